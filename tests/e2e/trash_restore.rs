//! The trash end to end, with the real `berth` binary, real LXD and real git: a forced delete
//! puts the workspace in the trash (`berth trash list`), `berth restore` brings /workspace back
//! with every file, mode and `.git` identical and the project Ready again under its uid; a name
//! in use is refused, `--as NEW` restores alongside under a new uid; `--purge` leaves nothing in
//! the trash nor in LXD; the trash and purging are admin rights.

use std::path::Path;

use crate::harness::{Berth, PROJECTS, exec, lxc, uid_of, unique_name, volumes_of};
use crate::support::daemon::{Daemon, TcpClient};
use crate::support::said;
use serde_json::{Value, json};

const TRASH: &str = "/apis/berth.dev/v1alpha1/trash";

/// `berth trash list -o json`, parsed.
fn trash_list(berth: &Berth) -> Vec<Value> {
    let list: Value = serde_json::from_str(&berth.cli_ok(&["trash", "list", "-o", "json"]))
        .expect("trash list -o json is JSON");
    assert_eq!(list["kind"], "TrashList");
    assert_eq!(list["apiVersion"], "berth.dev/v1alpha1");
    list["items"].as_array().cloned().unwrap_or_default()
}

/// A git repository with two commits, an executable script and a nested file.
fn git_repo(dir: &Path) -> String {
    let repo = dir.join("repo");
    std::fs::create_dir_all(repo.join("src")).unwrap();
    std::fs::write(repo.join("README.md"), "trash repo\n").unwrap();
    std::fs::write(repo.join("src/lib.rs"), "pub fn f() {}\n").unwrap();
    let run = repo.join("run.sh");
    std::fs::write(&run, "#!/bin/sh\necho run\n").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&run, std::fs::Permissions::from_mode(0o755)).unwrap();
    let git = |args: &[&str]| {
        crate::support::git(&repo, args);
    };
    git(&["init", "-q", "-b", "main"]);
    git(&["add", "-A"]);
    git(&["commit", "-q", "-m", "first"]);
    std::fs::write(repo.join("README.md"), "trash repo, second\n").unwrap();
    git(&["commit", "-q", "-am", "second"]);
    format!("file://{}", repo.display())
}

/// Every path under /workspace (`.git` included) with its type, mode, owner and size, and the
/// sha256 of every file, sorted: equal listings mean an identical workspace.
fn workspace_fingerprint(name: &str) -> String {
    let listing = exec(
        name,
        "cd /workspace && find . -exec stat -c '%n %F %a %u:%g %s' {} + | LC_ALL=C sort \
         && find . -type f -exec sha256sum {} + | LC_ALL=C sort",
    )
    .expect("fingerprint the workspace");
    assert!(listing.contains("./.git/HEAD"), "{listing}");
    listing
}

