//! The GitSource kind: a repository of manifests the daemon polls and applies as one applyset.

use chrono::{DateTime, Utc};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::duration::BerthDuration;
use crate::error::ValidationErrors;
use crate::meta::{API_VERSION, Condition, ObjectMeta};
use crate::quantity::scalar;

/// A git repository of manifests.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GitSource {
    #[serde(default)]
    pub api_version: String,
    #[serde(default)]
    pub kind: String,
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: GitSourceSpec,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<GitSourceStatus>,
}

impl GitSource {
    pub const KIND: &'static str = "GitSource";

    pub fn new(name: impl Into<String>, spec: GitSourceSpec) -> Self {
        GitSource {
            api_version: API_VERSION.to_string(),
            kind: Self::KIND.to_string(),
            metadata: ObjectMeta {
                name: name.into(),
                ..ObjectMeta::default()
            },
            spec,
            status: None,
        }
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
    /// Objects applied from the repository, as `Kind/name`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub inventory: Vec<String>,
}

/// Checks a repository URL: one of `schemes`, a host for network schemes, and an absolute path
/// for `file://`.
pub fn validate_git_url(url: &str, schemes: &[&str]) -> Result<(), String> {
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
