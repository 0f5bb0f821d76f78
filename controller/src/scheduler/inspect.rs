//! One exec round trip that tells what a running workspace holds: the agent's status file, the
//! git state of /workspace, listening ports, CPU time used and the newest file change.
//!
//! The script prints one `key value` line per fact, untrusted text base64-encoded so that no file
//! name or agent message can forge a line, and ends with `end`. Anything short of a complete,
//! well-formed report is [`InspectError`]: "could not tell" is never "nothing to lose".

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use berth_api::{AgentState, UnsavedWork};
use chrono::{DateTime, TimeZone, Utc};
use serde::Deserialize;

use crate::reconcile::layout::DurableLayout;
use crate::runtime::{ExecRequest, Runtime, RuntimeError};
use crate::store::StoredObject;

/// Where the agent reports (DESIGN "Agent status contract").
pub const AGENT_STATUS_FILE: &str = "/run/berth/agent.json";
/// The workspace every project's work lives in.
pub const WORKSPACE: &str = "/workspace";

/// The first line of a report; a new format gets a new version.
const HEADER: &str = "berth-inspect 1";

/// The inspection, run by `sh -c`. `BERTH_KNOWN` holds the files berth wrote, one
/// `<sha256>  ./<path>` line each (the `sha256sum` format), and is compared against.
///
/// Git runs with `--no-optional-locks` so that inspecting never refreshes the index, which would
/// both touch .git and make the inspection look like activity.
const SCRIPT: &str = r#"
set -u
fail() { echo "error $1"; exit 3; }
b64() { base64 | tr -d '\n'; }
g() { git -c 'safe.directory=*' -c core.quotePath=false --no-optional-locks "$@"; }
t=$(mktemp -d) || fail mktemp
trap 'rm -rf "$t"' EXIT
echo "berth-inspect 1"
if [ -f /run/berth/agent.json ]; then
  printf 'agent %s\n' "$(b64 < /run/berth/agent.json)"
else
  echo "agent -"
fi
cd /workspace || fail workspace
printf '%s\n' "$BERTH_KNOWN" | grep -v '^$' > "$t/known"
if [ -e .git ]; then
  echo "git repo"
  g status --porcelain=v1 -z --untracked-files=all > "$t/status" || fail git-status
  printf 'porcelain %s\n' "$(b64 < "$t/status")"
  if g rev-parse -q --verify refs/stash > /dev/null; then
    stashes=$(g rev-list --walk-reflogs --count refs/stash) || fail git-stash
  else
    stashes=0
  fi
  echo "stashes $stashes"
  if g rev-parse -q --verify HEAD > /dev/null; then head=HEAD; else head=; fi
  unpushed=$(g rev-list --count --branches $head --not --remotes) || fail git-rev-list
  echo "unpushed $unpushed"
  while read -r hash path; do
    if [ -f "$path" ]; then
      sum=$(sha256sum < "$path") || fail known-files
      printf 'known %s %s\n' "$(printf '%s' "${path#./}" | b64)" "${sum%% *}"
    fi
  done < "$t/known"
else
  echo "git none"
  find . -type f -exec sha256sum {} + > "$t/sums" || fail hash
  # awk, not `grep -Fxv -f`: busybox grep matches every line against an empty pattern file,
  # which would call a workspace of unsaved files clean.
  unsaved=$(awk -v known="$t/known" 'FILENAME == known { k[$0] = 1; next } !($0 in k) { n++ }
    END { print n + 0 }' "$t/known" "$t/sums") || fail compare
  [ -n "$unsaved" ] || fail compare
  echo "nongit_unsaved $unsaved"
fi
printf 'tcp %s\n' "$(b64 < /proc/net/tcp)"
printf 'tcp6 %s\n' "$(cat /proc/net/tcp6 2>/dev/null | b64)"
ticks=$(cat /proc/[0-9]*/stat 2>/dev/null | awk -v me="$$" '
  { line = $0; sub(/^.*\) /, "", line); split(line, f, " ");
    parent[$1] = f[2]; used[$1] = f[12] + f[13] + f[14] + f[15] }
  END {
    for (pid in used) {
      p = pid; mine = 0
      for (depth = 0; depth < 64 && p != "" && p != 0; depth++) {
        if (p == me) { mine = 1; break }
        p = parent[p]
      }
      if (!mine) total += used[pid]
    }
    printf "%.0f", total
  }') || fail cpu
echo "cpu_ticks $ticks"
echo "clk_tck $(getconf CLK_TCK 2>/dev/null || echo 100)"
# GNU find prints times itself; busybox find has no -printf, and stat does it there.
newest=$( { find . -path ./.git -prune -o -printf '%T@\n' 2>/dev/null ||
  find . -path ./.git -prune -o -exec stat -c %Y {} + 2>/dev/null; } | sort -rn | head -n 1)
echo "newest_mtime ${newest:--}"
echo "end"
"#;

/// A file berth wrote into the workspace and the sha256 (hex) of what it wrote.
pub type KnownFiles = BTreeMap<String, String>;

/// The files berth recorded writing into the workspace (`status.seededFiles`, absolute paths
/// under /workspace), relative to /workspace as [`inspect`] takes them. A record it cannot read
/// yields nothing, which is the safe side: more files count as unsaved.
pub fn known_files_of(status: &serde_json::Value) -> KnownFiles {
    let Some(files) = status.get("seededFiles").and_then(|f| f.as_object()) else {
        return KnownFiles::new();
    };
    files
        .iter()
        .filter_map(|(path, hash)| {
            let relative = path.strip_prefix("/workspace/")?;
            Some((relative.to_string(), hash.as_str()?.to_string()))
        })
        .collect()
}

/// What berth expects of a workspace before inspecting it: the files it wrote there, the volume
/// that must be mounted on /workspace, and the ignored files that count as work.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Expected {
    /// The files berth wrote, relative to /workspace, with their sha256.
    pub known: KnownFiles,
    /// The project's workspace volume (`berth-<uid>-workspace`).
    pub volume: String,
    /// `spec.reap.protectIgnored`: globs of ignored files that count as unsaved work.
    pub protect_ignored: Vec<String>,
}

/// What to expect of a project's workspace: its uid's volume, `status.seededFiles` and
/// `spec.reap.protectIgnored`.
pub fn expected_of(object: &StoredObject) -> Expected {
    let protect_ignored = object
        .spec
        .pointer("/reap/protectIgnored")
        .and_then(|v| serde_json::from_value(v).ok())
        .unwrap_or_default();
    Expected {
        known: known_files_of(&object.status.value()),
        volume: DurableLayout::workspace_volume(object.uid()),
        protect_ignored,
    }
}

/// Why the workspace could not be inspected.
#[derive(Debug, thiserror::Error)]
pub enum InspectError {
    #[error("inspection timed out after {0:?}")]
    Timeout(Duration),
    #[error("inspection exec failed: {0}")]
    Exec(#[source] RuntimeError),
    #[error("inspection exited with {code}: {detail}")]
    Exited { code: i32, detail: String },
    #[error("inspection output unreadable: {0}")]
    Parse(String),
}

/// What the agent last wrote into its status file (untrusted: sanitise before display).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentReport {
    pub state: AgentState,
    pub brief_id: Option<String>,
    pub title: Option<String>,
    pub message: Option<String>,
    pub updated_at: Option<DateTime<Utc>>,
}

/// One listening socket.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Listener {
    pub port: u16,
}

