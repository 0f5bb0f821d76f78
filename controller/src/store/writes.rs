//! Spec and metadata writes: the verbs (create, replace, apply, apply_batch, delete, the
//! finalizers and the annotations only the server records), their parameters, and the
//! in-memory transaction (`Pending`) they share, committed to SQLite or undone as one.
//!
//! An apply is written only while each object is as the caller's access was checked (`Expected`),
//! and every write is either kept or a dry run (`Commit::Persist`, `Commit::DryRun`).

use std::collections::BTreeMap;
use std::sync::Arc;

use berth_api::{Kind, ObjectMeta};
use serde_json::Value;

use super::cache::check_rv;
use super::{
    Action, Change, ChangeType, Commit, Deletion, Desired, Doc, Expected, Inner, Store, StoreError,
    StoredObject, now,
};

/// A create's parameters (kube's `PostParams`): kept or a dry run, on whose behalf, and
/// whether it brings a project back from the trash. A bare [`Commit`] is a create on nobody's
/// behalf.
#[derive(Debug, Clone)]
pub struct PostParams<'a> {
    pub commit: Commit,
    /// A Project this write creates has this user as its first member.
    pub creator: Option<&'a str>,
    /// Creates the object as the trash recorded it; fails when the name or the uid is taken.
    pub restore: Option<Restored>,
}

/// A Project as the trash recorded it: created again under `uid` (its own, or a new one when
/// it comes back under another name), with `status` as its first status.
#[derive(Debug, Clone)]
pub struct Restored {
    pub uid: String,
    pub status: Value,
}

impl<'a> PostParams<'a> {
    /// A create on behalf of `creator`.
    pub fn by(creator: &'a str, commit: Commit) -> Self {
        PostParams {
            creator: Some(creator),
            ..commit.into()
        }
    }
}

impl From<Commit> for PostParams<'_> {
    fn from(commit: Commit) -> Self {
        PostParams {
            commit,
            creator: None,
            restore: None,
        }
    }
}

/// An apply's parameters (kube's `PatchParams`): kept or a dry run, and on whose behalf. A bare
/// [`Commit`] is an apply on nobody's behalf.
#[derive(Debug, Clone, Copy)]
pub struct ApplyParams<'a> {
    pub commit: Commit,
    /// Projects the write creates have this user as their first member, and what an applyset
    /// prunes records them as `berth.dev/deletedBy`.
    pub creator: Option<&'a str>,
}

impl<'a> ApplyParams<'a> {
    /// An apply on behalf of `creator`.
    pub fn by(creator: &'a str, commit: Commit) -> Self {
        ApplyParams {
            commit,
            creator: Some(creator),
        }
    }
}

impl From<Commit> for ApplyParams<'_> {
    fn from(commit: Commit) -> Self {
        ApplyParams {
            commit,
            creator: None,
        }
    }
}

/// One object of an apply, with what it must still be when written, if anything (the
/// caller's access was checked against it).
#[derive(Debug, Clone)]
pub struct ApplyItem {
    pub desired: Desired,
    pub expected: Option<Expected>,
}

impl From<Desired> for ApplyItem {
    fn from(desired: Desired) -> Self {
        ApplyItem {
            desired,
            expected: None,
        }
    }
}

impl From<(Desired, Expected)> for ApplyItem {
    fn from((desired, expected): (Desired, Expected)) -> Self {
        ApplyItem {
            desired,
            expected: Some(expected),
        }
    }
}

/// One status write of [`Store::update_statuses`].
#[derive(Debug, Clone, PartialEq)]
pub struct StatusUpdate {
    pub kind: Kind,
    pub name: String,
    pub expected_rv: Option<u64>,
    pub status: Value,
}

/// A batch write failed, at `items[index]` when one item was the cause; nothing of the batch
/// was written.
#[derive(Debug, thiserror::Error)]
#[error("{}{error}", index.map(|i| format!("items[{i}]: ")).unwrap_or_default())]
pub struct BatchFailure {
    pub index: Option<usize>,
    #[source]
    pub error: StoreError,
}

