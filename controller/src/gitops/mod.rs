//! The GitSource controller: polls each GitSource's repository on its `interval` (or at once when
//! its spec or `berth.dev/requestedAt` changes), and applies the manifests of the fetched
//! revision as the applyset `gitsource-<name>`, the way `berth apply -R --prune --applyset`
//! would. A revision whose manifests do not all admit leaves what is applied in place.
//! `spec.secretRef` names the GitSource whose sealed credentials git is given; a URL is shown
//! redacted in every condition, event and log line.
//!
//! An object another applyset owns (another GitSource's, or one `berth apply --applyset` wrote)
//! is left to it and named in `Ready` (`ApplysetConflict`) and a Warning event. One revision's
//! manifests are at most `manifests::MAX_BYTES` (32 MiB).

pub mod git;
pub mod manifests;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use berth_api::{
    ConditionStatus, GitSource, GitSourceSpec, GitSourceStatus, Kind, annotations, condition_types,
    reasons, set_condition,
};
use chrono::Utc;
use tokio::sync::broadcast::error::RecvError;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::admission::{Admission, Admitter};
use crate::secrets::Secrets;
use crate::store::{
    Action, AppliedSet, ChangeType, Commit, Desired, EventType, FieldManager, SetConflict,
    SetParams, StatusWrite, StatusWritten, Store, StoredObject, Takeover,
};

use git::{Checkout, Credentials};
use manifests::Manifest;

/// Directory under the data dir holding one checkout per GitSource uid.
const CHECKOUTS_DIR: &str = "gitsources";
/// When a sync that failed unexpectedly is tried again.
const PANIC_RETRY: Duration = Duration::from_secs(30);
pub use berth_api::gitsource::{
    CREDENTIAL_HOST, CREDENTIAL_KEYS, CREDENTIAL_PASSWORD, CREDENTIAL_TOKEN, CREDENTIAL_USERNAME,
};
/// Most applied object names an event lists before it just counts.
const EVENT_NAMES: usize = 10;

/// The applyset a GitSource's objects are applied in.
pub fn applyset_name(gitsource: &str) -> String {
    GitSource::applyset_name(gitsource)
}

/// Starts the GitSource controller; it stops when `shutdown` is cancelled.
pub fn spawn(
    store: Arc<Store>,
    secrets: Arc<Secrets>,
    admission: Admission,
    data_dir: PathBuf,
    shutdown: CancellationToken,
) -> tokio::task::JoinHandle<()> {
    let checkouts = data_dir.join(CHECKOUTS_DIR);
    git::sweep_askpass(&checkouts);
    let controller = GitOps {
        store,
        secrets,
        admission: Arc::new(admission),
        checkouts,
    };
    tokio::spawn(controller.run(shutdown))
}

struct GitOps {
    store: Arc<Store>,
    secrets: Arc<Secrets>,
    admission: Arc<Admission>,
    checkouts: PathBuf,
}

/// What the controller remembers of one GitSource between syncs.
struct Tracked {
    uid: String,
    generation: i64,
    requested_at: Option<String>,
    /// When the next sync is due; `None` while suspended or while a sync runs.
    due: Option<Instant>,
    /// A sync of this source is running.
    running: bool,
    /// Something asked for a sync while one was running: run again as soon as it ends.
    again: bool,
}

impl Tracked {
    fn of(object: &StoredObject) -> Tracked {
        Tracked {
            uid: object.uid().to_string(),
            generation: object.generation(),
            requested_at: requested_at(object),
            due: Some(Instant::now()),
            running: false,
            again: false,
        }
    }

    /// Whether this write asks for a sync now: a new spec, a new uid or a new `requestedAt`.
    fn wants_sync(&self, object: &StoredObject) -> bool {
        self.uid != object.uid()
            || self.generation != object.generation()
            || self.requested_at != requested_at(object)
    }

    /// Notes a write that asks for a sync, keeping track of a running one.
    fn request(&mut self, object: &StoredObject) {
        let running = self.running && self.uid == object.uid();
        *self = Tracked::of(object);
        if running {
            self.running = true;
            self.again = true;
            self.due = None;
        }
    }
}

