//! `berth restart|stop|start NAME`: each is one merge patch of the project; the controller does
//! the rest.

use std::process::ExitCode;

use chrono::{SecondsFormat, Utc};
use clap::Args;
use serde_json::{Value, json};

use super::Context;
use super::duration;
use super::progress::{self, Goal};
use berth_api::annotations::{RECREATE_REQUESTED_AT, RESTARTED_AT, WOKEN_AT};

use crate::client::Resource;

#[derive(Debug, Args)]
pub struct RestartArgs {
    /// Project name.
    name: String,
    /// Replace the container from the image (the durable volumes stay).
    #[arg(long)]
    recreate: bool,
    #[command(flatten)]
    wait: WaitFlags,
}

#[derive(Debug, Args)]
pub struct StopArgs {
    /// Project name.
    name: String,
    #[command(flatten)]
    wait: WaitFlags,
}

#[derive(Debug, Args)]
pub struct StartArgs {
    /// Project name.
    name: String,
    #[command(flatten)]
    wait: WaitFlags,
}

#[derive(Debug, Args)]
struct WaitFlags {
    /// Wait until the project is Ready (or Stopped) again, printing each step.
    #[arg(long)]
    wait: bool,
    /// How long --wait waits.
    #[arg(long, default_value = "5m", value_parser = duration::parse)]
    timeout: std::time::Duration,
}

fn now() -> String {
    Utc::now().to_rfc3339_opts(SecondsFormat::Secs, true)
}

pub fn restart_patch(recreate: bool, at: &str) -> Value {
    let key = if recreate {
        RECREATE_REQUESTED_AT
    } else {
        RESTARTED_AT
    };
    json!({"metadata": {"annotations": {key: at}}})
}

pub fn stop_patch() -> Value {
    json!({"spec": {"state": "Stopped"}})
}

pub fn start_patch(at: &str) -> Value {
    json!({"spec": {"state": "Running"}, "metadata": {"annotations": {WOKEN_AT: at}}})
}

async fn patch_and_report(
    context: &Context,
    name: &str,
    patch: Value,
    done: &str,
    wait: WaitFlags,
) -> anyhow::Result<ExitCode> {
    let client = context.client()?;
    client.merge_patch(Resource::Project, name, &patch).await?;
    println!("project/{name} {done}");
    if wait.wait {
        let target = [(Resource::Project, name.to_string())];
        progress::wait_for(&client, &target, Goal::Ready, wait.timeout, true).await?;
        println!("project/{name} ready");
    }
    Ok(ExitCode::SUCCESS)
}

pub async fn restart(context: &Context, args: RestartArgs) -> anyhow::Result<ExitCode> {
    let done = if args.recreate {
        "recreate requested"
    } else {
        "restart requested"
    };
    patch_and_report(
        context,
        &args.name,
        restart_patch(args.recreate, &now()),
        done,
        args.wait,
    )
    .await
}

pub async fn stop(context: &Context, args: StopArgs) -> anyhow::Result<ExitCode> {
    patch_and_report(
        context,
        &args.name,
        stop_patch(),
        "stop requested",
        args.wait,
    )
    .await
}

pub async fn start(context: &Context, args: StartArgs) -> anyhow::Result<ExitCode> {
    patch_and_report(
        context,
        &args.name,
        start_patch(&now()),
        "start requested",
        args.wait,
    )
    .await
}
