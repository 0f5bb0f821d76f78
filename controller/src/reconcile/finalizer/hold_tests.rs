//! Every way a deletion no person forced could reach a workspace without looking at it first:
//! a step that went backwards, a container that vanished or was never the project's, work
//! written as its processes end. The teardown runs against the fake runtime, whose
//! inspections answer with what the workspace volume holds, wherever it is attached.

use crate::store::Commit;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use berth_api::UnsavedWork;
use serde_json::{Value, json};

use super::*;
use crate::layout::{CONTROLLER_LABEL, UID_LABEL};
use crate::metrics::Metrics;
use crate::reconcile::{Action, Backoff, ControllerSettings, NoLaterSteps, WorkQueue};
use crate::runtime::{CreateVolume, ExecOutput, Instance, InstanceStatus, Runtime};
use crate::store::Desired;
use crate::testing::fake_runtime::FakeRuntime;
use crate::testing::fixtures::{delete_project, finalized_project};
use crate::testing::inspection::{FakeWorkspace, inspection_report, is_inspection};
use crate::workspace::inspection_instance::{INSPECTS_LABEL, instance_name};

pub(super) struct Setup {
    _dir: tempfile::TempDir,
    pub fake: Arc<FakeRuntime>,
    pub ctx: Context,
    /// What each workspace volume holds, as every inspection of it answers.
    pub volumes: Arc<Mutex<HashMap<String, FakeWorkspace>>>,
}

pub(super) fn setup() -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(Store::open(&dir.path().join("berth.db")).unwrap());
    let fake = Arc::new(FakeRuntime::new());
    let metrics = Arc::new(Metrics::new());
    let queue = WorkQueue::new(1, Backoff::default(), metrics.clone());
    let ctx = Context::new(
        store,
        fake.clone(),
        metrics,
        ControllerSettings::default(),
        Arc::new(NoLaterSteps),
        queue,
    );
    let volumes: Arc<Mutex<HashMap<String, FakeWorkspace>>> = Arc::default();
    let weak = Arc::downgrade(&fake);
    let held = volumes.clone();
    fake.on_exec(move |name, request| {
        if !is_inspection(request) {
            return None;
        }
        let fake = weak.upgrade()?;
        let instance = fake.instance(name)?;
        let source = instance
            .devices
            .values()
            .find(|d| d.get("path").map(String::as_str) == Some("/workspace"))?
            .get("source")?
            .clone();
        let workspace = held.lock().unwrap().get(&source).cloned()?;
        Some(Ok(ExecOutput {
            exit_code: 0,
            stdout: inspection_report(&workspace).into_bytes(),
            stderr: Vec::new(),
        }))
    });
    Setup {
        _dir: dir,
        fake,
        ctx,
        volumes,
    }
}

/// The project's container as the deletion finds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Container {
    Running,
    Stopped,
    /// Gone: vanished, deleted behind berth's back, or never created.
    Missing,
    /// An instance of the project's name that is not the project's (no uid label of its own).
    Foreign,
}

pub(super) fn unpushed(n: u32) -> FakeWorkspace {
    FakeWorkspace::with_unsaved(UnsavedWork {
        unpushed: n,
        ..UnsavedWork::default()
    })
}

