//! The SQLite file: opened (0600, integrity checked, migrated) and loaded into memory, a
//! write's rows committed in one transaction, and whether it still takes writes.
//!
//! SQLite runs in WAL mode, the file 0600; migrations only go forward, each after a backup copy,
//! and `quick_check` runs at start. A stored row naming no kind is a load error: objects are
//! addressed by `berth_api::Kind`.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use berth_api::{Kind, ObjectMeta};
use chrono::Utc;
use rusqlite::{Connection, OpenFlags, params};
use serde_json::Value;
use tokio::sync::broadcast;

use super::applyset::load_applysets;
use super::cache::{Names, display_name_of};
use super::writes::Write;
use super::{
    CHANGE_FEED_CAPACITY, Doc, Inner, PROBE_INTERVAL, Store, StoreError, StoredObject, access,
    events, now, schema,
};

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
}

impl Inner {
    pub(super) fn commit(&mut self, writes: &[Write]) -> Result<(), StoreError> {
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

    pub(super) fn note_write<T>(&mut self, result: &Result<T, StoreError>) {
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

pub(crate) fn restrict_mode(path: &Path) -> Result<(), StoreError> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).map_err(|source| {
        StoreError::Io {
            path: path.to_path_buf(),
            source,
        }
    })
}

pub(super) fn probe(conn: &Connection) -> Result<(), StoreError> {
    conn.execute(
        "UPDATE counters SET value = value WHERE name = 'resourceVersion'",
        [],
    )?;
    Ok(())
}

pub(super) fn json_text<T: serde::Serialize>(value: &T) -> String {
    serde_json::to_string(value).unwrap_or_default()
}

pub(super) fn json_column<T: serde::de::DeserializeOwned>(
    row: &rusqlite::Row<'_>,
    index: usize,
) -> rusqlite::Result<T> {
    let text: String = row.get(index)?;
    serde_json::from_str(&text).map_err(|err| {
        rusqlite::Error::FromSqlConversionFailure(index, rusqlite::types::Type::Text, Box::new(err))
    })
}

/// A kind as stored (its exact name); any other text is a corrupt row.
pub(super) fn kind_column(row: &rusqlite::Row<'_>, index: usize) -> rusqlite::Result<Kind> {
    let text: String = row.get(index)?;
    text.parse().map_err(|err| {
        rusqlite::Error::FromSqlConversionFailure(index, rusqlite::types::Type::Text, Box::new(err))
    })
}

pub(super) type Loaded = (
    HashMap<Kind, BTreeMap<String, Arc<StoredObject>>>,
    HashMap<String, Names>,
    HashMap<String, (Kind, String)>,
);

pub(super) fn load_objects(conn: &Connection) -> Result<Loaded, StoreError> {
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
    let mut display_names: HashMap<String, Names> = HashMap::new();
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
