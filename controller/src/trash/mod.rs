//! The trash: a net under every deletion. A deleted project's volumes are not deleted but
//! labelled with what the project was and how it went, and renamed out of the project's names
//! (`names.rs`); `berth restore` brings them back under a project created again from the
//! recorded spec (`restore.rs`); housekeeping purges what outlived `trash.retention`.
//!
//! LXD holds the trash: an entry is the volumes that carry `user.berth.trash.uid`, so the
//! trash survives a lost store and needs no table of its own. A volume whose project uid
//! belongs to a live object is not in the trash, whatever its labels say: its project is on
//! its way into the trash (a teardown between labelling and renaming) or back out of it (a
//! restore that has created the object).
//!
//! Every step is idempotent and each reads where things are before acting, so a crash at any
//! point resumes from LXD's state: labels before the rename into the trash, the rename before
//! the object on the way back.

mod names;
mod restore;

#[cfg(all(test, feature = "testing"))]
mod tests;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use berth_api::Kind;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::metrics::Metrics;
use crate::runtime::{Runtime, RuntimeError, Volume};
use crate::store::{Doc, EventType, Store, StoreError, StoredObject};

pub use names::{
    KIND_CONTAINER, TRASH_UID, TrashEntry, checkout_copy, container_key, container_labels,
    container_number, container_trash_name, is_trash_name, trash_labels, trash_name,
};
pub use restore::Restore;

/// How long a deleted project's volumes are kept (`trash.retention`); zero disables the trash.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TrashSettings {
    pub retention: Duration,
}

/// `trash.retention` when the configuration says nothing.
pub const DEFAULT_RETENTION: Duration = Duration::from_secs(7 * 86_400);

impl Default for TrashSettings {
    fn default() -> Self {
        TrashSettings {
            retention: DEFAULT_RETENTION,
        }
    }
}

impl TrashSettings {
    pub fn enabled(&self) -> bool {
        !self.retention.is_zero()
    }
}

/// How long the purge of a trashed container waits for LXD to delete it.
const PURGE_INSTANCE_TIMEOUT: Duration = Duration::from_secs(120);

/// The member a volume lives on, for calls about it (none on a standalone server).
pub(crate) fn target(volume: &Volume) -> Option<&str> {
    Some(volume.location.as_str()).filter(|l| !l.is_empty() && *l != "none")
}

/// What went wrong with a trash request.
#[derive(Debug, thiserror::Error)]
pub enum TrashError {
    #[error("{0}")]
    NotFound(String),
    /// The name (or uid) to restore under is taken.
    #[error("{0}")]
    Conflict(String),
    #[error("{field}: {message}")]
    Invalid { field: String, message: String },
    #[error("LXD: {0}")]
    Runtime(#[from] RuntimeError),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// One entry as the API answers it (`TrashList.items`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TrashItem {
    pub uid: String,
    pub name: String,
    pub deleted_at: Option<DateTime<Utc>>,
    /// When the trash received the entry; it expires a retention later.
    pub trashed_at: Option<DateTime<Utc>>,
    pub deleted_by: String,
    pub reason: String,
    pub expires_at: Option<DateTime<Utc>>,
    pub bytes: u64,
}

/// `GET /apis/berth.dev/v1alpha1/trash`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TrashList {
    pub api_version: String,
    pub kind: String,
    pub items: Vec<TrashItem>,
}

/// The trash of one daemon: its pool and retention, and the lock that keeps a restore and a
/// purge from acting on one entry at once.
pub struct Trash {
    store: Arc<Store>,
    pool: String,
    settings: TrashSettings,
    metrics: Option<Arc<Metrics>>,
    lock: tokio::sync::Mutex<()>,
    /// The pool said once that it cannot size a volume (LXD 5.0's `dir`): not asked again.
    sizes_unknown: std::sync::atomic::AtomicBool,
    /// When housekeeping last swept the trash ([`Trash::sweep`]).
    swept_at: std::sync::Mutex<Option<DateTime<Utc>>>,
}

/// How often housekeeping sweeps the trash at most: reading it costs LXD a scan of every
/// instance for each volume of the pool, and an entry may outlive its retention by this much.
const SWEEP_AT_MOST_EVERY: Duration = Duration::from_secs(3600);

impl std::fmt::Debug for Trash {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Trash")
            .field("pool", &self.pool)
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

impl Trash {
    pub fn new(store: Arc<Store>, pool: impl Into<String>, settings: TrashSettings) -> Trash {
        Trash {
            store,
            pool: pool.into(),
            settings,
            metrics: None,
            lock: tokio::sync::Mutex::new(()),
            sizes_unknown: std::sync::atomic::AtomicBool::new(false),
            swept_at: std::sync::Mutex::new(None),
        }
    }

    /// Feeds `berth_trash_volumes` and `berth_trash_bytes` whenever the trash is listed.
    pub fn with_metrics(mut self, metrics: Arc<Metrics>) -> Trash {
        self.metrics = Some(metrics);
        self
    }

