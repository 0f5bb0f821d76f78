//! A new project's container taken from the warm pool (`pool.size`): a member of the pool's
//! image claimed in the Created step, renamed to the project's name, given its labels, limits
//! and volumes in one update that clears the pool's label, and started; each part judged by
//! what LXD shows, so a claim interrupted anywhere resumes.

use std::time::Duration;

use super::Project;
use crate::layout::uid_label;
use crate::reconcile::status::Draft;
use crate::reconcile::{Action, ReconcileError, fault, own_changes, pool};
use crate::runtime::{ImageSource, Instance, InstancePatch, InstanceStatus};

impl Project<'_> {
    /// A warm pool member for this new project, when it can use one: of the pool's image
    /// (the same alias, resolved to the same fingerprint), to run at once, on a single LXD
    /// server (a cluster places each project on a member first). Anything else, or an empty
    /// pool, creates its container the plain way.
    pub(super) fn take_from_pool(&self, draft: &Draft, image: &ImageSource) -> Option<String> {
        let pool = &self.ctx.settings.pool;
        if pool.wanted() == 0 || self.spec.image != pool.image() || !self.starts_at_once(draft) {
            return None;
        }
        let ImageSource::Fingerprint(fingerprint) = image else {
            return None;
        };
        let taken = pool.take(fingerprint, &self.ctx.metrics);
        if taken.is_none() {
            let empty = crate::metrics::ReasonLabels {
                reason: "empty".into(),
            };
            self.ctx.metrics.pool_fallbacks.get_or_create(&empty).inc();
        }
        taken
    }

    /// Step Created by a claim of the warm pool member recorded in `draft`: renamed to the
    /// project's name, then its labels, limits and devices set and the pool's label cleared in
    /// one update, then started. `found` is the instance under the project's name. Each part
    /// is judged by what LXD shows, so a controller killed anywhere resumes here: a member not
    /// renamed yet is renamed, one renamed but not updated is updated, and a member gone
    /// before its rename leaves the claim for the plain create.
    pub(super) async fn finish_claim(
        &self,
        mut draft: Draft,
        found: Option<Instance>,
    ) -> Result<Action, ReconcileError> {
        let runtime = &*self.ctx.runtime;
        let controller = self.ctx.store.controller_id();
        let member = draft.record.pool_member.clone().unwrap_or_default();
        let instance = match found {
            Some(instance) => instance,
            None => match runtime.get_instance_record(&member).await? {
                Some(unclaimed) if pool::is_member(&unclaimed, controller) => {
                    let rename = runtime.rename_instance(
                        &member,
                        self.name(),
                        self.ctx.settings.timeouts.start,
                    );
                    self.own_change(own_changes::RENAMED, rename).await?;
                    fault::after_call("rename_pool_member");
                    Instance {
                        name: self.name().to_string(),
                        ..unclaimed
                    }
                }
                // Renamed since the read that found no container of the project's name (a
                // list from before the rename): read again.
                _ if let Some(renamed) = runtime.get_instance_record(self.name()).await? => renamed,
                _ => {
                    tracing::info!(member, "the claimed pool member is gone; creating instead");
                    let lost = crate::metrics::ReasonLabels {
                        reason: "lost".into(),
                    };
                    self.ctx.metrics.pool_fallbacks.get_or_create(&lost).inc();
                    draft.record.pool_member = None;
                    self.commit(&mut draft).await?;
                    return Ok(Action::Requeue(Duration::ZERO));
                }
            },
        };
        if uid_label(&instance.config) != Some(self.uid()) {
            if !pool::is_member(&instance, controller) {
                return self.name_conflict(draft).await;
            }
            if let Err(refused) = self.give_member(&instance).await? {
                return self.creation_failed(draft, &refused).await;
            }
        }
        if instance.status == InstanceStatus::Stopped && self.starts_at_once(&draft) {
            self.start().await?;
        }
        draft.record.pool_member = None;
        self.ctx
            .settings
            .pool
            .claimed(self.name(), &self.ctx.metrics);
        match runtime.get_instance_record(self.name()).await? {
            Some(instance) => self.record_created(draft, &instance).await,
            None => Err(ReconcileError::Failed(
                "the claimed pool member vanished after its rename".into(),
            )),
        }
    }

    /// Gives the renamed member what a create request would have carried (labels, limits,
    /// volumes, forwards), clearing the pool's labels in the same update. LXD refusing the
    /// fleet's default limits is handled as on a create; `Err` is LXD refusing the project's.
    async fn give_member(&self, member: &Instance) -> Result<Result<(), String>, ReconcileError> {
        let image = ImageSource::Fingerprint(member.base_image().unwrap_or_default().to_string());
        let give = |with_fleet| {
            let request = self.create_request(image.clone(), with_fleet, None);
            let mut patch = InstancePatch {
                config: request.config,
                devices: request.devices,
            };
            patch.config.extend(pool::claim_clears());
            async move {
                let update = self.ctx.runtime.patch_instance(self.name(), &patch);
                self.own_change(own_changes::UPDATED, update).await
            }
        };
        self.fleet_limits_best_effort("claiming", give).await
    }
}
