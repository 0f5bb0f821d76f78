//! The scheduler in a real daemon against real LXD, real git and the real `shell` agent: an idle
//! project is stopped and an idle one set to Delete is deleted; projects with an uncommitted
//! file, an unpushed commit to a real remote, a blocked agent, or a workspace that cannot be
//! inspected are kept, with the reason in `get -o wide`, `reap --dry-run`, the `ReapProtected`
//! condition, an event and `berth_reap_refusals_total`; a plain delete of unpushed work is held
//! (DeletionBlocked, volumes kept) and finishes by itself once the work is pushed, `--force`
//! deletes at once; a stopped project due for deletion that holds work is kept without being
//! booted every pass; a GitOps prune of a project with an untracked file is held and the CLI
//! says so; a listener on 0.0.0.0:3000 shows in `berth ports`.

use std::collections::BTreeSet;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::harness::Berth;
use crate::harness::{
    PROJECTS, READY_DEADLINE, instance_count, instance_state, live_volumes_of, volumes_of,
};
use crate::support::daemon::Daemon;
use crate::support::git;
use crate::support::said;
use serde_json::{Value, json};

/// How long the scheduler gets to notice something, many rounds of its interval on a busy
/// machine.
const NOTICE_DEADLINE: Duration = Duration::from_secs(240);
/// The offline agent as shipped.
const SHELL_PROFILE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../manifests/agents/shell.yaml"
);

/// `berth-t-reap-<random>`: unique on this machine.
fn unique_name() -> String {
    format!("berth-t-reap-{:08x}", rand::random::<u32>())
}

/// A daemon whose controller and scheduler run often, and the projects it made: deleted with
/// `--force` (then checked with lxc) when the test ends, whatever happened.
struct Reaper {
    berth: Berth,
}

impl std::ops::Deref for Reaper {
    type Target = Berth;

    fn deref(&self) -> &Berth {
        &self.berth
    }
}

impl std::ops::DerefMut for Reaper {
    fn deref_mut(&mut self) -> &mut Berth {
        &mut self.berth
    }
}

impl Reaper {
    fn start(scheduler: &str) -> Reaper {
        Reaper {
            berth: Berth::launch(Daemon::running().config(&format!("scheduler: {scheduler}\n"))),
        }
    }

    /// Records a project made some other way (an apply) for the cleanup.
    fn adopt(&mut self, name: &str) {
        let project = self.get_project(name).expect("project exists");
        self.track(&project);
    }

    fn uid(&self, name: &str) -> String {
        self.berth
            .tracked_uid(name)
            .expect("a project of this test")
    }

    /// Waits until the container answers with its workspace mounted.
    fn wait_reachable(&self, name: &str) {
        self.wait_for_within(name, "Reachable", READY_DEADLINE, |p| {
            p["status"]["step"].as_str().is_some_and(|s| {
                [
                    "Reachable",
                    "Bootstrapped",
                    "CheckedOut",
                    "Seeded",
                    "RunnerStarted",
                    "Briefed",
                ]
                .contains(&s)
            }) && p["status"]["container"]["pid"].is_number()
        });
        self.wait_until(READY_DEADLINE, &format!("{name}: init ready"), || {
            exec(name, "test -f /run/init.ready").is_ok()
        });
    }

    fn refusals(&self, reason: &str) -> f64 {
        self.metric(&format!("berth_reap_refusals_total{{reason=\"{reason}\"}}"))
    }

    fn reap_passes(&self) -> f64 {
        self.metric("berth_scheduler_pass_duration_seconds_count{pass=\"reap\"}")
    }

    /// The reasons of the project's events.
    fn event_reasons(&self, name: &str) -> Vec<String> {
        self.events(name)
            .iter()
            .filter_map(|e| e["reason"].as_str().map(str::to_string))
            .collect()
    }

