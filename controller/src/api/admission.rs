//! Admission: a manifest from a request becomes what the store writes. Order: decode (unknown
//! fields are errors; status and server-set metadata are ignored) → validate → fleet defaults →
//! name checks. Uniqueness of `displayName` is the store's to enforce, atomically with the write.

use serde_json::{Map, Value};

use super::error::Cause;
use crate::config::FleetDefaults;
use crate::store::Desired;

/// A kind the API serves, and its path segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResourceKind {
    pub kind: &'static str,
    pub plural: &'static str,
}

impl ResourceKind {
    /// `ProjectList` for `Project`.
    pub fn list_kind(&self) -> String {
        format!("{}List", self.kind)
    }
}

pub const KINDS: &[ResourceKind] = &[
    ResourceKind {
        kind: "Project",
        plural: "projects",
    },
    ResourceKind {
        kind: "AgentProfile",
        plural: "agentprofiles",
    },
    ResourceKind {
        kind: "GitSource",
        plural: "gitsources",
    },
];

pub fn kind_by_plural(plural: &str) -> Option<ResourceKind> {
    KINDS.iter().copied().find(|k| k.plural == plural)
}

pub fn kind_by_name(kind: &str) -> Option<ResourceKind> {
    KINDS.iter().copied().find(|k| k.kind == kind)
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
    defaults: FleetDefaults,
}

const TOP_LEVEL_FIELDS: &[&str] = &["apiVersion", "kind", "metadata", "spec", "status"];

impl Admission {
    pub fn new(defaults: FleetDefaults) -> Self {
        Admission { defaults }
    }

    pub fn admit(&self, manifest: &Value) -> Result<Admitted, Vec<Cause>> {
        let Some(object) = manifest.as_object() else {
            return Err(vec![Cause::new(
                "",
                "must be an object with apiVersion, kind, metadata and spec",
            )]);
        };
        let mut causes = Vec::new();
        let resource_version = server_resource_version(object, &mut causes);
        let finalizers = object
            .get("metadata")
            .and_then(|m| m.get("finalizers"))
            .and_then(|f| serde_json::from_value::<Vec<String>>(f.clone()).ok());

        for key in object.keys() {
            if !TOP_LEVEL_FIELDS.contains(&key.as_str()) {
                causes.push(Cause::new(key.clone(), "unknown field"));
            }
        }
        match object.get("apiVersion").and_then(Value::as_str) {
            Some(berth_api::API_VERSION) => {}
            Some(other) => causes.push(Cause::new(
                "apiVersion",
                format!(
                    "{other:?} is not supported; use {:?}",
                    berth_api::API_VERSION
                ),
            )),
            None => causes.push(Cause::new("apiVersion", "required")),
        }
        let kind = match object.get("kind").and_then(Value::as_str) {
            Some(kind) => match kind_by_name(kind) {
                Some(kind) => Some(kind),
                None => {
                    let known: Vec<_> = KINDS.iter().map(|k| k.kind).collect();
                    causes.push(Cause::new(
                        "kind",
                        format!("{kind:?} is not a berth kind (one of {})", known.join(", ")),
                    ));
                    None
                }
            },
            None => {
                causes.push(Cause::new("kind", "required"));
                None
            }
        };
        let metadata = decode_metadata(object.get("metadata"), &mut causes);
        if let Err(message) = validate_name(&metadata.name) {
            causes.push(Cause::new("metadata.name", message));
        }
        let mut spec = match object.get("spec") {
            None | Some(Value::Null) => Value::Object(Map::new()),
            Some(Value::Object(spec)) => Value::Object(spec.clone()),
            Some(_) => {
                causes.push(Cause::new("spec", "must be an object"));
                Value::Null
            }
        };
        if !causes.is_empty() {
            return Err(causes);
        }
        let Some(kind) = kind else {
            return Err(causes);
        };
        if kind.kind == "Project" {
            self.default_project(&metadata.name, &mut spec);
        }
        Ok(Admitted {
            desired: Desired {
                kind: kind.kind.to_string(),
                name: metadata.name,
                labels: metadata.labels,
                annotations: metadata.annotations,
                finalizers: None,
                spec,
            },
            resource_version,
            finalizers,
        })
    }

    fn default_project(&self, name: &str, spec: &mut Value) {
        let Value::Object(spec) = spec else { return };
        let display = spec
            .get("displayName")
            .and_then(Value::as_str)
            .map(str::trim)
            .filter(|d| !d.is_empty())
            .unwrap_or(name)
            .to_string();
        spec.insert("displayName".into(), Value::String(display));
        spec.entry("image")
            .or_insert_with(|| Value::String(self.defaults.image.clone()));
    }
}

