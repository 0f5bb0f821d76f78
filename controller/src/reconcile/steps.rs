//! The durable steps after `Reachable` (Bootstrapped, CheckedOut, Seeded, RunnerStarted,
//! Briefed): which of them a spec asks for, and who performs them.
//!
//! The controller runs Created, Started and Reachable itself. The later steps provision agents
//! and the workspace; they plug in through [`LaterSteps`]. A step the spec asks nothing of is
//! skipped, so a project with no agent, repository or seed files is Ready once reachable.

use async_trait::async_trait;
use berth_api::{ProjectSpec, Step};

use crate::runtime::RuntimeError;
use crate::secrets::SecretsError;
use crate::store::StoreError;

/// Why a later step could not be performed, by what failed: the reconcile fails with it and the
/// queue retries with backoff. (A step that waits on the agent or the container is not an
/// error: it is [`StepOutcome::Waiting`].)
#[derive(Debug, thiserror::Error)]
pub enum StepError {
    /// LXD failed the call.
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    /// What the step did could not be recorded.
    #[error("recording {what}: {source}")]
    Store {
        what: &'static str,
        #[source]
        source: StoreError,
    },
    /// The project's secrets could not be read.
    #[error("reading the project's secrets: {0}")]
    Secrets(#[from] SecretsError),
}

impl StepError {
    /// A failure to record `what` in the store.
    pub fn recording(what: &'static str) -> impl FnOnce(StoreError) -> StepError {
        move |source| StepError::Store { what, source }
    }
}

/// What performing one step did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StepOutcome {
    /// Done: the step is recorded and the next may start at once.
    Done,
    /// Not done yet (waiting on the container or the agent); look again after the delay.
    Waiting {
        reason: String,
        message: String,
        retry_after: std::time::Duration,
    },
}

/// Everything a later step may need about the project.
#[derive(Debug, Clone)]
pub struct StepContext<'a> {
    pub name: &'a str,
    pub uid: &'a str,
    pub spec: &'a ProjectSpec,
}

#[async_trait]
pub trait LaterSteps: Send + Sync {
    /// Whether `step` has anything to do for this spec.
    fn required(&self, spec: &ProjectSpec, step: Step) -> bool;

    /// Whether what the steps up to `done` delivered is out of date for this spec (a new brief
    /// for a running agent): the last step that still holds, to go back to, and why. Asked on
    /// every reconcile of a project past `Reachable`, so it reads the store, never the runtime.
    fn outdated(&self, _project: &StepContext<'_>, _done: Step) -> Option<(Step, String)> {
        None
    }

    /// Keeps a project past `Reachable` in step with what changes outside its steps (its
    /// secrets, its agent's report). Asked on every reconcile that reaches the later steps, in
    /// the project's slot; what fails is the hook's to report, and the steps go on.
    async fn follow(&self, _project: &StepContext<'_>) {}

    /// Performs `step`. Every call it makes must be idempotent: after a crash it runs again.
    async fn run(&self, project: &StepContext<'_>, step: Step) -> Result<StepOutcome, StepError>;

    /// `text` (an error about the project, for its status and events) without the project's
    /// secret values or credentials in URLs.
    fn redact(&self, _project_uid: &str, text: &str) -> String {
        berth_api::redact_credentials(text).into_owned()
    }
}

/// Whether the spec asks anything of `step`, by DESIGN.md's rules for skipping.
pub fn asked_for(spec: &ProjectSpec, step: Step) -> bool {
    match step {
        Step::Requested | Step::Created | Step::Started | Step::Reachable => true,
        Step::Bootstrapped => !spec.profiles().is_empty(),
        Step::CheckedOut => spec.repo.is_some(),
        Step::Seeded => !spec.profiles().is_empty() || !spec.seed_files.is_empty(),
        Step::RunnerStarted | Step::Briefed => spec.agent.is_some(),
    }
}

/// The steps of this build: none after `Reachable`. A spec that asks for one of them waits at
/// that step with a message saying so, rather than being called Ready.
#[derive(Debug, Default)]
pub struct NoLaterSteps;

#[async_trait]
impl LaterSteps for NoLaterSteps {
    fn required(&self, spec: &ProjectSpec, step: Step) -> bool {
        asked_for(spec, step)
    }

    async fn run(&self, _project: &StepContext<'_>, step: Step) -> Result<StepOutcome, StepError> {
        Ok(StepOutcome::Waiting {
            reason: step.as_str().to_string(),
            message: format!(
                "step {} is not available in this berth build",
                step.as_str()
            ),
            retry_after: std::time::Duration::from_secs(300),
        })
    }
}

/// The first step after `done` that the spec asks for, if any.
pub fn next_required(steps: &dyn LaterSteps, spec: &ProjectSpec, done: Step) -> Option<Step> {
    let mut step = done.next();
    while let Some(s) = step {
        if steps.required(spec, s) {
            return Some(s);
        }
        step = s.next();
    }
    None
}

/// Where a project stands after its container booted again: the runner steps belong to one boot
/// and run again; the others (volumes, bootstrap, checkout, seeds) persist.
pub fn resume_after_boot(recorded: Step) -> Step {
    recorded.min(Step::Seeded).max(Step::Reachable)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spec_without_agent_stops_at_reachable() {
        let spec = ProjectSpec::default();
        assert_eq!(
            next_required(&NoLaterSteps, &spec, Step::Requested),
            Some(Step::Created)
        );
        assert_eq!(
            next_required(&NoLaterSteps, &spec, Step::Started),
            Some(Step::Reachable)
        );
        assert_eq!(next_required(&NoLaterSteps, &spec, Step::Reachable), None);
    }

    #[test]
    fn an_agent_asks_for_every_later_step_but_checkout() {
        let spec = ProjectSpec {
            agent: Some("shell".into()),
            ..ProjectSpec::default()
        };
        let mut steps = Vec::new();
        let mut at = Step::Reachable;
        while let Some(next) = next_required(&NoLaterSteps, &spec, at) {
            steps.push(next);
            at = next;
        }
        assert_eq!(
            steps,
            [
                Step::Bootstrapped,
                Step::Seeded,
                Step::RunnerStarted,
                Step::Briefed
            ]
        );
    }

    #[test]
    fn a_boot_resumes_at_reachable_keeping_durable_steps() {
        assert_eq!(resume_after_boot(Step::Briefed), Step::Seeded);
        assert_eq!(resume_after_boot(Step::Started), Step::Reachable);
        assert_eq!(resume_after_boot(Step::CheckedOut), Step::CheckedOut);
    }
}
