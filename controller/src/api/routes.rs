//! Request routing: `handle` authenticates, `handle_as` asks the authority, then `route`
//! only dispatches, every path to its handler (the object handlers of one kind behind
//! `resource`).

use std::collections::HashMap;
use std::sync::Arc;

use berth_api::Kind;
use berth_api::wire::API_PREFIX;
use hyper::body::Incoming;
use hyper::header::HeaderValue;
use hyper::{Method, Request, Response, StatusCode};

use super::access::{self, Redaction};
use super::apply::apply_list;
use super::error::ApiError;
use super::reads::{
    event_list, get, list, may_read, reap_plan, recent_events, warm_pool, watch_filter,
    watch_redaction,
};
use super::selector::LabelSelector;
use super::watch;
use super::writes::{
    create_or_replace, delete, patch, put_status, request_forced_checkout, request_forced_replace,
    request_look,
};
use super::{
    ApiState, Body, Caller, Transport, attach, authority, containers, ide, members, preview,
    probes, secrets, tools, trash, ui, users,
};
use crate::store::Commit;

pub(super) use super::responses::{blocking, json_response, serialized, success, text};

pub(super) type Outcome = Result<Response<Body>, ApiError>;

pub async fn handle(
    state: Arc<ApiState>,
    caller: Caller,
    req: Request<Incoming>,
) -> Response<Body> {
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    // The console signs its own people in (a session cookie or a bearer token), on either
    // listener: whoever reaches it through `berth ui`'s loopback port is no local admin.
    if ui::serves(&path) {
        return ui::handle(state, caller.transport, &caller.identity, req).await;
    }
    let authenticated =
        if caller.transport == Transport::Tcp && !authority::is_public(&method, &path) {
            access::authenticate_tcp(&state, req.headers())
        } else {
            Ok(caller)
        };
    match authenticated {
        Ok(caller) => handle_as(&state, &caller, req).await,
        Err(err) => {
            let anonymous = Caller {
                identity: "anonymous".to_string(),
                transport: Transport::Tcp,
                admin: false,
            };
            respond(&anonymous, &method, &path, Err(err))
        }
    }
}

/// Serves `req` for a caller already known (the console's calls on behalf of its sessions
/// too): the route's authority judged first ([`authority::admit`]), then its handler.
pub(super) async fn handle_as(
    state: &Arc<ApiState>,
    caller: &Caller,
    req: Request<Incoming>,
) -> Response<Body> {
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let routed = match authority::admit(state, caller, &method, &path) {
        Ok(()) => route(state, caller, req).await,
        Err(refused) => Err(refused),
    };
    respond(caller, &method, &path, routed)
}

/// The response for what routing gave: an error as a `Status` object; writes logged.
fn respond(caller: &Caller, method: &Method, path: &str, routed: Outcome) -> Response<Body> {
    let response = match routed {
        Ok(response) => response,
        Err(err) => {
            if err.code.is_server_error() {
                tracing::error!(%method, %path, caller = %caller.identity, error = %err.message, "request failed");
            }
            let mut response = json_response(err.code, &err.to_value());
            if err.code == StatusCode::UNAUTHORIZED {
                response.headers_mut().insert(
                    hyper::header::WWW_AUTHENTICATE,
                    HeaderValue::from_static("Bearer realm=\"berth\""),
                );
            }
            response
        }
    };
    if method != Method::GET {
        tracing::info!(%method, %path, caller = %caller.identity, code = response.status().as_u16(), "write");
    }
    response
}

/// The parsed query string.
pub(super) struct Query(HashMap<String, String>);

impl Query {
    pub(super) fn parse(query: Option<&str>) -> Query {
        Query(
            url::form_urlencoded::parse(query.unwrap_or_default().as_bytes())
                .into_owned()
                .collect(),
        )
    }

    pub(super) fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).map(String::as_str)
    }

    pub(super) fn flag(&self, key: &str) -> Result<bool, ApiError> {
        match self.get(key) {
            None | Some("false") | Some("0") => Ok(false),
            Some("true") | Some("1") | Some("") => Ok(true),
            Some(other) => Err(ApiError::bad_request(format!(
                "{key}: {other:?} is not true or false"
            ))),
        }
    }

    /// `?dryRun=All`: validate and admit, write nothing.
    pub(super) fn commit(&self) -> Result<Commit, ApiError> {
        match self.get("dryRun") {
            None | Some("") => Ok(Commit::Persist),
            Some("All") => Ok(Commit::DryRun),
            Some(other) => Err(ApiError::bad_request(format!(
                "dryRun: {other:?} is not supported; use dryRun=All"
            ))),
        }
    }

    pub(super) fn selector(&self) -> Result<LabelSelector, ApiError> {
        LabelSelector::parse(self.get("labelSelector").unwrap_or_default())
            .map_err(ApiError::bad_request)
    }
}

