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

use crate::store::Commit;
use std::collections::{BTreeMap, BTreeSet};
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use berth_api::{
    AgentState, ConditionStatus, Kind, ObjectMeta, Phase, ProjectSpec, ProjectStatus,
    ProtectionReason, ReapAction, Step, condition_types, find_condition, set_condition,
};
use chrono::{DateTime, Utc};
use futures::{FutureExt, StreamExt};
use tokio::time::Instant;

use super::activity::{self, ActivityInputs, PeopleActivity, Touches};
use super::housekeeping::{self, Orphan};
use super::memory::Memory;
use super::policy::{self, Decision, Evidence, ReapSubject, Verdict};
use super::{InspectTarget, Pass, Passes, ports, reap};
use crate::layout::LABEL_PREFIX;
use crate::metrics::{ActionLabels, Metrics};
use crate::reconcile::WorkQueue;
use crate::reconcile::status::{Idling, idling};
use crate::runtime::Runtime;
use crate::store::{
    Doc, EventType, FieldManager, StatusWrite, StatusWritten, Store, StoreError, StoredObject,
};
use crate::workspace::inspect::{InspectError, Inspection};
use crate::workspace::protection::{self, reasons_text};

#[path = "pass_network.rs"]
mod pass_network;
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
        while self.queue.saturated() && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(SATURATION_POLL).await;
        }
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

    /// Inspects every running project, and the stopped ones whose last findings stand between
    /// them and an outcome, and records what it found in status.
    async fn activity(&self) {
        self.yield_to_reconciles().await;
        let projects = self.projects();
        let live = projects.iter().map(|o| o.uid().to_string()).collect();
        self.memory().retain(&live);
        let settled_before = self.now() - self.settle;
        let (settling, running): (Vec<Arc<StoredObject>>, Vec<Arc<StoredObject>>) = projects
            .iter()
            .filter(|o| running(o))
            .cloned()
            .partition(|o| ready_since_after(o, settled_before));
        *self.settling.lock().unwrap_or_else(|e| e.into_inner()) =
            settling.iter().map(|o| o.uid().to_string()).collect();
        let targets = running
            .iter()
            .map(|o| InspectTarget {
                instance: o.name().to_string(),
                expected: crate::workspace::inspect::expected_of(o),
            })
            .collect();
        let results = super::inspect_all(
            self.runtime.clone(),
            targets,
            self.workers,
            self.inspect_timeout,
        )
        .await;
        let mut round = BTreeMap::new();
        for object in &running {
            let Some(result) = results.get(object.name()) else {
                continue;
            };
            self.memory().saw_running(object.uid());
            self.note_inspection(object, result);
            let _ = self.record_findings(object, result, false).await;
            round.insert(
                object.uid().to_string(),
                result.as_ref().cloned().map_err(|e| e.to_string()),
            );
            if let Ok(inspection) = result {
                self.memory()
                    .record_inspection(object.uid(), inspection.clone());
            }
        }

        let stopped: Vec<String> = projects
            .iter()
            .filter(|o| self.wants_stopped_look(o))
            .map(|o| o.name().to_string())
            .collect();
        // No per-item deadline here: a boot cut short would leave the container running.
        // `inspect_stopped` bounds every step of its own.
        let looks: Vec<(String, Result<Inspection, String>)> = futures::stream::iter(stopped)
            .map(|name| async move { self.look_while_stopped(&name).await })
            .buffer_unordered(self.workers)
            .filter_map(|found| async move { found })
            .collect()
            .await;
        round.extend(looks);
        *self.round.lock().unwrap_or_else(|e| e.into_inner()) = round;
    }

    /// Whether a stopped project is to be booted for a look this pass: it could hold work, it
    /// was not looked at within the recheck interval, and what was last found is what keeps it
    /// (an inspection that failed, or unsaved work holding a due deletion). A blocked agent is
    /// not a reason: its state lives on a tmpfs, so a boot cannot tell anything new.
    fn wants_stopped_look(&self, object: &StoredObject) -> bool {
        // The cheap tests first: this runs for every project in every pass.
        if object.is_deleting()
            || paused(object)
            || !self
                .memory()
                .stopped_look_due(object.uid(), Instant::now(), self.recheck_interval)
            || running(object)
        {
            return false;
        }
        let Some(facts) = Facts::of(object, None) else {
            return false;
        };
        if !facts.ever_reachable {
            return false;
        }
        let verdict = policy::decide(&facts.subject(self.now(), None));
        let held_by_findings = matches!(&verdict.decision, Decision::Refuse { reasons, .. }
            if reasons.iter().any(|r| *r != ProtectionReason::AgentBlocked));
        facts.evidence == Evidence::Failed || held_by_findings
    }

    /// Inspects a stopped project under its slot without starting its agent, and records what
    /// was found. `None` when it is no longer a stopped project by then.
    async fn look_while_stopped(&self, name: &str) -> Option<(String, Result<Inspection, String>)> {
        let _slot = self.queue.lock(name).await;
        let object = self.store.get(Kind::Project, name)?;
        if object.is_deleting() || running(&object) || paused(&object) {
            return None;
        }
        let (result, booted) = crate::workspace::look::inspect_in_place(
            self.runtime.as_ref(),
            name,
            &crate::workspace::inspect::expected_of(&object),
            self.inspect_timeout,
        )
        .await;
        // Also after a failure: trying again every pass would boot it every pass.
        self.memory()
            .looked_while_stopped(object.uid(), Instant::now());
        tracing::debug!(
            project = name,
            booted,
            ok = result.is_ok(),
            "looked at a stopped project"
        );
        self.note_inspection(&object, &result);
        let _ = self.record_findings(&object, &result, booted).await;
        Some((object.uid().to_string(), result.map_err(|e| e.to_string())))
    }

    /// Logs a failing inspection once when it begins, at debug level while it goes on.
    fn note_inspection(&self, object: &StoredObject, result: &Result<Inspection, InspectError>) {
        self.metrics.count_inspection(result.is_ok());
        let begins = self
            .memory()
            .inspection_failed(object.uid(), result.is_err());
        if let Err(e) = result {
            if begins {
                tracing::warn!(
                    project = object.name(),
                    error = %e,
                    "inspection failed: reaping and unforced deletion hold (InspectionFailed) until one succeeds"
                );
            } else {
                tracing::debug!(project = object.name(), error = %e, "inspection still fails");
            }
        }
    }

    /// Exec, tool calls and previews made through berth, the latest of each. An interactive
    /// exec or a relayed preview connection still open is activity now, whenever it started.
    fn touches(&self, uid: &str) -> Touches {
        let last = self.activity_log.last(uid);
        let at = |source: &str| last.filter(|(_, s)| *s == source).map(|(at, _)| at);
        let exec = if self.activity_log.is_open(uid, "exec") {
            Some(self.now())
        } else {
            at("exec")
        };
        let tool_logged = at("tool");
        let tool_stored = self.store.last_tool_call(uid).ok().flatten();
        let preview = if self.activity_log.is_open(uid, "preview") {
            Some(self.now())
        } else {
            at("preview")
        };
        Touches {
            exec,
            tool: tool_logged.max(tool_stored),
            preview,
        }
    }

    /// Writes what an inspection found: activity, unsaved work, the agent's report, ports.
    /// `booted`: the container was booted for this inspection, so its CPU figures cannot be
    /// compared with an earlier inspection's and nothing of its agent runs. Returns the object
    /// as written, `None` when it is gone or the write failed.
    async fn record_findings(
        &self,
        object: &StoredObject,
        result: &Result<Inspection, InspectError>,
        booted: bool,
    ) -> Option<Arc<StoredObject>> {
        let uid = object.uid().to_string();
        let touches = self.touches(&uid);
        let previous = if booted {
            None
        } else {
            self.memory().previous_inspection(&uid).cloned()
        };
        let current = result.as_ref().ok().cloned();
        let unsaved_work = reap::unsaved_work_status(result);
        let project = object.name().to_string();
        let preview_site = self.preview_site.clone();
        let now = self.now();
        let write = self
            .update_status(object.name(), move |status, _| {
                let before = status.clone();
                status.activity = Some(activity::update_activity(&ActivityInputs {
                    now,
                    previous_status: status.activity.as_ref(),
                    previous: previous.as_ref(),
                    current: current.as_ref(),
                    touches,
                    cpu_threshold: activity::DEFAULT_CPU_THRESHOLD,
                }));
                status.unsaved_work = unsaved_work.clone();
                let Some(current) = &current else {
                    return;
                };
                let report = current.agent.as_ref();
                if let Some(title) = activity::title_to_record(status.title.as_deref(), report) {
                    status.title = Some(title);
                }
                if let Some(report) = report {
                    status.agent = Some(activity::agent_status(report));
                    crate::agent::record_brief_progress(status);
                }
                status.ports = ports::port_statuses(&project, &current.ports, &preview_site);
                keep_inspected_at_unless_changed(&before, status);
            })
            .await;
        match write {
            Ok(written) => written,
            Err(e) => {
                tracing::warn!(project = object.name(), error = %e, "recording activity failed");
                None
            }
        }
    }

    /// Decides for every project, records the verdict and carries out what two passes agree on.
    async fn reap(&self) {
        let round = self.round.lock().unwrap_or_else(|e| e.into_inner()).clone();
        for object in self.projects() {
            // One project whose reaping panics must not keep the others from being reaped.
            let reaped = AssertUnwindSafe(self.reap_one(&object, &round))
                .catch_unwind()
                .await;
            if let Err(payload) = reaped {
                let message = super::panic_message(payload.as_ref());
                tracing::error!(project = object.name(), panic = %message, "reaping one project panicked; the pass goes on");
                self.metrics.count_scheduler_panic(Pass::Reap.label());
            }
        }
    }

    /// Decides on one project and acts when two agreeing passes say so.
    async fn reap_one(
        &self,
        object: &Arc<StoredObject>,
        round: &BTreeMap<String, Result<Inspection, String>>,
    ) {
        if object.is_deleting() {
            return;
        }
        // Not looked at yet, so nothing to judge: not "could not be inspected".
        if self
            .settling
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains(object.uid())
        {
            return;
        }
        let Some(facts) = Facts::of(object, round.get(object.uid())) else {
            return;
        };
        let previous_due = self.memory().previous_due(object.uid());
        let verdict = policy::decide(&facts.subject(self.now(), previous_due));
        self.memory().record_verdict(object.uid(), &verdict);
        self.count_refusals(object.uid(), &verdict);
        let failure = match round.get(object.uid()) {
            Some(Err(e)) => Some(e.clone()),
            _ => None,
        };
        if let Err(e) = self
            .record_verdict(object, &verdict, facts.evidence.clone(), failure)
            .await
        {
            tracing::warn!(project = object.name(), error = %e, "recording the reap verdict failed");
        }
        if let Some(action) = verdict.act().filter(|_| !paused(object)) {
            self.act(object.name(), action).await;
            self.memory().forget_due(object.uid());
        }
    }

    /// `reap_refusals_total{reason}` counts a refusal once, when a due action is first declined
    /// for a reason, not in every pass it stays declined.
    fn count_refusals(&self, uid: &str, verdict: &Verdict) {
        let Decision::Refuse { reasons, .. } = &verdict.decision else {
            self.memory().not_refused(uid);
            return;
        };
        let new = self.memory().refused(uid, reasons);
        for reason in new {
            self.metrics.count_refusal(reason.as_str());
        }
    }

    /// `status.reap` and the `ReapProtected` condition; a Warning event when protection begins
    /// or changes reason, with its cause (the files and commits, the agent's question, the
    /// inspection's error: `evidence` and `failure` are what the verdict was judged on).
    async fn record_verdict(
        &self,
        object: &StoredObject,
        verdict: &Verdict,
        evidence: Evidence,
        failure: Option<String>,
    ) -> Result<(), StoreError> {
        let verdict = verdict.clone();
        let changed = Arc::new(Mutex::new(None::<String>));
        let seen = changed.clone();
        let now = self.now();
        let updated = self
            .update_status(object.name(), move |status, generation| {
                let idled_at = status.reap.as_ref().and_then(|r| r.idled_at);
                status.reap = Some(reap::reap_status(&verdict, idled_at));
                // The one reading of what protects it, as `get` and `reap --dry-run` show it.
                let protected_by = protection::recorded(status);
                if let Some(reap) = status.reap.as_mut() {
                    reap.protected_by = protected_by.clone();
                }
                let protected = !protected_by.is_empty();
                let had =
                    berth_api::find_condition(&status.conditions, condition_types::REAP_PROTECTED)
                        .is_some();
                if !protected && !had {
                    return;
                }
                let question = status.agent.as_ref().map(|a| a.message.as_str());
                let cause =
                    protection::cause(&protected_by, &evidence, failure.as_deref(), question);
                let (cond, reason, message) = match protected_by.first() {
                    Some(first) if cause.is_empty() => (
                        ConditionStatus::True,
                        first.as_str(),
                        format!("reaping declines: {}", reasons_text(&protected_by)),
                    ),
                    Some(first) => (
                        ConditionStatus::True,
                        first.as_str(),
                        format!(
                            "reaping declines: {} ({cause})",
                            reasons_text(&protected_by)
                        ),
                    ),
                    None => (ConditionStatus::False, "NotProtected", String::new()),
                };
                let before =
                    berth_api::find_condition(&status.conditions, condition_types::REAP_PROTECTED)
                        .map(|c| (c.status, c.message.clone()));
                set_condition(
                    &mut status.conditions,
                    condition_types::REAP_PROTECTED,
                    cond,
                    reason,
                    &message,
                    generation,
                    now,
                );
                if protected && before != Some((ConditionStatus::True, message.clone())) {
                    *seen.lock().unwrap_or_else(|e| e.into_inner()) = Some(message);
                }
            })
            .await?;
        let message = changed.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let (Some(message), Some(updated)) = (message, updated) {
            self.event(&updated, EventType::Warning, "ReapProtected", &message)
                .await;
        }
        Ok(())
    }

    /// Carries out `action` on `name` under its slot, after a fresh re-check agrees. When the
    /// re-check holds the project, what it found is recorded like any pass's findings, so the
    /// next pass decides on it instead of finding the project due again.
    async fn act(&self, name: &str, action: ReapAction) {
        let _slot = self.queue.lock(name).await;
        let Some(object) = self.store.get(Kind::Project, name) else {
            return;
        };
        if object.is_deleting() || paused(&object) {
            return;
        }
        let Some(facts) = Facts::of(&object, None) else {
            return;
        };
        let uid = object.uid().to_string();
        let status: ProjectStatus = object.status.decode().unwrap_or_default();
        let previous = self.memory().previous_inspection(&uid).cloned();
        let checked = reap::recheck(
            self.runtime.as_ref(),
            name,
            &crate::workspace::inspect::expected_of(&object),
            self.inspect_timeout,
            facts.subject(self.now(), Some(action)),
            reap::Seen {
                previous: previous.as_ref(),
                activity: status.activity.as_ref(),
                touches: self.touches(&uid),
            },
        )
        .await;
        if checked.booted {
            self.memory().looked_while_stopped(&uid, Instant::now());
        }
        self.note_inspection(&object, &checked.result);
        let recorded = self
            .record_findings(&object, &checked.result, checked.booted)
            .await;
        if !checked.booted
            && let Ok(inspection) = &checked.result
        {
            self.memory().record_inspection(&uid, inspection.clone());
        }
        let verdict = checked.verdict;
        if verdict.act() != Some(action) {
            tracing::info!(
                project = name,
                action = action.metric_label(),
                protected_by = %reasons_text(&verdict.protected_by),
                booted = checked.booted,
                "the re-check holds the project"
            );
            self.count_refusals(&uid, &verdict);
            let (evidence, failure) = match &checked.result {
                Ok(inspection) => (Evidence::Inspected(inspection.unsaved.clone()), None),
                Err(e) => (Evidence::Failed, Some(e.to_string())),
            };
            if let Err(e) = self
                .record_verdict(&object, &verdict, evidence, failure)
                .await
            {
                tracing::warn!(project = name, error = %e, "recording the re-check failed");
            }
            return;
        }
        // The deletion names the version just written: a spec or annotation changed meanwhile
        // makes it fail, and the next pass decides again.
        let Some(current) = recorded.filter(|o| o.generation() == object.generation()) else {
            tracing::info!(project = name, "changed while being re-checked; not reaped");
            return;
        };
        let done = match action {
            ReapAction::Stop => self.idle(name).await,
            ReapAction::Delete => self.delete(&current).await,
        };
        match done {
            Ok(()) => {
                self.metrics
                    .reap_actions
                    .get_or_create(&ActionLabels {
                        action: action.metric_label(),
                    })
                    .inc();
                let message = match action {
                    ReapAction::Stop => "idle: stopped by the reaper until woken",
                    ReapAction::Delete => "deleted by the reaper",
                };
                tracing::info!(project = name, action = action.metric_label(), "reaped");
                self.event(&object, EventType::Normal, "Reaped", message)
                    .await;
                self.queue.request_now(name);
            }
            Err(e) => {
                tracing::warn!(project = name, error = %e, "reaping failed");
            }
        }
    }

    /// Idles the project: the reconciler stops it and keeps it stopped until woken.
    async fn idle(&self, name: &str) -> Result<(), StoreError> {
        let now = self.now();
        self.update_status(name, move |status, _| {
            let reap = status.reap.get_or_insert_with(Default::default);
            reap.idled_at = Some(now);
        })
        .await
        .map(|_| ())
    }

    async fn delete(&self, object: &Arc<StoredObject>) -> Result<(), StoreError> {
        let name = object.name().to_string();
        let rv = object.resource_version();
        self.store
            .call(move |store| {
                let annotations =
                    BTreeMap::from([(REAPED_ANNOTATION.to_string(), "reaper".into())]);
                store.delete(Kind::Project, &name, Some(rv), annotations, Commit::Persist)
            })
            .await
            .map(|_| ())
    }

    /// Purges the trash entries that outlived `trash.retention` (a `TrashPurged` event each)
    /// and recounts the trash's metrics, when the trash is due a sweep ([`Trash::sweep`]).
    async fn purge_trash(&self) {
        let Some(trash) = &self.trash else { return };
        // Background work: reading the trash costs LXD a scan of the pool's volumes, so not while
        // the reconciler is saturated, nor in the first settle period, when a daemon just
        // started may be taking an apply; the sweep stays due.
        let settling = (self.started.checked_add_signed(self.settle))
            .is_some_and(|settled| self.now() < settled);
        if settling || self.queue.saturated() {
            return;
        }
        if let Some(Err(e)) = trash.sweep(&*self.runtime, self.now()).await {
            tracing::warn!(error = %e, "housekeeping could not read the trash");
        }
    }

    /// Reports containers berth labelled whose project is gone, once per orphan episode (an
    /// event and the `orphan_containers` gauge); never deletes them.
    /// Drops the events of objects that went longer than `events.retention` ago; none while the
    /// trash finds the wall clock jumped (their history, the pause's own warning included, would
    /// go on the clock's word alone).
    async fn prune_events(&self) {
        if self
            .trash
            .as_ref()
            .is_some_and(|t| t.purge_paused().is_some())
        {
            return;
        }
        let retention =
            chrono::Duration::from_std(self.event_retention).unwrap_or(chrono::Duration::MAX);
        let Some(before) = self.now().checked_sub_signed(retention) else {
            return;
        };
        match self.store.call(move |s| s.prune_gone_events(before)).await {
            Ok(0) => {}
            Ok(pruned) => tracing::debug!(pruned, "pruned the events of objects gone"),
            Err(e) => tracing::warn!(error = %e, "pruning the events of objects gone failed"),
        }
    }

    async fn housekeeping(&self) {
        self.purge_trash().await;
        self.prune_events().await;
        let Some(strays) = self.strays().await else {
            return;
        };
        // A stray's project may have come back since the list (a restore).
        let orphans =
            housekeeping::orphans(&strays.instances, &self.uids(), self.store.controller_id());
        self.metrics
            .orphan_containers
            .set(i64::try_from(orphans.len()).unwrap_or(i64::MAX));
        let new: Vec<Orphan> = {
            let mut reported = self
                .reported_orphans
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            let now: BTreeSet<(String, String)> = orphans
                .iter()
                .map(|o| (o.instance.clone(), o.uid.clone()))
                .collect();
            let new = orphans
                .into_iter()
                .filter(|o| !reported.contains(&(o.instance.clone(), o.uid.clone())))
                .collect();
            *reported = now;
            new
        };
        for orphan in new {
            tracing::warn!(
                instance = orphan.instance.as_str(),
                uid = orphan.uid.as_str(),
                location = orphan.location.as_str(),
                "orphaned container: labelled by berth, its project is gone; left in place"
            );
            self.orphan_event(&orphan).await;
        }
    }

    /// The containers labelled for projects the store did not know: from this round's resync
    /// when it listed the fleet (or found a fresh list), else from a list of housekeeping's own.
    async fn strays(&self) -> Option<Arc<crate::reconcile::Strays>> {
        let listed = self.strays.lock().unwrap_or_else(|e| e.into_inner()).take();
        if listed.is_some() {
            return listed;
        }
        // Projects read on both sides of the list: one created or deleted meanwhile has its
        // uid in one of them, so its container is not taken for an orphan.
        let mut uids = self.uids();
        let listed_at = tokio::time::Instant::now();
        match self.runtime.list_instances(Some(LABEL_PREFIX), false).await {
            Ok(instances) => {
                uids.extend(self.uids());
                Some(Arc::new(crate::reconcile::Strays::of(
                    &instances, &uids, listed_at,
                )))
            }
            Err(e) => {
                tracing::warn!(error = %e, "housekeeping could not list the containers");
                None
            }
        }
    }

    /// A Warning event about the project the orphan belonged to (by its name and the uid on its
    /// label), so `berth events` shows it to administrators; a member of a later project of the
    /// same name does not see it.
    async fn orphan_event(&self, orphan: &Orphan) {
        let gone = Arc::new(StoredObject {
            kind: Kind::Project,
            metadata: ObjectMeta {
                name: orphan.instance.clone(),
                uid: Some(orphan.uid.clone()),
                ..ObjectMeta::default()
            },
            spec: Doc::null(),
            status: Doc::null(),
        });
        let place = match orphan.location.as_str() {
            "" | "none" => String::new(),
            member => format!(" on {member}"),
        };
        let message = format!(
            "container {}{place} carries berth's label for project uid {}, which no project has: \
             left in place with its volumes; remove it with lxc once nothing in it is needed",
            orphan.instance, orphan.uid
        );
        self.event(&gone, EventType::Warning, "OrphanedContainer", &message)
            .await;
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

    fn overrun(&self, took: Duration) {
        self.metrics.scheduler_overruns.inc();
        tracing::warn!(took = ?took, "a scheduler round outran its interval");
    }

    fn pass_panicked(&self, pass: Pass, _message: &str) {
        self.metrics.count_scheduler_panic(pass.label());
    }
}

/// Leaves `status.activity.inspectedAt` as `before` had it when an inspection changed nothing
/// else, so a steady fleet costs no store write and no watch event per pass. A project's first
/// inspection is recorded (the reaper's plan tells "not inspected yet" by it), and any other
/// change carries the new time along. When the passes last looked is in
/// `berth_scheduler_last_pass_timestamp_seconds`.
fn keep_inspected_at_unless_changed(before: &ProjectStatus, status: &mut ProjectStatus) {
    let Some(inspected_at) = before.activity.as_ref().and_then(|a| a.inspected_at) else {
        return;
    };
    let Some(activity) = status.activity.as_mut() else {
        return;
    };
    let now = activity.inspected_at.replace(inspected_at);
    if status != before
        && let Some(activity) = status.activity.as_mut()
    {
        activity.inspected_at = now;
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
