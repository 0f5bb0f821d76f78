//! The IDE against a real daemon on real LXD (image berth-agents, which carries code-server):
//! `berth ide` starts code-server on demand and prints the IDE host's URL with a one-time
//! ticket, and a second call starts nothing; Playwright (`tests/e2e/ide_browser.py`, Debian's
//! Chromium) opens that URL through the real preview listener, waits for the workbench and
//! creates a file in the editor, read back with `berth exec`, then opens the IDE again from
//! the console's Open IDE; an open IDE is the project's activity (source `ide`); the IDE's own
//! state is neither unsaved work nor in the way of a recreate, after which the state code-server
//! wrote is still there and the IDE starts again only when asked; a project left alone idles,
//! code-server stopping with its container, and `berth ide` wakes it and starts code-server
//! again; a non-member reads the same 404 as for any preview. On an image without
//! code-server, `berth ide` says so in one line and writes nothing.

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::harness::{Berth, bearer, exec, get, lxc, read_file, unique_name};
use serde_json::{Value, json};

const FILE: &str = "/workspace/ide-made.txt";
const TEXT: &str = "written in the IDE through berth";
/// What code-server writes into its state at its first start (its machine id).
const STATE_FILE: &str = "/workspace/.berth/ide/data/User/machineid";
const NOT_FOUND: &str = "404 page not found\n";

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// A daemon with a fast scheduler and a TCP listener for the users' CLI.
fn daemon() -> (Berth, tempfile::TempDir) {
    let config = tempfile::tempdir().expect("config dir");
    let file = config.path().join("berth.yaml");
    std::fs::write(
        &file,
        "scheduler: {interval: 1s, workers: 4}\nlisten: {http: \"127.0.0.1:0\"}\n",
    )
    .unwrap();
    let berth = Berth::start_with(&[], &["--config", &file.to_string_lossy()]);
    (berth, config)
}

