//! The reconcile against the fake runtime and a real store: convergence, no repeated side
//! effects under lost replies and failing calls, drift, the fleet guard, conflicts, deletion.

use crate::store::Commit;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use berth_api::{Kind, Phase, ProjectStatus, Step};
use serde_json::{Value, json};

use super::{Action, Context, ControllerSettings, NoLaterSteps, Timeouts, WorkQueue, project};
use crate::layout::{CONTROLLER_LABEL, DurableLayout, FINALIZER, UID_LABEL};
use crate::metrics::Metrics;
use crate::runtime::{Instance, InstanceStatus, Runtime, RuntimeError};
use crate::store::{Desired, EventType, Store};
use crate::testing::eventually;
use crate::testing::fake_runtime::{FakeRuntime, Fault};
use crate::testing::inspection::{FakeWorkspace, script_inspection};

/// More reconciles than any convergence here needs; hitting it means a loop.
const MAX_ROUNDS: usize = 40;

struct Harness {
    _dir: tempfile::TempDir,
    store: Arc<Store>,
    fake: Arc<FakeRuntime>,
    ctx: Context,
}

impl Harness {
    fn new() -> Harness {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(Store::open(&dir.path().join("berth.db")).unwrap());
        let fake = Arc::new(FakeRuntime::new());
        let metrics = Arc::new(Metrics::new());
        let settings = ControllerSettings {
            timeouts: Timeouts {
                boot: Duration::from_secs(5),
                ..Timeouts::default()
            },
            ..ControllerSettings::default()
        };
        let queue = WorkQueue::new(1, settings.backoff, metrics.clone());
        let ctx = Context::new(
            store.clone(),
            fake.clone(),
            metrics,
            settings,
            Arc::new(NoLaterSteps),
            queue,
        );
        Harness {
            _dir: dir,
            store,
            fake,
            ctx,
        }
    }

    fn apply(&self, name: &str, spec: Value) {
        self.apply_with(name, spec, BTreeMap::new());
    }

    fn apply_with(&self, name: &str, spec: Value, annotations: BTreeMap<String, String>) {
        self.store
            .apply(
                Desired::project(name, spec).with_annotations(annotations),
                Commit::Persist,
            )
            .unwrap();
    }

    fn annotate(&self, name: &str, key: &str, value: &str) {
        let object = self.store.get(Kind::Project, name).unwrap();
        let mut annotations = object.metadata.annotations.clone();
        annotations.insert(key.into(), value.into());
        self.apply_with(name, object.spec.value(), annotations);
    }

    /// Runs reconciles the way the queue would (again at once after a requeue or an error)
    /// until one says Done; returns the errors seen on the way.
    async fn converge(&self, name: &str) -> Vec<String> {
        let mut errors = Vec::new();
        for _ in 0..MAX_ROUNDS {
            match project::reconcile(&self.ctx, name).await {
                Ok(Action::Done) => return errors,
                Ok(Action::Requeue(_)) => {}
                Err(e) => errors.push(e.to_string()),
            }
        }
        panic!(
            "{name} did not converge in {MAX_ROUNDS} reconciles; errors {errors:?}; status {}",
            self.status_value(name)
        );
    }

    fn status_value(&self, name: &str) -> Value {
        self.store
            .get(Kind::Project, name)
            .map(|o| o.status.value())
            .unwrap_or(Value::Null)
    }

    fn status(&self, name: &str) -> ProjectStatus {
        serde_json::from_value(self.status_value(name)).unwrap_or_default()
    }

    fn ready_reason(&self, name: &str) -> (String, String) {
        let status = self.status(name);
        let ready = berth_api::find_condition(&status.conditions, "Ready").expect("Ready");
        (format!("{:?}", ready.status), ready.reason.clone())
    }

    fn uid(&self, name: &str) -> String {
        self.store
            .get(Kind::Project, name)
            .unwrap()
            .uid()
            .to_string()
    }

    fn assert_ready(&self, name: &str) {
        let status = self.status(name);
        assert_eq!(status.phase, Phase::Ready, "{}", self.status_value(name));
        assert_eq!(self.ready_reason(name).0, "True");
    }

    /// Exactly one container, this project's, and its workspace volume.
    fn assert_one_of_everything(&self, name: &str) {
        let uid = self.uid(name);
        let instance = self.fake.instance(name).expect("container");
        assert_eq!(instance.config.get(UID_LABEL), Some(&uid));
        let controller = self.store.controller_id().to_string();
        assert_eq!(instance.config.get(CONTROLLER_LABEL), Some(&controller));
        assert_eq!(self.fake.instance_names(), [name.to_string()]);
        let volume = self
            .fake
            .volume("default", &DurableLayout::workspace_volume(&uid))
            .expect("workspace volume");
        assert_eq!(volume.config.get(UID_LABEL), Some(&uid));
        assert_eq!(volume.config.get(CONTROLLER_LABEL), Some(&controller));
    }
}

fn tiny() -> Value {
    json!({"image": "berth-tiny"})
}

#[tokio::test]
async fn a_project_without_agent_is_ready_once_reachable() {
    let h = Harness::new();
    h.apply("p", tiny());
    assert!(h.converge("p").await.is_empty());
    h.assert_ready("p");
    h.assert_one_of_everything("p");
    let status = h.status("p");
    assert_eq!(status.step, Some(Step::Reachable));
    assert_eq!(status.observed_generation, 1);
    let container = status.container.unwrap();
    assert_eq!(container.name, "p");
    assert!(container.image_fingerprint.is_some());
    assert!(
        h.store
            .get(Kind::Project, "p")
            .unwrap()
            .metadata
            .finalizers
            .contains(&FINALIZER.to_string())
    );
    assert_eq!(h.fake.count("create_instance"), 1);
    assert_eq!(h.fake.count("start_instance"), 1);

    // The create step read the started container without its state: the next reconcile, which
    // reads it afresh, records its pid.
    assert_eq!(container.pid, None);
    h.converge("p").await;
    let pid = h.status("p").container.and_then(|c| c.pid);
    assert_eq!(pid, h.fake.instance("p").unwrap().state.map(|s| s.pid));

    // Converged: another reconcile changes nothing and calls nothing that acts.
    let rv = h.store.get(Kind::Project, "p").unwrap().resource_version();
    h.converge("p").await;
    assert_eq!(
        h.store.get(Kind::Project, "p").unwrap().resource_version(),
        rv
    );
    assert_eq!(h.fake.count("create_instance"), 1);
    assert_eq!(h.fake.count("start_instance"), 1);
}

#[tokio::test]
async fn one_reconcile_takes_a_new_project_to_ready_reading_each_thing_once() {
    let h = Harness::new();
    h.apply("p", tiny());
    let action = project::reconcile(&h.ctx, "p").await.unwrap();
    assert_eq!(action, Action::Done);
    h.assert_ready("p");
    // Read before the create, and once after the start that follows it at once (for the
    // Created record, without the state LXD gathers from the container): the steps after start
    // from what the step before read.
    assert_eq!(h.fake.count("get_instance"), 1);
    assert_eq!(h.fake.count("get_instance_record"), 1);
    assert_eq!(h.fake.count("start_instance"), 1);
    // The alias is resolved once for the create and the image check of every later step.
    assert_eq!(h.fake.count("resolve_image"), 1);
    assert_eq!(h.fake.count("exec"), 1);
    // Every step was committed on the way; the pid waits for a read with the state.
    let status = h.status("p");
    assert_eq!(status.step, Some(Step::Reachable));
    assert!(status.container.is_some_and(|c| c.pid.is_none()));
}

#[tokio::test]
async fn a_missing_container_is_judged_by_a_list_that_began_after_it_was_missed() {
    let h = Harness::new();
    h.apply("p", tiny());
    h.converge("p").await;
    h.apply("q", tiny());
    h.converge("q").await;
    // A list made while both were there answers for neither once q is found missing.
    crate::reconcile::triggers::resync_pass(&h.ctx).await;
    h.fake.vanish("q");
    // As LXD's instance-deleted event does.
    h.ctx.snapshot.forget("q");
    let lists = h.fake.count("list_instances");
    assert!(h.converge("q").await.is_empty());
    assert!(h.fake.count("list_instances") > lists, "listed again");
    assert_eq!(h.fake.count("create_instance"), 3, "q recreated");
    h.assert_ready("q");
}

