//! `berth logs NAME [-f]`: the output of a project's agent runner (`/var/log/berth/runner.log`
//! in its container). Following polls the server from the offset the last read ended at.

use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;
use clap::Args;
use reqwest::Method;

use super::Context;
use crate::client::{API_PREFIX, encode_segment};

/// How often `--follow` asks for more.
const FOLLOW_POLL: Duration = Duration::from_secs(1);

#[derive(Debug, Args)]
pub struct LogsArgs {
    /// The project.
    project: String,
    /// Keep printing the log as it grows, until interrupted.
    #[arg(short, long)]
    follow: bool,
}

pub async fn run(context: &Context, args: LogsArgs) -> anyhow::Result<ExitCode> {
    let client = context.client()?;
    let base = format!(
        "{API_PREFIX}/projects/{}/logs",
        encode_segment(&args.project)
    );
    // The server's default tail (64 KiB) first, then from where each read ended.
    let mut path = base.clone();
    loop {
        let reply = client.request_json(Method::GET, &path, None).await?;
        let text = reply["text"].as_str().unwrap_or_default();
        let mut out = std::io::stdout().lock();
        out.write_all(text.as_bytes())
            .and_then(|()| out.flush())
            .context("writing to stdout")?;
        if !args.follow {
            return Ok(ExitCode::SUCCESS);
        }
        let next = reply["nextOffset"]
            .as_u64()
            .context("the server's reply has no nextOffset")?;
        path = format!("{base}/{next}");
        tokio::time::sleep(FOLLOW_POLL).await;
    }
}
