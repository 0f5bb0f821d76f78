//! The work queue that owns every reconcile.
//!
//! Modelled on kube-runtime's scheduler and runner: keys (project names) are requested with a
//! time to run at; a key requested again keeps the earliest time; a key runs at most once at a
//! time (a request that arrives while it runs is held and runs once more afterwards); at most
//! `concurrency` keys run together; the outcome decides when the key runs next: a requeue after
//! the delay the reconciler asked for, an error after a per-key exponential backoff with jitter
//! that a success resets. A key backing off after an error is not run sooner because something
//! was observed about it (an LXD event its own failed call caused, a resync): only a change to
//! what it asks for ([`WorkQueue::request_change`]) runs it before its retry. Other components (the reaper) take a key's slot with [`WorkQueue::lock`]
//! so their work and a reconcile of the same project never overlap.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::fmt::Display;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures::FutureExt;
use rand::Rng;
use tokio::sync::Notify;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::metrics::{Metrics, ReconcileResult};

/// What a reconcile asks of the queue when it succeeds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Run again after this delay; `Duration::ZERO` when a step finished and the next may start.
    Requeue(Duration),
    /// Nothing left to do until something changes (or the periodic resync asks again).
    Done,
}

/// The default error policy: retry after the key's backoff.
pub fn retry_after_backoff<E>(_key: &str, _error: &E, backoff: Duration) -> Action {
    Action::Requeue(backoff)
}

/// A failed reconcile on its way to [`WorkQueue::finish`]: its message, and the error policy's
/// answer for a given backoff delay.
struct Failure {
    message: String,
    next: Box<dyn FnOnce(Duration) -> Action + Send>,
}

/// Per-key exponential backoff after errors.
#[derive(Debug, Clone, Copy)]
pub struct Backoff {
    /// Delay after the first error.
    pub initial: Duration,
    /// No delay grows past this.
    pub max: Duration,
    /// Fraction of the delay taken off at random (0.0 to 1.0), so keys that failed together
    /// do not retry in lockstep.
    pub jitter: f64,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            initial: Duration::from_millis(500),
            max: Duration::from_secs(300),
            jitter: 0.25,
        }
    }
}

impl Backoff {
    /// The delay before retry number `failures` (1 for the first error).
    pub fn delay(&self, failures: u32) -> Duration {
        let exp = failures.saturating_sub(1).min(30);
        let raw = self.initial.saturating_mul(1u32 << exp).min(self.max);
        if self.jitter <= 0.0 {
            return raw;
        }
        let cut = rand::rng().random_range(0.0..self.jitter.min(1.0));
        raw.mul_f64(1.0 - cut)
    }
}

#[derive(Debug, Default)]
struct State {
    /// Earliest requested run time per key.
    pending: HashMap<String, (Instant, u64)>,
    /// The same entries ordered by time, then by request order.
    order: BTreeSet<(Instant, u64, String)>,
    /// Keys whose reconcile is running now.
    running: HashSet<String>,
    /// Keys held by [`WorkQueue::lock`].
    locked: HashSet<String>,
    /// Consecutive errors per key.
    failures: HashMap<String, u32>,
    /// Keys backing off after an error: no observed event runs them before this time.
    retry_at: HashMap<String, Instant>,
    /// Keys whose pending request is for a change to what they ask for: it keeps its time even
    /// when the key is backing off.
    changed: HashSet<String>,
    seq: u64,
}

impl State {
    fn busy(&self, key: &str) -> bool {
        self.running.contains(key) || self.locked.contains(key)
    }

    /// When an observation about `key` may run it: not before its backoff ends.
    fn observed_at(&self, key: &str, at: Instant) -> Instant {
        self.retry_at.get(key).map_or(at, |&retry| retry.max(at))
    }

    /// Drops `key`'s pending request.
    fn unrequest(&mut self, key: &str) {
        if let Some((at, seq)) = self.pending.remove(key) {
            self.order.remove(&(at, seq, key.to_string()));
        }
        self.changed.remove(key);
    }

