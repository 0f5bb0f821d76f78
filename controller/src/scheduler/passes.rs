//! The daemon's scheduler passes: what each pass reads from the store, asks of LXD and writes
//! back into status, events and metrics.
//!
//! Status is shared with the reconciler, so every write here reads the stored status, changes
//! only the scheduler's fields and writes with the resourceVersion it read, retrying on a
//! conflict. Acting on a project (idling it, deleting it) and booting a stopped one to inspect
//! it happen only under the project's slot in the work queue, so no reconcile runs in between.
//!
//! What every inspection finds is recorded, whichever pass made it: the activity pass, the
//! look at a stopped project, or the re-check right before acting. So status, `reap --dry-run`
//! and the next pass all decide on the latest findings, and a refusal shows the moment it
//! happens.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use berth_api::{
    AgentState, ConditionStatus, Kind, Phase, ProjectSpec, ProjectStatus, ReapAction, Step,
    condition_types, find_condition,
};
use chrono::{DateTime, Utc};

use super::activity::PeopleActivity;
use super::memory::Memory;
use super::policy::{Evidence, ReapSubject};
use super::{Pass, Passes};
use crate::metrics::Metrics;
use crate::reconcile::WorkQueue;
use crate::reconcile::status::{Idling, idling};
use crate::runtime::Runtime;
use crate::store::{
    EventType, FieldManager, StatusWrite, StatusWritten, Store, StoreError, StoredObject,
};
use crate::workspace::inspect::Inspection;
use crate::workspace::protection::{self, reasons_text};

#[path = "pass_activity.rs"]
mod pass_activity;
#[path = "pass_housekeeping.rs"]
mod pass_housekeeping;
#[path = "pass_network.rs"]
mod pass_network;
#[path = "pass_reap.rs"]
mod pass_reap;
#[path = "pass_schedules.rs"]
mod pass_schedules;

/// The annotation a deletion the reaper asked for carries, so that events and audits tell it
/// from a person's.
pub const REAPED_ANNOTATION: &str = berth_api::annotations::REAPED_BY;

/// How many settle periods the activity pass waits at most for a saturated reconciler.
const YIELD_SETTLES: u32 = 4;

/// How often the activity pass looks whether the reconciler is still saturated.
const SATURATION_POLL: Duration = Duration::from_millis(250);

/// The scheduler's settings from berth.yaml.
#[derive(Debug, Clone)]
pub struct PassSettings {
    /// Inspections running at once (`scheduler.workers`).
    pub workers: usize,
    /// One inspection's deadline.
    pub inspect_timeout: Duration,
    /// `previewDomain` and the preview listener: what the URLs in `status.ports` look like.
    pub preview_site: crate::preview::PreviewSite,
    /// `scheduler.recheckInterval`: how long what a stopped project's inspection found stands
    /// before the project is booted to be inspected again.
    pub recheck_interval: Duration,
}

/// Where the passes read the time: the wall clock, or a simulated one in tests.
pub type Clock = Arc<dyn Fn() -> DateTime<Utc> + Send + Sync>;

/// What the passes need from the daemon.
pub struct DaemonPasses {
    store: Arc<Store>,
    runtime: Arc<dyn Runtime>,
    queue: WorkQueue,
    metrics: Arc<Metrics>,
    /// Exec and tool calls made through berth.
    activity_log: Arc<dyn PeopleActivity>,
    workers: usize,
    inspect_timeout: Duration,
    preview_site: crate::preview::PreviewSite,
    recheck_interval: Duration,
    clock: Clock,
    memory: Mutex<Memory>,
    /// This round's inspections by project uid, for the reap pass that follows.
    round: Mutex<BTreeMap<String, Result<Inspection, String>>>,
    /// The orphans (instance, uid) the last housekeeping pass saw, so each orphan episode is
    /// reported once.
    reported_orphans: Mutex<BTreeSet<(String, String)>>,
    /// The trash whose expired entries housekeeping purges.
    trash: Option<Arc<crate::trash::Trash>>,
    /// `events.retention`: how long a gone object's events stay before housekeeping prunes them.
    event_retention: Duration,
    /// A running project Ready for less than this is not inspected yet ([`Self::with_settle`]).
    settle: chrono::Duration,
    /// The uids this round left to settle: the reap pass leaves them alone too.
    settling: Mutex<BTreeSet<String>>,
    /// The controller's resync, run by the resync pass.
    controller_resync: Option<crate::reconcile::Resync>,
    /// How long the passes waited for a saturated reconciler this round ([`Passes::take_waited`]).
    waited: Mutex<Duration>,
    /// What the resync pass's list showed of stray containers: housekeeping's list.
    strays: Mutex<Option<Arc<crate::reconcile::Strays>>>,
    /// When the settle period was set: the daemon's start.
    started: DateTime<Utc>,
}

