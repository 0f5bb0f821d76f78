//! The lifecycle events berth's own calls will cause (what kube's controllers call
//! expectations). LXD announces every change to an instance, berth's too; the reconcile that
//! created or started a container reads it afterwards itself, so the event announcing that
//! change is no reason to run the project's reconcile again. Anything else, and any event
//! nobody expected, still requests one.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long an expected event may take to arrive. An expectation whose call failed without an
/// error (an operation that failed inside LXD) is forgotten after it; until then it could hide
/// the same action by someone else, which the failing project's own retries and the periodic
/// resync still see.
const WINDOW: Duration = Duration::from_secs(60);

/// LXD's lifecycle actions for the changes a reconcile makes and then reads back itself.
pub const CREATED: &str = "instance-created";
pub const STARTED: &str = "instance-started";
pub const RENAMED: &str = "instance-renamed";
pub const UPDATED: &str = "instance-updated";

#[derive(Debug, Default)]
pub struct OwnChanges {
    expected: Mutex<HashMap<String, Vec<(&'static str, Instant)>>>,
}

impl OwnChanges {
    /// Berth is about to change instance `name` in a way LXD announces as `action`.
    pub fn expect(&self, name: &str, action: &'static str) {
        let mut expected = self.lock();
        expected
            .entry(name.to_string())
            .or_default()
            .push((action, Instant::now()));
    }

    /// The call did not change the instance (it failed, or found the change made): LXD will
    /// announce nothing for it.
    pub fn withdraw(&self, name: &str, action: &str) {
        let mut expected = self.lock();
        if let Some(list) = expected.get_mut(name) {
            if let Some(at) = list.iter().position(|(a, _)| *a == action) {
                list.remove(at);
            }
            if list.is_empty() {
                expected.remove(name);
            }
        }
    }

    /// Whether the event `action` on `name` is one berth expected; an expected one is used up.
    pub fn announced(&self, name: &str, action: &str) -> bool {
        let mut expected = self.lock();
        let Some(list) = expected.get_mut(name) else {
            return false;
        };
        list.retain(|(_, at)| at.elapsed() < WINDOW);
        let found = list.iter().position(|(a, _)| *a == action);
        if let Some(at) = found {
            list.remove(at);
        }
        if list.is_empty() {
            expected.remove(name);
        }
        found.is_some()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Vec<(&'static str, Instant)>>> {
        self.expected.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_expected_event_is_used_up_once_and_others_pass() {
        let own = OwnChanges::default();
        own.expect("p", "instance-started");
        assert!(!own.announced("p", "instance-stopped"), "another action");
        assert!(!own.announced("q", "instance-started"), "another instance");
        assert!(own.announced("p", "instance-started"));
        assert!(!own.announced("p", "instance-started"), "a second start");
    }

    #[test]
    fn a_withdrawn_expectation_hides_nothing() {
        let own = OwnChanges::default();
        own.expect("p", "instance-created");
        own.withdraw("p", "instance-created");
        assert!(!own.announced("p", "instance-created"));
        assert!(own.lock().is_empty());
    }
}