    /// Records a request; an earlier one already pending wins.
    fn request(&mut self, key: &str, at: Instant) -> bool {
        if let Some(&(existing, seq)) = self.pending.get(key) {
            if existing <= at {
                return false;
            }
            self.order.remove(&(existing, seq, key.to_string()));
        }
        self.seq += 1;
        self.pending.insert(key.to_string(), (at, self.seq));
        self.order.insert((at, self.seq, key.to_string()));
        true
    }

    /// The first due key that is not busy, removed from the pending set, with its run time.
    fn pop_due(&mut self, now: Instant) -> Option<(String, Instant)> {
        let found = self
            .order
            .iter()
            .take_while(|(at, _, _)| *at <= now)
            .find(|(_, _, key)| !self.busy(key))
            .cloned()?;
        self.order.remove(&found);
        self.pending.remove(&found.2);
        self.changed.remove(&found.2);
        Some((found.2, found.0))
    }

    /// When the runner must look again: the earliest pending time of a key that is not busy.
    fn next_wake(&self) -> Option<Instant> {
        self.order
            .iter()
            .find(|(_, _, key)| !self.busy(key))
            .map(|(at, _, _)| *at)
    }
}

struct Shared {
    state: Mutex<State>,
    /// Wakes the runner: a new request, a freed slot.
    runner_wake: Notify,
    /// Wakes [`WorkQueue::lock`] callers waiting for a key to free.
    slot_freed: Notify,
    concurrency: usize,
    backoff: Backoff,
    metrics: Arc<Metrics>,
}

/// A cloneable handle to the queue: request keys, take a key's slot, run the reconciles.
#[derive(Clone)]
pub struct WorkQueue {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for WorkQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkQueue")
            .field("concurrency", &self.shared.concurrency)
            .finish_non_exhaustive()
    }
}

/// Holds one key's slot: no reconcile of that key runs until this is dropped.
#[derive(Debug)]
pub struct KeyLock {
    queue: WorkQueue,
    key: String,
}

impl Drop for KeyLock {
    fn drop(&mut self) {
        let shared = &self.queue.shared;
        shared.lock_state().locked.remove(&self.key);
        shared.runner_wake.notify_one();
        shared.slot_freed.notify_waiters();
    }
}

impl Shared {
    fn lock_state(&self) -> MutexGuard<'_, State> {
        // A panic while holding this lock cannot leave the state half-written in a way that
        // matters more than stopping the controller, so a poisoned lock is taken as is.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn update_depth(&self, state: &State) {
        self.metrics.workqueue_depth.set(state.pending.len() as i64);
    }
}

impl WorkQueue {
    pub fn new(concurrency: usize, backoff: Backoff, metrics: Arc<Metrics>) -> Self {
        WorkQueue {
            shared: Arc::new(Shared {
                state: Mutex::new(State::default()),
                runner_wake: Notify::new(),
                slot_freed: Notify::new(),
                concurrency: concurrency.max(1),
                backoff,
                metrics,
            }),
        }
    }

    /// Asks for `key` to be reconciled now, or once its backoff ends: something was observed
    /// about it (an LXD event, a resync), which is no reason to retry a failing key sooner.
    pub fn request_now(&self, key: &str) {
        self.request_at(key, Instant::now());
    }

    /// Asks for `key` to be reconciled after `delay` (or once its backoff ends, if later).
    pub fn request_after(&self, key: &str, delay: Duration) {
        self.request_at(key, Instant::now() + delay);
    }

    /// Asks for `key` to be reconciled at `at`, or once its backoff ends if that is later; an
    /// earlier request already pending wins.
    pub fn request_at(&self, key: &str, at: Instant) {
        self.add(key, at, false);
    }

    /// Asks for `key` to be reconciled now because what it asks for changed (its spec, its
    /// metadata): this runs it even while it backs off, since the change may be the fix.
    pub fn request_change(&self, key: &str) {
        self.add(key, Instant::now(), true);
    }

