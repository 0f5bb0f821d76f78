//! The values the runtime takes and returns. Plain data: no I/O, no client handles.

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// A device as LXD describes it: `type` plus type-specific keys (`path`, `pool`, `source`...).
pub type Device = BTreeMap<String, String>;

/// The server a runtime talks to, read when the client connected.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServerInfo {
    pub version: String,
    pub api_extensions: Vec<String>,
    pub clustered: bool,
    /// This member's name on a cluster ("none" on a standalone server).
    pub server_name: String,
    /// Cluster members; empty on a standalone server.
    pub members: Vec<ClusterMember>,
}

impl ServerInfo {
    pub fn has_extension(&self, name: &str) -> bool {
        self.api_extensions.iter().any(|e| e == name)
    }
}

/// What the host (the LXD member that answers) has to give its containers: LXD's
/// `/1.0/resources`, totals only.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostCapacity {
    pub memory_bytes: u64,
    /// CPU threads, what `limits.cpu` counts.
    pub cpus: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterMember {
    pub name: String,
    /// "Online", "Offline", "Evacuated", ...
    pub status: String,
    pub message: String,
    /// The cluster groups it belongs to (`@group` targets).
    pub groups: Vec<String>,
}

impl ClusterMember {
    pub fn is_online(&self) -> bool {
        self.status == "Online"
    }

    /// Evacuated (`lxc cluster evacuate`): its instances are stopped until it is restored.
    pub fn is_evacuated(&self) -> bool {
        self.status == "Evacuated"
    }
}

/// Where an instance's root filesystem comes from.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ImageSource {
    Alias(String),
    Fingerprint(String),
}

impl ImageSource {
    pub fn as_str(&self) -> &str {
        match self {
            ImageSource::Alias(s) | ImageSource::Fingerprint(s) => s,
        }
    }
}

/// An instance's lifecycle status, from LXD's `status` string.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum InstanceStatus {
    Running,
    Stopped,
    Frozen,
    Error,
    /// Transitional or unknown states ("Starting", "Stopping", "Aborting", ...), kept verbatim.
    Other(String),
}

impl InstanceStatus {
    pub fn parse(status: &str) -> InstanceStatus {
        match status {
            "Running" => InstanceStatus::Running,
            "Stopped" => InstanceStatus::Stopped,
            "Frozen" => InstanceStatus::Frozen,
            "Error" => InstanceStatus::Error,
            other => InstanceStatus::Other(other.to_string()),
        }
    }

    pub fn as_str(&self) -> &str {
        match self {
            InstanceStatus::Running => "Running",
            InstanceStatus::Stopped => "Stopped",
            InstanceStatus::Frozen => "Frozen",
            InstanceStatus::Error => "Error",
            InstanceStatus::Other(s) => s,
        }
    }

    /// LXD's numeric status code for the status.
    pub fn code(&self) -> u16 {
        match self {
            InstanceStatus::Running => 103,
            InstanceStatus::Stopped => 102,
            InstanceStatus::Frozen => 110,
            InstanceStatus::Error => 112,
            InstanceStatus::Other(_) => 0,
        }
    }
}

/// An instance as LXD reports it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Instance {
    pub name: String,
    pub status: InstanceStatus,
    pub status_code: u16,
    /// The cluster member it lives on ("none" on a standalone server).
    pub location: String,
    pub profiles: Vec<String>,
    /// The instance's own config (labels are `user.*` keys here).
    pub config: BTreeMap<String, String>,
    /// The instance's own devices (not those its profiles add, such as the root disk).
    pub devices: BTreeMap<String, Device>,
    pub created_at: Option<DateTime<Utc>>,
    pub last_used_at: Option<DateTime<Utc>>,
    /// Present when state was asked for.
    pub state: Option<InstanceState>,
}

impl Instance {
    /// The fingerprint of the image it was created from (`volatile.base_image`).
    pub fn base_image(&self) -> Option<&str> {
        self.config.get("volatile.base_image").map(String::as_str)
    }

    pub fn is_running(&self) -> bool {
        self.status == InstanceStatus::Running
    }
}

