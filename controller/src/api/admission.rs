//! Admission: a manifest from a request becomes what the store writes. Order: decode (unknown
//! fields are errors; status and server-set metadata are ignored) → validate → fleet defaults →
//! name checks. Uniqueness of `displayName` is the store's to enforce, atomically with the write.

use berth_api::{Defaults, Kind, Object};
use serde_json::{Map, Value};

use super::error::Cause;
use crate::store::{Desired, StoredObject};

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
}

impl Admission {
    pub fn new(defaults: Defaults) -> Self {
        Admission { defaults }
    }

    pub fn admit(&self, manifest: &Value) -> Result<Admitted, Vec<Cause>> {
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
        if let Object::Project(project) = &mut object {
            project.apply_defaults(&self.defaults);
        }
        let spec = object.spec_value();
        let kind = object.kind();
        let meta = object.metadata_mut();
        Ok(Admitted {
            desired: Desired {
                kind: kind.as_str().to_string(),
                name: std::mem::take(&mut meta.name),
                labels: std::mem::take(&mut meta.labels),
                annotations: std::mem::take(&mut meta.annotations),
                finalizers: None,
                spec,
            },
            resource_version,
            finalizers,
        })
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
        Admission::new(Defaults::default()).admit(&manifest)
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
}
