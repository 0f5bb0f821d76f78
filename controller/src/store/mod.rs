//! The desired-state store: every object lives in memory for reads and is written through to
//! SQLite, one transaction per write (or per batch), before anyone hears of it. Changes are
//! published on a broadcast feed in resourceVersion order.
//!
//! Invariants: `generation` moves only when spec changes; `resourceVersion` comes from one
//! global counter and moves on every write; a write that changes nothing writes nothing; status
//! moves only through [`Store::write_status`] (one writer, each field with declared owners), and
//! spec or metadata writes never touch it.

mod access;
mod events;
mod executions;
mod facade;
mod object;
pub mod schema;
mod status;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use berth_api::{Kind, ObjectMeta};
use chrono::{DateTime, Utc};
use rusqlite::{Connection, OpenFlags, params};
use serde_json::Value;
use tokio::sync::broadcast;

pub use access::{SecretEntry, SecretsChange, User};
pub use events::{Event, EventObject, EventType};
pub use executions::{Execution, ExecutionState};
pub use facade::{Unfinished, blocking};
pub use object::{Action, Change, ChangeType, Deletion, Desired, Doc, Expected, StoredObject};
pub use status::{
    FieldManager, PROJECT_FIELDS, STATUS_WRITE_ATTEMPTS, StatusWrite, StatusWritten, lay_owned,
};

/// Whether a write is kept. A dry run makes every check a real write would, then puts memory
/// back and commits nothing (the API's `?dryRun`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Commit {
    Persist,
    DryRun,
}

/// A create's parameters (kube's `PostParams`): kept or a dry run, on whose behalf, and
/// whether it brings a project back from the trash. A bare [`Commit`] is a create on nobody's
/// behalf.
#[derive(Debug, Clone)]
pub struct PostParams<'a> {
    pub commit: Commit,
    /// A Project this write creates has this user as its first member.
    pub creator: Option<&'a str>,
    /// Creates the object as the trash recorded it; fails when the name or the uid is taken.
    pub restore: Option<Restored>,
}

/// A Project as the trash recorded it: created again under `uid` (its own, or a new one when
/// it comes back under another name), with `status` as its first status.
#[derive(Debug, Clone)]
pub struct Restored {
    pub uid: String,
    pub status: Value,
}

impl<'a> PostParams<'a> {
    /// A create on behalf of `creator`.
    pub fn by(creator: &'a str, commit: Commit) -> Self {
        PostParams {
            creator: Some(creator),
            ..commit.into()
        }
    }
}

impl From<Commit> for PostParams<'_> {
    fn from(commit: Commit) -> Self {
        PostParams {
            commit,
            creator: None,
            restore: None,
        }
    }
}

/// An apply's parameters (kube's `PatchParams`): kept or a dry run, and on whose behalf. A bare
/// [`Commit`] is an apply on nobody's behalf.
#[derive(Debug, Clone, Copy)]
pub struct ApplyParams<'a> {
    pub commit: Commit,
    /// Projects the write creates have this user as their first member, and what an applyset
    /// prunes records them as `berth.dev/deletedBy`.
    pub creator: Option<&'a str>,
}

impl<'a> ApplyParams<'a> {
    /// An apply on behalf of `creator`.
    pub fn by(creator: &'a str, commit: Commit) -> Self {
        ApplyParams {
            commit,
            creator: Some(creator),
        }
    }
}

impl From<Commit> for ApplyParams<'_> {
    fn from(commit: Commit) -> Self {
        ApplyParams {
            commit,
            creator: None,
        }
    }
}

/// An applyset's parameters: the apply's, whether the set prunes, and what it does with an
/// object another set owns. A bare [`Commit`] adopts and keeps the previous inventory.
#[derive(Debug, Clone, Copy)]
pub struct SetParams<'a> {
    pub apply: ApplyParams<'a>,
    /// Deletes what the previous inventory held and this batch does not.
    pub prune: bool,
    pub takeover: Takeover,
}

impl From<Commit> for SetParams<'_> {
    fn from(commit: Commit) -> Self {
        SetParams {
            apply: commit.into(),
            prune: false,
            takeover: Takeover::Adopt,
        }
    }
}

impl<'a> From<ApplyParams<'a>> for SetParams<'a> {
    fn from(apply: ApplyParams<'a>) -> Self {
        SetParams {
            apply,
            prune: false,
            takeover: Takeover::Adopt,
        }
    }
}

impl SetParams<'_> {
    pub fn pruning(self, prune: bool) -> Self {
        SetParams { prune, ..self }
    }
}

/// One object of an apply, with what it must still be when written, if anything (the
/// caller's access was checked against it).
#[derive(Debug, Clone)]
pub struct ApplyItem {
    pub desired: Desired,
    pub expected: Option<Expected>,
}

impl From<Desired> for ApplyItem {
    fn from(desired: Desired) -> Self {
        ApplyItem {
            desired,
            expected: None,
        }
    }
}

impl From<(Desired, Expected)> for ApplyItem {
    fn from((desired, expected): (Desired, Expected)) -> Self {
        ApplyItem {
            desired,
            expected: Some(expected),
        }
    }
}

/// Room for a burst of writes (a 10,000-object apply) before a slow subscriber lags; a lagging
/// subscriber is told so and resyncs from a list.
const CHANGE_FEED_CAPACITY: usize = 16_384;
/// How long a successful writability probe is trusted by `/readyz`.
const PROBE_INTERVAL: Duration = Duration::from_secs(5);

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("{kind} {name:?} not found")]
    NotFound { kind: String, name: String },
    #[error("{kind} {name:?} already exists")]
    AlreadyExists { kind: String, name: String },
    /// A stale resourceVersion, or a displayName another project holds.
    #[error("{message}")]
    Conflict {
        kind: String,
        name: String,
        message: String,
    },
    /// The object was made, changed or replaced after the caller's access to it was checked;
    /// checking again and retrying is safe.
    #[error("{kind} {name:?} changed while the request was being checked")]
    Moved { kind: String, name: String },
    #[error("{field}: {message}")]
    Invalid { field: String, message: String },
    #[error("the store database: {0}")]
    Sqlite(#[from] rusqlite::Error),
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: the database is corrupt ({detail}); restore a backup or move it aside", path.display())]
    Corrupt { path: PathBuf, detail: String },
    #[error(
        "the store schema is version {found} but this berth knows only up to {supported}; run a newer berth"
    )]
    SchemaTooNew { found: u32, supported: u32 },
    #[error("the store cannot be written: {0}")]
    Unwritable(String),
}