#[tokio::test]
async fn status_another_writer_records_during_a_reconcile_survives_its_commits() {
    let h = Harness::new();
    h.apply("p", tiny());
    // The scheduler records activity and a title while the Reachable step's exec is under
    // way; the step's commits that follow must keep both.
    let store = h.store.clone();
    let written = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let once = written.clone();
    h.fake.on_exec(move |name, _| {
        if !once.swap(true, std::sync::atomic::Ordering::SeqCst) {
            let object = store.get(Kind::Project, name).unwrap();
            let mut status = object.status.value();
            status["activity"] = json!({"lastActiveAt": "2026-01-01T00:00:00Z", "source": "exec"});
            status["title"] = json!("Fix the flaky test");
            store
                .put_status(Kind::Project, name, Some(object.resource_version()), status)
                .unwrap();
        }
        None
    });
    assert!(h.converge("p").await.is_empty());
    assert!(written.load(std::sync::atomic::Ordering::SeqCst));
    h.assert_ready("p");
    let status = h.status("p");
    assert_eq!(status.step, Some(Step::Reachable));
    assert_eq!(status.title.as_deref(), Some("Fix the flaky test"));
    assert_eq!(
        status
            .activity
            .and_then(|a| a.last_active_at)
            .map(|t| t.to_rfc3339()),
        Some("2026-01-01T00:00:00+00:00".to_string())
    );
}

#[tokio::test]
async fn the_create_request_carries_label_limits_and_mounts() {
    let h = Harness::new();
    h.apply(
        "p",
        json!({"image": "berth-tiny", "resources": {"cpu": "500m", "memory": "1GiB"}}),
    );
    h.converge("p").await;
    let instance = h.fake.instance("p").unwrap();
    assert_eq!(instance.config["limits.cpu.allowance"], "50ms/100ms");
    assert_eq!(instance.config["limits.memory"], "1073741824");
    let uid = h.uid("p");
    assert_eq!(
        instance.devices["workspace"]["source"],
        DurableLayout::workspace_volume(&uid)
    );
    assert_eq!(instance.devices["workspace"]["path"], "/workspace");
    // Config, limits and devices went in with the create: no patch afterwards.
    assert_eq!(h.fake.count("patch_instance"), 0);
}

/// A limit that came from the fleet's defaults is best effort: a create LXD refuses with it is
/// made again without the fleet's limits, said in a Warning event and counted; a project's own
/// limit LXD refuses fails the create instead.
#[tokio::test]
async fn a_fleet_default_lxd_refuses_is_left_out_said_and_counted() {
    let h = Harness::new();
    h.fake
        .refuse_config("limits.memory", Some("Failed to set memory limit"));
    h.apply(
        "p",
        json!({"image": "berth-tiny", "resources": {"memory": "1GiB"}}),
    );
    h.converge("p").await;
    h.assert_ready("p");
    let instance = h.fake.instance("p").unwrap();
    assert!(
        !instance.config.contains_key("limits.memory"),
        "{:?}",
        instance.config
    );
    assert!(
        h.ctx
            .metrics
            .encode()
            .contains("berth_fleet_defaults_refused_total 1")
    );
    let events = h.store.events_for(Kind::Project, "p").unwrap();
    let warned = events
        .iter()
        .find(|e| e.reason == "FleetDefaultsNotApplied")
        .expect("a FleetDefaultsNotApplied event");
    assert_eq!(warned.type_, EventType::Warning);
    assert!(
        warned.message.contains("Failed to set memory limit"),
        "{}",
        warned.message
    );

    // The project's own limit: the create fails, nothing is counted.
    let own = BTreeMap::from([(
        berth_api::annotations::OVERRIDES.to_string(),
        "resources.memory".to_string(),
    )]);
    h.apply_with(
        "q",
        json!({"image": "berth-tiny", "resources": {"memory": "1GiB"}}),
        own,
    );
    let _ = project::reconcile(&h.ctx, "q").await;
    assert!(h.fake.instance("q").is_none());
    assert!(
        h.ctx
            .metrics
            .encode()
            .contains("berth_fleet_defaults_refused_total 1")
    );
}

/// Every call of a convergence fails once, or has its reply lost once; the project still
/// converges, with one container and one volume: no side effect is repeated.
#[tokio::test]
async fn any_one_failing_or_lost_call_still_converges_without_repeats() {
    let calls = {
        let h = Harness::new();
        h.apply("p", tiny());
        h.converge("p").await;
        h.fake.calls().len() as u64
    };
    for n in 1..=calls {
        for fault in [
            Fault::LoseReply,
            Fault::Fail(RuntimeError::Transport {
                what: "injected".into(),
                message: "connection refused".into(),
            }),
        ] {
            let h = Harness::new();
            h.apply("p", tiny());
            h.fake.fault_nth_call(n, fault.clone());
            h.converge("p").await;
            h.assert_ready("p");
            h.assert_one_of_everything("p");
            assert!(
                h.fake.count("start_instance") <= 2,
                "call {n} {fault:?}: {:?}",
                h.fake.calls()
            );
        }
    }
}

#[tokio::test]
async fn a_lost_create_reply_is_recognised_by_the_label() {
    let h = Harness::new();
    h.apply("p", tiny());
    h.fake.fault_method("create_instance", Fault::LoseReply);
    let errors = h.converge("p").await;
    assert_eq!(errors.len(), 1, "{errors:?}");
    h.assert_ready("p");
    h.assert_one_of_everything("p");
}

#[tokio::test]
async fn slow_calls_converge_the_same() {
    let h = Harness::new();
    h.fake.set_latency(Duration::from_millis(5));
    for name in ["a", "b", "c"] {
        h.apply(name, tiny());
    }
    let (a, b, c) = tokio::join!(h.converge("a"), h.converge("b"), h.converge("c"));
    assert!(a.is_empty() && b.is_empty() && c.is_empty());
    for name in ["a", "b", "c"] {
        h.assert_ready(name);
    }
    assert_eq!(h.fake.count("create_instance"), 3);
}

#[tokio::test]
async fn a_vanished_container_is_recreated_with_the_same_volume() {
    let h = Harness::new();
    h.apply("p", tiny());
    h.converge("p").await;
    let volumes_before = h.fake.count("create_volume");
    h.fake.vanish("p");
    h.converge("p").await;
    h.assert_ready("p");
    h.assert_one_of_everything("p");
    assert_eq!(h.fake.count("create_instance"), 2);
    // The volume existed: asked for again (idempotent), never replaced.
    assert!(h.fake.count("create_volume") > volumes_before);
    assert_eq!(h.fake.count("delete_volume"), 0);
}

#[tokio::test]
async fn many_vanishing_at_once_recreates_none_until_a_person_asks() {
    let h = Harness::new();
    let names = ["a", "b", "c", "d"];
    for name in names {
        h.apply(name, tiny());
        h.converge(name).await;
    }
    for name in ["a", "b", "c"] {
        h.fake.vanish(name);
    }
    for name in ["a", "b", "c"] {
        match project::reconcile(&h.ctx, name).await.unwrap() {
            Action::Requeue(d) => assert!(d > Duration::ZERO),
            Action::Done => panic!("held project must be looked at again"),
        }
        assert_eq!(h.status(name).phase, Phase::Missing);
    }
    assert_eq!(h.fake.count("create_instance"), 4);
    assert!(h.fake.instance("a").is_none());
    assert!(
        h.ctx
            .metrics
            .encode()
            .contains("berth_containers_vanished_total 1")
    );

    // A person releases one with `berth restart --recreate`.
    h.annotate("a", berth_api::annotations::RECREATE_REQUESTED_AT, "now");
    h.converge("a").await;
    h.assert_ready("a");
    assert!(h.fake.instance("b").is_none());
}

#[tokio::test]
async fn a_container_made_between_the_read_and_the_create_is_judged_not_failed() {
    // Not berth's: a name conflict. Berth's own (a create before a crash that the record
    // missed, say): it carries on with it.
    for (ours, reason) in [(false, "NameConflict"), (true, "Reachable")] {
        let h = Harness::new();
        h.apply("p", tiny());
        let uid = h.store.get(Kind::Project, "p").unwrap().uid().to_string();
        let made = match ours {
            true => Instance::labelled("p", &[(crate::layout::UID_LABEL, &uid)]),
            false => Instance::running("p", BTreeMap::new()),
        };
        h.fake
            .before_next("create_instance", move |fake| fake.insert_instance(made));
        for _ in 0..3 {
            project::reconcile(&h.ctx, "p").await.unwrap();
        }
        assert_eq!(h.ready_reason("p").1, reason);
        assert_eq!(h.fake.count("create_instance"), 1);
        assert_eq!(h.fake.count("delete_instance"), 0);
    }
}