impl Setup {
    /// A project with `status`, its workspace volume holding `workspace`, its container as
    /// `container`, asked to be deleted (not forced).
    pub fn deleting(
        &self,
        name: &str,
        status: Value,
        container: Container,
        workspace: FakeWorkspace,
    ) -> Arc<StoredObject> {
        let store = &self.ctx.store;
        let uid = finalized_project(store, name, status).uid().to_string();
        let volume = DurableLayout::workspace_volume(&uid);
        futures::executor::block_on(self.fake.create_volume(&CreateVolume {
            pool: "default".into(),
            name: volume.clone(),
            size: None,
            config: BTreeMap::from([
                (UID_LABEL.to_string(), uid.clone()),
                (
                    CONTROLLER_LABEL.to_string(),
                    store.controller_id().to_string(),
                ),
            ]),
            target: None,
        }))
        .unwrap();
        self.volumes
            .lock()
            .unwrap()
            .insert(volume.clone(), workspace);
        let mut config = BTreeMap::new();
        let mut devices = BTreeMap::new();
        match container {
            Container::Missing => {}
            Container::Foreign => {
                config.insert("user.someone".to_string(), "else".to_string());
            }
            Container::Running | Container::Stopped => {
                config.insert(UID_LABEL.to_string(), uid.clone());
                devices.insert(
                    "workspace".to_string(),
                    crate::layout::disk_device("default", &volume, "/workspace"),
                );
            }
        }
        if container != Container::Missing {
            let status = if container == Container::Stopped {
                InstanceStatus::Stopped
            } else {
                InstanceStatus::Running
            };
            self.fake.insert_instance(Instance {
                name: name.into(),
                status_code: status.code(),
                status,
                location: "none".into(),
                profiles: Vec::new(),
                config,
                devices,
                created_at: None,
                last_used_at: None,
                state: None,
            });
        }
        delete_project(store, name, BTreeMap::new()).unwrap()
    }

    /// One teardown attempt, as the reconciler runs it.
    pub async fn teardown(&self, name: &str) -> Action {
        let object = self.ctx.store.get(Kind::Project, name).unwrap();
        let draft = Draft::from_object(&object);
        crate::reconcile::finalizer::finalize(&self.ctx, &object, draft)
            .await
            .unwrap()
    }

    pub fn workspace_kept(&self, uid: &str) -> bool {
        self.fake
            .volume("default", &DurableLayout::workspace_volume(uid))
            .is_some()
    }

    pub fn blocked(&self, name: &str) -> Option<(String, String)> {
        let object = self.ctx.store.get(Kind::Project, name)?;
        let draft = Draft::from_object(&object);
        draft
            .condition(condition_types::DELETION_BLOCKED)
            .filter(|c| c.status == ConditionStatus::True)
            .map(|c| (c.reason.clone(), c.message.clone()))
    }

    /// Whether any inspection instance is left in the fake.
    pub fn inspection_instances(&self) -> Vec<String> {
        self.fake
            .instance_names()
            .into_iter()
            .filter(|n| n.starts_with("berth-inspect-"))
            .collect()
    }
}

/// A status whose step went back to Requested after the workspace had been reachable (here:
/// `spec.image` changed to an image that does not exist).
fn regressed() -> Value {
    json!({
        "phase": "Error", "step": "Requested",
        "firstReachableAt": "2026-01-01T00:00:00Z",
        "conditions": [{"type": "Ready", "status": "False", "reason": "ImageNotFound",
            "message": "image \"berth-bsae\" not found in LXD",
            "lastTransitionTime": "2026-01-01T00:00:00Z"}],
    })
}

fn uid_of(s: &Setup, name: &str) -> String {
    s.ctx
        .store
        .get(Kind::Project, name)
        .unwrap()
        .uid()
        .to_string()
}

#[tokio::test(start_paused = true)]
async fn a_step_gone_back_still_inspects_the_container() {
    let s = setup();
    let object = s.deleting("p", regressed(), Container::Running, unpushed(1));
    let mut draft = Draft::from_object(&object);
    assert!(hold(&s.ctx, &object, &mut draft).await.unwrap().is_some());
    assert_eq!(
        condition_reason(&draft),
        Some("UnsavedWork".to_string()),
        "a project that was Reachable once is inspected whatever its step says now"
    );
    // A stored project from before firstReachableAt, whose step is still Reachable.
    let legacy = s.deleting(
        "legacy",
        json!({"phase": "Ready", "step": "Briefed"}),
        Container::Running,
        unpushed(2),
    );
    let mut draft = Draft::from_object(&legacy);
    assert!(hold(&s.ctx, &legacy, &mut draft).await.unwrap().is_some());
}

fn condition_reason(draft: &Draft) -> Option<String> {
    draft
        .condition(condition_types::DELETION_BLOCKED)
        .filter(|c| c.status == ConditionStatus::True)
        .map(|c| c.reason.clone())
}