impl StoreError {
    // Displayed kinds: a stored object's `Kind`, or "User" and "Member" for the access records.
    fn conflict(kind: impl std::fmt::Display, name: &str, message: impl Into<String>) -> Self {
        StoreError::Conflict {
            kind: kind.to_string(),
            name: name.to_string(),
            message: message.into(),
        }
    }

    fn not_found(kind: impl std::fmt::Display, name: &str) -> Self {
        StoreError::NotFound {
            kind: kind.to_string(),
            name: name.to_string(),
        }
    }
}

/// One status write of [`Store::update_statuses`].
#[derive(Debug, Clone, PartialEq)]
pub struct StatusUpdate {
    pub kind: Kind,
    pub name: String,
    pub expected_rv: Option<u64>,
    pub status: Value,
}

/// What [`Store::apply_set`] did.
#[derive(Debug, Clone)]
pub struct AppliedSet {
    pub applied: Vec<(Arc<StoredObject>, Action)>,
    pub pruned: Vec<Deletion>,
    /// Objects of the batch left alone because another applyset owns them
    /// ([`Takeover::Refuse`]).
    pub conflicts: Vec<SetConflict>,
}

/// What a set does with an object of its batch that another applyset owns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Takeover {
    /// Apply it and take it into this set, as `berth apply --applyset` does when told to.
    Adopt,
    /// Leave it to its owner, and report it (a GitSource, as Flux does without `force`).
    Refuse,
}

/// An object a set's batch held that another applyset owns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SetConflict {
    pub kind: Kind,
    pub name: String,
    /// The applyset that owns it (`berth.dev/applyset`).
    pub owner: String,
}

/// A batch write failed, at `items[index]` when one item was the cause; nothing of the batch
/// was written.
#[derive(Debug, thiserror::Error)]
#[error("{}{error}", index.map(|i| format!("items[{i}]: ")).unwrap_or_default())]
pub struct BatchFailure {
    pub index: Option<usize>,
    #[source]
    pub error: StoreError,
}

pub struct Store {
    path: PathBuf,
    /// This store's controller id (see [`Store::controller_id`]).
    controller_id: String,
    inner: Mutex<Inner>,
    changes: broadcast::Sender<Change>,
    secret_changes: broadcast::Sender<SecretsChange>,
}

struct Inner {
    conn: Connection,
    objects: HashMap<Kind, BTreeMap<String, Arc<StoredObject>>>,
    /// Normalised `spec.displayName` of every Project → the projects holding it: one, except
    /// inside a batch write, which must end with one again.
    display_names: HashMap<String, BTreeSet<String>>,
    /// uid → (kind, name), for records that name objects by uid (LXD labels, events).
    uids: HashMap<String, (Kind, String)>,
    /// Applyset name → its inventory (`Kind/name`, sorted).
    applysets: HashMap<String, Vec<String>>,
    /// Project uid → the users who are its members.
    members: HashMap<String, BTreeSet<String>>,
    resource_version: u64,
    /// Why the last write failed, cleared by the next one that succeeds.
    write_error: Option<String>,
    last_probe: Option<Instant>,
}

/// The writes a store operation made in memory: committed to SQLite together, or undone
/// together.
struct Pending {
    rv_before: u64,
    /// Becomes a member of every Project this write creates, in the same transaction, so the
    /// creator's own watch sees the project appear.
    creator: Option<String>,
    /// Memberships added in memory, removed again on undo.
    member_undo: Vec<(String, String)>,
    undo: Vec<(Kind, String, Option<Arc<StoredObject>>)>,
    inventory_undo: Vec<(String, Option<Vec<String>>)>,
    writes: Vec<Write>,
    changes: Vec<Change>,
}

enum Write {
    Put(Arc<StoredObject>),
    Remove {
        kind: Kind,
        name: String,
        uid: String,
    },
    Inventory {
        set: String,
        inventory: Vec<String>,
    },
    Member {
        uid: String,
        user: String,
    },
}

fn display_name_of(object: &StoredObject) -> Option<String> {
    if object.kind != Kind::Project {
        return None;
    }
    let display = object
        .spec
        .get_str("displayName")
        .filter(|d| !d.trim().is_empty());
    Some(berth_api::display_name_key(
        display.as_deref().unwrap_or(object.name()),
    ))
}

pub(crate) fn restrict_mode(path: &Path) -> Result<(), StoreError> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).map_err(|source| {
        StoreError::Io {
            path: path.to_path_buf(),
            source,
        }
    })
}

