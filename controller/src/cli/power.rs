//! `berth restart|stop|start NAME`: each is one merge patch of the project; the controller does
//! the rest.

use std::process::ExitCode;

use berth_api::Kind;
use chrono::{SecondsFormat, Utc};
use clap::Args;
use serde_json::Value;

use super::Context;
use super::duration;
use super::progress::{self, Goal};
use super::render;

#[derive(Debug, Args)]
pub struct RestartArgs {
    /// Project name.
    name: String,
    /// Replace the container from the image (the durable volumes stay).
    #[arg(long)]
    recreate: bool,
    /// With --recreate: replace the container even when it holds work outside /workspace (a
    /// worktree); the old container goes to the trash either way (`berth trash cp`).
    #[arg(long, requires = "recreate")]
    force: bool,
    /// Wait until the container has started again (a new process, or with --recreate a new
    /// container) and the project is Ready, printing each step.
    #[arg(long)]
    wait: bool,
    /// How long --wait waits.
    #[arg(long, default_value = "5m", value_parser = duration::parse)]
    timeout: std::time::Duration,
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
    /// Wait until the project is running and Ready (start) or Stopped (stop), printing each step.
    #[arg(long)]
    wait: bool,
    /// How long --wait waits.
    #[arg(long, default_value = "5m", value_parser = duration::parse)]
    timeout: std::time::Duration,
}

fn now() -> String {
    Utc::now().to_rfc3339_opts(SecondsFormat::Secs, true)
}

pub use berth_api::power::{restart_patch, start_patch, stop_patch};

/// What `--wait` waits for, and what it prints when done.
struct Outcome {
    goal: Goal,
    done: &'static str,
}

/// How a power request reaches the server.
enum Request {
    /// A merge patch of the project's spec or annotations.
    Patch(Value),
    /// `POST .../forcereplace`: the server records a recreate that nothing holds.
    ForcedReplace,
}

async fn patch_and_report(
    context: &Context,
    name: &str,
    request: Request,
    requested: &str,
    wait: Option<(WaitFlags, Outcome)>,
) -> anyhow::Result<ExitCode> {
    let client = context.client()?;
    match request {
        Request::Patch(patch) => {
            client.merge_patch(Kind::Project, name, &patch).await?;
        }
        Request::ForcedReplace => {
            client.request_forced_replace(name).await?;
        }
    }
    println!("project/{name} {requested}");
    if let Some((flags, outcome)) = wait
        && flags.wait
    {
        let target = [(Kind::Project, name.to_string())];
        progress::wait_for(&client, &target, outcome.goal, flags.timeout, true).await?;
        println!("project/{name} {}", outcome.done);
    }
    Ok(ExitCode::SUCCESS)
}

pub async fn restart(context: &Context, args: RestartArgs) -> anyhow::Result<ExitCode> {
    let requested = if args.recreate {
        "recreate requested"
    } else {
        "restart requested"
    };
    // What tells the restarted container apart from the one running now: LXD moves an
    // instance's last-used time on every start.
    let path = if args.recreate {
        "status.container.createdAt"
    } else {
        "status.container.lastUsedAt"
    };
    let wait = match args.wait {
        true => {
            let project = context.client()?.get(Kind::Project, &args.name).await?;
            let before = render::value_at(&project, path)
                .cloned()
                .unwrap_or_default();
            let flags = WaitFlags {
                wait: true,
                timeout: args.timeout,
            };
            let goal = Goal::RunningAgain { path, before };
            Some((
                flags,
                Outcome {
                    goal,
                    done: "running",
                },
            ))
        }
        false => None,
    };
    // A forced replacement is the server's to record: no manifest or patch may carry it.
    let request = if args.recreate && args.force {
        Request::ForcedReplace
    } else {
        Request::Patch(restart_patch(args.recreate, &now()))
    };
    patch_and_report(context, &args.name, request, requested, wait).await
}

pub async fn stop(context: &Context, args: StopArgs) -> anyhow::Result<ExitCode> {
    // Asked to stop and stopped already: say so, as kubectl says "unchanged".
    let project = context.client()?.get(Kind::Project, &args.name).await?;
    if already_stopped(&project) {
        println!("project/{} already stopped", args.name);
        return Ok(ExitCode::SUCCESS);
    }
    let outcome = Outcome {
        goal: Goal::Stopped,
        done: "stopped",
    };
    let wait = Some((args.wait, outcome));
    let request = Request::Patch(stop_patch());
    patch_and_report(context, &args.name, request, "stop requested", wait).await
}

/// Whether the project is meant to be stopped and is, for its current generation.
fn already_stopped(project: &Value) -> bool {
    let at = |pointer: &str| project.pointer(pointer).and_then(Value::as_str);
    let generation = project
        .pointer("/metadata/generation")
        .and_then(Value::as_i64);
    let observed = project
        .pointer("/status/observedGeneration")
        .and_then(Value::as_i64);
    at("/spec/state") == Some("Stopped")
        && at("/status/phase") == Some("Stopped")
        && (generation.is_none() || observed >= generation)
}

pub async fn start(context: &Context, args: StartArgs) -> anyhow::Result<ExitCode> {
    let outcome = Outcome {
        goal: Goal::Running,
        done: "running",
    };
    let wait = Some((args.wait, outcome));
    patch_and_report(
        context,
        &args.name,
        Request::Patch(start_patch(&now())),
        "start requested",
        wait,
    )
    .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn only_a_project_meant_stopped_and_seen_stopped_is_already_stopped() {
        let project = |state: &str, phase: &str, generation: i64, observed: i64| {
            json!({"metadata": {"generation": generation}, "spec": {"state": state},
                   "status": {"phase": phase, "observedGeneration": observed}})
        };
        assert!(already_stopped(&project("Stopped", "Stopped", 2, 2)));
        assert!(!already_stopped(&project("Stopped", "Ready", 2, 2)));
        assert!(!already_stopped(&project("Running", "Stopped", 2, 2)));
        // Stopped at an older generation: the stop of this one is still on its way.
        assert!(!already_stopped(&project("Stopped", "Stopped", 3, 2)));
    }
}
