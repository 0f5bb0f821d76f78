//! Lists, API errors, watch events and the status path.

use berth_api::{
    ApiStatus, Kind, Object, ObjectList, Phase, WatchEvent, WatchEventType, decode_manifest,
};
use serde_json::json;

use crate::yaml;

fn sample() -> Object {
    decode_manifest(yaml(
        "apiVersion: berth.dev/v1alpha1\nkind: Project\nmetadata: {name: w}\n",
    ))
    .unwrap()
}

#[test]
fn the_api_prefix_names_the_api_version() {
    assert_eq!(
        berth_api::API_PREFIX,
        format!("/apis/{}", berth_api::API_VERSION)
    );
}

#[test]
fn lists_name_their_kind() {
    let list = ObjectList::of(Kind::Project, vec![sample()]);
    let v = serde_json::to_value(&list).unwrap();
    assert_eq!(v["kind"], "ProjectList");
    assert_eq!(v["apiVersion"], "berth.dev/v1alpha1");
    assert_eq!(v["items"][0]["kind"], "Project");
    let back: ObjectList = serde_json::from_value(v).unwrap();
    assert_eq!(back, list);
    assert_eq!(
        serde_json::to_value(ObjectList::mixed(vec![])).unwrap()["kind"],
        "List"
    );
}

#[test]
fn invalid_objects_become_kubernetes_status() {
    let err = decode_manifest(yaml(
        "apiVersion: berth.dev/v1alpha1\nkind: Project\nmetadata: {name: p}\nspec: {resources: {memory: 4 gigs}, env: {1X: y}}\n",
    ))
    .unwrap_err();
    let status = ApiStatus::invalid(Kind::Project, "p", &err);
    assert_eq!(
        serde_json::to_value(&status).unwrap(),
        json!({
            "apiVersion": "v1",
            "kind": "Status",
            "status": "Failure",
            "reason": "Invalid",
            "message": "Project \"p\" is invalid: spec.env.1X: \"1X\" is not a valid environment variable name (letters, digits and '_', not starting with a digit); spec.resources.memory: \"4 gigs\" is not a quantity",
            "code": 422,
            "details": {
                "name": "p",
                "kind": "projects",
                "causes": [
                    {"field": "spec.env.1X", "message": "\"1X\" is not a valid environment variable name (letters, digits and '_', not starting with a digit)"},
                    {"field": "spec.resources.memory", "message": "\"4 gigs\" is not a quantity"}
                ]
            }
        })
    );
    assert_eq!(status.causes().len(), 2);
}

#[test]
fn watch_events_serialize_like_kubernetes() {
    let ev = WatchEvent {
        type_: WatchEventType::Modified,
        object: sample(),
    };
    let v = serde_json::to_value(&ev).unwrap();
    assert_eq!(v["type"], "MODIFIED");
    assert_eq!(v["object"]["metadata"]["name"], "w");
    assert_eq!(serde_json::from_value::<WatchEvent>(v).unwrap(), ev);
}

#[test]
fn status_path_decodes_status_with_paths() {
    let mut obj = sample();
    obj.set_status_value(json!({"observedGeneration": 4, "phase": "Ready"}))
        .unwrap();
    assert_eq!(obj.observed_generation(), Some(4));
    let Object::Project(p) = &obj else { panic!() };
    assert_eq!(p.status.as_ref().unwrap().phase, Phase::Ready);

    let err = obj
        .set_status_value(json!({"phase": "Sleeping"}))
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "status.phase: \"Sleeping\" is not a valid value (expected one of `Pending`, `Provisioning`, `Ready`, `Stopped`, `Error`, `Missing`, `Deleting`)"
    );
    obj.set_status_value(serde_json::Value::Null).unwrap();
    assert_eq!(obj.observed_generation(), None);
    assert!(obj.conditions().is_empty());
}

#[test]
fn kinds_serialize_as_their_names() {
    assert_eq!(
        serde_json::to_value(Kind::AgentProfile).unwrap(),
        json!("AgentProfile")
    );
    assert_eq!(
        serde_json::from_value::<Kind>(json!("gitsources")).unwrap(),
        Kind::GitSource
    );
}

#[test]
fn an_exec_session_speaks_its_documented_messages() {
    use berth_api::wire::{ExecControl, ExecEnd, ExecTerminalSize};
    assert_eq!(
        serde_json::to_value(ExecEnd::exited(3)).unwrap(),
        json!({"exitCode": 3})
    );
    assert_eq!(
        serde_json::to_value(ExecEnd::failed("gone")).unwrap(),
        json!({"error": "gone"})
    );
    let eof = ExecControl {
        eof: true,
        resize: None,
    };
    assert_eq!(serde_json::to_value(eof).unwrap(), json!({"eof": true}));
    let resize = ExecControl {
        resize: Some(ExecTerminalSize {
            width: 80,
            height: 24,
        }),
        eof: false,
    };
    assert_eq!(
        serde_json::to_value(resize).unwrap(),
        json!({"resize": {"width": 80, "height": 24}})
    );
    let read: ExecControl =
        serde_json::from_value(json!({"resize": {"width": 1, "height": 2}})).unwrap();
    assert_eq!(read.resize.map(|s| (s.width, s.height)), Some((1, 2)));
    assert!(serde_json::from_value::<ExecControl>(json!({"kill": true})).is_err());
}
