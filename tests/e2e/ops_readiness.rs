//! `/readyz` of a real daemon: 503 with a reason while LXD cannot be reached, 200 once the
//! store, LXD and the controller are all there.

use std::time::{Duration, Instant};

use crate::support::daemon::{Daemon, Reply};

/// Polls `/readyz` until `done` holds for the reply, failing with the last one after `deadline`.
fn wait_readyz(daemon: &Daemon, deadline: Duration, done: impl Fn(&Reply) -> bool) -> Reply {
    daemon.eventually(deadline, "/readyz to answer as expected", || {
        let reply = daemon.client().get("/readyz");
        done(&reply).then_some(reply)
    })
}

#[test]
fn readyz_is_503_with_a_reason_while_lxd_is_unreachable() {
    let dir = tempfile::tempdir().expect("temp dir");
    let missing = dir.path().join("no-lxd-here.socket");
    let config = dir.path().join("berth.yaml");
    std::fs::write(
        &config,
        format!("lxd:\n  endpoint: unix://{}\n", missing.display()),
    )
    .expect("write config");
    let daemon = Daemon::running()
        .args(&["--config", config.to_str().expect("utf-8 path")])
        .start();

    // It stays unready: sample it for a while, as a probe would.
    let until = Instant::now() + Duration::from_secs(8);
    while Instant::now() < until {
        let reply = daemon.client().get("/readyz");
        assert_eq!(reply.status, 503, "ready without LXD: {}", reply.text());
        let text = reply.text();
        assert!(
            text.lines()
                .any(|l| l.starts_with("lxd:") && l.contains("no-lxd-here.socket")),
            "the reason does not name LXD and its endpoint: {text}"
        );
        assert!(text.contains("controller: not started"), "{text}");
        std::thread::sleep(Duration::from_millis(500));
    }
    // Liveness is another matter: the process is fine.
    assert_eq!(daemon.client().get("/healthz").status, 200);
}

#[test]
fn readyz_is_200_when_store_lxd_and_controller_are_up() {
    let daemon = Daemon::running().start();
    let reply = wait_readyz(&daemon, Duration::from_secs(120), |r| r.status == 200);
    assert_eq!(reply.text(), "ok\n");
}

#[test]
fn a_paused_daemon_is_ready_without_lxd() {
    let dir = tempfile::tempdir().expect("temp dir");
    let config = dir.path().join("berth.yaml");
    std::fs::write(
        &config,
        format!(
            "lxd:\n  endpoint: unix://{}\n",
            dir.path().join("absent.socket").display()
        ),
    )
    .expect("write config");
    let daemon = Daemon::start_with(&["--config", config.to_str().expect("utf-8 path")]);
    let reply = wait_readyz(&daemon, Duration::from_secs(30), |r| r.status == 200);
    assert_eq!(reply.text(), "ok\n");
}
