//! The later steps performed for real: [`AgentSteps`] runs Bootstrapped, CheckedOut, Seeded,
//! RunnerStarted and Briefed through [`crate::agent`], and keeps a provisioned workspace in step
//! with its secrets, its brief and its agent's own report afterwards.
//!
//! What a step must remember (the files berth seeded, the brief id, the agent's report, the
//! `Provisioned` condition) is written into the project's status before the step goes on or is
//! called done. The reconciler's commit lays only the fields it changed onto the stored status,
//! so these records survive it.
//!
//! The module is three parts: the step executor (here), the watch that asks for a reconcile
//! when a provisioned project's secrets or its agent's report need following (`watch.rs`: a
//! trigger, it only enqueues), and secrets propagation (`secrets.rs`), which the reconcile runs
//! in the project's slot through [`LaterSteps::follow`].
//!
//! A changed AgentProfile is provisioned again from Bootstrapped (`status.provisionedProfiles`
//! holds the revision of each profile's spec it provisioned); a new brief is handed to a running
//! agent, with Seeded run again first where a profile has skills, so they are fresh for it. The
//! watch polls every `watch_interval` where the runtime cannot watch a container's `/run/berth`,
//! and once a minute anyway.

use crate::file_roots::FileRoots;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use berth_api::{
    AgentProfileSpec, ConditionStatus, Kind, ProjectSpec, ProjectStatus, Step, condition_types,
};
use chrono::{DateTime, Utc};

mod secrets;
mod watch;

use super::steps::{LaterSteps, StepContext, StepError, StepOutcome, asked_for};
use crate::agent::{self, AgentError, WrittenFiles};
use crate::runtime::Runtime;
use crate::secrets::Secrets;
use crate::store::{EventType, FieldManager, StatusWrite, StatusWritten, Store, StoredObject};

/// Condition type of secrets propagation.
pub const SECRETS_SYNCED: &str = "SecretsSynced";
/// Reason of a project naming an AgentProfile that is not in the store (yet).
pub const PROFILE_NOT_FOUND: &str = "ProfileNotFound";
/// Reason of an agent silent past the brief deadline.
pub const BRIEF_NOT_ACKNOWLEDGED: &str = "BriefNotAcknowledged";
/// Reason of a new brief waiting for the runner of the previous one to exit.
pub const RUNNER_BUSY: &str = "RunnerBusy";
/// Reason of `Provisioned=True`: every profile's CLI verified and its files placed.
pub const BOOTSTRAPPED: &str = "Bootstrapped";
/// `Provisioned` reason: a profile listed only in `agents` failed; the project goes on without it.
pub const PROFILE_FAILED: &str = "ProfileFailed";

/// How long a failed step waits before it is tried again.
const RETRY: Duration = Duration::from_secs(15);
/// How often an unacknowledged brief is looked at again.
const BRIEF_POLL: Duration = Duration::from_secs(2);
/// How often a new brief looks whether the previous brief's runner has exited.
const RUNNER_BUSY_POLL: Duration = Duration::from_secs(5);

/// Settings of the agent steps.
#[derive(Debug, Clone)]
pub struct AgentSettings {
    /// How long a started runner has to acknowledge its brief.
    pub brief_deadline: Duration,
    /// Whether single-line secret values also go into LXD `environment.KEY`.
    pub mirror_secrets_to_lxd: bool,
    /// How often a Ready project's agent report and secrets are looked at.
    pub watch_interval: Duration,
    /// Where a `file://` repository named under them may lead (`allowedFileRoots`).
    pub file_roots: FileRoots,
    /// The pool of the projects' volumes (`lxd.storagePool`), where a forced checkout's copy
    /// of the workspace goes.
    pub storage_pool: String,
}

impl Default for AgentSettings {
    fn default() -> Self {
        AgentSettings {
            brief_deadline: Duration::from_secs(300),
            mirror_secrets_to_lxd: false,
            watch_interval: Duration::from_secs(5),
            file_roots: FileRoots::default(),
            storage_pool: "default".to_string(),
        }
    }
}

