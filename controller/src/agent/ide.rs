//! The IDE: code-server started inside a project's container on demand (never at boot), bound
//! to the container's loopback, and reached from outside only through the preview listener's
//! IDE host (`<name>--ide.<previewDomain>`).
//!
//! [`ensure`] is idempotent: a pid file on the `/run` tmpfs names the code-server started in
//! this boot, and one that is alive and answers `/healthz` is left alone, so a second call
//! starts nothing. A lock serialises concurrent calls. A reboot (the reaper's stop, a restart)
//! clears `/run` and ends code-server with the container; the next call starts it again.
//!
//! Its state (settings, extensions, the editor's own storage) lives under [`STATE_DIR`] in the
//! durable workspace volume, so it survives a replaced container. That directory is berth's and
//! not a person's work: it is listed in `.git/info/exclude`, and the workspace inspection leaves
//! it out of unsaved files and of file activity (`workspace/inspect.sh`).

use std::time::Duration;

use super::exec::{output_tail, run_script};
use crate::runtime::{Runtime, RuntimeError};

/// The port code-server listens on, on the container's loopback only.
pub const PORT: u16 = 13337;
/// Where the IDE's state lives: inside the workspace volume, so it survives a recreate.
pub const STATE_DIR: &str = "/workspace/.berth/ide";
/// The `.git/info/exclude` pattern that keeps [`STATE_DIR`] out of git.
pub const EXCLUDE_PATTERN: &str = "/.berth/ide/";
/// Where berth expects code-server in the image (berth-agents carries it there).
pub const BINARY: &str = "/usr/local/bin/code-server";
pub const PID_FILE: &str = "/run/berth/ide.pid";
/// code-server's output, one run's worth (each start begins it afresh).
pub const LOG: &str = "/var/log/berth/ide.log";
/// How long code-server may take to answer after it was started; on a loaded machine its
/// first start (Node loading the workbench server) takes several seconds.
const READY_WITHIN_SECS: u32 = 90;
const EXEC_TIMEOUT: Duration = Duration::from_secs(READY_WITHIN_SECS as u64 + 60);

/// What [`ensure`] found or did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdeOutcome {
    /// Started now, and answering.
    Started { pid: u32 },
    /// Already running in this boot and answering; nothing was started.
    Running { pid: u32 },
}

impl IdeOutcome {
    pub fn pid(self) -> u32 {
        match self {
            IdeOutcome::Started { pid } | IdeOutcome::Running { pid } => pid,
        }
    }

    pub fn started(self) -> bool {
        matches!(self, IdeOutcome::Started { .. })
    }
}

/// Why the IDE could not be made to run.
#[derive(Debug, thiserror::Error)]
pub enum IdeError {
    /// The project's image carries no code-server.
    #[error(
        "the container has no code-server ({BINARY}): use an image that carries it, such as berth-agents"
    )]
    NoCodeServer,
    /// The project's repository is not checked out yet: state written into /workspace now
    /// would hold the checkout back.
    #[error(
        "the project's repository is not checked out yet; open the IDE once the project is Ready"
    )]
    NotCheckedOut,
    /// code-server did not come up; the words are its log's last lines.
    #[error("code-server did not start: {0}")]
    Failed(String),
    #[error("{0}")]
    Runtime(#[from] RuntimeError),
}

