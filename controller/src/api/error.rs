//! API errors as Kubernetes `Status` objects, so kubectl-minded clients read them unchanged.

use hyper::StatusCode;
use serde::Serialize;
use serde_json::{Value, json};

use crate::store::{BatchFailure, StoreError};

/// One problem with one field of a request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Cause {
    pub field: String,
    pub message: String,
}

impl Cause {
    pub fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        Cause {
            field: field.into(),
            message: message.into(),
        }
    }
}

#[derive(Debug, Clone)]
pub struct ApiError {
    pub code: StatusCode,
    /// NotFound, AlreadyExists, Conflict, Invalid, BadRequest, RequestEntityTooLarge, ...
    pub reason: &'static str,
    pub message: String,
    pub kind: Option<String>,
    pub name: Option<String>,
    pub causes: Vec<Cause>,
}

impl ApiError {
    pub fn new(code: StatusCode, reason: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            code,
            reason,
            message: message.into(),
            kind: None,
            name: None,
            causes: Vec::new(),
        }
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "BadRequest", message)
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "NotFound", message)
    }

    pub fn method_not_allowed(method: &hyper::Method, path: &str) -> Self {
        Self::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "MethodNotAllowed",
            format!("{method} is not supported on {path}"),
        )
    }

    pub fn forbidden(message: impl Into<String>) -> Self {
        Self::new(StatusCode::FORBIDDEN, "Forbidden", message)
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "InternalError", message)
    }

    pub fn too_large(limit: usize) -> Self {
        Self::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "RequestEntityTooLarge",
            format!("the request body exceeds the limit of {} MiB", limit >> 20),
        )
    }

    /// 422: the object is not acceptable; every cause names its field.
    pub fn invalid(kind: Option<&str>, name: Option<&str>, causes: Vec<Cause>) -> Self {
        let summary = causes
            .iter()
            .map(|c| {
                if c.field.is_empty() {
                    c.message.clone()
                } else {
                    format!("{}: {}", c.field, c.message)
                }
            })
            .collect::<Vec<_>>()
            .join("; ");
        let subject = match (kind, name) {
            (Some(kind), Some(name)) if !name.is_empty() => format!("{kind} {name:?} is invalid"),
            (Some(kind), _) => format!("{kind} is invalid"),
            _ => "the request is invalid".to_string(),
        };
        ApiError {
            kind: kind.map(str::to_string),
            name: name.filter(|n| !n.is_empty()).map(str::to_string),
            causes,
            ..Self::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "Invalid",
                format!("{subject}: {summary}"),
            )
        }
    }

    pub fn with_object(mut self, kind: &str, name: &str) -> Self {
        self.kind = Some(kind.to_string());
        self.name = Some(name.to_string());
        self
    }

    /// Prefixes every cause's field (and the message) with `items[i].`, for batch requests.
    pub fn in_item(mut self, index: usize) -> Self {
        let prefix = format!("items[{index}]");
        for cause in &mut self.causes {
            cause.field = if cause.field.is_empty() {
                prefix.clone()
            } else {
                format!("{prefix}.{}", cause.field)
            };
        }
        if self.causes.is_empty() {
            self.causes
                .push(Cause::new(prefix.clone(), self.message.clone()));
        }
        self.message = format!("{prefix}: {}", self.message);
        self
    }

    pub fn to_value(&self) -> Value {
        let mut details = serde_json::Map::new();
        if let Some(name) = &self.name {
            details.insert("name".into(), json!(name));
        }
        if let Some(kind) = &self.kind {
            details.insert("kind".into(), json!(kind));
        }
        if !self.causes.is_empty() {
            details.insert("causes".into(), json!(self.causes));
        }
        json!({
            "kind": "Status",
            "apiVersion": "v1",
            "status": "Failure",
            "reason": self.reason,
            "message": self.message,
            "code": self.code.as_u16(),
            "details": details,
        })
    }
}

impl From<StoreError> for ApiError {
    fn from(err: StoreError) -> Self {
        let message = err.to_string();
        match err {
            StoreError::NotFound { kind, name } => {
                ApiError::not_found(message).with_object(&kind, &name)
            }
            StoreError::AlreadyExists { kind, name } => {
                ApiError::new(StatusCode::CONFLICT, "AlreadyExists", message)
                    .with_object(&kind, &name)
            }
            StoreError::Conflict { .. } => ApiError::new(StatusCode::CONFLICT, "Conflict", message),
            StoreError::Invalid { field, message } => {
                ApiError::invalid(None, None, vec![Cause::new(field, message)])
            }
            StoreError::Unwritable(_) | StoreError::Io { .. } => ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "ServiceUnavailable",
                message,
            ),
            StoreError::Sqlite(_)
            | StoreError::Corrupt { .. }
            | StoreError::SchemaTooNew { .. } => ApiError::internal(message),
        }
    }
}

impl From<BatchFailure> for ApiError {
    fn from(failure: BatchFailure) -> Self {
        let error = ApiError::from(failure.error);
        match failure.index {
            Some(index) => error.in_item(index),
            None => error,
        }
    }
}
