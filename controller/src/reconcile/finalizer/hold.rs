//! Held deletions: a deletion no person forced (a plain `berth delete`, a GitOps prune, the
//! reaper) waits while the workspace holds work that exists nowhere else, or an agent waits for
//! a person. The container and volumes stay as they are; status shows `DeletionBlocked=True`
//! with the protection as reason (Ready's message says why: the files and commits that hold the
//! work), `status.deletionHold` says when it was looked at and when it is looked at next, and
//! the workspace is inspected again every few minutes (`scheduler.recheckInterval`) until the
//! work is saved, or at once when a person asks (`berth delete` again, or `berth wait
//! --for=delete`: the annotation `berth.dev/lookRequestedAt` changed). `berth delete --force`
//! (annotation `berth.dev/forceDelete: "true"`) deletes at once.
//!
//! Every such deletion of a workspace that was ever reachable (`status.firstReachableAt`, not
//! the current step) looks first, wherever the workspace is: in the project's container, where
//! it is; then, when nothing protects it, once more after its processes were ended as a clean
//! stop ends them, so nothing written on their way out is lost; and from an inspection instance
//! when the project has no container of its own (see [`crate::workspace::inspection_instance`]).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use berth_api::{
    AgentState, BerthDuration, ConditionStatus, DeletionHold, Phase, ProjectStatus,
    ProtectionReason, annotations, condition_types, reasons,
};
use tokio::time::Instant;

use crate::layout::{DurableLayout, uid_label};
use crate::reconcile::status::{Draft, ever_reachable};
use crate::reconcile::{Context, ReconcileError};
use crate::runtime::{ImageSource, StopOptions};
use crate::store::{
    EventType, FieldManager, StatusWrite, StatusWritten, Store, StoreError, StoredObject,
};
use crate::workspace::inspect::{self, InspectError, Inspection};
use crate::workspace::inspection_instance::{self, VolumeInspection};
use crate::workspace::look;
use crate::workspace::protection::{self as policy, protections, reasons_text};
use berth_api::Kind;

/// Ready's message while the teardown goes ahead.
pub const REMOVING: &str = "removing the container and the volumes";
/// One inspection's deadline (a stopped container also gets this long to boot).
const INSPECT_TIMEOUT: Duration = Duration::from_secs(60);
/// How long the processes of a container being deleted get to exit on SIGTERM before the
/// second look: what berth's init gives them on a clean stop.
const QUIESCE_GRACE: Duration = Duration::from_secs(3);
/// How many times a held deletion's container is started again before it is left stopped.
const RESTART_ATTEMPTS: u32 = 3;
/// `DeletionBlocked=False` after a person forced the deletion.
const FORCED: &str = "Forced";

/// When each held deletion was last inspected, in this controller (its [`Context`]), and the
/// request for a fresh look (`berth.dev/lookRequestedAt`) that look answered. Forgetting (a
/// restart) only means one inspection sooner.
#[derive(Debug, Default)]
pub struct HeldDeletions(Mutex<HashMap<String, (Instant, Option<String>)>>);

impl HeldDeletions {
    /// How long until the held deletion of `uid` is due for another look, when it is not due
    /// yet (a request no look answered yet makes it due); otherwise records that it is looked
    /// at now, answering `request`.
    fn wait_or_look(
        &self,
        uid: &str,
        blocked_now: bool,
        every: Duration,
        request: Option<&str>,
    ) -> Option<Duration> {
        let now = Instant::now();
        let mut held = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if blocked_now
            && let Some((at, answered)) = held.get(uid)
            && answered.as_deref() == request
            && now.duration_since(*at) < every
        {
            return Some(every - now.duration_since(*at));
        }
        held.insert(uid.to_string(), (now, request.map(str::to_string)));
        None
    }

    /// Drops the re-inspection time of a project whose deletion goes ahead.
    pub fn forget(&self, uid: &str) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).remove(uid);
    }
}

/// The request for a fresh look a person made last (`berth delete` again, `berth wait
/// --for=delete`), if any.
fn look_requested(object: &StoredObject) -> Option<&str> {
    object
        .metadata
        .annotations
        .get(annotations::LOOK_REQUESTED_AT)
        .map(String::as_str)
}

