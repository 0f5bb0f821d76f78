//! The controller: a work queue of project names and the reconcile that drives each project's
//! LXD container, volumes and status toward its spec.
//!
//! Composed like a kube-runtime controller: three triggers (the store's change feed, LXD's event
//! stream, a periodic resync) request project names on a [`WorkQueue`]; the queue runs
//! [`project::reconcile`] for each, one at a time per project, several projects at once.
//!
//! Invariants: only the controller writes status; one reconcile per project at a time; one
//! reconcile advances at most one durable step, and a step's side effect is recorded in the store
//! before the next step starts; a container without the project's uid label is never touched.
//!
//! Its parts: `queue.rs` (every reconcile: dedup by key, earliest time wins, one run per key with
//! a held re-run, a concurrency cap, backoff with jitter, per-key locks for the reaper, the error
//! policy hook), `error_policy.rs` (LXD busy retried within `BUSY_RETRY`, a spec LXD refuses
//! waits for a spec change, anything else after the backoff), `startup.rs`, `triggers.rs`,
//! `own_changes.rs`, `snapshot.rs`, `project.rs` and `project/` (one reconcile, up to
//! `STEPS_PER_RECONCILE` steps in a row; the container a step just read and the aliases it
//! resolved carry to the next step as `Carried`), `commit.rs` (the finalizer commits through it
//! too), `status.rs` (the status one reconcile rewrites; `ever_reachable` and `idling`, the one
//! reading each of `status.firstReachableAt` and of "idled and not woken"), `steps.rs`,
//! `agent_steps/`, `envelope.rs`, `fleet.rs` (a list answers for a missing container only when it
//! began after the read that found it absent), `placement.rs` (`choose_member`, a pure decision,
//! and `Placer`, one placement at a time on a count reused for a batch), `pool.rs`, `replace.rs`,
//! `wake.rs`, `finalizer/` and `fault.rs`.

pub mod agent_steps;
mod commit;
pub mod envelope;
pub mod error_policy;
pub mod fault;
pub mod finalizer;
pub mod fleet;
pub mod own_changes;
pub mod placement;
pub mod pool;
pub mod project;
pub mod queue;
pub mod replace;
pub mod snapshot;
pub mod startup;
pub mod status;
pub mod steps;
pub mod triggers;
pub mod wake;

use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

pub use agent_steps::{AgentSettings, AgentSteps};
pub use queue::{Action, Backoff, KeyLock, WorkQueue};
pub use snapshot::Strays;
pub use startup::{connect_runtime, pool_enforces_sizes, settings_from_config};
pub use steps::{LaterSteps, NoLaterSteps, StepError, StepOutcome};

use crate::metrics::Metrics;
use crate::runtime::{Runtime, RuntimeError};
use crate::store::{Store, StoreError};

/// Deadlines of the calls and steps the controller makes.
#[derive(Debug, Clone)]
pub struct Timeouts {
    /// Creating a container (unpacking the image).
    pub create: Duration,
    pub start: Duration,
    /// How long a container gets to shut down cleanly before it is killed.
    pub clean_stop: Duration,
    pub delete: Duration,
    /// One exec round trip.
    pub exec: Duration,
    /// From start until an exec answers; past it `Ready=False`, reason `BootTimeout`.
    pub boot: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            create: Duration::from_secs(300),
            start: Duration::from_secs(60),
            clean_stop: Duration::from_secs(30),
            delete: Duration::from_secs(60),
            exec: Duration::from_secs(10),
            boot: Duration::from_secs(120),
        }
    }
}