async fn route(state: &Arc<ApiState>, caller: &Caller, req: Request<Incoming>) -> Outcome {
    let path = req.uri().path().trim_end_matches('/').to_string();
    let query = Query::parse(req.uri().query());
    let method = req.method().clone();
    match path.as_str() {
        "/healthz" | "/livez" => return only(&method, &path, Method::GET).map(|_| probes::live()),
        "/readyz" => return only(&method, &path, Method::GET).map(|_| probes::ready(state)),
        "/version" => return only(&method, &path, Method::GET).map(|_| probes::version()),
        "/metrics" => {
            only(&method, &path, Method::GET)?;
            return probes::metrics(state, &req);
        }
        _ => {}
    }
    let decoded = segments(&path)?;
    let segments: Vec<&str> = decoded.iter().map(String::as_str).collect();
    match segments.as_slice() {
        ["apply"] => {
            only(&method, &path, Method::POST)?;
            apply_list(state, caller, req, &query).await
        }
        ["events"] => {
            only(&method, &path, Method::GET)?;
            recent_events(state, caller, &query)
        }
        ["uitokens"] => {
            only(&method, &path, Method::POST)?;
            ui::mint_sign_in(state, caller)
        }
        ["reap"] => {
            only(&method, &path, Method::GET)?;
            reap_plan(state, caller)
        }
        ["pool"] => {
            only(&method, &path, Method::GET)?;
            Ok(serialized(StatusCode::OK, &warm_pool(state)))
        }
        ["trash"] => {
            only(&method, &path, Method::GET)?;
            trash::list(state, caller, query.flag("all")?).await
        }
        ["trash", "purge"] => {
            only(&method, &path, Method::POST)?;
            trash::purge(state, caller).await
        }
        ["trash", uid, "restore"] => {
            trash::route(state, caller, &method, &path, Some(uid), req).await
        }
        ["trash", key, "files"] => {
            only(&method, &path, Method::GET)?;
            trash::file(state, caller, key, query.get("path")).await
        }
        ["users"] => users::route(state, caller, &method, None, req).await,
        ["users", name] => users::route(state, caller, &method, Some(name), req).await,
        ["projects", name, "secrets"] => {
            secrets::route(state, caller, &method, name, None, req).await
        }
        ["projects", name, "secrets", key] => {
            secrets::route(state, caller, &method, name, Some(key), req).await
        }
        ["gitsources", name, "secrets"] => {
            secrets::gitsource_route(state, caller, &method, name, None, req).await
        }
        ["gitsources", name, "secrets", key] => {
            secrets::gitsource_route(state, caller, &method, name, Some(key), req).await
        }
        ["projects", name, "tools", rest @ ..] => {
            tools::route(state, caller, &method, name, rest, &query, req).await
        }
        ["projects", name, "runtime"] => {
            only(&method, &path, Method::GET)?;
            containers::runtime_figures(state, caller, name).await
        }
        ["projects", name, "exec"] if method == Method::GET => {
            attach::attach(state, caller, name, req).await
        }
        ["projects", name, "exec"] => {
            only(&method, &path, Method::POST)?;
            containers::exec(state, caller, name, req).await
        }
        ["projects", name, "answer"] => {
            only(&method, &path, Method::POST)?;
            containers::answer(state, caller, name, req).await
        }
        ["projects", name, "logs"] => {
            only(&method, &path, Method::GET)?;
            containers::logs(state, caller, name, &query, None).await
        }
        // The same as `?offset=K`, for clients that cannot send a query string.
        ["projects", name, "logs", offset] => {
            only(&method, &path, Method::GET)?;
            containers::logs(state, caller, name, &query, Some(offset)).await
        }
        ["projects", name, "previewtickets"] => {
            only(&method, &path, Method::POST)?;
            preview::issue_ticket(state, caller, name, req).await
        }
        ["projects", name, "ide"] => {
            only(&method, &path, Method::POST)?;
            ide::open(state, caller, name).await
        }
        ["projects", name, "portforward"] => {
            only(&method, &path, Method::GET)?;
            preview::port_forward(state, caller, name, &query, req).await
        }
        ["projects", name, "repairnetwork"] => {
            only(&method, &path, Method::POST)?;
            containers::repair_network(state, caller, name).await
        }
        ["projects", name, "look"] => {
            only(&method, &path, Method::POST)?;
            request_look(state, caller, name).await
        }
        ["projects", name, "forcecheckout"] => {
            only(&method, &path, Method::POST)?;
            request_forced_checkout(state, caller, name).await
        }
        ["projects", name, "forcereplace"] => {
            only(&method, &path, Method::POST)?;
            request_forced_replace(state, caller, name).await
        }
        ["projects", name, "members"] => members::route(state, caller, &method, name, None).await,
        ["projects", name, "members", user] => {
            members::route(state, caller, &method, name, Some(user)).await
        }
        [plural, tail @ ..] => {
            let kind = Kind::from_plural(plural).ok_or_else(|| {
                ApiError::not_found(format!("the server has no resource {plural:?}"))
            })?;
            resource(state, caller, kind, tail, req, &query).await
        }
        [] => Err(ApiError::not_found(format!("no route for {path}"))),
    }
}