#[test]
fn a_forced_delete_goes_to_the_trash_and_restore_brings_the_workspace_back() {
    let mut berth = Berth::start(None);
    let repos = tempfile::tempdir().unwrap();
    let url = git_repo(repos.path());
    let name = unique_name();
    let created = berth.create_project(
        &name,
        json!({"image": "berth-base", "repo": {"url": url, "branch": "main"}}),
    );
    let uid = uid_of(&created);
    berth.wait_ready(&name);
    // Work that exists only here: a commit, an uncommitted change, an untracked private file,
    // an empty directory.
    exec(
        &name,
        "cd /workspace && git -c user.name=t -c user.email=t@t commit -q --allow-empty -m local \
         && echo changed >> src/lib.rs && mkdir -p notes/empty && echo secret > notes/key \
         && chmod 600 notes/key && chmod 711 notes",
    )
    .unwrap();
    let before = workspace_fingerprint(&name);

    berth.cli_ok(&["delete", "project", &name, "--force"]);
    assert!(berth.get_project(&name).is_none());
    assert_eq!(
        volumes_of(&uid),
        [format!("berth-trash-{uid}-workspace")],
        "the workspace is in the trash, under its trash name only"
    );

    let table = berth.cli_ok(&["trash", "list"]);
    assert!(table.contains(&name) && table.contains(&uid), "{table}");
    let items = trash_list(&berth);
    let item = items
        .iter()
        .find(|i| i["uid"] == uid.as_str())
        .unwrap_or_else(|| panic!("{uid} not in the trash: {items:?}"));
    assert_eq!(item["name"], name.as_str());
    assert_eq!(item["reason"], "forced");
    assert!(
        item["deletedBy"].as_str().unwrap().starts_with("unix:"),
        "{item}"
    );
    let deleted: chrono::DateTime<chrono::Utc> =
        item["deletedAt"].as_str().unwrap().parse().unwrap();
    let trashed: chrono::DateTime<chrono::Utc> =
        item["trashedAt"].as_str().unwrap().parse().unwrap();
    let expires: chrono::DateTime<chrono::Utc> =
        item["expiresAt"].as_str().unwrap().parse().unwrap();
    assert!(trashed >= deleted, "{item}");
    assert_eq!(expires - trashed, chrono::Duration::days(7));
    assert!(item["bytes"].is_u64(), "{item}");
    let metrics = berth.client().get("/metrics").text();
    assert!(
        metrics.lines().any(|l| l == "berth_trash_volumes 1"),
        "{metrics}"
    );
    assert!(metrics.contains("berth_trash_bytes "), "{metrics}");

    let restored = berth.cli_ok(&["restore", &name]);
    assert!(restored.contains(&name), "{restored}");
    let project = berth.wait_ready(&name);
    assert_eq!(uid_of(&project), uid, "a restore keeps the uid");
    assert!(
        project["status"]["firstReachableAt"].is_string(),
        "{}",
        project["status"]
    );
    assert_eq!(volumes_of(&uid), [format!("berth-{uid}-workspace")]);
    assert_eq!(
        workspace_fingerprint(&name),
        before,
        "the workspace came back byte for byte"
    );
    assert!(trash_list(&berth).iter().all(|i| i["uid"] != uid.as_str()));
    let members = berth
        .client()
        .get(&format!("{PROJECTS}/{name}/members"))
        .json();
    assert!(
        members["items"].as_array().is_some_and(|m| m
            .iter()
            .any(|u| u["name"].as_str().is_some_and(|n| n.starts_with("unix:")))),
        "the caller is a member: {members}"
    );
}

