//! Host forwards (`spec.forwards`): `127.0.0.1:PORT` inside a project's container reaches an
//! address on the berth host through an LXD `proxy` device bound in the instance, so a model
//! server or gateway on the host is reachable without a NIC.
//!
//! Which targets are allowed is decided at admission ([`check_target`]); the devices are laid
//! into the create request and converged on a running container ([`drift`]).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;

use berth_api::{AGENT_API_PORT, Forward};

use crate::runtime::Device;

/// Every forward device berth manages is named with this prefix and the port.
pub const DEVICE_PREFIX: &str = "berth-forward-";

/// The device name of the forward of `port`.
pub fn device_name(port: u16) -> String {
    format!("{DEVICE_PREFIX}{port}")
}

/// The proxy device of one forward: it listens inside the instance (`bind=instance`) on the
/// container's loopback and connects on the host. A forward whose `to` does not parse has no
/// device (admission refuses it; a stored one predating the rule is left out).
pub fn device(forward: &Forward) -> Option<Device> {
    let target = forward.target()?;
    Some(BTreeMap::from([
        ("type".to_string(), "proxy".to_string()),
        ("bind".to_string(), "instance".to_string()),
        (
            "listen".to_string(),
            format!("tcp:127.0.0.1:{}", forward.port),
        ),
        ("connect".to_string(), format!("tcp:{target}")),
    ]))
}

/// The device through which a project's agent reaches berth's agent API (a `schedules`
/// capability): `127.0.0.1:`[`AGENT_API_PORT`] inside the container, berth's agent socket on
/// the host.
pub const AGENT_API_DEVICE: &str = "berth-agent-api";

fn agent_api_device(socket: &Path) -> Device {
    BTreeMap::from([
        ("type".to_string(), "proxy".to_string()),
        ("bind".to_string(), "instance".to_string()),
        (
            "listen".to_string(),
            format!("tcp:127.0.0.1:{AGENT_API_PORT}"),
        ),
        ("connect".to_string(), format!("unix:{}", socket.display())),
    ])
}

/// The proxy devices a spec asks for, by device name: its forwards, and the agent API's
/// when `agent_api` (berth's agent socket) is given for a project that asks for it.
pub fn devices(forwards: &[Forward], agent_api: Option<&Path>) -> BTreeMap<String, Device> {
    let mut devices: BTreeMap<String, Device> = forwards
        .iter()
        .filter_map(|f| Some((device_name(f.port), device(f)?)))
        .collect();
    if let Some(socket) = agent_api {
        devices.insert(AGENT_API_DEVICE.to_string(), agent_api_device(socket));
    }
    devices
}

/// What differs between the forwards asked for and an instance's devices: the devices to add
/// or replace, and the names of berth's forward devices nobody asks for any more.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Drift {
    pub upsert: BTreeMap<String, Device>,
    pub remove: Vec<String>,
}

impl Drift {
    pub fn is_empty(&self) -> bool {
        self.upsert.is_empty() && self.remove.is_empty()
    }
}

pub fn drift(
    forwards: &[Forward],
    agent_api: Option<&Path>,
    have: &BTreeMap<String, Device>,
) -> Drift {
    let want = devices(forwards, agent_api);
    let upsert = want
        .iter()
        .filter(|(name, device)| have.get(*name) != Some(device))
        .map(|(name, device)| (name.clone(), device.clone()))
        .collect();
    let remove = have
        .keys()
        .filter(|name| {
            (name.starts_with(DEVICE_PREFIX) || *name == AGENT_API_DEVICE)
                && !want.contains_key(*name)
        })
        .cloned()
        .collect();
    Drift { upsert, remove }
}

/// Whether a forward may reach `to`: a loopback address, or one listed in the config's
/// `allowedForwardTargets` (`HOST:PORT`, compared as addresses).
pub fn check_target(to: &str, allowed: &[String]) -> Result<(), String> {
    let Ok(target) = to.parse::<SocketAddr>() else {
        return Err(format!("{to:?} must be IP:PORT (IPv6 as [ADDR]:PORT)"));
    };
    if target.ip().is_loopback() {
        return Ok(());
    }
    let listed = allowed
        .iter()
        .any(|a| a.parse::<SocketAddr>().is_ok_and(|a| a == target));
    if listed {
        Ok(())
    } else {
        Err(format!(
            "{to:?} is neither a loopback address nor listed in allowedForwardTargets"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fwd(port: u16, to: &str) -> Forward {
        Forward {
            port,
            to: to.to_string(),
        }
    }

    #[test]
    fn a_forward_is_a_proxy_bound_in_the_instance() {
        let d = device(&fwd(8080, "127.0.0.1:11434")).unwrap();
        assert_eq!(d["type"], "proxy");
        assert_eq!(d["bind"], "instance");
        assert_eq!(d["listen"], "tcp:127.0.0.1:8080");
        assert_eq!(d["connect"], "tcp:127.0.0.1:11434");
        let v6 = device(&fwd(1, "[::1]:9")).unwrap();
        assert_eq!(v6["connect"], "tcp:[::1]:9");
        assert!(device(&fwd(1, "localhost:9")).is_none());
    }

    #[test]
    fn drift_adds_changes_and_removes_only_berths_forwards() {
        let mut have = devices(&[fwd(1000, "127.0.0.1:1"), fwd(2000, "127.0.0.1:2")], None);
        have.insert("workspace".into(), Device::new());
        let want = [
            fwd(1000, "127.0.0.1:1"),
            fwd(2000, "127.0.0.1:3"),
            fwd(3000, "127.0.0.1:4"),
        ];
        let d = drift(&want, None, &have);
        assert_eq!(
            d.upsert.keys().collect::<Vec<_>>(),
            ["berth-forward-2000", "berth-forward-3000"]
        );
        assert!(d.remove.is_empty());
        let d = drift(&[], None, &have);
        assert!(d.upsert.is_empty());
        assert_eq!(d.remove, ["berth-forward-1000", "berth-forward-2000"]);
        assert!(drift(&want[..1], None, &devices(&want[..1], None)).is_empty());
        // The agent API's device comes and goes with the capability.
        let socket = Path::new("/var/lib/berth/agent-api.sock");
        let with = devices(&want[..1], Some(socket));
        assert_eq!(
            with[AGENT_API_DEVICE]["connect"],
            "unix:/var/lib/berth/agent-api.sock"
        );
        assert_eq!(
            with[AGENT_API_DEVICE]["listen"],
            format!("tcp:127.0.0.1:{AGENT_API_PORT}")
        );
        let added = drift(&want[..1], Some(socket), &devices(&want[..1], None));
        assert_eq!(added.upsert.keys().collect::<Vec<_>>(), [AGENT_API_DEVICE]);
        assert_eq!(drift(&want[..1], None, &with).remove, [AGENT_API_DEVICE]);
    }

    #[test]
    fn targets_are_loopback_or_listed() {
        let allowed = vec!["10.0.0.5:8080".to_string()];
        // (to, allowed?)
        let cases = [
            ("127.0.0.1:11434", true),
            ("127.0.0.2:80", true),
            ("[::1]:80", true),
            ("10.0.0.5:8080", true),
            ("10.0.0.5:8081", false),
            ("192.168.1.1:80", false),
            ("example.com:80", false),
        ];
        for (to, ok) in cases {
            let got = check_target(to, &allowed);
            assert_eq!(got.is_ok(), ok, "{to}: {got:?}");
            if let Err(e) = got {
                assert!(e.contains(to), "{e}");
            }
        }
    }
}
