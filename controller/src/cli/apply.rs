//! `berth apply`: every document in one all-or-nothing call, printed like kubectl.

use std::process::ExitCode;
use std::time::Duration;

use berth_api::Kind;
use clap::Args;
use tokio::time::Instant;

use super::manifest;
use super::progress::{self, Goal, WaitError};
use super::render::value_at;
use super::{Context, duration};
use crate::client::{ApplyOptions, Client, ClientError};

#[derive(Debug, Args)]
pub struct ApplyArgs {
    #[command(flatten)]
    manifests: manifest::Files,
    /// Validate and show what would change, writing nothing.
    #[arg(long)]
    dry_run: bool,
    /// Delete objects that were in the applyset's previous inventory and are not in this one.
    #[arg(long, requires = "applyset")]
    prune: bool,
    /// Name of the set of objects these manifests make up (recorded server-side).
    #[arg(long, value_name = "NAME")]
    applyset: Option<String>,
    /// Wait until every object is Ready (or Stopped) for its current generation.
    #[arg(long)]
    wait: bool,
    /// How long --wait waits (and how long a pruned object's teardown is followed).
    #[arg(long, default_value = "5m", value_parser = duration::parse)]
    timeout: std::time::Duration,
}

pub async fn run(context: &Context, args: ApplyArgs) -> anyhow::Result<ExitCode> {
    let options = ApplyOptions {
        dry_run: args.dry_run,
        applyset: args.applyset.map(|name| (name, args.prune)),
    };
    let (client, outcomes) = args.manifests.apply(context, &options).await?;

    let suffix = if args.dry_run { " (dry run)" } else { "" };
    let deadline = Instant::now() + args.timeout;
    let mut targets = Vec::new();
    let mut held_by_finalizers = Vec::new();
    for outcome in &outcomes {
        let resource = outcome.kind.parse::<Kind>().ok();
        let label =
            resource.map_or_else(|| outcome.kind.to_lowercase(), |r| r.singular().to_string());
        let pruned = outcome.action == "pruned";
        if let Some(resource) = resource
            && pruned
            && !args.dry_run
            && value_at(&outcome.object, "metadata.deletionTimestamp").is_some()
        {
            held_by_finalizers.push((resource, outcome.name.clone()));
            continue;
        }
        println!("{label}/{} {}{suffix}", outcome.name, outcome.action);
        if let Some(resource) = resource
            && !pruned
            && outcome.action != "deleted"
        {
            targets.push((resource, outcome.name.clone()));
        }
    }
    // A pruned project goes through its teardown, which holds a workspace with unsaved work (as
    // a plain `berth delete` does): follow it, so a held one is seen, not taken for gone.
    let mut held = 0;
    for target in &held_by_finalizers {
        let left = deadline.saturating_duration_since(Instant::now());
        let (line, is_held) = prune_outcome(&client, target, left).await?;
        held += usize::from(is_held);
        println!("{line}");
    }

    if args.wait && !args.dry_run && !targets.is_empty() {
        let left = deadline.saturating_duration_since(Instant::now());
        let reached = progress::wait_for(&client, &targets, Goal::Ready, left, true).await?;
        for target in &targets {
            println!(
                "{}/{} {}",
                target.0.singular(),
                target.1,
                reached.word(target)
            );
        }
    }
    if held > 0 {
        anyhow::bail!(
            "{held} pruned object(s) held: their deletion waits until the work is saved, or berth delete --force"
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// The line for a pruned object that its finalizers keep for now, and whether its deletion is
/// held: pruned once gone; held, and why, when its deletion is blocked (the object stays
/// Deleting until what holds it is resolved, and the apply exits 1, as `berth delete` does).
async fn prune_outcome(
    client: &Client,
    (resource, name): &(Kind, String),
    timeout: Duration,
) -> Result<(String, bool), ClientError> {
    let target = [(*resource, name.clone())];
    let resource = resource.singular();
    match progress::wait_for(client, &target, Goal::Deleted, timeout, false).await {
        Ok(_) => Ok((format!("{resource}/{name} pruned"), false)),
        Err(WaitError::Failed { message, .. }) => {
            let why = message
                .strip_prefix("deletion blocked: ")
                .unwrap_or(&message);
            Ok((
                format!(
                    "{resource}/{name} pruned, deletion held: {why} (it stays Deleting until \
                     that is resolved; `berth delete {resource} {name} --force` deletes it now)"
                ),
                true,
            ))
        }
        Err(WaitError::Timeout { after, .. }) => Ok((
            format!("{resource}/{name} pruned, still Deleting after {after}"),
            false,
        )),
        Err(WaitError::Client(err)) => Err(err),
    }
}
