//! `berth completion bash|zsh|fish`: a completion script on stdout.

use std::io::Write;
use std::process::ExitCode;

use clap::{Args, CommandFactory};
use clap_complete::Shell;

use super::Cli;

#[derive(Debug, Args)]
pub struct CompletionArgs {
    #[arg(value_parser = ["bash", "zsh", "fish"])]
    shell: String,
}

pub fn run(args: CompletionArgs) -> anyhow::Result<ExitCode> {
    let shell = match args.shell.as_str() {
        "bash" => Shell::Bash,
        "zsh" => Shell::Zsh,
        _ => Shell::Fish,
    };
    let mut command = Cli::command();
    // Rendered whole first: the generator panics on a failed write (a closed pipe), while a
    // write error here ends the command quietly.
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut command, "berth", &mut script);
    std::io::stdout().write_all(&script)?;
    Ok(ExitCode::SUCCESS)
}
