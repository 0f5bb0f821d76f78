use crate::store::Commit;
use serde_json::json;

use super::*;
use crate::store::Desired;
use crate::testing::fake_runtime::FakeRuntime;
use serde_json::Value;

pub(super) struct Setup {
    _dir: tempfile::TempDir,
    pub(super) store: Arc<Store>,
    pub(super) fake: Arc<FakeRuntime>,
    pub(super) steps: Arc<AgentSteps>,
}

fn setup(spec: Value) -> Setup {
    setup_with(spec, AgentSettings::default())
}

/// AgentProfile `name`, home `/root/.<name>`, installed when `check` passes, running `true`.
fn apply_profile(store: &Store, name: &str, check: &str) {
    let spec = json!({"home": format!("/root/.{name}"), "install": {"check": check},
        "runner": {"command": ["true"]}});
    store
        .apply(Desired::of(Kind::AgentProfile, name, spec), Commit::Persist)
        .unwrap();
}

/// Project `p` with `spec` and the AgentProfile `shell`, over a fake runtime.
pub(super) fn setup_with(spec: Value, settings: AgentSettings) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(Store::open(&dir.path().join("berth.db")).unwrap());
    let secrets = Arc::new(Secrets::open(store.clone(), dir.path()).unwrap());
    store
        .apply(Desired::project("p", spec), Commit::Persist)
        .unwrap();
    apply_profile(&store, "shell", "true");
    let fake = Arc::new(FakeRuntime::new());
    let steps = Arc::new(AgentSteps::new(
        store.clone(),
        secrets,
        fake.clone(),
        settings,
    ));
    Setup {
        _dir: dir,
        store,
        fake,
        steps,
    }
}

/// Puts the project's container in the fake, in `status`.
fn container(setup: &Setup, status: crate::runtime::InstanceStatus) {
    setup.fake.insert_instance(crate::runtime::Instance {
        name: "p".into(),
        status,
        status_code: 0,
        location: "none".into(),
        profiles: Vec::new(),
        config: BTreeMap::new(),
        devices: BTreeMap::new(),
        created_at: None,
        last_used_at: None,
        state: None,
    });
}

fn write_status(setup: &Setup, status: Value) {
    setup
        .store
        .put_status(Kind::Project, "p", None, status)
        .unwrap();
}

fn condition(setup: &Setup, type_: &str) -> Option<berth_api::Condition> {
    let object = setup.store.get(Kind::Project, "p").unwrap();
    berth_api::find_condition(&decode_status(&object).conditions, type_).cloned()
}

async fn run(setup: &Setup, step: Step) -> StepOutcome {
    let object = setup.store.get(Kind::Project, "p").unwrap();
    let spec: ProjectSpec = object.spec.decode().unwrap();
    let context = StepContext {
        name: "p",
        uid: object.uid(),
        spec: &spec,
    };
    setup.steps.run(&context, step).await.unwrap()
}

fn reason(outcome: &StepOutcome) -> &str {
    match outcome {
        StepOutcome::Waiting { reason, .. } => reason,
        StepOutcome::Done => "Done",
    }
}

#[tokio::test]
async fn a_missing_profile_waits_with_profile_not_found() {
    let setup = setup(json!({"agent": "nowhere"}));
    let outcome = run(&setup, Step::Bootstrapped).await;
    assert_eq!(reason(&outcome), PROFILE_NOT_FOUND);
    assert_eq!(reason(&run(&setup, Step::Seeded).await), PROFILE_NOT_FOUND);
}

