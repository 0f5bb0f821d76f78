//! Applysets: a batch applied as one named set in one transaction, its inventory recorded,
//! and prune of what the previous inventory held and the new one does not.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use berth_api::Kind;
use rusqlite::Connection;

use super::database::json_column;
use super::writes::{ApplyItem, ApplyParams, BatchFailure, Mode, Pending, Write};
use super::{Action, Commit, Deletion, Inner, Store, StoreError, StoredObject};

/// An applyset's parameters: the apply's, whether the set prunes, and what it does with an
/// object another set owns. A bare [`Commit`] adopts and keeps the previous inventory.
#[derive(Debug, Clone, Copy)]
pub struct SetParams<'a> {
    pub apply: ApplyParams<'a>,
    /// Deletes what the previous inventory held and this batch does not.
    pub prune: bool,
    pub takeover: Takeover,
}

impl From<Commit> for SetParams<'_> {
    fn from(commit: Commit) -> Self {
        SetParams {
            apply: commit.into(),
            prune: false,
            takeover: Takeover::Adopt,
        }
    }
}

impl<'a> From<ApplyParams<'a>> for SetParams<'a> {
    fn from(apply: ApplyParams<'a>) -> Self {
        SetParams {
            apply,
            prune: false,
            takeover: Takeover::Adopt,
        }
    }
}

impl SetParams<'_> {
    pub fn pruning(self, prune: bool) -> Self {
        SetParams { prune, ..self }
    }
}

/// What [`Store::apply_set`] did.
#[derive(Debug, Clone)]
pub struct AppliedSet {
    pub applied: Vec<(Arc<StoredObject>, Action)>,
    pub pruned: Vec<Deletion>,
    /// Objects of the batch left alone because another applyset owns them
    /// ([`Takeover::Refuse`]).
    pub conflicts: Vec<SetConflict>,
}

/// What a set does with an object of its batch that another applyset owns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Takeover {
    /// Apply it and take it into this set, as `berth apply --applyset` does when told to.
    Adopt,
    /// Leave it to its owner, and report it (a GitSource, as Flux does without `force`).
    Refuse,
}

/// An object a set's batch held that another applyset owns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SetConflict {
    pub kind: Kind,
    pub name: String,
    /// The applyset that owns it (`berth.dev/applyset`).
    pub owner: String,
}

impl Store {
    /// The inventory recorded for applyset `name`: `Kind/name` of every object it applied last.
    pub fn applyset_inventory(&self, name: &str) -> Vec<String> {
        self.lock().applysets.get(name).cloned().unwrap_or_default()
    }

