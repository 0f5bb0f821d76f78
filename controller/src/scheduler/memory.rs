//! What the scheduler remembers between passes, per project, in this process only: the last
//! inspection (activity compares two), the action the last pass found due (reaping needs two
//! passes that agree), and when a held deletion was last re-inspected.
//!
//! Forgetting is always safe: after a restart the first pass can only find a project due, never
//! act on it, and activity falls back to the times recorded in status.

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use berth_api::ReapAction;
use tokio::time::Instant;

use super::inspect::Inspection;
use super::policy::Verdict;

#[derive(Debug, Default)]
struct Entry {
    inspection: Option<Inspection>,
    previous_due: Option<ReapAction>,
    held_inspected_at: Option<Instant>,
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

    /// Whether a deletion held by a protection is due for its re-inspection (every `every`, not
    /// every pass); when it is, the time is recorded.
    pub fn held_recheck_due(&mut self, uid: &str, now: Instant, every: Duration) -> bool {
        let entry = self.entries.entry(uid.to_string()).or_default();
        let due = entry
            .held_inspected_at
            .is_none_or(|at| now.duration_since(at) >= every);
        if due {
            entry.held_inspected_at = Some(now);
        }
        due
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
    async fn held_deletions_are_rechecked_every_few_minutes() {
        let mut memory = Memory::new();
        let every = Duration::from_secs(300);
        let start = Instant::now();
        assert!(memory.held_recheck_due("u1", start, every));
        assert!(!memory.held_recheck_due("u1", start + Duration::from_secs(30), every));
        assert!(!memory.held_recheck_due("u1", start + Duration::from_secs(299), every));
        assert!(memory.held_recheck_due("u1", start + Duration::from_secs(300), every));
        assert!(memory.held_recheck_due("u2", start + Duration::from_secs(301), every));
        memory.retain(&["u2".to_string()].into());
        assert_eq!(memory.len(), 1);
        assert!(memory.held_recheck_due("u1", start + Duration::from_secs(302), every));
    }
}
