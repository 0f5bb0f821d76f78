//! A fake agent for the fake runtime: it stands in for what runs inside an agent project's
//! container, so the real agent steps (`AgentSteps`) drive a project to Ready on a
//! `FakeRuntime` and follow its agent's reports afterwards.
//!
//! Installed on a `FakeRuntime`, it answers the execs the steps make the way berth's scripts
//! would in a container:
//! - a profile's install check (the script of `agent::bootstrap`) passes, printing
//!   [`FAKE_AGENT_VERSION`];
//! - the runner start (the script of `agent::start_runner`) answers `started PID`, `already PID
//!   running|exited` or `busy PID BRIEF` by the same rules: once per boot and brief, never two
//!   runners at once.
//!
//! A started runner then does what the script and the agent do in the container, through the
//! `Runtime` file API, so a watched `/run/berth` notices each write: the previous brief's report
//! and answer removed, the brief, its id and the runner's pid written, and the brief
//! acknowledged (`agent.json` saying `working` with the brief's id). Later reports are written
//! the same way with [`FakeAgent::report`]. Every other exec passes to the fake's other handlers.
//!
//! A runner belongs to the boot it was started in (the container's init pid): a restarted or
//! recreated container has none until the steps start it again.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};

use berth_api::AgentState;
use chrono::Utc;
use serde_json::{Value, json};

use crate::agent::{
    ANSWER_FILE, BRIEF_FILE, BRIEF_ID_FILE, RUNNER_PID_FILE, STATUS_FILE, sanitize_untrusted,
};
use crate::runtime::{ExecOutput, ExecRequest, FileWrite, Runtime, RuntimeError};
use crate::testing::fake_runtime::FakeRuntime;

/// What the fake's install checks print as the CLI's version.
pub const FAKE_AGENT_VERSION: &str = "fake-agent 1.0";

/// The offline `shell` AgentProfile as shipped (`manifests/agents/shell.yaml`).
const SHELL_PROFILE_MANIFEST: &str = include_str!("../../../manifests/agents/shell.yaml");

/// The spec of the `shell` AgentProfile berth ships, to store as an `AgentProfile` object.
pub fn shell_profile_spec() -> Value {
    let manifest: Value =
        serde_yaml::from_str(SHELL_PROFILE_MANIFEST).expect("manifests/agents/shell.yaml parses");
    manifest["spec"].clone()
}

/// The runner started in one container.
#[derive(Debug, Clone)]
struct FakeRunner {
    pid: u32,
    brief_id: String,
    /// The container's init pid when the runner started: another one is another boot.
    boot: i64,
    /// Until it reports `done` or `failed`.
    running: bool,
}

/// The fake agent of every container of one `FakeRuntime`. See the module documentation.
pub struct FakeAgent {
    runtime: Weak<FakeRuntime>,
    runners: Mutex<BTreeMap<String, FakeRunner>>,
    next_pid: AtomicU32,
    started: AtomicUsize,
}

impl std::fmt::Debug for FakeAgent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FakeAgent")
            .field("runners", &self.runners)
            .finish_non_exhaustive()
    }
}

impl FakeAgent {
    /// Installs the fake agent on `fake`: from now on it answers the install checks and runner
    /// starts of every container there.
    pub fn install(fake: &Arc<FakeRuntime>) -> Arc<FakeAgent> {
        let agent = Arc::new(FakeAgent {
            runtime: Arc::downgrade(fake),
            runners: Mutex::new(BTreeMap::new()),
            next_pid: AtomicU32::new(4000),
            started: AtomicUsize::new(0),
        });
        let answering = agent.clone();
        fake.on_exec(move |instance, request| answering.answer(instance, request));
        agent
    }

    /// The id of the brief the runner in `instance` was handed, if one was started.
    pub fn brief_id(&self, instance: &str) -> Option<String> {
        self.lock()
            .get(instance)
            .map(|runner| runner.brief_id.clone())
    }

    /// How many runners were started, over all containers.
    pub fn runners_started(&self) -> usize {
        self.started.load(Ordering::SeqCst)
    }