#[tokio::test]
async fn a_same_named_container_without_the_label_is_never_touched() {
    let h = Harness::new();
    let stranger = Instance {
        name: "p".into(),
        status: InstanceStatus::Running,
        status_code: 103,
        location: "none".into(),
        profiles: vec!["default".into()],
        config: BTreeMap::new(),
        devices: BTreeMap::new(),
        created_at: None,
        last_used_at: None,
        state: None,
    };
    h.fake.insert_instance(stranger.clone());
    h.apply("p", tiny());
    // The finalizer first, then the conflict, in one reconcile.
    let action = project::reconcile(&h.ctx, "p").await.unwrap();
    assert!(matches!(action, Action::Requeue(d) if d > Duration::ZERO));
    assert_eq!(h.ready_reason("p").1, "NameConflict");
    let finalizers = h
        .store
        .get(Kind::Project, "p")
        .unwrap()
        .metadata
        .finalizers
        .clone();
    assert_eq!(finalizers, vec![crate::layout::FINALIZER.to_string()]);
    for method in [
        "stop_instance",
        "delete_instance",
        "patch_instance",
        "start_instance",
        "update_instance",
        "create_volume",
    ] {
        assert_eq!(h.fake.count(method), 0, "{method}");
    }

    // Deleting the project leaves the stranger as it was.
    h.store
        .delete(Kind::Project, "p", None, BTreeMap::new(), Commit::Persist)
        .unwrap();
    h.converge("p").await;
    assert!(h.store.get(Kind::Project, "p").is_none());
    assert_eq!(h.fake.instance("p").unwrap().config, stranger.config);
    assert_eq!(h.fake.count("delete_instance"), 0);
}

#[tokio::test]
async fn deletion_removes_container_and_volumes_then_the_object() {
    let h = Harness::new();
    h.apply("p", tiny());
    h.converge("p").await;
    let uid = h.uid("p");
    // Forced: the fake workspace cannot be inspected, which would hold a plain delete.
    h.store
        .delete(Kind::Project, "p", None, forced(), Commit::Persist)
        .unwrap();
    // A lost reply on the delete: the teardown runs again and finishes.
    h.fake.fault_method("delete_instance", Fault::LoseReply);
    h.converge("p").await;
    assert!(h.store.get(Kind::Project, "p").is_none());
    assert!(h.fake.instance("p").is_none());
    assert!(
        h.fake
            .volume("default", &DurableLayout::workspace_volume(&uid))
            .is_none()
    );
}

/// The annotations of `berth delete --force`.
fn forced() -> BTreeMap<String, String> {
    BTreeMap::from([(
        berth_api::annotations::FORCE_DELETE.to_string(),
        "true".to_string(),
    )])
}

#[tokio::test]
async fn a_plain_delete_of_a_workspace_that_cannot_be_inspected_is_held() {
    let h = Harness::new();
    h.apply("p", tiny());
    h.converge("p").await;
    let uid = h.uid("p");
    // The fake answers no inspection: "could not tell" must hold the deletion, not finish it.
    h.store
        .delete(Kind::Project, "p", None, BTreeMap::new(), Commit::Persist)
        .unwrap();
    for _ in 0..5 {
        let _ = project::reconcile(&h.ctx, "p").await;
    }
    let status = h.status("p");
    assert_eq!(status.phase, Phase::Deleting);
    let blocked = status
        .conditions
        .iter()
        .find(|c| c.type_ == "DeletionBlocked")
        .expect("a DeletionBlocked condition");
    assert_eq!(
        (blocked.status, blocked.reason.as_str()),
        (berth_api::ConditionStatus::True, "InspectionFailed")
    );
    assert!(h.fake.instance("p").is_some());
    assert!(
        h.fake
            .volume("default", &DurableLayout::workspace_volume(&uid))
            .is_some()
    );
    assert_eq!(h.fake.count("delete_instance"), 0);
    assert_eq!(h.fake.count("delete_volume"), 0);
}

#[tokio::test]
async fn stopped_state_stops_and_running_starts_again_resuming_at_reachable() {
    let h = Harness::new();
    h.apply("p", tiny());
    h.converge("p").await;
    h.apply("p", json!({"image": "berth-tiny", "state": "Stopped"}));
    h.converge("p").await;
    assert_eq!(h.status("p").phase, Phase::Stopped);
    assert_eq!(
        h.fake.instance("p").unwrap().status,
        InstanceStatus::Stopped
    );
    h.apply("p", tiny());
    h.converge("p").await;
    h.assert_ready("p");
    assert_eq!(h.status("p").step, Some(Step::Reachable));
    assert_eq!(h.fake.count("create_instance"), 1);
}

// Paused time: the wedged container's clean-stop timeout passes at once.
#[tokio::test(start_paused = true)]
async fn a_restart_request_works_on_a_wedged_container_and_is_acted_on_once() {
    let h = Harness::new();
    h.apply("p", tiny());
    h.converge("p").await;
    let pid = h.status("p").container.unwrap().pid;
    h.fake.set_wedged("p", true);
    h.annotate("p", berth_api::annotations::RESTARTED_AT, "t1");
    h.converge("p").await;
    h.assert_ready("p");
    assert_ne!(h.status("p").container.unwrap().pid, pid);
    let starts = h.fake.count("start_instance");
    h.converge("p").await;
    assert_eq!(h.fake.count("start_instance"), starts, "acted on once");
}

#[tokio::test]
async fn a_new_image_replaces_the_container_and_keeps_the_volume() {
    let h = Harness::new();
    h.apply("p", tiny());
    h.converge("p").await;
    // Nothing outside /workspace: the replacement does not wait.
    script_inspection(&h.fake, "p", FakeWorkspace::default());
    h.apply("p", json!({"image": "berth-base"}));
    h.converge("p").await;
    h.assert_ready("p");
    let instance = h.fake.instance("p").unwrap();
    assert_eq!(
        instance.base_image(),
        Some(crate::testing::fake_runtime::fake_fingerprint("berth-base").as_str())
    );
    assert_eq!(h.fake.count("delete_volume"), 0);
    assert_eq!(h.fake.count("delete_instance"), 0, "nothing is deleted");
    // The old container is in the trash, without the project's volumes or its uid label.
    let uid = h.uid("p");
    let trashed = h
        .fake
        .instance(&format!("berth-trash-{uid}-ct-1"))
        .expect("the replaced container in the trash");
    assert_eq!(trashed.config.get(UID_LABEL), None);
    assert_eq!(
        trashed.config.get("user.berth.trash.uid"),
        Some(&format!("{uid}-ct-1"))
    );
    assert_eq!(
        trashed
            .config
            .get("user.berth.trash.kind")
            .map(String::as_str),
        Some("container")
    );
    assert_eq!(trashed.config.get("user.berth.trash.project"), Some(&uid));
    assert!(
        trashed.devices.values().all(|d| !d.contains_key("pool")),
        "{:?}",
        trashed.devices
    );
    let live = h
        .fake
        .volume("default", &DurableLayout::workspace_volume(&uid))
        .expect("the workspace volume stays with the project");
    assert_eq!(live.config.get(UID_LABEL), Some(&uid));
}

#[tokio::test]
async fn a_worktree_outside_the_workspace_holds_a_replacement_until_forced() {
    let h = Harness::new();
    h.apply("p", tiny());
    h.converge("p").await;
    let outside = berth_api::UnsavedWork {
        worktrees: 1,
        ..berth_api::UnsavedWork::default()
    };
    script_inspection(&h.fake, "p", FakeWorkspace::with_unsaved(outside));
    h.annotate("p", berth_api::annotations::RECREATE_REQUESTED_AT, "t1");
    project::reconcile(&h.ctx, "p")
        .await
        .expect("a held replacement");
    let status = h.status("p");
    let held = berth_api::find_condition(&status.conditions, "ReplaceBlocked").unwrap();
    assert_eq!(held.status, berth_api::ConditionStatus::True);
    assert!(held.message.contains("/tmp/wt-0"), "{}", held.message);
    assert_eq!(h.ready_reason("p").1, "ReplaceBlocked");
    assert_eq!(h.fake.count("rename_instance"), 0, "nothing replaced yet");
    assert_eq!(h.fake.count("create_instance"), 1);
    // A manifest cannot force it: the annotation is the server's.
    h.annotate("p", berth_api::annotations::FORCE_REPLACE, "t1");
    project::reconcile(&h.ctx, "p").await.expect("still held");
    assert_eq!(h.fake.count("rename_instance"), 0);
    // A person's forced request goes ahead.
    h.store.request_forced_replace("p", "t1").unwrap();
    h.converge("p").await;
    h.assert_ready("p");
    assert_eq!(h.fake.count("create_instance"), 2, "replaced");
    let uid = h.uid("p");
    assert!(
        h.fake
            .instance(&format!("berth-trash-{uid}-ct-1"))
            .is_some()
    );
    let status = h.status("p");
    let released = berth_api::find_condition(&status.conditions, "ReplaceBlocked").unwrap();
    assert_eq!(released.reason, "Forced");
    // A later recreate is not forced by the earlier force: held again.
    h.annotate("p", berth_api::annotations::RECREATE_REQUESTED_AT, "t2");
    project::reconcile(&h.ctx, "p").await.expect("held again");
    assert_eq!(h.ready_reason("p").1, "ReplaceBlocked");
    assert_eq!(h.fake.count("create_instance"), 2);
    // A second forced replacement takes the next number.
    h.store.request_forced_replace("p", "t3").unwrap();
    h.converge("p").await;
    assert!(
        h.fake
            .instance(&format!("berth-trash-{uid}-ct-2"))
            .is_some()
    );
}

