//! The workspace tools endpoint against a real daemon and a real container: every tool's happy
//! path on a Debian image and a busybox one, paths that escape the workspace, cancellation,
//! timeouts, no replay, a daemon crash in the middle of a Bash call, access, and a call that
//! wakes an idled project and counts as activity.
//!
//! Most tests run the daemon `--paused`, so nothing reconciles the Project; they create the
//! project's container themselves (named after the project, with `/workspace`, labelled with
//! the project's uid), which is all the endpoint needs: the project's instance, running. The wake test runs the controller
//! and scheduler, which bring the project up and idle it.

use std::path::Path;
use std::time::Duration;

use crate::harness::Berth;
use crate::support::daemon::{Daemon, TcpClient};
use crate::support::lxd::{BASE, TINY, Workspace, unique_name};
use serde_json::{Value, json};

const P: &str = "/apis/berth.dev/v1alpha1";
/// Generous: a command in a container starts or dies within seconds on a busy machine.
const WAIT_DEADLINE: Duration = Duration::from_secs(60);

/// Creates the project; a container the test made for it beforehand is then labelled with the
/// project's uid, as berth labels the containers it makes (the endpoint reaches no other).
fn project(daemon: &Daemon, name: &str, spec: Value) {
    let reply = daemon.client().post_json(
        &format!("{P}/projects"),
        &json!({"apiVersion": "berth.dev/v1alpha1", "kind": "Project",
                "metadata": {"name": name}, "spec": spec}),
    );
    assert_eq!(reply.status, 201, "{}", reply.text());
    let uid = crate::harness::uid_of(&reply.json());
    if crate::harness::instance_count(name) == 1 {
        crate::harness::lxc(&["config", "set", name, "user.berth.uid", &uid])
            .unwrap_or_else(|e| panic!("label {name}: {e}"));
    }
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

/// A call that must be refused with `code` and `reason`; its `Status` body.
fn refused(
    socket: &Path,
    project: &str,
    name: &str,
    id: &str,
    args: Value,
    code: u16,
    reason: &str,
) -> Value {
    let (got, body) = tool(socket, project, name, id, args.clone());
    assert_eq!(
        (got, body["reason"].as_str()),
        (code, Some(reason)),
        "{name} {args}: {body}"
    );
    body
}

fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest as _;
    hex::encode(sha2::Sha256::digest(bytes))
}

fn lines(n: usize, f: impl Fn(usize) -> String) -> String {
    (1..=n).map(|i| format!("{}\n", f(i))).collect()
}

