//! The LXD client against the real daemon: every runtime operation, concurrency, durable
//! volumes, events, and bad input turned into typed errors within deadlines.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use crate::support::lxd::{
    BASE, Cleanup, OP_TIMEOUT, POOL, TINY, client, create, eventually, request, unique_name,
};
use berth::lxd::{Endpoint, LxdClient, LxdConfig};
use berth::runtime::{
    CreateInstance, CreateVolume, Created, EventKind, ExecRequest, FileWrite, ImageSource,
    InstancePatch, InstanceStatus, Mkdir, Runtime, RuntimeError, StopOptions, Watch,
};
use futures::StreamExt;

fn exec(cmd: &[&str]) -> ExecRequest {
    ExecRequest::new(cmd.iter().copied(), Duration::from_secs(60))
}

/// The instance's log directory listing, read with the `lxc` client, not berth's.
fn exec_logs(name: &str) -> String {
    let raw = std::process::Command::new("lxc")
        .args(["query", &format!("/1.0/instances/{name}/logs")])
        .output()
        .expect("run lxc query");
    String::from_utf8_lossy(&raw.stdout).into_owned()
}

fn device(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn server_info_is_read_at_connect() {
    let lxd = client().await;
    let info = lxd.server_info().await.unwrap();
    assert!(!info.version.is_empty());
    assert!(info.has_extension("instances"), "{:?}", info.api_extensions);
    assert!(lxd.is_trusted());
}

#[tokio::test(flavor = "multi_thread")]
async fn storage_pools_report_their_driver() {
    let lxd = client().await;
    // The pool as the `lxc` client sees it, not berth.
    let raw = std::process::Command::new("lxc")
        .args(["query", &format!("/1.0/storage-pools/{POOL}")])
        .output()
        .expect("run lxc query");
    let expected: serde_json::Value = serde_json::from_slice(&raw.stdout).expect("pool JSON");
    let pool = lxd.storage_pool(POOL).await.unwrap();
    assert_eq!(pool.name, POOL);
    assert_eq!(pool.driver, expected["driver"].as_str().unwrap());
    assert_eq!(
        pool.enforces_sizes(),
        pool.driver != "dir",
        "{}",
        pool.driver
    );
    match lxd.storage_pool("berth-no-such-pool").await {
        Err(RuntimeError::NotFound { .. }) => {}
        other => panic!("a missing pool: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn instance_lifecycle_from_create_to_delete() {
    let lxd = client().await;
    let name = unique_name();
    let mut cleanup = Cleanup::new();
    cleanup.instance(&name);

    create(&lxd, &crate::support::lxd::request(&name, TINY)).await;
    // Idempotent: a second create submits nothing and reports the existing instance.
    match lxd.create_instance(&request(&name, TINY)).await.unwrap() {
        Created::Exists(existing) => assert_eq!(existing.name, name),
        other => panic!("second create: {other:?}"),
    }
    // Submitted without looking, as by a caller that just read no such instance: LXD fails
    // the operation, and the error says why.
    let blind = CreateInstance {
        known_absent: true,
        ..request(&name, TINY)
    };
    match lxd.create_instance(&blind).await.unwrap() {
        Created::Submitted { operation } => {
            let failed = lxd
                .wait_operation(&operation, OP_TIMEOUT)
                .await
                .unwrap_err();
            assert!(failed.is_already_exists(), "{failed:?}");
        }
        other => panic!("a create without looking: {other:?}"),
    }
    let stopped = lxd.get_instance(&name).await.unwrap().expect("created");
    assert_eq!(stopped.status, InstanceStatus::Stopped);
    assert_eq!(stopped.config.get("user.berth.test"), Some(&name));
    let fingerprint = lxd
        .resolve_image(&ImageSource::Alias(TINY.into()))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(stopped.base_image(), Some(fingerprint.as_str()));
    assert!(stopped.created_at.is_some());

    lxd.start_instance(&name, OP_TIMEOUT).await.unwrap();
    lxd.start_instance(&name, OP_TIMEOUT).await.unwrap(); // already running: fine
    let running = lxd.get_instance(&name).await.unwrap().unwrap();
    assert_eq!(running.status, InstanceStatus::Running);
    assert_eq!(running.status_code, 103);
    let state = running.state.expect("state");
    assert!(state.pid > 0 && state.processes > 0, "{state:?}");
    assert!(state.memory_usage_bytes > 0, "{state:?}");
    assert!(state.network.contains_key("lo"), "{state:?}");
    // The record alone: the same instance, without the state.
    let record = lxd
        .get_instance_record(&name)
        .await
        .unwrap()
        .expect("running");
    assert_eq!(record.status, InstanceStatus::Running);
    assert_eq!(record.last_used_at, running.last_used_at);
    assert!(record.state.is_none());

    // One list call finds it by its label prefix, with state.
    let listed = lxd
        .list_instances(Some("user.berth.test"), true)
        .await
        .unwrap();
    let mine = listed.iter().find(|i| i.name == name).expect("listed");
    assert!(mine.state.is_some());

    // PATCH merges a config key and a device; a full update with If-Match removes the device.
    let host_dir = tempfile::tempdir().unwrap();
    let patch = InstancePatch {
        config: [("user.berth.extra".to_string(), "1".to_string())].into(),
        devices: [(
            "scratch".to_string(),
            device(&[
                ("type", "disk"),
                ("source", host_dir.path().to_str().unwrap()),
                ("path", "/mnt/scratch"),
            ]),
        )]
        .into(),
    };
    lxd.patch_instance(&name, &patch).await.unwrap();
    let patched = lxd.get_instance(&name).await.unwrap().unwrap();
    assert_eq!(
        patched.config.get("user.berth.extra").map(String::as_str),
        Some("1")
    );
    assert!(patched.devices.contains_key("scratch"));
    lxd.update_instance(&name, &|edit| {
        edit.devices.remove("scratch");
        edit.config.remove("user.berth.extra");
    })
    .await
    .unwrap();
    let updated = lxd.get_instance(&name).await.unwrap().unwrap();
    assert!(!updated.devices.contains_key("scratch"));
    assert!(!updated.config.contains_key("user.berth.extra"));
    assert!(updated.config.contains_key("volatile.base_image"));

    lxd.restart_instance(&name, false, OP_TIMEOUT)
        .await
        .unwrap();
    lxd.restart_instance(&name, true, OP_TIMEOUT).await.unwrap();
    let log = lxd.console_log_tail(&name, 4096).await.unwrap();
    assert!(log.len() <= 4096);

    lxd.stop_instance(
        &name,
        StopOptions::clean_then_force(Duration::from_secs(30)),
    )
    .await
    .unwrap();
    lxd.stop_instance(
        &name,
        StopOptions::clean_then_force(Duration::from_secs(30)),
    )
    .await
    .unwrap(); // already stopped: fine
    assert_eq!(
        lxd.get_instance(&name).await.unwrap().unwrap().status,
        InstanceStatus::Stopped
    );
    lxd.delete_instance(&name, OP_TIMEOUT).await.unwrap();
    lxd.delete_instance(&name, OP_TIMEOUT).await.unwrap(); // already gone: fine
    assert!(lxd.get_instance(&name).await.unwrap().is_none());
}

#[tokio::test(flavor = "multi_thread")]
async fn exec_captures_output_exit_code_env_cwd_and_cleans_its_logs() {
    let lxd = client().await;
    let name = unique_name();
    let mut cleanup = Cleanup::new();
    cleanup.instance(&name);
    create(&lxd, &request(&name, TINY)).await;
    lxd.start_instance(&name, OP_TIMEOUT).await.unwrap();

    let mut run = exec(&["sh", "-c", "echo out:$GREETING; pwd; echo err >&2; exit 3"]);
    run.env.insert("GREETING".into(), "hello".into());
    run.cwd = Some("/tmp".into());
    let out = lxd.exec(&name, &run).await.unwrap();
    assert_eq!(out.exit_code, 3);
    assert_eq!(out.stdout_str(), "out:hello\n/tmp\n");
    assert_eq!(out.stderr_str(), "err\n");

    let mut as_user = exec(&["id", "-u"]);
    as_user.uid = Some(1234);
    as_user.gid = Some(1234);
    assert_eq!(
        lxd.exec(&name, &as_user).await.unwrap().stdout_str(),
        "1234\n"
    );

    // Large output survives the log round trip.
    let big = lxd
        .exec(
            &name,
            &exec(&[
                "sh",
                "-c",
                "i=0; while [ $i -lt 20000 ]; do echo line$i; i=$((i+1)); done",
            ]),
        )
        .await
        .unwrap();
    assert_eq!(big.stdout_str().lines().count(), 20000);

    // The recorded output logs were deleted after reading.
    lxd.exec(&name, &exec(&["true"])).await.unwrap();
    let listing = exec_logs(&name);
    assert!(
        !listing.contains("exec"),
        "exec logs left behind: {listing}"
    );

    // A command that outlives its deadline is a Timeout, promptly.
    let started = std::time::Instant::now();
    let slow = ExecRequest::new(["sleep", "3"], Duration::from_secs(1));
    match lxd.exec(&name, &slow).await {
        Err(RuntimeError::Timeout { after, .. }) => assert_eq!(after, Duration::from_secs(1)),
        other => panic!("slow exec: {other:?}"),
    }
    assert!(started.elapsed() < Duration::from_secs(10));
    // Its output logs are deleted once it ends, though nobody waited for it.
    eventually(
        OP_TIMEOUT,
        "logs of the timed-out exec to be deleted",
        || async { !exec_logs(&name).contains("exec") },
    )
    .await;

    // Wanting only the exit code: the command runs as it is and nothing is read back.
    let status_only = exec(&["sh", "-c", "echo out; echo err >&2; exit 4"]).discarding_output();
    let out = lxd.exec(&name, &status_only).await.unwrap();
    assert_eq!(out.exit_code, 4);
    assert!(out.stdout.is_empty() && out.stderr.is_empty());

    // A missing program is LXD's failure, typed.
    let missing = lxd.exec(&name, &exec(&["/no/such/program"])).await;
    match missing {
        Ok(out) => assert_ne!(out.exit_code, 0),
        Err(e) => assert!(e.lxd_message().is_some(), "{e}"),
    }

    // Exec on a stopped instance is rejected with LXD's message.
    lxd.stop_instance(
        &name,
        StopOptions::clean_then_force(Duration::from_secs(30)),
    )
    .await
    .unwrap();
    match lxd.exec(&name, &exec(&["true"])).await {
        Err(RuntimeError::Rejected {
            status: 400,
            message,
            ..
        }) => {
            assert!(message.to_lowercase().contains("not running"), "{message}")
        }
        other => panic!("exec on stopped: {other:?}"),
    }
}

/// A command nobody waits for any more is stopped: one past its timeout, and one whose
/// caller dropped the exec (a request that went away, a right that was revoked).
#[tokio::test(flavor = "multi_thread")]
async fn an_exec_nobody_waits_for_is_stopped() {
    let lxd = client().await;
    let name = unique_name();
    let mut cleanup = Cleanup::new();
    cleanup.instance(&name);
    create(&lxd, &request(&name, TINY)).await;
    lxd.start_instance(&name, OP_TIMEOUT).await.unwrap();
    let running = |marker: &'static str| {
        let (lxd, name) = (&lxd, &name);
        async move {
            lxd.exec(name, &exec(&["ps", "-o", "args"]))
                .await
                .is_ok_and(|out| out.stdout_str().contains(marker))
        }
    };

    let timed = ExecRequest::new(["sleep", "2996"], Duration::from_secs(2));
    let err = lxd.exec(&name, &timed).await.unwrap_err();
    assert!(matches!(err, RuntimeError::Timeout { .. }), "{err}");
    eventually(
        Duration::from_secs(60),
        "the timed-out sleep stops",
        || async { !running("sleep 2996").await },
    )
    .await;

    // Polled until the sleep runs, then dropped.
    let long = exec(&["sleep", "2995"]);
    let mut dropped = Box::pin(lxd.exec(&name, &long));
    let until = tokio::time::Instant::now() + Duration::from_secs(120);
    loop {
        tokio::select! {
            ended = &mut dropped => panic!("sleep ended by itself: {ended:?}"),
            () = tokio::time::sleep(Duration::from_millis(250)) => {}
        }
        if running("sleep 2995").await {
            break;
        }
        assert!(tokio::time::Instant::now() < until, "sleep never started");
    }
    drop(dropped);
    eventually(
        Duration::from_secs(60),
        "the dropped sleep stops",
        || async { !running("sleep 2995").await },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn files_are_written_read_and_deleted_with_owner_and_mode() {
    let lxd = client().await;
    let name = unique_name();
    let mut cleanup = Cleanup::new();
    cleanup.instance(&name);
    create(&lxd, &request(&name, TINY)).await;

    // Works on a stopped instance.
    let parent = Mkdir {
        path: "/srv".into(),
        uid: 0,
        gid: 0,
        mode: 0o755,
    };
    lxd.mkdir(&name, &parent).await.unwrap();
    let dir = Mkdir {
        path: "/srv/berth".into(),
        uid: 1000,
        gid: 1000,
        mode: 0o750,
    };
    lxd.mkdir(&name, &dir).await.unwrap();
    lxd.mkdir(&name, &dir).await.unwrap(); // existing: fine
    let content: Vec<u8> = (0..=255u8).cycle().take(300_000).collect();
    let file = FileWrite {
        path: "/srv/berth/blob".into(),
        content: content.clone(),
        uid: 1000,
        gid: 1001,
        mode: 0o640,
    };
    lxd.file_write(&name, &file).await.unwrap();
    assert_eq!(
        lxd.file_read(&name, "/srv/berth/blob", 1 << 20)
            .await
            .unwrap(),
        content
    );
    // Overwrite replaces, not appends.
    lxd.file_write(
        &name,
        &FileWrite {
            content: b"short".to_vec(),
            ..file.clone()
        },
    )
    .await
    .unwrap();
    assert_eq!(
        lxd.file_read(&name, "/srv/berth/blob", 1 << 20)
            .await
            .unwrap(),
        b"short"
    );

    lxd.start_instance(&name, OP_TIMEOUT).await.unwrap();
    let stat = lxd
        .exec(
            &name,
            &exec(&["stat", "-c", "%u %g %a", "/srv/berth", "/srv/berth/blob"]),
        )
        .await
        .unwrap();
    assert_eq!(
        stat.stdout_str(),
        "1000 1000 750\n1000 1001 640\n",
        "{}",
        stat.stderr_str()
    );

    match lxd.file_read(&name, "/srv/berth/missing", 1 << 20).await {
        Err(RuntimeError::NotFound { .. }) => {}
        other => panic!("missing file: {other:?}"),
    }
    match lxd.file_read(&name, "/srv/berth", 1 << 20).await {
        Err(RuntimeError::Rejected { .. }) => {}
        other => panic!("directory read: {other:?}"),
    }
    lxd.file_delete(&name, "/srv/berth/blob").await.unwrap();
    lxd.file_delete(&name, "/srv/berth/blob").await.unwrap(); // already gone: fine
    assert!(
        lxd.file_read(&name, "/srv/berth/blob", 1 << 20)
            .await
            .unwrap_err()
            .is_not_found()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn ten_concurrent_creates_all_succeed() {
    let lxd = client().await;
    let names: Vec<String> = (0..10).map(|_| unique_name()).collect();
    let mut cleanup = Cleanup::new();
    for name in &names {
        cleanup.instance(name);
    }
    let creates = names.iter().map(|name| {
        let lxd = Arc::clone(&lxd);
        let name = name.clone();
        tokio::spawn(async move {
            create(&lxd, &request(&name, TINY)).await;
            lxd.start_instance(&name, OP_TIMEOUT).await.unwrap();
        })
    });
    for result in futures::future::join_all(creates).await {
        result.expect("create task");
    }
    let listed = lxd
        .list_instances(Some("user.berth.test"), false)
        .await
        .unwrap();
    for name in &names {
        let found = listed.iter().find(|i| &i.name == name).expect("listed");
        assert_eq!(found.status, InstanceStatus::Running, "{name}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn workspace_volume_outlives_its_container() {
    let lxd = client().await;
    let volume = format!("{}-workspace", unique_name());
    let (first, second) = (unique_name(), unique_name());
    let mut cleanup = Cleanup::new();
    cleanup.instance(&first);
    cleanup.instance(&second);
    cleanup.volume(POOL, &volume);

    let label = [("user.berth.uid".to_string(), volume.clone())].into();
    let created = lxd
        .create_volume(&CreateVolume {
            pool: POOL.into(),
            name: volume.clone(),
            size: Some("1GiB".into()),
            config: label,
            target: None,
        })
        .await
        .unwrap();
    assert_eq!(created.name, volume);
    assert_eq!(created.config.get("size").map(String::as_str), Some("1GiB"));
    // Idempotent.
    let again = lxd
        .create_volume(&CreateVolume {
            pool: POOL.into(),
            name: volume.clone(),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(again.config.get("user.berth.uid"), Some(&volume));
    let listed = lxd
        .list_volumes(POOL, Some("user.berth.uid"))
        .await
        .unwrap();
    assert!(listed.iter().any(|v| v.name == volume));
    let prefix = volume.trim_end_matches("workspace");
    let named = lxd.volumes_named(POOL, prefix).await.unwrap();
    assert_eq!(
        named.iter().map(|v| v.name.as_str()).collect::<Vec<_>>(),
        [volume.as_str()],
        "only the volume whose name starts with {prefix:?}"
    );
    assert_eq!(named[0].config.get("user.berth.uid"), Some(&volume));

    let attach = |name: &str| {
        let mut req = request(name, TINY);
        req.devices.insert(
            "workspace".into(),
            device(&[
                ("type", "disk"),
                ("pool", POOL),
                ("source", &volume),
                ("path", "/workspace"),
            ]),
        );
        req
    };
    create(&lxd, &attach(&first)).await;
    lxd.start_instance(&first, OP_TIMEOUT).await.unwrap();
    let write = lxd
        .exec(
            &first,
            &exec(&["sh", "-c", "echo durable > /workspace/note && sync"]),
        )
        .await
        .unwrap();
    assert!(write.success(), "{}", write.stderr_str());
    let used = lxd.get_volume(POOL, &volume, None).await.unwrap().unwrap();
    assert!(
        used.used_by.iter().any(|u| u.contains(&first)),
        "{:?}",
        used.used_by
    );
    // In use: cannot be deleted.
    assert!(lxd.delete_volume(POOL, &volume, None).await.is_err());

    lxd.stop_instance(
        &first,
        StopOptions::clean_then_force(Duration::from_secs(30)),
    )
    .await
    .unwrap();
    lxd.delete_instance(&first, OP_TIMEOUT).await.unwrap();

    create(&lxd, &attach(&second)).await;
    lxd.start_instance(&second, OP_TIMEOUT).await.unwrap();
    let read = lxd
        .exec(
            &second,
            &exec(&[
                "sh",
                "-c",
                "cat /workspace/note && echo more >> /workspace/note && cat /workspace/note",
            ]),
        )
        .await
        .unwrap();
    assert_eq!(
        read.stdout_str(),
        "durable\ndurable\nmore\n",
        "{}",
        read.stderr_str()
    );

    lxd.stop_instance(
        &second,
        StopOptions::clean_then_force(Duration::from_secs(30)),
    )
    .await
    .unwrap();
    lxd.delete_instance(&second, OP_TIMEOUT).await.unwrap();
    lxd.delete_volume(POOL, &volume, None).await.unwrap();
    assert!(lxd.get_volume(POOL, &volume, None).await.unwrap().is_none());
    lxd.delete_volume(POOL, &volume, None).await.unwrap(); // already gone: fine
}

#[tokio::test(flavor = "multi_thread")]
async fn events_report_lifecycle_of_our_instance() {
    let lxd = client().await;
    let name = unique_name();
    let mut cleanup = Cleanup::new();
    cleanup.instance(&name);
    let mut events = lxd.events().await.unwrap();
    create(&lxd, &request(&name, TINY)).await;
    lxd.start_instance(&name, OP_TIMEOUT).await.unwrap();
    let seen = tokio::time::timeout(OP_TIMEOUT, async {
        while let Some(event) = events.next().await {
            let event = event.unwrap();
            if event.kind == EventKind::Lifecycle
                && event.action == "instance-started"
                && event.instance.as_deref() == Some(name.as_str())
            {
                return event;
            }
        }
        panic!("event stream ended");
    })
    .await
    .expect("instance-started event");
    assert_eq!(seen.source, format!("/1.0/instances/{name}"));
}

/// Whether a notice about `name` arrives within `within`, skipping notices about other tests'
/// instances.
async fn noticed(
    notices: &mut tokio::sync::broadcast::Receiver<String>,
    name: &str,
    within: Duration,
) -> bool {
    let wait = async {
        loop {
            match notices.recv().await {
                Ok(about) if about == name => return,
                Ok(_) | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                Err(e) => panic!("notices ended: {e}"),
            }
        }
    };
    tokio::time::timeout(within, wait).await.is_ok()
}

#[tokio::test(flavor = "multi_thread")]
async fn writes_in_a_watched_directory_are_noticed() {
    let lxd = client().await;
    let name = unique_name();
    let mut cleanup = Cleanup::new();
    cleanup.instance(&name);
    create(&lxd, &request(&name, TINY)).await;
    let mut notices = lxd.file_notices();
    let watch = |dir: &'static str| {
        let lxd = &lxd;
        let name = &name;
        async move { lxd.watch_files(name, dir).await.unwrap() }
    };

    // Nothing to watch in a stopped instance, nor a directory that is not there.
    assert_eq!(watch("/run/berth").await, Watch::Unavailable);
    lxd.start_instance(&name, OP_TIMEOUT).await.unwrap();
    assert_eq!(watch("/run/absent").await, Watch::Unavailable);

    let run = |cmd: &'static str| {
        let lxd = &lxd;
        let name = &name;
        async move {
            let out = lxd.exec(name, &exec(&["sh", "-c", cmd])).await.unwrap();
            assert_eq!(out.exit_code, 0, "{cmd}: {}", out.stderr_str());
        }
    };
    // The image's init mounts a tmpfs on `/run` and makes `/run/berth` in it, then says so.
    let init_ready = || async {
        let check = exec(&["test", "-f", "/run/init.ready"]);
        lxd.exec(&name, &check).await.unwrap().exit_code == 0
    };
    eventually(OP_TIMEOUT, "the init ready", init_ready).await;
    run("grep -q '^tmpfs /run tmpfs' /proc/mounts").await;
    assert_eq!(watch("/run/berth").await, Watch::Started);
    assert_eq!(watch("/run/berth").await, Watch::Already, "idempotent");

    // Written in the container, replaced by a rename, and written through LXD's file API.
    run("echo working > /run/berth/agent.json").await;
    assert!(noticed(&mut notices, &name, OP_TIMEOUT).await);
    run("echo blocked > /run/berth/.agent.tmp && mv /run/berth/.agent.tmp /run/berth/agent.json")
        .await;
    assert!(noticed(&mut notices, &name, OP_TIMEOUT).await);
    lxd.file_write(
        &name,
        &FileWrite {
            path: "/run/berth/answer".into(),
            content: b"yes".to_vec(),
            uid: 0,
            gid: 0,
            mode: 0o600,
        },
    )
    .await
    .unwrap();
    assert!(noticed(&mut notices, &name, OP_TIMEOUT).await);
    assert_eq!(watch("/run/berth").await, Watch::Already);

    // A restart unmounts the tmpfs, which ends the watch: a report written in the new
    // `/run/berth` before the next ask is not noticed, and that ask starts a new watch, so
    // the caller knows to read once. (One write may have been two notices, the rename's: none
    // is left over to be taken for a notice after the restart.)
    while let Ok(_) | Err(tokio::sync::broadcast::error::TryRecvError::Lagged(_)) =
        notices.try_recv()
    {}
    lxd.restart_instance(&name, true, OP_TIMEOUT).await.unwrap();
    eventually(OP_TIMEOUT, "the init ready again", init_ready).await;
    run("echo done > /run/berth/agent.json").await;
    assert!(
        !noticed(&mut notices, &name, Duration::from_secs(1)).await,
        "a write noticed with no watch"
    );
    assert_eq!(
        watch("/run/berth").await,
        Watch::Started,
        "after the restart"
    );
    assert_eq!(watch("/run/berth").await, Watch::Already);
    run("echo done > /run/berth/agent.json").await;
    assert!(noticed(&mut notices, &name, OP_TIMEOUT).await);
}

#[tokio::test(flavor = "multi_thread")]
async fn unreachable_socket_is_a_transport_error() {
    let dir = tempfile::tempdir().unwrap();
    let endpoint = Endpoint::Unix(dir.path().join("no.sock"));
    let started = std::time::Instant::now();
    match LxdClient::connect(LxdConfig::new(endpoint)).await {
        Err(RuntimeError::Transport { message, .. }) => {
            assert!(message.contains("No such file"), "{message}")
        }
        other => panic!("unreachable socket: {other:?}"),
    }
    assert!(started.elapsed() < Duration::from_secs(10));
}

#[tokio::test(flavor = "multi_thread")]
async fn missing_image_and_rejected_name_carry_lxd_messages() {
    let lxd = client().await;
    let name = unique_name();
    let mut cleanup = Cleanup::new();
    cleanup.instance(&name);
    assert!(
        lxd.resolve_image(&ImageSource::Alias(format!("{name}-nope")))
            .await
            .unwrap()
            .is_none()
    );
    let mut missing = request(&name, TINY);
    missing.image = ImageSource::Alias(format!("{name}-nope"));
    let error = match lxd.create_instance(&missing).await {
        Ok(Created::Submitted { operation }) => lxd
            .wait_operation(&operation, OP_TIMEOUT)
            .await
            .expect_err("missing image must fail"),
        Ok(other) => panic!("{other:?}"),
        Err(e) => e,
    };
    let message = error.lxd_message().expect("LXD's message").to_lowercase();
    assert!(
        message.contains("not found") || message.contains("image"),
        "{error}"
    );

    let bad = request("Bad_Name!", TINY);
    match lxd.create_instance(&bad).await {
        Err(RuntimeError::Rejected {
            status: 400,
            message,
            ..
        }) => {
            assert!(message.to_lowercase().contains("name"), "{message}")
        }
        other => panic!("bad name: {other:?}"),
    }
    assert!(lxd.get_instance("Bad_Name!").await.unwrap().is_none());
}

#[tokio::test(flavor = "multi_thread")]
async fn stop_that_times_out_is_typed_and_force_ends_it() {
    let lxd = client().await;
    let name = unique_name();
    let mut cleanup = Cleanup::new();
    cleanup.instance(&name);
    // PID 1 without a SIGPWR handler ignores LXD's clean-stop signal.
    let mut wedged = request(&name, TINY);
    wedged
        .config
        .insert("raw.lxc".into(), "lxc.init.cmd = /bin/sleep 3600".into());
    create(&lxd, &wedged).await;
    lxd.start_instance(&name, OP_TIMEOUT).await.unwrap();

    let started = std::time::Instant::now();
    let refuse = StopOptions {
        clean_timeout: Duration::from_secs(1),
        force_after: false,
    };
    match lxd.stop_instance(&name, refuse).await {
        Err(RuntimeError::OperationFailed { message, .. }) => {
            assert!(message.contains("Failed shutting down"), "{message}")
        }
        // LXD did not even answer within the grace period (a loaded machine): still typed.
        Err(RuntimeError::Timeout { .. }) => {}
        other => panic!("wedged stop: {other:?}"),
    }
    assert!(started.elapsed() < Duration::from_secs(15));
    assert!(lxd.get_instance(&name).await.unwrap().unwrap().is_running());

    lxd.stop_instance(&name, StopOptions::clean_then_force(Duration::from_secs(1)))
        .await
        .unwrap();
    assert_eq!(
        lxd.get_instance(&name).await.unwrap().unwrap().status,
        InstanceStatus::Stopped
    );
    // A vanished operation id is its own error, not a hang or a generic failure.
    match lxd
        .wait_operation(
            "00000000-0000-0000-0000-000000000000",
            Duration::from_secs(5),
        )
        .await
    {
        Err(RuntimeError::OperationVanished { .. }) => {}
        other => panic!("vanished operation: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn base_image_runs_bash_and_git() {
    let lxd = client().await;
    let name = unique_name();
    let mut cleanup = Cleanup::new();
    cleanup.instance(&name);
    create(&lxd, &request(&name, BASE)).await;
    lxd.start_instance(&name, OP_TIMEOUT).await.unwrap();
    let out = lxd
        .exec(
            &name,
            &exec(&[
                "bash",
                "-lc",
                "cd /tmp && git init -q r && git -C r rev-parse --git-dir",
            ]),
        )
        .await
        .unwrap();
    assert_eq!(out.stdout_str(), ".git\n", "{}", out.stderr_str());
}
