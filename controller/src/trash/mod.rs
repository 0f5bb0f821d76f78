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
//!
//! An entry is a project's volumes grouped by `user.berth.trash.uid`, or one trashed container;
//! an item whose `user.berth.trash.kind` is not `project` (a replaced container, a forced
//! checkout's copy of the workspace volume) is listed while its project lives, and a container
//! entry is never restored as a project, only read from (`berth trash cp`, through the file API).
//! A restore goes through `Admission` as `Admitter::Restore`, writes back `status.briefFinished`
//! from the record, and leaves a deleted project's container behind as its own entry. Expiry
//! counts from `trashedAt`, written with the labels that precede the rename; a purge records a
//! `TrashPurged` event under the gone project's name and uid. Housekeeping sweeps once a tenth of
//! the retention (at most an hour), since listing the trash costs LXD a scan of every instance per
//! volume, and first compares the wall clock's advance with the monotonic clock's (`ClockWatch`):
//! more than an hour apart pauses the purge (a `TrashPurgePaused` Warning on each entry it would
//! purge, `berth_trash_purge_paused`) until they agree or `purge_now` (`berth trash purge`)
//! accepts the clock. `Scope::All` lists every controller id's entries (`trash list --all`).
//! It imports no `reconcile`, `api` or scheduler: they call it.

mod names;
mod restore;

#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use berth_api::Kind;
use chrono::{DateTime, Utc};

use crate::metrics::Metrics;
use crate::runtime::{Runtime, RuntimeError, Volume};
use crate::store::{Doc, EventType, Store, StoreError, StoredObject};

