//! `berth mcp` driven by a real MCP client (the official Python SDK, installed into
//! `target/test-venv` by `scripts/setup-test-deps`) over stdio, against a real daemon and a real
//! container: the tools and their schemas, every tool's round trip into the remote
//! /workspace (and nothing on this host), containment, the instructions resource, cancelled
//! calls, a daemon killed in the middle of a Bash call, and a project replaced during a session.
//!
//! The daemon runs `--paused`, as in `tools_workspace`: the test makes the project's container
//! itself (named after the project, labelled with its uid), which is all the endpoint needs.

use std::io::{BufRead as _, BufReader, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::support::daemon::Daemon;
use crate::support::lxd::{BASE, Workspace, unique_name};
use crate::support::model_fixture::ModelFixture;
use serde_json::{Value, json};

const P: &str = "/apis/berth.dev/v1alpha1";
/// One answer of the driver: a tool call on a busy LXD host can take tens of seconds.
const ANSWER_DEADLINE: Duration = Duration::from_secs(300);
/// Generous: a command in a container starts or dies within seconds on a busy machine.
const WAIT_DEADLINE: Duration = Duration::from_secs(180);
const TOOLS: [&str; 6] = ["Read", "Glob", "Grep", "Write", "Edit", "Bash"];

/// The Python of the test venv: `BERTH_TEST_PYTHON`, or `target/test-venv/bin/python`.
fn python() -> PathBuf {
    if let Some(path) = std::env::var_os("BERTH_TEST_PYTHON") {
        return PathBuf::from(path);
    }
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/test-venv/bin/python");
    assert!(
        path.exists(),
        "{} is missing: run scripts/setup-test-deps (it installs the MCP Python SDK)",
        path.display()
    );
    path
}

/// The MCP client: `tests/e2e/mcp_driver.py` running `berth --server SOCKET mcp [PROJECT]`.
struct Driver {
    child: Child,
    stdin: ChildStdin,
    lines: mpsc::Receiver<String>,
    stderr: PathBuf,
    _dir: tempfile::TempDir,
}

impl Driver {
    fn start(daemon: &Daemon, project: Option<&str>) -> Driver {
        let dir = tempfile::tempdir().unwrap();
        let stderr = dir.path().join("driver.stderr");
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/e2e/mcp_driver.py");
        let mut command = Command::new(python());
        command
            .arg(script)
            .arg(env!("CARGO_BIN_EXE_berth"))
            .arg("--server")
            .arg(&daemon.socket)
            .arg("mcp");
        if let Some(project) = project {
            command.arg(project);
        }
        let mut child = command
            // The bridge must act on nothing but its flags: no token or server from the host.
            .env_remove("BERTH_SERVER")
            .env_remove("BERTH_TOKEN")
            .env_remove("BERTH_TOKEN_FILE")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&stderr).unwrap())
            .spawn()
            .expect("start the MCP driver");
        let stdin = child.stdin.take().unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Driver {
            child,
            stdin,
            lines,
            stderr,
            _dir: dir,
        }
    }

    fn ask(&mut self, request: Value) -> Value {
        writeln!(self.stdin, "{request}").expect("write to the driver");
        self.stdin.flush().unwrap();
        let line = self
            .lines
            .recv_timeout(ANSWER_DEADLINE)
            .unwrap_or_else(|err| {
                panic!(
                    "no answer to {request} ({err}); driver stderr:\n{}",
                    std::fs::read_to_string(&self.stderr).unwrap_or_default()
                )
            });
        let answer: Value = serde_json::from_str(&line).unwrap();
        assert!(
            answer.get("driverError").is_none(),
            "{request}: {answer}; driver stderr:\n{}",
            std::fs::read_to_string(&self.stderr).unwrap_or_default()
        );
        answer
    }

    fn start_call(&mut self, tag: &str, name: &str, arguments: Value) {
        let answer =
            self.ask(json!({"op": "call", "tag": tag, "name": name, "arguments": arguments}));
        assert_eq!(answer["started"], tag);
    }

    /// Calls a tool and waits for its result: `(isError, text)`.
    fn call(&mut self, name: &str, arguments: Value) -> (bool, String) {
        self.start_call("c", name, arguments);
        let result = self.ask(json!({"op": "wait", "tag": "c"}));
        (
            result["isError"].as_bool().expect("a tool result"),
            result["text"].as_str().unwrap_or_default().to_string(),
        )
    }

    fn ok(&mut self, name: &str, arguments: Value) -> String {
        let (error, text) = self.call(name, arguments.clone());
        assert!(!error, "{name} {arguments}: {text}");
        text
    }

    /// A tool error whose text starts with `reason`.
    fn refused(&mut self, name: &str, arguments: Value, reason: &str) -> String {
        let (error, text) = self.call(name, arguments.clone());
        assert!(
            error,
            "{name} {arguments} should fail with {reason}: {text}"
        );
        assert!(
            text.starts_with(&format!("{reason}: ")),
            "{name} {arguments}: want {reason}, got {text}"
        );
        text
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = writeln!(self.stdin, "{}", json!({"op": "quit"}));
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Creates the project and labels the test's container with its uid; returns the uid.
fn project(daemon: &Daemon, name: &str) -> String {
    let reply = daemon.client().post_json(
        &format!("{P}/projects"),
        &json!({"apiVersion": "berth.dev/v1alpha1", "kind": "Project",
                "metadata": {"name": name}, "spec": {}}),
    );
    assert_eq!(reply.status, 201, "{}", reply.text());
    let uid = crate::harness::uid_of(&reply.json());
    crate::harness::lxc(&["config", "set", name, "user.berth.uid", &uid])
        .unwrap_or_else(|e| panic!("label {name}: {e}"));
    uid
}

fn property_names(schema: &Value) -> Vec<String> {
    let mut names: Vec<String> = schema["properties"]
        .as_object()
        .expect("a schema with properties")
        .keys()
        .cloned()
        .collect();
    names.sort();
    names
}

#[test]
fn an_mcp_client_runs_every_tool_in_the_remote_workspace_and_nowhere_else() {
    let name = unique_name();
    let ws = Workspace::new(&name, BASE);
    let daemon = Daemon::start();
    project(&daemon, &name);
    let mut mcp = Driver::start(&daemon, Some(&name));

    // The six tools, with the API's arguments (as its capabilities list them), no `project`.
    let capabilities = daemon
        .client()
        .get(&format!("{P}/projects/{name}/tools"))
        .json();
    let tools = mcp.ask(json!({"op": "tools"}))["tools"].clone();
    let listed: Vec<&str> = tools
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(listed, TOOLS);
    for tool in tools.as_array().unwrap() {
        let api = capabilities["tools"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["name"] == tool["name"])
            .unwrap_or_else(|| panic!("{} is not in the API's capabilities", tool["name"]));
        let schema = &tool["inputSchema"];
        assert_eq!(schema["type"], "object");
        assert_eq!(
            property_names(schema),
            property_names(&api["arguments"]),
            "{}",
            tool["name"]
        );
        assert_eq!(
            schema["required"], api["arguments"]["required"],
            "{}",
            tool["name"]
        );
        assert!(
            tool["description"]
                .as_str()
                .is_some_and(|d| d.contains("remote"))
        );
    }

    // Every tool's round trip, landing in the container's /workspace.
    let written = mcp.ok(
        "Write",
        json!({"file_path": "/workspace/notes.txt", "content": "hello\nworld\n"}),
    );
    assert!(written.contains("notes.txt"), "{written}");
    assert_eq!(ws.sh("cat /workspace/notes.txt"), "hello\nworld\n");
    let read = mcp.ok("Read", json!({"file_path": "notes.txt"}));
    assert!(read.contains("hello") && read.contains("world"), "{read}");
    let edited = mcp.ok(
        "Edit",
        json!({"file_path": "notes.txt", "old_string": "world", "new_string": "berth"}),
    );
    assert!(edited.contains("replaced 1"), "{edited}");
    assert_eq!(ws.sh("cat /workspace/notes.txt"), "hello\nberth\n");
    let globbed = mcp.ok("Glob", json!({"pattern": "*.txt"}));
    assert!(globbed.contains("/workspace/notes.txt"), "{globbed}");
    let grepped = mcp.ok(
        "Grep",
        json!({"pattern": "ber+th", "output_mode": "content"}),
    );
    assert!(grepped.contains("berth"), "{grepped}");

    // Bash runs in the container, not on this host, and reports progress when asked.
    let marker = format!("/tmp/berth-mcp-{name}");
    let answer = mcp.ask(
        json!({"op": "call", "tag": "b", "name": "Bash", "progress": true,
        "arguments": {"command": format!("touch {marker} && hostname && pwd && sleep 3")}}),
    );
    assert_eq!(answer["started"], "b");
    let result = mcp.ask(json!({"op": "wait", "tag": "b"}));
    assert_eq!(result["isError"], false, "{result}");
    let text = result["text"].as_str().unwrap();
    assert!(
        text.contains(&name) && text.contains("/workspace"),
        "{text}"
    );
    assert!(!Path::new(&marker).exists(), "Bash ran on the host");
    assert_eq!(ws.sh(&format!("ls {marker}")).trim(), marker);
    let progress = result["progress"].as_array().unwrap();
    assert!(
        progress
            .iter()
            .any(|m| m.as_str().is_some_and(|m| m.contains("Bash"))),
        "no progress notification: {result}"
    );
    let (error, text) = mcp.call("Bash", json!({"command": "echo out; exit 3"}));
    assert!(
        !error && text.contains("out") && text.ends_with("[exit code 3]"),
        "{text}"
    );

    // Containment: nothing outside /workspace is read or written.
    mcp.refused(
        "Read",
        json!({"file_path": "/etc/passwd"}),
        "OutsideWorkspace",
    );
    mcp.refused(
        "Write",
        json!({"file_path": "../outside.txt", "content": "x"}),
        "OutsideWorkspace",
    );
    assert_eq!(ws.sh("ls /outside.txt 2>/dev/null || echo none"), "none\n");
    mcp.refused(
        "Glob",
        json!({"pattern": "*", "path": "/etc"}),
        "OutsideWorkspace",
    );

    // The root instruction files are the resource; a nested one is not a root entry.
    ws.sh(
        "printf 'Run make test.\\n' > /workspace/AGENTS.md && mkdir -p /workspace/sub \
         && printf 'nested\\n' > /workspace/sub/AGENTS.md",
    );
    let resources = mcp.ask(json!({"op": "resources"}));
    let uri = format!("berth://projects/{name}/instructions");
    assert_eq!(
        resources["resources"][0]["uri"],
        uri.as_str(),
        "{resources}"
    );
    let contents = resources["contents"][&uri].as_array().unwrap().clone();
    assert!(
        contents
            .iter()
            .any(|c| c["text"] == "Run make test.\n"
                && c["uri"] == format!("{uri}/AGENTS.md").as_str()),
        "{resources}"
    );
    assert!(
        !contents.iter().any(|c| c["text"] == "nested\n"),
        "{resources}"
    );

    // A cancelled call cancels the remote execution: what it started is killed.
    mcp.start_call("long", "Bash", json!({"command": "sleep 301"}));
    daemon.wait_until(WAIT_DEADLINE, "the long command to start", || {
        ws.running("sleep 30[1]")
    });
    mcp.ask(json!({"op": "cancel", "tag": "long"}));
    let result = mcp.ask(json!({"op": "wait", "tag": "long"}));
    assert_eq!(result["cancelledLocally"], true, "{result}");
    daemon.wait_until(WAIT_DEADLINE, "the cancelled command to be killed", || {
        !ws.running("sleep 30[1]")
    });

    // A call cancelled as soon as it is made never leaves anything running either.
    mcp.start_call("early", "Bash", json!({"command": "sleep 302"}));
    mcp.ask(json!({"op": "cancel", "tag": "early"}));
    mcp.ask(json!({"op": "wait", "tag": "early"}));
    daemon.wait_until(
        WAIT_DEADLINE,
        "nothing of the early-cancelled call to run",
        || !ws.running("sleep 30[2]"),
    );

    // A call past its timeout is a Timeout error, and what it started is killed.
    let text = mcp.refused(
        "Bash",
        json!({"command": "sleep 304", "timeout": 1500}),
        "Timeout",
    );
    assert!(
        text.contains("Bash") || text.contains("timed out"),
        "{text}"
    );
    daemon.wait_until(WAIT_DEADLINE, "the timed-out command to be killed", || {
        !ws.running("sleep 30[4]")
    });

    // The session still serves calls after cancels.
    assert!(
        mcp.ok("Read", json!({"file_path": "notes.txt"}))
            .contains("berth")
    );
}

#[test]
fn a_daemon_killed_mid_bash_is_outcome_unknown_and_nothing_reruns() {
    let name = unique_name();
    let ws = Workspace::new(&name, BASE);
    let mut daemon = Daemon::start();
    project(&daemon, &name);
    let mut mcp = Driver::start(&daemon, Some(&name));

    mcp.start_call(
        "lost",
        "Bash",
        json!({"command": "echo ran >> /workspace/runs; sleep 303"}),
    );
    daemon.wait_until(WAIT_DEADLINE, "the command to start", || {
        ws.running("sleep 30[3]")
    });
    daemon.kill();
    let result = mcp.ask(json!({"op": "wait", "tag": "lost"}));
    assert_eq!(result["isError"], true, "{result}");
    let text = result["text"].as_str().unwrap();
    assert!(
        text.starts_with("REMOTE_MUTATION_OUTCOME_UNKNOWN: ") && text.contains("not retried"),
        "{text}"
    );
    assert!(
        text.contains("echo ran >> /workspace/runs"),
        "what to inspect: {text}"
    );
    ws.sh("pkill -f 'sleep 30[3]' || true");

    // With the daemon down a call fails closed: an error saying so, nothing run locally.
    let text = mcp.refused(
        "Bash",
        json!({"command": "echo ran >> /workspace/runs"}),
        "Unreachable",
    );
    assert!(text.contains("nothing ran"), "{text}");

    // The restarted daemon serves the same session; the lost call never ran again.
    daemon.restart();
    let runs = mcp.ok("Read", json!({"file_path": "runs"}));
    assert_eq!(runs.matches("ran").count(), 1, "{runs}");
    assert_eq!(ws.sh("cat /workspace/runs"), "ran\n");
}

#[test]
fn a_session_without_a_project_takes_it_per_call_and_refuses_a_replaced_one() {
    let name = unique_name();
    let ws = Workspace::new(&name, BASE);
    let daemon = Daemon::start();
    let first_uid = project(&daemon, &name);
    let mut mcp = Driver::start(&daemon, None);

    let tools = mcp.ask(json!({"op": "tools"}))["tools"].clone();
    for tool in tools.as_array().unwrap() {
        let schema = &tool["inputSchema"];
        assert_eq!(schema["properties"]["project"]["type"], "string", "{tool}");
        assert_eq!(schema["required"][0], "project", "{tool}");
    }
    mcp.refused("Read", json!({"file_path": "a"}), "BadRequest");
    mcp.refused(
        "Read",
        json!({"project": format!("{name}-absent"), "file_path": "a"}),
        "NotFound",
    );
    mcp.ok(
        "Write",
        json!({"project": name, "file_path": "a.txt", "content": "first\n"}),
    );
    let resources = mcp.ask(json!({"op": "resources"}));
    assert!(
        resources["resources"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["uri"] == format!("berth://projects/{name}/instructions").as_str()),
        "{resources}"
    );

    // Deleted and created again under the same name: another project, refused, nothing runs.
    let reply = daemon.client().delete(&format!("{P}/projects/{name}"));
    assert_eq!(reply.status, 200, "{}", reply.text());
    daemon.wait_until(WAIT_DEADLINE, "the project to be gone", || {
        daemon.client().get(&format!("{P}/projects/{name}")).status == 404
    });
    let second_uid = project(&daemon, &name);
    assert_ne!(first_uid, second_uid);
    let text = mcp.refused(
        "Write",
        json!({"project": name, "file_path": "a.txt", "content": "second\n"}),
        "ProjectReplaced",
    );
    assert!(text.contains("new session"), "{text}");
    assert_eq!(ws.sh("cat /workspace/a.txt"), "first\n");
    mcp.refused(
        "Bash",
        json!({"project": name, "command": "touch /workspace/swapped"}),
        "ProjectReplaced",
    );
    assert_eq!(
        ws.sh("ls /workspace/swapped 2>/dev/null || echo none"),
        "none\n"
    );

    // A new session resolves the new project.
    drop(mcp);
    let mut fresh = Driver::start(&daemon, Some(&name));
    assert_eq!(
        fresh
            .ok("Read", json!({"file_path": "a.txt"}))
            .matches("first")
            .count(),
        1
    );
}

/// The Claude Code CLI: `BERTH_TEST_CLAUDE`, or the pinned one `scripts/setup-test-deps`
/// installs under `target/test-node`.
fn claude() -> PathBuf {
    if let Some(path) = std::env::var_os("BERTH_TEST_CLAUDE") {
        return PathBuf::from(path);
    }
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/test-node/node_modules/.bin/claude");
    assert!(
        path.exists(),
        "{} is missing: run scripts/setup-test-deps (it installs Claude Code)",
        path.display()
    );
    path
}

#[test]
fn claude_code_on_this_host_works_a_brief_whose_edits_land_only_in_the_remote_workspace() {
    let name = unique_name();
    let ws = Workspace::new(&name, BASE);
    let daemon = Daemon::start();
    project(&daemon, &name);
    ws.sh("printf 'Keep notes in notes/.\\n' > /workspace/AGENTS.md");

    // The model's side of the brief: write a file, edit it, run a command on it, report.
    let dir = tempfile::tempdir().unwrap();
    let fixture = ModelFixture::play(
        dir.path(),
        &json!({"steps": [
            {"tool": "mcp__berth__Write",
             "input": {"file_path": "/workspace/notes/hello.txt", "content": "hello from the model\n"}},
            {"tool": "mcp__berth__Edit",
             "input": {"file_path": "notes/hello.txt", "old_string": "model", "new_string": "fixture"}},
            {"tool": "mcp__berth__Bash",
             "input": {"command": "cp notes/hello.txt notes/copy.txt && hostname && pwd",
                       "description": "copy the note"}},
            {"text": "Wrote, edited and copied the note."}
        ]}),
    );

    // Claude Code runs here, on the host, in an empty directory with its own home, its own
    // tools switched off and berth's bridge as its only MCP server.
    let home = dir.path().join("home");
    let cwd = dir.path().join("cwd");
    std::fs::create_dir_all(&home).unwrap();
    std::fs::create_dir_all(&cwd).unwrap();
    let config = json!({"mcpServers": {"berth": {
        "type": "stdio",
        "command": env!("CARGO_BIN_EXE_berth"),
        "args": ["--server", daemon.socket, "mcp", name],
    }}});
    let config_path = dir.path().join("mcp.json");
    std::fs::write(&config_path, config.to_string()).unwrap();
    let output = Command::new(claude())
        .current_dir(&cwd)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", &home)
        .env("CLAUDE_CONFIG_DIR", home.join(".claude"))
        .env(
            "ANTHROPIC_BASE_URL",
            format!("http://127.0.0.1:{}", fixture.model_port),
        )
        .env("ANTHROPIC_API_KEY", "fixture")
        .env("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1")
        .env("DISABLE_AUTOUPDATER", "1")
        .env("DISABLE_TELEMETRY", "1")
        .env("DISABLE_ERROR_REPORTING", "1")
        .env("MCP_TIMEOUT", "120000")
        .env("MCP_TOOL_TIMEOUT", "300000")
        .args([
            "--print",
            "--output-format",
            "json",
            "--no-session-persistence",
        ])
        .arg("--strict-mcp-config")
        .arg("--mcp-config")
        .arg(&config_path)
        .args(["--tools", "", "--allowedTools", "mcp__berth", "--"])
        .arg("Write a note in notes/hello.txt, fix its wording, and copy it to notes/copy.txt.")
        .stdin(Stdio::null())
        .output()
        .expect("run claude");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "claude: {}\n{stdout}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    let result: Value = serde_json::from_str(stdout.trim()).expect("claude's JSON result");
    assert_eq!(result["is_error"], false, "{result}");
    assert_eq!(
        result["result"], "Wrote, edited and copied the note.",
        "{result}"
    );

    // The edits are in the remote /workspace ...
    assert_eq!(
        ws.sh("cat /workspace/notes/hello.txt"),
        "hello from the fixture\n"
    );
    assert_eq!(
        ws.sh("cat /workspace/notes/copy.txt"),
        "hello from the fixture\n"
    );
    // ... and nowhere on this host.
    let left: Vec<_> = std::fs::read_dir(&cwd).unwrap().collect();
    assert!(left.is_empty(), "files appeared on the host: {left:?}");
    assert!(!Path::new("/workspace/notes/hello.txt").exists());

    // The model was offered berth's tools and none of Claude Code's own, and every tool
    // result it got back came from the container.
    let requests = fixture.requests();
    let looped: Vec<&Value> = requests
        .iter()
        .filter(|r| r["tools"].as_array().is_some_and(|t| !t.is_empty()))
        .collect();
    assert!(looped.len() >= 4, "{requests:?}");
    for request in &looped {
        let offered: Vec<&str> = request["tools"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t.as_str().unwrap())
            .collect();
        for tool in TOOLS {
            assert!(
                offered.contains(&format!("mcp__berth__{tool}").as_str()),
                "{tool} not offered: {offered:?}"
            );
        }
        // Claude Code's own tools are off (its placeholder for tools it loads lazily is no tool).
        assert!(
            offered
                .iter()
                .all(|t| t.starts_with("mcp__berth__") || *t == "DeferredToolPlaceholder"),
            "tools offered to the model: {offered:?}"
        );
    }
    let results: Vec<String> = looped[looped.len() - 1]["body"]["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| m["content"].as_array())
        .flatten()
        .filter(|block| block["type"] == "tool_result")
        .map(|block| {
            assert_ne!(block["is_error"], true, "{block}");
            block["content"].to_string()
        })
        .collect();
    assert_eq!(results.len(), 3, "{results:?}");
    assert!(
        results[2].contains(&name) && results[2].contains("/workspace"),
        "Bash ran elsewhere: {results:?}"
    );
}