/// Whether a deletion asked for the workspace to go whatever it holds.
pub fn forced(object: &StoredObject) -> bool {
    object
        .metadata
        .annotations
        .get(annotations::FORCE_DELETE)
        .is_some_and(|v| v == "true")
}

/// Decides whether the teardown of `object` may destroy its workspace now. When it may, the
/// project's container (if any) is stopped, and the caller deletes it. When it may not,
/// `draft` carries `DeletionBlocked=True` (reason: the first protection), the container is as
/// it was, and the returned duration is when to look again; the caller commits the draft and
/// requeues.
pub async fn hold(
    ctx: &Context,
    object: &StoredObject,
    draft: &mut Draft,
) -> Result<Option<Duration>, ReconcileError> {
    if forced(object) {
        release(draft);
        ctx.held.forget(object.uid());
        return Ok(None);
    }
    let status: &ProjectStatus = &draft.status;
    // A project that never became Reachable never ran: nothing was written there.
    if !ever_reachable(status) {
        return Ok(None);
    }
    let uid = object.uid();
    let blocked = draft
        .condition(condition_types::DELETION_BLOCKED)
        .filter(|c| c.status == ConditionStatus::True)
        .map(|c| c.reason.clone());
    let blocked_now = blocked.is_some();
    let every = ctx.settings.held_recheck;
    let request = look_requested(object);
    if let Some(wait) = ctx.held.wait_or_look(uid, blocked_now, every, request) {
        return Ok(Some(wait));
    }

    let recorded_agent = status
        .agent
        .as_ref()
        .map_or(AgentState::Unknown, |a| a.state);
    let Some(Look { result, agent }) = look_at(ctx, object, recorded_agent).await? else {
        // No workspace volume is left: nothing to lose.
        return Ok(go_ahead(ctx, draft, blocked_now, uid));
    };
    let (evidence, agent) = look::evidence_of(&result, agent);
    if let Err(e) = &result {
        tracing::warn!(error = %e, "inspecting the workspace before deleting it failed");
    }
    let reasons = protections(agent, &evidence, true);
    if let Ok(inspection) = &result {
        draft.status.unsaved_work = Some(inspection.unsaved.clone());
    }

    let Some(first) = reasons.first() else {
        return Ok(go_ahead(ctx, draft, blocked_now, uid));
    };
    let failure = result.as_ref().err().map(ToString::to_string);
    let question = draft.status.agent.as_ref().map(|a| a.message.clone());
    let message = blocked_message(
        &reasons,
        &evidence,
        failure.as_deref(),
        question.as_deref(),
        every,
    );
    // Every view of what protects the project reads this (`policy::recorded`).
    draft.status.reap.get_or_insert_default().protected_by = reasons.clone();
    let looked_at = draft.now();
    draft.status.deletion_hold = Some(DeletionHold {
        looked_at: Some(looked_at),
        next_look_at: Some(BerthDuration::from_std(every).after(looked_at)),
        answered: request.map(str::to_string),
    });
    let changed = draft.set_condition(
        condition_types::DELETION_BLOCKED,
        ConditionStatus::True,
        first.as_str(),
        &message,
    );
    deleting(draft, &message);
    // A held deletion is a refusal too: counted when the hold begins or its reason changes,
    // not at every re-inspection.
    if blocked.as_deref() != Some(first.as_str()) {
        let counted: &[ProtectionReason] = if blocked_now {
            std::slice::from_ref(first)
        } else {
            &reasons
        };
        for reason in counted {
            ctx.metrics.count_refusal(reason.as_str());
        }
    }
    if changed {
        tracing::warn!(reasons = %reasons_text(&reasons), "deletion held");
        ctx.store
            .publish_event(object, EventType::Warning, "DeletionBlocked", &message)
            .await;
    }
    Ok(Some(every))
}

/// The deletion goes ahead: a hold it had is released.
fn go_ahead(ctx: &Context, draft: &mut Draft, blocked_now: bool, uid: &str) -> Option<Duration> {
    draft.status.deletion_hold = None;
    if blocked_now {
        draft.set_condition(
            condition_types::DELETION_BLOCKED,
            ConditionStatus::False,
            "WorkSaved",
            "nothing left to lose: deleting",
        );
        deleting(draft, REMOVING);
    }
    ctx.held.forget(uid);
    None
}

