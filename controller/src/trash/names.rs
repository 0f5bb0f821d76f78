//! How a volume in the trash is named and labelled, and how an entry is read back from LXD.
//!
//! A trashed volume keeps its project labels (`user.berth.uid`, `user.berth.controller`) and
//! gains `user.berth.trash.*` labels recording the project (uid, name, spec, labels) and how it
//! went (when, by whom, why), then is renamed `berth-trash-<uid>-<rest>`. The labels come first:
//! a volume is never under a trash name without them.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde_json::Value;

use crate::runtime::{Instance, Volume};
use crate::store::StoredObject;

/// The config key holding the project's uid on every berth volume (the reconciler's
/// `layout::UID_LABEL`; the trash reads and rewrites it, a unit test keeps the two equal).
pub const PROJECT_UID_LABEL: &str = "user.berth.uid";
/// The config key naming the controller that created a volume (`layout::CONTROLLER_LABEL`).
pub const CONTROLLER_LABEL: &str = "user.berth.controller";

/// Every trash label starts with this; listing by it finds the trash in one call.
pub const TRASH_LABEL_PREFIX: &str = "user.berth.trash.";
/// The uid of the project the entry was (the entry's key; never rewritten while in the trash).
pub const TRASH_UID: &str = "user.berth.trash.uid";
/// The name the volume had in the project.
pub const TRASH_FROM: &str = "user.berth.trash.from";
pub const TRASH_NAME: &str = "user.berth.trash.name";
/// The project's spec, as stored (JSON).
pub const TRASH_SPEC: &str = "user.berth.trash.spec";
/// The project's metadata labels (JSON).
pub const TRASH_LABELS: &str = "user.berth.trash.labels";
pub const TRASH_DELETED_AT: &str = "user.berth.trash.deletedAt";
pub const TRASH_DELETED_BY: &str = "user.berth.trash.deletedBy";
pub const TRASH_REASON: &str = "user.berth.trash.reason";
/// The uid a restore under another name gives the project, pinned before the first rename so
/// an interrupted restore resumes to the same uid.
pub const TRASH_RESTORE_AS: &str = "user.berth.trash.restoreAs";

/// What the entry holds: absent or [`KIND_PROJECT`], a deleted project's volumes;
/// [`KIND_CONTAINER`], a replaced container; `files`, a copy made before a forced checkout.
pub const TRASH_KIND: &str = "user.berth.trash.kind";
pub const KIND_PROJECT: &str = "project";
pub const KIND_CONTAINER: &str = "container";
/// The uid of the project the item came from (for a project entry, its [`TRASH_UID`]).
pub const TRASH_PROJECT: &str = "user.berth.trash.project";
/// When the trash received the item (RFC 3339).
pub const TRASH_TRASHED_AT: &str = "user.berth.trash.trashedAt";
/// `TRASH_KIND` of a copy of a live project's workspace, made before a forced checkout.
pub const KIND_FILES: &str = "files";
/// The brief the project's agent had finished (`status.briefFinished`) when it was deleted: a
/// restored project does not hand it over again.
pub const TRASH_BRIEF_FINISHED: &str = "user.berth.trash.briefFinished";

/// The name and labels of the copy of `object`'s workspace volume `live` taken before a forced
/// checkout asked for at `requested` (the name's time, so a retried copy finds its own), put
/// into the trash at `now`: `berth-trash-<uid>-checkout-<yyyymmddThhmmss>`.
pub fn checkout_copy(
    object: &StoredObject,
    live: &str,
    requested: DateTime<Utc>,
    now: DateTime<Utc>,
) -> (String, BTreeMap<String, String>) {
    let item = format!(
        "{}-checkout-{}",
        object.uid(),
        requested.format("%Y%m%dT%H%M%S")
    );
    let mut labels = trash_labels(object, live);
    let trashed_at = now.to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    labels.insert(TRASH_UID.to_string(), item.clone());
    labels.insert(TRASH_KIND.to_string(), KIND_FILES.to_string());
    labels.insert(TRASH_PROJECT.to_string(), object.uid().to_string());
    labels.insert(TRASH_TRASHED_AT.to_string(), trashed_at.clone());
    labels.insert(TRASH_DELETED_AT.to_string(), trashed_at);
    (format!("{TRASH_NAME_PREFIX}{item}"), labels)
}

