//! What one resync pass read from LXD in a single list call, handed to the reconciles that pass
//! requests so they do not each read their container again.
//!
//! An entry is taken at most once: the reconcile that takes it acts on it, and any later
//! reconcile (after a step, an event, an error) reads the container afresh. An LXD event about
//! an instance drops its entry, and the whole snapshot expires after one resync interval.
//!
//! Entries wait as compact JSON rather than as decoded instances: a pass over a large fleet
//! holds every container's config and devices until each reconcile takes its own, and decoded
//! maps cost several times their text.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use crate::runtime::Instance;

#[derive(Debug, Default)]
struct Inner {
    taken_at: Option<Instant>,
    /// Per project name: the container the list showed (as JSON), or `None` when it lacked one.
    instances: HashMap<String, Option<Box<[u8]>>>,
    /// Image alias → fingerprint, resolved at most once per pass.
    images: HashMap<String, Option<String>>,
    /// When an event last spoke of an instance: a list that started before it is stale for it.
    events: HashMap<String, Instant>,
}

#[derive(Debug, Default)]
pub struct Snapshot {
    inner: Mutex<Inner>,
}

impl Snapshot {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Replaces the snapshot with a list whose call started at `listed_at`: `projects` are the
    /// names to hold entries for. A name an event spoke of since `listed_at` gets no entry.
    pub fn replace<'a>(
        &self,
        projects: impl IntoIterator<Item = &'a str>,
        listed: Vec<Instance>,
        listed_at: Instant,
    ) {
        let mut inner = self.lock();
        inner.events.retain(|_, at| *at >= listed_at);
        let mut instances: HashMap<String, Option<Box<[u8]>>> = projects
            .into_iter()
            .filter(|name| !inner.events.contains_key(*name))
            .map(|name| (name.to_string(), None))
            .collect();
        for instance in listed {
            if !instances.contains_key(&instance.name) {
                continue;
            }
            match serde_json::to_vec(&instance) {
                Ok(json) => instances.insert(instance.name, Some(json.into_boxed_slice())),
                // No entry rather than a wrong "absent": the reconcile reads it itself.
                Err(_) => instances.remove(&instance.name),
            };
        }
        instances.shrink_to_fit();
        inner.taken_at = Some(listed_at);
        inner.instances = instances;
        inner.images = HashMap::new();
    }

    /// Takes the entry for `name` if the snapshot is younger than `max_age`: `Some(observed)`
    /// when the list answered for it, `None` when the caller must read the container itself.
    pub fn take(&self, name: &str, max_age: Duration) -> Option<Option<Instance>> {
        let mut inner = self.lock();
        if inner.taken_at.is_none_or(|at| at.elapsed() > max_age) {
            return None;
        }
        let entry = inner.instances.remove(name)?;
        drop(inner);
        match entry {
            None => Some(None),
            Some(json) => serde_json::from_slice(&json).ok().map(Some),
        }
    }

    /// How long ago the list in this snapshot was started; `None` before the first.
    pub fn age(&self) -> Option<Duration> {
        self.lock().taken_at.map(|at| at.elapsed())
    }

    /// Something happened to the instance: its entry is stale, and so is the entry of a list
    /// still in flight.
    pub fn forget(&self, name: &str) {
        let mut inner = self.lock();
        inner.instances.remove(name);
        inner.events.insert(name.to_string(), Instant::now());
    }

    /// The fingerprint resolved for `alias` in this pass, if any was.
    pub fn image(&self, alias: &str) -> Option<Option<String>> {
        self.lock().images.get(alias).cloned()
    }

    pub fn remember_image(&self, alias: &str, fingerprint: Option<String>) {
        self.lock().images.insert(alias.to_string(), fingerprint);
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn instance(name: &str) -> Instance {
        Instance::running(name, BTreeMap::new())
    }

    #[tokio::test(start_paused = true)]
    async fn entries_are_taken_once_and_expire() {
        let snapshot = Snapshot::default();
        snapshot.replace(
            ["a", "b", "c"],
            vec![instance("a"), instance("b")],
            Instant::now(),
        );
        let max_age = Duration::from_secs(30);
        assert_eq!(
            snapshot.take("a", max_age).map(|i| i.map(|i| i.name)),
            Some(Some("a".to_string()))
        );
        assert_eq!(snapshot.take("a", max_age), None, "taken once");
        assert_eq!(snapshot.take("c", max_age), Some(None), "listed as absent");
        snapshot.forget("b");
        assert_eq!(snapshot.take("b", max_age), None);

        snapshot.replace(["a"], vec![instance("a")], Instant::now());
        tokio::time::advance(Duration::from_secs(31)).await;
        assert_eq!(snapshot.take("a", max_age), None, "expired");

        // An event during the list call makes that instance's entry stale.
        let listed_at = Instant::now();
        tokio::time::advance(Duration::from_millis(10)).await;
        snapshot.forget("a");
        snapshot.replace(["a", "b"], vec![instance("a"), instance("b")], listed_at);
        assert_eq!(snapshot.take("a", max_age), None);
        assert!(snapshot.take("b", max_age).is_some());
    }
}
