use super::*;
use crate::activity_log::ActivityLog;
use crate::layout::UID_LABEL;
use crate::reconcile::Backoff;
use crate::runtime::{Instance, InstanceStatus};
use crate::store::Commit;
use crate::store::Desired;
use crate::testing::fake_runtime::FakeRuntime;
use crate::testing::inspection::{FakeWorkspace, is_inspection, script_inspection};
use berth_api::ProtectionReason;
use berth_api::UnsavedWork;
use serde_json::Value;
use serde_json::json;
use tokio::time::Instant;

/// The passes over a fake runtime and a real store, reading a clock that moves with tokio's
/// (paused) time, so hours pass in moments.
pub(super) struct Setup {
    _dir: tempfile::TempDir,
    pub store: Arc<Store>,
    pub fake: Arc<FakeRuntime>,
    pub metrics: Arc<Metrics>,
    /// Exec and tool calls made through berth, as the API records them.
    pub activity_log: Arc<ActivityLog>,
    pub passes: DaemonPasses,
}

pub(super) const RECHECK: Duration = Duration::from_secs(180);

pub(super) fn setup() -> Setup {
    setup_with(RECHECK)
}

/// [`setup`] with another `scheduler.recheckInterval`.
pub(super) fn setup_with(recheck_interval: Duration) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(Store::open(&dir.path().join("berth.db")).unwrap());
    let fake = Arc::new(FakeRuntime::new());
    let metrics = Arc::new(Metrics::new());
    let queue = WorkQueue::new(1, Backoff::default(), metrics.clone());
    let (base_utc, base) = (Utc::now(), Instant::now());
    // Every reading is a microsecond later than the one before, as a real clock would be between
    // two status writes of one pass.
    let ticks = Arc::new(std::sync::atomic::AtomicI64::new(0));
    let clock: Clock = Arc::new(move || {
        let tick = ticks.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        base_utc
            + chrono::Duration::from_std(Instant::now() - base).unwrap_or_default()
            + chrono::Duration::microseconds(tick)
    });
    let activity_log = Arc::new(ActivityLog::default());
    let passes = DaemonPasses::new(
        store.clone(),
        fake.clone(),
        queue,
        metrics.clone(),
        activity_log.clone(),
        PassSettings {
            workers: 2,
            inspect_timeout: Duration::from_secs(10),
            preview_site: crate::preview::PreviewSite::new("localhost", false, None),
            recheck_interval,
        },
    );
    // The passes read the simulated clock (the field is theirs; only tests replace it).
    let passes = DaemonPasses { clock, ..passes };
    Setup {
        _dir: dir,
        store,
        fake,
        metrics,
        activity_log,
        passes,
    }
}

impl Setup {
    pub fn now(&self) -> DateTime<Utc> {
        self.passes.now()
    }

    /// A project that became Reachable, with `reap` as its policy; its container runs (status
    /// with a pid) or is stopped (no pid, as the reconciler records a stopped container). Its
    /// status carries the reconciler's bookkeeping, which the passes must keep.
    pub fn project(&self, name: &str, reap: Value, running: bool) -> String {
        self.store
            .apply(
                Desired::project(name, json!({"image": "berth-base", "reap": reap})),
                Commit::Persist,
            )
            .unwrap();
        let object = self.store.get(Kind::Project, name).unwrap();
        let container = if running {
            json!({"name": name, "pid": 42})
        } else {
            json!({"name": name})
        };
        self.store
            .put_status(
                Kind::Project,
                name,
                None,
                json!({"phase": if running { "Ready" } else { "Stopped" }, "step": "Reachable",
                       "container": container,
                       "controller": {"image": "berth-base"}}),
            )
            .unwrap();
        self.fake.insert_instance(Instance {
            name: name.into(),
            status: if running {
                InstanceStatus::Running
            } else {
                InstanceStatus::Stopped
            },
            status_code: if running { 103 } else { 102 },
            location: "none".into(),
            profiles: Vec::new(),
            config: BTreeMap::from([(UID_LABEL.to_string(), object.uid().to_string())]),
            devices: Default::default(),
            created_at: None,
            last_used_at: None,
            state: None,
        });
        object.uid().to_string()
    }

    /// A running project whose container runs and was reachable, idle after one second.
    pub fn running_project(&self, name: &str, workspace: FakeWorkspace) {
        self.project(name, json!({"idleAfter": "1s", "idleAction": "Stop"}), true);
        script_inspection(&self.fake, name, workspace);
    }

    /// Merges `patch` into the stored status, as the reconciler would write it.
    pub fn patch_status(&self, name: &str, patch: Value) {
        let object = self.store.get(Kind::Project, name).unwrap();
        let mut status = object.status.value();
        for (key, value) in patch.as_object().unwrap() {
            if value.is_null() {
                status.as_object_mut().unwrap().remove(key);
            } else {
                status[key] = value.clone();
            }
        }
        self.store
            .put_status(Kind::Project, name, None, status)
            .unwrap();
    }

    pub fn status(&self, name: &str) -> Value {
        self.store.get(Kind::Project, name).unwrap().status.value()
    }

    /// One round of the activity and reap passes.
    pub async fn round(&self) {
        self.passes.run(Pass::Activity).await;
        self.passes.run(Pass::Reap).await;
    }

    /// Rounds of activity and reap passes, once every project is past its idle window.
    async fn rounds(&self, n: usize) {
        tokio::time::advance(Duration::from_millis(1100)).await;
        for _ in 0..n {
            self.round().await;
        }
    }

