use std::process::Command;

use berth_api::{AgentProfileSpec, AgentSkill};

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

fn write(path: &Path, content: &str, mode: u32) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, content).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// `allowed/` is the one root; `outside/` lies beside it.
struct Host {
    dir: tempfile::TempDir,
}

impl Host {
    fn new() -> Host {
        let host = Host {
            dir: tempfile::tempdir().unwrap(),
        };
        std::fs::create_dir_all(host.path("allowed")).unwrap();
        write(&host.path("outside/secret"), "not yours\n", 0o644);
        host
    }
    fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }
    fn roots(&self) -> FileRoots {
        FileRoots::new(vec![self.path("allowed")])
    }
}

fn profile(skills: Vec<AgentSkill>) -> AgentProfileSpec {
    AgentProfileSpec {
        skills,
        ..AgentProfileSpec::default()
    }
}

fn at_path(path: &Path, target: &str) -> AgentSkill {
    AgentSkill {
        path: Some(path.display().to_string()),
        repo: None,
        target: target.into(),
    }
}

fn at_repo(url: String, branch: Option<&str>, target: &str) -> AgentSkill {
    AgentSkill {
        path: None,
        repo: Some(Repo {
            url,
            branch: branch.map(String::from),
        }),
        target: target.into(),
    }
}

/// (path, content, mode) of every file, for comparing.
fn placed(set: &SkillSet) -> Vec<(String, String, u32)> {
    set.files
        .iter()
        .map(|f| {
            (
                f.path.clone(),
                String::from_utf8_lossy(&f.content).into_owned(),
                f.mode,
            )
        })
        .collect()
}

#[tokio::test]
async fn a_host_directory_is_read_whole_with_its_modes_and_without_git() {
    let host = Host::new();
    let pdf = host.path("allowed/pdf");
    write(&pdf.join("SKILL.md"), "# PDF\n", 0o644);
    write(&pdf.join("scripts/fill.py"), "print()\n", 0o755);
    write(&pdf.join(".git/HEAD"), "ref: x\n", 0o644);
    write(&host.path("allowed/shared/LICENSE"), "MIT\n", 0o644);
    std::os::unix::fs::symlink(host.path("allowed/shared/LICENSE"), pdf.join("LICENSE")).unwrap();
    std::os::unix::fs::symlink(host.path("allowed/shared"), pdf.join("shared")).unwrap();
    let claude = profile(vec![at_path(&pdf, ".claude/skills/")]);

    let set = read_skills(&[("claude", &claude)], &host.roots())
        .await
        .unwrap();
    assert_eq!(
        placed(&set),
        [
            (
                "/workspace/.claude/skills/pdf/LICENSE".into(),
                "MIT\n".into(),
                0o644
            ),
            (
                "/workspace/.claude/skills/pdf/SKILL.md".into(),
                "# PDF\n".into(),
                0o644
            ),
            (
                "/workspace/.claude/skills/pdf/scripts/fill.py".into(),
                "print()\n".into(),
                0o755
            ),
        ]
    );
    assert!(
        set.files
            .iter()
            .all(|f| f.source == "skill pdf of profile claude")
    );
    // A link to a directory is not followed, and says so.
    assert_eq!(set.warnings.len(), 1, "{:?}", set.warnings);
    assert!(set.warnings[0].contains("shared"), "{:?}", set.warnings);
}

#[tokio::test]
async fn a_host_source_leading_outside_the_roots_is_refused() {
    let host = Host::new();
    let pdf = host.path("allowed/pdf");
    write(&pdf.join("SKILL.md"), "# PDF\n", 0o644);
    std::os::unix::fs::symlink(host.path("outside/secret"), pdf.join("notes")).unwrap();
    let cases = [
        (
            at_path(&pdf, ".claude/skills"),
            "not under allowedFileRoots",
        ),
        (
            at_path(&host.path("outside"), ".claude/skills"),
            "is not under allowedFileRoots",
        ),
        (
            at_path(&host.path("allowed/missing"), ".claude/skills"),
            "missing",
        ),
    ];
    for (skill, words) in cases {
        let claude = profile(vec![skill.clone()]);
        let err = read_skills(&[("claude", &claude)], &host.roots())
            .await
            .unwrap_err();
        assert_eq!(err.reason(), "SkillFailed", "{skill:?}");
        let text = err.to_string();
        assert!(text.starts_with("skill "), "{text}");
        assert!(text.contains("of agent profile claude"), "{text}");
        assert!(text.contains(words), "{skill:?}: {text}");
    }
}