    /// Checks every place a protection shows: status, the condition, an event, `get -o wide`
    /// and `reap --dry-run` (with the action it holds back).
    fn assert_kept(&self, name: &str, reason: &str, action: &str) {
        let project = self.wait_for_within(name, reason, NOTICE_DEADLINE, |p| {
            protected_by(p).iter().any(|r| r == reason)
                && p["status"]["reap"]["nextAction"] == action
        });
        let condition = condition(&project, "ReapProtected");
        assert_eq!(condition["status"], "True", "{name}: {condition}");
        assert!(
            condition["message"]
                .as_str()
                .unwrap_or_default()
                .contains(reason),
            "{name}: {condition}"
        );
        assert!(
            self.event_reasons(name)
                .iter()
                .any(|r| r == "ReapProtected"),
            "{name}: no ReapProtected event: {:?}",
            self.event_reasons(name)
        );
        let wide = self.cli(&["get", "projects", "-o", "wide"]);
        assert!(wide.status.success(), "{}", said(&wide));
        let wide = stdout(&wide);
        let line = line_of(&wide, name);
        assert!(line.contains(reason), "{name}: {line}");
        let plan = self.cli(&["reap", "--dry-run"]);
        assert!(plan.status.success(), "{}", said(&plan));
        let plan = stdout(&plan);
        let header = plan.lines().next().unwrap_or_default();
        for column in ["NAME", "NEXT ACTION", "AT", "PROTECTED BY", "REASON"] {
            assert!(header.contains(column), "{header}");
        }
        let line = line_of(&plan, name);
        assert!(line.contains(reason) && line.contains(action), "{line}");
    }
}

/// Runs a shell command in the container. The deadline is enforced with SIGKILL as well: lxc
/// forwards SIGTERM into the container, so an exec LXD never finishes would outlive a plain
/// `timeout` (seen on a loaded machine).
fn exec(name: &str, script: &str) -> Result<String, String> {
    // As generous as the other suites' lxc calls: on a loaded machine one exec can take a minute.
    let out = Command::new("timeout")
        .args([
            "-k", "5", "120", "lxc", "exec", name, "--", "sh", "-c", script,
        ])
        .stdin(Stdio::null())
        .output()
        .expect("run lxc");
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!(
            "{} ({})",
            String::from_utf8_lossy(&out.stderr).trim(),
            // timeout(1) exits 124 or 137, or dies of the KILL it sent, when lxc outlived it.
            match (out.status.code(), out.status.signal()) {
                (Some(124) | Some(137), _) | (None, Some(9)) => {
                    "lxc exec did not finish within 120s".to_string()
                }
                (code, signal) => format!("exit {code:?}, signal {signal:?}"),
            }
        ))
    }
}

/// Runs a script in the workspace with a git identity.
fn workspace(name: &str, script: &str) -> String {
    exec(name, &in_workspace(script)).unwrap_or_else(|e| panic!("{name}: {script}: {e}"))
}

/// [`workspace`] for a script that may run twice with the same outcome: an `lxc exec` that
/// never finishes (LXD 5.0 loses an exec's end now and then on a loaded machine, whether or
/// not the command ran) is tried once more.
fn workspace_idempotent(name: &str, script: &str) -> String {
    let script = in_workspace(script);
    exec(name, &script)
        .or_else(|e| {
            if !e.contains("did not finish") {
                return Err(e);
            }
            eprintln!("{name}: {e}; trying the idempotent script once more");
            exec(name, &script)
        })
        .unwrap_or_else(|e| panic!("{name}: {script}: {e}"))
}

fn in_workspace(script: &str) -> String {
    format!(
        "cd /workspace && export HOME=/root GIT_AUTHOR_NAME=t GIT_AUTHOR_EMAIL=t@example.invalid \
         GIT_COMMITTER_NAME=t GIT_COMMITTER_EMAIL=t@example.invalid && {script}"
    )
}

fn protected_by(project: &Value) -> Vec<String> {
    project["status"]["reap"]["protectedBy"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

fn condition(project: &Value, type_: &str) -> Value {
    project["status"]["conditions"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["type"] == type_).cloned())
        .unwrap_or_default()
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn line_of<'a>(table: &'a str, name: &str) -> &'a str {
    table
        .lines()
        .find(|l| l.split_whitespace().next() == Some(name))
        .unwrap_or_else(|| panic!("{name} not listed:\n{table}"))
}

/// A bare repository on the host with one commit on `main`.
fn bare_remote(dir: &Path) -> std::path::PathBuf {
    let work = dir.join("work");
    std::fs::create_dir_all(&work).unwrap();
    std::fs::write(work.join("README.md"), "remote\n").unwrap();
    git(&work, &["init", "-q", "-b", "main"]);
    git(&work, &["add", "README.md"]);
    git(&work, &["commit", "-q", "-m", "first"]);
    let bare = dir.join("remote.git");
    git(
        dir,
        &["clone", "-q", "--bare", "work", bare.to_str().unwrap()],
    );
    bare
}