/// The agent steps, and the propagation that follows them.
pub struct AgentSteps {
    store: Arc<Store>,
    secrets: Arc<Secrets>,
    runtime: Arc<dyn Runtime>,
    settings: AgentSettings,
    /// The secrets revision last propagated, by project uid. Empty after a start, so a restarted
    /// daemon propagates once to every provisioned project.
    synced: Mutex<HashMap<String, u64>>,
}

impl std::fmt::Debug for AgentSteps {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentSteps")
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

impl AgentSteps {
    pub fn new(
        store: Arc<Store>,
        secrets: Arc<Secrets>,
        runtime: Arc<dyn Runtime>,
        settings: AgentSettings,
    ) -> Self {
        AgentSteps {
            store,
            secrets,
            runtime,
            settings,
            synced: Mutex::new(HashMap::new()),
        }
    }

    /// Every profile the spec names, decoded from the store; `Err(name)` for the first missing.
    fn profiles(&self, spec: &ProjectSpec) -> Result<Vec<(String, AgentProfileSpec)>, String> {
        Ok(self
            .revised_profiles(spec)?
            .into_iter()
            .map(|(name, profile, _)| (name, profile))
            .collect())
    }

    /// [`Self::profiles`], each with the revision of its spec (see [`profile_revision`]).
    fn revised_profiles(
        &self,
        spec: &ProjectSpec,
    ) -> Result<Vec<(String, AgentProfileSpec, String)>, String> {
        spec.profiles()
            .into_iter()
            .map(|name| {
                let object = self
                    .store
                    .get(Kind::AgentProfile, &name)
                    .ok_or(name.clone())?;
                let profile = object
                    .spec
                    .decode::<AgentProfileSpec>()
                    .map_err(|_| name.clone())?;
                let revision = profile_revision(&object);
                Ok((name, profile, revision))
            })
            .collect()
    }

    /// The revision of every profile the spec names, by name; `None` while one is missing
    /// (the steps report `ProfileNotFound`).
    fn profile_revisions(&self, spec: &ProjectSpec) -> Option<BTreeMap<String, String>> {
        spec.profiles()
            .into_iter()
            .map(|name| {
                let object = self.store.get(Kind::AgentProfile, &name)?;
                Some((name, profile_revision(&object)))
            })
            .collect()
    }

    /// Whether a profile the spec names has skills to place.
    fn has_skills(&self, spec: &ProjectSpec) -> bool {
        self.profiles(spec)
            .is_ok_and(|profiles| profiles.iter().any(|(_, p)| !p.skills.is_empty()))
    }

    /// Writes the agent steps' fields of the project's status through `change`, by the store's
    /// one status writer (the controller's own record and the other writers' fields stay).
    fn record(
        &self,
        name: &str,
        change: impl FnMut(&mut ProjectStatus),
    ) -> Result<(), crate::store::StoreError> {
        let mut change = change;
        let write = StatusWrite::new(Kind::Project, name, FieldManager::AgentSteps);
        match self
            .store
            .write_status_typed(write, |status, _| change(status))?
        {
            StatusWritten::Gone => Ok(()),
            written => written.require(Kind::Project, name).map(|_| ()),
        }
    }

    fn event(&self, name: &str, type_: EventType, reason: &str, message: &str) {
        if let Some(object) = self.store.get(Kind::Project, name) {
            self.store.record_or_warn(&object, type_, reason, message);
        }
    }

    /// Sets one condition of the project (not `Ready`, which the reconciler owns) when it
    /// differs from the stored one.
    fn record_condition(
        &self,
        name: &str,
        type_: &str,
        status: ConditionStatus,
        reason: &str,
        message: &str,
    ) -> Result<(), StepError> {
        self.record_with_condition(name, type_, status, reason, message, |_| {})
    }

    /// Sets a condition and makes `also`'s changes in one status write (none when neither
    /// changes anything).
    fn record_with_condition(
        &self,
        name: &str,
        type_: &str,
        status: ConditionStatus,
        reason: &str,
        message: &str,
        mut also: impl FnMut(&mut ProjectStatus),
    ) -> Result<(), StepError> {
        let Some(object) = self.store.get(Kind::Project, name) else {
            return Ok(());
        };
        let generation = object.generation();
        self.record(name, |s| {
            also(s);
            berth_api::set_condition(
                &mut s.conditions,
                type_,
                status,
                reason,
                message,
                generation,
                Utc::now(),
            );
        })
        .map_err(StepError::recording("a condition"))
    }

