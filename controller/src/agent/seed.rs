//! Seeded: the instructions files and skills of every profile, the managed `/workspace/.env`
//! and the project's seed files, written after the checkout.
//!
//! Seeds are written once: a file is (re)written only when it is missing or still holds exactly
//! what berth wrote there before (`previous`), so a person's edits are never overwritten and a
//! re-run with the same content changes nothing. `.env` is the exception, being merged: berth
//! owns only the block between its marker lines, and lines outside it are kept.
//!
//! A skill's files are seeds like any other, placed at `<target>/<name>/`. A file berth placed
//! under a skill target that no skill holds any more (or for a capability the project no longer
//! has) is removed while it is still as berth
//! wrote it, so a target converges on the skills of the profiles the project lists.
//!
//! The result records the SHA-256 of every file berth wrote, so the reaper can tell berth's files
//! from the user's unsaved work; in a git workspace those paths are also listed in
//! `.git/info/exclude`, so they do not show up as untracked.

use std::collections::BTreeMap;
use std::time::Duration;

use berth_api::files::is_within;
use berth_api::{FileMode, MergeMode, ProjectSpec, workspace_dir_path};
use serde::{Deserialize, Serialize};

use super::capability::Found as CapabilitiesFound;
use super::exec::{exit_failure, run_script, sha256_hex, write_file};
use super::{AgentError, NamedProfile, Result, SkillSet};
use crate::runtime::Runtime;

const REASON: &str = "SeedFailed";
const SEED_TIMEOUT: Duration = Duration::from_secs(60);

/// The managed environment file.
pub const ENV_FILE: &str = "/workspace/.env";
/// The most of `.env` berth reads back to rewrite its block: anyone who runs code in the
/// workspace can write the file, so a larger one fails the step instead of being read whole.
pub const ENV_FILE_MAX_BYTES: u64 = 16 << 20;
/// The marker lines around berth's block in `.env`.
pub const ENV_BLOCK_BEGIN: &str =
    "# >>> berth managed: lines up to the end marker are rewritten by berth >>>";
pub const ENV_BLOCK_END: &str = "# <<< berth managed <<<";

/// Files berth wrote under /workspace: absolute path → lowercase hex SHA-256 of the content.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WrittenFiles {
    pub files: BTreeMap<String, String>,
}

impl WrittenFiles {
    /// Whether `path` holds exactly what berth wrote there (so it is not the user's work).
    pub fn is_berths(&self, path: &str, content_sha256: &str) -> bool {
        self.files.get(path).is_some_and(|h| h == content_sha256)
    }

    pub fn get(&self, path: &str) -> Option<&str> {
        self.files.get(path).map(String::as_str)
    }

    fn record(&mut self, path: &str, hash: &str) {
        self.files.insert(path.to_string(), hash.to_string());
    }
}

/// What a seed did. `written` replaces the previous record.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SeedReport {
    pub written: WrittenFiles,
    /// Paths (re)written by this call.
    pub changed: Vec<String>,
    /// Skill and capability files removed by this call: no skill or capability holds them any
    /// more.
    pub removed: Vec<String>,
    /// Files left alone because someone else's content is there, for warning events.
    pub warnings: Vec<String>,
}

/// A file berth wants under /workspace.
#[derive(Debug, Clone, PartialEq, Eq)]
struct DesiredFile {
    path: String,
    content: Vec<u8>,
    mode: u32,
    /// What asked for it (`instructions of profile claude`, `spec.seedFiles[1]`), for the
    /// warning when the file is kept as someone else wrote it.
    sources: Vec<String>,
}

/// What the container holds at a path.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Found {
    Missing,
    File(String),
    /// A directory, symbolic link or device: berth never writes through it.
    NotRegular,
    /// Its directory resolves outside /workspace (a symbolic link in the checkout).
    Escapes,
}

/// What one seed converges the workspace to, besides the spec.
pub struct SeedInputs<'a> {
    /// Every profile the project lists.
    pub profiles: &'a [NamedProfile<'a>],
    /// The profiles' skills as [`super::read_skills`] read them.
    pub skills: &'a SkillSet,
    /// What the container offers the capabilities ([`super::capability::look`]).
    pub capabilities: &'a CapabilitiesFound,
    /// The project's secrets, for `.env`.
    pub secrets: &'a BTreeMap<String, String>,
    /// The record the last seed returned (empty the first time).
    pub previous: &'a WrittenFiles,
}

