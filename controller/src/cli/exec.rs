//! `berth exec NAME -- CMD...`: runs a command in a project's container (in /workspace, with the
//! project's environment and secrets), prints its output and exits with its exit code.

use std::io::Write as _;
use std::process::ExitCode;

use anyhow::{Context as _, bail};
use clap::Args;
use reqwest::Method;

use super::Context;
use crate::client::{API_PREFIX, encode_segment};
use crate::inspect::exec::{ExecCall, ExecResult};

/// The API client gives up on a request after 120 s; a command must end before that.
const MAX_TIMEOUT_SECS: u64 = 110;

#[derive(Debug, Args)]
pub struct ExecArgs {
    /// The project to run in.
    name: String,
    /// Interactive terminal: not supported yet, commands run to completion.
    #[arg(short = 'i', long = "stdin")]
    stdin: bool,
    #[arg(short = 't', long = "tty")]
    tty: bool,
    /// Working directory inside the container.
    #[arg(long, default_value = crate::inspect::exec::DEFAULT_CWD)]
    cwd: String,
    /// Extra environment, KEY=VALUE (repeatable).
    #[arg(short = 'e', long = "env", value_name = "KEY=VALUE")]
    env: Vec<String>,
    /// Seconds the command may run.
    #[arg(long, default_value_t = 100)]
    timeout: u64,
    /// The command and its arguments, after `--`.
    #[arg(last = true, required = true, value_name = "CMD")]
    command: Vec<String>,
}

pub async fn run(context: &Context, args: ExecArgs) -> anyhow::Result<ExitCode> {
    if args.stdin || args.tty {
        bail!(
            "exec -i/-t: interactive terminals are not supported yet; run the command without them"
        );
    }
    if args.timeout == 0 || args.timeout > MAX_TIMEOUT_SECS {
        bail!(
            "--timeout: {} is not between 1 and {MAX_TIMEOUT_SECS} seconds",
            args.timeout
        );
    }
    let mut environment = std::collections::BTreeMap::new();
    for pair in &args.env {
        let Some((key, value)) = pair.split_once('=') else {
            bail!("--env: {pair:?} is not KEY=VALUE");
        };
        environment.insert(key.to_string(), value.to_string());
    }
    let call = ExecCall {
        command: args.command,
        environment,
        cwd: Some(args.cwd),
        timeout_seconds: Some(args.timeout),
    };
    let path = format!("{API_PREFIX}/projects/{}/exec", encode_segment(&args.name));
    let body = serde_json::to_vec(&call)?;
    let reply = context
        .client()?
        .request_json(Method::POST, &path, Some(("application/json", body)))
        .await?;
    let result: ExecResult =
        serde_json::from_value(reply).context("reading the server's exec result")?;
    std::io::stdout().write_all(result.stdout.as_bytes())?;
    std::io::stdout().flush()?;
    std::io::stderr().write_all(result.stderr.as_bytes())?;
    // Exit codes beyond a byte (or negative, for a signal) still mean failure.
    Ok(match u8::try_from(result.exit_code) {
        Ok(code) => ExitCode::from(code),
        Err(_) => ExitCode::FAILURE,
    })
}