/// Glob and Grep as agents write them, the same on every image: braces and `**`, ripgrep
/// syntax (`\d`, `\s`, `\w`, lazy repetitions, a leading `(?i)`), the `glob` filter, the output
/// modes, and the match caps with their note.
fn globs_and_greps(s: &Path, name: &str, ws: &Workspace) {
    ws.sh(
        "mkdir -p /workspace/g/sub /workspace/g/.git && cd /workspace/g && \
         touch one.txt two.rs three.md sub/four.rs .git/five.rs",
    );
    let globs = [
        (
            json!({"pattern": "g/*.{txt,rs}"}),
            "/workspace/g/one.txt\n/workspace/g/two.rs\n",
        ),
        (
            json!({"pattern": "g/**/*.rs"}),
            "/workspace/g/sub/four.rs\n/workspace/g/two.rs\n",
        ),
        (
            json!({"pattern": "**/f?ur.[a-z]s"}),
            "/workspace/g/sub/four.rs\n",
        ),
        (
            json!({"pattern": "*.rs", "path": "g/sub"}),
            "/workspace/g/sub/four.rs\n",
        ),
        (
            json!({"pattern": "../*.md", "path": "g/sub"}),
            "/workspace/g/three.md\n",
        ),
        (
            json!({"pattern": "/workspace/g/one.txt"}),
            "/workspace/g/one.txt\n",
        ),
        (json!({"pattern": "g/*.{py,go}"}), ""),
    ];
    for (i, (args, want)) in globs.iter().enumerate() {
        let out = ok(s, name, "Glob", &format!("glob-{i}"), args.clone());
        assert_eq!(out["output"], *want, "{args}");
    }

    ws.sh(
        "mkdir -p /workspace/re && printf '%s\\n' 'fn main() {' '    let total = 42;' \
         '    // TODO: tidy' '    let s = \"a<b>c<d>\";' '}' > /workspace/re/code.rs && \
         echo 'no digits here' > /workspace/re/notes.txt",
    );
    let code_rs = "/workspace/re/code.rs";
    let greps = [
        (
            json!({"pattern": r"\d+"}),
            format!("{code_rs}:2:    let total = 42;\n"),
        ),
        (
            json!({"pattern": r"fn\s+\w+\("}),
            format!("{code_rs}:1:fn main() {{\n"),
        ),
        (
            json!({"pattern": r"<.*?>c"}),
            format!("{code_rs}:4:    let s = \"a<b>c<d>\";\n"),
        ),
        (
            json!({"pattern": "(?i)todo"}),
            format!("{code_rs}:3:    // TODO: tidy\n"),
        ),
        (
            json!({"pattern": r"[\d]{2};"}),
            format!("{code_rs}:2:    let total = 42;\n"),
        ),
        (
            json!({"pattern": r"\blet\b"}),
            format!("{code_rs}:2:    let total = 42;\n{code_rs}:4:    let s = \"a<b>c<d>\";\n"),
        ),
        (json!({"pattern": "digits", "glob": "*.rs"}), String::new()),
        (
            json!({"pattern": "digits|main", "glob": "{*.txt,re/*.md}"}),
            "/workspace/re/notes.txt:1:no digits here\n".to_string(),
        ),
    ];
    for (i, (args, want)) in greps.iter().enumerate() {
        let mut args = args.clone();
        args["path"] = json!("re");
        args["output_mode"] = json!("content");
        let out = ok(s, name, "Grep", &format!("grep-{i}"), args.clone());
        assert_eq!(out["output"], *want, "{args}");
    }
    let out = ok(
        s,
        name,
        "Grep",
        "grep-files",
        json!({"pattern": r"\w+", "path": "re"}),
    );
    assert_eq!(
        out["output"],
        "/workspace/re/code.rs\n/workspace/re/notes.txt\n"
    );
    let out = ok(
        s,
        name,
        "Grep",
        "grep-count",
        json!({"pattern": "let", "path": "re/code.rs", "output_mode": "count"}),
    );
    assert_eq!(out["output"], "/workspace/re/code.rs:2\n");
    refused(
        s,
        name,
        "Grep",
        "grep-bad",
        json!({"pattern": "a("}),
        400,
        "BadRequest",
    );

    // The caps: 1000 files or lines, then a note that says so.
    ws.sh(
        "mkdir -p /workspace/many && cd /workspace/many && for i in $(seq 1005); do : > f$i.txt; done && \
         seq 1005 > /workspace/numbers.log",
    );
    let out = ok(
        s,
        name,
        "Glob",
        "glob-cap",
        json!({"pattern": "many/*.txt"}),
    );
    let listed: Vec<&str> = out["output"].as_str().unwrap().lines().collect();
    assert_eq!(listed.len(), 1001, "{}", listed.len());
    assert!(
        listed[..1000]
            .iter()
            .all(|l| l.starts_with("/workspace/many/f"))
    );
    assert_eq!(listed[1000], "(results capped at 1000 files)");
    let out = ok(
        s,
        name,
        "Grep",
        "grep-cap",
        json!({"pattern": r"^\d+$", "path": "numbers.log", "output_mode": "content"}),
    );
    let want = lines(1000, |i| format!("/workspace/numbers.log:{i}:{i}"));
    assert_eq!(
        out["output"],
        format!("{want}(results capped at 1000 lines)\n")
    );
    ws.sh("rm -r /workspace/g /workspace/re /workspace/many /workspace/numbers.log");
}

