//! Bringing a project back from the trash.
//!
//! In order, each step idempotent and judged by where the volumes are: pin the new uid (a
//! restore under another name), rename every volume to its name in the project, give it the
//! project's uid label, create the object (the commit point: from here the volumes belong to a
//! live project and leave the trash listing), then clear the trash labels. A restore
//! interrupted before the object exists is found again in the trash and finishes on the next
//! request; one interrupted after it leaves stale trash labels that nothing reads (the next
//! deletion overwrites them).

use std::collections::BTreeMap;
use std::sync::Arc;

use berth_api::Kind;
use serde_json::{Value, json};

use super::names::{self, TrashEntry};
use super::{Trash, TrashError, cleared, target};
use crate::admission::{Admission, Admitter};
use crate::runtime::Runtime;
use crate::store::{Commit, Desired, EventType, PostParams, Restored, StoredObject};

/// A restore request.
#[derive(Debug, Clone)]
pub struct Restore {
    /// The entry: a uid, or a project name (its newest entry).
    pub key: String,
    /// Restore under this name, with a new uid, alongside whatever holds the old name.
    pub new_name: Option<String>,
    /// Who asked; becomes the project's first member.
    pub caller: String,
    /// The finalizers a new project gets (the reconciler's teardown).
    pub finalizers: Vec<String>,
}

impl Trash {
    /// Restores the entry `request.key` names and returns the project created again. A name in
    /// use is [`TrashError::Conflict`]; no such entry is [`TrashError::NotFound`].
    pub async fn restore(
        &self,
        runtime: &dyn Runtime,
        admission: &Admission,
        request: Restore,
    ) -> Result<Arc<StoredObject>, TrashError> {
        if let Some(name) = &request.new_name {
            berth_api::validate_name(name).map_err(|message| TrashError::Invalid {
                field: "name".into(),
                message,
            })?;
        }
        let _one_at_a_time = self.lock.lock().await;
        // A name reaches this store's entries only; a uid reaches any (`berth trash list
        // --all`: a store that was lost). Either way the entry is whole.
        let own = self.entries_of(runtime, super::Scope::Own).await?;
        let entry = match Trash::find(&own, &request.key) {
            Some(entry) => entry.clone(),
            None => self
                .entries_of(runtime, super::Scope::All)
                .await?
                .into_iter()
                .find(|e| e.uid == request.key)
                .ok_or_else(|| {
                    TrashError::NotFound(format!(
                        "nothing in the trash is {:?} (`berth trash list --all` shows every controller's entries; restore one of another controller by its uid)",
                        request.key
                    ))
                })?,
        };
        if entry.is_container() {
            return Err(TrashError::Conflict(format!(
                "{} is a replaced container of project {:?}: it is not restored as a project; copy its files out with `berth trash cp {}:PATH LOCALPATH`",
                entry.uid, entry.name, entry.uid
            )));
        }
        let name = request
            .new_name
            .clone()
            .unwrap_or_else(|| entry.name.clone());
        if self.store.get(Kind::Project, &name).is_some() {
            return Err(TrashError::Conflict(format!(
                "project {name:?} exists; restore under another name with --as NEW"
            )));
        }
        let spec = restored_spec(&entry, &request, |display| {
            self.store.project_with_display_name(display).is_some()
        })?;
        // The same refusal the store gives any writer: it names no project, since the caller
        // may not be allowed to know the other one exists.
        if let Some(display) = spec
            .get("displayName")
            .and_then(Value::as_str)
            .filter(|d| self.store.project_with_display_name(d).is_some())
        {
            return Err(TrashError::Conflict(format!(
                "spec.displayName: {:?} is already the display name of another project; restore under another name with --as NEW",
                display.trim()
            )));
        }

        // The one admission, as every writer's: what the entry recorded may no longer be
        // allowed (a forward target an admin removed since), and nothing is moved then.
        let desired = Desired {
            kind: Kind::Project,
            name: name.clone(),
            labels: entry.labels.clone(),
            annotations: BTreeMap::new(),
            finalizers: Some(request.finalizers.clone()),
            spec,
        };
        admission
            .check(Admitter::Restore, &desired, None, &self.store)
            .map_err(TrashError::Refused)?;

        let uid = match &request.new_name {
            None => entry.uid.clone(),
            Some(_) => self.pin_new_uid(runtime, &entry).await?,
        };
        if uid != entry.uid && self.store.get_by_uid(&uid).is_some() {
            return Err(TrashError::Conflict(format!(
                "an object with uid {uid} exists"
            )));
        }
        self.move_back(runtime, &entry, &uid).await?;

        // The workspace held work once: it is never taken for one that never did.
        let mut status = json!({ "firstReachableAt": chrono::Utc::now() });
        if let Some(finished) = finished_brief(&entry, &uid) {
            status["briefFinished"] = json!(finished);
        }
        // On a cluster the project goes back to the member its volumes live on.
        if let Some(member) = entry.volumes.iter().find_map(|v| target(v)) {
            status["location"] = json!(member);
        }
        let store = Arc::clone(&self.store);
        let (caller, created_uid) = (request.caller.clone(), uid.clone());
        let object = crate::store::blocking(move || {
            let params = PostParams {
                commit: Commit::Persist,
                creator: Some(&caller),
                restore: Some(Restored {
                    uid: created_uid,
                    status,
                }),
            };
            store.create(desired, params)
        })
        .await
        .map_err(|e| TrashError::Conflict(format!("the restore did not finish: {e}")))??;

        for volume in &entry.volumes {
            let live = self.live_name(&entry, volume, &uid)?;
            if let Err(e) = runtime
                .patch_volume(&self.pool, &live, &cleared(), target(volume))
                .await
            {
                tracing::warn!(volume = live.as_str(), error = %e, "trash labels left on a restored volume");
            }
        }
        // The deleted project's container stays in the trash, now an entry of its own (as a
        // replaced one is): the project comes back on a fresh container, and what only the old
        // one held can still be copied out of it (`berth trash cp`) until it expires.
        for instance in &entry.instances {
            let Some(n) = names::container_number(&entry.uid, &instance.name) else {
                continue;
            };
            let mut own = crate::runtime::InstancePatch::default();
            own.config.insert(
                names::TRASH_UID.to_string(),
                names::container_key(&entry.uid, n),
            );
            if let Err(e) = runtime.patch_instance(&instance.name, &own).await {
                tracing::warn!(instance = instance.name.as_str(), error = %e, "the deleted container stays keyed by the restored project");
            }
        }
        tracing::info!(
            name = name.as_str(),
            uid = uid.as_str(),
            from = entry.uid.as_str(),
            "project restored from the trash"
        );
        let message = format!(
            "restored from the trash by {} (project {} uid {}, deleted {} by {}: {})",
            request.caller,
            entry.name,
            entry.uid,
            entry
                .deleted_at
                .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
                .unwrap_or_else(|| "at an unknown time".into()),
            entry.deleted_by,
            entry.reason
        );
        self.store
            .publish_event(&object, EventType::Normal, "Restored", &message)
            .await;
        Ok(object)
    }