#[test]
fn idle_projects_are_stopped_and_work_keeps_the_others() {
    let mut reaper = Reaper::start("{interval: 2s, workers: 4, recheckInterval: 4s}");
    let profile = reaper.cli(&["apply", "-f", SHELL_PROFILE]);
    assert!(profile.status.success(), "{}", said(&profile));
    let remote_dir = tempfile::tempdir().expect("temp dir");
    let remote = bare_remote(remote_dir.path());
    let remote_url = format!("file://{}", remote.display());

    // The projects to be kept start with a long idle window, so that none is idled before its
    // workspace is set up; the window is shortened once it is.
    let spec = |image: &str, idle_after: &str| json!({"image": image, "reap": {"idleAfter": idle_after, "idleAction": "Stop"}});
    let (idle, doomed, dirty, unpushed, blocked, broken) = (
        unique_name(),
        unique_name(),
        unique_name(),
        unique_name(),
        unique_name(),
        unique_name(),
    );
    reaper.create_project(&idle, spec("berth-tiny", "5s"));
    reaper.create_project(
        &doomed,
        json!({"image": "berth-tiny", "reap": {"idleAfter": "5s", "idleAction": "Delete"}}),
    );
    reaper.create_project(&dirty, spec("berth-base", "1h"));
    let mut with_repo = spec("berth-base", "1h");
    with_repo["repo"] = json!({"url": remote_url, "branch": "main"});
    reaper.create_project(&unpushed, with_repo);
    let mut agent = spec("berth-tiny", "1h");
    agent["agent"] = json!("shell");
    agent["brief"] = json!("BLOCK: which database should the service use?");
    reaper.create_project(&blocked, agent);
    reaper.create_project(&broken, spec("berth-base", "1h"));
    let doomed_uid = reaper.uid(&doomed);

    // Not waited on: it may be reaped by the time the others are up.
    for name in [&idle, &dirty, &unpushed, &blocked, &broken] {
        reaper.wait_reachable(name);
    }
    // Written once berth has written its own files (Ready), so nothing of berth's lands on top.
    for name in [&dirty, &unpushed, &broken] {
        reaper.wait_for_within(name, "Ready", READY_DEADLINE, |p| {
            condition(p, "Ready")["status"] == "True"
        });
    }
    workspace(
        &dirty,
        "git init -q && echo draft > notes.txt && git add notes.txt",
    );
    workspace(
        &unpushed,
        "echo more >> README.md && git commit -qam 'local only'",
    );
    workspace(
        &broken,
        "git init -q && git commit -q --allow-empty -m one && echo garbage > .git/HEAD",
    );
    exec(
        &dirty,
        "(setsid git daemon --listen=0.0.0.0 --port=3000 --base-path=/tmp --detach \
           --pid-file=/tmp/gd.pid) </dev/null >/dev/null 2>&1",
    )
    .unwrap();
    reaper.wait_for_within(&blocked, "the agent blocked", READY_DEADLINE, |p| {
        p["status"]["agent"]["state"] == "blocked"
    });
    for name in [&dirty, &unpushed, &blocked, &broken] {
        reaper.patch_project(name, json!({"spec": {"reap": {"idleAfter": "5s"}}}));
    }

    // The idle one is idled: idledAt set, container stopped and kept stopped.
    reaper.wait_for_within(&idle, "idledAt", NOTICE_DEADLINE, |p| {
        p["status"]["reap"]["idledAt"].is_string()
    });
    reaper.wait_until(NOTICE_DEADLINE, &format!("{idle} stopped"), || {
        instance_state(&idle).as_deref() == Some("STOPPED")
    });

    // The clean one whose idle action is Delete is deleted, container and volumes with it.
    reaper.wait_gone(&doomed, "not reaped", NOTICE_DEADLINE);
    let log = reaper.berth.log_text();
    assert!(
        log.lines()
            .any(|l| l.contains("reaped") && l.contains(&doomed) && l.contains("delete")),
        "{doomed} went, but not by the reaper:\n{log}"
    );
    assert_eq!(instance_count(&doomed), 0);
    assert_eq!(
        volumes_of(&doomed_uid),
        [format!("berth-trash-{doomed_uid}-workspace")],
        "a reaped workspace goes to the trash"
    );
    let trash = reaper.client().get("/apis/berth.dev/v1alpha1/trash").json();
    assert!(
        trash["items"].as_array().is_some_and(|items| items
            .iter()
            .any(|i| i["uid"] == doomed_uid.as_str() && i["reason"] == "reaper")),
        "{trash}"
    );

    // The others are kept, each with its protection shown everywhere.
    for (name, reason) in [
        (&dirty, "UnsavedWork"),
        (&unpushed, "UnsavedWork"),
        (&blocked, "AgentBlocked"),
        (&broken, "InspectionFailed"),
    ] {
        reaper.assert_kept(name, reason, "Stop");
        let project = reaper.get_project(name).unwrap();
        assert!(
            project["status"]["reap"]["idledAt"].is_null(),
            "{name} was idled: {}",
            project["status"]
        );
        assert_eq!(instance_state(name).as_deref(), Some("RUNNING"), "{name}");
    }
    let dirty_status = reaper.get_project(&dirty).unwrap();
    assert_eq!(
        dirty_status["status"]["unsavedWork"]["uncommitted"], 1,
        "{}",
        dirty_status["status"]
    );
    let unpushed_status = reaper.get_project(&unpushed).unwrap();
    assert_eq!(
        unpushed_status["status"]["unsavedWork"]["unpushed"], 1,
        "{}",
        unpushed_status["status"]
    );
    let blocked_status = reaper.get_project(&blocked).unwrap();
    assert_eq!(blocked_status["status"]["agent"]["state"], "blocked");
    assert_eq!(
        blocked_status["status"]["agent"]["message"],
        "which database should the service use?"
    );
    assert!(reaper.get_project(&broken).unwrap()["status"]["unsavedWork"].is_null());

    // Each refusal is counted once its idle action falls due (their idle windows end at
    // different moments), not in every pass that declines again.
    let count = || -> Vec<f64> {
        ["UnsavedWork", "AgentBlocked", "InspectionFailed"]
            .iter()
            .map(|r| reaper.refusals(r))
            .collect()
    };
    let counted = reaper.eventually(NOTICE_DEADLINE, "the refusals counted", || {
        let counted = count();
        (counted[0] >= 2.0 && counted[1] >= 1.0 && counted[2] >= 1.0).then_some(counted)
    });
    reaper.wait_passes("reap", 4);
    assert_eq!(count(), counted, "refusals counted again in later passes");

    let plan = stdout(&reaper.cli(&["reap", "--dry-run"]));
    let idle_line = line_of(&plan, &idle);
    assert!(idle_line.contains("idled at"), "{idle_line}");

    // The listener on 0.0.0.0:3000 has its preview URL.
    let text = reaper.eventually(NOTICE_DEADLINE, "port 3000 listed", || {
        let ports = reaper.cli(&["ports", &dirty]);
        assert!(ports.status.success(), "{}", said(&ports));
        let text = stdout(&ports);
        text.contains(&format!("http://{dirty}--3000.localhost"))
            .then_some(text)
    });
    assert!(text.starts_with("PORT"), "{text}");

    // A plain delete of unpushed work is held; the container and volumes stay, and Ready says
    // why.
    let uid = reaper.uid(&unpushed);
    let delete = reaper.cli(&["delete", "project", &unpushed]);
    assert_eq!(delete.status.code(), Some(1), "{}", said(&delete));
    assert!(said(&delete).contains("UnsavedWork"), "{}", said(&delete));
    let held = reaper
        .get_project(&unpushed)
        .expect("held project still there");
    assert_eq!(held["status"]["phase"], "Deleting");
    let blocked_condition = condition(&held, "DeletionBlocked");
    assert_eq!(blocked_condition["status"], "True", "{blocked_condition}");
    assert_eq!(blocked_condition["reason"], "UnsavedWork");
    let ready = condition(&held, "Ready");
    assert!(
        ready["message"]
            .as_str()
            .unwrap_or_default()
            .contains("deletion held by UnsavedWork"),
        "{ready}"
    );
    assert!(
        reaper
            .event_reasons(&unpushed)
            .iter()
            .any(|r| r == "DeletionBlocked"),
        "{:?}",
        reaper.event_reasons(&unpushed)
    );
    assert!(
        reaper.refusals("UnsavedWork") > counted[0],
        "the hold is a refusal too"
    );
    assert_eq!(instance_count(&unpushed), 1);
    assert_eq!(volumes_of(&uid).len(), 1, "{:?}", volumes_of(&uid));
    assert_eq!(
        workspace_idempotent(&unpushed, "git log -1 --format=%s").trim(),
        "local only",
        "the held workspace was touched"
    );

    // Pushed, the deletion finishes by itself. The container has no network, so origin's
    // file:// path is made to exist inside it for the push, which updates origin/main, and goes
    // again: a remote that is a path inside the container saves nothing, the host's does.
    workspace(
        &unpushed,
        &format!(
            "mkdir -p {dir} && git init -q --bare {path} && git push -q origin HEAD:main \
             && rm -rf {path}",
            dir = remote.parent().unwrap().display(),
            path = remote.display()
        ),
    );
    reaper.wait_gone(
        &unpushed,
        "the held deletion did not finish once the work was pushed",
        NOTICE_DEADLINE,
    );
    assert_eq!(instance_count(&unpushed), 0);
    assert!(live_volumes_of(&uid).is_empty(), "{:?}", volumes_of(&uid));

    // --force deletes held work at once.
    let uid = reaper.uid(&dirty);
    let delete = reaper.cli(&["delete", "project", &dirty]);
    assert_eq!(delete.status.code(), Some(1), "{}", said(&delete));
    let forced = reaper.cli(&["delete", "project", &dirty, "--force"]);
    assert!(forced.status.success(), "{}", said(&forced));
    assert!(reaper.get_project(&dirty).is_none());
    assert_eq!(instance_count(&dirty), 0);
    assert!(live_volumes_of(&uid).is_empty(), "{:?}", volumes_of(&uid));
}