    async fn bootstrap(&self, project: &StepContext<'_>) -> Result<StepOutcome, StepError> {
        let profiles = match self.revised_profiles(project.spec) {
            Ok(profiles) => profiles,
            Err(missing) => {
                let message = format!("agent profile {missing} does not exist");
                self.record_condition(
                    project.name,
                    condition_types::PROVISIONED,
                    ConditionStatus::False,
                    PROFILE_NOT_FOUND,
                    &message,
                )?;
                return Ok(StepOutcome::Waiting {
                    reason: PROFILE_NOT_FOUND.to_string(),
                    message,
                    retry_after: RETRY,
                });
            }
        };
        let named: Vec<agent::NamedProfile<'_>> =
            profiles.iter().map(|(n, p, _)| (n.as_str(), p)).collect();
        let values = self.secret_values(project.uid)?;
        let agent_name = project.spec.agent.as_deref();
        match agent::bootstrap_best_effort(
            &*self.runtime,
            project.name,
            agent_name,
            &named,
            &values,
        )
        .await
        {
            Ok(report) => {
                // The revisions read with the specs just provisioned: a profile changed
                // meanwhile is found changed on the next look.
                let provisioned: BTreeMap<String, String> = profiles
                    .iter()
                    .map(|(name, _, revision)| (name.clone(), revision.clone()))
                    .collect();
                for warning in &report.warnings {
                    self.event(
                        project.name,
                        EventType::Warning,
                        "BootstrapWarning",
                        warning,
                    );
                }
                let (status, reason) = if report.failed.is_empty() {
                    (ConditionStatus::True, BOOTSTRAPPED)
                } else {
                    (ConditionStatus::False, PROFILE_FAILED)
                };
                for (profile, why) in &report.failed {
                    self.event(project.name, EventType::Warning, PROFILE_FAILED, why);
                    tracing::warn!(project = project.name, profile, "{why}");
                }
                self.record_with_condition(
                    project.name,
                    condition_types::PROVISIONED,
                    status,
                    reason,
                    &provisioned_message(&report),
                    |s| s.provisioned_profiles = provisioned.clone(),
                )?;
                Ok(StepOutcome::Done)
            }
            Err(e) => {
                if !e.is_transient() {
                    self.record_condition(
                        project.name,
                        condition_types::PROVISIONED,
                        ConditionStatus::False,
                        e.reason(),
                        &e.to_string(),
                    )?;
                }
                failed(e)
            }
        }
    }

    async fn checkout(&self, project: &StepContext<'_>) -> Result<StepOutcome, StepError> {
        let Some(repo) = &project.spec.repo else {
            return Ok(StepOutcome::Done);
        };
        let Some(object) = self.store.get(Kind::Project, project.name) else {
            return Ok(StepOutcome::Done);
        };
        let status = decode_status(&object);
        // berth's own files, as it wrote them, never hold a checkout back.
        let known = WrittenFiles {
            files: status.seeded_files.clone(),
        };
        // A forced checkout writes over the files only once a copy of them is in the trash.
        let (mode, copy) = match force_requested(&object, &status) {
            Some(requested) => match self.copy_to_trash(&object, &status, requested).await {
                Ok(copy) => (agent::CheckoutMode::Forced, Some(copy)),
                Err(e) => return Err(StepError::Runtime(e)),
            },
            None => (agent::CheckoutMode::Careful, None),
        };
        // A file:// path named under allowedFileRoots is held to them again as it is read.
        match agent::checkout(
            &*self.runtime,
            project.name,
            repo,
            &self.settings.file_roots,
            &known,
            mode,
        )
        .await
        {
            Ok(agent::CheckoutOutcome::Cloned { head, .. }) => {
                let message = match &copy {
                    Some(copy) => format!(
                        "checked out {head} over the workspace's files; they were copied to the trash first, as {copy} (berth trash list)"
                    ),
                    None => format!("checked out {head}"),
                };
                self.event(project.name, EventType::Normal, "Cloned", &message);
                self.checkout_unblocked(project.name, &status, &message)?;
                Ok(StepOutcome::Done)
            }
            Ok(agent::CheckoutOutcome::Kept) => {
                self.checkout_unblocked(project.name, &status, "")?;
                Ok(StepOutcome::Done)
            }
            Ok(agent::CheckoutOutcome::Blocked { count, files }) => {
                let message = blocked_message(project.name, count, &files);
                let held_already = condition_of(&status, condition_types::CHECKOUT_BLOCKED)
                    .is_some_and(|c| c.status == ConditionStatus::True && c.message == message);
                self.record_condition(
                    project.name,
                    condition_types::CHECKOUT_BLOCKED,
                    ConditionStatus::True,
                    berth_api::reasons::CHECKOUT_BLOCKED,
                    &message,
                )?;
                if !held_already {
                    self.event(
                        project.name,
                        EventType::Warning,
                        berth_api::reasons::CHECKOUT_BLOCKED,
                        &message,
                    );
                }
                Ok(StepOutcome::Waiting {
                    reason: berth_api::reasons::CHECKOUT_BLOCKED.to_string(),
                    message,
                    retry_after: RETRY,
                })
            }
            Err(e) => failed(e),
        }
    }

