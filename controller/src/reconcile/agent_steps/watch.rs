//! The watch that follows a provisioned project after its steps: a trigger, like the
//! controller's others, that asks the queue for a reconcile when the project's secrets revision
//! moved or its agent may have reported (a write noticed in its `/run/berth`, or the poll where
//! writes cannot be noticed); the reconcile then follows the project in its slot.

use std::collections::HashSet;
use std::sync::Arc;

use berth_api::{Kind, Phase, PowerState, ProjectSpec, Step};
use tokio::sync::broadcast::error::RecvError;
use tokio_util::sync::CancellationToken;

use super::{AgentSteps, agent_changed, apply_report, decode_status};
use crate::agent::{self, AgentError};
use crate::reconcile::WorkQueue;
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
    /// the same is asked of every project a notice cannot cover (a remote LXD, a directory not
    /// watched yet), and every [`RECHECK_TICKS`] intervals of every one, in case a notice was
    /// lost. Runs until `cancel`.
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
            let mut watched: HashSet<String> = HashSet::new();
            let mut ticks: u64 = 0;
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
                        Err(RecvError::Lagged(_)) => watched.clear(),
                        Err(RecvError::Closed) => {
                            notices = tokio::sync::broadcast::channel(1).1;
                        }
                    },
                    _ = tick.tick() => {
                        let recheck = ticks.is_multiple_of(RECHECK_TICKS);
                        ticks += 1;
                        let names: Vec<String> = this
                            .store
                            .list(Kind::Project)
                            .iter()
                            .map(|o| o.name().to_string())
                            .collect();
                        let present: HashSet<&str> = names.iter().map(String::as_str).collect();
                        watched.retain(|name| present.contains(name.as_str()));
                        for name in names {
                            if cancel.is_cancelled() {
                                return;
                            }
                            let Some(due) = this.follow_up(&name) else {
                                watched.remove(&name);
                                continue;
                            };
                            let noticed = due.briefed && this.watching(&name).await;
                            // A directory watched from now on may have changed before.
                            let new = noticed && watched.insert(name.clone());
                            if !noticed {
                                watched.remove(&name);
                            }
                            if due.stale_secrets || !noticed || new || recheck {
                                queue.request_now(&name);
                            }
                        }
                    }
                }
            }
        })
    }

    /// Whether writes to the project's `/run/berth` are noticed (a watch is asked for).
    async fn watching(&self, name: &str) -> bool {
        match self.runtime.watch_files(name, agent::RUN_DIR).await {
            Ok(watching) => watching,
            Err(e) => {
                tracing::debug!(project = name, error = %e, "agent reports polled, not watched");
                false
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

#[cfg(all(test, feature = "testing"))]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use serde_json::json;

    use super::*;
    use crate::metrics::Metrics;
    use crate::reconcile::{Action, AgentSettings, Backoff};
    use crate::runtime::{FileWrite, InstanceStatus, Runtime};
    use crate::store::Commit;
    use crate::testing::eventually;

    /// A briefed project is followed on a notice of a write in its `/run/berth`, and not by the
    /// poll while its directory is watched; once it cannot be watched, the poll takes over.
    #[tokio::test]
    async fn a_watched_agent_report_is_followed_on_notice_not_polled() {
        let setup = super::super::fake_runtime_tests::setup_with(
            json!({"agent": "shell", "brief": "hi"}),
            AgentSettings {
                watch_interval: Duration::from_millis(20),
                ..AgentSettings::default()
            },
        );
        let (store, fake, steps) = (&setup.store, &setup.fake, &setup.steps);
        store
            .update_status(
                Kind::Project,
                "p",
                None,
                json!({"phase": "Ready", "step": "Briefed", "briefId": "b-1"}),
                Commit::Persist,
            )
            .unwrap();
        fake.insert_instance(crate::runtime::Instance::running("p", Default::default()));
        let queue = WorkQueue::new(1, Backoff::default(), Arc::new(Metrics::new()));
        let cancel = CancellationToken::new();
        let followed = Arc::new(AtomicUsize::new(0));
        let counted = followed.clone();
        let running = queue.clone();
        let stop = cancel.clone();
        let following = steps.clone();
        // The reconcile's part: follow the project in its slot (its secrets, then its report).
        tokio::spawn(async move {
            running
                .run(stop, move |name| {
                    let (counted, following) = (counted.clone(), following.clone());
                    async move {
                        following.follow_project(&name).await;
                        counted.fetch_add(1, Ordering::SeqCst);
                        Ok::<_, std::convert::Infallible>(Action::Done)
                    }
                })
                .await
        });
        let watch = steps.spawn_watch(queue, cancel.clone());

        // Watched from the first look on, and followed once then (a report may predate it).
        eventually("the first follow", || followed.load(Ordering::SeqCst) == 1).await;
        let ticks = fake.count("watch_files");
        eventually("five more looks", || fake.count("watch_files") >= ticks + 5).await;
        assert_eq!(
            followed.load(Ordering::SeqCst),
            1,
            "a watched report was polled"
        );

        // The agent writes its report: one follow.
        fake.file_write(
            "p",
            &FileWrite {
                path: agent::STATUS_FILE.to_string(),
                content: br#"{"state":"blocked","briefId":"b-1"}"#.to_vec(),
                uid: 0,
                gid: 0,
                mode: 0o644,
            },
        )
        .await
        .unwrap();
        eventually("a follow on the notice", || {
            followed.load(Ordering::SeqCst) == 2
        })
        .await;
        let agent = store.get(Kind::Project, "p").unwrap().status.value()["agent"].clone();
        assert_eq!(agent["state"], "blocked", "{agent}");

        // Stopped (its tmpfs gone, so no watch): polled on every look.
        fake.set_status("p", InstanceStatus::Stopped);
        eventually("polled again", || followed.load(Ordering::SeqCst) >= 5).await;
        cancel.cancel();
        watch.await.unwrap();
    }
}
