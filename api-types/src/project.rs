//! The Project kind: one agent workspace on one LXD container with durable volumes.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use schemars::JsonSchema;
use serde::{Deserialize, Deserializer, Serialize};

use crate::duration::{BerthDuration, MaxAge};
use crate::error::ValidationErrors;
use crate::files::{FileMode, MergeMode, workspace_file_path};
use crate::gitsource::validate_git_url;
use crate::meta::{API_VERSION, Condition};
use crate::naming::validate_env_key;
use crate::object::kind_object;
use crate::quantity::{CpuQuantity, Quantity, scalar};
use crate::schedule::{ScheduleSpec, ScheduleStatus, ScheduledBrief, validate_schedules};

/// The spec fields [`Project::apply_defaults`] fills from the fleet defaults, as dotted paths.
/// Defaulting fills them when a project is created; an existing project keeps what it holds
/// (admission carries them over), so a change of fleet defaults never reaches running projects.
pub const DEFAULTED_FIELDS: [&str; 10] = [
    "image",
    "resources.cpu",
    "resources.memory",
    "resources.disk",
    "resources.workspaceSize",
    "resources.processes",
    "reap.idleAfter",
    "reap.idleAction",
    "reap.maxAge",
    "reap.protectIgnored",
];

kind_object! {
    /// A workspace for AI coding agents.
    Project {
        spec: ProjectSpec,
        status: ProjectStatus,
    }
}

impl Project {
    /// Fills what the user left out from the fleet defaults, so the stored spec holds resolved
    /// values: changing the defaults later affects new projects only. Idempotent.
    pub fn apply_defaults(&mut self, d: &Defaults) {
        if self.api_version.is_empty() {
            self.api_version = API_VERSION.to_string();
        }
        if self.kind.is_empty() {
            self.kind = Self::KIND.to_string();
        }
        let spec = &mut self.spec;
        if spec.display_name.trim().is_empty() {
            spec.display_name = self.metadata.name.clone();
        }
        if spec.image.is_empty() {
            spec.image = d.image.clone();
        }
        spec.resources.fill_from(&d.resources);
        spec.reap.fill_from(&d.reap);
        spec.reap.fill_from(&ReapPolicy::design_defaults());
    }

    /// The display name, falling back to the object name when none was given.
    pub fn display_name(&self) -> &str {
        if self.spec.display_name.trim().is_empty() {
            &self.metadata.name
        } else {
            &self.spec.display_name
        }
    }
}

/// Desired state of a project, as written by a user.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ProjectSpec {
    /// Human-facing name, unique case-insensitively after trimming. Defaults to the name.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub display_name: String,
    /// Desired power state.
    #[serde(default)]
    pub state: PowerState,
    /// LXD image alias or fingerprint. Defaults to the fleet default image.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub image: String,
    /// Resource envelope. Fields not given are taken from the fleet defaults.
    #[serde(default, skip_serializing_if = "Resources::is_empty")]
    pub resources: Resources,
    /// The AgentProfile that runs the brief.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
    /// Further AgentProfiles provisioned in the container (their homes get durable mounts).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub agents: Vec<String>,
    /// Repository cloned into /workspace once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repo: Option<Repo>,
    /// Files written after the checkout, before the runner starts.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub seed_files: Vec<SeedFile>,
    /// Non-secret environment of the container and of agent executions.
    #[serde(
        default,
        skip_serializing_if = "BTreeMap::is_empty",
        deserialize_with = "env_map"
    )]
    pub env: BTreeMap<String, String>,
    /// The agent's task; delivering it is the last step.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub brief: String,
    /// Briefs handed to the agent at the times of a cron.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub schedules: Vec<ScheduleSpec>,
    /// What berth adds to the workspace for the agent beyond its profiles.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub capabilities: Vec<Capability>,
    /// When an unused project is stopped or deleted.
    #[serde(default, skip_serializing_if = "ReapPolicy::is_empty")]
    pub reap: ReapPolicy,
    /// Host addresses reachable from inside the container at `127.0.0.1:PORT` (admins only).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub forwards: Vec<Forward>,
}

/// Something berth adds to a workspace for its agent.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "camelCase")]
pub enum Capability {
    /// The agent lists and adds its own project's schedules: `berth-schedule` and its skill
    /// under `/workspace/.berth/`, reaching berth at `127.0.0.1:`[`AGENT_API_PORT`] inside
    /// the container with a token good for this project's schedules alone.
    Schedules,
    /// A headless browser for the agent, best effort: the Playwright MCP server (with the
    /// image's Chromium) published to the agent's CLI, and a skill and a screenshot script under
    /// `/workspace/.berth/`. An image without them sets `CapabilityFailed`; the project goes on.
    Browser,
}

