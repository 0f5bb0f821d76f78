//! `/users[/NAME]`, admins only: add a user (its token is in that one response and nowhere
//! else, ever), list, show and remove users.

use std::sync::Arc;

use hyper::body::Incoming;
use hyper::{Method, Request, StatusCode};
use serde_json::{Value, json};

use super::access;
use super::body::{self, OBJECT_LIMIT};
use super::error::{ApiError, Cause};
use super::routes::{Outcome, blocking, json_response, success};
use super::{ApiState, Caller};
use crate::store::User;

pub(super) async fn route(
    state: &Arc<ApiState>,
    caller: &Caller,
    method: &Method,
    name: Option<&str>,
    req: Request<Incoming>,
) -> Outcome {
    access::require_admin(caller, "manage users")?;
    match (name, method) {
        (None, &Method::GET) => {
            let items: Vec<Value> = state.store.users()?.iter().map(user_value).collect();
            Ok(json_response(
                StatusCode::OK,
                &json!({"apiVersion": berth_api::API_VERSION, "kind": "UserList", "items": items}),
            ))
        }
        (None, &Method::POST) => add(state, req).await,
        (Some(name), &Method::GET) => {
            let user = state.store.user(name)?.ok_or_else(|| missing(name))?;
            Ok(json_response(StatusCode::OK, &user_value(&user)))
        }
        (Some(name), &Method::DELETE) => {
            let store = Arc::clone(&state.store);
            let owned = name.to_string();
            blocking(move || store.remove_user(&owned))
                .await?
                .map_err(|err| match err {
                    crate::store::StoreError::NotFound { .. } => missing(name),
                    other => other.into(),
                })?;
            Ok(success(format!(
                "user {name:?} removed; its token no longer works"
            )))
        }
        _ => Err(ApiError::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "MethodNotAllowed",
            format!("{method} is not supported on users"),
        )),
    }
}

/// `POST /users` with `{"name": NAME, "admin": false}`.
async fn add(state: &Arc<ApiState>, req: Request<Incoming>) -> Outcome {
    let media = body::media_type(req.headers());
    let (parts, incoming) = req.into_parts();
    let bytes = body::read(incoming, &parts.headers, OBJECT_LIMIT).await?;
    let value = body::decode(&bytes, media.as_deref())?;
    let invalid = |field: &str, message: String| {
        ApiError::invalid(Some("User"), None, vec![Cause::new(field, message)])
    };
    let Value::Object(fields) = &value else {
        return Err(invalid(
            "",
            "must be an object like {\"name\": \"ana\"}".into(),
        ));
    };
    if let Some(unknown) = fields
        .keys()
        .find(|k| !matches!(k.as_str(), "name" | "admin"))
    {
        return Err(invalid(unknown, "unknown field".into()));
    }
    let name = match fields.get("name") {
        Some(Value::String(name)) => name.clone(),
        _ => return Err(invalid("name", "required, a string".into())),
    };
    berth_api::validate_name(&name).map_err(|message| invalid("name", message))?;
    let admin = match fields.get("admin") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(admin)) => *admin,
        Some(_) => return Err(invalid("admin", "must be true or false".into())),
    };
    let token = crate::auth::new_token();
    let hash = crate::auth::token_hash(&token);
    let store = Arc::clone(&state.store);
    let user = blocking(move || store.add_user(&name, &hash, admin)).await??;
    let mut body = user_value(&user);
    body["token"] = json!(token);
    Ok(json_response(StatusCode::CREATED, &body))
}

fn user_value(user: &User) -> Value {
    json!({
        "apiVersion": berth_api::API_VERSION,
        "kind": "User",
        "name": user.name,
        "admin": user.admin,
        "creationTimestamp": user.created.to_rfc3339(),
    })
}

fn missing(name: &str) -> ApiError {
    ApiError::not_found(format!("user {name:?} not found")).with_object("User", name)
}