impl Store {
    /// Opens (or creates) the database at `path`: checks its integrity, migrates it forward and
    /// loads every object into memory.
    pub fn open(path: &Path) -> Result<Store, StoreError> {
        let io = |source| StoreError::Io {
            path: path.to_path_buf(),
            source,
        };
        if !path.exists() {
            use std::os::unix::fs::OpenOptionsExt;
            std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(false)
                .mode(0o600)
                .open(path)
                .map_err(io)?;
        }
        restrict_mode(path)?;
        let mut conn = Connection::open_with_flags(
            path,
            OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )?;
        let corrupt = |detail: String| StoreError::Corrupt {
            path: path.to_path_buf(),
            detail,
        };
        conn.busy_timeout(Duration::from_secs(5))?;
        let check: String = conn
            .query_row("PRAGMA quick_check", [], |row| row.get(0))
            .map_err(|err| corrupt(err.to_string()))?;
        if check != "ok" {
            return Err(corrupt(check));
        }
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(None, "synchronous", "FULL")?;
        conn.pragma_update(None, "foreign_keys", "ON")?;
        schema::migrate(&mut conn, path)?;

        let (objects, display_names, uids) = load_objects(&conn)?;
        let applysets = load_applysets(&conn)?;
        let members = access::load_members(&conn)?;
        let resource_version: i64 = conn.query_row(
            "SELECT value FROM counters WHERE name = 'resourceVersion'",
            [],
            |row| row.get(0),
        )?;
        let controller_id: String = conn.query_row(
            "SELECT value FROM settings WHERE name = 'controllerId'",
            [],
            |row| row.get(0),
        )?;
        let (changes, _) = broadcast::channel(CHANGE_FEED_CAPACITY);
        let (secret_changes, _) = broadcast::channel(CHANGE_FEED_CAPACITY);
        Ok(Store {
            path: path.to_path_buf(),
            controller_id,
            inner: Mutex::new(Inner {
                conn,
                objects,
                display_names,
                uids,
                applysets,
                members,
                resource_version: resource_version as u64,
                write_error: None,
                last_probe: None,
            }),
            changes,
            secret_changes,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The id of the controller this store drives, random and made once with the database:
    /// every container and volume it creates carries it, so containers of another berth on the
    /// same LXD are not taken for its own.
    pub fn controller_id(&self) -> &str {
        &self.controller_id
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock leaves memory as it was before the write (undo runs
        // before anything can panic), so the data is still consistent.
        self.inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Every committed write from now on, in resourceVersion order.
    pub fn subscribe(&self) -> broadcast::Receiver<Change> {
        self.changes.subscribe()
    }

    /// Subscribes and lists `kind` at one instant, so a watcher misses nothing and sees nothing
    /// twice: every change on the receiver is newer than the returned resourceVersion.
    pub fn list_and_subscribe(
        &self,
        kind: Kind,
    ) -> (Vec<Arc<StoredObject>>, u64, broadcast::Receiver<Change>) {
        let inner = self.lock();
        let receiver = self.changes.subscribe();
        (inner.list(kind), inner.resource_version, receiver)
    }

    /// The resourceVersion of the latest write.
    pub fn resource_version(&self) -> u64 {
        self.lock().resource_version
    }

    pub fn get(&self, kind: Kind, name: &str) -> Option<Arc<StoredObject>> {
        self.lock().get(kind, name)
    }

    /// Every object of `kind`, by name.
    pub fn list(&self, kind: Kind) -> Vec<Arc<StoredObject>> {
        self.lock().list(kind)
    }

    /// The object with this uid, whatever its kind.
    pub fn get_by_uid(&self, uid: &str) -> Option<Arc<StoredObject>> {
        let inner = self.lock();
        let (kind, name) = inner.uids.get(uid)?;
        inner.get(*kind, name)
    }

    /// The Project whose normalised displayName is `display_name`, if any.
    pub fn project_with_display_name(&self, display_name: &str) -> Option<String> {
        self.lock()
            .display_names
            .get(&berth_api::display_name_key(display_name))
            .and_then(|holders| holders.first().cloned())
    }

    /// Creates the object; 409 when the name is taken. See [`PostParams`] for on whose behalf
    /// and for a project brought back from the trash.
    pub fn create<'a>(
        &self,
        desired: Desired,
        params: impl Into<PostParams<'a>>,
    ) -> Result<Arc<StoredObject>, StoreError> {
        let PostParams {
            commit,
            creator,
            restore,
        } = params.into();
        let mode = match restore {
            Some(Restored { uid, status }) => Mode::Restore { uid, status },
            None => Mode::Create,
        };
        self.write_as(creator, commit, |inner, pending| {
            let (object, _) = inner.upsert(pending, desired, mode)?;
            inner.check_display_name(&object)?;
            Ok(object)
        })
    }

    /// Replaces the user fields of an existing object; `expected_rv` guards against lost updates.
    pub fn replace(
        &self,
        desired: Desired,
        expected_rv: Option<u64>,
        commit: Commit,
    ) -> Result<(Arc<StoredObject>, Action), StoreError> {
        self.write(commit, |inner, pending| {
            let written = inner.upsert(pending, desired, Mode::Replace(expected_rv))?;
            inner.check_display_name(&written.0)?;
            Ok(written)
        })
    }

    /// Creates the object or replaces its user fields: what `berth apply` does for one object.
    /// An item carrying an [`Expected`] is written only while the object is still as expected:
    /// a write allowed against what the caller saw never lands on something else
    /// (`StoreError::Moved`).
    pub fn apply<'a>(
        &self,
        item: impl Into<ApplyItem>,
        params: impl Into<ApplyParams<'a>>,
    ) -> Result<(Arc<StoredObject>, Action), StoreError> {
        let ApplyItem { desired, expected } = item.into();
        let ApplyParams { commit, creator } = params.into();
        self.write_as(creator, commit, |inner, pending| {
            let written = inner.upsert(pending, desired, Mode::Apply(expected))?;
            inner.check_display_name(&written.0)?;
            Ok(written)
        })
    }

    /// Applies every object in one transaction: all of them are written, or none. Display names
    /// must be unique once the whole batch is written, so a batch may swap two.
    pub fn apply_batch<'a, I: Into<ApplyItem>>(
        &self,
        batch: Vec<I>,
        params: impl Into<ApplyParams<'a>>,
    ) -> Result<Vec<(Arc<StoredObject>, Action)>, BatchFailure> {
        let ApplyParams { commit, creator } = params.into();
        let mut failed_at = None;
        self.write_as(creator, commit, |inner, pending| {
            let mut results = Vec::with_capacity(batch.len());
            for (index, item) in batch.into_iter().enumerate() {
                let ApplyItem { desired, expected } = item.into();
                failed_at = Some(index);
                results.push(inner.upsert(pending, desired, Mode::Apply(expected))?);
            }
            failed_at = inner.check_display_names(&results).err();
            match failed_at {
                Some(index) => Err(inner.display_name_conflict(&results[index].0)),
                None => Ok(results),
            }
        })
        .map_err(|error| BatchFailure {
            index: failed_at,
            error,
        })
    }

    /// Writes status, and only status. Unchanged status writes nothing. Only
    /// [`Store::write_status`] calls it: status has one writer.
    fn update_status(
        &self,
        kind: Kind,
        name: &str,
        expected_rv: Option<u64>,
        status: Value,
        commit: Commit,
    ) -> Result<Arc<StoredObject>, StoreError> {
        self.write(commit, |inner, pending| {
            inner.set_status(
                pending,
                StatusUpdate {
                    kind,
                    name: name.to_string(),
                    expected_rv,
                    status,
                },
            )
        })
    }

    /// Writes many statuses in one transaction, as a resync pass produces them. Each update
    /// stands alone: a missing object or a stale resourceVersion fails that update only, and an
    /// unchanged status writes nothing.
    #[cfg(test)]
    fn update_statuses(
        &self,
        updates: Vec<StatusUpdate>,
    ) -> Result<Vec<Result<Arc<StoredObject>, StoreError>>, StoreError> {
        self.write(Commit::Persist, |inner, pending| {
            Ok(updates
                .into_iter()
                .map(|update| inner.set_status(pending, update))
                .collect())
        })
    }

    /// Sets the finalizers; removing the last one of a deleting object removes the object
    /// (`None` is returned then).
    pub fn set_finalizers(
        &self,
        kind: Kind,
        name: &str,
        expected_rv: Option<u64>,
        finalizers: Vec<String>,
    ) -> Result<Option<Arc<StoredObject>>, StoreError> {
        self.write(Commit::Persist, |inner, pending| {
            let current = inner.existing(kind, name, expected_rv)?;
            let desired = Desired {
                kind,
                name: name.to_string(),
                labels: current.metadata.labels.clone(),
                annotations: current.metadata.annotations.clone(),
                finalizers: Some(finalizers),
                spec: current.spec.value(),
            };
            let (written, _) = inner.upsert(pending, desired, Mode::Replace(expected_rv))?;
            inner.check_display_name(&written)?;
            Ok(inner.get(kind, name))
        })
    }

    /// Deletes the object, or, while finalizers hold it, marks it deleting. `annotations` are
    /// merged onto a held object so the controller can read how it was asked to go (e.g.
    /// `berth.dev/forceDelete`).
    pub fn delete(
        &self,
        kind: Kind,
        name: &str,
        expected_rv: Option<u64>,
        annotations: BTreeMap<String, String>,
        commit: Commit,
    ) -> Result<Deletion, StoreError> {
        self.write(commit, |inner, pending| {
            let current = inner.existing(kind, name, expected_rv)?;
            Ok(inner.delete(pending, current, annotations))
        })
    }

    /// Asks the finalizer for a fresh look at a project being deleted: records `stamp` as its
    /// [`berth_api::annotations::LOOK_REQUESTED_AT`] (a metadata write, so the controller runs).
    /// An object not being deleted is a conflict: this never starts a deletion.
    pub fn request_look(
        &self,
        kind: Kind,
        name: &str,
        stamp: &str,
    ) -> Result<Arc<StoredObject>, StoreError> {
        self.write(Commit::Persist, |inner, pending| {
            let current = inner.existing(kind, name, None)?;
            if current.metadata.deletion_timestamp.is_none() {
                return Err(StoreError::conflict(
                    kind,
                    name,
                    format!("{kind} {name:?} is not being deleted: nothing to look at again"),
                ));
            }
            let annotations = BTreeMap::from([(
                berth_api::annotations::LOOK_REQUESTED_AT.to_string(),
                stamp.to_string(),
            )]);
            Ok(inner.delete(pending, current, annotations).object().clone())
        })
    }

    /// Records on a live Project that a member asked to force its held checkout
    /// ([`berth_api::annotations::FORCE_CHECKOUT`] set to `stamp`; a metadata write, so the
    /// controller runs). 409 while the project is being deleted.
    pub fn request_forced_checkout(
        &self,
        name: &str,
        stamp: &str,
    ) -> Result<Arc<StoredObject>, StoreError> {
        self.annotate_live(
            name,
            &[berth_api::annotations::FORCE_CHECKOUT],
            stamp,
            "nothing to check out",
        )
    }

    /// Records on a live Project that a member asked to replace its container whatever it
    /// holds outside /workspace: [`berth_api::annotations::RECREATE_REQUESTED_AT`] and
    /// [`berth_api::annotations::FORCE_REPLACE`] both set to `stamp`, in one write. 409 while the
    /// project is being deleted.
    pub fn request_forced_replace(
        &self,
        name: &str,
        stamp: &str,
    ) -> Result<Arc<StoredObject>, StoreError> {
        self.annotate_live(
            name,
            &[
                berth_api::annotations::RECREATE_REQUESTED_AT,
                berth_api::annotations::FORCE_REPLACE,
            ],
            stamp,
            "nothing to replace",
        )
    }

    /// Sets each of `keys` to `stamp` on the live Project `name` (a metadata write).
    fn annotate_live(
        &self,
        name: &str,
        keys: &[&str],
        stamp: &str,
        when_deleting: &str,
    ) -> Result<Arc<StoredObject>, StoreError> {
        self.write(Commit::Persist, |inner, pending| {
            let current = inner.existing(Kind::Project, name, None)?;
            if current.metadata.deletion_timestamp.is_some() {
                return Err(StoreError::conflict(
                    Kind::Project,
                    name,
                    format!("Project {name:?} is being deleted: {when_deleting}"),
                ));
            }
            let mut next = (*current).clone();
            for key in keys {
                next.metadata
                    .annotations
                    .insert(key.to_string(), stamp.to_string());
            }
            next.metadata.resource_version = Some(inner.next_rv().to_string());
            let next = Arc::new(next);
            inner.put(pending, Arc::clone(&next));
            pending
                .changes
                .push(Change::new(ChangeType::Modified, &next, true));
            Ok(next)
        })
    }

    /// The inventory recorded for applyset `name`: `Kind/name` of every object it applied last.
    pub fn applyset_inventory(&self, name: &str) -> Vec<String> {
        self.lock().applysets.get(name).cloned().unwrap_or_default()
    }

    /// Applies `batch` as applyset `set`, in one transaction: records the new inventory and, with
    /// [`SetParams::prune`], deletes what the previous inventory held and the new one does not
    /// (without it, the previous inventory is kept alongside). Only objects
    /// in that inventory are ever pruned, never by a selector; objects annotated
    /// `berth.dev/prune: disabled`, or since applied by another set, are left alone. With
    /// [`Takeover::Refuse`], every object another applyset owns is left to that set: it is
    /// neither written nor taken into this set's inventory, and is listed in
    /// [`AppliedSet::conflicts`], decided in the same transaction as the writes.
    pub fn apply_set<'a, I: Into<ApplyItem>>(
        &self,
        set: &str,
        batch: Vec<I>,
        params: impl Into<SetParams<'a>>,
    ) -> Result<AppliedSet, BatchFailure> {
        let SetParams {
            apply: ApplyParams { commit, creator },
            prune,
            takeover,
        } = params.into();
        let mut failed_at = None;
        self.write_as(creator, commit, |inner, pending| {
            let mut inventory: Vec<String> = Vec::with_capacity(batch.len());
            let mut applied = Vec::with_capacity(batch.len());
            // The batch index of each applied object, for naming the item a check refuses.
            let mut applied_index = Vec::with_capacity(batch.len());
            let mut conflicts = Vec::new();
            for (index, item) in batch.into_iter().enumerate() {
                let ApplyItem { desired, expected } = item.into();
                failed_at = Some(index);
                if takeover == Takeover::Refuse
                    && let Some(owner) = inner
                        .get(desired.kind, &desired.name)
                        .and_then(|current| owner_of(&current).filter(|o| o != set))
                {
                    conflicts.push(SetConflict {
                        kind: desired.kind,
                        name: desired.name,
                        owner,
                    });
                    continue;
                }
                inventory.push(format!("{}/{}", desired.kind, desired.name));
                applied.push(inner.upsert(pending, desired, Mode::Apply(expected))?);
                applied_index.push(index);
            }
            inventory.sort();
            inventory.dedup();
            let mut pruned = Vec::new();
            let previous = inner.applysets.get(set).cloned().unwrap_or_default();
            if !prune {
                // Without pruning, what the set applied before stays in its inventory so a later
                // prune still finds it.
                inventory.extend(previous.into_iter().filter(|key| {
                    inventory_key(key).is_some_and(|(kind, name)| {
                        inner
                            .get(kind, name)
                            .is_some_and(|current| owner_of(&current).is_none_or(|o| o == set))
                    })
                }));
                inventory.sort();
                inventory.dedup();
            } else {
                // Kept keys join the inventory after the loop: it stays sorted for the searches.
                let mut kept = Vec::new();
                for key in previous {
                    if inventory.binary_search(&key).is_ok() {
                        continue;
                    }
                    let Some((kind, name)) = inventory_key(&key) else {
                        continue;
                    };
                    let Some(current) = inner.get(kind, name) else {
                        continue;
                    };
                    let annotations = &current.metadata.annotations;
                    let opted_out = annotations
                        .get(berth_api::annotations::PRUNE)
                        .map(String::as_str)
                        == Some(berth_api::annotations::PRUNE_DISABLED);
                    let moved = owner_of(&current).is_some_and(|owner| owner != set);
                    if opted_out || moved || current.is_deleting() {
                        // Still ours to track until it is gone or handed over.
                        if opted_out && !moved {
                            kept.push(key);
                        }
                        continue;
                    }
                    pruned.push(inner.delete(pending, current, prune_annotations(creator)));
                }
                inventory.extend(kept);
                inventory.sort();
            }
            inner.record_inventory(pending, set, inventory);
            // Checked on the end state: what the batch renamed or pruned no longer holds a name.
            if let Err(index) = inner.check_display_names(&applied) {
                failed_at = Some(applied_index[index]);
                return Err(inner.display_name_conflict(&applied[index].0));
            }
            failed_at = None;
            Ok(AppliedSet {
                applied,
                pruned,
                conflicts,
            })
        })
        .map_err(|error| BatchFailure {
            index: failed_at,
            error,
        })
    }

    /// Writes an event. Only the recorder ([`Store::record_or_warn`], [`Store::publish_event`])
    /// calls it.
    fn record_event(
        &self,
        object: &StoredObject,
        type_: EventType,
        reason: &str,
        message: &str,
    ) -> Result<Event, StoreError> {
        let target = EventObject {
            kind: object.kind,
            name: object.name().to_string(),
            uid: object.uid().to_string(),
        };
        let mut inner = self.lock();
        let gone = !inner.uids.contains_key(object.uid());
        let now = Utc::now();
        let result = events::record(&mut inner.conn, &target, type_, reason, message, now, gone);
        inner.note_write(&result);
        result
    }

    /// Events about `kind`/`name`, oldest first: the existing object's, or when there is none,
    /// those of the objects of that name that went in the last `events.retention`.
    pub fn events_for(&self, kind: Kind, name: &str) -> Result<Vec<Event>, StoreError> {
        let inner = self.lock();
        let uid = inner.get(kind, name).map(|o| o.uid().to_string());
        events::for_object(&inner.conn, kind, name, uid.as_deref())
    }

    /// Deletes the events of objects that went before `before` (housekeeping, after
    /// `events.retention`); answers how many.
    pub fn prune_gone_events(&self, before: DateTime<Utc>) -> Result<usize, StoreError> {
        let inner = self.lock();
        events::prune_gone(&inner.conn, before)
    }

    /// The latest `limit` events about anything, oldest first.
    pub fn recent_events(&self, limit: usize) -> Result<Vec<Event>, StoreError> {
        events::recent(&self.lock().conn, limit)
    }

    /// Whether the database still takes writes: the last write succeeded and a probe write
    /// (at most every few seconds) commits. `/readyz` reports this.
    pub fn check_writable(&self) -> Result<(), StoreError> {
        let mut inner = self.lock();
        if let Some(error) = &inner.write_error {
            let error = error.clone();
            // A failed write is retried by the probe so readiness comes back by itself.
            if probe(&inner.conn).is_err() {
                return Err(StoreError::Unwritable(error));
            }
            inner.write_error = None;
        }
        if inner
            .last_probe
            .is_none_or(|at| at.elapsed() > PROBE_INTERVAL)
        {
            probe(&inner.conn).map_err(|err| StoreError::Unwritable(err.to_string()))?;
            inner.last_probe = Some(Instant::now());
        }
        Ok(())
    }

    /// Runs `op` on memory, then commits what it wrote to SQLite in one transaction and
    /// publishes the changes; on any failure (or a dry run) memory is put back as it was.
    fn write<T>(
        &self,
        commit: Commit,
        op: impl FnOnce(&mut Inner, &mut Pending) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        self.write_as(None, commit, op)
    }

    /// [`Store::write`] on behalf of `creator`, who becomes a member of the projects it creates.
    fn write_as<T>(
        &self,
        creator: Option<&str>,
        commit: Commit,
        op: impl FnOnce(&mut Inner, &mut Pending) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let mut inner = self.lock();
        let mut pending = Pending {
            rv_before: inner.resource_version,
            creator: creator.map(str::to_string),
            member_undo: Vec::new(),
            undo: Vec::new(),
            inventory_undo: Vec::new(),
            writes: Vec::new(),
            changes: Vec::new(),
        };
        let result = op(&mut inner, &mut pending);
        let value = match result {
            Ok(value) if commit == Commit::Persist => value,
            other => {
                inner.undo(pending);
                return other;
            }
        };
        if pending.writes.is_empty() {
            return Ok(value);
        }
        let committed = inner.commit(&pending.writes);
        inner.note_write(&committed);
        if let Err(err) = committed {
            inner.undo(pending);
            return Err(err);
        }
        // What belongs to a project goes with it, in the same transaction (see `commit`).
        for write in &pending.writes {
            if let Write::Remove { kind, uid, .. } = write
                && *kind == Kind::Project
            {
                inner.members.remove(uid);
            }
        }
        // Sent under the lock so subscribers see changes in resourceVersion order.
        for change in pending.changes {
            let _ = self.changes.send(change);
        }
        Ok(value)
    }
}

fn probe(conn: &Connection) -> Result<(), StoreError> {
    conn.execute(
        "UPDATE counters SET value = value WHERE name = 'resourceVersion'",
        [],
    )?;
    Ok(())
}

fn now() -> DateTime<Utc> {
    // Second precision, as Kubernetes timestamps: a stored object reads back identical.
    let now = Utc::now();
    DateTime::from_timestamp(now.timestamp(), 0).unwrap_or(now)
}

enum Mode {
    Create,
    /// Create under this uid with this initial status: a project brought back from the trash.
    Restore {
        uid: String,
        status: Value,
    },
    Replace(Option<u64>),
    /// Create or update; with an expectation, only while the object is still as expected.
    Apply(Option<Expected>),
}

impl Inner {
    fn get(&self, kind: Kind, name: &str) -> Option<Arc<StoredObject>> {
        self.objects.get(&kind)?.get(name).cloned()
    }

