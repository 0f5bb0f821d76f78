//! `/projects/NAME/members[/USER]`: members (and admins) list, add and remove a project's
//! members; a non-admin cannot remove the last one, so a project never becomes unreachable for
//! everyone but the admins by accident.

use std::sync::Arc;

use hyper::{Method, StatusCode};
use serde_json::{Value, json};

use super::access;
use super::error::ApiError;
use super::routes::{Outcome, blocking, json_response};
use super::{ApiState, Caller};

pub(super) async fn route(
    state: &Arc<ApiState>,
    caller: &Caller,
    method: &Method,
    project: &str,
    user: Option<&str>,
) -> Outcome {
    let project = access::member_project(state, caller, project)?;
    let uid = project.uid().to_string();
    let name = project.name().to_string();
    match (user, method) {
        (None, &Method::GET) => {
            let items: Vec<Value> = state
                .store
                .members(&uid)
                .into_iter()
                .map(|user| json!({"name": user}))
                .collect();
            Ok(json_response(
                StatusCode::OK,
                &json!({
                    "apiVersion": berth_api::API_VERSION,
                    "kind": "MemberList",
                    "metadata": {"project": name},
                    "items": items,
                }),
            ))
        }
        (Some(user), &Method::GET) => {
            if !state.store.is_member(&uid, user) {
                return Err(not_member(&name, user));
            }
            Ok(member(&name, user, StatusCode::OK))
        }
        (Some(user), &Method::PUT) => {
            check_user(state, user)?;
            let store = Arc::clone(&state.store);
            let user_owned = user.to_string();
            let added = blocking(move || store.add_member(&uid, &user_owned)).await??;
            let code = if added {
                StatusCode::CREATED
            } else {
                StatusCode::OK
            };
            Ok(member(&name, user, code))
        }
        (Some(user), &Method::DELETE) => {
            let store = Arc::clone(&state.store);
            let user_owned = user.to_string();
            let keep_one = !caller.admin;
            blocking(move || store.remove_member(&uid, &user_owned, keep_one))
                .await?
                .map_err(|err| match err {
                    crate::store::StoreError::NotFound { .. } => not_member(&name, user),
                    crate::store::StoreError::Conflict { message, .. } => {
                        ApiError::forbidden(message).with_object(berth_api::Kind::Project, &name)
                    }
                    other => other.into(),
                })?;
            Ok(json_response(
                StatusCode::OK,
                &json!({
                    "kind": "Status", "apiVersion": "v1", "status": "Success", "code": 200,
                    "message": format!("{user:?} is no longer a member of project {name:?}"),
                }),
            ))
        }
        _ => Err(ApiError::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "MethodNotAllowed",
            format!("{method} is not supported on the members of project {name:?}"),
        )),
    }
}

/// A member is a user berth knows, or a local administrator (`unix:<os user>`).
fn check_user(state: &ApiState, user: &str) -> Result<(), ApiError> {
    if let Some(os_user) = user.strip_prefix("unix:") {
        if os_user.is_empty() || os_user.contains(|c: char| c.is_whitespace() || c == '/') {
            return Err(ApiError::bad_request(format!(
                "{user:?} is not a local user like unix:alice"
            )));
        }
        return Ok(());
    }
    if state.store.user(user)?.is_none() {
        return Err(ApiError::not_found(format!(
            "user {user:?} not found (berth user add {user})"
        ))
        .with_object("User", user));
    }
    Ok(())
}

fn member(project: &str, user: &str, code: StatusCode) -> hyper::Response<super::Body> {
    json_response(
        code,
        &json!({
            "apiVersion": berth_api::API_VERSION,
            "kind": "Member",
            "metadata": {"project": project},
            "name": user,
        }),
    )
}

fn not_member(project: &str, user: &str) -> ApiError {
    ApiError::not_found(format!("{user:?} is not a member of project {project:?}"))
}
