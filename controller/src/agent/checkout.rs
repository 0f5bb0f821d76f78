//! CheckedOut: the project's repository cloned into /workspace, once.
//!
//! A `file://` URL names a path on the berth host: berth bundles it there with the git CLI
//! (`git bundle create --all`), pushes the bundle through the file API (which works on a local
//! and a remote LXD alike) and clones from it inside, then points `origin` at the URL given. The
//! clone's remote-tracking refs stay, so "commits on no remote" can be told offline. Other URLs
//! are cloned inside the container directly.
//!
//! The clone is built in a scratch directory and its `.git` renamed into /workspace last:
//! `/workspace/.git` exists only for a finished checkout, which is what makes a later call keep
//! it instead of cloning again.
//!
//! A checkout never writes over a file berth did not write: a workspace holding any file that
//! is not one of berth's, as berth wrote it (by its recorded hash), is left as it is and the
//! checkout answers [`CheckoutOutcome::Blocked`], unless it is forced.

use std::os::unix::fs::DirBuilderExt;
use std::time::Duration;

use berth_api::{Repo, file_url_path};

use super::exec::{exit_failure, run_script, write_file};
use super::{AgentError, Result, WrittenFiles};
use crate::file_roots::FileRoots;
use crate::runtime::Runtime;

const REASON: &str = "CheckoutFailed";

/// How long a clone (or the host-side bundle) may take.
pub const CHECKOUT_TIMEOUT: Duration = Duration::from_secs(10 * 60);
const PROBE_TIMEOUT: Duration = Duration::from_secs(60);
/// Where the bundle of a `file://` repository is pushed; removed after the clone.
const BUNDLE_PATH: &str = "/tmp/berth-checkout.bundle";

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CheckoutOutcome {
    /// The repository was cloned now.
    Cloned {
        /// The checked-out branch (`None` on a detached HEAD).
        branch: Option<String>,
        /// The commit checked out.
        head: String,
    },
    /// /workspace already held a checkout; it was left as it is.
    Kept,
    /// /workspace holds files berth did not write (and no repository): nothing was written.
    Blocked {
        /// How many such files there are.
        count: usize,
        /// The first few of them, relative to /workspace.
        files: Vec<String>,
    },
}

/// Whether a checkout may write over files berth did not write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CheckoutMode {
    /// Held while the workspace holds any such file.
    Careful,
    /// A person asked for it, and the workspace was copied to the trash first.
    Forced,
}

/// How many of the files that hold a checkout back are named.
pub const BLOCKING_FILES_NAMED: usize = 10;

