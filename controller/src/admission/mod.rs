//! Admission: the one place an object a writer sends becomes what the store writes, whoever
//! the writer is ([`Admitter`]): an API user or admin (create, replace, merge patch, apply,
//! batch apply, and the console, which makes the same API calls), the GitSource controller on
//! behalf of the admin who wrote the GitSource, or a restore from the trash. Order: decode
//! (unknown fields are errors; status and server-set metadata are ignored) → validate → fleet
//! defaults (for a project that exists, its stored defaulted values) → server-owned metadata →
//! the writer's rules ([`Admission::check`]). Uniqueness of `displayName` is the store's to
//! enforce, atomically with the write; its refusal names no other project.
//!
//! Every rule lives here once, so no entry point can skip one:
//! - server-owned metadata ([`SERVER_OWNED`] annotations, [`SERVER_OWNED_FIELDS`]) may be
//!   repeated as stored, never set: how an object was asked to go comes from the delete request
//!   alone, and finalizers are the controller's (an admin may still edit them by hand);
//! - `spec.forwards` go to loopback or `allowedForwardTargets` only, whoever writes them, and
//!   only an admin (or an admin's GitSource) changes them;
//! - a user who is not an admin keeps the resource limits it was given and names `file://`
//!   repositories under `allowedFileRoots` only;
//! - an AgentProfile's skills come from under `allowedFileRoots` only, whoever writes it;
//! - a GitSource's applyset (`gitsource-*`) is its controller's alone.
//!
//! Who may touch which object (membership, admin-only kinds) is access's (`api::access`).
//!
//! Entry points call [`Admission::admit`] once and [`Admission::check`] again on each fresh read
//! right before a write (the API's retries, the GitSource's applyset tag). A refusal of
//! server-owned metadata is a 400 naming it, and of membership a 404, as for a missing name.
//! Limits beyond the host's capacity, which the daemon reads from LXD once it answers, are warned
//! of (the API's `Warning: 299` headers, which the client prints). A project's agent adds a
//! schedule through [`Admission::admit_schedule`], as [`Admitter::ProjectAgent`]: that project's
//! `spec.schedules`, nothing else. Nothing here knows HTTP.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, PoisonError, RwLock};

use berth_api::annotations::{self, OVERRIDES, SERVER_OWNED, SERVER_OWNED_FIELDS};
use berth_api::{DEFAULTED_FIELDS, Defaults, FieldError as Cause, GitSource, Kind, Object};
use serde_json::{Map, Value};

use crate::file_roots::{ConfineError, FileRoots};
use crate::runtime::HostCapacity;
use crate::store::{Desired, Store, StoredObject};

