//! A person's bytes in a workspace, in a real daemon against real LXD and real git: nothing
//! berth does afterwards writes over them or stops counting them as work.
//! - a checkout into a workspace holding a person's files (and no repository) is held with
//!   `CheckoutBlocked` naming them, also when it is a failed checkout retried; once the person
//!   moves them away the checkout goes ahead;
//! - `.env` lines outside berth's block stay byte for byte (a non-UTF-8 byte, CRLF) through a
//!   `berth secret set`;
//! - a seed file and a profile's AGENTS.md edited by a person still count as work after the
//!   container is recreated (which runs Seeded again);
//! - commits pushed only to a remote that is a path inside the container, since wiped, are
//!   unpushed work.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::harness::{Berth, READY_DEADLINE, lxc, ready_reason, try_volumes_of};
use crate::support::daemon::Daemon;
use crate::support::git;
use crate::support::said;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

/// How long the scheduler gets to notice something, many rounds of its interval on a busy
/// machine.
const NOTICE_DEADLINE: Duration = Duration::from_secs(240);
const CONFIG: &str =
    "defaults: {image: berth-base}\ntrash: {retention: 3m}\nscheduler: {interval: 5s}\n";
/// The offline agent as shipped: its instructions are berth's AGENTS.md.
const SHELL_PROFILE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../manifests/agents/shell.yaml"
);
const MY_README: &str = "my readme, not saved anywhere\n";
const MY_MAIN: &str = "print('my own main')\n";

fn unique_name() -> String {
    format!("berth-t-bytes-{:08x}", rand::random::<u32>())
}

fn sha256(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// A daemon with these settings and the projects a test created, deleted with `--force`
/// (then checked with lxc, trash copies included) when the test ends.
struct Fixture {
    berth: Berth,
    _repo: tempfile::TempDir,
    /// A host repository with one commit holding README.md and main.py.
    repo: PathBuf,
}

impl std::ops::Deref for Fixture {
    type Target = Berth;

    fn deref(&self) -> &Berth {
        &self.berth
    }
}

impl std::ops::DerefMut for Fixture {
    fn deref_mut(&mut self) -> &mut Berth {
        &mut self.berth
    }
}

impl Fixture {
    fn start() -> Fixture {
        let berth = Berth::launch(Daemon::running().config(CONFIG));
        let dir = tempfile::tempdir().expect("temp dir");
        let repo = dir.path().join("upstream");
        upstream_repo(&repo);
        Fixture {
            berth,
            _repo: dir,
            repo,
        }
    }
}

/// `Ready=True` for the current generation.
fn ready_now(p: &Value) -> bool {
    ready_reason(p).is_some_and(|(status, _)| status == "True")
        && p["status"]["observedGeneration"] == p["metadata"]["generation"]
}

fn condition<'a>(p: &'a Value, kind: &str) -> Option<&'a Value> {
    p["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == kind)
}

fn blocked(p: &Value) -> bool {
    condition(p, "CheckoutBlocked").is_some_and(|c| c["status"] == "True")
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

fn unsaved_files(p: &Value) -> Vec<String> {
    strings(&p["status"]["unsavedWork"]["files"])
}

fn upstream_repo(dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join("README.md"), "upstream readme\n").unwrap();
    std::fs::write(dir.join("main.py"), "print('upstream')\n").unwrap();
    git(dir, &["init", "-q", "-b", "main"]);
    git(dir, &["add", "README.md", "main.py"]);
    git(dir, &["commit", "-q", "-m", "first"]);
}

/// Runs a script in the container's /workspace with a git identity; panics when it fails.
fn workspace(name: &str, script: &str) -> String {
    let script = format!(
        "cd /workspace && export HOME=/root GIT_AUTHOR_NAME=t \
         GIT_AUTHOR_EMAIL=t@example.invalid GIT_COMMITTER_NAME=t \
         GIT_COMMITTER_EMAIL=t@example.invalid && {script}"
    );
    crate::harness::exec(name, &script).unwrap_or_else(|e| panic!("{name}: {script}: {e}"))
}