/// The git state of the workspace, or the non-git equivalent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WorkspaceKind {
    Git,
    /// Not a repository: every file berth did not write (or changed since) counts as untracked.
    Plain,
}

/// Everything one inspection found.
#[derive(Debug, Clone, PartialEq)]
pub struct Inspection {
    /// `None` when the agent has not written its status file (yet, or since a reboot).
    pub agent: Option<AgentReport>,
    /// The agent status file exists but does not parse: reported, never fatal.
    pub agent_unreadable: bool,
    pub kind: WorkspaceKind,
    pub unsaved: UnsavedWork,
    /// Ports listening on a non-loopback address, 1024-65535, sorted and deduplicated.
    pub ports: Vec<u16>,
    /// Cumulative CPU time of every process in the container except the inspection's own.
    pub cpu: Duration,
    /// The newest modification time under /workspace, `.git` excluded.
    pub newest_mtime: Option<DateTime<Utc>>,
}

/// Runs the inspection in instance `name`, judging what it finds by `expected`.
pub async fn inspect(
    runtime: &dyn Runtime,
    name: &str,
    expected: &Expected,
    timeout: Duration,
) -> Result<Inspection, InspectError> {
    let mut request = ExecRequest::new(["/bin/sh", "-c", SCRIPT], timeout);
    request
        .env
        .insert("BERTH_KNOWN".into(), known_lines(&expected.known));
    request.env.insert("LC_ALL".into(), "C".into());
    request.env.insert(
        "PATH".into(),
        "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into(),
    );
    // LXD cannot cancel an exec; the outer timeout also covers a stalled connection.
    let exec = tokio::time::timeout(
        timeout + Duration::from_secs(5),
        runtime.exec(name, &request),
    );
    let output = match exec.await {
        Err(_) | Ok(Err(RuntimeError::Timeout { .. })) => {
            return Err(InspectError::Timeout(timeout));
        }
        Ok(Err(e)) => return Err(InspectError::Exec(e)),
        Ok(Ok(output)) => output,
    };
    if !output.success() {
        let stdout = output.stdout_str();
        let detail = stdout
            .lines()
            .find_map(|l| l.strip_prefix("error "))
            .map(str::to_string)
            .unwrap_or_else(|| output.stderr_str().trim().chars().take(200).collect());
        return Err(InspectError::Exited {
            code: output.exit_code,
            detail,
        });
    }
    parse_report(&output.stdout_str(), &expected.known)
}

