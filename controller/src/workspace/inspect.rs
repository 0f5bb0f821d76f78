//! One exec round trip that tells what a running workspace holds: the agent's status file, the
//! git state of /workspace, listening ports, CPU time used, the newest file change and the
//! container's IPv4 addresses.
//!
//! The script prints one `key value` line per fact, untrusted text base64-encoded so that no file
//! name or agent message can forge a line, and ends with `end`. Anything short of a complete,
//! well-formed report is [`InspectError`]: "could not tell" is never "nothing to lose".
//!
//! The report is judged against [`Expected`]: the volume that must be mounted on /workspace (seen
//! in `/proc/self/mountinfo`, read with shell builtins alone; anything else fails the
//! inspection), the files berth wrote with their hashes, and `spec.reap.protectIgnored`. Every
//! repository under /workspace counts, and linked worktrees outside it; remotes that are paths
//! inside the container do not count, present or gone, except the project's own `file://`
//! repository. The IDE's state (`/workspace/.berth/ide/`) is left out of unsaved work and file
//! activity; the IPv4 addresses (by interface, for the network pass) are `None` without `ip`.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use berth_api::{AgentState, ReapPolicy, UnsavedWork};
use chrono::{DateTime, TimeZone, Utc};
use serde::Deserialize;

use crate::agent::{ENV_BLOCK_BEGIN, ENV_BLOCK_END};
use crate::layout::DurableLayout;
use crate::runtime::{ExecRequest, Runtime, RuntimeError};
use crate::store::StoredObject;

/// Where the agent reports (DESIGN "Agent status contract").
pub const AGENT_STATUS_FILE: &str = "/run/berth/agent.json";
/// The workspace every project's work lives in.
pub const WORKSPACE: &str = "/workspace";

/// The first line of a report; a new format gets a new version.
pub const HEADER: &str = "berth-inspect 3";

/// The inspection, run by `sh -c` (its environment is described at its top).
///
/// Git runs with `--no-optional-locks` so that inspecting never refreshes the index, which would
/// both touch .git and make the inspection look like activity.
/// The inspection script, run by `sh -c` with the environment [`inspect`] gives it (public for
/// the raw-LXD baseline of `scripts/bench-reconcile`, which looks the same way).
pub const SCRIPT: &str = include_str!("inspect.sh");

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
    /// `spec.repo.url`: the one remote whose path may be absent from the container and still
    /// count (a `file://` repository on the berth host).
    pub origin: Option<String>,
}

