//! The GitSource kind: a repository of manifests the daemon polls and applies as one applyset.

use chrono::{DateTime, Utc};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::duration::BerthDuration;
use crate::error::ValidationErrors;
use crate::meta::Condition;
use crate::object::kind_object;
use crate::quantity::scalar;

kind_object! {
    /// A git repository of manifests.
    GitSource {
        spec: GitSourceSpec,
        status: GitSourceStatus,
    }
}

/// What to poll and how.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GitSourceSpec {
    /// `https` or `file` URL of the repository.
    #[serde(default)]
    #[schemars(extend("x-berth-required" = true))]
    pub url: String,
    /// Branch, tag or commit; the remote's default branch (HEAD) when empty.
    #[serde(
        rename = "ref",
        default,
        skip_serializing_if = "String::is_empty",
        deserialize_with = "scalar::string_like"
    )]
    pub ref_: String,
    /// Directory inside the repository holding the manifests.
    #[serde(default = "default_path")]
    pub path: String,
    /// How often to poll.
    #[serde(default = "default_interval")]
    pub interval: BerthDuration,
    /// Delete objects that left the repository.
    #[serde(default = "default_true")]
    pub prune: bool,
    /// Stop polling.
    #[serde(default)]
    pub suspend: bool,
    /// Credentials for an `https` repository, set with `berth gitsource secret set NAME KEY`
    /// (keys `username`, and `password` or `token`): the GitSource's own name, or another
    /// GitSource's whose credentials it shares. Credentials never go in `url`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub secret_ref: String,
}

fn default_path() -> String {
    ".".to_string()
}

fn default_interval() -> BerthDuration {
    BerthDuration::from_secs(300)
}

fn default_true() -> bool {
    true
}

impl Default for GitSourceSpec {
    fn default() -> Self {
        GitSourceSpec {
            url: String::new(),
            ref_: String::new(),
            path: default_path(),
            interval: default_interval(),
            prune: true,
            suspend: false,
            secret_ref: String::new(),
        }
    }
}

impl GitSourceSpec {
    /// The ref to fetch: `spec.ref`, or `HEAD` when none was given.
    pub fn git_ref(&self) -> &str {
        if self.ref_.is_empty() {
            "HEAD"
        } else {
            &self.ref_
        }
    }
}

/// What the last sync did.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GitSourceStatus {
    #[serde(default)]
    pub observed_generation: i64,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// Commit whose manifests were applied last.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_applied_revision: Option<String>,
    /// Commit of the last sync attempt, successful or not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_attempted_revision: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_synced_at: Option<DateTime<Utc>>,
    /// The value of the `berth.dev/requestedAt` annotation the last sync answered, so whoever
    /// asked for a sync (`berth reconcile gitsource`) can tell it has run, news or not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_handled_reconcile_at: Option<String>,
    /// Objects applied from the repository, as `Kind/name`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub inventory: Vec<String>,
}

/// The keys a GitSource's credentials (`spec.secretRef`) may hold: git's username, and a
/// password or a token.
pub const CREDENTIAL_USERNAME: &str = "username";
pub const CREDENTIAL_PASSWORD: &str = "password";
pub const CREDENTIAL_TOKEN: &str = "token";
pub const CREDENTIAL_KEYS: [&str; 3] = [CREDENTIAL_USERNAME, CREDENTIAL_PASSWORD, CREDENTIAL_TOKEN];

/// How the applyset of every GitSource begins. These sets are the GitSource controller's
/// alone: no API caller, not even an admin, applies into one, so nobody joins a GitSource's set
/// (and with it the GitSource's readers) or has its prune delete what it did not apply.
pub const APPLYSET_PREFIX: &str = "gitsource-";

impl GitSource {
    /// The applyset a GitSource's objects are applied in.
    pub fn applyset_name(gitsource: &str) -> String {
        format!("{APPLYSET_PREFIX}{gitsource}")
    }

    /// Whether `applyset` is a GitSource's, written by the GitSource controller only.
    pub fn owns_applyset(applyset: &str) -> bool {
        applyset.starts_with(APPLYSET_PREFIX)
    }
}

/// The secret value beside a GitSource's credentials recording the host (`host[:port]` of
/// `spec.url`) they were set for: they are offered to that host only, whichever GitSource
/// names them in its `secretRef`. Kept by the server; not one of [`CREDENTIAL_KEYS`].
pub const CREDENTIAL_HOST: &str = "host";

/// The host (`host[:port]`, lowercased) of an `https://` URL, which credentials are bound to;
/// `None` for other URLs.
pub fn credential_host(url: &str) -> Option<String> {
    let rest = url.strip_prefix("https://")?;
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    let host = authority.rsplit('@').next().unwrap_or_default();
    (!host.is_empty()).then(|| host.to_ascii_lowercase())
}

/// What stands for the credentials of a URL wherever one is shown.
pub const REDACTED: &str = "***";