/// `lxc monitor` of lifecycle events, to count the starts of one container.
struct StartCounter {
    child: Child,
    out: tempfile::NamedTempFile,
    instance: String,
}

impl StartCounter {
    fn new(instance: &str) -> StartCounter {
        let out = tempfile::NamedTempFile::new().expect("temp file");
        let child = Command::new("lxc")
            .args(["monitor", "--type=lifecycle", "--format=json"])
            .stdin(Stdio::null())
            .stdout(out.reopen().expect("reopen"))
            .stderr(Stdio::null())
            .spawn()
            .expect("lxc monitor");
        StartCounter {
            child,
            out,
            instance: instance.to_string(),
        }
    }

    /// Waits until the container was started `n` times since the counting began.
    fn wait_starts(&self, n: usize) {
        crate::support::eventually(
            NOTICE_DEADLINE,
            &format!("{} started {n} times", self.instance),
            || format!("; started {} times", self.starts()),
            || (self.starts() >= n).then_some(()),
        );
    }

    fn starts(&self) -> usize {
        let text = std::fs::read_to_string(self.out.path()).unwrap_or_default();
        let source = format!("/1.0/instances/{}", self.instance);
        // One event per line; the monitor sees the whole LXD, so most lines are others'.
        text.lines()
            .filter(|line| line.contains(&self.instance))
            .filter_map(|line| serde_json::from_str::<Value>(line).ok())
            .filter(|e| {
                e["metadata"]["action"] == "instance-started"
                    && e["metadata"]["source"].as_str() == Some(source.as_str())
            })
            .count()
    }
}

