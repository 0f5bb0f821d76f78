//! Work the inspection used to miss, in a real daemon against real LXD and real git: one
//! project, clean at first, is given each kind of work in turn right before the scheduler's
//! inspection, is protected (`UnsavedWork`) by it and names it in `status.unsavedWork.files`,
//! and is clean again once that work is undone:
//! - AGENTS.md, written by berth and listed in `.git/info/exclude`, edited by a person;
//! - a person's line in `.env`, outside berth's block;
//! - an ignored `data/app.db` matching `spec.reap.protectIgnored` (also listed by `describe`);
//! - a commit pushed only to a "backup" remote that is a path inside the container;
//! - an unpushed commit inside a submodule that `.gitmodules` marks `ignore = all`.
//!
//! Last, /workspace unmounted inside the container leaves an empty directory on the root
//! filesystem: `InspectionFailed`, never clean.

use std::path::Path;
use std::time::Duration;

use crate::harness::{Berth, READY_DEADLINE};
use crate::support::daemon::Daemon;
use crate::support::git;
use crate::support::said;
use serde_json::{Value, json};

/// How long the scheduler gets to notice something, many rounds of its interval on a busy
/// machine.
const NOTICE_DEADLINE: Duration = Duration::from_secs(240);
/// The offline agent as shipped: its instructions are berth's AGENTS.md.
const SHELL_PROFILE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../manifests/agents/shell.yaml"
);

/// `berth-t-hidden-<random>`: unique on this machine.
fn unique_name() -> String {
    format!("berth-t-hidden-{:08x}", rand::random::<u32>())
}

/// A daemon whose scheduler runs often, and the one project of the test: deleted with
/// `--force` (then checked with lxc) when the test ends, whatever happened.
struct Fixture {
    berth: Berth,
    name: String,
}

impl Fixture {
    fn get(&self) -> Option<Value> {
        self.berth.get_project(&self.name)
    }

    /// Waits until an inspection made after now found the workspace protected by `reason`
    /// alone, naming `holder` among the files that hold the work.
    fn wait_protected(&self, what: &str, holder: &str) -> Value {
        self.berth
            .wait_for_within(&self.name, what, NOTICE_DEADLINE, |p| {
                protected_by(p) == ["UnsavedWork"] && files(p).iter().any(|f| f == holder)
            })
    }

    /// Waits until the inspection finds the workspace clean again.
    fn wait_clean(&self, what: &str) {
        self.berth
            .wait_for_within(&self.name, what, NOTICE_DEADLINE, |p| {
                p["status"]["unsavedWork"].is_object()
                    && protected_by(p).is_empty()
                    && p["status"]["reap"].is_object()
            });
    }

    /// Runs a script in /workspace with a git identity; panics when it fails.
    fn workspace(&self, script: &str) -> String {
        let script = format!(
            "cd /workspace && export HOME=/root GIT_AUTHOR_NAME=t \
             GIT_AUTHOR_EMAIL=t@example.invalid GIT_COMMITTER_NAME=t \
             GIT_COMMITTER_EMAIL=t@example.invalid && {script}"
        );
        crate::harness::exec(&self.name, &script)
            .unwrap_or_else(|e| panic!("{}: {script}: {e}", self.name))
    }
}

fn protected_by(project: &Value) -> Vec<String> {
    strings(&project["status"]["reap"]["protectedBy"])
}

fn files(project: &Value) -> Vec<String> {
    strings(&project["status"]["unsavedWork"]["files"])
}

