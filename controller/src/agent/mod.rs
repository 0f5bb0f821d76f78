//! Agent provisioning inside a project's container: the steps Bootstrapped, CheckedOut, Seeded,
//! RunnerStarted and Briefed, and talking to the agent afterwards (its status file, answers,
//! the runner log).
//!
//! Every function here works on a `&dyn Runtime` and an instance name. It knows AgentProfile and
//! Project specs but not the store or the queue: the reconciler decides when a step runs and
//! records that it ran. Each function is idempotent, so running one again after a crash is
//! safe, and returns an [`AgentError`] whose [`AgentError::reason`] goes into a condition.
//!
//! Paths berth owns inside a container:
//! - `/usr/local/lib/berth/`: the runner wrapper, the agent adapter and the offline `shell`
//!   agent (bootstrap);
//! - `<home>/.berth-credentials.env` (0600): the profile's credentials as `export KEY='value'`
//!   lines, for a person or tool working in the container; the runner gets them in its
//!   environment directly;
//! - `/run/berth/` (tmpfs): `brief.md`, `brief.id`, `runner.pid`, `agent.json`, `answer`,
//!   `pending.json` (the adapter's question waiting for a person);
//! - `/run/berth/ide.pid`, `/var/log/berth/ide.log` and `/workspace/.berth/ide/`: the IDE
//!   (code-server, started on demand by [`ide::ensure`]);
//! - `/var/log/berth/runner.log`: the runner's output, capped at [`RUNNER_LOG_CAP`] bytes
//!   (one older generation is kept as `runner.log.1`).
//!
//! Bootstrap is best effort for profiles listed only in `agents` (`bootstrap_best_effort`). The
//! agent adapter (`adapter.js`, pushed at Bootstrapped) runs a CLI whose `runner.protocol` is
//! `claude-stream-json` or `codex-app-server` and keeps the status contract for it (ack,
//! working/blocked/done/failed, session id, title, answers), handing it the MCP servers a
//! capability published (Claude Code's `--mcp-config` and `--allowedTools`, Codex's
//! `-c mcp_servers.NAME...`). `capability/` writes what `spec.capabilities` (and a listed
//! profile's `capabilities`) puts in a workspace, at Seeded, recorded as berth's files; the
//! project token (`berthp.<name>.<hex>`) is minted once by Seeded. `brief.rs`'s `current_brief` is
//! the one answer to which brief the agent works (a scheduled run's, unless `spec.brief` changed
//! since it).

mod bootstrap;
mod brief;
pub mod capability;
mod checkout;
mod exec;
pub mod forwards;
pub mod ide;
mod runner;
mod seed;
mod skills;
mod status;

use crate::runtime::RuntimeError;

pub use bootstrap::sync_credentials;
pub use bootstrap::{
    BootstrapReport, InstallOutcome, ProfileBootstrap, bootstrap, bootstrap_best_effort,
};
pub use brief::{
    CurrentBrief, brief_finished, brief_id, current_brief, record_brief_progress, runner_env,
    scheduled_brief_id,
};
pub use checkout::{BLOCKING_FILES_NAMED, CheckoutMode, CheckoutOutcome, checkout};
pub use exec::sha256_hex;
pub use runner::{
    LogChunk, RESUME_SESSION_ENV, RunnerOutcome, RunnerState, TITLE_KNOWN_ENV, answer, runner_log,
    runner_log_from, start_runner,
};
pub use seed::{
    ENV_BLOCK_BEGIN, ENV_BLOCK_END, SeedInputs, SeedReport, WrittenFiles, env_file_with_block,
    seed, sync_env,
};
pub use skills::{MAX_SKILL_BYTES, MAX_SKILL_FILES, SkillFile, SkillSet, read_skills};
pub use status::{AgentReport, parse_agent_status, read_agent_status, sanitize_untrusted};