impl std::fmt::Debug for DaemonPasses {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DaemonPasses")
            .field("workers", &self.workers)
            .finish_non_exhaustive()
    }
}

impl DaemonPasses {
    pub fn new(
        store: Arc<Store>,
        runtime: Arc<dyn Runtime>,
        queue: WorkQueue,
        metrics: Arc<Metrics>,
        activity_log: Arc<dyn PeopleActivity>,
        settings: PassSettings,
    ) -> DaemonPasses {
        DaemonPasses {
            store,
            runtime,
            queue,
            metrics,
            activity_log,
            workers: settings.workers.max(1),
            inspect_timeout: settings.inspect_timeout,
            preview_site: settings.preview_site,
            recheck_interval: settings.recheck_interval,
            clock: Arc::new(crate::clock::now),
            memory: Mutex::new(Memory::new()),
            round: Mutex::new(BTreeMap::new()),
            reported_orphans: Mutex::new(BTreeSet::new()),
            trash: None,
            event_retention: crate::config::EVENT_RETENTION,
            settle: chrono::Duration::zero(),
            settling: Mutex::new(BTreeSet::new()),
            controller_resync: None,
            waited: Mutex::new(Duration::ZERO),
            strays: Mutex::new(None),
            started: Utc::now(),
        }
    }

    /// Leaves a project that became Ready less than `settle` ago uninspected (the daemon gives
    /// its scheduler interval): a workspace just made has no activity to measure and nothing
    /// due, and while a large apply converges, inspecting every project as it comes up would
    /// compete with the creates for LXD. Deletion and reaping still inspect it first
    /// ([`reap::recheck`], the finalizer's hold); its agent's reports arrive by the agent watch.
    /// The activity pass also waits for a saturated reconciler, at most a few settle periods,
    /// and housekeeping leaves the trash unswept for the first settle period and while the
    /// reconciler is saturated.
    pub fn with_settle(self, settle: Duration) -> DaemonPasses {
        DaemonPasses {
            settle: chrono::Duration::from_std(settle).unwrap_or(chrono::Duration::MAX),
            started: self.now(),
            ..self
        }
    }

    /// The resync pass runs the controller's resync: one list of the fleet that the reconciles
    /// it requests take their containers from. Requesting every project alone would have each
    /// reconcile read its container, one LXD call per project per interval.
    pub fn with_resync(self, resync: crate::reconcile::Resync) -> DaemonPasses {
        DaemonPasses {
            controller_resync: Some(resync),
            ..self
        }
    }

    /// Housekeeping prunes the events of objects gone longer than `retention` ago.
    pub fn with_event_retention(self, retention: Duration) -> DaemonPasses {
        DaemonPasses {
            event_retention: retention,
            ..self
        }
    }

    /// Housekeeping also purges what outlived the trash's retention.
    pub fn with_trash(self, trash: Arc<crate::trash::Trash>) -> DaemonPasses {
        DaemonPasses {
            trash: Some(trash),
            ..self
        }
    }

    fn now(&self) -> DateTime<Utc> {
        (self.clock)()
    }

    fn memory(&self) -> std::sync::MutexGuard<'_, Memory> {
        self.memory.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn projects(&self) -> Vec<Arc<StoredObject>> {
        self.store.list(Kind::Project)
    }

    fn uids(&self) -> BTreeSet<String> {
        self.projects()
            .iter()
            .map(|o| o.uid().to_string())
            .collect()
    }