/// Clones `repo` into /workspace unless a checkout is there already, or (`Careful`) the
/// workspace holds a file that is not among berth's files (`known`) as berth wrote it. A
/// `file://` path named under `roots` is bundled only when everything git reads for it is
/// under them too.
pub async fn checkout(
    rt: &dyn Runtime,
    instance: &str,
    repo: &Repo,
    roots: &FileRoots,
    known: &WrittenFiles,
    mode: CheckoutMode,
) -> Result<CheckoutOutcome> {
    let url = repo.url.as_str();
    let failed = |message: String| AgentError::CheckoutFailed {
        url: redact_url(url),
        message,
    };

    let source = if let Some(host_path) = file_url_path(url) {
        // Bundling is host work; skip it when the workspace is checked out already.
        let probe = run_script(
            rt,
            instance,
            REASON,
            "test -d /workspace/.git",
            &[],
            PROBE_TIMEOUT,
        )
        .await?;
        if probe.success() {
            return Ok(CheckoutOutcome::Kept);
        }
        // Admission allowed a non-admin only a path named under the roots; what the path leads
        // to may have changed since, so it is judged again here, right before git reads it.
        // A path outside the roots was named by an admin and is read as named.
        let git_dir = if roots.names(std::path::Path::new(host_path)) {
            let confined = roots
                .confine(std::path::Path::new(host_path))
                .map_err(|e| failed(e.to_string()))?;
            Some(confined.git_dir)
        } else {
            None
        };
        let bundle = bundle_host_repository(host_path, git_dir.as_deref())
            .await
            .map_err(failed)?;
        write_file(rt, instance, REASON, BUNDLE_PATH, &bundle, 0o600).await?;
        BUNDLE_PATH.to_string()
    } else {
        url.to_string()
    };

    const SCRIPT: &str = r#"
set -eu
src=$1 url=$2 branch=$3 bundle=$4 mode=$5 known=$6 named=$7
if [ -d /workspace/.git ]; then
    [ -z "$bundle" ] || rm -f "$bundle"
    echo kept
    exit 0
fi
command -v git >/dev/null 2>&1 || { echo "git is not installed in the container" >&2; exit 30; }
# A clone from an earlier call may still be running (an exec outlives its deadline): wait for
# it rather than pull its scratch directory from under it, then look again.
if command -v flock >/dev/null 2>&1; then
    mkdir -p /run/berth
    exec 9>/run/berth/checkout.lock
    flock -w 900 9 || { echo "an earlier checkout still holds the lock" >&2; exit 31; }
    if [ -d /workspace/.git ]; then
        [ -z "$bundle" ] || rm -f "$bundle"
        echo kept
        exit 0
    fi
fi
# Files berth did not write (or changed since) hold the checkout back unless it is forced:
# `reset --hard` would write over them.
if [ "$mode" != forced ]; then
    list=$(mktemp)
    printf '%s\n' "$known" | grep -v '^$' >"$list.known" || true
    find /workspace -path /workspace/.berth-checkout -prune -o ! -type d -print >"$list"
    n=0
    while IFS= read -r p; do
        if [ -f "$p" ] && [ ! -L "$p" ]; then
            sum=$(sha256sum <"$p")
            if grep -qxF -- "${sum%% *} $p" "$list.known"; then continue; fi
        fi
        n=$((n + 1))
        if [ "$n" -le "$named" ]; then printf 'file %s\n' "${p#/workspace/}"; fi
    done <"$list"
    rm -f "$list" "$list.known"
    if [ "$n" -gt 0 ]; then
        [ -z "$bundle" ] || rm -f "$bundle"
        echo "blocked $n"
        exit 0
    fi
fi
# The workspace volume's root may not be owned by the user git runs as.
git config --global --get-all safe.directory 2>/dev/null | grep -qx /workspace \
    || git config --global --add safe.directory /workspace
scratch=/workspace/.berth-checkout
rm -rf "$scratch"
if [ -n "$branch" ]; then
    git clone -q --no-checkout -b "$branch" -- "$src" "$scratch"
else
    git clone -q --no-checkout -- "$src" "$scratch"
fi
git --git-dir="$scratch/.git" remote set-url origin "$url"
git --git-dir="$scratch/.git" --work-tree=/workspace reset -q --hard HEAD
mv "$scratch/.git" /workspace/.git
rm -rf "$scratch"
[ -z "$bundle" ] || rm -f "$bundle"
echo "cloned $(git -C /workspace rev-parse HEAD) $(git -C /workspace symbolic-ref --short -q HEAD || true)"
"#;
    let branch = repo.branch.as_deref().unwrap_or("");
    let bundle = if source == BUNDLE_PATH {
        BUNDLE_PATH
    } else {
        ""
    };
    let mode = match mode {
        CheckoutMode::Careful => "careful",
        CheckoutMode::Forced => "forced",
    };
    let known: String = known
        .files
        .iter()
        .map(|(path, hash)| format!("{hash} {path}\n"))
        .collect();
    let named = BLOCKING_FILES_NAMED.to_string();
    let out = run_script(
        rt,
        instance,
        REASON,
        SCRIPT,
        &[&source, url, branch, bundle, mode, &known, &named],
        CHECKOUT_TIMEOUT,
    )
    .await?;
    if !out.success() {
        return Err(failed(exit_failure("git clone in the container", &out)));
    }
    let said = out.stdout_str();
    let last = said.lines().last().unwrap_or("");
    if last == "kept" {
        return Ok(CheckoutOutcome::Kept);
    }
    if let Some(count) = last.strip_prefix("blocked ") {
        let count = count
            .parse()
            .map_err(|_| failed(format!("unexpected output from the clone: {last:?}")))?;
        let files = said
            .lines()
            .filter_map(|l| l.strip_prefix("file "))
            .map(printable)
            .take(BLOCKING_FILES_NAMED)
            .collect();
        return Ok(CheckoutOutcome::Blocked { count, files });
    }
    let mut words = last.split_whitespace();
    match (words.next(), words.next()) {
        (Some("cloned"), Some(head)) => Ok(CheckoutOutcome::Cloned {
            head: head.to_string(),
            branch: words.next().map(str::to_string),
        }),
        _ => Err(failed(format!(
            "unexpected output from the clone: {last:?}"
        ))),
    }
}

