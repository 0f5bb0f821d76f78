//! Shapes of the HTTP API that are not objects: lists, errors and watch events.

use serde::{Deserialize, Serialize};

use crate::error::{FieldError, ValidationErrors};
use crate::meta::API_VERSION;
use crate::object::{Kind, Object};

/// `{apiVersion, kind: ProjectList, items: [...]}`; `kind: List` when it mixes kinds (the body of
/// the apply endpoint).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ObjectList {
    #[serde(default)]
    pub api_version: String,
    #[serde(default)]
    pub kind: String,
    #[serde(default, skip_serializing_if = "ListMeta::is_empty")]
    pub metadata: ListMeta,
    #[serde(default)]
    pub items: Vec<Object>,
}

/// Metadata of a list: the store's resourceVersion when it was read, for watching from there.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ListMeta {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource_version: Option<String>,
}

impl ListMeta {
    pub fn is_empty(&self) -> bool {
        self.resource_version.is_none()
    }
}

impl ObjectList {
    /// A list of objects of one kind.
    pub fn of(kind: Kind, items: Vec<Object>) -> Self {
        ObjectList {
            api_version: API_VERSION.to_string(),
            kind: kind.list_kind().to_string(),
            metadata: ListMeta::default(),
            items,
        }
    }

    /// A list of objects of any kinds.
    pub fn mixed(items: Vec<Object>) -> Self {
        ObjectList {
            api_version: API_VERSION.to_string(),
            kind: "List".to_string(),
            metadata: ListMeta::default(),
            items,
        }
    }
}

/// The Kubernetes `Status` object every API error is returned as.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ApiStatus {
    #[serde(default)]
    pub api_version: String,
    #[serde(default)]
    pub kind: String,
    /// `Failure` (or `Success`).
    #[serde(default)]
    pub status: String,
    /// Machine-readable cause: `NotFound`, `AlreadyExists`, `Conflict`, `Invalid`,
    /// `BadRequest`, `Forbidden`, `Unauthorized`, `RequestEntityTooLarge`, ...
    #[serde(default)]
    pub reason: String,
    #[serde(default)]
    pub message: String,
    #[serde(default)]
    pub code: u16,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub details: Option<StatusDetails>,
}

/// What a `Status` is about, and its field errors.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StatusDetails {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub kind: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub causes: Vec<FieldError>,
}

impl ApiStatus {
    pub fn failure(code: u16, reason: impl Into<String>, message: impl Into<String>) -> Self {
        ApiStatus {
            api_version: "v1".to_string(),
            kind: "Status".to_string(),
            status: "Failure".to_string(),
            reason: reason.into(),
            message: message.into(),
            code,
            details: None,
        }
    }

    /// 422 `Invalid` for an object that failed validation, every cause listed.
    pub fn invalid(kind: Kind, name: &str, errors: &ValidationErrors) -> Self {
        let subject = if name.is_empty() {
            kind.as_str().to_string()
        } else {
            format!("{} {name:?}", kind.as_str())
        };
        ApiStatus {
            details: Some(StatusDetails {
                name: name.to_string(),
                kind: kind.plural().to_string(),
                causes: errors.causes.clone(),
            }),
            ..ApiStatus::failure(422, "Invalid", format!("{subject} is invalid: {errors}"))
        }
    }

    /// The field errors carried, if any.
    pub fn causes(&self) -> &[FieldError] {
        self.details
            .as_ref()
            .map(|d| d.causes.as_slice())
            .unwrap_or(&[])
    }
}

impl std::fmt::Display for ApiStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for ApiStatus {}

/// One line of a `?watch=true` stream.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WatchEvent {
    #[serde(rename = "type")]
    pub type_: WatchEventType,
    pub object: Object,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum WatchEventType {
    Added,
    Modified,
    Deleted,
}
