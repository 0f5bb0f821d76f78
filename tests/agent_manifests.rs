//! The AgentProfiles shipped in manifests/agents: every file decodes and validates as a user's
//! manifest would, under the name of its file, with the home each agent keeps its state in.

use std::path::PathBuf;

use berth_api::{Object, decode_manifest};

fn agents_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../manifests/agents")
}

#[test]
fn every_shipped_profile_decodes_with_its_home() {
    let expected = [
        ("antigravity", "/root/.gemini/antigravity-cli"),
        ("claude", "/root/.claude"),
        ("codex", "/root/.codex"),
        ("kimi", "/root/.codex-kimi"),
        ("minimax", "/root/.codex-minimax"),
        ("shell", "/root/.berth-shell"),
    ];
    let mut found = Vec::new();
    for entry in std::fs::read_dir(agents_dir()).expect("manifests/agents") {
        let path = entry.unwrap().path();
        if path.extension().and_then(|e| e.to_str()) != Some("yaml") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        let value: serde_json::Value = serde_yaml::from_str(&text)
            .unwrap_or_else(|e| panic!("{}: not YAML: {e}", path.display()));
        let object = decode_manifest(value).unwrap_or_else(|e| panic!("{}: {e:?}", path.display()));
        let Object::AgentProfile(profile) = object else {
            panic!("{}: not an AgentProfile", path.display());
        };
        let stem = path.file_stem().unwrap().to_str().unwrap();
        assert_eq!(profile.metadata.name, stem, "{}", path.display());
        assert!(
            profile
                .spec
                .runner
                .command
                .iter()
                .any(|a| a.contains("{briefFile}")),
            "{stem}: the runner must be handed the brief"
        );
        if stem != "shell" {
            let install = &profile.spec.install;
            let version = install.version.as_deref().expect("a pinned version");
            assert!(
                install
                    .command
                    .as_deref()
                    .is_some_and(|c| c.contains(version)),
                "{stem}: install.command must install the pinned version {version}"
            );
            assert!(!profile.spec.credentials.is_empty(), "{stem}: credentials");
        }
        found.push((stem.to_string(), profile.spec.home.clone()));
    }
    found.sort();
    let expected: Vec<(String, String)> = expected
        .iter()
        .map(|(n, h)| (n.to_string(), h.to_string()))
        .collect();
    assert_eq!(found, expected);
}