/// Every trash label, for clearing them once a volume is back in a project.
pub const TRASH_KEYS: [&str; 13] = [
    TRASH_UID,
    TRASH_FROM,
    TRASH_NAME,
    TRASH_SPEC,
    TRASH_LABELS,
    TRASH_DELETED_AT,
    TRASH_DELETED_BY,
    TRASH_REASON,
    TRASH_RESTORE_AS,
    TRASH_KIND,
    TRASH_PROJECT,
    TRASH_TRASHED_AT,
    TRASH_BRIEF_FINISHED,
];

/// Whether trash labels `config` are a deleted project's (kind absent or `project`).
pub fn is_project_kind(config: &BTreeMap<String, String>) -> bool {
    config
        .get(TRASH_KIND)
        .is_none_or(|k| k.is_empty() || k == KIND_PROJECT)
}

const TRASH_NAME_PREFIX: &str = "berth-trash-";

/// Whether a volume name is a trash name: no live project's volume is ever named so.
pub fn is_trash_name(volume: &str) -> bool {
    volume.starts_with(TRASH_NAME_PREFIX)
}

/// The trash name of a project volume: `berth-<uid>-workspace` → `berth-trash-<uid>-workspace`.
pub fn trash_name(live: &str) -> String {
    format!(
        "{TRASH_NAME_PREFIX}{}",
        live.strip_prefix("berth-").unwrap_or(live)
    )
}

/// The name a volume recorded as `from` (the project `old_uid`'s) takes in the project
/// `new_uid`: volumes are keyed by their project's uid, so the uid in the name changes.
pub fn restored_name(from: &str, old_uid: &str, new_uid: &str) -> Option<String> {
    from.contains(old_uid)
        .then(|| from.replacen(old_uid, new_uid, 1))
}

/// Why a project went, from the annotations its deletion recorded.
pub fn reason(object: &StoredObject) -> &'static str {
    let annotations = &object.metadata.annotations;
    let is = |key: &str, value: &str| annotations.get(key).map(String::as_str) == Some(value);
    if is(berth_api::annotations::REAPED_BY, "reaper") {
        "reaper"
    } else if is(berth_api::annotations::REAPED_BY, "prune") {
        "prune"
    } else if is(berth_api::annotations::FORCE_DELETE, "true") {
        "forced"
    } else {
        "deleted"
    }
}

/// Who asked for the deletion: the caller recorded by the API, else what reaped it.
pub fn deleted_by(object: &StoredObject) -> String {
    let annotations = &object.metadata.annotations;
    annotations
        .get(berth_api::annotations::DELETED_BY)
        .or_else(|| annotations.get(berth_api::annotations::REAPED_BY))
        .filter(|v| !v.is_empty())
        .cloned()
        .unwrap_or_else(|| "unknown".to_string())
}

/// The labels a volume of `object` named `live` gets on its way into the trash. The same object
/// gives the same record every time (the deletion's timestamp, not the clock); only
/// `trashedAt`, written in the same patch that precedes the rename, is the clock's: the trash
/// keeps an item for its whole retention from when it received it, however long the deletion
/// was held before. Labelling again after a crash moves it later, never earlier.
pub fn trash_labels(object: &StoredObject, live: &str) -> BTreeMap<String, String> {
    let trashed_at = crate::clock::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    let deleted_at = object
        .metadata
        .deletion_timestamp
        .unwrap_or_else(crate::clock::now)
        .to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    let labels = serde_json::to_string(&object.metadata.labels).unwrap_or_default();
    BTreeMap::from([
        (TRASH_UID.to_string(), object.uid().to_string()),
        (TRASH_FROM.to_string(), live.to_string()),
        (TRASH_NAME.to_string(), object.name().to_string()),
        (TRASH_SPEC.to_string(), object.spec.value().to_string()),
        (TRASH_LABELS.to_string(), labels),
        (TRASH_DELETED_AT.to_string(), deleted_at),
        (TRASH_DELETED_BY.to_string(), deleted_by(object)),
        (TRASH_REASON.to_string(), reason(object).to_string()),
        (TRASH_TRASHED_AT.to_string(), trashed_at),
        (
            TRASH_BRIEF_FINISHED.to_string(),
            object
                .status
                .value()
                .get("briefFinished")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string(),
        ),
        // A label left by an earlier restore that was interrupted must not steer a later one.
        (TRASH_RESTORE_AS.to_string(), String::new()),
    ])
}