    /// `CheckoutBlocked=False` once the checkout is done, where it was held before.
    fn checkout_unblocked(
        &self,
        name: &str,
        status: &ProjectStatus,
        message: &str,
    ) -> Result<(), StepError> {
        if condition_of(status, condition_types::CHECKOUT_BLOCKED).is_none() {
            return Ok(());
        }
        self.record_condition(
            name,
            condition_types::CHECKOUT_BLOCKED,
            ConditionStatus::False,
            Step::CheckedOut.as_str(),
            message,
        )
    }

    /// Copies the project's workspace volume into the trash (on its member) for a forced
    /// checkout asked for at `requested`, and answers the copy's name. A copy made for the same
    /// request before (a retried step) is kept as it is.
    async fn copy_to_trash(
        &self,
        object: &StoredObject,
        status: &ProjectStatus,
        requested: DateTime<Utc>,
    ) -> Result<String, crate::runtime::RuntimeError> {
        let live = crate::layout::DurableLayout::workspace_volume(object.uid());
        let (name, labels) =
            crate::trash::checkout_copy(object, &live, requested, crate::clock::now());
        let pool = &self.settings.storage_pool;
        let target = status.location.clone();
        if self
            .runtime
            .get_volume(pool, &name, target.as_deref())
            .await?
            .is_some()
        {
            return Ok(name);
        }
        let request = crate::runtime::CreateVolume {
            pool: pool.clone(),
            name: name.clone(),
            size: None,
            config: labels,
            target,
        };
        match self.runtime.copy_volume(&live, &request).await {
            Ok(_) | Err(crate::runtime::RuntimeError::Conflict { .. }) => Ok(name),
            Err(e) => Err(e),
        }
    }

    async fn seed(&self, project: &StepContext<'_>) -> Result<StepOutcome, StepError> {
        let profiles = match self.profiles(project.spec) {
            Ok(profiles) => profiles,
            Err(missing) => {
                return Ok(StepOutcome::Waiting {
                    reason: PROFILE_NOT_FOUND.to_string(),
                    message: format!("agent profile {missing} does not exist"),
                    retry_after: RETRY,
                });
            }
        };
        let named: Vec<agent::NamedProfile<'_>> =
            profiles.iter().map(|(n, p)| (n.as_str(), p)).collect();
        self.mint_project_token(project)?;
        let values = self.secret_values(project.uid)?;
        let status = self.status(project.name);
        let previous = WrittenFiles {
            files: status.seeded_files.clone(),
        };
        // Read from their sources each time: a skill changed on its host is placed anew.
        let skills = match agent::read_skills(&named, &self.settings.file_roots).await {
            Ok(skills) => skills,
            Err(e) => return failed(e),
        };
        let capabilities =
            match agent::capability::look(&*self.runtime, project.name, project.spec, &named).await
            {
                Ok(found) => found,
                Err(e) => return failed(e),
            };
        let browser = agent::capability::wants_browser(project.spec, &named);
        self.record_capabilities(project, browser, &capabilities)?;
        let inputs = agent::SeedInputs {
            profiles: &named,
            skills: &skills,
            capabilities: &capabilities,
            secrets: &values,
            previous: &previous,
        };
        let report = match agent::seed(&*self.runtime, project.name, project.spec, inputs).await {
            Ok(report) => report,
            Err(e) => return failed(e),
        };
        for warning in &report.warnings {
            self.event(project.name, EventType::Warning, "SeedSkipped", warning);
        }
        if report.written != previous {
            if !report.changed.is_empty() {
                self.event(
                    project.name,
                    EventType::Normal,
                    "SeedWritten",
                    &format!("wrote {}", report.changed.join(", ")),
                );
            }
            if !report.removed.is_empty() {
                self.event(
                    project.name,
                    EventType::Normal,
                    "SkillRemoved",
                    &format!(
                        "removed {}: no skill or capability holds them any more",
                        report.removed.join(", ")
                    ),
                );
            }
            self.record(project.name, |s| {
                s.seeded_files = report.written.files.clone()
            })
            .map_err(StepError::recording("the seeded files"))?;
        }
        Ok(StepOutcome::Done)
    }

