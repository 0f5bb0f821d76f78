//! The routes that reach into a project's container, members only: `runtime` (live figures),
//! `exec` (a command run to its end; `attach` for one with its streams connected), `answer`
//! and `logs`. Each first makes sure the container is the project's own; inspection answers in
//! its own terms ([`InspectError`]), and this is where those get their status codes.

use std::collections::BTreeMap;
use std::sync::Arc;

use berth_api::Kind;
use hyper::body::Incoming;
use hyper::{Request, StatusCode};
use serde_json::{Value, json};

use super::error::{ApiError, Cause};
use super::routes::{Outcome, Query, json_response, serialized};
use super::{ApiState, Caller, access, body};
use crate::inspect::InspectError;
use crate::inspect::exec::{ExecCall, InvalidCall};
use crate::inspect::figures::AgentProbe;
use crate::inspect::reach::Unreached;
use crate::network::RepairError;
use crate::runtime::{ExecRequest, Runtime, RuntimeError};
use crate::store::{EventType, StoredObject};

/// The most an answer may hold.
const ANSWER_LIMIT: usize = 64 * 1024;
/// The most one `logs` reply carries: the runner log is capped at about this size anyway.
const LOG_CHUNK_LIMIT: u64 = crate::agent::RUNNER_LOG_CAP + 64 * 1024;

/// `GET .../projects/NAME/runtime`: the live figures of a member's project.
pub(super) async fn runtime_figures(state: &ApiState, caller: &Caller, name: &str) -> Outcome {
    let project = access::member_project(state, caller, name)?;
    let agents = agent_probes(state, &project);
    let figures = state.inspector.figures(&project, &agents).await?;
    Ok(serialized(StatusCode::OK, &figures))
}

/// `POST .../projects/NAME/repairnetwork`: re-applies the network configuration of a member's
/// project's container and restarts its networking inside (see [`crate::network`]); answers
/// every NIC as LXD reports it afterwards, and records a `NetworkRepaired` event.
pub(super) async fn repair_network(state: &ApiState, caller: &Caller, name: &str) -> Outcome {
    let project = access::member_project(state, caller, name)?;
    let (runtime, _) = state.inspector.reach(&project).await?;
    tracing::info!(project = name, caller = %caller.identity, "repairing the network");
    let repair = match crate::network::repair(runtime.as_ref(), name).await {
        Ok(repair) => repair,
        Err(e @ (RepairError::NoInterface | RepairError::NotRunning)) => {
            return Err(ApiError::new(
                StatusCode::CONFLICT,
                "Conflict",
                format!("{name}: {e}"),
            ));
        }
        Err(RepairError::Runtime(e)) => return Err(runtime_error(name, &e)),
    };
    let message = format!(
        "the network was re-applied at the request of {}: {}",
        caller.identity,
        repair.summary()
    );
    state
        .store
        .publish_event(&project, EventType::Normal, "NetworkRepaired", &message)
        .await;
    Ok(serialized(StatusCode::OK, &repair))
}

/// `POST .../projects/NAME/exec`: runs a member's command in the project's container.
pub(super) async fn exec(
    state: &ApiState,
    caller: &Caller,
    name: &str,
    req: Request<Incoming>,
) -> Outcome {
    let (project, _, bytes) = member_request(state, caller, name, req, body::OBJECT_LIMIT).await?;
    let call: ExecCall = serde_json::from_slice(&bytes)
        .map_err(|e| ApiError::bad_request(format!("exec body: {e}")))?;
    let request = exec_request(state, &project, &call)?;
    tracing::info!(project = name, caller = %caller.identity, "exec");
    // The command runs while its caller may still exec here: removing the user, or their
    // membership, stops it within `watch::RECHECK` (dropping the exec stops the command).
    let holder = super::watch::Holder::of(state, caller);
    let revoked = holder.revoked(state, || {
        access::member_project(state, caller, name).is_ok()
    });
    tokio::select! {
        result = state.inspector.exec(&project, &request) => {
            Ok(serialized(StatusCode::OK, &result?))
        }
        () = revoked => {
            tracing::info!(project = name, caller = %caller.identity, "exec stopped: access revoked");
            Err(ApiError::new(
                StatusCode::FORBIDDEN,
                "Forbidden",
                "access to this project was revoked while the command ran: it was stopped",
            ))
        }
    }
}

/// A member's project and the request's body (at most `limit` bytes) with its media type.
async fn member_request(
    state: &ApiState,
    caller: &Caller,
    name: &str,
    req: Request<Incoming>,
    limit: usize,
) -> Result<(Arc<StoredObject>, Option<String>, bytes::Bytes), ApiError> {
    let project = access::member_project(state, caller, name)?;
    let media = body::media_type(req.headers());
    let (parts, incoming) = req.into_parts();
    let bytes = body::read(incoming, &parts.headers, limit).await?;
    Ok((project, media, bytes))
}

