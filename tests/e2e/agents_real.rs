//! Real agent CLIs reach Ready: the pinned Claude Code and Codex in the image `berth-agents`, run by
//! berth's agent adapter in a real LXD container, talking to the scripted local model
//! (`support/model_fixture.py`) through host forwards, with every other connection sent to an
//! HTTPS_PROXY that refuses and counts it.
//!
//! One project walks the whole way: Ready only after the CLI acknowledged the brief; the file
//! the scripted Write call makes is in /workspace; the title is the model's answer to the
//! adapter's title request; a real permission request (a Bash call) blocks the project, the
//! reaper refuses it, `berth answer NAME allow` lets it go on and the model gets the tool's
//! result; `berth logs` shows the run; a daemon kill -9 and a container reboot after the brief
//! finished neither start a second runner nor run the brief again; nothing went through the
//! proxy. A second project is interrupted mid-brief (a daemon kill -9 and a reboot while it
//! waits for a permission): the brief is handed over once more, resuming the CLI's session
//! rather than starting over; Codex is interrupted the same way and resumes its thread. A
//! project runs Codex (the shipped `codex` profile: the built-in OpenAI provider, which speaks
//! to the fixture over its Responses WebSocket) through the same walk: its approval request,
//! from a command asking for escalation under Codex's default policy, is what blocks it; after
//! it finished, a wake (stop, start) and a replaced container do not run the brief again either.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::harness::{Berth, PROJECTS, exec, lxc, read_file, ready_reason, unique_name};
use crate::support::model_fixture::{ModelFixture, Script};
use serde_json::{Value, json};

const DEADLINE: Duration = Duration::from_secs(300);
/// Ports inside the container that reach the fixture's model and proxy.
const MODEL_PORT: u16 = 18080;
const PROXY_PORT: u16 = 18443;
const BASH: &str = "git init -q scratch";

fn wait_fixture(fixture: &ModelFixture, what: &str, check: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + DEADLINE;
    loop {
        let stats = fixture.stats();
        if check(&stats) {
            return stats;
        }
        assert!(
            Instant::now() < deadline,
            "the model fixture never saw {what}: {stats}"
        );
        std::thread::sleep(Duration::from_millis(250));
    }
}

