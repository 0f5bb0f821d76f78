//! `berth serve`: opens the store, serves the API and runs the controller until a signal.

use std::path::PathBuf;

/// What the command line may override in the configuration file.
#[derive(Debug, Clone, Default)]
pub struct DaemonOptions {
    pub config_path: Option<PathBuf>,
    pub data_dir: Option<PathBuf>,
    pub socket: Option<PathBuf>,
    pub listen: Option<String>,
    pub paused: bool,
    pub log_format: String,
}

pub fn run(_opts: DaemonOptions) -> anyhow::Result<()> {
    anyhow::bail!("the daemon is not built yet")
}
