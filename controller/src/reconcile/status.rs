//! A project's status as one reconcile rewrites it: decoded from the store, changed in memory,
//! and committed only when it differs from what is stored, with an event per transition.

use std::sync::Arc;

use berth_api::{Condition, ConditionStatus, Phase, ProjectStatus, Step, set_condition};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::store::{EventType, StoredObject};

/// The controller's own bookkeeping, kept under `status.controller`: what it submitted and which
/// requests (annotation values) it has already acted on, so a restarted controller neither
/// repeats nor forgets them.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ControllerRecord {
    /// An LXD operation a step submitted and whose outcome is not recorded yet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operation: Option<PendingOperation>,
    /// The `berth.dev/restartedAt` value last acted on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restarted_at: Option<String>,
    /// The `berth.dev/recreateRequestedAt` value last acted on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recreate_requested_at: Option<String>,
    /// The `spec.image` the current container was created from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// The image fingerprint the last container was created from: the fallback when the
    /// alias is deleted before the container must be recreated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fingerprint: Option<String>,
    /// The step to return to once a container that booted again answers (a boot resumes at
    /// Reachable, then where the project was).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resume: Option<Step>,
    /// When the current step began, for step deadlines.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step_started_at: Option<DateTime<Utc>>,
    /// The warm pool member this project is claiming (its pool name), recorded before it is
    /// renamed and cleared once the claimed container is recorded as Created.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool_member: Option<String>,
}

impl ControllerRecord {
    /// The record in a project's stored status; an unreadable one starts afresh (the
    /// controller owns it).
    pub fn of(object: &StoredObject) -> ControllerRecord {
        object
            .status
            .get("controller")
            .and_then(|v| serde_json::from_value(v).ok())
            .unwrap_or_default()
    }

