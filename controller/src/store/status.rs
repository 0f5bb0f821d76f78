//! The one status writer. Every part of berth that writes an object's status goes through
//! [`Store::write_status`]: it names itself (a [`FieldManager`], as server-side apply's field
//! managers do), says what it wants as a change of the status as it is now, and the writer
//! re-reads, applies the change, keeps every field the writer does not own as stored, and
//! writes under the resourceVersion it read, retrying a lost race a bounded number of times.
//! The result says when it gave up.
//!
//! The writer never drops `firstReachableAt`, retries a lost race up to
//! `STATUS_WRITE_ATTEMPTS` times, and answers `StatusWritten` (`Written`, `Unchanged`, `Gone`,
//! `GaveUp`).

use std::sync::Arc;

use berth_api::Kind;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use super::{Commit, Store, StoreError, StoredObject};

/// How often a status write re-reads and applies its change again when other writers keep
/// winning the race.
pub const STATUS_WRITE_ATTEMPTS: usize = 8;

/// Who writes a status field. Each top-level field of a Project's status has declared owners
/// ([`PROJECT_FIELDS`]); a writer's change to a field it does not own is not written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FieldManager {
    /// The project reconciler: lifecycle, steps, its own record, the finalizer's hold.
    Reconciler,
    /// The agent steps run by a reconcile: what was seeded, provisioned, briefed, reported.
    AgentSteps,
    /// The scheduler's passes: activity, ports, findings, the reaper's record.
    Scheduler,
    /// The GitSource controller: a GitSource's status (every field: it owns the kind's status).
    GitOps,
    /// The status subresource of the API (an administrator's PUT) and the controllers of the
    /// other kinds: every field.
    Server,
}

impl FieldManager {
    pub fn as_str(self) -> &'static str {
        match self {
            FieldManager::Reconciler => "reconciler",
            FieldManager::AgentSteps => "agent-steps",
            FieldManager::Scheduler => "scheduler",
            FieldManager::GitOps => "gitops",
            FieldManager::Server => "server",
        }
    }
}

/// One top-level field of a Project's status and the managers that may write it.
pub struct Field {
    pub name: &'static str,
    pub owners: &'static [FieldManager],
    /// Recorded once and never dropped by any write.
    pub sticky: bool,
}

const fn field(name: &'static str, owners: &'static [FieldManager]) -> Field {
    Field {
        name,
        owners,
        sticky: false,
    }
}

use FieldManager::{AgentSteps, Reconciler, Scheduler};

/// The declared owners of a Project's status fields. `conditions` is shared: each writer sets
/// only its own condition types (`Ready` and `DeletionBlocked` are the reconciler's).
pub const PROJECT_FIELDS: &[Field] = &[
    field("observedGeneration", &[Reconciler]),
    field("phase", &[Reconciler]),
    field("step", &[Reconciler]),
    Field {
        name: "firstReachableAt",
        owners: &[Reconciler],
        sticky: true,
    },
    field("message", &[Reconciler]),
    field("container", &[Reconciler]),
    // The member a project's volumes live on: decided once, kept for the project's life.
    Field {
        name: "location",
        owners: &[Reconciler],
        sticky: true,
    },
    field("controller", &[Reconciler]),
    field("conditions", &[Reconciler, AgentSteps, Scheduler]),
    // A deletion's look records its findings; waking clears the idle record.
    field("unsavedWork", &[Scheduler, Reconciler]),
    field("reap", &[Scheduler, Reconciler]),
    field("deletionHold", &[Reconciler]),
    field("activity", &[Scheduler]),
    // The addresses the activity pass saw, and the network check's failed repair.
    field("network", &[Scheduler]),
    field("ports", &[Scheduler]),
    field("title", &[Scheduler, AgentSteps]),
    field("agent", &[Scheduler, AgentSteps]),
    field("briefId", &[AgentSteps]),
    // The brief's progress moves with the agent's report, which both record.
    field("briefAcknowledged", &[Scheduler, AgentSteps]),
    field("briefFinished", &[Scheduler, AgentSteps]),
    field("seededFiles", &[AgentSteps]),
    field("provisionedProfiles", &[AgentSteps]),
    // A schedule's runs, and the brief the last one handed over.
    field("schedules", &[Scheduler]),
    field("scheduledBrief", &[Scheduler]),
];

