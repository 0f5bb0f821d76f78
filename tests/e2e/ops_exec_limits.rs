//! Output from a container is taken with hard caps on the host side: `berth exec` of a command
//! that prints without end stops at the cap, says so and exits 125, the daemon's memory does
//! not grow with what the command printed, the command does not run on, and LXD records no exec
//! output in its log directory on the host. A command that leaves something running in the
//! background still answers at once. A huge agent status file is not read whole either.
//! Real daemon, real LXD.

use std::time::{Duration, Instant};

use crate::harness::{Berth, PROJECTS};
use serde_json::json;

/// `berth exec`'s cap on each stream (`berth::inspect::exec::OUTPUT_LIMIT`).
const CAP: usize = 8 << 20;
/// How much the daemon's peak resident memory may grow over the whole test.
const RSS_GROWTH_BOUND_KIB: u64 = 256 * 1024;

/// The pid of the `berth serve` listening on `socket` (its command line names the socket).
fn daemon_pid(berth: &Berth) -> u32 {
    let socket = berth.socket.to_string_lossy().into_owned();
    std::fs::read_dir("/proc")
        .expect("read /proc")
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .find(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|cmdline| {
                let cmdline = String::from_utf8_lossy(&cmdline);
                cmdline.contains("serve") && cmdline.contains(&socket)
            })
        })
        .expect("the daemon's process")
}

/// The peak resident memory of `pid`, in KiB.
fn vm_hwm_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM in /proc/PID/status")
}

fn berth_exec(berth: &Berth, name: &str, script: &str) -> std::process::Output {
    berth.cli(&["exec", name, "--timeout", "100", "--", "sh", "-c", script])
}

/// Files in LXD's log directory for the instance (`/var/log/lxd/NAME` for the Debian package,
/// `/var/lib/lxd/logs/NAME` elsewhere), and the instance's logs as LXD lists them.
fn exec_output_files(name: &str) -> Vec<String> {
    let mut found = Vec::new();
    for dir in [
        format!("/var/log/lxd/{name}"),
        format!("/var/lib/lxd/logs/{name}"),
    ] {
        if let Ok(entries) = std::fs::read_dir(&dir) {
            found.extend(
                entries
                    .filter_map(|e| e.ok()?.file_name().into_string().ok())
                    .filter(|f| f.starts_with("exec"))
                    .map(|f| format!("{dir}/{f}")),
            );
        }
    }
    let listed = crate::harness::lxc(&["query", &format!("/1.0/instances/{name}/logs")])
        .expect("lxc query logs");
    found.extend(
        listed
            .split('"')
            .filter(|s| s.contains("/exec"))
            .map(str::to_string),
    );
    found
}

#[test]
fn endless_output_is_cut_at_the_cap_and_never_held_or_recorded() {
    let mut berth = Berth::start(None);
    let name = crate::harness::unique_name();
    berth.create_project(&name, json!({"image": "berth-tiny"}));
    berth.wait_ready(&name);
    let pid = daemon_pid(&berth);
    // One ordinary exec first, so the peak measured below already holds what any exec costs.
    // It leaves a process behind that keeps its streams, and still answers at once.
    let started = Instant::now();
    let out = berth_exec(&berth, &name, "sleep 300 & echo ready");
    assert!(out.status.success(), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "ready\n");
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "waited {:?} for the background process",
        started.elapsed()
    );
    let before = vm_hwm_kib(pid);

    for script in [
        "head -c 209715200 /dev/zero",
        "echo begin >&2; cat /dev/urandom",
    ] {
        let started = Instant::now();
        let out = berth_exec(&berth, &name, script);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(125), "{script}: {stderr}");
        assert!(stderr.contains("output cut"), "{script}: {stderr}");
        // What came before the cap, as printed (urandom is not UTF-8: a replacement
        // character may take up to three bytes where one was).
        let printed = out.stdout.len();
        assert!(printed >= CAP / 2, "{script}: only {printed} bytes");
        assert!(printed <= 3 * CAP, "{script}: {printed} bytes");
        assert!(
            started.elapsed() < Duration::from_secs(90),
            "{script}: took {:?}",
            started.elapsed()
        );
    }

    // Nothing runs on in the container, and its output files are gone.
    let until = Instant::now() + Duration::from_secs(60);
    loop {
        let ps = crate::harness::exec(&name, "ps; ls -a /tmp").expect("ps in the container");
        if !ps.contains("/dev/zero") && !ps.contains("/dev/urandom") && !ps.contains(".berth-exec-")
        {
            break;
        }
        assert!(
            Instant::now() < until,
            "the capped commands still run:\n{ps}"
        );
        std::thread::sleep(Duration::from_millis(250));
    }

    // An agent status file far past its cap is not read whole: `answer` reads it, finds it
    // unreadable, and answers from the stored status.
    crate::harness::exec(
        &name,
        "mkdir -p /run/berth && head -c 33554432 /dev/zero > /run/berth/agent.json",
    )
    .expect("write a huge status file");
    let reply = berth.client().request(
        "POST",
        &format!("{PROJECTS}/{name}/answer"),
        Some("text/plain"),
        b"yes",
    );
    assert_eq!(reply.status, 409, "{}", reply.text());

    let after = vm_hwm_kib(pid);
    assert!(
        after.saturating_sub(before) < RSS_GROWTH_BOUND_KIB,
        "the daemon's peak memory grew from {before} KiB to {after} KiB"
    );
    let recorded = exec_output_files(&name);
    assert!(
        recorded.is_empty(),
        "exec output recorded on the host: {recorded:?}"
    );
    berth.delete_project(&name);
}