    /// The value of one metric sample, e.g. `berth_reap_refusals_total{reason="UnsavedWork"}`.
    pub fn metric(&self, sample: &str) -> f64 {
        let text = self.metrics.encode();
        text.lines()
            .find_map(|l| l.strip_prefix(sample)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or_else(|| panic!("no {sample} in\n{text}"))
    }

    fn refusals(&self, reason: &str) -> f64 {
        self.metric(&format!("berth_reap_refusals_total{{reason=\"{reason}\"}}"))
    }

    fn events(&self, name: &str, reason: &str) -> usize {
        self.store
            .events_for(Kind::Project, name)
            .unwrap()
            .into_iter()
            .filter(|e| e.reason == reason)
            .map(|e| e.count as usize)
            .sum()
    }
}

fn condition(status: &Value, type_: &str) -> Value {
    status["conditions"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["type"] == type_).cloned())
        .unwrap_or_default()
}

#[tokio::test(start_paused = true)]
async fn an_idle_clean_project_is_idled_after_two_agreeing_passes() {
    let s = setup();
    s.running_project("idle", FakeWorkspace::default());
    s.rounds(1).await;
    assert!(
        s.status("idle")["reap"]["idledAt"].is_null(),
        "one pass must not act: {}",
        s.status("idle")
    );
    assert_eq!(s.status("idle")["reap"]["nextAction"], "Stop");
    s.rounds(1).await;
    let status = s.status("idle");
    assert!(status["reap"]["idledAt"].is_string(), "{status}");
    assert_eq!(status["controller"]["image"], "berth-base", "{status}");
    assert_eq!(status["step"], "Reachable");
    assert!(
        s.metrics
            .encode()
            .contains("berth_reap_actions_total{action=\"stop\"} 1"),
        "{}",
        s.metrics.encode()
    );
}

