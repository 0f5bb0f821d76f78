//! The AgentProfile kind: how one agent CLI is installed, configured and run in a project.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::error::ValidationErrors;
use crate::files::{
    FileMode, WORKSPACE_DIR, absolute_path, is_within, workspace_dir_path, workspace_file_path,
};
use crate::gitsource::validate_git_url;
use crate::meta::Condition;
use crate::naming::validate_env_key;
use crate::object::kind_object;
use crate::project::{Capability, Repo, validate_ref_name};

kind_object! {
    /// One agent CLI (claude, codex, the offline `shell` agent, ...).
    AgentProfile {
        spec: AgentProfileSpec,
        status: AgentProfileStatus,
    }
}

/// How to provision and run one agent. `home`, `install.check` and `runner.command` are required.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AgentProfileSpec {
    /// Absolute directory of the agent's provider state; it gets a durable volume.
    #[serde(default)]
    #[schemars(extend("x-berth-required" = true))]
    pub home: String,
    #[serde(default)]
    #[schemars(extend("x-berth-required" = true))]
    pub install: AgentInstall,
    /// The instructions file berth converges for this agent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instructions: Option<AgentInstructions>,
    /// Project secrets the agent needs in its environment.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub credentials: Vec<CredentialRef>,
    /// Non-secret files placed under `home`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub runtime_assets: Vec<RuntimeAsset>,
    /// Skill directories copied into every workspace that lists the profile.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub skills: Vec<AgentSkill>,
    /// Capabilities every workspace that lists the profile gets, as if its project asked for
    /// them in `spec.capabilities` (`browser` only: `schedules` is a project's own).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub capabilities: Vec<Capability>,
    #[serde(default)]
    #[schemars(extend("x-berth-required" = true))]
    pub runner: AgentRunner,
}

/// How to tell whether the agent CLI is present, and how to install it when it is not.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AgentInstall {
    /// Shell command that exits 0 when the CLI is installed.
    #[serde(default)]
    #[schemars(extend("x-berth-required" = true))]
    pub check: String,
    /// Shell command that installs the CLI; without it a failed check fails the bootstrap.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<String>,
    /// The version `command` installs (informational).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
}

/// An instructions file (CLAUDE.md, AGENTS.md, ...) under /workspace.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AgentInstructions {
    /// Relative to /workspace, or absolute under it.
    #[serde(default)]
    #[schemars(extend("x-berth-required" = true))]
    pub target: String,
    #[serde(default)]
    pub content: String,
}

impl AgentInstructions {
    /// The absolute path of the file, `None` when the target is invalid.
    pub fn target_path(&self) -> Option<String> {
        workspace_file_path(&self.target).ok()
    }
}

/// A project secret handed to the agent.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CredentialRef {
    /// The secret's key, also the environment variable name.
    #[serde(default)]
    #[schemars(extend("x-berth-required" = true))]
    pub secret: String,
}

/// A non-secret file under the profile's home.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RuntimeAsset {
    /// Absolute path under `home`.
    #[serde(default)]
    #[schemars(extend("x-berth-required" = true))]
    pub path: String,
    #[serde(default)]
    pub content: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<FileMode>,
}

/// One skill directory, from a host path or a git repository, placed in the workspace at
/// `<target>/<name>/`, its name being the directory's (or the repository's) own.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AgentSkill {
    /// An absolute directory on the berth host, under the config's `allowedFileRoots`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// A git repository whose tree is the skill (a `file://` one under `allowedFileRoots`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repo: Option<Repo>,
    /// The directory under /workspace that holds the profile's skills (`.claude/skills`).
    #[serde(default)]
    #[schemars(extend("x-berth-required" = true))]
    pub target: String,
}

/// The most skills one profile may list.
pub const MAX_SKILLS: usize = 64;

impl AgentSkill {
    /// The skill's directory name: the last component of `path`, or of the repository's URL
    /// without `.git`. `None` when neither names one.
    pub fn name(&self) -> Option<&str> {
        let last = match (&self.path, &self.repo) {
            (Some(path), None) => path.trim_end_matches('/').rsplit('/').next()?,
            (None, Some(repo)) => {
                let url = repo.url.trim_end_matches('/');
                let last = url.rsplit(['/', ':']).next()?;
                last.strip_suffix(".git").unwrap_or(last)
            }
            _ => return None,
        };
        (!last.is_empty() && last != "." && last != "..").then_some(last)
    }

    /// The absolute directory the skill's files go to, `<target>/<name>`; `None` when the
    /// target or the name is invalid.
    pub fn placed_at(&self) -> Option<String> {
        let target = workspace_dir_path(&self.target).ok()?;
        Some(format!("{target}/{}", self.name()?))
    }

    /// Where the skill comes from, as a person reads it (a host path or a repository URL).
    pub fn source(&self) -> String {
        match (&self.path, &self.repo) {
            (Some(path), _) => path.clone(),
            (None, Some(repo)) => match &repo.branch {
                Some(branch) => format!("{} ({branch})", crate::redact_credentials(&repo.url)),
                None => crate::redact_credentials(&repo.url).into_owned(),
            },
            (None, None) => String::new(),
        }
    }
}

/// The command that works a brief. `{briefFile}` in an argument stands for the brief's path.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AgentRunner {
    #[serde(default)]
    #[schemars(length(min = 1), extend("x-berth-required" = true))]
    pub command: Vec<String>,
    /// How the runner reports: it writes berth's status file itself (`status-file`), or berth's
    /// agent adapter runs it and reads its machine-readable output.
    #[serde(default, skip_serializing_if = "RunnerProtocol::is_status_file")]
    pub protocol: RunnerProtocol,
}

