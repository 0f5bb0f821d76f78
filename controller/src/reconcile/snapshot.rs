//! What one resync pass read from LXD in a single list call, handed to the reconciles that pass
//! requests so they do not each read their container again.
//!
//! An entry is taken at most once: the reconcile that takes it acts on it, and any later
//! reconcile (after a step, an event, an error) reads the container afresh. An LXD event about
//! an instance drops its entry, and the whole snapshot expires after one resync interval.
//!
//! The list names every instance LXD had, whoever owns it. When it was made while LXD's event
//! stream was followed, a name it lacked, and that no event has spoken of since, is a name LXD
//! has no instance of: a project applied after the list is created without a read of its own
//! (the informer's rule: a list, then the events since it). A broken stream voids all of it.
//!
//! Entries wait as compact JSON rather than as decoded instances: a pass over a large fleet
//! holds every container's config and devices until each reconcile takes its own, and decoded
//! maps cost several times their text.
//!
//! The list also answers housekeeping's question ([`Strays`]): which containers carry a project
//! uid the store did not know when it was made. Housekeeping takes that from the last list
//! rather than listing the fleet again: one list per interval, whoever needs it.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use crate::layout::uid_label;
use crate::runtime::Instance;

#[derive(Debug, Default)]
struct Inner {
    taken_at: Option<Instant>,
    /// Per project name: the container the list showed (as JSON), or `None` when it lacked one.
    instances: HashMap<String, Option<Box<[u8]>>>,
    /// Every instance name the list showed, when it started after the event stream was
    /// followed: a name outside it (and outside `events`) had no instance. `None` otherwise.
    listed: Option<HashSet<Box<str>>>,
    /// Image alias → fingerprint, resolved at most once per pass while events are followed.
    images: HashMap<String, Option<String>>,
    /// When an event last spoke of an image or alias: a resolution asked before it is stale.
    images_changed_at: Option<Instant>,
    /// Names this snapshot answered absent for (an entry or by omission): answered once, as
    /// every entry is taken once.
    taken: HashSet<String>,
    /// When an event last spoke of an instance: a list that started before it is stale for it.
    events: HashMap<String, Instant>,
    /// Since when LXD's event stream has been followed without a break; `None` while it is not.
    following_since: Option<Instant>,
    /// When the stream last broke: a list started before it may have missed what came after.
    lost_at: Option<Instant>,
    /// What the last list showed of containers whose project the store did not know.
    strays: Option<Arc<Strays>>,
}

/// The containers one list showed carrying berth's project uid label for a uid that no project
/// in the store had, read both before and after the list (a project created or deleted
/// meanwhile has its uid in one of the reads). Usually none: the list's other containers are
/// not kept.
#[derive(Debug)]
pub struct Strays {
    pub instances: Vec<Instance>,
    /// When the list call started.
    pub listed_at: Instant,
}

impl Strays {
    /// The labelled containers of `listed` whose uid is not `known`.
    pub fn of(listed: &[Instance], known: impl Fn(&str) -> bool, listed_at: Instant) -> Strays {
        let instances = listed
            .iter()
            .filter(|instance| uid_label(&instance.config).is_some_and(|uid| !known(uid)))
            .cloned()
            .collect();
        Strays {
            instances,
            listed_at,
        }
    }
}

impl Inner {
    fn clear(&mut self) {
        self.taken_at = None;
        self.instances = HashMap::new();
        self.listed = None;
        self.taken = HashSet::new();
        self.images = HashMap::new();
    }
}

#[derive(Debug, Default)]
pub struct Snapshot {
    inner: Mutex<Inner>,
    /// Held for a whole list-and-replace, so that passes started together list once.
    listing: tokio::sync::Mutex<()>,
}