impl Drop for StartCounter {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn stopped_work_due_for_delete_and_pruned_work_are_kept() {
    let recheck = Duration::from_secs(30);
    let mut reaper = Reaper::start("{interval: 1s, workers: 4, recheckInterval: 30s}");

    // A stopped project with an untracked file, then due for deletion. Its starts are
    // counted from its first boot on, which also shows the counting works.
    let stopped = unique_name();
    let counter = StartCounter::new(&stopped);
    reaper.create_project(
        &stopped,
        json!({"image": "berth-tiny", "reap": {"idleAfter": "1h", "idleAction": "Stop"}}),
    );
    reaper.wait_reachable(&stopped);
    counter.wait_starts(1);
    workspace_idempotent(&stopped, "echo draft > notes.txt");
    reaper.wait_for_within(&stopped, "the file seen", NOTICE_DEADLINE, |p| {
        p["status"]["unsavedWork"]["untracked"] == 1
    });
    let stop = reaper.cli(&["stop", &stopped]);
    assert!(stop.status.success(), "{}", said(&stop));
    reaper.wait_until(NOTICE_DEADLINE, &format!("{stopped} stopped"), || {
        instance_state(&stopped).as_deref() == Some("STOPPED")
    });
    let booted = counter.starts();
    reaper.patch_project(
        &stopped,
        json!({"spec": {"reap": {"idleAfter": "2s", "idleAction": "Delete"}}}),
    );
    reaper.assert_kept(&stopped, "UnsavedWork", "Delete");
    // What it held was last seen while it ran: it is booted once, without its agent, to look.
    counter.wait_starts(booted + 1);

