//! When a person last did something in a project through berth (`berth exec`), kept in memory
//! for the scheduler's activity pass: berth never writes spec or metadata to record it.

use std::collections::HashMap;
use std::sync::Mutex;

use chrono::{DateTime, Utc};

/// The last activity per project uid, with what caused it.
#[derive(Debug, Default)]
pub struct ActivityLog {
    last: Mutex<HashMap<String, Activity>>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Activity {
    pub at: DateTime<Utc>,
    /// The `status.activity.source` it counts as: `exec` or `tool`.
    pub source: &'static str,
}

impl ActivityLog {
    /// Records activity of `source` in the project `uid` now; an earlier time never replaces a
    /// later one.
    pub fn record(&self, uid: &str, source: &'static str) {
        self.record_at(uid, source, Utc::now());
    }

    pub fn record_at(&self, uid: &str, source: &'static str, at: DateTime<Utc>) {
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        let entry = last
            .entry(uid.to_string())
            .or_insert(Activity { at, source });
        if at >= entry.at {
            *entry = Activity { at, source };
        }
    }

    /// The project's last recorded activity, if any since the daemon started.
    pub fn last(&self, uid: &str) -> Option<Activity> {
        self.last
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(uid)
            .cloned()
    }

    /// Forgets a deleted project.
    pub fn forget(&self, uid: &str) {
        self.last
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(uid);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn later_activity_wins_and_projects_are_apart() {
        let log = ActivityLog::default();
        let early = Utc::now() - chrono::Duration::minutes(5);
        let late = Utc::now();
        log.record_at("a", "exec", late);
        log.record_at("a", "tool", early);
        assert_eq!(
            log.last("a").map(|a| (a.at, a.source)),
            Some((late, "exec"))
        );
        assert_eq!(log.last("b"), None);
        log.forget("a");
        assert_eq!(log.last("a"), None);
    }
}
