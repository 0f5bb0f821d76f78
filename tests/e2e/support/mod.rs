//! Helpers shared by the end-to-end tests: a real `berth serve` process, real LXD.
#![allow(dead_code)]

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