fn requested_at(object: &StoredObject) -> Option<String> {
    object
        .metadata
        .annotations
        .get(annotations::REQUESTED_AT)
        .cloned()
}

/// A finished sync: which source (name, uid) and when it wants the next one.
type Finished = (String, String, Option<Duration>);

impl GitOps {
    /// Each GitSource syncs in its own task, so a slow repository holds up only itself; a
    /// source never has two syncs at once.
    async fn run(self, shutdown: CancellationToken) {
        let this = Arc::new(self);
        let (objects, _, mut changes) = this.store.list_and_subscribe(Kind::GitSource);
        let mut tracked: HashMap<String, Tracked> = objects
            .iter()
            .map(|o| (o.name().to_string(), Tracked::of(o)))
            .collect();
        let mut running: JoinSet<Finished> = JoinSet::new();
        // Which source each task syncs, to recover from a task that panicked.
        let mut tasks: HashMap<tokio::task::Id, (String, String)> = HashMap::new();
        tracing::info!(gitsources = tracked.len(), "GitSource controller started");
        loop {
            let now = Instant::now();
            for (name, t) in tracked.iter_mut() {
                if t.running || t.due.is_none_or(|d| d > now) {
                    continue;
                }
                t.running = true;
                t.due = None;
                let (this, task_name, uid) = (Arc::clone(&this), name.clone(), t.uid.clone());
                let task = running.spawn(async move {
                    let next = this.sync(&task_name, &uid).await;
                    (task_name, uid, next)
                });
                tasks.insert(task.id(), (name.clone(), t.uid.clone()));
            }
            let next_due = tracked.values().filter_map(|t| t.due).min();
            let sleep = async {
                match next_due {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = shutdown.cancelled() => {
                    // Dropping the tasks kills their git processes.
                    running.shutdown().await;
                    return;
                }
                _ = sleep => {}
                Some(done) = running.join_next_with_id(), if !running.is_empty() => {
                    let (name, uid, next) = match done {
                        Ok((id, finished)) => {
                            tasks.remove(&id);
                            finished
                        }
                        Err(err) => {
                            let Some((name, uid)) = tasks.remove(&err.id()) else {
                                continue;
                            };
                            tracing::error!(gitsource = %name, %err, "a GitSource sync failed unexpectedly");
                            // Retried after the shortest sensible pause rather than hammered.
                            (name, uid, Some(PANIC_RETRY))
                        }
                    };
                    match tracked.get_mut(&name) {
                        Some(t) if t.uid == uid => {
                            t.running = false;
                            t.due = if std::mem::take(&mut t.again) {
                                Some(Instant::now())
                            } else {
                                next.map(|interval| Instant::now() + interval)
                            };
                        }
                        // Deleted while it synced: its checkout may have been written again.
                        _ => this.forget(&uid),
                    }
                }
                change = changes.recv() => match change {
                    Ok(change) if change.kind == Kind::GitSource => match change.type_ {
                        ChangeType::Deleted => {
                            tracked.remove(&change.name);
                            this.forget(change.object.uid());
                        }
                        _ if !change.desired_changed => {}
                        _ => match tracked.get_mut(&change.name) {
                            Some(t) if !t.wants_sync(&change.object) => {}
                            Some(t) => t.request(&change.object),
                            None => {
                                tracked.insert(change.name.clone(), Tracked::of(&change.object));
                            }
                        },
                    },
                    Ok(_) => {}
                    Err(RecvError::Lagged(missed)) => {
                        tracing::warn!(missed, "GitSource controller fell behind the change feed; relisting");
                        this.relist(&mut tracked);
                    }
                    Err(RecvError::Closed) => return,
                },
            }
        }
    }

    /// After missing changes: what is gone is forgotten, what is new or changed syncs now.
    fn relist(&self, tracked: &mut HashMap<String, Tracked>) {
        let objects = self.store.list(Kind::GitSource);
        tracked.retain(|name, t| {
            let keep = objects.iter().any(|o| o.name() == name && o.uid() == t.uid);
            if !keep && !t.running {
                self.forget(&t.uid);
            }
            keep
        });
        for object in objects {
            match tracked.get_mut(object.name()) {
                Some(t) if !t.wants_sync(&object) => {}
                Some(t) => t.request(&object),
                None => {
                    tracked.insert(object.name().to_string(), Tracked::of(&object));
                }
            }
        }
    }

    /// Removes a deleted GitSource's checkout. What it applied stays: deleting the source of
    /// truth is not a request to delete the fleet.
    fn forget(&self, uid: &str) {
        if uid.is_empty() {
            return;
        }
        let dir = self.checkouts.join(uid);
        if let Err(err) = std::fs::remove_dir_all(&dir)
            && err.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!(dir = %dir.display(), %err, "cannot remove a GitSource checkout");
        }
    }

