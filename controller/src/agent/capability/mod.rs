//! What berth adds to a workspace for a project's `spec.capabilities`.
//!
//! `schedules`: `berth-schedule` (bash, speaking HTTP over `/dev/tcp`, so any image with bash
//! runs it) and its skill under `/workspace/.berth/`, and a project token
//! (`BERTH_PROJECT_TOKEN`, a project secret, so it reaches `/workspace/.env` and outlives the
//! container) that the agent API takes for this project's schedules and nothing else.

use berth_api::{AGENT_API_PORT, Capability, ProjectSpec};

/// Where `berth-schedule` is written.
pub const SCHEDULE_CLI: &str = "/workspace/.berth/bin/berth-schedule";
/// Where its skill is written.
pub const SCHEDULE_SKILL: &str = "/workspace/.berth/skills/schedules/SKILL.md";
/// The project secret holding the project's token.
pub const TOKEN_KEY: &str = "BERTH_PROJECT_TOKEN";
/// Every project token starts with this, and then the project's name and a `.`.
pub const TOKEN_PREFIX: &str = "berthp.";

const SCHEDULE_CLI_TEXT: &str = include_str!("berth-schedule.sh");
const SCHEDULE_SKILL_TEXT: &str = include_str!("SKILL.md");

/// The files a spec's capabilities put in the workspace: (path, content, mode).
pub fn files(spec: &ProjectSpec) -> Vec<(&'static str, String, u32)> {
    if !spec.capabilities.contains(&Capability::Schedules) {
        return Vec::new();
    }
    vec![
        (
            SCHEDULE_CLI,
            SCHEDULE_CLI_TEXT.replace("@PORT@", &AGENT_API_PORT.to_string()),
            0o755,
        ),
        (SCHEDULE_SKILL, SCHEDULE_SKILL_TEXT.to_string(), 0o644),
    ]
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
    fn the_schedules_capability_writes_its_cli_and_skill() {
        let mut spec = ProjectSpec::default();
        assert!(files(&spec).is_empty());
        spec.capabilities = vec![Capability::Schedules];
        let files = files(&spec);
        assert_eq!(files.len(), 2);
        assert!(files[0].1.contains(&format!("port={AGENT_API_PORT}\n")));
        assert!(!files[0].1.contains("@PORT@"));
        assert_eq!(files[0].2, 0o755);
    }
}