/// `berth ide NAME` as a user over TCP: its stdout and stderr, and whether it succeeded.
fn ide_as(berth: &Berth, token: &str, name: &str) -> (bool, String, String) {
    let tcp = crate::support::daemon::logged_addr(&berth.log_text(), "serving the API over TCP");
    let out = crate::support::cli::output(
        crate::support::cli::client(&["--server", &format!("http://{tcp}"), "ide", name])
            .env("BERTH_TOKEN", token),
    );
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The pid `berth ide` reported on stderr (`... (pid N); ...`).
fn reported_pid(stderr: &str) -> u64 {
    stderr
        .split("(pid ")
        .nth(1)
        .and_then(|rest| rest.split(')').next())
        .and_then(|pid| pid.parse().ok())
        .unwrap_or_else(|| panic!("no pid in {stderr:?}"))
}

fn ide_started_events(berth: &Berth, name: &str) -> usize {
    berth.events_of(name, "IdeStarted").len()
}

#[test]
fn the_ide_opens_in_chromium_saves_into_the_workspace_and_keeps_its_state() {
    let python = root().join("target/test-venv/bin/python");
    assert!(
        python.exists(),
        "{} is missing: run scripts/setup-test-deps (it installs Playwright)",
        python.display()
    );
    let chromium = ["/usr/bin/chromium", "/usr/bin/chromium-browser"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .expect("Debian's chromium: run scripts/setup-test-deps");
    let artifacts = root().join("target/ide-artifacts");
    std::fs::create_dir_all(&artifacts).unwrap();

    let (mut berth, _config) = daemon();
    let addr = berth.preview_addr();
    let port = addr.rsplit_once(':').unwrap().1.to_string();
    let name = unique_name();
    berth.create_project(&name, json!({"image": "berth-agents"}));
    let alice = berth.add_user(&format!("alice-{name}"), false);
    let bob = berth.add_user(&format!("bob-{name}"), false);
    berth.add_member(&name, &format!("alice-{name}"));
    berth.wait_ready(&name);
    assert!(
        exec(&name, "test ! -e /run/berth/ide.pid").is_ok(),
        "code-server must not start at boot"
    );

    // The first call starts code-server and prints the IDE host's URL with a ticket.
    let first = berth.cli(&["ide", &name]);
    let (stdout, stderr) = (
        String::from_utf8_lossy(&first.stdout).into_owned(),
        String::from_utf8_lossy(&first.stderr).into_owned(),
    );
    assert!(first.status.success(), "berth ide: {stdout}{stderr}");
    let prefix = format!("http://{name}--ide.localhost:{port}/?berth-ticket=");
    assert!(stdout.trim().starts_with(&prefix), "{stdout:?}");
    assert_eq!(stdout.lines().count(), 1, "{stdout:?}");
    assert!(stderr.contains("code-server started"), "{stderr:?}");
    let pid = reported_pid(&stderr);
    assert_eq!(
        read_file(&name, "/run/berth/ide.pid").unwrap().trim(),
        pid.to_string()
    );

    // A member's second call finds it running and starts nothing.
    let (ok, url, said) = ide_as(&berth, &alice, &name);
    assert!(ok, "alice's berth ide: {url}{said}");
    assert!(said.contains("already running"), "{said:?}");
    assert_eq!(reported_pid(&said), pid);
    assert!(url.trim().starts_with(&prefix), "{url:?}");
    assert_eq!(ide_started_events(&berth, &name), 1);

    // Members reach code-server on the IDE host; anyone else reads the one 404.
    let host = format!("{name}--ide.localhost:{port}");
    let health = get(&addr, &host, "/healthz", &[bearer(&alice)]);
    assert_eq!(health.status, 200, "{health:?}\n{}", berth.log_text());
    let unknown = get(
        &addr,
        &format!("nope-{name}--ide.localhost"),
        "/healthz",
        &[bearer(&alice)],
    );
    assert_eq!(
        (unknown.status, unknown.body.as_str()),
        (404, NOT_FOUND),
        "{unknown:?}"
    );
    for (who, headers) in [
        ("no credentials", vec![]),
        ("a non-member", vec![bearer(&bob)]),
        (
            "another host's cookie",
            vec!["Cookie: berth-preview=forged".to_string()],
        ),
    ] {
        let answer = get(&addr, &host, "/healthz", &headers);
        assert_eq!(
            (answer.status, answer.body),
            (unknown.status, unknown.body.clone()),
            "{who}"
        );
    }
    let (ok, _, said) = ide_as(&berth, &bob, &name);
    assert!(!ok && said.contains("not found"), "bob's berth ide: {said}");

    // The browser: the workbench, a file saved from the editor, a user setting.
    let release = berth.dir.path().join("release-browser");
    let config = json!({
        "url": url.trim(),
        "chromium": chromium,
        "artifacts": artifacts,
        "text": TEXT,
        "path": FILE,
        "release": release,
        "console": format!("http://{}", crate::support::daemon::logged_addr(&berth.log_text(), "serving the API over TCP")),
        "token": alice,
        "project": name,
    });
    let mut driver = Command::new("timeout")
        .args(["-k", "10", "900"])
        .arg(&python)
        .arg(root().join("tests/e2e/ide_browser.py"))
        .arg(config.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run the Playwright driver");
    let mut said = String::new();
    let mut lines = BufReader::new(driver.stdout.take().unwrap()).lines();
    for line in lines.by_ref() {
        let line = line.unwrap_or_default();
        said.push_str(&line);
        said.push('\n');
        if line == "step: saved" {
            break;
        }
    }
    let open = said.contains("step: saved");

    // While the IDE is open, it is the project's activity.
    let activity = open.then(|| {
        berth.wait_for(&name, "activity from the open IDE", |p| {
            p["status"]["activity"]["source"] == "ide"
        })
    });
    let described = open.then(|| berth.cli_ok(&["describe", "project", &name]));
    std::fs::write(&release, b"").unwrap();
    for line in lines {
        said.push_str(&line.unwrap_or_default());
        said.push('\n');
    }
    let mut errors = String::new();
    driver
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut errors)
        .unwrap();
    let status = driver.wait().unwrap();
    assert!(
        status.success() && said.contains("all steps passed"),
        "the browser driver failed ({status}):\n{said}{errors}\n--- daemon log ---\n{}",
        berth.log_text()
    );
    assert!(activity.is_some());
    let described = described.unwrap();
    assert!(
        described
            .lines()
            .any(|l| l.contains("Last Activity") && l.contains("(ide)")),
        "{described}"
    );

    // What the editor saved is in /workspace, read back through berth.
    let read = berth.cli_ok(&["exec", &name, "--", "cat", FILE]);
    assert_eq!(read.trim_end(), TEXT);
    // code-server keeps its state in the workspace volume.
    let written = exec(&name, &format!("cat {STATE_FILE}"))
        .unwrap_or_else(|e| panic!("code-server wrote no {STATE_FILE}: {e}"));

    // The saved file is unsaved work; the IDE's own state is not.
    let project = berth.wait_for(&name, "the saved file seen as unsaved work", |p| {
        p["status"]["unsavedWork"]["files"]
            .as_array()
            .is_some_and(|f| f.iter().any(|f| f == "ide-made.txt"))
    });
    assert_eq!(
        project["status"]["unsavedWork"]["files"],
        json!(["ide-made.txt"]),
        "{}",
        project["status"]["unsavedWork"]
    );
    assert_eq!(project["status"]["unsavedWork"]["untracked"], 1);

    // A replaced container keeps the IDE's state; the IDE starts again only when asked.
    let old = lxc(&["config", "get", &name, "volatile.uuid"]).unwrap();
    berth.cli_ok(&["restart", &name, "--recreate"]);
    berth.wait_replaced(&name, &old);
    assert_eq!(exec(&name, &format!("cat {STATE_FILE}")).unwrap(), written);
    assert!(
        exec(&name, "test ! -e /run/berth/ide.pid").is_ok(),
        "code-server must not start with the new container"
    );
    let again: Value =
        serde_json::from_str(&berth.cli_ok(&["ide", &name, "-o", "json"])).expect("json");
    assert_eq!(again["started"], true, "{again}");
    assert_eq!(ide_started_events(&berth, &name), 2);
    let health = get(&addr, &host, "/healthz", &[bearer(&alice)]);
    assert_eq!(health.status, 200, "{health:?}");

    // Left alone, the project idles and code-server stops with its container (the saved file
    // removed first: it is unsaved work, which keeps the reaper away; the IDE's state is not);
    // `berth ide` wakes the project and starts code-server again.
    berth.cli_ok(&["exec", &name, "--", "rm", FILE]);
    let reply = berth.patch_project(
        &name,
        json!({"spec": {"reap": {"idleAfter": "5s", "idleAction": "Stop"}}}),
    );
    assert!(reply.status < 300, "{}", reply.text());
    berth.wait_for(&name, "idled and stopped", |p| {
        p["status"]["reap"]["idledAt"].is_string()
            && crate::harness::instance_state(&name).as_deref() == Some("STOPPED")
    });
    let woken: Value =
        serde_json::from_str(&berth.cli_ok(&["ide", &name, "-o", "json"])).expect("json");
    assert_eq!(woken["started"], true, "{woken}");
    assert_eq!(ide_started_events(&berth, &name), 3);
    assert!(
        berth
            .events_of(&name, "WakeRequested")
            .iter()
            .any(|e| e["message"] == "berth ide woke the idled project"),
        "{:?}",
        berth.events(&name)
    );
    berth.delete_project(&name);
}

#[test]
fn an_image_without_code_server_is_refused_in_one_line_and_keeps_nothing() {
    let (mut berth, _config) = daemon();
    let addr = berth.preview_addr();
    let name = unique_name();
    berth.create_project(&name, json!({"image": "berth-tiny"}));
    let alice = berth.add_user(&format!("alice-{name}"), false);
    let bob = berth.add_user(&format!("bob-{name}"), false);
    berth.add_member(&name, &format!("alice-{name}"));
    berth.wait_ready(&name);

    let (ok, stdout, stderr) = ide_as(&berth, &alice, &name);
    assert!(!ok, "{stdout}{stderr}");
    assert!(stdout.is_empty(), "{stdout:?}");
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr:?}");
    assert!(
        stderr.contains("no code-server") && stderr.contains("berth-agents"),
        "{stderr:?}"
    );
    assert!(
        exec(&name, "test ! -e /workspace/.berth").is_ok(),
        "nothing is written into the workspace"
    );
    assert_eq!(ide_started_events(&berth, &name), 0);

    // A member reaching the IDE host hears how to start it; anyone else the one 404.
    let host = format!("{name}--ide.localhost");
    let member = get(&addr, &host, "/", &[bearer(&alice)]);
    assert_eq!(member.status, 503, "{member:?}");
    assert!(
        member.body.contains(&format!("berth ide {name}")),
        "{member:?}"
    );
    let outsider = get(&addr, &host, "/", &[bearer(&bob)]);
    assert_eq!((outsider.status, outsider.body.as_str()), (404, NOT_FOUND));
    berth.delete_project(&name);
}
