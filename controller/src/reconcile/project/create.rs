//! A project without its container: the step Created (the volumes, then the container with its
//! config, limits, devices and label in one create request, the operation recorded before it is
//! waited on), or, for a container that existed and vanished, the judgement whether recreating
//! it is safe.
//!
//! A new container that is to run is started in its create step, and one read without state
//! afterwards serves both records (the pid follows with the next resync). A create right after a
//! read that found no container submits without looking again; one made in between fails its
//! operation and is judged by the next read. A container that vanished is judged by `fleet`
//! before it is recreated.

use std::collections::HashSet;
use std::time::Duration;

use berth_api::{
    ConditionStatus, Kind, Phase, PowerState, Step, annotations, condition_types, reasons,
};

use super::cluster::{EVACUATE_KEY, Placed};
use super::converge::container_status;
use super::{Next, Project, WAIT_FOR_PERSON};
use crate::layout::uid_label;
use crate::reconcile::envelope::Origin;
use crate::reconcile::fleet::Verdict;
use crate::reconcile::status::{Draft, Idling, PendingOperation, idling};
use crate::reconcile::{Action, ReconcileError, fault, own_changes};
use crate::runtime::{
    CreateInstance, Created, ImageSource, Instance, OperationStatus, RuntimeError,
};
use crate::store::Store;