fn protected_by(project: &Value) -> Vec<String> {
    project["status"]["reap"]["protectedBy"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

/// From now on the reaper finds the project due (idle at once): only a protection keeps it.
/// Set once the project is Ready, so that it is not idled while it is still being built.
fn reap_when_idle(berth: &Berth, name: &str) {
    berth.patch_project(
        name,
        json!({"spec": {"reap": {"idleAfter": "2s", "idleAction": "Stop", "maxAge": "never"}}}),
    );
}

fn runner_starts(berth: &Berth, name: &str) -> usize {
    let list = berth
        .client()
        .get(&format!("{PROJECTS}/{name}/events"))
        .json();
    list["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| {
            e["message"]
                .as_str()
                .is_some_and(|m| m.starts_with("runner started"))
        })
        .map(|e| e["count"].as_u64().unwrap_or(1) as usize)
        .sum()
}

#[test]
fn claude_code_works_a_brief_blocks_on_a_permission_and_finishes_once() {
    let Setup {
        mut berth,
        fixture,
        name,
        title,
        content,
        _config,
    } = claude_project(json!({}));

    // Host forwards are admin-only and go to loopback or allowedForwardTargets only.
    let refused = berth.client().post_json(
        PROJECTS,
        &json!({"apiVersion": "berth.dev/v1alpha1", "kind": "Project",
                "metadata": {"name": format!("{name}-x")},
                "spec": {"forwards": [{"port": 80, "to": "192.0.2.1:80"}]}}),
    );
    assert_eq!(refused.status, 422, "{}", refused.text());
    assert!(
        refused.text().contains("spec.forwards[0].to")
            && refused.text().contains("allowedForwardTargets"),
        "{}",
        refused.text()
    );

    // Ready only once the CLI acknowledged the brief.
    let brief_id = ready_with_a_session(&berth, &name);
    let acknowledged = berth.wait_for(&name, "acknowledged in the store", |p| {
        p["status"]["briefAcknowledged"].is_string()
    });
    assert_eq!(
        acknowledged["status"]["briefAcknowledged"],
        brief_id.as_str()
    );

    // A real permission request: the Bash call blocks the project.
    blocked_after_the_write(
        &berth,
        &fixture,
        &name,
        &content,
        "blocked on the Bash call",
    );
    // The title is the agent's answer to the adapter's question; the reaper refuses a project
    // whose agent waits for a person.
    titled_and_held(&berth, &name, &title);
    allowed_to_finish(
        &berth,
        &fixture,
        &name,
        &brief_id,
        "the Bash result",
        "the allowed Bash call ran",
    );
    // A crash of the daemon and a reboot of the container after the brief finished: no second
    // runner, no second run of the brief.
    logged_then_rebooted_once(&mut berth, &name, "[tool Write]");
    assert!(
        exec(&name, "test -e /run/berth/runner.pid").is_err(),
        "a runner was started after the boot"
    );
    briefed_once_offline(&fixture);
    berth.delete_project(&name);
}

/// Waits for the project to be Ready with its step Briefed.
fn wait_ready_briefed(berth: &Berth, name: &str, what: &str) -> Value {
    berth.wait_for(name, what, |p| {
        ready_reason(p).is_some_and(|(s, _)| s == "True") && p["status"]["step"] == "Briefed"
    })
}

/// Ready and Briefed, the agent on the brief's id with a session: answers the brief's id. From
/// then on the reaper finds the project due.
fn ready_with_a_session(berth: &Berth, name: &str) -> String {
    let ready = wait_ready_briefed(berth, name, "Ready and Briefed");
    let brief_id = ready["status"]["briefId"].as_str().unwrap().to_string();
    reap_when_idle(berth, name);
    assert_eq!(
        ready["status"]["agent"]["briefId"],
        brief_id.as_str(),
        "{}",
        ready["status"]
    );
    assert!(
        ready["status"]["agent"]["sessionId"]
            .as_str()
            .is_some_and(|s| !s.is_empty()),
        "{}",
        ready["status"]
    );
    brief_id
}

/// The agent blocks on the scripted check, asked once the Write landed and before the check
/// ran: answers the fixture's stats at that point.
fn blocked_after_the_write(
    berth: &Berth,
    fixture: &ModelFixture,
    name: &str,
    content: &str,
    what: &str,
) -> Value {
    let blocked = berth.wait_for(name, what, |p| p["status"]["agent"]["state"] == "blocked");
    let question = blocked["status"]["agent"]["message"].as_str().unwrap();
    assert!(question.contains(BASH), "{question}");
    assert_eq!(
        exec(name, "cat /workspace/hello.txt").unwrap().trim_end(),
        content
    );
    let stats = fixture.stats();
    assert_eq!(stats["briefRequests"], 1, "{stats}");
    assert_eq!(stats["writeResults"], 1, "{stats}");
    assert_eq!(stats["bashResults"], json!([]), "{stats}");
    assert!(exec(name, "test -e /workspace/scratch").is_err());
    stats
}

/// The title is the model's answer, and the reaper holds the blocked project in Ready.
fn titled_and_held(berth: &Berth, name: &str, title: &str) {
    let titled = berth.wait_for(name, "titled", |p| p["status"]["title"].is_string());
    assert_eq!(titled["status"]["title"], title);
    let held = berth.wait_for(name, "held by the reaper", |p| {
        protected_by(p).iter().any(|r| r == "AgentBlocked")
    });
    assert_eq!(held["status"]["phase"], "Ready", "{}", held["status"]);
}

/// `berth answer NAME allow`: the check runs, the model gets its result and the brief is done.
fn allowed_to_finish(
    berth: &Berth,
    fixture: &ModelFixture,
    name: &str,
    brief_id: &str,
    result: &str,
    ran: &str,
) {
    let out = berth.cli(&["answer", name, "allow"]);
    assert!(out.status.success(), "berth answer: {out:?}");
    let stats = wait_fixture(fixture, result, |s| {
        s["bashResults"].as_array().is_some_and(|a| !a.is_empty())
    });
    assert_eq!(stats["bashResults"][0]["isError"], false, "{stats}");
    let done = berth.wait_for(name, "done", |p| p["status"]["agent"]["state"] == "done");
    assert_eq!(done["status"]["agent"]["exitCode"], 0);
    assert_eq!(done["status"]["briefFinished"], brief_id);
    exec(name, "test -d /workspace/scratch/.git").expect(ran);
}

/// A finished brief: `berth logs NAME` shows the run (`tool`, how the CLI logs its tool call,
/// among the rest), one runner started, and after a crash and a reboot the project is Ready
/// again with still that one runner.
fn logged_then_rebooted_once(berth: &mut Berth, name: &str, tool: &str) {
    let out = berth.cli(&["logs", name]);
    assert!(out.status.success(), "berth logs: {out:?}");
    let log = String::from_utf8_lossy(&out.stdout);
    for expected in [
        "acknowledged",
        tool,
        "blocked: allow Bash",
        "answered; working",
        "done",
    ] {
        assert!(
            log.contains(expected),
            "berth logs lacks {expected:?}:\n{log}"
        );
    }
    assert_eq!(runner_starts(berth, name), 1);
    crash_and_reboot(berth, name);
    wait_ready_briefed(berth, name, "Ready again after the boot");
    assert_eq!(runner_starts(berth, name), 1);
}

/// The daemon is killed (-9) and the container reboots while it is down (a running daemon
/// would start it again as soon as it saw it stopped, racing `lxc restart`); the daemon comes
/// back once the container booted again.
fn crash_and_reboot(berth: &mut Berth, name: &str) {
    berth.kill();
    exec(name, "touch /run/berth-before-boot").unwrap();
    lxc(&["restart", name, "--timeout", "30", "--force"]).expect("lxc restart");
    berth.restart();
    let deadline = Instant::now() + DEADLINE;
    while exec(name, "test -e /run/berth-before-boot").is_ok() {
        assert!(Instant::now() < deadline, "{name} did not boot again");
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// The model saw the brief and the title request once each, and nothing went to the proxy.
fn briefed_once_offline(fixture: &ModelFixture) {
    let stats = fixture.stats();
    assert_eq!(stats["briefRequests"], 1, "{stats}");
    assert_eq!(stats["titleRequests"], 1, "{stats}");
    assert_eq!(
        stats["proxyConnections"], 0,
        "a connection left for the internet: {stats}"
    );
}

/// A daemon with a fast scheduler, the fixture, and an agent project with forwards to it.
struct Setup {
    berth: Berth,
    fixture: ModelFixture,
    name: String,
    title: String,
    content: String,
    _config: tempfile::NamedTempFile,
}

/// The CLI a project runs, and how it reaches the fixture.
#[derive(Clone, Copy)]
enum Cli {
    /// The shipped `claude` profile, pointed at the fixture with ANTHROPIC_BASE_URL.
    Claude,
    /// The shipped `codex` profile (the pinned Codex CLI under the adapter's app server, with
    /// Codex's built-in OpenAI provider, which opens a WebSocket), its `openai_base_url`
    /// pointed at the fixture.
    Codex,
    /// The shipped `kimi` profile (Codex with a provider that streams over HTTP), its
    /// provider's base_url pointed at the fixture.
    Kimi,
}

/// `extra` is laid over the project's spec.
fn claude_project(extra: Value) -> Setup {
    agent_project(Cli::Claude, extra)
}

fn agent_project(cli: Cli, extra: Value) -> Setup {
    let config = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(config.path(), "scheduler: {interval: 2s}\n").unwrap();
    let mut berth = Berth::start_with(&[], &["--config", config.path().to_str().unwrap()]);
    let name = unique_name();
    let tag = name[name.len() - 8..].to_string();
    let title = format!("Fixture title {tag}");
    let mark = format!("brief-mark-{tag}");
    let content = format!("written by the agent for {tag}");
    let fixture = ModelFixture::start(&Script {
        title: &title,
        brief_mark: &mark,
        file: "/workspace/hello.txt",
        file_content: &content,
        bash: BASH,
    });
    let model = format!("http://127.0.0.1:{MODEL_PORT}");
    let (agent, secret) = match cli {
        Cli::Claude => {
            berth.apply_shipped_profile("claude");
            ("claude", "ANTHROPIC_API_KEY")
        }
        Cli::Codex => {
            apply_profile_with(
                &berth,
                "codex",
                "model_provider = \"openai\"\n",
                &format!("model_provider = \"openai\"\n        openai_base_url = \"{model}/v1\"\n"),
            );
            ("codex", "OPENAI_API_KEY")
        }
        Cli::Kimi => {
            apply_profile_with(
                &berth,
                "kimi",
                "https://api.moonshot.ai/v1",
                &format!("{model}/v1"),
            );
            ("kimi", "MOONSHOT_API_KEY")
        }
    };
    let proxy = format!("http://127.0.0.1:{PROXY_PORT}");
    let mut spec = json!({
            "image": "berth-agents",
            "agent": agent,
            "brief": format!("{mark}: write hello.txt, then run the check.\n"),
            "forwards": [
                {"port": MODEL_PORT, "to": format!("127.0.0.1:{}", fixture.model_port)},
                {"port": PROXY_PORT, "to": format!("127.0.0.1:{}", fixture.proxy_port)},
            ],
            "env": {
                "HTTPS_PROXY": proxy,
                "HTTP_PROXY": proxy,
                "https_proxy": proxy,
                "http_proxy": proxy,
                "NO_PROXY": "127.0.0.1,localhost",
                "no_proxy": "127.0.0.1,localhost",
            },
    });
    if let Cli::Claude = cli {
        spec["env"]["ANTHROPIC_BASE_URL"] = json!(model);
    }
    for (key, value) in extra.as_object().cloned().unwrap_or_default() {
        spec[key] = value;
    }
    berth.create_project(&name, spec);
    berth.set_secret(&name, secret, "sk-fixture");
    Setup {
        berth,
        fixture,
        name,
        title,
        content,
        _config: config,
    }
}

/// Applies the shipped profile `name` with `from` replaced by `to` (once, and it must occur).
fn apply_profile_with(berth: &Berth, name: &str, from: &str, to: &str) {
    let path =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!("../manifests/agents/{name}.yaml"));
    let text = std::fs::read_to_string(&path).unwrap();
    assert_eq!(
        text.matches(from).count(),
        1,
        "{from} in {}",
        path.display()
    );
    let file = tempfile::Builder::new().suffix(".yaml").tempfile().unwrap();
    std::fs::write(file.path(), text.replace(from, to)).unwrap();
    let out = berth.cli(&["apply", "-f", file.path().to_str().unwrap()]);
    assert!(out.status.success(), "apply {name}: {out:?}");
}

#[test]
fn an_interrupted_brief_resumes_the_cli_session_after_a_crash_and_a_reboot() {
    an_interrupted_brief_resumes(Cli::Claude, "resuming session");
}

#[test]
fn an_interrupted_codex_brief_resumes_its_thread_after_a_crash_and_a_reboot() {
    an_interrupted_brief_resumes(Cli::Kimi, "resuming thread");
}

/// Interrupted while blocked on its permission request (so mid-brief, with the Write done):
/// the daemon dies and the container reboots; the runner started again resumes the CLI's
/// session (`resumed` is how the runner log says so) and the model never sees the brief start
/// over.
fn an_interrupted_brief_resumes(cli: Cli, resumed: &str) {
    let Setup {
        mut berth,
        fixture,
        name,
        content,
        _config,
        ..
    } = agent_project(cli, json!({}));
    let blocked = berth.wait_for(&name, "blocked on the permission request", |p| {
        p["status"]["agent"]["state"] == "blocked"
            && p["status"]["briefAcknowledged"].is_string()
            && p["status"]["agent"]["sessionId"].is_string()
    });
    let session = blocked["status"]["agent"]["sessionId"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(
        read_file(&name, "/workspace/hello.txt").unwrap().trim_end(),
        content
    );
    assert_eq!(runner_starts(&berth, &name), 1);

    // Mid-brief: the daemon dies, the container reboots (the CLI with it).
    crash_and_reboot(&mut berth, &name);

    // The brief is handed over once more, resuming the session: the model never sees the
    // brief start over.
    let deadline = Instant::now() + DEADLINE;
    while runner_starts(&berth, &name) < 2 {
        assert!(
            Instant::now() < deadline,
            "no runner after the boot:\n{}",
            berth.log_text()
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    let deadline = Instant::now() + DEADLINE;
    loop {
        let log = read_file(&name, "/var/log/berth/runner.log").unwrap_or_default();
        if log.contains(&format!("{resumed} {session}")) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no resume in the runner log:\n{log}"
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    wait_ready_briefed(&berth, &name, "Ready again");
    let stats = fixture.stats();
    assert_eq!(stats["briefRequests"], 1, "the brief started over: {stats}");
    assert_eq!(stats["writeResults"], 1, "{stats}");
    assert_eq!(stats["proxyConnections"], 0, "{stats}");
    assert_eq!(runner_starts(&berth, &name), 2);
    berth.delete_project(&name);
}

#[test]
fn codex_works_a_brief_blocks_on_an_approval_and_finishes_once() {
    let Setup {
        mut berth,
        fixture,
        name,
        title,
        content,
        _config,
    } = agent_project(Cli::Codex, json!({}));

    // Ready only once the app server took the brief as a turn.
    let brief_id = ready_with_a_session(&berth, &name);

    // A real approval request: the command asks for escalation, which Codex's default policy
    // (on-request) puts to a person.
    let stats =
        blocked_after_the_write(&berth, &fixture, &name, &content, "blocked on the approval");
    // The built-in provider spoke over its WebSocket, without falling back to HTTP.
    assert!(stats["websocketRequests"].as_u64() > Some(0), "{stats}");
    assert!(
        !stats["paths"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p.as_str().is_some_and(|p| p.ends_with("/responses"))),
        "{stats}"
    );

    titled_and_held(&berth, &name, &title);
    allowed_to_finish(
        &berth,
        &fixture,
        &name,
        &brief_id,
        "the command's result",
        "the approved command ran",
    );
    // A crash of the daemon and a reboot after the brief finished: it is not run again.
    logged_then_rebooted_once(&mut berth, &name, "commandExecution");

    // A wake (stop, then start) and a replaced container: still not run again.
    for args in [&["stop", "--wait"][..], &["start", "--wait"]] {
        let out = berth.cli(&[args, &[name.as_str()]].concat());
        assert!(out.status.success(), "berth {args:?}: {out:?}");
    }
    exec(&name, "touch /etc/berth-before-replace").unwrap();
    let out = berth.cli(&["restart", "--recreate", &name]);
    assert!(out.status.success(), "berth restart --recreate: {out:?}");
    let deadline = Instant::now() + DEADLINE;
    while exec(&name, "test ! -e /etc/berth-before-replace").is_err() {
        assert!(Instant::now() < deadline, "{name} was not replaced");
        std::thread::sleep(Duration::from_millis(250));
    }
    wait_ready_briefed(&berth, &name, "Ready in the replaced container");
    assert_eq!(
        read_file(&name, "/workspace/hello.txt").unwrap().trim_end(),
        content
    );
    assert_eq!(runner_starts(&berth, &name), 1);
    briefed_once_offline(&fixture);
    berth.delete_project(&name);
}