#[tokio::test(start_paused = true)]
async fn a_missing_container_has_its_volume_inspected_from_an_inspection_instance() {
    let s = setup();
    s.deleting("p", regressed(), Container::Missing, unpushed(1));
    let uid = uid_of(&s, "p");
    assert!(matches!(s.teardown("p").await, Action::Requeue(_)));
    let (reason, message) = s.blocked("p").expect("held");
    assert_eq!(reason, "UnsavedWork");
    assert!(message.contains("1 commits on no remote"), "{message}");
    assert!(s.workspace_kept(&uid));
    assert!(
        s.inspection_instances().is_empty(),
        "the inspection instance is gone"
    );
    let created: Vec<String> = s
        .fake
        .calls()
        .into_iter()
        .filter(|c| c.starts_with("create_instance"))
        .collect();
    assert_eq!(
        created,
        vec![format!("create_instance {}", instance_name(&uid))]
    );

    // Saved: the next look lets the deletion finish.
    s.volumes.lock().unwrap().insert(
        DurableLayout::workspace_volume(&uid),
        FakeWorkspace::default(),
    );
    // (The next look is due at once rather than after the recheck interval.)
    s.ctx.held.forget(&uid);
    assert!(matches!(s.teardown("p").await, Action::Done));
    assert!(!s.workspace_kept(&uid));
    assert!(s.inspection_instances().is_empty());
}

#[tokio::test(start_paused = true)]
async fn the_inspection_instance_is_made_the_way_the_contract_says() {
    let s = setup();
    let object = s.deleting(
        "p",
        json!({"phase": "Missing", "step": "Requested", "firstReachableAt": "2026-01-01T00:00:00Z",
               "container": {"name": "p", "imageFingerprint": crate::testing::fake_runtime::fake_fingerprint("berth-tiny")}}),
        Container::Missing,
        FakeWorkspace::default(),
    );
    let uid = object.uid().to_string();
    let seen: Arc<Mutex<Option<Instance>>> = Arc::default();
    let weak = Arc::downgrade(&s.fake);
    let record = seen.clone();
    s.fake.on_exec(move |name, request| {
        if is_inspection(request) {
            *record.lock().unwrap() = weak.upgrade()?.instance(name);
        }
        None
    });
    let mut draft = Draft::from_object(&object);
    assert_eq!(hold(&s.ctx, &object, &mut draft).await.unwrap(), None);
    let instance = seen
        .lock()
        .unwrap()
        .clone()
        .expect("inspected in an instance");
    assert_eq!(instance.name, instance_name(&uid));
    assert_eq!(instance.config.get(INSPECTS_LABEL), Some(&uid));
    assert!(instance.config.contains_key(CONTROLLER_LABEL));
    assert!(
        !instance.config.contains_key(UID_LABEL),
        "never taken for the project's container"
    );
    assert_eq!(
        instance.base_image(),
        Some(crate::testing::fake_runtime::fake_fingerprint("berth-tiny").as_str()),
        "made from the recorded fingerprint first"
    );
    let workspace = &instance.devices["workspace"];
    assert_eq!(workspace["source"], DurableLayout::workspace_volume(&uid));
    assert_eq!(workspace["path"], "/workspace");
    assert_eq!(workspace["readonly"], "true");
    assert!(s.inspection_instances().is_empty());
    // The orphan report, which counts berth's containers without a project, never counts it.
    let controller = s.ctx.store.controller_id();
    assert!(
        crate::scheduler::housekeeping::orphans(&[instance], &Default::default(), controller)
            .is_empty()
    );
}

#[tokio::test(start_paused = true)]
async fn a_foreign_container_is_left_alone_and_the_volume_inspected() {
    let s = setup();
    s.deleting(
        "p",
        json!({"phase": "Error", "step": "Reachable"}),
        Container::Foreign,
        unpushed(3),
    );
    let uid = uid_of(&s, "p");
    assert!(matches!(s.teardown("p").await, Action::Requeue(_)));
    assert_eq!(s.blocked("p").map(|b| b.0), Some("UnsavedWork".to_string()));
    assert!(s.workspace_kept(&uid));
    let foreign = s.fake.instance("p").expect("still there");
    assert_eq!(foreign.status, InstanceStatus::Running, "not touched");
    assert!(
        !s.fake
            .calls()
            .iter()
            .any(|c| c == "stop_instance p" || c == "delete_instance p" || c == "exec p"),
        "{:?}",
        s.fake.calls()
    );
}