/// A deletion held (unsaved work) for longer than the trash's retention, then forced: the trash
/// keeps the workspace for the whole retention from when it received it, not from the first
/// delete request, and housekeeping leaves it there.
#[test]
fn a_deletion_held_past_the_retention_keeps_its_trash_copy_for_the_full_retention() {
    const RETENTION_SECS: i64 = 40;
    let config = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(
        config.path(),
        format!(
            "trash: {{retention: {RETENTION_SECS}s}}\n\
             scheduler: {{interval: 2s, recheckInterval: 5s}}\n"
        ),
    )
    .unwrap();
    let mut berth = Berth::start_with(&[], &["--config", config.path().to_str().unwrap()]);
    let name = unique_name();
    let created = berth.create_project(&name, json!({"image": "berth-base"}));
    let uid = uid_of(&created);
    berth.wait_ready(&name);
    exec(&name, "echo 'a week of work' > /workspace/notes.md").unwrap();
    let notes = || exec(&name, "sha256sum /workspace/notes.md").unwrap();
    let before = notes();

    // Held: the workspace holds unsaved work.
    let reply = berth.client().delete(&format!("{PROJECTS}/{name}"));
    assert!([200, 202].contains(&reply.status), "{}", reply.text());
    berth.wait_for(&name, "the deletion held", |p| {
        p["status"]["conditions"].as_array().is_some_and(|c| {
            c.iter()
                .any(|c| c["type"] == "DeletionBlocked" && c["status"] == "True")
        })
    });
    let asked: chrono::DateTime<chrono::Utc> =
        berth.get_project(&name).unwrap()["metadata"]["deletionTimestamp"]
            .as_str()
            .unwrap()
            .parse()
            .unwrap();
    // Held for longer than the retention.
    let held_until = asked + chrono::Duration::seconds(RETENTION_SECS + 5);
    berth.wait_for(&name, "held past the retention", |_| {
        chrono::Utc::now() > held_until
    });

    berth.cli_ok(&["delete", "project", &name, "--force"]);
    berth.wait_gone(&name, "deleted", std::time::Duration::from_secs(300));
    let items = trash_list(&berth);
    let item = items
        .iter()
        .find(|i| i["uid"] == uid.as_str())
        .unwrap_or_else(|| panic!("{uid} not in the trash: {items:?}"));
    let at = |key: &str| -> chrono::DateTime<chrono::Utc> {
        item[key].as_str().unwrap().parse().unwrap()
    };
    assert!(
        at("trashedAt") > asked + chrono::Duration::seconds(RETENTION_SECS),
        "trashedAt is when the trash received it: {item}"
    );
    assert_eq!(
        at("expiresAt") - at("trashedAt"),
        chrono::Duration::seconds(RETENTION_SECS),
        "{item}"
    );
    assert!(
        at("expiresAt") > chrono::Utc::now(),
        "not due at once: {item}"
    );

    // Housekeeping sweeps a tenth of the retention apart: a few sweeps later it is still there.
    let swept_until = chrono::Utc::now() + chrono::Duration::seconds(RETENTION_SECS / 4);
    while chrono::Utc::now() < swept_until {
        std::thread::sleep(std::time::Duration::from_millis(500));
    }
    assert!(
        trash_list(&berth).iter().any(|i| i["uid"] == uid.as_str()),
        "purged before its retention:\n{}",
        berth.log_text()
    );
    berth.cli_ok(&["restore", &name]);
    berth.wait_ready(&name);
    assert_eq!(notes(), before, "the work came back byte for byte");
}

#[test]
fn a_restore_as_a_new_name_comes_back_alongside_and_purge_leaves_nothing() {
    let mut berth = Berth::start(None);
    let name = unique_name();
    let first = uid_of(&berth.create_project(&name, json!({"image": "berth-tiny"})));
    berth.wait_ready(&name);
    exec(&name, "echo kept > /workspace/f && chmod 640 /workspace/f").unwrap();
    berth.cli_ok(&["delete", "project", &name, "--force"]);

    // The trash never blocks the name: a new project takes it at once.
    let second = uid_of(&berth.create_project(&name, json!({"image": "berth-tiny"})));
    berth.wait_ready(&name);
    let refused = berth.cli(&["restore", &name]);
    assert!(!refused.status.success(), "{}", said(&refused));
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        stderr.contains("exists") && stderr.lines().count() == 1,
        "{stderr}"
    );
    let reply = berth
        .client()
        .post_json(&format!("{TRASH}/{first}/restore"), &json!({}));
    assert_eq!(reply.status, 409, "{}", reply.text());

    let alongside = format!("{name}-b");
    berth.cli_ok(&["restore", &name, "--as", &alongside]);
    let project = berth.wait_ready(&alongside);
    berth.track(&project);
    let third = uid_of(&project);
    assert!(third != first && third != second, "--as gives a new uid");
    assert_eq!(volumes_of(&third), [format!("berth-{third}-workspace")]);
    assert!(volumes_of(&first).is_empty(), "{:?}", volumes_of(&first));
    assert_eq!(
        lxc(&[
            "storage",
            "volume",
            "get",
            "default",
            &format!("berth-{third}-workspace"),
            "user.berth.uid"
        ])
        .unwrap()
        .trim(),
        third,
        "relabelled for its new project"
    );
    assert_eq!(
        exec(&alongside, "stat -c %a /workspace/f && cat /workspace/f").unwrap(),
        "640\nkept\n"
    );
    assert_eq!(berth.get_project(&name).map(|p| uid_of(&p)), Some(second));

    // --purge skips the trash: nothing of it is left anywhere.
    berth.cli_ok(&["delete", "project", &alongside, "--purge"]);
    assert!(berth.get_project(&alongside).is_none());
    assert!(volumes_of(&third).is_empty(), "{:?}", volumes_of(&third));
    assert!(
        trash_list(&berth)
            .iter()
            .all(|i| i["uid"] != third.as_str())
    );
}