impl Project<'_> {
    /// No container: create one, or, when one existed, judge whether it is safe to recreate.
    /// `looked_at`: when the read that found no container began.
    pub(super) async fn converge_absent(
        &self,
        mut draft: Draft,
        looked_at: tokio::time::Instant,
    ) -> Result<Action, ReconcileError> {
        // A list lacks the containers of an offline member: they are not missing.
        if let Next::Return(action) = self.wait_for_recorded_member(&mut draft).await? {
            return Ok(action);
        }
        let recreate_requested = self.recreate_requested(&draft);
        if draft.step() >= Step::Created {
            if !recreate_requested {
                let expected = expected_containers(&self.ctx.store);
                let (verdict, report) = self
                    .ctx
                    .fleet
                    .judge(&*self.ctx.runtime, self.uid(), looked_at, &expected)
                    .await?;
                match verdict {
                    Verdict::Present => return Ok(Action::Requeue(Duration::ZERO)),
                    Verdict::Hold { vanished, expected } => {
                        if let Some(count) = report {
                            self.ctx.metrics.containers_vanished.inc();
                            let message = format!(
                                "{count} of {expected} berth containers vanished at once; berth recreates none of them until a person acts (berth restart --recreate NAME)"
                            );
                            tracing::error!("{message}");
                            self.ctx
                                .store
                                .publish_event(
                                    self.object,
                                    crate::store::EventType::Warning,
                                    "ContainersVanished",
                                    &message,
                                )
                                .await;
                        }
                        draft.set_not_ready(
                            Phase::Missing,
                            reasons::MISSING,
                            &format!(
                                "the container vanished together with {} others; held for a person: berth restart --recreate {}",
                                vanished.saturating_sub(1),
                                self.name()
                            ),
                        );
                        self.commit(&mut draft).await?;
                        return Ok(Action::Requeue(self.ctx.settings.resync_interval));
                    }
                    Verdict::Recreate => {}
                }
            }
            draft.record.recreate_requested_at =
                self.annotation(annotations::RECREATE_REQUESTED_AT).cloned();
            draft.record.image = None;
            draft.status.container = None;
            draft.set_step(Step::Requested);
            draft.set_not_ready(
                Phase::Missing,
                reasons::MISSING,
                "the container is gone; recreating it with the same volumes",
            );
            self.commit(&mut draft).await?;
            return Ok(Action::Requeue(Duration::ZERO));
        }
        if recreate_requested {
            draft.record.recreate_requested_at =
                self.annotation(annotations::RECREATE_REQUESTED_AT).cloned();
        }
        self.create(draft).await
    }

    /// Step Created: the durable volumes, then the container with its config, limits, devices
    /// and label in the create request. The operation id is recorded before waiting on it.
    /// The read that led here found no container of the name (this reconcile's own, or a
    /// resync's list that any event about the name since would have voided), so the create
    /// does not look again: one made in between fails the operation and is judged by the next
    /// read.
    async fn create(&self, mut draft: Draft) -> Result<Action, ReconcileError> {
        let runtime = &*self.ctx.runtime;
        let settings = &self.ctx.settings;
        let Some(image) = self.resolve_image(&draft).await? else {
            draft.set_not_ready(
                Phase::Error,
                reasons::IMAGE_NOT_FOUND,
                &format!("image {:?} not found in LXD", self.spec.image),
            );
            self.commit(&mut draft).await?;
            return Ok(Action::Requeue(WAIT_FOR_PERSON));
        };
        let member = match self.place(&mut draft).await? {
            Placed::On(member) => member,
            Placed::Wait(action) => return Ok(action),
        };
        if draft.status.phase != Phase::Missing {
            draft.set_not_ready(Phase::Provisioning, Step::Requested.as_str(), "");
        }

        for mount in &self.layout.mounts {
            self.create_volume(mount, member.as_deref(), None).await?;
        }
        if member.is_none()
            && let Some(taken) = self.take_from_pool(&draft, &image)
        {
            draft.record.pool_member = Some(taken.clone());
            let recorded = self.commit(&mut draft).await;
            self.ctx.settings.pool.release(&taken);
            recorded?;
            return self.finish_claim(draft, None).await;
        }

        let create = |with_fleet| {
            let request = self.create_request(image.clone(), with_fleet, member.clone());
            async move {
                self.own_change(own_changes::CREATED, runtime.create_instance(&request))
                    .await
            }
        };
        let created = match self.fleet_limits_best_effort("creating", create).await? {
            Ok(created) => created,
            Err(refused) => return self.creation_failed(draft, &refused).await,
        };
        let operation = match created {
            Created::Exists(existing) => {
                // Created before a crash that came before recording it.
                let own = &self.ctx.own_changes;
                own.withdraw(self.name(), own_changes::CREATED);
                if uid_label(&existing.config) != Some(self.uid()) {
                    return self.name_conflict(draft).await;
                }
                return self.record_created(draft, &existing).await;
            }
            Created::Submitted { operation } => operation,
        };
        fault::after_call("create_instance");
        draft.record.operation = Some(PendingOperation {
            id: operation.clone(),
            step: Step::Created,
            submitted_at: draft.now(),
        });
        self.commit(&mut draft).await?;

        match runtime
            .wait_operation(&operation, settings.timeouts.create)
            .await
        {
            Ok(done) if done.status == OperationStatus::Success => {}
            // Still running, or judged by state: the next reconcile waits on the recorded id.
            Ok(_) | Err(RuntimeError::OperationVanished { .. }) => {
                return Ok(Action::Requeue(Duration::ZERO));
            }
            // Made by someone else (or by berth before a crash) since the read: the next
            // step reads it and judges whose it is.
            Err(e) if e.is_already_exists() => {
                self.ctx
                    .own_changes
                    .withdraw(self.name(), own_changes::CREATED);
                draft.record.operation = None;
                self.commit(&mut draft).await?;
                return Ok(Action::Requeue(Duration::ZERO));
            }
            Err(RuntimeError::OperationFailed { message, .. }) => {
                draft.record.operation = None;
                return self.creation_failed(draft, &message).await;
            }
            Err(e) => return Err(e.into()),
        }
        draft.record.operation = None;
        if self.starts_at_once(&draft) {
            // Nothing in a container just created from the spec can differ from it yet, so the
            // checks a present container goes through before its start have nothing to do: start
            // it now, and one read afterwards serves the Created and the Started records.
            self.start().await?;
        }
        // Read without its state: the steps ahead need none of it, and a read with it costs LXD
        // the most of anything on the way to Ready. The pid follows with the next read that
        // does not come from this reconcile (see `pid_unknown`).
        match runtime.get_instance_record(self.name()).await? {
            Some(instance) => self.record_created(draft, &instance).await,
            None => {
                self.commit(&mut draft).await?;
                Err(ReconcileError::Failed(
                    "the create operation succeeded but the container is not there".into(),
                ))
            }
        }
    }

    pub(super) fn create_request(
        &self,
        image: ImageSource,
        with_fleet: bool,
        member: Option<String>,
    ) -> CreateInstance {
        let settings = &self.ctx.settings;
        let include = |origin: Origin| with_fleet || origin == Origin::Project;
        let mut config = self.layout.labels();
        config.extend(self.envelope.config(include));
        if member.is_some() {
            config.insert(EVACUATE_KEY.to_string(), "stop".to_string());
        }
        let mut devices = self.layout.devices(&settings.storage_pool);
        if let Some(root) = self.envelope.root_device(&settings.storage_pool, include) {
            devices.insert("root".to_string(), root);
        }
        devices.extend(crate::agent::forwards::devices(
            &self.spec.forwards,
            self.agent_api(),
        ));
        CreateInstance {
            name: self.name().to_string(),
            image,
            config,
            devices,
            profiles: Vec::new(),
            target: member,
            known_absent: true,
        }
    }

    pub(super) async fn record_created(
        &self,
        mut draft: Draft,
        instance: &Instance,
    ) -> Result<Action, ReconcileError> {
        draft.record.operation = None;
        draft.record.image = Some(self.spec.image.clone());
        draft.record.fingerprint = instance.base_image().map(str::to_string);
        draft.status.container = Some(container_status(instance));
        self.set_resources_applied(&mut draft).await;
        draft.set_condition(
            condition_types::MOUNTS_READY,
            ConditionStatus::True,
            "Attached",
            "",
        );
        draft.set_step(Step::Created);
        draft.set_not_ready(Phase::Provisioning, Step::Created.as_str(), "");
        self.commit(&mut draft).await?;
        // Nothing acted on the container since it was read: the next step starts from it.
        self.carried.keep_instance(instance);
        Ok(Action::Requeue(Duration::ZERO))
    }

    pub(super) async fn creation_failed(
        &self,
        mut draft: Draft,
        message: &str,
    ) -> Result<Action, ReconcileError> {
        if self.has_project_limits() {
            draft.set_condition(
                condition_types::RESOURCES_APPLIED,
                ConditionStatus::False,
                reasons::RESOURCES_REJECTED,
                message,
            );
        }
        draft.set_not_ready(
            Phase::Error,
            reasons::PROVISIONING_FAILED,
            &format!("creating the container failed: {message}"),
        );
        self.commit(&mut draft).await?;
        Err(ReconcileError::Recorded(format!(
            "creating the container failed: {message}"
        )))
    }

    /// Whether a container just created is to run at once: neither the spec, an idled project
    /// nor a restart not yet recorded keeps it stopped (those take the way through
    /// [`Self::converge_present`]).
    pub(super) fn starts_at_once(&self, draft: &Draft) -> bool {
        self.spec.state == PowerState::Running
            && idling(&draft.status, &self.object.metadata.annotations) == Idling::Awake
            && self.restart_asked(draft).is_none()
    }
}

/// The uids of projects whose status says their container exists: what a list must show.
fn expected_containers(store: &Store) -> HashSet<String> {
    store
        .list(Kind::Project)
        .iter()
        .filter(|p| !p.is_deleting())
        .filter(|p| {
            p.status
                .get_str("step")
                .as_deref()
                .and_then(Step::parse)
                .is_some_and(|s| s >= Step::Created)
        })
        .map(|p| p.uid().to_string())
        .collect()
}
