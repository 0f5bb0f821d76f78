//! Input that could exhaust the daemon, end to end against a real `berth serve`: YAML whose
//! aliases expand to gigabytes (through the API and through a GitSource), and slow or idle
//! clients holding connections open.

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use support::daemon::{Client, Daemon};

const API: &str = "/apis/berth.dev/v1alpha1";
const DEADLINE: Duration = Duration::from_secs(60);

/// 150 KB of YAML: a 100 KB string anchored once and aliased fifteen thousand times, 1.5 GB
/// once expanded. `name` is the Project it claims to be.
fn alias_bomb(name: &str) -> String {
    let aliases = vec!["*a"; 15_000].join(", ");
    format!(
        "apiVersion: berth.dev/v1alpha1\nkind: Project\nmetadata:\n  name: {name}\nspec:\n  \
         displayName: &a \"{}\"\n  seedFiles: [{aliases}]\n",
        "x".repeat(100_000)
    )
}

/// The daemon's peak resident memory, from the kernel.
fn peak_rss_bytes(daemon: &Daemon) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{}/status", daemon.pid())).unwrap();
    let kib: u64 = status
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .expect("VmHWM in /proc/PID/status");
    kib * 1024
}

fn wait_for<T>(daemon: &Daemon, what: &str, mut check: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + DEADLINE;
    loop {
        if let Some(value) = check() {
            return value;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}\n--- daemon log ---\n{}",
            daemon.log_text()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn get(client: &Client, plural: &str, name: &str) -> Option<Value> {
    let reply = client.get(&format!("{API}/{plural}/{name}"));
    match reply.status {
        200 => Some(reply.json()),
        404 => None,
        other => panic!("GET {plural}/{name}: {other}: {}", reply.text()),
    }
}

fn condition<'a>(object: &'a Value, type_: &str) -> Option<&'a Value> {
    object["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)
}

#[test]
fn yaml_aliases_expanding_past_the_bound_are_refused_by_the_api() {
    let daemon = Daemon::start();
    let api = daemon.client();
    let bomb = alias_bomb("bomb");
    assert!(bomb.len() < 170_000, "{}", bomb.len());

    let started = Instant::now();
    let reply = api.request(
        "PATCH",
        &format!("{API}/projects/bomb"),
        Some("application/apply-patch+yaml"),
        bomb.as_bytes(),
    );
    let took = started.elapsed();
    assert_eq!(reply.status, 413, "{}", reply.text());
    let message = reply.json()["message"].as_str().unwrap().to_string();
    assert!(
        message.starts_with("document 1: YAML expands beyond ") && message.ends_with("(aliases)"),
        "{message}"
    );
    // The same body through the batch apply endpoint, as a YAML List would come.
    let reply = api.request(
        "POST",
        &format!("{API}/apply"),
        Some("application/yaml"),
        bomb.as_bytes(),
    );
    assert!(
        matches!(reply.status, 400 | 413),
        "{}: {}",
        reply.status,
        reply.text()
    );
    assert!(took < Duration::from_secs(10), "refusing took {took:?}");
    // Nothing near the 1.5 GB the aliases expand to was ever built.
    let peak = peak_rss_bytes(&daemon);
    assert!(peak < 256 << 20, "the daemon peaked at {} MiB", peak >> 20);
    assert!(get(&api, "projects", "bomb").is_none());
    // And it still answers.
    assert_eq!(api.get("/healthz").status, 200);
}

fn git(dir: &Path, args: &[&str]) -> String {
    let output = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(args)
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_TERMINAL_PROMPT", "0")
        .output()
        .expect("run git");
    assert!(
        output.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).trim().to_string()
}

/// A bare repository holding `files`, committed and pushed once; returns its URL and commit.
fn bare_repo(dir: &Path, files: &[(&str, &str)]) -> (String, String) {
    let bare: PathBuf = dir.join("fleet.git");
    let work = dir.join("work");
    std::fs::create_dir_all(&bare).unwrap();
    std::fs::create_dir_all(&work).unwrap();
    git(
        &bare,
        &["init", "--quiet", "--bare", "--initial-branch=main"],
    );
    git(&work, &["init", "--quiet", "--initial-branch=main"]);
    git(&work, &["config", "user.name", "Fleet"]);
    git(&work, &["config", "user.email", "fleet@example.invalid"]);
    for (file, text) in files {
        let path = work.join(file);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }
    git(&work, &["add", "--all"]);
    git(&work, &["commit", "--quiet", "-m", "fleet"]);
    git(&work, &["push", "--quiet", bare.to_str().unwrap(), "main"]);
    (
        format!("file://{}", bare.display()),
        git(&work, &["rev-parse", "HEAD"]),
    )
}

#[test]
fn a_gitsource_revision_with_an_alias_bomb_applies_nothing_and_names_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let harmless = "apiVersion: berth.dev/v1alpha1\nkind: Project\nmetadata:\n  name: harmless\n  \
                    annotations:\n    berth.dev/reconcile: paused\nspec:\n  state: Stopped\n";
    let bomb = format!("{harmless}---\n{}", alias_bomb("bomb"));
    let (url, revision) = bare_repo(
        dir.path(),
        &[("deploy/a.yaml", harmless), ("deploy/bomb.yaml", &bomb)],
    );
    let daemon = Daemon::start_running(&[]);
    let client = daemon.client();
    let reply = client.post_json(
        &format!("{API}/gitsources"),
        &json!({
            "apiVersion": "berth.dev/v1alpha1",
            "kind": "GitSource",
            "metadata": {"name": "fleet"},
            "spec": {"url": url, "ref": "main", "path": "deploy", "interval": "1h"},
        }),
    );
    assert_eq!(reply.status, 201, "{}", reply.text());

    let source = wait_for(&daemon, "Ready=False for the alias bomb", || {
        let source = get(&client, "gitsources", "fleet")?;
        (source["status"]["lastAttemptedRevision"] == revision
            && condition(&source, "Ready")?["status"] == "False")
            .then_some(source)
    });
    let message = condition(&source, "Ready").unwrap()["message"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        message.contains("deploy/bomb.yaml: document 2: YAML expands beyond "),
        "{message}"
    );
    // Nothing of that revision was applied, not even the harmless file before it.
    assert!(
        source["status"]["lastAppliedRevision"].is_null(),
        "{source}"
    );
    assert!(get(&client, "projects", "harmless").is_none());
    let peak = peak_rss_bytes(&daemon);
    assert!(peak < 256 << 20, "the daemon peaked at {} MiB", peak >> 20);
}
