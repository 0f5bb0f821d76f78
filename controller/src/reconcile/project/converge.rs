//! An existing container of the project converged one concern at a time: what LXD reports of
//! it recorded in `status.container`, a replacement asked for, forwards, a restart, kept
//! stopped, brought to Running, a reboot behind berth's back noticed. Each concern answers
//! [`Next::Continue`] or commits what it did and ends the reconcile.

use std::collections::BTreeMap;
use std::time::Duration;

use berth_api::{ContainerStatus, Phase, PowerState, Step, annotations, reasons};

use super::cluster::member_name;
use super::{Concern, Next, Project, WAIT_FOR_PERSON};
use crate::dispose;
use crate::reconcile::status::{Draft, Idling, idling};
use crate::reconcile::steps::resume_after_boot;
use crate::reconcile::{Action, ReconcileError, replace};
use crate::runtime::{Instance, InstancePatch, InstanceStatus, StopOptions};

impl Project<'_> {
    /// Records what LXD reports of the container; returns what was recorded before.
    pub(super) fn observe(
        &self,
        draft: &mut Draft,
        instance: &Instance,
    ) -> Option<ContainerStatus> {
        let previous = draft.status.container.take();
        let mut observed = container_status(instance);
        if pid_unlisted(instance) && same_boot(previous.as_ref(), instance) {
            observed.pid = previous.as_ref().and_then(|c| c.pid);
        }
        draft.status.container = Some(observed);
        if draft.status.location.is_none() {
            // Placed before placement was recorded: where its container is, its volumes are.
            draft.status.location = member_name(&instance.location);
        }
        if draft.record.image.is_none() {
            draft.record.image = Some(self.spec.image.clone());
        }
        if let Some(fingerprint) = instance.base_image() {
            draft.record.fingerprint = Some(fingerprint.to_string());
        }
        previous
    }

    /// Replaces the container (volumes stay) on request or for a new image.
    pub(super) async fn replace_when_asked(
        &self,
        draft: &mut Draft,
        instance: &Instance,
    ) -> Concern {
        let runtime = &*self.ctx.runtime;
        let settings = &self.ctx.settings;
        let recreate = self.recreate_requested(draft);
        let new_image = draft.record.image.as_deref() != Some(self.spec.image.as_str());
        if !(recreate || new_image) {
            return Ok(Next::Continue);
        }
        let why = if recreate {
            "a recreate was requested"
        } else {
            "spec.image changed"
        };
        // Work outside /workspace holds a replacement nobody forced: it would leave with the
        // container (which goes to the trash, not away).
        // A container already labelled for the trash was let go by an earlier look (a crash
        // came between): its volumes are detached, so it is not looked at again.
        let begun = instance.config.contains_key(crate::trash::TRASH_UID);
        if begun || replace::forced(self.object) {
            replace::release(
                draft,
                "Forced",
                "replaced with --force: the old container is in the trash",
            );
        } else if let Some(wait) = replace::hold(self.ctx, self.object, draft, why).await? {
            self.commit(draft).await?;
            return Ok(Next::Return(Action::Requeue(wait)));
        }
        let reason = if recreate { "recreate" } else { "image" };
        let trashed = dispose::container_into_trash(
            runtime,
            &dispose::Replaced {
                object: self.object,
                name: self.name(),
                why: reason,
                now: draft.now(),
                clean_stop: settings.timeouts.clean_stop,
                timeout: settings.timeouts.delete,
            },
        )
        .await?;
        self.warn_normal(
            "ContainerTrashed",
            &format!(
                "the replaced container ({why}) is in the trash as {trashed}: `berth trash list`, `berth trash cp`"
            ),
        )
        .await;
        draft.record.recreate_requested_at =
            self.annotation(annotations::RECREATE_REQUESTED_AT).cloned();
        draft.record.image = None;
        if new_image {
            // The old image is not a fallback for a new one.
            draft.record.fingerprint = None;
        }
        draft.status.container = None;
        draft.set_step(Step::Requested);
        draft.set_not_ready(
            Phase::Provisioning,
            Step::Requested.as_str(),
            &format!("replacing the container ({why}); the volumes stay, the old container is in the trash"),
        );
        self.commit_and_go_on(draft).await
    }

    /// Host forwards (`spec.forwards`) and the agent API's device added, changed or removed
    /// on the container.
    pub(super) async fn converge_forwards(
        &self,
        draft: &mut Draft,
        instance: &Instance,
    ) -> Concern {
        let drift =
            crate::agent::forwards::drift(&self.spec.forwards, self.agent_api(), &instance.devices);
        if drift.is_empty() {
            return Ok(Next::Continue);
        }
        let runtime = &*self.ctx.runtime;
        if !drift.upsert.is_empty() {
            let patch = InstancePatch {
                config: BTreeMap::new(),
                devices: drift.upsert.clone(),
            };
            runtime.patch_instance(self.name(), &patch).await?;
        }
        if !drift.remove.is_empty() {
            let remove = drift.remove.clone();
            runtime
                .update_instance(self.name(), &move |edit| {
                    for name in &remove {
                        edit.devices.remove(name);
                    }
                })
                .await?;
        }
        self.commit_and_go_on(draft).await
    }

    /// berth's agent socket, when the project asks for the agent API (`schedules`).
    pub(super) fn agent_api(&self) -> Option<&std::path::Path> {
        self.spec
            .capabilities
            .contains(&berth_api::Capability::Schedules)
            .then_some(self.ctx.settings.agent_api_socket.as_deref())
            .flatten()
    }

    /// A restart request: host-driven (clean stop, then kill), so a wedged container restarts.
    pub(super) async fn restart_when_asked(
        &self,
        draft: &mut Draft,
        instance: &Instance,
    ) -> Concern {
        let Some(restart) = self.restart_asked(draft).cloned() else {
            return Ok(Next::Continue);
        };
        draft.record.restarted_at = Some(restart);
        if instance.status != InstanceStatus::Stopped {
            self.stop_cleanly().await?;
            self.warn_normal("Restarted", "stopped for a requested restart")
                .await;
        }
        self.commit_and_go_on(draft).await
    }

    /// Keeps a project stopped while its spec says so or the reaper idled it.
    pub(super) async fn keep_stopped(&self, draft: &mut Draft, instance: &Instance) -> Concern {
        let idled = self.idled(draft).await;
        if self.spec.state == PowerState::Running && !idled {
            return Ok(Next::Continue);
        }
        if instance.status != InstanceStatus::Stopped {
            self.stop_cleanly().await?;
        }
        let message = if idled {
            "idled: stays stopped until woken"
        } else {
            "spec.state is Stopped"
        };
        draft.set_not_ready(Phase::Stopped, reasons::STOPPED, message);
        self.commit(draft).await?;
        Ok(Next::Return(Action::Done))
    }

    /// Brings a container that should run to Running: starts a stopped one, reports a frozen
    /// one, force-stops one LXD lost track of, waits out a transition.
    pub(super) async fn run(&self, draft: &mut Draft, instance: &Instance) -> Concern {
        let runtime = &*self.ctx.runtime;
        match &instance.status {
            InstanceStatus::Running => Ok(Next::Continue),
            InstanceStatus::Stopped => {
                self.start().await?;
                self.booted(draft);
                draft.set_not_ready(Phase::Provisioning, Step::Started.as_str(), "");
                self.commit_and_go_on(draft).await
            }
            InstanceStatus::Frozen => {
                draft.set_not_ready(
                    Phase::Error,
                    "Frozen",
                    "the container is frozen; unfreeze it (lxc start) or restart it",
                );
                self.commit(draft).await?;
                Ok(Next::Return(Action::Requeue(WAIT_FOR_PERSON)))
            }
            InstanceStatus::Error => {
                // LXD lost track of the container (a start that failed half-way): a forced stop
                // brings it back to Stopped, and the next reconcile starts it.
                self.warn(
                    "ContainerError",
                    "LXD reports the container in state Error; stopping it by force to start again",
                )
                .await;
                runtime
                    .stop_instance(self.name(), StopOptions::kill())
                    .await?;
                Ok(Next::Return(Action::Requeue(Duration::ZERO)))
            }
            InstanceStatus::Other(transient) => {
                tracing::debug!(state = transient.as_str(), "waiting for a transition");
                Ok(Next::Return(Action::Requeue(Duration::from_secs(1))))
            }
        }
    }

    /// Running: a new pid means it booted again behind berth's back; where either pid is
    /// unknown (a container read without its state since its start), a moved last-used time.
    pub(super) fn notice_reboot(
        &self,
        draft: &mut Draft,
        instance: &Instance,
        previous: Option<&ContainerStatus>,
    ) {
        let Some(previous) = previous else {
            return;
        };
        let pid = instance.state.as_ref().map(|s| s.pid).filter(|p| *p > 0);
        let rebooted = match (previous.pid, pid) {
            (Some(before), Some(now)) => before != now,
            _ => previous.last_used_at.is_some() && previous.last_used_at != instance.last_used_at,
        };
        if draft.step() > Step::Started && rebooted {
            self.booted(draft);
        }
    }

    /// Whether the reaper idled the project and nothing woke it since. `berth start` (the
    /// `berth.dev/wokenAt` annotation, later than the idling) or a new generation wakes it.
    async fn idled(&self, draft: &mut Draft) -> bool {
        let new_generation = draft.status.observed_generation < self.object.generation();
        let why = match idling(&draft.status, &self.object.metadata.annotations) {
            Idling::Awake => return false,
            Idling::Idled if !new_generation => return true,
            Idling::Woken => "berth start",
            Idling::Idled => "a new spec",
        };
        if let Some(reap) = draft.status.reap.as_mut() {
            reap.idled_at = None;
        }
        self.warn_normal("Woken", &format!("woken by {why}")).await;
        false
    }

    /// The container booted: the next step is Reachable, then where it was.
    fn booted(&self, draft: &mut Draft) {
        let step = draft.step();
        if step > Step::Started {
            draft.record.resume = Some(resume_after_boot(step));
        }
        draft.set_step(Step::Started);
    }

    /// Stops the container: cleanly first, killed past the clean-stop deadline.
    async fn stop_cleanly(&self) -> Result<(), ReconcileError> {
        self.ctx
            .runtime
            .stop_instance(
                self.name(),
                StopOptions::clean_then_force(self.ctx.settings.timeouts.clean_stop),
            )
            .await?;
        Ok(())
    }
}