/// A repository under `dir` with a skill on branch `main` and another on `next`.
fn skill_repository(dir: &Path) {
    write(&dir.join("SKILL.md"), "# Review v1\n", 0o644);
    write(&dir.join("bin/check"), "#!/bin/sh\n", 0o755);
    git(dir, &["init", "--quiet", "--initial-branch=main"]);
    std::os::unix::fs::symlink("SKILL.md", dir.join("README.md")).unwrap();
    git(dir, &["add", "-A"]);
    let commit = [
        "-c",
        "user.name=t",
        "-c",
        "user.email=t@example.invalid",
        "commit",
        "--quiet",
        "-a",
        "-m",
    ];
    git(dir, &[&commit[..], &["one"]].concat());
    git(dir, &["checkout", "--quiet", "-b", "next"]);
    write(&dir.join("SKILL.md"), "# Review v2\n", 0o644);
    git(dir, &[&commit[..], &["two"]].concat());
    git(dir, &["checkout", "--quiet", "main"]);
}

#[tokio::test]
async fn a_repository_is_read_at_its_branch_through_its_git_directory() {
    let host = Host::new();
    let repo = host.path("allowed/review");
    skill_repository(&repo);
    let url = format!("file://{}", repo.display());
    let codex = profile(vec![
        at_repo(url.clone(), None, ".agents/skills"),
        at_repo(url.clone(), Some("next"), ".codex/skills"),
    ]);
    let set = read_skills(&[("codex", &codex)], &host.roots())
        .await
        .unwrap();
    assert_eq!(
        placed(&set),
        [
            (
                "/workspace/.agents/skills/review/SKILL.md".into(),
                "# Review v1\n".into(),
                0o644
            ),
            (
                "/workspace/.agents/skills/review/bin/check".into(),
                "#!/bin/sh\n".into(),
                0o755
            ),
            (
                "/workspace/.codex/skills/review/SKILL.md".into(),
                "# Review v2\n".into(),
                0o644
            ),
            (
                "/workspace/.codex/skills/review/bin/check".into(),
                "#!/bin/sh\n".into(),
                0o755
            ),
        ]
    );
    // The link in the tree is left out, once per place.
    assert_eq!(set.warnings.len(), 2, "{:?}", set.warnings);
    assert!(set.warnings[0].contains("README.md"));

    // Outside the roots: refused before git runs.
    let elsewhere = host.path("outside/review");
    skill_repository(&elsewhere);
    let outside = profile(vec![at_repo(
        format!("file://{}", elsewhere.display()),
        None,
        ".agents/skills",
    )]);
    let err = read_skills(&[("codex", &outside)], &host.roots())
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("not under allowedFileRoots"),
        "{err}"
    );
}

#[tokio::test]
async fn a_remote_repository_is_cloned_on_the_host_first() {
    let host = Host::new();
    let repo = host.path("remote/review");
    skill_repository(&repo);
    // Any URL other than file:// is cloned; a plain path stands in for a remote here.
    let remote = Repo {
        url: repo.display().to_string(),
        branch: Some("next".into()),
    };
    let tree = read_repository(&remote, &host.roots()).await.unwrap();
    let files: Vec<(&str, &[u8], bool)> = tree
        .files
        .iter()
        .map(|(p, c, x)| (p.as_str(), c.as_slice(), *x))
        .collect();
    assert_eq!(
        files,
        [
            ("SKILL.md", &b"# Review v2\n"[..], false),
            ("bin/check", &b"#!/bin/sh\n"[..], true),
        ]
    );
    let gone = Repo {
        url: host.path("remote/none").display().to_string(),
        branch: None,
    };
    let err = read_repository(&gone, &host.roots()).await.unwrap_err();
    assert!(err.starts_with("cloning "), "{err}");
}

#[test]
fn batch_output_is_cut_into_objects() {
    let text = b"aa blob 3\nab\n\nbb blob 0\n\n";
    let mut rest = &text[..];
    assert_eq!(next_object(&mut rest, "aa").unwrap(), b"ab\n");
    assert_eq!(next_object(&mut rest, "bb").unwrap(), b"");
    assert!(rest.is_empty());
    let mut short = &b"cc blob 9\nab\n"[..];
    assert_eq!(next_object(&mut short, "cc"), None);
    let mut missing = &b"dd missing\n"[..];
    assert_eq!(next_object(&mut missing, "dd"), None);
}
