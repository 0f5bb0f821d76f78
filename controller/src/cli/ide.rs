//! `berth ide NAME`: starts code-server in a member's project if it is not running (on demand,
//! never at boot) and prints the IDE's URL (`<name>--ide.<previewDomain>`) with a one-time
//! ticket that signs the browser in (`POST .../projects/NAME/ide`).

use std::process::ExitCode;

use clap::Args;

use super::Context;
use super::render::{self, OutputFormat};

#[derive(Debug, Args)]
pub struct IdeArgs {
    /// The project.
    name: String,
    /// Output format (yaml or json print the answer as the server gave it).
    #[arg(short = 'o', long = "output", value_enum)]
    output: Option<OutputFormat>,
}

pub async fn run(context: &Context, args: IdeArgs) -> anyhow::Result<ExitCode> {
    let ide = context.client()?.open_ide(&args.name).await?;
    match args.output {
        Some(OutputFormat::Yaml) => print!("{}", render::to_yaml(&ide)),
        Some(OutputFormat::Json) => print!("{}", render::to_json(&ide)),
        _ => {
            let done = if ide["started"].as_bool() == Some(true) {
                "started"
            } else {
                "already running"
            };
            eprintln!(
                "project/{}: code-server {done} (pid {}); the link signs a browser in once, within a minute",
                args.name, ide["pid"]
            );
            println!("{}", ide["url"].as_str().unwrap_or_default());
        }
    }
    Ok(ExitCode::SUCCESS)
}
