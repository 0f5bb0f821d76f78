//! The HTTP face of inspection: `GET .../projects/NAME/runtime` and `POST .../projects/NAME/exec`,
//! members only. Both answer 503 while berth has no connection to LXD.

use std::collections::BTreeMap;
use std::sync::Arc;

use hyper::StatusCode;

use super::exec::{ExecCall, ExecResult};
use super::figures::{self, AgentProbe, RuntimeFigures};
use crate::api::access;
use crate::api::error::{ApiError, Cause};
use crate::api::{ApiState, Caller};
use crate::runtime::{Instance, Runtime, RuntimeError};
use crate::store::StoredObject;

const AGENT_PROFILE: &str = "AgentProfile";

/// The live figures of a member's project.
pub async fn runtime_figures(
    state: &ApiState,
    caller: &Caller,
    name: &str,
) -> Result<RuntimeFigures, ApiError> {
    let project = access::member_project(state, caller, name)?;
    let runtime = connected(state)?;
    let instance = reach(state, runtime.as_ref(), &project).await?;
    let agents = agent_probes(state, &project);
    let mut figures = figures::inspect(runtime.as_ref(), &instance, &agents)
        .await
        .map_err(|e| runtime_error(name, &e))?;
    figures.last_activity =
        state
            .inspector
            .activity
            .last(project.uid())
            .map(|a| figures::LastActivity {
                at: a.at,
                source: a.source,
            });
    Ok(figures)
}

/// Runs a member's command in the project's container and records it as activity.
pub async fn exec(
    state: &ApiState,
    caller: &Caller,
    name: &str,
    body: &[u8],
) -> Result<ExecResult, ApiError> {
    let project = access::member_project(state, caller, name)?;
    let call: ExecCall = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("exec body: {e}")))?;
    let project_env: BTreeMap<String, String> = project
        .spec
        .get("env")
        .and_then(|env| serde_json::from_value(env).ok())
        .unwrap_or_default();
    let secrets = state
        .secrets
        .values(project.uid())
        .map_err(|e| ApiError::internal(format!("reading the secrets of {name}: {e}")))?;
    let request = call.to_request(&project_env, secrets).map_err(|e| {
        ApiError::invalid(
            Some("Exec"),
            Some(name),
            vec![Cause::new(e.field, e.message.clone())],
        )
    })?;
    let runtime = connected(state)?;
    reach(state, runtime.as_ref(), &project).await?;
    // A person acts in the project while the command runs, whatever its outcome.
    let _running = state.inspector.activity.open(project.uid(), "exec");
    tracing::info!(project = name, caller = %caller.identity, "exec");
    match runtime.exec(project.name(), &request).await {
        Ok(output) => Ok(ExecResult::from(output)),
        // Cut, and said so: the caller gets what came before the cap.
        Err(RuntimeError::TooLarge {
            limit,
            partial: Some(partial),
            ..
        }) => Ok(ExecResult::cut(&partial, limit)),
        Err(e) => Err(runtime_error(name, &e)),
    }
}

/// The project's container, once it is known to be the project's own (409 `NameConflict`
/// otherwise): every route that reaches into a container asks this first.
pub async fn reach(
    state: &ApiState,
    runtime: &dyn Runtime,
    project: &StoredObject,
) -> Result<Instance, ApiError> {
    super::reach::owned_container(
        runtime,
        project.name(),
        project.uid(),
        state.store.controller_id(),
    )
    .await
    .map_err(ApiError::from)
}

pub(super) fn connected(state: &ApiState) -> Result<Arc<dyn Runtime>, ApiError> {
    state.inspector.runtime().ok_or_else(|| {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "ServiceUnavailable",
            "berth is not connected to LXD",
        )
    })
}

/// The profiles the project uses: its agent first, then the others; missing ones are skipped.
fn agent_probes(state: &ApiState, project: &StoredObject) -> Vec<AgentProbe> {
    let spec = project.spec.value();
    let mut names: Vec<String> = Vec::new();
    if let Some(agent) = spec["agent"].as_str() {
        names.push(agent.to_string());
    }
    for agent in spec["agents"].as_array().into_iter().flatten() {
        if let Some(agent) = agent.as_str().filter(|a| !names.iter().any(|n| n == a)) {
            names.push(agent.to_string());
        }
    }
    names
        .iter()
        .filter_map(|name| {
            let profile = state.store.get(AGENT_PROFILE, name)?;
            Some(AgentProbe::from_spec(name, &profile.spec.value()))
        })
        .collect()
}

pub(super) fn runtime_error(name: &str, e: &RuntimeError) -> ApiError {
    match e {
        RuntimeError::Timeout { .. } => ApiError::new(
            StatusCode::GATEWAY_TIMEOUT,
            "Timeout",
            format!("{name}: {e}"),
        ),
        // LXD answers 400 for an exec in a stopped or frozen container.
        RuntimeError::Rejected { status: 400, .. } => ApiError::new(
            StatusCode::CONFLICT,
            "Conflict",
            format!("{name}: the container is not running: {e}"),
        ),
        RuntimeError::NotFound { .. } => {
            ApiError::not_found(format!("{name}: {e}")).with_object("Project", name)
        }
        _ => ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "ServiceUnavailable",
            format!("{name}: {e}"),
        ),
    }
}
