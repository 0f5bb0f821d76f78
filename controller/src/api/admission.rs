//! Admission: a manifest from a request becomes what the store writes. Order: decode (unknown
//! fields are errors; status and server-set metadata are ignored) → validate → fleet defaults
//! (for a project that exists, its stored defaulted values) → name checks. Uniqueness of `displayName` is the store's to enforce, atomically with the write.
//!
//! Every write a user or a GitSource makes passes here, so this is where a manifest is kept from
//! setting what only the server writes: how an object was asked to go (`berth.dev/forceDelete`
//! and the others of [`SERVER_OWNED`]) comes from the delete request alone.

use std::collections::BTreeMap;
use std::sync::{Arc, PoisonError, RwLock};

use berth_api::annotations::{self, OVERRIDES, SERVER_OWNED};
use berth_api::{DEFAULTED_FIELDS, Defaults, Kind, Object};
use serde_json::{Map, Value};

use super::error::{ApiError, Cause};
use crate::runtime::HostCapacity;
use crate::store::{Desired, Store, StoredObject};

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

/// The kind served under `/apis/berth.dev/v1alpha1/<plural>`.
pub fn kind_by_plural(plural: &str) -> Option<Kind> {
    Kind::ALL.into_iter().find(|k| k.plural() == plural)
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
    /// The manifest sets what only the server writes (400), each cause naming the annotation.
    ServerOwned(Vec<Cause>),
}

impl Refusal {
    pub fn causes(&self) -> &[Cause] {
        match self {
            Refusal::Invalid(causes) | Refusal::ServerOwned(causes) => causes,
        }
    }

    /// The same refusal with each cause's field rewritten (e.g. under `items[3]`).
    pub fn map_causes(self, f: impl Fn(Cause) -> Cause) -> Refusal {
        match self {
            Refusal::Invalid(causes) => Refusal::Invalid(causes.into_iter().map(f).collect()),
            Refusal::ServerOwned(causes) => {
                Refusal::ServerOwned(causes.into_iter().map(f).collect())
            }
        }
    }

    /// The API's answer: 400 for a server-owned annotation, 422 for an invalid object.
    pub fn into_api_error(self, kind: Option<&str>, name: Option<&str>) -> ApiError {
        match self {
            Refusal::Invalid(causes) => ApiError::invalid(kind, name, causes),
            Refusal::ServerOwned(causes) => {
                let causes = super::error::bounded(causes);
                let summary = super::error::summary(&causes);
                let error = ApiError {
                    causes,
                    ..ApiError::bad_request(summary)
                };
                match kind {
                    Some(kind) => error.with_object(kind, name.unwrap_or_default()),
                    None => error,
                }
            }
        }
    }
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let details: Vec<String> = self.causes().iter().map(Cause::to_string).collect();
        f.write_str(&details.join("; "))
    }
}

pub struct Admission {
    defaults: Defaults,
    /// The spec a project naming nothing gets: what each defaulted field starts from.
    defaulted_spec: Value,
    host: HostSlot,
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
        }
    }

    /// Where the daemon puts the host's capacity once LXD answers.
    pub fn host_slot(&self) -> HostSlot {
        Arc::clone(&self.host)
    }

    /// What the API answers beside an admitted object as `Warning` headers: limits the host
    /// cannot back. LXD starts such a container, so they are warned of, not refused; nothing is
    /// said while the host's capacity is unknown.
    pub fn warnings(&self, desired: &Desired) -> Vec<String> {
        let host = *self.host.read().unwrap_or_else(PoisonError::into_inner);
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

    /// What `manifest` makes of the object `store` holds under its name (or of a new one).
    /// Fleet defaults fill a project's fields only when it is created; an existing project
    /// keeps the defaulted values it holds, so re-applying a manifest stays idempotent when the
    /// defaults change.
    pub fn admit(&self, manifest: &Value, store: &Store) -> Result<Admitted, Refusal> {
        self.admit_over(manifest, |kind, name| store.get(kind, name))
    }

    /// What `manifest` makes of an object that does not exist yet.
    pub fn admit_new(&self, manifest: &Value) -> Result<Admitted, Refusal> {
        self.admit_over(manifest, |_, _| None)
    }

    fn admit_over(
        &self,
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

        let mut object = berth_api::decode_manifest(manifest.clone()).map_err(|errors| {
            Refusal::Invalid(
                errors
                    .causes
                    .into_iter()
                    .map(|c| Cause::new(c.field, c.message))
                    .collect(),
            )
        })?;
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

/// Who writes a server-owned annotation, for the one-line refusal.
fn server_owned_message(key: &str) -> &'static str {
    match key {
        annotations::FORCE_DELETE => "set only by a delete request (berth delete --force)",
        annotations::PURGE => "set only by a delete request (berth delete --force --purge)",
        annotations::DELETED_BY => "set only by a delete request, to its caller",
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

    fn admit(manifest: Value) -> Result<Admitted, Refusal> {
        Admission::new(Defaults::default()).admit_new(&manifest)
    }

    #[test]
    fn limits_beyond_the_host_are_warned_of_once_its_capacity_is_known() {
        let admission = Admission::new(Defaults::default());
        let project = |resources: Value| {
            admission
                .admit_new(&json!({
                    "apiVersion": "berth.dev/v1alpha1", "kind": "Project",
                    "metadata": {"name": "big"},
                    "spec": {"resources": resources},
                }))
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
                .admit_over(&manifest, |_, _| Some(Arc::new(current.clone())))
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
            let admitted = admission.admit_over(&manifest, |_, _| current);
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
        let error = refusal.into_api_error(Some("AgentProfile"), Some("a"));
        assert_eq!(error.code, hyper::StatusCode::BAD_REQUEST);
        assert_eq!(
            error.causes[0].field,
            "metadata.annotations[berth.dev/forceDelete]"
        );
    }
}
