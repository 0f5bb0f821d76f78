//! One reconcile of one project: compare the spec with what LXD reports, take at most one step
//! toward it, record the step, and tell the queue when to look again.
//!
//! Level-triggered: nothing here remembers anything between runs except what the store holds,
//! so a controller killed at any point resumes from the database. Every LXD call is idempotent
//! or guarded by what the store recorded before it was made.
//!
//! The reconcile, top-down ([`reconcile`], then one step at a time):
//! - the object itself: paused, an unreadable spec, being deleted (the `finalizer`), the
//!   finalizer added, its AgentProfiles there, its envelope (`limits.rs`);
//! - the container as this step finds it, and an operation submitted before judged
//!   (`Project::converge`);
//! - no container: `create.rs` (a vanished one judged before it is recreated; step Created on
//!   the member `cluster.rs` places it on, from the image `image.rs` resolves, with the volumes
//!   of `mounts.rs`, from the warm pool in `claim.rs` or by a create request);
//! - the container there, one concern after another (`Project::converge_present`): its member
//!   (`cluster.rs`), a replacement (`converge.rs`), the image (`image.rs`), mounts
//!   (`mounts.rs`), limits and sizes (`limits.rs`), forwards (`converge.rs`), evacuation
//!   (`cluster.rs`), restart, kept stopped, running, a reboot noticed (`converge.rs`);
//! - then the step (`Project::advance`): Started, Reachable's exec probe, and the later steps
//!   through [`super::LaterSteps`].
//!
//! Every step commits through `super::commit` before the next begins.
mod claim;
mod cluster;
mod converge;
mod create;
mod image;
mod limits;
mod mounts;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use berth_api::{
    ConditionStatus, Kind, Phase, ProjectSpec, Step, annotations, condition_types, reasons,
};
use tracing::Instrument;

use self::converge::pid_unknown;
use self::limits::envelope_of;
use super::commit::{commit, store_call};
use super::envelope::Envelope;
use super::status::Draft;
use super::steps::{StepContext, StepOutcome, next_required};
use super::{Action, Context, ReconcileError, finalizer, own_changes};
use crate::layout::{DurableLayout, FINALIZER, uid_label};
use crate::runtime::{ExecRequest, Instance, OperationStatus, RuntimeError};
use crate::store::StoredObject;

/// How long a project with a name conflict, a missing image or a held recreation waits before
/// it is looked at again (a change to it requests it sooner).
const WAIT_FOR_PERSON: Duration = Duration::from_secs(60);
/// Polling interval while a container boots.
pub(super) const BOOT_POLL: Duration = Duration::from_millis(250);
/// The most steps one reconcile takes in a row. A step that finished asks for the next at
/// once; taking it in the same reconcile saves the queue's round trip and a second read of
/// what the step just saw, and the bound keeps one project from holding a worker for long.
const STEPS_PER_RECONCILE: usize = 8;
/// How much of the console log a boot timeout shows.
const CONSOLE_TAIL_BYTES: usize = 2048;

/// Reconciles the project `name`. The queue calls this; it never runs twice at once for a name.
pub async fn reconcile(ctx: &Context, name: &str) -> Result<Action, ReconcileError> {
    let span = tracing::info_span!("reconcile", project = name, step = tracing::field::Empty);
    async {
        let result = reconcile_project(ctx, name).await;
        if let Err(error) = &result
            && error.is_step_failure()
        {
            record_step_failure(ctx, name, error).await;
        }
        result
    }
    .instrument(span)
    .await
}

/// Takes step after step while each asks for the next at once, up to [`STEPS_PER_RECONCILE`].
/// Every step still commits what it did before the next begins, so a controller killed between
/// two steps resumes from the store as before.
async fn reconcile_project(ctx: &Context, name: &str) -> Result<Action, ReconcileError> {
    let carried = Carried::default();
    let mut taken = 0;
    loop {
        let action = reconcile_step(ctx, name, &carried).await?;
        taken += 1;
        match action {
            Action::Requeue(delay) if delay.is_zero() && taken < STEPS_PER_RECONCILE => {}
            other => return Ok(other),
        }
    }
}