    /// Syncs one GitSource; returns when to sync it next (`None`: only when it changes).
    async fn sync(&self, name: &str, uid: &str) -> Option<Duration> {
        let object = self.store.get(Kind::GitSource, name)?;
        if object.is_deleting() || object.uid() != uid {
            return None;
        }
        let spec: GitSourceSpec = match object.spec.decode() {
            Ok(spec) => spec,
            Err(err) => {
                tracing::error!(gitsource = name, %err, "a stored GitSource spec does not decode");
                return None;
            }
        };
        let mut before: GitSourceStatus = object.status.decode().unwrap_or_default();
        let generation = object.generation();
        let now = Utc::now();

        if spec.suspend {
            let mut status = before.clone();
            status.observed_generation = generation;
            set_condition(
                &mut status.conditions,
                condition_types::RECONCILING,
                ConditionStatus::False,
                reasons::SUSPENDED,
                "spec.suspend is true: the repository is not polled",
                generation,
                now,
            );
            status.last_handled_reconcile_at = requested_at(&object);
            self.write_status(&object, &before, status);
            return None;
        }

        let outcome = self
            .fetch_and_apply(&object, &spec, &mut before, generation)
            .await;
        let mut status = before.clone();
        status.observed_generation = generation;
        let now = Utc::now();
        match outcome {
            Ok((revision, applied)) => {
                status.last_attempted_revision = Some(revision.clone());
                status.last_applied_revision = Some(revision.clone());
                status.inventory = self.store.applyset_inventory(&applyset_name(name));
                let (ready, reason, message) = match conflicts_message(&applied.conflicts) {
                    None => (
                        ConditionStatus::True,
                        reasons::SUCCEEDED,
                        format!("applied revision {revision}"),
                    ),
                    Some(conflicts) => (
                        ConditionStatus::False,
                        reasons::APPLYSET_CONFLICT,
                        format!("applied revision {revision} but {conflicts}"),
                    ),
                };
                let news = !before.conditions.iter().any(|c| {
                    c.type_ == condition_types::READY && c.reason == reason && c.message == message
                });
                settled(&mut status, ready, reason, &message, generation, now);
                tracing::info!(gitsource = %name, %revision, "GitSource synced");
                if !applied.conflicts.is_empty() && news {
                    // Once per revision and set of conflicts, not once per poll.
                    tracing::warn!(gitsource = %name, %message, "objects of another applyset");
                    self.event(
                        &object,
                        EventType::Warning,
                        reasons::APPLYSET_CONFLICT,
                        &message,
                    )
                    .await;
                }
                if let Some(summary) = summarize(&applied) {
                    self.event(
                        &object,
                        EventType::Normal,
                        reasons::APPLIED,
                        &format!("revision {revision}: {summary}"),
                    )
                    .await;
                }
            }
            Err(failure) => {
                if let Some(revision) = &failure.revision {
                    status.last_attempted_revision = Some(revision.clone());
                }
                settled(
                    &mut status,
                    ConditionStatus::False,
                    failure.reason,
                    &failure.message,
                    generation,
                    now,
                );
                tracing::warn!(gitsource = name, reason = failure.reason, message = %failure.message, "sync failed");
                self.event(
                    &object,
                    EventType::Warning,
                    failure.reason,
                    &failure.message,
                )
                .await;
            }
        }
        status.last_handled_reconcile_at = requested_at(&object);
        self.write_status(&object, &before, status);
        // Capped: a source stored before intervals were must not overflow the next due time.
        Some(spec.interval.capped())
    }