/// What the controller needs from the configuration.
#[derive(Debug, Clone)]
pub struct ControllerSettings {
    /// Pool of the durable volumes and root disks.
    pub storage_pool: String,
    /// Whether that pool enforces sizes (LXD's `dir` driver does not).
    pub pool_enforces_quotas: bool,
    /// Cluster member or group to place containers and volumes on.
    pub target: Option<String>,
    /// Reconciles that may run at once.
    pub workers: usize,
    /// How often every project is checked for drift the events missed.
    pub resync_interval: Duration,
    pub backoff: Backoff,
    pub timeouts: Timeouts,
    /// How often a held deletion's workspace is inspected again (`scheduler.recheckInterval`).
    pub held_recheck: Duration,
    /// What a deletion does with the volumes (`trash.retention`).
    pub trash: crate::trash::TrashSettings,
    /// `defaults.image`: what a workspace volume without a container is inspected from when
    /// the project's own images are gone.
    pub default_image: String,
    /// berth's agent socket, which a project with the `schedules` capability reaches from
    /// inside its container; `None` when the daemon serves none.
    pub agent_api_socket: Option<std::path::PathBuf>,
    /// The warm pool new projects of `default_image` claim from (`pool.size`, default none);
    /// shared with the API, which shows it.
    pub pool: Arc<pool::WarmPool>,
}

impl Default for ControllerSettings {
    fn default() -> Self {
        ControllerSettings {
            storage_pool: "default".to_string(),
            pool_enforces_quotas: false,
            target: None,
            workers: 8,
            resync_interval: Duration::from_secs(30),
            backoff: Backoff::default(),
            timeouts: Timeouts::default(),
            held_recheck: crate::config::HELD_RECHECK,
            trash: crate::trash::TrashSettings::default(),
            default_image: "berth-base".to_string(),
            agent_api_socket: None,
            pool: Arc::default(),
        }
    }
}