    /// The agent in `instance` reports `state` (with `message`) for the brief its runner was
    /// handed: `/run/berth/agent.json` written through the runtime, as the agent would write
    /// it. `done` and `failed` end the runner.
    pub async fn report(
        &self,
        instance: &str,
        state: AgentState,
        message: &str,
    ) -> crate::runtime::Result<()> {
        let Some(brief_id) = self.brief_id(instance) else {
            return Err(RuntimeError::NotFound {
                what: format!("the fake agent's runner in {instance}"),
                message: "no runner was started there".to_string(),
            });
        };
        let runtime = self.runtime()?;
        let title = runtime
            .file(instance, BRIEF_FILE)
            .map(|brief| brief_title(&String::from_utf8_lossy(&brief)))
            .unwrap_or_default();
        write(
            &*runtime,
            instance,
            STATUS_FILE,
            status_file(&brief_id, state, &title, message).as_bytes(),
        )
        .await?;
        if matches!(state, AgentState::Done | AgentState::Failed)
            && let Some(runner) = self.lock().get_mut(instance)
            && runner.brief_id == brief_id
        {
            runner.running = false;
        }
        Ok(())
    }

    fn runtime(&self) -> crate::runtime::Result<Arc<FakeRuntime>> {
        self.runtime
            .upgrade()
            .ok_or_else(|| RuntimeError::Transport {
                what: "the fake agent".to_string(),
                message: "its fake runtime is gone".to_string(),
            })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, FakeRunner>> {
        self.runners.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The exec handler: the answer of the scripts the fake agent plays, `None` for the rest.
    fn answer(
        &self,
        instance: &str,
        request: &ExecRequest,
    ) -> Option<crate::runtime::Result<ExecOutput>> {
        if is_install_check(request) {
            return Some(Ok(output(
                0,
                &format!("reported {FAKE_AGENT_VERSION}\npresent\n"),
                "",
            )));
        }
        let (brief_id, brief) = runner_start(request)?;
        Some(Ok(self.start(instance, brief_id, brief)))
    }

    /// The runner start script's decision, and a started runner's work spawned.
    fn start(&self, instance: &str, brief_id: &str, brief: &str) -> ExecOutput {
        let Ok(runtime) = self.runtime() else {
            return output(1, "", "the fake agent's runtime is gone");
        };
        let Ok(tokio) = tokio::runtime::Handle::try_current() else {
            return output(
                1,
                "",
                "the fake agent runs its runner on tokio: no runtime here",
            );
        };
        let boot = runtime
            .instance(instance)
            .and_then(|i| i.state)
            .map_or(0, |s| s.pid);
        let pid = {
            let mut runners = self.lock();
            if let Some(runner) = runners.get(instance).filter(|r| r.boot == boot) {
                let state = if runner.running { "running" } else { "exited" };
                if runner.brief_id == brief_id {
                    return output(0, &format!("already {} {state}\n", runner.pid), "");
                }
                if runner.running {
                    let busy = format!("busy {} {}\n", runner.pid, runner.brief_id);
                    return output(0, &busy, "");
                }
            }
            let pid = self.next_pid.fetch_add(1, Ordering::SeqCst);
            runners.insert(
                instance.to_string(),
                FakeRunner {
                    pid,
                    brief_id: brief_id.to_string(),
                    boot,
                    running: true,
                },
            );
            pid
        };
        self.started.fetch_add(1, Ordering::SeqCst);
        let (instance, brief_id, brief) = (
            instance.to_string(),
            brief_id.to_string(),
            brief.to_string(),
        );
        tokio.spawn(async move {
            if let Err(e) = run(&*runtime, &instance, pid, &brief_id, &brief).await {
                tracing::debug!(instance, error = %e, "the fake agent's runner stopped");
            }
        });
        output(0, &format!("started {pid}\n"), "")
    }
}

/// What the start script and then the runner do in the container, in order: the previous
/// brief's report and answer removed, the brief, its id and the pid written, and the brief
/// acknowledged.
async fn run(
    runtime: &dyn Runtime,
    instance: &str,
    pid: u32,
    brief_id: &str,
    brief: &str,
) -> crate::runtime::Result<()> {
    runtime.file_delete(instance, STATUS_FILE).await?;
    runtime.file_delete(instance, ANSWER_FILE).await?;
    write(runtime, instance, BRIEF_FILE, brief.as_bytes()).await?;
    write(runtime, instance, BRIEF_ID_FILE, brief_id.as_bytes()).await?;
    write(
        runtime,
        instance,
        RUNNER_PID_FILE,
        format!("{pid}\n").as_bytes(),
    )
    .await?;
    let acknowledged = status_file(brief_id, AgentState::Working, &brief_title(brief), "");
    write(runtime, instance, STATUS_FILE, acknowledged.as_bytes()).await
}

async fn write(
    runtime: &dyn Runtime,
    instance: &str,
    path: &str,
    content: &[u8],
) -> crate::runtime::Result<()> {
    let file = FileWrite {
        path: path.to_string(),
        content: content.to_vec(),
        uid: 0,
        gid: 0,
        mode: 0o644,
    };
    runtime.file_write(instance, &file).await
}

/// `agent.json` as the offline `shell` agent writes it.
fn status_file(brief_id: &str, state: AgentState, title: &str, message: &str) -> String {
    json!({
        "briefId": brief_id,
        "state": state.as_str(),
        "title": title,
        "message": message,
        "updatedAt": Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
    })
    .to_string()
}

/// The brief's first line, at most 60 characters, as the `shell` agent titles its work.
fn brief_title(brief: &str) -> String {
    sanitize_untrusted(brief.lines().next().unwrap_or("").trim())
        .chars()
        .take(60)
        .collect()
}

/// `agent::bootstrap`'s install script: `sh -c SCRIPT berth CHECK INSTALL LOCK`.
fn is_install_check(request: &ExecRequest) -> bool {
    matches!(request.command.as_slice(), [sh, c, script, ..]
        if sh == "sh" && c == "-c" && script.contains("passes()") && script.contains("install.check"))
}

/// `agent::start_runner`'s script, `sh -c SCRIPT berth BRIEF_ID BRIEF COMMAND...` with the
/// runner's files named in its environment: the brief id and the brief.
fn runner_start(request: &ExecRequest) -> Option<(&str, &str)> {
    if !(request.env.contains_key("PID_FILE") && request.env.contains_key("BRIEF_ID_FILE")) {
        return None;
    }
    match request.command.as_slice() {
        [sh, c, _script, _zero, brief_id, brief, ..] if sh == "sh" && c == "-c" => {
            Some((brief_id.as_str(), brief.as_str()))
        }
        _ => None,
    }
}

fn output(exit_code: i32, stdout: &str, stderr: &str) -> ExecOutput {
    ExecOutput {
        exit_code,
        stdout: stdout.as_bytes().to_vec(),
        stderr: stderr.as_bytes().to_vec(),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use berth_api::{AgentProfileSpec, Kind, Phase, ProjectStatus};
    use tokio_util::sync::CancellationToken;

    use super::*;
    use crate::agent::{self, RunnerOutcome};
    use crate::metrics::Metrics;
    use crate::reconcile::agent_steps::brief_id;
    use crate::reconcile::{AgentSettings, AgentSteps, ControllerSettings, spawn_controller};
    use crate::runtime::InstanceStatus;
    use crate::secrets::Secrets;
    use crate::store::{Commit, Desired, Store};
    use crate::testing::eventually;

    fn status(store: &Store, name: &str) -> ProjectStatus {
        store
            .get(Kind::Project, name)
            .and_then(|o| o.status.decode().ok())
            .unwrap_or_default()
    }

    /// The real controller with the real agent steps and their watch, as the daemon runs them,
    /// brings a briefed project to Ready on the fake agent's acknowledgement; the agent's
    /// `blocked` report written in the container then reaches `status.agent`.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_briefed_project_becomes_ready_and_its_blocked_agent_is_followed() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(Store::open(&dir.path().join("berth.db")).unwrap());
        let secrets = Arc::new(Secrets::open(store.clone(), dir.path()).unwrap());
        let fake = Arc::new(FakeRuntime::new());
        let agent = FakeAgent::install(&fake);
        store
            .apply(
                Desired::of(Kind::AgentProfile, "shell", shell_profile_spec()),
                Commit::Persist,
            )
            .unwrap();
        let brief = "Add a health check endpoint.\nBLOCK: which database?";
        store
            .apply(
                Desired::project(
                    "fa",
                    json!({"image": "berth-tiny", "agent": "shell", "brief": brief}),
                ),
                Commit::Persist,
            )
            .unwrap();

        let cancel = CancellationToken::new();
        let steps = Arc::new(AgentSteps::new(
            store.clone(),
            secrets,
            fake.clone(),
            AgentSettings::default(),
        ));
        let controller = spawn_controller(
            store.clone(),
            fake.clone(),
            Arc::new(Metrics::new()),
            ControllerSettings::default(),
            steps.clone(),
            cancel.child_token(),
        );
        let watch = steps.spawn_watch(controller.queue.clone(), cancel.child_token());

        eventually("fa Ready with its agent working", || {
            let s = status(&store, "fa");
            s.phase == Phase::Ready && s.agent.is_some_and(|a| a.state == AgentState::Working)
        })
        .await;
        let object = store.get(Kind::Project, "fa").unwrap();
        let handed = brief_id(object.uid(), brief);
        let s = status(&store, "fa");
        assert_eq!(s.brief_id.as_deref(), Some(handed.as_str()));
        assert_eq!(s.brief_acknowledged.as_deref(), Some(handed.as_str()));
        assert_eq!(s.title.as_deref(), Some("Add a health check endpoint."));
        assert_eq!(agent.brief_id("fa").as_deref(), Some(handed.as_str()));
        assert_eq!(agent.runners_started(), 1);
        assert_eq!(fake.file("fa", BRIEF_FILE).unwrap(), brief.as_bytes());
        // The steps' own files reached the container: the profile's instructions.
        assert!(fake.file("fa", "/workspace/AGENTS.md").is_some());

        agent
            .report("fa", AgentState::Blocked, "which database?")
            .await
            .unwrap();
        eventually("fa's agent blocked in status", || {
            status(&store, "fa")
                .agent
                .is_some_and(|a| a.state == AgentState::Blocked && a.message == "which database?")
        })
        .await;
        let s = status(&store, "fa");
        assert_eq!(s.phase, Phase::Ready);
        assert_eq!(s.agent.unwrap().brief_id.as_deref(), Some(handed.as_str()));
        assert_eq!(agent.runners_started(), 1, "the runner was started once");

        cancel.cancel();
        controller.shutdown().await;
        watch.await.unwrap();
    }

    /// The runner start answers as berth's start script does, read by its real parser.
    #[tokio::test]
    async fn runner_starts_answer_as_the_start_script_does() {
        let fake = Arc::new(FakeRuntime::new());
        let agent = FakeAgent::install(&fake);
        fake.insert_instance(crate::runtime::Instance::running("fa", Default::default()));
        let profile: AgentProfileSpec = serde_json::from_value(shell_profile_spec()).unwrap();
        let none = BTreeMap::new();
        let start = |id: &'static str| {
            let (fake, profile, none) = (fake.clone(), profile.clone(), none.clone());
            async move {
                agent::start_runner(&*fake, "fa", &profile, id, "brief", &none, &none)
                    .await
                    .unwrap()
            }
        };
        let eventually_acknowledged = |id: &'static str| {
            let fake = fake.clone();
            async move {
                eventually("the brief acknowledged", || {
                    fake.file("fa", STATUS_FILE).is_some_and(|f| {
                        let report = agent::parse_agent_status(&f);
                        report.status.brief_id.as_deref() == Some(id)
                            && report.status.state == AgentState::Working
                    })
                })
                .await
            }
        };

        let RunnerOutcome::Started { pid } = start("b-1").await else {
            panic!("not started");
        };
        eventually_acknowledged("b-1").await;
        assert_eq!(fake.file("fa", BRIEF_ID_FILE).unwrap(), b"b-1");
        assert_eq!(
            start("b-1").await,
            RunnerOutcome::AlreadyStarted { pid, running: true }
        );
        // Another brief waits for the running one.
        assert_eq!(
            start("b-2").await,
            RunnerOutcome::Busy {
                pid,
                brief_id: "b-1".to_string()
            }
        );
        agent.report("fa", AgentState::Done, "").await.unwrap();
        assert_eq!(
            start("b-1").await,
            RunnerOutcome::AlreadyStarted {
                pid,
                running: false
            }
        );
        let RunnerOutcome::Started { pid: second } = start("b-2").await else {
            panic!("b-2 not started");
        };
        assert_ne!(second, pid);
        eventually_acknowledged("b-2").await;

        // A new boot has no runner: the brief is started again.
        fake.set_status("fa", InstanceStatus::Stopped);
        fake.start_instance("fa", Duration::from_secs(1))
            .await
            .unwrap();
        assert!(matches!(start("b-2").await, RunnerOutcome::Started { .. }));
        assert_eq!(agent.runners_started(), 3);
    }
}
