//! Request routing and the resource handlers.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::header::{CONTENT_TYPE, HeaderValue, WARNING};
use hyper::{Method, Request, Response, StatusCode};
use serde::Serialize;
use serde_json::{Value, json};

use berth_api::Kind;
use berth_api::wire::{API_PREFIX, ApplyItem, ApplyResult, ListMeta, ObjectList};

use super::access::{self, Redaction, Visibility};
use super::admission::{self, Admitted, Refusal};
use super::body::{self, APPLY_LIMIT, APPLY_PATCH, MERGE_PATCH, OBJECT_LIMIT};
use super::error::{ApiError, Cause};
use super::merge_patch;
use super::selector::LabelSelector;
use super::watch;
use super::{
    ApiState, Body, Caller, Transport, attach, authority, containers, ide, members, preview,
    probes, secrets, tools, trash, ui, users,
};
use crate::store::{
    Action, AppliedSet, ApplyParams, Commit, Deletion, Expected, FieldManager, PostParams,
    SetParams, StatusWrite, StoredObject,
};

/// How many events `GET .../events` returns without `?limit=`.
const DEFAULT_EVENT_LIMIT: usize = 1000;

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

    fn flag(&self, key: &str) -> Result<bool, ApiError> {
        match self.get(key) {
            None | Some("false") | Some("0") => Ok(false),
            Some("true") | Some("1") | Some("") => Ok(true),
            Some(other) => Err(ApiError::bad_request(format!(
                "{key}: {other:?} is not true or false"
            ))),
        }
    }

    /// `?dryRun=All`: validate and admit, write nothing.
    fn commit(&self) -> Result<Commit, ApiError> {
        match self.get("dryRun") {
            None | Some("") => Ok(Commit::Persist),
            Some("All") => Ok(Commit::DryRun),
            Some(other) => Err(ApiError::bad_request(format!(
                "dryRun: {other:?} is not supported; use dryRun=All"
            ))),
        }
    }

    fn selector(&self) -> Result<LabelSelector, ApiError> {
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
            let kind = admission::kind_by_plural(plural).ok_or_else(|| {
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

/// `GET .../events?limit=N`: the most recent events the caller may see.
fn recent_events(state: &ApiState, caller: &Caller, query: &Query) -> Outcome {
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

/// `GET .../reap`: what the reaper would do now with the projects the caller may see.
fn reap_plan(state: &ApiState, caller: &Caller) -> Outcome {
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
fn warm_pool(state: &ApiState) -> berth_api::wire::PoolList {
    berth_api::wire::PoolList {
        api_version: berth_api::API_VERSION.to_string(),
        kind: "PoolList".to_string(),
        items: vec![state.pool.entry()],
    }
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

/// Projects are read by their members (and admins), GitSources by the members of a project
/// they manage (404 to everyone else: their names and URLs are not for every user), the other
/// kinds by every user.
fn may_read(state: &ApiState, caller: &Caller, kind: Kind, name: &str) -> Result<(), ApiError> {
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
fn watch_filter(state: &ApiState, caller: &Caller) -> Option<watch::Filter> {
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

fn only(method: &Method, path: &str, allowed: Method) -> Result<(), ApiError> {
    if *method == allowed {
        Ok(())
    } else {
        Err(ApiError::method_not_allowed(method, path))
    }
}

fn list(state: &ApiState, caller: &Caller, kind: Kind, query: &Query) -> Outcome {
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

fn get(state: &ApiState, caller: &Caller, kind: Kind, name: &str) -> Outcome {
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
fn watch_redaction(state: &Arc<ApiState>, caller: &Caller, kind: Kind) -> Option<watch::Redact> {
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

fn not_found(kind: Kind, name: &str) -> ApiError {
    ApiError::not_found(format!("{} {name:?} not found", kind.as_str())).with_object(kind, name)
}

/// Reads and admits one object sent for `kind` (and `name`, when the URL names one).
async fn admit_one(
    state: &ApiState,
    caller: &Caller,
    kind: Kind,
    name: Option<&str>,
    req: Request<Incoming>,
) -> Result<Admitted, ApiError> {
    let value = read_object(kind, name, req).await?;
    admit_value(state, caller, kind, name, &value)
}

/// The request's body as one object of `kind`, with what the URL says filled in.
async fn read_object(
    kind: Kind,
    name: Option<&str>,
    req: Request<Incoming>,
) -> Result<Value, ApiError> {
    let media = body::media_type(req.headers());
    let (parts, incoming) = req.into_parts();
    let bytes = body::read(incoming, &parts.headers, OBJECT_LIMIT)
        .await
        .map_err(|err| err.about(kind.as_str(), name))?;
    let mut value = body::decode(&bytes, media.as_deref())?;
    fill_identity(&mut value, kind, name);
    Ok(value)
}

/// `metadata.generateName` of a create, taken out of the object: the text the server derives
/// the name from. `None` when the object names itself.
fn take_generate_name(value: &mut Value) -> Result<Option<String>, ApiError> {
    let Some(metadata) = value.get_mut("metadata").and_then(Value::as_object_mut) else {
        return Ok(None);
    };
    let Some(basis) = metadata.remove("generateName") else {
        return Ok(None);
    };
    let named = metadata
        .get("name")
        .and_then(Value::as_str)
        .is_some_and(|n| !n.is_empty());
    match basis.as_str().map(str::trim) {
        _ if named => Err(ApiError::bad_request(
            "metadata.generateName: give metadata.name or metadata.generateName, not both",
        )),
        Some(basis) if !basis.is_empty() => Ok(Some(basis.to_string())),
        _ => Err(ApiError::bad_request(
            "metadata.generateName: must be a non-empty string",
        )),
    }
}

/// A body may leave out what the URL already says.
fn fill_identity(value: &mut Value, kind: Kind, name: Option<&str>) {
    let Value::Object(object) = value else { return };
    object
        .entry("apiVersion")
        .or_insert_with(|| json!(berth_api::API_VERSION));
    object.entry("kind").or_insert_with(|| json!(kind.as_str()));
    if let Some(name) = name {
        let metadata = object.entry("metadata").or_insert_with(|| json!({}));
        if let Value::Object(metadata) = metadata {
            metadata.entry("name").or_insert_with(|| json!(name));
        }
    }
}

fn admit_value(
    state: &ApiState,
    caller: &Caller,
    kind: Kind,
    name: Option<&str>,
    value: &Value,
) -> Result<Admitted, ApiError> {
    // Where the object goes is checked before what it holds: an object sent to the wrong
    // endpoint is a wrong request, not an invalid object of this kind.
    if let Some(sent_kind) = value.get("kind").and_then(Value::as_str)
        && Kind::parse(sent_kind) != Some(kind)
    {
        return Err(ApiError::bad_request(format!(
            "kind {sent_kind:?} was sent to the {} endpoint",
            kind.plural()
        )));
    }
    let sent_name = value
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    if let Some(name) = name
        && sent_name != name
    {
        return Err(ApiError::bad_request(format!(
            "metadata.name {sent_name:?} does not match the name in the URL, {name:?}"
        ))
        .with_object(kind, name));
    }
    state
        .admission
        .admit(access::admitter(caller), value, &state.store)
        .map_err(|refusal| refusal.into_api_error(Some(kind.as_str()), Some(&sent_name)))
}

/// Store writes hold a lock and wait on the disk; keep them off the async workers.
pub(super) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, ApiError> {
    crate::store::blocking(f)
        .await
        .map_err(|err| ApiError::internal(err.to_string()))
}

/// A create (the collection's URL, no name: `201 Created`) or a replace (one object's URL,
/// whose name the admitted body must carry: `200 OK`): the body admitted with its finalizers as
/// sent, the caller allowed to write it over what is stored now, written, and answered with the
/// admission warnings.
async fn create_or_replace(
    state: &Arc<ApiState>,
    caller: &Caller,
    kind: Kind,
    name: Option<&str>,
    req: Request<Incoming>,
    query: &Query,
) -> Outcome {
    let commit = query.commit()?;
    let mut value = read_object(kind, name, req).await?;
    if name.is_none()
        && let Some(basis) = take_generate_name(&mut value)?
    {
        return create_generated(state, caller, kind, value, &basis, commit).await;
    }
    write_object(state, caller, kind, name, &value, commit)
        .await?
        .map_err(ApiError::from)
}

/// Admits `value` and writes it: a create (no `name`: `201 Created`) or a replace (`200 OK`),
/// with its finalizers as sent, the caller allowed to write it over what is stored now, and
/// answered with the admission warnings. The store's refusal comes back as it is, for a caller
/// that tries again (a generated name taken meanwhile).
async fn write_object(
    state: &Arc<ApiState>,
    caller: &Caller,
    kind: Kind,
    name: Option<&str>,
    value: &Value,
    commit: Commit,
) -> Result<Result<Response<Body>, crate::store::StoreError>, ApiError> {
    let admitted = admit_value(state, caller, kind, name, value)?;
    let warnings = state.admission.warnings(&admitted.desired);
    let rv = admitted.resource_version;
    let mut desired = admitted.desired;
    desired.finalizers = admitted.finalizers;
    let current = state.store.get(desired.kind, &desired.name);
    access::check_write(state, caller, &desired, current.as_deref())?;
    let store = Arc::clone(&state.store);
    let written = match name {
        None => {
            let creator = caller.identity.clone();
            blocking(move || store.create(desired, PostParams::by(&creator, commit)))
                .await?
                .map(|created| (StatusCode::CREATED, created))
        }
        Some(_) => blocking(move || store.replace(desired, rv, commit))
            .await?
            .map(|(replaced, _)| (StatusCode::OK, replaced)),
    };
    Ok(written.map(|(code, object)| warned(serialized(code, object.as_ref()), &warnings)))
}

/// A create whose name the server derives from `basis` (`metadata.generateName`), as `berth
/// create project` does from a display name: its slug, or the slug with `-2`, `-3`, ... when
/// taken, tried again when another create took the name meanwhile. A project without a display
/// name gets `basis` as its display name.
async fn create_generated(
    state: &Arc<ApiState>,
    caller: &Caller,
    kind: Kind,
    mut value: Value,
    basis: &str,
    commit: Commit,
) -> Outcome {
    if kind == Kind::Project
        && let Some(object) = value.as_object_mut()
        && let Value::Object(spec) = object.entry("spec").or_insert_with(|| json!({}))
    {
        spec.entry("displayName").or_insert_with(|| json!(basis));
    }
    for _ in 0..GENERATE_ATTEMPTS {
        let name = berth_api::derive_name(basis, |n| state.store.get(kind, n).is_some())
            .ok_or_else(|| {
                ApiError::bad_request(format!(
                    "metadata.generateName: {basis:?} has no letters or digits to derive a name from"
                ))
            })?;
        value["metadata"]["name"] = json!(name);
        match write_object(state, caller, kind, None, &value, commit).await? {
            // Another create took the name since it was derived: the next one.
            Err(crate::store::StoreError::AlreadyExists { .. }) => continue,
            written => return written.map_err(ApiError::from),
        }
    }
    Err(ApiError::new(
        StatusCode::CONFLICT,
        "AlreadyExists",
        format!("no free name derived from {basis:?} after {GENERATE_ATTEMPTS} attempts"),
    ))
}

/// How often a generated name is derived again when concurrent creates keep taking it.
const GENERATE_ATTEMPTS: usize = 50;

async fn patch(
    state: &Arc<ApiState>,
    caller: &Caller,
    kind: Kind,
    name: &str,
    req: Request<Incoming>,
    query: &Query,
) -> Outcome {
    let commit = query.commit()?;
    let media = body::media_type(req.headers()).unwrap_or_default();
    let store = Arc::clone(&state.store);
    match media.as_str() {
        APPLY_PATCH => {
            let admitted = admit_one(state, caller, kind, Some(name), req).await?;
            let warnings = state.admission.warnings(&admitted.desired);
            // Access is decided on the object as read; the store writes only while it is still
            // that object (or still absent), so a create never lands on a project another user
            // made meanwhile. Moved: judged again on what is there now.
            let mut attempts = 0;
            let (object, action) = loop {
                attempts += 1;
                let current = state.store.get(kind, name);
                access::check_write(state, caller, &admitted.desired, current.as_deref())?;
                let expected = Expected::of(current.as_deref());
                let creator = caller.identity.clone();
                let desired = admitted.desired.clone();
                let writer = Arc::clone(&store);
                let written = blocking(move || {
                    writer.apply((desired, expected), ApplyParams::by(&creator, commit))
                })
                .await?;
                match written {
                    Err(crate::store::StoreError::Moved { .. }) if attempts < PATCH_ATTEMPTS => {}
                    written => break written?,
                }
            };
            let code = if action == Action::Created {
                StatusCode::CREATED
            } else {
                StatusCode::OK
            };
            Ok(warned(serialized(code, object.as_ref()), &warnings))
        }
        MERGE_PATCH => {
            let (parts, incoming) = req.into_parts();
            let bytes = body::read(incoming, &parts.headers, OBJECT_LIMIT).await?;
            let patch = body::decode(&bytes, Some(MERGE_PATCH))?;
            // Without a resourceVersion in the patch, the object read is the precondition, so a
            // write that slipped in between is not silently overwritten: the patch is laid onto
            // the object as it is now and written again (the controller writes status often).
            // With one, a stale patch is the caller's 409.
            let mut attempts = 0;
            loop {
                attempts += 1;
                let current = store.get(kind, name).ok_or_else(|| not_found(kind, name))?;
                let merged = merged_user_form(&current, &patch)?;
                let admitted = admit_value(state, caller, kind, Some(name), &merged)?;
                let warnings = state.admission.warnings(&admitted.desired);
                access::check_write(state, caller, &admitted.desired, Some(&current))?;
                let pinned = admitted.resource_version.is_some();
                let rv = admitted
                    .resource_version
                    .unwrap_or(current.resource_version());
                let writer = Arc::clone(&store);
                let written =
                    blocking(move || writer.replace(admitted.desired, Some(rv), commit)).await?;
                let moved = || {
                    store
                        .get(kind, name)
                        .is_some_and(|now| now.resource_version() != rv)
                };
                match written {
                    Err(crate::store::StoreError::Conflict { .. })
                        if !pinned && attempts < PATCH_ATTEMPTS && moved() =>
                    {
                        continue;
                    }
                    written => {
                        let (object, _) = written?;
                        return Ok(warned(
                            serialized(StatusCode::OK, object.as_ref()),
                            &warnings,
                        ));
                    }
                }
            }
        }
        other => Err(ApiError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "UnsupportedMediaType",
            format!(
                "PATCH needs Content-Type {APPLY_PATCH} or {MERGE_PATCH}, not {:?}",
                other
            ),
        )),
    }
}

/// How often a merge patch without a resourceVersion is laid onto a fresh read when another
/// write keeps slipping in between.
const PATCH_ATTEMPTS: u32 = 5;

/// Applies a merge patch to the user-written parts of an object: spec, labels, annotations.
fn merged_user_form(current: &StoredObject, patch: &Value) -> Result<Value, ApiError> {
    let Value::Object(patch) = patch else {
        return Err(ApiError::bad_request("a merge patch must be a JSON object"));
    };
    let mut form = admission::user_form(current);
    let mut causes = Vec::new();
    for (key, value) in patch {
        match key.as_str() {
            "spec" => merge_patch::merge(&mut form["spec"], value),
            "metadata" => {
                let Value::Object(metadata) = value else {
                    causes.push(Cause::new("metadata", "must be an object"));
                    continue;
                };
                for (field, value) in metadata {
                    match field.as_str() {
                        "labels" | "annotations" => {
                            merge_patch::merge(&mut form["metadata"][field], value)
                        }
                        "resourceVersion" => form["metadata"][field] = value.clone(),
                        "name" if value.as_str() == Some(current.name()) => {}
                        other => causes.push(Cause::new(
                            format!("metadata.{other}"),
                            "cannot be changed by a merge patch",
                        )),
                    }
                }
            }
            "apiVersion" | "kind" if form.get(key) == Some(value) => {}
            other => causes.push(Cause::new(other, "cannot be changed by a merge patch")),
        }
    }
    if !causes.is_empty() {
        return Err(ApiError::invalid(
            Some(current.kind.as_str()),
            Some(current.name()),
            causes,
        ));
    }
    Ok(form)
}

/// Deletes an object, recording on it how it was asked to go: forced, purged (skipping the
/// trash; admins only, and only with force) and by whom.
async fn delete(
    state: &Arc<ApiState>,
    caller: &Caller,
    kind: Kind,
    name: &str,
    query: &Query,
) -> Outcome {
    use berth_api::annotations;
    // A non-member hears 404 of a project, as of a name that does not exist; a member who is
    // no admin hears 403.
    if kind == Kind::Project && !caller.admin {
        access::member_project(state, caller, name)?;
    }
    access::require_admin(caller, &format!("delete {} objects", kind.as_str()))?;
    let commit = query.commit()?;
    let force = query.flag("force")?;
    let purge = query.flag("purge")?;
    if purge {
        access::require_admin(caller, "purge a deletion (skip the trash)")?;
        if !force {
            return Err(ApiError::bad_request(
                "purge: a purged deletion must be forced (force=true&purge=true)",
            ));
        }
    }
    let mut annotations =
        BTreeMap::from([(annotations::DELETED_BY.to_string(), caller.identity.clone())]);
    if force {
        annotations.insert(annotations::FORCE_DELETE.to_string(), "true".to_string());
    }
    if purge {
        annotations.insert(annotations::PURGE.to_string(), "true".to_string());
    }
    // Asking again for a held deletion is asking for a fresh look at the workspace now.
    if kind == Kind::Project {
        annotations.insert(annotations::LOOK_REQUESTED_AT.to_string(), look_stamp());
    }
    let rv = match query.get("resourceVersion") {
        Some(rv) => Some(rv.parse::<u64>().map_err(|_| {
            ApiError::bad_request(format!("resourceVersion: {rv:?} is not a resourceVersion"))
        })?),
        None => None,
    };
    let store = Arc::clone(&state.store);
    let name_owned = name.to_string();
    let deletion = blocking(move || store.delete(kind, &name_owned, rv, annotations, commit))
        .await?
        .map_err(|err| match err {
            crate::store::StoreError::NotFound { .. } => not_found(kind, name),
            other => other.into(),
        })?;
    // Like Kubernetes: 200 with the last state when gone, 202 with the object (carrying
    // deletionTimestamp) while finalizers hold it.
    let code = match deletion {
        Deletion::Deleted(_) => StatusCode::OK,
        Deletion::Deleting(_) => StatusCode::ACCEPTED,
    };
    // A forced deletion of a held project no longer waits on what held it; saying so at once
    // keeps a waiting client from reading the old hold as the answer.
    if force && commit == Commit::Persist && code == StatusCode::ACCEPTED && kind == Kind::Project {
        let (store, name) = (Arc::clone(&state.store), name.to_string());
        let released =
            blocking(move || crate::reconcile::finalizer::release_forced(&store, &name)).await??;
        if let crate::store::StatusWritten::Written(object) = released {
            return Ok(serialized(code, object.as_ref()));
        }
    }
    Ok(serialized(code, deletion.object().as_ref()))
}

/// A request for a fresh look, unique per request: the time, to the nanosecond.
fn look_stamp() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Nanos, true)
}

/// A member's request recorded on project `name` by `write` (given the store, the name and a
/// fresh stamp), answered with the project.
async fn request_on_project(
    state: &Arc<ApiState>,
    caller: &Caller,
    name: &str,
    write: fn(
        &crate::store::Store,
        &str,
        &str,
    ) -> Result<Arc<StoredObject>, crate::store::StoreError>,
) -> Outcome {
    may_read(state, caller, Kind::Project, name)?;
    let store = Arc::clone(&state.store);
    let name_owned = name.to_string();
    let object = blocking(move || write(&store, &name_owned, &look_stamp()))
        .await?
        .map_err(|err| match err {
            crate::store::StoreError::NotFound { .. } => not_found(Kind::Project, name),
            other => other.into(),
        })?;
    Ok(serialized(StatusCode::OK, object.as_ref()))
}

/// `POST .../projects/NAME/look`: a member asks the finalizer to look at the workspace of a
/// held deletion again now (`berth wait --for=delete`); 409 when the project is not being
/// deleted. Answers the project, carrying the request in `berth.dev/lookRequestedAt`.
async fn request_look(state: &Arc<ApiState>, caller: &Caller, name: &str) -> Outcome {
    request_on_project(state, caller, name, |store, name, stamp| {
        store.request_look(Kind::Project, name, stamp)
    })
    .await
}

/// `POST .../projects/NAME/forcecheckout`: a member asks for the project's held checkout
/// (`CheckoutBlocked`) to go ahead over the workspace's files, which the controller first
/// copies into the trash. Answers the project, carrying the request in
/// `berth.dev/forceCheckout`; a request made while nothing is held forces nothing.
async fn request_forced_checkout(state: &Arc<ApiState>, caller: &Caller, name: &str) -> Outcome {
    request_on_project(
        state,
        caller,
        name,
        crate::store::Store::request_forced_checkout,
    )
    .await
}

/// `POST .../projects/NAME/forcereplace`: a member asks for the project's container to be
/// replaced now whatever it holds outside /workspace (`berth restart --recreate --force`); the
/// old container still goes to the trash. Answers the project, carrying the request in
/// `berth.dev/recreateRequestedAt` and `berth.dev/forceReplace` (which no manifest may set).
async fn request_forced_replace(state: &Arc<ApiState>, caller: &Caller, name: &str) -> Outcome {
    request_on_project(
        state,
        caller,
        name,
        crate::store::Store::request_forced_replace,
    )
    .await
}

async fn put_status(
    state: &Arc<ApiState>,
    caller: &Caller,
    kind: Kind,
    name: &str,
    req: Request<Incoming>,
    query: &Query,
) -> Outcome {
    if !caller.may_write_status() {
        return Err(ApiError::forbidden(
            "status is written only by the controller",
        ));
    }
    let commit = query.commit()?;
    let media = body::media_type(req.headers());
    let (parts, incoming) = req.into_parts();
    let bytes = body::read(incoming, &parts.headers, OBJECT_LIMIT).await?;
    let value = body::decode(&bytes, media.as_deref())?;
    let status = value.get("status").cloned().ok_or_else(|| {
        ApiError::invalid(
            Some(kind.as_str()),
            Some(name),
            vec![Cause::new("status", "required")],
        )
    })?;
    if !status.is_object() && !status.is_null() {
        return Err(ApiError::invalid(
            Some(kind.as_str()),
            Some(name),
            vec![Cause::new("status", "must be an object")],
        ));
    }
    // The controller reads status back typed: refuse what it could not read.
    if let Some(current) = state.store.get(kind, name) {
        let mut candidate = (*current).clone();
        candidate.status = crate::store::Doc::new(&status);
        if let Err(errors) = berth_api::decode_stored(candidate.to_value()) {
            return Err(ApiError::invalid(
                Some(kind.as_str()),
                Some(name),
                errors
                    .causes
                    .into_iter()
                    .map(|c| Cause::new(c.field, c.message))
                    .collect(),
            ));
        }
    }
    let rv = match value.pointer("/metadata/resourceVersion") {
        Some(Value::String(rv)) if !rv.is_empty() => Some(rv.parse::<u64>().map_err(|_| {
            ApiError::bad_request(format!(
                "metadata.resourceVersion: {rv:?} is not a resourceVersion"
            ))
        })?),
        _ => None,
    };
    let store = Arc::clone(&state.store);
    let name_owned = name.to_string();
    let object = blocking(move || {
        let write = StatusWrite::new(kind, &name_owned, FieldManager::Server)
            .pinned(rv)
            .commit(commit);
        store
            .write_status(write, |_| status.clone())?
            .require(kind, &name_owned)
    })
    .await??;
    Ok(serialized(StatusCode::OK, object.as_ref()))
}

/// `POST /apis/berth.dev/v1alpha1/apply`: a `List` of objects of any kind, every one admitted
/// before any is written, all written in one transaction.
async fn apply_list(
    state: &Arc<ApiState>,
    caller: &Caller,
    req: Request<Incoming>,
    query: &Query,
) -> Outcome {
    let commit = query.commit()?;
    let prune = query.flag("prune")?;
    if prune {
        // Pruning deletes, and deleting is for admins.
        access::require_admin(caller, "prune an applyset")?;
    }
    let applyset = match query.get("applyset") {
        None | Some("") => None,
        Some(name) => {
            berth_api::validate_name(name)
                .map_err(|message| ApiError::bad_request(format!("applyset: {message}")))?;
            state
                .admission
                .check_applyset(access::admitter(caller), name)
                .map_err(|refusal| refusal.into_api_error(Some("List"), None))?;
            Some(name.to_string())
        }
    };
    if prune && applyset.is_none() {
        return Err(ApiError::bad_request(
            "prune needs applyset=NAME: berth prunes only what a named set applied before",
        ));
    }
    let media = body::media_type(req.headers());
    let (parts, incoming) = req.into_parts();
    let bytes = body::read(incoming, &parts.headers, APPLY_LIMIT)
        .await
        .map_err(|err| err.about("List", None))?;
    let items = body::decode_list(&bytes, media.as_deref())?;
    drop(bytes);
    for (index, item) in items.iter().enumerate() {
        check_object_size(index, item)?;
    }
    let mut causes = Vec::new();
    // A server-owned annotation anywhere makes the batch a bad request (400), not an invalid one.
    let mut server_owned = Vec::new();
    let mut batch = Vec::with_capacity(items.len());
    let mut warnings = Vec::new();
    let mut seen: HashMap<(Kind, String), usize> = HashMap::with_capacity(items.len());
    for (index, item) in items.iter().enumerate() {
        match state.admission.admit_into(
            access::admitter(caller),
            item,
            &state.store,
            applyset.as_deref(),
        ) {
            Ok(admitted) => {
                let key = (admitted.desired.kind, admitted.desired.name.clone());
                if let Some(first) = seen.insert(key, index) {
                    causes.push(Cause::new(
                        format!("items[{index}].metadata.name"),
                        format!("{:?} is also items[{first}]", admitted.desired.name),
                    ));
                }
                warnings.extend(state.admission.warnings(&admitted.desired));
                batch.push(admitted.desired);
            }
            Err(refusal @ (Refusal::Forbidden(_) | Refusal::Hidden(..))) => {
                let kind = item.get("kind").and_then(Value::as_str);
                let name = item.pointer("/metadata/name").and_then(Value::as_str);
                return Err(refusal.into_api_error(kind, name).in_item(index));
            }
            Err(refusal) => {
                let refusal = refusal.map_causes(|c| {
                    let field = if c.field.is_empty() {
                        format!("items[{index}]")
                    } else {
                        format!("items[{index}].{}", c.field)
                    };
                    Cause::new(field, c.message)
                });
                match refusal {
                    Refusal::Invalid(item_causes) => causes.extend(item_causes),
                    Refusal::ServerOwned(item_causes) => server_owned.extend(item_causes),
                    other => return Err(other.into_api_error(Some("List"), None)),
                }
            }
        }
    }
    drop(items);
    if !server_owned.is_empty() {
        return Err(Refusal::ServerOwned(server_owned).into_api_error(Some("List"), None));
    }
    if !causes.is_empty() {
        return Err(ApiError::invalid(Some("List"), None, causes));
    }
    // The set is recorded on every object before access is checked: moving an object into a
    // set (whose prune may delete it) is a write of that object, with the same right.
    if let Some(set) = &applyset {
        for desired in &mut batch {
            desired
                .annotations
                .insert(berth_api::annotations::APPLYSET.to_string(), set.clone());
        }
    }
    // As for one object: access is decided on each object as read, and the batch is written
    // only while every object is still as read; otherwise all of it is judged again.
    let mut attempts = 0;
    let outcome = loop {
        attempts += 1;
        let mut checked = Vec::with_capacity(batch.len());
        for (index, desired) in batch.iter().enumerate() {
            let current = state.store.get(desired.kind, &desired.name);
            access::check_write(state, caller, desired, current.as_deref())
                .map_err(|err| err.in_item(index))?;
            checked.push((desired.clone(), Expected::of(current.as_deref())));
        }
        let store = Arc::clone(&state.store);
        let creator = caller.identity.clone();
        let written = match applyset.clone() {
            Some(set) => {
                blocking(move || {
                    let params = SetParams::from(ApplyParams::by(&creator, commit));
                    store.apply_set(&set, checked, params.pruning(prune))
                })
                .await?
            }
            None => blocking(move || store.apply_batch(checked, ApplyParams::by(&creator, commit)))
                .await?
                .map(|applied| AppliedSet {
                    applied,
                    pruned: Vec::new(),
                    conflicts: Vec::new(),
                }),
        };
        match written {
            Err(failure)
                if matches!(failure.error, crate::store::StoreError::Moved { .. })
                    && attempts < PATCH_ATTEMPTS => {}
            written => break written?,
        }
    };
    fn item<'o>(object: &'o StoredObject, action: &str) -> ApplyItem<&'o StoredObject> {
        ApplyItem {
            kind: object.kind.to_string(),
            name: object.name().to_string(),
            action: action.to_string(),
            object,
        }
    }
    let applied = outcome
        .applied
        .iter()
        .map(|(object, action)| item(object, action.as_str()));
    let pruned = outcome
        .pruned
        .iter()
        .map(|deletion| item(deletion.object(), "pruned"));
    let body: ApplyResult<&StoredObject> = ApplyResult::new(applied.chain(pruned).collect());
    Ok(warned(serialized(StatusCode::OK, &body), &warnings))
}

/// One object of a batch may hold no more than one object sent alone.
fn check_object_size(index: usize, item: &Value) -> Result<(), ApiError> {
    struct Counter(usize);
    impl std::io::Write for Counter {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut size = Counter(0);
    // Writing a Value to a counter cannot fail.
    let _ = serde_json::to_writer(&mut size, item);
    if size.0 <= OBJECT_LIMIT {
        return Ok(());
    }
    let kind = item.get("kind").and_then(Value::as_str).unwrap_or_default();
    let name = item
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let subject = match (kind.is_empty(), name.is_empty()) {
        (false, false) => format!("{kind} {name:?}"),
        (false, true) => kind.to_string(),
        _ => "the object".to_string(),
    };
    Err(ApiError::too_large_because(
        OBJECT_LIMIT,
        format!(
            "items[{index}]: {subject} is {:.1} MiB, over the limit of {} MiB for one object",
            size.0 as f64 / f64::from(1u32 << 20),
            OBJECT_LIMIT >> 20
        ),
    )
    .with_object(kind, name))
}

/// Events as a list; for a reader who is not an admin, with the projects it may not get
/// redacted from their messages.
fn event_list(events: Vec<crate::store::Event>, redaction: Option<Redaction>) -> Response<Body> {
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

pub(super) fn json_response(code: StatusCode, value: &Value) -> Response<Body> {
    serialized(code, value)
}

/// 200 with a `Success` Status saying what was done, as Kubernetes answers a delete of a
/// thing that is not an object.
pub(super) fn success(message: impl Into<String>) -> Response<Body> {
    let message = message.into();
    serialized(
        StatusCode::OK,
        &json!({
            "kind": "Status", "apiVersion": "v1", "status": "Success", "code": 200,
            "message": message,
        }),
    )
}

/// `response` with each warning as a `Warning: 299 - "..."` header (RFC 7234), as Kubernetes
/// answers admission warnings; a client prints them and carries on.
fn warned(mut response: Response<Body>, warnings: &[String]) -> Response<Body> {
    for warning in warnings {
        let quoted = warning.replace('\\', "\\\\").replace('"', "\\\"");
        if let Ok(value) = HeaderValue::from_str(&format!("299 - \"{quoted}\"")) {
            response.headers_mut().append(WARNING, value);
        }
    }
    response
}

pub(super) fn serialized<T: Serialize + ?Sized>(code: StatusCode, value: &T) -> Response<Body> {
    match serde_json::to_vec(value) {
        Ok(mut bytes) => {
            bytes.push(b'\n');
            bytes_response(code, "application/json", Bytes::from(bytes))
        }
        Err(err) => {
            let err = ApiError::internal(format!("encoding the response: {err}"));
            let bytes = serde_json::to_vec(&err.to_value()).unwrap_or_default();
            bytes_response(err.code, "application/json", Bytes::from(bytes))
        }
    }
}

pub fn text(code: StatusCode, body: &str) -> Response<Body> {
    bytes_response(
        code,
        "text/plain; charset=utf-8",
        Bytes::from(body.to_string()),
    )
}

fn bytes_response(code: StatusCode, content_type: &'static str, bytes: Bytes) -> Response<Body> {
    let mut response = Response::new(Full::new(bytes).boxed());
    *response.status_mut() = code;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}