    /// Applies `batch` as applyset `set`, in one transaction: records the new inventory and, with
    /// [`SetParams::prune`], deletes what the previous inventory held and the new one does not
    /// (without it, the previous inventory is kept alongside). Only objects
    /// in that inventory are ever pruned, never by a selector; objects annotated
    /// `berth.dev/prune: disabled`, or since applied by another set, are left alone. With
    /// [`Takeover::Refuse`], every object another applyset owns is left to that set: it is
    /// neither written nor taken into this set's inventory, and is listed in
    /// [`AppliedSet::conflicts`], decided in the same transaction as the writes.
    pub fn apply_set<'a, I: Into<ApplyItem>>(
        &self,
        set: &str,
        batch: Vec<I>,
        params: impl Into<SetParams<'a>>,
    ) -> Result<AppliedSet, BatchFailure> {
        let SetParams {
            apply: ApplyParams { commit, creator },
            prune,
            takeover,
        } = params.into();
        let mut failed_at = None;
        self.write_as(creator, commit, |inner, pending| {
            let mut inventory: Vec<String> = Vec::with_capacity(batch.len());
            let mut applied = Vec::with_capacity(batch.len());
            // The batch index of each applied object, for naming the item a check refuses.
            let mut applied_index = Vec::with_capacity(batch.len());
            let mut conflicts = Vec::new();
            for (index, item) in batch.into_iter().enumerate() {
                let ApplyItem { desired, expected } = item.into();
                failed_at = Some(index);
                if takeover == Takeover::Refuse
                    && let Some(owner) = inner
                        .get(desired.kind, &desired.name)
                        .and_then(|current| owner_of(&current).filter(|o| o != set))
                {
                    conflicts.push(SetConflict {
                        kind: desired.kind,
                        name: desired.name,
                        owner,
                    });
                    continue;
                }
                inventory.push(format!("{}/{}", desired.kind, desired.name));
                applied.push(inner.upsert(pending, desired, Mode::Apply(expected))?);
                applied_index.push(index);
            }
            inventory.sort();
            inventory.dedup();
            let mut pruned = Vec::new();
            let previous = inner.applysets.get(set).cloned().unwrap_or_default();
            if !prune {
                // Without pruning, what the set applied before stays in its inventory so a later
                // prune still finds it.
                inventory.extend(previous.into_iter().filter(|key| {
                    inventory_key(key).is_some_and(|(kind, name)| {
                        inner
                            .get(kind, name)
                            .is_some_and(|current| owner_of(&current).is_none_or(|o| o == set))
                    })
                }));
                inventory.sort();
                inventory.dedup();
            } else {
                // Kept keys join the inventory after the loop: it stays sorted for the searches.
                let mut kept = Vec::new();
                for key in previous {
                    if inventory.binary_search(&key).is_ok() {
                        continue;
                    }
                    let Some((kind, name)) = inventory_key(&key) else {
                        continue;
                    };
                    let Some(current) = inner.get(kind, name) else {
                        continue;
                    };
                    let annotations = &current.metadata.annotations;
                    let opted_out = annotations
                        .get(berth_api::annotations::PRUNE)
                        .map(String::as_str)
                        == Some(berth_api::annotations::PRUNE_DISABLED);
                    let moved = owner_of(&current).is_some_and(|owner| owner != set);
                    if opted_out || moved || current.is_deleting() {
                        // Still ours to track until it is gone or handed over.
                        if opted_out && !moved {
                            kept.push(key);
                        }
                        continue;
                    }
                    pruned.push(inner.delete(pending, current, prune_annotations(creator)));
                }
                inventory.extend(kept);
                inventory.sort();
            }
            inner.record_inventory(pending, set, inventory);
            // Checked on the end state: what the batch renamed or pruned no longer holds a name.
            if let Err(index) = inner.check_display_names(&applied) {
                failed_at = Some(applied_index[index]);
                return Err(inner.display_name_conflict(&applied[index].0));
            }
            failed_at = None;
            Ok(AppliedSet {
                applied,
                pruned,
                conflicts,
            })
        })
        .map_err(|error| BatchFailure {
            index: failed_at,
            error,
        })
    }
}

impl Inner {
    pub(super) fn record_inventory(
        &mut self,
        pending: &mut Pending,
        set: &str,
        inventory: Vec<String>,
    ) {
        if self.applysets.get(set) == Some(&inventory) {
            return;
        }
        let previous = self.applysets.insert(set.to_string(), inventory.clone());
        pending.inventory_undo.push((set.to_string(), previous));
        pending.writes.push(Write::Inventory {
            set: set.to_string(),
            inventory,
        });
    }
}

/// How a pruned object was asked to go: by a prune, on behalf of whoever applied the set.
pub(super) fn prune_annotations(creator: Option<&str>) -> BTreeMap<String, String> {
    let mut annotations = BTreeMap::from([(
        berth_api::annotations::REAPED_BY.to_string(),
        "prune".to_string(),
    )]);
    if let Some(creator) = creator {
        annotations.insert(
            berth_api::annotations::DELETED_BY.to_string(),
            creator.to_string(),
        );
    }
    annotations
}

/// The kind and name an applyset inventory key (`Kind/name`) names.
pub(super) fn inventory_key(key: &str) -> Option<(Kind, &str)> {
    let (kind, name) = key.split_once('/')?;
    Some((kind.parse().ok()?, name))
}

/// The applyset that owns `object` (`berth.dev/applyset`), if any.
pub(super) fn owner_of(object: &StoredObject) -> Option<String> {
    object
        .metadata
        .annotations
        .get(berth_api::annotations::APPLYSET)
        .cloned()
}

pub(super) fn load_applysets(
    conn: &Connection,
) -> Result<HashMap<String, Vec<String>>, StoreError> {
    let mut stmt = conn.prepare("SELECT name, inventory FROM applysets")?;
    let rows = stmt.query_map([], |row| Ok((row.get(0)?, json_column(row, 1)?)))?;
    Ok(rows.collect::<Result<_, _>>()?)
}