    async fn start_runner(&self, project: &StepContext<'_>) -> Result<StepOutcome, StepError> {
        let Some(agent_name) = &project.spec.agent else {
            return Ok(StepOutcome::Done);
        };
        let profile = match self.profiles(&ProjectSpec {
            agent: Some(agent_name.clone()),
            ..ProjectSpec::default()
        }) {
            Ok(mut profiles) if !profiles.is_empty() => profiles.remove(0).1,
            _ => {
                return Ok(StepOutcome::Waiting {
                    reason: PROFILE_NOT_FOUND.to_string(),
                    message: format!("agent profile {agent_name} does not exist"),
                    retry_after: RETRY,
                });
            }
        };
        let status = self.status(project.name);
        let brief = agent::current_brief(project.uid, project.spec, &status);
        let brief_id = brief.id.clone();
        if status.brief_id.as_deref() != Some(brief_id.as_str()) {
            // Recorded before the runner gets it, so a crash between the two hands over the
            // same id again.
            self.record(project.name, |s| s.brief_id = Some(brief_id.clone()))
                .map_err(StepError::recording("the brief id"))?;
        }
        // After a boot, a wake or a replaced container the brief is handed again only while
        // the agent has not finished it; one it had taken up resumes the CLI's session.
        if agent::brief_finished(&status, &brief_id) {
            return Ok(StepOutcome::Done);
        }
        let env = agent::runner_env(&project.spec.env, &status, &brief_id);
        let values = self.secret_values(project.uid)?;
        match agent::start_runner(
            &*self.runtime,
            project.name,
            &profile,
            &brief_id,
            brief.text,
            &env,
            &values,
        )
        .await
        {
            Ok(agent::RunnerOutcome::Started { pid }) => {
                self.event(
                    project.name,
                    EventType::Normal,
                    "RunnerStarted",
                    &match brief.schedule {
                        Some(run) => format!(
                            "runner started as pid {pid} with brief {brief_id}, scheduled for {}",
                            run.at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
                        ),
                        None => format!("runner started as pid {pid} with brief {brief_id}"),
                    },
                );
                Ok(StepOutcome::Done)
            }
            Ok(agent::RunnerOutcome::AlreadyStarted { .. }) => Ok(StepOutcome::Done),
            Ok(agent::RunnerOutcome::Busy { pid, brief_id: old }) => {
                let blocked = status.agent.as_ref().is_some_and(|a| {
                    a.state == berth_api::AgentState::Blocked
                        && a.brief_id.as_deref() == Some(old.as_str())
                });
                let hint = if blocked {
                    "; it waits for an answer (berth answer), or berth restart hands over the new brief at once"
                } else {
                    ""
                };
                Ok(StepOutcome::Waiting {
                    reason: RUNNER_BUSY.to_string(),
                    message: format!(
                        "the runner (pid {pid}) is still working brief {old}; brief {brief_id} is handed over once it exits{hint}"
                    ),
                    retry_after: RUNNER_BUSY_POLL,
                })
            }
            Err(e) => failed(e),
        }
    }