    fn list(&self, kind: Kind) -> Vec<Arc<StoredObject>> {
        self.objects
            .get(&kind)
            .map(|objects| objects.values().cloned().collect())
            .unwrap_or_default()
    }

    fn next_rv(&mut self) -> u64 {
        self.resource_version += 1;
        self.resource_version
    }

    fn existing(
        &self,
        kind: Kind,
        name: &str,
        expected_rv: Option<u64>,
    ) -> Result<Arc<StoredObject>, StoreError> {
        let current = self
            .get(kind, name)
            .ok_or_else(|| StoreError::not_found(kind, name))?;
        check_rv(&current, expected_rv)?;
        Ok(current)
    }

    fn upsert(
        &mut self,
        pending: &mut Pending,
        desired: Desired,
        mode: Mode,
    ) -> Result<(Arc<StoredObject>, Action), StoreError> {
        let current = self.get(desired.kind, &desired.name);
        let current = match (current, &mode) {
            (Some(_), Mode::Create | Mode::Restore { .. }) => {
                return Err(StoreError::AlreadyExists {
                    kind: desired.kind.to_string(),
                    name: desired.name,
                });
            }
            (None, Mode::Replace(_)) => {
                return Err(StoreError::not_found(desired.kind, &desired.name));
            }
            (Some(current), Mode::Replace(expected_rv)) => {
                check_rv(&current, *expected_rv)?;
                Some(current)
            }
            (current, Mode::Apply(Some(expected))) => {
                if Expected::of(current.as_deref()) != *expected {
                    return Err(StoreError::Moved {
                        kind: desired.kind.to_string(),
                        name: desired.name,
                    });
                }
                current
            }
            (current, _) => current,
        };
        let Some(current) = current else {
            let mut desired = desired;
            keep_server_owned(&mut desired.annotations, &BTreeMap::new());
            let (uid, status) = match mode {
                Mode::Restore { uid, status } => {
                    if self.uids.contains_key(&uid) {
                        return Err(StoreError::conflict(
                            desired.kind,
                            &desired.name,
                            format!("an object with uid {uid} exists"),
                        ));
                    }
                    (uid, Doc::new(&status))
                }
                _ => (uuid::Uuid::new_v4().to_string(), Doc::null()),
            };
            let object = Arc::new(StoredObject {
                kind: desired.kind,
                metadata: ObjectMeta {
                    name: desired.name,
                    uid: Some(uid),
                    generation: Some(1),
                    resource_version: Some(self.next_rv().to_string()),
                    labels: desired.labels,
                    annotations: desired.annotations,
                    creation_timestamp: Some(now()),
                    deletion_timestamp: None,
                    finalizers: desired.finalizers.unwrap_or_default(),
                },
                spec: Doc::new(&desired.spec),
                status,
            });
            self.put(pending, Arc::clone(&object));
            if object.kind == Kind::Project
                && let Some(creator) = pending.creator.clone()
            {
                self.add_member(pending, object.uid(), &creator);
            }
            pending
                .changes
                .push(Change::new(ChangeType::Added, &object, true));
            return Ok((object, Action::Created));
        };

        let mut next = (*current).clone();
        next.metadata.labels = desired.labels;
        next.metadata.annotations = desired.annotations;
        keep_server_owned(
            &mut next.metadata.annotations,
            &current.metadata.annotations,
        );
        if let Some(finalizers) = desired.finalizers {
            next.metadata.finalizers = finalizers;
        }
        let spec = Doc::new(&desired.spec);
        let spec_changed = next.spec != spec;
        next.spec = spec;
        if next == *current {
            return Ok((current, Action::Unchanged));
        }
        if spec_changed {
            next.metadata.generation = Some(current.generation() + 1);
        }
        let desired_changed = spec_changed
            || next.metadata.labels != current.metadata.labels
            || next.metadata.annotations != current.metadata.annotations;
        next.metadata.resource_version = Some(self.next_rv().to_string());
        let next = Arc::new(next);
        if next.is_deleting() && next.metadata.finalizers.is_empty() {
            self.remove(pending, next.kind, next.name());
            pending
                .changes
                .push(Change::new(ChangeType::Deleted, &next, true));
            return Ok((next, Action::Configured));
        }
        self.put(pending, Arc::clone(&next));
        pending
            .changes
            .push(Change::new(ChangeType::Modified, &next, desired_changed));
        Ok((next, Action::Configured))
    }

