//! What the scheduler remembers between passes, per project, in this process only: the last
//! inspection (activity compares two), the action the last pass found due (reaping needs two
//! passes that agree), when a stopped project was last booted to be inspected, and which
//! episodes (a failing inspection, a refusal) were already reported.
//!
//! Forgetting is always safe: after a restart the first pass can only find a project due, never
//! act on it, activity falls back to the times recorded in status, a stopped project is looked
//! at once more, and an ongoing episode is reported once more.

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use berth_api::{ProtectionReason, ReapAction};
use tokio::time::Instant;

use super::policy::Verdict;
use crate::workspace::inspect::Inspection;

#[derive(Debug, Default)]
struct Entry {
    inspection: Option<Inspection>,
    previous_due: Option<ReapAction>,
    /// When the project was last inspected while stopped; cleared when it is seen running.
    looked_while_stopped_at: Option<Instant>,
    /// The last inspection failed (its warning was logged).
    inspection_failing: bool,
    /// The reasons of the refusal going on, already counted in `reap_refusals_total`.
    refused: Vec<ProtectionReason>,
}

/// Per-project memory, keyed by project uid (a re-created project of the same name starts
/// afresh).
#[derive(Debug, Default)]
pub struct Memory {
    entries: HashMap<String, Entry>,
}

impl Memory {
    pub fn new() -> Memory {
        Memory::default()
    }

    /// The previous successful inspection, for [`super::activity::ActivityInputs::previous`].
    pub fn previous_inspection(&self, uid: &str) -> Option<&Inspection> {
        self.entries.get(uid)?.inspection.as_ref()
    }

    /// Keeps this pass's inspection for the next; a failed inspection keeps the last good one.
    pub fn record_inspection(&mut self, uid: &str, inspection: Inspection) {
        self.entries.entry(uid.to_string()).or_default().inspection = Some(inspection);
    }

    /// For [`super::policy::ReapSubject::previous_due`].
    pub fn previous_due(&self, uid: &str) -> Option<ReapAction> {
        self.entries.get(uid)?.previous_due
    }

    /// Records what this pass found due (nothing, when it kept or refused).
    pub fn record_verdict(&mut self, uid: &str, verdict: &Verdict) {
        self.entries
            .entry(uid.to_string())
            .or_default()
            .previous_due = verdict.due_action();
    }

    /// After acting (or failing to), the next pass starts the two-pass agreement over.
    pub fn forget_due(&mut self, uid: &str) {
        if let Some(entry) = self.entries.get_mut(uid) {
            entry.previous_due = None;
        }
    }

    /// The project was inspected while stopped, at `now`.
    pub fn looked_while_stopped(&mut self, uid: &str, now: Instant) {
        self.entries
            .entry(uid.to_string())
            .or_default()
            .looked_while_stopped_at = Some(now);
    }

    /// The project runs: what a stopped inspection found may change from now on.
    pub fn saw_running(&mut self, uid: &str) {
        if let Some(entry) = self.entries.get_mut(uid) {
            entry.looked_while_stopped_at = None;
        }
    }

    /// Whether a stopped project is due for another look: never looked at since it stopped, or
    /// not for `every`. Nothing changes a stopped workspace, so looking more often only costs a
    /// boot.
    pub fn stopped_look_due(&self, uid: &str, now: Instant, every: Duration) -> bool {
        self.entries
            .get(uid)
            .and_then(|e| e.looked_while_stopped_at)
            .is_none_or(|at| now.duration_since(at) >= every)
    }

    /// Records whether this inspection failed; true when a failure follows a success (or is the
    /// first inspection), so that one episode is reported once.
    pub fn inspection_failed(&mut self, uid: &str, failed: bool) -> bool {
        let entry = self.entries.entry(uid.to_string()).or_default();
        let begins = failed && !entry.inspection_failing;
        entry.inspection_failing = failed;
        begins
    }