/// The port inside a container where berth's agent API answers (a `schedules` capability).
pub const AGENT_API_PORT: u16 = 7391;

/// `127.0.0.1:port` inside the container reaches the host address `to` (an LXD proxy device
/// bound in the instance: no NIC needed).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Forward {
    /// The port inside the container, 1 to 65535.
    #[serde(default)]
    #[schemars(extend("x-berth-required" = true))]
    pub port: u16,
    /// `HOST:PORT` on the berth host: an IP address (IPv6 in brackets) and a port.
    #[serde(default)]
    #[schemars(extend("x-berth-required" = true))]
    pub to: String,
}

impl Forward {
    /// The target as a socket address, `None` when `to` is not `IP:PORT`.
    pub fn target(&self) -> Option<std::net::SocketAddr> {
        self.to
            .parse()
            .ok()
            .filter(|a: &std::net::SocketAddr| a.port() != 0)
    }
}

impl ProjectSpec {
    /// Every AgentProfile the project uses: `agent` first, then `agents`, without repeats.
    pub fn profiles(&self) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for name in self.agent.iter().chain(self.agents.iter()) {
            if !out.contains(name) {
                out.push(name.clone());
            }
        }
        out
    }
}

/// Environment values are strings, but YAML users write `PORT: 3000`: take scalars as text.
fn env_map<'de, D: Deserializer<'de>>(d: D) -> Result<BTreeMap<String, String>, D::Error> {
    scalar::string_map(d, scalar::Bare::AsText)
}

/// Desired power state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
pub enum PowerState {
    #[default]
    Running,
    Stopped,
}

impl PowerState {
    pub fn as_str(self) -> &'static str {
        match self {
            PowerState::Running => "Running",
            PowerState::Stopped => "Stopped",
        }
    }
}

/// Resource envelope of a project's container and volumes.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Resources {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<CpuQuantity>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<Quantity>,
    /// Size of the container's root disk.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk: Option<Quantity>,
    /// Size of the durable /workspace volume.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workspace_size: Option<Quantity>,
    /// The most processes (and threads) the container may run at once (LXD's
    /// `limits.processes`): a runaway program or a fork bomb stops there. Applies live.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub processes: Option<u32>,
}

impl Resources {
    pub fn is_empty(&self) -> bool {
        self.cpu.is_none()
            && self.memory.is_none()
            && self.disk.is_none()
            && self.workspace_size.is_none()
            && self.processes.is_none()
    }

    /// Takes every field not set here from `other`.
    pub fn fill_from(&mut self, other: &Resources) {
        if self.cpu.is_none() {
            self.cpu = other.cpu.clone();
        }
        if self.memory.is_none() {
            self.memory = other.memory.clone();
        }
        if self.disk.is_none() {
            self.disk = other.disk.clone();
        }
        if self.workspace_size.is_none() {
            self.workspace_size = other.workspace_size.clone();
        }
        if self.processes.is_none() {
            self.processes = other.processes;
        }
    }
}

/// Source repository of the workspace.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Repo {
    /// `https`, `http`, `ssh`, `git` or `file` (absolute path on the berth host) URL.
    #[serde(default)]
    #[schemars(extend("x-berth-required" = true))]
    pub url: String,
    /// Branch to check out; the remote's default branch when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub branch: Option<String>,
}

/// A file written into /workspace after the checkout.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SeedFile {
    /// Relative to /workspace, or absolute under it.
    #[serde(default)]
    #[schemars(extend("x-berth-required" = true))]
    pub path: String,
    #[serde(default)]
    pub content: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<FileMode>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub merge: Option<MergeMode>,
}

impl SeedFile {
    /// The absolute path the file is written to, `None` when the path is invalid.
    pub fn target(&self) -> Option<String> {
        workspace_file_path(&self.path).ok()
    }
}

/// What happens to a project nobody uses.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ReapPolicy {
    /// No activity for this long triggers `idleAction`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_after: Option<BerthDuration>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_action: Option<IdleAction>,
    /// Projects older than this are deleted; `never` disables it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_age: Option<MaxAge>,
    /// Ignored files (relative to /workspace) that count as unsaved work all the same, as
    /// gitignore globs: one without `/` matches the base name at any depth. `[]` protects none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protect_ignored: Option<Vec<String>>,
}