/// The segments after the API prefix, percent-decoded (clients encode them: `unix:alice`
/// arrives as `unix%3Aalice`).
fn segments(path: &str) -> Result<Vec<String>, ApiError> {
    let Some(rest) = path.strip_prefix(API_PREFIX) else {
        return Err(ApiError::not_found(format!("no route for {path}")));
    };
    rest.split('/')
        .filter(|s| !s.is_empty())
        .map(|s| {
            percent_encoding::percent_decode_str(s)
                .decode_utf8()
                .map(|s| s.into_owned())
                .map_err(|_| ApiError::bad_request(format!("{path}: a segment is not UTF-8")))
        })
        .collect()
}

/// `.../PLURAL[/NAME[/status|/events]]`: the objects of one kind.
async fn resource(
    state: &Arc<ApiState>,
    caller: &Caller,
    kind: Kind,
    tail: &[&str],
    req: Request<Incoming>,
    query: &Query,
) -> Outcome {
    let method = req.method().clone();
    let path = req.uri().path().trim_end_matches('/').to_string();
    match (tail, &method) {
        ([], &Method::GET) if query.flag("watch")? => Ok(watch::stream(
            state,
            caller,
            kind,
            query.selector()?,
            None,
            watch_filter(state, caller),
            watch_redaction(state, caller, kind),
        )),
        ([], &Method::GET) => list(state, caller, kind, query),
        ([], &Method::POST) => create_or_replace(state, caller, kind, None, req, query).await,
        ([], _) => Err(ApiError::method_not_allowed(&method, &path)),
        ([name], &Method::GET) if query.flag("watch")? => {
            may_read(state, caller, kind, name)?;
            Ok(watch::stream(
                state,
                caller,
                kind,
                query.selector()?,
                Some(name.to_string()),
                watch_filter(state, caller),
                watch_redaction(state, caller, kind),
            ))
        }
        ([name], &Method::GET) => {
            may_read(state, caller, kind, name)?;
            get(state, caller, kind, name)
        }
        ([name], &Method::PUT) => {
            create_or_replace(state, caller, kind, Some(name), req, query).await
        }
        ([name], &Method::PATCH) => patch(state, caller, kind, name, req, query).await,
        ([name], &Method::DELETE) => delete(state, caller, kind, name, query).await,
        ([_], _) => Err(ApiError::method_not_allowed(&method, &path)),
        ([name, "status"], &Method::GET) => {
            may_read(state, caller, kind, name)?;
            get(state, caller, kind, name)
        }
        ([name, "status"], &Method::PUT) => put_status(state, caller, kind, name, req, query).await,
        ([_, "status"], _) => Err(ApiError::method_not_allowed(&method, &path)),
        ([name, "events"], &Method::GET) => {
            may_read(state, caller, kind, name)?;
            Ok(event_list(
                state.store.events_for(kind, name)?,
                Redaction::of(state, caller),
            ))
        }
        ([_, "events"], _) => Err(ApiError::method_not_allowed(&method, &path)),
        _ => Err(ApiError::not_found(format!("no route for {path}"))),
    }
}

fn only(method: &Method, path: &str, allowed: Method) -> Result<(), ApiError> {
    if *method == allowed {
        Ok(())
    } else {
        Err(ApiError::method_not_allowed(method, path))
    }
}
