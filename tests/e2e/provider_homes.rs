//! Every shipped profile's home is a durable volume: a file in each (Claude Code's
//! `.claude.json` among them, which `CLAUDE_CONFIG_DIR` puts in its home) and the `.env` that
//! `berth secret set` writes are back, byte for byte, after `berth restart --recreate` and after
//! an image change. The profiles cannot install on berth-tiny without a network, which holds
//! nothing up (`ProfileFailed`); their homes are mounted all the same.

use std::time::{Duration, Instant};

use crate::harness::{Berth, exec, lxc, unique_name};
use serde_json::json;

/// The shipped profiles and their homes, as `manifests/agents/` has them.
const HOMES: [(&str, &str); 6] = [
    ("claude", "/root/.claude"),
    ("codex", "/root/.codex"),
    ("kimi", "/root/.codex-kimi"),
    ("minimax", "/root/.codex-minimax"),
    ("antigravity", "/root/.gemini/antigravity-cli"),
    ("shell", "/root/.berth-shell"),
];
/// What each home and the workspace's `.env` hold, as the container reads them.
fn contents(name: &str) -> String {
    let mut script = String::new();
    for (profile, home) in HOMES {
        script.push_str(&format!("cat {home}/state-{profile}; "));
    }
    script.push_str("cat /root/.claude/.claude.json; grep -c '^API_KEY=' /workspace/.env");
    exec(name, &script).unwrap_or_else(|e| panic!("read the homes of {name}: {e}"))
}

#[test]
fn provider_homes_and_secrets_survive_a_recreate_and_an_image_change() {
    let mut berth = Berth::start_with(&[], &[]);
    let agents = concat!(env!("CARGO_MANIFEST_DIR"), "/../manifests/agents/");
    berth.cli_ok(&["apply", "-f", agents]);
    let name = unique_name();
    let profiles: Vec<&str> = HOMES.iter().map(|(p, _)| *p).collect();
    berth.create_project(&name, json!({"image": "berth-tiny", "agents": profiles}));
    berth.wait_ready(&name);

    let mut script = String::new();
    for (profile, home) in HOMES {
        script.push_str(&format!(
            "mkdir -p {home} && echo 'kept by {profile}' > {home}/state-{profile} && "
        ));
    }
    script.push_str(
        "echo '{\"userID\":\"u-1\",\"hasCompletedOnboarding\":true}' > /root/.claude/.claude.json",
    );
    exec(&name, &script).unwrap();
    let value = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(value.path(), "s3cret-value").unwrap();
    let from = value.path().to_str().unwrap();
    berth.cli_ok(&["secret", "set", &name, "API_KEY", "--from-file", from]);
    let deadline = Instant::now() + Duration::from_secs(120);
    while exec(&name, "grep -q '^API_KEY=s3cret-value$' /workspace/.env").is_err() {
        assert!(
            Instant::now() < deadline,
            "the secret never reached /workspace/.env"
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    let before = contents(&name);
    assert!(before.contains("kept by antigravity"), "{before}");

    let old = lxc(&["config", "get", &name, "volatile.uuid"]).unwrap();
    berth.cli_ok(&["restart", &name, "--recreate"]);
    berth.wait_replaced(&name, &old);
    assert_eq!(contents(&name), before, "after restart --recreate");

    let old = lxc(&["config", "get", &name, "volatile.uuid"]).unwrap();
    let reply = berth.patch_project(&name, json!({"spec": {"image": "berth-base"}}));
    assert!(reply.status < 300, "{}", reply.text());
    berth.wait_replaced(&name, &old);
    assert_eq!(contents(&name), before, "after an image change");
    assert_eq!(
        exec(&name, "cat /etc/os-release | grep -c '^ID=debian'")
            .unwrap()
            .trim(),
        "1",
        "the new container is berth-base's"
    );
    berth.delete_project(&name);
}