    async fn briefed(&self, project: &StepContext<'_>) -> Result<StepOutcome, StepError> {
        let Some(object) = self.store.get(Kind::Project, project.name) else {
            return Ok(StepOutcome::Done);
        };
        let status = decode_status(&object);
        let Some(current) = status.brief_id.clone() else {
            return Ok(StepOutcome::Done);
        };
        let report = match agent::read_agent_status(&*self.runtime, project.name).await {
            Ok(report) => report,
            Err(e) => return failed(e),
        };
        if let Some(report) = &report
            && report.status.brief_id.as_deref() == Some(current.as_str())
        {
            if agent_changed(&status, report) {
                self.record(project.name, |s| apply_report(s, report))
                    .map_err(StepError::recording("the agent's report"))?;
            }
            return Ok(StepOutcome::Done);
        }
        // A finished brief is not handed again after a boot; its report stays in status.
        if agent::brief_finished(&status, &current) {
            return Ok(StepOutcome::Done);
        }
        let since = step_started_at(&object).unwrap_or_else(Utc::now);
        let waited = (Utc::now() - since).to_std().unwrap_or_default();
        if waited > self.settings.brief_deadline {
            return Ok(StepOutcome::Waiting {
                reason: BRIEF_NOT_ACKNOWLEDGED.to_string(),
                message: format!(
                    "the agent has not acknowledged brief {current} {}s after its runner started",
                    waited.as_secs()
                ),
                retry_after: Duration::from_secs(10),
            });
        }
        Ok(StepOutcome::Waiting {
            reason: Step::RunnerStarted.as_str().to_string(),
            message: format!("waiting for the agent to acknowledge brief {current}"),
            retry_after: BRIEF_POLL,
        })
    }

    /// `CapabilityFailed`: `True` with a line per capability the image cannot carry (and a
    /// Warning when that changes), `False` once every capability is published. A project
    /// that asks for none (`asked`) gets no condition, and one that had it sees it `False`.
    fn record_capabilities(
        &self,
        project: &StepContext<'_>,
        asked: bool,
        found: &agent::capability::Found,
    ) -> Result<(), StepError> {
        use berth_api::reasons::{CAPABILITY_UNAVAILABLE, PUBLISHED};
        let type_ = condition_types::CAPABILITY_FAILED;
        let current = condition_of(&self.status(project.name), type_).cloned();
        if found.failures.is_empty() {
            if !asked && current.is_none() {
                return Ok(());
            }
            return self.record_condition(
                project.name,
                type_,
                ConditionStatus::False,
                PUBLISHED,
                "",
            );
        }
        let message = found.failures.join("; ");
        let unchanged =
            current.is_some_and(|c| c.status == ConditionStatus::True && c.message == message);
        if !unchanged {
            self.event(project.name, EventType::Warning, type_, &message);
        }
        self.record_condition(
            project.name,
            type_,
            ConditionStatus::True,
            CAPABILITY_UNAVAILABLE,
            &message,
        )
    }

    /// A project whose capabilities need a project token gets one, once: a project secret, so
    /// it reaches `/workspace/.env` with the others and outlives any container.
    fn mint_project_token(&self, project: &StepContext<'_>) -> Result<(), StepError> {
        use agent::capability::{TOKEN_KEY, new_token, token_project};
        if !agent::capability::wants_token(project.spec) {
            return Ok(());
        }
        let current = self.secrets.get(project.uid, TOKEN_KEY)?;
        if current.as_deref().and_then(token_project) == Some(project.name) {
            return Ok(());
        }
        self.secrets
            .set(project.uid, TOKEN_KEY, new_token(project.name).as_bytes())?;
        self.event(
            project.name,
            EventType::Normal,
            "ProjectTokenIssued",
            &format!("{TOKEN_KEY} set: the agent's token for this project's schedules"),
        );
        Ok(())
    }

    fn secret_values(&self, uid: &str) -> Result<BTreeMap<String, String>, StepError> {
        Ok(self.secrets.values(uid)?)
    }

    fn status(&self, name: &str) -> ProjectStatus {
        self.store
            .get(Kind::Project, name)
            .map(|o| decode_status(&o))
            .unwrap_or_default()
    }
}

#[async_trait]
impl LaterSteps for AgentSteps {
    fn required(&self, spec: &ProjectSpec, step: Step) -> bool {
        asked_for(spec, step)
    }