    /// The uid a restore under another name gives the project: the one an interrupted restore
    /// pinned, else a new one, pinned on every volume before any is renamed.
    async fn pin_new_uid(
        &self,
        runtime: &dyn Runtime,
        entry: &TrashEntry,
    ) -> Result<String, TrashError> {
        if let Some(pinned) = &entry.restore_as {
            return Ok(pinned.clone());
        }
        let uid = uuid::Uuid::new_v4().to_string();
        let pin = BTreeMap::from([(names::TRASH_RESTORE_AS.to_string(), uid.clone())]);
        for volume in &entry.volumes {
            runtime
                .patch_volume(&self.pool, &volume.name, &pin, target(volume))
                .await?;
        }
        Ok(uid)
    }

    /// Renames every volume of `entry` to its name in the project `uid` and labels it as that
    /// project's; what is already so is left alone.
    async fn move_back(
        &self,
        runtime: &dyn Runtime,
        entry: &TrashEntry,
        uid: &str,
    ) -> Result<(), TrashError> {
        for volume in &entry.volumes {
            let live = self.live_name(entry, volume, uid)?;
            if volume.name != live {
                runtime
                    .rename_volume(&self.pool, &volume.name, &live, target(volume))
                    .await?;
            }
            let controller = self.store.controller_id();
            let label_of = |key: &str| volume.config.get(key).map(String::as_str);
            if label_of(names::PROJECT_UID_LABEL) != Some(uid)
                || label_of(names::CONTROLLER_LABEL).is_some_and(|c| c != controller)
            {
                // An entry of a lost store becomes this controller's with the project.
                let label = BTreeMap::from([
                    (names::PROJECT_UID_LABEL.to_string(), uid.to_string()),
                    (names::CONTROLLER_LABEL.to_string(), controller.to_string()),
                ]);
                runtime
                    .patch_volume(&self.pool, &live, &label, target(volume))
                    .await?;
            }
        }
        Ok(())
    }

    fn live_name(
        &self,
        entry: &TrashEntry,
        volume: &crate::runtime::Volume,
        uid: &str,
    ) -> Result<String, TrashError> {
        volume
            .config
            .get(names::TRASH_FROM)
            .and_then(|from| names::restored_name(from, &entry.uid, uid))
            .ok_or_else(|| {
                TrashError::Conflict(format!(
                    "volume {} does not record the name it had in project {}; restore it by hand",
                    volume.name, entry.uid
                ))
            })
    }
}

/// The spec the project comes back with: as recorded, with the display name of the new name
/// when restored under another one whose recorded display name is taken.
fn restored_spec(
    entry: &TrashEntry,
    request: &Restore,
    display_name_taken: impl Fn(&str) -> bool,
) -> Result<Value, TrashError> {
    let mut spec = entry.spec.clone();
    let Value::Object(fields) = &mut spec else {
        return Err(TrashError::Conflict(format!(
            "the trash entry {} records no readable spec; restore it by hand",
            entry.uid
        )));
    };
    if let Some(new_name) = &request.new_name {
        let recorded = fields
            .get("displayName")
            .and_then(Value::as_str)
            .unwrap_or(&entry.name)
            .to_string();
        if display_name_taken(&recorded) {
            fields.insert("displayName".into(), json!(new_name));
        }
    }
    Ok(spec)
}

/// The brief the restored project's agent has finished, under its uid `uid`: the one the entry
/// recorded, when it is the brief the spec carries (a brief's id names its project's uid, so a
/// restore under a new uid finishes the same text under the new id).
fn finished_brief(entry: &TrashEntry, uid: &str) -> Option<String> {
    let recorded = entry.brief_finished.as_deref()?;
    let brief = entry.spec.get("brief").and_then(Value::as_str)?;
    (recorded == crate::agent::brief_id(&entry.uid, brief))
        .then(|| crate::agent::brief_id(uid, brief))
}
