//! A user who names a project after a container berth did not make for it gets no way into
//! that container: every route that reaches into a container (exec, `exec -it`, the workspace
//! tools, `answer`, `logs`, the runtime figures) answers 409 `NameConflict`, and nothing runs
//! in it. Two foreign containers: one with no berth labels (anything else in the LXD project),
//! and one carrying the project's uid but another controller's id (another berth on the same
//! LXD). Real daemon, real LXD, a non-admin user over TCP.

use std::process::Command;
use std::time::{Duration, Instant};

use crate::support::daemon::{Daemon, TcpClient};
use crate::support::lxd;
use berth::runtime::{InstancePatch, Runtime};
use serde_json::{Value, json};

const P: &str = "/apis/berth.dev/v1alpha1";
/// Where a command that reached the container would leave its trace.
const MARKER: &str = "/root/berth-reached";
const DEADLINE: Duration = Duration::from_secs(120);

fn tokio() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime")
}

/// Waits until the project's Ready condition has `reason`.
fn wait_reason(client: &TcpClient, name: &str, reason: &str) -> Value {
    let until = Instant::now() + DEADLINE;
    loop {
        let project = client.get(&format!("{P}/projects/{name}")).json();
        let found = project["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|c| c["type"] == "Ready" && c["reason"] == reason);
        if found {
            return project;
        }
        assert!(
            Instant::now() < until,
            "{name}: no Ready reason {reason} within {DEADLINE:?}: {project}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Every route that reaches into the project's container, as the member: each must answer 409
/// NameConflict. Returns the failures.
fn every_route_refuses(user: &TcpClient, server: &str, token: &str, name: &str) -> Vec<String> {
    let touch = format!("touch {MARKER}");
    let tool = |tool: &str, id: &str, arguments: Value| {
        (
            "POST",
            format!("{P}/projects/{name}/tools/{tool}"),
            json!({"executionId": id, "arguments": arguments}).to_string(),
        )
    };
    let calls: Vec<(&str, String, String)> = vec![
        (
            "POST",
            format!("{P}/projects/{name}/exec"),
            json!({"command": ["sh", "-c", touch]}).to_string(),
        ),
        ("GET", format!("{P}/projects/{name}/runtime"), String::new()),
        (
            "POST",
            format!("{P}/projects/{name}/answer"),
            json!({"text": "yes"}).to_string(),
        ),
        ("GET", format!("{P}/projects/{name}/logs"), String::new()),
        ("GET", format!("{P}/projects/{name}/logs/0"), String::new()),
        ("GET", format!("{P}/projects/{name}/tools"), String::new()),
        (
            "GET",
            format!("{P}/projects/{name}/tools/instructions"),
            String::new(),
        ),
        tool("Bash", "reach-bash", json!({"command": touch})),
        tool(
            "Write",
            "reach-write",
            json!({"file_path": "/workspace/reached", "content": "x"}),
        ),
        tool("Read", "reach-read", json!({"file_path": "/etc/hostname"})),
        tool("Glob", "reach-glob", json!({"pattern": "*"})),
        tool("Grep", "reach-grep", json!({"pattern": "root"})),
        tool(
            "Edit",
            "reach-edit",
            json!({"file_path": "/workspace/a", "old_string": "a", "new_string": "b"}),
        ),
    ];
    let mut failures = Vec::new();
    for (method, path, body) in calls {
        let content_type = (!body.is_empty()).then_some("application/json");
        let reply = user.request(method, &path, content_type, body.as_bytes());
        let answer = serde_json::from_slice::<Value>(&reply.body).unwrap_or(Value::Null);
        if reply.status != 409 || answer["reason"] != "NameConflict" {
            failures.push(format!(
                "{method} {path} answered {}: {}",
                reply.status,
                reply.text()
            ));
        } else if answer["message"]
            .as_str()
            .is_none_or(|m| m.contains('\n') || !m.contains(name))
        {
            failures.push(format!(
                "{method} {path}: not a one-line message naming {name}: {answer}"
            ));
        }
    }
    // `berth exec` plain and with a websocket (-i, and -t), as a person runs it.
    for flags in [&[][..], &["-i"][..], &["-it"][..]] {
        let out = crate::support::cli::output(
            crate::support::cli::client(&["--server", server, "--token", token, "exec", name])
                .args(flags)
                .args(["--", "sh", "-c", &touch]),
        );
        let stderr = String::from_utf8_lossy(&out.stderr);
        if out.status.success() || !stderr.contains("not this project's") {
            failures.push(format!(
                "berth exec {flags:?} {name}: {} {stderr}",
                out.status
            ));
        }
    }
    failures
}

/// What lies where a command or a tool would leave a trace, as `lxc` sees it.
fn listing(name: &str) -> String {
    let out = Command::new("timeout")
        .args([
            "120",
            "lxc",
            "exec",
            name,
            "--",
            "ls",
            "-la",
            "/root",
            "/workspace",
            "/tmp",
        ])
        .output()
        .expect("run lxc exec");
    assert!(
        out.status.success(),
        "{name}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn a_member_never_reaches_a_container_berth_did_not_make_for_the_project() {
    let rt = tokio();
    let client = rt.block_on(lxd::client());
    let mut cleanup = lxd::Cleanup::new();
    let unlabelled = lxd::unique_name();
    let other_berths = lxd::unique_name();
    for name in [&unlabelled, &other_berths] {
        cleanup.instance(name);
        rt.block_on(async {
            lxd::create(&client, &lxd::request(name, lxd::TINY)).await;
            client
                .start_instance(name, lxd::OP_TIMEOUT)
                .await
                .expect("start the foreign container");
        });
    }

    let before: std::collections::BTreeMap<&str, String> = [&unlabelled, &other_berths]
        .into_iter()
        .map(|name| (name.as_str(), listing(name)))
        .collect();

    let daemon = Daemon::running().args(&["--listen", "127.0.0.1:0"]).start();
    let token = daemon.add_user("mia", false);
    let server = format!("http://{}", daemon.tcp_addr());
    let user = TcpClient::new(&daemon.tcp_addr(), Some(&token), None);

    // The member creates a project named like each container. The second is left alone by
    // the reconciler, so the labels below are what decides.
    let create = |name: &str, annotations: Value| {
        let body = json!({"apiVersion": "berth.dev/v1alpha1", "kind": "Project",
            "metadata": {"name": name, "annotations": annotations},
            "spec": {"image": lxd::TINY}});
        let reply = user.json("POST", &format!("{P}/projects"), &body);
        assert_eq!(reply.status, 201, "create {name}: {}", reply.text());
        reply.json()
    };
    let first = create(&unlabelled, json!({}));
    let second = create(&other_berths, json!({"berth.dev/reconcile": "paused"}));
    for project in [&first, &second] {
        let uid = project["metadata"]["uid"].as_str().unwrap();
        cleanup.volume(lxd::POOL, &format!("berth-{uid}-workspace"));
    }
    wait_reason(&user, &unlabelled, "NameConflict");
    wait_reason(&user, &other_berths, "ReconcilePaused");
    let uid = second["metadata"]["uid"].as_str().unwrap().to_string();
    rt.block_on(async {
        let patch = InstancePatch {
            config: [
                ("user.berth.uid".to_string(), uid),
                (
                    "user.berth.controller".to_string(),
                    "another-berth".to_string(),
                ),
            ]
            .into(),
            ..Default::default()
        };
        client
            .patch_instance(&other_berths, &patch)
            .await
            .expect("label the second container");
    });

    let mut failures = Vec::new();
    for name in [&unlabelled, &other_berths] {
        failures.extend(every_route_refuses(&user, &server, &token, name));
    }
    assert!(
        failures.is_empty(),
        "{}\n{}",
        failures.join("\n"),
        daemon.log_text()
    );

    // Nothing ran inside: no marker, and what the tools would write is not there.
    for name in [&unlabelled, &other_berths] {
        assert_eq!(
            listing(name),
            before[name.as_str()],
            "{name}: something reached it"
        );
        assert!(!listing(name).contains("berth-reached"), "{name}");
    }
}