/// Converges the seeded files.
pub async fn seed(
    rt: &dyn Runtime,
    instance: &str,
    spec: &ProjectSpec,
    inputs: SeedInputs<'_>,
) -> Result<SeedReport> {
    let SeedInputs {
        profiles,
        skills,
        capabilities,
        secrets,
        previous,
    } = inputs;
    let mut report = SeedReport {
        warnings: skills.warnings.clone(),
        ..SeedReport::default()
    };
    let desired = desired_files(spec, profiles, skills, capabilities, &mut report.warnings)?;
    let env = env_entries(&spec.env, secrets);

    let mut paths: Vec<&str> = desired.iter().map(|d| d.path.as_str()).collect();
    paths.push(ENV_FILE);
    for path in previous.files.keys() {
        if !paths.contains(&path.as_str()) {
            paths.push(path);
        }
    }
    let (is_git, found) = probe(rt, instance, &paths).await?;
    let found_at = |path: &str| found.get(path).cloned().unwrap_or(Found::Missing);
    let refuse = |path: &str, what: &Found| {
        AgentError::SeedFailed {
        path: path.to_string(),
        message: match what {
            Found::Escapes => "its directory resolves outside /workspace".to_string(),
            _ => "is not a regular file (a directory or symbolic link); berth does not write through it"
                .to_string(),
        },
    }
    };

    // Files berth keeps as it found them with no record of its own: out of the exclude list,
    // so git shows them as what they are, a person's or the repository's.
    let mut released: Vec<&str> = Vec::new();
    for file in &desired {
        let hash = sha256_hex(&file.content);
        let write = match found_at(&file.path) {
            what @ (Found::NotRegular | Found::Escapes) => return Err(refuse(&file.path, &what)),
            Found::Missing => true,
            Found::File(current) if current == hash => false,
            Found::File(current) if previous.get(&file.path) == Some(current.as_str()) => true,
            Found::File(_) => {
                report.warnings.push(kept_warning(file));
                // A file berth wrote and a person changed keeps berth's record, so that every
                // later inspection counts the change as work.
                match previous.get(&file.path) {
                    Some(then) => report.written.record(&file.path, then),
                    None => released.push(&file.path),
                }
                continue;
            }
        };
        if write {
            write_file(rt, instance, REASON, &file.path, &file.content, file.mode).await?;
            report.changed.push(file.path.clone());
        }
        report.written.record(&file.path, &hash);
    }

    let env_found = found_at(ENV_FILE);
    if let what @ (Found::NotRegular | Found::Escapes) = &env_found {
        return Err(refuse(ENV_FILE, what));
    }
    let (hash, changed) = converge_env(rt, instance, &env_found, &env).await?;
    // A `.env` that went away has no mode to set.
    if changed && hash.is_some() {
        report.changed.push(ENV_FILE.to_string());
    }
    if let Some(hash) = hash {
        report.written.record(ENV_FILE, &hash);
    }

    // A file berth placed under a skill target that no skill holds any more, or for a
    // capability the project no longer has, goes while it is as berth wrote it (a browser
    // configuration left behind would still be handed to the agent).
    let targets = skill_targets(profiles);
    for (path, hash) in &previous.files {
        let stale = !report.written.files.contains_key(path)
            && (targets.iter().any(|t| is_within(path, t) && path != t)
                || super::capability::is_capability_file(path))
            && found_at(path) == Found::File(hash.clone());
        if stale {
            rt.file_delete(instance, path)
                .await
                .map_err(|source| AgentError::Runtime {
                    reason: REASON,
                    what: format!("delete {path} in {instance}"),
                    source,
                })?;
            report.removed.push(path.clone());
        }
    }
    if !report.removed.is_empty() {
        let mut tops = targets.clone();
        tops.push(super::capability::DIR.to_string());
        prune_directories(rt, instance, &report.removed, &tops).await?;
    }
    let removed: Vec<&str> = report.removed.iter().map(String::as_str).collect();
    released.extend(removed);

    // Files berth wrote for an earlier spec keep their record while they are there: as berth
    // wrote them they are berth's, changed they are a person's work.
    for (path, hash) in &previous.files {
        if !report.written.files.contains_key(path)
            && path != ENV_FILE
            && !report.removed.contains(path)
            && matches!(found_at(path), Found::File(_))
        {
            report.written.record(path, hash);
        }
    }

    // The file API sets a mode only when it creates a file: set it on rewritten ones too.
    let modes: Vec<(u32, &str)> = report
        .changed
        .iter()
        .map(|path| {
            let mode = desired
                .iter()
                .find(|d| &d.path == path)
                .map_or(0o600, |d| d.mode);
            (mode, path.as_str())
        })
        .collect();
    if !modes.is_empty() || (is_git && !(report.written.files.is_empty() && released.is_empty())) {
        finish(rt, instance, &modes, &released, &report.written).await?;
    }
    Ok(report)
}