/// The writes a store operation made in memory: committed to SQLite together, or undone
/// together.
pub(super) struct Pending {
    pub(super) rv_before: u64,
    /// Becomes a member of every Project this write creates, in the same transaction, so the
    /// creator's own watch sees the project appear.
    pub(super) creator: Option<String>,
    /// Memberships added in memory, removed again on undo.
    pub(super) member_undo: Vec<(String, String)>,
    pub(super) undo: Vec<(Kind, String, Option<Arc<StoredObject>>)>,
    pub(super) inventory_undo: Vec<(String, Option<Vec<String>>)>,
    pub(super) writes: Vec<Write>,
    pub(super) changes: Vec<Change>,
}

pub(super) enum Write {
    Put(Arc<StoredObject>),
    Remove {
        kind: Kind,
        name: String,
        uid: String,
    },
    Inventory {
        set: String,
        inventory: Vec<String>,
    },
    Member {
        uid: String,
        user: String,
    },
}

pub(super) enum Mode {
    Create,
    /// Create under this uid with this initial status: a project brought back from the trash.
    Restore {
        uid: String,
        status: Value,
    },
    Replace(Option<u64>),
    /// Create or update; with an expectation, only while the object is still as expected.
    Apply(Option<Expected>),
}

impl Store {
    /// Creates the object; 409 when the name is taken. See [`PostParams`] for on whose behalf
    /// and for a project brought back from the trash.
    pub fn create<'a>(
        &self,
        desired: Desired,
        params: impl Into<PostParams<'a>>,
    ) -> Result<Arc<StoredObject>, StoreError> {
        let PostParams {
            commit,
            creator,
            restore,
        } = params.into();
        let mode = match restore {
            Some(Restored { uid, status }) => Mode::Restore { uid, status },
            None => Mode::Create,
        };
        self.write_as(creator, commit, |inner, pending| {
            let (object, _) = inner.upsert(pending, desired, mode)?;
            inner.check_display_name(&object)?;
            Ok(object)
        })
    }

    /// Replaces the user fields of an existing object; `expected_rv` guards against lost updates.
    pub fn replace(
        &self,
        desired: Desired,
        expected_rv: Option<u64>,
        commit: Commit,
    ) -> Result<(Arc<StoredObject>, Action), StoreError> {
        self.write(commit, |inner, pending| {
            let written = inner.upsert(pending, desired, Mode::Replace(expected_rv))?;
            inner.check_display_name(&written.0)?;
            Ok(written)
        })
    }

    /// Creates the object or replaces its user fields: what `berth apply` does for one object.
    /// An item carrying an [`Expected`] is written only while the object is still as expected:
    /// a write allowed against what the caller saw never lands on something else
    /// (`StoreError::Moved`).
    pub fn apply<'a>(
        &self,
        item: impl Into<ApplyItem>,
        params: impl Into<ApplyParams<'a>>,
    ) -> Result<(Arc<StoredObject>, Action), StoreError> {
        let ApplyItem { desired, expected } = item.into();
        let ApplyParams { commit, creator } = params.into();
        self.write_as(creator, commit, |inner, pending| {
            let written = inner.upsert(pending, desired, Mode::Apply(expected))?;
            inner.check_display_name(&written.0)?;
            Ok(written)
        })
    }

    /// Applies every object in one transaction: all of them are written, or none. Display names
    /// must be unique once the whole batch is written, so a batch may swap two.
    pub fn apply_batch<'a, I: Into<ApplyItem>>(
        &self,
        batch: Vec<I>,
        params: impl Into<ApplyParams<'a>>,
    ) -> Result<Vec<(Arc<StoredObject>, Action)>, BatchFailure> {
        let ApplyParams { commit, creator } = params.into();
        let mut failed_at = None;
        self.write_as(creator, commit, |inner, pending| {
            let mut results = Vec::with_capacity(batch.len());
            for (index, item) in batch.into_iter().enumerate() {
                let ApplyItem { desired, expected } = item.into();
                failed_at = Some(index);
                results.push(inner.upsert(pending, desired, Mode::Apply(expected))?);
            }
            failed_at = inner.check_display_names(&results).err();
            match failed_at {
                Some(index) => Err(inner.display_name_conflict(&results[index].0)),
                None => Ok(results),
            }
        })
        .map_err(|error| BatchFailure {
            index: failed_at,
            error,
        })
    }

    /// Writes status, and only status. Unchanged status writes nothing. Only
    /// [`Store::write_status`] calls it: status has one writer.
    pub(super) fn update_status(
        &self,
        kind: Kind,
        name: &str,
        expected_rv: Option<u64>,
        status: Value,
        commit: Commit,
    ) -> Result<Arc<StoredObject>, StoreError> {
        self.write(commit, |inner, pending| {
            inner.set_status(
                pending,
                StatusUpdate {
                    kind,
                    name: name.to_string(),
                    expected_rv,
                    status,
                },
            )
        })
    }

    /// Writes many statuses in one transaction, as a resync pass produces them. Each update
    /// stands alone: a missing object or a stale resourceVersion fails that update only, and an
    /// unchanged status writes nothing.
    #[cfg(test)]
    pub(super) fn update_statuses(
        &self,
        updates: Vec<StatusUpdate>,
    ) -> Result<Vec<Result<Arc<StoredObject>, StoreError>>, StoreError> {
        self.write(Commit::Persist, |inner, pending| {
            Ok(updates
                .into_iter()
                .map(|update| inner.set_status(pending, update))
                .collect())
        })
    }

    /// Sets the finalizers; removing the last one of a deleting object removes the object
    /// (`None` is returned then).
    pub fn set_finalizers(
        &self,
        kind: Kind,
        name: &str,
        expected_rv: Option<u64>,
        finalizers: Vec<String>,
    ) -> Result<Option<Arc<StoredObject>>, StoreError> {
        self.write(Commit::Persist, |inner, pending| {
            let current = inner.existing(kind, name, expected_rv)?;
            let desired = Desired {
                kind,
                name: name.to_string(),
                labels: current.metadata.labels.clone(),
                annotations: current.metadata.annotations.clone(),
                finalizers: Some(finalizers),
                spec: current.spec.value(),
            };
            let (written, _) = inner.upsert(pending, desired, Mode::Replace(expected_rv))?;
            inner.check_display_name(&written)?;
            Ok(inner.get(kind, name))
        })
    }

    /// Deletes the object, or, while finalizers hold it, marks it deleting. `annotations` are
    /// merged onto a held object so the controller can read how it was asked to go (e.g.
    /// `berth.dev/forceDelete`).
    pub fn delete(
        &self,
        kind: Kind,
        name: &str,
        expected_rv: Option<u64>,
        annotations: BTreeMap<String, String>,
        commit: Commit,
    ) -> Result<Deletion, StoreError> {
        self.write(commit, |inner, pending| {
            let current = inner.existing(kind, name, expected_rv)?;
            Ok(inner.delete(pending, current, annotations))
        })
    }

    /// Asks the finalizer for a fresh look at a project being deleted: records `stamp` as its
    /// [`berth_api::annotations::LOOK_REQUESTED_AT`] (a metadata write, so the controller runs).
    /// An object not being deleted is a conflict: this never starts a deletion.
    pub fn request_look(
        &self,
        kind: Kind,
        name: &str,
        stamp: &str,
    ) -> Result<Arc<StoredObject>, StoreError> {
        self.write(Commit::Persist, |inner, pending| {
            let current = inner.existing(kind, name, None)?;
            if current.metadata.deletion_timestamp.is_none() {
                return Err(StoreError::conflict(
                    kind,
                    name,
                    format!("{kind} {name:?} is not being deleted: nothing to look at again"),
                ));
            }
            let annotations = BTreeMap::from([(
                berth_api::annotations::LOOK_REQUESTED_AT.to_string(),
                stamp.to_string(),
            )]);
            Ok(inner.delete(pending, current, annotations).object().clone())
        })
    }

    /// Records on a live Project that a member asked to force its held checkout
    /// ([`berth_api::annotations::FORCE_CHECKOUT`] set to `stamp`; a metadata write, so the
    /// controller runs). 409 while the project is being deleted.
    pub fn request_forced_checkout(
        &self,
        name: &str,
        stamp: &str,
    ) -> Result<Arc<StoredObject>, StoreError> {
        self.annotate_live(
            name,
            &[berth_api::annotations::FORCE_CHECKOUT],
            stamp,
            "nothing to check out",
        )
    }

    /// Records on a live Project that a member asked to replace its container whatever it
    /// holds outside /workspace: [`berth_api::annotations::RECREATE_REQUESTED_AT`] and
    /// [`berth_api::annotations::FORCE_REPLACE`] both set to `stamp`, in one write. 409 while the
    /// project is being deleted.
    pub fn request_forced_replace(
        &self,
        name: &str,
        stamp: &str,
    ) -> Result<Arc<StoredObject>, StoreError> {
        self.annotate_live(
            name,
            &[
                berth_api::annotations::RECREATE_REQUESTED_AT,
                berth_api::annotations::FORCE_REPLACE,
            ],
            stamp,
            "nothing to replace",
        )
    }

    /// Sets each of `keys` to `stamp` on the live Project `name` (a metadata write).
    pub(super) fn annotate_live(
        &self,
        name: &str,
        keys: &[&str],
        stamp: &str,
        when_deleting: &str,
    ) -> Result<Arc<StoredObject>, StoreError> {
        self.write(Commit::Persist, |inner, pending| {
            let current = inner.existing(Kind::Project, name, None)?;
            if current.metadata.deletion_timestamp.is_some() {
                return Err(StoreError::conflict(
                    Kind::Project,
                    name,
                    format!("Project {name:?} is being deleted: {when_deleting}"),
                ));
            }
            let mut next = (*current).clone();
            for key in keys {
                next.metadata
                    .annotations
                    .insert(key.to_string(), stamp.to_string());
            }
            Ok(inner.modified(pending, next, true))
        })
    }

    /// Runs `op` on memory, then commits what it wrote to SQLite in one transaction and
    /// publishes the changes; on any failure (or a dry run) memory is put back as it was.
    pub(super) fn write<T>(
        &self,
        commit: Commit,
        op: impl FnOnce(&mut Inner, &mut Pending) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        self.write_as(None, commit, op)
    }

    /// [`Store::write`] on behalf of `creator`, who becomes a member of the projects it creates.
    pub(super) fn write_as<T>(
        &self,
        creator: Option<&str>,
        commit: Commit,
        op: impl FnOnce(&mut Inner, &mut Pending) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let mut inner = self.lock();
        let mut pending = Pending {
            rv_before: inner.resource_version,
            creator: creator.map(str::to_string),
            member_undo: Vec::new(),
            undo: Vec::new(),
            inventory_undo: Vec::new(),
            writes: Vec::new(),
            changes: Vec::new(),
        };
        let result = op(&mut inner, &mut pending);
        let value = match result {
            Ok(value) if commit == Commit::Persist => value,
            other => {
                inner.undo(pending);
                return other;
            }
        };
        if pending.writes.is_empty() {
            return Ok(value);
        }
        let committed = inner.commit(&pending.writes);
        inner.note_write(&committed);
        if let Err(err) = committed {
            inner.undo(pending);
            return Err(err);
        }
        // What belongs to a project goes with it, in the same transaction (see `commit`).
        for write in &pending.writes {
            if let Write::Remove { kind, uid, .. } = write
                && *kind == Kind::Project
            {
                inner.members.remove(uid);
            }
        }
        // Sent under the lock so subscribers see changes in resourceVersion order.
        for change in pending.changes {
            let _ = self.changes.send(change);
        }
        Ok(value)
    }
}