/// The command of `call` in the project's environment: its `spec.env` and its secrets.
pub(super) fn exec_request(
    state: &ApiState,
    project: &StoredObject,
    call: &ExecCall,
) -> Result<ExecRequest, ApiError> {
    let name = project.name();
    let project_env: BTreeMap<String, String> = project
        .spec
        .get("env")
        .and_then(|env| serde_json::from_value(env).ok())
        .unwrap_or_default();
    let secrets = state
        .secrets
        .values(project.uid())
        .map_err(|e| ApiError::internal(format!("reading the secrets of {name}: {e}")))?;
    crate::inspect::exec::to_request(call, &project_env, secrets).map_err(|e: InvalidCall| {
        ApiError::invalid(
            Some("Exec"),
            Some(name),
            vec![Cause::new(e.field, e.message.clone())],
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
            let profile = state.store.get(Kind::AgentProfile, name)?;
            Some(AgentProbe::from_spec(name, &profile.spec.value()))
        })
        .collect()
}

/// The runtime of the running controller, for the routes that reach LXD.
pub(super) fn container_runtime(state: &ApiState) -> Result<Arc<dyn Runtime>, ApiError> {
    state.inspector.runtime().ok_or_else(|| {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "ServiceUnavailable",
            "the controller is not running, so no container can be reached",
        )
    })
}

/// The runtime of the running controller with the project's own container in it, for the
/// routes that speak to the agent.
async fn agent_runtime(
    state: &ApiState,
    project: &StoredObject,
) -> Result<Arc<dyn Runtime>, ApiError> {
    container_runtime(state)?;
    let (runtime, _) = state.inspector.reach(project).await?;
    Ok(runtime)
}

fn agent_failure(e: crate::agent::AgentError) -> ApiError {
    ApiError::new(StatusCode::BAD_GATEWAY, "AgentUnreachable", e.to_string())
}

/// `POST .../projects/NAME/answer`: the body (text, or JSON `{"text": "..."}`) becomes the
/// blocked agent's answer, `/run/berth/answer`. Members only.
pub(super) async fn answer(
    state: &ApiState,
    caller: &Caller,
    name: &str,
    req: Request<Incoming>,
) -> Outcome {
    let (project, media, bytes) = member_request(state, caller, name, req, ANSWER_LIMIT).await?;
    let text = match media.as_deref() {
        Some(m) if m.ends_with("json") => {
            let value: Value = serde_json::from_slice(&bytes).map_err(|_| {
                ApiError::bad_request("the body is not JSON like {\"text\": \"...\"}")
            })?;
            match value.get("text") {
                Some(Value::String(text)) => text.clone(),
                _ => return Err(ApiError::bad_request("text: a string is required")),
            }
        }
        _ => String::from_utf8(bytes.to_vec())
            .map_err(|_| ApiError::bad_request("text: the answer is not UTF-8"))?,
    };
    if text.trim().is_empty() {
        return Err(ApiError::bad_request("text: the answer is empty"));
    }
    let runtime = agent_runtime(state, &project).await?;
    // An answer nobody asked for would be taken by a later question. The agent's own file is
    // the fresher word (status copies it every few seconds); the status when it is unreadable.
    let agent_state = match crate::agent::read_agent_status(&*runtime, project.name()).await {
        Ok(Some(report)) => report.status.state.as_str().to_string(),
        _ => project
            .status
            .pointer("/agent/state")
            .and_then(|s| s.as_str().map(str::to_string))
            .unwrap_or_else(|| "unknown".to_string()),
    };
    if agent_state != berth_api::AgentState::Blocked.as_str() {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "Conflict",
            format!("agent of project {name} is not waiting for an answer (state: {agent_state})"),
        ));
    }
    crate::agent::answer(&*runtime, project.name(), &text)
        .await
        .map_err(agent_failure)?;
    state
        .store
        .publish_event(
            &project,
            crate::store::EventType::Normal,
            "Answered",
            &format!("{} answered the agent", caller.identity),
        )
        .await;
    Ok(json_response(
        StatusCode::OK,
        &json!({"apiVersion": berth_api::API_VERSION, "kind": "Answer", "project": name}),
    ))
}

