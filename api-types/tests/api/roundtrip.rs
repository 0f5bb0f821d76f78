//! Stored objects survive decode_stored → to_value unchanged.

use berth_api::{Object, decode_stored};
use serde_json::json;

#[test]
fn full_project_round_trips() {
    let stored = json!({
        "apiVersion": "berth.dev/v1alpha1",
        "kind": "Project",
        "metadata": {
            "name": "payments-api",
            "uid": "3f2a9c",
            "generation": 3,
            "resourceVersion": "42",
            "labels": {"team": "payments"},
            "annotations": {"berth.dev/restartedAt": "2026-01-02T03:04:05Z"},
            "creationTimestamp": "2026-01-01T00:00:00Z",
            "deletionTimestamp": "2026-01-03T00:00:00Z",
            "finalizers": ["berth.dev/cleanup"]
        },
        "spec": {
            "displayName": "Payments API",
            "state": "Running",
            "image": "berth-base",
            "resources": {"cpu": "500m", "memory": "4GiB", "disk": "20GiB", "workspaceSize": "50Gi"},
            "agent": "shell",
            "agents": ["claude", "codex"],
            "repo": {"url": "file:///srv/pay.git", "branch": "main"},
            "seedFiles": [
                {"path": ".env.local", "content": "PORT=3000\n", "mode": "0644"},
                {"path": "AGENTS.md", "content": "...", "merge": "append"}
            ],
            "env": {"NODE_ENV": "development"},
            "brief": "Fix the flaky checkout test",
            "reap": {"idleAfter": "1h30m", "idleAction": "Delete", "maxAge": "never"}
        },
        "status": {
            "observedGeneration": 3,
            "phase": "Ready",
            "step": "Briefed",
            "conditions": [{
                "type": "Ready", "status": "True", "reason": "Briefed", "message": "",
                "lastTransitionTime": "2026-01-01T00:01:00Z", "observedGeneration": 3
            }],
            "container": {
                "name": "payments-api", "location": "none", "imageFingerprint": "abc123",
                "pid": 4242, "createdAt": "2026-01-01T00:00:10Z", "lastUsedAt": "2026-01-01T00:00:20Z"
            },
            "title": "Fix flaky checkout test in CI",
            "agent": {"state": "blocked", "message": "Which DB?", "briefId": "b1", "updatedAt": "2026-01-01T00:02:00Z"},
            "activity": {"lastActiveAt": "2026-01-01T00:02:00Z", "source": "agent", "inspectedAt": "2026-01-01T00:03:00Z"},
            "unsavedWork": {"uncommitted": 2, "untracked": 0, "stashes": 0, "unpushed": 1},
            "reap": {"protectedBy": ["AgentBlocked", "UnsavedWork"], "nextAction": "Stop", "nextActionAt": "2026-01-01T08:00:00Z"},
            "ports": [{"port": 3000, "url": "http://payments-api--3000.localhost"}],
            "message": "waiting",
            "briefId": "b1"
        }
    });
    let obj = decode_stored(stored.clone()).expect("decodes");
    assert_eq!(obj.to_value(), stored);
    assert_eq!(obj.key(), "Project/payments-api");
    let back: Object = serde_json::from_value(serde_json::to_value(&obj).unwrap()).unwrap();
    assert_eq!(back, obj);
}

#[test]
fn profile_and_git_source_round_trip() {
    for stored in [
        json!({
            "apiVersion": "berth.dev/v1alpha1",
            "kind": "AgentProfile",
            "metadata": {"name": "claude", "uid": "u1", "generation": 1, "resourceVersion": "1"},
            "spec": {
                "home": "/root/.claude",
                "install": {"check": "claude --version", "command": "npm i -g x", "version": "2.0.1"},
                "instructions": {"target": "/workspace/CLAUDE.md", "content": "..."},
                "credentials": [{"secret": "ANTHROPIC_API_KEY"}],
                "runtimeAssets": [{"path": "/root/.claude/settings.json", "content": "{}", "mode": "0600"}],
                "runner": {"command": ["claude", "-p", "{briefFile}"]}
            }
        }),
        json!({
            "apiVersion": "berth.dev/v1alpha1",
            "kind": "GitSource",
            "metadata": {"name": "fleet"},
            "spec": {"url": "https://git.example/fleet.git", "ref": "v1.2", "path": "clusters/a", "interval": "1m", "prune": false, "suspend": true},
            "status": {
                "observedGeneration": 1,
                "conditions": [],
                "lastAppliedRevision": "abc", "lastAttemptedRevision": "def",
                "lastSyncedAt": "2026-01-01T00:00:00Z",
                "inventory": ["Project/a", "AgentProfile/shell"]
            }
        }),
    ] {
        let obj = decode_stored(stored.clone()).expect("decodes");
        let mut want = stored;
        // An empty conditions list is omitted on output.
        if let Some(s) = want.get_mut("status").and_then(|s| s.as_object_mut()) {
            s.remove("conditions");
        }
        assert_eq!(obj.to_value(), want);
    }
}

#[test]
fn an_empty_status_decodes() {
    let obj = decode_stored(json!({
        "apiVersion": "berth.dev/v1alpha1", "kind": "Project",
        "metadata": {"name": "p"}, "spec": {}, "status": {}
    }))
    .unwrap();
    let Object::Project(p) = obj else { panic!() };
    let status = p.status.expect("status present");
    assert_eq!(status.phase, berth_api::Phase::Pending);
    assert!(status.step.is_none() && status.conditions.is_empty());
}

#[test]
fn stored_objects_are_not_validated_but_must_be_well_formed() {
    // A stored object is trusted: validation rules may tighten between versions.
    assert!(decode_stored(json!({"kind": "Project", "metadata": {"name": "Legacy_Name"}})).is_ok());
    let err = decode_stored(
        json!({"kind": "Project", "metadata": {"name": "p"}, "spec": {"state": "Off"}}),
    )
    .unwrap_err();
    assert_eq!(
        err.to_string(),
        "spec.state: \"Off\" is not a valid value (expected `Running` or `Stopped`)"
    );
    assert_eq!(
        decode_stored(json!({"kind": "Pod"}))
            .unwrap_err()
            .to_string(),
        "kind: \"Pod\" is not a known kind (Project, AgentProfile or GitSource)"
    );
}
