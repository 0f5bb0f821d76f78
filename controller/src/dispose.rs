//! The one owner of destruction: every container and volume berth takes away from a project goes
//! through here, and what it takes goes to the trash first.
//!
//! - A deleted project's volumes are labelled with the project's record and renamed into the
//!   trash ([`volumes`]), or deleted when the deletion was purged or the trash is disabled.
//! - A replaced container (`berth restart --recreate`, a new `spec.image`) is stopped, its
//!   volumes' disks detached (they stay with the live project), labelled and renamed
//!   `berth-trash-<uid>-ct-<n>` ([`container_into_trash`]): its root filesystem holds work outside
//!   the mounts (worktrees, a person's tools). It expires with the trash.
//! - A deleted project's container, once the deletion's look let it go, goes to the trash the
//!   same way ([`deleted_container`]): work outside the mounts that the look could not see
//!   (a tool a person installed, files under /root that are no repository) is kept for the
//!   retention. It is deleted only when the deletion was purged or the trash is disabled.
//!
//! - A warm pool member the pool no longer wants ([`pool_member`]) is deleted outright: it
//!   never held a project's data.
//!
//! Besides this module, only the trash's purge of expired items and the inspection instance's
//! cleanup delete instances or volumes (a unit test reads the source tree to keep it so).
//!
//! Every step is idempotent and reads where things are before acting, so a crash at any point
//! resumes from LXD's state: labels before the rename, the project's uid label cleared last.

use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::layout::{POOL_LABEL, UID_LABEL, uid_label};
use crate::runtime::{
    Device, Instance, InstanceStatus, Runtime, RuntimeError, StopOptions, Volume,
};
use crate::store::StoredObject;
use crate::trash::{self, TrashSettings};

#[cfg(test)]
mod tests;

/// Takes a deleted project's `volumes` (found under its own names) away from it: into the trash,
/// or deleted when the trash is disabled or the deletion was purged. Each volume is labelled,
/// then renamed; run again after a crash, it finishes what is still under the project's names
/// (a volume already renamed is no longer among them).
pub async fn volumes(
    runtime: &dyn Runtime,
    pool: &str,
    settings: &TrashSettings,
    object: &StoredObject,
    volumes: Vec<Volume>,
) -> Result<(), RuntimeError> {
    let purged = purged(object);
    for volume in &volumes {
        if purged || !settings.enabled() {
            runtime
                .delete_volume(pool, &volume.name, trash::target(volume))
                .await?;
            tracing::info!(volume = volume.name.as_str(), purged, "volume deleted");
            continue;
        }
        runtime
            .patch_volume(
                pool,
                &volume.name,
                &trash::trash_labels(object, &volume.name),
                trash::target(volume),
            )
            .await?;
        let trashed = trash::trash_name(&volume.name);
        runtime
            .rename_volume(pool, &volume.name, &trashed, trash::target(volume))
            .await?;
        tracing::info!(
            volume = volume.name.as_str(),
            trash = trashed.as_str(),
            "volume moved to the trash"
        );
    }
    Ok(())
}

/// Takes the container `instance` away from `object`, a project being deleted (the caller read
/// its record just before and checked that it is the project's own, and the deletion's look let
/// it go): into the trash like a replaced one ([`container_into_trash`], the deletion's reason
/// recorded), or stopped and deleted when the deletion was purged or the trash is disabled.
pub async fn deleted_container(
    runtime: &dyn Runtime,
    settings: &TrashSettings,
    object: &StoredObject,
    instance: &Instance,
    clean_stop: Duration,
    timeout: Duration,
) -> Result<(), RuntimeError> {
    let name = instance.name.as_str();
    if purged(object) || !settings.enabled() {
        runtime
            .stop_instance(name, StopOptions::clean_then_force(clean_stop))
            .await?;
        runtime.delete_instance(name, timeout).await?;
        tracing::info!("container deleted");
        return Ok(());
    }
    let replaced = Replaced {
        object,
        name,
        why: trash::reason(object),
        now: crate::clock::now(),
        clean_stop,
        timeout,
    };
    into_trash(runtime, &replaced, instance).await?;
    Ok(())
}

/// Deletes the warm pool member `name` of the controller `controller`, read again first: only
/// while it still carries that controller's pool label and no project's uid label (a claim
/// sets the one and clears the other in one update), so nothing that could hold a project's
/// data is deleted here. Answers whether it deleted it (or found it gone).
pub async fn pool_member(
    runtime: &dyn Runtime,
    controller: &str,
    name: &str,
    timeout: Duration,
) -> Result<bool, RuntimeError> {
    let Some(member) = runtime.get_instance_record(name).await? else {
        return Ok(true);
    };
    let unclaimed = member.config.get(POOL_LABEL).map(String::as_str) == Some(controller)
        && uid_label(&member.config).is_none();
    if !unclaimed {
        return Ok(false);
    }
    runtime.stop_instance(name, StopOptions::kill()).await?;
    runtime.delete_instance(name, timeout).await?;
    tracing::info!(member = name, "warm pool member deleted");
    Ok(true)
}