/// `BERTH_KNOWN`: the `sha256sum` lines the files berth wrote would produce if unchanged.
fn known_lines(known: &KnownFiles) -> String {
    known
        .iter()
        .map(|(path, hash)| {
            format!(
                "{}  ./{}",
                hash.to_ascii_lowercase(),
                path.trim_start_matches("./")
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn parse_err(what: impl Into<String>) -> InspectError {
    InspectError::Parse(what.into())
}

/// Parses the script's report. Every field the script always prints must be present exactly
/// once, and the report must end with `end`.
pub fn parse_report(text: &str, known: &KnownFiles) -> Result<Inspection, InspectError> {
    let mut lines = text.lines();
    if lines.next() != Some(HEADER) {
        return Err(parse_err("missing header"));
    }
    let mut fields: BTreeMap<&str, &str> = BTreeMap::new();
    let mut known_now: BTreeMap<String, String> = BTreeMap::new();
    let mut ended = false;
    for line in lines {
        if ended {
            return Err(parse_err("output after end"));
        }
        if line == "end" {
            ended = true;
            continue;
        }
        let (key, value) = line.split_once(' ').unwrap_or((line, ""));
        if key == "known" {
            let (path, hash) = value
                .split_once(' ')
                .ok_or_else(|| parse_err("malformed known line"))?;
            known_now.insert(decode_text(path, "known path")?, hash.to_string());
            continue;
        }
        if fields.insert(key, value).is_some() {
            return Err(parse_err(format!("{key} reported twice")));
        }
    }
    if !ended {
        return Err(parse_err("report cut short (no end line)"));
    }
    let field = |key: &str| {
        fields
            .get(key)
            .copied()
            .ok_or_else(|| parse_err(format!("missing {key}")))
    };
    let count = |key: &str| -> Result<u32, InspectError> {
        field(key)?
            .trim()
            .parse()
            .map_err(|_| parse_err(format!("{key} is not a count")))
    };

    let (agent, agent_unreadable) = match field("agent")? {
        "-" => (None, false),
        encoded => match parse_agent(&decode(encoded, "agent")?) {
            Some(report) => (Some(report), false),
            None => (None, true),
        },
    };

    let (kind, unsaved) = match field("git")? {
        "repo" => {
            let porcelain = decode(field("porcelain")?, "porcelain")?;
            let (uncommitted, untracked) = count_changes(&porcelain, known, &known_now)?;
            (
                WorkspaceKind::Git,
                UnsavedWork {
                    uncommitted,
                    untracked,
                    stashes: count("stashes")?,
                    unpushed: count("unpushed")?,
                },
            )
        }
        "none" => (
            WorkspaceKind::Plain,
            UnsavedWork {
                untracked: count("nongit_unsaved")?,
                ..UnsavedWork::default()
            },
        ),
        other => return Err(parse_err(format!("unknown git state {other:?}"))),
    };

    let mut ports = BTreeSet::new();
    for key in ["tcp", "tcp6"] {
        let table = decode_text(field(key)?, key)?;
        ports.extend(listening_ports(&table)?);
    }

    let ticks: u64 = field("cpu_ticks")?
        .parse()
        .map_err(|_| parse_err("cpu_ticks is not a number"))?;
    let clk_tck: u64 = field("clk_tck")?
        .trim()
        .parse()
        .ok()
        .filter(|&n| n > 0)
        .ok_or_else(|| parse_err("clk_tck is not a positive number"))?;
    let cpu = Duration::from_millis(ticks.saturating_mul(1000) / clk_tck);

    let newest_mtime = match field("newest_mtime")? {
        "-" | "" => None,
        secs => Some(parse_epoch(secs).ok_or_else(|| parse_err("newest_mtime is not a time"))?),
    };

    Ok(Inspection {
        agent,
        agent_unreadable,
        kind,
        unsaved,
        ports: ports.into_iter().collect(),
        cpu,
        newest_mtime,
    })
}

fn decode(encoded: &str, what: &str) -> Result<Vec<u8>, InspectError> {
    B64.decode(encoded.trim())
        .map_err(|_| parse_err(format!("{what} is not base64")))
}

fn decode_text(encoded: &str, what: &str) -> Result<String, InspectError> {
    String::from_utf8(decode(encoded, what)?).map_err(|_| parse_err(format!("{what} is not UTF-8")))
}

/// `git status --porcelain=v1 -z` → (uncommitted, untracked). Files berth wrote that still hold
/// what berth wrote do not count.
fn count_changes(
    porcelain: &[u8],
    known: &KnownFiles,
    known_now: &BTreeMap<String, String>,
) -> Result<(u32, u32), InspectError> {
    let berth_wrote = |path: &str| {
        known
            .get(path)
            .zip(known_now.get(path))
            .is_some_and(|(then, now)| then.eq_ignore_ascii_case(now))
    };
    let mut uncommitted = 0;
    let mut untracked = 0;
    let mut entries = porcelain.split(|&b| b == 0).filter(|e| !e.is_empty());
    while let Some(entry) = entries.next() {
        if entry.len() < 4 || entry[2] != b' ' {
            return Err(parse_err("malformed porcelain entry"));
        }
        let code = &entry[..2];
        let path = String::from_utf8_lossy(&entry[3..]);
        // A rename or copy is followed by its source path.
        if code.contains(&b'R') || code.contains(&b'C') {
            entries.next();
        }
        if berth_wrote(&path) {
            continue;
        }
        match code {
            b"??" => untracked += 1,
            b"!!" => {}
            _ => uncommitted += 1,
        }
    }
    Ok((uncommitted, untracked))
}

/// Ports in LISTEN state (0A) on a non-loopback address, 1024-65535, from /proc/net/tcp{,6}.
pub fn listening_ports(table: &str) -> Result<Vec<u16>, InspectError> {
    let mut ports = Vec::new();
    for line in table.lines().skip(1) {
        let cols: Vec<&str> = line.split_whitespace().collect();
        if cols.len() < 4 {
            return Err(parse_err("malformed /proc/net/tcp line"));
        }
        if cols[3] != "0A" {
            continue;
        }
        let (addr, port) = cols[1]
            .split_once(':')
            .ok_or_else(|| parse_err("malformed local address"))?;
        let port = u16::from_str_radix(port, 16).map_err(|_| parse_err("malformed local port"))?;
        if port < 1024 || is_loopback(addr)? {
            continue;
        }
        ports.push(port);
    }
    Ok(ports)
}

/// Whether a /proc/net/tcp{,6} address (hex, each 32-bit word in host byte order, which is
/// little-endian on every platform LXD runs on) is loopback: 127.0.0.0/8, ::1, or ::ffff:127.x.
fn is_loopback(addr: &str) -> Result<bool, InspectError> {
    let bad = || parse_err("malformed local address");
    let word = |i: usize| -> Result<[u8; 4], InspectError> {
        let hex = addr.get(i * 8..i * 8 + 8).ok_or_else(bad)?;
        Ok(u32::from_str_radix(hex, 16)
            .map_err(|_| bad())?
            .to_le_bytes())
    };
    match addr.len() {
        8 => Ok(word(0)?[0] == 127),
        32 => {
            let w = [word(0)?, word(1)?, word(2)?, word(3)?];
            let zero = [0u8; 4];
            let v6_loopback = w[0] == zero && w[1] == zero && w[2] == zero && w[3] == [0, 0, 0, 1];
            let v4_mapped_loopback =
                w[0] == zero && w[1] == zero && w[2] == [0, 0, 0xff, 0xff] && w[3][0] == 127;
            Ok(v6_loopback || v4_mapped_loopback)
        }
        _ => Err(bad()),
    }
}

fn parse_epoch(text: &str) -> Option<DateTime<Utc>> {
    let (secs, frac) = text.trim().split_once('.').unwrap_or((text.trim(), ""));
    let secs: i64 = secs.parse().ok()?;
    let nanos = if frac.is_empty() {
        0
    } else {
        let digits: String = frac.chars().take(9).collect();
        let scale = 10u32.pow(9 - digits.len() as u32);
        digits.parse::<u32>().ok()? * scale
    };
    Utc.timestamp_opt(secs, nanos).single()
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct AgentFile {
    #[serde(default)]
    brief_id: Option<String>,
    #[serde(default)]
    state: Option<String>,
    #[serde(default)]
    title: Option<String>,
    #[serde(default)]
    message: Option<String>,
    #[serde(default)]
    updated_at: Option<String>,
}

/// The agent status file; `None` when it is not the JSON object of the contract (an agent
/// writing it non-atomically may be caught mid-write).
fn parse_agent(bytes: &[u8]) -> Option<AgentReport> {
    let file: AgentFile = serde_json::from_slice(bytes).ok()?;
    Some(AgentReport {
        state: file
            .state
            .as_deref()
            .map_or(AgentState::Unknown, AgentState::parse),
        brief_id: file.brief_id,
        title: file.title,
        message: file.message,
        updated_at: file
            .updated_at
            .and_then(|t| DateTime::parse_from_rfc3339(&t).ok())
            .map(|t| t.with_timezone(&Utc)),
    })
}

#[cfg(test)]
#[path = "inspect_tests.rs"]
mod tests;
