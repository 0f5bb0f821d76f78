//! The life of a real `berth serve`: one per data directory, clean exit on SIGTERM, state kept
//! across restarts.

mod support;

use std::time::Duration;

use serde_json::json;
use support::daemon::{Daemon, spawn_serve, wait_with_deadline};

const PROJECTS: &str = "/apis/berth.dev/v1alpha1/projects";

fn project(name: &str) -> serde_json::Value {
    json!({"apiVersion": "berth.dev/v1alpha1", "kind": "Project", "metadata": {"name": name}, "spec": {}})
}

#[test]
fn a_second_daemon_on_the_same_data_dir_is_refused() {
    let daemon = Daemon::start();
    let other_socket = daemon.dir.path().join("other.sock");
    let log = daemon.dir.path().join("second.log");
    let mut second = spawn_serve(&daemon.data_dir, &other_socket, &log, &[]);
    let status =
        wait_with_deadline(&mut second, Duration::from_secs(30)).expect("second daemon exits");
    assert!(!status.success());
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.contains("already using the data directory"), "{text}");
    assert_eq!(daemon.client().get("/healthz").status, 200);
}

#[test]
fn a_second_daemon_on_the_same_socket_is_refused() {
    let daemon = Daemon::start();
    let other = tempfile::tempdir().unwrap();
    let log = other.path().join("second.log");
    let mut second = spawn_serve(&other.path().join("data"), &daemon.socket, &log, &[]);
    let status =
        wait_with_deadline(&mut second, Duration::from_secs(30)).expect("second daemon exits");
    assert!(!status.success());
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.contains("another berth is already serving"), "{text}");
    assert_eq!(daemon.client().get("/healthz").status, 200);
}

#[test]
fn sigterm_exits_cleanly_and_the_store_survives_a_restart() {
    let mut daemon = Daemon::start();
    let created = daemon.client().post_json(PROJECTS, &project("kept")).json();
    // An open watch must not hold up shutdown.
    let mut watch = daemon.client().watch(&format!("{PROJECTS}?watch=true"));
    assert_eq!(watch.next_event().unwrap()["type"], "ADDED");

    let status = daemon.terminate();
    assert!(status.success(), "exit {status}:\n{}", daemon.log_text());
    assert!(watch.next_event().is_none());
    assert!(
        !daemon.socket.exists(),
        "the socket file is removed on exit"
    );

    daemon.restart();
    let after = daemon.client().get(&format!("{PROJECTS}/kept")).json();
    assert_eq!(after, created);
    let next = daemon.client().post_json(PROJECTS, &project("next")).json();
    let rv = |v: &serde_json::Value| {
        v["metadata"]["resourceVersion"]
            .as_str()
            .unwrap()
            .parse::<u64>()
            .unwrap()
    };
    assert!(
        rv(&next) > rv(&created),
        "resourceVersion keeps counting after a restart"
    );
}

#[test]
fn a_stale_socket_file_is_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("berth.sock");
    drop(std::os::unix::net::UnixListener::bind(&socket).unwrap());
    assert!(socket.exists());
    let log = dir.path().join("daemon.log");
    let mut child = spawn_serve(&dir.path().join("data"), &socket, &log, &[]);
    let client = support::daemon::Client::new(&socket);
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while client
        .try_request("GET", "/healthz", None, &[])
        .map(|r| r.status)
        .ok()
        != Some(200)
    {
        assert!(
            std::time::Instant::now() < deadline,
            "{}",
            std::fs::read_to_string(&log).unwrap()
        );
        std::thread::sleep(Duration::from_millis(25));
    }
    let _ = child.kill();
    let _ = child.wait();
}

#[test]
fn a_config_typo_is_refused_naming_key_and_file() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("berth.yaml");
    std::fs::write(&config, "listen:\n  sockt: /tmp/x.sock\n").unwrap();
    let log = dir.path().join("daemon.log");
    let mut child = spawn_serve(
        &dir.path().join("data"),
        &dir.path().join("berth.sock"),
        &log,
        &["--config", config.to_str().unwrap()],
    );
    let status = wait_with_deadline(&mut child, Duration::from_secs(30)).expect("exits");
    assert!(!status.success());
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        text.contains("berth.yaml") && text.contains("sockt"),
        "{text}"
    );
}