#[tokio::test(start_paused = true)]
async fn an_inspection_instance_that_cannot_be_made_holds_the_deletion() {
    let s = setup();
    let object = s.deleting(
        "p",
        regressed(),
        Container::Missing,
        FakeWorkspace::default(),
    );
    // No image of the project's, nor the default, exists any more.
    s.fake.remove_image("berth-base");
    let mut draft = Draft::from_object(&object);
    assert!(hold(&s.ctx, &object, &mut draft).await.unwrap().is_some());
    assert_eq!(
        condition_reason(&draft),
        Some("InspectionFailed".to_string())
    );
    let message = super::ready_message(&draft);
    assert!(
        message.contains("no image to inspect"),
        "Ready says why: {message}"
    );

    // A leftover from a crash is removed first; a name someone else holds is never touched.
    let s = setup();
    let object = s.deleting(
        "q",
        regressed(),
        Container::Missing,
        FakeWorkspace::default(),
    );
    let name = instance_name(object.uid());
    let leftover = |labels: &[(&str, &str)]| Instance {
        name: name.clone(),
        status: InstanceStatus::Running,
        status_code: 103,
        location: "none".into(),
        profiles: Vec::new(),
        config: labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        devices: BTreeMap::new(),
        created_at: None,
        last_used_at: None,
        state: None,
    };
    s.fake
        .insert_instance(leftover(&[(INSPECTS_LABEL, object.uid())]));
    let mut draft = Draft::from_object(&object);
    assert_eq!(hold(&s.ctx, &object, &mut draft).await.unwrap(), None);
    assert!(s.inspection_instances().is_empty());

    s.fake
        .insert_instance(leftover(&[("user.someone", "else")]));
    s.ctx.held.forget(object.uid());
    let mut draft = Draft::from_object(&object);
    assert!(hold(&s.ctx, &object, &mut draft).await.unwrap().is_some());
    assert_eq!(
        condition_reason(&draft),
        Some("InspectionFailed".to_string())
    );
    assert_eq!(
        s.inspection_instances(),
        vec![name],
        "someone else's, left alone"
    );
}

#[tokio::test(start_paused = true)]
async fn a_project_that_never_ran_and_has_no_container_goes_without_inspection() {
    let s = setup();
    s.deleting(
        "p",
        json!({"phase": "Error", "step": "Requested"}),
        Container::Missing,
        unpushed(1),
    );
    let uid = uid_of(&s, "p");
    assert!(matches!(s.teardown("p").await, Action::Done));
    assert!(!s.workspace_kept(&uid));
    assert_eq!(s.fake.count("exec"), 0);
    assert_eq!(s.fake.count("create_instance"), 0);
}

/// Where each of `wanted` first appears in `calls`, in order after the previous one.
fn in_order(calls: &[String], wanted: &[&str]) -> bool {
    let mut from = 0;
    for w in wanted {
        match calls[from..].iter().position(|c| c == w) {
            Some(at) => from += at + 1,
            None => return false,
        }
    }
    true
}

/// Records, in order, which of the fake's execs in `instance` were inspections (`inspect`) and
/// which ended its processes (`quiesce`).
fn record_execs(fake: &Arc<FakeRuntime>, instance: &str) -> Arc<Mutex<Vec<&'static str>>> {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let (log, instance) = (seen.clone(), instance.to_string());
    fake.on_exec(move |name, request| {
        if name == instance {
            let kind = if look::is_quiesce(request) {
                "quiesce"
            } else if is_inspection(request) {
                "inspect"
            } else {
                "other"
            };
            log.lock().unwrap().push(kind);
        }
        None
    });
    seen
}

