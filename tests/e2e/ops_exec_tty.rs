//! `berth exec -i/-t` against a real running project on the Debian image: piped stdin reaches
//! the command and its exit code comes back, `-t` gives it a pseudo terminal of the local
//! terminal's size, and only members
//! get a session (over the unix socket and over TCP with a token).

use std::io::Write as _;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::harness::{Berth, PROJECTS};
use crate::support::daemon::Daemon;
use serde_json::json;

/// Generous: an exec on a busy 2-core machine answers in well under a second.
const SESSION_DEADLINE: Duration = Duration::from_secs(120);

fn berth_command(server: &str) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_berth"));
    command
        .arg("--server")
        .arg(server)
        .env_remove("BERTH_TOKEN")
        .env_remove("BERTH_SERVER");
    command
}

/// Waits for the child to exit, killing it (and failing) past the deadline.
fn finish(mut child: Child, what: &str) -> Output {
    let until = Instant::now() + SESSION_DEADLINE;
    while child.try_wait().expect("wait on child").is_none() {
        if Instant::now() > until {
            let _ = child.kill();
            let out = child.wait_with_output().expect("child output");
            panic!("{what}: no exit within {SESSION_DEADLINE:?}: {out:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().expect("child output")
}

/// Polls the runtime figures until the container runs and answered from inside.
fn wait_running(berth: &Berth, name: &str) {
    let deadline = Instant::now() + crate::harness::READY_DEADLINE;
    loop {
        let reply = berth.client().get(&format!("{PROJECTS}/{name}/runtime"));
        if reply.status == 200 {
            let figures = reply.json();
            if figures["status"] == "Running" && figures["os"]["kernel"].is_string() {
                return;
            }
        }
        assert!(
            Instant::now() < deadline,
            "{name}: no running container within {:?}; last: {} {}\n{}",
            crate::harness::READY_DEADLINE,
            reply.status,
            reply.text(),
            berth.log_text()
        );
        std::thread::sleep(Duration::from_millis(250));
    }
}

#[test]
fn piped_stdin_and_a_terminal_reach_the_command() {
    // Activity passes every 2s, so an open session is seen counting as activity in moments.
    let config = tempfile::tempdir().expect("config dir");
    let config_file = config.path().join("berth.yaml");
    std::fs::write(&config_file, "scheduler: {interval: 2s}\n").expect("write berth.yaml");
    let mut berth = Berth::start_with(&[], &["--config", &config_file.to_string_lossy()]);
    let name = crate::harness::unique_name();
    berth.create_project(&name, json!({"image": "berth-base"}));
    wait_running(&berth, &name);
    let socket = berth.socket.to_string_lossy().into_owned();

    // -i: stdin without a terminal; the command reads it, and its exit code is berth's.
    let mut child = berth_command(&socket)
        .args(["exec", &name, "-i", "--", "sh", "-c"])
        .arg("read x; echo got:$x; echo to-stderr >&2; exit 5")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn berth exec -i");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(b"hello\n")
        .expect("write stdin");
    let out = finish(child, "exec -i");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("got:hello"),
        "{out:?}\n{}",
        berth.log_text()
    );
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("to-stderr"),
        "{out:?}"
    );
    assert_eq!(out.status.code(), Some(5), "{out:?}");

    // End of piped input is end of file for the command.
    let mut child = berth_command(&socket)
        .args(["exec", &name, "-i", "--", "wc", "-c"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn berth exec -i wc");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(b"12345")
        .expect("write stdin");
    let out = finish(child, "exec -i wc");
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "5", "{out:?}");
    assert_eq!(out.status.code(), Some(0), "{out:?}");

    // -it under a pseudo terminal (script(1) provides one): the command gets a terminal too.
    let berth_bin = env!("CARGO_BIN_EXE_berth");
    // The local terminal's size becomes the remote one's. LXD 5.0 can drop a terminal's last
    // output when the process exits right after writing it (`lxc exec -t` too), so the
    // command lingers a moment before it exits.
    let inner = format!(
        "stty cols 101 rows 33; {berth_bin} --server {socket} exec {name} -it -- sh -c 'tty; stty size; sleep 1; exit 3'"
    );
    let mut child = Command::new("script")
        .args(["-q", "-e", "-c", &inner, "/dev/null"])
        .env_remove("BERTH_TOKEN")
        .env_remove("BERTH_SERVER")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn script");
    // Held open: the session ends with the command, not with our input.
    let held_stdin = child.stdin.take();
    let out = finish(child, "exec -it under script");
    drop(held_stdin);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("/dev/pts/"),
        "{out:?}\n{}",
        berth.log_text()
    );
    assert!(stdout.contains("33 101"), "{out:?}");
    assert_eq!(out.status.code(), Some(3), "{out:?}");

    // A client that goes away hangs up its terminal: the command does not outlive it.
    let mut abandoned = berth_command(&socket)
        .args(["exec", &name, "-t", "--", "sleep", "4242"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn berth exec -t sleep");
    let sleeping = |expected: bool| {
        let deadline = Instant::now() + SESSION_DEADLINE;
        loop {
            let out = berth_command(&socket)
                .args(["exec", &name, "--", "pgrep", "-f", "sleep 4242"])
                .stdin(Stdio::null())
                .output()
                .expect("run pgrep");
            if (out.status.code() == Some(0)) == expected {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "sleep 4242 running: expected {expected}: {out:?}"
            );
            std::thread::sleep(Duration::from_millis(250));
        }
    };
    sleeping(true);
    // The open session is activity at every pass while it stays open, not only when it began
    // (the last exec above ended at `quiet`).
    let quiet = chrono::Utc::now();
    let deadline = Instant::now() + SESSION_DEADLINE;
    loop {
        let project = berth.client().get(&format!("{PROJECTS}/{name}")).json();
        let activity = &project["status"]["activity"];
        let last = activity["lastActiveAt"]
            .as_str()
            .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok());
        if activity["source"] == "exec"
            && last.is_some_and(|t| t > quiet + chrono::Duration::seconds(5))
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "an open exec -t did not count as activity after it began: {activity}"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    abandoned.kill().expect("kill berth exec");
    let _ = abandoned.wait();
    sleeping(false);

    berth.delete_project(&name);
}

#[test]
fn only_members_get_a_session_over_tcp() {
    let daemon = Daemon::start_with(&["--listen", "127.0.0.1:0"]);
    let name = format!("berth-t-tty-{:08x}", rand::random::<u32>());
    let created = daemon.client().post_json(
        PROJECTS,
        &json!({"apiVersion": "berth.dev/v1alpha1", "kind": "Project",
                "metadata": {"name": name}, "spec": {"image": "berth-tiny"}}),
    );
    assert_eq!(created.status, 201, "{}", created.text());
    let token = daemon.add_user("mallory", false);
    let server = format!("http://{}", daemon.tcp_addr());
    let session = |token: &str| {
        let child = berth_command(&server)
            .args(["--token", token, "exec", &name, "-i", "--", "true"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn berth exec");
        finish(child, "exec -i over tcp")
    };

    // A non-member hears what a name nobody holds would get.
    let out = session(&token);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(stderr.contains("NotFound"), "{stderr}");

    let out = session("not-a-token");
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("Unauthorized"),
        "{out:?}"
    );

    // A member passes the access check; a paused daemon has no LXD to run it through.
    let member = daemon.client().request(
        "PUT",
        &format!("{PROJECTS}/{name}/members/mallory"),
        None,
        &[],
    );
    assert!([200, 201].contains(&member.status), "{}", member.text());
    let out = session(&token);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(stderr.contains("not connected to LXD"), "{stderr}");
}