/// Who writes an object. Admission's rules depend on it, and on nothing else about a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admitter<'a> {
    /// An API user who is not an admin (over TCP, with its token; or the console's session).
    User { name: &'a str },
    /// An admin token's user (over TCP, or the console's session).
    Admin { name: &'a str },
    /// The local administrator on the unix socket: an admin who also holds the last resort
    /// over finalizers, as the controller itself does (a deletion no finalizer may end
    /// otherwise). Nobody reaching the daemon over a network does.
    Local { name: &'a str },
    /// The GitSource controller applying GitSource `name`'s manifests. GitSources are written
    /// by admins, and one applies on its owner's behalf, with an admin's rights, except what
    /// no manifest may do: set server-owned metadata, or forward anywhere not allowed.
    GitSource { name: &'a str },
    /// A project put back from the trash, as it was.
    Restore,
    /// A project's own agent, by the project token of its `schedules` capability: it may add
    /// to that project's `spec.schedules` and change nothing else.
    ProjectAgent { project: &'a str },
}

impl Admitter<'_> {
    /// Whether this writer has an admin's rights over limits, forwards and host paths.
    fn acts_as_admin(&self) -> bool {
        !matches!(self, Admitter::User { .. } | Admitter::ProjectAgent { .. })
    }

    fn describe(&self) -> String {
        match self {
            Admitter::User { name } | Admitter::Admin { name } | Admitter::Local { name } => {
                format!("user {name:?}")
            }
            Admitter::GitSource { name } => format!("GitSource {name:?}"),
            Admitter::Restore => "a restore".to_string(),
            Admitter::ProjectAgent { project } => format!("the agent of project {project:?}"),
        }
    }
}

/// A manifest's decode and validation errors, each naming its field.
fn invalid(errors: berth_api::ValidationErrors) -> Refusal {
    Refusal::Invalid(
        errors
            .causes
            .into_iter()
            .map(|c| Cause::new(c.field, c.message))
            .collect(),
    )
}

/// A project's agent writes its own project's `spec.schedules`, and nothing else of it or of
/// any other object.
fn only_schedules(
    project: &str,
    desired: &Desired,
    current: Option<&StoredObject>,
) -> Result<(), Refusal> {
    let Some(current) = current.filter(|c| c.kind == Kind::Project && c.name() == project) else {
        return Err(Refusal::forbidden(
            "metadata.name",
            format!("the agent of project {project:?} writes that project alone"),
        ));
    };
    let without_schedules = |spec: &Value| {
        let mut spec = spec.clone();
        if let Some(fields) = spec.as_object_mut() {
            fields.remove("schedules");
        }
        spec
    };
    let same_meta = desired.labels == current.metadata.labels
        && desired.annotations == current.metadata.annotations
        && desired.finalizers.is_none();
    if !same_meta || without_schedules(&desired.spec) != without_schedules(&current.spec.value()) {
        return Err(Refusal::forbidden(
            "spec",
            format!("the agent of project {project:?} may change only its spec.schedules"),
        ));
    }
    Ok(())
}

/// The host's capacity once LXD has told it (`None` until then, or when it cannot be read):
/// filled by the daemon, read by admission's warnings.
pub type HostSlot = Arc<RwLock<Option<HostCapacity>>>;

/// The warnings for a project's `spec.resources` beyond what `host` has.
fn over_capacity(name: &str, spec: &Value, host: HostCapacity) -> Vec<String> {
    let Some(resources) = spec
        .get("resources")
        .and_then(|r| serde_json::from_value::<berth_api::Resources>(r.clone()).ok())
    else {
        return Vec::new();
    };
    let mut warnings = Vec::new();
    if let Some(memory) = resources
        .memory
        .filter(|m| m.as_bytes() > host.memory_bytes)
    {
        warnings.push(format!(
            "Project/{name}: spec.resources.memory {memory} is more than this host has ({}): \
             LXD starts it, but the host cannot back it",
            gib(host.memory_bytes)
        ));
    }
    if let Some(cpu) = resources
        .cpu
        .filter(|c| c.millis() > host.cpus.saturating_mul(1000))
    {
        warnings.push(format!(
            "Project/{name}: spec.resources.cpu {cpu} is more than this host has ({} CPUs): \
             LXD starts it on the CPUs there are",
            host.cpus
        ));
    }
    warnings
}

/// `bytes` in GiB, one decimal where it has one.
fn gib(bytes: u64) -> String {
    let tenths = (bytes as f64 / f64::from(1u32 << 30) * 10.0).round() / 10.0;
    format!("{tenths}GiB")
}

/// What admission makes of one manifest.
#[derive(Debug, Clone, PartialEq)]
pub struct Admitted {
    pub desired: Desired,
    /// `metadata.resourceVersion` as the request sent it: the precondition of a replace.
    pub resource_version: Option<u64>,
    /// `metadata.finalizers` when the request named them: a replace sets them, apply keeps the
    /// stored ones.
    pub finalizers: Option<Vec<String>>,
}

/// Why admission refused a manifest.
#[derive(Debug, Clone, PartialEq)]
pub enum Refusal {
    /// The object is not acceptable (422); every cause names its field.
    Invalid(Vec<Cause>),
    /// The manifest sets what only the server writes (400), each cause naming the field.
    ServerOwned(Vec<Cause>),
    /// The writer may not write this (403); the cause names the field.
    Forbidden(Vec<Cause>),
    /// The object exists but is not the writer's to see: answered as if it did not (404).
    Hidden(Kind, String),
}

impl Refusal {
    pub fn causes(&self) -> &[Cause] {
        match self {
            Refusal::Invalid(causes)
            | Refusal::ServerOwned(causes)
            | Refusal::Forbidden(causes) => causes,
            Refusal::Hidden(..) => &[],
        }
    }

    /// The same refusal with each cause's field rewritten (e.g. under `items[3]`).
    pub fn map_causes(self, f: impl Fn(Cause) -> Cause) -> Refusal {
        match self {
            Refusal::Invalid(causes) => Refusal::Invalid(causes.into_iter().map(f).collect()),
            Refusal::ServerOwned(causes) => {
                Refusal::ServerOwned(causes.into_iter().map(f).collect())
            }
            Refusal::Forbidden(causes) => Refusal::Forbidden(causes.into_iter().map(f).collect()),
            hidden @ Refusal::Hidden(..) => hidden,
        }
    }

    fn forbidden(field: impl Into<String>, message: impl Into<String>) -> Refusal {
        Refusal::Forbidden(vec![Cause::new(field, message)])
    }
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if let Refusal::Hidden(kind, name) = self {
            return write!(f, "{kind} {name:?} not found");
        }
        let details: Vec<String> = self.causes().iter().map(Cause::to_string).collect();
        f.write_str(&details.join("; "))
    }
}

pub struct Admission {
    defaults: Defaults,
    /// The spec a project naming nothing gets: what each defaulted field starts from.
    defaulted_spec: Value,
    host: HostSlot,
    /// The config's `allowedForwardTargets`, beside loopback.
    pub(crate) forward_targets: Vec<String>,
    /// The config's `allowedFileRoots`, where a user may name `file://` repositories.
    pub(crate) file_roots: Vec<std::path::PathBuf>,
}

impl Admission {
    pub fn new(defaults: Defaults) -> Self {
        let mut bare = berth_api::Project::new("bare", Default::default());
        bare.apply_defaults(&defaults);
        let defaulted_spec = serde_json::to_value(&bare.spec).unwrap_or(Value::Null);
        Admission {
            defaults,
            defaulted_spec,
            host: HostSlot::default(),
            forward_targets: Vec::new(),
            file_roots: Vec::new(),
        }
    }

    /// Where forwards may go beside loopback (the config's `allowedForwardTargets`).
    pub fn with_forward_targets(mut self, targets: Vec<String>) -> Self {
        self.forward_targets = targets;
        self
    }

    /// Where a user may name `file://` repositories (the config's `allowedFileRoots`).
    pub fn with_file_roots(mut self, roots: Vec<std::path::PathBuf>) -> Self {
        self.file_roots = roots;
        self
    }

    /// Where the daemon puts the host's capacity once LXD answers.
    pub fn host_slot(&self) -> HostSlot {
        Arc::clone(&self.host)
    }

    /// What the API answers beside an admitted object as `Warning` headers: limits the host
    /// cannot back. LXD starts such a container, so they are warned of, not refused; nothing is
    /// said while the host's capacity is unknown.
    pub fn warnings(&self, desired: &Desired) -> Vec<String> {
        self.warnings_against(desired, self.host())
    }

    /// The host's capacity as LXD last told it, `None` while unknown.
    pub fn host(&self) -> Option<HostCapacity> {
        *self.host.read().unwrap_or_else(PoisonError::into_inner)
    }

    /// [`Self::warnings`] against `host`, a capacity read once for a whole batch so that every
    /// object of it is judged alike, even when LXD first answers meanwhile.
    pub fn warnings_against(&self, desired: &Desired, host: Option<HostCapacity>) -> Vec<String> {
        match host {
            Some(host) if desired.kind == Kind::Project => {
                over_capacity(&desired.name, &desired.spec, host)
            }
            _ => Vec::new(),
        }
    }

    /// The resources a project naming none is given: what a non-admin may create with.
    pub fn default_resources(&self) -> Value {
        self.defaulted_spec
            .get("resources")
            .cloned()
            .unwrap_or(Value::Null)
    }

    /// What `manifest` makes of the object `store` holds under its name (or of a new one),
    /// written by `who`: every rule of this module applied. Fleet defaults fill a project's
    /// fields only when it is created; an existing project keeps the defaulted values it holds,
    /// so re-applying a manifest stays idempotent when the defaults change.
    pub fn admit(
        &self,
        who: Admitter<'_>,
        manifest: &Value,
        store: &Store,
    ) -> Result<Admitted, Refusal> {
        self.admit_into(who, manifest, store, None)
    }

    /// [`Admission::admit`] for an object applied into `applyset` (tagged with it before the
    /// rules are checked: moving an object into a set is a write of it).
    pub fn admit_into(
        &self,
        who: Admitter<'_>,
        manifest: &Value,
        store: &Store,
        applyset: Option<&str>,
    ) -> Result<Admitted, Refusal> {
        let mut current = None;
        let mut admitted = self.admit_over(who, manifest, |kind, name| {
            current = store.get(kind, name);
            current.clone()
        })?;
        if let Some(set) = applyset {
            admitted
                .desired
                .annotations
                .insert(annotations::APPLYSET.to_string(), set.to_string());
        }
        let mut desired = admitted.desired.clone();
        desired.finalizers = admitted.finalizers.clone();
        self.check(who, &desired, current.as_deref(), store)?;
        Ok(admitted)
    }

    /// What `manifest` makes of an object that does not exist yet, written by an admin; only
    /// the rules that do not depend on other objects apply.
    #[cfg(test)]
    fn admit_new(&self, who: Admitter<'_>, manifest: &Value) -> Result<Admitted, Refusal> {
        self.admit_over(who, manifest, |_, _| None)
    }

    /// The writer's rules for `desired` over `current` (absent when it would be created): run by
    /// [`Admission::admit`], and again by a writer that reads the object afresh before it
    /// writes (the API's retries), so what is judged is what is overwritten.
    pub fn check(
        &self,
        who: Admitter<'_>,
        desired: &Desired,
        current: Option<&StoredObject>,
        store: &Store,
    ) -> Result<(), Refusal> {
        if let Admitter::User { name } = who {
            if desired.kind != Kind::Project {
                // Re-applying what is already there changes nothing, so a member's GitOps
                // directory may carry the admin's profiles.
                if current.is_some_and(|c| unchanged(desired, c)) {
                    return Ok(());
                }
                return Err(Refusal::forbidden(
                    "kind",
                    format!(
                        "user {name:?} may not write {} objects: admins only",
                        desired.kind
                    ),
                ));
            }
            // Of a project it is not a member of, a user hears what it would of a name that
            // does not exist.
            if let Some(current) = current
                && !store.is_member(current.uid(), name)
            {
                return Err(Refusal::Hidden(current.kind, current.name().to_string()));
            }
        }
        if let Admitter::ProjectAgent { project } = who {
            return only_schedules(project, desired, current);
        }
        check_server_owned_fields(who, desired.finalizers.as_deref(), current)?;
        if let Some(set) = desired.annotations.get(annotations::APPLYSET)
            && current.and_then(|c| c.metadata.annotations.get(annotations::APPLYSET)) != Some(set)
        {
            self.check_applyset(who, set)?;
        }
        if desired.kind == Kind::AgentProfile {
            self.check_skill_sources(desired, current)?;
        }
        if desired.kind != Kind::Project {
            return Ok(());
        }
        self.check_forwards(who, desired, current)?;
        if who.acts_as_admin() {
            return Ok(());
        }
        let resources = desired.spec.get("resources").unwrap_or(&Value::Null);
        let allowed = match current {
            Some(current) => current.spec.get("resources").unwrap_or(Value::Null),
            None => self.default_resources(),
        };
        if *resources != allowed {
            return Err(Refusal::forbidden(
                "spec.resources",
                format!(
                    "{} may not set spec.resources of project {:?}: resource limits are changed \
                     by admins only",
                    who.describe(),
                    desired.name
                ),
            ));
        }
        let url = repo_url(&desired.spec);
        let current_spec = current.map(|c| c.spec.value()).unwrap_or_default();
        if url != repo_url(&current_spec) {
            self.check_file_url(who, "spec.repo.url", url)?;
        }
        Ok(())
    }

    /// A project's agent adding `schedule` to its own project `current`: the project as it is
    /// (metadata, defaults and the fields they override untouched) with the schedule appended,
    /// validated as any manifest is and checked as [`Admitter::ProjectAgent`].
    pub fn admit_schedule(
        &self,
        current: &StoredObject,
        schedule: &berth_api::ScheduleSpec,
        store: &Store,
    ) -> Result<Desired, Refusal> {
        let mut spec = current.spec.value();
        let Some(fields) = spec.as_object_mut() else {
            return Err(Refusal::forbidden("spec", "the stored project has no spec"));
        };
        let entry = serde_json::to_value(schedule).unwrap_or_default();
        match fields.get_mut("schedules").and_then(Value::as_array_mut) {
            Some(list) => list.push(entry),
            None => {
                fields.insert("schedules".to_string(), Value::Array(vec![entry]));
            }
        }
        let manifest = serde_json::json!({
            "apiVersion": berth_api::API_VERSION,
            "kind": "Project",
            "metadata": {"name": current.name()},
            "spec": spec,
        });
        berth_api::decode_manifest(manifest).map_err(invalid)?;
        let desired = Desired {
            kind: Kind::Project,
            name: current.name().to_string(),
            labels: current.metadata.labels.clone(),
            annotations: current.metadata.annotations.clone(),
            finalizers: None,
            spec,
        };
        let who = Admitter::ProjectAgent {
            project: current.name(),
        };
        self.check(who, &desired, Some(current), store)?;
        Ok(desired)
    }

    /// Whether `who` may write into applyset `set`: a GitSource's set is that GitSource's
    /// alone. Joining one would show the member the GitSource (its URL, inventory and events)
    /// and put the object under the GitSource's prune.
    pub fn check_applyset(&self, who: Admitter<'_>, set: &str) -> Result<(), Refusal> {
        if !GitSource::owns_applyset(set) {
            return Ok(());
        }
        match who {
            Admitter::GitSource { name } if GitSource::applyset_name(name) == set => Ok(()),
            _ => Err(Refusal::forbidden(
                "applyset",
                format!(
                    "{set:?} is a GitSource's applyset: only the GitSource controller applies \
                     into it"
                ),
            )),
        }
    }

    /// `spec.forwards` open a path from the container to the host: only an admin (or an admin's
    /// GitSource, or a restore of what was) sets or changes them, and whoever writes them, only
    /// towards loopback or the config's `allowedForwardTargets`.
    fn check_forwards(
        &self,
        who: Admitter<'_>,
        desired: &Desired,
        current: Option<&StoredObject>,
    ) -> Result<(), Refusal> {
        let wanted = desired.spec.get("forwards").unwrap_or(&Value::Null);
        let had = current
            .and_then(|c| c.spec.get("forwards"))
            .unwrap_or(Value::Null);
        if *wanted == had {
            return Ok(());
        }
        if !who.acts_as_admin() {
            return Err(Refusal::forbidden(
                "spec.forwards",
                format!(
                    "{} may not set spec.forwards of project {:?}: host forwards are set by \
                     admins only",
                    who.describe(),
                    desired.name
                ),
            ));
        }
        for (i, forward) in wanted.as_array().into_iter().flatten().enumerate() {
            let to = forward.get("to").and_then(Value::as_str).unwrap_or("");
            if let Err(message) = crate::agent::forwards::check_target(to, &self.forward_targets) {
                return Err(Refusal::Invalid(vec![Cause::new(
                    format!("spec.forwards[{i}].to"),
                    message,
                )]));
            }
        }
        Ok(())
    }

    /// An AgentProfile's skills are copied into every workspace that lists the profile, for
    /// its members to read: whoever writes the profile, a skill's host directory or `file://`
    /// repository lies under `allowedFileRoots`. A source the stored profile names already is
    /// not judged again (the roots may have changed since); one that does not exist yet is
    /// judged when it is placed.
    fn check_skill_sources(
        &self,
        desired: &Desired,
        current: Option<&StoredObject>,
    ) -> Result<(), Refusal> {
        let skills = desired.spec.get("skills").and_then(Value::as_array);
        let had = current
            .and_then(|c| c.spec.get("skills"))
            .unwrap_or_default();
        let had = had.as_array().map(Vec::as_slice).unwrap_or_default();
        let roots = FileRoots::new(self.file_roots.clone());
        for (i, skill) in skills.into_iter().flatten().enumerate() {
            let (field, path) = match (skill.get("path"), skill.pointer("/repo/url")) {
                (Some(Value::String(path)), _) => (format!("spec.skills[{i}].path"), path.as_str()),
                (_, Some(Value::String(url))) => match berth_api::file_url_path(url) {
                    Some(path) => (format!("spec.skills[{i}].repo.url"), path),
                    None => continue,
                },
                _ => continue,
            };
            let source = |s: &Value| {
                s.get("path")
                    .or_else(|| s.pointer("/repo/url"))
                    .cloned()
                    .unwrap_or_default()
            };
            if had.iter().any(|h| source(h) == source(skill)) {
                continue;
            }
            let invalid = |message: String| Refusal::Invalid(vec![Cause::new(&field, message)]);
            let host = Path::new(path);
            if !roots.names(host) {
                return Err(invalid(format!(
                    "{path:?} is not under allowedFileRoots: skills are copied into the workspaces of \
                     every project that lists the profile, so they come only from there"
                )));
            }
            let judged = if field.ends_with(".path") {
                roots.confine_dir(host).map(|_| ())
            } else {
                roots.confine(host).map(|_| ())
            };
            if let Err(ConfineError::Outside(why)) = judged {
                return Err(invalid(format!(
                    "{path:?} leads outside allowedFileRoots ({why})"
                )));
            }
        }
        Ok(())
    }

    /// A `file://` URL reads the daemon's host: a user who is not an admin may name only paths
    /// under `allowedFileRoots`.
    pub fn check_file_url(&self, who: Admitter<'_>, field: &str, url: &str) -> Result<(), Refusal> {
        let Some(path) = berth_api::file_url_path(url) else {
            return Ok(());
        };
        if who.acts_as_admin() {
            return Ok(());
        }
        let path = Path::new(path);
        let roots = FileRoots::new(self.file_roots.clone());
        if !roots.names(path) {
            return Err(Refusal::forbidden(
                field,
                format!(
                    "{url:?} is not under allowedFileRoots; only an admin may name this host path"
                ),
            ));
        }
        // Where git would read, links, `gitdir:` and alternates followed. A repository that does
        // not exist yet cannot be judged now; the checkout judges it when it runs.
        match roots.confine(path) {
            Err(ConfineError::Outside(why)) => Err(Refusal::forbidden(
                field,
                format!(
                    "{url:?} leads outside allowedFileRoots ({why}); only an admin may name it"
                ),
            )),
            Ok(_) | Err(ConfineError::Unresolved(_)) => Ok(()),
        }
    }

    fn admit_over(
        &self,
        who: Admitter<'_>,
        manifest: &Value,
        stored: impl FnOnce(Kind, &str) -> Option<Arc<StoredObject>>,
    ) -> Result<Admitted, Refusal> {
        let empty = Map::new();
        let metadata = manifest
            .get("metadata")
            .and_then(Value::as_object)
            .unwrap_or(&empty);
        let resource_version = sent_resource_version(metadata).map_err(Refusal::Invalid)?;
        let finalizers = metadata
            .get("finalizers")
            .and_then(|f| serde_json::from_value::<Vec<String>>(f.clone()).ok());

        let mut object = berth_api::decode_manifest(manifest.clone()).map_err(invalid)?;
        let given =
            matches!(object, Object::Project(_)).then(|| given_fields(&object.spec_value()));
        if let Object::Project(project) = &mut object {
            project.apply_defaults(&self.defaults);
        }
        let mut spec = object.spec_value();
        let kind = object.kind();
        let meta = object.metadata_mut();
        let name = std::mem::take(&mut meta.name);
        let mut annotations = std::mem::take(&mut meta.annotations);
        let current = stored(kind, &name);
        check_server_owned(&annotations, current.as_deref()).map_err(Refusal::ServerOwned)?;
        check_server_owned_fields(who, finalizers.as_deref(), current.as_deref())?;
        // A user who may not change a project's resources and leaves the block out keeps the
        // stored one (a read, an edit of the brief and a replace must not read as a change).
        if matches!(who, Admitter::User { .. })
            && kind == Kind::Project
            && manifest.pointer("/spec/resources").is_none()
            && let Some(stored) = current.as_deref().and_then(|c| c.spec.get("resources"))
            && let Value::Object(fields) = &mut spec
        {
            fields.insert("resources".to_string(), stored);
        }
        if let Some(given) = given {
            let overrides =
                carry_defaulted(&mut spec, &given, &self.defaulted_spec, current.as_deref());
            annotations.remove(OVERRIDES);
            if !overrides.is_empty() {
                annotations.insert(OVERRIDES.to_string(), overrides.join(","));
            }
        }
        Ok(Admitted {
            desired: Desired {
                kind,
                name,
                labels: std::mem::take(&mut meta.labels),
                annotations,
                finalizers: None,
                spec,
            },
            resource_version,
            finalizers,
        })
    }
}

/// Refuses a manifest that sets an annotation only the server writes. A manifest may repeat
/// what the server recorded on the stored object (`get -o yaml` applies back, a merge patch
/// starts from the stored annotations), never add or change one: so nothing but a delete
/// request can force a deletion, whatever a manifest, a patch or a GitSource carries.
fn check_server_owned(
    annotations: &BTreeMap<String, String>,
    current: Option<&StoredObject>,
) -> Result<(), Vec<Cause>> {
    let causes: Vec<Cause> = SERVER_OWNED
        .into_iter()
        .filter(|key| {
            annotations.get(*key).is_some_and(|value| {
                current.and_then(|c| c.metadata.annotations.get(*key)) != Some(value)
            })
        })
        .map(|key| {
            Cause::new(
                format!("metadata.annotations[{key}]"),
                server_owned_message(key),
            )
        })
        .collect();
    if causes.is_empty() {
        Ok(())
    } else {
        Err(causes)
    }
}

/// Refuses finalizers a writer sends that differ from the stored ones (none, for a new object):
/// [`SERVER_OWNED_FIELDS`]. Dropping the controller's `berth.dev/teardown` from a held deletion
/// would remove the object and leave its container and volumes outside the trash; a foreign one
/// would hold a deletion for ever. An admin may still edit them, as it may purge.
fn check_server_owned_fields(
    who: Admitter<'_>,
    finalizers: Option<&[String]>,
    current: Option<&StoredObject>,
) -> Result<(), Refusal> {
    if matches!(who, Admitter::Local { .. } | Admitter::Restore) {
        return Ok(());
    }
    let Some(finalizers) = finalizers else {
        return Ok(());
    };
    let stored = current
        .map(|c| c.metadata.finalizers.as_slice())
        .unwrap_or(&[]);
    if finalizers == stored {
        return Ok(());
    }
    Err(Refusal::ServerOwned(
        SERVER_OWNED_FIELDS
            .into_iter()
            .map(|field| {
                Cause::new(
                    format!("metadata.{field}"),
                    "set only by the server: the controller adds and removes its own",
                )
            })
            .collect(),
    ))
}

fn unchanged(desired: &Desired, current: &StoredObject) -> bool {
    desired.spec == current.spec
        && desired.labels == current.metadata.labels
        && desired.annotations == current.metadata.annotations
        && desired
            .finalizers
            .as_ref()
            .is_none_or(|f| *f == current.metadata.finalizers)
}

fn repo_url(spec: &Value) -> &str {
    spec.pointer("/repo/url")
        .and_then(Value::as_str)
        .unwrap_or_default()
}

/// Who writes a server-owned annotation, for the one-line refusal.
fn server_owned_message(key: &str) -> &'static str {
    match key {
        annotations::FORCE_DELETE => "set only by a delete request (berth delete --force)",
        annotations::PURGE => "set only by a delete request (berth delete --force --purge)",
        annotations::DELETED_BY => "set only by a delete request, to its caller",
        annotations::LOOK_REQUESTED_AT => {
            "set only by a delete request or POST .../look (berth wait --for=delete)"
        }
        annotations::FORCE_CHECKOUT => {
            "set only by POST .../forcecheckout (berth checkout NAME --force)"
        }
        annotations::FORCE_REPLACE => {
            "set only by POST .../forcereplace (berth restart --recreate --force)"
        }
        _ => "set only by the server, when it reaps or prunes",
    }
}

/// The defaulted fields a manifest's spec sets itself.
fn given_fields(spec: &Value) -> Vec<&'static str> {
    DEFAULTED_FIELDS
        .into_iter()
        .filter(|path| field(spec, path).is_some())
        .collect()
}

