//! Deleting a project: the finalizer `berth.dev/teardown` holds the object until its container
//! and volumes are gone. Every call is idempotent (deleting what is already gone succeeds), so a
//! teardown interrupted by a crash simply runs again. A deletion no person forced is held first
//! while the workspace holds work ([`hold`]).
//!
//! The teardown, in order: the deletion hold, then the container, a leftover inspection instance,
//! and the volumes (both through `crate::dispose`), then the object. When each held deletion was
//! last looked at, and which `berth.dev/lookRequestedAt` that look answered, is [`HeldDeletions`],
//! in the controller's `Context`, never a process-wide static; `status.deletionHold` says when it
//! looked, when it looks next and which request it answered, and a client reads a hold as the
//! answer to its request only then.

use std::sync::Arc;
use std::time::Duration;

use berth_api::{Kind, Phase, reasons};

use crate::layout::{DurableLayout, FINALIZER, uid_label};
use crate::reconcile::commit::{commit, store_call};
use crate::reconcile::status::Draft;
use crate::reconcile::{Action, Context, ReconcileError};
use crate::store::StoredObject;
use crate::workspace::inspection_instance;

mod hold;

pub use hold::{HeldDeletions, forced, release_forced};

/// A container being deleted gets this long to stop cleanly before it is killed.
const TEARDOWN_CLEAN_STOP: Duration = Duration::from_secs(10);

pub async fn finalize(
    ctx: &Context,
    object: &Arc<StoredObject>,
    mut draft: Draft,
) -> Result<Action, ReconcileError> {
    if !object.metadata.finalizers.iter().any(|f| f == FINALIZER) {
        // Something else holds the object; berth's part is done.
        return Ok(Action::Done);
    }
    let runtime = &*ctx.runtime;
    let settings = &ctx.settings;
    let name = object.name();
    let uid = object.uid();

    let message = hold::ready_message(&draft);
    draft.set_not_ready(Phase::Deleting, reasons::DELETING, &message);
    let object = commit(ctx, object, &mut draft).await?;

    // Work that exists nowhere else holds a deletion no person forced.
    if let Some(retry) = hold::hold(ctx, &object, &mut draft).await? {
        commit(ctx, &object, &mut draft).await?;
        return Ok(Action::Requeue(retry));
    }

    if let Some(instance) = runtime.get_instance_record(name).await? {
        if uid_label(&instance.config) == Some(uid) {
            crate::dispose::deleted_container(
                runtime,
                &settings.trash,
                &object,
                &instance,
                TEARDOWN_CLEAN_STOP,
                settings.timeouts.delete,
            )
            .await?;
        } else {
            tracing::warn!("an instance of this name is not this project's; leaving it alone");
        }
    }

    // The volumes go to the trash (or, purged, are deleted): `crate::dispose::volumes`.
    // An inspection instance a crash left behind would keep the workspace volume in use.
    if let Err(e) =
        inspection_instance::remove_leftover(runtime, uid, settings.timeouts.delete).await
    {
        tracing::warn!(error = %e, "a leftover inspection instance could not be removed");
    }

    let volumes = runtime
        .volumes_named(&settings.storage_pool, &DurableLayout::volume_prefix(uid))
        .await?
        .into_iter()
        .filter(|v| uid_label(&v.config) == Some(uid) && DurableLayout::owns_volume(uid, &v.name))
        .collect();
    crate::dispose::volumes(
        runtime,
        &settings.storage_pool,
        &settings.trash,
        &object,
        volumes,
    )
    .await?;

    let finalizers: Vec<String> = object
        .metadata
        .finalizers
        .iter()
        .filter(|f| *f != FINALIZER)
        .cloned()
        .collect();
    let project = name.to_string();
    store_call(ctx, move |store| {
        store.set_finalizers(Kind::Project, &project, None, finalizers)
    })
    .await?;
    ctx.queue.forget(name);
    Ok(Action::Done)
}