    // Kept through many passes, booted to be looked at now and then, not every pass.
    let watched = Instant::now();
    let passes = reaper.reap_passes();
    reaper.wait_passes("reap", 10);
    let (elapsed, passes) = (watched.elapsed(), reaper.reap_passes() - passes);
    let starts = counter.starts() - booted - 1;
    let allowed = (elapsed.as_secs() / recheck.as_secs()) as usize;
    assert!(
        starts <= allowed && (starts as f64) < passes / 2.0,
        "{starts} more starts in {passes} passes over {elapsed:?}\n{}",
        reaper.berth.log_text()
    );
    let project = reaper.get_project(&stopped).expect("kept");
    assert!(project["metadata"]["deletionTimestamp"].is_null());
    assert_eq!(protected_by(&project), ["UnsavedWork"]);
    assert_eq!(project["status"]["unsavedWork"]["untracked"], 1);
    assert_eq!(instance_state(&stopped).as_deref(), Some("STOPPED"));
    assert_eq!(
        reaper.metric("berth_reap_actions_total{action=\"delete\"}"),
        0.0
    );

    // A GitOps prune of a project with an untracked file is held, and apply says so.
    let pruned = unique_name();
    let set = format!("{pruned}-set");
    let with = tempfile::tempdir().expect("temp dir");
    let without = tempfile::tempdir().expect("temp dir");
    let profile = std::fs::read_to_string(SHELL_PROFILE).expect("shell profile");
    for dir in [with.path(), without.path()] {
        std::fs::write(dir.join("profile.yaml"), &profile).unwrap();
    }
    std::fs::write(
        with.path().join("project.yaml"),
        format!(
            "apiVersion: berth.dev/v1alpha1\nkind: Project\nmetadata: {{name: {pruned}}}\n\
             spec: {{image: berth-tiny, reap: {{idleAfter: 1h}}}}\n"
        ),
    )
    .unwrap();
    let dir_of = |d: &tempfile::TempDir| d.path().to_str().unwrap().to_string();
    let apply = reaper.cli(&["apply", "-f", &dir_of(&with), "--prune", "--applyset", &set]);
    assert!(apply.status.success(), "{}", said(&apply));
    reaper.adopt(&pruned);
    reaper.wait_reachable(&pruned);
    let uid = reaper.uid(&pruned);
    workspace_idempotent(&pruned, "echo draft > notes.txt");
    let refused = reaper.refusals("UnsavedWork");

    let apply = reaper.cli(&[
        "apply",
        "-f",
        &dir_of(&without),
        "--prune",
        "--applyset",
        &set,
    ]);
    let out = said(&apply);
    assert!(
        !apply.status.success(),
        "a held prune must not pass as done: {out}"
    );
    let printed = stdout(&apply);
    let line = line_of(&printed, &format!("project/{pruned}"));
    assert!(
        line.contains("held") && line.contains("UnsavedWork"),
        "{line}\n{out}"
    );
    assert!(
        !stdout(&apply)
            .lines()
            .any(|l| l.trim() == format!("project/{pruned} pruned")),
        "{out}"
    );
    let held = reaper.get_project(&pruned).expect("held, not destroyed");
    assert_eq!(held["status"]["phase"], "Deleting");
    let blocked = condition(&held, "DeletionBlocked");
    assert_eq!(
        (blocked["status"].as_str(), blocked["reason"].as_str()),
        (Some("True"), Some("UnsavedWork")),
        "{blocked}"
    );
    assert!(
        condition(&held, "Ready")["message"]
            .as_str()
            .unwrap_or_default()
            .contains("deletion held"),
        "{}",
        held["status"]
    );
    assert_eq!(reaper.refusals("UnsavedWork"), refused + 1.0);
    assert_eq!(instance_state(&pruned).as_deref(), Some("RUNNING"));
    assert_eq!(volumes_of(&uid).len(), 1, "{:?}", volumes_of(&uid));
    assert_eq!(
        workspace_idempotent(&pruned, "cat notes.txt").trim(),
        "draft"
    );

