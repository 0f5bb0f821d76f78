//! The scheduler: one loop of passes (resync, schedules, activity, network, reap, housekeeping)
//! and the decisions they make. Reaping is the only path in berth that can lose work
//! irreversibly, so the decision ([`policy`]) is pure and exhaustively tested, and it only ever
//! sees facts gathered by one inspection ([`inspect`]) that refuses to guess.
//!
//! The loop knows nothing of the store or the queue: the daemon implements [`Passes`] to wire each
//! pass to them and to the metrics.
//!
//! The resync pass runs the controller's resync (one list of the fleet) rather than requesting
//! each project; the activity pass waits at most a few settle periods while the reconciler is
//! saturated. A round longer than the interval is counted as an overrun, less the time the passes
//! gave way to a saturated reconciler. A pass that panics is caught and counted, and [`Health`]
//! tells `/readyz` when the loop stopped or a pass keeps panicking. When passes ran is
//! `berth_scheduler_last_pass_timestamp_seconds`, so `status.activity.inspectedAt` moving alone is
//! not written. A stopped project is looked at only when its last findings decide something, and
//! at most once per `scheduler.recheckInterval`.
//!
//! Its parts: the pure reap decision (`policy.rs`, built on `crate::workspace::protection`) and
//! its carrying out (`reap.rs`, re-checked right before acting); activity, people's through the
//! `PeopleActivity` trait the activity log implements (`activity.rs`), and ports (`ports.rs`);
//! orphan detection on the resync's list (`housekeeping.rs`); scheduled briefs planned
//! (`schedules.rs`); the daemon's passes (`passes.rs`, `DaemonPasses`, and one file per pass:
//! `pass_activity.rs`, `pass_schedules.rs`, `pass_network.rs`, `pass_reap.rs`,
//! `pass_housekeeping.rs`, which purges the trash's expired entries); what the passes remember in
//! this process, safe to forget (`memory.rs`).

pub mod activity;
pub mod housekeeping;
pub mod memory;
pub mod passes;
pub mod policy;
pub mod ports;
pub mod reap;
pub mod schedules;

use std::collections::BTreeMap;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures::{FutureExt, StreamExt};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::runtime::Runtime;
use crate::workspace::inspect::{self, Expected, InspectError, Inspection};

/// The passes of one scheduler round, in the order they run (the `pass` metric label).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Pass {
    /// Enqueue every project so the reconciler re-checks drift.
    Resync,
    /// Hand over the briefs of due schedules, waking idled projects.
    Schedules,
    /// Inspect running projects: agent status, git state, ports, CPU, file changes.
    Activity,
    /// Record what the inspections saw of each container's IPv4 addresses, and repair a lost one.
    Network,
    /// Decide and carry out idle stops and deletions, on what the activity pass recorded.
    Reap,
    /// Report containers labelled by berth whose object is gone.
    Housekeeping,
}

impl Pass {
    /// Activity runs before reaping because reaping decides on what it records.
    pub const ALL: [Pass; 6] = [
        Pass::Resync,
        Pass::Schedules,
        Pass::Activity,
        Pass::Network,
        Pass::Reap,
        Pass::Housekeeping,
    ];

    /// The `pass` label of `scheduler_pass_duration_seconds`.
    pub fn label(self) -> &'static str {
        match self {
            Pass::Resync => "resync",
            Pass::Schedules => "schedules",
            Pass::Activity => "activity",
            Pass::Network => "network",
            Pass::Reap => "reap",
            Pass::Housekeeping => "housekeeping",
        }
    }
}

/// What each pass does, and where its timings go. Each pass is awaited before the next starts,
/// so two passes never overlap; a pass handles its own errors (it reports them in status,
/// events and logs) because the loop must go on.
#[async_trait]
pub trait Passes: Send + Sync {
    async fn run(&self, pass: Pass);

    /// A pass finished after `took` (for `scheduler_pass_duration_seconds{pass}`).
    fn pass_finished(&self, _pass: Pass, _took: Duration) {}

    /// A whole round took `took`, longer than the interval (for `scheduler_overruns_total`);
    /// the next round starts at once instead of piling up.
    fn overrun(&self, _took: Duration) {}

    /// How long the passes waited, by design, for a saturated reconciler since this was last
    /// asked (once per round). That wait is the passes giving way, not falling behind: it does
    /// not count toward an overrun.
    fn take_waited(&self) -> Duration {
        Duration::ZERO
    }

    /// A pass panicked with `message` (for `scheduler_panics_total{pass}`); the loop goes on
    /// with the next pass.
    fn pass_panicked(&self, _pass: Pass, _message: &str) {}
}

/// Panics in a row after which a pass counts as unable to run, and `/readyz` says so.
pub const PANICS_BEFORE_UNREADY: u32 = 3;

/// How the scheduler loop fares, for `/readyz`: whether it still runs, and which passes keep
/// panicking.
#[derive(Debug, Default)]
pub struct Health {
    state: std::sync::Mutex<HealthState>,
}

#[derive(Debug, Default)]
struct HealthState {
    ended: bool,
    /// Per pass: panics in a row, and the last one's message.
    panics: BTreeMap<Pass, (u32, String)>,
}

