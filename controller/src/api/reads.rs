//! The reads of objects: a kind's list and watch, one object, events, and who may read what
//! (a name the caller may not see reads as missing); the reaper's plan and the warm pool.

use std::sync::Arc;

use hyper::{Response, StatusCode};
use serde_json::json;

use berth_api::Kind;
use berth_api::wire::{ListMeta, ObjectList};

use super::access::{self, Redaction, Visibility};
use super::error::ApiError;
use super::responses::serialized;
use super::routes::{Outcome, Query};
use super::watch;
use super::{ApiState, Body, Caller};
use crate::store::StoredObject;

/// Projects are read by their members (and admins), GitSources by the members of a project
/// they manage (404 to everyone else: their names and URLs are not for every user), the other
/// kinds by every user.
pub(super) fn may_read(
    state: &ApiState,
    caller: &Caller,
    kind: Kind,
    name: &str,
) -> Result<(), ApiError> {
    // An admin may read the events of a project already gone.
    if kind == Kind::Project && !caller.admin {
        access::member_project(state, caller, name)?;
    }
    if kind == Kind::GitSource
        && !caller.admin
        && !access::gitsource_visible(&state.store, name, &caller.identity)
    {
        return Err(not_found(kind, name));
    }
    Ok(())
}

/// A non-admin's watch shows the projects it is a member of, and the GitSources managing one,
/// at the time of each event.
pub(super) fn watch_filter(state: &ApiState, caller: &Caller) -> Option<watch::Filter> {
    if caller.admin {
        return None;
    }
    let store = Arc::clone(&state.store);
    let identity = caller.identity.clone();
    Some(Box::new(move |object: &StoredObject| match object.kind {
        Kind::Project => store.is_member(object.uid(), &identity),
        Kind::GitSource => access::gitsource_visible(&store, object.name(), &identity),
        Kind::AgentProfile => true,
    }))
}

pub(super) fn list(state: &ApiState, caller: &Caller, kind: Kind, query: &Query) -> Outcome {
    let selector = query.selector()?;
    let visible = Visibility::of(state, caller);
    let objects = state.store.list(kind);
    let body = ObjectList {
        api_version: berth_api::API_VERSION.to_string(),
        kind: kind.list_kind().to_string(),
        metadata: ListMeta {
            resource_version: Some(state.store.resource_version().to_string()),
        },
        items: objects
            .iter()
            .map(Arc::as_ref)
            .filter(|o| selector.matches(&o.metadata.labels) && visible.shows(o.kind, o.uid()))
            .collect::<Vec<_>>(),
    };
    if kind == Kind::GitSource
        && let Some(redaction) = Redaction::of(state, caller)
    {
        let mut value =
            serde_json::to_value(&body).map_err(|err| ApiError::internal(err.to_string()))?;
        for item in value["items"].as_array_mut().into_iter().flatten() {
            redaction.object(item);
        }
        return Ok(serialized(StatusCode::OK, &value));
    }
    Ok(serialized(StatusCode::OK, &body))
}

pub(super) fn get(state: &ApiState, caller: &Caller, kind: Kind, name: &str) -> Outcome {
    let object = state
        .store
        .get(kind, name)
        .ok_or_else(|| not_found(kind, name))?;
    if kind == Kind::GitSource
        && let Some(redaction) = Redaction::of(state, caller)
    {
        let mut value = serde_json::to_value(object.as_ref())
            .map_err(|err| ApiError::internal(err.to_string()))?;
        redaction.object(&mut value);
        return Ok(serialized(StatusCode::OK, &value));
    }
    Ok(serialized(StatusCode::OK, object.as_ref()))
}

/// A watch of GitSources by a reader who is not an admin: each object as `get` shows it, the
/// project names it may not get hidden (its projects judged at each event, as they change).
pub(super) fn watch_redaction(
    state: &Arc<ApiState>,
    caller: &Caller,
    kind: Kind,
) -> Option<watch::Redact> {
    if kind != Kind::GitSource || caller.admin {
        return None;
    }
    let (state, caller) = (Arc::clone(state), caller.clone());
    Some(Box::new(move |object: &StoredObject| {
        let mut value = serde_json::to_value(object).unwrap_or_default();
        if let Some(redaction) = Redaction::of(&state, &caller) {
            redaction.object(&mut value);
        }
        value
    }))
}

pub(super) fn not_found(kind: Kind, name: &str) -> ApiError {
    ApiError::not_found(format!("{} {name:?} not found", kind.as_str())).with_object(kind, name)
}

/// `GET .../events?limit=N`: the most recent events the caller may see.
pub(super) fn recent_events(state: &ApiState, caller: &Caller, query: &Query) -> Outcome {
    let limit = match query.get("limit") {
        Some(limit) => limit
            .parse()
            .map_err(|_| ApiError::bad_request(format!("limit: {limit:?} is not a number")))?,
        None => DEFAULT_EVENT_LIMIT,
    };
    let visible = Visibility::of(state, caller);
    let mut events = state.store.recent_events(limit)?;
    events.retain(|e| visible.shows(e.involved_object.kind, &e.involved_object.uid));
    Ok(event_list(events, Redaction::of(state, caller)))
}

/// How many events `GET .../events` returns without `?limit=`.
pub(super) const DEFAULT_EVENT_LIMIT: usize = 1000;

/// Events as a list; for a reader who is not an admin, with the projects it may not get
/// redacted from their messages.
pub(super) fn event_list(
    events: Vec<crate::store::Event>,
    redaction: Option<Redaction>,
) -> Response<Body> {
    let items = events.iter().map(|e| {
        let mut event = e.to_value();
        if let Some(redaction) = &redaction {
            redaction.event(&mut event);
        }
        event
    });
    let list = ObjectList {
        api_version: "v1".to_string(),
        kind: "EventList".to_string(),
        metadata: ListMeta::default(),
        items: items.collect::<Vec<_>>(),
    };
    serialized(StatusCode::OK, &list)
}

/// `GET .../reap`: what the reaper would do now with the projects the caller may see.
pub(super) fn reap_plan(state: &ApiState, caller: &Caller) -> Outcome {
    let visible = Visibility::of(state, caller);
    let projects = state.store.list(Kind::Project);
    let plan = crate::scheduler::passes::plan(
        projects
            .iter()
            .filter(|o| visible.shows(o.kind, o.uid()))
            .map(|o| o.as_ref()),
    );
    Ok(serialized(StatusCode::OK, &json!({"items": plan})))
}

/// `GET .../pool`: the warm pool, a count of containers holding no project's data, the same
/// for every caller.
pub(super) fn warm_pool(state: &ApiState) -> berth_api::wire::PoolList {
    berth_api::wire::PoolList {
        api_version: berth_api::API_VERSION.to_string(),
        kind: "PoolList".to_string(),
        items: vec![state.pool.entry()],
    }
}
