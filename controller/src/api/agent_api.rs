//! The agent API: berth's socket for agents inside their containers (`Config::agent_api_socket`,
//! reached through each project's `berth-agent-api` proxy device at `127.0.0.1:7391`). Every
//! request carries a project token (`BERTH_PROJECT_TOKEN`), and a token reaches its own
//! project's routes of [`authority::AGENT`] alone: anything else is the same 404. Writes go
//! through the one admission as its `ProjectAgent` (`Admission::admit_schedule`).

use std::sync::Arc;
use std::time::Duration;

use berth_api::{Kind, ProjectSpec, ProjectStatus, ScheduleSpec};
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use serde_json::{Value, json};
use tokio::net::UnixListener;

use super::authority::{self, Miss};
use super::error::ApiError;
use super::routes::{blocking, json_response};
use super::server::{Slots, serve_http1};
use super::{ApiState, Body, body};
use crate::agent::capability::{TOKEN_KEY, token_project};
use crate::auth::same_secret;
use crate::store::{Commit, EventType, StoredObject};

/// A schedule is a few lines of text.
const BODY_LIMIT: usize = 64 << 10;

/// Serves the agent API on `listener` until shutdown, at most `max_connections` at once.
pub async fn serve_agent_api(
    state: Arc<ApiState>,
    listener: UnixListener,
    max_connections: usize,
    metrics: Option<Arc<crate::metrics::Metrics>>,
) {
    let slots = Slots::new("agent", max_connections, metrics);
    loop {
        let accepted = tokio::select! {
            _ = state.shutdown.cancelled() => return,
            accepted = listener.accept() => accepted,
        };
        let stream = match accepted {
            Ok((stream, _)) => stream,
            Err(err) => {
                tracing::warn!(error = %err, "accepting an agent API connection failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Some(slot) = slots.take() else {
            continue;
        };
        let state = Arc::clone(&state);
        tokio::spawn(async move {
            let _slot = slot;
            let shutdown = state.shutdown.clone();
            serve_http1(stream, shutdown, "agent API connection", move |req| {
                let state = Arc::clone(&state);
                async move {
                    match handle(&state, req).await {
                        Ok(response) => response,
                        Err(error) => json_response(error.code, &error.to_value()),
                    }
                }
            })
            .await;
        });
    }
}

async fn handle(state: &Arc<ApiState>, req: Request<Incoming>) -> Result<Response<Body>, ApiError> {
    let (method, path) = (req.method().clone(), req.uri().path().to_string());
    let route = match authority::find(authority::AGENT, &method, &path) {
        Ok((route, _)) => route,
        Err(Miss::NotFound) => return Err(ApiError::not_found(format!("no route for {path}"))),
        Err(Miss::Method) => return Err(ApiError::method_not_allowed(&method, &path)),
    };
    debug_assert_eq!(route.authority, authority::Authority::ProjectToken);
    let project = project_of_token(state, req.headers())?;
    if method == Method::GET {
        Ok(json_response(StatusCode::OK, &listed(&project)))
    } else {
        add_schedule(state, project, req).await
    }
}

/// The project the request's token is the token of. Anything else, a missing token
/// included, is one 404: the socket tells nothing of which projects exist.
fn project_of_token(
    state: &ApiState,
    headers: &hyper::HeaderMap,
) -> Result<Arc<StoredObject>, ApiError> {
    let nobody = || ApiError::not_found("no project for this token");
    let token = crate::auth::bearer(
        headers
            .get(hyper::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok()),
    )
    .ok_or_else(nobody)?;
    let name = token_project(token).ok_or_else(nobody)?;
    let project = state
        .store
        .get(Kind::Project, name)
        .filter(|p| !p.is_deleting())
        .ok_or_else(nobody)?;
    let own = state
        .secrets
        .get(project.uid(), TOKEN_KEY)
        .map_err(|e| ApiError::internal(e.to_string()))?;
    match own {
        Some(own) if same_secret(&own, token) => Ok(project),
        _ => Err(nobody()),
    }
}

/// `{kind: ScheduleList, project, items: [{cron, timezone, brief, nextRun, lastRun}]}`.
fn listed(project: &StoredObject) -> Value {
    let spec: ProjectSpec = project.spec.decode().unwrap_or_default();
    let status: ProjectStatus = project.status.decode().unwrap_or_default();
    let items: Vec<Value> = spec
        .schedules
        .iter()
        .enumerate()
        .map(|(n, s)| {
            let recorded = status.recorded_schedule(n, &s.cron);
            json!({
                "cron": s.cron,
                "timezone": if s.timezone.is_empty() { "UTC" } else { s.timezone.as_str() },
                "brief": s.brief,
                "nextRun": recorded.and_then(|r| r.next_run),
                "lastRun": recorded.and_then(|r| r.last_run),
            })
        })
        .collect();
    json!({"kind": "ScheduleList", "project": project.name(), "items": items})
}

/// Adds the schedule in the body to the project's `spec.schedules`, admitted as the project's
/// agent and written only over the project as it was read.
async fn add_schedule(
    state: &Arc<ApiState>,
    project: Arc<StoredObject>,
    req: Request<Incoming>,
) -> Result<Response<Body>, ApiError> {
    let (parts, incoming) = req.into_parts();
    let bytes = body::read(incoming, &parts.headers, BODY_LIMIT).await?;
    let schedule: ScheduleSpec = serde_json::from_slice(&bytes).map_err(|e| {
        ApiError::bad_request(format!(
            "the body is not a schedule ({{cron, brief, timezone}}): {e}"
        ))
    })?;
    let name = project.name().to_string();
    let desired = state
        .admission
        .admit_schedule(&project, &schedule, &state.store)
        .map_err(|refusal| refusal.into_api_error(Some("Project"), Some(&name)))?;
    let store = Arc::clone(&state.store);
    let rv = project.resource_version();
    let written = blocking(move || store.replace(desired, Some(rv), Commit::Persist)).await??;
    let (object, _) = written;
    tracing::info!(project = %name, cron = %schedule.cron, "the project's agent added a schedule");
    let message = format!(
        "the agent added schedule {:?}{}",
        schedule.cron,
        match schedule.timezone.as_str() {
            "" => String::new(),
            zone => format!(" ({zone})"),
        }
    );
    state
        .store
        .publish_event(&object, EventType::Normal, "ScheduleAdded", &message)
        .await;
    Ok(json_response(StatusCode::CREATED, &listed(&object)))
}