    /// A due action was declined for `reasons`: returns those not already declining it in this
    /// episode, to be counted once each.
    pub fn refused(&mut self, uid: &str, reasons: &[ProtectionReason]) -> Vec<ProtectionReason> {
        let entry = self.entries.entry(uid.to_string()).or_default();
        let new = reasons
            .iter()
            .filter(|r| !entry.refused.contains(r))
            .copied()
            .collect();
        entry.refused = reasons.to_vec();
        new
    }

    /// Nothing was declined this pass: the refusal episode, if any, is over.
    pub fn not_refused(&mut self, uid: &str) {
        if let Some(entry) = self.entries.get_mut(uid) {
            entry.refused.clear();
        }
    }

    /// Drops every project not in `live` (deleted since).
    pub fn retain(&mut self, live: &BTreeSet<String>) {
        self.entries.retain(|uid, _| live.contains(uid));
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduler::policy::Decision;

    fn verdict(decision: Decision) -> Verdict {
        Verdict {
            decision,
            protected_by: Vec::new(),
            next_action: None,
            next_action_at: None,
        }
    }

    #[test]
    fn due_actions_are_remembered_until_refused_or_acted_on() {
        let mut memory = Memory::new();
        assert_eq!(memory.previous_due("u1"), None);
        memory.record_verdict(
            "u1",
            &verdict(Decision::Due {
                action: ReapAction::Stop,
            }),
        );
        assert_eq!(memory.previous_due("u1"), Some(ReapAction::Stop));
        memory.record_verdict(
            "u1",
            &verdict(Decision::Refuse {
                action: ReapAction::Stop,
                reasons: vec![berth_api::ProtectionReason::UnsavedWork],
            }),
        );
        assert_eq!(memory.previous_due("u1"), None);
        memory.record_verdict(
            "u1",
            &verdict(Decision::Act {
                action: ReapAction::Delete,
            }),
        );
        memory.forget_due("u1");
        assert_eq!(memory.previous_due("u1"), None);
    }

    #[tokio::test(start_paused = true)]
    async fn stopped_projects_are_looked_at_every_few_minutes_and_afresh_after_running() {
        let mut memory = Memory::new();
        let every = Duration::from_secs(300);
        let start = Instant::now();
        assert!(
            memory.stopped_look_due("u1", start, every),
            "never looked at"
        );
        memory.looked_while_stopped("u1", start);
        assert!(!memory.stopped_look_due("u1", start + Duration::from_secs(30), every));
        assert!(!memory.stopped_look_due("u1", start + Duration::from_secs(299), every));
        assert!(memory.stopped_look_due("u1", start + Duration::from_secs(300), every));
        assert!(memory.stopped_look_due("u2", start, every));
        memory.saw_running("u1");
        assert!(memory.stopped_look_due("u1", start + Duration::from_secs(1), every));
        memory.looked_while_stopped("u2", start);
        memory.retain(&["u1".to_string()].into());
        assert_eq!(memory.len(), 1);
        assert!(memory.stopped_look_due("u2", start + Duration::from_secs(1), every));
    }

    #[test]
    fn a_failing_inspection_is_reported_when_it_begins() {
        let mut memory = Memory::new();
        assert!(memory.inspection_failed("u1", true));
        assert!(!memory.inspection_failed("u1", true));
        assert!(!memory.inspection_failed("u1", false));
        assert!(memory.inspection_failed("u1", true));
    }

    #[test]
    fn a_refusal_counts_each_reason_once_per_episode() {
        use ProtectionReason::*;
        let mut memory = Memory::new();
        assert_eq!(memory.refused("u1", &[UnsavedWork]), vec![UnsavedWork]);
        assert_eq!(memory.refused("u1", &[UnsavedWork]), vec![]);
        assert_eq!(
            memory.refused("u1", &[AgentBlocked, UnsavedWork]),
            vec![AgentBlocked]
        );
        assert_eq!(memory.refused("u1", &[AgentBlocked]), vec![]);
        assert_eq!(
            memory.refused("u1", &[AgentBlocked, UnsavedWork]),
            vec![UnsavedWork]
        );
        memory.not_refused("u1");
        assert_eq!(memory.refused("u1", &[AgentBlocked]), vec![AgentBlocked]);
    }
}