impl Inner {
    pub(super) fn upsert(
        &mut self,
        pending: &mut Pending,
        desired: Desired,
        mode: Mode,
    ) -> Result<(Arc<StoredObject>, Action), StoreError> {
        let current = self.get(desired.kind, &desired.name);
        let current = match (current, &mode) {
            (Some(_), Mode::Create | Mode::Restore { .. }) => {
                return Err(StoreError::AlreadyExists {
                    kind: desired.kind.to_string(),
                    name: desired.name,
                });
            }
            (None, Mode::Replace(_)) => {
                return Err(StoreError::not_found(desired.kind, &desired.name));
            }
            (Some(current), Mode::Replace(expected_rv)) => {
                check_rv(&current, *expected_rv)?;
                Some(current)
            }
            (current, Mode::Apply(Some(expected))) => {
                if Expected::of(current.as_deref()) != *expected {
                    return Err(StoreError::Moved {
                        kind: desired.kind.to_string(),
                        name: desired.name,
                    });
                }
                current
            }
            (current, _) => current,
        };
        let Some(current) = current else {
            let mut desired = desired;
            keep_server_owned(&mut desired.annotations, &BTreeMap::new());
            let (uid, status) = match mode {
                Mode::Restore { uid, status } => {
                    if self.uids.contains_key(&uid) {
                        return Err(StoreError::conflict(
                            desired.kind,
                            &desired.name,
                            format!("an object with uid {uid} exists"),
                        ));
                    }
                    (uid, Doc::new(&status))
                }
                _ => (uuid::Uuid::new_v4().to_string(), Doc::null()),
            };
            let object = Arc::new(StoredObject {
                kind: desired.kind,
                metadata: ObjectMeta {
                    name: desired.name,
                    uid: Some(uid),
                    generation: Some(1),
                    resource_version: Some(self.next_rv().to_string()),
                    labels: desired.labels,
                    annotations: desired.annotations,
                    creation_timestamp: Some(now()),
                    deletion_timestamp: None,
                    finalizers: desired.finalizers.unwrap_or_default(),
                },
                spec: Doc::new(&desired.spec),
                status,
            });
            self.put(pending, Arc::clone(&object));
            if object.kind == Kind::Project
                && let Some(creator) = pending.creator.clone()
            {
                self.add_member(pending, object.uid(), &creator);
            }
            pending
                .changes
                .push(Change::new(ChangeType::Added, &object, true));
            return Ok((object, Action::Created));
        };

        let mut next = (*current).clone();
        next.metadata.labels = desired.labels;
        next.metadata.annotations = desired.annotations;
        keep_server_owned(
            &mut next.metadata.annotations,
            &current.metadata.annotations,
        );
        if let Some(finalizers) = desired.finalizers {
            next.metadata.finalizers = finalizers;
        }
        let spec = Doc::new(&desired.spec);
        let spec_changed = next.spec != spec;
        next.spec = spec;
        if next == *current {
            return Ok((current, Action::Unchanged));
        }
        if spec_changed {
            next.metadata.generation = Some(current.generation() + 1);
        }
        let desired_changed = spec_changed
            || next.metadata.labels != current.metadata.labels
            || next.metadata.annotations != current.metadata.annotations;
        if next.is_deleting() && next.metadata.finalizers.is_empty() {
            next.metadata.resource_version = Some(self.next_rv().to_string());
            let next = Arc::new(next);
            self.remove(pending, next.kind, next.name());
            pending
                .changes
                .push(Change::new(ChangeType::Deleted, &next, true));
            return Ok((next, Action::Configured));
        }
        Ok((
            self.modified(pending, next, desired_changed),
            Action::Configured,
        ))
    }