    fn is_empty(&self) -> bool {
        *self == ControllerRecord::default()
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PendingOperation {
    pub id: String,
    /// The step the operation completes.
    pub step: Step,
    pub submitted_at: DateTime<Utc>,
}

/// The status being rewritten by one reconcile.
#[derive(Debug, Clone)]
pub struct Draft {
    pub status: ProjectStatus,
    pub record: ControllerRecord,
    generation: i64,
    now: DateTime<Utc>,
}

impl Draft {
    /// Decodes the stored status; an unreadable one starts afresh (the controller owns it).
    pub fn from_object(object: &StoredObject) -> Draft {
        let status: ProjectStatus = object.status.decode().unwrap_or_default();
        Draft {
            status,
            record: ControllerRecord::of(object),
            generation: object.generation(),
            now: crate::clock::now(),
        }
    }

    /// Takes up what was committed: after a commit that merged in fields someone else wrote,
    /// the draft holds them too, so a later commit of this reconcile does not undo them.
    pub fn rebase(&mut self, committed: &StoredObject) {
        let again = Draft::from_object(committed);
        self.status = again.status;
        self.record = again.record;
    }

    pub fn now(&self) -> DateTime<Utc> {
        self.now
    }

    pub fn step(&self) -> Step {
        self.status.step.unwrap_or(Step::Requested)
    }

    /// Records that `step` is now the last completed one. The first time the project reaches
    /// Reachable is recorded for good (`status.firstReachableAt`): the step moves back later.
    pub fn set_step(&mut self, step: Step) {
        if self.status.step != Some(step) {
            self.status.step = Some(step);
            self.record.step_started_at = Some(self.now);
        }
        if step >= Step::Reachable {
            self.status.first_reachable_at.get_or_insert(self.now);
        }
    }

    /// Records `status.firstReachableAt` for a project that ran before that field existed
    /// (see [`ever_reachable`]), at the time it is noticed.
    pub fn backfill_first_reachable(&mut self) {
        if self.status.first_reachable_at.is_none() && ever_reachable(&self.status) {
            self.status.first_reachable_at = Some(self.now);
        }
    }

    /// How long the project has been waiting for the step after the current one.
    pub fn time_in_step(&self) -> chrono::Duration {
        self.record
            .step_started_at
            .map(|at| self.now - at)
            .unwrap_or_default()
    }

    /// Sets condition `type_`; answers whether its status or message changed (what a person
    /// reads), so a caller tells of a condition once, not at every reconcile.
    pub fn set_condition(
        &mut self,
        type_: &str,
        status: ConditionStatus,
        reason: &str,
        message: &str,
    ) -> bool {
        let unchanged = self
            .condition(type_)
            .is_some_and(|c| c.status == status && c.message == message);
        set_condition(
            &mut self.status.conditions,
            type_,
            status,
            reason,
            message,
            self.generation,
            self.now,
        );
        !unchanged
    }

    pub fn condition(&self, type_: &str) -> Option<&Condition> {
        berth_api::find_condition(&self.status.conditions, type_)
    }

    /// `Ready` true with its reason: the project is in phase Ready and carries no message.
    pub fn set_ready(&mut self, reason: &str, message: &str) {
        self.status.phase = Phase::Ready;
        let ready = berth_api::condition_types::READY;
        self.set_condition(ready, ConditionStatus::True, reason, message);
        self.status.message = String::new();
    }

    /// `Ready` false in `phase`, with the reason and the message the status shows.
    pub fn set_not_ready(&mut self, phase: Phase, reason: &str, message: &str) {
        self.status.phase = phase;
        let ready = berth_api::condition_types::READY;
        self.set_condition(ready, ConditionStatus::False, reason, message);
        self.status.message = message.to_string();
    }

    /// The JSON the store holds.
    pub fn to_value(&self) -> Value {
        let mut status = self.status.clone();
        status.observed_generation = self.generation;
        let mut value = serde_json::to_value(&status).unwrap_or(Value::Null);
        if !self.record.is_empty()
            && let Value::Object(map) = &mut value
        {
            map.insert(
                "controller".to_string(),
                serde_json::to_value(&self.record).unwrap_or(Value::Null),
            );
        }
        value
    }
}

/// Whether the workspace may hold work because the project became Reachable once, whatever
/// `status.step` says now (it moves back on a new image, a recreate, a vanished container and
/// every boot). `status.firstReachableAt` says so from then on; a project stored before that
/// field existed is judged by its step and by what only a reachable workspace leaves in status
/// (an inspection's findings, activity, seeded files, an agent's report or title).
pub fn ever_reachable(status: &ProjectStatus) -> bool {
    status.first_reachable_at.is_some()
        || status.step.is_some_and(|s| s >= Step::Reachable)
        || status.unsaved_work.is_some()
        || status.activity.is_some()
        || !status.seeded_files.is_empty()
        || status.agent.is_some()
        || status.title.is_some()
}

/// Where a project stands with the reaper's idling (`status.reap.idledAt`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Idling {
    /// Not idled.
    Awake,
    /// Idled, and nothing woke it since.
    Idled,
    /// Idled, then woken by `berth start` (the `berth.dev/wokenAt` annotation, set in the
    /// second of the idling or later); the reconciler has not acted on it yet.
    Woken,
}

/// The one reading of "idled and not woken", from the typed status and the object's
/// annotations. Annotations carry whole seconds: a wake in the second of the idling counts.
pub fn idling(
    status: &ProjectStatus,
    annotations: &std::collections::BTreeMap<String, String>,
) -> Idling {
    let Some(idled_at) = status.reap.as_ref().and_then(|r| r.idled_at) else {
        return Idling::Awake;
    };
    let woken = annotations
        .get(berth_api::annotations::WOKEN_AT)
        .and_then(|v| DateTime::parse_from_rfc3339(v).ok())
        .is_some_and(|w| w.timestamp() >= idled_at.timestamp());
    if woken { Idling::Woken } else { Idling::Idled }
}

/// The status field that, once written, no status write may drop (see [`ever_reachable`]; the
/// store's writer keeps it too).
const FIRST_REACHABLE_AT: &str = "firstReachableAt";

/// What changed between two statuses that deserves an event.
pub fn transitions(
    before: &ProjectStatus,
    after: &ProjectStatus,
) -> Vec<(EventType, String, String)> {
    let mut events = Vec::new();
    if before.step != after.step
        && let Some(step) = after.step
    {
        let message = match before.step {
            Some(previous) if previous > step => {
                format!("back to step {} (was {})", step.as_str(), previous.as_str())
            }
            _ => format!("step {} done", step.as_str()),
        };
        events.push((EventType::Normal, step.as_str().to_string(), message));
    }
    if before.phase != after.phase {
        let kind = match after.phase {
            Phase::Error | Phase::Missing => EventType::Warning,
            _ => EventType::Normal,
        };
        let mut message = format!(
            "phase {} (was {})",
            after.phase.as_str(),
            before.phase.as_str()
        );
        if !after.message.is_empty() {
            message = format!("{message}: {}", after.message);
        }
        events.push((kind, after.phase.as_str().to_string(), message));
    }
    events
}

/// Lays what one reconcile changed onto a status someone else wrote meanwhile: a three-way
/// merge of JSON statuses. `base` is what the reconcile read, `ours` what it wants, `theirs`
/// what the store holds now. A top-level field (or a condition, by its `type`) that the
/// reconcile changed takes its value; every other one keeps `theirs`, so the scheduler's
/// activity or an agent step's record written during the reconcile survives its commit.
pub fn merge_changes(base: &Value, ours: &Value, theirs: &Value) -> Value {
    let empty = serde_json::Map::new();
    let as_map = |v: &'_ Value| v.as_object().cloned().unwrap_or_default();
    let base_map = base.as_object().unwrap_or(&empty);
    let ours_map = ours.as_object().unwrap_or(&empty);
    let mut merged = as_map(theirs);
    let keys: std::collections::BTreeSet<&String> =
        base_map.keys().chain(ours_map.keys()).collect();
    for key in keys {
        let (was, want) = (base_map.get(key), ours_map.get(key));
        if key == "conditions" {
            let conditions = merge_conditions(
                was.unwrap_or(&Value::Null),
                want.unwrap_or(&Value::Null),
                merged.get(key).unwrap_or(&Value::Null),
            );
            if conditions.is_empty() {
                merged.remove(key);
            } else {
                merged.insert(key.clone(), Value::Array(conditions));
            }
            continue;
        }
        if was == want {
            continue;
        }
        if key == FIRST_REACHABLE_AT && want.is_none() {
            // Recorded once, never cleared.
            continue;
        }
        match want {
            Some(value) => merged.insert(key.clone(), value.clone()),
            None => merged.remove(key),
        };
    }
    Value::Object(merged)
}

/// The condition list of [`merge_changes`]: keyed by `type`, in `theirs`' order, with the
/// conditions only `ours` added at the end.
fn merge_conditions(base: &Value, ours: &Value, theirs: &Value) -> Vec<Value> {
    fn by_type(list: &Value) -> Vec<(&str, &Value)> {
        list.as_array()
            .map(|items| {
                items
                    .iter()
                    .map(|c| (c.get("type").and_then(Value::as_str).unwrap_or_default(), c))
                    .collect()
            })
            .unwrap_or_default()
    }
    let (base, ours, theirs) = (by_type(base), by_type(ours), by_type(theirs));
    let find = |list: &[(&str, &Value)], type_: &str| {
        list.iter()
            .find(|(t, _)| *t == type_)
            .map(|(_, c)| (*c).clone())
    };
    let mut merged = Vec::new();
    let mut types: Vec<&str> = theirs.iter().map(|(t, _)| *t).collect();
    types.extend(
        ours.iter()
            .map(|(t, _)| *t)
            .filter(|t| !theirs.iter().any(|(u, _)| u == t)),
    );
    for type_ in types {
        let (was, want) = (find(&base, type_), find(&ours, type_));
        let chosen = if was == want {
            find(&theirs, type_)
        } else {
            want
        };
        merged.extend(chosen);
    }
    merged
}

/// Whether the stored status already says what `draft` says.
pub fn unchanged(object: &Arc<StoredObject>, draft: &Draft) -> bool {
    object.status == draft.to_value()
}

#[cfg(test)]
mod tests {
    use super::*;
    use berth_api::{Kind, ObjectMeta};