/// One project in the trash: its volumes and what they record.
#[derive(Debug, Clone)]
pub struct TrashEntry {
    pub uid: String,
    pub name: String,
    /// `None` when the label does not parse: such an entry never expires by itself.
    pub deleted_at: Option<DateTime<Utc>>,
    /// When the trash received the entry (its latest volume), from which its retention counts;
    /// `deletedAt` for an entry an older berth labelled without it.
    pub trashed_at: Option<DateTime<Utc>>,
    pub deleted_by: String,
    pub reason: String,
    pub spec: Value,
    pub labels: BTreeMap<String, String>,
    /// The uid pinned by an interrupted restore under another name.
    pub restore_as: Option<String>,
    /// The brief the agent had finished when the project was deleted.
    pub brief_finished: Option<String>,
    pub volumes: Vec<Volume>,
    /// [`KIND_PROJECT`] (a deleted project's volumes) or [`KIND_CONTAINER`] (a replaced
    /// container, the one instance of `instances`).
    pub kind: String,
    /// The trashed instances (a replaced container), none for a project's volumes.
    pub instances: Vec<Instance>,
    /// The store id of the controller that trashed it (`user.berth.controller`; empty for an
    /// entry labelled before controllers were named).
    pub controller: String,
    /// Bytes used, summed over the volumes (0 where the pool cannot tell).
    pub bytes: u64,
}

impl TrashEntry {
    /// Groups trashed volumes into entries by the uid they record, oldest deletion first.
    /// Volumes without a readable record are left out (they are reported by their labels).
    pub fn group(volumes: Vec<Volume>) -> Vec<TrashEntry> {
        let mut by_uid: BTreeMap<String, TrashEntry> = BTreeMap::new();
        for volume in volumes {
            let config = &volume.config;
            let Some(uid) = config.get(TRASH_UID).filter(|u| !u.is_empty()).cloned() else {
                continue;
            };
            let entry = by_uid.entry(uid.clone()).or_insert_with(|| {
                let text = |key: &str| config.get(key).cloned().unwrap_or_default();
                TrashEntry {
                    uid,
                    name: text(TRASH_NAME),
                    deleted_at: config
                        .get(TRASH_DELETED_AT)
                        .and_then(|t| DateTime::parse_from_rfc3339(t).ok())
                        .map(|t| t.with_timezone(&Utc)),
                    trashed_at: None,
                    deleted_by: text(TRASH_DELETED_BY),
                    reason: text(TRASH_REASON),
                    spec: serde_json::from_str(&text(TRASH_SPEC)).unwrap_or(Value::Null),
                    labels: serde_json::from_str(&text(TRASH_LABELS)).unwrap_or_default(),
                    restore_as: config
                        .get(TRASH_RESTORE_AS)
                        .filter(|u| !u.is_empty())
                        .cloned(),
                    brief_finished: config
                        .get(TRASH_BRIEF_FINISHED)
                        .filter(|b| !b.is_empty())
                        .cloned(),
                    volumes: Vec::new(),
                    kind: config
                        .get(TRASH_KIND)
                        .filter(|k| !k.is_empty())
                        .cloned()
                        .unwrap_or_else(|| KIND_PROJECT.to_string()),
                    instances: Vec::new(),
                    controller: text(CONTROLLER_LABEL),
                    bytes: 0,
                }
            });
            if entry.restore_as.is_none() {
                entry.restore_as = config
                    .get(TRASH_RESTORE_AS)
                    .filter(|u| !u.is_empty())
                    .cloned();
            }
            let trashed_at = volume
                .config
                .get(TRASH_TRASHED_AT)
                .or_else(|| volume.config.get(TRASH_DELETED_AT))
                .and_then(|t| DateTime::parse_from_rfc3339(t).ok())
                .map(|t| t.with_timezone(&Utc));
            entry.trashed_at = entry.trashed_at.max(trashed_at);
            entry.volumes.push(volume);
        }
        let mut entries: Vec<TrashEntry> = by_uid.into_values().collect();
        entries.sort_by(|a, b| a.deleted_at.cmp(&b.deleted_at).then(a.uid.cmp(&b.uid)));
        entries
    }

