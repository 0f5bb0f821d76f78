//! Replacing a container keeps what it held, end to end with the real `berth` binary and real
//! LXD: a linked worktree outside /workspace (`/root/wt`, a changed and a new file) holds a
//! replacement (a `spec.image` change, then `berth restart --recreate`) as `ReplaceBlocked` with
//! the files named; `berth restart --recreate --force` replaces the container and puts the old
//! one in the trash, stopped, without the workspace volume, where `berth trash cp` copies the
//! worktree's files out byte for byte; `berth restore` of it refuses; and housekeeping purges it
//! after `trash.retention`.

use std::process::Command;
use std::time::Duration;

use crate::harness::{Berth, exec, lxc, read_file, uid_of, unique_name};
use crate::support::eventually;
use crate::support::said;
use serde_json::{Value, json};

/// Short enough to see the purge within the test, long enough to copy the files out first.
const RETENTION_SECS: u64 = 60;

fn condition<'a>(project: &'a Value, type_: &str) -> Option<&'a Value> {
    project["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)
}

fn trash_items(berth: &Berth) -> Vec<Value> {
    let list: Value = serde_json::from_str(&berth.cli_ok(&["trash", "list", "-o", "json"]))
        .expect("trash list -o json is JSON");
    list["items"].as_array().cloned().unwrap_or_default()
}

/// Instances whose name starts with `prefix`.
fn instances_named(prefix: &str) -> Vec<String> {
    lxc(&["list", "--format", "csv", "-c", "n"])
        .expect("lxc list")
        .lines()
        .map(str::trim)
        .filter(|n| n.starts_with(prefix))
        .map(str::to_string)
        .collect()
}

/// Deletes the project's trashed containers the test made, whatever happened.
struct TrashedContainers(String);

impl Drop for TrashedContainers {
    fn drop(&mut self) {
        for name in instances_named(&self.0) {
            let _ = lxc(&["delete", "--force", &name]);
        }
    }
}

fn sha256(path: &std::path::Path) -> String {
    let out = Command::new("sha256sum")
        .arg(path)
        .output()
        .expect("sha256sum");
    assert!(out.status.success(), "{out:?}");
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .unwrap()
        .to_string()
}