/// Where the user information of the URL starting at `text` ends (the last `@` of its
/// authority, which git takes as the end of `user:password`), if it has any.
fn userinfo_end(text: &str) -> Option<usize> {
    // Quotes and brackets do not end it: user information may hold `'`, `(` and `)`, and
    // seeing too much as user information only hides more.
    let end = text
        .find(|c: char| matches!(c, '/' | '?' | '#') || c.is_whitespace())
        .unwrap_or(text.len());
    text[..end].rfind('@')
}

/// Whether a URL carries credentials (`https://user:token@host/...`, or a bare token as the
/// user).
pub fn url_has_credentials(url: &str) -> bool {
    url.split_once("://")
        .is_some_and(|(_, rest)| userinfo_end(rest).is_some())
}

/// `text` with the user information of every URL in it replaced by `***`
/// (`https://***@host/...`): for URLs shown in conditions, events, logs, listings and errors.
pub fn redact_credentials(text: &str) -> std::borrow::Cow<'_, str> {
    if !text.contains("://") || !text.contains('@') {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("://") {
        let (head, tail) = rest.split_at(at + 3);
        out.push_str(head);
        match userinfo_end(tail) {
            Some(end) => {
                out.push_str(REDACTED);
                rest = &tail[end..];
            }
            None => rest = tail,
        }
    }
    out.push_str(rest);
    std::borrow::Cow::Owned(out)
}

/// Checks a repository URL: one of `schemes`, a host for network schemes, and an absolute path
/// for `file://`. The URL is shown redacted in every message.
pub fn validate_git_url(url: &str, schemes: &[&str]) -> Result<(), String> {
    let shown = redact_credentials(url);
    let url: &str = &shown;
    let allowed = schemes.join(", ");
    let Some((scheme, rest)) = url.split_once("://") else {
        return Err(format!("{url:?} is not a URL (use one of: {allowed})"));
    };
    if !schemes.contains(&scheme) {
        return Err(format!(
            "{url:?}: scheme {scheme:?} is not allowed (use one of: {allowed})"
        ));
    }
    if url.chars().any(|c| c.is_control() || c.is_whitespace()) {
        return Err(format!("{url:?} must not contain whitespace"));
    }
    if scheme == "file" {
        if !rest.starts_with('/') {
            return Err(format!("{url:?} must name an absolute path (file:///path)"));
        }
        if rest.split('/').any(|c| c == "..") {
            return Err(format!("{url:?} must not contain '..'"));
        }
    } else {
        let host = rest.split('/').next().unwrap_or("");
        if host.is_empty() {
            return Err(format!("{url:?} has no host"));
        }
    }
    Ok(())
}

/// The host path a `file://` URL names (`None` for other schemes), for checking it against the
/// roots `file://` repositories may come from.
pub fn file_url_path(url: &str) -> Option<&str> {
    url.strip_prefix("file://").filter(|p| p.starts_with('/'))
}

