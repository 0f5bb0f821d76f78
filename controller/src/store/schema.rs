//! The SQLite schema and its forward-only migrations. The schema version is SQLite's
//! `user_version`; a database newer than this binary knows is refused, never downgraded.

use std::path::{Path, PathBuf};

use rusqlite::Connection;

use super::StoreError;

/// Each entry moves the schema from version `i` to `i + 1`. Append only: a released migration is
/// never edited, because databases in the field already ran it.
const MIGRATIONS: &[&str] = &[
    // v1: objects and the global resourceVersion counter.
    "CREATE TABLE counters (
         name  TEXT PRIMARY KEY,
         value INTEGER NOT NULL
     );
     INSERT INTO counters (name, value) VALUES ('resourceVersion', 0);
     CREATE TABLE objects (
         kind               TEXT NOT NULL,
         name               TEXT NOT NULL,
         uid                TEXT NOT NULL UNIQUE,
         generation         INTEGER NOT NULL,
         resource_version   INTEGER NOT NULL,
         labels             TEXT NOT NULL,
         annotations        TEXT NOT NULL,
         finalizers         TEXT NOT NULL,
         creation_timestamp TEXT NOT NULL,
         deletion_timestamp TEXT,
         spec               TEXT NOT NULL,
         status             TEXT,
         PRIMARY KEY (kind, name)
     );",
    // v2: events about objects.
    "CREATE TABLE events (
         id              INTEGER PRIMARY KEY AUTOINCREMENT,
         object_kind     TEXT NOT NULL,
         object_name     TEXT NOT NULL,
         object_uid      TEXT NOT NULL,
         type            TEXT NOT NULL,
         reason          TEXT NOT NULL,
         message         TEXT NOT NULL,
         count           INTEGER NOT NULL,
         first_timestamp TEXT NOT NULL,
         last_timestamp  TEXT NOT NULL
     );
     CREATE INDEX events_by_object ON events (object_kind, object_name, id);
     CREATE INDEX events_by_uid ON events (object_uid, reason);",
    // v3: applyset inventories, for pruning exactly what a set applied before.
    "CREATE TABLE applysets (
         name      TEXT PRIMARY KEY,
         inventory TEXT NOT NULL,
         updated   TEXT NOT NULL
     );",
    // v4: access. Secrets (sealed by the secrets module, never plain text here), a per-project
    // secrets revision the controller watches, users by token hash, and project membership.
    // Rows name projects by uid: a project created again under the same name starts afresh.
    "CREATE TABLE secrets (
         project_uid TEXT NOT NULL,
         key         TEXT NOT NULL,
         sealed      BLOB NOT NULL,
         updated     TEXT NOT NULL,
         PRIMARY KEY (project_uid, key)
     );
     CREATE TABLE secret_revisions (
         project_uid TEXT PRIMARY KEY,
         revision    INTEGER NOT NULL
     );
     CREATE TABLE users (
         name       TEXT PRIMARY KEY,
         token_hash TEXT NOT NULL UNIQUE,
         admin      INTEGER NOT NULL,
         created    TEXT NOT NULL
     );
     CREATE TABLE members (
         project_uid TEXT NOT NULL,
         user        TEXT NOT NULL,
         added       TEXT NOT NULL,
         PRIMARY KEY (project_uid, user)
     );
     CREATE INDEX members_by_user ON members (user);",
    // v5: workspace tool executions, one row per (project, executionId), written before the
    // tool runs so a repeated id never runs twice and a lost outcome is known to be lost.
    "CREATE TABLE executions (
         project_uid TEXT NOT NULL,
         id          TEXT NOT NULL,
         tool        TEXT NOT NULL,
         state       TEXT NOT NULL,
         outcome     TEXT,
         started     TEXT NOT NULL,
         finished    TEXT,
         PRIMARY KEY (project_uid, id)
     );
     CREATE INDEX executions_by_started ON executions (project_uid, started);",
    // v6: the store's own settings; `controllerId` names this store's controller on the
    // LXD objects it creates, made once here so a copy of the database keeps it.
    "CREATE TABLE settings (
         name  TEXT PRIMARY KEY,
         value TEXT NOT NULL
     );
     INSERT INTO settings (name, value) VALUES ('controllerId', lower(hex(randomblob(8))));",
    // v7: when an event's object went (deleted, pruned): its events are kept for
    // `events.retention` after it, then pruned by housekeeping.
    "ALTER TABLE events ADD COLUMN gone_at TEXT;
     CREATE INDEX events_by_gone ON events (gone_at);",
];

/// The schema version this binary writes.
pub const SCHEMA_VERSION: u32 = MIGRATIONS.len() as u32;

pub(super) fn version(conn: &Connection) -> Result<u32, StoreError> {
    Ok(conn.query_row("PRAGMA user_version", [], |row| row.get(0))?)
}

/// Brings the database at `path` to [`SCHEMA_VERSION`]. Before touching a database that already
/// holds a schema, copies it to `<path>.bak-v<N>` so a failed or regretted upgrade can be undone
/// by hand.
pub(super) fn migrate(conn: &mut Connection, path: &Path) -> Result<(), StoreError> {
    let found = version(conn)?;
    if found > SCHEMA_VERSION {
        return Err(StoreError::SchemaTooNew {
            found,
            supported: SCHEMA_VERSION,
        });
    }
    if found == SCHEMA_VERSION {
        return Ok(());
    }
    if found > 0 {
        backup(conn, &backup_path(path, found))?;
    }
    migrate_to(conn, SCHEMA_VERSION)
}

pub(super) fn migrate_to(conn: &mut Connection, target: u32) -> Result<(), StoreError> {
    let found = version(conn)?;
    for (index, sql) in MIGRATIONS
        .iter()
        .enumerate()
        .take(target as usize)
        .skip(found as usize)
    {
        let next = index as u32 + 1;
        let tx = conn.transaction()?;
        tx.execute_batch(sql)?;
        tx.pragma_update(None, "user_version", next)?;
        tx.commit()?;
        tracing::info!(version = next, "migrated the store schema");
    }
    Ok(())
}

/// `berth.db` → `berth.db.bak-v<version>`.
pub fn backup_path(path: &Path, version: u32) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(format!(".bak-v{version}"));
    PathBuf::from(name)
}

fn backup(conn: &Connection, target: &Path) -> Result<(), StoreError> {
    // VACUUM INTO refuses an existing file; an older copy of the same version holds nothing the
    // live database lacks.
    if target.exists() {
        std::fs::remove_file(target).map_err(|source| StoreError::Io {
            path: target.to_path_buf(),
            source,
        })?;
    }
    let target_str = target.to_str().ok_or_else(|| StoreError::Io {
        path: target.to_path_buf(),
        source: std::io::Error::other("backup path is not UTF-8"),
    })?;
    conn.execute("VACUUM INTO ?1", [target_str])?;
    super::restrict_mode(target)?;
    tracing::info!(backup = %target.display(), "copied the store before migrating");
    Ok(())
}