#[tokio::test(start_paused = true)]
async fn unsaved_work_a_blocked_agent_and_a_failed_inspection_each_protect() {
    let s = setup();
    s.running_project(
        "dirty",
        FakeWorkspace {
            unsaved: UnsavedWork {
                unpushed: 2,
                ..UnsavedWork::default()
            },
            ports: vec![3000],
            ..FakeWorkspace::default()
        },
    );
    s.running_project(
        "blocked",
        FakeWorkspace {
            agent_json: Some(r#"{"state":"blocked","title":"pick a database"}"#.into()),
            ..FakeWorkspace::default()
        },
    );
    s.running_project("unknown", FakeWorkspace::default());
    // Its inspection answers nothing readable.
    s.fake
        .on_exec(|name, _| (name == "unknown").then(|| Ok(crate::runtime::ExecOutput::default())));
    s.rounds(3).await;
    for (name, reason) in [
        ("dirty", "UnsavedWork"),
        ("blocked", "AgentBlocked"),
        ("unknown", "InspectionFailed"),
    ] {
        let status = s.status(name);
        assert!(status["reap"]["idledAt"].is_null(), "{name}: {status}");
        assert_eq!(status["reap"]["protectedBy"], json!([reason]), "{name}");
        let condition = status["conditions"]
            .as_array()
            .and_then(|c| c.iter().find(|c| c["type"] == "ReapProtected").cloned())
            .unwrap();
        assert_eq!(condition["status"], "True", "{name}");
        assert_eq!(condition["reason"], reason, "{name}");
        assert_eq!(status["controller"]["image"], "berth-base");
        let warnings = s
            .store
            .events_for(Kind::Project, name)
            .unwrap()
            .into_iter()
            .filter(|e| e.reason == "ReapProtected")
            .count();
        assert_eq!(warnings, 1, "{name}: one event, not one per pass");
    }
    let dirty = s.status("dirty");
    assert_eq!(dirty["unsavedWork"]["unpushed"], 2);
    assert_eq!(dirty["ports"][0]["url"], "http://dirty--3000.localhost");
    let blocked = s.status("blocked");
    assert_eq!(blocked["title"], "pick a database");
    assert_eq!(blocked["agent"]["state"], "blocked");
    assert!(s.status("unknown")["unsavedWork"].is_null());
    // Each refusal counted once, although three passes declined it.
    for reason in ["UnsavedWork", "AgentBlocked", "InspectionFailed"] {
        assert_eq!(s.refusals(reason), 1.0, "{reason}");
    }
    assert_eq!(s.metric("berth_reap_actions_total{action=\"stop\"}"), 0.0);
    s.rounds(3).await;
    assert_eq!(s.refusals("UnsavedWork"), 1.0, "still one episode");

    let plan = plan(s.store.list(Kind::Project).iter().map(|o| o.as_ref()));
    let names: Vec<&str> = plan.iter().map(|e| e.name.as_str()).collect();
    assert_eq!(names, ["blocked", "dirty", "unknown"]);
    assert_eq!(plan[1].protected_by, vec![ProtectionReason::UnsavedWork]);
    assert_eq!(plan[1].next_action, Some(ReapAction::Stop));
    assert!(plan[1].reason.contains("UnsavedWork"), "{}", plan[1].reason);
}

#[test]
fn merging_keeps_every_field_the_scheduler_does_not_own() {
    let stored =
        json!({"phase": "Ready", "controller": {"x": 1}, "ports": [{"port": 1, "url": "u"}]});
    let status = ProjectStatus {
        title: Some("t".into()),
        ..ProjectStatus::default()
    };
    let merged = crate::store::lay_owned(
        Kind::Project,
        crate::store::FieldManager::Scheduler,
        &stored,
        serde_json::to_value(&status).unwrap(),
    );
    assert_eq!(merged["phase"], "Ready");
    assert_eq!(merged["controller"]["x"], 1);
    assert_eq!(merged["title"], "t");
    assert!(merged.get("ports").is_none(), "{merged}");
}

fn protected_by(status: &Value) -> Vec<String> {
    status["reap"]["protectedBy"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|r| r.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

fn time_at(status: &Value, pointer: &str) -> Option<DateTime<Utc>> {
    status
        .pointer(pointer)?
        .as_str()?
        .parse::<DateTime<Utc>>()
        .ok()
}

fn dirty(untracked: u32) -> FakeWorkspace {
    FakeWorkspace::with_unsaved(UnsavedWork {
        untracked,
        ..UnsavedWork::default()
    })
}

/// Records every command run in the fake other than the inspection.
fn record_commands(fake: &FakeRuntime) -> Arc<Mutex<Vec<Vec<String>>>> {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    fake.on_exec(move |_, request| {
        if !is_inspection(request) {
            log.lock().unwrap().push(request.command.clone());
        }
        None
    });
    seen
}

#[tokio::test(start_paused = true)]
async fn a_stopped_project_due_for_delete_is_booted_once_and_kept_with_what_it_holds() {
    let s = setup();
    s.project(
        "stopped",
        json!({"idleAfter": "1s", "idleAction": "Delete"}),
        false,
    );
    // The last inspection while it ran found nothing; a file was written before it stopped.
    s.patch_status(
        "stopped",
        json!({"unsavedWork": {"uncommitted": 0, "untracked": 0, "stashes": 0, "unpushed": 0}}),
    );
    script_inspection(&s.fake, "stopped", dirty(1));
    let commands = record_commands(&s.fake);

    // Due, then the re-check boots it, finds the file and holds it: that shows at once.
    s.rounds(2).await;
    let status = s.status("stopped");
    assert_eq!(protected_by(&status), ["UnsavedWork"], "{status}");
    assert_eq!(status["reap"]["nextAction"], "Delete");
    assert_eq!(status["unsavedWork"]["untracked"], 1, "{status}");
    let protected = condition(&status, "ReapProtected");
    assert_eq!(
        (protected["status"].as_str(), protected["reason"].as_str()),
        (Some("True"), Some("UnsavedWork"))
    );
    assert_eq!(s.events("stopped", "ReapProtected"), 1);
    assert_eq!(s.refusals("UnsavedWork"), 1.0);
    assert_eq!(s.fake.count("start_instance"), 1);
    assert_eq!(
        s.fake.instance("stopped").unwrap().status,
        InstanceStatus::Stopped,
        "stopped again after its inspection"
    );
    assert!(
        commands
            .lock()
            .unwrap()
            .iter()
            .all(|c| c.as_slice() == ["test", "-f", "/run/init.ready"]),
        "only the readiness probe ran besides the inspection: {:?}",
        commands.lock().unwrap()
    );
    let entry = plan(s.store.list(Kind::Project).iter().map(|o| o.as_ref()));
    assert_eq!(entry[0].protected_by, vec![ProtectionReason::UnsavedWork]);
    assert!(
        entry[0].reason.contains("UnsavedWork"),
        "{}",
        entry[0].reason
    );

    // Nothing changes a stopped workspace: passes within the recheck interval boot nothing.
    for _ in 0..10 {
        tokio::time::advance(Duration::from_secs(10)).await;
        s.round().await;
    }
    assert_eq!(s.fake.count("start_instance"), 1, "booted again every pass");
    assert_eq!(
        s.refusals("UnsavedWork"),
        1.0,
        "one refusal, not one per pass"
    );
    assert_eq!(s.events("stopped", "ReapProtected"), 1);
    assert_eq!(protected_by(&s.status("stopped")), ["UnsavedWork"]);

    // Then it is looked at again, once, and still kept.
    tokio::time::advance(RECHECK).await;
    s.round().await;
    s.round().await;
    assert_eq!(s.fake.count("start_instance"), 2);
    let object = s.store.get(Kind::Project, "stopped").expect("kept");
    assert!(!object.is_deleting());
    assert_eq!(s.metric("berth_reap_actions_total{action=\"delete\"}"), 0.0);
}

#[tokio::test(start_paused = true)]
async fn a_stopped_project_whose_inspection_failed_is_inspected_without_starting_its_agent() {
    let s = setup();
    // The activity pass raced a stop: status still says running, the container is stopped.
    s.project(
        "raced",
        json!({"idleAfter": "1h", "idleAction": "Stop"}),
        true,
    );
    s.fake.set_status("raced", InstanceStatus::Stopped);
    script_inspection(&s.fake, "raced", FakeWorkspace::default());
    s.round().await;
    assert_eq!(protected_by(&s.status("raced")), ["InspectionFailed"]);
    assert_eq!(s.fake.count("start_instance"), 0);

    // The reconciler records the stop; the next pass looks, without the runner.
    let commands = record_commands(&s.fake);
    s.patch_status(
        "raced",
        json!({"phase": "Stopped", "container": {"name": "raced"}}),
    );
    s.round().await;
    let status = s.status("raced");
    assert!(protected_by(&status).is_empty(), "{status}");
    assert_eq!(
        status["unsavedWork"],
        json!({"uncommitted": 0, "untracked": 0, "stashes": 0, "unpushed": 0})
    );
    assert_eq!(condition(&status, "ReapProtected")["status"], "False");
    assert!(time_at(&status, "/activity/inspectedAt").is_some());
    assert_eq!(s.fake.count("start_instance"), 1);
    assert_eq!(
        s.fake.instance("raced").unwrap().status,
        InstanceStatus::Stopped
    );
    assert_eq!(
        *commands.lock().unwrap(),
        vec![vec![
            "test".to_string(),
            "-f".into(),
            "/run/init.ready".into()
        ]],
        "nothing but the readiness probe and the inspection"
    );

    // What it found stands while it stays stopped.
    for _ in 0..5 {
        tokio::time::advance(RECHECK).await;
        s.round().await;
    }
    assert_eq!(s.fake.count("start_instance"), 1);
}

#[tokio::test(start_paused = true)]
async fn a_stopped_project_that_cannot_be_inspected_is_tried_again_only_every_recheck_interval() {
    let s = setup();
    s.project(
        "unreadable",
        json!({"idleAfter": "1s", "idleAction": "Delete"}),
        false,
    );
    // No scripted inspection: the fake's empty output is an unreadable report.
    s.rounds(1).await;
    assert_eq!(s.fake.count("start_instance"), 1);
    assert_eq!(protected_by(&s.status("unreadable")), ["InspectionFailed"]);
    for _ in 0..10 {
        tokio::time::advance(Duration::from_secs(10)).await;
        s.round().await;
    }
    assert_eq!(s.fake.count("start_instance"), 1);
    assert_eq!(s.refusals("InspectionFailed"), 1.0);
    tokio::time::advance(RECHECK).await;
    s.round().await;
    assert_eq!(s.fake.count("start_instance"), 2);
    assert!(s.store.get(Kind::Project, "unreadable").is_some());
    assert_eq!(
        s.fake.instance("unreadable").unwrap().status,
        InstanceStatus::Stopped
    );
}

#[tokio::test(start_paused = true)]
async fn status_and_the_recheck_count_file_changes_alike() {
    let s = setup();
    s.project(
        "edited",
        json!({"idleAfter": "1h", "idleAction": "Stop"}),
        true,
    );
    tokio::time::advance(Duration::from_secs(50 * 60)).await;
    let edited_at = s.now() - chrono::Duration::minutes(5);
    script_inspection(
        &s.fake,
        "edited",
        FakeWorkspace {
            newest_mtime: Some(edited_at),
            ..FakeWorkspace::default()
        },
    );
    s.round().await;
    let status = s.status("edited");
    assert_eq!(time_at(&status, "/activity/lastActiveAt"), Some(edited_at));
    assert_eq!(status["activity"]["source"], "files");

    // An older status written over it loses the activity; the previous inspection saw the same
    // files. The next pass records them again, as the re-check would count them.
    s.patch_status("edited", json!({"activity": null}));
    tokio::time::advance(Duration::from_secs(20 * 60)).await;
    s.round().await;
    let status = s.status("edited");
    assert_eq!(time_at(&status, "/activity/lastActiveAt"), Some(edited_at));
    assert_eq!(
        time_at(&status, "/reap/nextActionAt"),
        Some(edited_at + chrono::Duration::hours(1)),
        "the plan counts the files: {status}"
    );
    let entry = plan(s.store.list(Kind::Project).iter().map(|o| o.as_ref()));
    assert!(
        entry[0].reason.starts_with("last active"),
        "{}",
        entry[0].reason
    );
    s.round().await;
    assert!(s.status("edited")["reap"]["idledAt"].is_null());

    // Once the hour from the edit has passed, plan and re-check agree: it is idled.
    tokio::time::advance(Duration::from_secs(60 * 60)).await;
    s.round().await;
    s.round().await;
    assert!(s.status("edited")["reap"]["idledAt"].is_string());
}

#[tokio::test(start_paused = true)]
async fn work_the_recheck_finds_shows_at_once() {
    let s = setup();
    s.running_project("late", FakeWorkspace::default());
    s.rounds(1).await;
    assert_eq!(s.status("late")["reap"]["nextAction"], "Stop");
    // Work appears between this round's activity pass and its reap pass.
    s.passes.run(Pass::Activity).await;
    script_inspection(
        &s.fake,
        "late",
        FakeWorkspace::with_unsaved(UnsavedWork {
            stashes: 1,
            ..UnsavedWork::default()
        }),
    );
    s.passes.run(Pass::Reap).await;
    let status = s.status("late");
    assert!(status["reap"]["idledAt"].is_null(), "{status}");
    assert_eq!(protected_by(&status), ["UnsavedWork"]);
    assert_eq!(status["unsavedWork"]["stashes"], 1);
    assert_eq!(condition(&status, "ReapProtected")["status"], "True");
    assert_eq!(s.events("late", "ReapProtected"), 1);
    assert_eq!(s.refusals("UnsavedWork"), 1.0);
    s.rounds(3).await;
    assert_eq!(s.refusals("UnsavedWork"), 1.0);
    assert!(s.status("late")["reap"]["idledAt"].is_null());
}

fn labelled(name: &str, uid: Option<&str>) -> Instance {
    Instance {
        name: name.into(),
        status: InstanceStatus::Stopped,
        status_code: 102,
        location: "none".into(),
        profiles: Vec::new(),
        config: uid
            .map(|u| BTreeMap::from([(UID_LABEL.to_string(), u.to_string())]))
            .unwrap_or_default(),
        devices: Default::default(),
        created_at: None,
        last_used_at: None,
        state: None,
    }
}

#[tokio::test(start_paused = true)]
async fn orphans_are_reported_once_per_episode_and_left_in_place() {
    let s = setup();
    s.project("kept", json!({"idleAfter": "1h"}), true);
    s.fake
        .insert_instance(labelled("leftover", Some("uid-gone")));
    s.fake.insert_instance(labelled("stranger", None));
    // Another berth's on the same LXD: its project is in that berth's store, not this one.
    let mut theirs = labelled("another-berths", Some("uid-theirs"));
    theirs.config.insert(
        crate::layout::CONTROLLER_LABEL.to_string(),
        "0123456789abcdef".to_string(),
    );
    s.fake.insert_instance(theirs);
    let orphan_events = || -> Vec<crate::store::Event> {
        s.store
            .recent_events(100)
            .unwrap()
            .into_iter()
            .filter(|e| e.reason == "OrphanedContainer")
            .collect()
    };
    for _ in 0..3 {
        s.passes.run(Pass::Housekeeping).await;
    }
    assert_eq!(s.metric("berth_orphan_containers"), 1.0);
    let events = orphan_events();
    assert_eq!(events.len(), 1, "{events:?}");
    let event = &events[0];
    assert_eq!(event.count, 1, "one event per episode, not per pass");
    assert_eq!(event.type_, EventType::Warning);
    assert_eq!(event.involved_object.kind, Kind::Project);
    assert_eq!(event.involved_object.name, "leftover");
    assert_eq!(event.involved_object.uid, "uid-gone");
    assert!(event.message.contains("left in place"), "{}", event.message);
    assert!(s.fake.instance("leftover").is_some());
    for call in ["delete_instance", "stop_instance", "delete_volume"] {
        assert_eq!(s.fake.count(call), 0, "{call}");
    }

    // Gone, then back: a new episode, reported again.
    s.fake.vanish("leftover");
    s.passes.run(Pass::Housekeeping).await;
    assert_eq!(s.metric("berth_orphan_containers"), 0.0);
    s.fake
        .insert_instance(labelled("leftover", Some("uid-gone")));
    s.passes.run(Pass::Housekeeping).await;
    s.passes.run(Pass::Housekeeping).await;
    assert_eq!(orphan_events()[0].count, 2);
    assert_eq!(s.metric("berth_orphan_containers"), 1.0);
}

#[tokio::test(start_paused = true)]
async fn a_paused_project_is_neither_booted_nor_reaped() {
    let s = setup();
    for (name, running) in [("repair-stopped", false), ("repair-running", true)] {
        s.project(
            name,
            json!({"idleAfter": "1s", "idleAction": "Delete"}),
            running,
        );
        let object = s.store.get(Kind::Project, name).unwrap();
        s.store
            .apply(
                Desired::project(name, object.spec.value()).with_annotations(BTreeMap::from([(
                    berth_api::annotations::RECONCILE.to_string(),
                    berth_api::annotations::RECONCILE_PAUSED.to_string(),
                )])),
                Commit::Persist,
            )
            .unwrap();
        script_inspection(&s.fake, name, FakeWorkspace::default());
    }
    s.rounds(5).await;
    for name in ["repair-stopped", "repair-running"] {
        let object = s.store.get(Kind::Project, name).expect("not deleted");
        assert!(!object.is_deleting(), "{name}");
        assert_eq!(
            object.status.value()["reap"]["nextAction"],
            "Delete",
            "{name}: still planned"
        );
    }
    assert_eq!(
        s.fake.count("start_instance"),
        0,
        "a paused project is not booted"
    );
    assert_eq!(s.metric("berth_reap_actions_total{action=\"delete\"}"), 0.0);
}

#[tokio::test(start_paused = true)]
async fn an_idle_clean_project_set_to_delete_is_deleted_after_two_agreeing_passes() {
    let s = setup();
    s.project(
        "doomed",
        json!({"idleAfter": "1s", "idleAction": "Delete"}),
        true,
    );
    script_inspection(&s.fake, "doomed", FakeWorkspace::default());
    s.rounds(1).await;
    assert!(
        s.store.get(Kind::Project, "doomed").is_some(),
        "one pass must not act"
    );
    // The re-check writes what it found just before deleting: the deletion still goes ahead.
    s.round().await;
    assert!(s.store.get(Kind::Project, "doomed").is_none());
    assert_eq!(s.metric("berth_reap_actions_total{action=\"delete\"}"), 1.0);
}

/// A project stored before durations were capped (admission refuses these now) is decided on
/// like any other: nothing panics, and what status says of it reads back.
#[tokio::test(start_paused = true)]
async fn a_project_stored_with_a_huge_duration_never_panics_a_pass() {
    let s = setup();
    s.project(
        "ancient",
        json!({"idleAfter": "100000000d", "idleAction": "Delete", "maxAge": "99999999999w"}),
        true,
    );
    script_inspection(&s.fake, "ancient", FakeWorkspace::default());
    s.running_project("idle", FakeWorkspace::default());
    s.rounds(3).await;
    let status = s.status("ancient");
    assert_eq!(status["reap"]["nextAction"], "Delete", "{status}");
    let decoded: ProjectStatus = serde_json::from_value(status.clone()).unwrap();
    let next = decoded.reap.and_then(|r| r.next_action_at).unwrap();
    assert!(next > s.now() + chrono::Duration::days(36_000), "{next}");
    assert!(s.status("ancient")["reap"]["idledAt"].is_null());
    // The other project is reaped as usual in the same passes.
    assert!(s.status("idle")["reap"]["idledAt"].is_string());
}

/// An interactive shell is activity for as long as it is open, not only when it starts: a
/// project is never idled under a person's open `exec -it`, and idles as usual once it closes.
#[tokio::test(start_paused = true)]
async fn an_open_interactive_exec_keeps_the_project_active_until_it_closes() {
    let s = setup();
    s.running_project("shell", FakeWorkspace::default());
    let uid = s
        .store
        .get(Kind::Project, "shell")
        .unwrap()
        .uid()
        .to_string();
    let session = s.activity_log.open(&uid, "exec");
    // Hours pass with the shell open and nothing else happening in the workspace.
    for _ in 0..6 {
        tokio::time::advance(Duration::from_secs(1800)).await;
        s.round().await;
        let status = s.status("shell");
        assert!(
            status["reap"]["idledAt"].is_null(),
            "idled under an open shell: {status}"
        );
        assert_eq!(status["activity"]["source"], "exec", "{status}");
        let last: DateTime<Utc> =
            serde_json::from_value(status["activity"]["lastActiveAt"].clone()).unwrap();
        assert!(s.now() - last < chrono::Duration::seconds(5), "{status}");
    }
    drop(session);
    s.rounds(3).await;
    let status = s.status("shell");
    assert!(
        status["reap"]["idledAt"].is_string(),
        "idled once closed: {status}"
    );
}

/// One of the daemon's passes panicking (here the activity pass, on an inspection that broke
/// once) is counted by pass, and the passes after it, and the next round, still run.
#[tokio::test(start_paused = true)]
async fn a_panicking_pass_is_counted_and_the_next_pass_runs() {
    let s = setup();
    s.running_project("p", FakeWorkspace::default());
    let armed = Arc::new(std::sync::atomic::AtomicBool::new(true));
    s.fake.on_exec(move |_, _| {
        if armed.swap(false, std::sync::atomic::Ordering::SeqCst) {
            panic!("the inspection broke");
        }
        None
    });
    let Setup {
        _dir,
        store,
        metrics,
        passes,
        ..
    } = s;
    let health = Arc::new(super::super::Health::default());
    let shutdown = tokio_util::sync::CancellationToken::new();
    let interval = Duration::from_secs(30);
    let task = tokio::spawn(super::super::run(
        Arc::new(passes),
        interval,
        shutdown.clone(),
        health.clone(),
    ));
    tokio::time::sleep(interval + Duration::from_secs(1)).await;
    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(3600), task)
        .await
        .expect("the loop stops on shutdown")
        .expect("the loop itself never panics");
    let text = metrics.encode();
    let sample = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse::<f64>().ok())
            .unwrap_or_else(|| panic!("no {name} in\n{text}"))
    };
    assert_eq!(
        sample("berth_scheduler_panics_total{pass=\"activity\"}"),
        1.0
    );
    for pass in ["resync", "reap", "housekeeping"] {
        assert_eq!(
            sample(&format!("berth_scheduler_panics_total{{pass=\"{pass}\"}}")),
            0.0
        );
    }
    for pass in ["activity", "reap", "housekeeping"] {
        assert_eq!(
            sample(&format!(
                "berth_scheduler_pass_duration_seconds_count{{pass=\"{pass}\"}}"
            )),
            2.0,
            "{pass} ran in both rounds"
        );
    }
    // The second round's inspection went through and was recorded.
    let status = store.get(Kind::Project, "p").unwrap().status.value();
    assert!(status["unsavedWork"].is_object(), "{status}");
}

