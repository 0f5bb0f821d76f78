//! RunnerStarted: the brief handed over and the profile's runner started, once per boot and
//! brief; and talking to a running agent afterwards (answers, the runner log).
//!
//! The pid file under the tmpfs `/run/berth`, with the id of the brief it was started for, is the
//! guard: while it names this brief the runner was started for it in this boot, so a repeated
//! call (after a controller crash, say) starts nothing, whether the runner is still running or
//! has finished. A new brief starts a runner only once the previous one has exited, so there
//! are never two. A reboot clears `/run`, so the next boot starts it again. A lock serialises
//! concurrent calls.

use std::collections::BTreeMap;
use std::time::Duration;

use berth_api::{AgentProfileSpec, RunnerProtocol};

use super::exec::{output_tail, run_script, run_script_with_env};
use super::{
    ADAPTER_PATH, ANSWER_FILE, AgentError, BRIEF_FILE, BRIEF_ID_FILE, RUN_DIR, RUNNER_LOG,
    RUNNER_PID_FILE, RUNNER_WRAPPER_PATH, Result, STATUS_FILE,
};
use crate::runtime::Runtime;

const REASON: &str = "RunnerFailed";
const RUNNER_TIMEOUT: Duration = Duration::from_secs(60);
/// Briefs travel as one command-line argument, which Linux caps at 128 KiB.
pub const MAX_BRIEF_BYTES: usize = 100_000;
/// In the runner's environment: the agent CLI's session of an interrupted brief, which the
/// adapter resumes instead of starting over.
pub const RESUME_SESSION_ENV: &str = "BERTH_RESUME_SESSION";
/// In the runner's environment when berth has recorded a title: the adapter does not ask again.
pub const TITLE_KNOWN_ENV: &str = "BERTH_TITLE_KNOWN";

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunnerOutcome {
    /// Started now, with this brief.
    Started { pid: u32 },
    /// It had been started in this boot for this brief already; nothing was done.
    AlreadyStarted { pid: u32, running: bool },
    /// The runner started in this boot for another brief is still running; nothing was done.
    Busy { pid: u32, brief_id: String },
}

