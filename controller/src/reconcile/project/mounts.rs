//! A project's durable volumes on its container: each mount's volume created with the
//! project's labels, a missing mount re-attached, and what a container already held at a new
//! home's path copied into its volume (`user.berth.carry=pending`) before the volume hides it.

use std::collections::BTreeMap;
use std::time::Duration;

use berth_api::{ConditionStatus, Step, condition_types};

use super::cluster::member_name;
use super::{Concern, Next, Project};
use crate::layout::CARRY_KEY;
use crate::reconcile::ReconcileError;
use crate::reconcile::status::Draft;
use crate::runtime::{
    CreateVolume, ExecRequest, Instance, InstancePatch, InstanceStatus, RuntimeError,
};

/// How long copying what a container holds at a home path into its new volume may take.
const CARRY_TIMEOUT: Duration = Duration::from_secs(600);

/// Copies directory `$1` into `$2` (the new volume, mounted aside) with owners, modes and
/// links, and prints how many entries it copied; nothing there is `0`.
const CARRY_SCRIPT: &str = r#"src=$1 dst=$2
if [ -d "$src" ] && [ -n "$(ls -A "$src")" ]; then
  cp -a "$src"/. "$dst"/ && find "$dst" -mindepth 1 | wc -l
else
  echo 0
fi"#;

impl Project<'_> {
    /// Mounts: re-attaches what is missing (a device removed by hand, a new profile home).
    pub(super) async fn reattach_mounts(&self, draft: &mut Draft, instance: &Instance) -> Concern {
        let runtime = &*self.ctx.runtime;
        let settings = &self.ctx.settings;
        let missing: Vec<_> = self
            .layout
            .missing_from(&settings.storage_pool, &instance.devices)
            .into_iter()
            .cloned()
            .collect();
        draft.set_condition(
            condition_types::MOUNTS_READY,
            ConditionStatus::True,
            "Attached",
            "",
        );
        if missing.is_empty() {
            return Ok(Next::Continue);
        }
        let mut patch = InstancePatch::default();
        let member = member_name(&instance.location);
        let mut waiting = Vec::new();
        for mount in &missing {
            if self.carry_pending(mount, member.as_deref()).await? {
                // What the container holds at the path goes into the volume before the
                // volume hides it; that needs the container running.
                if instance.status != InstanceStatus::Running {
                    waiting.push(mount.path.as_str());
                    continue;
                }
                self.carry_into(mount, member.as_deref()).await?;
            }
            patch.devices.insert(
                mount.device.clone(),
                crate::layout::disk_device(&settings.storage_pool, &mount.volume, &mount.path),
            );
        }
        if !waiting.is_empty() {
            draft.set_condition(
                condition_types::MOUNTS_READY,
                ConditionStatus::False,
                "WaitingToCarry",
                &format!(
                    "{} will be copied into its new volume once the container runs",
                    waiting.join(", ")
                ),
            );
        }
        if patch.devices.is_empty() {
            return Ok(Next::Continue);
        }
        runtime.patch_instance(self.name(), &patch).await?;
        let paths: Vec<&str> = missing.iter().map(|m| m.path.as_str()).collect();
        self.warn(
            "MountsReattached",
            &format!("re-attached {}", paths.join(", ")),
        )
        .await;
        // Bootstrap runs again when the mount topology changed.
        if draft.step() > Step::Reachable {
            draft.set_step(Step::Reachable);
        }
        self.commit_and_go_on(draft).await
    }

    /// Whether `mount`'s volume waits for what the container holds at its path: a home volume
    /// made here, for a profile added to a container that already exists, is created so (the
    /// workspace, or a volume that exists, is attached as it is).
    async fn carry_pending(
        &self,
        mount: &crate::layout::Mount,
        member: Option<&str>,
    ) -> Result<bool, RuntimeError> {
        let runtime = &*self.ctx.runtime;
        let pool = &self.ctx.settings.storage_pool;
        if let Some(volume) = runtime.get_volume(pool, &mount.volume, member).await? {
            return Ok(volume.config.get(CARRY_KEY).is_some_and(|v| v == "pending"));
        }
        let home = mount.device != "workspace";
        let carry = home.then(|| (CARRY_KEY.to_string(), "pending".to_string()));
        self.create_volume(mount, member, carry).await?;
        Ok(home)
    }

    /// Copies what the running container holds at `mount`'s path into its new volume, mounted
    /// aside for the copy, so attaching the volume there hides nothing (a provider's logins
    /// and sessions from before its profile was added). Done again from the start when
    /// interrupted; the volume says it is done once the copy is.
    async fn carry_into(
        &self,
        mount: &crate::layout::Mount,
        member: Option<&str>,
    ) -> Result<(), ReconcileError> {
        let runtime = &*self.ctx.runtime;
        let pool = &self.ctx.settings.storage_pool;
        let device = format!("carry-{}", mount.device);
        let aside = format!("/run/berth-carry/{}", mount.device);
        let attach = InstancePatch {
            config: BTreeMap::new(),
            devices: BTreeMap::from([(
                device.clone(),
                crate::layout::disk_device(pool, &mount.volume, &aside),
            )]),
        };
        runtime.patch_instance(self.name(), &attach).await?;
        let copy = ExecRequest::new(
            [
                "sh",
                "-c",
                CARRY_SCRIPT,
                "sh",
                mount.path.as_str(),
                aside.as_str(),
            ],
            CARRY_TIMEOUT,
        );
        let output = runtime.exec(self.name(), &copy).await?;
        if !output.success() {
            return Err(ReconcileError::Failed(format!(
                "copying {} into its new volume {} failed (exit {}): {}",
                mount.path,
                mount.volume,
                output.exit_code,
                output.stderr_str().trim()
            )));
        }
        runtime
            .update_instance(self.name(), &move |edit| {
                edit.devices.remove(&device);
            })
            .await?;
        let done = BTreeMap::from([(CARRY_KEY.to_string(), String::new())]);
        runtime
            .patch_volume(pool, &mount.volume, &done, member)
            .await?;
        let copied: u64 = output.stdout_str().trim().parse().unwrap_or(0);
        if copied > 0 {
            self.warn_normal(
                "HomeCarried",
                &format!(
                    "copied {} ({copied} entries) into its new volume {} before mounting it there",
                    mount.path, mount.volume
                ),
            )
            .await;
        }
        Ok(())
    }

    /// Creates the volume of `mount` on `member` with the project's labels and `extra` (an
    /// existing one is left as it is).
    pub(super) async fn create_volume(
        &self,
        mount: &crate::layout::Mount,
        member: Option<&str>,
        extra: Option<(String, String)>,
    ) -> Result<(), RuntimeError> {
        let settings = &self.ctx.settings;
        let mut config = self.layout.labels();
        config.extend(extra);
        self.ctx
            .runtime
            .create_volume(&CreateVolume {
                pool: settings.storage_pool.clone(),
                name: mount.volume.clone(),
                size: mount.size_bytes.map(|b| b.to_string()),
                config,
                target: member.map(str::to_string),
            })
            .await?;
        Ok(())
    }
}