    /// One entry per trashed container (kind [`KIND_CONTAINER`]); instances without a readable
    /// record are left out.
    pub fn of_containers(instances: Vec<Instance>) -> Vec<TrashEntry> {
        instances
            .into_iter()
            .filter_map(|instance| {
                let config = &instance.config;
                let uid = config.get(TRASH_UID).filter(|u| !u.is_empty())?.clone();
                let text = |key: &str| config.get(key).cloned().unwrap_or_default();
                let trashed_at = config
                    .get(TRASH_TRASHED_AT)
                    .or_else(|| config.get(TRASH_DELETED_AT))
                    .and_then(|t| DateTime::parse_from_rfc3339(t).ok())
                    .map(|t| t.with_timezone(&Utc));
                Some(TrashEntry {
                    uid,
                    name: text(TRASH_NAME),
                    deleted_at: trashed_at,
                    trashed_at,
                    deleted_by: text(TRASH_DELETED_BY),
                    reason: text(TRASH_REASON),
                    spec: Value::Null,
                    labels: BTreeMap::new(),
                    restore_as: None,
                    brief_finished: None,
                    volumes: Vec::new(),
                    kind: KIND_CONTAINER.to_string(),
                    controller: text(CONTROLLER_LABEL),
                    instances: vec![instance],
                    bytes: 0,
                })
            })
            .collect()
    }

    /// Whether the entry is a replaced container rather than a deleted project's volumes.
    pub fn is_container(&self) -> bool {
        self.kind == KIND_CONTAINER
    }
}

/// The trash name of the `n`th container replaced in the project `uid`.
pub fn container_trash_name(uid: &str, n: u32) -> String {
    format!("{TRASH_NAME_PREFIX}{uid}-ct-{n}")
}

/// The entry key of the `n`th container replaced in the project `uid`: `<uid>-ct-<n>`.
pub fn container_key(uid: &str, n: u32) -> String {
    format!("{uid}-ct-{n}")
}

/// The number `n` of a trashed container's name of project `uid`, if it is one.
pub fn container_number(uid: &str, name: &str) -> Option<u32> {
    name.strip_prefix(TRASH_NAME_PREFIX)?
        .strip_prefix(uid)?
        .strip_prefix("-ct-")?
        .parse()
        .ok()
}

/// The labels a replaced container of `object` gets on its way into the trash, keyed `key`,
/// received at `trashed_at`, for `why` (`recreate`, `image`).
pub fn container_labels(
    object: &StoredObject,
    key: &str,
    trashed_at: DateTime<Utc>,
    why: &str,
) -> BTreeMap<String, String> {
    let at = trashed_at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    BTreeMap::from([
        (TRASH_UID.to_string(), key.to_string()),
        (TRASH_KIND.to_string(), KIND_CONTAINER.to_string()),
        (TRASH_PROJECT.to_string(), object.uid().to_string()),
        (TRASH_NAME.to_string(), object.name().to_string()),
        (TRASH_FROM.to_string(), object.name().to_string()),
        (TRASH_TRASHED_AT.to_string(), at.clone()),
        (TRASH_DELETED_AT.to_string(), at),
        (
            TRASH_DELETED_BY.to_string(),
            // A deleted project's container records who deleted it, like its volumes.
            match object.metadata.deletion_timestamp {
                Some(_) => deleted_by(object),
                None => "replacement".to_string(),
            },
        ),
        (TRASH_REASON.to_string(), why.to_string()),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_match_the_layout() {
        assert_eq!(PROJECT_UID_LABEL, crate::layout::UID_LABEL);
        assert_eq!(CONTROLLER_LABEL, crate::layout::CONTROLLER_LABEL);
        assert!(TRASH_LABEL_PREFIX.starts_with(crate::layout::LABEL_PREFIX));
    }

    #[test]
    fn names() {
        let uid = "0b6f3c1e-7d9a-4c1b-9a53-2f1e8d7c6b5a";
        let live = format!("berth-{uid}-workspace");
        let trashed = trash_name(&live);
        assert_eq!(trashed, format!("berth-trash-{uid}-workspace"));
        assert!(is_trash_name(&trashed));
        assert!(!is_trash_name(&live));
        assert!(!crate::layout::DurableLayout::owns_volume(uid, &trashed));
        assert_eq!(
            restored_name(&format!("berth-{uid}-home-shell"), uid, "n-1").as_deref(),
            Some("berth-n-1-home-shell")
        );
        assert_eq!(restored_name("berth-x-workspace", uid, "n-1"), None);
        let ct = container_trash_name(uid, 3);
        assert_eq!(ct, format!("berth-trash-{uid}-ct-3"));
        assert!(is_trash_name(&ct));
        assert_eq!(container_number(uid, &ct), Some(3));
        assert_eq!(container_number(uid, &trashed), None);
        assert_eq!(container_number("other", &ct), None);
        assert_eq!(container_key(uid, 3), format!("{uid}-ct-3"));
    }
}
