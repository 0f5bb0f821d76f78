//! `/projects/NAME/secrets[/KEY]`: set, list (keys and update times), read one value, delete.
//! Only members and admins reach here. A value travels in exactly two places: the body of a PUT
//! and the body of a GET of that one key; never a listing, a log line or an error message.
//!
//! `/gitsources/NAME/secrets[/KEY]`: a GitSource's credentials (`username`, `password`,
//! `token`), for admins: set, list and delete. Their values go to git and nowhere else, not even
//! back to an admin.

use std::sync::Arc;

use berth_api::Kind;
use hyper::body::Incoming;
use hyper::{Method, Request, StatusCode};
use serde_json::{Value, json};

use super::access;
use super::body;
use super::error::{ApiError, Cause};
use super::routes::{Outcome, blocking, json_response, success};
use super::{ApiState, Caller};
use crate::secrets::{MAX_VALUE_BYTES, Secrets, SecretsError};
use crate::store::{EventType, StoredObject};

pub(super) async fn route(
    state: &Arc<ApiState>,
    caller: &Caller,
    method: &Method,
    project: &str,
    key: Option<&str>,
    req: Request<Incoming>,
) -> Outcome {
    let project = access::member_project(state, caller, project)?;
    let uid = project.uid().to_string();
    let name = project.name().to_string();
    let secrets = Arc::clone(&state.secrets);
    let holder = Holder {
        object: &project,
        field: "project",
        kind: "project",
        noun: "secret",
    };
    match (key, method) {
        (None, &Method::GET) => {
            let revision = secrets.revision(&uid).map_err(from_secrets)?;
            holder.key_list(
                &secrets,
                json!({"project": name, "revision": revision.to_string()}),
            )
        }
        (Some(key), &Method::GET) => {
            let value = secrets
                .get(&uid, key)
                .map_err(from_secrets)?
                .ok_or_else(|| holder.missing(key))?;
            Ok(json_response(
                StatusCode::OK,
                &json!({
                    "apiVersion": berth_api::API_VERSION,
                    "kind": "SecretValue",
                    "project": name,
                    "key": key,
                    "value": value,
                }),
            ))
        }
        (Some(key), &Method::PUT) => {
            berth_api::validate_env_key(key).map_err(|message| {
                ApiError::invalid(Some("Secret"), Some(key), vec![Cause::new("key", message)])
            })?;
            holder.set(state, caller, key, req).await
        }
        (Some(key), &Method::DELETE) => holder.delete(state, caller, key).await,
        (None, _) | (Some(_), _) => Err(ApiError::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "MethodNotAllowed",
            format!("{method} is not supported on the secrets of project {name:?}"),
        )),
    }
}

pub(super) async fn gitsource_route(
    state: &Arc<ApiState>,
    caller: &Caller,
    method: &Method,
    name: &str,
    key: Option<&str>,
    req: Request<Incoming>,
) -> Outcome {
    const KIND: Kind = Kind::GitSource;
    access::require_admin(caller, "read or write GitSource credentials")?;
    let gitsource = state.store.get(KIND, name).ok_or_else(|| {
        ApiError::not_found(format!("{KIND} {name:?} not found")).with_object(KIND, name)
    })?;
    let secrets = Arc::clone(&state.secrets);
    let holder = Holder {
        object: &gitsource,
        field: "gitSource",
        kind: "GitSource",
        noun: "credential",
    };
    match (key, method) {
        (None, &Method::GET) => holder.key_list(&secrets, json!({"gitSource": name})),
        (Some(key), &Method::PUT) => {
            if !berth_api::gitsource::CREDENTIAL_KEYS.contains(&key) {
                return Err(ApiError::invalid(
                    Some("Secret"),
                    Some(key),
                    vec![Cause::new(
                        "key",
                        format!(
                            "{key:?}: a GitSource holds only {}",
                            berth_api::gitsource::CREDENTIAL_KEYS.join(", ")
                        ),
                    )],
                ));
            }
            // The credentials are bound to the host they are set for: recorded first, so a
            // credential is never held without its host.
            let url = gitsource.spec.get_str("url").unwrap_or_default();
            let host = berth_api::gitsource::credential_host(&url).unwrap_or_default();
            let (store, uid) = (Arc::clone(&secrets), gitsource.uid().to_string());
            blocking(move || {
                store.set(&uid, berth_api::gitsource::CREDENTIAL_HOST, host.as_bytes())
            })
            .await?
            .map_err(from_secrets)?;
            holder.set(state, caller, key, req).await
        }
        (Some(key), &Method::DELETE) => holder.delete(state, caller, key).await,
        _ => Err(ApiError::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "MethodNotAllowed",
            format!(
                "{method} is not supported on the credentials of GitSource {name:?} \
                 (they are set, listed and deleted, never read back)"
            ),
        )),
    }
}