pub use names::{
    KIND_CONTAINER, TRASH_UID, TrashEntry, checkout_copy, container_key, container_labels,
    container_number, container_trash_name, is_trash_name, reason, trash_labels, trash_name,
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
    /// Admission refused the project the entry would become (the one admission every writer
    /// goes through, a restore included).
    #[error("{0}")]
    Refused(crate::admission::Refusal),
    #[error("LXD: {0}")]
    Runtime(#[from] RuntimeError),
    #[error(transparent)]
    Store(#[from] StoreError),
}

pub use berth_api::wire::{TrashItem, TrashList};

/// Whose entries a trash request sees.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// This controller's (and those labelled before controllers were named).
    Own,
    /// Every controller's that shares the pool: for an administrator whose store was lost.
    All,
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
    /// Whether the wall clock, which ages every entry, can be trusted.
    clock: std::sync::Mutex<ClockWatch>,
}

/// A wall-clock jump larger than this between two sweeps pauses the purge.
pub const CLOCK_JUMP: Duration = Duration::from_secs(3600);

/// Compares the wall clock's advance with the monotonic clock's between sweeps. A wall clock set
/// forward by a day would otherwise age every entry by a day and purge the trash at once; one
/// set back only delays purges, but coming forward again it would look like a jump.
#[derive(Debug, Default)]
struct ClockWatch {
    /// The last reading both clocks agreed at.
    trusted: Option<(DateTime<Utc>, std::time::Instant)>,
    /// How far the wall clock is off the elapsed time, while the purge is paused.
    skew: Option<chrono::Duration>,
    /// The pause of this episode was reported.
    reported: bool,
}

impl ClockWatch {
    /// The wall clock's skew when it moved more than [`CLOCK_JUMP`] away from the time that
    /// passed since the last trusted reading; `None` (and trusted from now on) otherwise.
    fn observe(
        &mut self,
        now: DateTime<Utc>,
        mono: std::time::Instant,
    ) -> Option<chrono::Duration> {
        let Some((wall, at)) = self.trusted else {
            self.accept(now, mono);
            return None;
        };
        let elapsed = chrono::Duration::from_std(mono.saturating_duration_since(at))
            .unwrap_or(chrono::Duration::MAX);
        let skew = now - wall.checked_add_signed(elapsed).unwrap_or(now);
        let limit = chrono::Duration::from_std(CLOCK_JUMP).unwrap_or(chrono::Duration::MAX);
        if skew.abs() > limit {
            self.skew = Some(skew);
            return Some(skew);
        }
        self.accept(now, mono);
        None
    }

    /// Trusts the wall clock as it reads now (an administrator's `berth trash purge`).
    fn accept(&mut self, now: DateTime<Utc>, mono: std::time::Instant) {
        *self = ClockWatch {
            trusted: Some((now, mono)),
            skew: None,
            reported: false,
        };
    }
}

/// How a skew reads in messages: `+26h 0m`, `-3h 5m`.
fn skew_text(skew: chrono::Duration) -> String {
    let minutes = skew.num_minutes();
    let sign = if minutes < 0 { '-' } else { '+' };
    format!("{sign}{}h {}m", minutes.abs() / 60, minutes.abs() % 60)
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
            clock: std::sync::Mutex::new(ClockWatch::default()),
        }
    }

    fn clock(&self) -> std::sync::MutexGuard<'_, ClockWatch> {
        self.clock.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Why the purge is paused, while it is.
    pub fn purge_paused(&self) -> Option<String> {
        self.clock().skew.map(|skew| {
            format!(
                "the wall clock moved {} against the time that passed; nothing is purged until it agrees again or an administrator runs `berth trash purge`",
                skew_text(skew)
            )
        })
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
        self.entries_of(runtime, Scope::Own).await
    }

    /// The entries of this controller's trash, or of every controller's sharing the pool
    /// ([`Scope::All`]: a store that was lost left its entries under its old id).
    pub async fn entries_of(
        &self,
        runtime: &dyn Runtime,
        scope: Scope,
    ) -> Result<Vec<TrashEntry>, RuntimeError> {
        let controller = self.store.controller_id().to_string();
        let ours = |config: &BTreeMap<String, String>| {
            config
                .get(names::CONTROLLER_LABEL)
                .is_none_or(|c| *c == controller)
        };
        let volumes: Vec<Volume> = runtime
            .list_volumes(&self.pool, Some(names::TRASH_LABEL_PREFIX))
            .await?
            .into_iter()
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
            })
            .collect();
        // A deleted project's container is part of its project's entry (keyed by the project's
        // uid); a replaced one is an entry of its own. One whose project is live is on its way
        // into the trash, like the volumes above.
        for container in TrashEntry::of_containers(containers) {
            if let Some(entry) = entries.iter_mut().find(|e| e.uid == container.uid) {
                entry.instances.extend(container.instances);
            } else if self.store.get_by_uid(&container.uid).is_none() {
                entries.push(container);
            }
        }
        // Whole entries are this controller's or not: one whose volumes or container carry this
        // store's id (or none, from before ids existed). Never a part of an entry.
        if scope == Scope::Own {
            entries.retain(|e| {
                e.volumes.iter().any(|v| ours(&v.config))
                    || e.instances.iter().any(|i| ours(&i.config))
            });
        }
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
        if scope == Scope::Own {
            self.count(&entries);
        }
        Ok(entries)
    }

    fn count(&self, entries: &[TrashEntry]) {
        if let Some(metrics) = &self.metrics {
            let volumes: usize = entries.iter().map(|e| e.volumes.len()).sum();
            let containers: usize = entries.iter().map(|e| e.instances.len()).sum();
            metrics
                .trash_containers
                .set(i64::try_from(containers).unwrap_or(i64::MAX));
            let bytes: u64 = entries.iter().map(|e| e.bytes).sum();
            metrics
                .trash_volumes
                .set(i64::try_from(volumes).unwrap_or(i64::MAX));
            metrics
                .trash_bytes
                .set(i64::try_from(bytes).unwrap_or(i64::MAX));
        }
    }

    /// The trash as the API lists it: this controller's, or every controller's.
    pub async fn list(
        &self,
        runtime: &dyn Runtime,
        scope: Scope,
    ) -> Result<TrashList, RuntimeError> {
        let entries = self.entries_of(runtime, scope).await?;
        Ok(TrashList {
            api_version: berth_api::API_VERSION.to_string(),
            kind: "TrashList".to_string(),
            items: entries
                .iter()
                .map(|e| TrashItem {
                    uid: e.uid.clone(),
                    name: e.name.clone(),
                    kind: e.kind.clone(),
                    controller: e.controller.clone(),
                    deleted_at: e.deleted_at,
                    trashed_at: e.trashed_at,
                    deleted_by: e.deleted_by.clone(),
                    reason: e.reason.clone(),
                    expires_at: self.expires_at(e),
                    bytes: e.bytes,
                })
                .collect(),
            purge_paused: self.purge_paused(),
        })
    }

    /// Housekeeping: [`Trash::purge_expired`] once a tenth of the retention (at most an hour;
    /// hourly when the trash is disabled) has passed since the last sweep, so an entry outlives
    /// its retention by at most that much. `None` when it was not yet time.
    ///
    /// A wall clock that moved more than [`CLOCK_JUMP`] against the monotonic clock since the
    /// last sweep pauses the purge ([`ClockWatch`]): a Warning event `TrashPurgePaused` on every
    /// entry it would have purged, the gauge `berth_trash_purge_paused`, and `trash list` says
    /// so, until the clock agrees again or an administrator purges ([`Trash::purge_now`]).
    pub async fn sweep(
        &self,
        runtime: &dyn Runtime,
        now: DateTime<Utc>,
    ) -> Option<Result<Vec<String>, RuntimeError>> {
        self.sweep_at(runtime, now, std::time::Instant::now()).await
    }

    /// [`Trash::sweep`] with the monotonic clock's reading given.
    pub async fn sweep_at(
        &self,
        runtime: &dyn Runtime,
        now: DateTime<Utc>,
        mono: std::time::Instant,
    ) -> Option<Result<Vec<String>, RuntimeError>> {
        let jumped = self.clock().observe(now, mono);
        if let Some(metrics) = &self.metrics {
            metrics.trash_purge_paused.set(i64::from(jumped.is_some()));
        }
        if let Some(skew) = jumped {
            if let Err(e) = self.report_pause(runtime, now, skew).await {
                return Some(Err(e));
            }
            return None;
        }
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

    /// Reports a paused purge once per episode: a warning in the log, and a Warning event on
    /// every entry the clock as it reads would have purged.
    async fn report_pause(
        &self,
        runtime: &dyn Runtime,
        now: DateTime<Utc>,
        skew: chrono::Duration,
    ) -> Result<(), RuntimeError> {
        if std::mem::replace(&mut self.clock().reported, true) {
            return Ok(());
        }
        let message = self.purge_paused().unwrap_or_default();
        tracing::warn!(skew = %skew_text(skew), "trash purge paused: {message}");
        let due: Vec<TrashEntry> = self
            .entries(runtime)
            .await?
            .into_iter()
            .filter(|e| self.expires_at(e).is_some_and(|at| at <= now))
            .collect();
        for entry in &due {
            let text = format!(
                "the trash keeps {} (uid {}) although the wall clock says it expired: {message}",
                entry.name, entry.uid
            );
            self.event(entry, EventType::Warning, "TrashPurgePaused", &text)
                .await;
        }
        Ok(())
    }

    /// `berth trash purge` (administrators): trusts the wall clock as it reads now, ending a
    /// pause, and purges what expired by it.
    pub async fn purge_now(
        &self,
        runtime: &dyn Runtime,
        now: DateTime<Utc>,
    ) -> Result<Vec<String>, RuntimeError> {
        self.clock().accept(now, std::time::Instant::now());
        if let Some(metrics) = &self.metrics {
            metrics.trash_purge_paused.set(0);
        }
        *self.swept_at.lock().unwrap_or_else(|e| e.into_inner()) = Some(now);
        self.purge_expired(runtime, now).await
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
