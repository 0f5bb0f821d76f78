//! Property tests of manifest decoding: whatever a user or a repository sends, decoding returns
//! an object or errors that each name a field (or the document), and never panics; what decodes
//! decodes again to the same object.

use berth_api::decode_manifest;
use proptest::prelude::*;
use serde_json::Value;

/// Field names the three kinds use, so generated manifests reach deep into decoding.
const KEYS: [&str; 40] = [
    "name",
    "labels",
    "annotations",
    "displayName",
    "description",
    "image",
    "state",
    "profiles",
    "resources",
    "memory",
    "cpu",
    "disk",
    "workspaceSize",
    "repo",
    "url",
    "ref",
    "env",
    "brief",
    "reap",
    "idleAfter",
    "maxAge",
    "idleAction",
    "protectIgnored",
    "seedFiles",
    "path",
    "content",
    "mode",
    "merge",
    "interval",
    "prune",
    "suspend",
    "secretRef",
    "home",
    "install",
    "check",
    "runner",
    "command",
    "credentials",
    "secret",
    "runtimeAssets",
];

/// Values of the shapes those fields take, right and wrong.
fn leaf() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        (-1e12f64..1e12).prop_map(Value::from),
        proptest::sample::select(vec![
            "",
            "4GiB",
            "500m",
            "2",
            "30d",
            "never",
            "2h",
            "-1s",
            "99999999999d",
            "Running",
            "Stopped",
            "https://git.example/r.git",
            "file:///srv/r",
            "/workspace/a",
            "../x",
            "a-b",
            "berth-base",
            "0644",
            "replace",
            "UPPER",
            "ã",
            "a\nb",
        ])
        .prop_map(Value::from),
        ".{0,12}".prop_map(Value::String),
    ]
}

fn json() -> impl Strategy<Value = Value> {
    leaf().prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            proptest::collection::btree_map(
                prop_oneof![
                    proptest::sample::select(KEYS.to_vec()).prop_map(String::from),
                    ".{0,6}"
                ],
                inner,
                0..5,
            )
            .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// A manifest with a plausible header and arbitrary metadata and spec.
fn manifest() -> impl Strategy<Value = Value> {
    (
        prop_oneof![Just(Value::from("berth.dev/v1alpha1")), leaf()],
        prop_oneof![
            proptest::sample::select(vec!["Project", "AgentProfile", "GitSource"]).prop_map(Value::from),
            leaf(),
        ],
        prop_oneof![
            "[a-z][a-z0-9-]{0,10}".prop_map(|n| serde_json::json!({"name": n})),
            json()
        ],
        json(),
    )
        .prop_map(|(api_version, kind, metadata, spec)| {
            serde_json::json!({"apiVersion": api_version, "kind": kind, "metadata": metadata, "spec": spec})
        })
}

/// A valid manifest of each kind with one field of its spec set to a value of some shape, so
/// decoding succeeds often and the round trip is exercised.
fn near_valid() -> impl Strategy<Value = Value> {
    (
        proptest::sample::select(vec![
            serde_json::json!({"apiVersion": "berth.dev/v1alpha1", "kind": "Project",
                "metadata": {"name": "p"}, "spec": {"displayName": "P"}}),
            serde_json::json!({"apiVersion": "berth.dev/v1alpha1", "kind": "AgentProfile",
                "metadata": {"name": "a"}, "spec": {"home": "/home/agent",
                "install": {"check": "true"}, "runner": {"command": ["agent"]}}}),
            serde_json::json!({"apiVersion": "berth.dev/v1alpha1", "kind": "GitSource",
                "metadata": {"name": "g"}, "spec": {"url": "https://git.example/r.git"}}),
        ]),
        proptest::sample::select(KEYS.to_vec()),
        prop_oneof![3 => leaf(), 1 => json()],
    )
        .prop_map(|(mut manifest, key, value)| {
            manifest["spec"][key] = value;
            manifest
        })
}

/// Decodes `value` and checks what came back.
fn check(value: Value) -> Result<(), TestCaseError> {
    match decode_manifest(value.clone()) {
        Ok(object) => {
            // What decoded is a manifest that decodes to itself.
            let again = serde_json::to_value(&object).expect("an object serializes");
            let redecoded = decode_manifest(again.clone())
                .map_err(|e| TestCaseError::fail(format!("{again}: {e}")))?;
            prop_assert_eq!(redecoded, object, "{}", value);
        }
        Err(errors) => {
            prop_assert!(!errors.causes.is_empty(), "no cause for {}", value);
            for cause in &errors.causes {
                prop_assert!(!cause.message.is_empty(), "{:?} for {}", cause, value);
                let top = cause.field.split(['.', '[']).next().unwrap_or_default();
                prop_assert!(
                    ["", "apiVersion", "kind", "metadata", "spec"].contains(&top),
                    "{:?} names no field of the document {}",
                    cause,
                    value
                );
            }
        }
    }
    Ok(())
}

proptest! {
    // Failures are kept as plain regression tests, not files.
    #![proptest_config(ProptestConfig {
        cases: 384,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn any_json_decodes_or_names_what_is_wrong(value in json()) {
        check(value)?;
    }

    #[test]
    fn any_manifest_decodes_or_names_what_is_wrong(value in manifest()) {
        check(value)?;
    }

    #[test]
    fn a_near_valid_manifest_decodes_to_itself_or_names_the_field(value in near_valid()) {
        check(value)?;
    }

    /// YAML text as a repository may hold it: whatever the YAML parser makes of it.
    #[test]
    fn any_yaml_decodes_or_names_what_is_wrong(text in "[a-zA-Z0-9:{}\\[\\],&*!|>'\" \n-]{0,64}") {
        if let Ok(value) = serde_yaml::from_str::<Value>(&text) {
            check(value)?;
        }
    }
}
