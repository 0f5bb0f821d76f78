//! JSON Schemas of the kinds, for editors and CI linters. Checked in under `manifests/schema/`.

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
    v
}
