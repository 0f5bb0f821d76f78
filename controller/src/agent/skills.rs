//! Skills: the files of every AgentProfile's skill directories, read on the berth host for
//! Seeded to place at `<target>/<name>/` in the workspace.
//!
//! A container sees no host path and may have no network, so every skill is read here and its
//! files go in through the file API, as the checkout's bundle does. A host directory, and a
//! `file://` repository, must lie under `allowedFileRoots`: admission judged the path as named,
//! and it is judged again here right before it is read, every link resolved, since what a path
//! leads to may have changed since. A repository's tree is read with `git ls-tree` and `git
//! cat-file` at its branch (or HEAD) through the resolved git directory; a remote one is first
//! cloned, shallow and bare, into a private scratch directory on the host.

use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use berth_api::{AgentSkill, Repo, file_url_path};

use super::checkout::ScratchDir;
use super::{AgentError, NamedProfile, Result};
use crate::file_roots::FileRoots;

/// The most skill files berth places in one workspace: each is recorded in
/// `status.seededFiles` and handed to every later inspection.
pub const MAX_SKILL_FILES: usize = 512;
/// The most bytes of skill files berth places in one workspace.
pub const MAX_SKILL_BYTES: u64 = 16 << 20;
/// How long reading one repository's skill (a clone included) may take.
const GIT_TIMEOUT: Duration = Duration::from_secs(5 * 60);

/// One file of a skill, as Seeded wants it in the workspace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SkillFile {
    /// Absolute, under the skill's `<target>/<name>`.
    pub path: String,
    pub content: Vec<u8>,
    /// 0755 for a file the source has executable, 0644 otherwise.
    pub mode: u32,
    /// `skill pdf of profile claude`, for a warning when the file is kept as a person left it.
    pub source: String,
}

/// Every profile's skills, read from their sources, and what was left out (links and
/// submodules, which are not placed) for warnings.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SkillSet {
    pub files: Vec<SkillFile>,
    pub warnings: Vec<String>,
}