#[test]
fn the_trash_and_purging_are_admin_rights() {
    let daemon = Daemon::start_with(&["--listen", "127.0.0.1:0"]);
    let admin = daemon.add_user("ada", true);
    let user = daemon.add_user("uma", false);
    let tcp = TcpClient::new(&daemon.tcp_addr(), Some(&user), None);
    let reply = tcp.json(
        "POST",
        PROJECTS,
        &json!({"apiVersion": "berth.dev/v1alpha1", "kind": "Project",
                "metadata": {"name": "kept"}, "spec": {"image": "berth-tiny"}}),
    );
    assert_eq!(reply.status, 201, "{}", reply.text());

    for (method, path) in [
        ("GET", TRASH.to_string()),
        ("POST", format!("{TRASH}/kept/restore")),
        ("DELETE", format!("{PROJECTS}/kept?force=true&purge=true")),
    ] {
        let reply = tcp.json(method, &path, &json!({}));
        assert_eq!(reply.status, 403, "{method} {path}: {}", reply.text());
    }
    let admin = tcp.with_token(Some(&admin));
    let reply = admin.json("DELETE", &format!("{PROJECTS}/kept?purge=true"), &json!({}));
    assert_eq!(reply.status, 400, "purge needs force: {}", reply.text());
    assert!(reply.text().contains("purge"), "{}", reply.text());
    // The paused daemon never reached LXD: the trash says so rather than answering empty.
    assert_eq!(admin.get(TRASH).status, 503);
    assert_eq!(
        daemon.client().get(&format!("{PROJECTS}/kept")).json()["metadata"]["annotations"]
            .get("berth.dev/purge"),
        None,
        "a refused purge records nothing"
    );
}

/// The LXD calls the trash is made of, against the real daemon: a custom volume is relabelled
/// (a key set to "" removed), renamed (a taken name is a conflict, a missing volume not found),
/// and its usage is unknown on this `dir` pool rather than an error.
#[tokio::test]
async fn lxd_renames_and_relabels_custom_volumes() {
    use crate::support::lxd::{Cleanup, POOL};
    use berth::runtime::{CreateVolume, Runtime, RuntimeError};
    use std::collections::BTreeMap;

    let lxd = crate::support::lxd::client().await;
    let name = crate::support::lxd::unique_name();
    let (first, second, taken) = (
        format!("{name}-a"),
        format!("{name}-b"),
        format!("{name}-c"),
    );
    let mut cleanup = Cleanup::new();
    for volume in [&first, &second, &taken] {
        cleanup.volume(POOL, volume);
    }
    for volume in [&first, &taken] {
        lxd.create_volume(&CreateVolume {
            pool: POOL.into(),
            name: volume.clone(),
            size: None,
            config: BTreeMap::from([("user.berth.test".to_string(), "1".to_string())]),
            target: None,
        })
        .await
        .unwrap();
    }

    let labels = BTreeMap::from([
        ("user.berth.trash.name".to_string(), "p".to_string()),
        ("user.berth.test".to_string(), String::new()),
    ]);
    lxd.patch_volume(POOL, &first, &labels, None).await.unwrap();
    let config = lxd
        .get_volume(POOL, &first, None)
        .await
        .unwrap()
        .unwrap()
        .config;
    assert_eq!(
        config.get("user.berth.trash.name").map(String::as_str),
        Some("p")
    );
    assert!(!config.contains_key("user.berth.test"), "{config:?}");

    let err = lxd
        .rename_volume(POOL, &first, &taken, None)
        .await
        .unwrap_err();
    assert!(matches!(err, RuntimeError::Conflict { .. }), "{err}");
    lxd.rename_volume(POOL, &first, &second, None)
        .await
        .unwrap();
    assert!(lxd.get_volume(POOL, &first, None).await.unwrap().is_none());
    let moved = lxd.get_volume(POOL, &second, None).await.unwrap().unwrap();
    assert_eq!(
        moved
            .config
            .get("user.berth.trash.name")
            .map(String::as_str),
        Some("p")
    );
    let err = lxd
        .rename_volume(POOL, &first, &second, None)
        .await
        .unwrap_err();
    assert!(err.is_not_found(), "{err}");

    let driver = lxd.storage_pool(POOL).await.unwrap().driver;
    let usage = lxd.volume_usage(POOL, &second, None).await.unwrap();
    if driver == "dir" {
        assert_eq!(usage, None, "LXD 5.0's dir driver cannot size a volume");
    }
}