/// Writes the brief (`/run/berth/brief.md`, its id in `/run/berth/brief.id`) and starts the
/// profile's runner detached in its own session, `{briefFile}` in its command replaced by the
/// brief's path. Its environment is `env` with `secrets` on top, plus `BERTH_BRIEF_ID`,
/// `BERTH_BRIEF_FILE`, `BERTH_STATUS_FILE` and `BERTH_ANSWER_FILE`. The status file and answer
/// an earlier brief's runner left are removed first: neither belongs to this brief.
///
/// A profile whose `runner.protocol` is not `status-file` runs under the agent adapter
/// (`node /usr/local/lib/berth/adapter run PROTOCOL -- COMMAND...`), which needs Node in the
/// image (berth-agents has it); without Node the start fails saying so.
pub async fn start_runner(
    rt: &dyn Runtime,
    instance: &str,
    profile: &AgentProfileSpec,
    brief_id: &str,
    brief: &str,
    env: &BTreeMap<String, String>,
    secrets: &BTreeMap<String, String>,
) -> Result<RunnerOutcome> {
    if profile.runner.command.is_empty() {
        return Err(AgentError::RunnerFailed {
            message: "the profile has no runner.command".to_string(),
        });
    }
    if brief_id.is_empty()
        || brief_id.len() > 128
        || !brief_id.chars().all(|c| c.is_ascii_graphic())
    {
        return Err(AgentError::RunnerFailed {
            message: format!(
                "brief id {brief_id:?} must be 1 to 128 printable characters without spaces"
            ),
        });
    }
    if brief.len() > MAX_BRIEF_BYTES {
        return Err(AgentError::RunnerFailed {
            message: format!(
                "the brief is {} bytes, more than the {MAX_BRIEF_BYTES} berth can hand over",
                brief.len()
            ),
        });
    }
    const SCRIPT: &str = r#"
set -u
id=$1 brief=$2
shift 2
mkdir -p "$RUN_DIR" /var/log/berth
if command -v flock >/dev/null 2>&1; then
    exec 9>"$RUN_DIR/runner.lock"
    flock -w 30 9 || { echo "another start of the runner holds the lock" >&2; exit 41; }
fi
if [ -s "$PID_FILE" ]; then
    pid=$(cat "$PID_FILE")
    if kill -0 "$pid" 2>/dev/null; then state=running; else state=exited; fi
    was=$(cat "$BRIEF_ID_FILE" 2>/dev/null || true)
    if [ "$was" = "$id" ]; then echo "already $pid $state"; exit 0; fi
    if [ "$state" = running ]; then echo "busy $pid $was"; exit 0; fi
fi
rm -f "$STATUS_FILE" "$ANSWER_FILE" || exit 42
printf '%s' "$brief" >"$BRIEF_FILE.tmp" && mv -f "$BRIEF_FILE.tmp" "$BRIEF_FILE" || exit 42
printf '%s' "$id" >"$BRIEF_ID_FILE.tmp" && mv -f "$BRIEF_ID_FILE.tmp" "$BRIEF_ID_FILE" || exit 42
export BERTH_BRIEF_ID="$id" BERTH_BRIEF_FILE="$BRIEF_FILE" BERTH_STATUS_FILE="$STATUS_FILE" BERTH_ANSWER_FILE="$ANSWER_FILE"
pidfile=$PID_FILE
unset RUN_DIR PID_FILE BRIEF_FILE BRIEF_ID_FILE STATUS_FILE ANSWER_FILE
if [ "$NEEDS_NODE" = 1 ] && ! command -v node >/dev/null 2>&1; then
    echo "runner.protocol $PROTOCOL runs under berth's agent adapter, which needs node in the image (use the image berth-agents)" >&2
    exit 43
fi
unset NEEDS_NODE PROTOCOL
setsid "$WRAPPER" "$@" </dev/null >/dev/null 2>&1 9>&- &
pid=$!
echo "$pid" >"$pidfile"
echo "started $pid"
"#;
    let mut command: Vec<String> = profile
        .runner
        .command
        .iter()
        .map(|arg| arg.replace("{briefFile}", BRIEF_FILE))
        .collect();
    let protocol = profile.runner.protocol;
    if protocol != RunnerProtocol::StatusFile {
        let adapter = ["node", ADAPTER_PATH, "run", protocol.as_str(), "--"];
        command.splice(0..0, adapter.iter().map(|s| s.to_string()));
    }
    let mut args = vec![brief_id, brief];
    args.extend(command.iter().map(String::as_str));

    let mut exec_env = env.clone();
    exec_env.extend(secrets.iter().map(|(k, v)| (k.clone(), v.clone())));
    for (key, value) in [
        ("RUN_DIR", RUN_DIR),
        ("BERTH_RUN_DIR", RUN_DIR),
        ("PID_FILE", RUNNER_PID_FILE),
        ("BRIEF_FILE", BRIEF_FILE),
        ("BRIEF_ID_FILE", BRIEF_ID_FILE),
        ("STATUS_FILE", STATUS_FILE),
        ("ANSWER_FILE", ANSWER_FILE),
        ("WRAPPER", RUNNER_WRAPPER_PATH),
        ("PROTOCOL", protocol.as_str()),
        (
            "NEEDS_NODE",
            if protocol == RunnerProtocol::StatusFile {
                "0"
            } else {
                "1"
            },
        ),
    ] {
        exec_env.insert(key.to_string(), value.to_string());
    }
    let out = run_script_with_env(
        rt,
        instance,
        REASON,
        SCRIPT,
        &args,
        &exec_env,
        RUNNER_TIMEOUT,
    )
    .await?;
    if !out.success() {
        return Err(AgentError::RunnerFailed {
            message: format!("exit {}: {}", out.exit_code, output_tail(&out, 5)),
        });
    }
    let said = out.stdout_str();
    let last = said.lines().last().unwrap_or("");
    let unexpected = || AgentError::RunnerFailed {
        message: format!("unexpected answer from the start: {last:?}"),
    };
    let mut words = last.split_whitespace();
    match words.next() {
        Some("started") => {
            let pid = words
                .next()
                .and_then(|p| p.parse().ok())
                .ok_or_else(unexpected)?;
            Ok(RunnerOutcome::Started { pid })
        }
        Some("already") => {
            let pid = words
                .next()
                .and_then(|p| p.parse().ok())
                .ok_or_else(unexpected)?;
            let running = words.next() == Some("running");
            Ok(RunnerOutcome::AlreadyStarted { pid, running })
        }
        Some("busy") => {
            let pid = words
                .next()
                .and_then(|p| p.parse().ok())
                .ok_or_else(unexpected)?;
            let brief_id = words.next().unwrap_or("").to_string();
            Ok(RunnerOutcome::Busy { pid, brief_id })
        }
        _ => Err(unexpected()),
    }
}