/// One project whose reaping panics (here its re-check breaks) does not stop the reap pass:
/// the projects after it are still reaped, and the panic is counted.
#[tokio::test(start_paused = true)]
async fn a_project_whose_reaping_panics_does_not_stop_the_others() {
    let s = setup();
    s.running_project("a-broken", FakeWorkspace::default());
    s.running_project("b-fine", FakeWorkspace::default());
    let armed = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let trigger = armed.clone();
    s.fake.on_exec(move |name, _| {
        if name == "a-broken" && trigger.load(std::sync::atomic::Ordering::SeqCst) {
            panic!("the re-check broke");
        }
        None
    });
    s.rounds(1).await;
    assert_eq!(s.status("b-fine")["reap"]["nextAction"], "Stop");
    // The second agreeing pass acts, re-checking each project right before.
    tokio::time::advance(Duration::from_secs(1)).await;
    s.passes.run(Pass::Activity).await;
    armed.store(true, std::sync::atomic::Ordering::SeqCst);
    s.passes.run(Pass::Reap).await;
    assert!(
        s.status("b-fine")["reap"]["idledAt"].is_string(),
        "{}",
        s.status("b-fine")
    );
    assert!(s.status("a-broken")["reap"]["idledAt"].is_null());
    assert_eq!(s.metric("berth_scheduler_panics_total{pass=\"reap\"}"), 1.0);
}

