//! The controller against a real LXD: apply → Ready, durable /workspace through stop, start,
//! a container deleted behind berth's back and an image change, limits, restart, name
//! conflicts, the paused annotation and deletion.

use std::time::{Duration, Instant};

use crate::harness::{
    Berth, exec, instance_count, instance_state, instance_uid, live_volumes_of, lxc, lxc_when_idle,
    read_file, ready_reason, uid_of, unique_name, volumes_of,
};
use serde_json::json;

#[test]
fn apply_ends_ready_with_limits_label_and_workspace_volume() {
    // A short interval, so the pid (read at the first resync) and the first inspection come
    // soon, and the status is then watched across passes that must not rewrite it.
    let config = tempfile::NamedTempFile::new().expect("config file");
    std::fs::write(config.path(), "scheduler: {interval: 2s}\n").expect("write config");
    let mut berth = Berth::start_with(&[], &["--config", config.path().to_str().unwrap()]);
    let name = unique_name();
    berth.create_project(
        &name,
        json!({"image": "berth-tiny", "resources": {"cpu": "1", "memory": "256MiB"}}),
    );
    let project = berth.wait_ready(&name);
    let uid = uid_of(&project);
    let status = &project["status"];
    assert_eq!(status["phase"], "Ready");
    assert_eq!(status["step"], "Reachable");
    assert_eq!(status["container"]["name"], name.as_str());
    assert!(
        status["container"]["imageFingerprint"].is_string(),
        "{status}"
    );
    assert!(
        project["metadata"]["finalizers"]
            .as_array()
            .unwrap()
            .contains(&json!("berth.dev/teardown"))
    );

    assert_eq!(instance_uid(&name).as_deref(), Some(uid.as_str()));
    // The container names the controller that made it, as its store knows itself.
    let controller: String = rusqlite::Connection::open(berth.data_dir.join("berth.db"))
        .unwrap()
        .query_row(
            "SELECT value FROM settings WHERE name = 'controllerId'",
            [],
            |row| row.get(0),
        )
        .unwrap();
    assert_eq!(
        lxc(&["config", "get", &name, "user.berth.controller"])
            .unwrap()
            .trim(),
        controller
    );
    assert_eq!(
        lxc(&["config", "get", &name, "limits.memory"])
            .unwrap()
            .trim(),
        "268435456"
    );
    // One pinned CPU is what the container sees.
    assert_eq!(exec(&name, "nproc").unwrap().trim(), "1");
    assert_eq!(volumes_of(&uid), [format!("berth-{uid}-workspace")]);
    assert!(
        exec(
            &name,
            "mountpoint -q /workspace || grep -q ' /workspace ' /proc/mounts"
        )
        .is_ok()
    );

    // Events tell the story step by step.
    let events = berth
        .client()
        .get(&format!("{}/{name}/events", crate::harness::PROJECTS))
        .json();
    let reasons: Vec<&str> = events["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["reason"].as_str())
        .collect();
    for step in ["Created", "Started", "Reachable", "Ready"] {
        assert!(reasons.contains(&step), "no {step} event in {reasons:?}");
    }

    // Ready, its pid read (the create step reads the started container without its state, the
    // next resync reads it) and its first inspection recorded; then unchanged across passes:
    // neither the controller nor the scheduler rewrites a status nothing changed in.
    // The reap plan too: one made while the project was still being built (no idle action
    // yet) is made again once a pass sees it Ready.
    let project = berth.wait_for(&name, "its pid, first inspection and plan", |p| {
        p["status"]["container"]["pid"].is_i64()
            && p["status"]["activity"]["inspectedAt"].is_string()
            && p["status"]["reap"]["nextAction"] == "Stop"
    });
    let rv = project["metadata"]["resourceVersion"].clone();
    std::thread::sleep(Duration::from_secs(5));
    let again = berth.get_project(&name).unwrap();
    assert_eq!(
        again["metadata"]["resourceVersion"], rv,
        "status churn: {project} became {again}"
    );
}

#[test]
fn workspace_survives_stop_start_and_a_container_deleted_behind_berths_back() {
    let mut berth = Berth::start(None);
    let name = unique_name();
    berth.create_project(&name, json!({"image": "berth-tiny"}));
    let project = berth.wait_ready(&name);
    let uid = uid_of(&project);
    exec(&name, "echo durable > /workspace/note").unwrap();

    berth.patch_project(&name, json!({"spec": {"state": "Stopped"}}));
    berth.wait_for(&name, "Stopped", |p| p["status"]["phase"] == "Stopped");
    assert_eq!(instance_state(&name).as_deref(), Some("STOPPED"));

    berth.patch_project(&name, json!({"spec": {"state": "Running"}}));
    berth.wait_ready(&name);
    assert_eq!(
        read_file(&name, "/workspace/note").unwrap().trim(),
        "durable"
    );

    lxc_when_idle(&["delete", "--force", &name]).unwrap();
    let recreated = berth.wait_for(&name, "recreated and Ready", |p| {
        ready_reason(p).is_some_and(|(s, _)| s == "True")
            && p["status"]["container"]["createdAt"] != project["status"]["container"]["createdAt"]
    });
    assert_eq!(instance_count(&name), 1);
    assert_eq!(instance_uid(&name).as_deref(), Some(uid.as_str()));
    assert_eq!(
        read_file(&name, "/workspace/note").unwrap().trim(),
        "durable"
    );
    assert_eq!(
        volumes_of(&uid).len(),
        1,
        "the same volume, not a second one"
    );
    assert_eq!(recreated["status"]["phase"], "Ready");
}

#[test]
fn a_new_image_replaces_the_container_and_keeps_the_workspace() {
    let mut berth = Berth::start(None);
    let name = unique_name();
    berth.create_project(&name, json!({"image": "berth-tiny"}));
    let first = berth.wait_ready(&name);
    exec(&name, "echo kept > /workspace/note").unwrap();
    let tiny = first["status"]["container"]["imageFingerprint"].clone();

    berth.patch_project(&name, json!({"spec": {"image": "berth-base"}}));
    let replaced = berth.wait_for(&name, "Ready on the new image", |p| {
        ready_reason(p).is_some_and(|(s, _)| s == "True")
            && p["status"]["observedGeneration"] == p["metadata"]["generation"]
            && p["status"]["container"]["imageFingerprint"] != tiny
    });
    assert!(replaced["status"]["container"]["imageFingerprint"].is_string());
    assert_eq!(read_file(&name, "/workspace/note").unwrap().trim(), "kept");
    // The Debian image has bash; the busybox one does not.
    assert!(exec(&name, "command -v bash").is_ok());
    assert_eq!(instance_count(&name), 1);
}

#[test]
fn the_restart_annotation_reboots_the_container() {
    let mut berth = Berth::start(None);
    let name = unique_name();
    berth.create_project(&name, json!({"image": "berth-tiny"}));
    berth.wait_ready(&name);
    // The start in the create step is read without the container's state: its pid follows
    // with the next read.
    let before = berth.wait_for(&name, "its pid", |p| {
        p["status"]["container"]["pid"].is_i64()
    });
    let pid = before["status"]["container"]["pid"].clone();
    exec(&name, "echo gone-after-boot > /run/marker").unwrap();

    berth.patch_project(
        &name,
        json!({"metadata": {"annotations": {"berth.dev/restartedAt": "2026-01-01T00:00:00Z"}}}),
    );
    let after = berth.wait_for(&name, "Ready after a restart", |p| {
        ready_reason(p).is_some_and(|(s, _)| s == "True")
            && p["status"]["container"]["pid"].is_i64()
            && p["status"]["container"]["pid"] != pid
    });
    assert_eq!(after["status"]["phase"], "Ready");
    // /run is a tmpfs: a real reboot empties it.
    assert!(exec(&name, "test -e /run/marker").is_err());
}

#[test]
fn a_container_berth_did_not_create_is_never_touched() {
    let mut berth = Berth::start(None);
    let name = unique_name();
    lxc(&["init", "berth-tiny", &name]).unwrap();
    struct Remove(String);
    impl Drop for Remove {
        fn drop(&mut self) {
            let _ = lxc(&["delete", "--force", &self.0]);
        }
    }
    let _remove = Remove(name.clone());

    berth.create_project(&name, json!({"image": "berth-tiny"}));
    let project = berth.wait_for(&name, "NameConflict", |p| {
        ready_reason(p).is_some_and(|(_, r)| r == "NameConflict")
    });
    assert_eq!(project["status"]["phase"], "Error");
    assert_eq!(instance_state(&name).as_deref(), Some("STOPPED"));
    assert_eq!(
        instance_uid(&name),
        None,
        "berth labelled a container it does not own"
    );

    // Deleting the project leaves the stranger alone.
    berth.delete_project(&name);
    assert_eq!(instance_count(&name), 1);
    assert!(live_volumes_of(&uid_of(&project)).is_empty());
}

#[test]
fn a_paused_project_is_left_alone() {
    let mut berth = Berth::start(None);
    let name = unique_name();
    berth.create_project(&name, json!({"image": "berth-tiny"}));
    berth.wait_ready(&name);
    berth.patch_project(
        &name,
        json!({"metadata": {"annotations": {"berth.dev/reconcile": "paused"}}}),
    );
    berth.wait_for(&name, "ReconcilePaused", |p| {
        ready_reason(p).is_some_and(|(_, r)| r == "ReconcilePaused")
    });
    lxc_when_idle(&["stop", "--force", &name]).unwrap();
    // Nothing starts it again while paused (events arrive well within this window).
    let until = Instant::now() + Duration::from_secs(3);
    while Instant::now() < until {
        assert_eq!(instance_state(&name).as_deref(), Some("STOPPED"));
        std::thread::sleep(Duration::from_millis(200));
    }
    berth.patch_project(
        &name,
        json!({"metadata": {"annotations": {"berth.dev/reconcile": null}}}),
    );
    berth.wait_ready(&name);
    assert_eq!(instance_state(&name).as_deref(), Some("RUNNING"));
}

#[test]
fn delete_removes_the_container_and_trashes_the_volumes() {
    let mut berth = Berth::start(None);
    let name = unique_name();
    berth.create_project(&name, json!({"image": "berth-tiny"}));
    let project = berth.wait_ready(&name);
    let uid = uid_of(&project);
    exec(&name, "echo bye > /workspace/f").unwrap();
    assert_eq!(volumes_of(&uid).len(), 1);

    berth.delete_project(&name);
    assert_eq!(instance_count(&name), 0);
    // The volumes leave the project's names for the trash.
    assert_eq!(volumes_of(&uid), [format!("berth-trash-{uid}-workspace")]);

    // The same name again gets fresh volumes.
    berth.create_project(&name, json!({"image": "berth-tiny"}));
    let again = berth.wait_ready(&name);
    assert_ne!(uid_of(&again), uid);
    assert!(exec(&name, "test -e /workspace/f").is_err());
}

#[test]
fn a_start_lxd_refuses_is_explained_by_get_describe_events_and_wait() {
    let mut berth = Berth::start(None);
    let name = unique_name();
    berth.create_project(&name, json!({"image": "berth-tiny"}));
    berth.wait_ready(&name);
    berth.patch_project(&name, json!({"spec": {"state": "Stopped"}}));
    berth.wait_for(&name, "Stopped", |p| p["status"]["phase"] == "Stopped");

    // A host directory bound into the container, then removed: LXD refuses every start.
    let source = berth.dir.path().join("bound");
    std::fs::create_dir(&source).unwrap();
    lxc_when_idle(&[
        "config",
        "device",
        "add",
        &name,
        "gone",
        "disk",
        &format!("source={}", source.display()),
        "path=/mnt/gone",
    ])
    .unwrap();
    std::fs::remove_dir(&source).unwrap();
    let cause = "Missing source path";

    berth.patch_project(&name, json!({"spec": {"state": "Running"}}));
    let failed = berth.wait_for(&name, "StepFailed", |p| {
        ready_reason(p).is_some_and(|(_, reason)| reason == "StepFailed")
    });
    let message = failed["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "Ready")
        .unwrap()["message"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        message.starts_with("step Started failed: ") && message.contains(cause),
        "{message}"
    );

    let text = |out: std::process::Output| {
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    };
    let get = text(berth.cli(&["get", "project", &name]));
    assert!(
        get.contains("StepFailed: step Started failed") && get.contains(cause),
        "{get}"
    );
    let describe = text(berth.cli(&["describe", "project", &name]));
    assert!(
        describe.contains("StepFailed") && describe.contains(cause),
        "{describe}"
    );
    // One row, whatever the number of attempts: repeats count on it.
    let events = text(berth.cli(&["events"]));
    let rows: Vec<&str> = events
        .lines()
        .filter(|l| l.contains("StepFailed"))
        .collect();
    assert_eq!(rows.len(), 1, "{events}");
    assert!(
        rows[0].contains("Warning") && rows[0].contains(cause),
        "{events}"
    );
    let waited = berth.cli(&[
        "wait",
        &format!("project/{name}"),
        "--for=condition=Ready",
        "--timeout=2s",
    ]);
    assert_eq!(waited.status.code(), Some(1));
    let waited = text(waited);
    assert!(
        waited.contains("timed out") && waited.contains("StepFailed") && waited.contains(cause),
        "{waited}"
    );

    // Once the device is gone the next retry starts it, and the message clears.
    lxc_when_idle(&["config", "device", "remove", &name, "gone"]).unwrap();
    let ready = berth.wait_ready(&name);
    let (_, reason) = ready_reason(&ready).unwrap();
    assert_ne!(reason, "StepFailed");
    let get = text(berth.cli(&["get", "project", &name]));
    assert!(!get.contains(cause), "{get}");
}

/// A profile added to a running project gets a home volume over its home path; what the
/// container already held there (a provider's login, its sessions) is copied into the volume
/// first, so nothing is hidden, and it is said in an event.
#[test]
fn a_profile_added_later_keeps_what_its_home_already_held() {
    let mut berth = Berth::start_with(&[], &[]);
    let name = unique_name();
    let profile = format!("carry-{}", &name[name.len() - 8..]);
    let reply = berth.client().post_json(
        "/apis/berth.dev/v1alpha1/agentprofiles",
        &json!({"apiVersion": "berth.dev/v1alpha1", "kind": "AgentProfile",
            "metadata": {"name": profile},
            "spec": {"home": "/root/.claude", "install": {"check": "true"},
                     "runner": {"command": ["sleep", "100000"]}}}),
    );
    assert_eq!(reply.status, 201, "{}", reply.text());
    berth.create_project(&name, json!({"image": "berth-tiny"}));
    let project = berth.wait_ready(&name);
    let uid = uid_of(&project);
    let before = "mkdir -p /root/.claude/projects && printf 'token-abc\\n' > /root/.claude/.credentials.json \
                  && printf '{\"turn\":1}\\n' > /root/.claude/projects/s.jsonl \
                  && chmod 600 /root/.claude/.credentials.json";
    exec(&name, before).unwrap();

    let reply = berth.patch_project(&name, json!({"spec": {"agents": [profile]}}));
    assert!(reply.status < 300, "{}", reply.text());
    let volume = format!("berth-{uid}-home-{profile}");
    berth.wait_until(Duration::from_secs(240), "the home volume mounted", || {
        exec(&name, "grep -q ' /root/.claude ' /proc/mounts").is_ok()
    });
    // The files are there, now on the volume, with their mode.
    assert_eq!(
        exec(
            &name,
            "cat /root/.claude/.credentials.json /root/.claude/projects/s.jsonl"
        )
        .unwrap(),
        "token-abc\n{\"turn\":1}\n"
    );
    assert_eq!(
        exec(&name, "stat -c %a /root/.claude/.credentials.json")
            .unwrap()
            .trim(),
        "600"
    );
    assert!(
        live_volumes_of(&uid).contains(&volume),
        "{:?}",
        live_volumes_of(&uid)
    );
    assert_eq!(
        lxc(&[
            "storage",
            "volume",
            "get",
            "default",
            &volume,
            "user.berth.carry"
        ])
        .unwrap_or_default()
        .trim(),
        "",
        "the volume still waits for its copy"
    );
    let devices = lxc(&["config", "device", "list", &name]).unwrap();
    assert!(
        !devices.lines().any(|d| d.starts_with("carry-")),
        "the copy's mount was left behind: {devices}"
    );
    let events = berth
        .client()
        .get(&format!("{}/{name}/events", crate::harness::PROJECTS))
        .json();
    let carried = events["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["reason"] == "HomeCarried")
        .unwrap_or_else(|| panic!("no HomeCarried event: {events}"));
    assert!(
        carried["message"]
            .as_str()
            .unwrap()
            .contains("/root/.claude"),
        "{carried}"
    );
    berth.delete_project(&name);
    let reply = berth
        .client()
        .delete(&format!("/apis/berth.dev/v1alpha1/agentprofiles/{profile}"));
    assert!(reply.status < 300, "{}", reply.text());
}

/// `spec.resources.processes` is LXD's `limits.processes`: a fork bomb stops at it, and a
/// changed limit applies to the running container, which keeps running.
#[test]
fn a_process_limit_stops_a_fork_bomb_and_changes_live() {
    let mut berth = Berth::start_with(&[], &[]);
    let name = unique_name();
    berth.create_project(
        &name,
        json!({"image": "berth-tiny", "resources": {"processes": 40}}),
    );
    berth.wait_ready(&name);
    let limit = || {
        lxc(&["config", "get", &name, "limits.processes"])
            .unwrap_or_default()
            .trim()
            .to_string()
    };
    // As LXD counts them (the container's pids cgroup): at its limit nothing inside can fork
    // a `ps`, so the count comes from outside.
    let processes = || -> i64 {
        lxc(&["query", &format!("/1.0/instances/{name}/state")])
            .ok()
            .and_then(|state| serde_json::from_str::<serde_json::Value>(&state).ok())
            .and_then(|state| state["processes"].as_i64())
            .unwrap_or(-1)
    };
    let settle = |below: i64| {
        crate::support::eventually(
            Duration::from_secs(120),
            &format!("fewer than {below} processes"),
            || format!("; {} still run", processes()),
            || (processes() < below).then_some(()),
        );
    };
    assert_eq!(limit(), "40");
    // Eighty sleepers asked for, each for 20 s; the limit lets fewer than forty run.
    let bomb = "sh -c 'i=0; while [ $i -lt 80 ]; do sleep 20 </dev/null >/dev/null 2>&1 & \
                i=$((i+1)); done' >/dev/null 2>&1; exit 0";
    exec(&name, bomb).unwrap();
    let ran = processes();
    assert!(
        (20..=40).contains(&ran),
        "{ran} processes under a limit of 40"
    );
    settle(15);

    let before = lxc(&["config", "get", &name, "volatile.uuid"]).unwrap();
    let reply = berth.patch_project(&name, json!({"spec": {"resources": {"processes": 400}}}));
    assert!(reply.status < 300, "{}", reply.text());
    crate::support::eventually(
        Duration::from_secs(120),
        "limits.processes 400",
        || format!("; it is still {}", limit()),
        || (limit() == "400").then_some(()),
    );
    assert_eq!(instance_state(&name).as_deref(), Some("RUNNING"));
    assert_eq!(
        lxc(&["config", "get", &name, "volatile.uuid"]).unwrap(),
        before,
        "the limit changed by replacing the container"
    );
    exec(&name, bomb).unwrap();
    let ran = processes();
    assert!(
        ran >= 80,
        "{ran} processes under a limit of 400: every sleeper runs"
    );
    settle(15);
    berth.delete_project(&name);
}

/// A `disk` or `workspaceSize` set on an existing project reaches its container and volume,
/// made without either; on this `dir` pool, which enforces no size, the project says so in
/// `ResizeUnsupported`, naming the fields.
#[test]
fn a_changed_size_is_applied_or_said_to_be_unsupported() {
    let mut berth = Berth::start_with(&[], &[]);
    let name = unique_name();
    berth.create_project(&name, json!({"image": "berth-tiny"}));
    let project = berth.wait_ready(&name);
    let uid = uid_of(&project);
    let volume = format!("berth-{uid}-workspace");
    let size = || {
        lxc(&["storage", "volume", "get", "default", &volume, "size"])
            .unwrap_or_default()
            .trim()
            .to_string()
    };
    assert_eq!(size(), "", "the volume was made without a size");
    let before = lxc(&["config", "get", &name, "volatile.uuid"]).unwrap();

    let reply = berth.patch_project(
        &name,
        json!({"spec": {"resources": {"workspaceSize": "2GiB", "disk": "3GiB"}}}),
    );
    assert!(reply.status < 300, "{}", reply.text());
    let project = berth.wait_for(&name, "ResizeUnsupported", |p| {
        p["status"]["conditions"].as_array().is_some_and(|c| {
            c.iter().any(|c| {
                c["type"] == "ResizeUnsupported"
                    && c["status"] == "True"
                    && c["message"].as_str().is_some_and(|m| {
                        m.contains("spec.resources.workspaceSize")
                            && m.contains("spec.resources.disk")
                    })
            })
        })
    });
    assert_eq!(size(), "2147483648", "{}", project["status"]);
    // The container records the size applied, so later passes leave the volume unasked.
    assert_eq!(
        lxc(&["config", "get", &name, "user.berth.workspaceSize"])
            .unwrap()
            .trim(),
        "2147483648"
    );
    assert_eq!(
        lxc(&["config", "device", "get", &name, "root", "size"])
            .unwrap()
            .trim(),
        "3221225472"
    );
    // Applied to the container as it runs: the same container.
    assert_eq!(
        lxc(&["config", "get", &name, "volatile.uuid"]).unwrap(),
        before
    );
    assert_eq!(instance_state(&name).as_deref(), Some("RUNNING"));
    berth.delete_project(&name);
}

/// The btrfs pool `scripts/setup-test-deps` makes once (a loop file): a pool that enforces
/// sizes, beside the shared `dir` pool. The test's volumes on it (named by its project's uid,
/// in the trash too) are deleted when it ends; the pool stays, so no test changes LXD's pools
/// while others run.
const QUOTA_POOL: &str = "berth-test-quota";

struct QuotaVolumes {
    uid: String,
}

impl Drop for QuotaVolumes {
    fn drop(&mut self) {
        let listed =
            lxc(&["storage", "volume", "list", QUOTA_POOL, "--format", "csv"]).unwrap_or_default();
        for line in listed.lines() {
            let mut fields = line.split(',');
            if let (Some("custom"), Some(volume)) = (fields.next(), fields.next())
                && !self.uid.is_empty()
                && volume.contains(&self.uid)
            {
                let _ = lxc(&["storage", "volume", "delete", QUOTA_POOL, volume]);
            }
        }
    }
}

/// On a pool that enforces sizes a changed `workspaceSize` applies to the running project
/// (what did not fit now fits), and one LXD refuses (below what the volume holds) is said in
/// `ResizePending` with LXD's words, the volume left as it was.
#[test]
fn a_size_changes_live_on_a_pool_that_enforces_it() {
    if let Err(e) = lxc(&["storage", "show", QUOTA_POOL]) {
        panic!(
            "the LXD storage pool {QUOTA_POOL} is missing (scripts/setup-test-deps makes it: \
             btrfs on a loop file): {e}"
        );
    }
    let config = tempfile::NamedTempFile::new().expect("config file");
    std::fs::write(
        config.path(),
        format!("lxd: {{storagePool: {QUOTA_POOL}}}\n"),
    )
    .unwrap();
    let mut berth = Berth::start_with(&[], &["--config", config.path().to_str().unwrap()]);
    let name = unique_name();
    berth.create_project(
        &name,
        json!({"image": "berth-tiny", "resources": {"workspaceSize": "64MiB"}}),
    );
    let project = berth.wait_ready(&name);
    let _volumes = QuotaVolumes {
        uid: uid_of(&project),
    };
    let volume = format!("berth-{}-workspace", uid_of(&project));
    let size = || {
        lxc(&["storage", "volume", "get", QUOTA_POOL, &volume, "size"])
            .unwrap_or_default()
            .trim()
            .to_string()
    };
    let write = |mib: u32, file: &str| {
        exec(
            &name,
            &format!("dd if=/dev/zero of=/workspace/{file} bs=1M count={mib} 2>/dev/null && sync"),
        )
    };
    assert!(
        write(100, "big").is_err(),
        "100MiB fit in a 64MiB workspace"
    );
    exec(&name, "rm -f /workspace/big").unwrap();

    let reply = berth.patch_project(
        &name,
        json!({"spec": {"resources": {"workspaceSize": "256MiB"}}}),
    );
    assert!(reply.status < 300, "{}", reply.text());
    crate::support::eventually(
        Duration::from_secs(120),
        "the volume at 256MiB",
        || format!("; it is still {}", size()),
        || (size() == "268435456").then_some(()),
    );
    write(100, "big").expect("100MiB fit once the workspace is 256MiB");
    let events = berth
        .client()
        .get(&format!("{}/{name}/events", crate::harness::PROJECTS))
        .json();
    assert!(
        events["items"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["reason"] == "Resized"
                && e["message"]
                    .as_str()
                    .unwrap_or_default()
                    .contains("workspaceSize")),
        "{events}"
    );

    let reply = berth.patch_project(
        &name,
        json!({"spec": {"resources": {"workspaceSize": "32MiB"}}}),
    );
    assert!(reply.status < 300, "{}", reply.text());
    berth.wait_for(&name, "ResizePending", |p| {
        p["status"]["conditions"].as_array().is_some_and(|c| {
            c.iter().any(|c| {
                c["type"] == "ResizePending"
                    && c["status"] == "True"
                    && c["message"]
                        .as_str()
                        .is_some_and(|m| m.contains("spec.resources.workspaceSize"))
            })
        })
    });
    assert_eq!(size(), "268435456", "a refused shrink changed the volume");
    assert_eq!(
        exec(&name, "wc -c < /workspace/big").unwrap().trim(),
        "104857600"
    );
    berth.delete_project(&name);
    drop(berth);
}
