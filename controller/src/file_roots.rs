//! `allowedFileRoots`: the host paths a non-admin's `file://` repository may make berth read,
//! and the only ones an AgentProfile's skills come from.
//!
//! A check on the URL's text is not enough: git reads wherever the repository points it. A
//! symbolic link under a root, a `.git` file saying `gitdir: /elsewhere`, a worktree's
//! `commondir`, an `objects/info/alternates` line, or a pack or ref that is a link each make the
//! host's `git bundle` read a repository outside the roots. So every place git will read is
//! resolved to its real path (links followed, also links inside the object and ref
//! directories), recursively through alternates, and all of them must lie under a root's real
//! path. The bundle then runs with `GIT_DIR` set to the resolved directory, so git never
//! goes looking for a repository in the parents of the path named.
//!
//! A skill's host directory is confined the same way (`confine_dir`), and every file read from it
//! is checked again (`holds`).

use std::collections::BTreeSet;
use std::path::{Component, Path, PathBuf};

/// How many alternates (and alternates of alternates) one repository may chain.
const MAX_ALTERNATES: usize = 64;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfineError {
    /// git would read a place outside the roots.
    #[error("{0}")]
    Outside(String),
    /// The repository could not be resolved (missing, unreadable, not a repository): what it
    /// would read is unknown, which is never taken as "nothing outside".
    #[error("{0}")]
    Unresolved(String),
}

/// The configured roots. Empty: no non-admin may name a host path.
#[derive(Debug, Clone, Default)]
pub struct FileRoots {
    roots: Vec<PathBuf>,
}

/// Where git would read the repository at a host path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostRepository {
    /// The git directory (`.git`, or the repository itself when bare), resolved.
    pub git_dir: PathBuf,
    /// Every real path git reads for it: the git directory, its common directory, object
    /// directories and their alternates.
    pub reads: Vec<PathBuf>,
}

impl FileRoots {
    pub fn new(roots: Vec<PathBuf>) -> FileRoots {
        FileRoots { roots }
    }

    /// True when the path's text names a place under a root (no `..`). A non-admin may name
    /// only such a path; a path named under a root is then held to the roots wherever it
    /// leads, whoever named it.
    pub fn names(&self, path: &Path) -> bool {
        !path.components().any(|c| c == Component::ParentDir)
            && self
                .roots
                .iter()
                .any(|root| root.is_absolute() && path.starts_with(root))
    }

    /// Resolves the directory at `path` (links followed) and checks that it lies under a root.
    /// What is in it is held to the roots again as it is read ([`FileRoots::holds`]).
    pub fn confine_dir(&self, path: &Path) -> Result<PathBuf, ConfineError> {
        let real = std::fs::canonicalize(path)
            .map_err(|e| ConfineError::Unresolved(format!("{}: {e}", path.display())))?;
        if !real.is_dir() {
            return Err(ConfineError::Unresolved(format!(
                "{} is not a directory",
                path.display()
            )));
        }
        if !self.holds(&real) {
            return Err(ConfineError::Outside(format!(
                "{} leads to {}, which is not under allowedFileRoots",
                path.display(),
                real.display()
            )));
        }
        Ok(real)
    }

    /// Whether `real`, a path already resolved, lies under a root's real path.
    pub fn holds(&self, real: &Path) -> bool {
        self.real_roots().iter().any(|root| real.starts_with(root))
    }

    fn real_roots(&self) -> Vec<PathBuf> {
        self.roots
            .iter()
            .filter(|root| root.is_absolute())
            .filter_map(|root| std::fs::canonicalize(root).ok())
            .collect()
    }

    /// Resolves the repository at `path` and checks that git reads nothing outside the roots.
    /// The error says which place escapes and how, for a condition or a 403.
    pub fn confine(&self, path: &Path) -> Result<HostRepository, ConfineError> {
        let repository = resolve(path).map_err(ConfineError::Unresolved)?;
        let roots = self.real_roots();
        for read in &repository.reads {
            if !roots.iter().any(|root| read.starts_with(root)) {
                return Err(ConfineError::Outside(format!(
                    "{} reads {}, which is not under allowedFileRoots",
                    path.display(),
                    read.display()
                )));
            }
        }
        Ok(repository)
    }
}

