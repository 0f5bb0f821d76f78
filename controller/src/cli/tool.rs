//! `berth tool NAME TOOL --args JSON`: runs one workspace tool in a project's container, for
//! manual use. `TOOL` is Read, Glob, Grep, Write, Edit or Bash; `capabilities` and
//! `instructions` show what the endpoint offers and the workspace's instruction files.

use std::process::ExitCode;

use anyhow::Context as _;
use clap::Args;
use reqwest::Method;
use serde_json::{Value, json};

use super::Context;
use crate::client::{API_PREFIX, encode_segment};

#[derive(Debug, Args)]
pub struct ToolArgs {
    /// The project.
    project: String,
    /// Read, Glob, Grep, Write, Edit, Bash; or `capabilities`, `instructions`.
    tool: String,
    /// The tool's arguments as a JSON object, e.g. '{"command": "ls"}'.
    #[arg(long = "args", value_name = "JSON", default_value = "{}")]
    arguments: String,
    /// The execution's id; a repeated id returns the recorded outcome (default: a new one).
    #[arg(long, value_name = "ID")]
    execution_id: Option<String>,
    /// Give up (and kill what the tool started) after this many milliseconds.
    #[arg(long, value_name = "MS")]
    timeout_ms: Option<u64>,
    /// The workspace directory paths are resolved against (default /workspace).
    #[arg(long, value_name = "PATH")]
    workspace_path: Option<String>,
}

pub async fn run(context: &Context, args: ToolArgs) -> anyhow::Result<ExitCode> {
    let client = context.client()?;
    let base = format!(
        "{API_PREFIX}/projects/{}/tools",
        encode_segment(&args.project)
    );
    match args.tool.as_str() {
        "capabilities" | "instructions" => {
            let path = if args.tool == "capabilities" {
                base
            } else {
                format!("{base}/instructions")
            };
            let value = client.request_json(Method::GET, &path, None).await?;
            println!("{}", serde_json::to_string_pretty(&value)?);
            return Ok(ExitCode::SUCCESS);
        }
        _ => {}
    }
    let arguments: Value = serde_json::from_str(&args.arguments)
        .with_context(|| format!("--args: {:?} is not JSON", args.arguments))?;
    if !arguments.is_object() {
        anyhow::bail!("--args: must be a JSON object");
    }
    let mut body = json!({
        "executionId": args
            .execution_id
            .unwrap_or_else(|| uuid::Uuid::new_v4().to_string()),
        "arguments": arguments,
    });
    if let Some(ms) = args.timeout_ms {
        body["timeoutMs"] = json!(ms);
    }
    if let Some(path) = args.workspace_path {
        body["workspacePath"] = json!(path);
    }
    let path = format!("{base}/{}", encode_segment(&args.tool));
    let reply = client
        .request_json(
            Method::POST,
            &path,
            Some(("application/json", serde_json::to_vec(&body)?)),
        )
        .await?;
    if let Some(output) = reply.get("output").and_then(Value::as_str) {
        print!("{output}");
        if !output.is_empty() && !output.ends_with('\n') {
            println!();
        }
    }
    let code = reply.get("exitCode").and_then(Value::as_i64).unwrap_or(0);
    Ok(ExitCode::from(code.clamp(0, 255) as u8))
}