    pub fn settings(&self) -> &TrashSettings {
        &self.settings
    }

    /// When an entry expires: a retention after the trash received it (`None`: never, as that
    /// time is unknown). A deletion held for days before it reached the trash does not shorten
    /// the entry's stay.
    pub fn expires_at(&self, entry: &TrashEntry) -> Option<DateTime<Utc>> {
        let retention = chrono::Duration::from_std(self.settings.retention).ok()?;
        entry
            .trashed_at
            .and_then(|at| at.checked_add_signed(retention))
    }

    /// Every entry of this controller's trash, oldest deletion first, with the bytes it uses.
    pub async fn entries(&self, runtime: &dyn Runtime) -> Result<Vec<TrashEntry>, RuntimeError> {
        let controller = self.store.controller_id().to_string();
        let volumes: Vec<Volume> = runtime
            .list_volumes(&self.pool, Some(names::TRASH_LABEL_PREFIX))
            .await?
            .into_iter()
            .filter(|v| {
                v.config
                    .get(names::CONTROLLER_LABEL)
                    .is_none_or(|c| *c == controller)
            })
            // A deleted project's volumes on their way into the trash or back out of it: its
            // project is live. Other kinds of items belong to a live project by design.
            .filter(|v| {
                !names::is_project_kind(&v.config)
                    || v.config
                        .get(names::PROJECT_UID_LABEL)
                        .is_none_or(|uid| self.store.get_by_uid(uid).is_none())
            })
            .collect();
        let mut entries = TrashEntry::group(volumes);
        // Replaced containers, renamed into the trash (`crate::dispose`).
        let containers: Vec<_> = runtime
            .list_instances(Some(names::TRASH_LABEL_PREFIX), false)
            .await?
            .into_iter()
            .filter(|i| {
                is_trash_name(&i.name)
                    && i.config.get(names::TRASH_KIND).map(String::as_str)
                        == Some(names::KIND_CONTAINER)
                    && i.config
                        .get(names::CONTROLLER_LABEL)
                        .is_none_or(|c| *c == controller)
            })
            .collect();
        entries.extend(TrashEntry::of_containers(containers));
        entries.sort_by(|a, b| a.deleted_at.cmp(&b.deleted_at).then(a.uid.cmp(&b.uid)));
        for entry in &mut entries {
            for volume in &entry.volumes {
                if self.sizes_unknown.load(Ordering::Relaxed) {
                    break;
                }
                match runtime
                    .volume_usage(&self.pool, &volume.name, target(volume))
                    .await
                {
                    Ok(Some(used)) => entry.bytes += used,
                    Ok(None) => self.sizes_unknown.store(true, Ordering::Relaxed),
                    Err(e) => {
                        tracing::debug!(volume = volume.name.as_str(), error = %e, "volume usage unknown");
                    }
                }
            }
        }
        self.count(&entries);
        Ok(entries)
    }

    fn count(&self, entries: &[TrashEntry]) {
        if let Some(metrics) = &self.metrics {
            let volumes: usize = entries.iter().map(|e| e.volumes.len()).sum();
            let bytes: u64 = entries.iter().map(|e| e.bytes).sum();
            metrics
                .trash_volumes
                .set(i64::try_from(volumes).unwrap_or(i64::MAX));
            metrics
                .trash_bytes
                .set(i64::try_from(bytes).unwrap_or(i64::MAX));
        }
    }

    /// The trash as the API lists it.
    pub async fn list(&self, runtime: &dyn Runtime) -> Result<TrashList, RuntimeError> {
        let entries = self.entries(runtime).await?;
        Ok(TrashList {
            api_version: berth_api::API_VERSION.to_string(),
            kind: "TrashList".to_string(),
            items: entries
                .iter()
                .map(|e| TrashItem {
                    uid: e.uid.clone(),
                    name: e.name.clone(),
                    deleted_at: e.deleted_at,
                    trashed_at: e.trashed_at,
                    deleted_by: e.deleted_by.clone(),
                    reason: e.reason.clone(),
                    expires_at: self.expires_at(e),
                    bytes: e.bytes,
                })
                .collect(),
        })
    }

    /// Housekeeping: [`Trash::purge_expired`] once a tenth of the retention (at most an hour;
    /// hourly when the trash is disabled) has passed since the last sweep, so an entry outlives
    /// its retention by at most that much. `None` when it was not yet time.
    pub async fn sweep(
        &self,
        runtime: &dyn Runtime,
        now: DateTime<Utc>,
    ) -> Option<Result<Vec<String>, RuntimeError>> {
        // A disabled trash holds only what an earlier configuration left: hourly is enough.
        let every = if self.settings.enabled() {
            (self.settings.retention / 10).min(SWEEP_AT_MOST_EVERY)
        } else {
            SWEEP_AT_MOST_EVERY
        };
        let every = chrono::Duration::from_std(every).unwrap_or(chrono::Duration::MAX);
        {
            let mut swept_at = self.swept_at.lock().unwrap_or_else(|e| e.into_inner());
            // A clock that went back sweeps at once.
            if swept_at.is_some_and(|at| at <= now && now - at < every) {
                return None;
            }
            *swept_at = Some(now);
        }
        Some(self.purge_expired(runtime, now).await)
    }