    fn set_status(
        &mut self,
        pending: &mut Pending,
        update: StatusUpdate,
    ) -> Result<Arc<StoredObject>, StoreError> {
        let current = self.existing(update.kind, &update.name, update.expected_rv)?;
        let status = Doc::new(&update.status);
        if current.status == status {
            return Ok(current);
        }
        let mut next = (*current).clone();
        next.status = status;
        next.metadata.resource_version = Some(self.next_rv().to_string());
        let next = Arc::new(next);
        self.put(pending, Arc::clone(&next));
        pending
            .changes
            .push(Change::new(ChangeType::Modified, &next, false));
        Ok(next)
    }

    /// Deletes `current`, or marks it deleting while finalizers hold it.
    fn delete(
        &mut self,
        pending: &mut Pending,
        current: Arc<StoredObject>,
        annotations: BTreeMap<String, String>,
    ) -> Deletion {
        if current.metadata.finalizers.is_empty() {
            let mut last = (*current).clone();
            last.metadata.resource_version = Some(self.next_rv().to_string());
            let last = Arc::new(last);
            self.remove(pending, current.kind, current.name());
            pending
                .changes
                .push(Change::new(ChangeType::Deleted, &last, true));
            return Deletion::Deleted(last);
        }
        let mut next = (*current).clone();
        next.metadata.annotations.extend(annotations);
        if next.metadata.deletion_timestamp.is_none() {
            next.metadata.deletion_timestamp = Some(now());
        }
        if next == *current {
            return Deletion::Deleting(current);
        }
        next.metadata.resource_version = Some(self.next_rv().to_string());
        let next = Arc::new(next);
        self.put(pending, Arc::clone(&next));
        pending
            .changes
            .push(Change::new(ChangeType::Modified, &next, true));
        Deletion::Deleting(next)
    }