/// One step: the object's own state first (paused, an unreadable spec, being deleted, the
/// finalizer, its AgentProfiles), then its container through `Project::converge`.
async fn reconcile_step(
    ctx: &Context,
    name: &str,
    carried: &Carried,
) -> Result<Action, ReconcileError> {
    let Some(object) = ctx.store.get(Kind::Project, name) else {
        ctx.queue.forget(name);
        return Ok(Action::Done);
    };
    // Acting without being able to record it would repeat side effects after a restart.
    let store = ctx.store.clone();
    if let Err(e) = tokio::task::spawn_blocking(move || store.check_writable())
        .await
        .expect("a store call panicked")
    {
        return Err(ReconcileError::StoreUnwritable(e.to_string()));
    }

    let mut draft = Draft::from_object(&object);
    draft.backfill_first_reachable();
    tracing::Span::current().record("step", draft.step().as_str());
    let annotations = &object.metadata.annotations;
    if annotations.get(annotations::RECONCILE).map(String::as_str)
        == Some(annotations::RECONCILE_PAUSED)
    {
        draft.set_condition(
            condition_types::READY,
            ConditionStatus::Unknown,
            reasons::RECONCILE_PAUSED,
            "the berth.dev/reconcile annotation is \"paused\": berth leaves this project alone",
        );
        commit(ctx, &object, &mut draft).await?;
        return Ok(Action::Done);
    }

    let spec: ProjectSpec = match object.spec.decode() {
        Ok(spec) => spec,
        Err(e) => {
            draft.set_not_ready(Phase::Error, "InvalidSpec", &format!("spec: {e}"));
            commit(ctx, &object, &mut draft).await?;
            return Ok(Action::Done);
        }
    };

    if object.is_deleting() {
        return finalizer::finalize(ctx, &object, draft).await;
    }
    if !object.metadata.finalizers.iter().any(|f| f == FINALIZER) {
        let mut finalizers = object.metadata.finalizers.clone();
        finalizers.push(FINALIZER.to_string());
        let name = name.to_string();
        store_call(ctx, move |store| {
            store.set_finalizers(Kind::Project, &name, None, finalizers)
        })
        .await?;
        return Ok(Action::Requeue(Duration::ZERO));
    }

    let mut homes = Vec::new();
    for profile in spec.profiles() {
        let Some(found) = ctx.store.get(Kind::AgentProfile, &profile) else {
            draft.set_not_ready(
                Phase::Pending,
                reasons::PROFILE_NOT_FOUND,
                &format!("AgentProfile {profile:?} does not exist (yet)"),
            );
            commit(ctx, &object, &mut draft).await?;
            // Creating the profile requests every project.
            return Ok(Action::Done);
        };
        let home = found.spec.get_str("home").unwrap_or_default();
        if !home.is_empty() {
            homes.push((profile, home));
        }
    }

    let envelope = envelope_of(
        &spec.resources,
        object
            .metadata
            .annotations
            .get(annotations::OVERRIDES)
            .map(String::as_str),
    );
    let layout = DurableLayout::new(
        object.uid(),
        ctx.store.controller_id(),
        envelope.workspace_bytes.map(|l| l.value),
        &homes,
    );
    let project = Project {
        ctx,
        object: &object,
        spec: &spec,
        envelope,
        layout,
        latest: std::sync::Mutex::new(object.clone()),
        carried,
    };
    project.converge(draft).await
}

/// One project as this reconcile sees it.
struct Project<'a> {
    ctx: &'a Context,
    object: &'a Arc<StoredObject>,
    spec: &'a ProjectSpec,
    envelope: Envelope,
    layout: DurableLayout,
    /// The object as this reconcile last wrote it.
    latest: std::sync::Mutex<Arc<StoredObject>>,
    carried: &'a Carried,
}

