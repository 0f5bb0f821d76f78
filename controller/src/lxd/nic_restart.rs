//! How LXD is made to restart an instance's network interfaces in place.
//!
//! LXD has no call that restarts a device. A device whose configuration changes in a key its
//! type cannot update live is stopped and started again, and LXD 5.0 then keeps its
//! `volatile.<device>.hwaddr` (a device removed and added back, or masked with `type: none`,
//! loses it and comes back with a new MAC address). `boot.priority` is such a key for every
//! NIC type and means nothing to a container, so the restart is two writes: every NIC with
//! `boot.priority` changed (a profile's NIC as an instance device of the same configuration),
//! then the instance's own devices as they were. Each write restarts the NICs; the second
//! leaves the configuration as it was found.

use std::collections::BTreeMap;

use super::wire::InstanceJson;
use crate::runtime::{Device, InstanceEdit};

const PRIORITY: &str = "boot.priority";

/// The NICs of one instance as read before the restart.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct NicRestart {
    /// Each NIC's device as the first write sets it: its configuration, `boot.priority` changed.
    nudged: BTreeMap<String, Device>,
    /// Each NIC's own device as it was: `None` for one only a profile gives.
    own: BTreeMap<String, Option<Device>>,
    /// The NICs' interface names inside the instance, in device order.
    pub interfaces: Vec<String>,
}

impl NicRestart {
    pub(crate) fn of(instance: &InstanceJson) -> NicRestart {
        let nics: BTreeMap<&String, &Device> = instance
            .expanded_devices
            .iter()
            .filter(|(_, d)| d.get("type").is_some_and(|t| t == "nic"))
            .collect();
        let nudged = nics
            .iter()
            .map(|(name, device)| {
                let mut device = (*device).clone();
                let other = if device.get(PRIORITY).is_some_and(|p| p == "1") {
                    "2"
                } else {
                    "1"
                };
                device.insert(PRIORITY.to_string(), other.to_string());
                ((*name).clone(), device)
            })
            .collect();
        let own = nics
            .keys()
            .map(|name| ((*name).clone(), instance.devices.get(*name).cloned()))
            .collect();
        let interfaces = nics
            .iter()
            .map(|(name, device)| interface_name(name, device, &instance.config))
            .collect();
        NicRestart {
            nudged,
            own,
            interfaces,
        }
    }

    /// The first write: every NIC with its priority changed.
    pub(crate) fn nudge(&self, edit: &mut InstanceEdit) {
        for (name, device) in &self.nudged {
            edit.devices.insert(name.clone(), device.clone());
        }
    }

    /// The second write: the instance's own devices as they were.
    pub(crate) fn restore(&self, edit: &mut InstanceEdit) {
        for (name, device) in &self.own {
            match device {
                Some(device) => edit.devices.insert(name.clone(), device.clone()),
                None => edit.devices.remove(name),
            };
        }
    }
}

/// The interface's name inside the instance: the device's `name`, else the one LXD chose and
/// recorded, else the device's name.
fn interface_name(device: &str, config: &Device, instance: &BTreeMap<String, String>) -> String {
    config
        .get("name")
        .or_else(|| instance.get(&format!("volatile.{device}.name")))
        .cloned()
        .unwrap_or_else(|| device.to_string())
}

#[cfg(test)]
#[path = "nic_restart_tests.rs"]
mod tests;
