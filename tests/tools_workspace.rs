//! The workspace tools endpoint against a real daemon and a real container: every tool's happy
//! path, paths that escape the workspace, cancellation, timeouts, no replay, a daemon crash in
//! the middle of a Bash call, and access.
//!
//! The daemon runs `--paused`, so nothing reconciles the Project; the test creates the
//! project's container itself (named after the project, from `berth-base`, with `/workspace`),
//! which is all the endpoint needs: an instance of that name that runs.

mod support;

use std::path::Path;
use std::time::{Duration, Instant};

use berth::lxd::LxdClient;
use berth::runtime::{ExecRequest, Runtime};
use serde_json::{Value, json};
use support::daemon::{Daemon, TcpClient};
use support::lxd::{BASE, Cleanup, OP_TIMEOUT, client, create, request, unique_name};

const P: &str = "/apis/berth.dev/v1alpha1";

struct Workspace {
    name: String,
    lxd: std::sync::Arc<LxdClient>,
    rt: tokio::runtime::Runtime,
    _cleanup: Cleanup,
}

impl Workspace {
    /// A running `berth-base` container named `name` with an empty `/workspace`.
    fn new(name: &str) -> Workspace {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let lxd = rt.block_on(client());
        let mut cleanup = Cleanup::new();
        cleanup.instance(name);
        rt.block_on(create(&lxd, &request(name, BASE)));
        // On a busy host the start call can outlast its request deadline while the start
        // itself goes on: judge by the instance's state.
        if let Err(err) = rt.block_on(lxd.start_instance(name, OP_TIMEOUT)) {
            assert!(err.is_transient(), "start the container: {err}");
            let until = Instant::now() + OP_TIMEOUT;
            while !rt
                .block_on(lxd.get_instance(name))
                .ok()
                .flatten()
                .is_some_and(|i| i.is_running())
            {
                assert!(Instant::now() < until, "the container did not start: {err}");
                std::thread::sleep(Duration::from_millis(500));
            }
        }
        let ws = Workspace {
            name: name.to_string(),
            lxd,
            rt,
            _cleanup: cleanup,
        };
        ws.sh("mkdir -p /workspace");
        ws
    }

    /// Runs a shell command in the container as the test's own hand (not through berth).
    /// Every command given is idempotent, so one that outlasted its deadline on a busy host is
    /// simply run again.
    fn sh(&self, command: &str) -> String {
        let request = ExecRequest::new(["bash", "-c", command], Duration::from_secs(60));
        let mut attempts = 0;
        let output = loop {
            attempts += 1;
            match self.rt.block_on(self.lxd.exec(&self.name, &request)) {
                Ok(output) => break output,
                Err(err) if err.is_transient() && attempts < 4 => continue,
                Err(err) => panic!("{command}: {err}"),
            }
        };
        assert!(
            output.success(),
            "{command}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout).into_owned()
    }
}

fn project(daemon: &Daemon, name: &str, spec: Value) {
    let reply = daemon.client().post_json(
        &format!("{P}/projects"),
        &json!({"apiVersion": "berth.dev/v1alpha1", "kind": "Project",
                "metadata": {"name": name}, "spec": spec}),
    );
    assert_eq!(reply.status, 201, "{}", reply.text());
}

fn tool(socket: &Path, project: &str, tool: &str, id: &str, args: Value) -> (u16, Value) {
    tool_with(
        socket,
        project,
        tool,
        json!({"executionId": id, "arguments": args}),
    )
}

/// Posts on the daemon's socket with a deadline long enough for a busy LXD host, where one
/// exec can take tens of seconds.
fn tool_with(socket: &Path, project: &str, tool: &str, body: Value) -> (u16, Value) {
    use std::io::{Read as _, Write as _};
    let body = body.to_string();
    let mut stream = std::os::unix::net::UnixStream::connect(socket).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(300)))
        .unwrap();
    write!(
        stream,
        "POST {P}/projects/{project}/tools/{tool} HTTP/1.1\r\nHost: berth\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut reply = Vec::new();
    stream
        .read_to_end(&mut reply)
        .unwrap_or_else(|err| panic!("{tool} {body}: {err}"));
    let reply = String::from_utf8_lossy(&reply);
    let (head, payload) = reply.split_once("\r\n\r\n").expect("an HTTP reply");
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("a status");
    let value = serde_json::from_str(payload)
        .unwrap_or_else(|err| panic!("{tool}: not JSON ({err}): {payload}"));
    (status, value)
}

fn ok(socket: &Path, project: &str, name: &str, id: &str, args: Value) -> Value {
    let (code, body) = tool(socket, project, name, id, args.clone());
    assert_eq!(code, 200, "{name} {args}: {body}");
    body
}

