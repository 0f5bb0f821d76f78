//! Input that could exhaust the daemon, end to end against a real `berth serve`: YAML whose
//! aliases expand to gigabytes (through the API and through a GitSource), and slow or idle
//! clients holding connections open.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::support::daemon::{Client, Daemon, TcpClient};
use crate::support::git;
use serde_json::{Value, json};

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
    assert!(api.object("projects", "bomb").is_none());
    // And it still answers.
    assert_eq!(api.get("/healthz").status, 200);
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
    let daemon = Daemon::running().start();
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

    let source = daemon.eventually(DEADLINE, "Ready=False for the alias bomb", || {
        let source = client.object("gitsources", "fleet")?;
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
    assert!(client.object("projects", "harmless").is_none());
    let peak = peak_rss_bytes(&daemon);
    assert!(peak < 256 << 20, "the daemon peaked at {} MiB", peak >> 20);
}

/// `berth_NAME{listener="LISTENER"}` from the daemon's `/metrics`, over the unix socket.
fn listener_metric(client: &Client, name: &str, listener: &str) -> Option<f64> {
    let text = client.get("/metrics").text();
    let prefix = format!("berth_{name}{{listener=\"{listener}\"}} ");
    text.lines()
        .find_map(|line| line.strip_prefix(&prefix))
        .and_then(|value| value.trim().parse().ok())
}

/// What a socket says without waiting: `Some(bytes)` once the server wrote or closed (an empty
/// vector for a bare close), `None` while it is still open and silent.
fn said(stream: &mut std::net::TcpStream) -> Option<Vec<u8>> {
    use std::io::{ErrorKind, Read};
    let mut out = Vec::new();
    let mut buf = [0u8; 512];
    loop {
        match stream.read(&mut buf) {
            Ok(0) => return Some(out),
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(err) if err.kind() == ErrorKind::WouldBlock => {
                return (!out.is_empty()).then_some(out);
            }
            Err(err) if err.kind() == ErrorKind::ConnectionReset => return Some(out),
            Err(err) => panic!("reading an idle socket: {err}"),
        }
    }
}

#[test]
fn a_thousand_idle_sockets_neither_exhaust_the_daemon_nor_outlive_their_deadline() {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    const IDLE: usize = 1000;
    const CAP: usize = 512;
    // This process holds all thousand sockets itself.
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
    if soft < 4096 && hard > soft {
        setrlimit(Resource::RLIMIT_NOFILE, hard.min(65536), hard).unwrap();
    }
    let daemon = Daemon::start_with(&["--listen", "127.0.0.1:0"]);
    let admin = daemon.add_user("root", true);
    let addr = daemon.tcp_addr();
    let local = daemon.client();
    let tcp = TcpClient::new(&addr, Some(&admin), None);
    assert_eq!(tcp.get(&format!("{API}/projects")).status, 200);
    // That request's connection is let go before the flood: a slot it still held would free up
    // during the flood and let a later client in.
    daemon.eventually(DEADLINE, "the first request's connection to close", || {
        (listener_metric(&local, "api_connections", "tcp")? == 0.0).then_some(())
    });

    let opened = Instant::now();
    let mut idle: Vec<std::net::TcpStream> = (0..IDLE)
        .map(|_| {
            let stream = std::net::TcpStream::connect(&addr).expect("connect to the daemon");
            stream.set_nonblocking(true).unwrap();
            stream
        })
        .collect();

    // Connections yet to show a token hold a share of the cap (an eighth): each newer one
    // closes the oldest, so the daemon holds the newest few and refuses none.
    let share = CAP / 8;
    daemon.eventually(
        DEADLINE,
        "all but the unauthenticated share to be closed",
        || {
            let closed = idle.iter_mut().filter_map(said).count();
            let open = listener_metric(&local, "api_connections", "tcp")?;
            (closed == IDLE - share && open == share as f64).then_some(())
        },
    );
    // Meanwhile the unix socket answers, promptly, reads and writes alike.
    for i in 0..5 {
        let asked = Instant::now();
        assert_eq!(local.get("/healthz").status, 200);
        let reply = local.post_json(
            &format!("{API}/projects"),
            &json!({
                "apiVersion": "berth.dev/v1alpha1",
                "kind": "Project",
                "metadata": {"name": format!("during-{i}")},
                "spec": {"state": "Stopped"},
            }),
        );
        assert_eq!(reply.status, 201, "{}", reply.text());
        assert!(
            asked.elapsed() < Duration::from_secs(5),
            "{:?}",
            asked.elapsed()
        );
    }
    // A client with a token is served at once: the idle ones cannot keep it out.
    assert_eq!(tcp.get(&format!("{API}/projects")).status, 200);
    let refused = listener_metric(&local, "api_connections_refused_total", "tcp");
    assert_eq!(refused.unwrap_or(0.0), 0.0);

    // The held ones are closed by the deadline for showing a token (5 s), not sooner.
    let mut open: Vec<&mut std::net::TcpStream> = idle.iter_mut().collect();
    let deadline = Instant::now() + DEADLINE;
    while !open.is_empty() {
        assert!(
            Instant::now() < deadline,
            "{} idle sockets still open after {:?}",
            open.len(),
            opened.elapsed()
        );
        std::thread::sleep(Duration::from_millis(200));
        open.retain_mut(|stream| said(stream).is_none());
    }
    let closed_after = opened.elapsed();
    assert!(
        closed_after >= Duration::from_secs(4),
        "closed after {closed_after:?}, before the deadline"
    );
    drop(idle);

    // And TCP serves again, with its slots given back.
    daemon.eventually(DEADLINE, "the TCP slots to be given back", || {
        (listener_metric(&local, "api_connections", "tcp")? <= 1.0).then_some(())
    });
    assert_eq!(tcp.get(&format!("{API}/projects")).status, 200);
}

/// Limits the host cannot back are admitted with a warning the CLI prints to stderr, as kubectl
/// prints an admission warning; memory under the floor LXD can start is refused naming the field.
#[test]
fn resources_beyond_the_host_are_warned_of_and_below_the_floor_refused() {
    let daemon = Daemon::running().start();
    let dir = tempfile::tempdir().expect("temp dir");
    let name = format!("huge-{}", std::process::id());
    let manifest = dir.path().join("project.yaml");
    let apply = |memory: &str| {
        std::fs::write(
            &manifest,
            format!(
                "apiVersion: berth.dev/v1alpha1\nkind: Project\nmetadata:\n  name: {name}\n\
                 spec:\n  image: berth-tiny\n  resources:\n    memory: {memory}\n    cpu: \"4096\"\n"
            ),
        )
        .expect("write the manifest");
        let manifest = manifest.to_str().expect("utf-8 manifest path");
        daemon.cli(&["apply", "--dry-run", "-f", manifest])
    };

    // The daemon reads the host's capacity from LXD once it answers; until then it warns of
    // nothing.
    let stderr = daemon.eventually(DEADLINE, "a warning about the host's capacity", || {
        let out = apply("1024GiB");
        assert!(out.status.success(), "{out:?}");
        let stderr = String::from_utf8_lossy(&out.stderr).to_string();
        stderr.contains("Warning: ").then_some(stderr)
    });
    assert!(
        stderr.contains(&format!(
            "Warning: Project/{name}: spec.resources.memory 1024GiB is more than this host has ("
        )),
        "{stderr}"
    );
    assert!(
        stderr.contains(&format!(
            "Warning: Project/{name}: spec.resources.cpu 4096 is more than this host has ("
        )),
        "{stderr}"
    );
    assert!(
        daemon.client().object("projects", &name).is_none(),
        "a dry run"
    );

    let out = apply("1KiB");
    assert!(!out.status.success(), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("spec.resources.memory") && stderr.contains("32MiB"),
        "{stderr}"
    );
    assert!(daemon.client().object("projects", &name).is_none());
}