#[tokio::test]
async fn a_silent_agent_is_brief_not_acknowledged_past_the_deadline() {
    let setup = setup(json!({"agent": "shell", "brief": "hi"}));
    let started = |minutes: i64| (Utc::now() - chrono::Duration::minutes(minutes)).to_rfc3339();
    let write = |status: Value| write_status(&setup, status);

    write(json!({"step": "RunnerStarted", "briefId": "b-1",
        "controller": {"stepStartedAt": started(1)}}));
    assert_eq!(reason(&run(&setup, Step::Briefed).await), "RunnerStarted");

    write(json!({"step": "RunnerStarted", "briefId": "b-1",
        "controller": {"stepStartedAt": started(10)}}));
    assert_eq!(
        reason(&run(&setup, Step::Briefed).await),
        BRIEF_NOT_ACKNOWLEDGED
    );

    // A brief the agent finished before a boot is not waited for again.
    write(json!({"step": "RunnerStarted", "briefId": "b-1",
        "agent": {"state": "done", "briefId": "b-1"},
        "controller": {"stepStartedAt": started(10)}}));
    assert_eq!(reason(&run(&setup, Step::Briefed).await), "Done");
}

#[tokio::test]
async fn the_brief_id_is_recorded_before_the_runner_starts() {
    let setup = setup(json!({"agent": "shell", "brief": "hi"}));
    container(&setup, crate::runtime::InstanceStatus::Running);
    let object = setup.store.get(Kind::Project, "p").unwrap();
    let expected = brief_id(object.uid(), "hi");
    // What the store holds at the moment the runner is started.
    let store = setup.store.clone();
    let seen = Arc::new(Mutex::new(None));
    let seen_by_exec = seen.clone();
    setup.fake.on_exec(move |_, request| {
        let starts_runner = request.command.iter().any(|a| a.contains("PID_FILE"));
        if starts_runner {
            let status = store.get(Kind::Project, "p").unwrap().status.clone();
            *seen_by_exec.lock().unwrap() = status.get("briefId");
        }
        starts_runner.then(|| {
            Ok(crate::runtime::ExecOutput {
                exit_code: 0,
                stdout: b"started 42\n".to_vec(),
                stderr: Vec::new(),
            })
        })
    });
    assert_eq!(run(&setup, Step::RunnerStarted).await, StepOutcome::Done);
    assert_eq!(*seen.lock().unwrap(), Some(json!(expected)));
}

#[tokio::test]
async fn a_new_brief_is_due_again_and_waits_for_the_previous_runner() {
    let setup = setup(json!({"agent": "shell", "brief": "second"}));
    container(&setup, crate::runtime::InstanceStatus::Running);
    let object = setup.store.get(Kind::Project, "p").unwrap();
    let (uid, first) = (object.uid().to_string(), brief_id(object.uid(), "first"));
    let spec: ProjectSpec = object.spec.decode().unwrap();
    let context = StepContext {
        name: "p",
        uid: &uid,
        spec: &spec,
    };
    write_status(
        &setup,
        json!({"step": "Briefed", "briefId": first,
        "agent": {"state": "blocked", "briefId": first, "message": "which?"},
        "provisionedProfiles": setup.steps.profile_revisions(&spec)}),
    );

    // Briefed for the old brief is not Briefed for the new one: back to before the runner.
    let (back, why) = setup.steps.outdated(&context, Step::Briefed).unwrap();
    assert_eq!(back, Step::Seeded);
    assert!(why.contains(&first), "{why}");
    assert_eq!(setup.steps.outdated(&context, Step::Seeded), None);

    // The previous brief's runner still works: no second runner, and the status says why.
    let busy = format!("busy 42 {first}\n");
    setup.fake.on_exec(move |_, request| {
        let starts_runner = request.command.iter().any(|a| a.contains("PID_FILE"));
        starts_runner.then(|| {
            Ok(crate::runtime::ExecOutput {
                exit_code: 0,
                stdout: busy.clone().into_bytes(),
                stderr: Vec::new(),
            })
        })
    });
    let outcome = setup
        .steps
        .run(&context, Step::RunnerStarted)
        .await
        .unwrap();
    let StepOutcome::Waiting {
        reason, message, ..
    } = outcome
    else {
        panic!("{outcome:?}");
    };
    assert_eq!(reason, RUNNER_BUSY);
    assert!(
        message.contains(&first) && message.contains("berth answer"),
        "{message}"
    );
    let object = setup.store.get(Kind::Project, "p").unwrap();
    let second = brief_id(object.uid(), "second");
    assert_eq!(object.status.value()["briefId"], second.as_str());
    assert_eq!(setup.steps.outdated(&context, Step::Briefed), None);
}