fn wait_for(what: &str, mut check: impl FnMut() -> bool) {
    let until = Instant::now() + Duration::from_secs(60);
    while !check() {
        assert!(Instant::now() < until, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn tools_run_inside_the_workspace_fail_closed_and_never_replay() {
    let name = unique_name();
    let ws = Workspace::new(&name);
    let daemon = Daemon::start_with(&["--listen", "127.0.0.1:0"]);
    project(&daemon, &name, json!({"env": {"GREETING": "hello"}}));
    let c = daemon.client();
    let s = daemon.socket.clone();
    let reply = c.put_json(
        &format!("{P}/projects/{name}/secrets/API_TOKEN"),
        &json!({"value": "s3cr3t-value"}),
    );
    assert_eq!(reply.status, 200, "{}", reply.text());

    // Capabilities.
    let caps = c.get(&format!("{P}/projects/{name}/tools")).json();
    assert_eq!(caps["protocolVersion"], "berth.dev/tools/v1");
    assert_eq!(caps["tools"].as_array().unwrap().len(), 6);

    // Write, Read, Edit, Glob, Grep, Bash.
    let out = ok(
        &s,
        &name,
        "Write",
        "w1",
        json!({"file_path": "src/a.txt", "content": "one\ntwo\nthree\n"}),
    );
    assert!(out["output"].as_str().unwrap().contains("created"), "{out}");
    assert_eq!(ws.sh("cat /workspace/src/a.txt"), "one\ntwo\nthree\n");
    let out = ok(
        &s,
        &name,
        "Read",
        "r1",
        json!({"file_path": "/workspace/src/a.txt", "offset": 2, "limit": 1}),
    );
    assert_eq!(out["output"], "     2\ttwo\n");
    let out = ok(
        &s,
        &name,
        "Edit",
        "e1",
        json!({"file_path": "src/a.txt", "old_string": "two", "new_string": "2"}),
    );
    assert!(
        out["output"].as_str().unwrap().contains("1 occurrence"),
        "{out}"
    );
    assert_eq!(ws.sh("cat /workspace/src/a.txt"), "one\n2\nthree\n");
    let (code, body) = tool(
        &s,
        &name,
        "Edit",
        "e2",
        json!({"file_path": "src/a.txt", "old_string": "e", "new_string": "E"}),
    );
    assert_eq!(
        (code, body["reason"].as_str()),
        (400, Some("BadRequest")),
        "{body}"
    );
    ws.sh("mkdir -p /workspace/.git && echo three > /workspace/.git/config");
    let out = ok(&s, &name, "Glob", "g1", json!({"pattern": "**/*"}));
    assert_eq!(out["output"], "/workspace/src/a.txt\n");
    let out = ok(
        &s,
        &name,
        "Grep",
        "gr1",
        json!({"pattern": "thr+ee", "output_mode": "content"}),
    );
    assert_eq!(out["output"], "/workspace/src/a.txt:3:three\n");
    let out = ok(
        &s,
        &name,
        "Bash",
        "b1",
        json!({"command": "echo $GREETING $API_TOKEN; pwd; exit 3"}),
    );
    assert_eq!(out["output"], "hello s3cr3t-value\n/workspace\n");
    assert_eq!(out["exitCode"], 3);

    // Instruction files at the root only.
    ws.sh("echo agents > /workspace/AGENTS.md && mkdir -p /workspace/sub && echo no > /workspace/sub/CLAUDE.md");
    let files = c
        .get(&format!("{P}/projects/{name}/tools/instructions"))
        .json();
    assert_eq!(
        files["files"],
        json!([{"path": "AGENTS.md", "content": "agents\n"}])
    );

    // Escapes are refused, before anything is read or written.
    ws.sh(
        "ln -sfn / /workspace/root && ln -sfn /etc/passwd /workspace/pw && ln -sfn ../.. /workspace/up",
    );
    let escapes = [
        ("Read", json!({"file_path": "../etc/passwd"})),
        ("Read", json!({"file_path": "/etc/passwd"})),
        ("Read", json!({"file_path": "root/etc/passwd"})),
        ("Read", json!({"file_path": "pw"})),
        ("Write", json!({"file_path": "up/tmp/x", "content": "x"})),
        ("Write", json!({"file_path": "/tmp/x", "content": "x"})),
        (
            "Edit",
            json!({"file_path": "root/etc/hostname", "old_string": "a", "new_string": "b"}),
        ),
        ("Glob", json!({"pattern": "*", "path": "root"})),
        ("Grep", json!({"pattern": "root", "path": "/etc"})),
    ];
    for (i, (name_, args)) in escapes.iter().enumerate() {
        let (code, body) = tool(&s, &name, name_, &format!("x{i}"), args.clone());
        assert_eq!(
            (code, body["reason"].as_str()),
            (403, Some("OutsideWorkspace")),
            "{name_} {args}: {body}"
        );
    }
    assert_eq!(ws.sh("ls /tmp/x 2>/dev/null || echo none"), "none\n");
    // A glob through a link out of the workspace finds nothing outside.
    let out = ok(
        &s,
        &name,
        "Glob",
        "g2",
        json!({"pattern": "root/etc/host*"}),
    );
    assert_eq!(out["output"], "");

    // Unsupported tools and arguments, a shell mismatch.
    let (code, body) = tool(&s, &name, "WebFetch", "u1", json!({}));
    assert_eq!((code, body["reason"].as_str()), (400, Some("Unsupported")));
    let (code, body) = tool(
        &s,
        &name,
        "Read",
        "u2",
        json!({"file_path": "a", "encoding": "x"}),
    );
    assert_eq!((code, body["reason"].as_str()), (400, Some("Unsupported")));
    let (code, body) = tool_with(
        &s,
        &name,
        "Bash",
        json!({"executionId": "sh1", "arguments": {"command": "touch /workspace/ran"}, "shell": {"name": "bash", "version": "3.2"}}),
    );
    assert_eq!(
        (code, body["reason"].as_str()),
        (412, Some("ShellMismatch")),
        "{body}"
    );
    let (code, _) = tool_with(
        &s,
        &name,
        "Bash",
        json!({"executionId": "sh2", "arguments": {"command": "true"}, "shell": {"name": "bash", "version": "5"}}),
    );
    assert_eq!(code, 200);
    assert_eq!(
        ws.sh("ls /workspace/ran 2>/dev/null || echo none"),
        "none\n"
    );

    // A repeated id returns the recorded outcome without running again (secrets redacted).
    for _ in 0..2 {
        let out = ok(
            &s,
            &name,
            "Bash",
            "once",
            json!({"command": "echo line >> /workspace/log; echo $API_TOKEN"}),
        );
        assert_eq!(out["exitCode"], 0);
    }
    assert_eq!(ws.sh("cat /workspace/log"), "line\n");
    let again = ok(
        &s,
        &name,
        "Bash",
        "once",
        json!({"command": "echo line >> /workspace/log"}),
    );
    assert_eq!(again["output"], "[REDACTED]\n");

    // Cancel before dispatch: the later call answers Cancelled and does not run.
    let reply = c.delete(&format!("{P}/projects/{name}/tools/executions/early"));
    assert_eq!(reply.status, 200, "{}", reply.text());
    let (code, body) = tool(
        &s,
        &name,
        "Bash",
        "early",
        json!({"command": "touch /workspace/early"}),
    );
    assert_eq!((code, body["reason"].as_str()), (409, Some("Cancelled")));
    assert_eq!(
        ws.sh("ls /workspace/early 2>/dev/null || echo none"),
        "none\n"
    );

    // Cancel during a long Bash: the answer is Cancelled and its process group is gone.
    let long = {
        let s = s.clone();
        let name = name.clone();
        std::thread::spawn(move || {
            tool(
                &s,
                &name,
                "Bash",
                "long",
                json!({"command": "sleep 301 & sleep 302; echo done"}),
            )
        })
    };
    wait_for("the long command to start", || {
        ws.sh("pgrep -f 'sleep 30[12]' || true").lines().count() >= 2
    });
    let reply = c.delete(&format!("{P}/projects/{name}/tools/executions/long"));
    assert_eq!(reply.status, 200, "{}", reply.text());
    let (code, body) = long.join().unwrap();
    assert_eq!(
        (code, body["reason"].as_str()),
        (409, Some("Cancelled")),
        "{body}"
    );
    wait_for("the process group to be gone", || {
        ws.sh("pgrep -f 'sleep 30[12]' || true").is_empty()
    });

    // A timeout kills what the command started.
    let (code, body) = tool_with(
        &s,
        &name,
        "Bash",
        json!({"executionId": "slow", "timeoutMs": 1500, "arguments": {"command": "sleep 303"}}),
    );
    assert_eq!(
        (code, body["reason"].as_str()),
        (408, Some("Timeout")),
        "{body}"
    );
    wait_for("the timed-out command to be killed", || {
        ws.sh("pgrep -f 'sleep 30[3]' || true").is_empty()
    });

    // A caller that goes away cancels its call: what it started is killed.
    {
        use std::io::Write as _;
        let body =
            json!({"executionId": "gone", "arguments": {"command": "sleep 305"}}).to_string();
        let mut stream = std::os::unix::net::UnixStream::connect(&daemon.socket).unwrap();
        write!(
            stream,
            "POST {P}/projects/{name}/tools/Bash HTTP/1.1\r\nHost: berth\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        wait_for("the command to start", || {
            !ws.sh("pgrep -f 'sleep 30[5]' || true").is_empty()
        });
        drop(stream);
        wait_for("the abandoned command to be killed", || {
            ws.sh("pgrep -f 'sleep 30[5]' || true").is_empty()
        });
        let (code, body) = tool(&s, &name, "Bash", "gone", json!({"command": "sleep 305"}));
        assert_eq!(
            (code, body["reason"].as_str()),
            (409, Some("Cancelled")),
            "{body}"
        );
    }

    // A link swapped in while the calls run never lets a read out of the workspace.
    ws.sh("echo inside > /workspace/plain; (for i in $(seq 400); do ln -sfn /etc/shadow /workspace/flip; cp /workspace/plain /workspace/flip.new; mv -f /workspace/flip.new /workspace/flip; done) >/dev/null 2>&1 &");
    for i in 0..8 {
        let (code, body) = tool(
            &s,
            &name,
            "Read",
            &format!("flip{i}"),
            json!({"file_path": "flip"}),
        );
        match code {
            200 => assert_eq!(body["output"], "     1\tinside\n", "{body}"),
            403 | 404 => {}
            _ => panic!("flip: {code} {body}"),
        }
        assert!(!body.to_string().contains("root:"), "{body}");
    }

    // The CLI runs a tool and exits with the command's code.
    let cli = std::process::Command::new(env!("CARGO_BIN_EXE_berth"))
        .args([
            "tool",
            &name,
            "Bash",
            "--args",
            r#"{"command": "echo from-cli; exit 4"}"#,
        ])
        .env("BERTH_SERVER", &daemon.socket)
        .env_remove("BERTH_TOKEN")
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&cli.stdout), "from-cli\n");
    assert_eq!(
        cli.status.code(),
        Some(4),
        "{}",
        String::from_utf8_lossy(&cli.stderr)
    );

    // A project without a container is unreachable; nothing falls back.
    let other = unique_name();
    project(&daemon, &other, json!({}));
    let (code, body) = tool(&s, &other, "Read", "n1", json!({"file_path": "a"}));
    assert_eq!(
        (code, body["reason"].as_str()),
        (503, Some("Unreachable")),
        "{body}"
    );

    // Members only.
    let outsider = daemon.add_user("otto", false);
    let tcp = TcpClient::new(&daemon.tcp_addr(), Some(&outsider), None);
    let reply = tcp.json(
        "POST",
        &format!("{P}/projects/{name}/tools/Read"),
        &json!({"executionId": "t1", "arguments": {"file_path": "src/a.txt"}}),
    );
    assert_eq!(reply.status, 403, "{}", reply.text());
    let member = daemon.add_user("mia", false);
    let reply = c.request(
        "PUT",
        &format!("{P}/projects/{name}/members/mia"),
        None,
        b"",
    );
    assert!(reply.status < 300, "{}", reply.text());
    let reply = tcp.with_token(Some(&member)).json(
        "POST",
        &format!("{P}/projects/{name}/tools/Read"),
        &json!({"executionId": "t2", "arguments": {"file_path": "src/a.txt"}}),
    );
    assert_eq!(reply.status, 200, "{}", reply.text());
}