/// Live state of an instance; counters are zero when it is stopped.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct InstanceState {
    pub pid: i64,
    pub processes: i64,
    /// CPU time used, in nanoseconds.
    pub cpu_usage_ns: u64,
    pub memory_usage_bytes: u64,
    pub memory_peak_bytes: u64,
    pub swap_usage_bytes: u64,
    /// Disk usage per device name, in bytes (not reported by every pool driver).
    pub disk_usage_bytes: BTreeMap<String, u64>,
    pub network: BTreeMap<String, NetworkState>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NetworkState {
    pub addresses: Vec<String>,
    /// Hardware address; empty when the interface has none (loopback).
    #[serde(default)]
    pub mac: String,
    #[serde(default)]
    pub mtu: u32,
    pub bytes_received: u64,
    pub bytes_sent: u64,
}

/// A request to create an instance (not started).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CreateInstance {
    pub name: String,
    pub image: ImageSource,
    pub config: BTreeMap<String, String>,
    pub devices: BTreeMap<String, Device>,
    /// Empty means the server's `default` profile.
    pub profiles: Vec<String>,
    /// Cluster member to place it on; `None` uses the client's default target.
    pub target: Option<String>,
    /// The caller read no instance of that name just before: the create is submitted without
    /// looking again, and an instance made in between fails its operation (see
    /// [`super::RuntimeError::is_already_exists`]).
    pub known_absent: bool,
}

/// What `create_instance` did.
#[derive(Debug, Clone, PartialEq)]
pub enum Created {
    /// Creation was submitted as this operation; wait for it with `wait_operation`.
    Submitted { operation: String },
    /// An instance of that name already existed; nothing was submitted.
    Exists(Box<Instance>),
}

/// A finished (or still running, if the wait timed out server-side) operation.
#[derive(Debug, Clone, PartialEq)]
pub struct Operation {
    pub id: String,
    pub status: OperationStatus,
    /// LXD's error message when it failed.
    pub err: String,
    pub metadata: serde_json::Value,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OperationStatus {
    Success,
    Failure,
    Cancelled,
    Running,
    Other(String),
}

impl OperationStatus {
    pub fn parse(s: &str) -> OperationStatus {
        match s {
            "Success" => OperationStatus::Success,
            "Failure" => OperationStatus::Failure,
            "Cancelled" => OperationStatus::Cancelled,
            "Running" | "Pending" => OperationStatus::Running,
            other => OperationStatus::Other(other.to_string()),
        }
    }
}

/// How to stop an instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StopOptions {
    /// How long the instance gets to shut down after being asked.
    pub clean_timeout: Duration,
    /// Kill it when it has not stopped cleanly in time (otherwise that is a `Timeout` error).
    pub force_after: bool,
}

impl StopOptions {
    pub fn clean_then_force(clean_timeout: Duration) -> StopOptions {
        StopOptions {
            clean_timeout,
            force_after: true,
        }
    }

    /// Killed at once, without asking init to shut down first.
    pub fn kill() -> StopOptions {
        StopOptions {
            clean_timeout: Duration::ZERO,
            force_after: true,
        }
    }
}

/// Config keys and devices merged into an instance.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct InstancePatch {
    /// A key set to "" is removed.
    pub config: BTreeMap<String, String>,
    pub devices: BTreeMap<String, Device>,
}

/// The editable part of an instance, handed to `update_instance`'s closure. `volatile.*` keys
/// are present and must be kept (LXD refuses an update that drops them).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct InstanceEdit {
    pub config: BTreeMap<String, String>,
    pub devices: BTreeMap<String, Device>,
    pub profiles: Vec<String>,
}

/// A command to run inside an instance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecRequest {
    pub command: Vec<String>,
    pub env: BTreeMap<String, String>,
    pub cwd: Option<String>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub timeout: Duration,
    /// The most output of each stream (stdout, stderr) the caller takes. Past it the command is
    /// stopped and the exec fails with [`RuntimeError::TooLarge`](super::RuntimeError::TooLarge):
    /// what runs in a container is untrusted, and its output is never taken whole on faith.
    pub max_output: usize,
    /// Only the exit code is wanted: the output goes nowhere and nothing is read back (no
    /// wrapper, no files), so the exec costs LXD one call and its operation.
    pub discard_output: bool,
}

