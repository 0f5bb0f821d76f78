//! The warm pool through the real binary on the real LXD: `pool: {size: 2}` fills with booted,
//! stopped members holding nothing; a new project claims one and is Ready in it with its
//! workspace volume mounted and its labels; the pool refills; a daemon started again with
//! `pool.size: 0` deletes every member.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::harness::{Berth, exec, instance_uid, lxc, read_file, uid_of, unique_name};

/// Members of berth-tiny boot in well under a second each; the machine is shared.
const FILL_DEADLINE: Duration = Duration::from_secs(180);

/// Deletes whatever pool members the test's daemon left (a failed test must not leave
/// containers behind). Declared before the daemon, so it runs after the daemon is killed.
struct Members {
    controller: String,
}

impl Members {
    /// The names of the instances labelled as this controller's pool members.
    fn names(&self) -> Vec<String> {
        let filter = format!("user.berth.pool={}", self.controller);
        lxc(&["list", &filter, "--format", "csv", "-c", "n"])
            .expect("lxc list")
            .lines()
            .map(str::to_string)
            .filter(|n| !n.is_empty())
            .collect()
    }
}

impl Drop for Members {
    fn drop(&mut self) {
        if self.controller.is_empty() {
            return;
        }
        for name in self.names() {
            let _ = lxc(&["delete", "--force", &name]);
        }
    }
}

fn controller_id(berth: &Berth) -> String {
    rusqlite::Connection::open(berth.data_dir.join("berth.db"))
        .unwrap()
        .query_row(
            "SELECT value FROM settings WHERE name = 'controllerId'",
            [],
            |row| row.get(0),
        )
        .unwrap()
}

fn pool(berth: &Berth) -> Value {
    let out = berth.cli_ok(&["get", "pool", "-o", "json"]);
    let list: Value = serde_json::from_str(&out).expect("get pool -o json");
    assert_eq!(list["kind"], "PoolList", "{list}");
    list["items"][0].clone()
}