#[tokio::test]
async fn a_rebuilt_alias_marks_the_image_outdated_without_replacing() {
    let h = Harness::new();
    h.apply("p", tiny());
    h.converge("p").await;
    h.fake.add_image("berth-tiny", "feedface");
    h.converge("p").await;
    let status = h.status("p");
    let outdated = berth_api::find_condition(&status.conditions, "ImageOutdated").unwrap();
    assert_eq!(outdated.reason, "NewImageAvailable");
    assert_eq!(h.fake.count("create_instance"), 1);
}

#[tokio::test]
async fn paused_projects_are_left_alone() {
    let h = Harness::new();
    let paused = BTreeMap::from([(
        berth_api::annotations::RECONCILE.to_string(),
        berth_api::annotations::RECONCILE_PAUSED.to_string(),
    )]);
    h.apply_with("p", tiny(), paused);
    h.converge("p").await;
    assert_eq!(h.ready_reason("p").1, "ReconcilePaused");
    assert!(h.fake.calls().is_empty(), "{:?}", h.fake.calls());
}

#[tokio::test]
async fn a_missing_profile_waits_with_profile_not_found() {
    let h = Harness::new();
    h.apply("p", json!({"image": "berth-tiny", "agent": "claude"}));
    h.converge("p").await;
    assert_eq!(h.ready_reason("p").1, "ProfileNotFound");
    assert_eq!(h.fake.count("create_instance"), 0);
}

#[tokio::test]
async fn sizes_the_pool_cannot_enforce_are_reported_not_failed() {
    let h = Harness::new();
    h.apply(
        "p",
        json!({"image": "berth-tiny", "resources": {"workspaceSize": "10GiB"}}),
    );
    h.converge("p").await;
    h.assert_ready("p");
    let status = h.status("p");
    let applied = berth_api::find_condition(&status.conditions, "ResourcesApplied").unwrap();
    assert_eq!(applied.reason, "QuotaNotEnforced");
    assert_eq!(format!("{:?}", applied.status), "True");
}

#[tokio::test]
async fn sizes_are_limits_on_a_pool_that_enforces_them() {
    let mut h = Harness::new();
    h.fake.set_pool_driver("default", "zfs");
    h.ctx.settings.pool_enforces_quotas =
        super::pool_enforces_sizes(&*h.fake, &h.ctx.settings.storage_pool).await;
    assert!(h.ctx.settings.pool_enforces_quotas);
    h.apply(
        "p",
        json!({"image": "berth-tiny", "resources": {"workspaceSize": "10GiB"}}),
    );
    h.converge("p").await;
    h.assert_ready("p");
    let status = h.status("p");
    let applied = berth_api::find_condition(&status.conditions, "ResourcesApplied").unwrap();
    assert_eq!(applied.reason, "Applied");
    let volumes = h.fake.list_volumes("default", None).await.unwrap();
    let workspace = volumes
        .iter()
        .find(|v| v.name.ends_with("-workspace"))
        .expect("workspace volume");
    assert_eq!(
        workspace.config.get("size").map(String::as_str),
        Some("10737418240")
    );

    // A pool that cannot be read promises nothing.
    h.fake.fault_method(
        "storage_pool",
        Fault::Fail(RuntimeError::NotFound {
            what: "storage pool default".into(),
            message: String::new(),
        }),
    );
    assert!(!super::pool_enforces_sizes(&*h.fake, "default").await);
}

/// Applies `names` and converges each until its pid is recorded.
async fn ready_with_pids(h: &Harness, names: &[&str]) {
    for name in names {
        h.apply(name, tiny());
        h.converge(name).await;
        h.converge(name).await;
        assert!(h.status(name).container.is_some_and(|c| c.pid.is_some()));
    }
}

#[tokio::test]
async fn a_resync_pass_reads_the_fleet_in_one_list_call() {
    let h = Harness::new();
    // As the daemon does: a list it can rely on needs LXD's events followed.
    h.ctx.snapshot.following_events();
    let names: Vec<String> = (0..20).map(|i| format!("p{i}")).collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    ready_with_pids(&h, &names).await;
    let gets = h.fake.count("get_instance");
    let resolves = h.fake.count("resolve_image");
    super::triggers::resync_pass(&h.ctx).await;
    for name in &names {
        h.converge(name).await;
        h.assert_ready(name);
    }
    assert_eq!(h.fake.count("list_instances"), 1);
    assert_eq!(h.fake.count("get_instance"), gets, "no GET per project");
    assert_eq!(
        h.fake.count("resolve_image") - resolves,
        1,
        "the alias once"
    );
}

#[tokio::test]
async fn the_resync_answers_housekeeping_the_strays_its_list_showed() {
    let h = Harness::new();
    h.ctx.snapshot.following_events();
    ready_with_pids(&h, &["p"]).await;
    h.fake.insert_instance(Instance::labelled(
        "left-behind",
        &[(UID_LABEL, "uid-gone")],
    ));
    let strays = super::triggers::resync_unless_fresh(&h.ctx)
        .await
        .expect("a list was made");
    let names: Vec<&str> = strays.instances.iter().map(|i| i.name.as_str()).collect();
    assert_eq!(
        names,
        ["left-behind"],
        "the project's own container is known"
    );

    // Fresh: the next asks nothing of LXD and answers the same list's.
    let lists = h.fake.count("list_instances");
    let again = super::triggers::resync_unless_fresh(&h.ctx).await.unwrap();
    assert_eq!(h.fake.count("list_instances"), lists);
    assert!(Arc::ptr_eq(&strays, &again));
}

#[tokio::test]
async fn a_project_applied_after_a_list_is_created_without_reading_its_name_first() {
    let h = Harness::new();
    let mut stranger = Instance::running("q", BTreeMap::new());
    stranger.location = "none".into();
    h.fake.insert_instance(stranger);
    h.ctx.snapshot.following_events();
    super::triggers::resync_pass(&h.ctx).await;
    h.apply("p", tiny());
    h.apply("q", tiny());
    let gets = h.fake.count("get_instance");
    h.converge("p").await;
    h.assert_ready("p");
    assert_eq!(
        h.fake.count("get_instance"),
        gets,
        "no read before the create"
    );

    // The list showed every instance, not only berth's: a name someone else holds is read
    // and left alone, before any volume is made for it.
    let volumes = h.fake.count("create_volume");
    project::reconcile(&h.ctx, "q").await.unwrap();
    assert_eq!(h.ready_reason("q").1, "NameConflict");
    assert_eq!(h.fake.count("create_volume"), volumes);
    assert_eq!(h.fake.count("create_instance"), 1, "only p's");
}

#[tokio::test]
async fn new_projects_resolve_their_alias_once_until_an_image_event() {
    let h = Harness::new();
    h.ctx.snapshot.following_events();
    super::triggers::resync_pass(&h.ctx).await;
    let resolves = h.fake.count("resolve_image");
    for name in ["p", "q"] {
        h.apply(name, tiny());
        h.converge(name).await;
        h.assert_ready(name);
    }
    assert_eq!(h.fake.count("resolve_image") - resolves, 1, "once for both");
    // What an `image-alias-updated` event does: the next create asks again.
    h.ctx.snapshot.forget_images();
    h.apply("r", tiny());
    h.converge("r").await;
    assert_eq!(h.fake.count("resolve_image") - resolves, 2);
}

#[tokio::test]
async fn without_following_events_a_new_project_reads_its_name_first() {
    let h = Harness::new();
    super::triggers::resync_pass(&h.ctx).await;
    h.apply("p", tiny());
    let gets = h.fake.count("get_instance");
    h.converge("p").await;
    h.assert_ready("p");
    assert_eq!(h.fake.count("get_instance"), gets + 1);
}

