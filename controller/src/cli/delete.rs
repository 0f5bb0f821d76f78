//! `berth delete KIND NAME... | KIND/NAME... | KIND -l SELECTOR | -f FILE`: asks for deletion,
//! then waits until the objects are gone. A deletion the server holds (condition
//! `DeletionBlocked`) ends the wait with its reason. As kubectl does, a missing object is
//! reported and the others are deleted all the same.

use std::process::ExitCode;

use berth_api::Kind;
use clap::{ArgAction, Args};
use serde_json::Value;

use super::get::{parse_kind, parse_objects};
use super::progress::{self, Goal};
use super::{Context, duration, manifest};

#[derive(Debug, Args)]
pub struct DeleteArgs {
    /// `KIND NAME...` or `KIND/NAME...` (kind: project, agentprofile or gitsource, or proj,
    /// ap, gs); with --selector, only KIND.
    #[arg(
        value_name = "KIND NAME|KIND/NAME",
        required_unless_present = "files",
        conflicts_with = "files"
    )]
    objects: Vec<String>,
    /// Delete the objects of KIND whose labels match (`team=payments,tier!=test`).
    #[arg(
        short = 'l',
        long = "selector",
        value_name = "SELECTOR",
        conflicts_with = "files"
    )]
    selector: Option<String>,
    /// A missing object is no error.
    #[arg(long)]
    ignore_not_found: bool,
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
    let client = context.client()?;
    let named: Vec<(Kind, String)> = if !args.files.is_empty() {
        manifest::load(&args.files, args.recursive)?
            .into_iter()
            .map(|m| (m.resource, m.name))
            .collect()
    } else if let Some(selector) = &args.selector {
        let [kind] = args.objects.as_slice() else {
            anyhow::bail!(
                "delete --selector: give only the KIND, e.g. delete project -l {selector}"
            );
        };
        let kind = parse_kind(kind).map_err(anyhow::Error::msg)?;
        let list = client.list(kind, Some(selector)).await?;
        let names: Vec<(Kind, String)> = list
            .get("items")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|item| item.pointer("/metadata/name")?.as_str())
            .map(|name| (kind, name.to_string()))
            .collect();
        if names.is_empty() {
            println!("No {} match {selector:?}.", kind.plural());
            return Ok(ExitCode::SUCCESS);
        }
        names
    } else {
        let named = parse_objects(&args.objects).map_err(anyhow::Error::msg)?;
        if named.is_empty() {
            anyhow::bail!(
                "delete {}: give at least one NAME, or --selector",
                args.objects.join(" ")
            );
        }
        named
    };

    // Each one asked for in turn; a missing one is reported and the rest go on.
    let mut targets = Vec::with_capacity(named.len());
    let mut missing = 0;
    for (resource, name) in named {
        match client
            .delete_with(resource, &name, args.force || args.purge, args.purge)
            .await
        {
            Ok(_) => {
                if !args.wait {
                    println!("{}/{name} deletion requested", resource.singular());
                }
                targets.push((resource, name));
            }
            Err(err) if err.is_not_found() => {
                if !args.ignore_not_found {
                    super::report(&anyhow::Error::from(err));
                    missing += 1;
                }
            }
            Err(err) => return Err(err.into()),
        }
    }
    if args.wait && !targets.is_empty() {
        progress::wait_for(&client, &targets, Goal::Deleted, args.timeout, false).await?;
        for (resource, name) in &targets {
            println!("{}/{name} deleted", resource.singular());
        }
    }
    Ok(if missing > 0 {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}