/// What the last look at the workspace found, and the agent's state to judge it by.
struct Look {
    result: Result<Inspection, InspectError>,
    agent: AgentState,
}

/// Looks at the workspace as the deletion would leave it. The project's own container is
/// inspected where it is (a stopped one booted without its runner and stopped again). When
/// that finds nothing to protect and the container runs, its processes are ended as a clean
/// stop would end them (SIGTERM and a grace, then SIGSTOP for what is left: [`look::quiesce`])
/// and the workspace is inspected again, so nothing written on the way out is lost; then the
/// container is killed, as nothing in it runs any more. When that second look finds work, the
/// container is started again, as a stop and start would leave it. Without a container of the
/// project's own (it vanished, was deleted by hand, or its name is someone else's), the
/// workspace volume is inspected from an inspection instance. `None` when there is no
/// workspace volume left.
async fn look_at(
    ctx: &Context,
    object: &StoredObject,
    recorded_agent: AgentState,
) -> Result<Option<Look>, ReconcileError> {
    let runtime = ctx.runtime.as_ref();
    let name = object.name();
    let known = inspect::expected_of(object);
    let instance = ctx.runtime.get_instance_record(name).await?;
    let Some(instance) = instance.filter(|i| uid_label(&i.config) == Some(object.uid())) else {
        return look_at_volume(ctx, object, &known).await.map(|result| {
            result.map(|result| Look {
                result,
                agent: recorded_agent,
            })
        });
    };
    let (first, booted) =
        look::inspect_as_found(runtime, name, instance.status, &known, INSPECT_TIMEOUT).await;
    let (evidence, agent) = look::evidence_of(&first, recorded_agent);
    let first = Look {
        result: first,
        agent,
    };
    // Held, or already looked at stopped: the container stays as it was.
    if booted || !protections(agent, &evidence, true).is_empty() {
        return Ok(Some(first));
    }
    if let Err(e) = look::quiesce(runtime, name, QUIESCE_GRACE, INSPECT_TIMEOUT).await {
        tracing::warn!(error = %e, "ending the container's processes to inspect it failed");
        restart(runtime, name).await;
        return Ok(Some(Look {
            result: Err(e),
            agent,
        }));
    }
    let second = inspect::inspect(runtime, name, &known, INSPECT_TIMEOUT).await;
    let (evidence, _) = look::evidence_of(&second, agent);
    if protections(agent, &evidence, true).is_empty() {
        // Nothing runs in it but init: a kill loses nothing a clean stop would keep.
        if let Err(e) = runtime.stop_instance(name, StopOptions::kill()).await {
            tracing::warn!(error = %e, "killing the inspected container failed");
        }
    } else {
        restart(runtime, name).await;
    }
    Ok(Some(Look {
        result: second,
        agent,
    }))
}

