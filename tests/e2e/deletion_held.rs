//! A plain delete inspects the workspace wherever it is, in a real daemon against real LXD and
//! real git: a project whose image was changed to a typo (its step back at Requested, its
//! container gone) is held with its unpushed commit; a project whose container was deleted
//! behind berth's back has its volume inspected from an inspection instance, is held, and is
//! deleted once the work is gone, leaving no inspection instance; a file written while the
//! container stops is found by the look at the stopped workspace, which holds the deletion and
//! starts the container again.
//!
//! The work is made after the last look any scheduler pass could take (the scheduler's interval
//! is an hour), so no recorded `status.unsavedWork` can answer for the deletion's own look.

use std::time::Duration;

use crate::harness::Berth;
use crate::harness::{
    PROJECTS, READY_DEADLINE, exec, instance_count, instance_state, live_volumes_of, lxc,
    volumes_of,
};
use crate::support::daemon::Daemon;
use crate::support::said;
use serde_json::{Value, json};

/// How long a held deletion may take to show, or to finish once the work is gone.
const HOLD_DEADLINE: Duration = Duration::from_secs(240);
/// No scheduler pass runs after the projects are made; a held deletion looks again every 3s.
const CONFIG: &str = "scheduler: {interval: 1h, workers: 2, recheckInterval: 3s}\n";
/// A held deletion looks again only after an hour, unless a person asks.
const SLOW_RECHECK: &str = "scheduler: {interval: 1h, workers: 2, recheckInterval: 1h}\n";

/// `berth-t-del-<random>`: unique on this machine.
fn unique_name() -> String {
    format!("berth-t-del-{:08x}", rand::random::<u32>())
}

/// A running daemon and the projects it made: deleted with `--force` (then checked with lxc)
/// when the test ends, whatever happened.
struct Deleter {
    berth: Berth,
    /// Instances the test made itself, deleted at the end.
    own_instances: Vec<String>,
}

impl std::ops::Deref for Deleter {
    type Target = Berth;

    fn deref(&self) -> &Berth {
        &self.berth
    }
}

impl std::ops::DerefMut for Deleter {
    fn deref_mut(&mut self) -> &mut Berth {
        &mut self.berth
    }
}

impl Deleter {
    fn start() -> Deleter {
        Deleter::start_with(CONFIG)
    }

    fn start_with(config: &str) -> Deleter {
        Deleter {
            berth: Berth::launch(Daemon::running().config(config)),
            own_instances: Vec::new(),
        }
    }

    /// Creates a project that no reaper touches during the test, and waits until it is Ready.
    fn create_ready(&mut self, name: &str, image: &str) -> String {
        let created = self.create_project(
            name,
            json!({"image": image, "reap": {"idleAfter": "24h", "maxAge": "never"}}),
        );
        let uid = crate::harness::uid_of(&created);
        self.wait_for_within(name, "Ready", READY_DEADLINE, |p| {
            condition(p, "Ready")["status"] == "True"
        });
        self.wait_until(READY_DEADLINE, &format!("{name}: init ready"), || {
            exec(name, "test -f /run/init.ready").is_ok()
        });
        uid
    }

    /// The project, once its deletion is held by `reason`.
    fn wait_held(&self, name: &str, reason: &str) -> Value {
        let held = self.wait_for_within(name, "a held deletion", HOLD_DEADLINE, |p| {
            condition(p, "DeletionBlocked")["status"] == "True"
        });
        assert_eq!(held["status"]["phase"], "Deleting", "{}", held["status"]);
        let blocked = condition(&held, "DeletionBlocked");
        assert_eq!(blocked["reason"], reason, "{blocked}");
        let ready = condition(&held, "Ready");
        assert!(
            ready["message"]
                .as_str()
                .unwrap_or_default()
                .contains(&format!("deletion held by {reason}")),
            "{ready}"
        );
        held
    }
}