/// Whether `manager` may write the field `name` of a status of `kind`.
fn owns(kind: Kind, manager: FieldManager, name: &str) -> bool {
    if manager == FieldManager::Server || kind != Kind::Project {
        return true;
    }
    PROJECT_FIELDS
        .iter()
        .find(|f| f.name == name)
        .is_some_and(|f| f.owners.contains(&manager))
}

/// Lays what `manager` wants (`next`) onto the `stored` status: the fields it owns take their
/// value from `next` (absent there: removed), every other field keeps the stored one, and a
/// sticky field is never dropped by a controller (an administrator's PUT replaces it all).
pub fn lay_owned(kind: Kind, manager: FieldManager, stored: &Value, next: Value) -> Value {
    let Value::Object(next) = next else {
        return if manager == FieldManager::Server {
            next
        } else {
            stored.clone()
        };
    };
    let mut merged = match stored {
        Value::Object(map) => map.clone(),
        _ => serde_json::Map::new(),
    };
    let names: std::collections::BTreeSet<String> =
        merged.keys().chain(next.keys()).cloned().collect();
    for name in names {
        if !owns(kind, manager, &name) {
            if next.get(&name) != merged.get(&name) {
                tracing::debug!(
                    field = name.as_str(),
                    manager = manager.as_str(),
                    "a status write left a field it does not own as stored"
                );
            }
            continue;
        }
        match next.get(&name) {
            Some(value) => {
                merged.insert(name, value.clone());
            }
            None => {
                let sticky = kind == Kind::Project
                    && manager != FieldManager::Server
                    && PROJECT_FIELDS.iter().any(|f| f.name == name && f.sticky);
                if !sticky {
                    merged.remove(&name);
                }
            }
        }
    }
    Value::Object(merged)
}

/// Which object's status to write, by whom, and under what precondition.
#[derive(Debug, Clone, Copy)]
pub struct StatusWrite<'a> {
    pub kind: Kind,
    pub name: &'a str,
    pub manager: FieldManager,
    /// A resourceVersion the caller read and insists on: a conflict is then final, not retried.
    pub pinned: Option<u64>,
    /// [`Commit::DryRun`]: judge the write, write nothing.
    pub commit: Commit,
}

impl<'a> StatusWrite<'a> {
    pub fn new(kind: Kind, name: &'a str, manager: FieldManager) -> Self {
        StatusWrite {
            kind,
            name,
            manager,
            pinned: None,
            commit: Commit::Persist,
        }
    }

    pub fn pinned(self, resource_version: Option<u64>) -> Self {
        StatusWrite {
            pinned: resource_version,
            ..self
        }
    }

    pub fn commit(self, commit: Commit) -> Self {
        StatusWrite { commit, ..self }
    }
}

/// What a status write did.
#[derive(Debug, Clone)]
pub enum StatusWritten {
    /// Written: the object as stored now.
    Written(Arc<StoredObject>),
    /// The change changed nothing; nothing was written.
    Unchanged(Arc<StoredObject>),
    /// No such object (any more).
    Gone,
    /// Other writers won every race: nothing was written after this many attempts.
    GaveUp { attempts: usize },
}

impl StatusWritten {
    /// The object as stored after the write, when there is one that reflects it.
    pub fn object(self) -> Option<Arc<StoredObject>> {
        match self {
            StatusWritten::Written(o) | StatusWritten::Unchanged(o) => Some(o),
            StatusWritten::Gone | StatusWritten::GaveUp { .. } => None,
        }
    }

    /// The object after the write; a gone object is `NotFound`, giving up a `Conflict`.
    pub fn require(self, kind: Kind, name: &str) -> Result<Arc<StoredObject>, StoreError> {
        match self {
            StatusWritten::Written(o) | StatusWritten::Unchanged(o) => Ok(o),
            StatusWritten::Gone => Err(StoreError::not_found(kind, name)),
            StatusWritten::GaveUp { attempts } => Err(StoreError::conflict(
                kind,
                name,
                format!("the status kept changing: gave up after {attempts} attempts"),
            )),
        }
    }
}