#[tokio::test(start_paused = true)]
async fn a_running_container_has_its_processes_ended_then_is_inspected_again_then_trashed() {
    let s = setup();
    s.deleting(
        "p",
        json!({"phase": "Ready", "step": "Seeded"}),
        Container::Running,
        FakeWorkspace::default(),
    );
    let execs = record_execs(&s.fake, "p");
    assert!(matches!(s.teardown("p").await, Action::Done));
    assert_eq!(
        *execs.lock().unwrap(),
        ["inspect", "quiesce", "inspect"],
        "a look, the processes ended, a second look"
    );
    let calls = s.fake.calls();
    assert!(
        in_order(&calls, &["exec p", "stop_instance p", "rename_instance p"]),
        "inspected, then stopped, then into the trash: {calls:?}"
    );
    assert_eq!(
        s.fake.count("start_instance"),
        0,
        "no boot to look: {calls:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn work_written_as_the_processes_end_holds_it_and_it_runs_again() {
    let s = setup();
    let object = s.deleting(
        "p",
        json!({"phase": "Ready", "step": "Seeded"}),
        Container::Running,
        FakeWorkspace::default(),
    );
    let uid = object.uid().to_string();
    // The agent commits when it gets SIGTERM.
    let volumes = s.volumes.clone();
    let volume = DurableLayout::workspace_volume(&uid);
    s.fake.on_exec(move |name, request| {
        if name == "p" && look::is_quiesce(request) {
            volumes.lock().unwrap().insert(volume.clone(), unpushed(1));
        }
        None
    });
    assert!(matches!(s.teardown("p").await, Action::Requeue(_)));
    assert_eq!(s.blocked("p").map(|b| b.0), Some("UnsavedWork".to_string()));
    assert!(s.workspace_kept(&uid));
    assert_eq!(
        s.fake.instance("p").map(|i| i.status),
        Some(InstanceStatus::Running),
        "put back as a stop and start would leave it"
    );
    assert_eq!(s.fake.count("start_instance"), 1, "started again");
    assert_eq!(s.fake.count("delete_instance"), 0);
}

#[tokio::test(start_paused = true)]
async fn a_stopped_container_is_looked_at_once_and_stays_stopped_when_held() {
    let s = setup();
    s.deleting(
        "p",
        json!({"phase": "Stopped", "step": "Started", "firstReachableAt": "2026-01-01T00:00:00Z"}),
        Container::Stopped,
        unpushed(1),
    );
    assert!(matches!(s.teardown("p").await, Action::Requeue(_)));
    assert_eq!(s.blocked("p").map(|b| b.0), Some("UnsavedWork".to_string()));
    assert_eq!(
        s.fake.instance("p").map(|i| i.status),
        Some(InstanceStatus::Stopped)
    );
    assert_eq!(s.fake.count("start_instance"), 1, "booted once to look");
}

/// Reconciles until the reconcile says Done or `rounds` have run; returns the last action.
async fn reconcile(s: &Setup, name: &str, rounds: usize) -> Option<Action> {
    let mut last = None;
    for _ in 0..rounds {
        match crate::reconcile::project::reconcile(&s.ctx, name).await {
            Ok(Action::Done) => return Some(Action::Done),
            Ok(action) => last = Some(action),
            Err(e) => tracing::debug!(error = %e, "reconcile failed"),
        }
    }
    last
}

#[tokio::test(start_paused = true)]
async fn an_image_changed_to_a_typo_still_has_its_deletion_held() {
    let s = setup();
    let apply = |image: &str| {
        let finalizers = s
            .ctx
            .store
            .get(Kind::Project, "p")
            .map(|o| o.metadata.finalizers.clone());
        s.ctx
            .store
            .apply(
                Desired::project("p", json!({ "image": image })).with_finalizers(finalizers),
                Commit::Persist,
            )
            .unwrap();
    };
    apply("berth-tiny");
    assert!(matches!(reconcile(&s, "p", 40).await, Some(Action::Done)));
    let status = |s: &Setup| -> ProjectStatus {
        s.ctx
            .store
            .get(Kind::Project, "p")
            .unwrap()
            .status
            .decode()
            .unwrap()
    };
    let reached = status(&s)
        .first_reachable_at
        .expect("recorded once Reachable");
    let uid = uid_of(&s, "p");
    s.volumes
        .lock()
        .unwrap()
        .insert(DurableLayout::workspace_volume(&uid), unpushed(1));

    // A typo: the container is replaced, the new image does not exist.
    apply("berth-tnyi");
    reconcile(&s, "p", 10).await;
    let now = status(&s);
    assert_eq!(now.step, Some(berth_api::Step::Requested), "{now:?}");
    assert!(s.fake.instance("p").is_none());
    assert_eq!(now.first_reachable_at, Some(reached), "never cleared");

    // A plain delete inspects the volume and holds.
    s.ctx
        .store
        .delete(Kind::Project, "p", None, BTreeMap::new(), Commit::Persist)
        .unwrap();
    reconcile(&s, "p", 3).await;
    assert_eq!(s.blocked("p").map(|b| b.0), Some("UnsavedWork".to_string()));
    assert!(s.workspace_kept(&uid));
    assert_eq!(status(&s).phase, Phase::Deleting);
    assert!(s.inspection_instances().is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_leftover_inspection_instance_does_not_strand_a_forced_deletion() {
    let s = setup();
    let object = s.deleting("p", regressed(), Container::Missing, unpushed(1));
    let uid = object.uid().to_string();
    // A crash between creating the inspection instance and deleting it.
    s.fake.insert_instance(Instance {
        name: instance_name(&uid),
        status: InstanceStatus::Running,
        status_code: 103,
        location: "none".into(),
        profiles: Vec::new(),
        config: BTreeMap::from([(INSPECTS_LABEL.to_string(), uid.clone())]),
        devices: BTreeMap::from([(
            "workspace".to_string(),
            crate::layout::disk_device(
                "default",
                &DurableLayout::workspace_volume(&uid),
                "/workspace",
            ),
        )]),
        created_at: None,
        last_used_at: None,
        state: None,
    });
    let mut annotations = object.metadata.annotations.clone();
    annotations.insert(berth_api::annotations::FORCE_DELETE.into(), "true".into());
    s.ctx
        .store
        .delete(Kind::Project, "p", None, annotations, Commit::Persist)
        .unwrap();
    assert!(matches!(s.teardown("p").await, Action::Done));
    assert!(!s.workspace_kept(&uid));
    assert!(s.inspection_instances().is_empty());
}

/// One simulated workspace for [`randomized_deletions_never_destroy_protected_work`]: its true
/// state, which the deletion only learns by looking.
#[derive(Debug, Clone, Default)]
struct World {
    reached: bool,
    unsaved: UnsavedWork,
    /// A file berth seeded is in the workspace; `edited` when someone changed it since.
    seeded: bool,
    edited: bool,
    blocked: bool,
    /// A process in the container writes when it gets SIGTERM (the container is stopped, or its
    /// processes ended before a look).
    writes_on_stop: bool,
    /// The project container's processes were ended ([`look::quiesce`]).
    terminated: bool,
    /// Every inspection of it comes back unreadable.
    failing: bool,
}

impl World {
    /// Whether destroying it now could lose something (or nobody could tell).
    fn protected(&self, container: Container) -> bool {
        self.reached
            && (self.unsaved.any()
                || self.edited
                || self.blocked
                || self.failing
                || (self.writes_on_stop && container == Container::Running))
    }
}

const SEED_HASH: &str = "5eed5eed5eed5eed5eed5eed5eed5eed5eed5eed5eed5eed5eed5eed5eed5eed";

/// What the inspection script would print for `world`'s workspace, a git repository whose
/// seeded file (excluded from git, so judged by its hash alone) carries its hash now.
fn report(world: &World, live_agent: bool) -> String {
    use base64::Engine;
    use base64::engine::general_purpose::STANDARD as B64;
    let workspace = FakeWorkspace {
        unsaved: world.unsaved.clone(),
        agent_json: (live_agent && world.blocked)
            .then(|| r#"{"state":"blocked","message":"which database?"}"#.to_string()),
        ..FakeWorkspace::default()
    };
    let report = inspection_report(&workspace);
    if !world.seeded {
        return report;
    }
    let now = if world.edited {
        "0ddba11".repeat(10)[..64].to_string()
    } else {
        SEED_HASH.to_string()
    };
    let (header, rest) = report.split_once('\n').expect("a report has a header line");
    format!("{header}\nknown {} {now}\n{rest}", B64.encode("AGENTS.md"))
}

/// The workspace volume attached to `instance` in the fake.
fn attached_workspace(fake: &FakeRuntime, instance: &str) -> Option<String> {
    fake.instance(instance)?
        .devices
        .values()
        .find(|d| d.get("path").map(String::as_str) == Some("/workspace"))?
        .get("source")
        .cloned()
}

/// Hundreds of deletions of workspaces in every state a deletion can meet them in: steps gone
/// back (a new image, a recreate, a boot) or never recorded, containers running, stopped,
/// vanished or taken by someone else, unsaved work of every kind, seeded files edited or not,
/// blocked agents, writes while the container stops, inspections that fail and LXD calls that
/// fail. Whatever happens, a workspace that holds work (or cannot be told not to) is never
/// destroyed, a foreign container is never touched, and everything else is deleted.
#[tokio::test(start_paused = true)]
async fn randomized_deletions_never_destroy_protected_work() {
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};
    let mut rng = StdRng::seed_from_u64(0x6265_7274_6800_0d31);
    let steps = berth_api::Step::ALL;
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    let s = setup();
    for w in 0..300 {
        let name = format!("p{w}");
        let name = name.as_str();
        let container = match rng.random_range(0..4) {
            0 => Container::Running,
            1 => Container::Stopped,
            2 => Container::Missing,
            _ => Container::Foreign,
        };
        let reached = rng.random_bool(0.8);
        let mut world = World {
            reached,
            ..World::default()
        };
        if reached {
            if rng.random_bool(0.4) {
                match rng.random_range(0..4) {
                    0 => world.unsaved.uncommitted = 1,
                    1 => world.unsaved.untracked = 2,
                    2 => world.unsaved.stashes = 1,
                    _ => world.unsaved.unpushed = 3,
                }
            }
            world.seeded = rng.random_bool(0.5);
            world.edited = world.seeded && rng.random_bool(0.3);
            world.blocked = rng.random_bool(0.1);
            world.writes_on_stop = rng.random_bool(0.5);
            world.failing = rng.random_bool(0.1);
        }
        // What status says: the record, or (stored before it existed) the step or traces.
        let mut status = json!({"phase": "Ready"});
        if reached {
            match rng.random_range(0..3) {
                0 => {
                    status["firstReachableAt"] = json!("2026-01-01T00:00:00Z");
                    status["step"] = json!(steps[rng.random_range(0..steps.len())]);
                }
                1 => status["step"] = json!(steps[rng.random_range(3..steps.len())]),
                _ => {
                    status["step"] = json!(steps[rng.random_range(0..3)]);
                    // A finding recorded long ago: stale, never an answer for a fresh look.
                    status["unsavedWork"] =
                        json!({"uncommitted": 0, "untracked": 0, "stashes": 0, "unpushed": 0});
                }
            }
            if world.seeded {
                status["seededFiles"] = json!({"/workspace/AGENTS.md": SEED_HASH});
            }
            if world.blocked {
                status["agent"] = json!({"state": "blocked"});
            }
            if rng.random_bool(0.5) {
                status["container"] = json!({"name": name,
                    "imageFingerprint": crate::testing::fake_runtime::fake_fingerprint("berth-tiny")});
            }
        } else {
            status["step"] = json!(steps[rng.random_range(0..3)]);
        }
        let object = s.deleting(name, status.clone(), container, FakeWorkspace::default());
        let uid = object.uid().to_string();
        let volume = DurableLayout::workspace_volume(&uid);
        let shared = Arc::new(Mutex::new(world.clone()));
        let weak = Arc::downgrade(&s.fake);
        let live = shared.clone();
        let (project, stopped) = (name.to_string(), format!("stop_instance {name}"));
        let ours = volume.clone();
        s.fake.on_exec(move |instance, request| {
            if look::is_quiesce(request) && instance == project {
                live.lock().unwrap().terminated = true;
                return None;
            }
            if !is_inspection(request) {
                return None;
            }
            let fake = weak.upgrade()?;
            if attached_workspace(&fake, instance)? != ours {
                return None;
            }
            let mut world = live.lock().unwrap();
            // The writer, running in the project's own container, ran when it got SIGTERM:
            // from its processes' end before the second look, or from a stop.
            if world.writes_on_stop
                && container == Container::Running
                && (world.terminated || fake.calls().contains(&stopped))
            {
                world.unsaved.uncommitted = world.unsaved.uncommitted.max(1);
            }
            if world.failing {
                return Some(Ok(ExecOutput {
                    exit_code: 0,
                    stdout: b"berth-inspect 1\ngit repo\n".to_vec(),
                    stderr: Vec::new(),
                }));
            }
            let running = instance == project;
            Some(Ok(report(&world, running))).map(|r| {
                r.map(|stdout| ExecOutput {
                    exit_code: 0,
                    stdout: stdout.into_bytes(),
                    stderr: Vec::new(),
                })
            })
        });
        // Now and then one LXD call on the way fails (no earlier world's fault is left over).
        s.fake.clear_faults();
        if rng.random_bool(0.2) {
            let method = [
                "create_instance",
                "wait_operation",
                "start_instance",
                "stop_instance",
                "delete_instance",
                "volumes_named",
                "get_instance",
            ][rng.random_range(0..7)];
            s.fake.fault_method(
                method,
                crate::testing::fake_runtime::Fault::Fail(
                    crate::runtime::RuntimeError::Transport {
                        what: method.into(),
                        message: "injected".into(),
                    },
                ),
            );
        }
        let protected = world.protected(container);
        let foreign_before = s
            .fake
            .instance(name)
            .filter(|_| container == Container::Foreign);

        let mut done = false;
        for _ in 0..4 {
            let object = s.ctx.store.get(Kind::Project, name).unwrap();
            let draft = Draft::from_object(&object);
            let result = crate::reconcile::finalizer::finalize(&s.ctx, &object, draft).await;
            s.ctx.held.forget(&uid);
            // Safety, after every attempt: protected work is still there.
            if protected {
                assert!(
                    s.fake.volume("default", &volume).is_some(),
                    "world {w} destroyed while protected: {world:?}, {container:?}, status {status}"
                );
            }
            if matches!(result, Ok(Action::Done)) {
                done = true;
                break;
            }
        }
        // A foreign container is never touched.
        if let Some(before) = foreign_before {
            assert_eq!(s.fake.instance(name), Some(before), "world {w}");
            let touched = [
                format!("stop_instance {name}"),
                format!("delete_instance {name}"),
                format!("exec {name}"),
            ];
            assert!(
                !s.fake.calls().iter().any(|c| touched.contains(c)),
                "world {w} touched a foreign container"
            );
        }
        assert!(s.inspection_instances().is_empty(), "world {w}");
        if protected {
            assert!(!done, "world {w}: {world:?}");
            assert!(s.blocked(name).is_some(), "world {w}: held, and says so");
            // A held deletion leaves the project's own container as it was.
            if container == Container::Running {
                assert_eq!(
                    s.fake.instance(name).map(|i| i.status),
                    Some(InstanceStatus::Running),
                    "world {w}: {world:?}"
                );
            }
            *counts.entry("held").or_default() += 1;
        } else {
            // Liveness: with nothing to protect, the deletion finishes within a few attempts
            // even when one LXD call fails on the way.
            assert!(
                done,
                "world {w} not deleted: {world:?}, {container:?}, status {status}, {:?}",
                s.blocked(name)
            );
            assert!(s.fake.volume("default", &volume).is_none(), "world {w}");
            *counts.entry("deleted").or_default() += 1;
        }
        if reached && container != Container::Running && container != Container::Stopped {
            *counts.entry("volume inspected").or_default() += 1;
        }
        if world.writes_on_stop && container == Container::Running && !world.unsaved.any() {
            *counts.entry("caught on stop").or_default() += 1;
        }
        if world.edited {
            *counts.entry("seed edited").or_default() += 1;
        }
    }
    // The simulation must exercise every path, or it proves nothing.
    for (what, at_least) in [
        ("held", 80),
        ("deleted", 80),
        ("volume inspected", 80),
        ("caught on stop", 8),
        ("seed edited", 15),
    ] {
        let n = counts.get(what).copied().unwrap_or(0);
        assert!(n >= at_least, "too few {what}: {counts:?}");
    }
}