#[test]
fn a_bash_call_lost_to_a_daemon_crash_answers_outcome_unknown() {
    let name = unique_name();
    let ws = Workspace::new(&name);
    let mut daemon = Daemon::start();
    project(&daemon, &name, json!({}));
    let c = daemon.client();
    let call = {
        let c = c.clone();
        let name = name.clone();
        std::thread::spawn(move || {
            c.try_request(
                "POST",
                &format!("{P}/projects/{name}/tools/Bash"),
                Some("application/json"),
                json!({"executionId": "lost", "arguments": {"command": "sleep 304"}})
                    .to_string()
                    .as_bytes(),
            )
        })
    };
    wait_for("the command to start", || {
        !ws.sh("pgrep -f 'sleep 30[4]' || true").is_empty()
    });
    daemon.kill();
    assert!(
        call.join().unwrap().is_err(),
        "the call cannot have an answer"
    );
    ws.sh("pkill -f 'sleep 30[4]' || true");
    daemon.restart();
    let s = daemon.socket.clone();
    let (code, body) = tool(&s, &name, "Bash", "lost", json!({"command": "sleep 304"}));
    assert_eq!(
        (code, body["reason"].as_str()),
        (409, Some("REMOTE_MUTATION_OUTCOME_UNKNOWN")),
        "{body}"
    );
}