fn server_resource_version(object: &Map<String, Value>, causes: &mut Vec<Cause>) -> Option<u64> {
    let rv = object.get("metadata")?.get("resourceVersion")?;
    let parsed = match rv {
        Value::String(text) if text.is_empty() => return None,
        Value::String(text) => text.parse().ok(),
        Value::Number(number) => number.as_u64(),
        _ => None,
    };
    if parsed.is_none() {
        causes.push(Cause::new(
            "metadata.resourceVersion",
            format!("{rv} is not a resourceVersion this server issued"),
        ));
    }
    parsed
}

fn decode_metadata(metadata: Option<&Value>, causes: &mut Vec<Cause>) -> berth_api::ObjectMeta {
    let Some(metadata) = metadata else {
        causes.push(Cause::new("metadata", "required"));
        return berth_api::ObjectMeta::default();
    };
    match serde_json::from_value::<berth_api::ObjectMeta>(metadata.clone()) {
        Ok(meta) => meta,
        Err(err) => {
            let message = err.to_string();
            let field = message
                .strip_prefix("unknown field `")
                .and_then(|rest| rest.split('`').next())
                .map(|f| format!("metadata.{f}"))
                .unwrap_or_else(|| "metadata".to_string());
            causes.push(Cause::new(field, message));
            berth_api::ObjectMeta::default()
        }
    }
}

/// `metadata.name`: `^[a-z]([a-z0-9-]{0,61}[a-z0-9])?$`, which is also a valid LXD instance
/// name.
pub fn validate_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("required".to_string());
    }
    let bytes = name.as_bytes();
    let valid = bytes.len() <= 63
        && bytes[0].is_ascii_lowercase()
        && bytes
            .iter()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
        && !name.ends_with('-');
    if valid {
        Ok(())
    } else {
        Err(format!(
            "{name:?} must be 1-63 lowercase letters, digits or '-', start with a letter and not end with '-'"
        ))
    }
}

/// The user-facing form of a stored object, as a merge patch starts from.
pub fn user_form(object: &crate::store::StoredObject) -> Value {
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
        Admission::new(FleetDefaults::default()).admit(&manifest)
    }

    #[test]
    fn a_good_project_is_defaulted() {
        let admitted = admit(json!({
            "apiVersion": "berth.dev/v1alpha1", "kind": "Project",
            "metadata": {"name": "pay", "labels": {"team": "x"}, "resourceVersion": "7", "uid": "ignored"},
            "spec": {"displayName": " Pay "},
            "status": {"phase": "Ready"}
        }))
        .unwrap();
        assert_eq!(admitted.resource_version, Some(7));
        assert_eq!(admitted.desired.spec["displayName"], "Pay");
        assert_eq!(admitted.desired.spec["image"], "berth-base");
        assert_eq!(admitted.desired.labels["team"], "x");
    }

    #[test]
    fn bad_manifests_name_their_fields() {
        let table = [
            (json!([]), vec![""]),
            (
                json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "a"}}),
                vec!["apiVersion", "kind"],
            ),
            (
                json!({"apiVersion": "berth.dev/v1alpha1", "kind": "Project", "metadata": {"name": "Bad_Name"}}),
                vec!["metadata.name"],
            ),
            (
                json!({"apiVersion": "berth.dev/v1alpha1", "kind": "Project", "metadata": {"name": "a", "lables": {}}}),
                vec!["metadata.lables", "metadata.name"],
            ),
            (
                json!({"apiVersion": "berth.dev/v1alpha1", "kind": "Project", "metadata": {"name": "a"}, "spce": {}}),
                vec!["spce"],
            ),
            (
                json!({"apiVersion": "berth.dev/v1alpha1", "kind": "Project"}),
                vec!["metadata", "metadata.name"],
            ),
        ];
        for (manifest, fields) in table {
            let causes = admit(manifest.clone()).unwrap_err();
            let got: Vec<_> = causes.iter().map(|c| c.field.as_str()).collect();
            assert_eq!(got, fields, "{manifest}");
        }
    }

    #[test]
    fn names() {
        for good in ["a", "payments-api", "a1", &"a".repeat(63)] {
            assert!(validate_name(good).is_ok(), "{good}");
        }
        for bad in ["", "1a", "A", "a-", "a_b", "a.b", &"a".repeat(64)] {
            assert!(validate_name(bad).is_err(), "{bad}");
        }
    }
}