/// At most this many `protectIgnored` globs, each at most [`MAX_PROTECT_GLOB`] bytes.
pub const MAX_PROTECT_GLOBS: usize = 32;
pub const MAX_PROTECT_GLOB: usize = 256;

/// A reap policy with every field resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolvedReapPolicy {
    pub idle_after: BerthDuration,
    pub idle_action: IdleAction,
    pub max_age: MaxAge,
}

impl ReapPolicy {
    /// The values DESIGN gives when the configuration says nothing: 8h, Stop, 30d, and the
    /// ignored files that usually hold a person's data (`.env*`, `*.db`, `*.sqlite*`).
    pub fn design_defaults() -> Self {
        ReapPolicy {
            idle_after: Some(BerthDuration::from_secs(8 * 3600)),
            idle_action: Some(IdleAction::Stop),
            max_age: Some(MaxAge::After(BerthDuration::from_secs(30 * 86_400))),
            protect_ignored: Some(Self::default_protect_ignored()),
        }
    }

    /// `protectIgnored` when nothing says otherwise.
    pub fn default_protect_ignored() -> Vec<String> {
        [".env*", "*.db", "*.sqlite*"].map(String::from).into()
    }

    pub fn is_empty(&self) -> bool {
        self.idle_after.is_none()
            && self.idle_action.is_none()
            && self.max_age.is_none()
            && self.protect_ignored.is_none()
    }

    /// Takes every field not set here from `other`.
    pub fn fill_from(&mut self, other: &ReapPolicy) {
        if self.idle_after.is_none() {
            self.idle_after = other.idle_after.clone();
        }
        if self.idle_action.is_none() {
            self.idle_action = other.idle_action;
        }
        if self.max_age.is_none() {
            self.max_age = other.max_age.clone();
        }
        if self.protect_ignored.is_none() {
            self.protect_ignored = other.protect_ignored.clone();
        }
    }

    /// Every field, missing ones taken from the DESIGN defaults.
    pub fn resolve(&self) -> ResolvedReapPolicy {
        let mut p = self.clone();
        p.fill_from(&ReapPolicy::design_defaults());
        ResolvedReapPolicy {
            idle_after: p
                .idle_after
                .unwrap_or_else(|| BerthDuration::from_secs(8 * 3600)),
            idle_action: p.idle_action.unwrap_or_default(),
            max_age: p.max_age.unwrap_or(MaxAge::Never),
        }
    }
}

/// What idling does to a project.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
pub enum IdleAction {
    /// Stop the container (reversible).
    #[default]
    Stop,
    /// Delete the project and its volumes.
    Delete,
}

/// Fleet defaults (the `defaults` section of berth.yaml), resolved into each new project.
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Defaults {
    pub image: String,
    pub resources: Resources,
    pub reap: ReapPolicy,
}

impl Default for Defaults {
    fn default() -> Self {
        Defaults {
            image: "berth-base".to_string(),
            resources: Resources {
                cpu: Some(CpuQuantity::from_cpus(2)),
                memory: "4GiB".parse().ok(),
                disk: None,
                workspace_size: None,
                // A ceiling for a fork bomb, far above what agents, browsers and builds run.
                processes: Some(4096),
            },
            reap: ReapPolicy::design_defaults(),
        }
    }
}

// A partial `defaults` section keeps the built-in value of every key it leaves out, so a config
// that only changes `cpu` still gets the default memory and reap policy.
impl<'de> Deserialize<'de> for Defaults {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(rename_all = "camelCase", deny_unknown_fields)]
        struct Raw {
            #[serde(default)]
            image: Option<String>,
            #[serde(default)]
            resources: Option<Resources>,
            #[serde(default)]
            reap: Option<ReapPolicy>,
        }
        let raw = Raw::deserialize(d)?;
        let builtin = Defaults::default();
        let mut resources = raw.resources.unwrap_or_default();
        resources.fill_from(&builtin.resources);
        let mut reap = raw.reap.unwrap_or_default();
        reap.fill_from(&builtin.reap);
        Ok(Defaults {
            image: raw
                .image
                .filter(|i| !i.trim().is_empty())
                .unwrap_or(builtin.image),
            resources,
            reap,
        })
    }
}

