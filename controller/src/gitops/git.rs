//! The git CLI, as the GitSource controller drives it: every call has a deadline, never prompts,
//! ignores the host's and user's git configuration, and may speak only `https` and `file`.
//!
//! Credentials reach git through `GIT_ASKPASS`: a script in a fresh 0700 directory beside the
//! checkouts (in the data directory, not a shared /tmp) that prints the username or password
//! from 0600 files beside it, and only when git asks for the URL's own host. They are never in
//! git's argv (which `ps` shows), its environment or the URL; the directory is removed when the
//! fetch ends, and one a crash left behind when the controller starts again.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use tokio::process::Command;

/// How long one git call may take; a fetch of a large repository over a slow link is the worst
/// case.
pub const GIT_TIMEOUT: Duration = Duration::from_secs(120);

#[derive(Debug, thiserror::Error)]
pub enum GitError {
    #[error("git {command}: {message}")]
    Failed { command: String, message: String },
    #[error("git {command}: no answer within {timeout:?}")]
    TimedOut { command: String, timeout: Duration },
    #[error("git {command}: cannot run git: {source}")]
    Spawn {
        command: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("spec.ref: {ref_:?} is not a branch, tag or commit of {url}")]
    UnknownRef { ref_: String, url: String },
}

/// What a GitSource's `spec.secretRef` holds for git: a username and a password or token.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    pub username: String,
    pub password: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("username", &self.username)
            .field("password", &"***")
            .finish()
    }
}

/// The username git sends with a `token` and no `username`: forges accept any non-empty one
/// with a token, and this is the one GitHub documents.
pub const TOKEN_USERNAME: &str = "x-access-token";

/// How the askpass directories under the checkouts directory begin (a uid never does).
const ASKPASS_PREFIX: &str = ".askpass-";

/// Removes the askpass directories a crash left under `checkouts`: only one daemon uses a data
/// directory, so none of them belongs to a running fetch.
pub fn sweep_askpass(checkouts: &Path) {
    let Ok(entries) = std::fs::read_dir(checkouts) else {
        return;
    };
    for entry in entries.flatten() {
        if entry
            .file_name()
            .to_string_lossy()
            .starts_with(ASKPASS_PREFIX)
        {
            let path = entry.path();
            if let Err(err) = std::fs::remove_dir_all(&path) {
                tracing::warn!(dir = %path.display(), %err, "cannot remove a git askpass directory");
            }
        }
    }
}

/// The `GIT_ASKPASS` program of one git call: a directory only the daemon's user can enter,
/// holding the script and the two values. Removed when dropped.
struct Askpass {
    dir: PathBuf,
}

impl Drop for Askpass {
    fn drop(&mut self) {
        if let Err(err) = std::fs::remove_dir_all(&self.dir) {
            tracing::warn!(dir = %self.dir.display(), %err, "cannot remove a git askpass directory");
        }
    }
}

impl Askpass {
    /// Writes the script for `url`'s host. A host with characters a shell pattern would treat
    /// specially gets no credentials (a validated https host never has them).
    fn new(base: &Path, url: &str, credentials: &Credentials) -> Result<Askpass, GitError> {
        use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
        let (scheme, rest) = url.split_once("://").unwrap_or(("", url));
        let host = rest.split(['/', '?', '#']).next().unwrap_or_default();
        let plain = |s: &str| {
            !s.is_empty()
                && s.chars().all(|c| {
                    c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | ':' | '[' | ']')
                })
        };
        if !plain(scheme) || !plain(host) {
            return Err(GitError::Failed {
                command: "fetch".to_string(),
                message: format!(
                    "{}: credentials are given only to a plain https host",
                    berth_api::redact_credentials(url)
                ),
            });
        }
        let io = |path: &Path, source| GitError::Io {
            path: path.to_path_buf(),
            source,
        };
        // A new directory of a random name: created here, so nobody else holds it open.
        let dir = base.join(format!(
            "{ASKPASS_PREFIX}{}",
            hex::encode(rand::random::<[u8; 12]>())
        ));
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&dir)
            .map_err(|source| io(&dir, source))?;
        let askpass = Askpass { dir };
        let dir = &askpass.dir;
        let write = |name: &str, mode: u32, content: &str| -> Result<PathBuf, GitError> {
            let path = dir.join(name);
            let mut file = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(mode)
                .open(&path)
                .map_err(|source| io(&path, source))?;
            std::io::Write::write_all(&mut file, content.as_bytes())
                .map_err(|source| io(&path, source))?;
            Ok(path)
        };
        // git reads the first line of the answer: a value is one line.
        let first_line = |v: &str| v.split(['\r', '\n']).next().unwrap_or_default().to_string();
        let username = write("username", 0o600, &first_line(&credentials.username))?;
        let password = write("password", 0o600, &first_line(&credentials.password))?;
        // git prompts "Username for 'https://host': " and "Password for 'https://user@host': ";
        // a prompt for any other host (a redirect elsewhere) gets nothing. Prompts are compared
        // whole, the username read from its file, so the script holds no value.
        let script = format!(
            "#!/bin/sh\n\
             if [ \"$1\" = \"Username for '{scheme}://{host}': \" ]; then exec cat '{username}'; fi\n\
             if [ \"$1\" = \"Password for '{scheme}://$(cat '{username}')@{host}': \" ]; then \
             exec cat '{password}'; fi\n\
             exit 1\n",
            username = username.display(),
            password = password.display(),
        );
        write("askpass", 0o700, &script)?;
        Ok(askpass)
    }

    fn program(&self) -> PathBuf {
        self.dir.join("askpass")
    }
}

