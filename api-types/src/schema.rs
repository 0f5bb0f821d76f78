//! JSON Schemas of the kinds, for editors and CI linters. Checked in under `manifests/schema/`.
//!
//! A test (`api-types/tests/schema.rs`) fails when the checked-in files are stale.

use schemars::JsonSchema;
use serde_json::{Value, json};

use crate::gitsource::GitSource;
use crate::meta::API_VERSION;
use crate::profile::AgentProfile;
use crate::project::Project;

/// `(file name, schema)` for every kind.
pub fn schemas() -> Vec<(&'static str, Value)> {
    vec![
        ("project.json", schema_of::<Project>("Project")),
        (
            "agentprofile.json",
            schema_of::<AgentProfile>("AgentProfile"),
        ),
        ("gitsource.json", schema_of::<GitSource>("GitSource")),
    ]
}

fn schema_of<T: JsonSchema>(kind: &str) -> Value {
    let mut v = serde_json::to_value(schemars::schema_for!(T)).unwrap_or(Value::Null);
    if let Value::Object(root) = &mut v {
        root.insert(
            "$id".into(),
            json!(format!(
                "https://berth.dev/schemas/{}.json",
                kind.to_ascii_lowercase()
            )),
        );
        if let Some(Value::Object(props)) = root.get_mut("properties") {
            props.insert("apiVersion".into(), json!({"const": API_VERSION}));
            props.insert("kind".into(), json!({"const": kind}));
        }
        root.insert(
            "required".into(),
            json!(["apiVersion", "kind", "metadata", "spec"]),
        );
    }
    mark_required(&mut v);
    v
}

/// Marker put on fields that a manifest must give but that decode with a default, so that a
/// missing one is reported by validation together with every other problem instead of stopping
/// the decoder. The schema lists them as required, without the default.
const REQUIRED_MARKER: &str = "x-berth-required";

fn mark_required(v: &mut Value) {
    match v {
        Value::Object(map) => {
            let mut required = Vec::new();
            if let Some(Value::Object(props)) = map.get_mut("properties") {
                for (name, prop) in props.iter_mut() {
                    if let Value::Object(p) = prop
                        && p.remove(REQUIRED_MARKER).is_some()
                    {
                        p.remove("default");
                        required.push(name.clone());
                    }
                }
            }
            if !required.is_empty() {
                let list = map.entry("required").or_insert_with(|| json!([]));
                if let Value::Array(list) = list {
                    for name in required {
                        if !list.iter().any(|n| *n == name) {
                            list.push(Value::String(name));
                        }
                    }
                }
            }
            for child in map.values_mut() {
                mark_required(child);
            }
        }
        Value::Array(items) => items.iter_mut().for_each(mark_required),
        _ => {}
    }
}