impl Defaults {
    /// Checks the section as berth.yaml gave it; fields are named under `prefix`
    /// (e.g. `defaults`).
    pub fn validate(&self, prefix: &str) -> Result<(), ValidationErrors> {
        let mut errs = ValidationErrors::new();
        validate_resources(&self.resources, &format!("{prefix}.resources"), &mut errs);
        validate_reap(&self.reap, &format!("{prefix}.reap"), &mut errs);
        errs.into_result()
    }
}

/// Observed state of a project, written by the controller only. Every field is optional so an
/// empty `{}` decodes.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProjectStatus {
    #[serde(default)]
    pub observed_generation: i64,
    #[serde(default)]
    pub phase: Phase,
    /// The last durable step completed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<Step>,
    /// When the workspace first became reachable (an exec answered). From then on it may hold
    /// work, whatever `step` says later (it moves back on a new image, a recreate or a boot):
    /// recorded once and never cleared while the volumes exist, so every deletion inspects it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_reachable_at: Option<DateTime<Utc>>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container: Option<ContainerStatus>,
    /// The LXD cluster member the project is placed on: decided once, before its volumes and
    /// first container are created, and never changed, since its volumes live there. Absent on a
    /// single (not clustered) LXD server.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub location: Option<String>,
    /// The agent's own summary of its work, recorded once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<AgentStatus>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub activity: Option<ActivityStatus>,
    /// The container's IPv4 addresses as the scheduler last saw them, and its repair of a lost one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<NetworkStatus>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unsaved_work: Option<UnsavedWork>,
    /// While a deletion is held: when the workspace was last looked at, when it is looked at
    /// next, and which request for a fresh look that look answered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deletion_hold: Option<DeletionHold>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reap: Option<ReapStatus>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<PortStatus>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    /// The id of the current brief, recorded before it is delivered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub brief_id: Option<String>,
    /// The last brief the agent acknowledged (its status file carried the id).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub brief_acknowledged: Option<String>,
    /// The last brief the agent finished (`done` or `failed`): never handed over again, after
    /// a reboot, a wake or a replaced container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub brief_finished: Option<String>,
    /// Files berth wrote under /workspace (path to lowercase hex SHA-256 of the content), so a
    /// file holding exactly that content is berth's, not the user's unsaved work.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub seeded_files: BTreeMap<String, String>,
    /// The AgentProfiles Bootstrapped last provisioned: name to the revision of its spec then
    /// (`UID/GENERATION`). A profile changed since, added or dropped makes Bootstrapped and the
    /// steps after it run again.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub provisioned_profiles: BTreeMap<String, String>,
    /// Each schedule's next and last run, in the order of `spec.schedules`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub schedules: Vec<ScheduleStatus>,
    /// The brief the last due schedule handed over.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheduled_brief: Option<ScheduledBrief>,
}

impl ProjectStatus {
    /// What the scheduler recorded of `spec.schedules[n]` (whose cron is `cron`): written in
    /// spec order by its last round, so an entry edited since has none until the next.
    pub fn recorded_schedule(&self, n: usize, cron: &str) -> Option<&ScheduleStatus> {
        self.schedules.get(n).filter(|r| r.cron == cron)
    }
}

/// Summary of where a project stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize, JsonSchema)]
pub enum Phase {
    #[default]
    Pending,
    Provisioning,
    Ready,
    Stopped,
    Error,
    Missing,
    Deleting,
}

impl Phase {
    pub const ALL: [Phase; 7] = [
        Phase::Pending,
        Phase::Provisioning,
        Phase::Ready,
        Phase::Stopped,
        Phase::Error,
        Phase::Missing,
        Phase::Deleting,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Pending => "Pending",
            Phase::Provisioning => "Provisioning",
            Phase::Ready => "Ready",
            Phase::Stopped => "Stopped",
            Phase::Error => "Error",
            Phase::Missing => "Missing",
            Phase::Deleting => "Deleting",
        }
    }
}

/// The durable steps of building a project, in pipeline order (`Ord` follows it).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, JsonSchema,
)]
pub enum Step {
    Requested,
    Created,
    Started,
    Reachable,
    Bootstrapped,
    CheckedOut,
    Seeded,
    RunnerStarted,
    Briefed,
}

impl Step {
    pub const ALL: [Step; 9] = [
        Step::Requested,
        Step::Created,
        Step::Started,
        Step::Reachable,
        Step::Bootstrapped,
        Step::CheckedOut,
        Step::Seeded,
        Step::RunnerStarted,
        Step::Briefed,
    ];