/// An event on the project (or GitSource) naming the key and who changed it: never the value.
async fn audit(
    state: &ApiState,
    project: &Arc<StoredObject>,
    reason: &'static str,
    message: String,
) {
    // The secret is written; a failure leaves only its trace missing (and is logged).
    state
        .store
        .publish_event(project, EventType::Normal, reason, &message)
        .await;
}

/// The value: `{"value": "..."}` for a JSON body, the raw bytes otherwise (what
/// `berth secret set` sends from stdin or a file).
async fn read_value(req: Request<Incoming>) -> Result<Vec<u8>, ApiError> {
    let media = body::media_type(req.headers());
    let (parts, incoming) = req.into_parts();
    let bytes = body::read(incoming, &parts.headers, MAX_VALUE_BYTES + 4096).await?;
    match media.as_deref() {
        Some(m) if m.ends_with("json") => {
            let value: Value = serde_json::from_slice(&bytes).map_err(|_| {
                ApiError::bad_request("the body is not JSON like {\"value\": \"...\"}")
            })?;
            match value.get("value") {
                Some(Value::String(text)) => Ok(text.clone().into_bytes()),
                _ => Err(ApiError::invalid(
                    Some("Secret"),
                    None,
                    vec![Cause::new("value", "required, a string")],
                )),
            }
        }
        _ => Ok(bytes.to_vec()),
    }
}

/// What holds the secrets a request is about: a project, or a GitSource (its credentials).
struct Holder<'a> {
    object: &'a Arc<StoredObject>,
    /// The field naming it in a reply (`project`, `gitSource`).
    field: &'static str,
    /// How messages name its kind, and one of its values.
    kind: &'static str,
    noun: &'static str,
}

impl Holder<'_> {
    /// `SecretKeyList`: every key it holds and when it last changed, never a value;
    /// `metadata` names the holder.
    fn key_list(&self, secrets: &Secrets, metadata: Value) -> Outcome {
        let items: Vec<Value> = secrets
            .list(self.object.uid())
            .map_err(from_secrets)?
            .into_iter()
            .map(|e| json!({"key": e.key, "updateTime": e.updated.to_rfc3339()}))
            .collect();
        Ok(json_response(
            StatusCode::OK,
            &json!({
                "apiVersion": berth_api::API_VERSION,
                "kind": "SecretKeyList",
                "metadata": metadata,
                "items": items,
            }),
        ))
    }

    fn missing(&self, key: &str) -> ApiError {
        let (kind, name, noun) = (self.kind, self.object.name(), self.noun);
        ApiError::not_found(format!("{kind} {name:?} has no {noun} {key:?}"))
    }

    /// Sets `key` to the request's body and records who did (never the value).
    async fn set(
        &self,
        state: &ApiState,
        caller: &Caller,
        key: &str,
        req: Request<Incoming>,
    ) -> Outcome {
        let value = read_value(req).await?;
        let (secrets, uid, key_owned) = (
            Arc::clone(&state.secrets),
            self.object.uid().to_string(),
            key.to_string(),
        );
        let revision = blocking(move || secrets.set(&uid, &key_owned, &value))
            .await?
            .map_err(from_secrets)?;
        let message = format!("{} {key} set by {}", self.noun, caller.identity);
        audit(state, self.object, "SecretSet", message).await;
        let mut reply = json!({
            "apiVersion": berth_api::API_VERSION,
            "kind": "SecretKey",
            "key": key,
            "revision": revision.to_string(),
        });
        reply[self.field] = json!(self.object.name());
        Ok(json_response(StatusCode::OK, &reply))
    }

    /// Deletes `key` and records who did.
    async fn delete(&self, state: &ApiState, caller: &Caller, key: &str) -> Outcome {
        let (secrets, uid, key_owned) = (
            Arc::clone(&state.secrets),
            self.object.uid().to_string(),
            key.to_string(),
        );
        let deleted = blocking(move || secrets.delete(&uid, &key_owned))
            .await?
            .map_err(from_secrets)?;
        if !deleted {
            return Err(self.missing(key));
        }
        let message = format!("{} {key} deleted by {}", self.noun, caller.identity);
        audit(state, self.object, "SecretDeleted", message).await;
        let (kind, name, noun) = (self.kind, self.object.name(), self.noun);
        Ok(success(format!(
            "{noun} {key:?} of {kind} {name:?} deleted"
        )))
    }
}

fn from_secrets(err: SecretsError) -> ApiError {
    match err {
        SecretsError::InvalidKey(message) => {
            ApiError::invalid(Some("Secret"), None, vec![Cause::new("key", message)])
        }
        SecretsError::InvalidValue(message) => {
            ApiError::invalid(Some("Secret"), None, vec![Cause::new("value", message)])
        }
        SecretsError::Store(err) => err.into(),
        other => ApiError::internal(other.to_string()),
    }
}
