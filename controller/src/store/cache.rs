//! The objects in memory: reads, the change feed, the resourceVersion counter, and the uid and
//! displayName indexes kept in step with every change.

use std::collections::HashMap;
use std::sync::Arc;

use berth_api::Kind;
use tokio::sync::broadcast;

use super::{Action, Change, Inner, Store, StoreError, StoredObject};

/// A small set of names, kept sorted: a project's members, the projects holding a display name.
/// Nearly always one name, which a `BTreeSet` would keep in a node of eleven (about 300 bytes):
/// at 100,000 projects the two indexes were 60 MB of mostly empty nodes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct Names(Vec<String>);

impl Names {
    /// Adds `name`; false when it was there already.
    pub(super) fn insert(&mut self, name: String) -> bool {
        match self.0.binary_search(&name) {
            Ok(_) => false,
            Err(at) => {
                // Room for exactly one more: most sets stay at one name.
                self.0.reserve_exact(1);
                self.0.insert(at, name);
                true
            }
        }
    }

    /// Removes `name`; false when it was not there.
    pub(super) fn remove(&mut self, name: &str) -> bool {
        match self.position(name) {
            Some(at) => {
                self.0.remove(at);
                true
            }
            None => false,
        }
    }

    pub(super) fn contains(&self, name: &str) -> bool {
        self.position(name).is_some()
    }

    pub(super) fn first(&self) -> Option<&String> {
        self.0.first()
    }

    pub(super) fn iter(&self) -> std::slice::Iter<'_, String> {
        self.0.iter()
    }

    pub(super) fn len(&self) -> usize {
        self.0.len()
    }

    pub(super) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    fn position(&self, name: &str) -> Option<usize> {
        self.0.binary_search_by(|held| held.as_str().cmp(name)).ok()
    }
}

impl Store {
    /// Every committed write from now on, in resourceVersion order.
    pub fn subscribe(&self) -> broadcast::Receiver<Change> {
        self.changes.subscribe()
    }

    /// Subscribes and lists `kind` at one instant, so a watcher misses nothing and sees nothing
    /// twice: every change on the receiver is newer than the returned resourceVersion.
    pub fn list_and_subscribe(
        &self,
        kind: Kind,
    ) -> (Vec<Arc<StoredObject>>, u64, broadcast::Receiver<Change>) {
        let inner = self.lock();
        let receiver = self.changes.subscribe();
        (inner.list(kind), inner.resource_version, receiver)
    }

    /// The resourceVersion of the latest write.
    pub fn resource_version(&self) -> u64 {
        self.lock().resource_version
    }

    pub fn get(&self, kind: Kind, name: &str) -> Option<Arc<StoredObject>> {
        self.lock().get(kind, name)
    }

    /// Every object of `kind`, by name.
    pub fn list(&self, kind: Kind) -> Vec<Arc<StoredObject>> {
        self.lock().list(kind)
    }

    /// The object with this uid, whatever its kind.
    pub fn get_by_uid(&self, uid: &str) -> Option<Arc<StoredObject>> {
        let inner = self.lock();
        let (kind, name) = inner.uids.get(uid)?;
        inner.get(*kind, name)
    }

    /// The Project whose normalised displayName is `display_name`, if any.
    pub fn project_with_display_name(&self, display_name: &str) -> Option<String> {
        self.lock()
            .display_names
            .get(&berth_api::display_name_key(display_name))
            .and_then(|holders| holders.first().cloned())
    }
}

impl Inner {
    pub(super) fn get(&self, kind: Kind, name: &str) -> Option<Arc<StoredObject>> {
        self.objects.get(&kind)?.get(name).cloned()
    }

    pub(super) fn list(&self, kind: Kind) -> Vec<Arc<StoredObject>> {
        self.objects
            .get(&kind)
            .map(|objects| objects.values().cloned().collect())
            .unwrap_or_default()
    }

    pub(super) fn next_rv(&mut self) -> u64 {
        self.resource_version += 1;
        self.resource_version
    }

    pub(super) fn existing(
        &self,
        kind: Kind,
        name: &str,
        expected_rv: Option<u64>,
    ) -> Result<Arc<StoredObject>, StoreError> {
        let current = self
            .get(kind, name)
            .ok_or_else(|| StoreError::not_found(kind, name))?;
        check_rv(&current, expected_rv)?;
        Ok(current)
    }

