//! `berth delete KIND NAME... | -f FILE`: asks for deletion, then waits until the objects are
//! gone. A deletion the server holds (condition `DeletionBlocked`) ends the wait with its reason.

use std::process::ExitCode;

use clap::{ArgAction, Args};

use super::get::parse_resource;
use super::progress::{self, Goal};
use super::{Context, duration, manifest};
use crate::client::Resource;

#[derive(Debug, Args)]
pub struct DeleteArgs {
    /// project, agentprofile or gitsource (with NAME).
    #[arg(value_parser = parse_resource, required_unless_present = "files", conflicts_with = "files")]
    kind: Option<Resource>,
    /// Objects to delete.
    #[arg(requires = "kind")]
    names: Vec<String>,
    /// Delete the objects these manifests name.
    #[arg(short = 'f', long = "filename", value_name = "FILE|DIR|-")]
    files: Vec<String>,
    /// Read directories recursively.
    #[arg(short = 'R', long)]
    recursive: bool,
    /// Delete even what reaping protections would hold (unsaved work, a blocked agent).
    #[arg(long)]
    force: bool,
    /// Skip the trash: delete the volumes at once (admins; implies --force).
    #[arg(long)]
    purge: bool,
    /// Wait until the objects are gone (`--wait=false` returns once deletion is requested).
    #[arg(long, default_value_t = true, action = ArgAction::Set, num_args = 0..=1,
          default_missing_value = "true", require_equals = true, value_name = "BOOL")]
    wait: bool,
    /// How long to wait for the objects to go.
    #[arg(long, default_value = "5m", value_parser = duration::parse)]
    timeout: std::time::Duration,
}

pub async fn run(context: &Context, args: DeleteArgs) -> anyhow::Result<ExitCode> {
    let targets: Vec<(Resource, String)> = if args.files.is_empty() {
        let kind = args.kind.expect("clap requires KIND without -f");
        if args.names.is_empty() {
            anyhow::bail!("delete {kind}: give at least one NAME");
        }
        args.names.iter().map(|n| (kind, n.clone())).collect()
    } else {
        manifest::load(&args.files, args.recursive)?
            .into_iter()
            .map(|m| (m.resource, m.name))
            .collect()
    };
    let client = context.client()?;
    for (resource, name) in &targets {
        client
            .delete_with(*resource, name, args.force || args.purge, args.purge)
            .await?;
        if !args.wait {
            println!("{resource}/{name} deletion requested");
        }
    }
    if !args.wait {
        return Ok(ExitCode::SUCCESS);
    }
    progress::wait_for(&client, &targets, Goal::Deleted, args.timeout, false).await?;
    for (resource, name) in &targets {
        println!("{resource}/{name} deleted");
    }
    Ok(ExitCode::SUCCESS)
}