impl ExecRequest {
    /// The output cap of an exec unless the caller sets another: far above what berth's own
    /// scripts print, far below what would strain the daemon.
    pub const DEFAULT_MAX_OUTPUT: usize = 16 << 20;

    /// A command as root in the default directory, with a timeout.
    pub fn new<I, S>(command: I, timeout: Duration) -> ExecRequest
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        ExecRequest {
            command: command.into_iter().map(Into::into).collect(),
            env: BTreeMap::new(),
            cwd: None,
            uid: None,
            gid: None,
            timeout,
            max_output: Self::DEFAULT_MAX_OUTPUT,
            discard_output: false,
        }
    }

    /// The same request wanting only the exit code ([`ExecRequest::discard_output`]).
    pub fn discarding_output(self) -> ExecRequest {
        ExecRequest {
            discard_output: true,
            ..self
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExecOutput {
    pub exit_code: i32,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
}

impl ExecOutput {
    pub fn success(&self) -> bool {
        self.exit_code == 0
    }

    pub fn stdout_str(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }

    pub fn stderr_str(&self) -> String {
        String::from_utf8_lossy(&self.stderr).into_owned()
    }
}

/// A whole file to write into an instance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileWrite {
    pub path: String,
    pub content: Vec<u8>,
    pub uid: u32,
    pub gid: u32,
    pub mode: u32,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mkdir {
    pub path: String,
    pub uid: u32,
    pub gid: u32,
    pub mode: u32,
}

/// A custom storage volume to create.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CreateVolume {
    pub pool: String,
    pub name: String,
    /// e.g. "20GiB"; enforced only by pools that support quotas.
    pub size: Option<String>,
    /// Other config keys, labels as `user.*`.
    pub config: BTreeMap<String, String>,
    /// Cluster member for a volume on a local pool.
    pub target: Option<String>,
}

/// A storage pool, as far as berth cares: whether sizes on it are limits.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoragePool {
    pub name: String,
    /// "dir", "zfs", "btrfs", "lvm", "ceph", ...
    pub driver: String,
}

impl StoragePool {
    /// Whether LXD enforces a custom volume's or root disk's `size` on this pool: block and
    /// copy-on-write drivers do; `dir` accepts the key and ignores it.
    pub fn enforces_sizes(&self) -> bool {
        matches!(
            self.driver.as_str(),
            "zfs" | "btrfs" | "lvm" | "ceph" | "cephfs" | "powerflex"
        )
    }
}

/// The space of a storage pool (LXD's `/1.0/storage-pools/POOL/resources`), in bytes.
/// `total` is 0 where the pool does not know its size: then nothing can be judged from it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PoolSpace {
    pub used: u64,
    pub total: u64,
}

impl PoolSpace {
    /// What is left; 0 when the pool uses more than it says it has.
    pub fn free(&self) -> u64 {
        self.total.saturating_sub(self.used)
    }
}

/// A custom storage volume.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Volume {
    pub pool: String,
    pub name: String,
    pub config: BTreeMap<String, String>,
    /// The member holding it ("none" on a standalone server or for a remote pool).
    pub location: String,
    /// API paths of the instances and profiles using it.
    pub used_by: Vec<String>,
}

/// One event from the runtime's event stream.
#[derive(Debug, Clone, PartialEq)]
pub struct RuntimeEvent {
    pub kind: EventKind,
    /// e.g. "instance-started", "instance-deleted" (lifecycle) or the operation's description.
    pub action: String,
    /// The API path the event is about, e.g. "/1.0/instances/foo".
    pub source: String,
    /// The instance the event is about, when it is about one.
    pub instance: Option<String>,
    pub location: String,
    pub timestamp: Option<DateTime<Utc>>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EventKind {
    Lifecycle,
    Operation,
    Other(String),
}

/// The instance name an LXD API path like `/1.0/instances/NAME[/...][?query]` refers to.
pub fn instance_from_source(source: &str) -> Option<String> {
    let rest = source.strip_prefix("/1.0/instances/")?;
    let rest = rest.split('?').next().unwrap_or(rest);
    let name = rest.split('/').next().unwrap_or(rest);
    if name.is_empty() {
        None
    } else {
        Some(
            percent_encoding::percent_decode_str(name)
                .decode_utf8_lossy()
                .into_owned(),
        )
    }
}
