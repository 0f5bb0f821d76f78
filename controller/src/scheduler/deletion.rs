//! Held deletions: a deletion no person forced (a plain `berth delete`, a GitOps prune, the
//! reaper) waits while the workspace holds work that exists nowhere else, or an agent waits for
//! a person. The container and volumes stay as they are; status shows `DeletionBlocked=True`
//! with the protection as reason (Ready's message says why), and the workspace is inspected
//! again every few minutes (`scheduler.recheckInterval`) until the work is saved. `berth delete --force` (annotation `berth.dev/forceDelete: "true"`)
//! deletes at once.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex};
use std::time::Duration;

use berth_api::{
    AgentState, ConditionStatus, Phase, ProjectStatus, ProtectionReason, Step, condition_types,
    reasons,
};
use serde_json::Value;
use tokio::time::Instant;

use super::inspect;
use super::passes::reasons_text;
use super::policy;
use super::reap;
use crate::api::FORCE_DELETE_ANNOTATION;
use crate::reconcile::PROJECT_KIND;
use crate::reconcile::layout::uid_label;
use crate::reconcile::status::Draft;
use crate::reconcile::{Context, ReconcileError};
use crate::store::{EventType, Store, StoreError, StoredObject};

/// How often a held deletion's workspace is inspected again unless `scheduler.recheckInterval`
/// says otherwise: booting a stopped container to look is not free, and saved work does not
/// need to be noticed within seconds.
pub const HELD_RECHECK: Duration = Duration::from_secs(180);
/// Ready's message while the teardown goes ahead.
pub const REMOVING: &str = "removing the container and the volumes";
/// One inspection's deadline (a stopped container also gets this long to boot).
const INSPECT_TIMEOUT: Duration = Duration::from_secs(60);
/// `DeletionBlocked=False` after a person forced the deletion.
const FORCED: &str = "Forced";

/// When each held deletion was last inspected, in this process. Forgetting (a restart) only
/// means one inspection sooner.
static HELD: LazyLock<Mutex<HashMap<String, Instant>>> = LazyLock::new(Mutex::default);

/// Whether a deletion asked for the workspace to go whatever it holds.
pub fn forced(object: &StoredObject) -> bool {
    object
        .metadata
        .annotations
        .get(FORCE_DELETE_ANNOTATION)
        .is_some_and(|v| v == "true")
}