    /// The step after this one; `None` after the last.
    pub fn next(self) -> Option<Step> {
        let i = Step::ALL.iter().position(|s| *s == self)?;
        Step::ALL.get(i + 1).copied()
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Step::Requested => "Requested",
            Step::Created => "Created",
            Step::Started => "Started",
            Step::Reachable => "Reachable",
            Step::Bootstrapped => "Bootstrapped",
            Step::CheckedOut => "CheckedOut",
            Step::Seeded => "Seeded",
            Step::RunnerStarted => "RunnerStarted",
            Step::Briefed => "Briefed",
        }
    }

    pub fn parse(s: &str) -> Option<Step> {
        Step::ALL.into_iter().find(|step| step.as_str() == s)
    }
}

/// The container that currently holds the project.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ContainerStatus {
    #[serde(default)]
    pub name: String,
    /// Cluster member the container runs on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub location: Option<String>,
    /// The image the container was created from, resolved from `spec.image`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_fingerprint: Option<String>,
    /// The container init's host pid, from the last read of the container with its state; a
    /// container berth just created and started shows none until a later read (within one
    /// resync interval).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_at: Option<DateTime<Utc>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_used_at: Option<DateTime<Utc>>,
}

/// What the agent last reported in its status file.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AgentStatus {
    #[serde(default)]
    pub state: AgentState,
    /// The agent's message, e.g. the question it is blocked on (untrusted text).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    /// The brief the agent says it is working on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub brief_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub updated_at: Option<DateTime<Utc>>,
    /// The agent CLI's own session id, which resumes the brief after an interruption.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
    /// The runner's exit code, once it ended (`done` or `failed`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
}

/// The agent's state as it reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum AgentState {
    Working,
    Blocked,
    Idle,
    Done,
    Failed,
    #[default]
    Unknown,
}

impl AgentState {
    pub fn as_str(self) -> &'static str {
        match self {
            AgentState::Working => "working",
            AgentState::Blocked => "blocked",
            AgentState::Idle => "idle",
            AgentState::Done => "done",
            AgentState::Failed => "failed",
            AgentState::Unknown => "unknown",
        }
    }

    /// Reads the agent status file's `state`; anything unrecognised is `Unknown`.
    pub fn parse(s: &str) -> AgentState {
        match s {
            "working" => AgentState::Working,
            "blocked" => AgentState::Blocked,
            "idle" => AgentState::Idle,
            "done" => AgentState::Done,
            "failed" => AgentState::Failed,
            _ => AgentState::Unknown,
        }
    }
}

/// The network of a project's container as the scheduler's inspections see it.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NetworkStatus {
    /// IPv4 addresses with their prefix length (`10.0.0.5/24`) per interface, loopback left
    /// out, as last seen while there were any: what a lost address is told by.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub ipv4: BTreeMap<String, Vec<String>>,
    /// When every address was found gone and the automatic repair could not bring one back:
    /// nothing is repaired again until an address returns.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repair_failed_at: Option<DateTime<Utc>>,
}

/// When the project was last seen in use, and by which signal.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ActivityStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_active_at: Option<DateTime<Utc>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<ActivitySource>,
    /// When an inspection last recorded something: the first one, or one that changed the
    /// status. An inspection that finds nothing new writes nothing, so this is not the latest.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inspected_at: Option<DateTime<Utc>>,
}

/// The signal that showed activity.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ActivitySource {
    /// The agent status file was updated while working.
    Agent,
    /// Processes other than berth's inspection used CPU.
    Cpu,
    /// A file under /workspace (outside .git) changed.
    Files,
    /// Someone ran `berth exec`.
    Exec,
    /// A workspace tool call.
    Tool,
    /// A request through the preview listener or `berth port-forward`.
    Preview,
    /// The IDE: `berth ide`, or a request to the IDE host (an open editor counts while its
    /// connection lasts).
    Ide,
}

impl ActivitySource {
    pub fn as_str(self) -> &'static str {
        match self {
            ActivitySource::Agent => "agent",
            ActivitySource::Cpu => "cpu",
            ActivitySource::Files => "files",
            ActivitySource::Exec => "exec",
            ActivitySource::Tool => "tool",
            ActivitySource::Preview => "preview",
            ActivitySource::Ide => "ide",
        }
    }
}

