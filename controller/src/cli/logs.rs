//! `berth logs NAME [-f] [--tail N]`: the output of a project's agent runner
//! (`/var/log/berth/runner.log` in its container). Following polls the server from the offset the
//! last read ended at, and ends once the runner has exited and its log is read to the end.

use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;
use berth_api::{Kind, Step};
use clap::Args;

use super::Context;
use crate::client::{API_PREFIX, encode_segment};

/// How often `--follow` asks for more.
const FOLLOW_POLL: Duration = Duration::from_secs(1);

#[derive(Debug, Args)]
pub struct LogsArgs {
    /// The project.
    project: String,
    /// Keep printing the log as it grows, until the runner exits (or until interrupted).
    #[arg(short, long)]
    follow: bool,
    /// Only the last N lines (default: the last 64 KiB).
    #[arg(long, value_name = "N")]
    tail: Option<u64>,
}

pub async fn run(context: &Context, args: LogsArgs) -> anyhow::Result<ExitCode> {
    let client = context.client()?;
    let base = format!(
        "{API_PREFIX}/projects/{}/logs",
        encode_segment(&args.project)
    );
    let lines = args.tail.map(|n| n.to_string());
    let mut query: Vec<(&str, &str)> = lines.iter().map(|n| ("tailLines", n.as_str())).collect();
    let mut path = base.clone();
    let mut said_waiting = false;
    loop {
        let reply = client.get_json(&path, &query).await?;
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
        query.clear();
        match reply["runner"].as_str() {
            // The state was read before the log: an exited runner's log is whole once a read
            // brings nothing new.
            Some("Exited") if text.is_empty() => return Ok(ExitCode::SUCCESS),
            Some("Exited") => continue,
            Some("NotStarted") => {
                let project = client.get(Kind::Project, &args.project).await?;
                let step = project["status"]["step"].as_str().and_then(Step::parse);
                // Past its start in this boot, no runner is coming (its brief is done).
                if step.is_some_and(|s| s >= Step::RunnerStarted) {
                    return Ok(ExitCode::SUCCESS);
                }
                if !said_waiting {
                    eprintln!(
                        "waiting for the runner of project {} to start (step {})",
                        args.project,
                        step.map_or("none", Step::as_str)
                    );
                    said_waiting = true;
                }
            }
            _ => {}
        }
        tokio::time::sleep(FOLLOW_POLL).await;
    }
}