/// Decides whether the teardown of `object` may destroy its workspace now. When it may not,
/// `draft` carries `DeletionBlocked=True` (reason: the first protection) and the returned
/// duration is when to look again; the caller commits the draft and requeues.
pub async fn hold(
    ctx: &Context,
    object: &StoredObject,
    draft: &mut Draft,
) -> Result<Option<Duration>, ReconcileError> {
    if forced(object) {
        release(draft);
        forget(object.uid());
        return Ok(None);
    }
    let status: &ProjectStatus = &draft.status;
    // A project that never became Reachable has nothing to lose.
    if status.step.is_none_or(|s| s < Step::Reachable) {
        return Ok(None);
    }
    let name = object.name();
    let uid = object.uid();
    let Some(instance) = ctx.runtime.get_instance(name).await? else {
        return Ok(None);
    };
    if uid_label(&instance.config) != Some(uid) {
        // Not this project's container: the teardown leaves it alone anyway.
        return Ok(None);
    }
    let blocked = draft
        .condition(condition_types::DELETION_BLOCKED)
        .filter(|c| c.status == ConditionStatus::True)
        .map(|c| c.reason.clone());
    let blocked_now = blocked.is_some();
    let every = ctx.settings.held_recheck;
    let now = Instant::now();
    {
        let mut held = HELD.lock().unwrap_or_else(|e| e.into_inner());
        if blocked_now
            && let Some(at) = held.get(uid)
            && now.duration_since(*at) < every
        {
            return Ok(Some(every - now.duration_since(*at)));
        }
        held.insert(uid.to_string(), now);
    }

    let expected = inspect::expected_of(object);
    let (result, _booted) =
        reap::inspect_in_place(ctx.runtime.as_ref(), name, &expected, INSPECT_TIMEOUT).await;
    let recorded_agent = status
        .agent
        .as_ref()
        .map_or(AgentState::Unknown, |a| a.state);
    let (evidence, agent) = reap::evidence_of(&result, recorded_agent);
    if let Err(e) = &result {
        tracing::warn!(error = %e, "inspecting the workspace before deleting it failed");
    }
    let reasons = policy::protections(agent, &evidence, true);
    if let Ok(inspection) = &result {
        draft.status.unsaved_work = Some(inspection.unsaved.clone());
    }

    let Some(first) = reasons.first() else {
        if blocked_now {
            draft.set_condition(
                condition_types::DELETION_BLOCKED,
                ConditionStatus::False,
                "WorkSaved",
                "nothing left to lose: deleting",
            );
            deleting(draft, REMOVING);
        }
        forget(uid);
        return Ok(None);
    };
    let message = blocked_message(&reasons, &evidence);
    let already = draft
        .condition(condition_types::DELETION_BLOCKED)
        .is_some_and(|c| c.status == ConditionStatus::True && c.message == message);
    draft.set_condition(
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
    if !already {
        tracing::warn!(reasons = %reasons_text(&reasons), "deletion held");
        let store = ctx.store.clone();
        let target = object.clone();
        let recorded = tokio::task::spawn_blocking(move || {
            store.record_event(&target, EventType::Warning, "DeletionBlocked", &message)
        })
        .await
        .expect("a store call panicked");
        if let Err(e) = recorded {
            tracing::warn!(error = %e, "could not record an event");
        }
    }
    Ok(Some(every))
}

/// Ready's message for a project being deleted: why it is held, while it is.
pub fn ready_message(draft: &Draft) -> String {
    draft
        .condition(condition_types::DELETION_BLOCKED)
        .filter(|c| c.status == ConditionStatus::True)
        .map_or_else(|| REMOVING.to_string(), |c| c.message.clone())
}

fn deleting(draft: &mut Draft, message: &str) {
    draft.set_ready(Phase::Deleting, false, reasons::DELETING, message);
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
/// Returns the updated object, or `None` when there was no hold to clear.
pub fn release_forced(store: &Store, name: &str) -> Result<Option<Arc<StoredObject>>, StoreError> {
    for _ in 0..5 {
        let Some(object) = store.get(PROJECT_KIND, name) else {
            return Ok(None);
        };
        let mut draft = Draft::from_object(&object);
        release(&mut draft);
        let Some(Value::Array(conditions)) = draft.to_value().get("conditions").cloned() else {
            return Ok(None);
        };
        let mut status = object.status.value();
        let Some(map) = status.as_object_mut() else {
            return Ok(None);
        };
        if map.get("conditions") == Some(&Value::Array(conditions.clone())) {
            return Ok(None);
        }
        map.insert("conditions".to_string(), Value::Array(conditions));
        match store.update_status(
            PROJECT_KIND,
            name,
            Some(object.resource_version()),
            status,
            false,
        ) {
            Ok(updated) => return Ok(Some(updated)),
            Err(StoreError::Conflict { .. }) => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(None)
}

/// Drops the re-inspection time of a project whose deletion goes ahead.
pub fn forget(uid: &str) {
    HELD.lock().unwrap_or_else(|e| e.into_inner()).remove(uid);
}

fn blocked_message(reasons: &[ProtectionReason], evidence: &policy::Evidence) -> String {
    let detail = match evidence {
        policy::Evidence::Inspected(u) if u.any() => format!(
            " ({} uncommitted, {} untracked, {} stashes, {} unpushed commits)",
            u.uncommitted, u.untracked, u.stashes, u.unpushed
        ),
        _ => String::new(),
    };
    format!(
        "deletion held by {}{detail}: save the work, or delete with --force to discard it",
        reasons_text(reasons)
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use berth_api::UnsavedWork;

    #[test]
    fn the_message_names_the_protection_and_the_way_out() {
        let evidence = policy::Evidence::Inspected(UnsavedWork {
            unpushed: 2,
            ..UnsavedWork::default()
        });
        let message = blocked_message(&[ProtectionReason::UnsavedWork], &evidence);
        assert!(message.contains("UnsavedWork"), "{message}");
        assert!(message.contains("2 unpushed"), "{message}");
        assert!(message.contains("--force"), "{message}");
    }
}

#[cfg(all(test, feature = "testing"))]
mod held {
    use std::collections::BTreeMap;

    use super::*;
    use crate::metrics::Metrics;
    use crate::reconcile::layout::UID_LABEL;
    use crate::reconcile::{Backoff, ControllerSettings, NoLaterSteps, WorkQueue};
    use crate::runtime::fake::FakeRuntime;
    use crate::runtime::{Instance, InstanceStatus};
    use crate::scheduler::passes::{FakeWorkspace, script_inspection};
    use crate::store::{Desired, Store};
    use berth_api::UnsavedWork;
    use serde_json::json;

    struct Setup {
        _dir: tempfile::TempDir,
        fake: Arc<FakeRuntime>,
        ctx: Context,
    }

    fn setup() -> Setup {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(Store::open(&dir.path().join("berth.db")).unwrap());
        let fake = Arc::new(FakeRuntime::new());
        let metrics = Arc::new(Metrics::new());
        let ctx = Context {
            store,
            runtime: fake.clone(),
            metrics: metrics.clone(),
            settings: ControllerSettings::default(),
            later_steps: Arc::new(NoLaterSteps),
            fleet: Default::default(),
            snapshot: Default::default(),
            queue: WorkQueue::new(1, Backoff::default(), metrics),
        };
        Setup {
            _dir: dir,
            fake,
            ctx,
        }
    }

    impl Setup {
        /// A reachable project with a running container, asked to be deleted.
        fn deleting(&self, name: &str, annotations: BTreeMap<String, String>) -> Arc<StoredObject> {
            let store = &self.ctx.store;
            store
                .apply(
                    Desired {
                        kind: PROJECT_KIND.into(),
                        name: name.into(),
                        labels: BTreeMap::new(),
                        annotations: BTreeMap::new(),
                        finalizers: Some(vec!["berth.dev/teardown".into()]),
                        spec: json!({"image": "berth-base"}),
                    },
                    false,
                )
                .unwrap();
            store
                .update_status(
                    PROJECT_KIND,
                    name,
                    None,
                    json!({"phase": "Ready", "step": "Reachable"}),
                    false,
                )
                .unwrap();
            let uid = store.get(PROJECT_KIND, name).unwrap().uid().to_string();
            self.fake.insert_instance(Instance {
                name: name.into(),
                status: InstanceStatus::Running,
                status_code: 103,
                location: "none".into(),
                profiles: Vec::new(),
                config: BTreeMap::from([(UID_LABEL.to_string(), uid)]),
                devices: Default::default(),
                created_at: None,
                last_used_at: None,
                state: None,
            });
            store
                .delete(PROJECT_KIND, name, None, annotations, false)
                .unwrap();
            store.get(PROJECT_KIND, name).unwrap()
        }
    }

    fn condition(draft: &Draft) -> Option<(ConditionStatus, String)> {
        draft
            .condition(condition_types::DELETION_BLOCKED)
            .map(|c| (c.status, c.reason.clone()))
    }

    fn refusals(s: &Setup, reason: &str) -> String {
        let text = s.ctx.metrics.encode();
        let key = format!("berth_reap_refusals_total{{reason=\"{reason}\"}} ");
        text.lines()
            .find_map(|l| l.strip_prefix(&key))
            .unwrap_or_default()
            .to_string()
    }

    fn ready_message(draft: &Draft) -> String {
        draft
            .condition(condition_types::READY)
            .map(|c| c.message.clone())
            .unwrap_or_default()
    }

    #[tokio::test(start_paused = true)]
    async fn unpushed_work_holds_a_plain_delete_and_is_looked_at_again_only_later() {
        let s = setup();
        let object = s.deleting("p", BTreeMap::new());
        script_inspection(
            &s.fake,
            "p",
            FakeWorkspace::with_unsaved(UnsavedWork {
                unpushed: 1,
                ..UnsavedWork::default()
            }),
        );
        let mut draft = Draft::from_object(&object);
        let retry = hold(&s.ctx, &object, &mut draft).await.unwrap();
        assert_eq!(retry, Some(HELD_RECHECK));
        assert_eq!(
            condition(&draft),
            Some((ConditionStatus::True, "UnsavedWork".into()))
        );
        let events = s.ctx.store.events_for(PROJECT_KIND, "p").unwrap();
        assert!(events.iter().any(|e| e.reason == "DeletionBlocked"));
        let held = ready_message(&draft);
        assert!(
            held.contains("deletion held by UnsavedWork") && held.contains("1 unpushed"),
            "{held}"
        );
        assert_eq!(super::ready_message(&draft), held, "the teardown keeps it");
        assert_eq!(draft.status.phase, Phase::Deleting);
        assert_eq!(refusals(&s, "UnsavedWork"), "1");

        // Held: the next reconcile does not inspect again before the interval.
        let execs = s.fake.count("exec");
        let retry = hold(&s.ctx, &object, &mut draft).await.unwrap();
        assert!(retry.is_some_and(|r| r <= HELD_RECHECK));
        assert_eq!(s.fake.count("exec"), execs);

        // At the interval it looks again: still held, and the refusal is not counted again.
        tokio::time::advance(HELD_RECHECK).await;
        assert!(hold(&s.ctx, &object, &mut draft).await.unwrap().is_some());
        assert!(s.fake.count("exec") > execs);
        assert_eq!(refusals(&s, "UnsavedWork"), "1");

        // Pushed: the next look lets the deletion go ahead, and Ready says so.
        script_inspection(&s.fake, "p", FakeWorkspace::default());
        tokio::time::advance(HELD_RECHECK).await;
        assert_eq!(hold(&s.ctx, &object, &mut draft).await.unwrap(), None);
        assert_eq!(
            condition(&draft),
            Some((ConditionStatus::False, "WorkSaved".into()))
        );
        assert_eq!(ready_message(&draft), REMOVING);
        assert_eq!(super::ready_message(&draft), REMOVING);
    }

    #[tokio::test(start_paused = true)]
    async fn the_recheck_interval_is_the_configured_one() {
        let mut s = setup();
        s.ctx.settings.held_recheck = Duration::from_secs(5);
        let object = s.deleting("p", BTreeMap::new());
        script_inspection(
            &s.fake,
            "p",
            FakeWorkspace::with_unsaved(UnsavedWork {
                untracked: 1,
                ..UnsavedWork::default()
            }),
        );
        let mut draft = Draft::from_object(&object);
        assert_eq!(
            hold(&s.ctx, &object, &mut draft).await.unwrap(),
            Some(Duration::from_secs(5))
        );
        let execs = s.fake.count("exec");
        tokio::time::advance(Duration::from_secs(5)).await;
        assert!(hold(&s.ctx, &object, &mut draft).await.unwrap().is_some());
        assert!(s.fake.count("exec") > execs, "looked again after 5s");
    }

    #[tokio::test]
    async fn a_forced_delete_and_a_clean_workspace_go_ahead() {
        let s = setup();
        let forced = s.deleting(
            "forced",
            BTreeMap::from([(FORCE_DELETE_ANNOTATION.to_string(), "true".to_string())]),
        );
        let mut draft = Draft::from_object(&forced);
        draft.set_condition(
            condition_types::DELETION_BLOCKED,
            ConditionStatus::True,
            "UnsavedWork",
            "held",
        );
        assert_eq!(hold(&s.ctx, &forced, &mut draft).await.unwrap(), None);
        assert_eq!(
            condition(&draft),
            Some((ConditionStatus::False, FORCED.into()))
        );
        assert_eq!(s.fake.count("exec"), 0, "a forced delete inspects nothing");

        let clean = s.deleting("clean", BTreeMap::new());
        script_inspection(&s.fake, "clean", FakeWorkspace::default());
        let mut draft = Draft::from_object(&clean);
        assert_eq!(hold(&s.ctx, &clean, &mut draft).await.unwrap(), None);
        assert_eq!(condition(&draft), None);

        // An inspection that cannot be read holds the deletion.
        let unknown = s.deleting("unknown", BTreeMap::new());
        let mut draft = Draft::from_object(&unknown);
        assert!(hold(&s.ctx, &unknown, &mut draft).await.unwrap().is_some());
        assert_eq!(
            condition(&draft),
            Some((ConditionStatus::True, "InspectionFailed".into()))
        );
    }

    #[tokio::test]
    async fn releasing_a_forced_hold_keeps_the_rest_of_the_status() {
        let s = setup();
        let object = s.deleting("p", BTreeMap::new());
        let mut draft = Draft::from_object(&object);
        draft.set_condition(
            condition_types::DELETION_BLOCKED,
            ConditionStatus::True,
            "UnsavedWork",
            "held",
        );
        let mut status = draft.to_value();
        status["controller"] = json!({"image": "berth-base"});
        s.ctx
            .store
            .update_status(PROJECT_KIND, "p", None, status, false)
            .unwrap();
        let released = release_forced(&s.ctx.store, "p").unwrap().unwrap();
        assert_eq!(released.status.value()["controller"]["image"], "berth-base");
        let draft = Draft::from_object(&released);
        assert_eq!(
            condition(&draft),
            Some((ConditionStatus::False, FORCED.into()))
        );
        assert!(release_forced(&s.ctx.store, "p").unwrap().is_none());
    }
}
