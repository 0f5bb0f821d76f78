//! The watch that follows a provisioned project after its steps: a trigger, like the
//! controller's others, that asks the queue for a reconcile when the project's secrets revision
//! moved or its agent may have reported (a write noticed in its `/run/berth`, or the poll where
//! writes cannot be noticed); the reconcile then follows the project in its slot.

use std::sync::Arc;

use berth_api::{Kind, Phase, PowerState, ProjectSpec, Step};
use tokio::sync::broadcast::error::RecvError;
use tokio_util::sync::CancellationToken;

use super::{AgentSteps, agent_changed, apply_report, decode_status};
use crate::agent::{self, AgentError};
use crate::reconcile::WorkQueue;
use crate::runtime::Watch;
use crate::store::EventType;

/// Every this many `watch_interval`s a project whose agent reports are noticed is looked at
/// anyway, in case a notice was lost (12 × the default 5 s: once a minute).
const RECHECK_TICKS: u64 = 12;

/// What following a provisioned project calls for.
struct FollowUp {
    spec: ProjectSpec,
    revision: u64,
    stale_secrets: bool,
    briefed: bool,
}

impl AgentSteps {
    /// Starts the watch that follows provisioning: on every secrets change, a provisioned
    /// project whose secrets revision moved is asked for a reconcile, which follows it in its
    /// slot ([`LaterSteps::follow`]); so is a briefed one (whose agent's report is copied into
    /// status) when the runtime notices a write in its `/run/berth`. Every `watch_interval`
    /// the watch of each briefed project is asked for, and the same is asked of every project
    /// a notice cannot cover (a remote LXD, a directory not there yet) and of every one whose
    /// watch just started (its report may predate the watch: a new container, or one
    /// restarted, whose tmpfs took the old watch with it); and every [`RECHECK_TICKS`]
    /// intervals (or after notices were missed) of every one, in case a notice was lost. Runs
    /// until `cancel`.
    pub fn spawn_watch(
        self: &Arc<Self>,
        queue: WorkQueue,
        cancel: CancellationToken,
    ) -> tokio::task::JoinHandle<()> {
        let this = Arc::clone(self);
        tokio::spawn(async move {
            let mut changes = this.secrets.subscribe();
            let mut notices = this.runtime.file_notices();
            let mut tick = tokio::time::interval(this.settings.watch_interval);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut ticks: u64 = 0;
            let mut missed = false;
            loop {
                tokio::select! {
                    _ = cancel.cancelled() => return,
                    change = changes.recv() => {
                        if let Ok(change) = change {
                            this.enqueue_if_due(&queue, &change.project);
                        }
                        // A lagged receiver missed some changes: the next tick compares
                        // revisions for every project anyway.
                    }
                    notice = notices.recv() => match notice {
                        Ok(name) => this.enqueue_if_due(&queue, &name),
                        // Missed notices: the next tick looks at every project.
                        Err(RecvError::Lagged(_)) => missed = true,
                        Err(RecvError::Closed) => {
                            notices = tokio::sync::broadcast::channel(1).1;
                        }
                    },
                    _ = tick.tick() => {
                        let recheck =
                            ticks.is_multiple_of(RECHECK_TICKS) || std::mem::take(&mut missed);
                        ticks += 1;
                        let names: Vec<String> = this
                            .store
                            .list(Kind::Project)
                            .iter()
                            .map(|o| o.name().to_string())
                            .collect();
                        for name in names {
                            if cancel.is_cancelled() {
                                return;
                            }
                            let Some(due) = this.follow_up(&name) else {
                                continue;
                            };
                            let watch = if due.briefed {
                                this.watch(&name).await
                            } else {
                                Watch::Unavailable
                            };
                            // Only a watch in place since the last look has seen every write:
                            // a new one may follow a write nobody noticed, and no watch is
                            // polled.
                            if due.stale_secrets || watch != Watch::Already || recheck {
                                queue.request_now(&name);
                            }
                        }
                    }
                }
            }
        })
    }