impl Health {
    fn state(&self) -> std::sync::MutexGuard<'_, HealthState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn pass_ran(&self, pass: Pass) {
        self.state().panics.remove(&pass);
    }

    fn pass_panicked(&self, pass: Pass, message: &str) {
        let mut state = self.state();
        let entry = state.panics.entry(pass).or_default();
        entry.0 += 1;
        entry.1 = message.to_string();
    }

    /// `Err` with the reason when the scheduler cannot do its work: its loop ended, or a pass
    /// panicked [`PANICS_BEFORE_UNREADY`] times in a row.
    pub fn check(&self) -> Result<(), String> {
        let state = self.state();
        if state.ended {
            return Err("the scheduler loop stopped".to_string());
        }
        let failing: Vec<String> = state
            .panics
            .iter()
            .filter(|(_, (count, _))| *count >= PANICS_BEFORE_UNREADY)
            .map(|(pass, (count, message))| {
                format!(
                    "the {} pass panicked {count} times in a row (last: {message})",
                    pass.label()
                )
            })
            .collect();
        if failing.is_empty() {
            Ok(())
        } else {
            Err(failing.join("; "))
        }
    }
}

/// Marks the loop ended however it ends: returned, or dropped with its task.
struct Running(Arc<Health>);

impl Drop for Running {
    fn drop(&mut self) {
        self.0.state().ended = true;
    }
}

/// The text a panic carried.
pub(crate) fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".to_string())
}

/// Runs rounds of passes every `interval` until `shutdown` is cancelled. A round that outruns
/// the interval is counted (unless waiting for a saturated reconciler made it long) and the
/// next starts when it ends; shutdown lets the running pass
/// finish (a reap half done is worse than a late exit) and then returns. A pass that panics is
/// counted, logged and recorded in `health`, and the loop goes on: one bad object must not
/// stop the scheduler for the whole fleet.
pub async fn run(
    passes: Arc<dyn Passes>,
    interval: Duration,
    shutdown: CancellationToken,
    health: Arc<Health>,
) {
    let _running = Running(Arc::clone(&health));
    loop {
        let started = Instant::now();
        for pass in Pass::ALL {
            if shutdown.is_cancelled() {
                return;
            }
            let pass_started = Instant::now();
            match AssertUnwindSafe(passes.run(pass)).catch_unwind().await {
                Ok(()) => health.pass_ran(pass),
                Err(payload) => {
                    let message = panic_message(payload.as_ref());
                    tracing::error!(pass = pass.label(), panic = %message, "a scheduler pass panicked; the loop goes on");
                    health.pass_panicked(pass, &message);
                    passes.pass_panicked(pass, &message);
                }
            }
            passes.pass_finished(pass, pass_started.elapsed());
        }
        let took = started.elapsed();
        if took > interval {
            // Still the next round starts at once: the interval has gone by either way.
            if took.saturating_sub(passes.take_waited()) > interval {
                passes.overrun(took);
            }
            continue;
        }
        passes.take_waited();
        tokio::select! {
            _ = tokio::time::sleep_until(started + interval) => {}
            _ = shutdown.cancelled() => return,
        }
    }
}

/// Runs `work` for every item, at most `workers` at once, each given up on after
/// `per_item_timeout` (reported as `None`). Results come back keyed by item.
pub async fn bounded<K, F, Fut, R>(
    items: Vec<K>,
    workers: usize,
    per_item_timeout: Duration,
    work: F,
) -> BTreeMap<K, Option<R>>
where
    K: Ord + Clone,
    F: Fn(K) -> Fut,
    Fut: Future<Output = R>,
{
    futures::stream::iter(items)
        .map(|key| {
            let fut = work(key.clone());
            async move { (key, tokio::time::timeout(per_item_timeout, fut).await.ok()) }
        })
        .buffer_unordered(workers.max(1))
        .collect()
        .await
}

/// One project for the activity pass to inspect: its instance and what to expect there.
#[derive(Debug, Clone)]
pub struct InspectTarget {
    pub instance: String,
    pub expected: Expected,
}

/// Inspects every target, at most `workers` at once, each within `timeout` (a timeout is an
/// [`InspectError::Timeout`], which refuses reaping like any failure).
pub async fn inspect_all(
    runtime: Arc<dyn Runtime>,
    targets: Vec<InspectTarget>,
    workers: usize,
    timeout: Duration,
) -> BTreeMap<String, Result<Inspection, InspectError>> {
    let expected: BTreeMap<String, Expected> = targets
        .into_iter()
        .map(|t| (t.instance, t.expected))
        .collect();
    let names: Vec<String> = expected.keys().cloned().collect();
    let expected = &expected;
    let results = bounded(names, workers, timeout, |name| {
        let runtime = runtime.clone();
        async move { inspect::inspect(runtime.as_ref(), &name, &expected[&name], timeout).await }
    })
    .await;
    results
        .into_iter()
        .map(|(name, result)| (name, result.unwrap_or(Err(InspectError::Timeout(timeout)))))
        .collect()
}

#[cfg(test)]
#[path = "loop_tests.rs"]
mod tests;
