//! The image a project's container is made from: the spec's alias or fingerprint resolved (an
//! alias once per reconcile, and once per resync pass while LXD's events are followed), the
//! recorded fingerprint as the fallback when the alias is gone, and `ImageOutdated` when the
//! alias moved on from the container's image.

use berth_api::{ConditionStatus, condition_types, reasons};

use super::Project;
use crate::reconcile::ReconcileError;
use crate::reconcile::status::Draft;
use crate::runtime::{ImageSource, Instance, RuntimeError};

impl Project<'_> {
    /// The image to create from: the alias (or fingerprint) in the spec, else the fingerprint
    /// recorded for the previous container, so a deleted alias does not strand a project.
    pub(super) async fn resolve_image(
        &self,
        draft: &Draft,
    ) -> Result<Option<ImageSource>, ReconcileError> {
        let runtime = &*self.ctx.runtime;
        let wanted = &self.spec.image;
        if let Some(fingerprint) = self.resolve_alias(wanted).await? {
            return Ok(Some(ImageSource::Fingerprint(fingerprint)));
        }
        if let Some(fingerprint) = runtime
            .resolve_image(&ImageSource::Fingerprint(wanted.clone()))
            .await?
        {
            return Ok(Some(ImageSource::Fingerprint(fingerprint)));
        }
        if let Some(recorded) = draft.record.fingerprint.clone()
            && let Some(fingerprint) = runtime
                .resolve_image(&ImageSource::Fingerprint(recorded))
                .await?
        {
            return Ok(Some(ImageSource::Fingerprint(fingerprint)));
        }
        Ok(None)
    }

    /// The fingerprint `alias` names now, resolved at most once per reconcile, and while LXD's
    /// events are followed at most once per resync pass (an image event makes it ask again).
    async fn resolve_alias(&self, alias: &str) -> Result<Option<String>, RuntimeError> {
        if let Some(known) = self.carried.image(alias) {
            return Ok(known);
        }
        let snapshot = &self.ctx.snapshot;
        let fingerprint = match snapshot.image(alias) {
            Some(known) => known,
            None => {
                let asked_at = tokio::time::Instant::now();
                let fingerprint = self
                    .ctx
                    .runtime
                    .resolve_image(&ImageSource::Alias(alias.to_string()))
                    .await?;
                snapshot.remember_image(alias, fingerprint.clone(), asked_at);
                fingerprint
            }
        };
        self.carried.remember_image(alias, fingerprint.clone());
        Ok(fingerprint)
    }

    /// `ImageOutdated`: the alias now names another image than the container was created from.
    /// The alias is resolved once per resync pass for every project that uses it (see
    /// [`Self::resolve_alias`]).
    pub(super) async fn check_image(
        &self,
        draft: &mut Draft,
        instance: &Instance,
    ) -> Result<(), ReconcileError> {
        let Some(base) = instance.base_image() else {
            return Ok(());
        };
        match self.resolve_alias(&self.spec.image).await? {
            Some(fingerprint) if fingerprint != base => draft.set_condition(
                condition_types::IMAGE_OUTDATED,
                ConditionStatus::True,
                reasons::NEW_IMAGE_AVAILABLE,
                &format!(
                    "image {:?} now points to {}; berth restart --recreate replaces the container (volumes stay)",
                    self.spec.image,
                    short(&fingerprint)
                ),
            ),
            _ => draft.set_condition(
                condition_types::IMAGE_OUTDATED,
                ConditionStatus::False,
                "Current",
                "",
            ),
        };
        Ok(())
    }
}

fn short(fingerprint: &str) -> &str {
    &fingerprint[..fingerprint.len().min(12)]
}
