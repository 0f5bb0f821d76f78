//! Events: what happened to an object, for `describe` and `berth events`. A repeat of the same
//! type, reason and message bumps the count and last time of the earlier one instead of adding
//! a row, and an object keeps only its latest [`KEPT_PER_OBJECT`] distinct events, so a project
//! stuck in a retry loop cannot fill the disk. When the object goes (deleted, pruned) its events
//! stay, marked with when it went, until housekeeping prunes them after `events.retention`.

use berth_api::Kind;
use chrono::{DateTime, Utc};
use rusqlite::{Connection, OptionalExtension, Row, params};
use serde::Serialize;
use serde_json::{Value, json};

use super::{Store, StoreError, StoredObject};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum EventType {
    Normal,
    Warning,
}

impl EventType {
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Normal => "Normal",
            EventType::Warning => "Warning",
        }
    }

    fn parse(value: &str) -> EventType {
        if value == "Warning" {
            EventType::Warning
        } else {
            EventType::Normal
        }
    }
}

/// The object an event is about.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct EventObject {
    pub kind: Kind,
    pub name: String,
    pub uid: String,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Event {
    pub id: i64,
    pub involved_object: EventObject,
    #[serde(rename = "type")]
    pub type_: EventType,
    pub reason: String,
    pub message: String,
    pub count: i64,
    pub first_timestamp: DateTime<Utc>,
    pub last_timestamp: DateTime<Utc>,
}

impl Event {
    /// The wire form, shaped like a Kubernetes core/v1 Event. A URL in the message is shown
    /// without its credentials: an event recorded before they were redacted at the source may
    /// still hold them.
    pub fn to_value(&self) -> Value {
        json!({
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": format!("{}.{}", self.involved_object.name, self.id)},
            "involvedObject": self.involved_object,
            "type": self.type_.as_str(),
            "reason": self.reason,
            "message": berth_api::redact_credentials(&self.message),
            "count": self.count,
            "firstTimestamp": self.first_timestamp,
            "lastTimestamp": self.last_timestamp,
        })
    }
}

/// Distinct events kept per object.
pub const KEPT_PER_OBJECT: i64 = 100;

const COLUMNS: &str = "id, object_kind, object_name, object_uid, type, reason, message, count, \
                       first_timestamp, last_timestamp";

/// Records an event about `object`; `gone`: the object no longer exists (an event about what
/// was left of it, e.g. its trash purged), so the event is kept only for the retention.
pub(super) fn record(
    conn: &mut Connection,
    object: &EventObject,
    type_: EventType,
    reason: &str,
    message: &str,
    now: DateTime<Utc>,
    gone: bool,
) -> Result<Event, StoreError> {
    let tx = conn.transaction()?;
    let now = stamp(now);
    let gone_at = gone.then(|| now.clone());
    let earlier: Option<i64> = tx
        .query_row(
            "SELECT id FROM events WHERE object_uid = ?1 AND reason = ?2 AND type = ?3 \
             AND message = ?4 ORDER BY id DESC LIMIT 1",
            params![object.uid, reason, type_.as_str(), message],
            |row| row.get(0),
        )
        .optional()?;
    let id = match earlier {
        Some(id) => {
            tx.execute(
                "UPDATE events SET count = count + 1, last_timestamp = ?2, \
                 gone_at = coalesce(?3, gone_at) WHERE id = ?1",
                params![id, now, gone_at],
            )?;
            id
        }
        None => {
            tx.execute(
                "INSERT INTO events (object_kind, object_name, object_uid, type, reason, message, \
                 count, first_timestamp, last_timestamp, gone_at) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, 1, ?7, ?7, ?8)",
                params![
                    object.kind.as_str(),
                    object.name,
                    object.uid,
                    type_.as_str(),
                    reason,
                    message,
                    now,
                    gone_at
                ],
            )?;
            let id = tx.last_insert_rowid();
            tx.execute(
                "DELETE FROM events WHERE object_uid = ?1 AND id NOT IN \
                 (SELECT id FROM events WHERE object_uid = ?1 \
                  ORDER BY last_timestamp DESC, id DESC LIMIT ?2)",
                params![object.uid, KEPT_PER_OBJECT],
            )?;
            id
        }
    };
    let event = tx.query_row(
        &format!("SELECT {COLUMNS} FROM events WHERE id = ?1"),
        [id],
        from_row,
    )?;
    tx.commit()?;
    Ok(event)
}

/// Fixed width, so text order is time order.
fn stamp(time: DateTime<Utc>) -> String {
    time.to_rfc3339_opts(chrono::SecondsFormat::Nanos, true)
}

