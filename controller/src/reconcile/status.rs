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
}

impl ControllerRecord {
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
        let status: ProjectStatus =
            serde_json::from_value(object.status.clone()).unwrap_or_default();
        let record: ControllerRecord = object
            .status
            .get("controller")
            .and_then(|v| serde_json::from_value(v.clone()).ok())
            .unwrap_or_default();
        Draft {
            status,
            record,
            generation: object.generation(),
            now: Utc::now(),
        }
    }

    pub fn now(&self) -> DateTime<Utc> {
        self.now
    }

    pub fn step(&self) -> Step {
        self.status.step.unwrap_or(Step::Requested)
    }

    /// Records that `step` is now the last completed one.
    pub fn set_step(&mut self, step: Step) {
        if self.status.step != Some(step) {
            self.status.step = Some(step);
            self.record.step_started_at = Some(self.now);
        }
    }

    /// How long the project has been waiting for the step after the current one.
    pub fn time_in_step(&self) -> chrono::Duration {
        self.record
            .step_started_at
            .map(|at| self.now - at)
            .unwrap_or_default()
    }

    pub fn set_condition(
        &mut self,
        type_: &str,
        status: ConditionStatus,
        reason: &str,
        message: &str,
    ) {
        set_condition(
            &mut self.status.conditions,
            type_,
            status,
            reason,
            message,
            self.generation,
            self.now,
        );
    }

    pub fn condition(&self, type_: &str) -> Option<&Condition> {
        berth_api::find_condition(&self.status.conditions, type_)
    }

    /// `Ready` with its reason, and the phase that goes with it.
    pub fn set_ready(&mut self, phase: Phase, ready: bool, reason: &str, message: &str) {
        self.status.phase = phase;
        let status = if ready {
            ConditionStatus::True
        } else {
            ConditionStatus::False
        };
        self.set_condition(berth_api::condition_types::READY, status, reason, message);
        self.status.message = if ready {
            String::new()
        } else {
            message.to_string()
        };
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

/// Whether the stored status already says what `draft` says.
pub fn unchanged(object: &Arc<StoredObject>, draft: &Draft) -> bool {
    object.status == draft.to_value()
}

#[cfg(test)]
mod tests {
    use super::*;
    use berth_api::ObjectMeta;

    fn object(status: Value) -> StoredObject {
        StoredObject {
            kind: "Project".into(),
            metadata: ObjectMeta {
                name: "p".into(),
                uid: Some("u".into()),
                generation: Some(3),
                ..ObjectMeta::default()
            },
            spec: Value::Null,
            status,
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
        draft.set_ready(Phase::Provisioning, false, "Created", "");
        let stored = Arc::new(object(draft.to_value()));
        let again = Draft::from_object(&stored);
        assert_eq!(again.record, draft.record);
        assert_eq!(again.step(), Step::Created);
        assert!(unchanged(&stored, &again));
        assert_eq!(stored.status["observedGeneration"], 3);
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