pub(crate) fn validate_gitsource(g: &GitSource, errs: &mut ValidationErrors) {
    let s = &g.spec;
    if s.url.is_empty() {
        errs.push("spec.url", "required");
    } else if let Err(e) = validate_git_url(&s.url, &["https", "file"]) {
        errs.push("spec.url", e);
    } else if url_has_credentials(&s.url) {
        // Every user reads a GitSource's spec, and it lands in conditions and events: a token
        // there is a token published.
        errs.push(
            "spec.url",
            format!(
                "{:?} carries credentials: put them in a secret \
                 (berth gitsource secret set {} username|password|token) and name it in spec.secretRef",
                redact_credentials(&s.url),
                if g.metadata.name.is_empty() { "NAME" } else { &g.metadata.name },
            ),
        );
    }
    if !s.secret_ref.is_empty() {
        if let Err(e) = crate::naming::validate_name(&s.secret_ref) {
            errs.push("spec.secretRef", e);
        } else if !s.url.starts_with("https://") {
            errs.push(
                "spec.secretRef",
                "credentials are used only with an https URL",
            );
        }
    }
    if s.ref_.starts_with('-') || s.ref_.chars().any(|c| c.is_control() || c.is_whitespace()) {
        errs.push("spec.ref", format!("{:?} is not a valid git ref", s.ref_));
    }
    if s.path.is_empty() {
        errs.push("spec.path", "must not be empty (use \".\")");
    } else if s.path.starts_with('/') {
        errs.push(
            "spec.path",
            format!("{:?} must be relative to the repository", s.path),
        );
    } else if s.path.split('/').any(|c| c == "..") {
        errs.push("spec.path", format!("{:?} must not contain '..'", s.path));
    }
    if s.interval.is_zero() {
        errs.push("spec.interval", "must be more than 0");
    }
    if let Err(e) = s.interval.check_cap() {
        errs.push("spec.interval", e);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_in_urls_are_redacted_wherever_they_stand() {
        let table = [
            ("https://host/repo.git", "https://host/repo.git"),
            (
                "https://user:tok@host/repo.git",
                "https://***@host/repo.git",
            ),
            ("https://ghp_abc@host:8443/r", "https://***@host:8443/r"),
            ("https://u:p@ss@host/r", "https://***@host/r"),
            // Found by the property below: sub-delimiters are user information too.
            ("https://u:pa'ss@host/r", "https://***@host/r"),
            ("'https://u:p(x)@host'", "'https://***@host'"),
            (
                "https://host/path@not-userinfo",
                "https://host/path@not-userinfo",
            ),
            ("file:///srv/a@b/repo", "file:///srv/a@b/repo"),
            (
                "fatal: unable to access 'https://u:s3cr3t@host/r/': 403",
                "fatal: unable to access 'https://***@host/r/': 403",
            ),
            (
                "from \"https://a:b@one/x\" and https://c@two",
                "from \"https://***@one/x\" and https://***@two",
            ),
            ("no url at all @ here", "no url at all @ here"),
            ("https://", "https://"),
        ];
        for (text, shown) in table {
            assert_eq!(redact_credentials(text), shown, "{text}");
        }
        for (url, carries) in [
            ("https://user:tok@host/r", true),
            ("https://tok@host/r", true),
            ("https://host/r@x", false),
            ("file:///a@b", false),
        ] {
            assert_eq!(url_has_credentials(url), carries, "{url}");
        }
    }

    fn gitsource(url: &str, secret_ref: &str) -> GitSource {
        GitSource::new(
            "fleet",
            GitSourceSpec {
                url: url.to_string(),
                secret_ref: secret_ref.to_string(),
                ..GitSourceSpec::default()
            },
        )
    }

    #[test]
    fn a_url_with_credentials_is_refused_without_echoing_them() {
        let mut errs = ValidationErrors::default();
        validate_gitsource(
            &gitsource("https://bot:s3cr3t@git.example/fleet.git", ""),
            &mut errs,
        );
        let text = errs.to_string();
        assert!(
            text.starts_with("spec.url: \"https://***@git.example/fleet.git\" carries credentials"),
            "{text}"
        );
        assert!(text.contains("spec.secretRef"), "{text}");
        assert!(!text.contains("s3cr3t") && !text.contains("bot"), "{text}");

        // Malformed ones too: the scheme error must not show the token either.
        let mut errs = ValidationErrors::default();
        validate_gitsource(
            &gitsource("ssh://bot:s3cr3t@git.example/fleet.git", ""),
            &mut errs,
        );
        assert!(!errs.to_string().contains("s3cr3t"), "{errs}");
    }

    #[test]
    fn secret_ref_names_an_object_and_needs_https() {
        let table = [
            ("https://git.example/fleet.git", "fleet-creds", None),
            (
                "https://git.example/fleet.git",
                "Bad_Name",
                Some("spec.secretRef"),
            ),
            (
                "file:///srv/fleet",
                "fleet-creds",
                Some("spec.secretRef: credentials are used only with an https URL"),
            ),
            ("file:///srv/fleet", "", None),
        ];
        for (url, secret_ref, error) in table {
            let mut errs = ValidationErrors::default();
            validate_gitsource(&gitsource(url, secret_ref), &mut errs);
            match error {
                None => assert!(errs.is_empty(), "{url} {secret_ref}: {errs}"),
                Some(prefix) => assert!(
                    errs.to_string().starts_with(prefix),
                    "{url} {secret_ref}: {errs}"
                ),
            }
        }
    }

    mod properties {
        use proptest::prelude::*;

        use super::super::{redact_credentials, url_has_credentials};

        proptest! {
            #![proptest_config(ProptestConfig {
                cases: 256,
                failure_persistence: None,
                ..ProptestConfig::default()
            })]

            /// Whatever a user and password hold (any character a URL's user information may
            /// carry), and whatever text stands around the URL, the password is not shown.
            #[test]
            fn a_password_in_a_url_is_never_shown(
                user in "[A-Za-z0-9._~%!$&'()*+,;=-]{0,8}",
                password in "[A-Za-z0-9._~%!$&'()*+,;=:-]{6,16}",
                host in "[a-z0-9.-]{1,12}(:[0-9]{1,5})?",
                path in "(/[a-z0-9._-]{0,8}){0,3}",
                before in "[ a-z'\"(:]{0,6}",
                after in "[ a-z'\"):,@]{0,6}",
            ) {
                let url = format!("https://{user}:{password}@{host}{path}");
                prop_assert!(url_has_credentials(&url));
                let text = format!("{before}{url}{after}");
                let shown = redact_credentials(&text);
                prop_assert!(!shown.contains(&password), "{} shown as {}", text, shown);
                if !path.is_empty() || !after.contains('@') {
                    prop_assert!(shown.contains(&format!("https://***@{host}")), "{}", shown);
                }
                prop_assert_eq!(redact_credentials(&shown), shown.clone());
            }
        }
    }
}