/// Events about `kind`/`name`, oldest first (by when they last happened): those of the object
/// `uid` when one of that name exists now (a project created again under the same name starts
/// with no history of the old one), else those of every object of that name that went.
pub(super) fn for_object(
    conn: &Connection,
    kind: Kind,
    name: &str,
    uid: Option<&str>,
) -> Result<Vec<Event>, StoreError> {
    let rows = match uid {
        Some(uid) => {
            let mut stmt = conn.prepare_cached(&format!(
                "SELECT {COLUMNS} FROM events WHERE object_kind = ?1 AND object_name = ?2 \
                 AND object_uid = ?3 ORDER BY last_timestamp, id"
            ))?;
            stmt.query_map([kind.as_str(), name, uid], from_row)?
                .collect::<Result<_, _>>()?
        }
        None => {
            let mut stmt = conn.prepare_cached(&format!(
                "SELECT {COLUMNS} FROM events WHERE object_kind = ?1 AND object_name = ?2 \
                 ORDER BY last_timestamp, id"
            ))?;
            stmt.query_map([kind.as_str(), name], from_row)?
                .collect::<Result<_, _>>()?
        }
    };
    Ok(rows)
}

/// The most recent `limit` events about anything, oldest first.
pub(super) fn recent(conn: &Connection, limit: usize) -> Result<Vec<Event>, StoreError> {
    let mut stmt = conn.prepare_cached(&format!(
        "SELECT {COLUMNS} FROM (SELECT {COLUMNS} FROM events \
         ORDER BY last_timestamp DESC, id DESC LIMIT ?1) ORDER BY last_timestamp, id"
    ))?;
    let rows = stmt.query_map([limit as i64], from_row)?;
    Ok(rows.collect::<Result<_, _>>()?)
}

fn from_row(row: &Row<'_>) -> rusqlite::Result<Event> {
    let type_: String = row.get(4)?;
    Ok(Event {
        id: row.get(0)?,
        involved_object: EventObject {
            kind: super::database::kind_column(row, 1)?,
            name: row.get(2)?,
            uid: row.get(3)?,
        },
        type_: EventType::parse(&type_),
        reason: row.get(5)?,
        message: row.get(6)?,
        count: row.get(7)?,
        first_timestamp: timestamp(row, 8)?,
        last_timestamp: timestamp(row, 9)?,
    })
}

pub(super) fn timestamp(row: &Row<'_>, index: usize) -> rusqlite::Result<DateTime<Utc>> {
    let text: String = row.get(index)?;
    DateTime::parse_from_rfc3339(&text)
        .map(|t| t.with_timezone(&Utc))
        .map_err(|err| {
            rusqlite::Error::FromSqlConversionFailure(
                index,
                rusqlite::types::Type::Text,
                Box::new(err),
            )
        })
}

/// Marks every event about an object as its object's gone at `now`: part of the transaction
/// that removes it. They are listed (`berth events NAME`) until [`prune_gone`] drops them.
pub(super) fn mark_gone(
    tx: &rusqlite::Transaction<'_>,
    uid: &str,
    now: DateTime<Utc>,
) -> Result<(), StoreError> {
    tx.execute(
        "UPDATE events SET gone_at = ?2 WHERE object_uid = ?1 AND gone_at IS NULL",
        params![uid, stamp(now)],
    )?;
    Ok(())
}

/// Deletes the events whose object went before `before`; answers how many.
pub(super) fn prune_gone(conn: &Connection, before: DateTime<Utc>) -> Result<usize, StoreError> {
    Ok(conn.execute(
        "DELETE FROM events WHERE gone_at IS NOT NULL AND gone_at < ?1",
        [stamp(before)],
    )?)
}

impl Store {
    /// Writes an event. Only the recorder ([`Store::record_or_warn`], [`Store::publish_event`])
    /// calls it.
    pub(super) fn record_event(
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
        let result = record(&mut inner.conn, &target, type_, reason, message, now, gone);
        inner.note_write(&result);
        result
    }

    /// Events about `kind`/`name`, oldest first: the existing object's, or when there is none,
    /// those of the objects of that name that went in the last `events.retention`.
    pub fn events_for(&self, kind: Kind, name: &str) -> Result<Vec<Event>, StoreError> {
        let inner = self.lock();
        let uid = inner.get(kind, name).map(|o| o.uid().to_string());
        for_object(&inner.conn, kind, name, uid.as_deref())
    }

    /// Deletes the events of objects that went before `before` (housekeeping, after
    /// `events.retention`); answers how many.
    pub fn prune_gone_events(&self, before: DateTime<Utc>) -> Result<usize, StoreError> {
        let inner = self.lock();
        prune_gone(&inner.conn, before)
    }

    /// The latest `limit` events about anything, oldest first.
    pub fn recent_events(&self, limit: usize) -> Result<Vec<Event>, StoreError> {
        recent(&self.lock().conn, limit)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_event_recorded_with_a_url_carrying_credentials_is_shown_redacted() {
        let event = Event {
            id: 1,
            involved_object: EventObject {
                kind: Kind::GitSource,
                name: "fleet".to_string(),
                uid: "u".to_string(),
            },
            type_: EventType::Warning,
            reason: "FetchFailed".to_string(),
            message: "spec.ref: \"v9\" is not a branch, tag or commit of https://bot:s3cr3t@git.example/f.git"
                .to_string(),
            count: 1,
            first_timestamp: Utc::now(),
            last_timestamp: Utc::now(),
        };
        let shown = event.to_value();
        assert_eq!(
            shown["message"],
            "spec.ref: \"v9\" is not a branch, tag or commit of https://***@git.example/f.git"
        );
    }
}