    fn object(status: Value) -> StoredObject {
        StoredObject {
            kind: Kind::Project,
            metadata: ObjectMeta {
                name: "p".into(),
                uid: Some("u".into()),
                generation: Some(3),
                ..ObjectMeta::default()
            },
            spec: crate::store::Doc::null(),
            status: status.into(),
        }
    }

    #[test]
    fn record_round_trips_and_an_unchanged_draft_writes_nothing() {
        let mut draft = Draft::from_object(&object(Value::Null));
        draft.set_step(Step::Created);
        draft.record.operation = Some(PendingOperation {
            id: "op".into(),
            step: Step::Created,
            submitted_at: draft.now(),
        });
        draft.set_not_ready(Phase::Provisioning, "Created", "");
        let stored = Arc::new(object(draft.to_value()));
        let again = Draft::from_object(&stored);
        assert_eq!(again.record, draft.record);
        assert_eq!(again.step(), Step::Created);
        assert!(unchanged(&stored, &again));
        assert_eq!(stored.status.value()["observedGeneration"], 3);
    }

    #[test]
    fn a_commit_keeps_what_others_wrote_meanwhile_and_wins_where_it_changed() {
        use serde_json::json;
        let ready = |status: &str, reason: &str| json!({"type": "Ready", "status": status, "reason": reason});
        let protected = json!({"type": "ReapProtected", "status": "True", "reason": "UnsavedWork"});
        let base = json!({
            "phase": "Provisioning", "step": "Created",
            "conditions": [ready("False", "Created")],
            "activity": {"lastActiveAt": "t0"},
        });
        // The reconcile advanced a step; the scheduler meanwhile recorded activity and a
        // condition of its own, and rewrote the phase the reconcile also set.
        let ours = json!({
            "phase": "Ready", "step": "Started",
            "conditions": [ready("True", "Started")],
            "activity": {"lastActiveAt": "t0"},
            "controller": {"stepStartedAt": "t1"},
        });
        let theirs = json!({
            "phase": "Stopped", "step": "Created",
            "conditions": [ready("False", "Created"), protected.clone()],
            "activity": {"lastActiveAt": "t2"},
            "title": "Fix the test",
        });
        let merged = merge_changes(&base, &ours, &theirs);
        assert_eq!(
            merged,
            json!({
                "phase": "Ready", "step": "Started",
                "conditions": [ready("True", "Started"), protected],
                "activity": {"lastActiveAt": "t2"},
                "title": "Fix the test",
                "controller": {"stepStartedAt": "t1"},
            })
        );

        // A field or condition the reconcile removed goes; one it never had stays.
        let base =
            json!({"message": "boot timeout", "conditions": [ready("False", "BootTimeout")]});
        let ours = json!({});
        let theirs = json!({"message": "boot timeout", "conditions": [ready("False", "BootTimeout")], "ports": [3000]});
        assert_eq!(
            merge_changes(&base, &ours, &theirs),
            json!({"ports": [3000]})
        );
        // Nothing written meanwhile: the merge is what the reconcile wants.
        let ours = json!({"phase": "Ready", "conditions": [ready("True", "Reachable")]});
        assert_eq!(merge_changes(&base, &ours, &base), ours);
    }