/// Work in /workspace that exists nowhere else. The counts added later than the first four are
/// left out when zero, so a status reads as it did before them.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct UnsavedWork {
    /// Changed tracked files, also inside submodules and nested repositories, and files git was
    /// told not to look at (skip-worktree, assume-unchanged) whose content changed.
    #[serde(default)]
    pub uncommitted: u32,
    #[serde(default)]
    pub untracked: u32,
    #[serde(default)]
    pub stashes: u32,
    /// Commits on no remote: reachable from a branch, tag, detached HEAD or other local ref but
    /// from no remote-tracking ref of a remote outside the container.
    #[serde(default)]
    pub unpushed: u32,
    /// Ignored files matching `spec.reap.protectIgnored`.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub ignored: u32,
    /// Files berth wrote whose content changed since, and a `.env` holding lines outside
    /// berth's block.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub modified_seeds: u32,
    /// Linked worktrees outside /workspace.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub worktrees: u32,
    /// Some of the files and refs that hold the work (at most [`UnsavedWork::MAX_FILES`],
    /// relative to /workspace, sanitised).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub files: Vec<String>,
    /// Some of the commits on no remote, `HASH on REF` (at most [`UnsavedWork::MAX_FILES`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub commits: Vec<String>,
}

/// A held deletion's schedule (`status.deletionHold`).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DeletionHold {
    /// When the workspace was last looked at.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub looked_at: Option<DateTime<Utc>>,
    /// When it is looked at again (sooner when a person asks: `berth delete` or `berth wait
    /// --for=delete` on it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_look_at: Option<DateTime<Utc>>,
    /// The value of the `berth.dev/lookRequestedAt` annotation this look answered: a client
    /// that asked for a fresh look reads the hold as the answer only once it matches.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub answered: Option<String>,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

impl UnsavedWork {
    /// How many files and refs `files` names at most.
    pub const MAX_FILES: usize = 20;

    /// Each kind of work found, e.g. `1 untracked files, 2 commits on no remote`; empty when
    /// nothing would be lost.
    pub fn summary(&self) -> String {
        [
            (self.uncommitted, "uncommitted changes"),
            (self.untracked, "untracked files"),
            (self.stashes, "stashes"),
            (self.unpushed, "commits on no remote"),
            (self.ignored, "ignored files that protect"),
            (self.modified_seeds, "files berth wrote, changed since"),
            (self.worktrees, "worktrees outside /workspace"),
        ]
        .iter()
        .filter(|(n, _)| *n > 0)
        .map(|(n, label)| format!("{n} {label}"))
        .collect::<Vec<_>>()
        .join(", ")
    }

    /// Whether anything would be lost.
    pub fn any(&self) -> bool {
        [
            self.uncommitted,
            self.untracked,
            self.stashes,
            self.unpushed,
            self.ignored,
            self.modified_seeds,
            self.worktrees,
        ]
        .iter()
        .any(|&n| n > 0)
            || !self.files.is_empty()
    }
}

/// The reaper's view of the project.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReapStatus {
    /// Why reaping declines, if it does.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub protected_by: Vec<ProtectionReason>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_action: Option<ReapAction>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_action_at: Option<DateTime<Utc>>,
    /// Set while the project is idled (stopped by the reaper until woken).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idled_at: Option<DateTime<Utc>>,
}

/// Why a project may not be reaped (or deleted without `--force`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum ProtectionReason {
    /// The agent waits for a person.
    AgentBlocked,
    /// Uncommitted or untracked changes, stashes, or commits on no remote.
    UnsavedWork,
    /// The workspace could not be inspected.
    InspectionFailed,
}

impl ProtectionReason {
    pub const ALL: [ProtectionReason; 3] = [
        ProtectionReason::AgentBlocked,
        ProtectionReason::UnsavedWork,
        ProtectionReason::InspectionFailed,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            ProtectionReason::AgentBlocked => "AgentBlocked",
            ProtectionReason::UnsavedWork => "UnsavedWork",
            ProtectionReason::InspectionFailed => "InspectionFailed",
        }
    }
}

/// What the reaper will do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum ReapAction {
    Stop,
    Delete,
}

impl ReapAction {
    /// The `action` label value of the reap metrics.
    pub fn metric_label(self) -> &'static str {
        match self {
            ReapAction::Stop => "stop",
            ReapAction::Delete => "delete",
        }
    }
}

impl From<IdleAction> for ReapAction {
    fn from(a: IdleAction) -> Self {
        match a {
            IdleAction::Stop => ReapAction::Stop,
            IdleAction::Delete => ReapAction::Delete,
        }
    }
}

