use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;

use crate::daemon::{self, DaemonOptions};

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Configuration file (berth.yaml); every key has a default.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Directory for the database, the secrets key and git checkouts.
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Unix socket to serve the API on.
    #[arg(long)]
    socket: Option<PathBuf>,
    /// Also serve the API on this TCP address (token auth), e.g. 127.0.0.1:7480.
    #[arg(long)]
    listen: Option<String>,
    /// Serve previews on this TCP address (listen.preview), e.g. 127.0.0.1:0 for a free port;
    /// "" disables them.
    #[arg(long)]
    preview: Option<String>,
    /// Serve the API and store, but let the controller act on nothing.
    #[arg(long)]
    paused: bool,
    /// Log format: text or json.
    #[arg(long, default_value = "text")]
    log_format: String,
}

pub fn run(args: ServeArgs) -> anyhow::Result<ExitCode> {
    daemon::run(DaemonOptions {
        config_path: args.config,
        data_dir: args.data_dir,
        socket: args.socket,
        listen: args.listen,
        preview: args.preview,
        paused: args.paused,
        log_format: args.log_format,
    })?;
    Ok(ExitCode::SUCCESS)
}
