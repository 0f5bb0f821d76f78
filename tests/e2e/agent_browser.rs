//! The `browser` capability and the process limit that keeps a browser (or anything else) from
//! exhausting the host.
//!
//! The pinned Claude Code in `berth-agents`, run by berth's agent adapter against the scripted
//! local model, opens a page served inside its container through the Playwright MCP server berth
//! published to it and takes a screenshot, which lands in /workspace; nothing leaves the
//! container on the way (the refusing proxy counts no connection). An image without the
//! browser sets `CapabilityFailed` naming what it lacks, and the project still starts and its
//! agent still works its brief; a browser dropped from the spec leaves the workspace when
//! Seeded runs again. A fork bomb in a project limited to 200 processes leaves the
//! daemon's API and another project's exec answering, and its project stops.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::harness::{Berth, lxc, ready_reason, unique_name};
use crate::support::model_fixture::ModelFixture;
use serde_json::{Value, json};

/// Ports inside the container that reach the fixture's model and proxy.
const MODEL_PORT: u16 = 18080;
const PROXY_PORT: u16 = 18443;
/// Where the page is served inside the container.
const PAGE_PORT: u16 = 8000;
/// How long anything that should answer at once may take while a fork bomb runs.
const RESPONSIVE: Duration = Duration::from_secs(30);

fn condition(project: &Value, type_: &str) -> Value {
    project["status"]["conditions"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["type"] == type_).cloned())
        .unwrap_or(Value::Null)
}

/// `berth exec NAME -- sh -c SCRIPT`, its stdout.
fn sh(berth: &Berth, name: &str, script: &str) -> String {
    berth.cli_ok(&["exec", name, "--", "sh", "-c", script])
}

/// The first 4 bytes of a file in the container, as `od` prints them.
fn png_magic(berth: &Berth, name: &str, path: &str) -> String {
    sh(berth, name, &format!("od -An -c -N4 {path} | tr -s ' '"))
}