    /// Deletes the volumes of every entry that expired by `now`, with a Normal
    /// event `TrashPurged` for each, and recounts the trash. Returns the uids purged.
    pub async fn purge_expired(
        &self,
        runtime: &dyn Runtime,
        now: DateTime<Utc>,
    ) -> Result<Vec<String>, RuntimeError> {
        let _one_at_a_time = self.lock.lock().await;
        let entries = self.entries(runtime).await?;
        let mut purged = Vec::new();
        let mut kept = Vec::new();
        for entry in entries {
            if self.expires_at(&entry).is_none_or(|at| at > now) {
                kept.push(entry);
                continue;
            }
            let mut failed = None;
            // The trash's own purge: a replaced container past its retention.
            for instance in &entry.instances {
                if let Err(e) = runtime
                    .delete_instance(&instance.name, PURGE_INSTANCE_TIMEOUT)
                    .await
                {
                    failed = Some(e);
                }
            }
            for volume in &entry.volumes {
                if let Err(e) = runtime
                    .delete_volume(&self.pool, &volume.name, target(volume))
                    .await
                {
                    failed = Some(e);
                }
            }
            if let Some(e) = failed {
                tracing::warn!(uid = entry.uid.as_str(), error = %e, "could not purge a trash entry; trying again next pass");
                kept.push(entry);
                continue;
            }
            tracing::info!(
                uid = entry.uid.as_str(),
                name = entry.name.as_str(),
                "trash entry purged"
            );
            self.event(
                &entry,
                EventType::Normal,
                "TrashPurged",
                &format!(
                    "the trashed {} of project {} (uid {}, deleted {}) were purged after the trash's retention",
                    if entry.is_container() { "container" } else { "volumes" },
                    entry.name,
                    entry.uid,
                    entry
                        .deleted_at
                        .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
                        .unwrap_or_default()
                ),
            )
            .await;
            purged.push(entry.uid.clone());
        }
        self.count(&kept);
        Ok(purged)
    }

    /// An event about the entry's project, which is gone: it is recorded under the project's
    /// name and the uid it had, like an orphaned container's, so `berth events` shows it to
    /// administrators and a member of a later project of that name does not see it.
    async fn event(&self, entry: &TrashEntry, type_: EventType, reason: &str, message: &str) {
        let gone = StoredObject {
            kind: Kind::Project,
            metadata: berth_api::ObjectMeta {
                name: entry.name.clone(),
                // A replaced container's event goes to the project it came from.
                uid: Some(
                    entry
                        .instances
                        .first()
                        .and_then(|i| i.config.get(names::TRASH_PROJECT))
                        .unwrap_or(&entry.uid)
                        .clone(),
                ),
                ..berth_api::ObjectMeta::default()
            },
            spec: Doc::null(),
            status: Doc::null(),
        };
        self.store
            .publish_event(&gone, type_, reason, message)
            .await;
    }

    /// Reads the file `path` (at most `max_bytes`) from the trashed container `key` names,
    /// through LXD's file API, which reads a stopped instance's filesystem: the container stays
    /// stopped and as it was.
    pub async fn read_file(
        &self,
        runtime: &dyn Runtime,
        key: &str,
        path: &str,
        max_bytes: u64,
    ) -> Result<Vec<u8>, TrashError> {
        if !path.starts_with('/') {
            return Err(TrashError::Invalid {
                field: "path".into(),
                message: format!("{path:?} is not an absolute path"),
            });
        }
        let entries = self.entries(runtime).await?;
        let entry = entries
            .iter()
            .find(|e| e.uid == key)
            .ok_or_else(|| TrashError::NotFound(format!("nothing in the trash is {key:?}")))?;
        let Some(instance) = entry.instances.first() else {
            return Err(TrashError::Invalid {
                field: "item".into(),
                message: format!(
                    "{key} is a deleted project's volumes, not a container: restore it with `berth restore {key}`"
                ),
            });
        };
        match runtime.file_read(&instance.name, path, max_bytes).await {
            Err(RuntimeError::NotFound { .. }) => {
                Err(TrashError::NotFound(format!("{key} has no file {path}")))
            }
            other => Ok(other?),
        }
    }

    /// Finds the entry `key` names: a uid, or a name (its newest entry).
    fn find<'a>(entries: &'a [TrashEntry], key: &str) -> Option<&'a TrashEntry> {
        entries.iter().find(|e| e.uid == key).or_else(|| {
            entries
                .iter()
                .filter(|e| e.name == key && !e.is_container())
                .max_by(|a, b| a.deleted_at.cmp(&b.deleted_at))
        })
    }
}

/// Labels that clear every trash label from a volume back in a project.
fn cleared() -> BTreeMap<String, String> {
    names::TRASH_KEYS
        .iter()
        .map(|k| (k.to_string(), String::new()))
        .collect()
}
