//! Test support: fakes and fixtures for the crate's unit tests (built with `cfg(test)`, so a
//! plain `cargo test` runs every one), the benchmarks and scale simulation (feature `testing`).
//! Nothing in production code uses it.
//!
//! Its parts: `fake_runtime.rs` (`FakeRuntime`: LXD in memory, with fault injection: lost replies,
//! slow or failing calls), `fixtures.rs` (`Desired::of`, `Desired::project` and their builders,
//! `Instance::running` and `labelled`, `finalized_project` and `delete_project` for held
//! deletions), `inspection.rs` (`FakeWorkspace`, `script_inspection`) and `fake_agent.rs`
//! (`FakeAgent`, which plays the agent in every container of a `FakeRuntime` so the real agent
//! steps run to Ready on the fake).

pub mod fake_agent;
pub mod fake_runtime;
pub mod fixtures;
pub mod inspection;

/// Waits in real time until `check` holds, failing the test with `what` after a minute.
pub async fn eventually(what: &str, check: impl Fn() -> bool) {
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(60);
    while !check() {
        assert!(tokio::time::Instant::now() < deadline, "timed out: {what}");
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}

/// The crate's property tests: 256 cases each, and failures kept as plain regression tests
/// rather than files.
#[cfg(test)]
pub fn proptest_config() -> proptest::test_runner::Config {
    proptest::test_runner::Config {
        cases: 256,
        failure_persistence: None,
        ..proptest::test_runner::Config::default()
    }
}