/// Settles each defaulted field of an admitted project `spec` (fresh fleet defaults filled in
/// where the manifest gave nothing) against the `current` stored project, and returns the
/// fields the project overrides from now on:
/// - a field the manifest sets is an override when it differs from what defaulting gave the
///   project (or was one already);
/// - a field the manifest leaves out keeps its stored value, unless it was an override: then
///   the manifest took it back, and the fleet default of today applies.
///
/// A new project's overrides are the fields set to something other than the fleet default.
fn carry_defaulted(
    spec: &mut Value,
    given: &[&'static str],
    defaulted_spec: &Value,
    current: Option<&StoredObject>,
) -> Vec<&'static str> {
    let Some(current) = current else {
        return given
            .iter()
            .copied()
            .filter(|path| field(spec, path) != field(defaulted_spec, path))
            .collect();
    };
    let before = overrides_of(current);
    let current_spec = current.spec.value();
    let mut overrides = Vec::new();
    for path in DEFAULTED_FIELDS {
        let was_override = before.contains(&path);
        let stored = field(&current_spec, path).cloned();
        if given.contains(&path) {
            if was_override || field(spec, path) != stored.as_ref() {
                overrides.push(path);
            }
        } else if !was_override {
            set_field(spec, path, stored);
        }
    }
    overrides
}