/// Converges `.env` alone: for secrets propagation after the workspace was seeded (a new,
/// changed or deleted secret), without touching any other seeded file. Returns the record with
/// the new `.env` entry (or without one, when no values are left) and whether it was rewritten.
/// In a git workspace berth's files are listed in `.git/info/exclude` as [`seed`] lists them: a
/// secret must never show up as a file to commit, whenever `.env` first appears.
pub async fn sync_env(
    rt: &dyn Runtime,
    instance: &str,
    env: &BTreeMap<String, String>,
    secrets: &BTreeMap<String, String>,
    previous: &WrittenFiles,
) -> Result<(WrittenFiles, bool)> {
    let entries = env_entries(env, secrets);
    let (is_git, found) = probe(rt, instance, &[ENV_FILE]).await?;
    let found = found.get(ENV_FILE).cloned().unwrap_or(Found::Missing);
    if matches!(found, Found::NotRegular | Found::Escapes) {
        return Err(AgentError::SeedFailed {
            path: ENV_FILE.to_string(),
            message: "is not a regular file inside /workspace".to_string(),
        });
    }
    let (hash, changed) = converge_env(rt, instance, &found, &entries).await?;
    let mut written = previous.clone();
    match &hash {
        Some(hash) => written.record(ENV_FILE, hash),
        None => {
            written.files.remove(ENV_FILE);
        }
    }
    let modes: &[(u32, &str)] = if changed && hash.is_some() {
        &[(0o600, ENV_FILE)]
    } else {
        &[]
    };
    if !modes.is_empty() || (is_git && !written.files.is_empty()) {
        finish(rt, instance, modes, &[], &written).await?;
    }
    Ok((written, changed))
}

/// Rewrites berth's block of `.env` (a regular file or missing, as `found` says). Returns the
/// hash to record (`None` when berth has no values there) and whether the file changed.
async fn converge_env(
    rt: &dyn Runtime,
    instance: &str,
    found: &Found,
    entries: &BTreeMap<String, String>,
) -> Result<(Option<String>, bool)> {
    let existing = match found {
        Found::File(_) => rt
            .file_read(instance, ENV_FILE, ENV_FILE_MAX_BYTES)
            .await
            .map_err(|source| AgentError::Runtime {
                reason: REASON,
                what: format!("read {ENV_FILE} in {instance}"),
                source,
            })?,
        _ if entries.is_empty() => return Ok((None, false)),
        _ => Vec::new(),
    };
    let content = env_file_with_block(&existing, entries);
    if content.is_empty() && !existing.is_empty() {
        // Nothing but berth's block was there: the file goes with it, rather than stay
        // behind empty as a file nobody wrote.
        rt.file_delete(instance, ENV_FILE)
            .await
            .map_err(|source| AgentError::Runtime {
                reason: REASON,
                what: format!("delete {ENV_FILE} in {instance}"),
                source,
            })?;
        return Ok((None, true));
    }
    let changed = content != existing || !matches!(found, Found::File(_));
    if changed {
        write_file(rt, instance, REASON, ENV_FILE, &content, 0o600).await?;
    }
    let hash = (!entries.is_empty()).then(|| sha256_hex(&content));
    Ok((hash, changed))
}