/// Why a reconcile failed; [`error_policy::error_policy`] says when the queue tries again.
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    #[error("LXD: {0}")]
    Runtime(#[from] RuntimeError),
    /// LXD failed the call that performs `step` (starting the container for `Started`).
    #[error("LXD: {source}")]
    StepCall {
        step: berth_api::Step,
        #[source]
        source: RuntimeError,
    },
    #[error("store: {0}")]
    Store(#[from] StoreError),
    /// The store refuses writes: acting now could not be recorded, so nothing is done.
    #[error("the store cannot be written, so the controller does nothing: {0}")]
    StoreUnwritable(String),
    /// A later step failed for another reason than LXD (the store, the secrets).
    #[error("{0}")]
    Step(StepError),
    /// The spec asks for what LXD refuses: trying again fails the same way until it changes.
    #[error("{0}")]
    Spec(String),
    #[error("{0}")]
    Failed(String),
    /// Failed, and the status already says why (its own reason and message).
    #[error("{0}")]
    Recorded(String),
}

impl ReconcileError {
    /// Whether the failure belongs in the project's status as a failed step: not when the
    /// status already says it, nor when the store is what failed (it could not be written).
    pub fn is_step_failure(&self) -> bool {
        !matches!(
            self,
            ReconcileError::Recorded(_)
                | ReconcileError::Store(_)
                | ReconcileError::StoreUnwritable(_)
        )
    }
}

impl From<StepError> for ReconcileError {
    fn from(error: StepError) -> Self {
        match error {
            StepError::Runtime(e) => ReconcileError::Runtime(e),
            other => ReconcileError::Step(other),
        }
    }
}

/// Everything a reconcile uses, shared by the queue's tasks.
pub struct Context {
    pub store: Arc<Store>,
    pub runtime: Arc<dyn Runtime>,
    pub metrics: Arc<Metrics>,
    pub settings: ControllerSettings,
    pub later_steps: Arc<dyn LaterSteps>,
    pub fleet: fleet::FleetGuard,
    /// The last resync pass's list of containers.
    pub snapshot: snapshot::Snapshot,
    /// The LXD events berth's own calls will cause, which request no reconcile.
    pub own_changes: own_changes::OwnChanges,
    pub queue: WorkQueue,
    /// When each held deletion was last looked at (the finalizer's memory; safe to forget).
    pub held: finalizer::HeldDeletions,
    /// Places new projects on cluster members one at a time.
    pub placement: placement::Placer,
}

impl Context {
    /// A controller's context over these parts, with nothing listed, placed or held yet.
    pub fn new(
        store: Arc<Store>,
        runtime: Arc<dyn Runtime>,
        metrics: Arc<Metrics>,
        settings: ControllerSettings,
        later_steps: Arc<dyn LaterSteps>,
        queue: WorkQueue,
    ) -> Context {
        Context {
            store,
            runtime,
            metrics,
            settings,
            later_steps,
            fleet: fleet::FleetGuard::default(),
            snapshot: snapshot::Snapshot::default(),
            own_changes: Default::default(),
            queue,
            held: Default::default(),
            placement: Default::default(),
        }
    }
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

/// The running controller: its queue (for others to request or lock projects) and its tasks.
#[derive(Debug)]
pub struct ControllerHandle {
    pub queue: WorkQueue,
    pub context: Arc<Context>,
    cancel: CancellationToken,
    tasks: Vec<JoinHandle<()>>,
}

/// A resync of the whole fleet, as the controller does it: what [`ControllerHandle::resync`]
/// hands the scheduler. It answers what its list showed of stray containers, for housekeeping.
pub type Resync =
    Arc<dyn Fn() -> futures::future::BoxFuture<'static, Option<Arc<Strays>>> + Send + Sync>;

impl ControllerHandle {
    /// The controller's resync pass (one list of the fleet, then every project requested), for
    /// the scheduler's resync pass to run; skipped when another listed the fleet recently.
    pub fn resync(&self) -> Resync {
        let context = Arc::clone(&self.context);
        Arc::new(move || {
            let context = Arc::clone(&context);
            Box::pin(async move { triggers::resync_unless_fresh(&context).await })
        })
    }

    /// Stops the triggers, lets running reconciles finish and waits for all of it.
    pub async fn shutdown(self) {
        self.cancel.cancel();
        for task in self.tasks {
            let _ = task.await;
        }
    }
}

/// Starts the controller: the queue's runner, the triggers and the periodic resync. It acts
/// until `cancel` fires (or [`ControllerHandle::shutdown`]).
pub fn spawn_controller(
    store: Arc<Store>,
    runtime: Arc<dyn Runtime>,
    metrics: Arc<Metrics>,
    settings: ControllerSettings,
    later_steps: Arc<dyn LaterSteps>,
    cancel: CancellationToken,
) -> ControllerHandle {
    let queue = WorkQueue::new(settings.workers, settings.backoff, metrics.clone());
    let context = Arc::new(Context::new(
        store,
        runtime,
        metrics,
        settings,
        later_steps,
        queue.clone(),
    ));

    let mut tasks = Vec::new();
    let ctx = context.clone();
    let run_cancel = cancel.clone();
    tasks.push(tokio::spawn(async move {
        let queue = ctx.queue.clone();
        queue
            .run_with_policy(
                run_cancel,
                move |name: String| {
                    let ctx = ctx.clone();
                    async move { project::reconcile(&ctx, &name).await }
                },
                error_policy::error_policy,
            )
            .await;
    }));
    tasks.push(tokio::spawn(triggers::watch_store(
        context.clone(),
        cancel.clone(),
    )));
    tasks.push(tokio::spawn(triggers::watch_lxd_events(
        context.clone(),
        cancel.clone(),
    )));
    tasks.push(tokio::spawn(triggers::resync(
        context.clone(),
        cancel.clone(),
    )));
    tasks.push(tokio::spawn(triggers::watch_phases(
        context.clone(),
        cancel.clone(),
    )));
    tasks.push(tokio::spawn(pool::refill(context.clone(), cancel.clone())));

    ControllerHandle {
        queue,
        context,
        cancel,
        tasks,
    }
}

#[cfg(test)]
mod tests;
