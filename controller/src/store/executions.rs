//! Workspace tool executions: one row per (project, executionId). The row is written `started`
//! before the tool runs and `finished` with its recorded outcome after, so a repeated id answers
//! from the row instead of running again, and a row left `started` (the daemon died mid-call)
//! tells the caller the outcome is unknown.

use chrono::{DateTime, SecondsFormat, Utc};
use rusqlite::{OptionalExtension, params};
use serde_json::Value;

use super::{Store, StoreError};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExecutionState {
    /// Recorded before dispatch; no outcome yet (running now, or lost).
    Started,
    /// Has an outcome.
    Finished,
}

impl ExecutionState {
    fn as_str(self) -> &'static str {
        match self {
            ExecutionState::Started => "started",
            ExecutionState::Finished => "finished",
        }
    }

    fn parse(value: &str) -> ExecutionState {
        if value == "finished" {
            ExecutionState::Finished
        } else {
            ExecutionState::Started
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Execution {
    pub id: String,
    pub tool: String,
    pub state: ExecutionState,
    /// The recorded answer (already redacted), when finished.
    pub outcome: Option<Value>,
    pub started: DateTime<Utc>,
    pub finished: Option<DateTime<Utc>>,
}

impl Store {
    /// Records `id` as started, unless the project already has an execution of that id: then
    /// that one is returned and nothing is written.
    pub fn begin_execution(
        &self,
        project_uid: &str,
        id: &str,
        tool: &str,
        now: DateTime<Utc>,
    ) -> Result<Option<Execution>, StoreError> {
        let inner = self.lock();
        if let Some(existing) = read(&inner.conn, project_uid, id)? {
            return Ok(Some(existing));
        }
        inner.conn.execute(
            "INSERT INTO executions (project_uid, id, tool, state, started) VALUES (?1, ?2, ?3, ?4, ?5)",
            params![project_uid, id, tool, ExecutionState::Started.as_str(), now.to_rfc3339_opts(SecondsFormat::Micros, true)],
        )?;
        Ok(None)
    }

    /// Records the outcome of an execution (inserting it when it was never started, as a
    /// cancel before dispatch does).
    pub fn finish_execution(
        &self,
        project_uid: &str,
        id: &str,
        tool: &str,
        outcome: &Value,
        now: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        let inner = self.lock();
        let now = now.to_rfc3339_opts(SecondsFormat::Micros, true);
        inner.conn.execute(
            "INSERT INTO executions (project_uid, id, tool, state, outcome, started, finished)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?6)
             ON CONFLICT (project_uid, id) DO UPDATE
             SET state = excluded.state, outcome = excluded.outcome, finished = excluded.finished",
            params![
                project_uid,
                id,
                tool,
                ExecutionState::Finished.as_str(),
                outcome.to_string(),
                now
            ],
        )?;
        Ok(())
    }

    pub fn execution(&self, project_uid: &str, id: &str) -> Result<Option<Execution>, StoreError> {
        read(&self.lock().conn, project_uid, id)
    }

    /// When the project's latest tool call started: activity, for the idle scheduler.
    pub fn last_tool_call(&self, project_uid: &str) -> Result<Option<DateTime<Utc>>, StoreError> {
        let started: Option<String> = self.lock().conn.query_row(
            "SELECT MAX(started) FROM executions WHERE project_uid = ?1",
            params![project_uid],
            |row| row.get(0),
        )?;
        Ok(started.as_deref().and_then(parse_time))
    }

    /// Deletes executions that started before `before`; returns how many.
    pub fn expire_executions(&self, before: DateTime<Utc>) -> Result<usize, StoreError> {
        Ok(self.lock().conn.execute(
            "DELETE FROM executions WHERE started < ?1",
            params![before.to_rfc3339_opts(SecondsFormat::Micros, true)],
        )?)
    }
}

fn read(
    conn: &rusqlite::Connection,
    project_uid: &str,
    id: &str,
) -> Result<Option<Execution>, StoreError> {
    let row = conn
        .query_row(
            "SELECT id, tool, state, outcome, started, finished FROM executions
             WHERE project_uid = ?1 AND id = ?2",
            params![project_uid, id],
            |row| {
                Ok((
                    row.get::<_, String>(0)?,
                    row.get::<_, String>(1)?,
                    row.get::<_, String>(2)?,
                    row.get::<_, Option<String>>(3)?,
                    row.get::<_, String>(4)?,
                    row.get::<_, Option<String>>(5)?,
                ))
            },
        )
        .optional()?;
    let Some((id, tool, state, outcome, started, finished)) = row else {
        return Ok(None);
    };
    Ok(Some(Execution {
        id,
        tool,
        state: ExecutionState::parse(&state),
        outcome: outcome.and_then(|o| serde_json::from_str(&o).ok()),
        started: parse_time(&started).unwrap_or_default(),
        finished: finished.as_deref().and_then(parse_time),
    }))
}

fn parse_time(value: &str) -> Option<DateTime<Utc>> {
    DateTime::parse_from_rfc3339(value)
        .ok()
        .map(|t| t.with_timezone(&Utc))
}
