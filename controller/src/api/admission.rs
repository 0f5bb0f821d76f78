//! Admission: a manifest from a request becomes what the store writes. Order: decode (unknown
//! fields are errors; status and server-set metadata are ignored) → validate → fleet defaults
//! (for a project that exists, its stored defaulted values) → name checks. Uniqueness of `displayName` is the store's to enforce, atomically with the write.

use std::sync::Arc;

use berth_api::annotations::OVERRIDES;
use berth_api::{DEFAULTED_FIELDS, Defaults, Kind, Object};
use serde_json::{Map, Value};

use super::error::Cause;
use crate::store::{Desired, Store, StoredObject};

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

pub struct Admission {
    defaults: Defaults,
    /// The spec a project naming nothing gets: what each defaulted field starts from.
    defaulted_spec: Value,
}

impl Admission {
    pub fn new(defaults: Defaults) -> Self {
        let mut bare = berth_api::Project::new("bare", Default::default());
        bare.apply_defaults(&defaults);
        let defaulted_spec = serde_json::to_value(&bare.spec).unwrap_or(Value::Null);
        Admission {
            defaults,
            defaulted_spec,
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
    pub fn admit(&self, manifest: &Value, store: &Store) -> Result<Admitted, Vec<Cause>> {
        self.admit_over(manifest, |kind, name| store.get(kind, name))
    }

    /// What `manifest` makes of an object that does not exist yet.
    pub fn admit_new(&self, manifest: &Value) -> Result<Admitted, Vec<Cause>> {
        self.admit_over(manifest, |_, _| None)
    }

    fn admit_over(
        &self,
        manifest: &Value,
        stored: impl FnOnce(&str, &str) -> Option<Arc<StoredObject>>,
    ) -> Result<Admitted, Vec<Cause>> {
        let empty = Map::new();
        let metadata = manifest
            .get("metadata")
            .and_then(Value::as_object)
            .unwrap_or(&empty);
        let resource_version = sent_resource_version(metadata)?;
        let finalizers = metadata
            .get("finalizers")
            .and_then(|f| serde_json::from_value::<Vec<String>>(f.clone()).ok());

        let mut object = berth_api::decode_manifest(manifest.clone()).map_err(|errors| {
            errors
                .causes
                .into_iter()
                .map(|c| Cause::new(c.field, c.message))
                .collect::<Vec<_>>()
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
        if let Some(given) = given {
            let current = stored(kind.as_str(), &name);
            let overrides =
                carry_defaulted(&mut spec, &given, &self.defaulted_spec, current.as_deref());
            annotations.remove(OVERRIDES);
            if !overrides.is_empty() {
                annotations.insert(OVERRIDES.to_string(), overrides.join(","));
            }
        }
        Ok(Admitted {
            desired: Desired {
                kind: kind.as_str().to_string(),
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

    fn admit(manifest: Value) -> Result<Admitted, Vec<Cause>> {
        Admission::new(Defaults::default()).admit_new(&manifest)
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
            let causes = admit(manifest.clone()).unwrap_err();
            let got: Vec<_> = causes.iter().map(|c| c.field.as_str()).collect();
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
            kind: "Project".into(),
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
}
