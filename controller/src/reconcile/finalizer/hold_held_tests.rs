use std::collections::BTreeMap;

use super::looks::{Setup, setup};
use super::*;
use crate::config::HELD_RECHECK;
use crate::layout::UID_LABEL;
use crate::runtime::Instance;
use crate::testing::fixtures::{delete_project, finalized_project};
use crate::testing::inspection::{FakeWorkspace, script_inspection};
use berth_api::UnsavedWork;
use serde_json::json;
use std::sync::Arc;

/// A reachable project with a running container, asked to be deleted.
fn deleting(s: &Setup, name: &str, annotations: BTreeMap<String, String>) -> Arc<StoredObject> {
    let store = &s.ctx.store;
    let status = json!({"phase": "Ready", "step": "Reachable"});
    let uid = finalized_project(store, name, status).uid().to_string();
    s.fake.insert_instance(Instance::running(
        name,
        BTreeMap::from([(UID_LABEL.to_string(), uid)]),
    ));
    delete_project(store, name, annotations).unwrap()
}

fn condition(draft: &Draft) -> Option<(ConditionStatus, String)> {
    draft
        .condition(condition_types::DELETION_BLOCKED)
        .map(|c| (c.status, c.reason.clone()))
}

fn refusals(s: &Setup, reason: &str) -> String {
    let text = s.ctx.metrics.encode();
    let key = format!("berth_reap_refusals_total{{reason=\"{reason}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&key))
        .unwrap_or_default()
        .to_string()
}

fn ready_message(draft: &Draft) -> String {
    draft
        .condition(condition_types::READY)
        .map(|c| c.message.clone())
        .unwrap_or_default()
}

#[tokio::test(start_paused = true)]
async fn unpushed_work_holds_a_plain_delete_and_is_looked_at_again_only_later() {
    let s = setup();
    let object = deleting(&s, "p", BTreeMap::new());
    script_inspection(
        &s.fake,
        "p",
        FakeWorkspace::with_unsaved(UnsavedWork {
            unpushed: 1,
            ..UnsavedWork::default()
        }),
    );
    let mut draft = Draft::from_object(&object);
    let retry = hold(&s.ctx, &object, &mut draft).await.unwrap();
    assert_eq!(retry, Some(HELD_RECHECK));
    assert_eq!(
        condition(&draft),
        Some((ConditionStatus::True, "UnsavedWork".into()))
    );
    let events = s.ctx.store.events_for(Kind::Project, "p").unwrap();
    assert!(events.iter().any(|e| e.reason == "DeletionBlocked"));
    let held = ready_message(&draft);
    assert!(
        held.contains("deletion held by UnsavedWork") && held.contains("1 commits on no remote"),
        "{held}"
    );
    assert_eq!(super::ready_message(&draft), held, "the teardown keeps it");
    assert_eq!(draft.status.phase, Phase::Deleting);
    assert_eq!(refusals(&s, "UnsavedWork"), "1");

    // Held: the next reconcile does not inspect again before the interval.
    let execs = s.fake.count("exec");
    let retry = hold(&s.ctx, &object, &mut draft).await.unwrap();
    assert!(retry.is_some_and(|r| r <= HELD_RECHECK));
    assert_eq!(s.fake.count("exec"), execs);

    // At the interval it looks again: still held, and the refusal is not counted again.
    tokio::time::advance(HELD_RECHECK).await;
    assert!(hold(&s.ctx, &object, &mut draft).await.unwrap().is_some());
    assert!(s.fake.count("exec") > execs);
    assert_eq!(refusals(&s, "UnsavedWork"), "1");

    // Pushed: the next look lets the deletion go ahead, and Ready says so.
    script_inspection(&s.fake, "p", FakeWorkspace::default());
    tokio::time::advance(HELD_RECHECK).await;
    assert_eq!(hold(&s.ctx, &object, &mut draft).await.unwrap(), None);
    assert_eq!(
        condition(&draft),
        Some((ConditionStatus::False, "WorkSaved".into()))
    );
    assert_eq!(ready_message(&draft), REMOVING);
    assert_eq!(super::ready_message(&draft), REMOVING);
}

#[tokio::test(start_paused = true)]
async fn the_recheck_interval_is_the_configured_one() {
    let mut s = setup();
    s.ctx.settings.held_recheck = Duration::from_secs(5);
    let object = deleting(&s, "p", BTreeMap::new());
    script_inspection(
        &s.fake,
        "p",
        FakeWorkspace::with_unsaved(UnsavedWork {
            untracked: 1,
            ..UnsavedWork::default()
        }),
    );
    let mut draft = Draft::from_object(&object);
    assert_eq!(
        hold(&s.ctx, &object, &mut draft).await.unwrap(),
        Some(Duration::from_secs(5))
    );
    let execs = s.fake.count("exec");
    tokio::time::advance(Duration::from_secs(5)).await;
    assert!(hold(&s.ctx, &object, &mut draft).await.unwrap().is_some());
    assert!(s.fake.count("exec") > execs, "looked again after 5s");
}

#[tokio::test]
async fn a_forced_delete_and_a_clean_workspace_go_ahead() {
    let s = setup();
    let forced = deleting(
        &s,
        "forced",
        BTreeMap::from([(annotations::FORCE_DELETE.to_string(), "true".to_string())]),
    );
    let mut draft = Draft::from_object(&forced);
    draft.set_condition(
        condition_types::DELETION_BLOCKED,
        ConditionStatus::True,
        "UnsavedWork",
        "held",
    );
    assert_eq!(hold(&s.ctx, &forced, &mut draft).await.unwrap(), None);
    assert_eq!(
        condition(&draft),
        Some((ConditionStatus::False, FORCED.into()))
    );
    assert_eq!(s.fake.count("exec"), 0, "a forced delete inspects nothing");

    let clean = deleting(&s, "clean", BTreeMap::new());
    script_inspection(&s.fake, "clean", FakeWorkspace::default());
    let mut draft = Draft::from_object(&clean);
    assert_eq!(hold(&s.ctx, &clean, &mut draft).await.unwrap(), None);
    assert_eq!(condition(&draft), None);

    // An inspection that cannot be read holds the deletion.
    let unknown = deleting(&s, "unknown", BTreeMap::new());
    let mut draft = Draft::from_object(&unknown);
    assert!(hold(&s.ctx, &unknown, &mut draft).await.unwrap().is_some());
    assert_eq!(
        condition(&draft),
        Some((ConditionStatus::True, "InspectionFailed".into()))
    );
}

#[tokio::test]
async fn releasing_a_forced_hold_keeps_the_rest_of_the_status() {
    let s = setup();
    let object = deleting(&s, "p", BTreeMap::new());
    let mut draft = Draft::from_object(&object);
    draft.set_condition(
        condition_types::DELETION_BLOCKED,
        ConditionStatus::True,
        "UnsavedWork",
        "held",
    );
    let mut status = draft.to_value();
    status["controller"] = json!({"image": "berth-base"});
    s.ctx
        .store
        .put_status(Kind::Project, "p", None, status)
        .unwrap();
    let released = release_forced(&s.ctx.store, "p").unwrap();
    let StatusWritten::Written(released) = released else {
        panic!("the hold was not released: {released:?}")
    };
    assert_eq!(released.status.value()["controller"]["image"], "berth-base");
    let draft = Draft::from_object(&released);
    assert_eq!(
        condition(&draft),
        Some((ConditionStatus::False, FORCED.into()))
    );
    assert!(matches!(
        release_forced(&s.ctx.store, "p").unwrap(),
        StatusWritten::Unchanged(_)
    ));
}