impl Store {
    /// The one status writer: reads the object, asks `change` for the status it wants given
    /// the stored object, keeps the fields `write.manager` does not own as stored, and writes
    /// under the resourceVersion read. A lost race is retried (up to
    /// [`STATUS_WRITE_ATTEMPTS`]) unless the caller pinned a resourceVersion.
    pub fn write_status(
        &self,
        write: StatusWrite<'_>,
        mut change: impl FnMut(&StoredObject) -> Value,
    ) -> Result<StatusWritten, StoreError> {
        for attempt in 1..=STATUS_WRITE_ATTEMPTS {
            let Some(latest) = self.get(write.kind, write.name) else {
                return match write.pinned {
                    Some(_) => Err(StoreError::not_found(write.kind, write.name)),
                    None => Ok(StatusWritten::Gone),
                };
            };
            let stored = latest.status.value();
            let next = lay_owned(write.kind, write.manager, &stored, change(&latest));
            if write.pinned.is_none() && latest.status == next {
                return Ok(StatusWritten::Unchanged(latest));
            }
            let expected = write.pinned.or(Some(latest.resource_version()));
            match self.update_status(write.kind, write.name, expected, next, write.commit) {
                Ok(object) if object.resource_version() == latest.resource_version() => {
                    return Ok(StatusWritten::Unchanged(object));
                }
                Ok(object) => return Ok(StatusWritten::Written(object)),
                Err(StoreError::NotFound { .. }) if write.pinned.is_none() => {
                    return Ok(StatusWritten::Gone);
                }
                Err(StoreError::Conflict { .. })
                    if write.pinned.is_none() && attempt < STATUS_WRITE_ATTEMPTS => {}
                Err(StoreError::Conflict { .. }) if write.pinned.is_none() => {
                    tracing::warn!(
                        kind = write.kind.as_str(),
                        name = write.name,
                        manager = write.manager.as_str(),
                        attempts = attempt,
                        "a status write gave up: other writers kept winning"
                    );
                    return Ok(StatusWritten::GaveUp { attempts: attempt });
                }
                Err(e) => return Err(e),
            }
        }
        Ok(StatusWritten::GaveUp {
            attempts: STATUS_WRITE_ATTEMPTS,
        })
    }

    /// [`Store::write_status`] with `change` editing the typed status (decoded from the stored
    /// one; an unreadable one starts from the default, and the fields this writer does not own
    /// are kept as stored either way).
    pub fn write_status_typed<T: Serialize + DeserializeOwned + Default>(
        &self,
        write: StatusWrite<'_>,
        mut change: impl FnMut(&mut T, &StoredObject),
    ) -> Result<StatusWritten, StoreError> {
        self.write_status(write, |object| {
            let mut status: T = object.status.decode().unwrap_or_default();
            change(&mut status, object);
            serde_json::to_value(&status).unwrap_or(Value::Null)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_writer_changes_only_the_fields_it_owns_and_never_drops_first_reachable_at() {
        let stored = json!({
            "phase": "Ready", "firstReachableAt": "t0", "activity": {"lastActiveAt": "t1"},
            "controller": {"image": "berth-base"}, "seededFiles": {"/workspace/AGENTS.md": "00"},
        });
        // The scheduler rewrites activity; its decoded status lacks the reconciler's record.
        let next = json!({"phase": "Stopped", "activity": {"lastActiveAt": "t2"}});
        let merged = lay_owned(Kind::Project, FieldManager::Scheduler, &stored, next);
        assert_eq!(merged["phase"], "Ready");
        assert_eq!(merged["activity"]["lastActiveAt"], "t2");
        assert_eq!(merged["controller"]["image"], "berth-base");
        assert_eq!(merged["seededFiles"]["/workspace/AGENTS.md"], "00");

        // The reconciler removes what it owns, never firstReachableAt.
        let merged = lay_owned(Kind::Project, FieldManager::Reconciler, &stored, json!({}));
        assert_eq!(merged.get("phase"), None);
        assert_eq!(merged["firstReachableAt"], "t0");
        assert_eq!(merged["activity"]["lastActiveAt"], "t1");

        // The server (an administrator's PUT) and other kinds write every field.
        let merged = lay_owned(
            Kind::Project,
            FieldManager::Server,
            &stored,
            json!({"phase": "X"}),
        );
        assert_eq!(merged, json!({"phase": "X"}));
        let merged = lay_owned(
            Kind::GitSource,
            FieldManager::Server,
            &json!({"a": 1}),
            json!({}),
        );
        assert_eq!(merged, json!({}));
    }
}