#[tokio::test(start_paused = true)]
async fn resync_passes_started_together_list_once() {
    let h = Harness::new();
    h.apply("p", tiny());
    h.converge("p").await;
    // Every call takes a while, so the second pass starts while the first lists.
    h.fake.set_latency(Duration::from_millis(50));
    let lists = h.fake.count("list_instances");
    tokio::join!(
        super::triggers::resync_unless_fresh(&h.ctx),
        super::triggers::resync_unless_fresh(&h.ctx)
    );
    assert_eq!(h.fake.count("list_instances"), lists + 1);
}

#[tokio::test(start_paused = true)]
async fn the_resync_timer_skips_a_tick_right_after_another_resync_pass() {
    let h = Harness::new();
    h.apply("p", tiny());
    h.converge("p").await;
    let Harness {
        _dir, fake, ctx, ..
    } = h;
    let ctx = Arc::new(ctx);
    let interval = ctx.settings.resync_interval;
    let cancel = tokio_util::sync::CancellationToken::new();
    let timer = tokio::spawn(super::triggers::resync(ctx.clone(), cancel.clone()));
    tokio::time::sleep(interval - interval / 10).await;
    // As the scheduler's resync pass does, just before the timer's tick.
    super::triggers::resync_pass(&ctx).await;
    let lists = fake.count("list_instances");
    tokio::time::sleep(interval / 5).await;
    assert_eq!(
        fake.count("list_instances"),
        lists,
        "listed twice in one interval"
    );
    tokio::time::sleep(interval).await;
    assert_eq!(
        fake.count("list_instances"),
        lists + 1,
        "the next tick lists"
    );
    cancel.cancel();
    timer.await.unwrap();
}

#[tokio::test]
async fn a_resync_pass_reads_a_container_whose_pid_berth_never_read_once() {
    let h = Harness::new();
    let names = ["p", "q"];
    for name in names {
        h.apply(name, tiny());
        h.converge(name).await;
    }
    let (gets, writes) = (h.fake.count("get_instance"), h.store.resource_version());
    for _ in 0..2 {
        super::triggers::resync_pass(&h.ctx).await;
        for name in names {
            h.converge(name).await;
            h.assert_ready(name);
        }
    }
    for name in names {
        let pid = h.status(name).container.and_then(|c| c.pid);
        assert_eq!(pid, h.fake.instance(name).unwrap().state.map(|s| s.pid));
    }
    assert_eq!(h.fake.count("get_instance") - gets, 2, "each read once");
    assert_eq!(
        h.store.resource_version() - writes,
        2,
        "each pid written once"
    );
}

#[tokio::test]
async fn a_restart_behind_berths_back_is_noticed_from_a_list_without_state() {
    let h = Harness::new();
    ready_with_pids(&h, &["p", "q"]).await;
    let pid = |name| h.status(name).container.and_then(|c| c.pid);
    let (p_pid, q_pid) = (pid("p"), pid("q"));
    h.fake
        .restart_instance("q", true, Duration::from_secs(5))
        .await
        .unwrap();
    let (gets, probes) = (h.fake.count("get_instance"), h.fake.count("exec"));
    super::triggers::resync_pass(&h.ctx).await;
    for name in ["p", "q"] {
        h.converge(name).await;
        h.assert_ready(name);
    }
    assert_eq!(pid("p"), p_pid, "the pid of the boot already seen is kept");
    assert!(
        pid("q").is_some() && pid("q") != q_pid,
        "the new boot's pid"
    );
    assert_eq!(
        h.fake.count("get_instance") - gets,
        1,
        "only the restarted container is read"
    );
    assert_eq!(
        h.fake.count("exec") - probes,
        1,
        "q reached again after its boot"
    );
}

#[tokio::test]
async fn a_container_on_an_offline_member_is_left_alone() {
    let h = Harness::new();
    cluster(&h, &[("m1", "Online")]);
    h.apply("p", tiny());
    h.converge("p").await;
    assert_eq!(h.fake.instance("p").unwrap().location, "m1");
    cluster(&h, &[("m1", "Offline")]);
    h.fake.set_status("p", InstanceStatus::Error);
    let acting = [
        "create_instance",
        "start_instance",
        "stop_instance",
        "delete_instance",
    ]
    .map(|m| h.fake.count(m));
    let action = project::reconcile(&h.ctx, "p").await.unwrap();
    assert!(matches!(action, Action::Requeue(d) if d > Duration::ZERO));
    assert_eq!(h.ready_reason("p").1, "MemberOffline");
    let after = [
        "create_instance",
        "start_instance",
        "stop_instance",
        "delete_instance",
    ]
    .map(|m| h.fake.count(m));
    assert_eq!(acting, after);
}

#[tokio::test]
async fn a_deleted_alias_falls_back_to_the_recorded_fingerprint() {
    let h = Harness::new();
    h.apply("p", tiny());
    h.converge("p").await;
    h.fake.vanish("p");
    // The alias goes; the image itself stays (the fake keeps images by alias, so another
    // alias holds it).
    let fingerprint = crate::testing::fake_runtime::fake_fingerprint("berth-tiny");
    h.fake.remove_image("berth-tiny");
    h.fake.add_image("kept", &fingerprint);
    h.converge("p").await;
    h.assert_ready("p");
    assert_eq!(h.fake.count("create_instance"), 2);

    assert_eq!(
        h.fake.instance("p").unwrap().base_image(),
        Some(fingerprint.as_str())
    );

    // Without a recorded fingerprint there is nothing to fall back to.
    h.apply("q", tiny());
    for _ in 0..3 {
        let _ = project::reconcile(&h.ctx, "q").await;
    }
    assert_eq!(h.ready_reason("q").1, "ImageNotFound");
    assert!(h.fake.instance("q").is_none());
}

/// The controller running over a fake runtime with `workers`; only the store feed and LXD's
/// events cause reconciles (the resync is an hour away).
fn running_controller(
    workers: usize,
) -> (
    tempfile::TempDir,
    Arc<Store>,
    Arc<FakeRuntime>,
    super::ControllerHandle,
) {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(Store::open(&dir.path().join("berth.db")).unwrap());
    let fake = Arc::new(FakeRuntime::new());
    let settings = ControllerSettings {
        workers,
        resync_interval: Duration::from_secs(3600),
        ..ControllerSettings::default()
    };
    let controller = super::spawn_controller(
        store.clone(),
        fake.clone(),
        Arc::new(Metrics::new()),
        settings,
        Arc::new(NoLaterSteps),
        tokio_util::sync::CancellationToken::new(),
    );
    (dir, store, fake, controller)
}

