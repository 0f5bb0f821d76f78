//! Metadata shared by every kind, and the condition type every status carries.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use schemars::JsonSchema;
use serde::{Deserialize, Deserializer, Serialize};

use crate::quantity::scalar::{self, Bare};

/// The API group and version of every berth object.
pub const API_VERSION: &str = "berth.dev/v1alpha1";

/// The finalizer the controller puts on every project: its container and volumes go (into the
/// trash) before the object does.
pub const TEARDOWN_FINALIZER: &str = "berth.dev/teardown";

/// Object metadata, as Kubernetes shapes it. `name`, `labels` and `annotations` are written by
/// users; everything else is set by the server and ignored when a manifest is applied.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ObjectMeta {
    /// Lower-case letters, digits and '-'; a project's name is also its LXD instance name.
    #[serde(default)]
    #[schemars(pattern(r"^[a-z]([a-z0-9-]{0,61}[a-z0-9])?$"))]
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation: Option<i64>,
    /// Moves on every write; a write that names a stale value is refused with 409.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource_version: Option<String>,
    #[serde(
        default,
        skip_serializing_if = "BTreeMap::is_empty",
        deserialize_with = "string_values"
    )]
    pub labels: BTreeMap<String, String>,
    #[serde(
        default,
        skip_serializing_if = "BTreeMap::is_empty",
        deserialize_with = "string_values"
    )]
    pub annotations: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub creation_timestamp: Option<DateTime<Utc>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deletion_timestamp: Option<DateTime<Utc>>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub finalizers: Vec<String>,
}

/// Label and annotation values are strings, as in Kubernetes: `x: 1` or `y: true` is refused,
/// not stored as text, since YAML has already turned what was typed (`1.10`, `yes`) into a
/// number or boolean whose text may differ.
fn string_values<'de, D: Deserializer<'de>>(d: D) -> Result<BTreeMap<String, String>, D::Error> {
    scalar::string_map(d, Bare::Refuse)
}

/// `"True"`, `"False"` or `"Unknown"`, as in Kubernetes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum ConditionStatus {
    True,
    False,
    Unknown,
}

impl ConditionStatus {
    pub fn from_bool(value: bool) -> Self {
        if value {
            ConditionStatus::True
        } else {
            ConditionStatus::False
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            ConditionStatus::True => "True",
            ConditionStatus::False => "False",
            ConditionStatus::Unknown => "Unknown",
        }
    }
}

/// One observed aspect of an object. `last_transition_time` moves only when `status` changes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    #[serde(rename = "type")]
    pub type_: String,
    pub status: ConditionStatus,
    #[serde(default)]
    pub reason: String,
    #[serde(default)]
    pub message: String,
    pub last_transition_time: DateTime<Utc>,
    #[serde(default)]
    pub observed_generation: i64,
}