    async fn fetch_and_apply(
        &self,
        object: &StoredObject,
        spec: &GitSourceSpec,
        before: &mut GitSourceStatus,
        generation: i64,
    ) -> Result<(String, AppliedSet), Failure> {
        let checkout = Checkout::new(self.checkouts.join(object.uid()));
        let credentials = self
            .credentials(spec)
            .map_err(|m| Failure::fetch(None, m))?;
        let revision = checkout
            .fetch(&spec.url, &spec.ref_, credentials.as_ref())
            .await
            .map_err(|err| Failure::fetch(None, err.to_string()))?;

        let news = before.last_attempted_revision.as_deref() != Some(revision.as_str())
            || before.observed_generation != generation;
        if news {
            // Only a new revision or spec is news; a poll that finds nothing new writes nothing.
            let mut status = before.clone();
            set_condition(
                &mut status.conditions,
                condition_types::RECONCILING,
                ConditionStatus::True,
                reasons::PROGRESSING,
                &format!("applying revision {revision}"),
                generation,
                Utc::now(),
            );
            *before = self.write_status(object, before, status);
        }

        checkout
            .checkout(&revision)
            .await
            .map_err(|err| Failure::fetch(Some(&revision), err.to_string()))?;
        let root = checkout.dir().to_path_buf();
        let path = spec.path.clone();
        let loaded = tokio::task::spawn_blocking(move || manifests::load(&root, &path))
            .await
            .map_err(|err| Failure::apply(&revision, format!("reading manifests: {err}")))?
            .map_err(|err| Failure::apply(&revision, err.to_string()))?;

        let set = applyset_name(object.name());
        let batch = self
            .admit(object.name(), &loaded, &set)
            .map_err(|m| Failure::apply(&revision, m))?;
        let store = Arc::clone(&self.store);
        let set_name = set.clone();
        let prune = spec.prune;
        let result = tokio::task::spawn_blocking(move || {
            // The GitSource was written by an admin, and acts as one; Projects it creates get
            // no member, so only admins see them until members are added. An object another
            // applyset owns is left to it: taking it over would have its owner's next prune
            // and this set's fight over it.
            let params = SetParams {
                apply: Commit::Persist.into(),
                prune,
                takeover: Takeover::Refuse,
            };
            store.apply_set(&set_name, batch, params)
        })
        .await
        .map_err(|err| Failure::apply(&revision, format!("applying: {err}")))?;
        result
            .map_err(|failure| {
                let message = match failure.index.and_then(|i| loaded.get(i)) {
                    Some(m) => format!("{} ({}): {}", m.source, m.reference(), failure.error),
                    None => failure.error.to_string(),
                };
                Failure::apply(&revision, message)
            })
            .map(|applied| (revision, applied))
    }