#[tokio::test]
async fn a_changed_profile_is_provisioned_again() {
    let setup = setup(json!({"agent": "shell"}));
    container(&setup, crate::runtime::InstanceStatus::Running);
    setup.fake.on_exec(|_, request| {
        let is_check = request.command.iter().any(|a| a.contains("passes()"));
        is_check.then(|| {
            Ok(crate::runtime::ExecOutput {
                exit_code: 0,
                stdout: b"reported v1\npresent\n".to_vec(),
                stderr: Vec::new(),
            })
        })
    });
    let shell = |extra: Value| {
        let mut spec = json!({"home": "/root/.shell", "install": {"check": "true"},
            "runner": {"command": ["true"]}});
        spec.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        setup
            .store
            .apply(
                Desired::of(Kind::AgentProfile, "shell", spec),
                Commit::Persist,
            )
            .unwrap();
    };
    let outdated = || {
        let object = setup.store.get(Kind::Project, "p").unwrap();
        let spec: ProjectSpec = object.spec.decode().unwrap();
        let context = StepContext {
            name: "p",
            uid: object.uid(),
            spec: &spec,
        };
        setup.steps.outdated(&context, Step::Briefed)
    };

    // A status from before the revisions were recorded provisions once more.
    let (back, why) = outdated().unwrap();
    assert_eq!(back, Step::Reachable);
    assert!(why.contains("not on record"), "{why}");

    assert_eq!(run(&setup, Step::Bootstrapped).await, StepOutcome::Done);
    assert_eq!(outdated(), None);
    // The same profile applied again is no change.
    shell(json!({}));
    assert_eq!(outdated(), None);

    shell(json!({"instructions": {"target": "/workspace/AGENTS.md", "content": "new"}}));
    assert_eq!(
        outdated(),
        Some((
            Step::Reachable,
            "provisioning again: AgentProfile shell changed".to_string()
        ))
    );
    assert_eq!(run(&setup, Step::Bootstrapped).await, StepOutcome::Done);
    assert_eq!(outdated(), None);
    // Skills are part of the profile: changing them provisions and seeds again.
    shell(
        json!({"instructions": {"target": "/workspace/AGENTS.md", "content": "new"},
        "skills": [{"path": "/srv/skills/pdf", "target": ".claude/skills"}]}),
    );
    assert_eq!(
        outdated(),
        Some((
            Step::Reachable,
            "provisioning again: AgentProfile shell changed".to_string()
        ))
    );
    assert_eq!(run(&setup, Step::Bootstrapped).await, StepOutcome::Done);
    assert_eq!(outdated(), None);

    // A profile the project names besides its agent counts too, added and dropped.
    apply_profile(&setup.store, "extra", "true");
    let project = |spec: Value| {
        setup
            .store
            .apply(Desired::project("p", spec), Commit::Persist)
            .unwrap();
    };
    project(json!({"agent": "shell", "agents": ["extra"]}));
    assert_eq!(
        outdated().map(|(_, why)| why).as_deref(),
        Some("provisioning again: AgentProfile extra added")
    );
    assert_eq!(run(&setup, Step::Bootstrapped).await, StepOutcome::Done);
    project(json!({"agent": "shell"}));
    assert_eq!(
        outdated().map(|(_, why)| why).as_deref(),
        Some("provisioning again: AgentProfile extra dropped")
    );
    // A profile not there (yet) is the steps' ProfileNotFound, not a change.
    project(json!({"agent": "shell", "agents": ["later"]}));
    assert_eq!(outdated(), None);
}

