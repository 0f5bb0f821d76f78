//! `berth checkout NAME --force`: lets a project's held checkout (`CheckoutBlocked`: the
//! workspace holds files berth did not write) go ahead over those files. The controller first
//! copies the workspace volume into the trash (`berth trash list`), then checks out
//! (`POST .../projects/NAME/forcecheckout`, members).

use std::process::ExitCode;

use clap::Args;

use super::Context;

#[derive(Debug, Args)]
pub struct CheckoutArgs {
    /// The project whose checkout is held.
    name: String,
    /// Write over the workspace's files (a copy of the workspace goes to the trash first).
    #[arg(long)]
    force: bool,
}

pub async fn run(context: &Context, args: CheckoutArgs) -> anyhow::Result<ExitCode> {
    if !args.force {
        anyhow::bail!(
            "--force: required; a held checkout otherwise waits until the files it names are moved out of /workspace"
        );
    }
    context
        .client()?
        .request_forced_checkout(&args.name)
        .await?;
    println!(
        "project/{} checkout forced: the workspace is copied to the trash, then checked out",
        args.name
    );
    Ok(ExitCode::SUCCESS)
}
