//! Limits that keep one caller from exhausting the daemon for everyone, end to end against a
//! real `berth serve` with a TCP listener: the memory one apply body may cost and the size of
//! the errors it is answered with.

mod support;

use serde_json::Value;
use support::daemon::{Daemon, TcpClient};

const API: &str = "/apis/berth.dev/v1alpha1";

/// The daemon's peak resident memory, from the kernel.
fn peak_rss_bytes(daemon: &Daemon) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{}/status", daemon.pid())).unwrap();
    let kib: u64 = status
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .expect("VmHWM in /proc/PID/status");
    kib * 1024
}

/// `{"kind":"List","items":[{"a":1},...]}` of about `bytes` bytes: every item invalid.
fn junk_list(bytes: usize) -> Vec<u8> {
    let count = bytes / 8;
    let mut body = String::with_capacity(bytes + 64);
    body.push_str(r#"{"apiVersion":"v1","kind":"List","items":["#);
    for i in 0..count {
        if i > 0 {
            body.push(',');
        }
        body.push_str(r#"{"a":1}"#);
    }
    body.push_str("]}");
    body.into_bytes()
}

/// One Project of about `bytes` bytes whose spec holds a list of small objects: a few bytes of
/// text each, far more once decoded.
fn dense_project(bytes: usize) -> Vec<u8> {
    let count = bytes / 8;
    let objects = vec![r#"{"a":1}"#; count].join(",");
    format!(
        r#"{{"apiVersion":"berth.dev/v1alpha1","kind":"Project","metadata":{{"name":"dense"}},"spec":{{"seedFiles":[{objects}]}}}}"#
    )
    .into_bytes()
}

/// The answer to a body the daemon refuses: 413 or 422, small, and naming what was wrong.
fn assert_bounded_refusal(reply: &support::daemon::Reply, what: &str) -> Value {
    assert!(
        matches!(reply.status, 413 | 422),
        "{what}: {}: {}",
        reply.status,
        String::from_utf8_lossy(&reply.body[..reply.body.len().min(2000)])
    );
    assert!(
        reply.body.len() < 16 << 10,
        "{what}: the {} answer is {} bytes",
        reply.status,
        reply.body.len()
    );
    let error = reply.json();
    let causes = error["details"]["causes"].as_array().map_or(0, Vec::len);
    assert!(causes <= 21, "{what}: {causes} causes");
    error
}

#[test]
fn apply_bodies_cost_bounded_memory_and_bounded_errors() {
    let daemon = Daemon::start_with(&["--listen", "127.0.0.1:0"]);
    let token = daemon.add_user("limited", false);
    let tcp = TcpClient::new(&daemon.tcp_addr(), Some(&token), None);
    assert_eq!(tcp.get("/healthz").status, 200);
    let idle = peak_rss_bytes(&daemon);

    // Ten thousand invalid items are admitted one by one; the answer lists the first few
    // problems and how many more there were.
    let reply = tcp.request(
        "POST",
        &format!("{API}/apply"),
        Some("application/json"),
        &junk_list(80_000),
    );
    let error = assert_bounded_refusal(&reply, "10,000 invalid items");
    assert_eq!(reply.status, 422, "{error}");
    let message = error["message"].as_str().unwrap();
    assert!(message.contains(" more"), "{message}");

    // Bodies of 4 and 30 MiB: more items than an apply takes.
    for mib in [4, 30] {
        let reply = tcp.request(
            "POST",
            &format!("{API}/apply"),
            Some("application/json"),
            &junk_list(mib << 20),
        );
        let error = assert_bounded_refusal(&reply, &format!("a {mib} MiB List"));
        assert_eq!(reply.status, 413, "{error}");
        let message = error["message"].as_str().unwrap();
        assert!(message.contains("items"), "{message}");
        assert_eq!(tcp.get("/healthz").status, 200);
    }

    // One object of just under 3 MiB that would decode to hundreds of MiB, alone and as the
    // single item of a List.
    let dense = dense_project(3_000_000);
    let reply = tcp.request(
        "POST",
        &format!("{API}/projects"),
        Some("application/json"),
        &dense,
    );
    assert_bounded_refusal(&reply, "a dense Project");
    let mut list = br#"{"apiVersion":"v1","kind":"List","items":["#.to_vec();
    list.extend_from_slice(&dense);
    list.extend_from_slice(b"]}");
    let reply = tcp.request(
        "POST",
        &format!("{API}/apply"),
        Some("application/json"),
        &list,
    );
    assert_bounded_refusal(&reply, "a List of one dense Project");

    // The daemon still answers, and nothing like the bodies' decoded size was ever held.
    assert_eq!(tcp.get(&format!("{API}/projects")).status, 200);
    let grew = peak_rss_bytes(&daemon).saturating_sub(idle);
    assert!(grew < 256 << 20, "the daemon grew by {} MiB", grew >> 20);
}
