//! LXD's JSON shapes, and their conversion to the runtime's types.

use std::collections::BTreeMap;

use chrono::{DateTime, Datelike, Utc};
use serde::Deserialize;

use crate::runtime::{
    ClusterMember, Device, EventKind, Instance, InstanceState, InstanceStatus, NetworkState,
    Operation, OperationStatus, RuntimeEvent, Volume, instance_from_source,
};

/// A field LXD may send as `null`: an instance on an offline cluster member is listed with
/// `config`, `devices` and `profiles` null.
fn null_as_default<'de, D, T>(deserializer: D) -> Result<T, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Ok(Option::<T>::deserialize(deserializer)?.unwrap_or_default())
}

#[derive(Debug, Deserialize)]
pub(crate) struct ServerJson {
    #[serde(default)]
    pub api_extensions: Vec<String>,
    #[serde(default)]
    pub auth: String,
    #[serde(default)]
    pub environment: ServerEnvironmentJson,
}

#[derive(Debug, Default, Deserialize)]
pub(crate) struct ServerEnvironmentJson {
    #[serde(default)]
    pub server_version: String,
    #[serde(default)]
    pub server_clustered: bool,
    #[serde(default)]
    pub server_name: String,
}

/// `/1.0/resources`, the totals only.
#[derive(Debug, Deserialize)]
pub(crate) struct ResourcesJson {
    pub cpu: TotalJson,
    pub memory: TotalJson,
}

#[derive(Debug, Deserialize)]
pub(crate) struct TotalJson {
    pub total: u64,
}

#[derive(Debug, Deserialize)]
pub(crate) struct MemberJson {
    #[serde(default)]
    pub server_name: String,
    #[serde(default)]
    pub status: String,
    #[serde(default)]
    pub message: String,
    #[serde(default, deserialize_with = "null_as_default")]
    pub groups: Vec<String>,
}

impl From<MemberJson> for ClusterMember {
    fn from(m: MemberJson) -> ClusterMember {
        ClusterMember {
            name: m.server_name,
            status: m.status,
            message: m.message,
            groups: m.groups,
        }
    }
}

#[derive(Debug, Deserialize)]
pub(crate) struct InstanceJson {
    pub name: String,
    #[serde(default)]
    pub status: String,
    #[serde(default)]
    pub status_code: u16,
    #[serde(default)]
    pub location: String,
    #[serde(default, deserialize_with = "null_as_default")]
    pub profiles: Vec<String>,
    #[serde(default, deserialize_with = "null_as_default")]
    pub config: BTreeMap<String, String>,
    #[serde(default, deserialize_with = "null_as_default")]
    pub devices: BTreeMap<String, Device>,
    /// Its own devices and those its profiles give it, as LXD applies them.
    #[serde(default, deserialize_with = "null_as_default")]
    pub expanded_devices: BTreeMap<String, Device>,
    #[serde(default)]
    pub created_at: Option<DateTime<Utc>>,
    #[serde(default)]
    pub last_used_at: Option<DateTime<Utc>>,
    #[serde(default)]
    pub state: Option<StateJson>,
    // Kept so a full PUT sends back what it read.
    #[serde(default)]
    pub architecture: String,
    #[serde(default)]
    pub ephemeral: bool,
    #[serde(default)]
    pub stateful: bool,
    #[serde(default)]
    pub description: String,
}

/// LXD writes "never" as the zero time.
fn real_time(t: Option<DateTime<Utc>>) -> Option<DateTime<Utc>> {
    t.filter(|t| t.year() > 1970)
}

impl From<InstanceJson> for Instance {
    fn from(j: InstanceJson) -> Instance {
        Instance {
            status: InstanceStatus::parse(&j.status),
            status_code: j.status_code,
            location: j.location,
            profiles: j.profiles,
            config: j.config,
            devices: j.devices,
            created_at: real_time(j.created_at),
            last_used_at: real_time(j.last_used_at),
            state: j.state.map(InstanceState::from),
            name: j.name,
        }
    }
}

#[derive(Debug, Default, Deserialize)]
pub(crate) struct StateJson {
    #[serde(default)]
    pub pid: i64,
    #[serde(default)]
    pub processes: i64,
    #[serde(default)]
    pub cpu: Option<CpuJson>,
    #[serde(default)]
    pub memory: Option<MemoryJson>,
    #[serde(default)]
    pub disk: Option<BTreeMap<String, DiskJson>>,
    #[serde(default)]
    pub network: Option<BTreeMap<String, NetworkJson>>,
}

#[derive(Debug, Default, Deserialize)]
pub(crate) struct CpuJson {
    #[serde(default)]
    pub usage: i64,
}

#[derive(Debug, Default, Deserialize)]
pub(crate) struct MemoryJson {
    #[serde(default)]
    pub usage: i64,
    #[serde(default)]
    pub usage_peak: i64,
    #[serde(default)]
    pub swap_usage: i64,
}

#[derive(Debug, Default, Deserialize)]
pub(crate) struct DiskJson {
    #[serde(default)]
    pub usage: i64,
}

#[derive(Debug, Default, Deserialize)]
pub(crate) struct NetworkJson {
    #[serde(default)]
    pub addresses: Vec<AddressJson>,
    #[serde(default)]
    pub hwaddr: String,
    #[serde(default)]
    pub mtu: u32,
    #[serde(default)]
    pub counters: CountersJson,
}

#[derive(Debug, Default, Deserialize)]
pub(crate) struct AddressJson {
    #[serde(default)]
    pub address: String,
}

#[derive(Debug, Default, Deserialize)]
pub(crate) struct CountersJson {
    #[serde(default)]
    pub bytes_received: i64,
    #[serde(default)]
    pub bytes_sent: i64,
}

