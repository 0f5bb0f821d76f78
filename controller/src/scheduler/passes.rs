//! The daemon's scheduler passes: what each pass reads from the store, asks of LXD and writes
//! back into status, events and metrics.
//!
//! Status is shared with the reconciler, so every write here reads the stored status, changes
//! only the scheduler's fields and writes with the resourceVersion it read, retrying on a
//! conflict. Acting on a project (idling it, deleting it) happens only under the project's slot
//! in the work queue, so no reconcile runs in between the last re-check and the action.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use berth_api::{
    AgentState, ConditionStatus, ProjectSpec, ProjectStatus, ProtectionReason, ReapAction, Step,
    condition_types, set_condition,
};
use chrono::{DateTime, Utc};
use serde_json::Value;

use super::activity::{self, ActivityInputs, Touches};
use super::housekeeping;
use super::inspect::{InspectError, Inspection};
use super::memory::Memory;
use super::policy::{self, Evidence, ReapSubject, Verdict};
use super::{InspectTarget, Pass, Passes, ports, reap};
use crate::inspect::activity::ActivityLog;
use crate::metrics::{ActionLabels, Metrics, ReasonLabels};
use crate::reconcile::layout::{LABEL_PREFIX, UID_LABEL};
use crate::reconcile::{PROJECT_KIND, WorkQueue};
use crate::runtime::Runtime;
use crate::store::{EventType, Store, StoreError, StoredObject};

/// The annotation a deletion the reaper asked for carries, so that events and audits tell it
/// from a person's.
pub const REAPED_ANNOTATION: &str = "berth.dev/reapedBy";
/// How many times a status write is retried when the object changed under it.
const STATUS_WRITE_ATTEMPTS: usize = 5;

/// The scheduler's settings from berth.yaml.
#[derive(Debug, Clone)]
pub struct PassSettings {
    /// Inspections running at once (`scheduler.workers`).
    pub workers: usize,
    /// One inspection's deadline.
    pub inspect_timeout: Duration,
    /// `previewDomain`: the domain of the preview URLs in `status.ports`.
    pub preview_domain: String,
}