#[test]
fn claude_code_takes_a_screenshot_of_a_page_served_in_its_container() {
    let mut berth = Berth::start_with(&[], &[]);
    let name = unique_name();
    let tag = name[name.len() - 8..].to_string();
    let shot = format!("shot-{tag}.png");
    berth.apply_shipped_profile("claude");

    // The model's side: open the page, screenshot it into /workspace, report.
    let dir = tempfile::tempdir().unwrap();
    let gate = dir.path().join("page-served");
    let page = format!("http://127.0.0.1:{PAGE_PORT}/");
    let fixture = ModelFixture::play_gated(
        dir.path(),
        &json!({"steps": [
            {"tool": "mcp__browser__browser_navigate", "input": {"url": page}},
            {"tool": "mcp__browser__browser_take_screenshot",
             "input": {"filename": shot, "type": "png", "scale": "css"}},
            {"text": "Took the screenshot."}
        ]}),
        &gate,
    );
    let model = format!("http://127.0.0.1:{MODEL_PORT}");
    let proxy = format!("http://127.0.0.1:{PROXY_PORT}");
    berth.create_project(
        &name,
        json!({
            "image": "berth-agents",
            "agent": "claude",
            "capabilities": ["browser"],
            "brief": format!("Open {page} in the browser and save a screenshot as {shot}.\n"),
            "seedFiles": [{"path": "site/index.html",
                           "content": format!("<title>Page {tag}</title><h1>Hello {tag}</h1>\n")}],
            "forwards": [
                {"port": MODEL_PORT, "to": format!("127.0.0.1:{}", fixture.model_port)},
                {"port": PROXY_PORT, "to": format!("127.0.0.1:{}", fixture.proxy_port)},
            ],
            "env": {
                "ANTHROPIC_BASE_URL": model,
                "HTTPS_PROXY": proxy, "HTTP_PROXY": proxy,
                "https_proxy": proxy, "http_proxy": proxy,
                "NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost",
            },
        }),
    );
    berth.set_secret(&name, "ANTHROPIC_API_KEY", "sk-fixture");

    // The page is served inside the container once it is seeded; the model's first step waits
    // for it.
    let seeded = berth.wait_for(&name, "seeded", |p| {
        ["Seeded", "RunnerStarted", "Briefed"].contains(&p["status"]["step"].as_str().unwrap_or(""))
    });
    let published = condition(&seeded, "CapabilityFailed");
    assert_eq!(published["status"], "False", "{published}");
    assert_eq!(published["reason"], "Published", "{published}");
    sh(
        &berth,
        &name,
        &format!(
            "cd /workspace/site && setsid python3 -m http.server {PAGE_PORT} --bind 127.0.0.1 \
             </dev/null >/dev/null 2>&1 &"
        ),
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    let fetch = format!(
        "python3 -c 'import urllib.request; print(urllib.request.urlopen(\"{page}\").read().decode())'"
    );
    while !berth
        .cli(&["exec", &name, "--", "sh", "-c", &fetch])
        .status
        .success()
    {
        assert!(Instant::now() < deadline, "the page is not served");
        std::thread::sleep(Duration::from_millis(250));
    }
    std::fs::write(&gate, b"").unwrap();

    let done = berth.wait_for(&name, "done with its brief", |p| {
        p["status"]["agent"]["state"] == "done"
    });
    assert_eq!(
        ready_reason(&done).map(|(s, _)| s).as_deref(),
        Some("True"),
        "{}",
        done["status"]
    );

    // The MCP server was offered to Claude Code, both calls ran without error or permission,
    // and the browser rendered the served page.
    let requests = fixture.requests();
    // Claude Code offers MCP tools in full or defers them behind its ToolSearch tool, naming
    // them in the request either way.
    let offered = requests
        .iter()
        .find(|r| r["tools"].as_array().is_some_and(|t| !t.is_empty()))
        .expect("a request offering tools");
    for tool in [
        "mcp__browser__browser_navigate",
        "mcp__browser__browser_take_screenshot",
    ] {
        assert!(
            offered["body"].to_string().contains(tool),
            "{tool} not offered: {}",
            offered["tools"]
        );
    }
    let last = requests
        .iter()
        .rev()
        .find(|r| r["tools"].as_array().is_some_and(|t| !t.is_empty()))
        .unwrap();
    let results: Vec<&Value> = last["body"]["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| m["content"].as_array())
        .flatten()
        .filter(|b| b["type"] == "tool_result")
        .collect();
    assert_eq!(results.len(), 2, "{}", last["body"]["messages"]);
    for result in &results {
        assert_ne!(result["is_error"], true, "{result}");
    }
    assert!(
        results[0].to_string().contains(&page)
            && results[0].to_string().contains(&format!("Page {tag}")),
        "the navigation did not reach the page: {}",
        results[0]
    );
    assert!(
        results[1].to_string().contains(&shot),
        "the screenshot went elsewhere: {}",
        results[1]
    );
    let rendered = sh(
        &berth,
        &name,
        &format!("grep -rl 'Hello {tag}' /workspace/.berth/browser/output/ | head -1"),
    );
    assert!(
        rendered.contains("/workspace/.berth/browser/output/"),
        "the page's snapshot is not in the output directory"
    );

    // The screenshot is a PNG in /workspace.
    assert_eq!(
        png_magic(&berth, &name, &format!("/workspace/{shot}")).trim(),
        "211 P N G"
    );
    // The script that needs no MCP takes one too.
    let cli_shot = sh(
        &berth,
        &name,
        &format!("/workspace/.berth/bin/berth-screenshot {page} /workspace/cli-{tag}.png 640x480"),
    );
    assert_eq!(cli_shot.trim(), format!("/workspace/cli-{tag}.png"));
    assert_eq!(
        png_magic(&berth, &name, &format!("/workspace/cli-{tag}.png")).trim(),
        "211 P N G"
    );
    // Nothing tried to leave the container: not Claude Code, not Chromium.
    assert_eq!(
        fixture.stats()["proxyConnections"],
        0,
        "{}",
        fixture.stats()
    );
    berth.delete_project(&name);
}

#[test]
fn an_image_without_a_browser_says_so_and_the_project_goes_on() {
    let mut berth = Berth::start_with(&[], &[]);
    let name = unique_name();
    berth.apply_shipped_profile("shell");
    berth.create_project(
        &name,
        json!({"image": "berth-base", "agent": "shell", "capabilities": ["browser"],
               "brief": "Look at the landing page\n"}),
    );
    let done = berth.wait_for(&name, "Ready with its brief done", |p| {
        ready_reason(p).is_some_and(|(s, _)| s == "True") && p["status"]["agent"]["state"] == "done"
    });
    let failed = condition(&done, "CapabilityFailed");
    assert_eq!(failed["status"], "True", "{failed}");
    assert_eq!(failed["reason"], "CapabilityUnavailable", "{failed}");
    let message = failed["message"].as_str().unwrap();
    assert!(
        message.starts_with("browser: the image has no playwright-mcp") && !message.contains('\n'),
        "{message}"
    );
    let warnings = berth.events_of(&name, "CapabilityFailed");
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert_eq!(warnings[0]["type"], "Warning");
    // Nothing of the browser was published; the agent worked its brief.
    assert_eq!(
        sh(
            &berth,
            &name,
            "ls /workspace/.berth/mcp.json /workspace/.berth/skills/browser 2>&1 | grep -c 'No such'; \
             grep -c 'Look at the landing page' /run/berth/shell.log"
        ),
        "2\n1\n"
    );
    berth.delete_project(&name);
}

#[test]
fn a_dropped_browser_leaves_the_workspace_when_seeded_again() {
    let mut berth = Berth::start_with(&[], &[]);
    let name = unique_name();
    berth.apply_shipped_profile("shell");
    berth.create_project(
        &name,
        json!({"image": "berth-agents", "agent": "shell", "capabilities": ["browser"],
               "brief": "Look at the landing page\n"}),
    );
    let ready = berth.wait_for(&name, "Ready and Briefed", |p| {
        ready_reason(p).is_some_and(|(s, _)| s == "True") && p["status"]["step"] == "Briefed"
    });
    assert_eq!(condition(&ready, "CapabilityFailed")["status"], "False");
    let published = "test -e /workspace/.berth/mcp.json && echo published || echo gone";
    assert_eq!(sh(&berth, &name, published), "published\n");

    // The capability dropped, and the profile changed so that Seeded runs again.
    let reply = berth.patch_project(&name, json!({"spec": {"capabilities": null}}));
    assert!(reply.status < 300, "{}", reply.text());
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../manifests/agents/shell.yaml");
    let changed = std::fs::read_to_string(path)
        .unwrap()
        .replace("Commit your work;", "Commit your work often;");
    let out = berth.cli_input(&["apply", "-f", "-"], changed.as_bytes());
    assert!(out.status.success(), "{out:?}");
    // Gone, and said so (the event follows the removal).
    crate::support::eventually(
        Duration::from_secs(120),
        "the browser's files removed, in a SkillRemoved event",
        || format!("{:?}", berth.events_of(&name, "SkillRemoved")),
        || {
            let said = berth.events_of(&name, "SkillRemoved").iter().any(|e| {
                e["message"]
                    .as_str()
                    .unwrap_or("")
                    .contains("/workspace/.berth/mcp.json")
            });
            (said && sh(&berth, &name, published) == "gone\n").then_some(())
        },
    );
    berth.delete_project(&name);
}

/// The processes the container runs, as LXD counts them (at its limit nothing inside can fork
/// a `ps`).
fn processes(name: &str) -> i64 {
    lxc(&["query", &format!("/1.0/instances/{name}/state")])
        .ok()
        .and_then(|state| serde_json::from_str::<Value>(&state).ok())
        .and_then(|state| state["processes"].as_i64())
        .unwrap_or(-1)
}

/// Runs `what`, failing when it takes longer than [`RESPONSIVE`]; answers how long it took.
fn within(what: &str, f: impl FnOnce()) -> Duration {
    let started = Instant::now();
    f();
    let took = started.elapsed();
    assert!(took < RESPONSIVE, "{what} took {took:?} while the bomb ran");
    took
}

#[test]
fn a_fork_bomb_under_its_process_limit_leaves_the_daemon_and_others_responsive() {
    let config = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(
        config.path(),
        "defaults: {image: berth-tiny, resources: {processes: 300}}\n",
    )
    .unwrap();
    let mut berth = Berth::start_with(&[], &["--config", config.path().to_str().unwrap()]);
    let bomb = unique_name();
    let other = unique_name();
    berth.create_project(&bomb, json!({"resources": {"processes": 200}}));
    berth.create_project(&other, json!({}));
    berth.wait_ready(&bomb);
    let ready = berth.wait_ready(&other);
    // The fleet default reached the project that gave none, and LXD.
    assert_eq!(ready["spec"]["resources"]["processes"], 300);
    let limit = |name: &str| {
        lxc(&["config", "get", name, "limits.processes"])
            .unwrap_or_default()
            .trim()
            .to_string()
    };
    assert_eq!(limit(&other), "300");
    assert_eq!(limit(&bomb), "200");

    // The bomb, started straight through LXD so that nothing of berth stands between it and
    // the container; the exec stays open while it runs (a finished exec takes what it started
    // with it). Each call leaves a sleeper behind, and the first shell sets it off again every
    // second. A busybox shell whose fork fails exits, the first one too, so on a loaded machine
    // the bomb can die out below its limit: when its exec ended, or its count stopped rising for
    // five seconds, another is set off beside it, until the container holds its limit.
    let set_off = || {
        Command::new("lxc")
            .args(["exec", &bomb, "--"])
            .args([
                "sh",
                "-c",
                "b() { sleep 600 & b | b & }; b; while :; do sleep 1; b; done",
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap()
    };
    let mut running = vec![set_off()];
    let deadline = Instant::now() + Duration::from_secs(120);
    let (mut highest, mut rose_at) = (0, Instant::now());
    loop {
        let count = processes(&bomb);
        if count >= 190 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the bomb never reached its limit: {count} processes, set off {} times",
            running.len()
        );
        if count > highest {
            (highest, rose_at) = (count, Instant::now());
        }
        let ended = running.last_mut().unwrap().try_wait().unwrap().is_some();
        if ended || rose_at.elapsed() > Duration::from_secs(5) {
            running.push(set_off());
            rose_at = Instant::now();
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    eprintln!("the bomb was set off {} times", running.len());

    // While it forks at its limit: the API, readiness and another project's exec answer.
    let mut took = Vec::new();
    for _ in 0..3 {
        took.push(within("listing projects", || {
            berth.cli_ok(&["get", "projects"]);
        }));
        took.push(within("/readyz", || {
            let reply = berth.client().get("/readyz");
            assert_eq!(reply.status, 200, "{}", reply.text());
        }));
        took.push(within("exec in the other project", || {
            assert_eq!(sh(&berth, &other, "echo answered"), "answered\n");
        }));
        let count = processes(&bomb);
        assert!(count <= 200, "{count} processes under a limit of 200");
    }
    eprintln!("answers while the bomb ran: {took:?}");

    // The bomb's project stops.
    let stopping = Instant::now();
    berth.cli_ok(&["stop", &bomb]);
    berth.wait_for(&bomb, "stopped", |p| p["status"]["phase"] == "Stopped");
    eprintln!("stopped in {:?}", stopping.elapsed());
    assert_eq!(
        crate::harness::instance_state(&bomb).as_deref(),
        Some("STOPPED")
    );
    for mut exec in running {
        let _ = exec.kill();
        let _ = exec.wait();
    }
    assert_eq!(sh(&berth, &other, "echo answered"), "answered\n");
    berth.delete_project(&bomb);
    berth.delete_project(&other);
}