    /// The credentials `spec.secretRef` names: the `username` (or [`git::TOKEN_USERNAME`]) and
    /// the `password` or `token` held for that GitSource.
    fn credentials(&self, spec: &GitSourceSpec) -> Result<Option<Credentials>, String> {
        if spec.secret_ref.is_empty() {
            return Ok(None);
        }
        let name = &spec.secret_ref;
        let holder = self
            .store
            .get(Kind::GitSource, name)
            .ok_or_else(|| format!("spec.secretRef: there is no GitSource {name:?}"))?;
        let mut values = self
            .secrets
            .values(holder.uid())
            .map_err(|err| format!("spec.secretRef: {err}"))?;
        // A credential goes only to the host it was set for (or, set before hosts were
        // recorded, to the host of its own GitSource), whichever GitSource names it.
        let bound = values
            .remove(CREDENTIAL_HOST)
            .filter(|host| !host.is_empty())
            .or_else(|| {
                berth_api::gitsource::credential_host(
                    &holder.spec.get_str("url").unwrap_or_default(),
                )
            });
        let wanted = berth_api::gitsource::credential_host(&spec.url);
        if bound.is_none() || bound != wanted {
            return Err(format!(
                "spec.secretRef: the credentials of GitSource {name:?} were set for host {}, \
                 not {}; they go to no other host (set them on a GitSource of this host)",
                bound.as_deref().unwrap_or("(none)"),
                wanted.as_deref().unwrap_or("(a URL that is not https)")
            ));
        }
        let password = values
            .remove(CREDENTIAL_PASSWORD)
            .or_else(|| values.remove(CREDENTIAL_TOKEN))
            .ok_or_else(|| {
                format!(
                    "spec.secretRef: GitSource {name:?} holds no password or token \
                     (berth gitsource secret set {name} token)"
                )
            })?;
        let username = values
            .remove(CREDENTIAL_USERNAME)
            .unwrap_or_else(|| git::TOKEN_USERNAME.to_string());
        Ok(Some(Credentials { username, password }))
    }

    /// Admits every manifest of GitSource `source` through the one admission, as the GitSource
    /// (on behalf of the admin who wrote it), tagged with the applyset. The first problem is
    /// reported with its file, document and field.
    fn admit(&self, source: &str, loaded: &[Manifest], set: &str) -> Result<Vec<Desired>, String> {
        let who = Admitter::GitSource { name: source };
        let mut batch = Vec::with_capacity(loaded.len());
        for manifest in loaded {
            let refused =
                |refusal| format!("{} ({}): {refusal}", manifest.source, manifest.reference());
            let mut admitted = self
                .admission
                .admit(who, &manifest.object, &self.store)
                .map_err(refused)?;
            admitted
                .desired
                .annotations
                .insert(annotations::APPLYSET.to_string(), set.to_string());
            let current = self
                .store
                .get(admitted.desired.kind, &admitted.desired.name);
            self.admission
                .check(who, &admitted.desired, current.as_deref(), &self.store)
                .map_err(refused)?;
            batch.push(admitted.desired);
        }
        Ok(batch)
    }

    /// Writes `status` when it differs from `before`; `lastSyncedAt` moves only with such a
    /// write, so polling an unchanged repository leaves the GitSource untouched. Returns the
    /// status as it now stands.
    fn write_status(
        &self,
        object: &StoredObject,
        before: &GitSourceStatus,
        mut status: GitSourceStatus,
    ) -> GitSourceStatus {
        status.last_synced_at = before.last_synced_at;
        if &status == before && !object.status.is_null() {
            return status;
        }
        status.last_synced_at = Some(Utc::now());
        let value = match serde_json::to_value(&status) {
            Ok(value) => value,
            Err(err) => {
                tracing::error!(%err, "encoding a GitSource status");
                return before.clone();
            }
        };
        // Guard on the uid: a GitSource deleted and recreated under the same name meanwhile is
        // another object, whose status stays as it is.
        let mut replaced = false;
        let written = self.store.write_status(
            StatusWrite::new(Kind::GitSource, object.name(), FieldManager::GitOps),
            |latest| {
                replaced = latest.uid() != object.uid();
                if replaced {
                    latest.status.value()
                } else {
                    value.clone()
                }
            },
        );
        match written {
            Ok(StatusWritten::Written(_) | StatusWritten::Unchanged(_)) if !replaced => status,
            Ok(_) => before.clone(),
            Err(err) => {
                tracing::warn!(gitsource = object.name(), %err, "cannot write the GitSource status");
                before.clone()
            }
        }
    }

    async fn event(&self, object: &StoredObject, type_: EventType, reason: &str, message: &str) {
        self.store
            .publish_event(object, type_, reason, message)
            .await;
    }
}