/// A link swapped back and forth while Read, Grep, Write and Edit run never lets a call read
/// or write a file outside the workspace: every answer is checked for the outside file's
/// content, and the outside file for change.
fn links_swapped_mid_call_never_reach_outside(s: &Path, name: &str, ws: &Workspace) {
    let marker = format!("OUTSIDE-{:08x}", rand::random::<u32>());
    ws.sh(&format!(
        "printf '%s\\n' {marker} > /root/outside.txt && echo inside > /workspace/plain && rm -f /workspace/.flip-stop"
    ));
    // A link for as long as one command runs, a regular file for two: both sides common.
    ws.sh(
        "(while [ ! -e /workspace/.flip-stop ]; do cp /workspace/plain /workspace/flip.new; \
         ln -sfn /root/outside.txt /workspace/flip; mv -f /workspace/flip.new /workspace/flip; done) \
         > /dev/null 2>&1 &",
    );
    let calls = (0..30)
        .map(|_| ("Read", json!({"file_path": "flip"})))
        .chain((0..30).map(|_| {
            (
                "Grep",
                json!({"pattern": "inside|OUTSIDE", "path": "flip", "output_mode": "content"}),
            )
        }))
        .chain((0..10).map(|_| {
            (
                "Write",
                json!({"file_path": "flip", "content": "written\n"}),
            )
        }))
        .chain((0..10).map(|_| {
            (
                "Edit",
                json!({"file_path": "flip", "old_string": "inside", "new_string": "edited"}),
            )
        }));
    let (mut read_inside, mut refused) = (0, 0);
    for (i, (tool_name, args)) in calls.enumerate() {
        let (code, body) = tool(s, name, tool_name, &format!("flip{i}"), args);
        assert!(!body.to_string().contains(&marker), "{tool_name}: {body}");
        match (tool_name, code) {
            ("Read", 200) => {
                assert_eq!(body["output"], "     1\tinside\n", "{body}");
                read_inside += 1;
            }
            ("Grep", 200) => {
                let output = body["output"].as_str().unwrap();
                assert!(
                    ["", "/workspace/flip:1:inside\n"].contains(&output),
                    "{body}"
                );
                read_inside += usize::from(!output.is_empty());
            }
            ("Read" | "Grep", 403 | 404) => refused += 1,
            // Caught between the swap's two halves: neither the file nor the link.
            ("Read" | "Grep", 400)
                if body["message"]
                    .as_str()
                    .is_some_and(|m| m.contains("not a regular file")) =>
            {
                refused += 1
            }
            ("Write", 200 | 403 | 404) | ("Edit", 200 | 400 | 403 | 404 | 409) => {}
            _ => panic!("{tool_name} flip: {code} {body}"),
        }
    }
    ws.sh("touch /workspace/.flip-stop");
    assert_eq!(ws.sh("cat /root/outside.txt"), format!("{marker}\n"));
    // Both sides of the swap were met, so the race was really run.
    assert!(
        read_inside > 0 && refused > 0,
        "inside {read_inside}, refused {refused}"
    );
}