#[tokio::test]
async fn secrets_not_reaching_a_stopped_container_are_no_sync_failure() {
    let setup = setup(json!({}));
    container(&setup, crate::runtime::InstanceStatus::Stopped);
    // Ready as last recorded: the stop landed after the look at the phase.
    write_status(&setup, json!({"phase": "Ready", "step": "Reachable"}));
    let spec = ProjectSpec::default();
    assert!(setup.steps.sync_secrets("p", &spec, 0).await.is_ok());
    assert_eq!(condition(&setup, SECRETS_SYNCED), None);
    let object = setup.store.get(Kind::Project, "p").unwrap();
    assert!(
        setup
            .store
            .events_for(Kind::Project, "p")
            .unwrap()
            .is_empty()
    );
    assert_eq!(
        setup.steps.synced_revision(object.uid()),
        None,
        "synced again once it runs"
    );

    // Running, the same failure is one.
    setup
        .fake
        .set_status("p", crate::runtime::InstanceStatus::Running);
    setup.fake.on_exec(|_, _| {
        Some(Ok(crate::runtime::ExecOutput {
            exit_code: 1,
            stdout: Vec::new(),
            stderr: b"disk full".to_vec(),
        }))
    });
    assert!(setup.steps.sync_secrets("p", &spec, 0).await.is_err());
    let synced = condition(&setup, SECRETS_SYNCED).unwrap();
    assert_eq!(synced.status, ConditionStatus::False);
    assert_eq!(synced.reason, "SyncFailed");
}

/// With mirroring off (the default), secrets stay out of LXD's database, and what an
/// earlier mirroring put there is cleared; keys berth did not list are left alone.
#[tokio::test]
async fn unmirrored_secrets_are_cleared_from_the_lxd_environment() {
    let setup = setup(json!({}));
    setup.fake.insert_instance(crate::runtime::Instance {
        name: "p".into(),
        status: crate::runtime::InstanceStatus::Running,
        status_code: 0,
        location: "none".into(),
        profiles: Vec::new(),
        config: BTreeMap::from([
            (
                "environment.BERTH_SECRET_KEYS".to_string(),
                "OLD".to_string(),
            ),
            ("environment.OLD".to_string(), "leaked".to_string()),
            (
                "environment.NODE_ENV".to_string(),
                "development".to_string(),
            ),
        ]),
        devices: BTreeMap::new(),
        created_at: None,
        last_used_at: None,
        state: None,
    });
    assert!(!AgentSettings::default().mirror_secrets_to_lxd);
    let spec = ProjectSpec::default();
    setup.steps.sync_secrets("p", &spec, 0).await.unwrap();
    let config = setup.fake.instance("p").unwrap().config;
    assert_eq!(config.get("environment.OLD"), None, "{config:?}");
    assert_eq!(
        config.get("environment.BERTH_SECRET_KEYS"),
        None,
        "{config:?}"
    );
    assert_eq!(
        config.get("environment.NODE_ENV").map(String::as_str),
        Some("development")
    );
}

#[tokio::test]
async fn bootstrap_sets_provisioned_with_the_reason_of_a_failure() {
    let setup = setup(json!({"agent": "shell"}));
    container(&setup, crate::runtime::InstanceStatus::Running);
    let check_passes = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let passes = check_passes.clone();
    setup.fake.on_exec(move |_, request| {
        let is_check = request.command.iter().any(|a| a.contains("passes()"));
        is_check.then(|| {
            let ok = passes.load(std::sync::atomic::Ordering::SeqCst);
            Ok(crate::runtime::ExecOutput {
                exit_code: if ok { 0 } else { 20 },
                stdout: if ok {
                    b"reported v9\npresent\n".to_vec()
                } else {
                    Vec::new()
                },
                stderr: b"install.check failed".to_vec(),
            })
        })
    });
    assert_eq!(
        reason(&run(&setup, Step::Bootstrapped).await),
        "InstallFailed"
    );
    let provisioned = condition(&setup, condition_types::PROVISIONED).unwrap();
    assert_eq!(provisioned.status, ConditionStatus::False);
    assert_eq!(provisioned.reason, "InstallFailed");

    check_passes.store(true, std::sync::atomic::Ordering::SeqCst);
    assert_eq!(run(&setup, Step::Bootstrapped).await, StepOutcome::Done);
    let provisioned = condition(&setup, condition_types::PROVISIONED).unwrap();
    assert_eq!(provisioned.status, ConditionStatus::True);
    assert_eq!(provisioned.reason, BOOTSTRAPPED);
    assert_eq!(provisioned.message, "verified shell: v9");
}