    #[test]
    fn first_reachable_at_is_recorded_once_and_never_dropped() {
        use serde_json::json;
        let mut draft = Draft::from_object(&object(Value::Null));
        draft.set_step(Step::Started);
        assert_eq!(draft.status.first_reachable_at, None);
        draft.set_step(Step::Reachable);
        let at = draft.status.first_reachable_at.expect("recorded");
        // A new image, a recreate, a boot: the step goes back, the record stays.
        draft.set_step(Step::Requested);
        draft.set_step(Step::Reachable);
        assert_eq!(draft.status.first_reachable_at, Some(at));
        assert!(ever_reachable(&draft.status));

        // Stored before the field existed: backfilled from the step, or from what only a
        // reachable workspace leaves behind.
        for stored in [
            json!({"step": "Briefed"}),
            json!({"step": "Requested", "unsavedWork": {"uncommitted": 0, "untracked": 0, "stashes": 0, "unpushed": 0}}),
            json!({"step": "Requested", "seededFiles": {"/workspace/AGENTS.md": "00"}}),
        ] {
            let mut draft = Draft::from_object(&object(stored.clone()));
            draft.backfill_first_reachable();
            assert!(draft.status.first_reachable_at.is_some(), "{stored}");
        }
        let mut never = Draft::from_object(&object(json!({"step": "Created"})));
        never.backfill_first_reachable();
        assert_eq!(never.status.first_reachable_at, None);
        assert!(!ever_reachable(&never.status));

        // No status write drops it: not a merge with a draft that lacks it, nor a write of one.
        let base = json!({"step": "Reachable", "firstReachableAt": "t0"});
        let ours = json!({"step": "Requested"});
        let theirs = json!({"step": "Reachable", "firstReachableAt": "t0", "title": "x"});
        assert_eq!(
            merge_changes(&base, &ours, &theirs)["firstReachableAt"],
            "t0"
        );
    }

    #[test]
    fn transitions_name_steps_and_phases() {
        let before = ProjectStatus::default();
        let mut after = before.clone();
        after.step = Some(Step::Created);
        after.phase = Phase::Provisioning;
        let events = transitions(&before, &after);
        assert_eq!(events.len(), 2);
        assert_eq!(events[0].1, "Created");
        assert_eq!(events[1].1, "Provisioning");
        assert!(transitions(&after, &after).is_empty());
    }
}