/// What the passes need from the daemon.
pub struct DaemonPasses {
    store: Arc<Store>,
    runtime: Arc<dyn Runtime>,
    queue: WorkQueue,
    metrics: Arc<Metrics>,
    /// Exec and tool calls made through berth.
    activity_log: Arc<ActivityLog>,
    workers: usize,
    inspect_timeout: Duration,
    preview_domain: String,
    memory: Mutex<Memory>,
    /// This round's inspections by project uid, for the reap pass that follows.
    round: Mutex<BTreeMap<String, Result<Inspection, String>>>,
    /// Orphans already reported, so each is reported once per daemon.
    reported_orphans: Mutex<BTreeSet<String>>,
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
        activity_log: Arc<ActivityLog>,
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
            preview_domain: settings.preview_domain,
            memory: Mutex::new(Memory::new()),
            round: Mutex::new(BTreeMap::new()),
            reported_orphans: Mutex::new(BTreeSet::new()),
        }
    }

    fn memory(&self) -> std::sync::MutexGuard<'_, Memory> {
        self.memory.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn projects(&self) -> Vec<Arc<StoredObject>> {
        self.store.list(PROJECT_KIND)
    }

    /// Asks the reconciler to re-check every project. Requests for a project already queued
    /// merge, so this costs nothing when the controller's own resync ran moments ago.
    async fn resync(&self) {
        for object in self.projects() {
            self.queue.request_now(object.name());
        }
    }

    /// Inspects every running project and records what it found in status.
    async fn activity(&self) {
        let projects: Vec<Arc<StoredObject>> =
            self.projects().into_iter().filter(|o| running(o)).collect();
        let live: BTreeSet<String> = self
            .projects()
            .iter()
            .map(|o| o.uid().to_string())
            .collect();
        self.memory().retain(&live);
        let targets = projects
            .iter()
            .map(|o| InspectTarget {
                instance: o.name().to_string(),
                known: super::inspect::known_files_of(&o.status),
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
        for object in &projects {
            let Some(result) = results.get(object.name()) else {
                continue;
            };
            if let Err(e) = result {
                tracing::warn!(project = object.name(), error = %e, "inspection failed");
            }
            self.record_activity(object, result).await;
            round.insert(
                object.uid().to_string(),
                result.as_ref().cloned().map_err(|e| e.to_string()),
            );
            if let Ok(inspection) = result {
                self.memory()
                    .record_inspection(object.uid(), inspection.clone());
            }
        }
        *self.round.lock().unwrap_or_else(|e| e.into_inner()) = round;
    }

    async fn record_activity(
        &self,
        object: &Arc<StoredObject>,
        result: &Result<Inspection, InspectError>,
    ) {
        let uid = object.uid().to_string();
        let exec = self
            .activity_log
            .last(&uid)
            .filter(|a| a.source == "exec")
            .map(|a| a.at);
        let tool_logged = self
            .activity_log
            .last(&uid)
            .filter(|a| a.source == "tool")
            .map(|a| a.at);
        let tool_stored = self.store.last_tool_call(&uid).ok().flatten();
        let tool = tool_logged.max(tool_stored);
        let previous = self.memory().previous_inspection(&uid).cloned();
        let current = result.as_ref().ok().cloned();
        let unsaved_work = reap::unsaved_work_status(result);
        let project = object.name().to_string();
        let preview_domain = self.preview_domain.clone();
        let write = self
            .update_status(object.name(), move |status, _| {
                let now = Utc::now();
                status.activity = Some(activity::update_activity(&ActivityInputs {
                    now,
                    previous_status: status.activity.as_ref(),
                    previous: previous.as_ref(),
                    current: current.as_ref(),
                    touches: Touches { exec, tool },
                    cpu_threshold: activity::DEFAULT_CPU_THRESHOLD,
                }));
                status.unsaved_work = unsaved_work;
                let Some(current) = &current else {
                    return;
                };
                let report = current.agent.as_ref();
                if let Some(title) = activity::title_to_record(status.title.as_deref(), report) {
                    status.title = Some(title);
                }
                if let Some(report) = report {
                    status.agent = Some(activity::agent_status(report));
                }
                status.ports = ports::port_statuses(&project, &current.ports, &preview_domain);
            })
            .await;
        if let Err(e) = write {
            tracing::warn!(project = object.name(), error = %e, "recording activity failed");
        }
    }

    /// Decides for every project, records the verdict and carries out what two passes agree on.
    async fn reap(&self) {
        let round = self.round.lock().unwrap_or_else(|e| e.into_inner()).clone();
        for object in self.projects() {
            if object.is_deleting() {
                continue;
            }
            let Some(subject) = Facts::of(&object, round.get(object.uid())) else {
                continue;
            };
            let previous_due = self.memory().previous_due(object.uid());
            let now = Utc::now();
            let verdict = policy::decide(&subject.subject(now, previous_due));
            self.memory().record_verdict(object.uid(), &verdict);
            if let policy::Decision::Refuse { reasons, .. } = &verdict.decision {
                for reason in reasons {
                    self.metrics
                        .reap_refusals
                        .get_or_create(&ReasonLabels {
                            reason: reason.as_str().to_string(),
                        })
                        .inc();
                }
            }
            if let Err(e) = self.record_verdict(&object, &verdict).await {
                tracing::warn!(project = object.name(), error = %e, "recording the reap verdict failed");
            }
            if let Some(action) = verdict.act() {
                self.act(object.name(), action).await;
                self.memory().forget_due(object.uid());
            }
        }
    }

    /// `status.reap` and the `ReapProtected` condition; a Warning event when protection begins
    /// or changes reason.
    async fn record_verdict(
        &self,
        object: &Arc<StoredObject>,
        verdict: &Verdict,
    ) -> Result<(), StoreError> {
        let verdict = verdict.clone();
        let changed = Arc::new(Mutex::new(None::<String>));
        let seen = changed.clone();
        let updated = self
            .update_status(object.name(), move |status, generation| {
                let idled_at = status.reap.as_ref().and_then(|r| r.idled_at);
                status.reap = Some(reap::reap_status(&verdict, idled_at));
                let now = Utc::now();
                let protected = !verdict.protected_by.is_empty();
                let had =
                    berth_api::find_condition(&status.conditions, condition_types::REAP_PROTECTED)
                        .is_some();
                if !protected && !had {
                    return;
                }
                let (cond, reason, message) = match verdict.protected_by.first() {
                    Some(first) => (
                        ConditionStatus::True,
                        first.as_str(),
                        format!("reaping declines: {}", reasons_text(&verdict.protected_by)),
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

    /// Carries out `action` on `name` under its slot, after a fresh re-check agrees.
    async fn act(&self, name: &str, action: ReapAction) {
        let _slot = self.queue.lock(name).await;
        let Some(object) = self.store.get(PROJECT_KIND, name) else {
            return;
        };
        if object.is_deleting() {
            return;
        }
        let Some(facts) = Facts::of(&object, None) else {
            return;
        };
        let now = Utc::now();
        let subject = facts.subject(now, Some(action));
        let verdict = if facts.stopped {
            let result = reap::inspect_stopped(
                self.runtime.as_ref(),
                name,
                &super::inspect::known_files_of(&object.status),
                self.inspect_timeout,
            )
            .await;
            let (evidence, agent) = reap::evidence_of(&result, subject.agent);
            policy::decide(&ReapSubject {
                evidence,
                agent,
                ..subject
            })
        } else {
            reap::recheck(
                self.runtime.as_ref(),
                name,
                &super::inspect::known_files_of(&object.status),
                self.inspect_timeout,
                subject,
            )
            .await
            .0
        };
        if verdict.act() != Some(action) {
            tracing::info!(
                project = name,
                action = action.metric_label(),
                "the re-check holds the project"
            );
            return;
        }
        let done = match action {
            ReapAction::Stop => self.idle(name).await,
            ReapAction::Delete => self.delete(&object).await,
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
        self.update_status(name, |status, _| {
            let reap = status.reap.get_or_insert_with(Default::default);
            reap.idled_at = Some(Utc::now());
        })
        .await
        .map(|_| ())
    }

    async fn delete(&self, object: &Arc<StoredObject>) -> Result<(), StoreError> {
        let store = self.store.clone();
        let name = object.name().to_string();
        let rv = object.resource_version();
        blocking(move || {
            let annotations = BTreeMap::from([(REAPED_ANNOTATION.to_string(), "reaper".into())]);
            store.delete(PROJECT_KIND, &name, Some(rv), annotations, false)
        })
        .await
        .map(|_| ())
    }

    /// Reports containers berth labelled whose project is gone; never deletes them.
    async fn housekeeping(&self) {
        let instances = match self.runtime.list_instances(Some(LABEL_PREFIX), false).await {
            Ok(instances) => instances,
            Err(e) => {
                tracing::warn!(error = %e, "housekeeping could not list the containers");
                return;
            }
        };
        let uids: BTreeSet<String> = self
            .projects()
            .iter()
            .map(|o| o.uid().to_string())
            .collect();
        let mut reported = self
            .reported_orphans
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        for orphan in housekeeping::orphans(&instances, UID_LABEL, &uids) {
            if reported.insert(orphan.instance.clone()) {
                tracing::warn!(
                    instance = orphan.instance.as_str(),
                    uid = orphan.uid.as_str(),
                    location = orphan.location.as_str(),
                    "orphaned container: labelled by berth, its project is gone; left in place"
                );
            }
        }
    }

    async fn event(&self, object: &Arc<StoredObject>, type_: EventType, reason: &str, msg: &str) {
        let store = self.store.clone();
        let object = object.clone();
        let (reason, msg) = (reason.to_string(), msg.to_string());
        if let Err(e) = blocking(move || store.record_event(&object, type_, &reason, &msg)).await {
            tracing::warn!(error = %e, "could not record an event");
        }
    }

    /// Reads the stored status, lets `change` edit the scheduler's fields and writes them back
    /// with the resourceVersion read, keeping every other field as stored. Returns the updated
    /// object (`None` when the project is gone).
    async fn update_status<F>(
        &self,
        name: &str,
        change: F,
    ) -> Result<Option<Arc<StoredObject>>, StoreError>
    where
        F: Fn(&mut ProjectStatus, i64) + Send + 'static,
    {
        let store = self.store.clone();
        let name = name.to_string();
        blocking(move || {
            let mut attempt = 0;
            loop {
                let Some(object) = store.get(PROJECT_KIND, &name) else {
                    return Ok(None);
                };
                let mut status: ProjectStatus =
                    serde_json::from_value(object.status.clone()).unwrap_or_default();
                change(&mut status, object.generation());
                let value = merge_owned(&object.status, &status);
                if value == object.status {
                    return Ok(Some(object));
                }
                match store.update_status(
                    PROJECT_KIND,
                    &name,
                    Some(object.resource_version()),
                    value,
                    false,
                ) {
                    Ok(updated) => return Ok(Some(updated)),
                    Err(StoreError::Conflict { .. }) if attempt + 1 < STATUS_WRITE_ATTEMPTS => {
                        attempt += 1;
                    }
                    Err(StoreError::NotFound { .. }) => return Ok(None),
                    Err(e) => return Err(e),
                }
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
            Pass::Activity => self.activity().await,
            Pass::Reap => self.reap().await,
            Pass::Housekeeping => self.housekeeping().await,
        }
    }

    fn pass_finished(&self, pass: Pass, took: Duration) {
        self.metrics.observe_pass(pass.label(), took.as_secs_f64());
    }

    fn overrun(&self, took: Duration) {
        self.metrics.scheduler_overruns.inc();
        tracing::warn!(took = ?took, "a scheduler round outran its interval");
    }
}

/// The status fields the scheduler writes; everything else is the reconciler's.
const OWNED_FIELDS: [&str; 7] = [
    "activity",
    "title",
    "agent",
    "unsavedWork",
    "ports",
    "reap",
    "conditions",
];

/// The stored status with the scheduler's fields taken from `status`.
fn merge_owned(stored: &Value, status: &ProjectStatus) -> Value {
    let mut merged = match stored {
        Value::Object(map) => map.clone(),
        _ => serde_json::Map::new(),
    };
    let Ok(Value::Object(new)) = serde_json::to_value(status) else {
        return stored.clone();
    };
    for field in OWNED_FIELDS {
        match new.get(field) {
            Some(value) => merged.insert(field.to_string(), value.clone()),
            None => merged.remove(field),
        };
    }
    Value::Object(merged)
}

/// Whether the project's container runs with its workspace mounted, so it can be inspected.
fn running(object: &StoredObject) -> bool {
    if object.is_deleting() {
        return false;
    }
    let status: ProjectStatus = serde_json::from_value(object.status.clone()).unwrap_or_default();
    let idled = status.reap.as_ref().is_some_and(|r| r.idled_at.is_some());
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
    agent: AgentState,
    evidence: Evidence,
    ever_reachable: bool,
    stopped: bool,
}

impl Facts {
    /// `None` for a project whose spec does not parse (the reconciler reports that).
    fn of(object: &StoredObject, inspected: Option<&Result<Inspection, String>>) -> Option<Facts> {
        let spec: ProjectSpec = serde_json::from_value(object.spec.clone()).ok()?;
        let status: ProjectStatus =
            serde_json::from_value(object.status.clone()).unwrap_or_default();
        let recorded_agent = status
            .agent
            .as_ref()
            .map_or(AgentState::Unknown, |a| a.state);
        let idled = status.reap.as_ref().is_some_and(|r| r.idled_at.is_some());
        let is_running = running(object);
        let stopped = idled || !is_running;
        let (evidence, agent) = match inspected {
            Some(Ok(inspection)) => reap::evidence_of(&Ok(inspection.clone()), recorded_agent),
            Some(Err(_)) => (Evidence::Failed, recorded_agent),
            // A stopped container holds what the last inspection saw; a running one that was
            // not inspected this round could not be told apart from one with work.
            None if stopped => (
                status
                    .unsaved_work
                    .map_or(Evidence::Failed, Evidence::Inspected),
                recorded_agent,
            ),
            None => (Evidence::Failed, recorded_agent),
        };
        Some(Facts {
            policy: spec.reap.resolve(),
            created_at: object.metadata.creation_timestamp.unwrap_or_else(Utc::now),
            last_active_at: status.activity.as_ref().and_then(|a| a.last_active_at),
            agent,
            evidence,
            ever_reachable: status.step.is_some_and(|s| s >= Step::Reachable),
            stopped,
        })
    }

    fn subject(&self, now: DateTime<Utc>, previous_due: Option<ReapAction>) -> ReapSubject<'_> {
        ReapSubject {
            now,
            policy: &self.policy,
            created_at: self.created_at,
            last_active_at: self.last_active_at,
            agent: self.agent,
            evidence: self.evidence.clone(),
            ever_reachable: self.ever_reachable,
            stopped: self.stopped,
            previous_due,
        }
    }
}

/// `AgentBlocked, UnsavedWork` for a message.
pub fn reasons_text(reasons: &[ProtectionReason]) -> String {
    reasons
        .iter()
        .map(|r| r.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Runs a store call on the blocking pool: store writes commit to SQLite synchronously.
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(f)
        .await
        .expect("a store call panicked")
}

/// One row of the reaper's plan (`GET /apis/berth.dev/v1alpha1/reap`, `berth reap --dry-run`):
/// what it would do to a project next, as recorded by the last reap pass.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PlanEntry {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_action: Option<ReapAction>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_action_at: Option<DateTime<Utc>>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub protected_by: Vec<ProtectionReason>,
    /// Why, in words.
    #[serde(default)]
    pub reason: String,
}

/// The plan for `projects`, in name order. Nothing is inspected or changed: it reads what the
/// last passes recorded.
pub fn plan<'a>(projects: impl IntoIterator<Item = &'a StoredObject>) -> Vec<PlanEntry> {
    let mut entries: Vec<PlanEntry> = projects
        .into_iter()
        .map(|object| {
            let status: ProjectStatus =
                serde_json::from_value(object.status.clone()).unwrap_or_default();
            let reap = status.reap.clone().unwrap_or_default();
            let reason = plan_reason(object, &status);
            PlanEntry {
                name: object.name().to_string(),
                next_action: reap.next_action,
                next_action_at: reap.next_action_at,
                protected_by: reap.protected_by,
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
    if !reap.protected_by.is_empty() {
        return format!("protected by {}", reasons_text(&reap.protected_by));
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

/// What a scripted inspection reports (see [`script_inspection`]).
#[cfg(feature = "testing")]
#[derive(Debug, Clone, Default)]
pub struct FakeWorkspace {
    pub unsaved: berth_api::UnsavedWork,
    /// The agent status file's JSON, if the agent wrote one.
    pub agent_json: Option<String>,
    pub ports: Vec<u16>,
}

/// Makes every inspection of `instance` in the fake runtime answer with `workspace`, as the
/// inspection script would in a git workspace. Without it, the fake's empty exec output is an
/// unreadable report, which protects the workspace like any failed inspection.
#[cfg(feature = "testing")]
pub fn script_inspection(
    fake: &crate::runtime::fake::FakeRuntime,
    instance: &str,
    workspace: FakeWorkspace,
) {
    use base64::Engine;
    use base64::engine::general_purpose::STANDARD as B64;
    let b64 = |text: &str| B64.encode(text.as_bytes());
    let mut porcelain = String::new();
    for i in 0..workspace.unsaved.uncommitted {
        porcelain.push_str(&format!(" M changed-{i}\0"));
    }
    for i in 0..workspace.unsaved.untracked {
        porcelain.push_str(&format!("?? new-{i}\0"));
    }
    let mut tcp = String::from(
        "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid\n",
    );
    for (i, port) in workspace.ports.iter().enumerate() {
        tcp.push_str(&format!(
            "   {i}: 00000000:{port:04X} 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0\n"
        ));
    }
    let report = format!(
        "berth-inspect 1\nagent {}\ngit repo\nporcelain {}\nstashes {}\nunpushed {}\n\
         tcp {}\ntcp6 \ncpu_ticks 0\nclk_tck 100\nnewest_mtime -\nend\n",
        workspace.agent_json.as_deref().map_or("-".to_string(), b64),
        b64(&porcelain),
        workspace.unsaved.stashes,
        workspace.unsaved.unpushed,
        b64(&tcp),
    );
    let instance = instance.to_string();
    fake.on_exec(move |name, request| {
        let inspecting = name == instance
            && request
                .command
                .iter()
                .any(|arg| arg.contains("berth-inspect 1"));
        inspecting.then(|| {
            Ok(crate::runtime::ExecOutput {
                exit_code: 0,
                stdout: report.clone().into_bytes(),
                stderr: Vec::new(),
            })
        })
    });
}

#[cfg(all(test, feature = "testing"))]
mod tests {
    use super::*;
    use crate::reconcile::Backoff;
    use crate::reconcile::layout::UID_LABEL;
    use crate::runtime::fake::FakeRuntime;
    use crate::runtime::{Instance, InstanceStatus};
    use crate::store::Desired;
    use berth_api::UnsavedWork;
    use serde_json::json;

    struct Setup {
        _dir: tempfile::TempDir,
        store: Arc<Store>,
        fake: Arc<FakeRuntime>,
        metrics: Arc<Metrics>,
        passes: DaemonPasses,
    }

    fn setup() -> Setup {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(Store::open(&dir.path().join("berth.db")).unwrap());
        let fake = Arc::new(FakeRuntime::new());
        let metrics = Arc::new(Metrics::new());
        let queue = WorkQueue::new(1, Backoff::default(), metrics.clone());
        let passes = DaemonPasses::new(
            store.clone(),
            fake.clone(),
            queue,
            metrics.clone(),
            Arc::new(ActivityLog::default()),
            PassSettings {
                workers: 2,
                inspect_timeout: Duration::from_secs(10),
                preview_domain: "localhost".into(),
            },
        );
        Setup {
            _dir: dir,
            store,
            fake,
            metrics,
            passes,
        }
    }

    impl Setup {
        /// A project whose container runs and was reachable, idle after one second; its
        /// status carries the reconciler's bookkeeping, which the passes must keep.
        fn running_project(&self, name: &str, workspace: FakeWorkspace) {
            self.store
                .apply(
                    Desired {
                        kind: PROJECT_KIND.into(),
                        name: name.into(),
                        labels: BTreeMap::new(),
                        annotations: BTreeMap::new(),
                        finalizers: None,
                        spec: json!({"image": "berth-base",
                                     "reap": {"idleAfter": "1s", "idleAction": "Stop"}}),
                    },
                    false,
                )
                .unwrap();
            let object = self.store.get(PROJECT_KIND, name).unwrap();
            self.store
                .update_status(
                    PROJECT_KIND,
                    name,
                    None,
                    json!({"phase": "Ready", "step": "Reachable",
                           "container": {"name": name, "pid": 42},
                           "controller": {"image": "berth-base"}}),
                    false,
                )
                .unwrap();
            self.fake.insert_instance(Instance {
                name: name.into(),
                status: InstanceStatus::Running,
                status_code: 103,
                location: "none".into(),
                profiles: Vec::new(),
                config: BTreeMap::from([(UID_LABEL.to_string(), object.uid().to_string())]),
                devices: Default::default(),
                created_at: None,
                last_used_at: None,
                state: None,
            });
            script_inspection(&self.fake, name, workspace);
        }

        fn status(&self, name: &str) -> Value {
            self.store.get(PROJECT_KIND, name).unwrap().status.clone()
        }

        /// Rounds of activity and reap passes, once every project is past its idle window.
        async fn rounds(&self, n: usize) {
            let until = Utc::now() + chrono::Duration::milliseconds(1100);
            while Utc::now() < until {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            for _ in 0..n {
                self.passes.run(Pass::Activity).await;
                self.passes.run(Pass::Reap).await;
            }
        }
    }

    #[tokio::test]
    async fn an_idle_clean_project_is_idled_after_two_agreeing_passes() {
        let s = setup();
        s.running_project("idle", FakeWorkspace::default());
        s.rounds(1).await;
        assert!(
            s.status("idle")["reap"]["idledAt"].is_null(),
            "one pass must not act: {}",
            s.status("idle")
        );
        assert_eq!(s.status("idle")["reap"]["nextAction"], "Stop");
        s.rounds(1).await;
        let status = s.status("idle");
        assert!(status["reap"]["idledAt"].is_string(), "{status}");
        assert_eq!(status["controller"]["image"], "berth-base", "{status}");
        assert_eq!(status["step"], "Reachable");
        assert!(
            s.metrics
                .encode()
                .contains("berth_reap_actions_total{action=\"stop\"} 1"),
            "{}",
            s.metrics.encode()
        );
    }

    #[tokio::test]
    async fn unsaved_work_a_blocked_agent_and_a_failed_inspection_each_protect() {
        let s = setup();
        s.running_project(
            "dirty",
            FakeWorkspace {
                unsaved: UnsavedWork {
                    unpushed: 2,
                    ..UnsavedWork::default()
                },
                ports: vec![3000],
                ..FakeWorkspace::default()
            },
        );
        s.running_project(
            "blocked",
            FakeWorkspace {
                agent_json: Some(r#"{"state":"blocked","title":"pick a database"}"#.into()),
                ..FakeWorkspace::default()
            },
        );
        s.running_project("unknown", FakeWorkspace::default());
        // Its inspection answers nothing readable.
        s.fake.on_exec(|name, _| {
            (name == "unknown").then(|| Ok(crate::runtime::ExecOutput::default()))
        });
        s.rounds(3).await;
        for (name, reason) in [
            ("dirty", "UnsavedWork"),
            ("blocked", "AgentBlocked"),
            ("unknown", "InspectionFailed"),
        ] {
            let status = s.status(name);
            assert!(status["reap"]["idledAt"].is_null(), "{name}: {status}");
            assert_eq!(status["reap"]["protectedBy"], json!([reason]), "{name}");
            let condition = status["conditions"]
                .as_array()
                .and_then(|c| c.iter().find(|c| c["type"] == "ReapProtected").cloned())
                .unwrap();
            assert_eq!(condition["status"], "True", "{name}");
            assert_eq!(condition["reason"], reason, "{name}");
            assert_eq!(status["controller"]["image"], "berth-base");
            let warnings = s
                .store
                .events_for(PROJECT_KIND, name)
                .unwrap()
                .into_iter()
                .filter(|e| e.reason == "ReapProtected")
                .count();
            assert_eq!(warnings, 1, "{name}: one event, not one per pass");
        }
        let dirty = s.status("dirty");
        assert_eq!(dirty["unsavedWork"]["unpushed"], 2);
        assert_eq!(dirty["ports"][0]["url"], "http://dirty--3000.localhost");
        let blocked = s.status("blocked");
        assert_eq!(blocked["title"], "pick a database");
        assert_eq!(blocked["agent"]["state"], "blocked");
        assert!(s.status("unknown")["unsavedWork"].is_null());
        let text = s.metrics.encode();
        assert!(
            text.contains("berth_reap_refusals_total{reason=\"UnsavedWork\"}"),
            "{text}"
        );
        assert!(
            text.contains("berth_reap_actions_total{action=\"stop\"} 0"),
            "{text}"
        );

        let plan = plan(s.store.list(PROJECT_KIND).iter().map(|o| o.as_ref()));
        let names: Vec<&str> = plan.iter().map(|e| e.name.as_str()).collect();
        assert_eq!(names, ["blocked", "dirty", "unknown"]);
        assert_eq!(plan[1].protected_by, vec![ProtectionReason::UnsavedWork]);
        assert_eq!(plan[1].next_action, Some(ReapAction::Stop));
        assert!(plan[1].reason.contains("UnsavedWork"), "{}", plan[1].reason);
    }

    #[test]
    fn merging_keeps_every_field_the_scheduler_does_not_own() {
        let stored =
            json!({"phase": "Ready", "controller": {"x": 1}, "ports": [{"port": 1, "url": "u"}]});
        let status = ProjectStatus {
            title: Some("t".into()),
            ..ProjectStatus::default()
        };
        let merged = merge_owned(&stored, &status);
        assert_eq!(merged["phase"], "Ready");
        assert_eq!(merged["controller"]["x"], 1);
        assert_eq!(merged["title"], "t");
        assert!(merged.get("ports").is_none(), "{merged}");
    }
}