/// A profile listed only in `agents` that fails is reported and blocks nothing; the
/// project's own agent profile must succeed.
#[tokio::test]
async fn a_failing_best_effort_profile_is_reported_and_blocks_nothing() {
    let setup = setup(json!({"agent": "shell", "agents": ["extra"]}));
    apply_profile(&setup.store, "extra", "extra-check");
    container(&setup, crate::runtime::InstanceStatus::Running);
    let failing = Arc::new(std::sync::Mutex::new("extra-check"));
    let which = failing.clone();
    setup.fake.on_exec(move |_, request| {
        let is_check = request.command.iter().any(|a| a.contains("passes()"));
        let fails = *which.lock().unwrap();
        let this_one = request.command.iter().any(|a| a == fails);
        is_check.then(|| {
            Ok(crate::runtime::ExecOutput {
                exit_code: if this_one { 20 } else { 0 },
                stdout: if this_one {
                    Vec::new()
                } else {
                    b"reported v9\npresent\n".to_vec()
                },
                stderr: b"install.check failed".to_vec(),
            })
        })
    });
    assert_eq!(run(&setup, Step::Bootstrapped).await, StepOutcome::Done);
    let provisioned = condition(&setup, condition_types::PROVISIONED).unwrap();
    assert_eq!(provisioned.status, ConditionStatus::False);
    assert_eq!(provisioned.reason, PROFILE_FAILED);
    assert!(
        provisioned
            .message
            .starts_with("verified shell: v9; profile extra failed"),
        "{}",
        provisioned.message
    );

    // The project's own agent failing fails the step.
    *failing.lock().unwrap() = "true";
    assert_eq!(
        reason(&run(&setup, Step::Bootstrapped).await),
        "InstallFailed"
    );
}

/// Answers the Seeded probe from the fake's files, as the script reads the container.
fn probe_from_files(fake: &Arc<FakeRuntime>) {
    let files = Arc::downgrade(fake);
    fake.on_exec(move |name, request| {
        let script = request.command.get(2)?;
        if !script.contains("git yes") {
            return None;
        }
        let fake = files.upgrade()?;
        let mut out = String::from("git no\n");
        for path in request.command.iter().skip(4) {
            match fake.file(name, path) {
                Some(content) => out.push_str(&format!("{} {path}\n", agent::sha256_hex(&content))),
                None => out.push_str(&format!("- {path}\n")),
            }
        }
        Some(Ok(crate::runtime::ExecOutput {
            exit_code: 0,
            stdout: out.into_bytes(),
            stderr: Vec::new(),
        }))
    });
}