    /// Waits while the reconciler is saturated, for at most [`YIELD_SETTLES`] settle periods:
    /// while a large apply converges, inspections would compete with its creates for LXD, and
    /// nothing an inspection finds is due within minutes. A fleet whose agents keep the
    /// reconciler busy without saturating it is inspected on time.
    async fn yield_to_reconciles(&self) {
        let Some(deadline) = self.settle.to_std().ok().and_then(|settle| {
            tokio::time::Instant::now().checked_add(settle.saturating_mul(YIELD_SETTLES))
        }) else {
            return;
        };
        let started = tokio::time::Instant::now();
        while self.queue.saturated() && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(SATURATION_POLL).await;
        }
        self.add_waited(started.elapsed());
    }

    /// The project's slot in the work queue; the wait counts as giving way to the reconciler
    /// when it was saturated.
    async fn slot(&self, name: &str) -> crate::reconcile::KeyLock {
        let saturated = self.queue.saturated();
        let started = tokio::time::Instant::now();
        let slot = self.queue.lock(name).await;
        if saturated {
            self.add_waited(started.elapsed());
        }
        slot
    }

    fn add_waited(&self, waited: Duration) {
        *self.waited.lock().unwrap_or_else(|e| e.into_inner()) += waited;
    }

    /// Asks the reconciler to re-check every project: through the controller's own resync when
    /// it was given ([`Self::with_resync`]), else by requesting each.
    async fn resync(&self) {
        if let Some(resync) = &self.controller_resync {
            let strays = resync().await;
            *self.strays.lock().unwrap_or_else(|e| e.into_inner()) = strays;
            return;
        }
        for object in self.projects() {
            self.queue.request_now(object.name());
        }
    }

    async fn event(&self, object: &Arc<StoredObject>, type_: EventType, reason: &str, msg: &str) {
        self.store.publish_event(object, type_, reason, msg).await;
    }

    /// Writes the scheduler's fields of the project's status through `change` (given the
    /// project's generation), by the store's one status writer. Returns the updated object
    /// (`None` when the project is gone).
    async fn update_status<F>(
        &self,
        name: &str,
        mut change: F,
    ) -> Result<Option<Arc<StoredObject>>, StoreError>
    where
        F: FnMut(&mut ProjectStatus, i64) + Send + 'static,
    {
        let name = name.to_string();
        self.store
            .call(move |store| {
                let write = StatusWrite::new(Kind::Project, &name, FieldManager::Scheduler);
                match store.write_status_typed(write, |status, object| {
                    change(status, object.generation())
                })? {
                    StatusWritten::Gone => Ok(None),
                    written => written.require(Kind::Project, &name).map(Some),
                }
            })
            .await
    }
}

#[async_trait]
impl Passes for DaemonPasses {
    async fn run(&self, pass: Pass) {
        match pass {
            Pass::Resync => self.resync().await,
            Pass::Schedules => self.schedules().await,
            Pass::Activity => self.activity().await,
            Pass::Network => self.network().await,
            Pass::Reap => self.reap().await,
            Pass::Housekeeping => self.housekeeping().await,
        }
    }

    fn pass_finished(&self, pass: Pass, took: Duration) {
        self.metrics.observe_pass(pass.label(), took.as_secs_f64());
        self.metrics
            .pass_finished_at(pass.label(), self.now().timestamp());
    }

    fn take_waited(&self) -> Duration {
        std::mem::take(&mut *self.waited.lock().unwrap_or_else(|e| e.into_inner()))
    }

    fn overrun(&self, took: Duration) {
        self.metrics.scheduler_overruns.inc();
        tracing::warn!(took = ?took, "a scheduler round outran its interval");
    }

    fn pass_panicked(&self, pass: Pass, _message: &str) {
        self.metrics.count_scheduler_panic(pass.label());
    }
}

/// Whether an operator asked the controller to leave the project alone
/// (`berth.dev/reconcile: paused`): it is still inspected where it runs, but never booted,
/// stopped or deleted by the scheduler.
fn paused(object: &StoredObject) -> bool {
    object
        .metadata
        .annotations
        .get(berth_api::annotations::RECONCILE)
        .is_some_and(|v| v == berth_api::annotations::RECONCILE_PAUSED)
}

/// Whether the project's container runs with its workspace mounted, so it can be inspected.
/// Since when the project has been Ready, if it is.
fn ready_since(status: &ProjectStatus) -> Option<DateTime<Utc>> {
    find_condition(&status.conditions, condition_types::READY)
        .filter(|c| c.status == ConditionStatus::True)
        .map(|c| c.last_transition_time)
}

/// Whether the project became Ready after `moment`.
fn ready_since_after(object: &StoredObject, moment: DateTime<Utc>) -> bool {
    let status: ProjectStatus = object.status.decode().unwrap_or_default();
    ready_since(&status).is_some_and(|since| since > moment)
}

fn running(object: &StoredObject) -> bool {
    if object.is_deleting() {
        return false;
    }
    let status: ProjectStatus = object.status.decode().unwrap_or_default();
    let idled = idling(&status, &object.metadata.annotations) != Idling::Awake;
    let reachable = status.step.is_some_and(|s| s >= Step::Reachable);
    let pid = status.container.as_ref().is_some_and(|c| c.pid.is_some());
    reachable && pid && !idled
}

