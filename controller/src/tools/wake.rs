//! A tool call (also a preview request or a port-forward) on a project the reaper idled wakes
//! it the way `berth start` does (the `berth.dev/wokenAt` annotation, later than the idling;
//! spec is never written) and waits, within the call's deadline, for the reconciler to bring
//! it back to Reachable. A project stopped by its own `spec.state: Stopped` is never started
//! by a tool call.

use std::sync::Arc;
use std::time::Duration;

use crate::reconcile::status::{Idling, idling};
use crate::reconcile::wake::{WakeError, request_wake};
use berth_api::{ProjectStatus, Step};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::blocking;
use super::error::ToolError;
use crate::store::{Store, StoredObject};
use berth_api::Kind;

/// How often the store is looked at while a woken project starts (it is in memory).
const POLL: Duration = Duration::from_millis(200);

/// Where a project stands for a tool call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Power {
    /// Running and reachable as far as berth knows: the call goes ahead (the exec itself
    /// tells if the container is gone).
    Up,
    /// The reaper idled it and nothing woke it yet.
    Idled,
    /// Woken, or booting again: the reconciler is bringing it to Reachable.
    Starting,
    /// `spec.state: Stopped`.
    Stopped,
    Deleting,
}

fn power(object: &StoredObject) -> Power {
    if object.is_deleting() {
        return Power::Deleting;
    }
    if object.spec.get_str("state").as_deref() == Some("Stopped") {
        return Power::Stopped;
    }
    let status: ProjectStatus = object.status.decode().unwrap_or_default();
    match idling(&status, &object.metadata.annotations) {
        // `berth start` (or an earlier call) woke it; the reconciler has not acted yet.
        Idling::Woken => return Power::Starting,
        Idling::Idled => return Power::Idled,
        Idling::Awake => {}
    }
    // Started: running again, the reconciler is probing for Reachable.
    if status.step == Some(Step::Started) {
        return Power::Starting;
    }
    Power::Up
}

/// Who wakes a project, for its event and for the advice when it does not come up in time.
#[derive(Debug, Clone, Copy)]
pub struct Waker<'a> {
    /// `a tool call`, `a preview request`.
    pub by: &'a str,
    /// What to do when the project was not up in time.
    pub retry: &'a str,
}

/// Makes sure the project can take the call by `deadline`: wakes an idled one and waits for
/// it; refuses a stopped one. Returns whether it woke the project.
pub async fn ensure_awake(
    store: &Arc<Store>,
    project: &StoredObject,
    deadline: Instant,
    cancel: &CancellationToken,
    execution_id: &str,
    waker: Waker<'_>,
) -> Result<bool, ToolError> {
    let current = fresh(store, project)?;
    let woke = match power(&current) {
        Power::Up => return Ok(false),
        Power::Stopped => return Err(stopped()),
        Power::Deleting => return Err(deleting()),
        Power::Starting => false,
        Power::Idled => {
            wake(store, project, waker.by).await?;
            true
        }
    };
    loop {
        let current = fresh(store, project)?;
        match power(&current) {
            Power::Up => return Ok(woke),
            Power::Stopped => return Err(stopped()),
            Power::Deleting => return Err(deleting()),
            Power::Idled | Power::Starting => {}
        }
        if Instant::now() + POLL > deadline {
            let how = if woke {
                "this request woke it from idle"
            } else {
                "it was woken"
            };
            return Err(ToolError::unreachable(format!(
                "project {:?} is starting ({how}) and was not reachable within the call's timeout; {}",
                project.name(),
                waker.retry
            )));
        }
        tokio::select! {
            () = cancel.cancelled() => return Err(ToolError::cancelled(execution_id)),
            () = tokio::time::sleep(POLL) => {}
        }
    }
}

/// The stored project, if it is still the one the call was made on.
fn fresh(store: &Store, project: &StoredObject) -> Result<Arc<StoredObject>, ToolError> {
    store
        .get(Kind::Project, project.name())
        .filter(|o| o.uid() == project.uid())
        .ok_or_else(|| ToolError::unreachable(format!("project {:?} was deleted", project.name())))
}

/// Sets `berth.dev/wokenAt` to now, as `berth start` does; the reconciler reads it.
async fn wake(store: &Arc<Store>, project: &StoredObject, by: &str) -> Result<(), ToolError> {
    let store = Arc::clone(store);
    let (name, uid, by) = (
        project.name().to_string(),
        project.uid().to_string(),
        by.to_string(),
    );
    blocking(move || match request_wake(&store, &name, &uid, &by) {
        Ok(()) => Ok(()),
        Err(WakeError::Store(err)) => Err(ToolError::from(err)),
        Err(err) => Err(ToolError::unreachable(err.to_string())),
    })
    .await?
}

fn stopped() -> ToolError {
    ToolError::unreachable(
        "project is stopped (spec.state: Stopped); a tool call does not start it, `berth start` does",
    )
}

fn deleting() -> ToolError {
    ToolError::unreachable("project is being deleted")
}

#[cfg(test)]
mod tests {
    use super::*;
    use berth_api::annotations::WOKEN_AT;
    use serde_json::json;

    fn object(
        spec: serde_json::Value,
        status: serde_json::Value,
        annotations: &[(&str, &str)],
    ) -> StoredObject {
        let mut metadata: berth_api::ObjectMeta =
            serde_json::from_value(json!({"name": "p", "uid": "u"})).unwrap();
        metadata.annotations = annotations
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        StoredObject {
            kind: Kind::Project,
            metadata,
            spec: spec.into(),
            status: status.into(),
        }
    }

    #[test]
    fn power_follows_spec_idling_and_steps() {
        let up = json!({"step": "Briefed", "container": {"name": "p", "pid": 7}});
        let idled = json!({"step": "Seeded", "reap": {"idledAt": "2026-01-01T10:00:00Z"}});
        let cases = [
            (json!({}), up.clone(), vec![], Power::Up),
            (
                json!({"state": "Stopped"}),
                up.clone(),
                vec![],
                Power::Stopped,
            ),
            (
                json!({"state": "Stopped"}),
                idled.clone(),
                vec![],
                Power::Stopped,
            ),
            (json!({}), idled.clone(), vec![], Power::Idled),
            (
                json!({}),
                idled.clone(),
                vec![(WOKEN_AT, "2026-01-01T09:59:59Z")],
                Power::Idled,
            ),
            (
                json!({}),
                idled.clone(),
                vec![(WOKEN_AT, "2026-01-01T10:00:00Z")],
                Power::Starting,
            ),
            (
                json!({}),
                json!({"step": "Started"}),
                vec![],
                Power::Starting,
            ),
            (json!({}), json!({"step": "Created"}), vec![], Power::Up),
        ];
        for (spec, status, annotations, want) in cases {
            let o = object(spec.clone(), status.clone(), &annotations);
            assert_eq!(power(&o), want, "{spec} {status} {annotations:?}");
        }
    }
}
