//! `berth completion bash|zsh|fish`: a completion script on stdout.

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
    clap_complete::generate(shell, &mut command, "berth", &mut std::io::stdout());
    Ok(ExitCode::SUCCESS)
}