/// How a runner's CLI reports its progress (`spec.runner.protocol`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum RunnerProtocol {
    /// The runner writes `/run/berth/agent.json` itself (the offline `shell` agent).
    #[default]
    StatusFile,
    /// Claude Code's `-p --output-format stream-json`; permission requests come through a
    /// permission-prompt tool the adapter serves.
    ClaudeStreamJson,
    /// Codex's app server (JSON-RPC over stdio); approvals arrive as requests.
    CodexAppServer,
}

impl RunnerProtocol {
    pub fn as_str(self) -> &'static str {
        match self {
            RunnerProtocol::StatusFile => "status-file",
            RunnerProtocol::ClaudeStreamJson => "claude-stream-json",
            RunnerProtocol::CodexAppServer => "codex-app-server",
        }
    }

    pub fn is_status_file(&self) -> bool {
        *self == RunnerProtocol::StatusFile
    }
}

/// Observed state of a profile (conditions only).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AgentProfileStatus {
    #[serde(default)]
    pub observed_generation: i64,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

pub(crate) fn validate_profile(p: &AgentProfile, errs: &mut ValidationErrors) {
    let s = &p.spec;
    let home = match absolute_path(&s.home) {
        Ok(home) => {
            if home == "/" {
                errs.push("spec.home", "must not be /");
                None
            } else if is_within(&home, WORKSPACE_DIR) {
                errs.push(
                    "spec.home",
                    format!("{:?} must not lie under {WORKSPACE_DIR}", s.home),
                );
                None
            } else {
                Some(home)
            }
        }
        Err(e) => {
            errs.push("spec.home", e);
            None
        }
    };
    if s.install.check.trim().is_empty() {
        errs.push("spec.install.check", "required");
    }
    if s.install
        .command
        .as_ref()
        .is_some_and(|c| c.trim().is_empty())
    {
        errs.push("spec.install.command", "must not be empty when given");
    }
    if let Some(instr) = &s.instructions
        && let Err(e) = workspace_file_path(&instr.target)
    {
        errs.push("spec.instructions.target", e);
    }
    for (i, cred) in s.credentials.iter().enumerate() {
        let field = format!("spec.credentials[{i}].secret");
        if cred.secret.is_empty() {
            errs.push(field, "required");
        } else if let Err(e) = validate_env_key(&cred.secret) {
            errs.push(field, e);
        }
    }
    for (i, asset) in s.runtime_assets.iter().enumerate() {
        let field = format!("spec.runtimeAssets[{i}].path");
        match absolute_path(&asset.path) {
            Ok(path) => {
                if let Some(home) = &home
                    && (path == *home || !is_within(&path, home))
                {
                    errs.push(
                        field,
                        format!("{:?} must lie under home {home}", asset.path),
                    );
                }
            }
            Err(e) => errs.push(field, e),
        }
    }
    validate_skills(&s.skills, errs);
    for (i, capability) in s.capabilities.iter().enumerate() {
        if *capability == Capability::Schedules {
            errs.push(
                format!("spec.capabilities[{i}]"),
                "schedules is a project's own: set it in the Project's spec.capabilities",
            );
        }
    }
    if s.runner.command.is_empty() {
        errs.push("spec.runner.command", "required");
    } else if s.runner.command[0].trim().is_empty() {
        errs.push("spec.runner.command[0]", "must name a program");
    }
}

fn validate_skills(skills: &[AgentSkill], errs: &mut ValidationErrors) {
    if skills.len() > MAX_SKILLS {
        errs.push(
            "spec.skills",
            format!("at most {MAX_SKILLS} skills, not {}", skills.len()),
        );
    }
    let mut placed: Vec<(String, usize)> = Vec::new();
    for (i, skill) in skills.iter().enumerate() {
        let field = |name: &str| format!("spec.skills[{i}].{name}");
        match (&skill.path, &skill.repo) {
            (Some(_), Some(_)) => errs.push(
                format!("spec.skills[{i}]"),
                "give either path or repo, not both",
            ),
            (None, None) => errs.push(format!("spec.skills[{i}]"), "give a path or a repo"),
            (Some(path), None) => match absolute_path(path) {
                Ok(normal) if normal == "/" => errs.push(field("path"), "must not be /"),
                Ok(_) => {}
                Err(e) => errs.push(field("path"), e),
            },
            (None, Some(repo)) => {
                if repo.url.is_empty() {
                    errs.push(field("repo.url"), "required");
                } else if let Err(e) =
                    validate_git_url(&repo.url, &["https", "http", "ssh", "git", "file"])
                {
                    errs.push(field("repo.url"), e);
                } else if skill.name().is_none() {
                    errs.push(
                        field("repo.url"),
                        format!("{:?} names no repository", repo.url),
                    );
                }
                if let Some(branch) = &repo.branch
                    && let Err(e) = validate_ref_name(branch)
                {
                    errs.push(field("repo.branch"), e);
                }
            }
        }
        if let Err(e) = workspace_dir_path(&skill.target) {
            errs.push(field("target"), e);
        }
        if let Some(at) = skill.placed_at() {
            match placed.iter().find(|(p, _)| *p == at) {
                Some((_, first)) => errs.push(
                    format!("spec.skills[{i}]"),
                    format!("places its files at {at}, as spec.skills[{first}] does"),
                ),
                None => placed.push((at, i)),
            }
        }
    }
}
