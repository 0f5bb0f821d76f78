//! Data-driven tests of berth-api: manifests in, errors or objects out.

mod conditions;
mod defaults;
mod manifests;
mod mutations;
mod roundtrip;
mod units;
mod wire;

/// Parses one YAML document into the JSON value the decoders take.
pub fn yaml(text: &str) -> serde_json::Value {
    serde_yaml::from_str(text).unwrap_or_else(|e| panic!("test YAML does not parse: {e}\n{text}"))
}