/// Why a sync failed, and at which revision (none when the fetch itself failed).
struct Failure {
    revision: Option<String>,
    reason: &'static str,
    message: String,
}

impl Failure {
    /// Messages land in conditions, events and logs: any URL in them is shown redacted.
    fn fetch(revision: Option<&str>, message: String) -> Failure {
        Failure {
            revision: revision.map(str::to_string),
            reason: reasons::FETCH_FAILED,
            message: berth_api::redact_credentials(&message).into_owned(),
        }
    }

    fn apply(revision: &str, message: String) -> Failure {
        Failure {
            revision: Some(revision.to_string()),
            reason: reasons::APPLY_FAILED,
            message: berth_api::redact_credentials(&format!("revision {revision}: {message}"))
                .into_owned(),
        }
    }
}

/// `left 2 objects to the applysets that own them: Project/a (applyset cli), ...`, naming every
/// one, or `None` without conflicts.
/// A sync that ended: Ready as `ready` says, and no longer Reconciling, for one reason.
fn settled(
    status: &mut GitSourceStatus,
    ready: ConditionStatus,
    reason: &str,
    message: &str,
    generation: i64,
    now: chrono::DateTime<Utc>,
) {
    for (type_, value) in [
        (condition_types::READY, ready),
        (condition_types::RECONCILING, ConditionStatus::False),
    ] {
        set_condition(
            &mut status.conditions,
            type_,
            value,
            reason,
            message,
            generation,
            now,
        );
    }
}

fn conflicts_message(conflicts: &[SetConflict]) -> Option<String> {
    if conflicts.is_empty() {
        return None;
    }
    let named: Vec<String> = conflicts
        .iter()
        .map(|c| format!("{}/{} (applyset {})", c.kind, c.name, c.owner))
        .collect();
    let count = match conflicts.len() {
        1 => "1 object".to_string(),
        n => format!("{n} objects"),
    };
    Some(format!(
        "left {count} to the applysets that own them (not taken over): {}",
        named.join(", ")
    ))
}