/// `git bundle create --all` of a host repository, read into memory. With `git_dir` (resolved
/// and confined), git reads that directory and looks for no other.
async fn bundle_host_repository(
    path: &str,
    git_dir: Option<&std::path::Path>,
) -> Result<Vec<u8>, String> {
    let dir = ScratchDir::create().map_err(|e| format!("temporary directory on the host: {e}"))?;
    let bundle = dir.0.join("repo.bundle");
    let mut command = tokio::process::Command::new("git");
    command
        // The repository may belong to another user on the host; berth only reads it.
        .arg("-c")
        .arg(format!("safe.directory={path}"));
    if let Some(git_dir) = git_dir {
        command
            .arg("-c")
            .arg(format!("safe.directory={}", git_dir.display()))
            .arg("--git-dir")
            .arg(git_dir)
            .env("GIT_CEILING_DIRECTORIES", "/");
    }
    command
        .arg("-C")
        .arg(path)
        .args(["bundle", "create", "--quiet"])
        .arg(&bundle)
        .arg("--all")
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true);
    let output = tokio::time::timeout(CHECKOUT_TIMEOUT, command.output())
        .await
        .map_err(|_| format!("git bundle on the host did not finish within {CHECKOUT_TIMEOUT:?}"))?
        .map_err(|e| format!("cannot run git on the host: {e}"))?;
    if !output.status.success() {
        let err = String::from_utf8_lossy(&output.stderr);
        let err: String = err
            .lines()
            .filter(|l| !l.trim().is_empty())
            .collect::<Vec<_>>()
            .join(" | ");
        return Err(format!("git bundle of {path} on the host failed: {err}"));
    }
    tokio::fs::read(&bundle)
        .await
        .map_err(|e| format!("reading the bundle of {path}: {e}"))
}

/// A private host directory removed when dropped (also when the bundle fails half-way).
pub(super) struct ScratchDir(pub(super) std::path::PathBuf);

impl ScratchDir {
    pub(super) fn create() -> std::io::Result<ScratchDir> {
        let path =
            std::env::temp_dir().join(format!("berth-bundle-{:016x}", rand::random::<u64>()));
        std::fs::DirBuilder::new().mode(0o700).create(&path)?;
        Ok(ScratchDir(path))
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A file name as a message may carry it: control characters shown as `?`.
fn printable(name: &str) -> String {
    name.chars()
        .map(|c| if c.is_control() { '?' } else { c })
        .collect()
}

/// The URL without user information (a token in `https://user:token@host/...` stays out of
/// conditions and events).
fn redact_url(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(mut parsed) if !parsed.username().is_empty() || parsed.password().is_some() => {
            let _ = parsed.set_username("");
            let _ = parsed.set_password(None);
            parsed.to_string()
        }
        _ => url.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_lose_their_credentials_in_messages() {
        assert_eq!(
            redact_url("https://bob:t0ken@git.example/x.git"),
            "https://git.example/x.git"
        );
        assert_eq!(redact_url("file:///srv/repo"), "file:///srv/repo");
    }
}
