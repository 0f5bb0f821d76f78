//! What berth adds to a workspace for a project's `spec.capabilities`.
//!
//! `schedules`: `berth-schedule` (bash, speaking HTTP over `/dev/tcp`, so any image with bash
//! runs it) and its skill under `/workspace/.berth/`, and a project token
//! (`BERTH_PROJECT_TOKEN`, a project secret, so it reaches `/workspace/.env` and outlives the
//! container) that the agent API takes for this project's schedules and nothing else.
//!
//! `browser` ([`browser`]): what the image offers is looked at first ([`look`]); the Playwright
//! MCP server's configuration, the MCP servers file the agent adapter hands to the CLI, a skill
//! and a screenshot script are written only when the image has them all, and a capability the
//! image cannot carry is a [`Found::failures`] line, never a failed step.

pub mod browser;

use berth_api::{AGENT_API_PORT, Capability, ProjectSpec};

use super::{NamedProfile, Result};
use crate::runtime::Runtime;

pub use browser::{BROWSER_CONFIG, BROWSER_SCREENSHOT, BROWSER_SKILL, MCP_SERVERS};

/// Where `berth-schedule` is written.
pub const SCHEDULE_CLI: &str = "/workspace/.berth/bin/berth-schedule";
/// Where its skill is written.
pub const SCHEDULE_SKILL: &str = "/workspace/.berth/skills/schedules/SKILL.md";
/// The project secret holding the project's token.
pub const TOKEN_KEY: &str = "BERTH_PROJECT_TOKEN";
/// Every project token starts with this, and then the project's name and a `.`.
pub const TOKEN_PREFIX: &str = "berthp.";

/// The directory every capability's files lie under.
pub const DIR: &str = "/workspace/.berth";

/// Whether berth writes `path` for some capability (so, recorded and no longer wanted, it goes).
pub fn is_capability_file(path: &str) -> bool {
    [SCHEDULE_CLI, SCHEDULE_SKILL].contains(&path) || browser::PATHS.contains(&path)
}

const SCHEDULE_CLI_TEXT: &str = include_str!("berth-schedule.sh");
const SCHEDULE_SKILL_TEXT: &str = include_str!("schedules-SKILL.md");

/// What the container offers the capabilities that need something of its image.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Found {
    /// The browser's Chromium, when the spec asks for a browser and the image has one with
    /// the Playwright MCP server and Node.
    pub chromium: Option<String>,
    /// One line per capability the image cannot carry, naming what it lacks.
    pub failures: Vec<String>,
}

/// Whether the project gets a browser: its spec asks for one, or a profile it lists does.
pub fn wants_browser(spec: &ProjectSpec, profiles: &[NamedProfile<'_>]) -> bool {
    spec.capabilities.contains(&Capability::Browser)
        || profiles
            .iter()
            .any(|(_, p)| p.capabilities.contains(&Capability::Browser))
}

/// Looks in the container for what the project's capabilities need (one exec, and none when
/// no capability needs anything of the image).
pub async fn look(
    rt: &dyn Runtime,
    instance: &str,
    spec: &ProjectSpec,
    profiles: &[NamedProfile<'_>],
) -> Result<Found> {
    let mut found = Found::default();
    if wants_browser(spec, profiles) {
        match browser::look(rt, instance).await? {
            Ok(chromium) => found.chromium = Some(chromium),
            Err(failure) => found.failures.push(failure),
        }
    }
    Ok(found)
}

/// The files a spec's capabilities put in the workspace, given what [`look`] found (the
/// browser's when it found a Chromium): (path, content, mode).
pub fn files(spec: &ProjectSpec, found: &Found) -> Vec<(&'static str, String, u32)> {
    let mut files = Vec::new();
    if spec.capabilities.contains(&Capability::Schedules) {
        files.push((
            SCHEDULE_CLI,
            SCHEDULE_CLI_TEXT.replace("@PORT@", &AGENT_API_PORT.to_string()),
            0o755,
        ));
        files.push((SCHEDULE_SKILL, SCHEDULE_SKILL_TEXT.to_string(), 0o644));
    }
    if let Some(chromium) = &found.chromium {
        files.extend(browser::files(chromium));
    }
    files
}

/// Whether the spec asks for a project token.
pub fn wants_token(spec: &ProjectSpec) -> bool {
    spec.capabilities.contains(&Capability::Schedules)
}

/// A fresh token for project `name`: the name (so the agent API finds the project without a
/// search) and 32 random bytes in hex.
pub fn new_token(name: &str) -> String {
    use rand::RngCore;
    let mut bytes = [0u8; 32];
    rand::rng().fill_bytes(&mut bytes);
    format!("{TOKEN_PREFIX}{name}.{}", hex::encode(bytes))
}

/// The project a token names, `None` for anything else. The token still has to equal the
/// project's own ([`TOKEN_KEY`]) to count.
pub fn token_project(token: &str) -> Option<&str> {
    let rest = token.strip_prefix(TOKEN_PREFIX)?;
    let (name, secret) = rest.split_once('.')?;
    (!name.is_empty() && secret.len() == 64).then_some(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_name_their_project_and_nothing_else_passes() {
        let token = new_token("payments-api");
        assert_eq!(token_project(&token), Some("payments-api"));
        assert_ne!(token, new_token("payments-api"));
        for bad in ["", "berthp.", "berthp.x.short", "berth_abc", "berthp..0123"] {
            assert_eq!(token_project(bad), None, "{bad}");
        }
    }

    #[test]
    fn a_browser_is_asked_by_the_spec_or_by_a_listed_profile() {
        let mut spec = ProjectSpec::default();
        let plain = berth_api::AgentProfileSpec::default();
        let browsing = berth_api::AgentProfileSpec {
            capabilities: vec![Capability::Browser],
            ..Default::default()
        };
        assert!(!wants_browser(&spec, &[("a", &plain)]));
        assert!(wants_browser(&spec, &[("a", &plain), ("b", &browsing)]));
        spec.capabilities = vec![Capability::Browser];
        assert!(wants_browser(&spec, &[("a", &plain)]));
        // Only what the look found is written: nothing of the browser without a Chromium.
        assert!(files(&spec, &Found::default()).is_empty());
        let found = Found {
            chromium: Some("/usr/lib/chromium/chromium".into()),
            failures: Vec::new(),
        };
        let written = files(&spec, &found);
        assert!(written.iter().any(|(p, _, _)| *p == MCP_SERVERS));
        // Every file a capability writes is one berth removes once it is not wanted.
        spec.capabilities.push(Capability::Schedules);
        for (path, _, _) in files(&spec, &found) {
            assert!(is_capability_file(path), "{path}");
            assert!(path.starts_with(&format!("{DIR}/")), "{path}");
        }
        assert!(!is_capability_file("/workspace/.berth/notes.md"));
    }

    #[test]
    fn the_schedules_capability_writes_its_cli_and_skill() {
        let mut spec = ProjectSpec::default();
        assert!(files(&spec, &Found::default()).is_empty());
        spec.capabilities = vec![Capability::Schedules];
        let files = files(&spec, &Found::default());
        assert_eq!(files.len(), 2);
        assert!(files[0].1.contains(&format!("port={AGENT_API_PORT}\n")));
        assert!(!files[0].1.contains("@PORT@"));
        assert_eq!(files[0].2, 0o755);
    }
}