/// A deleted project's events stay listed for `events.retention` after it went, then the
/// housekeeping pass prunes them; a live project's events stay whatever their age.
#[tokio::test(start_paused = true)]
async fn housekeeping_prunes_the_events_of_objects_gone_past_the_retention() {
    let mut s = setup();
    s.passes = s.passes.with_event_retention(Duration::from_secs(3600));
    // No containers: housekeeping has no orphan to report about the one that went.
    for name in ["gone", "live"] {
        s.store
            .apply(
                Desired::project(name, json!({"image": "berth-base"})),
                Commit::Persist,
            )
            .unwrap();
    }
    for name in ["gone", "live"] {
        let object = s.store.get(Kind::Project, name).unwrap();
        s.store
            .record_or_warn(&object, EventType::Warning, "Tested", "an event");
    }
    s.store
        .delete(
            Kind::Project,
            "gone",
            None,
            BTreeMap::new(),
            Commit::Persist,
        )
        .unwrap();
    assert!(s.store.get(Kind::Project, "gone").is_none());
    let listed = |name: &str| s.store.events_for(Kind::Project, name).unwrap().len();

    tokio::time::advance(Duration::from_secs(3500)).await;
    s.passes.run(Pass::Housekeeping).await;
    assert_eq!(listed("gone"), 1, "kept within the retention");

    tokio::time::advance(Duration::from_secs(200)).await;
    s.passes.run(Pass::Housekeeping).await;
    assert_eq!(listed("gone"), 0, "pruned after the retention");
    assert_eq!(listed("live"), 1, "a live object's events stay");
}