fn strings(value: &Value) -> Vec<String> {
    value
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

/// A bare repository on the host with one commit on `main` that ignores `data/`.
fn bare_remote(dir: &Path) -> std::path::PathBuf {
    let work = dir.join("work");
    std::fs::create_dir_all(&work).unwrap();
    std::fs::write(work.join("README.md"), "remote\n").unwrap();
    std::fs::write(work.join(".gitignore"), "data/\n").unwrap();
    git(&work, &["init", "-q", "-b", "main"]);
    git(&work, &["add", "README.md", ".gitignore"]);
    git(&work, &["commit", "-q", "-m", "first"]);
    let bare = dir.join("remote.git");
    git(
        dir,
        &["clone", "-q", "--bare", "work", bare.to_str().unwrap()],
    );
    bare
}

#[test]
fn work_git_hides_protects_the_workspace() {
    let mut berth = Berth::launch(
        Daemon::running().config("scheduler: {interval: 2s, workers: 4, recheckInterval: 4s}\n"),
    );
    berth.cli_ok(&["apply", "-f", SHELL_PROFILE]);
    let remote_dir = tempfile::tempdir().expect("temp dir");
    let remote = bare_remote(remote_dir.path());

    let name = unique_name();
    // Idling is an hour away: protectedBy shows what protects it all the same.
    berth.create_project(
        &name,
        json!({"image": "berth-base", "agent": "shell", "env": {"FOO": "bar"},
               "repo": {"url": format!("file://{}", remote.display()), "branch": "main"},
               "reap": {"idleAfter": "1h", "idleAction": "Stop"}}),
    );
    let f = Fixture { berth, name };

    // Admission gave it the fleet's protectIgnored.
    let project = f.get().expect("created");
    assert_eq!(
        project["spec"]["reap"]["protectIgnored"],
        json!([".env*", "*.db", "*.sqlite*"])
    );
    f.berth
        .wait_for_within(&f.name, "Ready", READY_DEADLINE, |p| {
            p["status"]["conditions"].as_array().is_some_and(|c| {
                c.iter()
                    .any(|c| c["type"] == "Ready" && c["status"] == "True")
            })
        });
    assert!(
        f.workspace("cat .git/info/exclude").contains("AGENTS.md"),
        "berth's files are excluded from git"
    );
    f.wait_clean("a fresh checkout with berth's files is clean");

    // An edited AGENTS.md: git shows nothing (it is excluded), its hash tells.
    f.workspace("cp AGENTS.md /tmp/agents.orig && echo 'my own rule' >> AGENTS.md");
    assert_eq!(f.workspace("git status --porcelain"), "");
    let p = f.wait_protected("edited AGENTS.md protects", "AGENTS.md");
    assert_eq!(p["status"]["unsavedWork"]["modifiedSeeds"], 1, "{p}");
    f.workspace("cp /tmp/agents.orig AGENTS.md");
    f.wait_clean("AGENTS.md as berth wrote it again");

    // A person's line in .env, outside berth's block.
    f.workspace("cp .env /tmp/env.orig && echo 'MY_TOKEN=mine' >> .env");
    f.wait_protected("a person's .env line protects", ".env");
    f.workspace("cp /tmp/env.orig .env");
    f.wait_clean(".env holds berth's block alone again");

    // An ignored file that protectIgnored names, listed by describe.
    f.workspace("mkdir -p data && echo rows > data/app.db && git check-ignore -q data/app.db");
    let p = f.wait_protected("an ignored data/app.db protects", "data/app.db");
    assert_eq!(p["status"]["unsavedWork"]["ignored"], 1, "{p}");
    let describe = f.berth.cli(&["describe", "project", &f.name]);
    assert!(describe.status.success(), "{}", said(&describe));
    let text = said(&describe);
    let section = text
        .split("Unsaved Work:\n")
        .nth(1)
        .unwrap_or_else(|| panic!("no Unsaved Work section:\n{text}"));
    assert!(
        section.contains("1 ignored files that protect") && section.contains("    data/app.db\n"),
        "{text}"
    );
    f.workspace("rm -r data");
    f.wait_clean("the ignored file gone");

    // A commit pushed only to a remote that is a path inside the container saves nothing.
    f.workspace(
        "git init -q --bare /tmp/backup.git && git remote add backup /tmp/backup.git \
         && git checkout -q -b wip && echo draft > draft.txt && git add draft.txt \
         && git commit -qm draft && git push -q backup wip && git checkout -q main",
    );
    let p = f.wait_protected(
        "a commit on a backup remote inside protects",
        "refs/heads/wip",
    );
    assert_eq!(p["status"]["unsavedWork"]["unpushed"], 1, "{p}");
    f.workspace("git branch -q -D wip && git remote remove backup && rm -rf /tmp/backup.git");
    f.wait_clean("the local branch and its backup remote gone");

    // A submodule that .gitmodules tells git to ignore; the superproject's commit pushed to the
    // host's origin (made to exist in the container for the push, then gone again).
    f.workspace(&format!(
        "git init -q --bare -b main /tmp/sub.git && git clone -q /tmp/sub.git /tmp/subwork 2>/dev/null \
         && (cd /tmp/subwork && echo s > s && git add s && git commit -qm s \
             && git push -q origin HEAD:main) \
         && git -c protocol.file.allow=always submodule add -q /tmp/sub.git sub \
         && git config -f .gitmodules submodule.sub.ignore all \
         && git add .gitmodules sub && git commit -qm 'add sub' \
         && rm -rf /tmp/sub.git /tmp/subwork \
         && mkdir -p {dir} && git init -q --bare {path} && git push -q origin HEAD:main \
         && rm -rf {path}",
        dir = remote.parent().unwrap().display(),
        path = remote.display()
    ));
    f.wait_clean("a pushed submodule");
    f.workspace("cd sub && echo t > t && git add t && git commit -qm 'only here'");
    assert_eq!(
        f.workspace("git status --porcelain"),
        "",
        "git hides the submodule"
    );
    let p = f.wait_protected("an unpushed commit in an ignored submodule protects", "sub");
    assert!(
        files(&p).iter().any(|f| f == "refs/heads/main in sub"),
        "{}",
        p["status"]["unsavedWork"]
    );
    // Both of the submodule's commits: its origin was a path inside the container, since
    // removed, so the first is saved nowhere either.
    assert_eq!(p["status"]["unsavedWork"]["unpushed"], 2, "{p}");

    // /workspace unmounted: an empty directory on the root filesystem is not "clean".
    f.workspace("git -C sub reset -q --hard HEAD~1");
    crate::harness::exec(&f.name, "cd / && umount /workspace && test -d /workspace")
        .unwrap_or_else(|e| panic!("umount: {e}"));
    f.berth
        .wait_for_within(&f.name, "InspectionFailed", NOTICE_DEADLINE, |p| {
            protected_by(p) == ["InspectionFailed"]
        });
    let log = f.berth.log_text();
    assert!(log.contains("workspace-not-mounted"), "{log}");
}