/// How many times berth started the project's runner, by its events (kept by uid, so a project
/// restored under its uid shows its earlier life's too).
fn runner_starts(berth: &Berth, name: &str) -> usize {
    let list = berth
        .client()
        .get(&format!("{PROJECTS}/{name}/events"))
        .json();
    list["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| {
            e["message"]
                .as_str()
                .is_some_and(|m| m.starts_with("runner started"))
        })
        .map(|e| e["count"].as_u64().unwrap_or(1) as usize)
        .sum()
}

#[test]
fn a_restored_project_does_not_run_its_finished_brief_again() {
    let mut berth = Berth::start(None);
    let name = unique_name();
    let profile = format!("shell-{}", &name[name.len() - 8..]);
    let reply = berth.client().post_json(
        "/apis/berth.dev/v1alpha1/agentprofiles",
        &json!({
            "apiVersion": "berth.dev/v1alpha1",
            "kind": "AgentProfile",
            "metadata": {"name": profile},
            "spec": {
                "home": format!("/root/.{profile}"),
                "install": {"check": "test -x /usr/local/lib/berth/shell-agent"},
                "runner": {"command": ["/usr/local/lib/berth/shell-agent", "{briefFile}"]},
            },
        }),
    );
    assert_eq!(reply.status, 201, "{}", reply.text());
    berth.create_project(
        &name,
        json!({
            "image": "berth-base",
            "agent": profile,
            "brief": "Write the file once\necho ran >> /workspace/runs.txt\n",
        }),
    );
    berth.wait_for(&name, "the brief done", |p| {
        p["status"]["agent"]["state"] == "done" && p["status"]["briefFinished"].is_string()
    });
    assert_eq!(runner_starts(&berth, &name), 1);

    berth.cli_ok(&["delete", "project", &name, "--force"]);
    berth.wait_gone(&name, "deleted", std::time::Duration::from_secs(300));
    berth.cli_ok(&["restore", &name]);
    berth.wait_ready(&name);
    let restored = berth.wait_for(&name, "briefed", |p| p["status"]["step"] == "Briefed");
    assert!(
        restored["status"]["briefFinished"].is_string(),
        "the finished brief is recorded on the restored project: {restored}"
    );
    assert_eq!(
        runner_starts(&berth, &name),
        1,
        "the finished brief was handed over again:\n{}",
        berth.log_text()
    );
    assert!(
        exec(&name, "test -e /run/berth/brief.md").is_err(),
        "no brief handed to the new container"
    );
    let _ = berth.client().try_request(
        "DELETE",
        &format!("/apis/berth.dev/v1alpha1/agentprofiles/{profile}"),
        None,
        &[],
    );
}