/// What the policy is given about one project, from its stored object and this round's
/// inspection.
struct Facts {
    policy: berth_api::ResolvedReapPolicy,
    created_at: DateTime<Utc>,
    last_active_at: Option<DateTime<Utc>>,
    ready_since: Option<DateTime<Utc>>,
    building: bool,
    agent: AgentState,
    evidence: Evidence,
    ever_reachable: bool,
    stopped: bool,
}

impl Facts {
    /// `None` for a project whose spec does not parse (the reconciler reports that).
    fn of(object: &StoredObject, inspected: Option<&Result<Inspection, String>>) -> Option<Facts> {
        let spec: ProjectSpec = object.spec.decode().ok()?;
        let status: ProjectStatus = object.status.decode().unwrap_or_default();
        let recorded_agent = status
            .agent
            .as_ref()
            .map_or(AgentState::Unknown, |a| a.state);
        let idled = idling(&status, &object.metadata.annotations) != Idling::Awake;
        let is_running = running(object);
        let stopped = idled || !is_running;
        let (evidence, agent) = match inspected {
            Some(Ok(inspection)) => {
                crate::workspace::look::evidence_of(&Ok(inspection.clone()), recorded_agent)
            }
            Some(Err(_)) => (Evidence::Failed, recorded_agent),
            // A stopped container holds what the last inspection saw; a running one that was
            // not inspected this round could not be told apart from one with work.
            None if stopped => (
                status
                    .unsaved_work
                    .clone()
                    .map_or(Evidence::Failed, Evidence::Inspected),
                recorded_agent,
            ),
            None => (Evidence::Failed, recorded_agent),
        };
        Some(Facts {
            policy: spec.reap.resolve(),
            created_at: object.metadata.creation_timestamp.unwrap_or_else(Utc::now),
            last_active_at: status.activity.as_ref().and_then(|a| a.last_active_at),
            ready_since: ready_since(&status),
            building: matches!(status.phase, Phase::Pending | Phase::Provisioning),
            agent,
            evidence,
            ever_reachable: crate::reconcile::status::ever_reachable(&status),
            stopped,
        })
    }

    fn subject(&self, now: DateTime<Utc>, previous_due: Option<ReapAction>) -> ReapSubject<'_> {
        ReapSubject {
            now,
            policy: &self.policy,
            created_at: self.created_at,
            last_active_at: self.last_active_at,
            ready_since: self.ready_since,
            building: self.building,
            agent: self.agent,
            evidence: self.evidence.clone(),
            ever_reachable: self.ever_reachable,
            stopped: self.stopped,
            previous_due,
        }
    }
}

pub use berth_api::wire::PlanEntry;

/// The plan for `projects`, in name order. Nothing is inspected or changed: it reads what the
/// last passes recorded.
pub fn plan<'a>(projects: impl IntoIterator<Item = &'a StoredObject>) -> Vec<PlanEntry> {
    let mut entries: Vec<PlanEntry> = projects
        .into_iter()
        .map(|object| {
            let status: ProjectStatus = object.status.decode().unwrap_or_default();
            let reap = status.reap.clone().unwrap_or_default();
            let reason = plan_reason(object, &status);
            PlanEntry {
                name: object.name().to_string(),
                next_action: reap.next_action,
                next_action_at: reap.next_action_at,
                protected_by: protection::recorded(&status),
                reason,
            }
        })
        .collect();
    entries.sort_by(|a, b| a.name.cmp(&b.name));
    entries
}

fn plan_reason(object: &StoredObject, status: &ProjectStatus) -> String {
    let blocked = berth_api::find_condition(&status.conditions, condition_types::DELETION_BLOCKED)
        .filter(|c| c.status == ConditionStatus::True && object.is_deleting());
    if let Some(blocked) = blocked {
        return blocked.message.clone();
    }
    let reap = status.reap.clone().unwrap_or_default();
    let protected_by = protection::recorded(status);
    if !protected_by.is_empty() {
        return format!("protected by {}", reasons_text(&protected_by));
    }
    if object.is_deleting() {
        return "being deleted".to_string();
    }
    if let Some(at) = reap.idled_at {
        return format!(
            "idled at {}",
            at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
        );
    }
    match status.activity.as_ref().and_then(|a| a.last_active_at) {
        Some(at) => format!(
            "last active {}",
            at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
        ),
        None if reap.next_action.is_some() => "no activity seen since creation".to_string(),
        None if status
            .activity
            .as_ref()
            .is_none_or(|a| a.inspected_at.is_none()) =>
        {
            "not inspected yet".to_string()
        }
        None => String::new(),
    }
}

#[cfg(test)]
#[path = "passes_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "sim_tests.rs"]
mod sim;

#[cfg(test)]
#[path = "pass_network_tests.rs"]
mod network_tests;