/// A fleet where nothing happens costs no store write and no watch event, however many passes
/// look at it; a file touched in one workspace shows in its `lastActiveAt` within two passes.
#[tokio::test(start_paused = true)]
async fn a_steady_fleet_writes_nothing_until_a_file_is_touched() {
    let s = setup();
    let kept = json!({"idleAfter": "30d", "idleAction": "Stop"});
    for name in ["steady-a", "steady-b", "steady-c"] {
        s.project(name, kept.clone(), true);
        script_inspection(&s.fake, name, FakeWorkspace::default());
    }
    s.project("steady-dirty", kept.clone(), true);
    script_inspection(&s.fake, "steady-dirty", dirty(2));
    s.project("steady-blocked", kept, true);
    script_inspection(
        &s.fake,
        "steady-blocked",
        FakeWorkspace {
            agent_json: Some(r#"{"state":"blocked","message":"may I?"}"#.into()),
            ports: vec![8080],
            ..FakeWorkspace::default()
        },
    );
    // The first passes record what they find.
    for _ in 0..2 {
        tokio::time::advance(Duration::from_secs(30)).await;
        s.round().await;
    }
    let first = s.status("steady-a");
    assert!(
        time_at(&first, "/activity/inspectedAt").is_some(),
        "{first}"
    );
    assert_eq!(protected_by(&s.status("steady-blocked")), ["AgentBlocked"]);

    let version = s.store.resource_version();
    let mut changes = s.store.subscribe();
    let inspections = s.metric("berth_scheduler_inspections_total{result=\"ok\"}");
    for _ in 0..5 {
        tokio::time::advance(Duration::from_secs(30)).await;
        s.round().await;
    }
    assert_eq!(s.store.resource_version(), version, "a steady fleet wrote");
    assert!(
        matches!(
            changes.try_recv(),
            Err(tokio::sync::broadcast::error::TryRecvError::Empty)
        ),
        "a steady fleet made a watch event"
    );
    assert_eq!(
        s.metric("berth_scheduler_inspections_total{result=\"ok\"}"),
        inspections + 25.0,
        "every pass still inspected every project"
    );
    assert_eq!(s.status("steady-a"), first);

    // A file touched in one workspace: its lastActiveAt moves, and only it is written.
    let touched = s.now();
    script_inspection(
        &s.fake,
        "steady-b",
        FakeWorkspace {
            newest_mtime: Some(touched),
            ..FakeWorkspace::default()
        },
    );
    for _ in 0..2 {
        tokio::time::advance(Duration::from_secs(30)).await;
        s.round().await;
    }
    let status = s.status("steady-b");
    assert_eq!(
        time_at(&status, "/activity/lastActiveAt"),
        Some(touched),
        "{status}"
    );
    assert_eq!(status["activity"]["source"], "files");
    let mut written = BTreeSet::new();
    while let Ok(change) = changes.try_recv() {
        written.insert(change.name);
    }
    assert_eq!(written, BTreeSet::from(["steady-b".to_string()]));
}

/// Marks `name` Ready since `since`, as the reconciler records it.
fn ready_since(s: &Setup, name: &str, since: DateTime<Utc>) {
    s.patch_status(
        name,
        json!({"conditions": [{"type": "Ready", "status": "True", "reason": "Ready",
            "message": "", "lastTransitionTime": since.to_rfc3339(), "observedGeneration": 1}]}),
    );
}

fn inspections_of(fake: &FakeRuntime, name: &str) -> usize {
    fake.calls()
        .iter()
        .filter(|c| c.as_str() == format!("exec {name}"))
        .count()
}

#[tokio::test(start_paused = true)]
async fn a_project_just_made_ready_is_left_to_settle_before_its_first_inspection() {
    let s = setup();
    let s = Setup {
        passes: s.passes.with_settle(Duration::from_secs(600)),
        ..s
    };
    s.running_project("fresh", FakeWorkspace::default());
    s.running_project("settled", FakeWorkspace::default());
    ready_since(&s, "fresh", s.now());
    ready_since(&s, "settled", s.now() - chrono::Duration::hours(1));

    s.rounds(1).await;
    assert_eq!(inspections_of(&s.fake, "fresh"), 0);
    assert!(inspections_of(&s.fake, "settled") > 0);
    // Not looked at is not "could not be inspected": no verdict, no protection, no event.
    let fresh = s.status("fresh");
    assert!(fresh["reap"].is_null(), "{fresh}");
    assert!(condition(&fresh, "ReapProtected").is_null(), "{fresh}");
    assert_eq!(s.status("settled")["reap"]["nextAction"], "Stop");

    tokio::time::advance(Duration::from_secs(600)).await;
    s.rounds(1).await;
    assert!(inspections_of(&s.fake, "fresh") > 0);
    assert_eq!(s.status("fresh")["reap"]["nextAction"], "Stop");
}

#[tokio::test(start_paused = true)]
async fn inspections_wait_a_few_settle_periods_at_most_for_a_saturated_reconciler() {
    let s = setup();
    let settle = Duration::from_secs(60);
    let s = Setup {
        passes: s.passes.with_settle(settle),
        ..s
    };
    s.running_project("p", FakeWorkspace::default());
    ready_since(&s, "p", s.now() - chrono::Duration::hours(1));
    // Work is due that no worker took: an apply converging.
    s.passes.queue.request_now("applied");
    assert!(s.passes.queue.saturated());

    let round = s.round();
    tokio::pin!(round);
    tokio::select! {
        _ = &mut round => panic!("the round did not wait for the reconciler"),
        _ = tokio::time::sleep(settle * 2) => {}
    }
    assert_eq!(inspections_of(&s.fake, "p"), 0, "inspected while saturated");
    s.passes.queue.forget("applied");
    round.await;
    assert!(inspections_of(&s.fake, "p") > 0);
    // The round's wait is told to the loop, which does not count it toward an overrun.
    let waited = s.passes.take_waited();
    assert!(waited >= settle * 2, "{waited:?}");
    assert_eq!(s.passes.take_waited(), Duration::ZERO, "told once");

    // Saturated for good: inspected after four settle periods all the same.
    s.passes.queue.request_now("stuck");
    let started = tokio::time::Instant::now();
    tokio::time::advance(Duration::from_secs(600)).await;
    let before = inspections_of(&s.fake, "p");
    s.round().await;
    assert!(inspections_of(&s.fake, "p") > before);
    assert!(started.elapsed() >= settle * 4);
}

#[tokio::test]
async fn the_resync_pass_runs_the_controllers_resync_when_given_it() {
    let s = setup();
    s.running_project("p", FakeWorkspace::default());
    let runs = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = runs.clone();
    let s = Setup {
        passes: s.passes.with_resync(Arc::new(move || {
            counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Box::pin(async { None })
        })),
        ..s
    };
    s.passes.run(Pass::Resync).await;
    assert_eq!(runs.load(std::sync::atomic::Ordering::SeqCst), 1);
    assert_eq!(s.passes.queue.depth(), 0, "nothing requested besides it");
}

#[tokio::test(start_paused = true)]
async fn housekeeping_takes_the_resyncs_list_and_lists_only_without_one() {
    let s = setup();
    s.project("kept", json!({"idleAfter": "1h"}), true);
    let kept = s
        .store
        .get(Kind::Project, "kept")
        .unwrap()
        .uid()
        .to_string();
    let listed = vec![
        labelled("leftover", Some("uid-gone")),
        labelled("came-back", Some(kept.as_str())),
    ];
    let s = Setup {
        passes: s.passes.with_resync(Arc::new(move || {
            // As the controller's list saw them: "came-back" was restored since.
            let strays =
                crate::reconcile::Strays::of(&listed, |_| false, tokio::time::Instant::now());
            Box::pin(async move { Some(Arc::new(strays)) })
        })),
        ..s
    };
    s.passes.run(Pass::Resync).await;
    s.passes.run(Pass::Housekeeping).await;
    assert_eq!(s.fake.count("list_instances"), 0, "listed again");
    assert_eq!(s.metric("berth_orphan_containers"), 1.0);
    let reported: Vec<String> = s
        .store
        .recent_events(100)
        .unwrap()
        .into_iter()
        .filter(|e| e.reason == "OrphanedContainer")
        .map(|e| e.involved_object.name)
        .collect();
    assert_eq!(reported, ["leftover"]);

    // A round whose resync did not run (or whose list failed) lists for itself.
    s.passes.run(Pass::Housekeeping).await;
    assert_eq!(s.fake.count("list_instances"), 1);
}

#[tokio::test(start_paused = true)]
async fn the_trash_is_swept_neither_right_after_start_nor_while_the_reconciler_is_saturated() {
    let s = setup();
    let settle = Duration::from_secs(60);
    let trash = Arc::new(crate::trash::Trash::new(
        s.store.clone(),
        "default",
        crate::trash::TrashSettings::default(),
    ));
    let s = Setup {
        passes: s.passes.with_settle(settle).with_trash(trash),
        ..s
    };
    s.passes.run(Pass::Housekeeping).await;
    assert_eq!(s.fake.count("list_volumes"), 0, "swept right after start");

    tokio::time::advance(settle).await;
    s.passes.queue.request_now("applied");
    s.passes.run(Pass::Housekeeping).await;
    assert_eq!(s.fake.count("list_volumes"), 0, "swept while saturated");

    s.passes.queue.forget("applied");
    s.passes.run(Pass::Housekeeping).await;
    assert_eq!(s.fake.count("list_volumes"), 1, "the sweep stayed due");
}
