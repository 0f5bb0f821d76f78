use std::sync::Mutex;
use std::time::Duration;

use serde_json::json;

use super::super::fake_runtime_tests::Setup;
use super::*;
use crate::metrics::Metrics;
use crate::reconcile::{Action, AgentSettings, Backoff};
use crate::runtime::{FileWrite, InstanceStatus, Runtime};
use crate::testing::eventually;

/// A briefed project `p` with its container running, followed by the watch every
/// `interval`; returns the setup, the follows so far (for each, how many looks the watch
/// had taken, calls to `watch_files`, when it ran), and the watch's task.
fn watched(
    interval: Duration,
    cancel: &CancellationToken,
) -> (Setup, Arc<Mutex<Vec<usize>>>, tokio::task::JoinHandle<()>) {
    let setup = super::super::fake_runtime_tests::setup_with(
        json!({"agent": "shell", "brief": "hi"}),
        AgentSettings {
            watch_interval: interval,
            ..AgentSettings::default()
        },
    );
    setup
        .store
        .put_status(
            Kind::Project,
            "p",
            None,
            json!({"phase": "Ready", "step": "Briefed", "briefId": "b-1"}),
        )
        .unwrap();
    setup
        .fake
        .insert_instance(crate::runtime::Instance::running("p", Default::default()));
    let queue = WorkQueue::new(1, Backoff::default(), Arc::new(Metrics::new()));
    let follows = Arc::new(Mutex::new(Vec::new()));
    let (counted, following, fake) = (follows.clone(), setup.steps.clone(), setup.fake.clone());
    let (running, stop) = (queue.clone(), cancel.clone());
    // The reconcile's part: follow the project in its slot (its secrets, then its report).
    tokio::spawn(async move {
        running
            .run(stop, move |name| {
                let (counted, following, fake) = (counted.clone(), following.clone(), fake.clone());
                async move {
                    following.follow_project(&name).await;
                    counted.lock().unwrap().push(fake.count("watch_files"));
                    Ok::<_, std::convert::Infallible>(Action::Done)
                }
            })
            .await
    });
    let watch = setup.steps.spawn_watch(queue, cancel.clone());
    (setup, follows, watch)
}

fn report(state: &str) -> FileWrite {
    FileWrite {
        path: agent::STATUS_FILE.to_string(),
        content: format!(r#"{{"state":"{state}","briefId":"b-1"}}"#).into_bytes(),
        uid: 0,
        gid: 0,
        mode: 0o644,
    }
}

fn agent_state(setup: &Setup) -> serde_json::Value {
    setup.store.get(Kind::Project, "p").unwrap().status.value()["agent"]["state"].clone()
}

/// A briefed project is followed on a notice of a write in its `/run/berth`, and not by the
/// poll while its directory is watched; once it cannot be watched, the poll takes over.
#[tokio::test]
async fn a_watched_agent_report_is_followed_on_notice_not_polled() {
    let cancel = CancellationToken::new();
    let (setup, follows, watch) = watched(Duration::from_millis(20), &cancel);
    let fake = &setup.fake;
    let followed = || follows.lock().unwrap().len();

    // Watched from the first look on, and followed once then (a report may predate it).
    eventually("the first follow", || followed() == 1).await;
    let ticks = fake.count("watch_files");
    eventually("five more looks", || fake.count("watch_files") >= ticks + 5).await;
    assert_eq!(followed(), 1, "a watched report was polled");

    // The agent writes its report: one follow.
    fake.file_write("p", &report("blocked")).await.unwrap();
    eventually("a follow on the notice", || followed() == 2).await;
    assert_eq!(agent_state(&setup), "blocked");

    // Stopped (its tmpfs gone, so no watch): polled on every look.
    fake.set_status("p", InstanceStatus::Stopped);
    eventually("polled again", || followed() >= 5).await;
    cancel.cancel();
    watch.await.unwrap();
}

/// A restart ends the watch with the container's tmpfs `/run`: the agent's report written
/// before the next look is not noticed, but that look starts a new watch, so the report is
/// read then, not on the safety poll.
#[tokio::test]
async fn a_report_written_before_a_watch_restarts_is_read_on_the_next_look() {
    let cancel = CancellationToken::new();
    let (setup, follows, watch) = watched(Duration::from_millis(50), &cancel);
    let fake = &setup.fake;
    let followed = || follows.lock().unwrap().len();
    eventually("the first follow", || followed() == 1).await;
    let looks = fake.count("watch_files");
    eventually("two more looks", || fake.count("watch_files") >= looks + 2).await;
    assert_eq!(followed(), 1, "a watched report was polled");

    // Nothing in between yields to the watch: no look comes between these two calls.
    fake.restart_instance("p", false, Duration::from_secs(1))
        .await
        .unwrap();
    fake.file_write("p", &report("blocked")).await.unwrap();
    let written = fake.count("watch_files");
    eventually("the report read", || agent_state(&setup) == "blocked").await;

    let follows = follows.lock().unwrap().clone();
    assert_eq!(follows.len(), 2, "one follow for the report: {follows:?}");
    let look = follows[1];
    assert_eq!(look, written + 1, "read on the next look");
    assert!(
        !u64::try_from(look - 1)
            .unwrap()
            .is_multiple_of(RECHECK_TICKS),
        "the look after the restart was the safety poll's: nothing shown"
    );
    cancel.cancel();
    watch.await.unwrap();
}
