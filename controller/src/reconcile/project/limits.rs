//! A project's resources: its envelope (the limits its spec holds, each the project's own or a
//! fleet default), the fleet's defaults as best effort on a create, `ResourcesApplied`, and the
//! limits and sizes converged on an existing container and its workspace volume.

use std::collections::{BTreeMap, HashSet};

use berth_api::{ConditionStatus, Resources, condition_types, reasons};

use super::cluster::member_name;
use super::{Concern, Next, Project};
use crate::layout::{DurableLayout, WORKSPACE_SIZE_KEY};
use crate::reconcile::ReconcileError;
use crate::reconcile::envelope::{Envelope, Limit, Origin};
use crate::reconcile::status::Draft;
use crate::runtime::{Instance, InstancePatch, RuntimeError};

impl Project<'_> {
    fn has_fleet_limits(&self) -> bool {
        let fleet = |l: Option<Limit>| l.is_some_and(|l| l.origin == Origin::FleetDefault);
        fleet(self.envelope.cpu_millis)
            || fleet(self.envelope.memory_bytes)
            || fleet(self.envelope.disk_bytes)
            || fleet(self.envelope.processes)
    }

    pub(super) fn has_project_limits(&self) -> bool {
        let project = |l: Option<Limit>| l.is_some_and(|l| l.origin == Origin::Project);
        project(self.envelope.cpu_millis)
            || project(self.envelope.memory_bytes)
            || project(self.envelope.disk_bytes)
            || project(self.envelope.workspace_bytes)
            || project(self.envelope.processes)
    }

    /// Runs `call` with the fleet's default limits and, when LXD refuses the container with
    /// them, once more without (a `FleetDefaultsNotApplied` Warning and the metric: the
    /// fleet's defaults are best effort). `Err` carries LXD's words when it refused what the
    /// project itself asks for.
    pub(super) async fn fleet_limits_best_effort<T, Fut>(
        &self,
        doing: &str,
        mut call: impl FnMut(bool) -> Fut,
    ) -> Result<Result<T, String>, ReconcileError>
    where
        Fut: Future<Output = Result<T, RuntimeError>>,
    {
        let mut with_fleet = true;
        loop {
            match call(with_fleet).await {
                Ok(done) => return Ok(Ok(done)),
                Err(e @ RuntimeError::Rejected { .. }) if with_fleet && self.has_fleet_limits() => {
                    with_fleet = false;
                    let message = format!(
                        "the fleet default limits were not applied ({e}); {doing} without them"
                    );
                    tracing::warn!("{message}");
                    self.ctx.metrics.fleet_defaults_refused.inc();
                    self.warn("FleetDefaultsNotApplied", &message).await;
                }
                Err(RuntimeError::Rejected { message, .. }) => return Ok(Err(message)),
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// `ResourcesApplied`: sizes the pool cannot enforce are reported, not failed.
    pub(super) async fn set_resources_applied(&self, draft: &mut Draft) {
        let settings = &self.ctx.settings;
        if self.envelope.has_sizes() && !settings.pool_enforces_quotas {
            let message = format!(
                "storage pool {:?} does not enforce sizes; disk and workspaceSize are not limits here",
                settings.storage_pool
            );
            let changed = draft.set_condition(
                condition_types::RESOURCES_APPLIED,
                ConditionStatus::True,
                reasons::QUOTA_NOT_ENFORCED,
                &message,
            );
            if changed {
                self.warn(reasons::QUOTA_NOT_ENFORCED, &message).await;
            }
        } else {
            draft.set_condition(
                condition_types::RESOURCES_APPLIED,
                ConditionStatus::True,
                reasons::APPLIED,
                "",
            );
        }
    }

    /// Applies project limits that differ from the container's; removes limits nobody asks
    /// for any more. Fleet defaults are applied at creation only (best effort).
    pub(super) async fn converge_limits(&self, draft: &mut Draft, instance: &Instance) -> Concern {
        let wanted_any = self.envelope.config(|_| true);
        let wanted_project = self.envelope.config(|o| o == Origin::Project);
        let mut patch = BTreeMap::new();
        for key in crate::reconcile::envelope::LIMIT_KEYS {
            let have = instance.config.get(key).map(String::as_str).unwrap_or("");
            match (wanted_project.get(key), wanted_any.get(key)) {
                (Some(want), _) if want != have => {
                    patch.insert(key.to_string(), want.clone());
                }
                (None, None) if !have.is_empty() => {
                    patch.insert(key.to_string(), String::new());
                }
                _ => {}
            }
        }
        if patch.is_empty() {
            self.set_resources_applied(draft).await;
            return Ok(Next::Continue);
        }
        let request = InstancePatch {
            config: patch,
            devices: BTreeMap::new(),
        };
        match self.ctx.runtime.patch_instance(self.name(), &request).await {
            Ok(()) => {
                self.set_resources_applied(draft).await;
                self.commit_and_go_on(draft).await
            }
            Err(RuntimeError::Rejected { message, .. }) => {
                draft.set_condition(
                    condition_types::RESOURCES_APPLIED,
                    ConditionStatus::False,
                    reasons::RESOURCES_REJECTED,
                    &message,
                );
                self.commit(draft).await?;
                Err(ReconcileError::Spec(format!(
                    "LXD refused the limits: {message}"
                )))
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Sizes the project asks for (`resources.disk`, the root disk's `size`; `workspaceSize`,
    /// the workspace volume's) applied to an existing container and volume when they changed:
    /// live where the pool enforces sizes (`Resized`), recorded with `ResizeUnsupported` where
    /// it does not, and `ResizePending` with LXD's words when LXD refuses (tried each pass).
    pub(super) async fn converge_sizes(&self, draft: &mut Draft, instance: &Instance) -> Concern {
        let runtime = &*self.ctx.runtime;
        let settings = &self.ctx.settings;
        let pool = &settings.storage_pool;
        let own = |limit: Option<Limit>| limit.filter(|l| l.origin == Origin::Project);
        let mut applied: Vec<&str> = Vec::new();
        let mut refused: Vec<String> = Vec::new();
        let mut record = BTreeMap::new();
        if let Some(root) = own(self.envelope.disk_bytes)
            .and_then(|_| self.envelope.root_device(pool, |o| o == Origin::Project))
        {
            let have = instance.devices.get("root").and_then(|d| d.get("size"));
            if have != root.get("size") {
                let patch = InstancePatch {
                    config: BTreeMap::new(),
                    devices: BTreeMap::from([("root".to_string(), root)]),
                };
                match runtime.patch_instance(self.name(), &patch).await {
                    Ok(()) => applied.push("spec.resources.disk"),
                    Err(RuntimeError::Rejected { message, .. }) => {
                        refused.push(format!("spec.resources.disk: {message}"));
                    }
                    Err(e) => return Err(e.into()),
                }
            }
        }
        // The volume is asked for only when the container's record of the size differs (a
        // changed size, a new container): a pass over an unchanged project costs LXD nothing.
        if let Some(size) = own(self.envelope.workspace_bytes)
            .map(|l| l.value.to_string())
            .filter(|want| instance.config.get(WORKSPACE_SIZE_KEY) != Some(want))
        {
            let member = member_name(&instance.location);
            let volume = DurableLayout::workspace_volume(self.object.uid());
            // A volume made without a size gets one too; a missing one is the mounts' concern.
            let have = runtime
                .get_volume(pool, &volume, member.as_deref())
                .await?
                .map(|v| v.config.get("size").cloned());
            if have
                .as_ref()
                .is_some_and(|have| have.as_deref() != Some(size.as_str()))
            {
                let config = BTreeMap::from([("size".to_string(), size.clone())]);
                match runtime
                    .patch_volume(pool, &volume, &config, member.as_deref())
                    .await
                {
                    Ok(()) => {
                        applied.push("spec.resources.workspaceSize");
                        record.insert(WORKSPACE_SIZE_KEY.to_string(), size);
                    }
                    Err(RuntimeError::Rejected { message, .. }) => {
                        refused.push(format!("spec.resources.workspaceSize: {message}"));
                    }
                    Err(e) => return Err(e.into()),
                }
            } else if have.is_some() {
                record.insert(WORKSPACE_SIZE_KEY.to_string(), size);
            }
        }
        if !record.is_empty() {
            let patch = InstancePatch {
                config: record,
                devices: BTreeMap::new(),
            };
            runtime.patch_instance(self.name(), &patch).await?;
        }
        if !refused.is_empty() {
            let message = refused.join("; ");
            let changed = draft.set_condition(
                condition_types::RESIZE_PENDING,
                ConditionStatus::True,
                reasons::RESIZE_REFUSED,
                &message,
            );
            if changed {
                self.warn(reasons::RESIZE_REFUSED, &message).await;
            }
        } else if draft
            .condition(condition_types::RESIZE_PENDING)
            .is_some_and(|c| c.status == ConditionStatus::True)
        {
            draft.set_condition(
                condition_types::RESIZE_PENDING,
                ConditionStatus::False,
                reasons::APPLIED,
                "",
            );
        }
        if applied.is_empty() {
            return Ok(Next::Continue);
        }
        if settings.pool_enforces_quotas {
            self.warn_normal(
                "Resized",
                &format!("applied {} to the running project", applied.join(", ")),
            )
            .await;
        } else {
            let message = format!(
                "{}: recorded, but storage pool {pool:?} does not enforce sizes",
                applied.join(", ")
            );
            self.warn(reasons::QUOTA_NOT_ENFORCED, &message).await;
            draft.set_condition(
                condition_types::RESIZE_UNSUPPORTED,
                ConditionStatus::True,
                reasons::QUOTA_NOT_ENFORCED,
                &message,
            );
        }
        self.commit_and_go_on(draft).await
    }
}

/// The project's envelope, from the limits its stored spec holds. Admission fills the fields a
/// manifest leaves out from the fleet defaults and lists the ones a manifest set itself in the
/// `berth.dev/overrides` annotation: those are the project's own and must apply; the others
/// came from the fleet and are best effort.
pub(super) fn envelope_of(spec: &Resources, overrides: Option<&str>) -> Envelope {
    let own: HashSet<&str> = overrides
        .unwrap_or_default()
        .split(',')
        .map(str::trim)
        .collect();
    let limit = |field: &str, value: Option<u64>| {
        value.map(|value| Limit {
            value,
            origin: if own.contains(field) {
                Origin::Project
            } else {
                Origin::FleetDefault
            },
        })
    };
    Envelope {
        cpu_millis: limit("resources.cpu", spec.cpu.as_ref().map(|c| c.millis())),
        memory_bytes: limit(
            "resources.memory",
            spec.memory.as_ref().map(|q| q.as_bytes()),
        ),
        disk_bytes: limit("resources.disk", spec.disk.as_ref().map(|q| q.as_bytes())),
        workspace_bytes: limit(
            "resources.workspaceSize",
            spec.workspace_size.as_ref().map(|q| q.as_bytes()),
        ),
        processes: limit("resources.processes", spec.processes.map(u64::from)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn envelope_tells_project_limits_from_fleet_defaults() {
        let spec = Resources {
            cpu: Some("2".parse().unwrap()),
            memory: Some("1GiB".parse().unwrap()),
            workspace_size: Some("10GiB".parse().unwrap()),
            ..Resources::default()
        };
        let envelope = envelope_of(
            &spec,
            Some("image,resources.memory,resources.workspaceSize"),
        );
        assert_eq!(
            envelope.cpu_millis,
            Some(Limit {
                value: 2000,
                origin: Origin::FleetDefault
            })
        );
        assert_eq!(
            envelope.memory_bytes,
            Some(Limit {
                value: 1 << 30,
                origin: Origin::Project
            })
        );
        assert_eq!(envelope.disk_bytes, None);
        assert_eq!(
            envelope.workspace_bytes.map(|l| l.origin),
            Some(Origin::Project)
        );
        // Without overrides every limit came from the fleet, whatever today's defaults are.
        let defaulted = envelope_of(&spec, None);
        assert_eq!(
            defaulted.memory_bytes,
            Some(Limit {
                value: 1 << 30,
                origin: Origin::FleetDefault
            })
        );
        assert_eq!(
            envelope_of(&Resources::default(), None),
            Envelope::default()
        );
    }
}
