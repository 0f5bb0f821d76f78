//! The `berth` command line: one module per subcommand.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod serve;

#[derive(Debug, Parser)]
#[command(
    name = "berth",
    version,
    about = "Durable LXD workspaces for AI coding agents"
)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the daemon: API, store and controller.
    Serve(serve::ServeArgs),
}

pub fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Serve(args) => serve::run(args),
    };
    match result {
        Ok(code) => code,
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::FAILURE
        }
    }
}
