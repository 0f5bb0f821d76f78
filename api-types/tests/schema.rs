//! The JSON Schemas checked in under manifests/schema/ must match what the types generate.

use std::path::PathBuf;

fn schema_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../manifests/schema")
}

fn render(schema: &serde_json::Value) -> String {
    let mut text = serde_json::to_string_pretty(schema).expect("schema serializes");
    text.push('\n');
    text
}

#[test]
fn checked_in_schemas_are_current() {
    let update = std::env::var("BERTH_UPDATE_SCHEMAS").is_ok_and(|v| v == "1");
    let dir = schema_dir();
    let mut stale = Vec::new();
    for (file, schema) in berth_api::schemas() {
        let path = dir.join(file);
        let want = render(&schema);
        let have = std::fs::read_to_string(&path).unwrap_or_default();
        if have == want {
            continue;
        }
        if update {
            std::fs::create_dir_all(&dir).expect("create manifests/schema");
            std::fs::write(&path, want).expect("write schema");
        } else {
            stale.push(file);
        }
    }
    assert!(
        stale.is_empty(),
        "stale JSON Schemas in manifests/schema: {}; regenerate them with \
         BERTH_UPDATE_SCHEMAS=1 cargo test -p berth-api --test schema",
        stale.join(", ")
    );
}

#[test]
fn schemas_describe_quantities_durations_and_required_fields() {
    let schemas = berth_api::schemas();
    let find = |name: &str| {
        schemas
            .iter()
            .find(|(file, _)| *file == name)
            .map(|(_, s)| s.clone())
            .expect("schema present")
    };
    let project = find("project.json");
    let defs = &project["$defs"];
    for def in ["Quantity", "CpuQuantity", "Duration", "MaxAge"] {
        assert_eq!(defs[def]["type"], "string", "{def}");
        assert!(defs[def]["pattern"].is_string(), "{def} has a pattern");
    }
    assert_eq!(project["properties"]["kind"]["const"], "Project");
    assert_eq!(
        project["properties"]["apiVersion"]["const"],
        berth_api::API_VERSION
    );
    assert_eq!(defs["ProjectSpec"]["additionalProperties"], false);

    let profile = find("agentprofile.json");
    let required = &profile["$defs"]["AgentProfileSpec"]["required"];
    for field in ["home", "install", "runner"] {
        assert!(
            required
                .as_array()
                .is_some_and(|r| r.iter().any(|f| f == field)),
            "AgentProfileSpec requires {field}: {required}"
        );
    }
    let gitsource = find("gitsource.json");
    assert_eq!(gitsource["properties"]["kind"]["const"], "GitSource");
    assert!(gitsource["$defs"]["GitSourceSpec"]["properties"]["ref"].is_object());
}
