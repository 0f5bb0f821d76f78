//! Where a project's durable data lives in LXD and how its container is labelled.
//!
//! Volumes are keyed by the project's uid, not its name, so a project deleted and re-created
//! under the same name gets fresh volumes, and a container can always be replaced without
//! touching them.
//!
//! Also the labels: `user.berth.uid` (the project a container or volume belongs to) and
//! `user.berth.controller`, the store's own id, made once by its v6 migration, so two daemons on
//! one LXD never take each other's. The reconciler, the scheduler, the workspace inspection, the
//! tools and the trash all name things through here.

use std::collections::BTreeMap;

use crate::runtime::Device;

/// The config key that marks a container or volume as berth's, holding the project's uid.
pub const UID_LABEL: &str = "user.berth.uid";
/// The config key naming the controller (its store's id) that created a container or volume.
pub const CONTROLLER_LABEL: &str = "user.berth.controller";
/// On a warm pool member: the id of the controller whose pool it is. A claim clears it in the
/// same update that sets the project's labels and attaches its volumes, so a container
/// carrying it has never held a project's data.
pub const POOL_LABEL: &str = "user.berth.pool";
/// On a warm pool member: `true` once it booted, answered and was stopped again.
pub const POOL_READY_LABEL: &str = "user.berth.pool.ready";
/// The prefix of every label berth sets; listing by it finds berth's instances in one call.
pub const LABEL_PREFIX: &str = "user.berth.";
/// On a home volume made for a profile added to an existing container: `pending` until what
/// the container already held at the home path was copied in (then the key goes).
pub const CARRY_KEY: &str = "user.berth.carry";
/// On a container: the workspace size (bytes) last applied to its workspace volume, so a
/// reconcile compares the spec with its own config and asks LXD for the volume only when they
/// differ (a changed size, a new container).
pub const WORKSPACE_SIZE_KEY: &str = "user.berth.workspaceSize";
/// The finalizer that holds a project until its container and volumes are gone.
pub const FINALIZER: &str = berth_api::TEARDOWN_FINALIZER;

/// One durable volume and where it is attached in the container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mount {
    /// The instance device name.
    pub device: String,
    /// The custom storage volume.
    pub volume: String,
    /// Mount point inside the container.
    pub path: String,
    /// Quota for the volume (bytes), where the pool enforces one.
    pub size_bytes: Option<u64>,
}

/// The durable layout of one project: its workspace and one home per agent profile.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DurableLayout {
    pub uid: String,
    /// The id of the controller creating them ([`crate::store::Store::controller_id`]).
    pub controller: String,
    pub mounts: Vec<Mount>,
}

impl DurableLayout {
    pub fn workspace_volume(uid: &str) -> String {
        format!("berth-{uid}-workspace")
    }

    pub fn home_volume(uid: &str, profile: &str) -> String {
        format!("berth-{uid}-home-{profile}")
    }

    /// The layout for a project with `homes` as (profile name, home path) pairs, created by
    /// the controller `controller`.
    pub fn new(
        uid: &str,
        controller: &str,
        workspace_size: Option<u64>,
        homes: &[(String, String)],
    ) -> Self {
        let mut mounts = vec![Mount {
            device: "workspace".to_string(),
            volume: Self::workspace_volume(uid),
            path: "/workspace".to_string(),
            size_bytes: workspace_size,
        }];
        for (profile, home) in homes {
            mounts.push(Mount {
                device: format!("home-{profile}"),
                volume: Self::home_volume(uid, profile),
                path: home.clone(),
                size_bytes: None,
            });
        }
        DurableLayout {
            uid: uid.to_string(),
            controller: controller.to_string(),
            mounts,
        }
    }

    /// What the name of every volume of the project with this uid starts with.
    pub fn volume_prefix(uid: &str) -> String {
        format!("berth-{uid}-")
    }

    /// Whether a volume name belongs to the project with this uid.
    /// A volume in the trash (`berth-trash-...`) is no project's, whatever uid it names.
    pub fn owns_volume(uid: &str, volume: &str) -> bool {
        !crate::trash::is_trash_name(volume)
            && volume
                .strip_prefix("berth-")
                .and_then(|rest| rest.strip_prefix(uid))
                .is_some_and(|rest| rest == "-workspace" || rest.starts_with("-home-"))
    }

    /// The disk devices that attach every mount from `pool`.
    pub fn devices(&self, pool: &str) -> BTreeMap<String, Device> {
        self.mounts
            .iter()
            .map(|m| (m.device.clone(), disk_device(pool, &m.volume, &m.path)))
            .collect()
    }

    /// Mounts the instance's devices lack or attach differently.
    pub fn missing_from<'a>(
        &'a self,
        pool: &str,
        devices: &BTreeMap<String, Device>,
    ) -> Vec<&'a Mount> {
        self.mounts
            .iter()
            .filter(|m| devices.get(&m.device) != Some(&disk_device(pool, &m.volume, &m.path)))
            .collect()
    }

    /// The labels every volume and container of this project carries.
    pub fn labels(&self) -> BTreeMap<String, String> {
        BTreeMap::from([
            (UID_LABEL.to_string(), self.uid.clone()),
            (CONTROLLER_LABEL.to_string(), self.controller.clone()),
        ])
    }
}

pub fn disk_device(pool: &str, volume: &str, path: &str) -> Device {
    BTreeMap::from([
        ("type".to_string(), "disk".to_string()),
        ("pool".to_string(), pool.to_string()),
        ("source".to_string(), volume.to_string()),
        ("path".to_string(), path.to_string()),
    ])
}

/// The uid label of an instance or volume config, if it has one.
pub fn uid_label(config: &BTreeMap<String, String>) -> Option<&str> {
    config.get(UID_LABEL).map(String::as_str)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn volumes_are_keyed_by_uid() {
        let layout = DurableLayout::new(
            "u-1",
            "c-1",
            Some(1 << 30),
            &[("claude".into(), "/root/.claude".into())],
        );
        let names: Vec<(&str, &str)> = layout
            .mounts
            .iter()
            .map(|m| (m.volume.as_str(), m.path.as_str()))
            .collect();
        assert_eq!(
            names,
            [
                ("berth-u-1-workspace", "/workspace"),
                ("berth-u-1-home-claude", "/root/.claude")
            ]
        );
        assert!(DurableLayout::owns_volume("u-1", "berth-u-1-workspace"));
        assert!(DurableLayout::owns_volume("u-1", "berth-u-1-home-claude"));
        assert!(!DurableLayout::owns_volume("u-1", "berth-u-12-workspace"));
        assert!(!DurableLayout::owns_volume("u-1", "other"));
        assert!(!DurableLayout::owns_volume(
            "u-1",
            "berth-trash-u-1-workspace"
        ));
        assert!(!DurableLayout::owns_volume(
            "trash",
            "berth-trash-workspace"
        ));
    }

    #[test]
    fn missing_mounts_are_found_by_device_content() {
        let layout = DurableLayout::new("u", "c", None, &[("shell".into(), "/root".into())]);
        let mut devices = layout.devices("default");
        assert!(layout.missing_from("default", &devices).is_empty());
        devices.remove("home-shell");
        devices
            .get_mut("workspace")
            .unwrap()
            .insert("path".into(), "/elsewhere".into());
        let missing: Vec<&str> = layout
            .missing_from("default", &devices)
            .iter()
            .map(|m| m.device.as_str())
            .collect();
        assert_eq!(missing, ["workspace", "home-shell"]);
    }
}
