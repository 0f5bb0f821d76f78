//! Defaulting at admission: manifests in, resolved specs out.

use berth_api::{Defaults, Object, Project, decode_manifest};
use serde_json::json;

use crate::yaml;

fn project(body: &str) -> Project {
    let text = format!("apiVersion: berth.dev/v1alpha1\nkind: Project\n{body}");
    match decode_manifest(yaml(&text)) {
        Ok(Object::Project(p)) => p,
        other => panic!("not a valid project: {other:?}"),
    }
}

/// `reap.protectIgnored` when neither the project nor the configuration says otherwise.
const BUILT_IN: [&str; 3] = [".env*", "*.db", "*.sqlite*"];

/// (case, manifest body, defaults section of berth.yaml or "" for none, expected spec).
fn table() -> Vec<(&'static str, &'static str, &'static str, serde_json::Value)> {
    vec![
        (
            "bare project takes the built-in defaults",
            "metadata: {name: bare}\n",
            "",
            json!({
                "displayName": "bare",
                "state": "Running",
                "image": "berth-base",
                "resources": {"cpu": "2", "memory": "4GiB", "processes": 4096},
                "reap": {"idleAfter": "8h", "idleAction": "Stop", "maxAge": "30d", "protectIgnored": BUILT_IN},
            }),
        ),
        (
            "the project's own values win, field by field",
            "metadata: {name: own}\nspec:\n  displayName: Own Thing\n  state: Stopped\n  image: custom\n  resources: {memory: 8Gi, workspaceSize: 50GiB}\n  reap: {idleAfter: 2h, maxAge: never, protectIgnored: []}\n",
            "",
            json!({
                "displayName": "Own Thing",
                "state": "Stopped",
                "image": "custom",
                "resources": {"cpu": "2", "memory": "8Gi", "workspaceSize": "50GiB", "processes": 4096},
                "reap": {"idleAfter": "2h", "idleAction": "Stop", "maxAge": "never", "protectIgnored": []},
            }),
        ),
        (
            "a partial defaults section keeps the built-in values it leaves out",
            "metadata: {name: fleet}\nspec: {agent: shell, brief: hello}\n",
            "image: other\nresources: {cpu: 500m, disk: 10GiB}\nreap: {idleAction: Delete, protectIgnored: ['*.pem']}\n",
            json!({
                "displayName": "fleet",
                "state": "Running",
                "image": "other",
                "agent": "shell",
                "brief": "hello",
                "resources": {"cpu": "500m", "memory": "4GiB", "disk": "10GiB", "processes": 4096},
                "reap": {"idleAfter": "8h", "idleAction": "Delete", "maxAge": "30d", "protectIgnored": ["*.pem"]},
            }),
        ),
        (
            "a blank display name is replaced by the name",
            "metadata: {name: blank}\nspec: {displayName: ''}\n",
            "",
            json!({
                "displayName": "blank",
                "state": "Running",
                "image": "berth-base",
                "resources": {"cpu": "2", "memory": "4GiB", "processes": 4096},
                "reap": {"idleAfter": "8h", "idleAction": "Stop", "maxAge": "30d", "protectIgnored": BUILT_IN},
            }),
        ),
    ]
}

#[test]
fn defaulting_table() {
    for (case, body, defaults, want) in table() {
        let defaults: Defaults = if defaults.is_empty() {
            Defaults::default()
        } else {
            serde_yaml::from_str(defaults).unwrap_or_else(|e| panic!("{case}: {e}"))
        };
        let mut p = project(body);
        p.apply_defaults(&defaults);
        assert_eq!(serde_json::to_value(&p.spec).unwrap(), want, "{case}");

        // Defaulting a defaulted spec changes nothing, even under different fleet defaults.
        let once = p.clone();
        p.apply_defaults(&defaults);
        assert_eq!(p, once, "{case}: defaulting twice");
        let other: Defaults =
            serde_yaml::from_str("image: elsewhere\nresources: {cpu: '8'}\n").unwrap();
        p.apply_defaults(&other);
        assert_eq!(
            serde_json::to_value(&p.spec).unwrap(),
            serde_json::to_value(&once.spec).unwrap(),
            "{case}: new fleet defaults reach new projects only"
        );

        // The defaulted object, printed and applied again, defaults to the same spec.
        let printed = serde_yaml::to_string(&Object::Project(once.clone())).unwrap();
        let Ok(Object::Project(mut again)) = decode_manifest(yaml(&printed)) else {
            panic!("{case}: defaulted object does not apply back");
        };
        again.apply_defaults(&defaults);
        assert_eq!(again.spec, once.spec, "{case}: re-apply is idempotent");
    }
}