/// Where berth's support files live in every container.
pub const SUPPORT_DIR: &str = "/usr/local/lib/berth";
/// The offline agent, pushed at bootstrap.
pub const SHELL_AGENT_PATH: &str = "/usr/local/lib/berth/shell-agent";
/// Runs a profile's runner with its output appended to the capped runner log.
pub const RUNNER_WRAPPER_PATH: &str = "/usr/local/lib/berth/runner";
/// The agent adapter (a Node script): runs a CLI whose `runner.protocol` is not `status-file`
/// and keeps the status contract for it.
pub const ADAPTER_PATH: &str = "/usr/local/lib/berth/adapter";
/// The tmpfs directory of the agent status contract.
pub const RUN_DIR: &str = "/run/berth";
pub const BRIEF_FILE: &str = "/run/berth/brief.md";
pub const BRIEF_ID_FILE: &str = "/run/berth/brief.id";
pub const STATUS_FILE: &str = "/run/berth/agent.json";
/// The most of the agent's status file berth reads: the agent writes it, so past this it is
/// unreadable rather than read whole.
pub const STATUS_FILE_MAX_BYTES: u64 = 64 * 1024;
pub const ANSWER_FILE: &str = "/run/berth/answer";
pub const RUNNER_PID_FILE: &str = "/run/berth/runner.pid";
pub const RUNNER_LOG: &str = "/var/log/berth/runner.log";
/// The runner log is rotated once it grows past this many bytes.
pub const RUNNER_LOG_CAP: u64 = 1024 * 1024;
/// The file in a profile's home that holds its credentials.
pub const CREDENTIALS_FILE_NAME: &str = ".berth-credentials.env";

/// Why an agent step failed. Secret values never appear in these messages; secret keys may.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// A profile's CLI is missing and could not be installed.
    #[error("agent profile {profile}: {message}")]
    InstallFailed { profile: String, message: String },

    /// A profile needs a project secret that is not set.
    #[error("agent profile {profile} needs the project secret {key}, which is not set")]
    CredentialMissing { profile: String, key: String },

    /// A profile's spec cannot be applied as it is (a runtime asset outside its home, ...).
    #[error("agent profile {profile}: {field}: {message}")]
    InvalidProfile {
        profile: String,
        field: String,
        message: String,
    },

    #[error("checkout of {url}: {message}")]
    CheckoutFailed { url: String, message: String },

    #[error("seed {path}: {message}")]
    SeedFailed { path: String, message: String },

    /// A profile's skill could not be read on the host.
    #[error("skill {skill} of agent profile {profile}: {message}")]
    SkillFailed {
        profile: String,
        skill: String,
        message: String,
    },

    #[error("runner: {message}")]
    RunnerFailed { message: String },

    /// The container runtime failed a call; `reason` is the step's failure reason.
    #[error("{what}: {source}")]
    Runtime {
        reason: &'static str,
        what: String,
        #[source]
        source: RuntimeError,
    },
}

impl AgentError {
    /// The condition reason: `InstallFailed`, `CredentialMissing`, `InvalidProfile`,
    /// `CheckoutFailed`, `SeedFailed`, `SkillFailed` or `RunnerFailed`.
    pub fn reason(&self) -> &'static str {
        match self {
            AgentError::InstallFailed { .. } => "InstallFailed",
            AgentError::CredentialMissing { .. } => "CredentialMissing",
            AgentError::InvalidProfile { .. } => "InvalidProfile",
            AgentError::CheckoutFailed { .. } => "CheckoutFailed",
            AgentError::SeedFailed { .. } => "SeedFailed",
            AgentError::SkillFailed { .. } => "SkillFailed",
            AgentError::RunnerFailed { .. } => "RunnerFailed",
            AgentError::Runtime { reason, .. } => reason,
        }
    }

    /// Worth retrying unchanged: the runtime was unreachable or a call timed out.
    pub fn is_transient(&self) -> bool {
        matches!(self, AgentError::Runtime { source, .. } if source.is_transient())
    }
}

pub type Result<T, E = AgentError> = std::result::Result<T, E>;

/// A profile as the steps take it: its name and its spec.
pub type NamedProfile<'a> = (&'a str, &'a berth_api::AgentProfileSpec);
