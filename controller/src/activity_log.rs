//! When a person last did something in a project through berth (`berth exec`, a tool call), and which
//! interactive sessions are open there now, kept in memory for the scheduler's activity pass:
//! berth never writes spec or metadata to record it.
//!
//! An exec, an upgraded preview or port-forward connection, or an IDE connection still open counts
//! as activity now, at every activity pass, until it ends.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use chrono::{DateTime, Utc};

/// The last activity per project uid, with what caused it, and the sessions open now.
#[derive(Debug, Default)]
pub struct ActivityLog {
    last: Mutex<HashMap<String, Activity>>,
    /// Sessions open now (`exec -it`), counted per project uid and source.
    open: Mutex<HashMap<(String, &'static str), usize>>,
}

/// A session a person holds open in a project (an interactive exec): activity for as long as it
/// is held, not only when it starts, so nobody's open shell is idled under them. Dropping it
/// closes the session, and its end counts as activity too.
#[derive(Debug)]
#[must_use = "the session counts as activity only while this is held"]
pub struct OpenSession {
    log: Arc<ActivityLog>,
    uid: String,
    source: &'static str,
}

impl Drop for OpenSession {
    fn drop(&mut self) {
        let key = (std::mem::take(&mut self.uid), self.source);
        let was_open = {
            let mut open = self.log.open.lock().unwrap_or_else(|e| e.into_inner());
            match open.get_mut(&key) {
                Some(count) if *count > 1 => {
                    *count -= 1;
                    true
                }
                Some(_) => open.remove(&key).is_some(),
                // Forgotten meanwhile: the project is gone.
                None => false,
            }
        };
        if was_open {
            self.log.record(&key.0, key.1);
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Activity {
    pub at: DateTime<Utc>,
    /// The `status.activity.source` it counts as: `exec` or `tool`.
    pub source: &'static str,
}

impl crate::scheduler::activity::PeopleActivity for ActivityLog {
    fn last(&self, uid: &str) -> Option<(DateTime<Utc>, &'static str)> {
        ActivityLog::last(self, uid).map(|a| (a.at, a.source))
    }

    fn is_open(&self, uid: &str, source: &'static str) -> bool {
        ActivityLog::is_open(self, uid, source)
    }
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

    /// Records activity of `source` now and holds it open until the returned session drops.
    pub fn open(self: &Arc<Self>, uid: &str, source: &'static str) -> OpenSession {
        self.record(uid, source);
        *self
            .open
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry((uid.to_string(), source))
            .or_insert(0) += 1;
        OpenSession {
            log: Arc::clone(self),
            uid: uid.to_string(),
            source,
        }
    }

    /// Whether a session of `source` is open in the project `uid` now.
    pub fn is_open(&self, uid: &str, source: &'static str) -> bool {
        self.open
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains_key(&(uid.to_string(), source))
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
        self.open
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|(open, _), _| open != uid);
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

    #[test]
    fn an_open_session_is_activity_until_it_closes_and_its_end_is_recorded() {
        let log = Arc::new(ActivityLog::default());
        let first = log.open("a", "exec");
        let opened_at = log.last("a").unwrap().at;
        let second = log.open("a", "exec");
        assert!(log.is_open("a", "exec"));
        assert!(!log.is_open("a", "tool") && !log.is_open("b", "exec"));
        drop(first);
        assert!(
            log.is_open("a", "exec"),
            "one of two sessions is still open"
        );
        drop(second);
        assert!(!log.is_open("a", "exec"));
        let closed = log.last("a").unwrap();
        assert_eq!(closed.source, "exec");
        assert!(closed.at >= opened_at);

        // A project forgotten while a session is open stays forgotten when it closes.
        let session = log.open("c", "exec");
        log.forget("c");
        assert!(!log.is_open("c", "exec"));
        drop(session);
        assert_eq!(log.last("c"), None);
    }
}