/// Puts a container whose processes the second look ended back as a stop and start would: a
/// held deletion keeps it running. The start is tried a few times: LXD refuses one while the
/// kill still holds the instance, and a held deletion looks again only when a stopped container
/// would be looked at.
async fn restart(runtime: &dyn crate::runtime::Runtime, name: &str) {
    if let Err(e) = runtime.stop_instance(name, StopOptions::kill()).await {
        tracing::warn!(error = %e, "stopping the container after inspecting it failed");
    }
    for attempt in 1..=RESTART_ATTEMPTS {
        match runtime.start_instance(name, INSPECT_TIMEOUT).await {
            Ok(()) => return,
            Err(e) if attempt < RESTART_ATTEMPTS => {
                tracing::info!(error = %e, attempt, "starting the container again failed; retrying");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(e) => {
                tracing::warn!(error = %e, "starting the container again after inspecting it failed");
            }
        }
    }
}

/// Inspects the workspace volume from an inspection instance, made from the image of the
/// project's last container, else its `spec.image`, else the configured default, and placed on
/// the volume's cluster member. `None` when there is no workspace volume of the project's.
async fn look_at_volume(
    ctx: &Context,
    object: &StoredObject,
    known: &inspect::Expected,
) -> Result<Option<Result<Inspection, InspectError>>, ReconcileError> {
    let settings = &ctx.settings;
    let uid = object.uid();
    let volume_name = DurableLayout::workspace_volume(uid);
    let found = ctx
        .runtime
        .get_volume(&settings.storage_pool, &volume_name, None)
        .await?;
    let Some(volume) = found.filter(|v| uid_label(&v.config) == Some(uid)) else {
        return Ok(None);
    };
    let status = object.status.value();
    let mut images = Vec::new();
    for recorded in [
        status.pointer("/container/imageFingerprint"),
        status.pointer("/controller/fingerprint"),
    ] {
        if let Some(fingerprint) = recorded.and_then(|v| v.as_str()).filter(|f| !f.is_empty()) {
            images.push(ImageSource::Fingerprint(fingerprint.to_string()));
        }
    }
    if let Some(image) = object.spec.get_str("image").filter(|i| !i.is_empty()) {
        images.push(ImageSource::Alias(image.clone()));
        images.push(ImageSource::Fingerprint(image));
    }
    images.push(ImageSource::Alias(settings.default_image.clone()));
    let location = Some(volume.location.as_str()).filter(|l| !l.is_empty() && *l != "none");
    let request = VolumeInspection {
        uid,
        controller: ctx.store.controller_id(),
        pool: &settings.storage_pool,
        volume: &volume.name,
        location,
        images,
        timeout: INSPECT_TIMEOUT,
    };
    tracing::info!(
        volume = volume.name.as_str(),
        "no container of this project: inspecting its workspace volume"
    );
    Ok(Some(
        inspection_instance::inspect_volume(ctx.runtime.as_ref(), &request, known).await,
    ))
}

/// Ready's message for a project being deleted: why it is held, while it is.
pub fn ready_message(draft: &Draft) -> String {
    draft
        .condition(condition_types::DELETION_BLOCKED)
        .filter(|c| c.status == ConditionStatus::True)
        .map_or_else(|| REMOVING.to_string(), |c| c.message.clone())
}

fn deleting(draft: &mut Draft, message: &str) {
    draft.set_not_ready(Phase::Deleting, reasons::DELETING, message);
}

/// A forced deletion no longer waits on what held it.
fn release(draft: &mut Draft) {
    if draft
        .condition(condition_types::DELETION_BLOCKED)
        .is_some_and(|c| c.status == ConditionStatus::True)
    {
        draft.set_condition(
            condition_types::DELETION_BLOCKED,
            ConditionStatus::False,
            FORCED,
            "deleted with --force: the workspace is discarded",
        );
        deleting(draft, REMOVING);
    }
}

/// Clears a hold on `name` when its deletion was forced, in the stored status (keeping every
/// other field), so a client waiting for the deletion does not read the old hold as the answer.
/// The write says when there was no hold to clear (`Unchanged`) or it gave up.
pub fn release_forced(store: &Store, name: &str) -> Result<StatusWritten, StoreError> {
    store.write_status(
        StatusWrite::new(Kind::Project, name, FieldManager::Reconciler),
        |object| {
            let mut draft = Draft::from_object(object);
            release(&mut draft);
            let mut status = object.status.value();
            if let (Some(map), Some(conditions)) =
                (status.as_object_mut(), draft.to_value().get("conditions"))
            {
                map.insert("conditions".to_string(), conditions.clone());
            }
            status
        },
    )
}

/// Why the deletion is held and by what (the files, the commits, the agent's question, the
/// inspection's error: [`policy::cause`]), that the project stays Deleting, and when it is
/// looked at again: one line, the same at every look that finds the same (the next look's time
/// is `status.deletionHold.nextLookAt`).
fn blocked_message(
    reasons: &[ProtectionReason],
    evidence: &policy::Evidence,
    failure: Option<&str>,
    question: Option<&str>,
    every: Duration,
) -> String {
    let cause = policy::cause(reasons, evidence, failure, question);
    let detail = if cause.is_empty() {
        String::new()
    } else {
        format!(" ({cause})")
    };
    format!(
        "deletion held by {}{detail}: it stays Deleting and is looked at again every {} (at once \
         on `berth delete` or `berth wait --for=delete`); save the work, or delete with --force \
         to discard it",
        reasons_text(reasons),
        BerthDuration::from_std(every).as_str()
    )
}

#[cfg(test)]
#[path = "hold_unit_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "hold_tests.rs"]
mod looks;

#[cfg(test)]
#[path = "hold_held_tests.rs"]
mod held;