/// Reads the skills of `profiles`. A source that cannot be read, leads outside the roots or
/// holds more than the bounds fails, naming the profile and the skill.
pub async fn read_skills(profiles: &[NamedProfile<'_>], roots: &FileRoots) -> Result<SkillSet> {
    let mut set = SkillSet::default();
    let mut bytes = 0u64;
    for (profile, spec) in profiles {
        for (i, skill) in spec.skills.iter().enumerate() {
            let failed = |message: String| AgentError::SkillFailed {
                profile: profile.to_string(),
                skill: skill.name().unwrap_or("?").to_string(),
                message,
            };
            let Some(at) = skill.placed_at() else {
                return Err(AgentError::InvalidProfile {
                    profile: profile.to_string(),
                    field: format!("spec.skills[{i}]"),
                    message: "names no skill directory under /workspace".to_string(),
                });
            };
            let tree = read_source(skill, roots).await.map_err(failed)?;
            let name = skill.name().unwrap_or_default();
            let source = format!("skill {name} of profile {profile}");
            for skipped in tree.skipped {
                set.warnings.push(format!(
                    "{source}: {skipped} is not placed (a symbolic link or submodule)"
                ));
            }
            for (relative, content, executable) in tree.files {
                bytes += content.len() as u64;
                if set.files.len() >= MAX_SKILL_FILES || bytes > MAX_SKILL_BYTES {
                    return Err(failed(format!(
                        "the skills of the project's profiles hold more than {MAX_SKILL_FILES} \
                         files or {} MiB, the most berth places in a workspace",
                        MAX_SKILL_BYTES >> 20
                    )));
                }
                set.files.push(SkillFile {
                    path: format!("{at}/{relative}"),
                    content,
                    mode: if executable { 0o755 } else { 0o644 },
                    source: source.clone(),
                });
            }
        }
    }
    Ok(set)
}

/// A skill's files, relative to its directory, and the entries left out.
#[derive(Debug, Default)]
struct Tree {
    files: Vec<(String, Vec<u8>, bool)>,
    skipped: Vec<String>,
}

async fn read_source(skill: &AgentSkill, roots: &FileRoots) -> Result<Tree, String> {
    match (&skill.path, &skill.repo) {
        (Some(path), _) => {
            let (path, roots) = (PathBuf::from(path), roots.clone());
            tokio::task::spawn_blocking(move || read_host_directory(&path, &roots))
                .await
                .map_err(|e| format!("reading the skill's directory: {e}"))?
        }
        (None, Some(repo)) => read_repository(repo, roots).await,
        (None, None) => Err("names neither a path nor a repo".to_string()),
    }
}

/// A host directory's files, held to the roots: the directory and every file read, links
/// followed, must resolve under them. `.git` is left out.
fn read_host_directory(path: &Path, roots: &FileRoots) -> Result<Tree, String> {
    if !roots.names(path) {
        return Err(format!("{} is not under allowedFileRoots", path.display()));
    }
    let top = roots.confine_dir(path).map_err(|e| e.to_string())?;
    let mut tree = Tree::default();
    let mut budget = MAX_SKILL_BYTES;
    walk(&top, "", roots, &mut tree, &mut budget)?;
    Ok(tree)
}

fn walk(
    dir: &Path,
    prefix: &str,
    roots: &FileRoots,
    tree: &mut Tree,
    budget: &mut u64,
) -> Result<(), String> {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .map_err(|e| format!("{}: {e}", dir.display()))?
        .collect::<std::io::Result<_>>()
        .map_err(|e| format!("{}: {e}", dir.display()))?;
    entries.sort_by_key(|e| e.file_name());
    for entry in entries {
        let path = entry.path();
        let name = entry.file_name();
        let name = name
            .to_str()
            .filter(|n| !n.chars().any(char::is_control))
            .ok_or_else(|| format!("{}: a file name berth cannot place", path.display()))?;
        if name == ".git" {
            continue;
        }
        let relative = format!("{prefix}{name}");
        let real = std::fs::canonicalize(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        if !roots.holds(&real) {
            return Err(format!(
                "{} leads to {}, which is not under allowedFileRoots",
                path.display(),
                real.display()
            ));
        }
        let linked = entry
            .file_type()
            .map_err(|e| format!("{}: {e}", path.display()))?
            .is_symlink();
        let meta = std::fs::metadata(&real).map_err(|e| format!("{}: {e}", real.display()))?;
        if meta.is_dir() && !linked {
            walk(&path, &format!("{relative}/"), roots, tree, budget)?;
        } else if meta.is_file() {
            if tree.files.len() >= MAX_SKILL_FILES {
                return Err(format!(
                    "{} holds more than {MAX_SKILL_FILES} files",
                    dir.display()
                ));
            }
            if meta.len() > *budget {
                return Err(format!(
                    "{relative} makes the skill larger than berth places"
                ));
            }
            let content = read_at_most(&real, *budget)?;
            *budget -= content.len() as u64;
            let executable = meta.permissions().mode() & 0o111 != 0;
            tree.files.push((relative, content, executable));
        } else {
            tree.skipped.push(relative);
        }
    }
    Ok(())
}

fn read_at_most(path: &Path, limit: u64) -> Result<Vec<u8>, String> {
    let file = std::fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut content = Vec::new();
    file.take(limit + 1)
        .read_to_end(&mut content)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    if content.len() as u64 > limit {
        return Err(format!(
            "{} makes the skill larger than berth places",
            path.display()
        ));
    }
    Ok(content)
}

/// A repository's tree at its branch (or HEAD). A `file://` one is read through its git
/// directory, resolved and held to the roots; any other is cloned shallow into scratch first.
async fn read_repository(repo: &Repo, roots: &FileRoots) -> Result<Tree, String> {
    let shown = berth_api::redact_credentials(&repo.url).into_owned();
    let scratch;
    let (git_dir, at) = match file_url_path(&repo.url) {
        Some(path) => {
            let path = Path::new(path);
            if !roots.names(path) {
                return Err(format!("{shown} is not under allowedFileRoots"));
            }
            let resolved = roots.confine(path).map_err(|e| e.to_string())?;
            (resolved.git_dir, repo.branch.as_deref().unwrap_or("HEAD"))
        }
        None => {
            scratch = ScratchDir::create().map_err(|e| format!("scratch directory: {e}"))?;
            let git_dir = scratch.0.join("skill.git");
            let mut clone = tokio::process::Command::new("git");
            clone.args(["clone", "--quiet", "--bare", "--depth", "1"]);
            if let Some(branch) = &repo.branch {
                clone.arg("--branch").arg(branch);
            }
            clone.arg("--").arg(&repo.url).arg(&git_dir);
            clone.env("GIT_TERMINAL_PROMPT", "0");
            run(clone, None)
                .await
                .map_err(|e| format!("cloning {shown}: {e}"))?;
            (git_dir, "HEAD")
        }
    };
    let listing = run(
        git(&git_dir, &["ls-tree", "-r", "-l", "-z", "--full-tree", at]),
        None,
    )
    .await
    .map_err(|e| format!("listing {shown} at {at}: {e}"))?;
    let mut tree = Tree::default();
    let mut blobs: Vec<(String, String, bool)> = Vec::new();
    let mut total = 0u64;
    for entry in listing.split(|b| *b == 0).filter(|e| !e.is_empty()) {
        let entry = String::from_utf8_lossy(entry);
        let Some((meta, path)) = entry.split_once('\t') else {
            return Err(format!("unexpected git ls-tree output: {entry:?}"));
        };
        if path.chars().any(char::is_control) || path.contains('\u{fffd}') {
            return Err(format!("{path:?}: a file name berth cannot place"));
        }
        let fields: Vec<&str> = meta.split_whitespace().collect();
        match fields.as_slice() {
            [mode @ ("100644" | "100755"), "blob", oid, size] => {
                total += size.parse::<u64>().unwrap_or(u64::MAX);
                if total > MAX_SKILL_BYTES || blobs.len() >= MAX_SKILL_FILES {
                    return Err(format!(
                        "{shown} holds more than {MAX_SKILL_FILES} files or {} MiB",
                        MAX_SKILL_BYTES >> 20
                    ));
                }
                blobs.push((path.to_string(), oid.to_string(), *mode == "100755"));
            }
            _ => tree.skipped.push(path.to_string()),
        }
    }
    if blobs.is_empty() {
        return Ok(tree);
    }
    let oids: String = blobs.iter().map(|(_, oid, _)| format!("{oid}\n")).collect();
    let batch = run(
        git(&git_dir, &["cat-file", "--batch"]),
        Some(oids.into_bytes()),
    )
    .await
    .map_err(|e| format!("reading {shown}: {e}"))?;
    let mut rest = batch.as_slice();
    for (path, oid, executable) in blobs {
        let content = next_object(&mut rest, &oid)
            .ok_or_else(|| format!("reading {shown}: git cat-file answered short at {path}"))?;
        tree.files.push((path, content, executable));
    }
    Ok(tree)
}

/// One object of `git cat-file --batch` output (`<oid> blob <size>\n<content>\n`).
fn next_object(rest: &mut &[u8], oid: &str) -> Option<Vec<u8>> {
    let newline = rest.iter().position(|b| *b == b'\n')?;
    let header = std::str::from_utf8(&rest[..newline]).ok()?;
    let mut words = header.split(' ');
    if words.next()? != oid || words.next()? != "blob" {
        return None;
    }
    let size: usize = words.next()?.parse().ok()?;
    let start = newline + 1;
    let content = rest.get(start..start + size)?.to_vec();
    *rest = rest.get(start + size + 1..)?;
    Some(content)
}

/// `git` reading `git_dir` and looking for no other repository.
fn git(git_dir: &Path, args: &[&str]) -> tokio::process::Command {
    let mut command = tokio::process::Command::new("git");
    command
        // The repository may belong to another user on the host; berth only reads it.
        .arg("-c")
        .arg(format!("safe.directory={}", git_dir.display()))
        .arg("--git-dir")
        .arg(git_dir)
        .env("GIT_CEILING_DIRECTORIES", "/")
        .args(args);
    command
}

/// Runs a git command under [`GIT_TIMEOUT`], feeding it `stdin`; its stdout, or its stderr's
/// lines as the error.
async fn run(
    mut command: tokio::process::Command,
    stdin: Option<Vec<u8>>,
) -> Result<Vec<u8>, String> {
    use tokio::io::AsyncWriteExt;
    command
        .stdin(if stdin.is_some() {
            std::process::Stdio::piped()
        } else {
            std::process::Stdio::null()
        })
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    let work = async {
        let mut child = command
            .spawn()
            .map_err(|e| format!("cannot run git on the host: {e}"))?;
        if let (Some(input), Some(mut pipe)) = (stdin, child.stdin.take()) {
            // Written while the output is read, so neither pipe fills and stalls the other.
            tokio::spawn(async move {
                let _ = pipe.write_all(&input).await;
            });
        }
        child
            .wait_with_output()
            .await
            .map_err(|e| format!("git on the host: {e}"))
    };
    let output = tokio::time::timeout(GIT_TIMEOUT, work)
        .await
        .map_err(|_| format!("git did not finish within {GIT_TIMEOUT:?}"))??;
    if !output.status.success() {
        let err = String::from_utf8_lossy(&output.stderr);
        let err: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
        return Err(berth_api::redact_credentials(&err.join(" | ")).into_owned());
    }
    Ok(output.stdout)
}

#[cfg(test)]
#[path = "skills_tests.rs"]
mod tests;
