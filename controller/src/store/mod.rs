//! The desired-state store: every object lives in memory for reads and is written through to
//! SQLite, one transaction per write (or per batch), before anyone hears of it. Changes are
//! published on a broadcast feed in resourceVersion order.
//!
//! Its parts: `cache.rs` (the objects in memory, their indexes and the change feed),
//! `database.rs` (the SQLite file: opening, loading, committing), `writes.rs` (the verbs and
//! the in-memory transaction they share), `applyset.rs` (sets, their inventories and prune),
//! `status.rs` (the one status writer), `events.rs`, `access.rs`, `executions.rs`, `facade.rs`.
//!
//! Invariants: `generation` moves only when spec changes; `resourceVersion` comes from one
//! global counter and moves on every write; a write that changes nothing writes nothing; status
//! moves only through [`Store::write_status`] (one writer, each field with declared owners), and
//! spec or metadata writes never touch it.

mod access;
mod applyset;
mod cache;
mod database;
mod events;
mod executions;
mod facade;
mod object;
pub mod schema;
mod status;
mod writes;

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use cache::Names;

use berth_api::Kind;
use chrono::{DateTime, Utc};
use rusqlite::Connection;
use tokio::sync::broadcast;

pub use access::{SecretEntry, SecretsChange, User};
pub use applyset::{AppliedSet, SetConflict, SetParams, Takeover};
pub(crate) use database::restrict_mode;
pub use events::{Event, EventObject, EventType};
pub use executions::{Execution, ExecutionState};
pub use facade::{Unfinished, blocking};
pub use object::{Action, Change, ChangeType, Deletion, Desired, Doc, Expected, StoredObject};
pub use status::{
    FieldManager, PROJECT_FIELDS, STATUS_WRITE_ATTEMPTS, StatusWrite, StatusWritten, lay_owned,
};
pub use writes::{ApplyItem, ApplyParams, BatchFailure, PostParams, Restored, StatusUpdate};

/// Whether a write is kept. A dry run makes every check a real write would, then puts memory
/// back and commits nothing (the API's `?dryRun`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Commit {
    Persist,
    DryRun,
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

/// The store: every object in memory behind one lock, written through to SQLite.
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
    display_names: HashMap<String, Names>,
    /// uid → (kind, name), for records that name objects by uid (LXD labels, events).
    uids: HashMap<String, (Kind, String)>,
    /// Applyset name → its inventory (`Kind/name`, sorted).
    applysets: HashMap<String, Vec<String>>,
    /// Project uid → the users who are its members.
    members: HashMap<String, Names>,
    resource_version: u64,
    /// Why the last write failed, cleared by the next one that succeeds.
    write_error: Option<String>,
    last_probe: Option<Instant>,
}

impl Store {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock leaves memory as it was before the write (undo runs
        // before anything can panic), so the data is still consistent.
        self.inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

pub(super) fn now() -> DateTime<Utc> {
    // Second precision, as Kubernetes timestamps: a stored object reads back identical.
    let now = Utc::now();
    DateTime::from_timestamp(now.timestamp(), 0).unwrap_or(now)
}

#[cfg(test)]
mod tests;
