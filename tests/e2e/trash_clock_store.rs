//! The trash keeps its promise when the daemon's world changes under it, with the real `berth`
//! binary and real LXD: a store that was lost (a new data dir, so a new controller id) still
//! lets an admin list the old trash (`trash list --all`) and restore from it byte for byte; a
//! wall clock set forward past the retention pauses the purge (a Warning event, the gauge,
//! `trash list` says so) instead of emptying the trash, until the clock agrees again or an
//! admin runs `berth trash purge`.

use std::time::{Duration, Instant};

use crate::harness::{Berth, exec, uid_of, unique_name};
use crate::support::said;
use serde_json::{Value, json};

/// `berth trash list [--all] -o json`, parsed whole.
fn trash(berth: &Berth, all: bool) -> Value {
    let mut args = vec!["trash", "list", "-o", "json"];
    if all {
        args.push("--all");
    }
    serde_json::from_str(&berth.cli_ok(&args)).expect("trash list -o json is JSON")
}

fn holds(list: &Value, uid: &str) -> bool {
    list["items"]
        .as_array()
        .is_some_and(|items| items.iter().any(|i| i["uid"] == uid))
}

/// Waits, up to two minutes, until `check` holds.
fn until(berth: &Berth, what: &str, check: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(120);
    while !check() {
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}:\n{}",
            berth.log_text()
        );
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// A repository with a commit, an uncommitted change and an untracked file, in /workspace.
fn work(name: &str) {
    exec(
        name,
        "cd /workspace && git init -q -b main && echo one > a.txt \
         && git add a.txt && git -c user.name=t -c user.email=t@t commit -q -m one \
         && echo two >> a.txt && echo private > notes.md",
    )
    .expect("write work");
}

/// Every path under /workspace (`.git` included) and the sha256 of every file, sorted.
fn fingerprint(name: &str) -> String {
    let listing = exec(
        name,
        "cd /workspace && find . -exec stat -c '%n %F %a %s' {} + | LC_ALL=C sort \
         && find . -type f -exec sha256sum {} + | LC_ALL=C sort",
    )
    .expect("fingerprint the workspace");
    assert!(listing.contains("./.git/HEAD"), "{listing}");
    listing
}

fn deleted(berth: &Berth, name: &str) {
    berth.cli_ok(&["delete", "project", name, "--force"]);
    until(berth, "the project gone", || {
        berth.get_project(name).is_none()
    });
}

#[test]
fn a_lost_store_keeps_its_trash_for_an_admin_to_list_and_restore() {
    let mut berth = Berth::start(None);
    let name = unique_name();
    let created = berth.create_project(&name, json!({"image": "berth-base"}));
    let uid = uid_of(&created);
    berth.wait_ready(&name);
    work(&name);
    let before = fingerprint(&name);
    deleted(&berth, &name);
    let old_store = trash(&berth, false);
    assert!(holds(&old_store, &uid), "{old_store}");

    // The store is lost: the daemon starts again on an empty data dir, a new controller id.
    berth.kill();
    std::fs::remove_dir_all(&berth.data_dir).expect("remove the data dir");
    berth.restart();
    berth.wait_connected();

    let own = trash(&berth, false);
    assert!(
        !holds(&own, &uid),
        "another store's entry is not this one's: {own}"
    );
    let all = trash(&berth, true);
    assert!(
        holds(&all, &uid),
        "--all lists every controller's entries: {all}"
    );
    let item = all["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["uid"] == uid.as_str())
        .unwrap();
    assert_eq!(item["kind"], "project", "{item}");
    assert!(
        item["controller"].as_str().is_some_and(|c| !c.is_empty()),
        "{item}"
    );
    let table = berth.cli_ok(&["trash", "list", "--all"]);
    assert!(
        table.contains("CONTROLLER") && table.contains(&uid),
        "{table}"
    );

    // A name alone does not reach another store's entry; its uid does.
    let by_name = berth.cli(&["restore", &name]);
    assert!(!by_name.status.success(), "{}", said(&by_name));
    assert!(
        String::from_utf8_lossy(&by_name.stderr).contains("--all"),
        "the refusal points at trash list --all: {}",
        said(&by_name)
    );
    berth.cli_ok(&["restore", &uid]);
    let restored = berth.get_project(&name).expect("restored");
    berth.track(&restored);
    berth.wait_ready(&name);
    assert_eq!(fingerprint(&name), before, "every byte came back");
    assert!(
        !holds(&trash(&berth, true), &uid),
        "the entry left the trash with the restore"
    );
}

#[test]
fn a_clock_jump_pauses_the_purge_until_the_clock_agrees_or_an_admin_purges() {
    let config = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(
        config.path(),
        "trash: {retention: 1h}\nscheduler: {interval: 1s, recheckInterval: 5s}\n",
    )
    .unwrap();
    let shift = tempfile::NamedTempFile::new().unwrap();
    let set_clock = |seconds: i64| std::fs::write(shift.path(), seconds.to_string()).unwrap();
    set_clock(0);
    let mut berth = Berth::start_with(
        &[(
            "BERTH_TESTING_CLOCK_SHIFT_FILE",
            shift.path().to_str().unwrap(),
        )],
        &["--config", config.path().to_str().unwrap()],
    );
    let name = unique_name();
    let created = berth.create_project(&name, json!({"image": "berth-base"}));
    let uid = uid_of(&created);
    berth.wait_ready(&name);
    work(&name);
    deleted(&berth, &name);
    assert!(holds(&trash(&berth, false), &uid));

    // Three days forward: past the retention, by a clock that did not really advance.
    set_clock(3 * 86_400);
    until(&berth, "the purge paused", || {
        trash(&berth, false)["purgePaused"].is_string()
    });
    let paused = trash(&berth, false);
    assert!(holds(&paused, &uid), "nothing purged on a jump: {paused}");
    let metrics = berth.client().get("/metrics").text();
    assert!(
        metrics.lines().any(|l| l == "berth_trash_purge_paused 1"),
        "{metrics}"
    );
    let listed = berth.cli(&["trash", "list"]);
    assert!(
        String::from_utf8_lossy(&listed.stderr).contains("Purging is paused"),
        "{}",
        said(&listed)
    );
    let events = berth
        .client()
        .get("/apis/berth.dev/v1alpha1/events?limit=500")
        .json();
    assert!(
        events["items"].as_array().is_some_and(|items| items
            .iter()
            .any(|e| e["reason"] == "TrashPurgePaused" && e["type"] == "Warning")),
        "a Warning event says why: {events}"
    );

    // The clock is set right again: the purge goes on by it, and the entry is not yet due.
    set_clock(0);
    until(&berth, "the purge resumed", || {
        trash(&berth, false)["purgePaused"].is_null()
    });
    assert!(holds(&trash(&berth, false), &uid));

    // Forward again, and an admin decides the clock is right: what expired by it is purged.
    set_clock(3 * 86_400);
    until(&berth, "the purge paused again", || {
        trash(&berth, false)["purgePaused"].is_string()
    });
    let purged = berth.cli_ok(&["trash", "purge"]);
    assert!(purged.contains(&uid), "{purged}");
    let after = trash(&berth, false);
    assert!(!holds(&after, &uid), "{after}");
    assert!(after["purgePaused"].is_null(), "{after}");
}