fn is_ready(store: &Store, name: &str) -> bool {
    store.get(Kind::Project, name).is_some_and(|o| {
        o.status
            .decode::<ProjectStatus>()
            .is_ok_and(|s| s.phase == Phase::Ready)
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_project_takes_one_reconcile_in_the_running_controller() {
    // One at a time, in the order asked.
    let (_dir, store, fake, controller) = running_controller(1);
    let ready = |name: &str| is_ready(&store, name);
    // p first, so that starting the controller (which requests every project) is behind.
    // Then q; what q's reconcile asks for runs before r, asked for once q is Ready.
    for name in ["p", "q", "r"] {
        store
            .apply(Desired::project(name, tiny()), Commit::Persist)
            .unwrap();
        eventually("Ready", || ready(name)).await;
    }
    // Its finalizer, the container's creation and start are berth's own doing: they ask for
    // no second reconcile, which would read the container again.
    let reads = |call: &str| fake.calls().iter().filter(|c| *c == call).count();
    assert_eq!(
        reads("get_instance q"),
        0,
        "none before the create: the list made on following LXD's events answers for it"
    );
    assert_eq!(reads("get_instance_record q"), 1, "after the start, once");
    controller.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_running_controller_follows_the_store_and_lxd_events() {
    let (_dir, store, fake, controller) = running_controller(ControllerSettings::default().workers);
    let ready = |name: &str| is_ready(&store, name);

    // A spec written to the store is picked up from the change feed.
    store
        .apply(Desired::project("p", tiny()), Commit::Persist)
        .unwrap();
    eventually("p Ready", || ready("p")).await;

    // A container deleted behind berth's back is noticed from LXD's event stream.
    fake.vanish("p");
    eventually("p recreated", || {
        if fake.instance("p").is_none() {
            fake.emit(crate::runtime::RuntimeEvent {
                kind: crate::runtime::EventKind::Lifecycle,
                action: "instance-deleted".into(),
                source: "/1.0/instances/p".into(),
                instance: Some("p".into()),
                location: "none".into(),
                timestamp: None,
            });
        }
        fake.instance("p").is_some() && ready("p")
    })
    .await;
    assert_eq!(fake.instance_names(), ["p".to_string()]);

    // Deletion runs the finalizer and the object goes.
    store
        .delete(Kind::Project, "p", None, forced(), Commit::Persist)
        .unwrap();
    eventually("p gone", || store.get(Kind::Project, "p").is_none()).await;
    assert!(fake.instance("p").is_none());

    let metrics = controller.context.metrics.clone();
    controller.shutdown().await;
    let text = metrics.encode();
    assert!(
        !text.contains("berth_reconcile_total{result=\"success\"} 0"),
        "{text}"
    );
    assert!(text.contains("berth_workqueue_adds_total"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_event_stream_is_subscribed_again_after_it_failed() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(Store::open(&dir.path().join("berth.db")).unwrap());
    let fake = Arc::new(FakeRuntime::new());
    // LXD is down for the first subscription.
    fake.fault_method(
        "events",
        Fault::Fail(RuntimeError::Transport {
            what: "events".into(),
            message: "connection refused".into(),
        }),
    );
    let controller = super::spawn_controller(
        store.clone(),
        fake.clone(),
        Arc::new(Metrics::new()),
        ControllerSettings {
            resync_interval: Duration::from_secs(3600),
            ..ControllerSettings::default()
        },
        Arc::new(NoLaterSteps),
        tokio_util::sync::CancellationToken::new(),
    );
    store
        .apply(Desired::project("p", tiny()), Commit::Persist)
        .unwrap();
    eventually("p created", || fake.instance("p").is_some()).await;
    eventually("subscribed again", || fake.count("events") >= 2).await;
    // Only an event can tell the controller now (no resync for an hour).
    let created = fake.count("create_instance");
    fake.vanish("p");
    // Sent until it lands: the subscription counted above may not be listening yet.
    eventually("p recreated", || {
        fake.emit(crate::runtime::RuntimeEvent {
            kind: crate::runtime::EventKind::Lifecycle,
            action: "instance-deleted".into(),
            source: "/1.0/instances/p".into(),
            instance: Some("p".into()),
            location: "none".into(),
            timestamp: None,
        });
        fake.count("create_instance") > created
    })
    .await;
    controller.shutdown().await;
}

#[tokio::test]
async fn an_idled_project_stays_stopped_until_woken() {
    let h = Harness::new();
    h.apply("p", tiny());
    h.converge("p").await;
    // The reaper idles it: status only, spec still says Running.
    let object = h.store.get(Kind::Project, "p").unwrap();
    let mut status = object.status.value();
    let idled_at = chrono::Utc::now() - chrono::Duration::seconds(60);
    status["reap"] = json!({"idledAt": idled_at});
    h.store
        .put_status(Kind::Project, "p", None, status)
        .unwrap();
    h.converge("p").await;
    assert_eq!(h.status("p").phase, Phase::Stopped);
    assert_eq!(
        h.fake.instance("p").unwrap().status,
        InstanceStatus::Stopped
    );
    h.converge("p").await;
    assert_eq!(h.status("p").phase, Phase::Stopped, "stays idle");

    let now = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    h.annotate("p", berth_api::annotations::WOKEN_AT, &now);
    h.converge("p").await;
    h.assert_ready("p");
    assert!(h.status("p").reap.unwrap().idled_at.is_none());
}

#[tokio::test]
async fn commands_and_file_transfers_in_a_container_request_no_reconcile() {
    let h = Harness::new();
    for name in ["p", "q"] {
        h.apply(name, tiny());
        h.converge(name).await;
    }
    let Harness {
        _dir, fake, ctx, ..
    } = h;
    let ctx = Arc::new(ctx);
    let cancel = tokio_util::sync::CancellationToken::new();
    let watcher = tokio::spawn(super::triggers::watch_lxd_events(
        ctx.clone(),
        cancel.clone(),
    ));
    // Connecting requests every project once (events may have been missed); none runs here.
    eventually("the watcher to connect", || ctx.queue.depth() == 2).await;
    ctx.queue.forget("p");
    ctx.queue.forget("q");

    // What an inspection and a step do in p, then a change behind berth's back in q: LXD
    // announces each in order on one stream.
    let exec = crate::runtime::ExecRequest::new(["true"], Duration::from_secs(5));
    fake.exec("p", &exec).await.unwrap();
    let file = crate::runtime::FileWrite {
        path: "/tmp/x".into(),
        content: b"x".to_vec(),
        uid: 0,
        gid: 0,
        mode: 0o644,
    };
    fake.file_write("p", &file).await.unwrap();
    fake.file_read("p", "/tmp/x", 16).await.unwrap();
    fake.file_delete("p", "/tmp/x").await.unwrap();
    fake.stop_instance(
        "q",
        crate::runtime::StopOptions::clean_then_force(Duration::ZERO),
    )
    .await
    .unwrap();
    eventually("q's stop to request q", || ctx.queue.is_requested("q")).await;
    assert!(!ctx.queue.is_requested("p"));
    cancel.cancel();
    watcher.await.unwrap();
}

#[tokio::test]
async fn berths_own_create_and_start_request_no_second_reconcile() {
    let h = Harness::new();
    h.apply("q", tiny());
    h.converge("q").await;
    h.apply("p", tiny());
    let Harness {
        _dir, fake, ctx, ..
    } = h;
    let ctx = Arc::new(ctx);
    let cancel = tokio_util::sync::CancellationToken::new();
    let watcher = tokio::spawn(super::triggers::watch_lxd_events(
        ctx.clone(),
        cancel.clone(),
    ));
    eventually("the watcher to connect", || ctx.queue.depth() == 2).await;
    ctx.queue.forget("p");
    ctx.queue.forget("q");

    assert_eq!(
        project::reconcile(&ctx, "p").await.unwrap(),
        Action::Done,
        "Ready in one reconcile"
    );
    // Then a start by someone else, announced after berth's own events on the same stream.
    fake.stop_instance(
        "q",
        crate::runtime::StopOptions::clean_then_force(Duration::ZERO),
    )
    .await
    .unwrap();
    fake.start_instance("q", Duration::from_secs(5))
        .await
        .unwrap();
    eventually("q's start to request q", || ctx.queue.is_requested("q")).await;
    assert!(!ctx.queue.is_requested("p"), "p's own changes");
    cancel.cancel();
    watcher.await.unwrap();
}

#[tokio::test]
async fn a_container_created_for_a_project_kept_stopped_is_never_started() {
    let h = Harness::new();
    h.apply("off", json!({"image": "berth-tiny", "state": "Stopped"}));
    h.converge("off").await;
    assert_eq!(h.status("off").phase, Phase::Stopped);
    assert_eq!(h.fake.count("start_instance"), 0, "spec.state Stopped");

    // An idled project whose container vanished is recreated, stopped.
    h.apply("idle", tiny());
    h.converge("idle").await;
    let mut status = h.store.get(Kind::Project, "idle").unwrap().status.value();
    status["reap"] = json!({"idledAt": chrono::Utc::now() - chrono::Duration::seconds(60)});
    h.store
        .put_status(Kind::Project, "idle", None, status)
        .unwrap();
    h.converge("idle").await;
    h.fake.vanish("idle");
    let starts = h.fake.count("start_instance");
    h.converge("idle").await;
    assert_eq!(h.fake.count("create_instance"), 3, "recreated");
    assert_eq!(h.status("idle").phase, Phase::Stopped);
    assert_eq!(h.fake.count("start_instance"), starts, "idled");

    // A manifest that carries a restart request: started once, not started, stopped, started.
    h.apply("asked", tiny());
    h.annotate("asked", berth_api::annotations::RESTARTED_AT, "t1");
    let (starts, stops) = (
        h.fake.count("start_instance"),
        h.fake.count("stop_instance"),
    );
    h.converge("asked").await;
    h.assert_ready("asked");
    assert_eq!(h.fake.count("start_instance"), starts + 1);
    assert_eq!(h.fake.count("stop_instance"), stops);
}

#[tokio::test]
async fn host_forwards_go_in_with_the_create_and_follow_the_spec() {
    let h = Harness::new();
    let forwards = |list: Value| json!({"image": "berth-tiny", "forwards": list});
    h.apply(
        "p",
        forwards(json!([{"port": 8080, "to": "127.0.0.1:11434"}])),
    );
    h.converge("p").await;
    h.assert_ready("p");
    let devices = h.fake.instance("p").unwrap().devices;
    let proxy = &devices["berth-forward-8080"];
    assert_eq!(proxy["type"], "proxy");
    assert_eq!(proxy["bind"], "instance");
    assert_eq!(proxy["listen"], "tcp:127.0.0.1:8080");
    assert_eq!(proxy["connect"], "tcp:127.0.0.1:11434");
    assert_eq!(h.fake.count("patch_instance"), 0);

    // A changed target and a new port are patched onto the running container.
    h.apply(
        "p",
        forwards(json!([
            {"port": 8080, "to": "127.0.0.1:11435"},
            {"port": 9000, "to": "[::1]:9000"}
        ])),
    );
    h.converge("p").await;
    let devices = h.fake.instance("p").unwrap().devices;
    assert_eq!(
        devices["berth-forward-8080"]["connect"],
        "tcp:127.0.0.1:11435"
    );
    assert_eq!(devices["berth-forward-9000"]["connect"], "tcp:[::1]:9000");

    // Dropped from the spec: removed, and the other devices stay.
    h.apply("p", tiny());
    h.converge("p").await;
    let devices = h.fake.instance("p").unwrap().devices;
    assert!(
        !devices.keys().any(|d| d.starts_with("berth-forward-")),
        "{devices:?}"
    );
    assert!(devices.contains_key("workspace"));
    h.assert_ready("p");
    assert_eq!(h.fake.count("create_instance"), 1);
}

/// LXD's answer when `forkstart` cannot run the container (here: a memory limit too small).
const FORKSTART_FAILED: &str = "Failed to run: /usr/bin/lxd forkstart p /var/lib/lxd/containers /var/log/lxd/p/lxc.conf: exit status 1";

#[tokio::test(start_paused = true)]
async fn a_failing_start_is_retried_on_its_backoff_and_says_why() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(Store::open(&dir.path().join("berth.db")).unwrap());
    let fake = Arc::new(FakeRuntime::new());
    // Each failed start sends LXD's operation events about the container, as LXD does.
    fake.fail_start("p", Some(FORKSTART_FAILED));
    let controller = super::spawn_controller(
        store.clone(),
        fake.clone(),
        Arc::new(Metrics::new()),
        ControllerSettings::default(),
        Arc::new(NoLaterSteps),
        tokio_util::sync::CancellationToken::new(),
    );
    store
        .apply(Desired::project("p", tiny()), Commit::Persist)
        .unwrap();
    let tick = Duration::from_millis(100);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(600);
    while fake.count("start_instance") == 0 {
        assert!(tokio::time::Instant::now() < deadline, "never started");
        tokio::time::sleep(tick).await;
    }

    // 70 seconds of a start that keeps failing: the backoff (0.5s doubling, up to a quarter
    // taken off) allows at most 8 attempts; the events of each failed start must not add more.
    // Woken by LXD's events too, so a loop that never lets paused time move is caught as well.
    use futures::StreamExt;
    let mut events = Some(fake.events().await.unwrap());
    let window_end = tokio::time::Instant::now() + Duration::from_secs(70);
    while tokio::time::Instant::now() < window_end && fake.count("start_instance") <= 8 {
        let event = async {
            match events.as_mut() {
                Some(stream) => stream.next().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = tokio::time::sleep(tick) => {}
            // A lagging subscriber only missed events; an ended stream wakes no one.
            event = event => if event.is_none() { events = None },
        }
    }
    let attempts = fake.count("start_instance");
    assert!(
        (3..=8).contains(&attempts),
        "{attempts} start attempts in 70s"
    );

    // The failure is in the Ready condition, naming the step and LXD's cause.
    let ready = |store: &Store| {
        let status: ProjectStatus = store
            .get(Kind::Project, "p")
            .unwrap()
            .status
            .decode()
            .unwrap();
        berth_api::find_condition(&status.conditions, "Ready")
            .cloned()
            .expect("Ready")
    };
    let condition = ready(&store);
    assert_eq!(condition.reason, berth_api::reasons::STEP_FAILED);
    assert!(
        condition.message.contains("Started") && condition.message.contains(FORKSTART_FAILED),
        "{}",
        condition.message
    );
    // One Warning event counting every attempt, with the same cause.
    let warnings: Vec<_> = store
        .events_for(Kind::Project, "p")
        .unwrap()
        .into_iter()
        .filter(|e| e.reason == berth_api::reasons::STEP_FAILED)
        .collect();
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert_eq!(warnings[0].type_, crate::store::EventType::Warning);
    assert!(warnings[0].message.contains(FORKSTART_FAILED));
    assert_eq!(warnings[0].count as usize, attempts);

    // Once the start works, the next retry makes it Ready and the message is gone.
    fake.fail_start("p", None);
    while store
        .get(Kind::Project, "p")
        .and_then(|o| o.status.decode::<ProjectStatus>().ok())
        .is_none_or(|s| s.phase != Phase::Ready)
    {
        assert!(tokio::time::Instant::now() < deadline, "never Ready");
        tokio::time::sleep(tick).await;
    }
    let condition = ready(&store);
    assert_eq!(condition.status, berth_api::ConditionStatus::True);
    assert!(
        !condition.message.contains("forkstart"),
        "{}",
        condition.message
    );
    controller.shutdown().await;
}

/// A fake cluster of `members` (name, status), every one in the group "default".
fn cluster(h: &Harness, members: &[(&str, &str)]) {
    let mut server = crate::runtime::ServerInfo {
        version: "5.0.2".into(),
        api_extensions: Vec::new(),
        clustered: true,
        server_name: members[0].0.into(),
        members: Vec::new(),
    };
    server.members = members
        .iter()
        .map(|(name, status)| crate::runtime::ClusterMember {
            name: name.to_string(),
            status: status.to_string(),
            message: String::new(),
            groups: vec!["default".into()],
        })
        .collect();
    h.fake.set_server(server);
}

#[tokio::test]
async fn projects_spread_over_members_and_stay_on_theirs() {
    let h = Harness::new();
    cluster(&h, &[("m1", "Online"), ("m2", "Online")]);
    let names = ["a", "b", "c", "d", "e"];
    for name in names {
        h.apply(name, tiny());
    }
    // Each placement counts the ones recorded before it.
    for name in names {
        h.converge(name).await;
        h.assert_ready(name);
    }
    let location = |name: &str| h.status(name).location.expect("placed");
    let mut per_member = BTreeMap::new();
    for name in names {
        let member = location(name);
        *per_member.entry(member.clone()).or_insert(0) += 1;
        let instance = h.fake.instance(name).unwrap();
        assert_eq!(instance.location, member, "{name}: container on its member");
        assert_eq!(
            instance.config.get("cluster.evacuate").map(String::as_str),
            Some("stop")
        );
        let volume = h
            .fake
            .volume("default", &DurableLayout::workspace_volume(&h.uid(name)))
            .unwrap();
        assert_eq!(volume.location, member, "{name}: volume by its container");
    }
    assert_eq!(
        per_member,
        BTreeMap::from([("m1".to_string(), 3), ("m2".to_string(), 2)])
    );

    // A replaced container (new image) and a vanished one go back to the same member, even
    // where the load would place a new project elsewhere.
    let on_m1 = names.iter().find(|n| location(n) == "m1").unwrap();
    h.fake.add_image("berth-tiny-2", "f2");
    script_inspection(&h.fake, on_m1, FakeWorkspace::default());
    let mut spec = tiny();
    spec["image"] = json!("berth-tiny-2");
    h.apply(on_m1, spec);
    h.converge(on_m1).await;
    h.assert_ready(on_m1);
    assert_eq!(h.fake.instance(on_m1).unwrap().location, "m1");
    h.fake.vanish(on_m1);
    h.converge(on_m1).await;
    assert_eq!(h.fake.instance(on_m1).unwrap().location, "m1");
    assert_eq!(location(on_m1), "m1");
}

#[tokio::test]
async fn a_target_restricts_placement_and_an_unavailable_one_waits() {
    let h = Harness::new();
    cluster(&h, &[("m1", "Online"), ("m2", "Offline")]);
    let mut ctx_settings = h.ctx.settings.clone();
    ctx_settings.target = Some("m2".into());
    let h = Harness {
        ctx: Context {
            settings: ctx_settings,
            ..h.ctx
        },
        ..h
    };
    h.apply("p", tiny());
    let action = project::reconcile(&h.ctx, "p").await.unwrap();
    let action = match action {
        // The finalizer is added first.
        Action::Requeue(d) if d == Duration::ZERO => project::reconcile(&h.ctx, "p").await.unwrap(),
        other => other,
    };
    assert!(matches!(action, Action::Requeue(d) if d > Duration::ZERO));
    assert_eq!(h.ready_reason("p").1, "NoMemberAvailable");
    assert_eq!(h.status("p").location, None, "nothing decided");
    assert_eq!(h.fake.count("create_volume"), 0);

    cluster(&h, &[("m1", "Online"), ("m2", "Online")]);
    h.converge("p").await;
    h.assert_ready("p");
    assert_eq!(h.status("p").location.as_deref(), Some("m2"));
    assert_eq!(h.fake.instance("p").unwrap().location, "m2");
}

/// A project placed on a two-member cluster whose member then turns `state`.
async fn placed_then(state: &str) -> (Harness, String) {
    let h = Harness::new();
    cluster(&h, &[("m1", "Online"), ("m2", "Online")]);
    h.apply("p", tiny());
    h.converge("p").await;
    let member = h.status("p").location.unwrap();
    let members: Vec<(&str, &str)> = ["m1", "m2"]
        .iter()
        .map(|m| (*m, if *m == member { state } else { "Online" }))
        .collect();
    cluster(&h, &members);
    (h, member)
}

#[tokio::test]
async fn an_evacuated_member_keeps_its_projects_stopped_until_restored() {
    let (h, member) = placed_then("Evacuated").await;
    h.fake.set_status("p", InstanceStatus::Stopped);
    let starts = h.fake.count("start_instance");
    let action = project::reconcile(&h.ctx, "p").await.unwrap();
    assert!(matches!(action, Action::Requeue(d) if d > Duration::ZERO));
    assert_eq!(h.status("p").phase, Phase::Stopped);
    assert_eq!(h.ready_reason("p").1, "MemberEvacuated");
    assert_eq!(h.fake.count("start_instance"), starts, "not started there");
    assert_eq!(
        h.fake.count("create_instance"),
        1,
        "not recreated elsewhere"
    );

    cluster(&h, &[("m1", "Online"), ("m2", "Online")]);
    h.converge("p").await;
    h.assert_ready("p");
    assert_eq!(h.fake.instance("p").unwrap().location, member);
    assert_eq!(h.fake.count("create_instance"), 1);
}

#[tokio::test]
async fn a_container_missing_from_a_list_on_an_offline_member_is_not_recreated() {
    let (h, member) = placed_then("Offline").await;
    // An offline member's containers are listed without their config, so berth's list lacks
    // them, and reading one fails.
    let kept = h.fake.instance("p").unwrap();
    h.fake.vanish("p");
    let action = project::reconcile(&h.ctx, "p").await.unwrap();
    assert!(matches!(action, Action::Requeue(d) if d > Duration::ZERO));
    assert_eq!(h.ready_reason("p").1, "MemberOffline");
    assert_eq!(h.fake.count("create_instance"), 1);
    assert_eq!(h.fake.count("create_volume"), 1);

    h.fake.insert_instance(kept);
    cluster(&h, &[("m1", "Online"), ("m2", "Online")]);
    h.converge("p").await;
    h.assert_ready("p");
    assert_eq!(h.fake.count("create_instance"), 1);
    assert_eq!(h.status("p").location, Some(member));
}

#[tokio::test]
async fn a_single_server_places_nothing() {
    let h = Harness::new();
    h.apply("p", tiny());
    h.converge("p").await;
    h.assert_ready("p");
    assert_eq!(h.status("p").location, None);
    let instance = h.fake.instance("p").unwrap();
    assert_eq!(instance.config.get("cluster.evacuate"), None);
    assert!(
        !h.fake.calls().iter().any(|c| c.starts_with("get_volume")),
        "no look for existing volumes off a cluster"
    );
}

#[tokio::test]
async fn a_replacement_interrupted_before_the_rename_finishes_without_a_second_look() {
    let h = Harness::new();
    h.apply("p", tiny());
    h.converge("p").await;
    script_inspection(&h.fake, "p", FakeWorkspace::default());
    h.fake.fault_method(
        "rename_instance",
        Fault::Fail(RuntimeError::Timeout {
            what: "rename".into(),
            after: Duration::from_secs(1),
        }),
    );
    h.annotate("p", berth_api::annotations::RECREATE_REQUESTED_AT, "t1");
    assert!(project::reconcile(&h.ctx, "p").await.is_err());
    let labelled = h
        .fake
        .instance("p")
        .expect("still under the project's name");
    assert!(labelled.config.contains_key("user.berth.trash.uid"));
    // The volumes are detached now: a second look could not find the workspace, and must not
    // be what decides.
    let outside = berth_api::UnsavedWork {
        worktrees: 1,
        ..berth_api::UnsavedWork::default()
    };
    script_inspection(&h.fake, "p", FakeWorkspace::with_unsaved(outside));
    h.converge("p").await;
    h.assert_ready("p");
    let uid = h.uid("p");
    assert!(
        h.fake
            .instance(&format!("berth-trash-{uid}-ct-1"))
            .is_some()
    );
    assert!(
        h.fake
            .instance(&format!("berth-trash-{uid}-ct-2"))
            .is_none()
    );
}

/// Replacements in every state they meet a container in: a worktree outside /workspace or
/// none, forced or not, for a recreate or a new image, with one LXD call on the way failing.
/// Whatever happens, nothing is deleted, and a byte written in the container's own filesystem
/// is still there: in the project's container while the replacement is held, in the trash
/// once it went ahead.
#[tokio::test]
async fn randomized_replacements_never_destroy_a_byte_written() {
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};
    let mut rng = StdRng::seed_from_u64(0x7265_706c_6163_6531);
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    let h = Harness::new();
    for w in 0..60 {
        let name = format!("r{w}");
        let name = name.as_str();
        h.apply(name, tiny());
        h.converge(name).await;
        let uid = h.uid(name);
        let bytes: Vec<u8> = (0..64).map(|_| rng.random()).collect();
        let path = format!("/root/wt/file-{w}");
        h.fake
            .file_write(
                name,
                &crate::runtime::FileWrite {
                    path: path.clone(),
                    content: bytes.clone(),
                    uid: 0,
                    gid: 0,
                    mode: 0o644,
                },
            )
            .await
            .unwrap();
        let worktree = rng.random_bool(0.5);
        let forced = rng.random_bool(0.5);
        let image = rng.random_bool(0.5);
        let unsaved = berth_api::UnsavedWork {
            worktrees: u32::from(worktree),
            ..berth_api::UnsavedWork::default()
        };
        script_inspection(&h.fake, name, FakeWorkspace::with_unsaved(unsaved));
        if rng.random_bool(0.3) {
            let method = [
                "stop_instance",
                "get_instance_record",
                "update_instance",
                "rename_instance",
                "patch_instance",
                "create_instance",
            ][rng.random_range(0..6)];
            h.fake.fault_method(
                method,
                Fault::Fail(RuntimeError::Transport {
                    what: method.into(),
                    message: "injected".into(),
                }),
            );
        }
        let at = format!("t{w}");
        if image {
            h.apply(name, json!({"image": "berth-base"}));
        } else {
            h.annotate(name, berth_api::annotations::RECREATE_REQUESTED_AT, &at);
        }
        if forced {
            h.store.request_forced_replace(name, &at).unwrap();
        }
        for _ in 0..8 {
            let _ = project::reconcile(&h.ctx, name).await;
        }
        h.fake.clear_faults();
        let held = worktree && !forced;
        let trashed = format!("berth-trash-{uid}-ct-1");
        let holder = if held { name } else { trashed.as_str() };
        let kept = h.fake.file_read(holder, &path, 1 << 20).await;
        assert_eq!(
            kept.as_deref().ok(),
            Some(bytes.as_slice()),
            "world {w}: worktree {worktree}, forced {forced}, image {image}: {:?}",
            h.fake.instance_names()
        );
        if held {
            let status = h.status(name);
            let blocked = berth_api::find_condition(&status.conditions, "ReplaceBlocked");
            assert!(blocked.is_some_and(|c| c.status == berth_api::ConditionStatus::True));
            assert!(h.fake.instance(&trashed).is_none(), "world {w}");
            *counts.entry("held").or_default() += 1;
        } else {
            let live = h.fake.instance(name).expect("a new container");
            assert!(live.config.contains_key(UID_LABEL), "world {w}");
            assert_ne!(
                h.fake.file_read(name, &path, 1 << 20).await.ok(),
                Some(bytes.clone()),
                "world {w}: the new container is new"
            );
            *counts.entry("replaced").or_default() += 1;
        }
        assert_eq!(h.fake.count("delete_instance"), 0, "world {w}");
        assert_eq!(h.fake.count("delete_volume"), 0, "world {w}");
    }
    for (what, at_least) in [("held", 8), ("replaced", 25)] {
        let n = counts.get(what).copied().unwrap_or(0);
        assert!(n >= at_least, "too few {what}: {counts:?}");
    }
}