/// Where git reads the repository at `path`, every place resolved to its real path. Only `path`
/// itself is looked at (a bare repository, or a work tree with `.git`), never its parents.
pub fn resolve(path: &Path) -> Result<HostRepository, String> {
    let real = |p: &Path, what: &str| {
        std::fs::canonicalize(p).map_err(|e| format!("{what} {}: {e}", p.display()))
    };
    let top = real(path, "repository")?;
    let dot_git = top.join(".git");
    let git_dir = if is_git_dir(&top) {
        top.clone()
    } else if dot_git.is_dir() {
        real(&dot_git, "git directory")?
    } else if dot_git.is_file() {
        let text = read_small(&dot_git)?;
        let target = text
            .trim_end_matches(['\n', '\r'])
            .strip_prefix("gitdir: ")
            .ok_or_else(|| format!("{}: not a gitdir file", dot_git.display()))?;
        real(&top.join(target), "git directory named by .git")?
    } else {
        return Err(format!("{} is not a git repository", path.display()));
    };
    let mut reads = BTreeSet::from([top, git_dir.clone()]);
    // A linked worktree's git directory shares objects and refs with its common directory.
    let commondir = git_dir.join("commondir");
    let common = if commondir.is_file() {
        let text = read_small(&commondir)?;
        real(
            &git_dir.join(text.trim_end_matches(['\n', '\r'])),
            "commondir",
        )?
    } else {
        git_dir.clone()
    };
    reads.insert(common.clone());
    for entry in ["objects", "refs", "packed-refs", "HEAD", "config"] {
        let place = common.join(entry);
        if std::fs::symlink_metadata(&place).is_ok() {
            reads.insert(real(&place, entry)?);
        }
    }
    // A link inside the repository (a pack, a loose object, a ref) is read as the file it names.
    let mut walked = 0;
    for dir in [common.join("refs"), git_dir.join("refs")] {
        linked_files(&dir, &mut reads, &mut walked)?;
    }
    let mut pending = vec![real(&common.join("objects"), "objects")?];
    let mut seen = BTreeSet::new();
    while let Some(objects) = pending.pop() {
        if !seen.insert(objects.clone()) {
            continue;
        }
        if seen.len() > MAX_ALTERNATES {
            return Err(format!(
                "{}: more than {MAX_ALTERNATES} chained alternates",
                path.display()
            ));
        }
        reads.insert(objects.clone());
        linked_files(&objects, &mut reads, &mut walked)?;
        let alternates = objects.join("info/alternates");
        if !alternates.exists() {
            continue;
        }
        for line in read_small(&alternates)?.lines() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            // git also takes a quoted C-style path; such a line is refused rather than guessed.
            if line.starts_with('"') {
                return Err(format!(
                    "{}: a quoted alternate is not supported",
                    alternates.display()
                ));
            }
            pending.push(real(&objects.join(line), "alternate object directory")?);
        }
    }
    Ok(HostRepository {
        git_dir,
        reads: reads.into_iter().collect(),
    })
}

/// The most entries of a repository's object and ref directories looked through for links.
const MAX_WALKED: usize = 1_000_000;

/// Adds the real path of every symbolic link under `dir` (not descending into linked
/// directories, whose own real path is added) to `reads`.
fn linked_files(
    dir: &Path,
    reads: &mut BTreeSet<PathBuf>,
    walked: &mut usize,
) -> Result<(), String> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(format!("{}: {e}", dir.display())),
    };
    for entry in entries {
        let entry = entry.map_err(|e| format!("{}: {e}", dir.display()))?;
        *walked += 1;
        if *walked > MAX_WALKED {
            return Err(format!(
                "{}: more than {MAX_WALKED} files to check",
                dir.display()
            ));
        }
        let path = entry.path();
        let kind = entry
            .file_type()
            .map_err(|e| format!("{}: {e}", path.display()))?;
        if kind.is_symlink() {
            let target = std::fs::canonicalize(&path)
                .map_err(|e| format!("link {}: {e}", path.display()))?;
            reads.insert(target);
        } else if kind.is_dir() {
            linked_files(&path, reads, walked)?;
        }
    }
    Ok(())
}

