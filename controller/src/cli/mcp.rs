//! `berth mcp [PROJECT]`: serves the workspace tools to a local agent over MCP on stdin and
//! stdout (see [`crate::mcp`]). Registered once with the agent, e.g.
//! `claude mcp add berth -- berth mcp NAME`.

use std::process::ExitCode;

use clap::Args;

use super::Context;
use crate::mcp::Bridge;

#[derive(Debug, Args)]
pub struct McpArgs {
    /// The project whose workspace the tools run in; without it every tool takes a `project`
    /// argument (any project you are a member of).
    project: Option<String>,
}

pub async fn run(context: &Context, args: McpArgs) -> anyhow::Result<ExitCode> {
    let bridge = Bridge::new(context.client()?, args.project).await?;
    bridge.serve_stdio().await?;
    Ok(ExitCode::SUCCESS)
}
