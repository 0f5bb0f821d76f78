//! A project's network: the repair that re-applies its container's network configuration
//! ([`repair`]) and the scheduler's check of its IPv4 addresses ([`check`]).
//!
//! A project has a network when its container has a NIC: LXD gives it one from the profiles
//! of the LXD project berth uses (its `default` profile, since berth names none). The repair
//! has LXD restart every NIC with the configuration it has (the MAC address kept; the
//! addresses LXD itself sets, for the `routed` and `ipvlan` types, applied again), then brings
//! each interface up inside and runs the image's own networking for it (`restart.sh`), and
//! reads the outcome back from LXD's state of the instance.
//!
//! It works over `&dyn Runtime` alone. The image's own networking is `networkctl` or ifupdown; a
//! repair fails as `RepairError` (`NoInterface`, `NotRunning`, ...). The API's `repairnetwork`
//! and the scheduler's network pass both call [`repair`].

pub mod check;

use std::net::Ipv4Addr;
use std::time::Duration;

use serde::Serialize;

use crate::runtime::{ExecRequest, Runtime, RuntimeError};

/// Brings the interfaces up and runs the image's networking for them (POSIX `sh`).
const RESTART_SCRIPT: &str = include_str!("restart.sh");

/// How long the networking inside may take: a DHCP client waits for its lease.
pub const RESTART_TIMEOUT: Duration = Duration::from_secs(60);

/// The most of the script's complaints an answer carries.
const MAX_NOTES: usize = 20;
const MAX_NOTE_CHARS: usize = 200;

/// Why a repair could not be made.
#[derive(Debug, thiserror::Error)]
pub enum RepairError {
    /// The container has no NIC: nothing to repair.
    #[error(
        "the container has no network interface (no nic device of its own or from its profiles)"
    )]
    NoInterface,
    #[error("the container is not running")]
    NotRunning,
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
}

/// What a repair did and found: every NIC as LXD reports it afterwards.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NetworkRepair {
    pub interfaces: Vec<RepairedInterface>,
    /// What the networking inside said went wrong, line by line (untrusted, bounded).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RepairedInterface {
    pub name: String,
    /// Empty when LXD does not report the interface (it did not come back).
    pub mac: String,
    pub mtu: u32,
    pub addresses: Vec<String>,
}

impl NetworkRepair {
    /// The IPv4 addresses the interfaces have now.
    pub fn ipv4(&self) -> Vec<String> {
        self.interfaces
            .iter()
            .flat_map(|i| i.addresses.iter())
            .filter(|a| a.parse::<Ipv4Addr>().is_ok())
            .cloned()
            .collect()
    }

    /// `eth0 10.0.0.5, eth1 none`: for events and messages.
    pub fn summary(&self) -> String {
        self.interfaces
            .iter()
            .map(|i| {
                let v4: Vec<&str> = i
                    .addresses
                    .iter()
                    .filter(|a| a.parse::<Ipv4Addr>().is_ok())
                    .map(String::as_str)
                    .collect();
                if v4.is_empty() {
                    format!("{} no IPv4 address", i.name)
                } else {
                    format!("{} {}", i.name, v4.join(" "))
                }
            })
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// Re-applies the network configuration of the running instance `name` and restarts its
/// networking inside; the caller has made sure the instance is the project's.
pub async fn repair(runtime: &dyn Runtime, name: &str) -> Result<NetworkRepair, RepairError> {
    let running = runtime
        .get_instance_record(name)
        .await?
        .is_some_and(|i| i.is_running());
    if !running {
        return Err(RepairError::NotRunning);
    }
    let interfaces = runtime.restart_nics(name).await?;
    if interfaces.is_empty() {
        return Err(RepairError::NoInterface);
    }
    let mut command = vec![
        "sh".to_string(),
        "-c".to_string(),
        RESTART_SCRIPT.to_string(),
        "berth-network".to_string(),
    ];
    command.extend(interfaces.iter().cloned());
    let mut request = ExecRequest::new(command, RESTART_TIMEOUT);
    request.max_output = 64 * 1024;
    let output = runtime.exec(name, &request).await?;
    let notes = notes(&output.stderr_str());
    let state = runtime
        .get_instance(name)
        .await?
        .and_then(|i| i.state)
        .unwrap_or_default();
    let interfaces = interfaces
        .into_iter()
        .map(|name| match state.network.get(&name) {
            Some(n) => RepairedInterface {
                mac: n.mac.clone(),
                mtu: n.mtu,
                addresses: n.addresses.clone(),
                name,
            },
            None => RepairedInterface {
                name,
                mac: String::new(),
                mtu: 0,
                addresses: Vec::new(),
            },
        })
        .collect();
    Ok(NetworkRepair { interfaces, notes })
}

/// The script's complaints, control characters replaced and bounded.
fn notes(stderr: &str) -> Vec<String> {
    stderr
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .take(MAX_NOTES)
        .map(|l| {
            l.chars()
                .take(MAX_NOTE_CHARS)
                .map(|c| if c.is_control() { ' ' } else { c })
                .collect()
        })
        .collect()
}

#[cfg(test)]
#[path = "repair_tests.rs"]
mod tests;