    let forced = reaper.cli(&["delete", "project", &pruned, "--force"]);
    assert!(forced.status.success(), "{}", said(&forced));
    assert!(reaper.get_project(&pruned).is_none());
    assert!(live_volumes_of(&uid).is_empty(), "{:?}", volumes_of(&uid));
}

/// The list's resourceVersion: it moves with every write of any object in the store.
fn list_version(reaper: &Reaper) -> u64 {
    let list = reaper.client().get(PROJECTS).json();
    list["metadata"]["resourceVersion"]
        .as_str()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no resourceVersion on the list: {}", list["metadata"]))
}

#[test]
fn a_steady_fleet_writes_nothing_and_a_touched_file_shows_within_two_passes() {
    let mut reaper = Reaper::start("{interval: 2s, workers: 4}");
    let names = [unique_name(), unique_name()];
    for name in &names {
        reaper.create_project(
            name,
            json!({"image": "berth-tiny", "reap": {"idleAfter": "1h", "idleAction": "Stop"}}),
        );
    }
    for name in &names {
        reaper.wait_reachable(name);
        reaper.wait_for_within(name, "Ready with an inspection", READY_DEADLINE, |p| {
            condition(p, "Ready")["status"] == "True"
                && p["status"]["activity"]["inspectedAt"].is_string()
        });
    }

    // Every watch event from here on, kept by a reader that lives as long as the daemon.
    let events = std::sync::Arc::new(std::sync::Mutex::new(Vec::<Value>::new()));
    let mut watch = reaper.client().watch(&format!("{PROJECTS}?watch=true"));
    let seen = events.clone();
    std::thread::spawn(move || {
        while let Some(event) = watch.next_event() {
            seen.lock().unwrap().push(event);
        }
    });
    let changed_since = |version: u64| -> Vec<Value> {
        events
            .lock()
            .unwrap()
            .iter()
            .filter(|e| {
                e["object"]["metadata"]["resourceVersion"]
                    .as_str()
                    .and_then(|v| v.parse::<u64>().ok())
                    .is_some_and(|v| v > version)
            })
            .cloned()
            .collect()
    };

    // Steady once two passes in a row wrote nothing (what is left of starting up settles
    // first); then it stays so for three more.
    let until = Instant::now() + NOTICE_DEADLINE;
    let mut version = list_version(&reaper);
    loop {
        reaper.wait_passes("reap", 2);
        let now = list_version(&reaper);
        if now == version {
            break;
        }
        assert!(
            Instant::now() < until,
            "the fleet never settled: {:?}",
            changed_since(version)
        );
        version = now;
    }
    let inspections = reaper.metric("berth_scheduler_inspections_total{result=\"ok\"}");
    reaper.wait_passes("reap", 3);
    assert_eq!(
        list_version(&reaper),
        version,
        "a steady fleet wrote: {:?}",
        changed_since(version)
    );
    assert_eq!(changed_since(version), Vec::<Value>::new());
    assert!(
        reaper.metric("berth_scheduler_inspections_total{result=\"ok\"}") >= inspections + 4.0,
        "the passes kept inspecting both projects"
    );

    // A file touched in one workspace: its lastActiveAt moves within two passes.
    let before = reaper.get_project(&names[0]).expect("project")["status"]["activity"].clone();
    let touched = chrono::Utc::now() - chrono::Duration::seconds(1);
    exec(&names[0], "echo work > /workspace/notes.txt").expect("touch a file");
    reaper.wait_passes("reap", 2);
    let project = reaper.get_project(&names[0]).expect("project");
    let activity = &project["status"]["activity"];
    let last_active: chrono::DateTime<chrono::Utc> = activity["lastActiveAt"]
        .as_str()
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("no lastActiveAt: {activity} (before: {before})"));
    assert!(
        last_active >= touched,
        "{activity} (before: {before}, touched at {touched})"
    );
    assert_eq!(activity["source"], "files", "{activity}");
    let written: BTreeSet<String> = changed_since(version)
        .iter()
        .filter_map(|e| e["object"]["metadata"]["name"].as_str().map(str::to_string))
        .collect();
    assert_eq!(written, BTreeSet::from([names[0].clone()]));
}