impl Drop for Deleter {
    fn drop(&mut self) {
        for name in &self.own_instances {
            let _ = lxc(&["delete", "--force", name]);
        }
        // The inspection instances of a held deletion go with their look; one a failed test
        // left is berth's own, labelled with its project's uid.
        for name in self.tracked_names() {
            if let Some(uid) = self.tracked_uid(&name)
                && inspect_labelled(&inspection_instance(&uid), &uid)
            {
                let _ = lxc(&["delete", "--force", &inspection_instance(&uid)]);
            }
        }
    }
}

/// The name of the inspection instance berth makes for the project `uid`.
fn inspection_instance(uid: &str) -> String {
    format!("berth-inspect-{uid}")
}

/// Whether `name` is berth's inspection instance of `uid` (never delete anything else).
fn inspect_labelled(name: &str, uid: &str) -> bool {
    lxc(&["config", "get", name, "user.berth.inspects"]).is_ok_and(|v| v.trim() == uid)
}

fn condition(project: &Value, type_: &str) -> Value {
    project["status"]["conditions"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["type"] == type_).cloned())
        .unwrap_or_default()
}

/// Runs a script in the workspace with a git identity.
fn workspace(name: &str, script: &str) -> String {
    let script = format!(
        "cd /workspace && export HOME=/root GIT_AUTHOR_NAME=t GIT_AUTHOR_EMAIL=t@example.invalid \
         GIT_COMMITTER_NAME=t GIT_COMMITTER_EMAIL=t@example.invalid && {script}"
    );
    exec(name, &script).unwrap_or_else(|e| panic!("{name}: {script}: {e}"))
}

/// The workspace went back to Requested (a typo in the image): a plain delete still finds the
/// unpushed commit in the volume, and holds.
#[test]
fn an_image_typo_does_not_make_unpushed_work_deletable() {
    let mut berth = Deleter::start();
    let name = unique_name();
    let uid = berth.create_ready(&name, "berth-base");
    let reached = berth.get_project(&name).expect("project")["status"]["firstReachableAt"].clone();
    assert!(reached.is_string(), "firstReachableAt recorded: {reached}");
    workspace(
        &name,
        "git init -q && echo draft > notes.txt && git add notes.txt && git commit -qm 'local only'",
    );

    let typo = format!("berth-bsae-{:08x}", rand::random::<u32>());
    let reply = berth.client().request(
        "PATCH",
        &format!("{PROJECTS}/{name}"),
        Some("application/merge-patch+json"),
        json!({"spec": {"image": typo}}).to_string().as_bytes(),
    );
    assert_eq!(reply.status, 200, "{}", reply.text());
    let regressed = berth.wait_for_within(&name, "ImageNotFound", READY_DEADLINE, |p| {
        condition(p, "Ready")["reason"] == "ImageNotFound"
    });
    assert_eq!(regressed["status"]["step"], "Requested");
    assert_eq!(
        regressed["status"]["firstReachableAt"], reached,
        "never cleared"
    );
    assert_eq!(instance_count(&name), 0, "the old container was replaced");
    assert!(
        regressed["status"]["unsavedWork"].is_null(),
        "no recorded finding answers for the deletion's own look: {}",
        regressed["status"]
    );

    let delete = berth.cli(&["delete", "project", &name]);
    assert_eq!(delete.status.code(), Some(1), "{}", said(&delete));
    assert!(said(&delete).contains("UnsavedWork"), "{}", said(&delete));
    let held = berth.wait_held(&name, "UnsavedWork");
    assert_eq!(
        held["status"]["unsavedWork"]["unpushed"], 1,
        "{}",
        held["status"]
    );
    assert_eq!(volumes_of(&uid).len(), 1, "{:?}", volumes_of(&uid));
    assert_eq!(instance_count(&inspection_instance(&uid)), 0);
}