#[test]
fn tools_run_inside_the_workspace_fail_closed_and_never_replay() {
    let name = unique_name();
    let ws = Workspace::new(&name, BASE);
    let daemon = Daemon::start_with(&["--listen", "127.0.0.1:0"]);
    project(&daemon, &name, json!({"env": {"GREETING": "hello"}}));
    let c = daemon.client();
    let s = daemon.socket.clone();
    let reply = c.put_json(
        &format!("{P}/projects/{name}/secrets/API_TOKEN"),
        &json!({"value": "s3cr3t-value"}),
    );
    assert_eq!(reply.status, 200, "{}", reply.text());

    // Capabilities: the limits, and what this workspace offers.
    let caps = c.get(&format!("{P}/projects/{name}/tools")).json();
    assert_eq!(caps["protocolVersion"], "berth.dev/tools/v1");
    assert_eq!(caps["tools"].as_array().unwrap().len(), 6);
    assert_eq!(caps["limits"]["maxFileBytes"], 2 << 20, "{caps}");
    assert_eq!(caps["limits"]["maxRequestBytes"], 3 << 20, "{caps}");
    assert_eq!(caps["limits"]["maxMatches"], 1000, "{caps}");
    assert_eq!(caps["workspace"]["grepDialect"], "pcre", "{caps}");
    assert!(
        caps["workspace"]["bash"]
            .as_str()
            .is_some_and(|v| v.starts_with('5')),
        "{caps}"
    );
    assert!(
        caps["tools"]
            .as_array()
            .unwrap()
            .iter()
            .all(|t| t["available"] == true),
        "{caps}"
    );

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
    refused(
        &s,
        &name,
        "Edit",
        "e2",
        json!({"file_path": "src/a.txt", "old_string": "e", "new_string": "E"}),
        400,
        "BadRequest",
    );
    // Every occurrence with replace_all, counted.
    ws.sh("printf 'x = 1\\nx = 2\\ny = x\\n' > /workspace/multi.txt");
    let out = ok(
        &s,
        &name,
        "Edit",
        "e3",
        json!({"file_path": "multi.txt", "old_string": "x", "new_string": "zz", "replace_all": true}),
    );
    assert_eq!(
        out["output"], "replaced 3 occurrence(s) in /workspace/multi.txt",
        "{out}"
    );
    assert_eq!(
        ws.sh("cat /workspace/multi.txt"),
        "zz = 1\nzz = 2\ny = zz\n"
    );
    refused(
        &s,
        &name,
        "Edit",
        "e4",
        json!({"file_path": "multi.txt", "old_string": "absent", "new_string": "b"}),
        400,
        "BadRequest",
    );
    ws.sh("rm /workspace/multi.txt");

    // Content larger than one exec's environment reaches the file whole.
    let big = "0123456789abcde\n".repeat(65536);
    let out = ok(
        &s,
        &name,
        "Write",
        "w2",
        json!({"file_path": "big/one.txt", "content": big}),
    );
    assert_eq!(
        out["output"], "created /workspace/big/one.txt (0 -> 1048576 bytes)\n",
        "{out}"
    );
    assert_eq!(
        ws.sh("wc -c < /workspace/big/one.txt && sha256sum < /workspace/big/one.txt | cut -c1-16"),
        format!("1048576\n{}\n", &sha256_hex(big.as_bytes())[..16])
    );
    let too_big = "x".repeat((2 << 20) + 1);
    let body = refused(
        &s,
        &name,
        "Write",
        "w3",
        json!({"file_path": "big/two.txt", "content": too_big}),
        400,
        "BadRequest",
    );
    assert!(
        body["message"].as_str().unwrap().contains("2 MiB"),
        "{body}"
    );
    ws.sh("rm -r /workspace/big");

    ws.sh("mkdir -p /workspace/.git && echo three > /workspace/.git/config");
    let out = ok(&s, &name, "Glob", "g1", json!({"pattern": "**/*"}));
    assert_eq!(out["output"], "/workspace/src/a.txt\n");
    globs_and_greps(&s, &name, &ws);
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
        ("Glob", json!({"pattern": "../*"})),
        ("Glob", json!({"pattern": "/etc/*"})),
        ("Glob", json!({"pattern": "src/*/../../../*"})),
        ("Glob", json!({"pattern": "root/etc/host*"})),
        ("Grep", json!({"pattern": "root", "path": "/etc"})),
        ("Grep", json!({"pattern": "root", "path": "root/etc"})),
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
    // A glob over the whole workspace does not follow the links out of it.
    let out = ok(&s, &name, "Glob", "g2", json!({"pattern": "**/host*"}));
    assert_eq!(out["output"], "");

    // Unsupported tools and arguments, a shell mismatch.
    refused(&s, &name, "WebFetch", "u1", json!({}), 400, "Unsupported");
    refused(
        &s,
        &name,
        "Read",
        "u2",
        json!({"file_path": "a", "encoding": "x"}),
        400,
        "Unsupported",
    );
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

    // A command that prints far more than the cap runs to its end; each stream is cut
    // inside the container and says so, and its exit code is the command's.
    let out = ok(
        &s,
        &name,
        "Bash",
        "loud",
        json!({"command": "head -c 50000000 /dev/zero | tr '\\0' a; echo done > /workspace/loud; echo warn >&2; exit 5"}),
    );
    assert_eq!(out["exitCode"], 5, "{}", &out["output"].to_string()[..200]);
    let text = out["output"].as_str().unwrap();
    assert!(text.starts_with("aaaa"), "{}", &text[..40]);
    assert!(
        text.contains("[output cut at 262144 bytes; the rest was discarded]"),
        "{}",
        &text[text.len().saturating_sub(300)..]
    );
    assert!(text.len() < 262144 + 200, "{} bytes", text.len());
    assert!(text.ends_with("warn\n"), "{}", &text[text.len() - 100..]);
    assert_eq!(ws.sh("cat /workspace/loud"), "done\n");

    // Cancel before dispatch: the later call answers Cancelled and does not run.
    let reply = c.delete(&format!("{P}/projects/{name}/tools/executions/early"));
    assert_eq!(reply.status, 200, "{}", reply.text());
    refused(
        &s,
        &name,
        "Bash",
        "early",
        json!({"command": "touch /workspace/early"}),
        409,
        "Cancelled",
    );
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
    daemon.wait_until(WAIT_DEADLINE, "the long command to start", || {
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
    daemon.wait_until(WAIT_DEADLINE, "the process group to be gone", || {
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
    daemon.wait_until(WAIT_DEADLINE, "the timed-out command to be killed", || {
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
        daemon.wait_until(WAIT_DEADLINE, "the command to start", || {
            !ws.sh("pgrep -f 'sleep 30[5]' || true").is_empty()
        });
        drop(stream);
        daemon.wait_until(WAIT_DEADLINE, "the abandoned command to be killed", || {
            ws.sh("pgrep -f 'sleep 30[5]' || true").is_empty()
        });
        refused(
            &s,
            &name,
            "Bash",
            "gone",
            json!({"command": "sleep 305"}),
            409,
            "Cancelled",
        );
    }

    links_swapped_mid_call_never_reach_outside(&s, &name, &ws);

    // The CLI runs a tool and exits with the command's code.
    let cli = daemon.cli(&[
        "tool",
        &name,
        "Bash",
        "--args",
        r#"{"command": "echo from-cli; exit 4"}"#,
    ]);
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
    refused(
        &s,
        &other,
        "Read",
        "n1",
        json!({"file_path": "a"}),
        503,
        "Unreachable",
    );

    // Members only.
    let outsider = daemon.add_user("otto", false);
    let tcp = TcpClient::new(&daemon.tcp_addr(), Some(&outsider), None);
    let reply = tcp.json(
        "POST",
        &format!("{P}/projects/{name}/tools/Read"),
        &json!({"executionId": "t1", "arguments": {"file_path": "src/a.txt"}}),
    );
    // A non-member hears 404, as of a name nobody holds.
    assert_eq!(reply.status, 404, "{}", reply.text());
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
    let ws = Workspace::new(&name, BASE);
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
    daemon.wait_until(WAIT_DEADLINE, "the command to start", || {
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
    refused(
        &s,
        &name,
        "Bash",
        "lost",
        json!({"command": "sleep 304"}),
        409,
        "REMOTE_MUTATION_OUTCOME_UNKNOWN",
    );
}

/// The LXD requests the daemon counted, every method and code together.
fn lxd_requests(daemon: &Daemon) -> f64 {
    let reply = daemon.client().get("/metrics");
    assert_eq!(reply.status, 200, "{}", reply.text());
    reply
        .text()
        .lines()
        .filter(|line| line.starts_with("berth_lxd_requests_total{"))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// The tools reach LXD through the daemon's one client: what a tool call asks of LXD is
/// counted in `berth_lxd_requests_total` like the controller's own requests.
#[test]
fn tool_calls_are_counted_among_the_lxd_requests() {
    let name = unique_name();
    let ws = Workspace::new(&name, BASE);
    ws.sh("echo counted > /workspace/counted.txt");
    // Paused: nothing else in the daemon asks LXD anything.
    let daemon = Daemon::start();
    project(&daemon, &name, json!({}));
    let before = lxd_requests(&daemon);
    let s = daemon.socket.clone();
    let body = ok(
        &s,
        &name,
        "Read",
        "count-1",
        json!({"file_path": "/workspace/counted.txt"}),
    );
    assert!(
        body["output"]
            .as_str()
            .unwrap_or_default()
            .contains("counted"),
        "{body}"
    );
    let after = lxd_requests(&daemon);
    // At least the container read and the exec of the Read.
    assert!(
        after >= before + 2.0,
        "berth_lxd_requests_total went from {before} to {after}"
    );
}

#[test]
fn busybox_workspaces_run_every_tool_but_bash_and_say_so() {
    let name = unique_name();
    let ws = Workspace::new(&name, TINY);
    let daemon = Daemon::start();
    project(&daemon, &name, json!({}));
    let c = daemon.client();
    let s = daemon.socket.clone();

    // Capabilities say what this image lacks.
    let caps = c.get(&format!("{P}/projects/{name}/tools")).json();
    assert_eq!(caps["workspace"]["probed"], true, "{caps}");
    assert_eq!(caps["workspace"]["bash"], Value::Null, "{caps}");
    assert_eq!(caps["workspace"]["grepDialect"], "ere", "{caps}");
    for t in caps["tools"].as_array().unwrap() {
        let bash = t["name"] == "Bash";
        assert_eq!(t["available"], !bash, "{t}");
        if bash {
            assert!(
                t["unavailableReason"].as_str().unwrap().contains("no bash"),
                "{t}"
            );
        }
    }

    // The tools that need no bash work as on Debian.
    let out = ok(
        &s,
        &name,
        "Write",
        "w1",
        json!({"file_path": "src/a.txt", "content": "one\ntwo\nthree\n"}),
    );
    assert_eq!(
        out["output"], "created /workspace/src/a.txt (0 -> 14 bytes)\n",
        "{out}"
    );
    let out = ok(
        &s,
        &name,
        "Read",
        "r1",
        json!({"file_path": "src/a.txt", "offset": 2, "limit": 1}),
    );
    assert_eq!(out["output"], "     2\ttwo\n");
    let out = ok(
        &s,
        &name,
        "Edit",
        "e1",
        json!({"file_path": "src/a.txt", "old_string": "t", "new_string": "T", "replace_all": true}),
    );
    assert_eq!(
        out["output"],
        "replaced 2 occurrence(s) in /workspace/src/a.txt"
    );
    assert_eq!(ws.sh("cat /workspace/src/a.txt"), "one\nTwo\nThree\n");
    let out = ok(
        &s,
        &name,
        "Write",
        "w2",
        json!({"file_path": "src/a.txt", "content": "replaced\n"}),
    );
    assert_eq!(
        out["output"], "updated /workspace/src/a.txt (14 -> 9 bytes)\n",
        "{out}"
    );
    globs_and_greps(&s, &name, &ws);

    // Escapes are refused here too.
    ws.sh("ln -sfn / /workspace/root");
    for (i, (tool_name, args)) in [
        ("Read", json!({"file_path": "../etc/passwd"})),
        ("Read", json!({"file_path": "root/etc/passwd"})),
        ("Write", json!({"file_path": "root/tmp/x", "content": "x"})),
        ("Glob", json!({"pattern": "/etc/*"})),
        ("Grep", json!({"pattern": "root", "path": "root/etc"})),
    ]
    .into_iter()
    .enumerate()
    {
        let (code, body) = tool(&s, &name, tool_name, &format!("x{i}"), args.clone());
        assert_eq!(
            (code, body["reason"].as_str()),
            (403, Some("OutsideWorkspace")),
            "{tool_name} {args}: {body}"
        );
    }
    assert_eq!(ws.sh("ls /tmp/x 2>/dev/null || echo none"), "none\n");
    links_swapped_mid_call_never_reach_outside(&s, &name, &ws);

    // A pattern this grep cannot honour is refused, never matched as something else.
    ws.sh("echo 'alpha beta' > /workspace/words.txt");
    for (pattern, reason) in [(r"\p{Greek}", "Unsupported"), ("a(?=l)", "BadRequest")] {
        let (code, body) = tool(
            &s,
            &name,
            "Grep",
            &format!("refused-{reason}"),
            json!({"pattern": pattern, "path": "words.txt"}),
        );
        assert_eq!(
            (code, body["reason"].as_str()),
            (400, Some(reason)),
            "{pattern}: {body}"
        );
    }

    // Bash needs bash: an explicit refusal, and nothing ran.
    let body = refused(
        &s,
        &name,
        "Bash",
        "b1",
        json!({"command": "touch /workspace/ran"}),
        400,
        "Unsupported",
    );
    assert!(
        body["message"].as_str().unwrap().contains("no bash"),
        "{body}"
    );
    let (code, body) = tool_with(
        &s,
        &name,
        "Bash",
        json!({"executionId": "b2", "arguments": {"command": "touch /workspace/ran"},
               "shell": {"name": "bash", "version": "5"}}),
    );
    assert_eq!(
        (code, body["reason"].as_str()),
        (412, Some("ShellMismatch")),
        "{body}"
    );
    assert_eq!(
        ws.sh("ls /workspace/ran 2>/dev/null || echo none"),
        "none\n"
    );

    // Instruction files.
    ws.sh("echo agents > /workspace/AGENTS.md");
    let files = c
        .get(&format!("{P}/projects/{name}/tools/instructions"))
        .json();
    assert_eq!(
        files["files"],
        json!([{"path": "AGENTS.md", "content": "agents\n"}]),
        "{files}"
    );

    // A cancel before dispatch holds on busybox as well.
    let reply = c.delete(&format!("{P}/projects/{name}/tools/executions/early"));
    assert_eq!(reply.status, 200, "{}", reply.text());
    refused(
        &s,
        &name,
        "Write",
        "early",
        json!({"file_path": "early.txt", "content": "x"}),
        409,
        "Cancelled",
    );
    assert_eq!(
        ws.sh("ls /workspace/early.txt 2>/dev/null || echo none"),
        "none\n"
    );
}

/// A daemon whose controller runs and whose scheduler passes every second.
fn running() -> Berth {
    Berth::launch(Daemon::running().config("scheduler: {interval: 1s, workers: 4}\n"))
}

/// Polls until `check` holds for the project and the container's state.
fn wait_with_state(
    berth: &Berth,
    name: &str,
    what: &str,
    check: impl Fn(&Value, Option<&str>) -> bool,
) -> Value {
    berth.wait_for(name, what, |p| {
        check(p, crate::harness::instance_state(name).as_deref())
    })
}

/// Runs `berth tool NAME TOOL --args ARGS [EXTRA...]`.
fn tool_cli(
    berth: &Berth,
    name: &str,
    tool_name: &str,
    args: Value,
    extra: &[&str],
) -> std::process::Output {
    let args = args.to_string();
    berth.cli(&[&["tool", name, tool_name, "--args", &args], extra].concat())
}

fn idled(project: &Value) -> Option<String> {
    project["status"]["reap"]["idledAt"]
        .as_str()
        .map(str::to_string)
}

#[test]
fn a_tool_call_wakes_an_idled_project_and_counts_as_activity() {
    let mut berth = running();
    let name = unique_name();
    berth.create_project(
        &name,
        json!({"image": BASE, "reap": {"idleAfter": "4s", "idleAction": "Stop"}}),
    );
    let project = wait_with_state(&berth, &name, "idled and stopped", |p, state| {
        idled(p).is_some() && state == Some("STOPPED")
    });
    let first_idling = idled(&project);

    // The call wakes it, waits for it and runs, once. (Its trace stays out of /workspace,
    // where a file would count as unsaved work and keep the reaper from idling it again.)
    let command = json!({"command": "echo woke; echo ran >> /root/wake.log"});
    for _ in 0..2 {
        let out = tool_cli(
            &berth,
            &name,
            "Bash",
            command.clone(),
            &["--execution-id", "wake-1"],
        );
        assert_eq!(
            (
                String::from_utf8_lossy(&out.stdout).as_ref(),
                out.status.code()
            ),
            ("woke\n", Some(0)),
            "{}\n{}",
            String::from_utf8_lossy(&out.stderr),
            berth.log_text()
        );
    }
    assert_eq!(
        crate::harness::read_file(&name, "/root/wake.log").as_deref(),
        Ok("ran\n")
    );
    let project = berth.get_project(&name).expect("the project");
    assert!(
        project["metadata"]["annotations"]["berth.dev/wokenAt"].is_string(),
        "{}",
        project["metadata"]
    );
    let events = berth
        .client()
        .get(&format!("{}/{name}/events", crate::harness::PROJECTS))
        .json();
    assert!(
        events["items"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["reason"] == "WakeRequested"),
        "{events}"
    );

    // A call that cannot wait for the start fails closed, and says it woke the project,
    // which then comes up.
    let project = wait_with_state(&berth, &name, "idled again", |p, state| {
        idled(p).is_some_and(|at| Some(&at) != first_idling.as_ref()) && state == Some("STOPPED")
    });
    let second_idling = idled(&project);
    let (code, body) = tool_with(
        &berth.socket,
        &name,
        "Glob",
        json!({"executionId": "wake-2", "timeoutMs": 1, "arguments": {"pattern": "**/*"}}),
    );
    assert_eq!(
        (code, body["reason"].as_str()),
        (503, Some("Unreachable")),
        "{body}"
    );
    let message = body["message"].as_str().unwrap();
    assert!(
        message.contains("woke") && message.contains("starting"),
        "{message}"
    );
    wait_with_state(&berth, &name, "woken by the call that timed out", |p, _| {
        idled(p) != second_idling
    });

    // Kept up from here on; a new spec wakes it too.
    berth.patch_project(&name, json!({"spec": {"reap": {"idleAfter": "1h"}}}));
    wait_with_state(&berth, &name, "running with the new spec", |p, state| {
        idled(p).is_none()
            && state == Some("RUNNING")
            && p["status"]["observedGeneration"] == p["metadata"]["generation"]
            && p["status"]["activity"]["inspectedAt"].is_string()
    });

    // A tool call is activity: the scheduler's next pass records it as such. Two passes
    // first, so the boot is behind the inspection that follows the call.
    berth.wait_passes("activity", 2);
    let called_at = chrono::Utc::now() - chrono::Duration::seconds(1);
    let out = ok(
        &berth.socket,
        &name,
        "Glob",
        "activity-1",
        json!({"pattern": "**/*"}),
    );
    assert_eq!(out["output"], "");
    wait_with_state(&berth, &name, "activity from the tool call", |p, _| {
        let activity = &p["status"]["activity"];
        activity["source"] == "tool"
            && activity["lastActiveAt"]
                .as_str()
                .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
                .is_some_and(|t| t >= called_at)
    });

    // A project stopped by its own spec is not started by a tool call.
    berth.patch_project(&name, json!({"spec": {"state": "Stopped"}}));
    let project = wait_with_state(&berth, &name, "stopped by its spec", |p, state| {
        p["status"]["phase"] == "Stopped" && state == Some("STOPPED")
    });
    let woken_at = project["metadata"]["annotations"]["berth.dev/wokenAt"].clone();
    let body = refused(
        &berth.socket,
        &name,
        "Bash",
        "stopped-1",
        json!({"command": "echo no"}),
        503,
        "Unreachable",
    );
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("project is stopped (spec.state: Stopped)"),
        "{body}"
    );
    let project = berth.get_project(&name).expect("the project");
    assert_eq!(
        project["metadata"]["annotations"]["berth.dev/wokenAt"],
        woken_at
    );
    // Nothing started it for the call: it is (again) stopped. The scheduler may boot it
    // briefly meanwhile, to look into a stopped workspace whose last inspection failed.
    wait_with_state(&berth, &name, "still stopped by its spec", |p, state| {
        p["status"]["phase"] == "Stopped" && state == Some("STOPPED")
    });
}