/// Answers a blocked agent: writes `text` to `/run/berth/answer` atomically (a reader never sees
/// half of it).
pub async fn answer(rt: &dyn Runtime, instance: &str, text: &str) -> Result<()> {
    const SCRIPT: &str = r#"
mkdir -p "$(dirname "$2")" && printf '%s' "$1" >"$2.tmp" && mv -f "$2.tmp" "$2"
"#;
    let out = run_script(
        rt,
        instance,
        REASON,
        SCRIPT,
        &[text, ANSWER_FILE],
        RUNNER_TIMEOUT,
    )
    .await?;
    if !out.success() {
        return Err(AgentError::RunnerFailed {
            message: format!("writing the answer failed: {}", output_tail(&out, 3)),
        });
    }
    Ok(())
}

/// The last `tail_bytes` of the runner log (empty when the runner never wrote one).
pub async fn runner_log(rt: &dyn Runtime, instance: &str, tail_bytes: u64) -> Result<String> {
    const SCRIPT: &str = r#"[ -f "$2" ] || exit 0; tail -c "$1" "$2""#;
    let bytes = tail_bytes.to_string();
    let out = run_script(
        rt,
        instance,
        REASON,
        SCRIPT,
        &[&bytes, RUNNER_LOG],
        RUNNER_TIMEOUT,
    )
    .await?;
    if !out.success() {
        return Err(AgentError::RunnerFailed {
            message: format!("reading {RUNNER_LOG} failed: {}", output_tail(&out, 3)),
        });
    }
    Ok(out.stdout_str())
}

/// A piece of the runner log, for following it (`berth logs -f`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogChunk {
    /// The log's bytes from the offset on (at most the bytes asked for), lossily as text.
    pub text: String,
    /// Where the next read continues.
    pub next_offset: u64,
    /// The runner as it was just before the log was read: when it had exited, nothing is
    /// written after this chunk's end.
    pub runner: RunnerState,
}

/// Whether the runner of this boot is running.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunnerState {
    Running,
    Exited,
    /// No runner was started in this boot.
    NotStarted,
}

impl RunnerState {
    pub fn as_str(self) -> &'static str {
        match self {
            RunnerState::Running => "Running",
            RunnerState::Exited => "Exited",
            RunnerState::NotStarted => "NotStarted",
        }
    }
}

/// The runner log from byte `offset` on, at most `max_bytes` of it. When the log is shorter than
/// `offset` it was rotated meanwhile, and reading starts over at its beginning.
pub async fn runner_log_from(
    rt: &dyn Runtime,
    instance: &str,
    offset: u64,
    max_bytes: u64,
) -> Result<LogChunk> {
    const SCRIPT: &str = r#"
log=$1 off=$2 max=$3 pidfile=$4
runner=NotStarted
if [ -s "$pidfile" ]; then
    if kill -0 "$(cat "$pidfile")" 2>/dev/null; then runner=Running; else runner=Exited; fi
fi
if [ ! -f "$log" ]; then echo "0 $runner"; exit 0; fi
size=$(wc -c <"$log")
[ "$off" -le "$size" ] || off=0
echo "$off $runner"
tail -c +$((off + 1)) "$log" | head -c "$max"
"#;
    let (offset, max) = (offset.to_string(), max_bytes.to_string());
    let out = run_script(
        rt,
        instance,
        REASON,
        SCRIPT,
        &[RUNNER_LOG, &offset, &max, RUNNER_PID_FILE],
        RUNNER_TIMEOUT,
    )
    .await?;
    let bad = |what: &str| AgentError::RunnerFailed {
        message: format!("reading {RUNNER_LOG}: {what}"),
    };
    if !out.success() {
        return Err(bad(&output_tail(&out, 3)));
    }
    let newline = out
        .stdout
        .iter()
        .position(|b| *b == b'\n')
        .ok_or_else(|| bad("no offset in the answer"))?;
    let head = std::str::from_utf8(&out.stdout[..newline]).unwrap_or_default();
    let mut words = head.split_whitespace();
    let start: u64 = words
        .next()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| bad("no offset in the answer"))?;
    let runner = match words.next() {
        Some("Running") => RunnerState::Running,
        Some("Exited") => RunnerState::Exited,
        Some("NotStarted") => RunnerState::NotStarted,
        _ => return Err(bad("no runner state in the answer")),
    };
    let data = &out.stdout[newline + 1..];
    Ok(LogChunk {
        text: String::from_utf8_lossy(data).into_owned(),
        next_offset: start + data.len() as u64,
        runner,
    })
}