/// The container was deleted behind berth's back while the daemon was down, and the deletion
/// was asked for before the controller could recreate it: the volume is inspected from an
/// inspection instance and the deletion is held; once the work is gone, it completes.
#[test]
fn a_deleted_container_has_its_volume_inspected() {
    let mut berth = Deleter::start();
    let name = unique_name();
    let uid = berth.create_ready(&name, "berth-tiny");
    let volume = format!("berth-{uid}-workspace");
    // Not a git repository: a file berth did not write is unsaved work.
    workspace(&name, "echo draft > notes.txt");

    berth.terminate();
    lxc(&["delete", "--force", &name]).expect("delete the container behind berth's back");
    // The deletion is recorded by a paused daemon on the same store, so the controller never
    // sees the container missing before it sees the deletion.
    berth.restart_paused();
    let delete = berth.cli(&["delete", "project", &name, "--wait=false"]);
    assert!(delete.status.success(), "{}", said(&delete));
    berth.terminate();
    berth.restart();

    let held = berth.wait_held(&name, "UnsavedWork");
    assert_eq!(
        held["status"]["unsavedWork"]["untracked"], 1,
        "{}",
        held["status"]
    );
    assert_eq!(instance_count(&name), 0, "no container was recreated");
    assert_eq!(volumes_of(&uid), vec![volume.clone()]);
    // The hold looks again now and then, each look from a fresh inspection instance: the one
    // of any look is gone once it is done.
    berth.wait_until(
        Duration::from_secs(120),
        "the inspection instance removed after its look",
        || instance_count(&inspection_instance(&uid)) == 0,
    );
    assert!(
        berth
            .berth
            .log_text()
            .contains("no container of this project: inspecting its workspace volume"),
        "the volume was inspected from an inspection instance"
    );

    // The work is taken away through an instance of the test's own with the volume attached.
    let own = unique_name();
    berth.own_instances.push(own.clone());
    lxc(&["init", "berth-tiny", &own]).expect("make an instance");
    lxc(&[
        "config",
        "device",
        "add",
        &own,
        "ws",
        "disk",
        "pool=default",
        &format!("source={volume}"),
        "path=/workspace",
    ])
    .expect("attach the volume");
    lxc(&["start", &own]).expect("start it");
    berth.wait_until(READY_DEADLINE, "the work removed", || {
        exec(
            &own,
            "rm -f /workspace/notes.txt && test ! -e /workspace/notes.txt",
        )
        .is_ok()
    });
    lxc(&["delete", "--force", &own]).expect("delete the instance");

    berth.wait_gone(
        &name,
        "the held deletion did not finish once the work was gone",
        HOLD_DEADLINE,
    );
    // Gone from the project's names, kept in the trash.
    assert!(live_volumes_of(&uid).is_empty(), "{:?}", volumes_of(&uid));
    assert!(
        volumes_of(&uid)
            .iter()
            .all(|v| v.starts_with("berth-trash-")),
        "{:?}",
        volumes_of(&uid)
    );
    assert_eq!(instance_count(&inspection_instance(&uid)), 0);
}