/// What one concern of a reconcile decided.
enum Next {
    /// Nothing (more) to do here: on to the next concern.
    Continue,
    /// Committed what it did: the reconcile ends with this action.
    Return(Action),
}

/// What one concern of a reconcile answers.
type Concern = Result<Next, ReconcileError>;

impl Project<'_> {
    /// The container as this step finds it (carried from the step before, listed by the last
    /// resync, else read), an operation a step submitted earlier judged first; then the path
    /// of a project without its container or the concerns of one with it.
    async fn converge(&self, mut draft: Draft) -> Result<Action, ReconcileError> {
        let runtime = &*self.ctx.runtime;
        let looked_at = tokio::time::Instant::now();
        let mut instance = match self.carried.take_instance() {
            Some(known) => Some(known),
            None => {
                // A listed container carries no state: one started since it was last observed,
                // or whose pid berth never read, is read afresh, for the pid of its boot.
                let snapshot = self
                    .ctx
                    .snapshot
                    .take(self.name(), self.ctx.settings.resync_interval)
                    .filter(|listed| {
                        !listed.as_ref().is_some_and(|instance| {
                            pid_unknown(draft.status.container.as_ref(), instance)
                        })
                    });
                match snapshot {
                    Some(listed) => listed,
                    None => match runtime.get_instance(self.name()).await {
                        Ok(found) => found,
                        Err(e) => {
                            // A container on an offline member cannot be read: that is the
                            // member's state, not a failure of this project's.
                            if let Next::Return(action) =
                                self.wait_for_recorded_member(&mut draft).await?
                            {
                                return Ok(action);
                            }
                            return Err(e.into());
                        }
                    },
                }
            }
        };

        if draft.record.pool_member.is_some() {
            return self.finish_claim(draft, instance).await;
        }
        if let Some(found) = &instance
            && uid_label(&found.config) != Some(self.uid())
        {
            return self.name_conflict(draft).await;
        }

        // An operation a step submitted before a crash (or before this reconcile) is judged
        // first: by its outcome while LXD remembers it, else by the instance's state.
        if let Some(op) = draft.record.operation.clone() {
            match runtime
                .wait_operation(&op.id, self.ctx.settings.timeouts.create)
                .await
            {
                Ok(done) if done.status == OperationStatus::Success => {
                    draft.record.operation = None;
                }
                Ok(_) => {
                    let waited = (draft.now() - op.submitted_at).to_std().unwrap_or_default();
                    if waited > self.ctx.settings.timeouts.create {
                        draft.set_not_ready(
                            Phase::Provisioning,
                            reasons::STEP_TIMEOUT,
                            &format!(
                                "step {} has not finished after {}s",
                                op.step.as_str(),
                                waited.as_secs()
                            ),
                        );
                        self.commit(&mut draft).await?;
                    }
                    return Ok(Action::Requeue(Duration::from_secs(1)));
                }
                Err(RuntimeError::OperationVanished { .. }) => {
                    draft.record.operation = None;
                }
                // A create that met an instance of its name: the read below judges whose.
                Err(e) if e.is_already_exists() => {
                    draft.record.operation = None;
                }
                Err(RuntimeError::OperationFailed { message, .. }) => {
                    draft.record.operation = None;
                    return self.creation_failed(draft, &message).await;
                }
                Err(e) => return Err(e.into()),
            }
            instance = runtime.get_instance(self.name()).await?;
            if let Some(found) = &instance
                && uid_label(&found.config) != Some(self.uid())
            {
                return self.name_conflict(draft).await;
            }
        }

        match instance {
            None => self.converge_absent(draft, looked_at).await,
            Some(instance) => self.converge_present(draft, instance).await,
        }
    }

    /// The container exists and is this project's: converge it, one concern after another;
    /// the first that has something to do commits it and ends the reconcile.
    async fn converge_present(
        &self,
        mut draft: Draft,
        instance: Instance,
    ) -> Result<Action, ReconcileError> {
        if let Next::Return(action) = self.wait_for_member(&mut draft, &instance).await? {
            return Ok(action);
        }
        let previous = self.observe(&mut draft, &instance);
        if draft.step() < Step::Created {
            return self.record_created(draft, &instance).await;
        }
        if let Next::Return(action) = self.replace_when_asked(&mut draft, &instance).await? {
            return Ok(action);
        }
        self.check_image(&mut draft, &instance).await?;
        if let Next::Return(action) = self.reattach_mounts(&mut draft, &instance).await? {
            return Ok(action);
        }
        if let Next::Return(action) = self.converge_limits(&mut draft, &instance).await? {
            return Ok(action);
        }
        if let Next::Return(action) = self.converge_sizes(&mut draft, &instance).await? {
            return Ok(action);
        }
        if let Next::Return(action) = self.converge_forwards(&mut draft, &instance).await? {
            return Ok(action);
        }
        if let Next::Return(action) = self.stay_on_evacuation(&mut draft, &instance).await? {
            return Ok(action);
        }
        if let Next::Return(action) = self.restart_when_asked(&mut draft, &instance).await? {
            return Ok(action);
        }
        if let Next::Return(action) = self.keep_stopped(&mut draft, &instance).await? {
            return Ok(action);
        }
        if let Next::Return(action) = self.run(&mut draft, &instance).await? {
            return Ok(action);
        }
        self.notice_reboot(&mut draft, &instance, previous.as_ref());
        // Nothing acted on the container in this step (every concern that acts returns above),
        // and the steps ahead run commands, write files and set environment keys, none of
        // which the concerns above look at: the next step starts from this read.
        self.carried.keep_instance(&instance);
        self.advance(draft).await
    }

    /// The running container's next step.
    async fn advance(&self, mut draft: Draft) -> Result<Action, ReconcileError> {
        match draft.step() {
            Step::Requested => unreachable!("handled before"),
            Step::Created => {
                draft.set_step(Step::Started);
                draft.set_not_ready(Phase::Provisioning, Step::Started.as_str(), "");
                self.commit(&mut draft).await?;
                Ok(Action::Requeue(Duration::ZERO))
            }
            Step::Started => self.reach(draft).await,
            done => self.later_steps(draft, done).await,
        }
    }

    /// Step Reachable: an exec round trip answers. Past the boot deadline the condition says so
    /// and shows the console's last lines.
    async fn reach(&self, mut draft: Draft) -> Result<Action, ReconcileError> {
        let settings = &self.ctx.settings;
        if answers(&*self.ctx.runtime, self.name(), settings.timeouts.exec).await? {
            let target = draft.record.resume.take().unwrap_or(Step::Reachable);
            draft.set_step(target.max(Step::Reachable));
            draft.set_not_ready(Phase::Provisioning, draft.step().as_str(), "");
            self.commit(&mut draft).await?;
            // The probe changed nothing this reconcile converged: the later steps follow on the
            // container as it was read, without reading it again.
            let done = draft.step();
            let later = self.later_steps(draft, done).await;
            // A container claimed from the warm pool is up: the refill may go on.
            self.ctx.settings.pool.answered(self.name());
            return later;
        }
        let waited = draft.time_in_step().to_std().unwrap_or_default();
        if waited > settings.timeouts.boot {
            let console = self
                .ctx
                .runtime
                .console_log_tail(self.name(), CONSOLE_TAIL_BYTES)
                .await
                .unwrap_or_default();
            draft.set_not_ready(
                Phase::Provisioning,
                reasons::BOOT_TIMEOUT,
                &format!(
                    "no exec answer {}s after start; console tail:\n{}",
                    waited.as_secs(),
                    console.trim_end()
                ),
            );
            self.commit(&mut draft).await?;
            return Ok(Action::Requeue(Duration::from_secs(5)));
        }
        Ok(Action::Requeue(BOOT_POLL))
    }

    /// The steps after Reachable, through the pluggable [`super::LaterSteps`].
    async fn later_steps(&self, mut draft: Draft, done: Step) -> Result<Action, ReconcileError> {
        let steps = &*self.ctx.later_steps;
        let context = StepContext {
            name: self.name(),
            uid: self.uid(),
            spec: self.spec,
        };
        steps.follow(&context).await;
        if let Some((back, why)) = steps.outdated(&context, done)
            && back < done
        {
            draft.set_step(back);
            draft.set_not_ready(Phase::Provisioning, back.as_str(), &why);
            self.commit(&mut draft).await?;
            return Ok(Action::Requeue(Duration::ZERO));
        }
        let Some(next) = next_required(steps, self.spec, done) else {
            draft.set_ready(done.as_str(), "");
            self.commit(&mut draft).await?;
            return Ok(Action::Done);
        };
        match steps.run(&context, next).await? {
            StepOutcome::Done => {
                draft.set_step(next);
                draft.set_not_ready(Phase::Provisioning, next.as_str(), "");
                self.commit(&mut draft).await?;
                Ok(Action::Requeue(Duration::ZERO))
            }
            StepOutcome::Waiting {
                reason,
                message,
                retry_after,
            } => {
                draft.set_not_ready(Phase::Provisioning, &reason, &message);
                self.commit(&mut draft).await?;
                Ok(Action::Requeue(retry_after))
            }
        }
    }

    // What every step and concern uses.

    fn name(&self) -> &str {
        self.object.name()
    }

    fn uid(&self) -> &str {
        self.object.uid()
    }

    fn annotation(&self, key: &str) -> Option<&String> {
        self.object.metadata.annotations.get(key)
    }

    /// Whether a `berth restart --recreate` is waiting to be acted on.
    fn recreate_requested(&self, draft: &Draft) -> bool {
        self.annotation(annotations::RECREATE_REQUESTED_AT)
            .is_some_and(|v| Some(v) != draft.record.recreate_requested_at.as_ref())
    }

    /// A restart asked for (`berth.dev/restartedAt`) and not yet acted on.
    fn restart_asked(&self, draft: &Draft) -> Option<&String> {
        self.annotation(annotations::RESTARTED_AT)
            .filter(|asked| Some(*asked) != draft.record.restarted_at.as_ref())
    }

    /// Commits against the latest stored version, so each commit of one reconcile compares with
    /// (and reports transitions from) what the previous one wrote.
    async fn commit(&self, draft: &mut Draft) -> Result<Arc<StoredObject>, ReconcileError> {
        let latest = self
            .latest
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let updated = commit(self.ctx, &latest, draft).await?;
        *self.latest.lock().unwrap_or_else(|e| e.into_inner()) = updated.clone();
        Ok(updated)
    }

    /// Commits what a concern did and asks for the next reconcile at once.
    async fn commit_and_go_on(&self, draft: &mut Draft) -> Concern {
        self.commit(draft).await?;
        Ok(Next::Return(Action::Requeue(Duration::ZERO)))
    }

    /// Runs `call`, a change LXD announces as `action`, as berth's own: the event requests no
    /// second reconcile, since this one reads what the call did itself.
    async fn own_change<T>(
        &self,
        action: &'static str,
        call: impl Future<Output = Result<T, RuntimeError>>,
    ) -> Result<T, RuntimeError> {
        let own = &self.ctx.own_changes;
        own.expect(self.name(), action);
        let result = call.await;
        if result.is_err() {
            own.withdraw(self.name(), action);
        }
        result
    }

    /// Starts the container (step Started), as berth's own change.
    async fn start(&self) -> Result<(), ReconcileError> {
        let timeout = self.ctx.settings.timeouts.start;
        let start = self.ctx.runtime.start_instance(self.name(), timeout);
        self.own_change(own_changes::STARTED, start)
            .await
            .map_err(|source| ReconcileError::StepCall {
                step: Step::Started,
                source,
            })
    }

    async fn name_conflict(&self, mut draft: Draft) -> Result<Action, ReconcileError> {
        draft.set_not_ready(
            Phase::Error,
            reasons::NAME_CONFLICT,
            &format!(
                "an LXD instance named {:?} exists without this project's {} label; berth leaves it alone",
                self.name(),
                crate::layout::UID_LABEL
            ),
        );
        self.commit(&mut draft).await?;
        Ok(Action::Requeue(WAIT_FOR_PERSON))
    }

    async fn warn(&self, reason: &str, message: &str) {
        self.ctx
            .store
            .publish_event(
                self.object,
                crate::store::EventType::Warning,
                reason,
                message,
            )
            .await;
    }

    async fn warn_normal(&self, reason: &str, message: &str) {
        self.ctx
            .store
            .publish_event(
                self.object,
                crate::store::EventType::Normal,
                reason,
                message,
            )
            .await;
    }
}

