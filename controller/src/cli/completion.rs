//! `berth completion bash|zsh|fish`: a completion script on stdout; `berth man`: the man page,
//! both generated from the CLI's own definition (the Debian package ships them).

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

#[derive(Debug, Args)]
pub struct ManArgs {}

/// `berth man`: berth(1) in roff on stdout.
pub fn man(_args: ManArgs) -> anyhow::Result<ExitCode> {
    let command = Cli::command();
    clap_mangen::Man::new(command).render(&mut std::io::stdout())?;
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::Cli;

    #[test]
    fn the_man_page_lists_the_subcommands() {
        let mut page = Vec::new();
        clap_mangen::Man::new(Cli::command())
            .render(&mut page)
            .unwrap();
        let page = String::from_utf8(page).unwrap();
        assert!(page.starts_with(".ie \\n(.g .ds Aq"), "{page}");
        for needle in [
            ".TH berth 1",
            "berth\\-apply",
            "berth\\-serve",
            "\\-\\-server",
        ] {
            assert!(page.contains(needle), "{needle} not in:\n{page}");
        }
        assert!(
            !page.contains("berth\\-man"),
            "the hidden man command is listed"
        );
    }
}
