//! The writes of one object: admission, create (a given or generated name), replace, merge
//! and apply patches retried while the object moves, delete, the status subresource, and the
//! requests a member records on a project (look, forced checkout, forced replace).
//!
//! A delete records `forceDelete`, `purge` and `deletedBy`, and on a Project `lookRequestedAt`
//! (as `POST .../look` does, which `berth wait --for=delete` sends); `POST .../forcecheckout`
//! (members) records `forceCheckout`.

use std::collections::BTreeMap;
use std::sync::Arc;

use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use serde_json::{Value, json};

use berth_api::Kind;

use super::access;
use super::admission::{self, Admitted};
use super::body::{self, APPLY_PATCH, MERGE_PATCH, OBJECT_LIMIT};
use super::error::{ApiError, Cause};
use super::merge_patch;
use super::reads::{may_read, not_found};
use super::responses::{blocking, serialized, warned};
use super::routes::{Outcome, Query};
use super::{ApiState, Body, Caller};
use crate::store::{
    Action, ApplyParams, Commit, Deletion, Expected, FieldManager, PostParams, StatusWrite,
    StoredObject,
};

/// Reads and admits one object sent for `kind` (and `name`, when the URL names one).
pub(super) async fn admit_one(
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
pub(super) async fn read_object(
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
pub(super) fn take_generate_name(value: &mut Value) -> Result<Option<String>, ApiError> {
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
pub(super) fn fill_identity(value: &mut Value, kind: Kind, name: Option<&str>) {
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

pub(super) fn admit_value(
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

/// A create (the collection's URL, no name: `201 Created`) or a replace (one object's URL,
/// whose name the admitted body must carry: `200 OK`): the body admitted with its finalizers as
/// sent, the caller allowed to write it over what is stored now, written, and answered with the
/// admission warnings.
pub(super) async fn create_or_replace(
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
pub(super) async fn write_object(
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
pub(super) async fn create_generated(
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
pub(super) const GENERATE_ATTEMPTS: usize = 50;

pub(super) async fn patch(
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
pub(super) const PATCH_ATTEMPTS: u32 = 5;

/// Applies a merge patch to the user-written parts of an object: spec, labels, annotations.
pub(super) fn merged_user_form(current: &StoredObject, patch: &Value) -> Result<Value, ApiError> {
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
pub(super) async fn delete(
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
pub(super) fn look_stamp() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Nanos, true)
}

/// A member's request recorded on project `name` by `write` (given the store, the name and a
/// fresh stamp), answered with the project.
pub(super) async fn request_on_project(
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
pub(super) async fn request_look(state: &Arc<ApiState>, caller: &Caller, name: &str) -> Outcome {
    request_on_project(state, caller, name, |store, name, stamp| {
        store.request_look(Kind::Project, name, stamp)
    })
    .await
}

/// `POST .../projects/NAME/forcecheckout`: a member asks for the project's held checkout
/// (`CheckoutBlocked`) to go ahead over the workspace's files, which the controller first
/// copies into the trash. Answers the project, carrying the request in
/// `berth.dev/forceCheckout`; a request made while nothing is held forces nothing.
pub(super) async fn request_forced_checkout(
    state: &Arc<ApiState>,
    caller: &Caller,
    name: &str,
) -> Outcome {
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
pub(super) async fn request_forced_replace(
    state: &Arc<ApiState>,
    caller: &Caller,
    name: &str,
) -> Outcome {
    request_on_project(
        state,
        caller,
        name,
        crate::store::Store::request_forced_replace,
    )
    .await
}

pub(super) async fn put_status(
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