/// A process in the container writes a file when it is told to end, as on a stop: the look
/// after the container's processes were ended finds it, the deletion is held, and the container
/// runs again.
#[test]
fn a_write_on_the_way_out_is_not_lost() {
    let mut berth = Deleter::start();
    let name = unique_name();
    let uid = berth.create_ready(&name, "berth-tiny");
    // Before its last look the deletion sends SIGTERM to every process, as init does on a stop.
    exec(
        &name,
        "setsid sh -c 'trap \"echo late > /workspace/late.txt; sync; exit 0\" TERM; \
         while :; do sleep 1; done' </dev/null >/dev/null 2>&1 &",
    )
    .expect("start the late writer");

    let delete = berth.cli(&["delete", "project", &name]);
    assert_eq!(delete.status.code(), Some(1), "{}", said(&delete));
    let held = berth.wait_held(&name, "UnsavedWork");
    assert_eq!(
        held["status"]["unsavedWork"]["untracked"], 1,
        "{}",
        held["status"]
    );
    assert_eq!(volumes_of(&uid).len(), 1, "{:?}", volumes_of(&uid));
    // The writer runs only on SIGTERM: its file shows the processes were ended before the look
    // that held the deletion.
    assert_eq!(
        instance_state(&name).as_deref(),
        Some("RUNNING"),
        "put back as it was"
    );
    assert_eq!(workspace(&name, "cat late.txt").trim(), "late");

    // Gone again, the deletion finishes.
    workspace(&name, "rm late.txt");
    berth.wait_gone(
        &name,
        "the held deletion did not finish once the file was gone",
        HOLD_DEADLINE,
    );
    // Gone from the project's names, kept in the trash.
    assert!(live_volumes_of(&uid).is_empty(), "{:?}", volumes_of(&uid));
    assert!(
        volumes_of(&uid)
            .iter()
            .all(|v| v.starts_with("berth-trash-")),
        "{:?}",
        volumes_of(&uid)
    );
    assert_eq!(instance_count(&name), 0);
}

/// A held deletion says what holds it (the untracked file, the unpushed commit), that the
/// project stays Deleting and when it is looked at next; every view of its protection agrees;
/// once the work is gone, asking again deletes it at once, without waiting for the hour-long
/// recheck interval; and its events are still listed after it is gone.
#[test]
fn a_held_deletion_names_its_work_and_a_second_delete_looks_again() {
    let mut berth = Deleter::start_with(SLOW_RECHECK);
    let name = unique_name();
    berth.create_ready(&name, "berth-base");
    workspace(
        &name,
        "git init -q && echo draft > notes.txt && git add notes.txt && \
         git commit -qm 'local only' && echo more > todo-later.txt",
    );
    let commit = workspace(&name, "git rev-parse --short HEAD")
        .trim()
        .to_string();

    let delete = berth.cli(&["delete", "project", &name]);
    let text = said(&delete);
    assert_eq!(delete.status.code(), Some(1), "{text}");
    for expected in [
        "UnsavedWork",
        "todo-later.txt",
        commit.as_str(),
        "stays Deleting",
        "next look at ",
        "(in ",
    ] {
        assert!(text.contains(expected), "{expected:?} not in: {text}");
    }
    let held = berth.wait_held(&name, "UnsavedWork");
    assert!(
        held["status"]["deletionHold"]["nextLookAt"].is_string(),
        "{}",
        held["status"]
    );

    // Every view says what protects it: the wide listing and the reaper's plan alike.
    let wide = berth.cli(&["get", "projects", "-o", "wide"]);
    let row = String::from_utf8_lossy(&wide.stdout)
        .lines()
        .find(|l| l.starts_with(&name))
        .unwrap_or_default()
        .to_string();
    assert!(row.contains("UnsavedWork"), "{}", said(&wide));
    let plan = berth.cli(&["reap", "--dry-run"]);
    let planned = String::from_utf8_lossy(&plan.stdout)
        .lines()
        .find(|l| l.starts_with(&name))
        .unwrap_or_default()
        .to_string();
    assert!(planned.contains("UnsavedWork"), "{}", said(&plan));

    // The work is discarded by hand; a second delete looks again now and deletes it.
    workspace(&name, "rm -rf .git notes.txt todo-later.txt");
    let again = berth.cli(&["delete", "project", &name, "--timeout=3m"]);
    assert!(again.status.success(), "{}", said(&again));
    assert!(berth.get_project(&name).is_none(), "deleted");

    // Its events outlive it (events.retention, an hour by default).
    let events = berth.cli(&["events", &name]);
    assert!(events.status.success(), "{}", said(&events));
    assert!(
        String::from_utf8_lossy(&events.stdout).contains("DeletionBlocked"),
        "{}",
        said(&events)
    );
}
