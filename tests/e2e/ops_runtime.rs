//! Runtime inspection and `berth exec` against a real running project on the Debian image: the
//! figures are live and plausible, `describe` shows them, exec runs in /workspace with the
//! project's environment and secrets and returns the exit code, and only members get either.

use std::time::{Duration, Instant};

use crate::harness::{Berth, PROJECTS};
use crate::support::daemon::Daemon;
use serde_json::{Value, json};

/// Polls the runtime figures until the container runs, answered from inside and has used some
/// CPU time (the cgroup's counter reads 0 for the first moments of a container's life).
fn wait_running(berth: &Berth, name: &str) -> Value {
    let deadline = Instant::now() + crate::harness::READY_DEADLINE;
    loop {
        let reply = berth.client().get(&format!("{PROJECTS}/{name}/runtime"));
        if reply.status == 200 {
            let figures = reply.json();
            if figures["status"] == "Running"
                && figures["os"]["kernel"].is_string()
                && figures["cpu"]["usageSeconds"].as_f64() > Some(0.0)
            {
                return figures;
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
fn a_running_project_shows_live_figures_and_runs_commands() {
    let mut berth = Berth::start(None);
    let name = crate::harness::unique_name();
    // A profile whose install check prints a version, and whose instructions file berth's
    // later steps would write (named relative to /workspace, as profiles usually do):
    // inspection reports both.
    let profile = format!("probe-{:08x}", rand::random::<u32>());
    let created = berth.client().post_json(
        "/apis/berth.dev/v1alpha1/agentprofiles",
        &json!({"apiVersion": "berth.dev/v1alpha1", "kind": "AgentProfile",
                "metadata": {"name": profile},
                "spec": {"home": "/root/.probe", "install": {"check": "bash --version"},
                         "instructions": {"target": "PROBE.md", "content": "probe"},
                         "runner": {"command": ["true"]}}}),
    );
    assert_eq!(created.status, 201, "{}", created.text());
    berth.create_project(
        &name,
        json!({"image": "berth-base", "agent": profile, "env": {"GREETING": "hello from spec"}}),
    );
    // The figures come from LXD and from inside the container, as soon as it runs (agent
    // provisioning need not have finished).
    let figures = wait_running(&berth, &name);
    let at = |path: &str| -> &Value { figures.pointer(path).unwrap_or(&Value::Null) };
    assert_eq!(at("/status"), "Running", "{figures}");
    assert_eq!(at("/container/name"), name.as_str());
    assert_eq!(at("/container/type"), "container");
    assert!(at("/container/pid").as_i64() > Some(0), "{figures}");
    assert!(
        at("/container/imageFingerprint")
            .as_str()
            .is_some_and(|f| f.len() >= 12),
        "{figures}"
    );
    assert!(at("/container/createdAt").is_string(), "{figures}");
    assert!(at("/container/architecture").is_string(), "{figures}");
    assert!(at("/processes").as_i64() > Some(0), "{figures}");
    assert!(at("/cpu/usageSeconds").as_f64() > Some(0.0), "{figures}");
    assert!(at("/memory/usageBytes").as_u64() > Some(0), "{figures}");
    assert!(
        at("/memory/peakBytes").as_u64() >= at("/memory/usageBytes").as_u64(),
        "{figures}"
    );
    assert!(
        at("/network").is_object() && at("/disk").is_object(),
        "{figures}"
    );
    // Each interface carries its MAC and MTU; loopback is the only one here.
    assert_eq!(at("/network/lo/mtu"), 65536, "{figures}");
    assert!(at("/network/lo/mac").is_string(), "{figures}");
    assert!(
        at("/os/distribution")
            .as_str()
            .is_some_and(|d| d.contains("Debian")),
        "{figures}"
    );
    assert!(
        at("/os/kernel").as_str().is_some_and(|k| !k.is_empty()),
        "{figures}"
    );
    assert!(at("/os/cpuCount").as_u64() >= Some(1), "{figures}");
    // The container's own uptime, not the host's: it started moments ago.
    let uptime = at("/os/uptimeSeconds").as_f64().unwrap_or_default();
    assert!(uptime > 0.0 && uptime < 600.0, "{figures}");
    assert_eq!(at("/os/hostname"), name.as_str(), "{figures}");

    let agent = &figures["agents"][0];
    assert_eq!(agent["profile"], profile.as_str(), "{figures}");
    assert_eq!(agent["installed"], true, "{figures}");
    assert!(
        agent["version"]
            .as_str()
            .is_some_and(|v| v.contains("GNU bash")),
        "{figures}"
    );
    assert_eq!(agent["instructions"], "/workspace/PROBE.md", "{figures}");

    // describe shows them, once the Seeded step has written the instructions (the figures
    // above may have been read before it did).
    berth.wait_for(&name, "seeded", |project| {
        project["status"]["seededFiles"]
            .get("/workspace/PROBE.md")
            .is_some()
    });
    let described = berth.cli(&["describe", "project", &name]);
    assert!(described.status.success(), "{described:?}");
    let text = String::from_utf8_lossy(&described.stdout);
    let runtime = text
        .split_once("Runtime:\n")
        .map(|(_, section)| section)
        .unwrap_or_else(|| panic!("no Runtime section:\n{text}"));
    let field = |label: &str| -> String {
        runtime
            .lines()
            .find_map(|l| l.trim_start().strip_prefix(&format!("{label}:")))
            .map(|v| v.trim().to_string())
            .unwrap_or_else(|| panic!("no {label} line in:\n{runtime}"))
    };
    let container = field("Container");
    assert!(container.starts_with("container image "), "{container}");
    assert!(
        container.contains(&format!("pid {}", at("/container/pid"))),
        "{container}"
    );
    assert!(field("Processes").parse::<u32>().is_ok_and(|n| n > 0));
    assert!(field("CPU Time").ends_with('s'));
    let memory = field("Memory");
    assert!(
        memory.contains("(peak ") && memory.contains(", swap "),
        "{memory}"
    );
    assert!(!field("Disk").is_empty());
    assert!(field("Network").contains("lo "), "{runtime}");
    assert!(field("Network").contains("mtu 65536"), "{runtime}");
    let os = field("OS");
    assert!(
        os.contains("Debian") && os.contains("kernel ") && os.contains(&format!("hostname {name}")),
        "{os}"
    );
    assert_eq!(
        field("Agents"),
        format!(
            "{profile}: {}, /workspace/PROBE.md present",
            agent["version"].as_str().unwrap(),
        )
    );

    // exec over the API: /workspace, spec.env, secrets, exit code, both streams.
    let secret = berth.client().put_json(
        &format!("{PROJECTS}/{name}/secrets/API_TOKEN"),
        &json!({"value": "s3cret"}),
    );
    assert!(
        [200, 201].contains(&secret.status),
        "set secret: {}",
        secret.text()
    );
    let reply = berth.client().post_json(
        &format!("{PROJECTS}/{name}/exec"),
        &json!({
            "command": ["sh", "-c", "pwd; echo \"$GREETING\"; echo \"$API_TOKEN\"; echo \"$EXTRA\"; echo oops >&2; exit 3"],
            "environment": {"EXTRA": "from call"},
        }),
    );
    assert_eq!(reply.status, 200, "{}", reply.text());
    let result = reply.json();
    assert_eq!(result["exitCode"], 3, "{result}");
    assert_eq!(
        result["stdout"], "/workspace\nhello from spec\ns3cret\nfrom call\n",
        "{result}"
    );
    assert_eq!(result["stderr"], "oops\n", "{result}");

    // The exec counts as activity, which inspection reports, with files as they are now.
    let wrote = berth.client().post_json(
        &format!("{PROJECTS}/{name}/exec"),
        &json!({"command": ["sh", "-c", "echo probe > PROBE.md && touch .env"]}),
    );
    assert_eq!(wrote.json()["exitCode"], 0, "{}", wrote.text());
    let figures = berth
        .client()
        .get(&format!("{PROJECTS}/{name}/runtime"))
        .json();
    assert_eq!(
        figures["agents"][0]["instructionsPresent"], true,
        "{figures}"
    );
    assert!(figures["credentialsUpdatedAt"].is_string(), "{figures}");
    assert_eq!(figures["lastActivity"]["source"], "exec", "{figures}");
    assert!(figures["lastActivity"]["at"].is_string(), "{figures}");

    // A bad call names its field.
    let bad = berth
        .client()
        .post_json(&format!("{PROJECTS}/{name}/exec"), &json!({"command": []}));
    assert_eq!(bad.status, 422, "{}", bad.text());
    assert!(bad.text().contains("command"), "{}", bad.text());

    // The CLI prints the output and exits with the command's code.
    let out = berth.cli(&[
        "exec",
        &name,
        "--",
        "sh",
        "-c",
        "echo out; echo err >&2; exit 4",
    ]);
    assert_eq!(out.status.code(), Some(4), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "out\n");
    assert_eq!(String::from_utf8_lossy(&out.stderr), "err\n");
    let ok = berth.cli(&["exec", &name, "--", "true"]);
    assert_eq!(ok.status.code(), Some(0), "{ok:?}");

    berth.delete_project(&name);
}

#[test]
fn only_members_inspect_and_exec() {
    let daemon = Daemon::start_with(&["--listen", "127.0.0.1:0"]);
    let name = format!("berth-t-ops-{:08x}", rand::random::<u32>());
    let created = daemon.client().post_json(
        "/apis/berth.dev/v1alpha1/projects",
        &json!({"apiVersion": "berth.dev/v1alpha1", "kind": "Project",
                "metadata": {"name": name}, "spec": {"image": "berth-tiny"}}),
    );
    assert_eq!(created.status, 201, "{}", created.text());
    let token = daemon.add_user("mallory", false);
    let base = format!("http://{}{PROJECTS}/{name}", daemon.tcp_addr());

    // A non-member hears 404, as of a name nobody holds.
    let (code, body) =
        crate::ops::http_request("GET", &format!("{base}/runtime"), Some(&token), None);
    assert_eq!(code, 404, "{body}");
    let (code, body) = crate::ops::http_request(
        "POST",
        &format!("{base}/exec"),
        Some(&token),
        Some(&json!({"command": ["id"]})),
    );
    assert_eq!(code, 404, "{body}");
    let (code, body) = crate::ops::http_request("GET", &format!("{base}/runtime"), None, None);
    assert_eq!(code, 401, "{body}");

    // A member passes the access check; a paused daemon has no LXD to inspect through.
    let member = daemon.client().request(
        "PUT",
        &format!("{PROJECTS}/{name}/members/mallory"),
        None,
        &[],
    );
    assert!([200, 201].contains(&member.status), "{}", member.text());
    let (code, body) =
        crate::ops::http_request("GET", &format!("{base}/runtime"), Some(&token), None);
    assert_eq!(code, 503, "{body}");
    assert!(body.contains("not connected to LXD"), "{body}");
}