/// `created AgentProfile/a; configured Project/b; pruned Project/c`, or `None` when the apply
/// changed nothing.
fn summarize(applied: &AppliedSet) -> Option<String> {
    let mut groups: Vec<(&str, Vec<String>)> = vec![
        ("created", Vec::new()),
        ("configured", Vec::new()),
        ("pruned", Vec::new()),
    ];
    for (object, action) in &applied.applied {
        let slot = match action {
            Action::Created => 0,
            Action::Configured => 1,
            Action::Unchanged => continue,
        };
        groups[slot]
            .1
            .push(format!("{}/{}", object.kind, object.name()));
    }
    for deletion in &applied.pruned {
        let object = deletion.object();
        groups[2]
            .1
            .push(format!("{}/{}", object.kind, object.name()));
    }
    let parts: Vec<String> = groups
        .into_iter()
        .filter(|(_, names)| !names.is_empty())
        .map(|(verb, names)| {
            let shown = names.iter().take(EVENT_NAMES).cloned().collect::<Vec<_>>();
            let more = names.len().saturating_sub(EVENT_NAMES);
            if more > 0 {
                format!("{verb} {} and {more} more", shown.join(", "))
            } else {
                format!("{verb} {}", shown.join(", "))
            }
        })
        .collect();
    (!parts.is_empty()).then(|| parts.join("; "))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use berth_api::ObjectMeta;

    use super::*;
    use crate::store::{Commit, Deletion};

    fn object(kind: Kind, name: &str) -> Arc<StoredObject> {
        Arc::new(StoredObject {
            kind,
            metadata: ObjectMeta {
                name: name.to_string(),
                uid: Some(format!("uid-{name}")),
                generation: Some(1),
                annotations: BTreeMap::new(),
                ..ObjectMeta::default()
            },
            spec: crate::store::Doc::null(),
            status: crate::store::Doc::null(),
        })
    }

    #[test]
    fn a_summary_names_what_changed_and_nothing_when_nothing_did() {
        let unchanged = AppliedSet {
            applied: vec![(object(Kind::Project, "a"), Action::Unchanged)],
            pruned: vec![],
            conflicts: vec![],
        };
        assert_eq!(summarize(&unchanged), None);
        let changed = AppliedSet {
            applied: vec![
                (object(Kind::Project, "a"), Action::Unchanged),
                (object(Kind::Project, "b"), Action::Created),
                (object(Kind::AgentProfile, "c"), Action::Configured),
            ],
            pruned: vec![Deletion::Deleted(object(Kind::Project, "d"))],
            conflicts: vec![],
        };
        assert_eq!(
            summarize(&changed).unwrap(),
            "created Project/b; configured AgentProfile/c; pruned Project/d"
        );
        let many = AppliedSet {
            applied: (0..12)
                .map(|i| (object(Kind::Project, &format!("p{i:02}")), Action::Created))
                .collect(),
            pruned: vec![],
            conflicts: vec![],
        };
        assert!(
            summarize(&many)
                .unwrap()
                .ends_with("Project/p09 and 2 more")
        );
    }

    #[test]
    fn a_request_during_a_sync_runs_another_right_after() {
        let first = object(Kind::GitSource, "fleet");
        let mut tracked = Tracked::of(&first);
        tracked.running = true;
        tracked.due = None;
        assert!(!tracked.wants_sync(&first));

        let mut asked = (*first).clone();
        asked
            .metadata
            .annotations
            .insert(annotations::REQUESTED_AT.to_string(), "now".to_string());
        assert!(tracked.wants_sync(&asked));
        tracked.request(&asked);
        assert!(tracked.running && tracked.again && tracked.due.is_none());

        // The same value again is not a new request.
        assert!(!tracked.wants_sync(&asked));
    }

    #[test]
    fn secret_ref_hands_git_the_sealed_credentials_and_they_go_with_their_gitsource() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(Store::open(&dir.path().join("berth.db")).unwrap());
        let secrets = Arc::new(Secrets::open(Arc::clone(&store), dir.path()).unwrap());
        let gitops = GitOps {
            secrets: Arc::clone(&secrets),
            store: Arc::clone(&store),
            admission: Arc::new(Admission::new(berth_api::Defaults::default())),
            checkouts: dir.path().join("checkouts"),
        };
        let url = "https://git.example/fleet.git";
        let fleet = store
            .create(
                Desired::of(Kind::GitSource, "fleet", serde_json::json!({"url": url})),
                Commit::Persist,
            )
            .unwrap();
        let spec = |secret_ref: &str| GitSourceSpec {
            url: url.to_string(),
            secret_ref: secret_ref.to_string(),
            ..GitSourceSpec::default()
        };
        assert_eq!(gitops.credentials(&spec("")).unwrap(), None);
        let missing = gitops.credentials(&spec("other")).unwrap_err();
        assert_eq!(missing, "spec.secretRef: there is no GitSource \"other\"");
        let empty = gitops.credentials(&spec("fleet")).unwrap_err();
        assert!(empty.contains("holds no password or token"), "{empty}");

        secrets
            .set(fleet.uid(), CREDENTIAL_TOKEN, b"tok-123")
            .unwrap();
        assert_eq!(
            gitops.credentials(&spec("fleet")).unwrap(),
            Some(Credentials {
                username: git::TOKEN_USERNAME.to_string(),
                password: "tok-123".to_string()
            })
        );
        secrets
            .set(fleet.uid(), CREDENTIAL_USERNAME, b"bot")
            .unwrap();
        secrets
            .set(fleet.uid(), CREDENTIAL_PASSWORD, b"pw")
            .unwrap();
        assert_eq!(
            gitops.credentials(&spec("fleet")).unwrap(),
            Some(Credentials {
                username: "bot".to_string(),
                password: "pw".to_string()
            })
        );

        // Only projects and GitSources hold secrets; a GitSource's go when it goes.
        let profile = store
            .create(
                Desired::of(Kind::AgentProfile, "p", serde_json::json!({})),
                Commit::Persist,
            )
            .unwrap();
        assert!(secrets.set(profile.uid(), CREDENTIAL_TOKEN, b"x").is_err());
        store
            .delete(
                Kind::GitSource,
                "fleet",
                None,
                Default::default(),
                Commit::Persist,
            )
            .unwrap();
        assert!(secrets.values(fleet.uid()).unwrap().is_empty());
        assert!(secrets.set(fleet.uid(), CREDENTIAL_TOKEN, b"x").is_err());
    }

    #[test]
    fn a_revision_carrying_a_force_applies_nothing_and_says_why() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(Store::open(&dir.path().join("berth.db")).unwrap());
        let gitops = GitOps {
            secrets: Arc::new(Secrets::open(Arc::clone(&store), dir.path()).unwrap()),
            store,
            admission: Arc::new(Admission::new(berth_api::Defaults::default())),
            checkouts: dir.path().join("checkouts"),
        };
        let repo = dir.path().join("repo");
        std::fs::create_dir_all(&repo).unwrap();
        std::fs::write(
            repo.join("a.yaml"),
            "apiVersion: berth.dev/v1alpha1\nkind: Project\nmetadata: {name: calm}\n",
        )
        .unwrap();
        std::fs::write(
            repo.join("b.yaml"),
            "apiVersion: berth.dev/v1alpha1\nkind: Project\nmetadata:\n  name: armed\n  \
             annotations: {berth.dev/forceDelete: \"true\"}\n",
        )
        .unwrap();
        let loaded = manifests::load(&repo, ".").unwrap();
        let message = gitops
            .admit("fleet", &loaded, "gitsource-fleet")
            .unwrap_err();
        assert!(
            message.ends_with(
                "(Project/armed): metadata.annotations[berth.dev/forceDelete]: \
                 set only by a delete request (berth delete --force)"
            ),
            "{message}"
        );
    }

    /// The GitSource controller's call into admission: what the API refuses, a repository
    /// cannot slip in, and the applyset is only this GitSource's.
    #[test]
    fn a_repository_meets_every_admission_rule() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(Store::open(&dir.path().join("berth.db")).unwrap());
        let gitops = GitOps {
            secrets: Arc::new(Secrets::open(Arc::clone(&store), dir.path()).unwrap()),
            store,
            admission: Arc::new(Admission::new(berth_api::Defaults::default())),
            checkouts: dir.path().join("checkouts"),
        };
        let table = [
            (
                "spec:\n  forwards:\n  - {port: 80, to: '192.0.2.10:80'}\n",
                "spec.forwards[0].to",
            ),
            ("  finalizers: [example.com/wedge]\n", "metadata.finalizers"),
            (
                "  annotations: {berth.dev/purge: 'true'}\n",
                "berth.dev/purge",
            ),
        ];
        for (i, (extra, field)) in table.into_iter().enumerate() {
            let repo = dir.path().join(format!("repo-{i}"));
            std::fs::create_dir_all(&repo).unwrap();
            std::fs::write(
                repo.join("p.yaml"),
                format!(
                    "apiVersion: berth.dev/v1alpha1\nkind: Project\nmetadata:\n  name: p\n{extra}"
                ),
            )
            .unwrap();
            let loaded = manifests::load(&repo, ".").unwrap();
            let message = gitops
                .admit("fleet", &loaded, "gitsource-fleet")
                .unwrap_err();
            assert!(message.contains(field), "{field}: {message}");
        }
        let repo = dir.path().join("repo-ok");
        std::fs::create_dir_all(&repo).unwrap();
        std::fs::write(
            repo.join("p.yaml"),
            "apiVersion: berth.dev/v1alpha1\nkind: Project\nmetadata: {name: p}\n",
        )
        .unwrap();
        let loaded = manifests::load(&repo, ".").unwrap();
        assert!(gitops.admit("fleet", &loaded, "gitsource-fleet").is_ok());
        let message = gitops
            .admit("fleet", &loaded, "gitsource-other")
            .unwrap_err();
        assert!(message.contains("gitsource-other"), "{message}");
    }
}