/// The fields `object` overrides, as its annotation lists them (none without one: objects
/// stored before the annotation existed keep every value they hold).
fn overrides_of(object: &StoredObject) -> Vec<&'static str> {
    let listed = object
        .metadata
        .annotations
        .get(OVERRIDES)
        .map(String::as_str)
        .unwrap_or_default();
    let listed: Vec<&str> = listed.split(',').map(str::trim).collect();
    DEFAULTED_FIELDS
        .into_iter()
        .filter(|path| listed.contains(path))
        .collect()
}

fn field<'a>(spec: &'a Value, path: &str) -> Option<&'a Value> {
    path.split('.').try_fold(spec, |v, key| v.get(key))
}

/// Sets (or, with `None`, removes) a dotted field; a section left empty goes too, as the spec
/// serialises without empty sections.
fn set_field(spec: &mut Value, path: &str, value: Option<Value>) {
    let (section, leaf) = match path.split_once('.') {
        Some((section, leaf)) => (Some(section), leaf),
        None => (None, path),
    };
    let Value::Object(root) = spec else { return };
    let Some(section) = section else {
        match value {
            Some(value) => root.insert(leaf.to_string(), value),
            None => root.remove(leaf),
        };
        return;
    };
    let holder = root
        .entry(section.to_string())
        .or_insert_with(|| Value::Object(Map::new()));
    if let Value::Object(holder) = holder {
        match value {
            Some(value) => holder.insert(leaf.to_string(), value),
            None => holder.remove(leaf),
        };
        if holder.is_empty() {
            root.remove(section);
        }
    }
}