/// A bare repository or a git directory: `HEAD`, `objects` and `refs` in it.
fn is_git_dir(path: &Path) -> bool {
    path.join("HEAD").is_file() && path.join("objects").is_dir() && path.join("refs").is_dir()
}

/// A git control file (`.git`, `commondir`, `alternates`): small, or not one.
fn read_small(path: &Path) -> Result<String, String> {
    const LIMIT: u64 = 64 << 10;
    use std::io::Read;
    let file = std::fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut text = String::new();
    file.take(LIMIT + 1)
        .read_to_string(&mut text)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    if text.len() as u64 > LIMIT {
        return Err(format!("{}: larger than {LIMIT} bytes", path.display()));
    }
    Ok(text)
}

#[cfg(test)]
mod tests {
    use std::process::Command;

    use super::*;

    fn git(dir: &Path, args: &[&str]) {
        let output = Command::new("git")
            .arg("-C")
            .arg(dir)
            .args(args)
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .output()
            .expect("run git");
        assert!(
            output.status.success(),
            "git {args:?}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }

    /// A repository with one commit at `dir`.
    fn repository(dir: &Path) {
        std::fs::create_dir_all(dir).unwrap();
        git(dir, &["init", "--quiet", "--initial-branch=main"]);
        std::fs::write(dir.join("README"), "hello\n").unwrap();
        git(dir, &["add", "README"]);
        git(
            dir,
            &[
                "-c",
                "user.name=t",
                "-c",
                "user.email=t@example.invalid",
                "commit",
                "--quiet",
                "-m",
                "one",
            ],
        );
    }

    /// `allowed/` is the only root; `outside/secret` a repository outside it.
    struct Host {
        dir: tempfile::TempDir,
    }

    impl Host {
        fn new() -> Host {
            let host = Host {
                dir: tempfile::tempdir().unwrap(),
            };
            std::fs::create_dir_all(host.allowed()).unwrap();
            repository(&host.outside());
            host
        }
        fn allowed(&self) -> PathBuf {
            self.dir.path().join("allowed")
        }
        fn outside(&self) -> PathBuf {
            self.dir.path().join("outside/secret")
        }
        fn roots(&self) -> FileRoots {
            FileRoots::new(vec![self.allowed()])
        }
    }

    #[test]
    fn a_repository_under_the_root_is_confined_and_resolved() {
        let host = Host::new();
        let repo = host.allowed().join("app");
        repository(&repo);
        assert!(host.roots().names(&repo));
        let resolved = host.roots().confine(&repo).unwrap();
        assert_eq!(
            resolved.git_dir,
            std::fs::canonicalize(repo.join(".git")).unwrap()
        );
        // A bare clone too, and alternates that stay under the root.
        let bare = host.allowed().join("app.git");
        git(
            &host.allowed(),
            &["clone", "--quiet", "--bare", "--shared", "app", "app.git"],
        );
        let resolved = host.roots().confine(&bare).unwrap();
        assert_eq!(resolved.git_dir, std::fs::canonicalize(&bare).unwrap());
        assert!(
            resolved
                .reads
                .contains(&std::fs::canonicalize(repo.join(".git/objects")).unwrap())
        );
    }

    #[test]
    fn a_symbolic_link_under_the_root_to_a_repository_outside_is_refused() {
        let host = Host::new();
        let link = host.allowed().join("innocent");
        std::os::unix::fs::symlink(host.outside(), &link).unwrap();
        assert!(host.roots().names(&link), "the text alone passes");
        let err = host.roots().confine(&link).unwrap_err().to_string();
        assert!(err.contains("not under allowedFileRoots"), "{err}");
        assert!(err.contains("outside/secret"), "{err}");
        // A link deeper in: .git itself.
        let repo = host.allowed().join("linked-git");
        std::fs::create_dir_all(&repo).unwrap();
        std::os::unix::fs::symlink(host.outside().join(".git"), repo.join(".git")).unwrap();
        assert!(host.roots().confine(&repo).is_err());
    }

    #[test]
    fn a_git_file_naming_a_git_directory_outside_is_refused() {
        let host = Host::new();
        let repo = host.allowed().join("gitfile");
        std::fs::create_dir_all(&repo).unwrap();
        std::fs::write(
            repo.join(".git"),
            format!("gitdir: {}\n", host.outside().join(".git").display()),
        )
        .unwrap();
        let err = host.roots().confine(&repo).unwrap_err();
        assert!(matches!(err, ConfineError::Outside(_)), "{err}");
    }

    #[test]
    fn alternates_reaching_outside_are_refused_also_through_a_chain() {
        let host = Host::new();
        let repo = host.allowed().join("borrower");
        repository(&repo);
        let alternates = repo.join(".git/objects/info/alternates");
        std::fs::write(
            &alternates,
            format!("{}\n", host.outside().join(".git/objects").display()),
        )
        .unwrap();
        let err = host.roots().confine(&repo).unwrap_err().to_string();
        assert!(err.contains("outside/secret/.git/objects"), "{err}");

        // Through a repository under the root whose own alternates point out, by a relative path.
        let middle = host.allowed().join("middle");
        repository(&middle);
        let relative = "../../../../outside/secret/.git/objects\n# a comment\n";
        std::fs::write(middle.join(".git/objects/info/alternates"), relative).unwrap();
        std::fs::write(
            &alternates,
            format!("{}\n", middle.join(".git/objects").display()),
        )
        .unwrap();
        let err = host.roots().confine(&repo).unwrap_err().to_string();
        assert!(err.contains("outside/secret/.git/objects"), "{err}");
    }

    #[test]
    fn a_pack_linked_from_outside_is_refused() {
        let host = Host::new();
        let repo = host.allowed().join("packs");
        repository(&repo);
        git(&host.outside(), &["repack", "-q", "-a", "-d"]);
        let pack_dir = host.outside().join(".git/objects/pack");
        let pack = std::fs::read_dir(&pack_dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .find(|p| p.extension().is_some_and(|e| e == "pack"))
            .expect("a pack");
        let linked = repo
            .join(".git/objects/pack")
            .join(pack.file_name().unwrap());
        std::fs::create_dir_all(linked.parent().unwrap()).unwrap();
        std::os::unix::fs::symlink(&pack, &linked).unwrap();
        let err = host.roots().confine(&repo).unwrap_err().to_string();
        assert!(err.contains("not under allowedFileRoots"), "{err}");
    }

    #[test]
    fn a_directory_is_confined_where_its_links_lead() {
        let host = Host::new();
        let skill = host.allowed().join("skills/pdf");
        std::fs::create_dir_all(&skill).unwrap();
        assert_eq!(
            host.roots().confine_dir(&skill).unwrap(),
            std::fs::canonicalize(&skill).unwrap()
        );
        let link = host.allowed().join("skills/escape");
        std::os::unix::fs::symlink(host.outside(), &link).unwrap();
        let err = host.roots().confine_dir(&link).unwrap_err();
        assert!(matches!(err, ConfineError::Outside(_)), "{err}");
        let missing = host.roots().confine_dir(&host.allowed().join("gone"));
        assert!(matches!(missing, Err(ConfineError::Unresolved(_))));
        assert!(
            !host
                .roots()
                .holds(&std::fs::canonicalize(host.outside()).unwrap())
        );
    }

    #[test]
    fn a_path_that_is_no_repository_is_not_looked_for_in_its_parents() {
        let host = Host::new();
        // The root itself inside a repository: git would find that one from a plain directory.
        let parent_repo = host.allowed().join("outer");
        repository(&parent_repo);
        let plain = parent_repo.join("plain");
        std::fs::create_dir_all(&plain).unwrap();
        let err = resolve(&plain).unwrap_err();
        assert!(err.contains("is not a git repository"), "{err}");
    }
}