    /// Asks for a watch of the project's `/run/berth`: whether writes there are noticed, and
    /// since when (see [`Watch`]).
    async fn watch(&self, name: &str) -> Watch {
        match self.runtime.watch_files(name, agent::RUN_DIR).await {
            Ok(watch) => watch,
            Err(e) => {
                tracing::debug!(project = name, error = %e, "agent reports polled, not watched");
                Watch::Unavailable
            }
        }
    }

    /// Asks for a reconcile of `name` when following it has something to do.
    fn enqueue_if_due(&self, queue: &WorkQueue, name: &str) {
        if self.follow_up(name).is_some() {
            queue.request_now(name);
        }
    }

    /// Secrets and agent report of one project; the reconcile calls it in the project's slot.
    pub(super) async fn follow_project(&self, name: &str) {
        let Some(due) = self.follow_up(name) else {
            return;
        };
        if due.stale_secrets
            && let Err(e) = self.sync_secrets(name, &due.spec, due.revision).await
        {
            tracing::warn!(project = name, error = %e, "secrets propagation failed");
        }
        if due.briefed
            && let Err(e) = self.copy_agent_report(name).await
        {
            tracing::debug!(project = name, error = %e, "agent report not read");
        }
    }

    /// What [`Self::follow`] has to do for the project as stored now, if anything.
    fn follow_up(&self, name: &str) -> Option<FollowUp> {
        let object = self.store.get(Kind::Project, name)?;
        if object.is_deleting() {
            return None;
        }
        let status = decode_status(&object);
        // A stopped or failing container (or one about to be stopped) has nothing to sync
        // into; the next tick after it is back finds the revision still stale.
        if !matches!(status.phase, Phase::Ready | Phase::Provisioning) {
            return None;
        }
        let step = status.step.unwrap_or(Step::Requested);
        let spec = object.spec.decode::<ProjectSpec>().ok()?;
        if spec.state != PowerState::Running {
            return None;
        }
        let revision = self.secrets.revision(object.uid()).unwrap_or_default();
        // Seeded wrote the workspace's files with the secrets of then; a project that skips
        // Seeded (no agent, no seed files) gets them once it is Ready and has any.
        let provisioned = step >= Step::Seeded || (status.phase == Phase::Ready && revision > 0);
        if !provisioned {
            return None;
        }
        let stale_secrets = self.synced_revision(object.uid()) != Some(revision);
        // A runner was handed a brief in this boot: its reports are copied also while a new
        // brief waits for it to exit, so a question it asks is seen (and can be answered).
        let briefed = step >= Step::Seeded && status.brief_id.is_some();
        (stale_secrets || briefed).then_some(FollowUp {
            spec,
            revision,
            stale_secrets,
            briefed,
        })
    }

    /// Copies the agent's report into `status.agent` (and the title, once).
    async fn copy_agent_report(&self, name: &str) -> Result<(), AgentError> {
        let Some(report) = agent::read_agent_status(&*self.runtime, name).await? else {
            return Ok(());
        };
        let Some(object) = self.store.get(Kind::Project, name) else {
            return Ok(());
        };
        let status = decode_status(&object);
        if !agent_changed(&status, &report) {
            return Ok(());
        }
        let blocked_now = report.status.state == berth_api::AgentState::Blocked
            && status.agent.as_ref().map(|a| a.state) != Some(berth_api::AgentState::Blocked);
        if let Err(e) = self.record(name, |s| apply_report(s, &report)) {
            // A write racing this one; the next look copies the report again.
            tracing::debug!(project = name, error = %e, "agent report not recorded");
            return Ok(());
        }
        if blocked_now {
            self.event(
                name,
                EventType::Normal,
                "AgentBlocked",
                "the agent asks a question; answer with `berth answer`",
            );
        }
        Ok(())
    }
}

#[cfg(test)]
#[path = "watch_tests.rs"]
mod tests;