impl Snapshot {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Replaces the snapshot with a list whose call started at `listed_at`: `listed` is every
    /// instance LXD had (any owner's), `projects` the names to hold entries for. A name an event
    /// spoke of since `listed_at` gets no entry; a list the event stream broke during is dropped.
    pub fn replace<'a>(
        &self,
        projects: impl IntoIterator<Item = &'a str>,
        listed: Vec<Instance>,
        listed_at: Instant,
    ) {
        let mut inner = self.lock();
        if inner.lost_at.is_some_and(|at| at >= listed_at) {
            return;
        }
        inner.events.retain(|_, at| *at >= listed_at);
        let complete = inner
            .following_since
            .is_some_and(|since| since <= listed_at);
        inner.listed = complete.then(|| {
            listed
                .iter()
                .map(|instance| Box::from(instance.name.as_str()))
                .collect()
        });
        let mut instances: HashMap<String, Option<Box<[u8]>>> = projects
            .into_iter()
            .filter(|name| !inner.events.contains_key(*name))
            .map(|name| (name.to_string(), None))
            .collect();
        for instance in listed {
            if !instances.contains_key(&instance.name) {
                continue;
            }
            // Not berth's as listed: someone else's, or one on an offline cluster member, which
            // LXD lists without its config. The reconcile reads it and judges.
            if uid_label(&instance.config).is_none() {
                instances.remove(&instance.name);
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
        inner.taken = HashSet::new();
        inner.images = HashMap::new();
    }

    /// Takes the entry for `name` if the snapshot is younger than `max_age`: `Some(observed)`
    /// when the list answered for it (`Some(None)`: no instance of the name, also for a name
    /// the list and the events since never spoke of), `None` when the caller must read the
    /// container itself.
    pub fn take(&self, name: &str, max_age: Duration) -> Option<Option<Instance>> {
        let mut inner = self.lock();
        if inner.taken_at.is_none_or(|at| at.elapsed() > max_age) {
            return None;
        }
        let entry = match inner.instances.remove(name) {
            Some(entry) => entry,
            None if inner.events.contains_key(name) || inner.taken.contains(name) => return None,
            None => match &inner.listed {
                Some(listed) if !listed.contains(name) => None,
                _ => return None,
            },
        };
        if entry.is_none() {
            inner.taken.insert(name.to_string());
        }
        drop(inner);
        match entry {
            None => Some(None),
            Some(json) => serde_json::from_slice(&json).ok().map(Some),
        }
    }

    /// Waits for any list in flight to be replaced into the snapshot and holds off the next
    /// until the guard is dropped.
    pub async fn listing(&self) -> tokio::sync::MutexGuard<'_, ()> {
        self.listing.lock().await
    }

    /// Keeps what the list started at `strays.listed_at` showed of stray containers, unless a
    /// later list's are kept already.
    pub fn keep_strays(&self, strays: Strays) {
        let mut inner = self.lock();
        if inner
            .strays
            .as_ref()
            .is_none_or(|kept| kept.listed_at <= strays.listed_at)
        {
            inner.strays = Some(Arc::new(strays));
        }
    }

    /// The strays of the last list that succeeded; `None` before the first.
    pub fn strays(&self) -> Option<Arc<Strays>> {
        self.lock().strays.clone()
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

    /// LXD's event stream is followed from now on: what was listed before may have changed
    /// unseen, so it is dropped.
    pub fn following_events(&self) {
        let mut inner = self.lock();
        inner.following_since = Some(Instant::now());
        inner.clear();
    }

    /// LXD's event stream broke: nothing listed can be trusted until a list made after it is
    /// followed again.
    pub fn events_lost(&self) {
        let mut inner = self.lock();
        inner.following_since = None;
        inner.lost_at = Some(Instant::now());
        inner.clear();
    }

    /// The fingerprint `alias` resolved to in this pass, if it did and LXD's events have been
    /// followed since (an image event drops it).
    pub fn image(&self, alias: &str) -> Option<Option<String>> {
        let inner = self.lock();
        inner.following_since?;
        inner.images.get(alias).cloned()
    }

    /// Remembers what `alias` resolved to when asked at `asked_at`, unless an image event came
    /// since.
    pub fn remember_image(&self, alias: &str, fingerprint: Option<String>, asked_at: Instant) {
        let mut inner = self.lock();
        if inner.images_changed_at.is_some_and(|at| at >= asked_at) {
            return;
        }
        inner.images.insert(alias.to_string(), fingerprint);
    }

    /// An image or alias changed: every resolution remembered is stale.
    pub fn forget_images(&self) {
        let mut inner = self.lock();
        inner.images = HashMap::new();
        inner.images_changed_at = Some(Instant::now());
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    #[test]
    fn strays_are_the_labelled_containers_of_unknown_uids_and_the_latest_list_wins() {
        const UID: &str = crate::layout::UID_LABEL;
        let listed = [
            Instance::labelled("known", &[(UID, "u1")]),
            Instance::labelled("stray", &[(UID, "u2")]),
            Instance::labelled("someone-elses", &[]),
        ];
        let known = std::collections::BTreeSet::from(["u1".to_string()]);
        let earlier = Instant::now();
        let later = earlier + Duration::from_secs(1);
        let snapshot = Snapshot::default();
        assert!(snapshot.strays().is_none());
        snapshot.keep_strays(Strays::of(&listed, |uid| known.contains(uid), later));
        let names = |s: &Snapshot| -> Vec<String> {
            let strays = s.strays().unwrap();
            strays.instances.iter().map(|i| i.name.clone()).collect()
        };
        assert_eq!(names(&snapshot), ["stray"]);
        // A list that started earlier but finished later does not replace it.
        snapshot.keep_strays(Strays::of(&listed[..1], |uid| known.contains(uid), earlier));
        assert_eq!(names(&snapshot), ["stray"]);
    }

    /// A container of berth's, as the list shows it.
    fn instance(name: &str) -> Instance {
        Instance::labelled(name, &[(crate::layout::UID_LABEL, name)])
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

    #[tokio::test(start_paused = true)]
    async fn a_name_the_list_lacked_is_absent_only_while_events_are_followed() {
        let snapshot = Snapshot::default();
        let max_age = Duration::from_secs(30);
        let listed = || vec![instance("a"), Instance::running("foreign", BTreeMap::new())];

        // A list made before the events were followed cannot speak for names it lacked.
        snapshot.replace(["a"], listed(), Instant::now());
        assert_eq!(snapshot.take("new", max_age), None);

        snapshot.following_events();
        assert_eq!(snapshot.age(), None, "following anew drops what was listed");
        tokio::time::advance(Duration::from_millis(10)).await;
        snapshot.replace(["a"], listed(), Instant::now());
        assert_eq!(
            snapshot.take("new", max_age),
            Some(None),
            "applied after the list"
        );
        assert_eq!(snapshot.take("new", max_age), None, "taken once");
        assert_eq!(
            snapshot.take("foreign", max_age),
            None,
            "a name the list showed is read, whoever holds it"
        );
        // A project's name held by an instance without berth's labels: read, not taken as is.
        snapshot.replace(["foreign"], listed(), Instant::now());
        assert_eq!(snapshot.take("foreign", max_age), None);
        snapshot.forget("created-since");
        assert_eq!(snapshot.take("created-since", max_age), None);

        // An absent entry taken once is not answered again by omission.
        snapshot.replace(["a", "b"], listed(), Instant::now());
        assert_eq!(snapshot.take("b", max_age), Some(None));
        assert_eq!(snapshot.take("b", max_age), None);

        let listed_at = Instant::now();
        tokio::time::advance(Duration::from_millis(10)).await;
        snapshot.events_lost();
        assert_eq!(snapshot.take("a", max_age), None);
        snapshot.replace(["a"], listed(), listed_at);
        assert_eq!(
            snapshot.age(),
            None,
            "a list the break came during is dropped"
        );
        tokio::time::advance(Duration::from_millis(10)).await;
        snapshot.replace(["a"], listed(), Instant::now());
        assert_eq!(
            snapshot.take("other", max_age),
            None,
            "not followed since the break"
        );
        assert!(snapshot.take("a", max_age).is_some());
    }

    #[tokio::test(start_paused = true)]
    async fn an_image_event_drops_what_aliases_resolved_to() {
        let snapshot = Snapshot::default();
        snapshot.remember_image("tiny", Some("old".into()), Instant::now());
        assert_eq!(snapshot.image("tiny"), None, "events not followed");
        snapshot.following_events();
        snapshot.remember_image("tiny", Some("old".into()), Instant::now());
        assert_eq!(snapshot.image("tiny"), Some(Some("old".into())));

        // Asked before the alias moved, answered after: not remembered.
        let asked = Instant::now();
        tokio::time::advance(Duration::from_millis(5)).await;
        snapshot.forget_images();
        assert_eq!(snapshot.image("tiny"), None);
        snapshot.remember_image("tiny", Some("old".into()), asked);
        assert_eq!(snapshot.image("tiny"), None);
        tokio::time::advance(Duration::from_millis(5)).await;
        snapshot.remember_image("tiny", Some("new".into()), Instant::now());
        assert_eq!(snapshot.image("tiny"), Some(Some("new".into())));
    }
}
