//! The resource envelope: a project's CPU, memory and disk limits as LXD config keys.
//!
//! A limit the project's spec asks for must apply, or the launch fails with
//! `ResourcesApplied=False`; a limit that comes from the fleet defaults is best effort (applied
//! when LXD takes it, a warning event when it does not). A size the storage pool cannot enforce
//! is not a failure: it is reported as `QuotaNotEnforced`.

use std::collections::BTreeMap;

use crate::runtime::Device;

/// Where a limit came from, which decides what a failure to apply it means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// Written in the project's spec: must apply.
    Project,
    /// The fleet default: best effort.
    FleetDefault,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limit {
    pub value: u64,
    pub origin: Origin,
}

/// Limits in the units LXD takes: millicores and bytes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Envelope {
    pub cpu_millis: Option<Limit>,
    pub memory_bytes: Option<Limit>,
    /// Root disk size.
    pub disk_bytes: Option<Limit>,
    /// Quota of the workspace volume.
    pub workspace_bytes: Option<Limit>,
    /// The most processes at once (`limits.processes`).
    pub processes: Option<Limit>,
}

/// The config keys berth manages for limits; a key absent from the desired set is removed.
pub const LIMIT_KEYS: [&str; 4] = [
    "limits.cpu",
    "limits.cpu.allowance",
    "limits.memory",
    "limits.processes",
];

impl Envelope {
    /// The instance config keys for CPU, memory and processes. Whole CPUs pin that many CPUs
    /// (`limits.cpu`); a fraction becomes a hard time quota (`limits.cpu.allowance`).
    pub fn config(&self, include: impl Fn(Origin) -> bool) -> BTreeMap<String, String> {
        let mut config = BTreeMap::new();
        if let Some(cpu) = self.cpu_millis.filter(|l| include(l.origin)) {
            if cpu.value % 1000 == 0 {
                config.insert("limits.cpu".to_string(), (cpu.value / 1000).to_string());
            } else {
                // Per 100 ms period: 500m is 50ms/100ms.
                let ms = cpu.value.div_ceil(10).max(1);
                config.insert("limits.cpu.allowance".to_string(), format!("{ms}ms/100ms"));
            }
        }
        if let Some(memory) = self.memory_bytes.filter(|l| include(l.origin)) {
            config.insert("limits.memory".to_string(), memory.value.to_string());
        }
        if let Some(processes) = self.processes.filter(|l| include(l.origin)) {
            config.insert("limits.processes".to_string(), processes.value.to_string());
        }
        config
    }

    /// The root disk device carrying the disk size, when a size is asked for.
    pub fn root_device(&self, pool: &str, include: impl Fn(Origin) -> bool) -> Option<Device> {
        let disk = self.disk_bytes.filter(|l| include(l.origin))?;
        Some(BTreeMap::from([
            ("type".to_string(), "disk".to_string()),
            ("path".to_string(), "/".to_string()),
            ("pool".to_string(), pool.to_string()),
            ("size".to_string(), disk.value.to_string()),
        ]))
    }

    /// Whether any size (root disk or workspace) is asked for.
    pub fn has_sizes(&self) -> bool {
        self.disk_bytes.is_some() || self.workspace_bytes.is_some()
    }

    /// The config keys whose value differs from what the instance has: to patch in
    /// (a key mapped to "" is to be removed).
    pub fn drift(
        &self,
        current: &BTreeMap<String, String>,
        include: impl Fn(Origin) -> bool,
    ) -> BTreeMap<String, String> {
        let desired = self.config(include);
        let mut patch = BTreeMap::new();
        for key in LIMIT_KEYS {
            let want = desired.get(key).map(String::as_str).unwrap_or("");
            let have = current.get(key).map(String::as_str).unwrap_or("");
            if want != have {
                patch.insert(key.to_string(), want.to_string());
            }
        }
        patch
    }
}

/// Whether a storage pool driver enforces volume and root disk sizes (LXD's `dir` does not).
pub fn driver_enforces_quotas(driver: &str) -> bool {
    matches!(
        driver,
        "zfs" | "btrfs" | "lvm" | "ceph" | "cephfs" | "powerflex"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn project(value: u64) -> Option<Limit> {
        Some(Limit {
            value,
            origin: Origin::Project,
        })
    }

    #[test]
    fn limits_become_lxd_keys() {
        let cases: &[(u64, &str, &str)] = &[
            (2000, "limits.cpu", "2"),
            (1000, "limits.cpu", "1"),
            (500, "limits.cpu.allowance", "50ms/100ms"),
            (1500, "limits.cpu.allowance", "150ms/100ms"),
            (1, "limits.cpu.allowance", "1ms/100ms"),
        ];
        for (millis, key, value) in cases {
            let envelope = Envelope {
                cpu_millis: project(*millis),
                ..Envelope::default()
            };
            let config = envelope.config(|_| true);
            assert_eq!(
                config.get(*key).map(String::as_str),
                Some(*value),
                "{millis}m"
            );
            assert_eq!(config.len(), 1);
        }
        let envelope = Envelope {
            memory_bytes: project(4 << 30),
            ..Envelope::default()
        };
        assert_eq!(envelope.config(|_| true)["limits.memory"], "4294967296");
    }

    #[test]
    fn fleet_defaults_can_be_left_out() {
        let envelope = Envelope {
            cpu_millis: Some(Limit {
                value: 2000,
                origin: Origin::FleetDefault,
            }),
            memory_bytes: project(1 << 30),
            ..Envelope::default()
        };
        let only_project = envelope.config(|o| o == Origin::Project);
        assert_eq!(only_project.keys().collect::<Vec<_>>(), ["limits.memory"]);
    }

    #[test]
    fn drift_lists_changed_and_stale_keys() {
        let envelope = Envelope {
            memory_bytes: project(1 << 30),
            ..Envelope::default()
        };
        let current = BTreeMap::from([
            ("limits.cpu".to_string(), "2".to_string()),
            ("limits.memory".to_string(), "1073741824".to_string()),
        ]);
        let drift = envelope.drift(&current, |_| true);
        assert_eq!(
            drift,
            BTreeMap::from([("limits.cpu".to_string(), String::new())])
        );
    }
}