    fn record_inventory(&mut self, pending: &mut Pending, set: &str, inventory: Vec<String>) {
        if self.applysets.get(set) == Some(&inventory) {
            return;
        }
        let previous = self.applysets.insert(set.to_string(), inventory.clone());
        pending.inventory_undo.push((set.to_string(), previous));
        pending.writes.push(Write::Inventory {
            set: set.to_string(),
            inventory,
        });
    }

    /// Another project holding the display name of `object`, which was just written.
    fn display_name_holder(&self, object: &StoredObject) -> Option<&str> {
        let display = display_name_of(object)?;
        // A write that removed the object holds nothing.
        self.get(object.kind, object.name())?;
        self.display_names
            .get(&display)?
            .iter()
            .find(|holder| *holder != object.name())
            .map(String::as_str)
    }

    fn check_display_name(&self, object: &StoredObject) -> Result<(), StoreError> {
        match self.display_name_holder(object) {
            Some(_) => Err(self.display_name_conflict(object)),
            None => Ok(()),
        }
    }

    /// The index of the first written object whose display name another project holds; of two
    /// in the batch, the later one took it.
    fn check_display_names(&self, written: &[(Arc<StoredObject>, Action)]) -> Result<(), usize> {
        let position: HashMap<&str, usize> = written
            .iter()
            .enumerate()
            .map(|(index, (object, _))| (object.name(), index))
            .collect();
        for (index, (object, action)) in written.iter().enumerate() {
            let Some(display) = display_name_of(object) else {
                continue;
            };
            if *action == Action::Unchanged || self.get(object.kind, object.name()).is_none() {
                continue;
            }
            let taken = self.display_names.get(&display).is_some_and(|holders| {
                holders.iter().any(|holder| {
                    holder != object.name()
                        && position.get(holder.as_str()).is_none_or(|at| *at < index)
                })
            });
            if taken {
                return Err(index);
            }
        }
        Ok(())
    }

