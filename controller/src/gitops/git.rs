//! The git CLI, as the GitSource controller drives it: every call has a deadline, never prompts,
//! ignores the host's and user's git configuration, and may speak only `https` and `file`.

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
    pub async fn fetch(&self, url: &str, ref_: &str) -> Result<String, GitError> {
        if !self.dir.join(".git").is_dir() {
            std::fs::create_dir_all(&self.dir).map_err(|source| GitError::Io {
                path: self.dir.clone(),
                source,
            })?;
            self.git(&["init", "--quiet"]).await?;
        }
        // Branches land under a remote-tracking namespace so a branch and a tag of the same name
        // stay apart; `--prune` forgets branches the remote deleted.
        self.git(&[
            "fetch",
            "--quiet",
            "--force",
            "--prune",
            "--no-recurse-submodules",
            "--",
            url,
            "+refs/heads/*:refs/remotes/origin/*",
            "+refs/tags/*:refs/tags/*",
        ])
        .await?;
        if ref_.is_empty() || ref_ == "HEAD" {
            self.git(&["fetch", "--quiet", "--force", "--", url, "HEAD"])
                .await?;
            return self
                .resolve("FETCH_HEAD")
                .await
                .ok_or(GitError::UnknownRef {
                    ref_: "HEAD".to_string(),
                    url: url.to_string(),
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
                    .git(&["fetch", "--quiet", "--force", "--", url, ref_])
                    .await;
                if let Some(commit) = self.resolve(ref_).await {
                    return Ok(commit);
                }
            }
        }
        Err(GitError::UnknownRef {
            ref_: ref_.to_string(),
            url: url.to_string(),
        })
    }

    /// Makes the working tree exactly `commit`, with nothing left over from an earlier one.
    pub async fn checkout(&self, commit: &str) -> Result<(), GitError> {
        self.git(&["checkout", "--quiet", "--force", "--detach", commit])
            .await?;
        self.git(&["clean", "--quiet", "-ffdx"]).await?;
        Ok(())
    }

    async fn resolve(&self, name: &str) -> Option<String> {
        let spec = format!("{name}^{{commit}}");
        self.git(&[
            "rev-parse",
            "--verify",
            "--quiet",
            "--end-of-options",
            &spec,
        ])
        .await
        .ok()
        .map(|out| out.trim().to_string())
        .filter(|commit| !commit.is_empty())
    }

    async fn git(&self, args: &[&str]) -> Result<String, GitError> {
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
            .args(args)
            .env("GIT_TERMINAL_PROMPT", "0")
            .env("GIT_ASKPASS", "true")
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