/// `GET .../projects/NAME/logs?tailBytes=N` (the last N bytes, 64 KiB by default) or
/// `?offset=K` (or `.../logs/K`: from byte K on, for following): the runner log with the offset the next read
/// continues at. Members only.
pub(super) async fn logs(
    state: &ApiState,
    caller: &Caller,
    name: &str,
    query: &Query,
    offset_segment: Option<&str>,
) -> Outcome {
    let project = access::member_project(state, caller, name)?;
    let parse = |key: &str, v: &str| {
        v.parse::<u64>()
            .map_err(|_| ApiError::bad_request(format!("{key}: {v:?} is not a number")))
    };
    let number = |key: &str| -> Result<Option<u64>, ApiError> {
        query.get(key).map(|v| parse(key, v)).transpose()
    };
    let offset = match offset_segment {
        Some(v) => Some(parse("offset", v)?),
        None => number("offset")?,
    };
    let tail = number("tailBytes")?.unwrap_or(64 * 1024);
    // A container is looked at only once it is known to be berth's own; without a controller
    // running, that no agent means no log still stands.
    let reached = match container_runtime(state) {
        Ok(_) => Ok(state.inspector.reach(&project).await?.0),
        Err(e) => Err(e),
    };
    if !project
        .spec
        .pointer("/agent")
        .is_some_and(|a| a.is_string())
    {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "NoAgent",
            format!("project {name} has no agent, so no runner log"),
        ));
    }
    let runtime = reached?;
    let chunk = crate::agent::runner_log_from(
        &*runtime,
        project.name(),
        offset.unwrap_or(0),
        LOG_CHUNK_LIMIT,
    )
    .await
    .map_err(agent_failure)?;
    let text = if offset.is_some() {
        chunk.text
    } else if let Some(lines) = number("tailLines")? {
        last_lines(&chunk.text, lines as usize).to_string()
    } else {
        let bytes = chunk.text.as_bytes();
        let from = bytes.len().saturating_sub(tail as usize);
        String::from_utf8_lossy(&bytes[from..]).into_owned()
    };
    Ok(json_response(
        StatusCode::OK,
        &json!({
            "apiVersion": berth_api::API_VERSION,
            "kind": "RunnerLog",
            "project": name,
            "text": text,
            "nextOffset": chunk.next_offset,
            "runner": chunk.runner.as_str(),
        }),
    ))
}

/// The last `n` lines of `text` (a final line without its newline counts).
fn last_lines(text: &str, n: usize) -> &str {
    if n == 0 {
        return "";
    }
    let body = text.strip_suffix('\n').unwrap_or(text);
    match body.rmatch_indices('\n').nth(n - 1) {
        Some((at, _)) => &text[at + 1..],
        None => text,
    }
}

impl From<InspectError> for ApiError {
    fn from(err: InspectError) -> ApiError {
        match err {
            InspectError::NotConnected => ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "ServiceUnavailable",
                err.to_string(),
            ),
            InspectError::Unreached(unreached) => unreached.into(),
            InspectError::Runtime { name, source } => runtime_error(&name, &source),
        }
    }
}

/// 409 `NameConflict` for a foreign container, 404 for none, 503 when LXD did not say.
impl From<Unreached> for ApiError {
    fn from(unreached: Unreached) -> ApiError {
        match &unreached {
            Unreached::Foreign(_) => {
                ApiError::new(StatusCode::CONFLICT, "NameConflict", unreached.to_string())
            }
            Unreached::Absent(name) => {
                ApiError::not_found(unreached.to_string()).with_object(Kind::Project, name)
            }
            Unreached::Runtime { .. } => ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "ServiceUnavailable",
                unreached.to_string(),
            ),
        }
    }
}

fn runtime_error(name: &str, e: &RuntimeError) -> ApiError {
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
            ApiError::not_found(format!("{name}: {e}")).with_object(Kind::Project, name)
        }
        _ => ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "ServiceUnavailable",
            format!("{name}: {e}"),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inspect::reach::owned_container;

    #[test]
    fn a_foreign_container_is_a_name_conflict() {
        let error = ApiError::from(Unreached::Foreign(
            "the container \"web\" is not this project's (it was not made by berth)".into(),
        ));
        assert_eq!(error.code, StatusCode::CONFLICT);
        assert_eq!(error.reason, "NameConflict");
        assert!(!error.message.contains('\n'), "{}", error.message);
    }

    #[tokio::test]
    async fn a_missing_container_is_not_a_conflict() {
        let fake = crate::testing::fake_runtime::FakeRuntime::new();
        let err = owned_container(&fake, "nothing", "u1", "c1")
            .await
            .unwrap_err();
        assert!(matches!(err, Unreached::Absent(_)), "{err}");
        assert_eq!(ApiError::from(err).code, StatusCode::NOT_FOUND);
    }

    #[test]
    fn no_connection_is_unavailable() {
        let error = ApiError::from(InspectError::NotConnected);
        assert_eq!(error.code, StatusCode::SERVICE_UNAVAILABLE);
        assert!(error.message.contains("not connected to LXD"));
    }

    #[test]
    fn last_lines_counts_a_final_line_without_its_newline() {
        assert_eq!(last_lines("a\nb\nc\n", 2), "b\nc\n");
        assert_eq!(last_lines("a\nb\nc", 2), "b\nc");
        assert_eq!(last_lines("a\nb\n", 5), "a\nb\n");
        assert_eq!(last_lines("a\nb\n", 0), "");
        assert_eq!(last_lines("", 3), "");
    }
}