/// Puts a failed step's cause where a person looks: the Ready condition (reason
/// `StepFailed`, the step and the cause in its message, until a later step replaces it) and a
/// Warning event, which a repeat of the same message counts instead of adding. Secret values
/// and URL credentials are redacted first. A project being deleted reports through its
/// finalizer instead.
async fn record_step_failure(ctx: &Context, name: &str, error: &ReconcileError) {
    let Some(object) = ctx.store.get(Kind::Project, name) else {
        return;
    };
    if object.is_deleting() {
        return;
    }
    let mut draft = Draft::from_object(&object);
    let step = match error {
        ReconcileError::StepCall { step, .. } => *step,
        _ => draft.step().next().unwrap_or(draft.step()),
    };
    let cause = ctx.later_steps.redact(object.uid(), &error.to_string());
    let message = format!("step {} failed: {cause}", step.as_str());
    let phase = draft.status.phase;
    draft.set_not_ready(phase, reasons::STEP_FAILED, &message);
    if let Err(e) = commit(ctx, &object, &mut draft).await {
        tracing::warn!(error = %e, "could not record the failed step in status");
    }
    store_call(ctx, move |store| {
        store.record_or_warn(
            &object,
            crate::store::EventType::Warning,
            reasons::STEP_FAILED,
            &message,
        )
    })
    .await;
}

