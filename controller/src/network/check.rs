//! The scheduler's IPv4 check, as a pure decision: from what status records of a running
//! project's network and what this round's inspection saw, whether to record, to repair, or
//! to leave it be. One repair per loss: a repair that fails is recorded
//! (`repairFailedAt`), and nothing is repaired again until an address returns.

use std::collections::BTreeMap;

use berth_api::NetworkStatus;
use chrono::{DateTime, Utc};

/// The interface that is never the container's network.
const LOOPBACK: &str = "lo";

/// What the check decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Check {
    /// Nothing to write, nothing to do.
    Steady,
    /// Write this as `status.network`.
    Record(NetworkStatus),
    /// Every address the container had is gone: repair it once.
    Repair,
}

/// `recorded`: `status.network`; `seen`: the inspection's IPv4 addresses by interface (`None`
/// when it could not tell, which decides nothing).
pub fn check(
    recorded: Option<&NetworkStatus>,
    seen: Option<&BTreeMap<String, Vec<String>>>,
) -> Check {
    let Some(seen) = seen else {
        return Check::Steady;
    };
    let addresses: BTreeMap<String, Vec<String>> = seen
        .iter()
        .filter(|(interface, addresses)| *interface != LOOPBACK && !addresses.is_empty())
        .map(|(interface, addresses)| (interface.clone(), addresses.clone()))
        .collect();
    if !addresses.is_empty() {
        let now = NetworkStatus {
            ipv4: addresses,
            repair_failed_at: None,
        };
        return if recorded == Some(&now) {
            Check::Steady
        } else {
            Check::Record(now)
        };
    }
    match recorded {
        Some(r) if !r.ipv4.is_empty() && r.repair_failed_at.is_none() => Check::Repair,
        _ => Check::Steady,
    }
}

/// `status.network` after a repair that left no IPv4 address: the addresses it had stay, so
/// a person sees what was lost.
pub fn repair_failed(recorded: &NetworkStatus, at: DateTime<Utc>) -> NetworkStatus {
    NetworkStatus {
        ipv4: recorded.ipv4.clone(),
        repair_failed_at: Some(at),
    }
}

#[cfg(test)]
#[path = "check_tests.rs"]
mod tests;
