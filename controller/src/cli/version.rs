//! `berth version`: the client's version, and the server's when it answers.

use std::process::ExitCode;

use clap::Args;

use super::Context;
use super::render::str_at;

#[derive(Debug, Args)]
pub struct VersionArgs {
    /// Print only the client version; do not contact the server.
    #[arg(long)]
    client: bool,
}

pub async fn run(context: &Context, args: VersionArgs) -> anyhow::Result<ExitCode> {
    println!("Client Version: {}", env!("CARGO_PKG_VERSION"));
    if args.client {
        return Ok(ExitCode::SUCCESS);
    }
    let answer = context.client()?.version().await?;
    let version = str_at(&answer, "version");
    println!(
        "Server Version: {}",
        if version.is_empty() {
            "<unknown>"
        } else {
            version
        }
    );
    Ok(ExitCode::SUCCESS)
}