#[test]
fn defaults_section_rejects_unknown_keys_and_bad_values() {
    let err = serde_yaml::from_str::<Defaults>("imag: x\n").unwrap_err();
    assert!(err.to_string().contains("unknown field `imag`"), "{err}");
    let err = serde_yaml::from_str::<Defaults>("resources: {memory: lots}\n").unwrap_err();
    assert!(
        err.to_string().contains("\"lots\" is not a quantity"),
        "{err}"
    );
    let d: Defaults = serde_yaml::from_str("reap: {idleAfter: 0s}\n").unwrap();
    assert_eq!(
        d.validate("defaults").unwrap_err().to_string(),
        "defaults.reap.idleAfter: must be more than 0"
    );
    let d: Defaults = serde_yaml::from_str("reap: {idleAfter: 36500d, maxAge: 36501d}\n").unwrap();
    assert_eq!(
        d.validate("defaults").unwrap_err().to_string(),
        "defaults.reap.maxAge: \"36501d\" is too long: at most 36500d"
    );
    assert_eq!(Defaults::default().validate("defaults"), Ok(()));
}

#[test]
fn profiles_are_agent_first_without_repeats() {
    let p = project(
        "metadata: {name: x}\nspec: {agent: shell, agents: [claude, shell, codex, claude]}\n",
    );
    assert_eq!(p.spec.profiles(), vec!["shell", "claude", "codex"]);
    let p = project("metadata: {name: x}\nspec: {agents: [codex]}\n");
    assert_eq!(p.spec.profiles(), vec!["codex"]);
    let p = project("metadata: {name: x}\n");
    assert!(p.spec.profiles().is_empty());
}

#[test]
fn reap_policy_resolves_missing_fields() {
    let p = project("metadata: {name: x}\nspec: {reap: {idleAction: Delete}}\n");
    let r = p.spec.reap.resolve();
    assert_eq!(r.idle_after.as_std().as_secs(), 8 * 3600);
    assert_eq!(r.idle_action, berth_api::IdleAction::Delete);
    assert_eq!(
        r.max_age.limit().map(|d| d.as_std().as_secs()),
        Some(30 * 86_400)
    );
}

#[test]
fn git_source_defaults_are_filled_at_decode() {
    let obj = decode_manifest(yaml(
        "apiVersion: berth.dev/v1alpha1\nkind: GitSource\nmetadata: {name: g}\nspec: {url: 'https://git.example/fleet.git'}\n",
    ))
    .unwrap();
    assert_eq!(
        obj.spec_value(),
        json!({"url": "https://git.example/fleet.git", "path": ".", "interval": "5m", "prune": true, "suspend": false})
    );
    let Object::GitSource(g) = obj else { panic!() };
    assert_eq!(g.spec.git_ref(), "HEAD");
}

/// A dotted path of a JSON object, `None` when absent.
fn at<'a>(value: &'a serde_json::Value, path: &str) -> Option<&'a serde_json::Value> {
    path.split('.').try_fold(value, |v, key| v.get(key))
}

#[test]
fn defaulted_fields_are_exactly_what_defaulting_fills() {
    let defaults: Defaults = serde_yaml::from_str(
        "image: img\nresources: {cpu: '3', memory: 3GiB, disk: 3GiB, workspaceSize: 3GiB, processes: 300}\n",
    )
    .unwrap();
    let mut p = project("metadata: {name: bare}\n");
    let before = serde_json::to_value(&p.spec).unwrap();
    p.apply_defaults(&defaults);
    let after = serde_json::to_value(&p.spec).unwrap();
    for path in berth_api::DEFAULTED_FIELDS {
        assert!(
            at(&before, path).is_none(),
            "{path} is set before defaulting"
        );
        assert!(
            at(&after, path).is_some(),
            "{path} is not filled by defaulting"
        );
    }
    // Nothing else changes, save the display name (the object name, which never changes).
    let mut rest = after.clone();
    for path in berth_api::DEFAULTED_FIELDS {
        let (parent, leaf) = path.rsplit_once('.').unwrap_or(("", path));
        let holder = if parent.is_empty() {
            &mut rest
        } else {
            &mut rest[parent]
        };
        holder.as_object_mut().unwrap().remove(leaf);
    }
    assert_eq!(
        rest,
        json!({"displayName": "bare", "state": "Running", "resources": {}, "reap": {}})
    );
}