#[tokio::test]
async fn skills_are_placed_recorded_refreshed_and_a_persons_change_is_kept() {
    let host = tempfile::tempdir().unwrap();
    let roots = host.path().join("skills");
    let pdf = roots.join("pdf");
    std::fs::create_dir_all(pdf.join("ref")).unwrap();
    std::fs::write(pdf.join("SKILL.md"), "# PDF v1\n").unwrap();
    std::fs::write(pdf.join("ref/forms.md"), "forms\n").unwrap();
    let settings = AgentSettings {
        file_roots: FileRoots::new(vec![roots.clone()]),
        ..AgentSettings::default()
    };
    let setup = setup_with(json!({"agent": "shell", "brief": "first"}), settings);
    let skill = json!([{"path": pdf.display().to_string(), "target": ".claude/skills"}]);
    setup
        .store
        .apply(
            Desired::of(
                Kind::AgentProfile,
                "shell",
                json!({"home": "/root/.shell", "install": {"check": "true"},
                    "skills": skill, "runner": {"command": ["true"]}}),
            ),
            Commit::Persist,
        )
        .unwrap();
    container(&setup, crate::runtime::InstanceStatus::Running);
    probe_from_files(&setup.fake);
    let at = |rel: &str| format!("/workspace/.claude/skills/pdf/{rel}");
    let in_container = |rel: &str| {
        setup
            .fake
            .file("p", &at(rel))
            .map(|c| String::from_utf8(c).unwrap())
    };
    let seeded = || decode_status(&setup.store.get(Kind::Project, "p").unwrap()).seeded_files;

    assert_eq!(run(&setup, Step::Seeded).await, StepOutcome::Done);
    assert_eq!(in_container("SKILL.md").as_deref(), Some("# PDF v1\n"));
    assert_eq!(in_container("ref/forms.md").as_deref(), Some("forms\n"));
    let first = seeded();
    assert_eq!(
        first.get(&at("SKILL.md")).map(String::as_str),
        Some(agent::sha256_hex(b"# PDF v1\n").as_str())
    );
    assert!(first.contains_key(&at("ref/forms.md")));

    // A new brief sends the project back so that Seeded places the skills again.
    let object = setup.store.get(Kind::Project, "p").unwrap();
    let first_brief = brief_id(object.uid(), "first");
    write_status(
        &setup,
        json!({"step": "Briefed", "briefId": first_brief, "seededFiles": first,
            "provisionedProfiles": setup.steps.profile_revisions(&ProjectSpec {
                agent: Some("shell".into()), ..ProjectSpec::default() })}),
    );
    setup
        .store
        .apply(
            Desired::project("p", json!({"agent": "shell", "brief": "second"})),
            Commit::Persist,
        )
        .unwrap();
    let object = setup.store.get(Kind::Project, "p").unwrap();
    let spec: ProjectSpec = object.spec.decode().unwrap();
    let context = StepContext {
        name: "p",
        uid: object.uid(),
        spec: &spec,
    };
    let (back, _) = setup.steps.outdated(&context, Step::Briefed).unwrap();
    assert_eq!(back, Step::CheckedOut, "Seeded runs before the new brief");

    // Meanwhile a person edited a skill file, and the source changed: the person's file
    // stays, a file the source dropped goes, a new one comes.
    use crate::runtime::Runtime;
    setup
        .fake
        .file_write(
            "p",
            &crate::runtime::FileWrite {
                path: at("SKILL.md"),
                content: b"# PDF, my notes\n".to_vec(),
                uid: 0,
                gid: 0,
                mode: 0o644,
            },
        )
        .await
        .unwrap();
    std::fs::write(pdf.join("SKILL.md"), "# PDF v2\n").unwrap();
    std::fs::remove_file(pdf.join("ref/forms.md")).unwrap();
    std::fs::write(pdf.join("tables.md"), "tables\n").unwrap();
    assert_eq!(run(&setup, Step::Seeded).await, StepOutcome::Done);
    assert_eq!(
        in_container("SKILL.md").as_deref(),
        Some("# PDF, my notes\n")
    );
    assert_eq!(in_container("ref/forms.md"), None);
    assert_eq!(in_container("tables.md").as_deref(), Some("tables\n"));
    let second = seeded();
    // The edited file keeps berth's record, so it counts as the person's work.
    assert_eq!(second.get(&at("SKILL.md")), first.get(&at("SKILL.md")));
    assert!(!second.contains_key(&at("ref/forms.md")));
    assert!(second.contains_key(&at("tables.md")));
    let events = setup.store.events_for(Kind::Project, "p").unwrap();
    let said = |reason: &str, words: &str| {
        events
            .iter()
            .any(|e| e.reason == reason && e.message.contains(words))
    };
    assert!(said("SeedSkipped", &at("SKILL.md")), "{events:?}");
    assert!(said("SkillRemoved", &at("ref/forms.md")), "{events:?}");

    // A source that cannot be read fails the step, naming the skill.
    std::fs::remove_dir_all(&pdf).unwrap();
    let outcome = run(&setup, Step::Seeded).await;
    let StepOutcome::Waiting {
        reason, message, ..
    } = outcome
    else {
        panic!("{outcome:?}");
    };
    assert_eq!(reason, "SkillFailed");
    assert!(
        message.starts_with("skill pdf of agent profile shell:"),
        "{message}"
    );
}