fn sent_resource_version(metadata: &Map<String, Value>) -> Result<Option<u64>, Vec<Cause>> {
    let Some(rv) = metadata.get("resourceVersion") else {
        return Ok(None);
    };
    let parsed = match rv {
        Value::Null => return Ok(None),
        Value::String(text) if text.is_empty() => return Ok(None),
        Value::String(text) => text.parse().ok(),
        Value::Number(number) => number.as_u64(),
        _ => None,
    };
    parsed.map(Some).ok_or_else(|| {
        vec![Cause::new(
            "metadata.resourceVersion",
            format!("{rv} is not a resourceVersion this server issued"),
        )]
    })
}

/// The user-facing form of a stored object, as a merge patch starts from.
pub fn user_form(object: &StoredObject) -> Value {
    let meta = &object.metadata;
    serde_json::json!({
        "apiVersion": berth_api::API_VERSION,
        "kind": object.kind,
        "metadata": {
            "name": meta.name,
            "labels": meta.labels,
            "annotations": meta.annotations,
        },
        "spec": object.spec,
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    const ADMIN: Admitter<'static> = Admitter::Admin { name: "ada" };

    fn admit(manifest: Value) -> Result<Admitted, Refusal> {
        Admission::new(Defaults::default()).admit_new(ADMIN, &manifest)
    }

    #[test]
    fn limits_beyond_the_host_are_warned_of_once_its_capacity_is_known() {
        let admission = Admission::new(Defaults::default());
        let project = |resources: Value| {
            admission
                .admit_new(
                    ADMIN,
                    &json!({
                        "apiVersion": "berth.dev/v1alpha1", "kind": "Project",
                        "metadata": {"name": "big"},
                        "spec": {"resources": resources},
                    }),
                )
                .unwrap()
                .desired
        };
        let huge = project(json!({"memory": "100GiB", "cpu": "16"}));
        assert_eq!(
            admission.warnings(&huge),
            Vec::<String>::new(),
            "capacity unknown"
        );

        *admission.host_slot().write().unwrap() = Some(HostCapacity {
            memory_bytes: 24 << 30,
            cpus: 2,
        });
        assert_eq!(
            admission.warnings(&huge),
            vec![
                "Project/big: spec.resources.memory 100GiB is more than this host has (24GiB): \
                 LXD starts it, but the host cannot back it"
                    .to_string(),
                "Project/big: spec.resources.cpu 16 is more than this host has (2 CPUs): LXD \
                 starts it on the CPUs there are"
                    .to_string(),
            ]
        );
        let fits = project(json!({"memory": "24GiB", "cpu": "2"}));
        assert!(admission.warnings(&fits).is_empty());
    }

    #[test]
    fn a_good_project_is_defaulted_and_server_fields_are_ignored() {
        let admitted = admit(json!({
            "apiVersion": "berth.dev/v1alpha1", "kind": "Project",
            "metadata": {"name": "pay", "labels": {"team": "x"}, "resourceVersion": "7", "uid": "ignored"},
            "spec": {"displayName": "Pay"},
            "status": {"phase": "Ready"}
        }))
        .unwrap();
        assert_eq!(admitted.resource_version, Some(7));
        assert_eq!(admitted.desired.spec["displayName"], "Pay");
        assert_eq!(admitted.desired.spec["image"], "berth-base");
        assert_eq!(admitted.desired.labels["team"], "x");
        // Defaulting is idempotent: admitting the stored form gives the same spec.
        let again = admit(json!({
            "apiVersion": "berth.dev/v1alpha1", "kind": "Project",
            "metadata": {"name": "pay", "labels": {"team": "x"}},
            "spec": admitted.desired.spec,
        }))
        .unwrap();
        assert_eq!(again.desired, admitted.desired);
    }

    #[test]
    fn bad_manifests_name_their_fields() {
        let table = [
            (json!([]), vec![""]),
            (
                json!({"apiVersion": "berth.dev/v1alpha1", "kind": "Project", "metadata": {"name": "Bad_Name"}}),
                vec!["metadata.name"],
            ),
            (
                json!({"apiVersion": "berth.dev/v1alpha1", "kind": "Project", "metadata": {"name": "a"}, "spce": {}}),
                vec!["spce"],
            ),
            (
                json!({"apiVersion": "berth.dev/v1alpha1", "kind": "Project", "metadata": {"name": "a", "resourceVersion": "x"}}),
                vec!["metadata.resourceVersion"],
            ),
        ];
        for (manifest, fields) in table {
            let refusal = admit(manifest.clone()).unwrap_err();
            assert!(matches!(refusal, Refusal::Invalid(_)), "{manifest}");
            let got: Vec<_> = refusal.causes().iter().map(|c| c.field.as_str()).collect();
            assert_eq!(got, fields, "{manifest}");
        }
    }

    fn stored(spec: Value, overrides: Option<&str>) -> StoredObject {
        let mut metadata = berth_api::ObjectMeta {
            name: "p".into(),
            ..Default::default()
        };
        if let Some(overrides) = overrides {
            metadata
                .annotations
                .insert(OVERRIDES.to_string(), overrides.to_string());
        }
        StoredObject {
            kind: Kind::Project,
            metadata,
            spec: spec.into(),
            status: crate::store::Doc::null(),
        }
    }

    #[test]
    fn an_existing_project_keeps_its_defaulted_fields_and_drops_only_overrides_taken_back() {
        let old = json!({"displayName": "p", "state": "Running", "image": "old-image",
            "resources": {"cpu": "2", "memory": "4GiB"},
            "reap": {"idleAfter": "8h", "idleAction": "Stop", "maxAge": "30d"}});
        let new_defaults: Defaults = serde_yaml::from_str(
            "image: new-image\nresources: {cpu: '4', disk: 9GiB}\nreap: {idleAction: Delete}\n",
        )
        .unwrap();
        let admission = Admission::new(new_defaults);
        // (case, manifest spec, stored overrides, spec wanted, overrides wanted)
        type Case = (
            &'static str,
            Value,
            Option<&'static str>,
            Value,
            Option<&'static str>,
        );
        let table: Vec<Case> = vec![
            (
                "nothing set: everything stays as stored",
                json!({}),
                None,
                old.clone(),
                None,
            ),
            (
                "the stored values written out: still not overrides",
                old.clone(),
                None,
                old.clone(),
                None,
            ),
            (
                "a new value is an override; the rest stays",
                json!({"resources": {"cpu": "8"}}),
                None,
                json!({"displayName": "p", "state": "Running", "image": "old-image",
                    "resources": {"cpu": "8", "memory": "4GiB"},
                    "reap": {"idleAfter": "8h", "idleAction": "Stop", "maxAge": "30d"}}),
                Some("resources.cpu"),
            ),
            (
                "an override taken back falls to today's default; a field never set stays",
                json!({}),
                Some("resources.cpu,image"),
                json!({"displayName": "p", "state": "Running", "image": "new-image",
                    "resources": {"cpu": "4", "memory": "4GiB"},
                    "reap": {"idleAfter": "8h", "idleAction": "Stop", "maxAge": "30d"}}),
                None,
            ),
            (
                "an override still set stays one, whatever its value",
                json!({"image": "old-image"}),
                Some("image"),
                old.clone(),
                Some("image"),
            ),
            (
                "protectIgnored set, even to none, is an override",
                json!({"reap": {"protectIgnored": []}}),
                None,
                json!({"displayName": "p", "state": "Running", "image": "old-image",
                    "resources": {"cpu": "2", "memory": "4GiB"},
                    "reap": {"idleAfter": "8h", "idleAction": "Stop", "maxAge": "30d",
                             "protectIgnored": []}}),
                Some("reap.protectIgnored"),
            ),
            (
                "protectIgnored taken back falls to today's default",
                json!({}),
                Some("reap.protectIgnored"),
                json!({"displayName": "p", "state": "Running", "image": "old-image",
                    "resources": {"cpu": "2", "memory": "4GiB"},
                    "reap": {"idleAfter": "8h", "idleAction": "Stop", "maxAge": "30d",
                             "protectIgnored": [".env*", "*.db", "*.sqlite*"]}}),
                None,
            ),
            (
                "a field with no default stays absent, even when one appears",
                json!({"brief": "go"}),
                None,
                json!({"displayName": "p", "state": "Running", "image": "old-image", "brief": "go",
                    "resources": {"cpu": "2", "memory": "4GiB"},
                    "reap": {"idleAfter": "8h", "idleAction": "Stop", "maxAge": "30d"}}),
                None,
            ),
        ];
        for (case, spec, overrides, want_spec, want_overrides) in table {
            let current = stored(old.clone(), overrides);
            let manifest = json!({"apiVersion": "berth.dev/v1alpha1", "kind": "Project",
                "metadata": {"name": "p", "annotations": {OVERRIDES: "image,reap.maxAge"}},
                "spec": spec});
            let admitted = admission
                .admit_over(ADMIN, &manifest, |_, _| Some(Arc::new(current.clone())))
                .unwrap();
            assert_eq!(admitted.desired.spec, want_spec, "{case}");
            assert_eq!(
                admitted
                    .desired
                    .annotations
                    .get(OVERRIDES)
                    .map(String::as_str),
                want_overrides,
                "{case}"
            );
        }
    }

    #[test]
    fn a_new_project_overrides_what_differs_from_the_fleet_defaults() {
        let admitted = admit(json!({"apiVersion": "berth.dev/v1alpha1", "kind": "Project",
            "metadata": {"name": "p"},
            "spec": {"image": "berth-base", "resources": {"cpu": "3"}, "reap": {"maxAge": "never"}}}))
        .unwrap();
        assert_eq!(
            admitted
                .desired
                .annotations
                .get(OVERRIDES)
                .map(String::as_str),
            Some("resources.cpu,reap.maxAge")
        );
        let plain = admit(
            json!({"apiVersion": "berth.dev/v1alpha1", "kind": "Project",
            "metadata": {"name": "p"}}),
        )
        .unwrap();
        assert!(plain.desired.annotations.is_empty());
    }

    /// A stored project carrying `annotations`.
    fn stored_with(annotations: &[(&str, &str)]) -> StoredObject {
        let mut object = stored(json!({"displayName": "p"}), None);
        object.metadata.annotations = annotations
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        object
    }

    #[test]
    fn a_manifest_never_sets_what_only_the_server_writes() {
        use berth_api::annotations::{DELETED_BY, FORCE_DELETE, PURGE, REAPED_BY};
        let admission = Admission::new(Defaults::default());
        const FORCED: &[(&str, &str)] = &[(FORCE_DELETE, "true"), (DELETED_BY, "unix:ann")];
        // (case, manifest annotations, stored annotations (None: no stored object), refused fields)
        type Case = (
            &'static str,
            Value,
            Option<&'static [(&'static str, &'static str)]>,
            Vec<&'static str>,
        );
        let table: Vec<Case> = vec![
            (
                "a new object pre-armed with a force",
                json!({FORCE_DELETE: "true"}),
                None,
                vec!["metadata.annotations[berth.dev/forceDelete]"],
            ),
            (
                "an existing object armed by a re-apply",
                json!({FORCE_DELETE: "true"}),
                Some(&[]),
                vec!["metadata.annotations[berth.dev/forceDelete]"],
            ),
            (
                "any value counts, and every server-owned annotation is named",
                json!({FORCE_DELETE: "false", PURGE: "true", DELETED_BY: "me", REAPED_BY: "reaper"}),
                None,
                vec![
                    "metadata.annotations[berth.dev/forceDelete]",
                    "metadata.annotations[berth.dev/purge]",
                    "metadata.annotations[berth.dev/deletedBy]",
                    "metadata.annotations[berth.dev/reapedBy]",
                ],
            ),
            (
                "a recorded force repeated (get -o yaml applied back) adds nothing",
                json!({FORCE_DELETE: "true", DELETED_BY: "unix:ann"}),
                Some(FORCED),
                vec![],
            ),
            (
                "a recorded deletion's caller cannot be changed",
                json!({DELETED_BY: "someone-else"}),
                Some(FORCED),
                vec!["metadata.annotations[berth.dev/deletedBy]"],
            ),
            (
                "a purge cannot be added to a forced deletion",
                json!({FORCE_DELETE: "true", PURGE: "true"}),
                Some(FORCED),
                vec!["metadata.annotations[berth.dev/purge]"],
            ),
            (
                "other annotations pass",
                json!({"berth.dev/prune": "disabled", "team": "x"}),
                None,
                vec![],
            ),
        ];
        for (case, annotations, current, refused) in table {
            let manifest = json!({"apiVersion": "berth.dev/v1alpha1", "kind": "Project",
                "metadata": {"name": "p", "annotations": annotations}});
            let current = current.map(|a| Arc::new(stored_with(a)));
            let admitted = admission.admit_over(ADMIN, &manifest, |_, _| current);
            match admitted {
                Ok(_) => assert!(refused.is_empty(), "{case}: admitted"),
                Err(Refusal::ServerOwned(causes)) => {
                    let got: Vec<&str> = causes.iter().map(|c| c.field.as_str()).collect();
                    assert_eq!(got, refused, "{case}");
                }
                Err(other) => panic!("{case}: {other:?}"),
            }
        }

        let refusal = admit(json!({"apiVersion": "berth.dev/v1alpha1", "kind": "AgentProfile",
            "metadata": {"name": "a", "annotations": {FORCE_DELETE: "true"}},
            "spec": {"home": "/root/.a", "install": {"check": "true"}, "runner": {"command": ["a"]}}}))
        .unwrap_err();
        assert_eq!(
            refusal.to_string(),
            "metadata.annotations[berth.dev/forceDelete]: set only by a delete request (berth delete --force)"
        );
        assert!(matches!(refusal, Refusal::ServerOwned(_)));
    }

    /// Every rule, through the one admission, for every writer. A writer that skips a rule
    /// fails its row.
    #[test]
    fn every_rule_holds_for_every_writer() {
        use crate::store::Commit;
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("berth.db")).unwrap();
        let theirs = store
            .create(Desired::project("theirs", json!({})), Commit::Persist)
            .unwrap();
        store.add_member(theirs.uid(), "bob").unwrap();
        let admission = Admission::new(Defaults::default());
        let project = |metadata: Value, spec: Value| {
            json!({"apiVersion": "berth.dev/v1alpha1", "kind": "Project",
                "metadata": metadata, "spec": spec})
        };
        let user = Admitter::User { name: "mia" };
        let admin = Admitter::Admin { name: "ada" };
        let fleet = Admitter::GitSource { name: "fleet" };
        let other = Admitter::GitSource { name: "other" };
        let restore = Admitter::Restore;
        const LOCAL: Admitter<'static> = Admitter::Local { name: "root" };
        const OK: &str = "ok";
        const OWNED: &str = "server-owned";
        const INVALID: &str = "invalid";
        const FORBIDDEN: &str = "forbidden";
        const HIDDEN: &str = "hidden";
        // (rule, manifest, [user, admin, GitSource fleet, GitSource other, restore]); the local
        // administrator is checked against the admin's column.
        let table = [
            (
                "a server-owned annotation",
                project(
                    json!({"name": "p", "annotations": {annotations::FORCE_DELETE: "true"}}),
                    json!({}),
                ),
                [OWNED, OWNED, OWNED, OWNED, OWNED],
            ),
            (
                "finalizers",
                project(
                    json!({"name": "p", "finalizers": ["example.com/wedge"]}),
                    json!({}),
                ),
                [OWNED, OWNED, OWNED, OWNED, OK],
            ),
            (
                "a forward outside allowedForwardTargets",
                project(
                    json!({"name": "p"}),
                    json!({"forwards": [{"port": 80, "to": "192.0.2.10:80"}]}),
                ),
                [FORBIDDEN, INVALID, INVALID, INVALID, INVALID],
            ),
            (
                "a forward to loopback",
                project(
                    json!({"name": "p"}),
                    json!({"forwards": [{"port": 80, "to": "127.0.0.1:80"}]}),
                ),
                [FORBIDDEN, OK, OK, OK, OK],
            ),
            (
                "resource limits",
                project(json!({"name": "p"}), json!({"resources": {"cpu": "64"}})),
                [FORBIDDEN, OK, OK, OK, OK],
            ),
            (
                "a file:// repository outside allowedFileRoots",
                project(
                    json!({"name": "p"}),
                    json!({"repo": {"url": "file:///etc/secret-repo"}}),
                ),
                [FORBIDDEN, OK, OK, OK, OK],
            ),
            (
                "a GitSource's applyset",
                project(
                    json!({"name": "p", "annotations": {annotations::APPLYSET: "gitsource-fleet"}}),
                    json!({}),
                ),
                [FORBIDDEN, FORBIDDEN, OK, FORBIDDEN, FORBIDDEN],
            ),
            (
                "a project of somebody else",
                project(json!({"name": "theirs"}), json!({})),
                [HIDDEN, OK, OK, OK, OK],
            ),
            (
                "a skill outside allowedFileRoots",
                json!({"apiVersion": "berth.dev/v1alpha1", "kind": "AgentProfile",
                    "metadata": {"name": "a"},
                    "spec": {"home": "/root/.a", "install": {"check": "true"},
                             "skills": [{"path": "/etc", "target": ".a/skills"}],
                             "runner": {"command": ["a"]}}}),
                [FORBIDDEN, INVALID, INVALID, INVALID, INVALID],
            ),
            (
                "an admin-only kind",
                json!({"apiVersion": "berth.dev/v1alpha1", "kind": "AgentProfile",
                    "metadata": {"name": "a"},
                    "spec": {"home": "/root/.a", "install": {"check": "true"},
                             "runner": {"command": ["a"]}}}),
                [FORBIDDEN, OK, OK, OK, OK],
            ),
        ];
        let mut failures = Vec::new();
        for (rule, manifest, expected) in table {
            // The local administrator is an admin who may also write finalizers.
            let local = if rule == "finalizers" {
                OK
            } else {
                expected[1]
            };
            for (who, want) in [user, admin, fleet, other, restore, LOCAL]
                .into_iter()
                .zip(expected.into_iter().chain([local]))
            {
                let got = match admission.admit(who, &manifest, &store) {
                    Ok(_) => OK,
                    Err(Refusal::ServerOwned(_)) => OWNED,
                    Err(Refusal::Invalid(_)) => INVALID,
                    Err(Refusal::Forbidden(_)) => FORBIDDEN,
                    Err(Refusal::Hidden(..)) => HIDDEN,
                };
                if got != want {
                    failures.push(format!("{rule} by {who:?}: {got}, not {want}"));
                }
            }
        }
        assert!(failures.is_empty(), "{failures:#?}");
    }

    #[test]
    fn a_skill_source_is_held_to_allowed_file_roots_wherever_it_leads() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("berth.db")).unwrap();
        let roots = dir.path().join("skills");
        std::fs::create_dir_all(roots.join("pdf")).unwrap();
        std::os::unix::fs::symlink("/etc", roots.join("etc")).unwrap();
        let admission = Admission::new(Defaults::default()).with_file_roots(vec![roots.clone()]);
        let profile = |skill: Value| {
            json!({"apiVersion": "berth.dev/v1alpha1", "kind": "AgentProfile",
                "metadata": {"name": "a"},
                "spec": {"home": "/root/.a", "install": {"check": "true"},
                         "skills": [skill], "runner": {"command": ["a"]}}})
        };
        let under = |name: &str| roots.join(name).display().to_string();
        let admin = Admitter::Admin { name: "ada" };
        // (skill, the refused field and words of its message, or None when admitted)
        let cases = [
            (json!({"path": under("pdf"), "target": ".a/skills"}), None),
            // Not there yet: judged when it is placed.
            (json!({"path": under("later"), "target": ".a/skills"}), None),
            (
                json!({"path": under("etc"), "target": ".a/skills"}),
                Some(("spec.skills[0].path", "leads outside allowedFileRoots")),
            ),
            (
                json!({"path": "/srv/elsewhere", "target": ".a/skills"}),
                Some(("spec.skills[0].path", "is not under allowedFileRoots")),
            ),
            (
                json!({"repo": {"url": "file:///srv/elsewhere.git"}, "target": ".a/skills"}),
                Some(("spec.skills[0].repo.url", "is not under allowedFileRoots")),
            ),
            (
                json!({"repo": {"url": "https://git.example/skills.git"}, "target": ".a/skills"}),
                None,
            ),
        ];
        for (skill, want) in cases {
            let got = admission.admit(admin, &profile(skill.clone()), &store);
            match (got, want) {
                (Ok(_), None) => {}
                (Err(Refusal::Invalid(causes)), Some((field, words))) => {
                    assert_eq!(causes[0].field, field, "{skill}");
                    assert!(causes[0].message.contains(words), "{skill}: {causes:?}");
                }
                (got, want) => panic!("{skill}: {:?}, want {want:?}", got.err()),
            }
        }
    }
}