    /// Another project holding the display name of `object`, which was just written.
    pub(super) fn display_name_holder(&self, object: &StoredObject) -> Option<&str> {
        let display = display_name_of(object)?;
        // A write that removed the object holds nothing.
        self.get(object.kind, object.name())?;
        self.display_names
            .get(&display)?
            .iter()
            .find(|holder| *holder != object.name())
            .map(String::as_str)
    }

    pub(super) fn check_display_name(&self, object: &StoredObject) -> Result<(), StoreError> {
        match self.display_name_holder(object) {
            Some(_) => Err(self.display_name_conflict(object)),
            None => Ok(()),
        }
    }

    /// The index of the first written object whose display name another project holds; of two
    /// in the batch, the later one took it.
    pub(super) fn check_display_names(
        &self,
        written: &[(Arc<StoredObject>, Action)],
    ) -> Result<(), usize> {
        let position: HashMap<&str, usize> = written
            .iter()
            .enumerate()
            .map(|(index, (object, _))| (object.name(), index))
            .collect();
        for (index, (object, action)) in written.iter().enumerate() {
            let Some(display) = display_name_of(object) else {
                continue;
            };
            if *action == Action::Unchanged || self.get(object.kind, object.name()).is_none() {
                continue;
            }
            let taken = self.display_names.get(&display).is_some_and(|holders| {
                holders.iter().any(|holder| {
                    holder != object.name()
                        && position.get(holder.as_str()).is_none_or(|at| *at < index)
                })
            });
            if taken {
                return Err(index);
            }
        }
        Ok(())
    }

    /// The refusal of a display name another project holds. It names no project: the writer
    /// may not be allowed to know the other one exists.
    pub(super) fn display_name_conflict(&self, object: &StoredObject) -> StoreError {
        StoreError::conflict(
            object.kind,
            object.name(),
            format!(
                "spec.displayName: {:?} is already the display name of another project",
                object
                    .spec
                    .get_str("displayName")
                    .as_deref()
                    .unwrap_or(object.name())
                    .trim()
            ),
        )
    }

    /// The one place memory changes, keeping the displayName index in step.
    pub(super) fn set(
        &mut self,
        kind: Kind,
        name: &str,
        object: Option<Arc<StoredObject>>,
    ) -> Option<Arc<StoredObject>> {
        let objects = self.objects.entry(kind).or_default();
        let previous = match &object {
            Some(object) => objects.insert(name.to_string(), Arc::clone(object)),
            None => objects.remove(name),
        };
        // A write that keeps the spec (a status write, most often) keeps the display name.
        let same_spec = matches!((&previous, &object), (Some(p), Some(o)) if p.spec == o.spec);
        if !same_spec {
            if let Some(display) = previous.as_deref().and_then(display_name_of)
                && let Some(holders) = self.display_names.get_mut(&display)
            {
                holders.remove(name);
                if holders.is_empty() {
                    self.display_names.remove(&display);
                }
            }
            if let Some(display) = object.as_deref().and_then(display_name_of) {
                self.display_names
                    .entry(display)
                    .or_default()
                    .insert(name.to_string());
            }
        }
        if let Some(previous) = &previous {
            self.uids.remove(previous.uid());
        }
        if let Some(object) = &object {
            self.uids
                .insert(object.uid().to_string(), (kind, name.to_string()));
        }
        previous
    }
}

pub(super) fn display_name_of(object: &StoredObject) -> Option<String> {
    if object.kind != Kind::Project {
        return None;
    }
    let display = object
        .spec
        .get_str("displayName")
        .filter(|d| !d.trim().is_empty());
    Some(berth_api::display_name_key(
        display.as_deref().unwrap_or(object.name()),
    ))
}

pub(super) fn check_rv(current: &StoredObject, expected_rv: Option<u64>) -> Result<(), StoreError> {
    match expected_rv {
        Some(expected) if expected != current.resource_version() => Err(StoreError::conflict(
            current.kind,
            current.name(),
            format!(
                "{} {:?} was modified (resourceVersion {} is stale, now {}); read it again and retry",
                current.kind,
                current.name(),
                expected,
                current.resource_version()
            ),
        )),
        _ => Ok(()),
    }
}
