//! The web console in a real browser: Playwright (PyPI, in `target/test-venv`) driving Debian's
//! Chromium against a real daemon on real LXD, through `tests/e2e/console_browser.py`. Alice signs
//! in; the fleet marks her project holding an untracked file and names the file; a label set
//! meanwhile arrives in place without a reload; a preview link opens the server in the
//! container; the shell agent's question is answered from the project page and the agent
//! finishes; bob, no member, sees nothing of either project; axe-core finds no serious or
//! critical violation. Screenshots of both pages are kept under `target/console-artifacts/`.
//! `scripts/setup-test-deps` installs Chromium, Playwright and axe-core.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::daemon::Daemon;
use crate::support::lxd::unique_name;
use serde_json::{Value, json};

const P: &str = "/apis/berth.dev/v1alpha1";
/// The scheduler, a container's boot and the agent on a busy shared machine.
const DEADLINE: Duration = Duration::from_secs(300);
const FILE: &str = "draft-console.txt";
const INDEX: &str = "hello from inside the container";

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn python() -> PathBuf {
    let path = root().join("target/test-venv/bin/python");
    assert!(
        path.exists(),
        "{} is missing: run scripts/setup-test-deps (it installs Playwright)",
        path.display()
    );
    path
}

/// The daemon and what the test made in it, removed when the test ends however it ends.
struct Fleet {
    daemon: Daemon,
    projects: Vec<String>,
    profile: Option<String>,
}

impl Fleet {
    fn create(&mut self, name: &str, spec: Value) {
        let reply = self.daemon.client().post_json(
            &format!("{P}/projects"),
            &json!({"apiVersion": "berth.dev/v1alpha1", "kind": "Project",
                    "metadata": {"name": name}, "spec": spec}),
        );
        assert_eq!(reply.status, 201, "create {name}: {}", reply.text());
        self.projects.push(name.to_string());
    }

    fn member(&self, project: &str, user: &str) {
        let reply = self.daemon.client().request(
            "PUT",
            &format!("{P}/projects/{project}/members/{user}"),
            None,
            b"",
        );
        assert!(reply.status < 300, "{}", reply.text());
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        let client = self.daemon.client();
        for name in &self.projects {
            let _ = client.try_request(
                "DELETE",
                &format!("{P}/projects/{name}?force=true"),
                None,
                &[],
            );
        }
        let until = Instant::now() + Duration::from_secs(180);
        while Instant::now() < until
            && self.projects.iter().any(|n| {
                client
                    .try_request("GET", &format!("{P}/projects/{n}"), None, &[])
                    .is_ok_and(|r| r.status == 200)
            })
        {
            std::thread::sleep(Duration::from_millis(250));
        }
        if let Some(profile) = &self.profile {
            let _ =
                client.try_request("DELETE", &format!("{P}/agentprofiles/{profile}"), None, &[]);
        }
    }
}

#[test]
fn the_console_in_chromium_marks_answers_and_follows_live() {
    let python = python();
    let chromium = ["/usr/bin/chromium", "/usr/bin/chromium-browser"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .expect("Debian's chromium: run scripts/setup-test-deps");
    let axe = root().join("target/test-node/node_modules/axe-core/axe.min.js");
    assert!(
        axe.exists(),
        "{}: run scripts/setup-test-deps",
        axe.display()
    );
    let artifacts = root().join("target/console-artifacts");
    std::fs::create_dir_all(&artifacts).unwrap();

    let daemon = Daemon::running()
        .config("scheduler: {interval: 2s, workers: 4}\nlisten: {http: \"127.0.0.1:0\"}\n")
        .start();
    let mut fleet = Fleet {
        daemon,
        projects: Vec::new(),
        profile: None,
    };
    let alice = format!("alice-{}", &unique_name()[8..]);
    let bob = format!("bob-{}", &unique_name()[8..]);
    let alice_token = fleet.daemon.add_user(&alice, false);
    let bob_token = fleet.daemon.add_user(&bob, false);

    let profile = format!("shell-{}", &unique_name()[8..]);
    let reply = fleet.daemon.client().post_json(
        &format!("{P}/agentprofiles"),
        &json!({"apiVersion": "berth.dev/v1alpha1", "kind": "AgentProfile",
                "metadata": {"name": profile},
                "spec": {"home": format!("/root/.{profile}"),
                         "install": {"check": "test -x /usr/local/lib/berth/shell-agent"},
                         "runner": {"command": ["/usr/local/lib/berth/shell-agent", "{briefFile}"]}}}),
    );
    assert_eq!(reply.status, 201, "{}", reply.text());
    fleet.profile = Some(profile.clone());

    let dirty = unique_name();
    let asker = unique_name();
    fleet.create(&dirty, json!({"image": "berth-tiny"}));
    fleet.create(
        &asker,
        json!({"image": "berth-base", "agent": profile,
               "brief": "Ask then finish\nBLOCK: which colour?\necho finishing\n"}),
    );
    fleet.member(&dirty, &alice);
    fleet.member(&asker, &alice);

    fleet
        .daemon
        .wait_for_within(&dirty, "reachable", DEADLINE, |p| {
            p["status"]["firstReachableAt"].is_string()
        });
    let servers = format!(
        "mkdir -p /www && printf '{INDEX}\\n' > /www/index.html && busybox httpd -p 8000 -h /www \
         && echo draft > /workspace/{FILE}"
    );
    crate::harness::exec(&dirty, &servers).expect("the file and the server");
    fleet
        .daemon
        .wait_for_within(&dirty, "the file and the port seen", DEADLINE, |p| {
            p["status"]["unsavedWork"]["files"]
                .as_array()
                .is_some_and(|f| f.iter().any(|f| f == FILE))
                && p["status"]["ports"]
                    .as_array()
                    .is_some_and(|ports| ports.iter().any(|p| p["port"] == 8000))
        });
    fleet
        .daemon
        .wait_for_within(&asker, "blocked", DEADLINE, |p| {
            p["status"]["agent"]["state"] == "blocked"
        });

    let config = json!({
        "base": format!("http://{}", fleet.daemon.tcp_addr()),
        "alice": alice_token,
        "bob": bob_token,
        "dirty": dirty,
        "asker": asker,
        "file": FILE,
        "port": 8000,
        "artifacts": artifacts,
        "chromium": chromium,
        "axe": axe,
    });
    let out = Command::new("timeout")
        .args(["-k", "10", "900"])
        .arg(&python)
        .arg(root().join("tests/e2e/console_browser.py"))
        .arg(config.to_string())
        .stdin(Stdio::null())
        .output()
        .expect("run the Playwright driver");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "the browser driver failed:\n{said}\n--- daemon log ---\n{}",
        fleet.daemon.log_text()
    );
    assert!(said.contains("all steps passed"), "{said}");

    // The answer reached the agent through the same path as `berth answer`.
    let log = crate::harness::read_file(&asker, "/run/berth/shell.log").unwrap_or_default();
    assert!(log.contains("answer: blue"), "{log}");
    for shot in ["console-fleet.png", "console-project.png"] {
        let bytes = std::fs::metadata(artifacts.join(shot)).map(|m| m.len());
        assert!(bytes.as_ref().is_ok_and(|b| *b > 1000), "{shot}: {bytes:?}");
    }
}