/// What to expect of a project's workspace: its uid's volume, `status.seededFiles` and
/// `spec.reap.protectIgnored`. A project stored before that field existed has none set, and
/// gets the built-in globs: more files counted as work is the safe side.
pub fn expected_of(object: &StoredObject) -> Expected {
    let protect_ignored = object
        .spec
        .pointer("/reap/protectIgnored")
        .and_then(|v| serde_json::from_value(v).ok())
        .unwrap_or_else(ReapPolicy::default_protect_ignored);
    Expected {
        known: known_files_of(&object.status.value()),
        volume: DurableLayout::workspace_volume(object.uid()),
        protect_ignored,
        origin: object
            .spec
            .pointer("/repo/url")
            .and_then(|v| v.as_str().map(str::to_string)),
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
    pub session_id: Option<String>,
    pub exit_code: Option<i32>,
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
    /// IPv4 addresses with their prefix length by interface, loopback included; `None` when
    /// the container has no `ip` to tell.
    pub ipv4: Option<BTreeMap<String, Vec<String>>>,
}

/// Runs the inspection in instance `name`, judging what it finds by `expected`.
pub async fn inspect(
    runtime: &dyn Runtime,
    name: &str,
    expected: &Expected,
    timeout: Duration,
) -> Result<Inspection, InspectError> {
    let mut request = ExecRequest::new(["/bin/sh", "-c", SCRIPT], timeout);
    let env = [
        ("BERTH_KNOWN", known_lines(&expected.known)),
        ("BERTH_VOLUME", expected.volume.clone()),
        ("BERTH_PROTECT", pathspecs(&expected.protect_ignored)),
        ("BERTH_ENV_BEGIN", ENV_BLOCK_BEGIN.to_string()),
        ("BERTH_ENV_END", ENV_BLOCK_END.to_string()),
        ("BERTH_ORIGIN", expected.origin.clone().unwrap_or_default()),
        ("LC_ALL", "C".to_string()),
    ];
    request
        .env
        .extend(env.into_iter().map(|(k, v)| (k.to_string(), v)));
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

/// `BERTH_PROTECT`: `spec.reap.protectIgnored` as git pathspecs, one a line, so that git itself
/// matches them as gitignore would: a glob without `/` matches the base name at any depth, one
/// with `/` the path from the repository's top, one ending in `/` everything under it.
pub fn pathspecs(globs: &[String]) -> String {
    globs
        .iter()
        .filter(|g| !g.is_empty() && !g.contains('\n'))
        .map(|glob| {
            let (glob, dir) = match glob.strip_suffix('/') {
                Some(dir) => (dir, true),
                None => (glob.as_str(), false),
            };
            let glob = glob.trim_start_matches('/');
            let anywhere = if glob.contains('/') { "" } else { "**/" };
            let under = if dir { "/**" } else { "" };
            format!(":(glob){anywhere}{glob}{under}")
        })
        .collect::<Vec<_>>()
        .join("\n")
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
/// once (`known` and `repo` lines as often as there are files and repositories), and the report
/// must end with `end`.
pub fn parse_report(text: &str, known: &KnownFiles) -> Result<Inspection, InspectError> {
    let mut lines = text.lines();
    if lines.next() != Some(HEADER) {
        return Err(parse_err("missing header"));
    }
    let mut fields: BTreeMap<&str, &str> = BTreeMap::new();
    let mut known_now: BTreeMap<String, String> = BTreeMap::new();
    let mut repos: Vec<&str> = Vec::new();
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
        match key {
            "known" => {
                let (path, hash) = value
                    .split_once(' ')
                    .ok_or_else(|| parse_err("malformed known line"))?;
                known_now.insert(decode_text(path, "known path")?, hash.to_string());
            }
            "repo" => repos.push(value),
            _ => {
                if fields.insert(key, value).is_some() {
                    return Err(parse_err(format!("{key} reported twice")));
                }
            }
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

    let mut work = Work::default();
    // Files berth wrote are judged by their hash wherever they are; `.env` by the lines outside
    // berth's block, since its recorded hash also covers a person's lines.
    for (path, now) in &known_now {
        let Some(then) = known.get(path) else {
            continue;
        };
        if path != ENV_PATH && !then.eq_ignore_ascii_case(now) {
            work.unsaved.modified_seeds += 1;
            work.note(path);
        }
    }
    let env_mine = count("env_mine")?;
    if known.contains_key(ENV_PATH) && env_mine > 0 {
        work.unsaved.modified_seeds += 1;
        work.note(ENV_PATH);
    }

    let kind = match field("git")? {
        "repo" => {
            if !repos.iter().any(|r| r.starts_with("main ")) {
                return Err(parse_err("missing the workspace's repository"));
            }
            for repo in repos {
                work.add_repo(repo, known, &known_now)?;
            }
            WorkspaceKind::Git
        }
        "none" => {
            work.unsaved.untracked += count("nongit_unsaved")?;
            for path in decode_list(field("nongit_files")?, b'\n', "nongit_files")? {
                work.note(path.strip_prefix("./").unwrap_or(&path));
            }
            WorkspaceKind::Plain
        }
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

    let ipv4 = match field("ipv4")? {
        "-" => None,
        encoded => Some(ipv4_addresses(&decode_text(encoded, "ipv4")?)),
    };

    Ok(Inspection {
        agent,
        agent_unreadable,
        kind,
        unsaved: work.unsaved,
        ports: ports.into_iter().collect(),
        cpu,
        newest_mtime,
        ipv4,
    })
}

/// The most interfaces, and addresses on one, an inspection reports: the text is the
/// container's, so nothing it prints is held without a bound.
const MAX_INTERFACES: usize = 64;
const MAX_ADDRESSES: usize = 64;

/// `ip -o -f inet addr show` (iproute2 and busybox print the same columns: index, interface,
/// `inet`, address/prefix) as addresses by interface. A line that is not a well-formed IPv4
/// address of a plausible interface name is left out.
pub fn ipv4_addresses(text: &str) -> BTreeMap<String, Vec<String>> {
    let mut found: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for line in text.lines() {
        let mut words = line.split_whitespace().skip(1);
        let (Some(interface), Some("inet"), Some(address)) =
            (words.next(), words.next(), words.next())
        else {
            continue;
        };
        let interface = interface.split('@').next().unwrap_or(interface);
        let plausible_name = !interface.is_empty()
            && interface.len() <= 15
            && interface.chars().all(|c| c.is_ascii_graphic() && c != '/');
        let Some((ip, prefix)) = address.split_once('/') else {
            continue;
        };
        let well_formed =
            ip.parse::<std::net::Ipv4Addr>().is_ok() && prefix.parse::<u8>().is_ok_and(|p| p <= 32);
        if !plausible_name || !well_formed {
            continue;
        }
        if found.len() >= MAX_INTERFACES && !found.contains_key(interface) {
            continue;
        }
        let addresses = found.entry(interface.to_string()).or_default();
        if addresses.len() < MAX_ADDRESSES && !addresses.iter().any(|a| a == address) {
            addresses.push(address.to_string());
        }
    }
    found
}

/// The managed environment file, relative to /workspace.
const ENV_PATH: &str = ".env";
/// How long a name in `files` may be.
const MAX_NAME: usize = 200;

/// The unsaved work found so far, and the names of what holds it.
#[derive(Default)]
struct Work {
    unsaved: UnsavedWork,
}

impl Work {
    /// Names `name` in `files` (untrusted: control characters replaced, length bounded), up
    /// to [`UnsavedWork::MAX_FILES`] distinct names.
    fn note(&mut self, name: &str) {
        let files = &mut self.unsaved.files;
        if files.len() >= UnsavedWork::MAX_FILES {
            return;
        }
        let mut clean: String = name
            .chars()
            .map(|c| if c.is_control() { '?' } else { c })
            .take(MAX_NAME)
            .collect();
        if name.chars().count() > MAX_NAME {
            clean.push('…');
        }
        if !files.contains(&clean) {
            files.push(clean);
        }
    }

    /// Names an unpushed commit (`HASH on REF`; untrusted, bounded as `files` is), up to
    /// [`UnsavedWork::MAX_FILES`].
    fn note_commit(&mut self, hash: &str, reference: &str) {
        let commits = &mut self.unsaved.commits;
        if commits.len() >= UnsavedWork::MAX_FILES
            || hash.is_empty()
            || !hash.chars().all(|c| c.is_ascii_hexdigit())
        {
            return;
        }
        let reference: String = reference
            .chars()
            .map(|c| if c.is_control() { '?' } else { c })
            .take(MAX_NAME)
            .collect();
        let hash: String = hash.chars().take(40).collect();
        commits.push(format!("{hash} on {reference}"));
    }

    /// One `repo` line: `KIND DIR PORCELAIN STASHES UNPUSHED FLAGGED IGNORED`, `-` for empty.
    fn add_repo(
        &mut self,
        line: &str,
        known: &KnownFiles,
        known_now: &BTreeMap<String, String>,
    ) -> Result<(), InspectError> {
        let cols: Vec<&str> = line.split(' ').collect();
        let [kind, dir, porcelain, stashes, unpushed, flagged, ignored] = cols[..] else {
            return Err(parse_err("malformed repo line"));
        };
        let dir = decode_text(dir, "repo directory")?;
        let main = match kind {
            "main" => true,
            "nested" => false,
            "outside" => {
                self.unsaved.worktrees += 1;
                self.note(&dir);
                false
            }
            other => return Err(parse_err(format!("unknown repository kind {other:?}"))),
        };
        // Paths as seen from /workspace; a worktree outside it by its absolute path.
        let prefix = match dir.strip_prefix("./") {
            _ if main => String::new(),
            Some(rel) => format!("{rel}/"),
            None => format!("{}/", dir.trim_end_matches('/')),
        };
        let within = |what: &str| {
            if main {
                what.to_string()
            } else {
                format!("{what} in {}", prefix.trim_end_matches('/'))
            }
        };

        let porcelain = decode_or_empty(porcelain, "porcelain")?;
        let excused = |path: &str| main && berth_wrote(path, known, known_now);
        for (code, path) in porcelain_entries(&porcelain)? {
            if excused(&path) {
                continue;
            }
            match code {
                Change::Untracked => self.unsaved.untracked += 1,
                Change::Ignored => continue,
                Change::Changed => self.unsaved.uncommitted += 1,
            }
            self.note(&format!("{prefix}{path}"));
        }

        let stashes: u32 = stashes
            .parse()
            .map_err(|_| parse_err("stashes is not a count"))?;
        if stashes > 0 {
            self.unsaved.stashes += stashes;
            self.note(&within("refs/stash"));
        }

        // `COUNT REF [HASH...]`: the commits only REF reaches, the first few named.
        for entry in decode_list(unpushed, b'\n', "unpushed")? {
            let mut words = entry.split_whitespace();
            let (Some(n), Some(reference)) = (words.next(), words.next()) else {
                return Err(parse_err("malformed unpushed line"));
            };
            let n: u32 = n
                .parse()
                .map_err(|_| parse_err("unpushed is not a count"))?;
            self.unsaved.unpushed = self.unsaved.unpushed.saturating_add(n);
            let reference = within(reference);
            for hash in words {
                self.note_commit(hash, &reference);
            }
            self.note(&reference);
        }

        for path in decode_list(flagged, b'\n', "flagged")? {
            self.unsaved.uncommitted += 1;
            self.note(&format!("{prefix}{path}"));
        }

        // Berth's own files are judged by their hash alone.
        for path in decode_list(ignored, 0, "ignored")? {
            if main && known.contains_key(&path) {
                continue;
            }
            self.unsaved.ignored += 1;
            self.note(&format!("{prefix}{path}"));
        }
        Ok(())
    }
}

/// Whether the workspace's `path` still holds what berth wrote there.
fn berth_wrote(path: &str, known: &KnownFiles, known_now: &BTreeMap<String, String>) -> bool {
    known
        .get(path)
        .zip(known_now.get(path))
        .is_some_and(|(then, now)| then.eq_ignore_ascii_case(now))
}

fn decode(encoded: &str, what: &str) -> Result<Vec<u8>, InspectError> {
    B64.decode(encoded.trim())
        .map_err(|_| parse_err(format!("{what} is not base64")))
}

fn decode_text(encoded: &str, what: &str) -> Result<String, InspectError> {
    String::from_utf8(decode(encoded, what)?).map_err(|_| parse_err(format!("{what} is not UTF-8")))
}

/// A field the script prints as `-` when what it encodes is empty.
fn decode_or_empty(encoded: &str, what: &str) -> Result<Vec<u8>, InspectError> {
    match encoded {
        "-" => Ok(Vec::new()),
        _ => decode(encoded, what),
    }
}

/// A list of names separated by `separator`, empty entries dropped (names may be any bytes:
/// read lossily, they are only counted and shown).
fn decode_list(encoded: &str, separator: u8, what: &str) -> Result<Vec<String>, InspectError> {
    Ok(decode_or_empty(encoded, what)?
        .split(|&b| b == separator)
        .filter(|e| !e.is_empty())
        .map(|e| String::from_utf8_lossy(e).into_owned())
        .collect())
}

/// What `git status` says of one path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Change {
    Changed,
    Untracked,
    Ignored,
}

/// `git status --porcelain=v1 -z` → its entries (a rename's or copy's source path skipped).
fn porcelain_entries(porcelain: &[u8]) -> Result<Vec<(Change, String)>, InspectError> {
    let mut out = Vec::new();
    let mut entries = porcelain.split(|&b| b == 0).filter(|e| !e.is_empty());
    while let Some(entry) = entries.next() {
        if entry.len() < 4 || entry[2] != b' ' {
            return Err(parse_err("malformed porcelain entry"));
        }
        let code = &entry[..2];
        let path = String::from_utf8_lossy(&entry[3..]).into_owned();
        // A rename or copy is followed by its source path.
        if code.contains(&b'R') || code.contains(&b'C') {
            entries.next();
        }
        let change = match code {
            b"??" => Change::Untracked,
            b"!!" => Change::Ignored,
            _ => Change::Changed,
        };
        out.push((change, path));
    }
    Ok(out)
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
    #[serde(default)]
    session_id: Option<String>,
    #[serde(default)]
    exit_code: Option<i32>,
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
        session_id: file.session_id,
        exit_code: file.exit_code,
    })
}

#[cfg(test)]
#[path = "inspect_tests.rs"]
mod tests;
