//! `berth reconcile gitsource NAME`: a sync now rather than at the next poll, as
//! `flux reconcile source git` asks for one. It sets `berth.dev/requestedAt` and waits until the
//! GitSource says it answered that request (`status.lastHandledReconcileAt`), then reports the
//! revision, or why the sync failed.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;
use berth_api::Kind;
use clap::{Args, Subcommand};
use futures::StreamExt as _;
use serde_json::{Value, json};

use super::Context;
use super::duration;
use super::render::{condition, reason_and_message, str_at};

#[derive(Debug, Args)]
pub struct ReconcileArgs {
    #[command(subcommand)]
    kind: ReconcileKind,
}

#[derive(Debug, Subcommand)]
enum ReconcileKind {
    /// Fetch and apply a GitSource's repository now.
    #[command(alias = "gitsources", alias = "gs")]
    Gitsource(GitSourceArgs),
}

#[derive(Debug, Args)]
struct GitSourceArgs {
    /// The GitSource.
    name: String,
    /// How long to wait for the sync to finish.
    #[arg(long, default_value = "5m", value_parser = duration::parse)]
    timeout: Duration,
}

pub async fn run(context: &Context, args: ReconcileArgs) -> anyhow::Result<ExitCode> {
    let ReconcileKind::Gitsource(args) = args.kind;
    let client = context.client()?;
    let name = &args.name;
    let source = client.get(Kind::GitSource, name).await?;
    if source.pointer("/spec/suspend") == Some(&Value::Bool(true)) {
        anyhow::bail!("gitsource/{name} is suspended (spec.suspend is true): resume it first");
    }
    let at = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Nanos, true);
    let patch = json!({"metadata": {"annotations": {
        berth_api::annotations::REQUESTED_AT: at,
    }}});
    client.merge_patch(Kind::GitSource, name, &patch).await?;
    println!("gitsource/{name} sync requested");

    let answered = |object: &Value| str_at(object, "status.lastHandledReconcileAt") == at;
    let wait = async {
        let mut changes = client.watch_object(Kind::GitSource, name).await?;
        while let Some(change) = changes.next().await {
            let change = change?;
            if change.type_ == berth_api::WatchEventType::Deleted {
                anyhow::bail!("gitsource/{name} was deleted while syncing");
            }
            if answered(&change.object) {
                return Ok(change.object);
            }
        }
        anyhow::bail!("the server ended the watch of gitsource/{name} before the sync finished")
    };
    let synced = tokio::time::timeout(args.timeout, wait)
        .await
        .ok()
        .with_context(|| {
            format!(
                "timed out after {} waiting for gitsource/{name} to sync",
                duration::format(args.timeout)
            )
        })??;
    match condition(&synced, "Ready") {
        Some(ready) if str_at(ready, "status") == "True" => {
            let revision = str_at(&synced, "status.lastAppliedRevision");
            println!("gitsource/{name} synced: revision {revision}");
            Ok(ExitCode::SUCCESS)
        }
        ready => {
            let why = ready.map_or_else(|| "Unknown".to_string(), reason_and_message);
            eprintln!("error: gitsource/{name} is not ready: {why}");
            Ok(ExitCode::FAILURE)
        }
    }
}