/// The instructions of every profile, their skills, then the seed files on top, in the spec's
/// order. A skill file at a path another profile's skill placed with other content is left
/// out, with a warning.
fn desired_files(
    spec: &ProjectSpec,
    profiles: &[NamedProfile<'_>],
    skills: &SkillSet,
    capabilities: &CapabilitiesFound,
    warnings: &mut Vec<String>,
) -> Result<Vec<DesiredFile>> {
    let mut files: Vec<DesiredFile> = Vec::new();
    for (name, profile) in profiles {
        let Some(instructions) = &profile.instructions else {
            continue;
        };
        let path = instructions
            .target_path()
            .ok_or_else(|| AgentError::InvalidProfile {
                profile: name.to_string(),
                field: "spec.instructions.target".to_string(),
                message: format!("{:?} must lie under /workspace", instructions.target),
            })?;
        let source = format!("the instructions of profile {name}");
        match files.iter_mut().find(|f| f.path == path) {
            // Profiles sharing a target (AGENTS.md for every Codex-based agent) share the file.
            Some(existing) if contains(&existing.content, instructions.content.as_bytes()) => {
                existing.sources.push(source);
            }
            Some(existing) => {
                append(&mut existing.content, instructions.content.as_bytes());
                existing.sources.push(source);
            }
            None => files.push(DesiredFile {
                path,
                content: instructions.content.clone().into_bytes(),
                mode: 0o644,
                sources: vec![source],
            }),
        }
    }
    for skill in &skills.files {
        match files.iter_mut().find(|f| f.path == skill.path) {
            // Profiles sharing a target and a skill (two Codex-based agents) share its files.
            Some(existing) if existing.content == skill.content => {
                existing.sources.push(skill.source.clone());
            }
            Some(existing) => warnings.push(format!(
                "{} is not placed from {}: {} placed other content there",
                skill.path,
                skill.source,
                existing.sources.join(", ")
            )),
            None => files.push(DesiredFile {
                path: skill.path.clone(),
                content: skill.content.clone(),
                mode: skill.mode,
                sources: vec![skill.source.clone()],
            }),
        }
    }
    for (i, seed) in spec.seed_files.iter().enumerate() {
        let path = seed.target().ok_or_else(|| AgentError::SeedFailed {
            path: seed.path.clone(),
            message: format!("spec.seedFiles[{i}].path must lie under /workspace"),
        })?;
        let mode = seed.mode.map(FileMode::bits);
        let merge = seed.merge.unwrap_or_default();
        let source = match merge {
            MergeMode::Append => format!("spec.seedFiles[{i}] (merge: append)"),
            MergeMode::Replace => format!("spec.seedFiles[{i}]"),
        };
        match files.iter_mut().find(|f| f.path == path) {
            Some(existing) => {
                match merge {
                    MergeMode::Append => append(&mut existing.content, seed.content.as_bytes()),
                    MergeMode::Replace => existing.content = seed.content.clone().into_bytes(),
                }
                if let Some(mode) = mode {
                    existing.mode = mode;
                }
                existing.sources.push(source);
            }
            None => files.push(DesiredFile {
                path,
                content: seed.content.clone().into_bytes(),
                mode: mode.unwrap_or(0o644),
                sources: vec![source],
            }),
        }
    }
    // What the capabilities add is berth's own: a seed file of the same path gives way.
    for (path, content, mode) in super::capability::files(spec, capabilities) {
        files.retain(|f| f.path != path);
        files.push(DesiredFile {
            path: path.to_string(),
            content: content.into_bytes(),
            mode,
            sources: vec!["spec.capabilities".to_string()],
        });
    }
    Ok(files)
}

/// The warning for a file berth leaves as it found it, naming every seed that is therefore not
/// applied. A `merge: append` seed appends to what berth writes; it never edits a file of the
/// repository's or a person's (which would show up as their change, and be committed with it).
fn kept_warning(file: &DesiredFile) -> String {
    let appends = file.sources.iter().any(|s| s.ends_with("(merge: append)"));
    let mut warning = format!(
        "kept {}: it holds content berth did not write (from the repository or a person); not applied: {}",
        file.path,
        file.sources.join(", ")
    );
    if appends {
        warning.push_str(
            "; merge: append adds only to instructions berth writes, so add that text to the file in the repository or seed another path",
        );
    }
    warning
}

fn append(content: &mut Vec<u8>, more: &[u8]) {
    if !content.is_empty() && !content.ends_with(b"\n") {
        content.push(b'\n');
    }
    content.extend_from_slice(more);
}

fn contains(content: &[u8], part: &[u8]) -> bool {
    part.is_empty() || content.windows(part.len()).any(|w| w == part)
}

/// The skill targets of every profile, absolute.
fn skill_targets(profiles: &[NamedProfile<'_>]) -> Vec<String> {
    let mut targets: Vec<String> = profiles
        .iter()
        .flat_map(|(_, p)| &p.skills)
        .filter_map(|s| workspace_dir_path(&s.target).ok())
        .collect();
    targets.sort();
    targets.dedup();
    targets
}

/// One round trip: the directories `removed` files leave empty, up to (not including) their
/// skill target, removed.
async fn prune_directories(
    rt: &dyn Runtime,
    instance: &str,
    removed: &[String],
    targets: &[String],
) -> Result<()> {
    const SCRIPT: &str = r#"
while [ "$#" -gt 1 ]; do
    top=$1 d=$(dirname "$2")
    shift 2
    while [ "$d" != "$top" ] && [ "${d#"$top"/}" != "$d" ] && rmdir "$d" 2>/dev/null; do
        d=$(dirname "$d")
    done
done
"#;
    let mut args: Vec<&str> = Vec::new();
    for path in removed {
        if let Some(top) = targets.iter().find(|t| is_within(path, t)) {
            args.push(top);
            args.push(path);
        }
    }
    let out = run_script(rt, instance, REASON, SCRIPT, &args, SEED_TIMEOUT).await?;
    if !out.success() {
        return Err(AgentError::SeedFailed {
            path: "/workspace".to_string(),
            message: exit_failure("removing emptied skill directories", &out),
        });
    }
    Ok(())
}

/// The project's environment and its secrets; a secret wins over a plain value of the same key.
fn env_entries(
    env: &BTreeMap<String, String>,
    secrets: &BTreeMap<String, String>,
) -> BTreeMap<String, String> {
    let mut out = env.clone();
    out.extend(secrets.iter().map(|(k, v)| (k.clone(), v.clone())));
    out
}

/// `existing` with berth's block replaced by one holding `entries` (in place, or appended when
/// there was none; removed when `entries` is empty). Every line outside the block is kept byte
/// for byte, whatever its encoding and line end: `.env` is a person's file, not berth's text.
pub fn env_file_with_block(existing: &[u8], entries: &BTreeMap<String, String>) -> Vec<u8> {
    let lines = byte_lines(existing);
    let (before, after): (&[&[u8]], &[&[u8]]) = match managed_block(&lines) {
        Some((begin, end)) => (&lines[..begin], &lines[end..]),
        None => (&lines[..], &[]),
    };
    let mut out: Vec<u8> = before.concat();
    if !entries.is_empty() {
        if !out.is_empty() && !out.ends_with(b"\n") {
            out.push(b'\n');
        }
        let mut block = vec![ENV_BLOCK_BEGIN.to_string()];
        block.extend(entries.iter().map(|(k, v)| format!("{k}={}", env_value(v))));
        block.push(ENV_BLOCK_END.to_string());
        for line in block {
            out.extend_from_slice(line.as_bytes());
            out.push(b'\n');
        }
    }
    out.extend_from_slice(&after.concat());
    out
}

/// `text` cut after every `\n`, each line keeping its own end (`\n`, `\r\n`, or none for the
/// last).
fn byte_lines(text: &[u8]) -> Vec<&[u8]> {
    text.split_inclusive(|b| *b == b'\n').collect()
}

/// Where berth's block lies in `.env`'s lines (from its begin marker to just past its end
/// marker): the first end marker with a begin marker before it, from the nearest such begin
/// marker. A begin marker without an end (a person cut the block) starts no block, so nothing
/// after it is taken for berth's; the inspection reads the block by the same rule.
fn managed_block(lines: &[&[u8]]) -> Option<(usize, usize)> {
    let mut begin = None;
    for (i, line) in lines.iter().enumerate() {
        let line = line.trim_ascii_end();
        if line == ENV_BLOCK_BEGIN.as_bytes() {
            begin = Some(i);
        } else if line == ENV_BLOCK_END.as_bytes() && begin.is_some() {
            return begin.map(|b| (b, i + 1));
        }
    }
    None
}

/// A value as dotenv readers take it: bare when plain, single-quoted (literal) when it has
/// spaces or shell characters, double-quoted with escapes when it has a quote or a newline.
fn env_value(value: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "_./:@%+,=-".contains(c);
    if value.chars().all(plain) {
        value.to_string()
    } else if !value.contains('\'') && !value.contains('\n') && !value.contains('\r') {
        format!("'{value}'")
    } else {
        let mut out = String::from("\"");
        for c in value.chars() {
            match c {
                '\\' => out.push_str("\\\\"),
                '"' => out.push_str("\\\""),
                '\n' => out.push_str("\\n"),
                '\r' => out.push_str("\\r"),
                '$' => out.push_str("\\$"),
                '`' => out.push_str("\\`"),
                c => out.push(c),
            }
        }
        out.push('"');
        out
    }
}

/// One round trip: whether /workspace is a git repository, and what each path holds. The
/// parent directories of paths inside /workspace are created, never through a symbolic link
/// that leads out of it.
async fn probe(
    rt: &dyn Runtime,
    instance: &str,
    paths: &[&str],
) -> Result<(bool, BTreeMap<String, Found>)> {
    const SCRIPT: &str = r#"
if [ -d /workspace/.git ]; then echo "git yes"; else echo "git no"; fi
for p; do
    d=$(dirname "$p")
    e=$d
    while [ ! -e "$e" ] && [ ! -L "$e" ]; do e=$(dirname "$e"); done
    real=$(cd "$e" 2>/dev/null && pwd -P) || real=
    case $real in
    /workspace | /workspace/*) mkdir -p "$d" 2>/dev/null || { echo "other $p"; continue; } ;;
    *) echo "escapes $p"; continue ;;
    esac
    if [ -L "$p" ]; then
        echo "other $p"
    elif [ -f "$p" ]; then
        h=$(sha256sum <"$p") || exit 1
        echo "${h%% *} $p"
    elif [ -e "$p" ]; then
        echo "other $p"
    else
        echo "- $p"
    fi
done
"#;
    let out = run_script(rt, instance, REASON, SCRIPT, paths, SEED_TIMEOUT).await?;
    if !out.success() {
        return Err(AgentError::SeedFailed {
            path: "/workspace".to_string(),
            message: exit_failure("inspecting the workspace", &out),
        });
    }
    Ok(parse_probe(&out.stdout_str()))
}

fn parse_probe(text: &str) -> (bool, BTreeMap<String, Found>) {
    let mut is_git = false;
    let mut found = BTreeMap::new();
    for line in text.lines() {
        let Some((what, path)) = line.split_once(' ') else {
            continue;
        };
        let state = match what {
            "git" => {
                is_git = path == "yes";
                continue;
            }
            "-" => Found::Missing,
            "other" => Found::NotRegular,
            "escapes" => Found::Escapes,
            hash if hash.len() == 64 && hash.bytes().all(|b| b.is_ascii_hexdigit()) => {
                Found::File(hash.to_ascii_lowercase())
            }
            _ => continue,
        };
        found.insert(path.to_string(), state);
    }
    (is_git, found)
}

/// One round trip: the modes of rewritten files, the files berth no longer owns (`released`)
/// taken out of `.git/info/exclude`, and berth's files listed there (each once) so they are not
/// untracked files.
async fn finish(
    rt: &dyn Runtime,
    instance: &str,
    modes: &[(u32, &str)],
    released: &[&str],
    written: &WrittenFiles,
) -> Result<()> {
    const SCRIPT: &str = r#"
n=$1
shift
while [ "$n" -gt 0 ]; do
    chmod "$1" "$2" || exit 1
    shift 2
    n=$((n - 1))
done
n=$1
shift
cd /workspace || exit 0
[ -d .git ] || exit 0
mkdir -p .git/info && touch .git/info/exclude || exit 1
while [ "$n" -gt 0 ]; do
    if grep -qxF -- "$1" .git/info/exclude; then
        grep -vxF -- "$1" .git/info/exclude >.git/info/exclude.berth
        mv .git/info/exclude.berth .git/info/exclude || exit 1
    fi
    shift
    n=$((n - 1))
done
for pattern; do
    grep -qxF -- "$pattern" .git/info/exclude || printf '%s\n' "$pattern" >>.git/info/exclude || exit 1
done
"#;
    let mut args: Vec<String> = vec![modes.len().to_string()];
    for (mode, path) in modes {
        args.push(format!("{mode:o}"));
        args.push(path.to_string());
    }
    let released: Vec<String> = released.iter().filter_map(|p| exclude_pattern(p)).collect();
    args.push(released.len().to_string());
    args.extend(released);
    args.extend(written.files.keys().filter_map(|p| exclude_pattern(p)));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = run_script(rt, instance, REASON, SCRIPT, &args, SEED_TIMEOUT).await?;
    if !out.success() {
        return Err(AgentError::SeedFailed {
            path: "/workspace".to_string(),
            message: exit_failure("setting modes and .git/info/exclude", &out),
        });
    }
    Ok(())
}

/// A gitignore pattern matching exactly one path under /workspace, anchored at the top.
fn exclude_pattern(path: &str) -> Option<String> {
    let rel = path.strip_prefix("/workspace/")?;
    let mut out = String::from("/");
    for c in rel.chars() {
        if matches!(c, '*' | '?' | '[' | '\\' | '!' | '#') {
            out.push('\\');
        }
        out.push(c);
    }
    if out.ends_with(' ') {
        out.pop();
        out.push_str("\\ ");
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use berth_api::{AgentInstructions, AgentProfileSpec, SeedFile};

    fn entries(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn env_block_merge_keeps_user_lines() {
        let block = format!("{ENV_BLOCK_BEGIN}\nA=1\n{ENV_BLOCK_END}\n");
        // (existing file, entries, expected file)
        type Case<'a> = (&'a str, &'a [(&'a str, &'a str)], String);
        let cases: &[Case] = &[
            ("", &[("A", "1")], block.clone()),
            ("", &[], String::new()),
            ("MINE=x\n", &[("A", "1")], format!("MINE=x\n{block}")),
            (
                &format!("MINE=x\n{ENV_BLOCK_BEGIN}\nOLD=2\n{ENV_BLOCK_END}\nTAIL=y\n"),
                &[("A", "1")],
                format!("MINE=x\n{block}TAIL=y\n"),
            ),
            (
                &format!("MINE=x\n{ENV_BLOCK_BEGIN}\nOLD=2\n{ENV_BLOCK_END}\n"),
                &[],
                "MINE=x\n".to_string(),
            ),
            // A block whose end marker was deleted is no block: every line after its begin
            // marker may be a person's, and is kept; berth's block is written anew.
            (
                &format!("MINE=x\n{ENV_BLOCK_BEGIN}\nOLD=2\nLATER=3\n"),
                &[("A", "1")],
                format!("MINE=x\n{ENV_BLOCK_BEGIN}\nOLD=2\nLATER=3\n{block}"),
            ),
            // Such a stray begin marker before berth's block does not swallow the lines
            // between them.
            (
                &format!("{ENV_BLOCK_BEGIN}\nKEEP=1\n{ENV_BLOCK_BEGIN}\nOLD=2\n{ENV_BLOCK_END}\n"),
                &[("A", "1")],
                format!("{ENV_BLOCK_BEGIN}\nKEEP=1\n{block}"),
            ),
            (
                "NO_NEWLINE=1",
                &[("A", "1")],
                format!("NO_NEWLINE=1\n{block}"),
            ),
        ];
        for (existing, pairs, want) in cases {
            let got = env_file_with_block(existing.as_bytes(), &entries(pairs));
            assert_eq!(
                String::from_utf8(got.clone()).unwrap(),
                *want,
                "from {existing:?}"
            );
            // Converging again changes nothing.
            assert_eq!(env_file_with_block(&got, &entries(pairs)), got);
        }
    }

    #[test]
    fn env_lines_outside_the_block_keep_their_bytes() {
        let head: &[u8] = b"MINE=caf\xe9\r\nOTHER=x\r\n";
        let tail: &[u8] = b"TAIL=\xffend\r\nLAST=no-newline";
        let old = format!("{ENV_BLOCK_BEGIN}\r\nOLD=1\r\n{ENV_BLOCK_END}\r\n");
        let existing = [head, old.as_bytes(), tail].concat();
        let got = env_file_with_block(&existing, &entries(&[("A", "1")]));
        let block = format!("{ENV_BLOCK_BEGIN}\nA=1\n{ENV_BLOCK_END}\n");
        assert_eq!(got, [head, block.as_bytes(), tail].concat());
        // Without entries the block goes and the rest stays as it was.
        let got = env_file_with_block(&existing, &BTreeMap::new());
        assert_eq!(got, [head, tail].concat());
        // No block yet: one is appended after a last line without its end.
        let got = env_file_with_block(tail, &entries(&[("A", "1")]));
        assert_eq!(got, [tail, b"\n", block.as_bytes()].concat());
    }

    #[test]
    fn env_values_are_quoted_when_needed() {
        let cases = [
            ("plain-1.2/x", "plain-1.2/x"),
            ("", ""),
            ("two words", "'two words'"),
            ("$HOME", "'$HOME'"),
            ("it's", r#""it's""#),
            ("a\nb\"c", r#""a\nb\"c""#),
        ];
        for (value, want) in cases {
            assert_eq!(env_value(value), want, "{value:?}");
        }
    }

    #[test]
    fn instructions_of_every_profile_then_seeds_with_append_and_modes() {
        let claude = AgentProfileSpec {
            instructions: Some(AgentInstructions {
                target: "CLAUDE.md".into(),
                content: "claude rules\n".into(),
            }),
            ..AgentProfileSpec::default()
        };
        let codex = AgentProfileSpec {
            instructions: Some(AgentInstructions {
                target: "/workspace/AGENTS.md".into(),
                content: "agents rules".into(),
            }),
            ..AgentProfileSpec::default()
        };
        let spec = ProjectSpec {
            seed_files: vec![
                SeedFile {
                    path: "AGENTS.md".into(),
                    content: "project rules\n".into(),
                    mode: None,
                    merge: Some(MergeMode::Append),
                },
                SeedFile {
                    path: "bin/run.sh".into(),
                    content: "#!/bin/sh\n".into(),
                    mode: Some(FileMode::new(0o755).unwrap()),
                    merge: None,
                },
            ],
            ..ProjectSpec::default()
        };
        let profiles = [("claude", &claude), ("codex", &codex), ("kimi", &codex)];
        let mut warnings = Vec::new();
        let files = desired_files(
            &spec,
            &profiles,
            &SkillSet::default(),
            &CapabilitiesFound::default(),
            &mut warnings,
        )
        .unwrap();
        let want = vec![
            DesiredFile {
                path: "/workspace/CLAUDE.md".into(),
                content: "claude rules\n".into(),
                mode: 0o644,
                sources: vec!["the instructions of profile claude".into()],
            },
            DesiredFile {
                path: "/workspace/AGENTS.md".into(),
                content: "agents rules\nproject rules\n".into(),
                mode: 0o644,
                sources: vec![
                    "the instructions of profile codex".into(),
                    "the instructions of profile kimi".into(),
                    "spec.seedFiles[0] (merge: append)".into(),
                ],
            },
            DesiredFile {
                path: "/workspace/bin/run.sh".into(),
                content: "#!/bin/sh\n".into(),
                mode: 0o755,
                sources: vec!["spec.seedFiles[1]".into()],
            },
        ];
        assert_eq!(files, want);

        // A file kept as the repository has it names every seed not applied there.
        let warning = kept_warning(&files[1]);
        assert!(
            warning.starts_with("kept /workspace/AGENTS.md: it holds content berth did not write"),
            "{warning}"
        );
        for named in [
            "profile codex",
            "profile kimi",
            "spec.seedFiles[0] (merge: append)",
        ] {
            assert!(warning.contains(named), "{named}: {warning}");
        }
        assert!(warning.contains("merge: append adds only to"), "{warning}");
        assert!(!kept_warning(&files[2]).contains("merge: append"));
    }

    #[test]
    fn skills_are_shared_between_profiles_and_seeds_go_on_top() {
        let skill = |path: &str, content: &str, source: &str| super::super::SkillFile {
            path: path.into(),
            content: content.into(),
            mode: 0o755,
            source: source.into(),
        };
        let skills = SkillSet {
            files: vec![
                skill(
                    "/workspace/.agents/skills/a/SKILL.md",
                    "a\n",
                    "skill a of profile codex",
                ),
                skill(
                    "/workspace/.agents/skills/a/SKILL.md",
                    "a\n",
                    "skill a of profile kimi",
                ),
                skill(
                    "/workspace/.agents/skills/b/SKILL.md",
                    "b\n",
                    "skill b of profile codex",
                ),
                skill(
                    "/workspace/.agents/skills/b/SKILL.md",
                    "B\n",
                    "skill b of profile kimi",
                ),
            ],
            warnings: vec!["left out".into()],
        };
        let spec = ProjectSpec {
            seed_files: vec![SeedFile {
                path: ".agents/skills/a/SKILL.md".into(),
                content: "project a\n".into(),
                mode: None,
                merge: Some(MergeMode::Append),
            }],
            ..ProjectSpec::default()
        };
        let mut warnings = Vec::new();
        let files = desired_files(
            &spec,
            &[],
            &skills,
            &CapabilitiesFound::default(),
            &mut warnings,
        )
        .unwrap();
        let got: Vec<(&str, &[u8], u32, usize)> = files
            .iter()
            .map(|f| {
                (
                    f.path.as_str(),
                    f.content.as_slice(),
                    f.mode,
                    f.sources.len(),
                )
            })
            .collect();
        assert_eq!(
            got,
            [
                (
                    "/workspace/.agents/skills/a/SKILL.md",
                    &b"a\nproject a\n"[..],
                    0o755,
                    3
                ),
                (
                    "/workspace/.agents/skills/b/SKILL.md",
                    &b"b\n"[..],
                    0o755,
                    1
                ),
            ]
        );
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert!(
            warnings[0].contains("skill b of profile kimi")
                && warnings[0].contains("skill b of profile codex placed other content"),
            "{warnings:?}"
        );
    }

    #[test]
    fn probe_output_is_parsed_by_line() {
        let hash = "a".repeat(64);
        let text = format!(
            "git yes\n{hash} /workspace/a b\n- /workspace/c\nother /workspace/d\nescapes /workspace/e\n"
        );
        let (git, found) = parse_probe(&text);
        assert!(git);
        assert_eq!(found["/workspace/a b"], Found::File(hash));
        assert_eq!(found["/workspace/c"], Found::Missing);
        assert_eq!(found["/workspace/d"], Found::NotRegular);
        assert_eq!(found["/workspace/e"], Found::Escapes);
    }

    #[test]
    fn exclude_patterns_match_one_path_literally() {
        assert_eq!(exclude_pattern("/workspace/.env").unwrap(), "/.env");
        assert_eq!(exclude_pattern("/workspace/a/#b*").unwrap(), "/a/\\#b\\*");
        assert_eq!(exclude_pattern("/elsewhere"), None);
    }

    #[test]
    fn written_files_records_round_trip_as_json() {
        let mut w = WrittenFiles::default();
        w.record("/workspace/.env", &"b".repeat(64));
        let json = serde_json::to_string(&w).unwrap();
        let back: WrittenFiles = serde_json::from_str(&json).unwrap();
        assert_eq!(back, w);
        assert!(back.is_berths("/workspace/.env", &"b".repeat(64)));
        assert!(!back.is_berths("/workspace/.env", &"c".repeat(64)));
    }
}