    fn add(&self, key: &str, at: Instant, change: bool) {
        let shared = &self.shared;
        shared.metrics.workqueue_adds.inc();
        let mut state = shared.lock_state();
        let at = if change {
            at
        } else {
            state.observed_at(key, at)
        };
        let added = state.request(key, at);
        if change {
            state.changed.insert(key.to_string());
        }
        if added {
            shared.update_depth(&state);
            drop(state);
            shared.runner_wake.notify_one();
        }
    }

    /// Whether the reconciler is at capacity: every worker busy, or work due that no worker
    /// has taken yet (a large apply converging).
    pub fn saturated(&self) -> bool {
        let state = self.shared.lock_state();
        let now = Instant::now();
        state.running.len() >= self.shared.concurrency
            || state
                .order
                .iter()
                .take_while(|(at, _, _)| *at <= now)
                .any(|(_, _, key)| !state.busy(key))
    }

    /// How many keys wait to run (including keys held while they run).
    pub fn depth(&self) -> usize {
        self.shared.lock_state().pending.len()
    }

    /// Whether `key` waits to run.
    pub fn is_requested(&self, key: &str) -> bool {
        self.shared.lock_state().pending.contains_key(key)
    }

    /// Forgets a key's pending request and backoff (the project is gone).
    pub fn forget(&self, key: &str) {
        let mut state = self.shared.lock_state();
        state.unrequest(key);
        state.failures.remove(key);
        state.retry_at.remove(key);
        self.shared.update_depth(&state);
    }

    /// Takes `key`'s slot exclusively, waiting for a running reconcile of it to finish.
    /// Requests for the key made meanwhile wait until the returned lock is dropped.
    pub async fn lock(&self, key: &str) -> KeyLock {
        loop {
            let freed = self.shared.slot_freed.notified();
            tokio::pin!(freed);
            // Registered before checking, so a release between the check and the await wakes us.
            freed.as_mut().enable();
            {
                let mut state = self.shared.lock_state();
                if !state.busy(key) {
                    state.locked.insert(key.to_string());
                    return KeyLock {
                        queue: self.clone(),
                        key: key.to_string(),
                    };
                }
            }
            freed.await;
        }
    }

    /// Runs reconciles until `cancel` fires, then waits for the running ones to finish; every
    /// error is retried after the key's backoff ([`retry_after_backoff`]).
    pub async fn run<F, Fut, E>(&self, cancel: CancellationToken, reconcile: F)
    where
        F: Fn(String) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Action, E>> + Send + 'static,
        E: Display + Send + 'static,
    {
        self.run_with_policy(cancel, reconcile, retry_after_backoff)
            .await
    }