/// Whether the deletion of `object` skips the trash (`DELETE ...?purge=true`, admins).
fn purged(object: &StoredObject) -> bool {
    object
        .metadata
        .annotations
        .get(berth_api::annotations::PURGE)
        .is_some_and(|v| v == "true")
}

/// What a replacement (or a deletion) puts in the trash: the project's container, and why it
/// goes.
pub struct Replaced<'a> {
    pub object: &'a StoredObject,
    /// The container's name (the project's).
    pub name: &'a str,
    /// `recreate` or `image` (a deletion's: `deleted`, `forced`, `reaper`, `prune`), recorded
    /// as the entry's reason.
    pub why: &'a str,
    pub now: DateTime<Utc>,
    /// How long the container gets to stop cleanly before it is killed.
    pub clean_stop: Duration,
    pub timeout: Duration,
}

/// Moves a replaced container into the trash instead of deleting it: stopped, its volumes'
/// disk devices and its proxies detached (the volumes stay with the live project; a trashed
/// instance must not hold the workspace), labelled (`user.berth.trash.*`, kind `container`,
/// keyed `<uid>-ct-<n>`), renamed `berth-trash-<uid>-ct-<n>`, and finally its project uid
/// label cleared so nothing takes it for the project's container. Returns the trash name.
///
/// Run again after a crash it finishes the same item: a container already labelled keeps its
/// key, so a retried replacement never makes a second entry of one container.
pub async fn container_into_trash(
    runtime: &dyn Runtime,
    replaced: &Replaced<'_>,
) -> Result<String, RuntimeError> {
    let name = replaced.name;
    let Some(instance) = runtime.get_instance_record(name).await? else {
        return Err(RuntimeError::NotFound {
            what: format!("instance {name}"),
            message: "the container to replace is gone".into(),
        });
    };
    into_trash(runtime, replaced, &instance).await
}

/// [`container_into_trash`] of the container whose record `instance` the caller has just read.
async fn into_trash(
    runtime: &dyn Runtime,
    replaced: &Replaced<'_>,
    instance: &Instance,
) -> Result<String, RuntimeError> {
    let Replaced {
        object,
        name,
        why,
        now,
        clean_stop,
        timeout,
    } = replaced;
    let uid = object.uid();
    // A container started after this read refuses the rename below, and the caller retries.
    if instance.status != InstanceStatus::Stopped {
        runtime
            .stop_instance(name, StopOptions::clean_then_force(*clean_stop))
            .await?;
    }
    let n = match instance
        .config
        .get(trash::TRASH_UID)
        .and_then(|key| key.strip_prefix(uid))
        .and_then(|rest| rest.strip_prefix("-ct-"))
        .and_then(|n| n.parse::<u32>().ok())
    {
        Some(n) => n,
        None => next_free(runtime, uid).await?,
    };
    // A deleted project's container joins its project's entry (restored with it, purged with
    // it); a replaced one is an entry of its own.
    let key = match object.metadata.deletion_timestamp {
        Some(_) => uid.to_string(),
        None => trash::container_key(uid, n),
    };
    let labels = trash::container_labels(object, &key, *now, why);
    runtime
        .update_instance(name, &|edit| {
            edit.devices.retain(|_, device| !detached(device));
            for (k, v) in &labels {
                // A retry keeps the first record's time.
                edit.config.entry(k.clone()).or_insert_with(|| v.clone());
            }
        })
        .await?;
    let trashed = trash::container_trash_name(uid, n);
    runtime.rename_instance(name, &trashed, *timeout).await?;
    if uid_label(&instance.config) == Some(uid) {
        let mut clear = crate::runtime::InstancePatch::default();
        clear.config.insert(UID_LABEL.to_string(), String::new());
        runtime.patch_instance(&trashed, &clear).await?;
    }
    tracing::info!(
        trash = trashed.as_str(),
        reason = *why,
        "replaced container moved to the trash"
    );
    Ok(trashed)
}

/// The devices a trashed container gives up: disks of a storage volume (the project's volumes,
/// which stay with the live project) and proxies (host listeners).
fn detached(device: &Device) -> bool {
    let kind = device.get("type").map(String::as_str);
    match kind {
        Some("disk") => device.contains_key("pool") && device.get("path").is_none_or(|p| p != "/"),
        Some("proxy") => true,
        _ => false,
    }
}

/// The next free number for a container of project `uid` in the trash: one past the highest
/// trashed one (an expired one's number is not reused while a later one exists).
async fn next_free(runtime: &dyn Runtime, uid: &str) -> Result<u32, RuntimeError> {
    let highest = runtime
        .instance_names()
        .await?
        .iter()
        .filter_map(|name| trash::container_number(uid, name))
        .max();
    Ok(highest.map_or(1, |n| n + 1))
}