    fn redact(&self, project_uid: &str, text: &str) -> String {
        match self.secret_values(project_uid) {
            Ok(values) => {
                berth_api::redact_credentials(&crate::secrets::redact(text, values.values()))
                    .into_owned()
            }
            // Without the values nothing can be redacted: keep nothing of the text.
            Err(e) => {
                format!("the cause is withheld: the project's secrets could not be read ({e})")
            }
        }
    }

    /// Secrets propagation and the agent's report, when the project is due for them.
    async fn follow(&self, project: &StepContext<'_>) {
        self.follow_project(project.name).await;
    }

    /// An AgentProfile changed, added or dropped since Bootstrapped provisioned the profiles
    /// makes Bootstrapped due again, and the steps after it converge what it changed
    /// (instructions, the runner's brief); the checkout and the running runner are kept.
    ///
    /// A brief other than the one handed over makes RunnerStarted and Briefed due again: the
    /// agent gets the new one, and until it acknowledges it the project is not Briefed. Where a
    /// profile has skills, Seeded runs first, so the new brief meets them as their sources are
    /// now.
    fn outdated(&self, project: &StepContext<'_>, done: Step) -> Option<(Step, String)> {
        if done < Step::Bootstrapped || !asked_for(project.spec, Step::Bootstrapped) {
            return None;
        }
        let status = self.status(project.name);
        if let Some(current) = self.profile_revisions(project.spec)
            && status.provisioned_profiles != current
        {
            return Some((
                Step::Reachable,
                profiles_changed(&status.provisioned_profiles, &current),
            ));
        }
        if done < Step::RunnerStarted || !asked_for(project.spec, Step::RunnerStarted) {
            return None;
        }
        let handed = status.brief_id.as_deref()?;
        let current = agent::current_brief(project.uid, project.spec, &status);
        (handed != current.id).then(|| {
            let why = match current.schedule {
                Some(run) => format!(
                    "a schedule ran at {}",
                    run.at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
                ),
                None => "spec.brief changed".to_string(),
            };
            // Skills are placed again before a new brief: back to before Seeded.
            let back = if self.has_skills(project.spec) {
                Step::CheckedOut
            } else {
                Step::Seeded
            };
            (
                back,
                format!("{why}: brief {} replaces brief {handed}", current.id),
            )
        })
    }

    async fn run(&self, project: &StepContext<'_>, step: Step) -> Result<StepOutcome, StepError> {
        match step {
            Step::Bootstrapped => self.bootstrap(project).await,
            Step::CheckedOut => self.checkout(project).await,
            Step::Seeded => self.seed(project).await,
            Step::RunnerStarted => self.start_runner(project).await,
            Step::Briefed => self.briefed(project).await,
            Step::Requested | Step::Created | Step::Started | Step::Reachable => {
                Ok(StepOutcome::Done)
            }
        }
    }
}

/// A step's failure: a transient runtime error goes back to the queue's backoff; any other sets
/// `Ready=False` with the step's reason and is tried again later.
fn failed(e: AgentError) -> Result<StepOutcome, StepError> {
    if e.is_transient()
        && let AgentError::Runtime { source, .. } = e
    {
        return Err(source.into());
    }
    Ok(StepOutcome::Waiting {
        reason: e.reason().to_string(),
        message: e.to_string(),
        retry_after: RETRY,
    })
}

/// The revision of an AgentProfile's spec: its uid and generation, which moves only when the
/// spec changes (an unchanged profile applied again keeps it; one deleted and made again
/// does not).
fn profile_revision(profile: &StoredObject) -> String {
    format!("{}/{}", profile.uid(), profile.generation())
}

/// Why the provisioned profiles are out of date, for the `Ready` condition's message.
fn profiles_changed(
    recorded: &BTreeMap<String, String>,
    current: &BTreeMap<String, String>,
) -> String {
    if recorded.is_empty() {
        return "provisioning again: which AgentProfile revisions were provisioned is not on record"
            .to_string();
    }
    let mut changes = Vec::new();
    for (name, revision) in current {
        match recorded.get(name) {
            None => changes.push(format!("AgentProfile {name} added")),
            Some(was) if was != revision => changes.push(format!("AgentProfile {name} changed")),
            Some(_) => {}
        }
    }
    for name in recorded.keys().filter(|n| !current.contains_key(*n)) {
        changes.push(format!("AgentProfile {name} dropped"));
    }
    format!("provisioning again: {}", changes.join(", "))
}

pub use crate::agent::brief_id;

/// `Provisioned`'s message: each profile with the version its check printed.
fn provisioned_message(report: &agent::BootstrapReport) -> String {
    let profiles: Vec<String> = report
        .profiles
        .iter()
        .map(|p| {
            let version = match (&p.reported, &p.version) {
                (Some(reported), _) => reported.clone(),
                (None, Some(declared)) => format!("{declared} (declared; the check printed none)"),
                (None, None) => "check passed, no version printed".to_string(),
            };
            let installed = match p.install {
                agent::InstallOutcome::Installed => ", installed now",
                agent::InstallOutcome::Present => "",
            };
            format!("{}: {version}{installed}", p.profile)
        })
        .collect();
    let mut message = format!("verified {}", profiles.join("; "));
    if profiles.is_empty() {
        message = String::from("no profile verified");
    }
    for (profile, why) in &report.failed {
        message.push_str(&format!(
            "; profile {profile} failed and the project goes on without it: {why}"
        ));
    }
    message
}

/// The condition of type `type_` in a status.
fn condition_of<'a>(status: &'a ProjectStatus, type_: &str) -> Option<&'a berth_api::Condition> {
    status.conditions.iter().find(|c| c.type_ == type_)
}