/// LXD reports -1 for "unknown"; berth reports 0.
fn count(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}

impl From<StateJson> for InstanceState {
    fn from(s: StateJson) -> InstanceState {
        let cpu = s.cpu.unwrap_or_default();
        let memory = s.memory.unwrap_or_default();
        InstanceState {
            pid: s.pid,
            processes: s.processes,
            cpu_usage_ns: count(cpu.usage),
            memory_usage_bytes: count(memory.usage),
            memory_peak_bytes: count(memory.usage_peak),
            swap_usage_bytes: count(memory.swap_usage),
            disk_usage_bytes: s
                .disk
                .unwrap_or_default()
                .into_iter()
                .map(|(k, d)| (k, count(d.usage)))
                .collect(),
            network: s
                .network
                .unwrap_or_default()
                .into_iter()
                .map(|(k, n)| {
                    (
                        k,
                        NetworkState {
                            addresses: n.addresses.into_iter().map(|a| a.address).collect(),
                            mac: n.hwaddr,
                            mtu: n.mtu,
                            bytes_received: count(n.counters.bytes_received),
                            bytes_sent: count(n.counters.bytes_sent),
                        },
                    )
                })
                .collect(),
        }
    }
}

#[derive(Debug, Deserialize)]
pub(crate) struct OperationJson {
    #[serde(default)]
    pub id: String,
    #[serde(default)]
    pub description: String,
    #[serde(default)]
    pub status: String,
    #[serde(default)]
    pub err: String,
    #[serde(default)]
    pub metadata: serde_json::Value,
    #[serde(default)]
    pub resources: Option<BTreeMap<String, Vec<String>>>,
}

impl From<OperationJson> for Operation {
    fn from(o: OperationJson) -> Operation {
        Operation {
            id: o.id,
            status: OperationStatus::parse(&o.status),
            err: o.err,
            metadata: o.metadata,
        }
    }
}

#[derive(Debug, Deserialize)]
pub(crate) struct VolumeJson {
    pub name: String,
    #[serde(rename = "type", default)]
    pub kind: String,
    #[serde(default)]
    pub config: BTreeMap<String, String>,
    #[serde(default)]
    pub location: String,
    #[serde(default)]
    pub used_by: Vec<String>,
}

impl VolumeJson {
    pub fn into_volume(self, pool: &str) -> Volume {
        Volume {
            pool: pool.to_string(),
            name: self.name,
            config: self.config,
            location: self.location,
            used_by: self.used_by,
        }
    }
}

#[derive(Debug, Deserialize)]
pub(crate) struct EventJson {
    #[serde(rename = "type", default)]
    pub kind: String,
    #[serde(default)]
    pub timestamp: Option<DateTime<Utc>>,
    #[serde(default)]
    pub location: String,
    #[serde(default)]
    pub metadata: serde_json::Value,
}

/// One websocket message of `/1.0/events` as a runtime event; `None` for messages berth has no
/// use for.
pub(crate) fn parse_event(text: &str) -> Option<RuntimeEvent> {
    let event: EventJson = serde_json::from_str(text).ok()?;
    match event.kind.as_str() {
        "lifecycle" => {
            let action = event.metadata.get("action")?.as_str()?.to_string();
            let source = event
                .metadata
                .get("source")
                .and_then(|v| v.as_str())
                .unwrap_or_default()
                .to_string();
            Some(RuntimeEvent {
                kind: EventKind::Lifecycle,
                action,
                instance: instance_from_source(&source),
                source,
                location: event.location,
                timestamp: event.timestamp,
            })
        }
        "operation" => {
            let op: OperationJson = serde_json::from_value(event.metadata).ok()?;
            let instance = op
                .resources
                .as_ref()
                .and_then(|r| r.get("instances").or_else(|| r.get("containers")))
                .and_then(|v| v.first())
                .and_then(|s| instance_from_source(s));
            Some(RuntimeEvent {
                kind: EventKind::Operation,
                action: format!("{} ({})", op.description, op.status),
                source: format!("/1.0/operations/{}", op.id),
                instance,
                location: event.location,
                timestamp: event.timestamp,
            })
        }
        other => Some(RuntimeEvent {
            kind: EventKind::Other(other.to_string()),
            action: String::new(),
            source: String::new(),
            instance: None,
            location: event.location,
            timestamp: event.timestamp,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_instance_on_an_offline_member_is_listed_without_config() {
        // As LXD 5.0.2 lists an instance whose member does not answer.
        let listed = r#"[{"architecture":"","config":null,"devices":null,"ephemeral":false,
            "profiles":null,"stateful":false,"description":"","created_at":"0001-01-01T00:00:00Z",
            "name":"p","status":"Error","status_code":112,"last_used_at":"0001-01-01T00:00:00Z",
            "location":"m2","type":"","project":"default","backups":null,"state":null,
            "snapshots":null}]"#;
        let instances: Vec<InstanceJson> = serde_json::from_str(listed).unwrap();
        let instance = Instance::from(instances.into_iter().next().unwrap());
        assert_eq!(instance.status, InstanceStatus::Error);
        assert_eq!(instance.location, "m2");
        assert!(instance.config.is_empty() && instance.devices.is_empty());
        assert_eq!(instance.created_at, None);

        let member: MemberJson = serde_json::from_str(
            r#"{"server_name":"m2","status":"Evacuated","message":"Unavailable due to maintenance","groups":["default","fast"]}"#,
        )
        .unwrap();
        let member = ClusterMember::from(member);
        assert!(member.is_evacuated() && !member.is_online());
        assert_eq!(member.groups, ["default", "fast"]);
    }
}