/// The container identity `status.container` shows.
pub(super) fn container_status(instance: &Instance) -> ContainerStatus {
    ContainerStatus {
        name: instance.name.clone(),
        location: member_name(&instance.location),
        image_fingerprint: instance.base_image().map(str::to_string),
        pid: instance
            .state
            .as_ref()
            .map(|s| s.pid)
            .filter(|p| *p > 0 && instance.is_running()),
        created_at: instance.created_at,
        last_used_at: instance.last_used_at,
    }
}

/// Whether `instance` runs, listed without its state, and `recorded` does not hold the pid of
/// this boot.
pub(super) fn pid_unknown(recorded: Option<&ContainerStatus>, instance: &Instance) -> bool {
    pid_unlisted(instance)
        && !(same_boot(recorded, instance) && recorded.is_some_and(|c| c.pid.is_some()))
}

/// Whether `instance` runs but was listed without its state, so without its pid.
fn pid_unlisted(instance: &Instance) -> bool {
    instance.state.is_none() && instance.is_running()
}

/// Whether `instance` is in the boot `recorded` observed: LXD moves an instance's last-used
/// time on every start, a reboot's too. Its pid is then the recorded one.
fn same_boot(recorded: Option<&ContainerStatus>, instance: &Instance) -> bool {
    recorded.is_some_and(|c| c.last_used_at == instance.last_used_at)
}