/// Makes sure code-server runs in `instance` and answers on [`PORT`]: starts it, detached in
/// its own session with its log in [`LOG`], when the pid file names no live one, and waits
/// until it answers. `has_repo`: the project checks out a repository, which must be in place
/// before the IDE writes its state into /workspace.
pub async fn ensure(
    rt: &dyn Runtime,
    instance: &str,
    has_repo: bool,
) -> Result<IdeOutcome, IdeError> {
    const SCRIPT: &str = r#"
set -u
port=$1 state=$2 pidfile=$3 log=$4 bin=$5 repo=$6 pattern=$7 within=$8
mkdir -p /run/berth /var/log/berth || exit 40
if command -v flock >/dev/null 2>&1; then
    exec 9>/run/berth/ide.lock
    flock -w 60 9 || { echo "another start of the IDE holds the lock" >&2; exit 41; }
fi
answers() {
    if command -v curl >/dev/null 2>&1; then
        curl -fsS -o /dev/null --max-time 5 "http://127.0.0.1:$port/healthz" 2>/dev/null
    else
        wget -q -O /dev/null -T 5 "http://127.0.0.1:$port/healthz" 2>/dev/null
    fi
}
alive() { [ -n "$1" ] && kill -0 "$1" 2>/dev/null && grep -q code-server "/proc/$1/cmdline" 2>/dev/null; }
# Waits until the code-server $1 answers; fails when it exits first or takes too long.
await() {
    n=0
    while ! answers; do
        alive "$1" || { echo "code-server exited; its log ends:" >&2; tail -n 15 "$log" >&2; exit 46; }
        n=$((n + 1))
        [ "$n" -le $((within * 5)) ] || { echo "code-server did not answer within ${within}s; its log ends:" >&2; tail -n 15 "$log" >&2; exit 47; }
        sleep 0.2
    done
}
pid=$(cat "$pidfile" 2>/dev/null || true)
if alive "$pid"; then
    await "$pid"
    echo "running $pid"
    exit 0
fi
[ -x "$bin" ] || exit 44
if [ "$repo" = yes ] && [ ! -d /workspace/.git ]; then exit 45; fi
mkdir -p "$state/data" "$state/extensions" || exit 40
if [ -d /workspace/.git ]; then
    mkdir -p /workspace/.git/info && touch /workspace/.git/info/exclude || exit 40
    grep -qxF -- "$pattern" /workspace/.git/info/exclude ||
        printf '%s\n' "$pattern" >>/workspace/.git/info/exclude || exit 40
fi
cd /workspace || exit 40
setsid "$bin" --auth none --bind-addr "127.0.0.1:$port" --disable-telemetry \
    --disable-update-check --disable-workspace-trust --config "$state/config.yaml" \
    --user-data-dir "$state/data" --extensions-dir "$state/extensions" /workspace \
    </dev/null >"$log" 2>&1 9>&- &
pid=$!
echo "$pid" >"$pidfile"
await "$pid"
echo "started $pid"
"#;
    let port = PORT.to_string();
    let within = READY_WITHIN_SECS.to_string();
    let args = [
        port.as_str(),
        STATE_DIR,
        PID_FILE,
        LOG,
        BINARY,
        if has_repo { "yes" } else { "no" },
        EXCLUDE_PATTERN,
        within.as_str(),
    ];
    let out = run_script(rt, instance, "IdeFailed", SCRIPT, &args, EXEC_TIMEOUT)
        .await
        .map_err(|e| match e {
            super::AgentError::Runtime { source, .. } => IdeError::Runtime(source),
            other => IdeError::Failed(other.to_string()),
        })?;
    match out.exit_code {
        0 => parse(&out.stdout_str()),
        44 => Err(IdeError::NoCodeServer),
        45 => Err(IdeError::NotCheckedOut),
        _ => Err(IdeError::Failed(format!(
            "exit {}: {}",
            out.exit_code,
            output_tail(&out, 15)
        ))),
    }
}

/// The script's last line: `started PID` or `running PID`.
fn parse(said: &str) -> Result<IdeOutcome, IdeError> {
    let last = said.lines().last().unwrap_or_default();
    let mut words = last.split_whitespace();
    let outcome = match (words.next(), words.next().and_then(|p| p.parse().ok())) {
        (Some("started"), Some(pid)) => IdeOutcome::Started { pid },
        (Some("running"), Some(pid)) => IdeOutcome::Running { pid },
        _ => {
            return Err(IdeError::Failed(format!(
                "unexpected output from the start: {last:?}"
            )));
        }
    };
    Ok(outcome)
}

#[cfg(test)]
#[path = "ide_tests.rs"]
mod tests;