/// A port something listens on in the container, with its preview URL.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PortStatus {
    pub port: u16,
    #[serde(default)]
    pub url: String,
}

// ---- validation ----

pub(crate) fn validate_project(p: &Project, errs: &mut ValidationErrors) {
    let s = &p.spec;
    if !s.display_name.is_empty() {
        if s.display_name.trim().is_empty() {
            errs.push("spec.displayName", "must not be blank");
        } else if s.display_name.chars().any(char::is_control) {
            errs.push("spec.displayName", "must not contain control characters");
        } else if s.display_name.chars().count() > 200 {
            errs.push("spec.displayName", "must be at most 200 characters");
        }
    }
    if !s.image.is_empty() && (s.image.trim() != s.image || s.image.contains(char::is_whitespace)) {
        errs.push(
            "spec.image",
            format!("{:?} must not contain whitespace", s.image),
        );
    }
    validate_resources(&s.resources, "spec.resources", errs);
    if let Some(agent) = &s.agent {
        check_profile_name(agent, "spec.agent", errs);
    }
    for (i, agent) in s.agents.iter().enumerate() {
        check_profile_name(agent, &format!("spec.agents[{i}]"), errs);
    }
    if let Some(repo) = &s.repo {
        if repo.url.is_empty() {
            errs.push("spec.repo.url", "required");
        } else if let Err(e) = validate_git_url(&repo.url, &["https", "http", "ssh", "git", "file"])
        {
            errs.push("spec.repo.url", e);
        }
        if let Some(branch) = &repo.branch
            && let Err(e) = validate_ref_name(branch)
        {
            errs.push("spec.repo.branch", e);
        }
    }
    for (i, seed) in s.seed_files.iter().enumerate() {
        if let Err(e) = workspace_file_path(&seed.path) {
            errs.push(format!("spec.seedFiles[{i}].path"), e);
        }
    }
    for key in s.env.keys() {
        if let Err(e) = validate_env_key(key) {
            errs.push(format!("spec.env.{key}"), e);
        }
    }
    for (key, value) in &s.env {
        if value.contains('\0') {
            errs.push(format!("spec.env.{key}"), "must not contain NUL");
        }
    }
    validate_reap(&s.reap, "spec.reap", errs);
    validate_schedules(&s.schedules, errs);
    if s.capabilities.contains(&Capability::Schedules) && s.agent.is_none() {
        errs.push(
            "spec.capabilities",
            "schedules is for the project's agent: set spec.agent",
        );
    }
    for (i, forward) in s.forwards.iter().enumerate() {
        if forward.port == AGENT_API_PORT && s.capabilities.contains(&Capability::Schedules) {
            errs.push(
                format!("spec.forwards[{i}].port"),
                format!(
                    "{AGENT_API_PORT} is where berth's agent API answers (capability schedules)"
                ),
            );
        }
    }
    if s.capabilities.contains(&Capability::Browser) && s.profiles().is_empty() {
        errs.push(
            "spec.capabilities",
            "browser is published to the project's agent: set spec.agent",
        );
    }
    if !s.schedules.is_empty() && s.agent.is_none() {
        errs.push(
            "spec.schedules",
            "a schedule hands its brief to the project's agent: set spec.agent",
        );
    }
    let mut ports = std::collections::BTreeSet::new();
    for (i, forward) in s.forwards.iter().enumerate() {
        if forward.port == 0 {
            errs.push(format!("spec.forwards[{i}].port"), "must be 1 to 65535");
        } else if !ports.insert(forward.port) {
            errs.push(
                format!("spec.forwards[{i}].port"),
                format!("{} is forwarded twice", forward.port),
            );
        }
        if forward.to.is_empty() {
            errs.push(format!("spec.forwards[{i}].to"), "required");
        } else if forward.target().is_none() {
            errs.push(
                format!("spec.forwards[{i}].to"),
                format!(
                    "{:?} must be IP:PORT (IPv6 as [ADDR]:PORT) with a port from 1 to 65535",
                    forward.to
                ),
            );
        }
    }
}

fn check_profile_name(name: &str, field: &str, errs: &mut ValidationErrors) {
    if name.is_empty() {
        errs.push(field, "must not be empty");
    } else if let Err(e) = crate::naming::validate_name(name) {
        errs.push(field, e);
    }
}

