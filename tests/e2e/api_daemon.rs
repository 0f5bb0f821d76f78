//! The life of a real `berth serve`: one per data directory, clean exit on SIGTERM, state kept
//! across restarts.

use std::time::Duration;

use crate::support::daemon::{Daemon, spawn_serve, wait_with_deadline};
use serde_json::json;

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
fn a_killed_daemon_loses_no_acknowledged_write() {
    let mut daemon = Daemon::start();
    let list = json!({"apiVersion": "v1", "kind": "List",
        "items": (0..50).map(|i| project(&format!("p{i}"))).collect::<Vec<_>>()});
    let applied = daemon
        .client()
        .post_json("/apis/berth.dev/v1alpha1/apply", &list);
    assert_eq!(applied.status, 200, "{}", applied.text());
    let status = daemon
        .client()
        .put_json(
            &format!("{PROJECTS}/p7/status"),
            &json!({"status": {"phase": "Ready"}}),
        )
        .json();
    daemon.kill();
    // The socket file is left behind by a crash; the next daemon replaces it.
    assert!(daemon.socket.exists());
    daemon.restart();
    let listed = daemon.client().get(PROJECTS).json();
    assert_eq!(listed["items"].as_array().unwrap().len(), 50);
    assert_eq!(
        daemon.client().get(&format!("{PROJECTS}/p7")).json(),
        status
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
    let client = crate::support::daemon::Client::new(&socket);
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

/// One request over plain TCP, `Connection: close`; returns the status code and the body.
fn tcp_request(addr: &str, token: &str, method: &str, path: &str, body: &str) -> (u16, String) {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(addr).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: berth\r\nConnection: close\r\nAuthorization: Bearer {token}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut reply = String::new();
    stream.read_to_string(&mut reply).unwrap();
    let status = reply.split_whitespace().nth(1).unwrap().parse().unwrap();
    let body = reply
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (status, body)
}

#[test]
fn loopback_tcp_serves_the_api_but_not_status_writes() {
    let daemon = Daemon::start_with(&["--listen", "127.0.0.1:0"]);
    let addr = daemon.tcp_addr();
    // Even an admin's token does not make a TCP caller the controller.
    let token = daemon.add_user("tcp-admin", true);
    let (status, _) = tcp_request(&addr, "", "GET", "/healthz", "");
    assert_eq!(status, 200);
    let (status, body) = tcp_request(
        &addr,
        &token,
        "POST",
        PROJECTS,
        &project("over-tcp").to_string(),
    );
    assert_eq!(status, 201, "{body}");
    let (status, body) = tcp_request(
        &addr,
        &token,
        "PUT",
        &format!("{PROJECTS}/over-tcp/status"),
        r#"{"status": {"phase": "Ready"}}"#,
    );
    assert_eq!(status, 403, "{body}");
    assert_eq!(
        daemon.client().get(&format!("{PROJECTS}/over-tcp")).status,
        200
    );
}

#[test]
fn a_non_loopback_address_without_tls_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("daemon.log");
    let mut child = spawn_serve(
        &dir.path().join("data"),
        &dir.path().join("berth.sock"),
        &log,
        &["--listen", "0.0.0.0:7480"],
    );
    let status = wait_with_deadline(&mut child, Duration::from_secs(30)).expect("exits");
    assert!(!status.success());
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        text.contains("listen.http") && text.contains("tls"),
        "{text}"
    );
}