    /// [`WorkQueue::run`] with an error policy (kube-runtime's `error_policy`): given the key,
    /// the error and the key's backoff delay, it says what the queue does next. A panic is
    /// retried after the backoff, whatever the policy.
    pub async fn run_with_policy<F, Fut, E, P>(
        &self,
        cancel: CancellationToken,
        reconcile: F,
        error_policy: P,
    ) where
        F: Fn(String) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Action, E>> + Send + 'static,
        E: Display + Send + 'static,
        P: Fn(&str, &E, Duration) -> Action + Send + Sync + 'static,
    {
        let reconcile = Arc::new(reconcile);
        let error_policy = Arc::new(error_policy);
        let mut tasks = JoinSet::new();
        loop {
            let wake = self.shared.runner_wake.notified();
            tokio::pin!(wake);
            wake.as_mut().enable();

            let next_wake = {
                let mut state = self.shared.lock_state();
                let now = Instant::now();
                while state.running.len() < self.shared.concurrency {
                    let Some((key, due)) = state.pop_due(now) else {
                        break;
                    };
                    state.running.insert(key.clone());
                    self.shared
                        .metrics
                        .workqueue_queue_duration
                        .observe(now.saturating_duration_since(due).as_secs_f64());
                    let queue = self.clone();
                    let reconcile = reconcile.clone();
                    let error_policy = error_policy.clone();
                    tasks.spawn(async move {
                        let started = Instant::now();
                        let outcome = AssertUnwindSafe(reconcile(key.clone()))
                            .catch_unwind()
                            .await;
                        let outcome = match outcome {
                            Ok(Ok(action)) => Ok(action),
                            Ok(Err(e)) => {
                                let failed = key.clone();
                                Err(Failure {
                                    message: e.to_string(),
                                    next: Box::new(move |backoff| {
                                        error_policy(&failed, &e, backoff)
                                    }),
                                })
                            }
                            Err(_) => Err(Failure {
                                message: "the reconcile panicked".to_string(),
                                next: Box::new(Action::Requeue),
                            }),
                        };
                        queue.finish(&key, outcome, started.elapsed());
                    });
                }
                self.shared.update_depth(&state);
                if state.running.len() < self.shared.concurrency {
                    state.next_wake()
                } else {
                    None
                }
            };

            let sleep = async {
                match next_wake {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = cancel.cancelled() => break,
                _ = &mut wake => {}
                _ = sleep => {}
                Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
            }
        }
        while tasks.join_next().await.is_some() {}
    }

    /// Applies a reconcile's outcome: frees the key's slot and schedules its next run.
    fn finish(&self, key: &str, outcome: Result<Action, Failure>, took: Duration) {
        let shared = &self.shared;
        let now = Instant::now();
        let mut state = shared.lock_state();
        state.running.remove(key);
        let result = match outcome {
            Ok(Action::Done) => {
                state.failures.remove(key);
                state.retry_at.remove(key);
                ReconcileResult::Success
            }
            Ok(Action::Requeue(delay)) => {
                state.failures.remove(key);
                state.retry_at.remove(key);
                state.request(key, now + delay);
                ReconcileResult::Requeue
            }
            Err(Failure { message, next }) => {
                let failures = state.failures.entry(key.to_string()).or_insert(0);
                *failures = failures.saturating_add(1);
                let backoff = shared.backoff.delay(*failures);
                let next = next(backoff);
                let retry = now
                    + match next {
                        Action::Requeue(delay) => delay,
                        Action::Done => backoff,
                    };
                state.retry_at.insert(key.to_string(), retry);
                // What was observed while it ran (often the events of its own failed call)
                // waits for the backoff too; a change to the key keeps its time.
                if !state.changed.contains(key)
                    && let Some(&(at, _)) = state.pending.get(key)
                {
                    state.unrequest(key);
                    state.request(key, at.max(retry));
                }
                match next {
                    Action::Requeue(delay) => {
                        tracing::warn!(project = key, error = %message, retry_in = ?delay, "reconcile failed");
                        state.request(key, retry);
                        shared.metrics.workqueue_retries.inc();
                    }
                    Action::Done => {
                        tracing::warn!(project = key, error = %message, "reconcile failed; not retried");
                    }
                }
                ReconcileResult::Error
            }
        };
        shared.update_depth(&state);
        drop(state);
        shared.metrics.record_reconcile(result, took.as_secs_f64());
        shared.runner_wake.notify_one();
        shared.slot_freed.notify_waiters();
    }

    /// Consecutive errors recorded for `key`.
    pub fn failures(&self, key: &str) -> u32 {
        self.shared
            .lock_state()
            .failures
            .get(key)
            .copied()
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A reconciler whose behaviour per call is scripted, recording every call with its time.
    #[derive(Clone, Default)]
    struct Script {
        calls: Arc<Mutex<Vec<(String, Instant)>>>,
        running: Arc<AtomicUsize>,
        max_running: Arc<AtomicUsize>,
        per_key_running: Arc<Mutex<HashMap<String, usize>>>,
        overlaps: Arc<AtomicUsize>,
    }

    impl Script {
        fn calls(&self) -> Vec<(String, Instant)> {
            self.calls.lock().unwrap().clone()
        }
        fn keys(&self) -> Vec<String> {
            self.calls().into_iter().map(|(k, _)| k).collect()
        }
    }

    fn no_jitter() -> Backoff {
        Backoff {
            initial: Duration::from_secs(1),
            max: Duration::from_secs(8),
            jitter: 0.0,
        }
    }

    /// Starts a queue whose reconcile takes `work` and then returns `outcome(key, call_number)`.
    fn start(
        concurrency: usize,
        work: Duration,
        outcome: impl Fn(&str, usize) -> Result<Action, String> + Send + Sync + 'static,
    ) -> (WorkQueue, Script, CancellationToken) {
        start_with_policy(concurrency, work, outcome, retry_after_backoff)
    }

    fn start_with_policy(
        concurrency: usize,
        work: Duration,
        outcome: impl Fn(&str, usize) -> Result<Action, String> + Send + Sync + 'static,
        error_policy: impl Fn(&str, &String, Duration) -> Action + Send + Sync + 'static,
    ) -> (WorkQueue, Script, CancellationToken) {
        let queue = WorkQueue::new(concurrency, no_jitter(), Arc::new(Metrics::new()));
        let script = Script::default();
        let cancel = CancellationToken::new();
        let outcome = Arc::new(outcome);
        let s = script.clone();
        let q = queue.clone();
        let c = cancel.clone();
        tokio::spawn(async move {
            q.run_with_policy(
                c,
                move |key: String| {
                    let s = s.clone();
                    let outcome = outcome.clone();
                    async move {
                        let n = {
                            let mut calls = s.calls.lock().unwrap();
                            calls.push((key.clone(), Instant::now()));
                            calls.iter().filter(|(k, _)| *k == key).count()
                        };
                        {
                            let mut per_key = s.per_key_running.lock().unwrap();
                            let c = per_key.entry(key.clone()).or_insert(0);
                            *c += 1;
                            if *c > 1 {
                                s.overlaps.fetch_add(1, Ordering::SeqCst);
                            }
                        }
                        let now = s.running.fetch_add(1, Ordering::SeqCst) + 1;
                        s.max_running.fetch_max(now, Ordering::SeqCst);
                        tokio::time::sleep(work).await;
                        s.running.fetch_sub(1, Ordering::SeqCst);
                        *s.per_key_running.lock().unwrap().get_mut(&key).unwrap() -= 1;
                        outcome(&key, n)
                    }
                },
                error_policy,
            )
            .await
        });
        (queue, script, cancel)
    }

    /// Lets spawned tasks run and paused time move forward by `d`.
    async fn advance(d: Duration) {
        tokio::time::sleep(d).await;
    }

    #[tokio::test(start_paused = true)]
    async fn repeated_requests_dedup_and_earliest_time_wins() {
        let (queue, script, cancel) = start(4, Duration::from_millis(10), |_, _| Ok(Action::Done));
        queue.request_after("a", Duration::from_secs(10));
        queue.request_after("a", Duration::from_secs(2));
        queue.request_after("a", Duration::from_secs(5));
        assert_eq!(queue.depth(), 1);
        let t0 = Instant::now();
        advance(Duration::from_secs(20)).await;
        let calls = script.calls();
        assert_eq!(calls.len(), 1, "one run for three requests");
        let ran_after = calls[0].1 - t0;
        assert!(
            ran_after >= Duration::from_secs(2) && ran_after < Duration::from_secs(3),
            "{ran_after:?}"
        );
        cancel.cancel();
    }

    #[tokio::test(start_paused = true)]
    async fn a_key_runs_once_at_a_time_and_a_request_while_running_is_held() {
        let (queue, script, cancel) = start(4, Duration::from_secs(5), |_, _| Ok(Action::Done));
        queue.request_now("a");
        advance(Duration::from_secs(1)).await;
        assert_eq!(script.keys(), ["a"]);
        // Requested twice while running: held, not run concurrently, run once afterwards.
        queue.request_now("a");
        queue.request_now("a");
        advance(Duration::from_secs(2)).await;
        assert_eq!(script.calls().len(), 1);
        advance(Duration::from_secs(20)).await;
        assert_eq!(script.keys(), ["a", "a"]);
        assert_eq!(script.overlaps.load(Ordering::SeqCst), 0);
        let calls = script.calls();
        assert!(calls[1].1 - calls[0].1 >= Duration::from_secs(5));
        cancel.cancel();
    }

    #[tokio::test(start_paused = true)]
    async fn keys_run_in_order_of_their_time_then_of_request() {
        let (queue, script, cancel) = start(1, Duration::from_millis(10), |_, _| Ok(Action::Done));
        queue.request_after("late", Duration::from_secs(3));
        queue.request_after("first", Duration::from_secs(1));
        queue.request_after("second", Duration::from_secs(1));
        queue.request_after("middle", Duration::from_secs(2));
        advance(Duration::from_secs(10)).await;
        assert_eq!(script.keys(), ["first", "second", "middle", "late"]);
        cancel.cancel();
    }

    #[tokio::test(start_paused = true)]
    async fn concurrency_is_capped() {
        let (queue, script, cancel) = start(3, Duration::from_secs(1), |_, _| Ok(Action::Done));
        for i in 0..10 {
            queue.request_now(&format!("p{i}"));
        }
        advance(Duration::from_millis(500)).await;
        assert_eq!(script.running.load(Ordering::SeqCst), 3);
        advance(Duration::from_secs(10)).await;
        assert_eq!(script.calls().len(), 10);
        assert_eq!(script.max_running.load(Ordering::SeqCst), 3);
        assert_eq!(queue.depth(), 0);
        cancel.cancel();
    }

    #[tokio::test(start_paused = true)]
    async fn requeue_runs_after_its_delay_and_zero_means_at_once() {
        let (queue, script, cancel) = start(2, Duration::ZERO, |_, n| match n {
            1 => Ok(Action::Requeue(Duration::ZERO)),
            2 => Ok(Action::Requeue(Duration::from_secs(30))),
            _ => Ok(Action::Done),
        });
        let t0 = Instant::now();
        queue.request_now("a");
        advance(Duration::from_secs(60)).await;
        let calls = script.calls();
        assert_eq!(calls.len(), 3);
        assert!(
            calls[1].1 - t0 < Duration::from_millis(1),
            "a finished step runs at once"
        );
        assert_eq!(calls[2].1 - calls[1].1, Duration::from_secs(30));
        cancel.cancel();
    }

    #[tokio::test(start_paused = true)]
    async fn errors_back_off_exponentially_capped_and_reset_on_success() {
        // Five failures, one success, then one more failure.
        let (queue, script, cancel) = start(1, Duration::ZERO, |_, n| match n {
            1..=5 => Err("boom".to_string()),
            6 => Ok(Action::Requeue(Duration::from_secs(100))),
            7 => Err("boom again".to_string()),
            _ => Ok(Action::Done),
        });
        queue.request_now("a");
        advance(Duration::from_secs(400)).await;
        let calls = script.calls();
        assert_eq!(calls.len(), 8);
        let gaps: Vec<u64> = calls
            .windows(2)
            .map(|w| (w[1].1 - w[0].1).as_secs())
            .collect();
        // 1, 2, 4, 8, capped at 8; the success requeues after 100; the next error starts again at 1.
        assert_eq!(gaps, [1, 2, 4, 8, 8, 100, 1]);
        assert_eq!(queue.failures("a"), 0);
        cancel.cancel();
    }

    #[tokio::test(start_paused = true)]
    async fn an_observation_waits_for_the_backoff_and_a_change_does_not() {
        // Every run fails; backoff 1, 2, 4, 8, 8 seconds.
        let (queue, script, cancel) =
            start(
                1,
                Duration::from_millis(100),
                |_, _| Err("boom".to_string()),
            );
        let t0 = Instant::now();
        queue.request_now("a");
        // Something is observed about the key while it runs (its own failed call's events)
        // and every 10ms afterwards (more events, a resync): none of it runs it sooner.
        advance(Duration::from_millis(50)).await;
        queue.request_now("a");
        for _ in 0..2_000 {
            advance(Duration::from_millis(10)).await;
            queue.request_now("a");
        }
        let calls = script.calls();
        let gaps: Vec<u64> = calls
            .windows(2)
            .map(|w| (w[1].1 - w[0].1).as_millis() as u64)
            .collect();
        assert_eq!(gaps, [1_100, 2_100, 4_100, 8_100], "runs at {calls:?}");
        // A change to what the key asks for runs it at once, backoff or not.
        // The fifth run (15.4s) failed; its retry is due at 23.5s.
        advance(Duration::from_secs(2)).await;
        let changed_at = Instant::now();
        assert!(changed_at - t0 < Duration::from_millis(23_500));
        queue.request_change("a");
        advance(Duration::from_millis(1)).await;
        let calls = script.calls();
        assert_eq!(calls.len(), 6);
        assert_eq!(calls[5].1, changed_at);
        cancel.cancel();
    }

    #[tokio::test(start_paused = true)]
    async fn the_error_policy_decides_what_follows_an_error() {
        // "fatal" is not retried; any other error is retried after a fixed 30s, not the backoff.
        let policy = |_: &str, error: &String, _backoff: Duration| {
            if error == "fatal" {
                Action::Done
            } else {
                Action::Requeue(Duration::from_secs(30))
            }
        };
        let (queue, script, cancel) = start_with_policy(
            1,
            Duration::ZERO,
            |key, n| match (key, n) {
                ("a", _) => Err("fatal".to_string()),
                ("b", 1) => Err("transient".to_string()),
                _ => Ok(Action::Done),
            },
            policy,
        );
        queue.request_now("a");
        queue.request_now("b");
        advance(Duration::from_secs(100)).await;
        let calls = script.calls();
        let at = |key: &str| -> Vec<Instant> {
            calls
                .iter()
                .filter(|(k, _)| k == key)
                .map(|(_, t)| *t)
                .collect()
        };
        assert_eq!(at("a").len(), 1, "a fatal error is not retried");
        let b = at("b");
        assert_eq!(b.len(), 2);
        assert_eq!((b[1] - b[0]).as_secs(), 30);
        assert_eq!(queue.failures("a"), 1);
        cancel.cancel();
    }

    #[tokio::test(start_paused = true)]
    async fn a_panicking_reconcile_is_an_error_and_frees_its_slot() {
        let (queue, script, cancel) = start(1, Duration::ZERO, |_, n| {
            if n == 1 {
                panic!("reconcile bug");
            }
            Ok(Action::Done)
        });
        queue.request_now("a");
        advance(Duration::from_secs(5)).await;
        assert_eq!(script.calls().len(), 2);
        cancel.cancel();
    }

    #[tokio::test(start_paused = true)]
    async fn lock_waits_for_a_running_reconcile_and_holds_later_ones() {
        let (queue, script, cancel) = start(2, Duration::from_secs(5), |_, _| Ok(Action::Done));
        queue.request_now("a");
        advance(Duration::from_secs(1)).await;
        let locked_at = Arc::new(Mutex::new(None));
        let q = queue.clone();
        let l = locked_at.clone();
        let holder = tokio::spawn(async move {
            let guard = q.lock("a").await;
            *l.lock().unwrap() = Some(Instant::now());
            tokio::time::sleep(Duration::from_secs(10)).await;
            drop(guard);
            Instant::now()
        });
        advance(Duration::from_secs(1)).await;
        assert!(
            locked_at.lock().unwrap().is_none(),
            "the reconcile still runs"
        );
        advance(Duration::from_secs(4)).await;
        let locked = locked_at
            .lock()
            .unwrap()
            .expect("lock taken once the reconcile ended");
        // While locked, a request waits; it runs once the lock is dropped.
        queue.request_now("a");
        queue.request_now("b");
        advance(Duration::from_secs(2)).await;
        assert_eq!(script.keys(), ["a", "b"]);
        let released = holder.await.unwrap();
        advance(Duration::from_secs(1)).await;
        let calls = script.calls();
        assert_eq!(script.keys(), ["a", "b", "a"]);
        assert!(calls[2].1 >= released && released >= locked);
        cancel.cancel();
    }

    #[test]
    fn jitter_stays_within_its_fraction() {
        let backoff = Backoff {
            initial: Duration::from_secs(4),
            max: Duration::from_secs(60),
            jitter: 0.25,
        };
        for _ in 0..200 {
            let d = backoff.delay(2);
            assert!(
                d <= Duration::from_secs(8) && d >= Duration::from_secs(6),
                "{d:?}"
            );
        }
        assert!(backoff.delay(20) <= Duration::from_secs(60));
    }
}