    /// The refusal of a display name another project holds. It names no project: the writer
    /// may not be allowed to know the other one exists.
    fn display_name_conflict(&self, object: &StoredObject) -> StoreError {
        StoreError::conflict(
            object.kind,
            object.name(),
            format!(
                "spec.displayName: {:?} is already the display name of another project",
                object
                    .spec
                    .get_str("displayName")
                    .as_deref()
                    .unwrap_or(object.name())
                    .trim()
            ),
        )
    }

    /// Puts `object` in memory, remembering what it replaced.
    fn put(&mut self, pending: &mut Pending, object: Arc<StoredObject>) {
        let previous = self.set(object.kind, object.name(), Some(Arc::clone(&object)));
        pending
            .undo
            .push((object.kind, object.name().to_string(), previous));
        pending.writes.push(Write::Put(object));
    }

    fn remove(&mut self, pending: &mut Pending, kind: Kind, name: &str) {
        let previous = self.set(kind, name, None);
        let uid = previous
            .as_ref()
            .map(|p| p.uid().to_string())
            .unwrap_or_default();
        pending.undo.push((kind, name.to_string(), previous));
        pending.writes.push(Write::Remove {
            kind,
            name: name.to_string(),
            uid,
        });
    }

    /// The one place memory changes, keeping the displayName index in step.
    fn set(
        &mut self,
        kind: Kind,
        name: &str,
        object: Option<Arc<StoredObject>>,
    ) -> Option<Arc<StoredObject>> {
        let objects = self.objects.entry(kind).or_default();
        let previous = match &object {
            Some(object) => objects.insert(name.to_string(), Arc::clone(object)),
            None => objects.remove(name),
        };
        // A write that keeps the spec (a status write, most often) keeps the display name.
        let same_spec = matches!((&previous, &object), (Some(p), Some(o)) if p.spec == o.spec);
        if !same_spec {
            if let Some(display) = previous.as_deref().and_then(display_name_of)
                && let Some(holders) = self.display_names.get_mut(&display)
            {
                holders.remove(name);
                if holders.is_empty() {
                    self.display_names.remove(&display);
                }
            }
            if let Some(display) = object.as_deref().and_then(display_name_of) {
                self.display_names
                    .entry(display)
                    .or_default()
                    .insert(name.to_string());
            }
        }
        if let Some(previous) = &previous {
            self.uids.remove(previous.uid());
        }
        if let Some(object) = &object {
            self.uids
                .insert(object.uid().to_string(), (kind, name.to_string()));
        }
        previous
    }

    fn add_member(&mut self, pending: &mut Pending, uid: &str, user: &str) {
        if self
            .members
            .entry(uid.to_string())
            .or_default()
            .insert(user.to_string())
        {
            pending
                .member_undo
                .push((uid.to_string(), user.to_string()));
            pending.writes.push(Write::Member {
                uid: uid.to_string(),
                user: user.to_string(),
            });
        }
    }

    fn undo(&mut self, pending: Pending) {
        for (uid, user) in pending.member_undo {
            if let Some(members) = self.members.get_mut(&uid) {
                members.remove(&user);
                if members.is_empty() {
                    self.members.remove(&uid);
                }
            }
        }
        for (kind, name, previous) in pending.undo.into_iter().rev() {
            self.set(kind, &name, previous);
        }
        for (set, previous) in pending.inventory_undo.into_iter().rev() {
            match previous {
                Some(inventory) => self.applysets.insert(set, inventory),
                None => self.applysets.remove(&set),
            };
        }
        self.resource_version = pending.rv_before;
    }

    fn commit(&mut self, writes: &[Write]) -> Result<(), StoreError> {
        let tx = self.conn.transaction()?;
        {
            let mut put = tx.prepare_cached(
                "INSERT INTO objects (kind, name, uid, generation, resource_version, labels, \
                 annotations, finalizers, creation_timestamp, deletion_timestamp, spec, status) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12) \
                 ON CONFLICT (kind, name) DO UPDATE SET uid = ?3, generation = ?4, \
                 resource_version = ?5, labels = ?6, annotations = ?7, finalizers = ?8, \
                 creation_timestamp = ?9, deletion_timestamp = ?10, spec = ?11, status = ?12",
            )?;
            let mut remove =
                tx.prepare_cached("DELETE FROM objects WHERE kind = ?1 AND name = ?2")?;
            let mut inventory = tx.prepare_cached(
                "INSERT INTO applysets (name, inventory, updated) VALUES (?1, ?2, ?3) \
                 ON CONFLICT (name) DO UPDATE SET inventory = ?2, updated = ?3",
            )?;
            for write in writes {
                match write {
                    Write::Put(object) => {
                        let meta = &object.metadata;
                        let status = (!object.status.is_null()).then(|| object.status.to_string());
                        put.execute(params![
                            object.kind.as_str(),
                            meta.name,
                            object.uid(),
                            object.generation(),
                            object.resource_version() as i64,
                            json_text(&meta.labels),
                            json_text(&meta.annotations),
                            json_text(&meta.finalizers),
                            meta.creation_timestamp.unwrap_or_else(now).to_rfc3339(),
                            meta.deletion_timestamp.map(|t| t.to_rfc3339()),
                            object.spec.to_string(),
                            status,
                        ])?;
                    }
                    Write::Remove { kind, name, uid } => {
                        remove.execute(params![kind.as_str(), name])?;
                        events::mark_gone(&tx, uid, Utc::now())?;
                        if matches!(kind, Kind::Project | Kind::GitSource) {
                            access::forget_project(&tx, uid)?;
                        }
                    }
                    Write::Inventory {
                        set,
                        inventory: members,
                    } => {
                        inventory.execute(params![set, json_text(members), now().to_rfc3339()])?;
                    }
                    Write::Member { uid, user } => {
                        access::insert_member(&tx, uid, user)?;
                    }
                }
            }
            tx.execute(
                "UPDATE counters SET value = ?1 WHERE name = 'resourceVersion'",
                [self.resource_version as i64],
            )?;
        }
        tx.commit()?;
        Ok(())
    }

