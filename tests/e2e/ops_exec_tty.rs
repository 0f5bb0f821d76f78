//! `berth exec -i/-t` against a real running project on the Debian image: piped stdin reaches
//! the command and its exit code comes back, `-t` gives it a pseudo terminal of the local
//! terminal's size, and only members
//! get a session (over the unix socket and over TCP with a token).

use std::process::{Command, Stdio};
use std::time::Duration;

use crate::harness::{Berth, PROJECTS};
use crate::support::cli::{client, collect};
use crate::support::daemon::Daemon;
use serde_json::json;

/// Generous: an exec on a busy 2-core machine answers in well under a second.
const SESSION_DEADLINE: Duration = Duration::from_secs(120);

/// Polls the runtime figures until the container runs and answered from inside.
fn wait_running(berth: &Berth, name: &str) {
    berth.wait_until(
        crate::harness::READY_DEADLINE,
        &format!("{name}: a running container"),
        || {
            let reply = berth.client().get(&format!("{PROJECTS}/{name}/runtime"));
            reply.status == 200 && {
                let figures = reply.json();
                figures["status"] == "Running" && figures["os"]["kernel"].is_string()
            }
        },
    );
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
    let out = berth.cli_input(
        &[
            "exec",
            &name,
            "-i",
            "--",
            "sh",
            "-c",
            "read x; echo got:$x; echo to-stderr >&2; exit 5",
        ],
        b"hello\n",
    );
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
    let out = berth.cli_input(&["exec", &name, "-i", "--", "wc", "-c"], b"12345");
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
    let out = collect(child, &["exec", "-it", "under script(1)"]);
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
    let mut abandoned = berth
        .command(&["exec", &name, "-t", "--", "sleep", "4242"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn berth exec -t sleep");
    let sleeping = |expected: bool| {
        berth.wait_until(
            SESSION_DEADLINE,
            &format!("sleep 4242 running: {expected}"),
            || {
                let out = berth.cli(&["exec", &name, "--", "pgrep", "-f", "sleep 4242"]);
                (out.status.code() == Some(0)) == expected
            },
        );
    };
    sleeping(true);
    // The open session is activity at every pass while it stays open, not only when it began
    // (the last exec above ended at `quiet`).
    let quiet = chrono::Utc::now();
    berth.wait_until(
        SESSION_DEADLINE,
        "an open exec -t to count as activity after it began",
        || {
            let project = berth.client().get(&format!("{PROJECTS}/{name}")).json();
            let activity = &project["status"]["activity"];
            let last = activity["lastActiveAt"]
                .as_str()
                .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok());
            activity["source"] == "exec"
                && last.is_some_and(|t| t > quiet + chrono::Duration::seconds(5))
        },
    );
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
        let args = [
            "--server", &server, "--token", token, "exec", &name, "-i", "--", "true",
        ];
        collect(client(&args).spawn().expect("spawn berth exec"), &args)
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
