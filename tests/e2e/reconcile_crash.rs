//! Crash tests: the daemon exits at a fault point (right after committing a step, or right after
//! LXD accepted the create call and before berth recorded it) or is killed with SIGKILL, then
//! starts again on the same data directory. It must converge to Ready with exactly one
//! container and one workspace volume: no side effect repeated.

use std::time::Duration;

use crate::harness::{
    Berth, FAULT_EXIT_CODE, exec, instance_count, instance_uid, uid_of, unique_name, volumes_of,
};
use serde_json::json;

/// Starts a daemon armed with `fault`, creates a project, waits for the daemon to exit at the
/// fault point, restarts it without the fault and checks convergence.
fn crash_at(fault: &str) {
    let mut berth = Berth::start(Some(fault));
    let name = unique_name();
    let created = berth.create_project(&name, json!({"image": "berth-tiny"}));
    let uid = uid_of(&created);
    let status = berth.wait_exit(Duration::from_secs(120));
    assert_eq!(
        status.code(),
        Some(FAULT_EXIT_CODE),
        "{fault}: the daemon did not stop at its fault point:\n{}",
        berth.log_text()
    );
    assert!(
        berth.log_text().contains("fault point"),
        "{}",
        berth.log_text()
    );

    berth.restart();
    let project = berth.wait_ready(&name);
    assert_eq!(project["status"]["phase"], "Ready", "{fault}");
    assert_eq!(instance_count(&name), 1, "{fault}: one container");
    assert_eq!(instance_uid(&name).as_deref(), Some(uid.as_str()));
    assert_eq!(
        volumes_of(&uid),
        [format!("berth-{uid}-workspace")],
        "{fault}: one workspace volume"
    );
    assert!(exec(&name, "true").is_ok());
    assert!(
        project["status"]
            .get("controller")
            .is_none_or(|c| c.get("operation").is_none())
    );
}

#[test]
fn crash_right_after_lxd_accepted_the_create() {
    crash_at("after-call:create_instance");
}

#[test]
fn crash_right_after_created_was_committed() {
    crash_at("after-step:Created");
}

#[test]
fn crash_right_after_started_was_committed() {
    crash_at("after-step:Started");
}

#[test]
fn crash_right_after_reachable_was_committed() {
    crash_at("after-step:Reachable");
}

#[test]
fn sigkill_mid_provisioning_then_restart_converges() {
    let mut berth = Berth::start(None);
    let names: Vec<String> = (0..3).map(|_| unique_name()).collect();
    for name in &names {
        berth.create_project(name, json!({"image": "berth-tiny"}));
    }
    // Kill as soon as the first container exists: the others are somewhere mid-way.
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    while names.iter().all(|n| instance_count(n) == 0) {
        assert!(
            std::time::Instant::now() < deadline,
            "no container appeared"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    berth.kill();
    berth.restart();
    for name in &names {
        let project = berth.wait_ready(name);
        assert_eq!(instance_count(name), 1, "{name}");
        assert_eq!(volumes_of(&uid_of(&project)).len(), 1, "{name}");
    }
}
