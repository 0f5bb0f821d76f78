//! The AgentProfiles shipped in manifests/agents: every file decodes and validates as a user's
//! manifest would, under the name of its file, with the home each agent keeps its state in. And
//! what `berth apply` refuses: an incomplete profile, a seed file outside /workspace, each with a
//! line naming the file and the field, nothing stored.

use std::path::PathBuf;

use crate::support::daemon::Daemon;
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
        // A status-file runner is handed the brief's path; the adapter hands it to the others.
        assert!(
            profile.spec.runner.protocol != berth_api::RunnerProtocol::StatusFile
                || profile
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

#[test]
fn apply_refuses_incomplete_profiles_and_seeds_outside_the_workspace() {
    let daemon = Daemon::start();
    // (manifest, the object as the CLI names it, what a line of the error says)
    let cases: &[(&str, &str, &[&str])] = &[
        (
            "kind: AgentProfile\nmetadata: {name: no-check}\nspec:\n  home: /root/.x\n  runner: {command: [x]}\n",
            "agentprofile/no-check",
            &["spec.install.check: required"],
        ),
        (
            "kind: AgentProfile\nmetadata: {name: no-home}\nspec:\n  install: {check: \"true\"}\n",
            "agentprofile/no-home",
            &["spec.home: required", "spec.runner.command: required"],
        ),
        (
            "kind: Project\nmetadata: {name: climbs-out}\nspec:\n  seedFiles:\n    - {path: ../etc/passwd, content: x}\n",
            "project/climbs-out",
            &["spec.seedFiles[0].path: \"../etc/passwd\" must not contain '..'"],
        ),
        (
            "kind: Project\nmetadata: {name: absolute}\nspec:\n  seedFiles:\n    - {path: notes.txt, content: x}\n    - {path: /etc/passwd, content: x}\n",
            "project/absolute",
            &["spec.seedFiles[1].path: \"/etc/passwd\" must lie under /workspace"],
        ),
    ];
    for (i, (manifest, object, errors)) in cases.iter().enumerate() {
        let file = daemon.dir.path().join(format!("bad-{i}.yaml"));
        std::fs::write(&file, format!("apiVersion: berth.dev/v1alpha1\n{manifest}")).unwrap();
        let out = daemon.cli(&["apply", "-f", file.to_str().unwrap()]);
        let said = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{object} applied: {said}");
        for error in *errors {
            // One line names the file, the object, the field and what is wrong with it.
            assert!(
                said.lines()
                    .any(|line| line.contains(&format!("bad-{i}.yaml"))
                        && line.contains(object)
                        && line.contains(error)),
                "{object}: no line says {error:?}:\n{said}"
            );
        }
        let (kind, name) = object.split_once('/').unwrap();
        let reply = daemon
            .client()
            .get(&format!("/apis/berth.dev/v1alpha1/{kind}s/{name}"));
        assert_eq!(reply.status, 404, "{object} was stored: {}", reply.text());
    }
}