    pub(super) fn set_status(
        &mut self,
        pending: &mut Pending,
        update: StatusUpdate,
    ) -> Result<Arc<StoredObject>, StoreError> {
        let current = self.existing(update.kind, &update.name, update.expected_rv)?;
        let status = Doc::new(&update.status);
        if current.status == status {
            return Ok(current);
        }
        let mut next = (*current).clone();
        next.status = status;
        Ok(self.modified(pending, next, false))
    }

    /// Deletes `current`, or marks it deleting while finalizers hold it.
    pub(super) fn delete(
        &mut self,
        pending: &mut Pending,
        current: Arc<StoredObject>,
        annotations: BTreeMap<String, String>,
    ) -> Deletion {
        if current.metadata.finalizers.is_empty() {
            let mut last = (*current).clone();
            last.metadata.resource_version = Some(self.next_rv().to_string());
            let last = Arc::new(last);
            self.remove(pending, current.kind, current.name());
            pending
                .changes
                .push(Change::new(ChangeType::Deleted, &last, true));
            return Deletion::Deleted(last);
        }
        let mut next = (*current).clone();
        next.metadata.annotations.extend(annotations);
        if next.metadata.deletion_timestamp.is_none() {
            next.metadata.deletion_timestamp = Some(now());
        }
        if next == *current {
            return Deletion::Deleting(current);
        }
        Deletion::Deleting(self.modified(pending, next, true))
    }

