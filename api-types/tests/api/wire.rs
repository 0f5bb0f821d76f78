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

/// Reads `json` as a `T` and writes it back: the typed value is `want`, and writing it gives
/// the same JSON the server writes and the client reads today.
fn round_trips<T>(json: serde_json::Value, want: T)
where
    T: serde::Serialize + serde::de::DeserializeOwned + PartialEq + std::fmt::Debug,
{
    let read: T = serde_json::from_value(json.clone()).unwrap();
    assert_eq!(read, want);
    assert_eq!(serde_json::to_value(&read).unwrap(), json);
}

#[test]
fn wire_shapes_keep_their_json() {
    use berth_api::wire::{
        ApplyItem, ApplyResult, ExecCall, ExecResult, PlanEntry, PoolEntry, PoolList, TrashItem,
        TrashList,
    };
    use berth_api::{ProtectionReason, ReapAction};

    let at = |text: &str| text.parse::<chrono::DateTime<chrono::Utc>>().unwrap();

    round_trips(
        json!({"apiVersion": "berth.dev/v1alpha1", "kind": "ApplyResult", "items": [
            {"kind": "Project", "name": "a", "action": "created", "object": {"kind": "Project"}},
            {"kind": "GitSource", "name": "b", "action": "pruned", "object": null},
        ]}),
        ApplyResult::new(vec![
            ApplyItem {
                kind: "Project".into(),
                name: "a".into(),
                action: "created".into(),
                object: json!({"kind": "Project"}),
            },
            ApplyItem {
                kind: "GitSource".into(),
                name: "b".into(),
                action: "pruned".into(),
                object: serde_json::Value::Null,
            },
        ]),
    );

    // `held` is there only while the refill is held: older clients read the same shape.
    let entry = |held: Option<&str>| PoolEntry {
        image: "berth-base".into(),
        ready: 1,
        wanted: 2,
        claims: 3,
        held: held.map(String::from),
    };
    round_trips(
        json!({"apiVersion": "berth.dev/v1alpha1", "kind": "PoolList", "items": [
            {"image": "berth-base", "ready": 1, "wanted": 2, "claims": 3},
            {"image": "berth-base", "ready": 1, "wanted": 2, "claims": 3, "held": "disk"},
        ]}),
        PoolList {
            api_version: "berth.dev/v1alpha1".into(),
            kind: "PoolList".into(),
            items: vec![entry(None), entry(Some("disk"))],
        },
    );

    let item = TrashItem {
        uid: "3f2a9c".into(),
        name: "payments-api".into(),
        kind: "project".into(),
        controller: "c-1".into(),
        deleted_at: Some(at("2026-01-02T03:04:05Z")),
        trashed_at: Some(at("2026-01-02T03:04:06Z")),
        deleted_by: "unix:alice".into(),
        reason: "deleted".into(),
        expires_at: None,
        bytes: 3 << 20,
    };
    round_trips(
        json!({"apiVersion": "berth.dev/v1alpha1", "kind": "TrashList", "items": [{
            "uid": "3f2a9c", "name": "payments-api", "kind": "project", "controller": "c-1",
            "deletedAt": "2026-01-02T03:04:05Z", "trashedAt": "2026-01-02T03:04:06Z",
            "deletedBy": "unix:alice", "reason": "deleted", "expiresAt": null,
            "bytes": 3145728,
        }], "purgePaused": "the clock went back"}),
        TrashList {
            api_version: "berth.dev/v1alpha1".into(),
            kind: "TrashList".into(),
            items: vec![item],
            purge_paused: Some("the clock went back".into()),
        },
    );

    round_trips(
        json!({"name": "idle", "nextAction": "Delete", "nextActionAt": "2026-01-03T00:00:00Z",
               "protectedBy": ["UnsavedWork", "AgentBlocked"], "reason": "idle for 2h"}),
        PlanEntry {
            name: "idle".into(),
            next_action: Some(ReapAction::Delete),
            next_action_at: Some(at("2026-01-03T00:00:00Z")),
            protected_by: vec![
                ProtectionReason::UnsavedWork,
                ProtectionReason::AgentBlocked,
            ],
            reason: "idle for 2h".into(),
        },
    );
    round_trips(
        json!({"name": "kept", "reason": ""}),
        PlanEntry {
            name: "kept".into(),
            next_action: None,
            next_action_at: None,
            protected_by: Vec::new(),
            reason: String::new(),
        },
    );

    round_trips(
        json!({"command": ["git", "status"], "environment": {"LANG": "C"},
               "cwd": "/workspace/app", "timeoutSeconds": 30}),
        ExecCall {
            command: vec!["git".into(), "status".into()],
            environment: [("LANG".to_string(), "C".to_string())].into(),
            cwd: Some("/workspace/app".into()),
            timeout_seconds: Some(30),
        },
    );
    round_trips(
        json!({"command": ["true"]}),
        ExecCall {
            command: vec!["true".into()],
            environment: Default::default(),
            cwd: None,
            timeout_seconds: None,
        },
    );
    assert!(
        serde_json::from_value::<ExecCall>(json!({"command": ["true"], "user": "root"})).is_err(),
        "an exec call refuses fields it does not know"
    );

    round_trips(
        json!({"exitCode": 1, "stdout": "out", "stderr": "err"}),
        ExecResult {
            exit_code: 1,
            stdout: "out".into(),
            stderr: "err".into(),
            output_cut_at: None,
        },
    );
    round_trips(
        json!({"exitCode": 137, "stdout": "", "stderr": "", "outputCutAt": 1048576}),
        ExecResult {
            exit_code: 137,
            stdout: String::new(),
            stderr: String::new(),
            output_cut_at: Some(1 << 20),
        },
    );
}

/// The README documents these bounds (3 MiB an object, 64 MiB and 100,000 items an apply).
#[test]
fn request_limits_are_the_documented_sizes() {
    use berth_api::wire::{APPLY_ITEMS, APPLY_LIMIT, OBJECT_LIMIT};
    assert_eq!(
        (OBJECT_LIMIT, APPLY_LIMIT, APPLY_ITEMS),
        (3 << 20, 64 << 20, 100_000)
    );
}