/// A file's bytes in the container, exactly.
fn file_bytes(name: &str, path: &str) -> Vec<u8> {
    let out = Command::new("lxc")
        .args(["exec", name, "--", "cat", path])
        .output()
        .expect("lxc exec");
    assert!(out.status.success(), "cat {path}: {}", said(&out));
    out.stdout
}

/// The person writes README.md and main.py into /workspace.
fn write_my_files(name: &str) {
    workspace(
        name,
        &format!("printf '%s' '{MY_README}' > README.md && printf '%s' \"{MY_MAIN}\" > main.py"),
    );
}

fn assert_my_files(name: &str, dir: &str) {
    assert_eq!(
        sha256(&file_bytes(name, &format!("{dir}/README.md"))),
        sha256(MY_README.as_bytes()),
        "{dir}/README.md is the person's"
    );
    assert_eq!(
        sha256(&file_bytes(name, &format!("{dir}/main.py"))),
        sha256(MY_MAIN.as_bytes()),
        "{dir}/main.py is the person's"
    );
}

/// Held: the checkout waits with `CheckoutBlocked` naming both files, the files untouched.
fn held(f: &Fixture, name: &str) {
    let p = f.wait_for_within(
        name,
        "CheckoutBlocked, or the checkout done",
        READY_DEADLINE,
        |p| blocked(p) || ready_now(p),
    );
    assert_my_files(name, "/workspace");
    assert!(blocked(&p), "{}", p["status"]);
    let message = condition(&p, "CheckoutBlocked").unwrap()["message"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(
        message.contains("README.md") && message.contains("main.py"),
        "{message}"
    );
    let events = f.cli_input(&["events", "project", name], b"");
    assert!(
        said(&events).contains("CheckoutBlocked"),
        "{}",
        said(&events)
    );
}

/// Held, then the person moves the files away, and the checkout goes ahead.
fn held_then_moved(f: &Fixture, name: &str) {
    held(f, name);
    workspace(
        name,
        "mkdir -p /root/mine && mv README.md main.py /root/mine/",
    );
    f.wait_ready(name);
    assert_eq!(
        String::from_utf8(file_bytes(name, "/workspace/README.md")).unwrap(),
        "upstream readme\n"
    );
    assert_my_files(name, "/root/mine");
    let p = f.get_project(name).unwrap();
    assert!(!blocked(&p), "{}", p["status"]);
}

#[test]
fn a_checkout_never_writes_over_a_persons_files() {
    let mut f = Fixture::start();
    let name = unique_name();
    f.create_project(&name, json!({"image": "berth-base"}));
    f.wait_ready(&name);
    write_my_files(&name);
    f.wait_for_within(&name, "the files counted as work", NOTICE_DEADLINE, |p| {
        let files = unsaved_files(p);
        files.iter().any(|f| f == "README.md") && files.iter().any(|f| f == "main.py")
    });

    let url = format!("file://{}", f.repo.display());
    f.patch_project(
        &name,
        json!({"spec": {"repo": {"url": url, "branch": "main"}}}),
    );
    held(&f, &name);

    // Forced: a copy of the workspace goes to the trash first, then the checkout.
    let forced = f.cli_input(&["checkout", &name, "--force"], b"");
    assert!(forced.status.success(), "{}", said(&forced));
    f.wait_for_within(&name, "checked out", READY_DEADLINE, |p| {
        ready_now(p) && !blocked(p)
    });
    assert_eq!(
        String::from_utf8(file_bytes(&name, "/workspace/README.md")).unwrap(),
        "upstream readme\n"
    );
    let uid = &f.berth.tracked_uid(&name).expect("a project of this test");
    let copies: Vec<String> = try_volumes_of(uid)
        .unwrap()
        .into_iter()
        .filter(|v| v.starts_with(&format!("berth-trash-{uid}-checkout-")))
        .collect();
    assert_eq!(copies.len(), 1, "{copies:?}");
    let copy = &copies[0];
    let item = copy.strip_prefix("berth-trash-").unwrap();
    for (key, want) in [
        ("user.berth.trash.uid", item),
        ("user.berth.trash.kind", "files"),
        ("user.berth.trash.project", uid.as_str()),
        ("user.berth.trash.name", name.as_str()),
    ] {
        let got = lxc(&["storage", "volume", "get", "default", copy, key]).unwrap();
        assert_eq!(got.trim(), want, "{key} of {copy}");
    }
    let trashed_at = lxc(&[
        "storage",
        "volume",
        "get",
        "default",
        copy,
        "user.berth.trash.trashedAt",
    ])
    .unwrap();
    assert!(trashed_at.trim().ends_with('Z'), "{trashed_at}");
    // The copy holds the person's bytes (a dir pool keeps a volume as a host directory).
    let pool = lxc(&["storage", "show", "default"]).unwrap();
    if pool.contains("driver: dir") {
        let source = lxc(&["storage", "get", "default", "source"]).unwrap();
        let dir = Path::new(source.trim())
            .join("custom")
            .join(format!("default_{copy}"));
        assert_eq!(
            sha256(&std::fs::read(dir.join("README.md")).unwrap()),
            sha256(MY_README.as_bytes())
        );
        assert_eq!(
            sha256(&std::fs::read(dir.join("main.py")).unwrap()),
            sha256(MY_MAIN.as_bytes())
        );
    }
    let list = f.cli_input(&["trash", "list"], b"");
    assert!(said(&list).contains(item), "{}", said(&list));
    let events = f.cli_input(&["events", "project", &name], b"");
    assert!(said(&events).contains(copy.as_str()), "{}", said(&events));
}

#[test]
fn a_retried_checkout_never_writes_over_a_persons_files() {
    let mut f = Fixture::start();
    let name = unique_name();
    // The repository is not there yet: the checkout fails and is retried.
    let later = f.repo.parent().unwrap().join("later");
    let url = format!("file://{}", later.display());
    f.create_project(
        &name,
        json!({"image": "berth-base", "repo": {"url": url, "branch": "main"}}),
    );
    f.wait_for_within(&name, "the checkout failed", READY_DEADLINE, |p| {
        ready_reason(p).is_some_and(|(status, _)| status == "False")
            && p["status"]["conditions"]
                .to_string()
                .contains("CheckoutFailed")
    });
    write_my_files(&name);
    // The repository appears; a change to the object retries now rather than after backoff.
    upstream_repo(&later);
    f.patch_project(
        &name,
        json!({"metadata": {"annotations": {"test.berth.dev/poke": "1"}}}),
    );
    held_then_moved(&f, &name);
}

#[test]
fn env_lines_outside_berths_block_stay_byte_for_byte() {
    let mut f = Fixture::start();
    let profile = f.cli_input(&["apply", "-f", SHELL_PROFILE], b"");
    assert!(profile.status.success(), "{}", said(&profile));
    let name = unique_name();
    f.create_project(
        &name,
        json!({"image": "berth-base", "agent": "shell", "env": {"FOO": "bar"}}),
    );
    f.wait_ready(&name);
    // A Latin-1 byte and CRLF line ends, before and after berth's block.
    workspace(
        &name,
        "printf 'MINE=caf\\351\\r\\nOTHER=x\\r\\n' > /tmp/head && printf 'TAIL=\\377end\\r\\n' > /tmp/tail \
         && cat /tmp/head .env /tmp/tail > /tmp/env && cat /tmp/env > .env",
    );
    let head = b"MINE=caf\xe9\r\nOTHER=x\r\n".to_vec();
    let tail = b"TAIL=\xffend\r\n".to_vec();
    let before = file_bytes(&name, "/workspace/.env");
    assert!(before.starts_with(&head) && before.ends_with(&tail));

    let out = f.cli_input(&["secret", "set", &name, "API_TOKEN"], b"s3cret-value");
    assert!(out.status.success(), "{}", said(&out));
    let after = f.eventually(READY_DEADLINE, "the secret in .env", || {
        let now = file_bytes(&name, "/workspace/.env");
        now.windows(10).any(|w| w == b"API_TOKEN=").then_some(now)
    });
    assert_eq!(
        sha256(&after[..head.len()]),
        sha256(&head),
        "the lines before berth's block: {:?}",
        String::from_utf8_lossy(&after)
    );
    assert_eq!(
        sha256(&after[after.len() - tail.len()..]),
        sha256(&tail),
        "the lines after berth's block: {:?}",
        String::from_utf8_lossy(&after)
    );
}

#[test]
fn edited_seeds_stay_work_after_the_container_is_recreated() {
    let mut f = Fixture::start();
    let profile = f.cli_input(&["apply", "-f", SHELL_PROFILE], b"");
    assert!(profile.status.success(), "{}", said(&profile));
    let name = unique_name();
    let url = format!("file://{}", f.repo.display());
    f.create_project(
        &name,
        json!({"image": "berth-base", "agent": "shell",
               "repo": {"url": url, "branch": "main"},
               "seedFiles": [{"path": "notes.md", "content": "seeded notes\n"}],
               "reap": {"idleAfter": "1h", "idleAction": "Stop"}}),
    );
    f.wait_ready(&name);
    workspace(
        &name,
        "echo 'my note' >> notes.md && echo 'my own rule' >> AGENTS.md",
    );
    let notes = file_bytes(&name, "/workspace/notes.md");
    let agents = file_bytes(&name, "/workspace/AGENTS.md");
    f.wait_for_within(&name, "the edits counted as work", NOTICE_DEADLINE, |p| {
        let files = unsaved_files(p);
        files.iter().any(|f| f == "notes.md") && files.iter().any(|f| f == "AGENTS.md")
    });

    let container = lxc(&["config", "get", &name, "volatile.uuid"]).unwrap();
    f.patch_project(
        &name,
        json!({"metadata": {"annotations": {"berth.dev/recreateRequestedAt": "2026-01-01T00:00:00Z"}}}),
    );
    // The new container is there (the old one is gone into the trash first, so no answer
    // is not yet a new one), running, and the project Ready on it.
    f.wait_replaced(&name, &container);
    // A fresh inspection after Seeded ran again: a new file changes what it finds.
    workspace(&name, "echo marker > marker.txt");
    let p = f.wait_for_within(&name, "the marker counted", NOTICE_DEADLINE, |p| {
        unsaved_files(p).iter().any(|f| f == "marker.txt")
    });
    let files = unsaved_files(&p);
    assert!(
        files.iter().any(|f| f == "notes.md") && files.iter().any(|f| f == "AGENTS.md"),
        "{}",
        p["status"]
    );
    assert_eq!(
        sha256(&file_bytes(&name, "/workspace/notes.md")),
        sha256(&notes)
    );
    assert_eq!(
        sha256(&file_bytes(&name, "/workspace/AGENTS.md")),
        sha256(&agents)
    );
}

#[test]
fn a_wiped_path_remote_saves_nothing() {
    let mut f = Fixture::start();
    let name = unique_name();
    let url = format!("file://{}", f.repo.display());
    f.create_project(
        &name,
        json!({"image": "berth-base", "repo": {"url": url, "branch": "main"},
               "reap": {"idleAfter": "1h", "idleAction": "Stop"}}),
    );
    f.wait_ready(&name);
    workspace(
        &name,
        "git init -q --bare /tmp/backup.git && git remote add backup /tmp/backup.git \
         && git init -q --bare /tmp/other.git && git remote add other file:///tmp/other.git \
         && git checkout -q -b wip && echo draft > draft.txt && git add draft.txt \
         && git commit -qm draft && git push -q backup wip \
         && git checkout -q main && git checkout -q -b wip2 && echo more > more.txt && git add more.txt \
         && git commit -qm more && git push -q other wip2 && git checkout -q main",
    );
    f.wait_for_within(&name, "the branches counted", NOTICE_DEADLINE, |p| {
        let files = unsaved_files(p);
        files.iter().any(|f| f == "refs/heads/wip") && files.iter().any(|f| f == "refs/heads/wip2")
    });
    // What a recreate does to /tmp.
    workspace(&name, "rm -rf /tmp/backup.git /tmp/other.git");
    workspace(&name, "echo marker > marker.txt");
    let p = f.wait_for_within(&name, "the marker counted", NOTICE_DEADLINE, |p| {
        unsaved_files(p).iter().any(|f| f == "marker.txt")
    });
    let files = unsaved_files(&p);
    assert!(
        files.iter().any(|f| f == "refs/heads/wip") && files.iter().any(|f| f == "refs/heads/wip2"),
        "{}",
        p["status"]["unsavedWork"]
    );
}