/// When a member asked to force the held checkout: a request (`berth.dev/forceCheckout`)
/// made after the hold began. An older request, or none, forces nothing.
fn force_requested(object: &StoredObject, status: &ProjectStatus) -> Option<DateTime<Utc>> {
    let held = condition_of(status, condition_types::CHECKOUT_BLOCKED)
        .filter(|c| c.status == ConditionStatus::True)?;
    let requested = object
        .metadata
        .annotations
        .get(berth_api::annotations::FORCE_CHECKOUT)
        .and_then(|v| DateTime::parse_from_rfc3339(v).ok())?
        .with_timezone(&Utc);
    (requested > held.last_transition_time).then_some(requested)
}

/// What a held checkout tells: which files hold it (a bounded list and the count) and the two
/// ways on.
fn blocked_message(name: &str, count: usize, files: &[String]) -> String {
    let more = count.saturating_sub(files.len());
    let mut named = files.join(", ");
    if more > 0 {
        named.push_str(&format!(" and {more} more"));
    }
    format!(
        "the workspace holds {count} files berth did not write, and no repository: {named}; \
         the checkout would write over them. Move them out of /workspace, or run \
         `berth checkout {name} --force` (a copy of the workspace goes to the trash first)"
    )
}

fn decode_status(object: &StoredObject) -> ProjectStatus {
    object.status.decode().unwrap_or_default()
}

fn step_started_at(object: &StoredObject) -> Option<DateTime<Utc>> {
    object
        .status
        .get("controller")?
        .get("stepStartedAt")
        .and_then(|v| serde_json::from_value(v.clone()).ok())
}

fn agent_changed(status: &ProjectStatus, report: &agent::AgentReport) -> bool {
    let mut applied = status.clone();
    apply_report(&mut applied, report);
    applied != *status
}

fn apply_report(status: &mut ProjectStatus, report: &agent::AgentReport) {
    let mut agent = report.status.clone();
    // A fresh status file after a boot may not carry the session yet: the recorded one stays.
    if agent.session_id.is_none()
        && let Some(had) = &status.agent
        && had.brief_id == agent.brief_id
    {
        agent.session_id = had.session_id.clone();
    }
    status.agent = Some(agent);
    if status.title.is_none() {
        status.title = report.title.clone();
    }
    agent::record_brief_progress(status);
}

#[cfg(test)]
#[path = "tests.rs"]
mod tests;

#[cfg(test)]
#[path = "fake_runtime_tests.rs"]
mod fake_runtime_tests;