    /// Writes `next`, a changed copy of a stored object, in memory under the next
    /// resourceVersion and records it as modified (`desired_changed`: its spec, labels or
    /// annotations moved, which the controller acts on).
    fn modified(
        &mut self,
        pending: &mut Pending,
        mut next: StoredObject,
        desired_changed: bool,
    ) -> Arc<StoredObject> {
        next.metadata.resource_version = Some(self.next_rv().to_string());
        let next = Arc::new(next);
        self.put(pending, Arc::clone(&next));
        pending
            .changes
            .push(Change::new(ChangeType::Modified, &next, desired_changed));
        next
    }

    /// Puts `object` in memory, remembering what it replaced.
    pub(super) fn put(&mut self, pending: &mut Pending, object: Arc<StoredObject>) {
        let previous = self.set(object.kind, object.name(), Some(Arc::clone(&object)));
        pending
            .undo
            .push((object.kind, object.name().to_string(), previous));
        pending.writes.push(Write::Put(object));
    }

    pub(super) fn remove(&mut self, pending: &mut Pending, kind: Kind, name: &str) {
        let previous = self.set(kind, name, None);
        let uid = previous
            .as_ref()
            .map(|p| p.uid().to_string())
            .unwrap_or_default();
        pending.undo.push((kind, name.to_string(), previous));
        pending.writes.push(Write::Remove {
            kind,
            name: name.to_string(),
            uid,
        });
    }