#[test]
fn a_restore_goes_through_admission_and_a_refused_one_moves_nothing() {
    let config = tempfile::NamedTempFile::new().unwrap();
    // A documentation address: the proxy device only connects when someone connects to it,
    // which nobody does here.
    std::fs::write(
        config.path(),
        "allowedForwardTargets: [\"192.0.2.10:80\"]\n",
    )
    .unwrap();
    let mut berth = Berth::start_with(&[], &["--config", config.path().to_str().unwrap()]);
    let name = unique_name();
    let created = berth.create_project(
        &name,
        json!({"image": "berth-base", "forwards": [{"port": 8080, "to": "192.0.2.10:80"}]}),
    );
    let uid = uid_of(&created);
    berth.wait_ready(&name);
    berth.cli_ok(&["delete", "project", &name, "--force"]);
    berth.wait_gone(&name, "deleted", std::time::Duration::from_secs(300));

    // The operator no longer allows that target: the entry would become a project no apply
    // could create.
    std::fs::write(config.path(), "allowedForwardTargets: []\n").unwrap();
    berth.kill();
    berth.restart();
    berth.wait_connected();
    let refused = berth.cli(&["restore", &name]);
    assert!(!refused.status.success(), "{}", said(&refused));
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        stderr.contains("spec.forwards[0].to"),
        "the refusal names the field: {}",
        said(&refused)
    );
    assert!(berth.get_project(&name).is_none());
    assert!(
        trash_list(&berth).iter().any(|i| i["uid"] == uid.as_str()),
        "the entry stays in the trash, untouched"
    );
    assert!(
        volumes_of(&uid)
            .iter()
            .all(|v| v.starts_with("berth-trash-")),
        "no volume moved back: {:?}",
        volumes_of(&uid)
    );
}

#[test]
fn a_deleted_projects_container_goes_to_the_trash_with_its_volumes() {
    let mut berth = Berth::start(None);
    let name = unique_name();
    let created = berth.create_project(&name, json!({"image": "berth-base"}));
    let uid = uid_of(&created);
    berth.wait_ready(&name);
    // Outside every mount: only the container's root filesystem holds it.
    exec(
        &name,
        "head -c 50000 /dev/urandom > /root/tool.bin && sha256sum /root/tool.bin > /root/tool.sum",
    )
    .unwrap();
    let sum = exec(&name, "cut -d' ' -f1 /root/tool.sum").unwrap();
    berth.cli_ok(&["delete", "project", &name, "--force"]);
    berth.wait_gone(&name, "deleted", std::time::Duration::from_secs(300));
    let trashed = format!("berth-trash-{uid}-ct-1");
    assert_eq!(
        lxc(&["list", &trashed, "--format", "csv", "-c", "s"])
            .unwrap()
            .trim(),
        "STOPPED",
        "the container is kept, stopped"
    );
    // One entry: the project's volumes and its container.
    let items: Vec<Value> = trash_list(&berth)
        .into_iter()
        .filter(|i| i["uid"].as_str().is_some_and(|u| u.starts_with(&uid)))
        .collect();
    assert_eq!(items.len(), 1, "{items:?}");
    assert_eq!(items[0]["kind"], "project");

    let out = tempfile::tempdir().unwrap();
    berth.cli_ok(&[
        "trash",
        "cp",
        &format!("{uid}:/root/tool.bin"),
        out.path().to_str().unwrap(),
    ]);
    let copied = std::fs::read(out.path().join("tool.bin")).unwrap();
    use sha2::Digest;
    let copied_sum: String = sha2::Sha256::digest(&copied)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    assert_eq!(copied_sum, sum.trim(), "byte for byte");

    // The project comes back on a fresh container; the old one stays, an entry of its own.
    berth.cli_ok(&["restore", &name]);
    berth.wait_ready(&name);
    let left: Vec<Value> = trash_list(&berth)
        .into_iter()
        .filter(|i| i["uid"].as_str().is_some_and(|u| u.starts_with(&uid)))
        .collect();
    assert_eq!(left.len(), 1, "{left:?}");
    assert_eq!(left[0]["uid"], format!("{uid}-ct-1"));
    assert_eq!(left[0]["kind"], "container");
}