/// A local checkout of one repository, kept between syncs so a poll fetches only what is new.
pub struct Checkout {
    dir: PathBuf,
}

impl Checkout {
    pub fn new(dir: PathBuf) -> Checkout {
        Checkout { dir }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Fetches `url` and resolves `ref_` (a branch, a tag or a commit; the remote's HEAD when
    /// empty) to a full commit id.
    /// `credentials` are offered to the URL's host when it asks for them.
    pub async fn fetch(
        &self,
        url: &str,
        ref_: &str,
        credentials: Option<&Credentials>,
    ) -> Result<String, GitError> {
        if !self.dir.join(".git").is_dir() {
            std::fs::create_dir_all(&self.dir).map_err(|source| GitError::Io {
                path: self.dir.clone(),
                source,
            })?;
            self.git(&["init", "--quiet"], None).await?;
        }
        let base = self.dir.parent().unwrap_or(&self.dir);
        let askpass = credentials
            .map(|c| Askpass::new(base, url, c))
            .transpose()?;
        let askpass = askpass.as_ref();
        // Branches land under a remote-tracking namespace so a branch and a tag of the same name
        // stay apart; `--prune` forgets branches the remote deleted.
        self.git(
            &[
                "fetch",
                "--quiet",
                "--force",
                "--prune",
                "--no-recurse-submodules",
                "--",
                url,
                "+refs/heads/*:refs/remotes/origin/*",
                "+refs/tags/*:refs/tags/*",
            ],
            askpass,
        )
        .await?;
        if ref_.is_empty() || ref_ == "HEAD" {
            self.git(&["fetch", "--quiet", "--force", "--", url, "HEAD"], askpass)
                .await?;
            return self
                .resolve("FETCH_HEAD")
                .await
                .ok_or(GitError::UnknownRef {
                    ref_: "HEAD".to_string(),
                    url: berth_api::redact_credentials(url).into_owned(),
                });
        }
        let branch = ref_.strip_prefix("refs/heads/").unwrap_or(ref_);
        let tag = ref_.strip_prefix("refs/tags/").unwrap_or(ref_);
        for candidate in [
            format!("refs/remotes/origin/{branch}"),
            format!("refs/tags/{tag}"),
        ] {
            if let Some(commit) = self.resolve(&candidate).await {
                return Ok(commit);
            }
        }
        let looks_like_commit =
            ref_.len() >= 4 && ref_.len() <= 64 && ref_.chars().all(|c| c.is_ascii_hexdigit());
        if looks_like_commit {
            if let Some(commit) = self.resolve(ref_).await {
                return Ok(commit);
            }
            // A commit no branch or tag reaches: servers that allow it hand it out by id.
            if ref_.len() == 40 || ref_.len() == 64 {
                let _ = self
                    .git(&["fetch", "--quiet", "--force", "--", url, ref_], askpass)
                    .await;
                if let Some(commit) = self.resolve(ref_).await {
                    return Ok(commit);
                }
            }
        }
        Err(GitError::UnknownRef {
            ref_: ref_.to_string(),
            url: berth_api::redact_credentials(url).into_owned(),
        })
    }

    /// Makes the working tree exactly `commit`, with nothing left over from an earlier one.
    pub async fn checkout(&self, commit: &str) -> Result<(), GitError> {
        self.git(
            &["checkout", "--quiet", "--force", "--detach", commit],
            None,
        )
        .await?;
        self.git(&["clean", "--quiet", "-ffdx"], None).await?;
        Ok(())
    }

    async fn resolve(&self, name: &str) -> Option<String> {
        let spec = format!("{name}^{{commit}}");
        self.git(
            &[
                "rev-parse",
                "--verify",
                "--quiet",
                "--end-of-options",
                &spec,
            ],
            None,
        )
        .await
        .ok()
        .map(|out| out.trim().to_string())
        .filter(|commit| !commit.is_empty())
    }

    async fn git(&self, args: &[&str], askpass: Option<&Askpass>) -> Result<String, GitError> {
        let command = args.first().copied().unwrap_or_default().to_string();
        let mut cmd = Command::new("git");
        cmd.arg("-C")
            .arg(&self.dir)
            // Only the schemes a GitSource may name, also for redirects and submodules.
            .args(["-c", "protocol.allow=never"])
            .args(["-c", "protocol.https.allow=always"])
            .args(["-c", "protocol.file.allow=always"])
            .args(["-c", "core.hooksPath=/dev/null"])
            .args(["-c", "advice.detachedHead=false"])
            // No credential helper keeps (or offers) what the askpass program answers.
            .args(["-c", "credential.helper="])
            .args(args)
            .env("GIT_TERMINAL_PROMPT", "0")
            .env(
                "GIT_ASKPASS",
                askpass.map_or_else(|| PathBuf::from("true"), Askpass::program),
            )
            .env_remove("SSH_ASKPASS")
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            .env("LC_ALL", "C")
            .env_remove("GIT_DIR")
            .env_remove("GIT_WORK_TREE")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let child = cmd.spawn().map_err(|source| GitError::Spawn {
            command: command.clone(),
            source,
        })?;
        let output = tokio::time::timeout(GIT_TIMEOUT, child.wait_with_output())
            .await
            .map_err(|_| GitError::TimedOut {
                command: command.clone(),
                timeout: GIT_TIMEOUT,
            })?
            .map_err(|source| GitError::Spawn {
                command: command.clone(),
                source,
            })?;
        if output.status.success() {
            return Ok(String::from_utf8_lossy(&output.stdout).into_owned());
        }
        let stderr = String::from_utf8_lossy(&output.stderr);
        // git names the URL it fetched in its errors; a stored one may still carry credentials.
        let stderr = berth_api::redact_credentials(&stderr);
        let message = stderr
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .collect::<Vec<_>>()
            .join("; ");
        Err(GitError::Failed {
            command,
            message: if message.is_empty() {
                format!("exited with {}", output.status)
            } else {
                message
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    fn ask(askpass: &Askpass, prompt: &str) -> (bool, String) {
        let out = std::process::Command::new(askpass.program())
            .arg(prompt)
            .env_clear()
            .output()
            .unwrap();
        (out.status.success(), String::from_utf8(out.stdout).unwrap())
    }

    #[test]
    fn askpass_answers_only_the_urls_host_and_keeps_the_values_private() {
        let credentials = Credentials {
            username: "bot".to_string(),
            password: "s3cr3t\nsecond line".to_string(),
        };
        let base = tempfile::tempdir().unwrap();
        let askpass = Askpass::new(
            base.path(),
            "https://git.example:8443/fleet.git",
            &credentials,
        )
        .unwrap();
        let dir = askpass.dir.clone();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&dir), 0o700);
        assert_eq!(mode(&dir.join("username")), 0o600);
        assert_eq!(mode(&dir.join("password")), 0o600);
        // The script names files, never a value.
        let script = std::fs::read_to_string(askpass.program()).unwrap();
        assert!(
            !script.contains("s3cr3t") && !script.contains("bot"),
            "{script}"
        );

        let table = [
            ("Username for 'https://git.example:8443': ", Some("bot")),
            (
                "Password for 'https://bot@git.example:8443': ",
                Some("s3cr3t"),
            ),
            // A redirect to another host, or another port, gets nothing.
            ("Username for 'https://evil.example': ", None),
            ("Password for 'https://bot@git.example': ", None),
            (
                "Password for 'https://bot@evil.example/x@git.example:8443': ",
                None,
            ),
            ("anything else", None),
        ];
        for (prompt, answer) in table {
            let (ok, out) = ask(&askpass, prompt);
            match answer {
                Some(value) => assert!(ok && out == value, "{prompt}: {out:?}"),
                None => assert!(!ok && out.is_empty(), "{prompt}: {out:?}"),
            }
        }
        drop(askpass);
        assert!(!dir.exists(), "the values outlive the call");

        // What a crash left behind goes when the controller starts; checkouts stay.
        let left = Askpass::new(base.path(), "https://git.example/f.git", &credentials).unwrap();
        let left_dir = left.dir.clone();
        std::mem::forget(left);
        std::fs::create_dir(base.path().join("some-uid")).unwrap();
        assert!(left_dir.exists());
        sweep_askpass(base.path());
        assert!(!left_dir.exists());
        assert!(base.path().join("some-uid").exists());
    }

    #[test]
    fn credentials_never_show_in_debug_output_or_odd_hosts() {
        let credentials = Credentials {
            username: "bot".to_string(),
            password: "s3cr3t".to_string(),
        };
        assert!(!format!("{credentials:?}").contains("s3cr3t"));
        let err = Askpass::new(
            &std::env::temp_dir(),
            "https://u:s3cr3t@ho$t/x",
            &credentials,
        )
        .err()
        .unwrap()
        .to_string();
        assert!(
            err.contains("https://***@") && !err.contains("s3cr3t"),
            "{err}"
        );
    }
}
