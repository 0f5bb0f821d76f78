//! API errors as Kubernetes `Status` objects, so kubectl-minded clients read them unchanged.

use berth_api::wire::{ApiStatus, StatusDetails};
use hyper::StatusCode;
use serde_json::Value;

use crate::store::{BatchFailure, StoreError};

/// One problem with one field of a request: `details.causes` of the wire `Status`.
pub use berth_api::FieldError as Cause;

/// The most causes one error lists: a batch of thousands of bad items is answered with the
/// first few and a count, not with a cause per item.
pub const MAX_CAUSES: usize = 20;

/// The first [`MAX_CAUSES`] causes and, when there were more, one saying how many.
pub fn bounded(mut causes: Vec<Cause>) -> Vec<Cause> {
    if causes.len() > MAX_CAUSES {
        let more = causes.len() - MAX_CAUSES;
        causes.truncate(MAX_CAUSES);
        causes.push(Cause::new("", format!("and {more} more")));
    }
    causes
}

/// The causes as one line, for an error's message.
pub fn summary(causes: &[Cause]) -> String {
    causes
        .iter()
        .map(Cause::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Subject {
    pub kind: String,
    pub name: Option<String>,
}

#[derive(Debug, Clone)]
pub struct ApiError {
    pub code: StatusCode,
    /// NotFound, AlreadyExists, Conflict, Invalid, BadRequest, RequestEntityTooLarge, ...
    pub reason: &'static str,
    pub message: String,
    /// The kind, and object, the error is about (`details.kind`, `details.name`); boxed, as
    /// errors travel in every `Result` of the API.
    pub subject: Option<Box<Subject>>,
    pub causes: Vec<Cause>,
    /// For 413: the most the request (or one object in it) may hold, in bytes.
    pub limit_bytes: Option<u32>,
}

impl ApiError {
    pub fn new(code: StatusCode, reason: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            code,
            reason,
            message: message.into(),
            subject: None,
            causes: Vec::new(),
            limit_bytes: None,
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
        Self::too_large_because(
            limit,
            format!("the request body exceeds the limit of {} MiB", limit >> 20),
        )
    }

    /// 413 with its own message, e.g. for one object of a batch.
    pub fn too_large_because(limit: usize, message: impl Into<String>) -> Self {
        ApiError {
            limit_bytes: u32::try_from(limit).ok(),
            ..Self::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "RequestEntityTooLarge",
                message,
            )
        }
    }

    /// 422: the object is not acceptable; every cause names its field. At most
    /// [`MAX_CAUSES`] are listed, then how many more there were.
    pub fn invalid(kind: Option<&str>, name: Option<&str>, causes: Vec<Cause>) -> Self {
        let causes = bounded(causes);
        let summary = summary(&causes);
        let subject = match (kind, name) {
            (Some(kind), Some(name)) if !name.is_empty() => format!("{kind} {name:?} is invalid"),
            (Some(kind), _) => format!("{kind} is invalid"),
            _ => "the request is invalid".to_string(),
        };
        let error = ApiError {
            causes,
            ..Self::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "Invalid",
                format!("{subject}: {summary}"),
            )
        };
        match kind {
            Some(kind) => error.with_object(kind, name.unwrap_or_default()),
            None => error,
        }
    }

    /// `kind`: a stored object's `Kind`, or another thing an API names ("User", "Secret").
    pub fn with_object(mut self, kind: impl std::fmt::Display, name: &str) -> Self {
        let kind = kind.to_string();
        self.subject = (!kind.is_empty()).then(|| {
            Box::new(Subject {
                kind,
                name: (!name.is_empty()).then(|| name.to_string()),
            })
        });
        self
    }

    /// Names the kind (and the object, when known) a request was about, unless already named.
    pub fn about(self, kind: &str, name: Option<&str>) -> Self {
        if self.subject.is_some() {
            return self;
        }
        self.with_object(kind, name.unwrap_or_default())
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

    /// The wire `Status` this error is answered with.
    pub fn to_status(&self) -> ApiStatus {
        ApiStatus {
            details: Some(StatusDetails {
                name: self
                    .subject
                    .as_ref()
                    .and_then(|s| s.name.clone())
                    .unwrap_or_default(),
                kind: self
                    .subject
                    .as_ref()
                    .map(|s| s.kind.clone())
                    .unwrap_or_default(),
                causes: self.causes.clone(),
                limit_bytes: self.limit_bytes,
            }),
            ..ApiStatus::failure(self.code.as_u16(), self.reason, self.message.clone())
        }
    }

    pub fn to_value(&self) -> Value {
        serde_json::to_value(self.to_status()).unwrap_or_default()
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
            StoreError::Moved { kind, name } => {
                ApiError::new(StatusCode::CONFLICT, "Conflict", message).with_object(&kind, &name)
            }
            StoreError::Conflict { kind, name, .. } => {
                ApiError::new(StatusCode::CONFLICT, "Conflict", message).with_object(&kind, &name)
            }
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
