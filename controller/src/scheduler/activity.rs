//! From what inspections saw, when a project was last in use and by which signal
//! (`status.activity`), plus the agent's report as status shows it (title, state, message).
//!
//! The inspection is built not to look like activity (its own processes are left out of the CPU
//! figure, `.git` out of the file times, and git takes no optional locks), so any change between
//! two inspections is someone else's doing.

use std::time::Duration;

use berth_api::{ActivitySource, ActivityStatus, AgentState, AgentStatus};
use chrono::{DateTime, Utc};

use crate::workspace::inspect::{AgentReport, Inspection};

/// The most characters of agent-written text status keeps.
pub const MAX_TEXT_CHARS: usize = 200;

/// CPU use between two inspections below this is background noise (init, an idle agent
/// polling for an answer), not someone working.
pub const DEFAULT_CPU_THRESHOLD: Duration = Duration::from_millis(500);

/// What people did in a project through berth (`berth exec`, tool calls), as the API records
/// it in memory: the scheduler's activity pass counts it.
pub trait PeopleActivity: Send + Sync {
    /// When the project `uid` was last used through berth, and as what (`exec`, `tool`).
    fn last(&self, uid: &str) -> Option<(DateTime<Utc>, &'static str)>;
    /// Whether a session of `source` is open in the project now.
    fn is_open(&self, uid: &str, source: &'static str) -> bool;
}

/// Signals other than the inspection: when someone last used berth to run something.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Touches {
    /// The last `berth exec` in the project.
    pub exec: Option<DateTime<Utc>>,
    /// The last workspace tool call.
    pub tool: Option<DateTime<Utc>>,
    /// The last request through the preview listener or `berth port-forward`.
    pub preview: Option<DateTime<Utc>>,
    /// The last use of the IDE (`berth ide`, a request to the IDE host).
    pub ide: Option<DateTime<Utc>>,
}

/// Everything one activity update looks at.
#[derive(Debug, Clone, Copy)]
pub struct ActivityInputs<'a> {
    pub now: DateTime<Utc>,
    /// `status.activity` as it stands.
    pub previous_status: Option<&'a ActivityStatus>,
    /// The previous inspection of this project, if this process made one.
    pub previous: Option<&'a Inspection>,
    /// This pass's inspection; `None` when it failed (then only exec and tool can show activity).
    pub current: Option<&'a Inspection>,
    pub touches: Touches,
    pub cpu_threshold: Duration,
}

/// The new `status.activity`.
pub fn update_activity(inputs: &ActivityInputs<'_>) -> ActivityStatus {
    let previous_status = inputs.previous_status.cloned().unwrap_or_default();
    let last = previous_status.last_active_at;
    let mut candidates: Vec<(DateTime<Utc>, ActivitySource)> = Vec::new();
    if let Some(current) = inputs.current {
        if let Some(at) = agent_activity(inputs.previous, current, last) {
            candidates.push((at, ActivitySource::Agent));
        }
        if let Some(previous) = inputs.previous
            && current.cpu > previous.cpu + inputs.cpu_threshold
        {
            candidates.push((inputs.now, ActivitySource::Cpu));
        }
        if let Some(at) = files_activity(inputs.previous, current, last, inputs.now) {
            candidates.push((at, ActivitySource::Files));
        }
    }
    candidates.extend(inputs.touches.exec.map(|t| (t, ActivitySource::Exec)));
    candidates.extend(inputs.touches.tool.map(|t| (t, ActivitySource::Tool)));
    candidates.extend(inputs.touches.preview.map(|t| (t, ActivitySource::Preview)));
    candidates.extend(inputs.touches.ide.map(|t| (t, ActivitySource::Ide)));

    // A container clock ahead of the host must not push activity into the future.
    let newest = candidates
        .into_iter()
        .map(|(at, source)| (at.min(inputs.now), source))
        .filter(|(at, _)| last.is_none_or(|last| *at > last))
        .max_by_key(|(at, _)| *at);
    let (last_active_at, source) = match newest {
        Some((at, source)) => (Some(at), Some(source)),
        None => (last, previous_status.source),
    };
    ActivityStatus {
        last_active_at,
        source,
        inspected_at: if inputs.current.is_some() {
            Some(inputs.now)
        } else {
            previous_status.inspected_at
        },
    }
}

/// A file under /workspace changed after the activity recorded last: judged against status,
/// not against the previous inspection, so that the activity pass and the re-check before
/// acting (which has only status to go on) always agree. A time ahead of the host's clock
/// counts as now, and only when it is new: otherwise one future-dated file would look like
/// activity in every pass.
pub fn files_activity(
    previous: Option<&Inspection>,
    current: &Inspection,
    last: Option<DateTime<Utc>>,
    now: DateTime<Utc>,
) -> Option<DateTime<Utc>> {
    let newest = current.newest_mtime?;
    if newest > now && previous.is_some_and(|p| p.newest_mtime == Some(newest)) {
        return None;
    }
    let at = newest.min(now);
    last.is_none_or(|last| at > last).then_some(at)
}

/// The agent counts as active when it updated its status file while working.
fn agent_activity(
    previous: Option<&Inspection>,
    current: &Inspection,
    last: Option<DateTime<Utc>>,
) -> Option<DateTime<Utc>> {
    let report = current.agent.as_ref()?;
    if report.state != AgentState::Working {
        return None;
    }
    let updated = report.updated_at?;
    let before = match previous.and_then(|p| p.agent.as_ref()) {
        Some(prior) => prior.updated_at,
        None => last,
    };
    before.is_none_or(|b| updated > b).then_some(updated)
}

/// Strips control characters and keeps at most [`MAX_TEXT_CHARS`] characters of untrusted text.
pub fn sanitize(text: &str) -> String {
    text.chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect::<String>()
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .chars()
        .take(MAX_TEXT_CHARS)
        .collect()
}

/// The title to record: the agent's, sanitised, only when status has none yet (it is recorded
/// once and never rewritten).
pub fn title_to_record(existing: Option<&str>, report: Option<&AgentReport>) -> Option<String> {
    if existing.is_some_and(|t| !t.is_empty()) {
        return None;
    }
    let title = sanitize(report?.title.as_deref()?);
    (!title.is_empty()).then_some(title)
}

/// `status.agent` from the agent's report.
pub fn agent_status(report: &AgentReport) -> AgentStatus {
    AgentStatus {
        state: report.state,
        message: report.message.as_deref().map(sanitize).unwrap_or_default(),
        brief_id: report.brief_id.as_deref().map(sanitize),
        updated_at: report.updated_at,
        session_id: report.session_id.as_deref().map(sanitize),
        exit_code: report.exit_code,
    }
}

#[cfg(test)]
#[path = "activity_tests.rs"]
mod tests;
