//! `scripts/setup-lxd` brings back an LXD daemon that was killed with containers running.
//! Such a daemon leaves each running container's `[lxc monitor]` process behind (named `lxd`
//! too); the script must not take those for a live daemon. The test runs a daemon of its own
//! (its own state directory, as `scripts/lxd-cluster` does) so the shared one is never killed.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::support::eventually;
use crate::support::lxd::{lxc_in, unique_name};

fn setup_lxd(dir: &str) -> Result<String, String> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/setup-lxd");
    let out = Command::new("timeout")
        .args(["-k", "10", "600", "bash"])
        .arg(script)
        .args(["--images=berth-tiny", "--skip-check"])
        .env("LXD_DIR", dir)
        .stdin(Stdio::null())
        .output()
        .expect("run scripts/setup-lxd");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if out.status.success() {
        Ok(text)
    } else {
        Err(text)
    }
}

/// The pid of the daemon serving `dir`, as it reports it.
fn server_pid(dir: &str) -> Option<i32> {
    let info: serde_json::Value =
        serde_json::from_str(&lxc_in(Some(dir), &["query", "/1.0"]).ok()?).ok()?;
    info["environment"]["server_pid"]
        .as_i64()
        .and_then(|p| i32::try_from(p).ok())
}

/// Processes whose command line contains `needle` (arguments joined by spaces).
fn processes_with(needle: &str) -> Vec<i32> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let text = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        if text.contains(needle) {
            found.push(pid);
        }
    }
    found
}

fn kill(pid: i32) {
    let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
}

/// The test's daemon, its containers and its state directory, removed when dropped.
struct OwnDaemon {
    dir: PathBuf,
}

impl OwnDaemon {
    fn dir(&self) -> &str {
        self.dir.to_str().unwrap()
    }
}

impl Drop for OwnDaemon {
    fn drop(&mut self) {
        let dir = self.dir().to_string();
        if let Ok(names) = lxc_in(Some(&dir), &["list", "--format", "csv", "-c", "n"]) {
            for name in names.lines().filter(|n| !n.is_empty()) {
                let _ = lxc_in(Some(&dir), &["delete", "--force", name]);
            }
        }
        let _ = Command::new("timeout")
            .args(["60", "lxd", "shutdown", "--timeout", "30"])
            .env("LXD_DIR", &dir)
            .status();
        // Whatever still runs from the state directory (a daemon that did not answer, a
        // container's monitor or payload) is killed and its mounts are unmounted before the
        // directory goes, as `scripts/lxd-cluster down` removes a member's.
        let lib = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/lib");
        let removed = Command::new("timeout")
            .args(["-k", "10", "120", "bash", "-c"])
            .arg(r#"set -eu; source "$1/common.sh"; source "$1/lxd-state.sh"; remove_state_dir "$2""#)
            .arg("remove-state-dir")
            .arg(&lib)
            .arg(&dir)
            .status();
        if !matches!(removed, Ok(status) if status.success()) && !std::thread::panicking() {
            panic!("removing {dir} failed: {removed:?}");
        }
    }
}

#[test]
fn setup_lxd_restarts_a_daemon_killed_with_containers_running() {
    let daemon = OwnDaemon {
        dir: PathBuf::from(format!("/var/lib/lxd-{}", unique_name())),
    };
    let dir = daemon.dir().to_string();
    setup_lxd(&dir).unwrap_or_else(|log| panic!("first set-up failed:\n{log}"));

    let name = unique_name();
    lxc_in(Some(&dir), &["launch", "berth-tiny", &name]).expect("launch a container");
    let killed = server_pid(&dir).expect("the daemon's pid");
    kill(killed);
    eventually(
        Duration::from_secs(60),
        "the killed daemon to be gone",
        String::new,
        || (!Path::new(&format!("/proc/{killed}")).exists()).then_some(()),
    );
    // What misled the script: the container's monitor outlives the daemon, named lxd.
    let monitor = format!("[lxc monitor] {dir}/containers {name}");
    assert!(
        !processes_with(&monitor).is_empty(),
        "no monitor process left for {name}"
    );
    assert!(
        lxc_in(Some(&dir), &["query", "/1.0"]).is_err(),
        "the daemon still answers"
    );

    let log = setup_lxd(&dir).unwrap_or_else(|log| panic!("set-up after the kill failed:\n{log}"));
    assert!(log.contains("lxd: started"), "{log}");
    let pid = server_pid(&dir).expect("a daemon answers again");
    assert_ne!(pid, killed);
    // Nothing lost: the container is still there and still running.
    let state = lxc_in(Some(&dir), &["list", &name, "--format", "csv", "-c", "s"]).unwrap();
    assert_eq!(state.trim(), "RUNNING", "{log}");
    lxc_in(Some(&dir), &["exec", &name, "--", "true"]).expect("exec in the container");
}
