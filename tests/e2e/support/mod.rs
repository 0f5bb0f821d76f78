//! Helpers shared by the end-to-end tests: a real `berth serve` process, real LXD.
#![allow(dead_code)]

pub mod cli;
pub mod cluster;
pub mod daemon;
pub mod lxd;
pub mod model_fixture;

use std::time::{Duration, Instant};

/// Polls `check` until it returns `Some`, for at most `deadline`; past it, fails naming `what`
/// and whatever `context` adds (a daemon's log). The end-to-end tests wait through this (and
/// `lxd::eventually` in async code) rather than sleeping a fixed time.
pub fn eventually<T>(
    deadline: Duration,
    what: &str,
    context: impl Fn() -> String,
    mut check: impl FnMut() -> Option<T>,
) -> T {
    let until = Instant::now() + deadline;
    loop {
        if let Some(value) = check() {
            return value;
        }
        assert!(
            Instant::now() < until,
            "timed out after {deadline:?} waiting for {what}{}",
            context()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Runs git in `dir` as the tests' own user (a fixed identity, no global or system config, no
/// prompt) and returns its trimmed stdout; fails the test when git fails.
pub fn git(dir: &std::path::Path, args: &[&str]) -> String {
    let output = std::process::Command::new("git")
        .args([
            "-c",
            "user.name=berth test",
            "-c",
            "user.email=t@berth.invalid",
        ])
        .args(args)
        .current_dir(dir)
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_TERMINAL_PROMPT", "0")
        .output()
        .expect("run git");
    assert!(
        output.status.success(),
        "git {args:?} in {}: {}",
        dir.display(),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).trim().to_string()
}

/// A command's exit, stdout and stderr, for an assertion's message.
pub fn said(out: &std::process::Output) -> String {
    format!(
        "exit {:?}\nstdout: {}\nstderr: {}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}