#[test]
fn a_replaced_container_is_held_for_a_worktree_and_kept_in_the_trash() {
    let config = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(
        config.path(),
        format!(
            "trash: {{retention: {RETENTION_SECS}s}}\n\
             scheduler: {{interval: 5s, recheckInterval: 20s}}\n"
        ),
    )
    .unwrap();
    let mut berth = Berth::start_with(&[], &["--config", config.path().to_str().unwrap()]);
    let name = unique_name();
    let created = berth.create_project(&name, json!({"image": "berth-base"}));
    let uid = uid_of(&created);
    let _cleanup = TrashedContainers(format!("berth-trash-{uid}-ct-"));
    let ready = berth.wait_ready(&name);
    let first_container = ready["status"]["container"]["createdAt"].clone();

    // A worktree outside /workspace, with a changed file and a new one.
    exec(
        &name,
        "set -e; cd /workspace && git init -q -b main \
         && printf 'tracked\\n' > tracked.txt && git add tracked.txt \
         && git -c user.name=t -c user.email=t@t commit -q -m init \
         && git worktree add -q /root/wt -b side \
         && printf 'changed in the worktree\\n' >> /root/wt/tracked.txt \
         && head -c 70000 /dev/urandom > /root/wt/new.bin",
    )
    .expect("make the worktree");
    let hashes = exec(
        &name,
        "cd /root/wt && sha256sum tracked.txt new.bin | awk '{print $1}'",
    )
    .expect("hash the worktree's files");
    let hashes: Vec<&str> = hashes.lines().collect();
    assert_eq!(hashes.len(), 2, "{hashes:?}");

    // A new image (the same image by fingerprint: a different spec.image) is held.
    let fingerprint = lxc(&["image", "list", "berth-base", "--format", "csv", "-c", "F"])
        .expect("the base image's fingerprint")
        .trim()
        .to_string();
    assert_eq!(fingerprint.len(), 64, "{fingerprint}");
    let reply = berth.patch_project(&name, json!({"spec": {"image": fingerprint}}));
    assert_eq!(reply.status, 200, "{}", reply.text());
    let held = berth.wait_for(&name, "ReplaceBlocked for the image", |p| {
        condition(p, "ReplaceBlocked").is_some_and(|c| {
            c["status"] == "True" && c["message"].as_str().unwrap_or("").contains("spec.image")
        })
    });
    let message = condition(&held, "ReplaceBlocked").unwrap()["message"]
        .as_str()
        .unwrap()
        .to_string();
    for named in ["/root/wt", "tracked.txt", "new.bin"] {
        assert!(message.contains(named), "{named} in {message}");
    }
    let ready = condition(&held, "Ready").unwrap();
    assert_eq!(ready["status"], "False");
    assert_eq!(ready["reason"], "ReplaceBlocked");
    let events = berth.cli_ok(&["events", "project", &name]);
    assert!(events.contains("ReplaceBlocked"), "{events}");

    // A recreate nobody forced is held too; the container is the one it was.
    berth.cli_ok(&["restart", "--recreate", &name]);
    let held = berth.wait_for(&name, "ReplaceBlocked for the recreate", |p| {
        condition(p, "ReplaceBlocked").is_some_and(|c| {
            c["status"] == "True"
                && c["message"]
                    .as_str()
                    .unwrap_or("")
                    .contains("a recreate was requested")
        })
    });
    assert_eq!(held["status"]["container"]["createdAt"], first_container);
    assert!(instances_named(&format!("berth-trash-{uid}")).is_empty());
    assert_eq!(
        read_file(&name, "/root/wt/tracked.txt").unwrap(),
        "tracked\nchanged in the worktree\n"
    );

    // A patch cannot force it: `berth.dev/forceReplace` is the server's to write.
    let asked = held["metadata"]["annotations"]["berth.dev/recreateRequestedAt"].clone();
    assert!(asked.is_string(), "{held}");
    let reply = berth.client().request(
        "PATCH",
        &format!("{}/{name}", crate::harness::PROJECTS),
        Some("application/merge-patch+json"),
        json!({"metadata": {"annotations": {"berth.dev/forceReplace": asked}}})
            .to_string()
            .as_bytes(),
    );
    assert_eq!(reply.status, 400, "{}", reply.text());
    assert!(
        reply.text().contains("berth.dev/forceReplace")
            && reply.text().contains("berth restart --recreate --force"),
        "the refusal names the annotation: {}",
        reply.text()
    );
    assert!(instances_named(&format!("berth-trash-{uid}")).is_empty());

    // Forced: replaced, and the old container is in the trash.
    berth.cli_ok(&["restart", "--recreate", "--force", &name]);
    let replaced = berth.wait_for(&name, "replaced and Ready", |p| {
        p["status"]["container"]["createdAt"] != first_container
            && crate::harness::ready_reason(p).is_some_and(|(s, _)| s == "True")
            && p["status"]["observedGeneration"] == p["metadata"]["generation"]
    });
    assert_eq!(
        condition(&replaced, "ReplaceBlocked").unwrap()["reason"],
        "Forced"
    );
    let trashed = format!("berth-trash-{uid}-ct-1");
    assert_eq!(
        instances_named(&format!("berth-trash-{uid}")),
        std::slice::from_ref(&trashed)
    );
    assert_eq!(
        lxc(&["list", &trashed, "--format", "csv", "-c", "s"])
            .unwrap()
            .trim(),
        "STOPPED"
    );
    // The workspace volume stays with the live project, attached to the new container only.
    let devices = lxc(&["config", "device", "show", &trashed]).unwrap();
    assert!(!devices.contains("workspace"), "{devices}");
    let live_devices = lxc(&["config", "device", "show", &name]).unwrap();
    assert!(
        live_devices.contains(&format!("berth-{uid}-workspace")),
        "{live_devices}"
    );
    assert!(
        exec(&name, "test -e /workspace/.git/worktrees/wt && echo yes")
            .unwrap()
            .contains("yes")
    );

    let key = format!("{uid}-ct-1");
    let items = trash_items(&berth);
    let item = items
        .iter()
        .find(|i| i["uid"] == key.as_str())
        .unwrap_or_else(|| panic!("{key} not in the trash: {items:?}"));
    assert_eq!(item["name"], name.as_str());
    assert_eq!(item["reason"], "recreate");
    assert!(item["expiresAt"].is_string(), "{item}");
    let table = berth.cli_ok(&["trash", "list"]);
    assert!(table.contains(&key), "{table}");

    // The worktree's files come out of the stopped, trashed container byte for byte.
    let out = tempfile::tempdir().unwrap();
    berth.cli_ok(&[
        "trash",
        "cp",
        &format!("{key}:/root/wt/tracked.txt"),
        out.path().to_str().unwrap(),
    ]);
    let new_bin = out.path().join("copied.bin");
    berth.cli_ok(&[
        "trash",
        "cp",
        &format!("{key}:/root/wt/new.bin"),
        new_bin.to_str().unwrap(),
    ]);
    assert_eq!(sha256(&out.path().join("tracked.txt")), hashes[0]);
    assert_eq!(sha256(&new_bin), hashes[1]);
    let missing = berth.cli(&[
        "trash",
        "cp",
        &format!("{key}:/root/wt/nothing"),
        "/dev/null",
    ]);
    assert!(!missing.status.success(), "{}", said(&missing));
    assert!(
        said(&missing).contains("no file /root/wt/nothing"),
        "{}",
        said(&missing)
    );
    // Not a project: restore refuses and says how to get the files.
    let restore = berth.cli(&["restore", &key]);
    assert!(!restore.status.success(), "{}", said(&restore));
    assert!(
        said(&restore).contains("berth trash cp"),
        "{}",
        said(&restore)
    );

    // Expired with the trash: housekeeping deletes it.
    eventually(
        Duration::from_secs(RETENTION_SECS + 180),
        "the trashed container purged after the retention",
        || berth.log_text(),
        || {
            instances_named(&format!("berth-trash-{uid}"))
                .is_empty()
                .then_some(())
        },
    );
    assert!(
        trash_items(&berth).iter().all(|i| i["uid"] != key.as_str()),
        "purged from the listing too"
    );
    let events = berth.cli_ok(&["events", "project", &name]);
    assert!(events.contains("TrashPurged"), "{events}");
    berth.delete_project(&name);
}