/// Waits until the pool shows `ready` members, and LXD shows them booted and stopped.
fn wait_ready_members(berth: &Berth, members: &Members, ready: u64) -> Vec<String> {
    let deadline = Instant::now() + FILL_DEADLINE;
    loop {
        let entry = pool(berth);
        if entry["ready"] == ready {
            let names = members.names();
            let stopped = names.iter().all(|n| {
                lxc(&["list", n, "--format", "csv", "-c", "s"]).is_ok_and(|s| s.trim() == "STOPPED")
            });
            if names.len() as u64 == ready && stopped {
                return names;
            }
        }
        assert!(
            Instant::now() < deadline,
            "the pool never had {ready} ready members: {entry}; lxc: {:?}\n{}",
            members.names(),
            berth.log_text()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// A daemon with a pool of `size` berth-tiny members, connected to LXD; its config file lives
/// as long as the daemon may restart.
fn start_with_pool(size: usize) -> (Berth, Members, tempfile::NamedTempFile) {
    let config = tempfile::NamedTempFile::new().expect("config file");
    std::fs::write(
        config.path(),
        format!(
            "pool: {{size: {size}}}\ndefaults: {{image: berth-tiny}}\nscheduler: {{interval: 2s}}\n"
        ),
    )
    .expect("write config");
    let berth = Berth::start_with(&[], &["--config", config.path().to_str().unwrap()]);
    berth.wait_connected();
    let members = Members {
        controller: controller_id(&berth),
    };
    (berth, members, config)
}

#[test]
fn a_new_project_claims_a_ready_member_and_the_pool_refills() {
    let (mut berth, members, config) = start_with_pool(2);

    let before = wait_ready_members(&berth, &members, 2);
    for name in &before {
        assert!(
            name.starts_with("berth-pool-"),
            "{name} is named as the pool's"
        );
        assert_eq!(
            lxc(&["config", "get", name, "user.berth.pool.ready"])
                .unwrap()
                .trim(),
            "true"
        );
        assert_eq!(instance_uid(name), None, "{name} holds no project");
        let devices = lxc(&["config", "device", "list", name]).unwrap();
        assert!(devices.trim().is_empty(), "{name} has devices: {devices}");
    }
    let entry = pool(&berth);
    assert_eq!(entry["image"], "berth-tiny");
    assert_eq!(entry["wanted"], 2);
    assert_eq!(entry["claims"], 0);

    let name = unique_name();
    berth.create_project(&name, json!({"image": "berth-tiny"}));
    let project = berth.wait_ready(&name);
    let uid = uid_of(&project);

    // The project's container is one of the members, renamed and given the project's labels
    // and volume; the pool's labels are gone from it.
    let claimed: Vec<&String> = before
        .iter()
        .filter(|m| lxc(&["info", m]).is_err())
        .collect();
    assert_eq!(claimed.len(), 1, "one member was claimed: {before:?}");
    assert_eq!(instance_uid(&name).as_deref(), Some(uid.as_str()));
    assert_eq!(
        lxc(&["config", "get", &name, "user.berth.controller"])
            .unwrap()
            .trim(),
        members.controller
    );
    assert_eq!(
        lxc(&["config", "get", &name, "user.berth.pool"])
            .unwrap()
            .trim(),
        ""
    );
    exec(&name, "grep -q ' /workspace ' /proc/mounts").expect("/workspace is mounted");
    exec(
        &name,
        "echo kept > /workspace/claimed && cat /workspace/claimed",
    )
    .expect("/workspace is writable");
    assert_eq!(project["status"]["container"]["name"], name.as_str());
    assert_eq!(
        berth.metric("berth_pool_claims_total{image=\"berth-tiny\"}"),
        1.0
    );

    // The refill makes another member, none of them the project's.
    let after = wait_ready_members(&berth, &members, 2);
    assert!(!after.contains(&name));
    assert_eq!(berth.metric("berth_pool_ready{image=\"berth-tiny\"}"), 2.0);
    // The real `default` pool has room: the refill read its space and is not held.
    assert_eq!(
        berth.metric("berth_pool_held{image=\"berth-tiny\",reason=\"disk\"}"),
        0.0
    );
    let table = berth.cli_ok(&["get", "pool"]);
    let rows: Vec<Vec<&str>> = table
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(
        rows,
        [
            vec!["IMAGE", "READY", "WANTED", "CLAIMS", "HELD"],
            vec!["berth-tiny", "2", "2", "1", "-"]
        ],
        "{table}"
    );

    // Started again without a pool: every member goes, the project stays.
    berth.terminate();
    std::fs::write(
        config.path(),
        "pool: {size: 0}\ndefaults: {image: berth-tiny}\nscheduler: {interval: 2s}\n",
    )
    .expect("write config");
    berth.restart();
    berth.wait_connected();
    berth.wait_until(FILL_DEADLINE, "no pool members left", || {
        members.names().is_empty()
    });
    assert_eq!(pool(&berth)["wanted"], 0);
    assert_eq!(instance_uid(&name).as_deref(), Some(uid.as_str()));
    assert_eq!(
        read_file(&name, "/workspace/claimed").unwrap().trim(),
        "kept"
    );
}

/// A daemon killed right after it renamed a member to the project's name, before it gave it the
/// project's labels and volumes, finishes that claim when it starts again: one container, the
/// project's, and no member taken for an orphan or claimed twice.
#[test]
fn a_daemon_killed_mid_claim_finishes_the_same_claim() {
    let (mut berth, members, _config) = start_with_pool(1);
    let before = wait_ready_members(&berth, &members, 1);

    berth.terminate();
    berth.restart_with(Some("after-call:rename_pool_member"));
    // A daemon offers its members once its first refill pass has listed them; a create
    // before that takes the plain path.
    assert_eq!(wait_ready_members(&berth, &members, 1), before);
    let name = unique_name();
    berth.create_project(&name, json!({"image": "berth-tiny"}));
    let status = berth.wait_exit(Duration::from_secs(120));
    assert_eq!(
        status.code(),
        Some(crate::harness::FAULT_EXIT_CODE),
        "{}",
        berth.log_text()
    );
    // Killed between the rename and the update: the project's name, the pool's label.
    assert!(
        lxc(&["info", &before[0]]).is_err(),
        "the member was renamed"
    );
    assert_eq!(instance_uid(&name), None);
    assert_eq!(
        lxc(&["config", "get", &name, "user.berth.pool"])
            .unwrap()
            .trim(),
        members.controller
    );

    berth.restart();
    let project = berth.wait_ready(&name);
    let uid = uid_of(&project);
    assert_eq!(instance_uid(&name).as_deref(), Some(uid.as_str()));
    exec(&name, "grep -q ' /workspace ' /proc/mounts").expect("/workspace is mounted");
    // The refill made a new member under another name and left the claimed one alone.
    let after = wait_ready_members(&berth, &members, 1);
    assert!(
        !after.contains(&name) && !after.contains(&before[0]),
        "{after:?}"
    );
    let labelled = lxc(&[
        "list",
        &format!("user.berth.uid={uid}"),
        "--format",
        "csv",
        "-c",
        "n",
    ])
    .unwrap();
    assert_eq!(labelled.trim(), name, "one container is the project's");
}