    fn note_write<T>(&mut self, result: &Result<T, StoreError>) {
        match result {
            Ok(_) => self.write_error = None,
            Err(StoreError::Sqlite(err)) => {
                tracing::error!(error = %err, "a store write failed");
                self.write_error = Some(err.to_string());
            }
            Err(_) => {}
        }
    }
}

/// How a pruned object was asked to go: by a prune, on behalf of whoever applied the set.
fn prune_annotations(creator: Option<&str>) -> BTreeMap<String, String> {
    let mut annotations = BTreeMap::from([(
        berth_api::annotations::REAPED_BY.to_string(),
        "prune".to_string(),
    )]);
    if let Some(creator) = creator {
        annotations.insert(
            berth_api::annotations::DELETED_BY.to_string(),
            creator.to_string(),
        );
    }
    annotations
}

/// A spec or metadata write keeps the annotations only the server writes as `current` holds
/// them: a delete request records them ([`Store::delete`]), and no later write drops or adds
/// one, so a re-applied manifest never loses a recorded force nor arms one.
fn keep_server_owned(
    annotations: &mut BTreeMap<String, String>,
    current: &BTreeMap<String, String>,
) {
    for key in berth_api::annotations::SERVER_OWNED {
        match current.get(key) {
            Some(value) => annotations.insert(key.to_string(), value.clone()),
            None => annotations.remove(key),
        };
    }
}

fn check_rv(current: &StoredObject, expected_rv: Option<u64>) -> Result<(), StoreError> {
    match expected_rv {
        Some(expected) if expected != current.resource_version() => Err(StoreError::conflict(
            current.kind,
            current.name(),
            format!(
                "{} {:?} was modified (resourceVersion {} is stale, now {}); read it again and retry",
                current.kind,
                current.name(),
                expected,
                current.resource_version()
            ),
        )),
        _ => Ok(()),
    }
}

fn json_text<T: serde::Serialize>(value: &T) -> String {
    serde_json::to_string(value).unwrap_or_default()
}

/// The kind and name an applyset inventory key (`Kind/name`) names.
fn inventory_key(key: &str) -> Option<(Kind, &str)> {
    let (kind, name) = key.split_once('/')?;
    Some((kind.parse().ok()?, name))
}

/// The applyset that owns `object` (`berth.dev/applyset`), if any.
fn owner_of(object: &StoredObject) -> Option<String> {
    object
        .metadata
        .annotations
        .get(berth_api::annotations::APPLYSET)
        .cloned()
}

fn load_applysets(conn: &Connection) -> Result<HashMap<String, Vec<String>>, StoreError> {
    let mut stmt = conn.prepare("SELECT name, inventory FROM applysets")?;
    let rows = stmt.query_map([], |row| Ok((row.get(0)?, json_column(row, 1)?)))?;
    Ok(rows.collect::<Result<_, _>>()?)
}

fn json_column<T: serde::de::DeserializeOwned>(
    row: &rusqlite::Row<'_>,
    index: usize,
) -> rusqlite::Result<T> {
    let text: String = row.get(index)?;
    serde_json::from_str(&text).map_err(|err| {
        rusqlite::Error::FromSqlConversionFailure(index, rusqlite::types::Type::Text, Box::new(err))
    })
}

/// A kind as stored (its exact name); any other text is a corrupt row.
fn kind_column(row: &rusqlite::Row<'_>, index: usize) -> rusqlite::Result<Kind> {
    let text: String = row.get(index)?;
    text.parse().map_err(|err| {
        rusqlite::Error::FromSqlConversionFailure(index, rusqlite::types::Type::Text, Box::new(err))
    })
}

type Loaded = (
    HashMap<Kind, BTreeMap<String, Arc<StoredObject>>>,
    HashMap<String, BTreeSet<String>>,
    HashMap<String, (Kind, String)>,
);

fn load_objects(conn: &Connection) -> Result<Loaded, StoreError> {
    let mut stmt = conn.prepare(
        "SELECT kind, name, uid, generation, resource_version, labels, annotations, finalizers, \
         creation_timestamp, deletion_timestamp, spec, status FROM objects",
    )?;
    let rows = stmt.query_map([], |row| {
        let status: Option<String> = row.get(11)?;
        let deletion: Option<String> = row.get(9)?;
        let deletion_timestamp = match deletion {
            Some(_) => Some(events::timestamp(row, 9)?),
            None => None,
        };
        Ok(StoredObject {
            kind: kind_column(row, 0)?,
            metadata: ObjectMeta {
                name: row.get(1)?,
                uid: Some(row.get(2)?),
                generation: Some(row.get(3)?),
                resource_version: Some(row.get::<_, i64>(4)?.to_string()),
                labels: json_column(row, 5)?,
                annotations: json_column(row, 6)?,
                finalizers: json_column(row, 7)?,
                creation_timestamp: Some(events::timestamp(row, 8)?),
                deletion_timestamp,
            },
            spec: Doc::new(&json_column::<Value>(row, 10)?),
            status: match status {
                Some(_) => Doc::new(&json_column::<Value>(row, 11)?),
                None => Doc::null(),
            },
        })
    })?;
    let mut objects: HashMap<Kind, BTreeMap<String, Arc<StoredObject>>> = HashMap::new();
    let mut display_names: HashMap<String, BTreeSet<String>> = HashMap::new();
    let mut uids = HashMap::new();
    for row in rows {
        let object = Arc::new(row?);
        uids.insert(
            object.uid().to_string(),
            (object.kind, object.name().to_string()),
        );
        if let Some(display) = display_name_of(&object) {
            display_names
                .entry(display)
                .or_default()
                .insert(object.name().to_string());
        }
        objects
            .entry(object.kind)
            .or_default()
            .insert(object.name().to_string(), object);
    }
    Ok((objects, display_names, uids))
}

#[cfg(test)]
mod tests;