    pub(super) fn add_member(&mut self, pending: &mut Pending, uid: &str, user: &str) {
        if self
            .members
            .entry(uid.to_string())
            .or_default()
            .insert(user.to_string())
        {
            pending
                .member_undo
                .push((uid.to_string(), user.to_string()));
            pending.writes.push(Write::Member {
                uid: uid.to_string(),
                user: user.to_string(),
            });
        }
    }

    pub(super) fn undo(&mut self, pending: Pending) {
        for (uid, user) in pending.member_undo {
            if let Some(members) = self.members.get_mut(&uid) {
                members.remove(&user);
                if members.is_empty() {
                    self.members.remove(&uid);
                }
            }
        }
        for (kind, name, previous) in pending.undo.into_iter().rev() {
            self.set(kind, &name, previous);
        }
        for (set, previous) in pending.inventory_undo.into_iter().rev() {
            match previous {
                Some(inventory) => self.applysets.insert(set, inventory),
                None => self.applysets.remove(&set),
            };
        }
        self.resource_version = pending.rv_before;
    }
}

/// A spec or metadata write keeps the annotations only the server writes as `current` holds
/// them: a delete request records them ([`Store::delete`]), and no later write drops or adds
/// one, so a re-applied manifest never loses a recorded force nor arms one.
pub(super) fn keep_server_owned(
    annotations: &mut BTreeMap<String, String>,
    current: &BTreeMap<String, String>,
) {
    for key in berth_api::annotations::SERVER_OWNED {
        match current.get(key) {
            Some(value) => annotations.insert(key.to_string(), value.clone()),
            None => annotations.remove(key),
        };
    }
}
