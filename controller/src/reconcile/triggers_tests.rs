use crate::store::Commit;
use std::collections::BTreeMap;

use serde_json::json;

use super::*;
use crate::metrics::Metrics;
use crate::store::Store;
use crate::testing::fixtures::finalized_project;

fn condition(type_: &str, status: &str, reason: &str) -> serde_json::Value {
    json!({"type": type_, "status": status, "reason": reason, "message": "",
           "lastTransitionTime": "2026-01-01T00:00:00Z"})
}

fn sample(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("no {name} in {text}"))
        .parse()
        .unwrap()
}

#[test]
fn held_deletions_and_steps_past_their_deadline_are_counted() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("berth.db")).unwrap();
    let metrics = Metrics::new();
    let held = json!({"phase": "Deleting",
                      "conditions": [condition("DeletionBlocked", "True", "UnsavedWork")]});
    finalized_project(&store, "held-a", held.clone());
    finalized_project(&store, "held-b", held);
    // Asked to go, but not held: the teardown is under way.
    finalized_project(
        &store,
        "going",
        json!({"phase": "Deleting",
             "conditions": [condition("DeletionBlocked", "False", "Forced")]}),
    );
    finalized_project(
        &store,
        "boot",
        json!({"phase": "Error",
             "conditions": [condition("Ready", "False", "BootTimeout")]}),
    );
    finalized_project(
        &store,
        "step",
        json!({"phase": "Provisioning",
             "conditions": [condition("Ready", "False", "StepTimeout")]}),
    );
    finalized_project(
        &store,
        "fine",
        json!({"phase": "Ready",
             "conditions": [condition("Ready", "True", "Reachable")]}),
    );
    // Held, but not (yet) deleting: not a held deletion.
    finalized_project(
        &store,
        "idle",
        json!({"phase": "Stopped",
             "conditions": [condition("DeletionBlocked", "True", "UnsavedWork")]}),
    );
    for name in ["held-a", "held-b", "going"] {
        store
            .delete(Kind::Project, name, None, BTreeMap::new(), Commit::Persist)
            .unwrap();
    }

    count_phases(&store, &metrics);
    let text = metrics.encode();
    assert_eq!(sample(&text, "berth_deletions_held"), 2.0);
    assert_eq!(sample(&text, "berth_projects_step_timeout"), 2.0);
    let age = sample(&text, "berth_deletion_held_oldest_seconds");
    assert!(age > 0.0 && age < 600.0, "{age}");

    store
        .put_status(
            Kind::Project,
            "step",
            None,
            json!({"phase": "Ready", "conditions": [condition("Ready", "True", "Reachable")]}),
        )
        .unwrap();
    for name in ["held-a", "held-b"] {
        store
            .put_status(
                Kind::Project,
                name,
                None,
                json!({"phase": "Deleting",
                       "conditions": [condition("DeletionBlocked", "False", "Clean")]}),
            )
            .unwrap();
    }
    count_phases(&store, &metrics);
    let text = metrics.encode();
    assert_eq!(sample(&text, "berth_deletions_held"), 0.0);
    assert_eq!(sample(&text, "berth_deletion_held_oldest_seconds"), 0.0);
    assert_eq!(sample(&text, "berth_projects_step_timeout"), 1.0);
}