/// The least `resources.memory` admission accepts: below it LXD's `forkstart` cannot start the
/// container (1KiB fails every start), and little runs in a few MiB anyway.
pub const MIN_MEMORY_BYTES: u64 = 32 * 1024 * 1024;

/// The least `resources.processes` admission accepts: the container's init, an exec and a git
/// command with its helpers fit, so berth can still look inside a project at its limit.
pub const MIN_PROCESSES: u32 = 32;

fn validate_resources(r: &Resources, prefix: &str, errs: &mut ValidationErrors) {
    if let Some(processes) = r.processes
        && processes < MIN_PROCESSES
    {
        errs.push(
            format!("{prefix}.processes"),
            format!(
                "{processes} is below the minimum of {MIN_PROCESSES}: the container's init and \
                 berth's own commands need that many"
            ),
        );
    }
    if r.cpu.as_ref().is_some_and(|c| c.millis() == 0) {
        errs.push(format!("{prefix}.cpu"), "must be more than 0");
    }
    if let Some(memory) = &r.memory
        && memory.as_bytes() > 0
        && memory.as_bytes() < MIN_MEMORY_BYTES
    {
        errs.push(
            format!("{prefix}.memory"),
            format!(
                "{:?} is below the minimum of 32MiB: LXD cannot start a container with less",
                memory.as_str()
            ),
        );
    }
    for (name, q) in [
        ("memory", &r.memory),
        ("disk", &r.disk),
        ("workspaceSize", &r.workspace_size),
    ] {
        if q.as_ref().is_some_and(|q| q.as_bytes() == 0) {
            errs.push(format!("{prefix}.{name}"), "must be more than 0");
        }
    }
}

fn validate_reap(r: &ReapPolicy, prefix: &str, errs: &mut ValidationErrors) {
    if r.idle_after.as_ref().is_some_and(BerthDuration::is_zero) {
        errs.push(format!("{prefix}.idleAfter"), "must be more than 0");
    }
    if let Some(Err(e)) = r.idle_after.as_ref().map(BerthDuration::check_cap) {
        errs.push(format!("{prefix}.idleAfter"), e);
    }
    if let Some(MaxAge::After(d)) = &r.max_age {
        if d.is_zero() {
            errs.push(
                format!("{prefix}.maxAge"),
                "must be more than 0 (write \"never\" to disable)",
            );
        }
        if let Err(e) = d.check_cap() {
            errs.push(format!("{prefix}.maxAge"), e);
        }
    }
    if let Some(globs) = &r.protect_ignored {
        if globs.len() > MAX_PROTECT_GLOBS {
            errs.push(
                format!("{prefix}.protectIgnored"),
                format!("at most {MAX_PROTECT_GLOBS} globs"),
            );
        }
        for (i, glob) in globs.iter().enumerate() {
            if let Err(message) = validate_protect_glob(glob) {
                errs.push(format!("{prefix}.protectIgnored[{i}]"), message);
            }
        }
    }
}

/// One `protectIgnored` glob: relative to /workspace, inside it, one line of printable text.
fn validate_protect_glob(glob: &str) -> Result<(), String> {
    if glob.trim().is_empty() {
        return Err("must not be empty".into());
    }
    if glob.len() > MAX_PROTECT_GLOB {
        return Err(format!("must be at most {MAX_PROTECT_GLOB} bytes"));
    }
    if glob.starts_with('/') {
        return Err(format!("{glob:?} must be relative to /workspace"));
    }
    if glob.split('/').any(|part| part == "..") {
        return Err(format!("{glob:?} must not contain \"..\""));
    }
    if glob.starts_with(':') {
        return Err(format!("{glob:?} must not start with ':'"));
    }
    if glob.chars().any(char::is_control) {
        return Err(format!("{glob:?} must not contain control characters"));
    }
    Ok(())
}

/// Checks a branch name against git's ref-name rules (the parts a user can get wrong).
pub fn validate_ref_name(name: &str) -> Result<(), String> {
    let bad = name.is_empty()
        || name.starts_with('-')
        || name.starts_with('/')
        || name.ends_with('/')
        || name.ends_with('.')
        || name.ends_with(".lock")
        || name.contains("..")
        || name.contains("//")
        || name.contains("@{")
        || name
            .chars()
            .any(|c| c.is_control() || c.is_whitespace() || "~^:?*[\\".contains(c));
    if bad {
        Err(format!("{name:?} is not a valid git branch name"))
    } else {
        Ok(())
    }
}
