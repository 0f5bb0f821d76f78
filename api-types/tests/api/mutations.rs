//! Every field of valid manifests replaced by values of every other shape: decoding never
//! panics, every cause names a field, and a field that cannot be a given shape is reported.

use berth_api::decode_manifest;
use serde_json::{Value, json};

use crate::yaml;

const MANIFESTS: &[&str] = &[
    "apiVersion: berth.dev/v1alpha1
kind: Project
metadata: {name: p, labels: {a: b}, annotations: {berth.dev/reconcile: paused}}
spec:
  displayName: P
  state: Stopped
  image: berth-base
  resources: {cpu: '2', memory: 4GiB, disk: 20GiB, workspaceSize: 50GiB}
  agent: shell
  agents: [claude]
  repo: {url: 'file:///srv/r', branch: main}
  seedFiles: [{path: a, content: b, mode: '0644', merge: append}]
  env: {A: b}
  brief: do it
  reap: {idleAfter: 2h, idleAction: Delete, maxAge: never}
",
    "apiVersion: berth.dev/v1alpha1
kind: AgentProfile
metadata: {name: shell}
spec:
  home: /root/.shell
  install: {check: 'true', command: 'true', version: '1'}
  instructions: {target: AGENTS.md, content: x}
  credentials: [{secret: TOKEN}]
  runtimeAssets: [{path: /root/.shell/rc, content: x, mode: '0600'}]
  runner: {command: [sh, -c, 'cat {briefFile}']}
",
    "apiVersion: berth.dev/v1alpha1
kind: GitSource
metadata: {name: g}
spec: {url: 'https://h/r.git', ref: main, path: deploy, interval: 1m, prune: false, suspend: true}
",
];

/// Paths (as JSON pointers) of every value in `v`, the root excluded.
fn pointers(v: &Value, prefix: String, out: &mut Vec<String>) {
    match v {
        Value::Object(m) => {
            for (k, child) in m {
                let p = format!("{prefix}/{}", k.replace('~', "~0").replace('/', "~1"));
                out.push(p.clone());
                pointers(child, p, out);
            }
        }
        Value::Array(a) => {
            for (i, child) in a.iter().enumerate() {
                let p = format!("{prefix}/{i}");
                out.push(p.clone());
                pointers(child, p, out);
            }
        }
        _ => {}
    }
}

#[test]
fn any_field_of_any_shape_is_handled() {
    let shapes = [
        json!(null),
        json!(7),
        json!(-1),
        json!(2.5),
        json!(true),
        json!(""),
        json!("x y"),
        json!([]),
        json!([1]),
        json!({}),
        json!({"bogus": 1}),
    ];
    let mut decoded = 0;
    let mut rejected = 0;
    for manifest in MANIFESTS {
        let base = yaml(manifest);
        let mut paths = Vec::new();
        pointers(&base, String::new(), &mut paths);
        for path in &paths {
            for shape in &shapes {
                let mut v = base.clone();
                *v.pointer_mut(path).expect("pointer exists") = shape.clone();
                match decode_manifest(v) {
                    Ok(_) => decoded += 1,
                    Err(e) => {
                        rejected += 1;
                        assert!(!e.causes.is_empty(), "{path} = {shape}: no causes");
                        for c in &e.causes {
                            assert!(!c.message.is_empty(), "{path} = {shape}: empty message");
                            assert!(
                                !c.message.contains("expected struct")
                                    && !c.message.contains(" map,"),
                                "{path} = {shape}: Rust words in {:?}",
                                c.message
                            );
                            let top_level = ["apiVersion", "kind", ""].contains(&c.field.as_str());
                            assert!(
                                top_level
                                    || c.field.starts_with("metadata")
                                    || c.field.starts_with("spec"),
                                "{path} = {shape}: odd field {:?}",
                                c.field
                            );
                        }
                    }
                }
            }
        }
    }
    assert!(
        decoded > 0 && rejected > decoded,
        "{decoded} decoded, {rejected} rejected"
    );
}

#[test]
fn a_valid_object_survives_store_round_trip() {
    for manifest in MANIFESTS {
        let mut obj = decode_manifest(yaml(manifest)).expect("valid");
        obj.apply_defaults(&berth_api::Defaults::default());
        let stored = berth_api::decode_stored(obj.to_value()).expect("stored form decodes");
        assert_eq!(stored, obj);
        assert_eq!(stored.to_value(), obj.to_value());
        assert_eq!(stored.validate(), Ok(()));
    }
}