/// What one step of a reconcile hands the next step of the same reconcile.
#[derive(Default)]
struct Carried {
    /// The container as a step just read it (nothing acted on it since): the next step starts
    /// from it instead of reading it again.
    instance: std::sync::Mutex<Option<Instance>>,
    /// Image aliases resolved in this reconcile, alias → fingerprint.
    images: std::sync::Mutex<BTreeMap<String, Option<String>>>,
}

impl Carried {
    fn take_instance(&self) -> Option<Instance> {
        self.instance
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
    }

    fn keep_instance(&self, instance: &Instance) {
        *self.instance.lock().unwrap_or_else(|e| e.into_inner()) = Some(instance.clone());
    }

    fn image(&self, alias: &str) -> Option<Option<String>> {
        let images = self.images.lock().unwrap_or_else(|e| e.into_inner());
        images.get(alias).cloned()
    }

    fn remember_image(&self, alias: &str, fingerprint: Option<String>) {
        let mut images = self.images.lock().unwrap_or_else(|e| e.into_inner());
        images.insert(alias.to_string(), fingerprint);
    }
}

/// Whether a command runs in the container `name` yet: `true` once it booted. A container
/// still starting (LXD refusing the exec, or a transient error) is not an error.
pub(super) async fn answers(
    runtime: &dyn crate::runtime::Runtime,
    name: &str,
    timeout: Duration,
) -> Result<bool, RuntimeError> {
    let probe = ExecRequest::new(["true"], timeout).discarding_output();
    match runtime.exec(name, &probe).await {
        Ok(out) => Ok(out.success()),
        Err(e) if e.is_transient() || matches!(e, RuntimeError::Rejected { .. }) => Ok(false),
        Err(e) => Err(e),
    }
}
