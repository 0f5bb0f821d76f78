//! Committing one step of a reconcile: the draft's status written through the store's status
//! path (laid onto whatever another writer stored since the reconcile read it), an event per
//! transition and the step's duration, before the next side effect begins.

use std::sync::Arc;

use berth_api::{Kind, ProjectStatus};

use super::status::{Draft, transitions};
use super::{Context, ReconcileError, fault};
use crate::store::{FieldManager, StatusWrite, Store, StoredObject};

/// Runs a store call on the blocking pool: store writes commit to SQLite synchronously.
pub(super) async fn store_call<T: Send + 'static>(
    ctx: &Context,
    f: impl FnOnce(&Store) -> T + Send + 'static,
) -> T {
    ctx.store.call(f).await
}

/// Writes the draft's status when it differs from the stored one, then records an event per
/// transition and, for a new step, its duration. A step's fault point fires here, right after
/// the step is committed.
pub(super) async fn commit(
    ctx: &Context,
    object: &Arc<StoredObject>,
    draft: &mut Draft,
) -> Result<Arc<StoredObject>, ReconcileError> {
    let value = draft.to_value();
    if object.status == value {
        return Ok(object.clone());
    }
    let before: ProjectStatus = object.status.decode().unwrap_or_default();
    // The first step is timed from the project's creation: that is when it was asked for.
    let before_step_started = Draft::from_object(object)
        .record
        .step_started_at
        .or_else(|| {
            before
                .step
                .is_none()
                .then_some(object.metadata.creation_timestamp)
                .flatten()
        });
    let name = object.name().to_string();
    let base = object.clone();
    let updated = store_call(ctx, move |store| {
        store
            .write_status(
                StatusWrite::new(Kind::Project, &name, FieldManager::Reconciler),
                |latest| lay_changes(&base, &value, latest),
            )?
            .require(Kind::Project, &name)
    })
    .await?;
    let events = transitions(&before, &draft.status);
    if !events.is_empty() {
        let target = updated.clone();
        store_call(ctx, move |store| {
            for (type_, reason, message) in events {
                store.record_or_warn(&target, type_, &reason, &message);
            }
        })
        .await;
    }
    if before.step != draft.status.step
        && let Some(step) = draft.status.step
    {
        if let Some(since) = before_step_started {
            let took = (draft.now() - since).to_std().unwrap_or_default();
            ctx.metrics.observe_step(step.as_str(), took.as_secs_f64());
        }
        tracing::info!(step = step.as_str(), "step committed");
        fault::after_step(step);
    }
    draft.rebase(&updated);
    Ok(updated)
}

/// The status this reconcile wants, `ours` (derived from `base`), as a change of the status
/// stored now: when someone else wrote it since `base` was read (the scheduler's activity, an
/// agent step's record), only the fields this reconcile changed are laid onto theirs.
fn lay_changes(
    base: &StoredObject,
    ours: &serde_json::Value,
    latest: &StoredObject,
) -> serde_json::Value {
    if latest.resource_version() == base.resource_version() {
        ours.clone()
    } else {
        super::status::merge_changes(&base.status.value(), ours, &latest.status.value())
    }
}
