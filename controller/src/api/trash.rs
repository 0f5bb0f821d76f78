//! `/trash`, `/trash/purge` and `/trash/UID/restore`: what deletions put in the trash, purging
//! it, and bringing a project back. All are admin rights, like deleting: a non-admin sees
//! nothing of the trash (an entry names a project that may never have been theirs, and a
//! restore creates a project).

use std::sync::Arc;

use hyper::body::Incoming;
use hyper::{Method, Request, StatusCode};
use serde_json::Value;

use super::access;
use super::body::{self, OBJECT_LIMIT};
use super::containers::container_runtime;
use super::error::{ApiError, Cause};
use super::routes::{Outcome, serialized};
use super::{ApiState, Caller};
use crate::trash::{Restore, Scope, Trash, TrashError};

/// `GET /trash[?all=true]` (admins): this controller's entries, or every controller's.
pub(super) async fn list(state: &Arc<ApiState>, caller: &Caller, all: bool) -> Outcome {
    access::require_admin(caller, "list the trash")?;
    let trash = trash(state)?;
    let runtime = container_runtime(state)?;
    let scope = if all { Scope::All } else { Scope::Own };
    let list = trash
        .list(&*runtime, scope)
        .await
        .map_err(TrashError::from)
        .map_err(failure)?;
    Ok(serialized(StatusCode::OK, &list))
}

/// `POST /trash/purge` (admins): trusts the daemon's wall clock as it reads now (ending a pause
/// a clock jump caused) and purges what expired by it, as `{"purged": [UID...]}`.
pub(super) async fn purge(state: &Arc<ApiState>, caller: &Caller) -> Outcome {
    access::require_admin(caller, "purge the trash")?;
    let trash = trash(state)?;
    let runtime = container_runtime(state)?;
    let purged = trash
        .purge_now(&*runtime, crate::clock::now())
        .await
        .map_err(TrashError::from)
        .map_err(failure)?;
    Ok(serialized(
        StatusCode::OK,
        &serde_json::json!({ "purged": purged }),
    ))
}

/// `POST /trash/UID/restore` (admins).
pub(super) async fn route(
    state: &Arc<ApiState>,
    caller: &Caller,
    method: &Method,
    path: &str,
    entry: Option<&str>,
    req: Request<Incoming>,
) -> Outcome {
    match (entry, method) {
        (Some(uid), &Method::POST) => {
            access::require_admin(caller, "restore projects")?;
            let (parts, incoming) = req.into_parts();
            let bytes = body::read(incoming, &parts.headers, OBJECT_LIMIT).await?;
            let new_name = new_name(&bytes)?;
            let trash = trash(state)?;
            let runtime = container_runtime(state)?;
            let object = trash
                .restore(
                    &*runtime,
                    &state.admission,
                    Restore {
                        key: uid.to_string(),
                        new_name,
                        caller: caller.identity.clone(),
                        finalizers: vec![crate::layout::FINALIZER.to_string()],
                    },
                )
                .await
                .map_err(failure)?;
            Ok(serialized(StatusCode::CREATED, object.as_ref()))
        }
        _ => Err(ApiError::method_not_allowed(method, path)),
    }
}

/// The most a file copied out of a trashed container may hold (it travels base64 in JSON).
const FILE_LIMIT: u64 = 32 << 20;

/// `GET /trash/KEY/files?path=P` (admins): the file `P` of the trashed container `KEY`, read
/// through LXD's file API with the container left stopped, as `{"path", "size", "content"}`
/// (`content` base64). `berth trash cp` is its client.
pub(super) async fn file(
    state: &Arc<ApiState>,
    caller: &Caller,
    key: &str,
    path: Option<&str>,
) -> Outcome {
    access::require_admin(caller, "read from the trash")?;
    let Some(path) = path.filter(|p| !p.is_empty()) else {
        return Err(ApiError::invalid(
            None,
            None,
            vec![Cause::new(
                "path",
                "required: the file to read, ?path=/abs/path",
            )],
        ));
    };
    let trash = trash(state)?;
    let runtime = container_runtime(state)?;
    let bytes = trash
        .read_file(&*runtime, key, path, FILE_LIMIT)
        .await
        .map_err(|e| match e {
            TrashError::Runtime(crate::runtime::RuntimeError::TooLarge { .. }) => {
                ApiError::bad_request(format!(
                    "path: {path} is larger than {} MiB",
                    FILE_LIMIT >> 20
                ))
            }
            other => failure(other),
        })?;
    use base64::Engine;
    let body = serde_json::json!({
        "path": path,
        "size": bytes.len(),
        "content": base64::engine::general_purpose::STANDARD.encode(&bytes),
    });
    Ok(serialized(StatusCode::OK, &body))
}

fn trash(state: &ApiState) -> Result<&Arc<Trash>, ApiError> {
    state.trash.as_ref().ok_or_else(|| {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "ServiceUnavailable",
            "this daemon keeps no trash (the controller is paused)",
        )
    })
}

/// The optional body `{"name": NEW}`.
fn new_name(bytes: &[u8]) -> Result<Option<String>, ApiError> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(None);
    }
    let value: Value = serde_json::from_slice(bytes)
        .map_err(|e| ApiError::bad_request(format!("the body is not JSON: {e}")))?;
    let Value::Object(fields) = value else {
        return Err(ApiError::bad_request(
            "the body must be an object like {\"name\": NEW}",
        ));
    };
    if let Some(unknown) = fields.keys().find(|k| *k != "name") {
        return Err(ApiError::invalid(
            None,
            None,
            vec![Cause::new(
                unknown.clone(),
                "unknown field; only name is accepted",
            )],
        ));
    }
    match fields.get("name") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(name)) => Ok(Some(name.clone())),
        Some(_) => Err(ApiError::invalid(
            None,
            None,
            vec![Cause::new("name", "must be a string")],
        )),
    }
}

fn failure(error: TrashError) -> ApiError {
    match error {
        TrashError::NotFound(message) => ApiError::not_found(message),
        TrashError::Conflict(message) => {
            ApiError::new(StatusCode::CONFLICT, "AlreadyExists", message)
        }
        TrashError::Invalid { field, message } => ApiError::invalid(
            Some(berth_api::Kind::Project.as_str()),
            None,
            vec![Cause::new(field, message)],
        ),
        TrashError::Runtime(e) => ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "ServiceUnavailable",
            format!("LXD: {e}"),
        ),
        TrashError::Store(e) => e.into(),
        TrashError::Refused(refusal) => {
            refusal.into_api_error(Some(berth_api::Kind::Project.as_str()), None)
        }
    }
}
