//! The `browser` capability: a headless Chromium for the agent through the Playwright MCP
//! server (`playwright-mcp`, which the image `berth-agents` carries pinned, with Debian's
//! Chromium and Node).
//!
//! berth writes, under `/workspace/.berth/`:
//! - `browser/playwright-mcp.json`, the server's configuration: the image's Chromium, headless,
//!   an in-memory profile, no sandbox (a container's root has none to give) and the switches
//!   that keep Chromium off the network it does not have; files it names itself go to
//!   `browser/output/`;
//! - `mcp.json`, the MCP servers berth publishes to the agent's CLI (Claude Code's
//!   `mcpServers` format): the agent adapter hands them to Claude Code (`--mcp-config`, their
//!   tools allowed) and to Codex (`-c mcp_servers.NAME...`), so a headless run needs no
//!   approval of a project's `.mcp.json`;
//! - the skill `skills/browser/SKILL.md` and `bin/berth-screenshot`, a screenshot by Chromium
//!   alone for an agent without MCP.

use std::time::Duration;

use serde_json::json;

use crate::agent::Result;
use crate::agent::exec::{exit_failure, run_script};
use crate::runtime::Runtime;

/// The MCP servers berth publishes to the agent's CLI; the agent adapter reads it.
pub const MCP_SERVERS: &str = "/workspace/.berth/mcp.json";
/// The Playwright MCP server's configuration.
pub const BROWSER_CONFIG: &str = "/workspace/.berth/browser/playwright-mcp.json";
/// Where the server puts files it names itself (a screenshot without a file name).
pub const BROWSER_OUTPUT: &str = "/workspace/.berth/browser/output";
/// The skill.
pub const BROWSER_SKILL: &str = "/workspace/.berth/skills/browser/SKILL.md";
/// The screenshot script.
pub const BROWSER_SCREENSHOT: &str = "/workspace/.berth/bin/berth-screenshot";
/// Every file the browser writes.
pub const PATHS: [&str; 4] = [
    BROWSER_CONFIG,
    MCP_SERVERS,
    BROWSER_SKILL,
    BROWSER_SCREENSHOT,
];
/// The MCP server's name: its tools are `mcp__browser__browser_navigate`, ...
pub const SERVER_NAME: &str = "browser";
/// The command of the MCP server, looked up on the container's PATH.
pub const SERVER_COMMAND: &str = "playwright-mcp";

/// Chromium's switches in a container: no sandbox (it runs as root, without user namespaces of
/// its own); as little as it can of reaching for the network on its own (updates, sync, the
/// time, QUIC, GPU probing), which a container without a NIC answers only with failures and
/// delays; and no proxy, whatever the environment says: the browser opens what the container
/// serves, and a proxy forwarded for the agent's model is not a way out for pages (Chromium
/// still asks Google for updates now and then, which a container without a NIC refuses).
const CHROMIUM_ARGS: [&str; 9] = [
    "--no-sandbox",
    "--no-proxy-server",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-features=NetworkTimeServiceQuerying",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
    "--disable-gpu",
];

const SKILL_TEXT: &str = include_str!("browser-SKILL.md");
const SCREENSHOT_TEXT: &str = include_str!("berth-screenshot.sh");
const LOOK_TIMEOUT: Duration = Duration::from_secs(30);

/// Prints `chromium PATH` when the image has all the browser needs, else `missing NAME...`.
/// Debian's binary comes first: its `/usr/bin/chromium` wrapper adds the switches of
/// `/etc/chromium.d` (remote extensions, Google API keys), with which Chromium asks Google for
/// extension updates and the time whatever switches berth gives it.
const LOOK_SCRIPT: &str = r#"
missing=
command -v playwright-mcp >/dev/null 2>&1 || missing="$missing playwright-mcp"
command -v node >/dev/null 2>&1 || missing="$missing node"
chromium=
if [ -x /usr/lib/chromium/chromium ]; then
    chromium=/usr/lib/chromium/chromium
else
    for c in chromium chromium-browser; do
        chromium=$(command -v "$c" 2>/dev/null) && break
    done
fi
[ -n "$chromium" ] || missing="$missing chromium"
if [ -n "$missing" ]; then echo "missing$missing"; else echo "chromium $chromium"; fi
"#;

/// The image's Chromium when the container has everything the browser needs, else the line
/// `CapabilityFailed` carries.
pub async fn look(rt: &dyn Runtime, instance: &str) -> Result<Result<String, String>> {
    let out = run_script(rt, instance, "SeedFailed", LOOK_SCRIPT, &[], LOOK_TIMEOUT).await?;
    if out.exit_code != 0 {
        return Ok(Err(format!(
            "browser: {}",
            exit_failure("looking for Chromium and playwright-mcp", &out)
        )));
    }
    Ok(read_look(&String::from_utf8_lossy(&out.stdout)))
}

fn read_look(stdout: &str) -> Result<String, String> {
    let line = stdout.lines().next().unwrap_or("").trim();
    // The path goes into a script: plain characters only.
    if let Some(path) = line.strip_prefix("chromium ")
        && path.starts_with('/')
        && path
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"/._+-".contains(&b))
    {
        return Ok(path.to_string());
    }
    if let Some(names) = line.strip_prefix("missing ") {
        let names: Vec<&str> = names.split_whitespace().collect();
        return Err(format!(
            "browser: the image has no {} (the image berth-agents carries them); the project goes on without a browser",
            names.join(", ")
        ));
    }
    Err(format!(
        "browser: looking for Chromium and playwright-mcp answered {line:?}; the project goes on without a browser"
    ))
}

/// The browser's files for the Chromium at `chromium`: (path, content, mode).
pub fn files(chromium: &str) -> Vec<(&'static str, String, u32)> {
    let config = json!({
        "browser": {
            "browserName": "chromium",
            "isolated": true,
            "launchOptions": {
                "executablePath": chromium,
                "headless": true,
                "chromiumSandbox": false,
                "args": CHROMIUM_ARGS,
            },
        },
        "outputDir": BROWSER_OUTPUT,
    });
    let servers = json!({
        "mcpServers": {
            SERVER_NAME: {
                "type": "stdio",
                "command": SERVER_COMMAND,
                "args": ["--config", BROWSER_CONFIG],
            },
        },
    });
    let screenshot = SCREENSHOT_TEXT
        .replace("@CHROMIUM@", chromium)
        .replace("@ARGS@", &CHROMIUM_ARGS.join(" "));
    vec![
        (BROWSER_CONFIG, pretty(&config), 0o644),
        (MCP_SERVERS, pretty(&servers), 0o644),
        (BROWSER_SKILL, SKILL_TEXT.to_string(), 0o644),
        (BROWSER_SCREENSHOT, screenshot, 0o755),
    ]
}

fn pretty(value: &serde_json::Value) -> String {
    let mut text = serde_json::to_string_pretty(value).expect("JSON values serialise");
    text.push('\n');
    text
}

#[cfg(test)]
#[path = "browser_tests.rs"]
mod tests;
