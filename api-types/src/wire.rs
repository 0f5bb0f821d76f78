//! Shapes of the HTTP API that are not objects: lists, the apply result, the trash list, the
//! reaper's plan, `berth exec`'s call and answer, errors and watch events.
//!
//! `API_PREFIX`; lists (`ObjectList`) and watch events (`WatchEvent`), generic over their items
//! (stored objects, JSON values); the apply endpoint's `ApplyResult`; the trash's `TrashList`; the
//! reaper's `PlanEntry`; `berth exec`'s `ExecCall` and `ExecResult` and its interactive session's
//! `ExecControl` and `ExecEnd`; a workspace tool call's `ToolCallBody`; Kubernetes `Status`
//! errors (`ApiStatus`, read back from any body by `ApiStatus::from_body`). The server writes and
//! the client reads these very types.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::error::{FieldError, ValidationErrors};
use crate::meta::API_VERSION;
use crate::object::{Kind, Object};
use crate::project::{ProtectionReason, ReapAction};

/// The largest body of one object the API reads: create, replace, patch, status.
pub const OBJECT_LIMIT: usize = 3 << 20;
/// The largest `List` the apply endpoint reads; a client refuses to send a larger one. Room
/// for 100,000 manifests of about 600 bytes: the server decodes a `List` an item at a time.
pub const APPLY_LIMIT: usize = 64 << 20;
/// The most items one `List` sent to the apply endpoint may hold: a fleet of 100,000 projects
/// is applied in one call.
pub const APPLY_ITEMS: usize = 100_000;

/// The version of the workspace tools protocol (`.../tools/...` requests and answers).
pub const TOOLS_PROTOCOL_VERSION: &str = "berth.dev/tools/v1";

/// Where every berth object lives on the server: `/apis/` and the [`API_VERSION`].
pub const API_PREFIX: &str = "/apis/berth.dev/v1alpha1";

/// `{apiVersion, kind: ProjectList, items: [...]}`; `kind: List` when it mixes kinds (the body of
/// the apply endpoint).
/// Typed items by default; the server lists its stored objects as they are, the client reads
/// them as JSON values.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ObjectList<T = Object> {
    #[serde(default)]
    pub api_version: String,
    #[serde(default)]
    pub kind: String,
    #[serde(default, skip_serializing_if = "ListMeta::is_empty")]
    pub metadata: ListMeta,
    #[serde(default = "Vec::new")]
    pub items: Vec<T>,
}

/// The answer of the apply endpoint: `{apiVersion, kind: ApplyResult, items: [...]}`, one item
/// per object written (in the order sent) and one per object pruned. The server writes its
/// stored objects into it; the client reads them as JSON values.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(
    rename_all = "camelCase",
    bound(deserialize = "T: Deserialize<'de> + Default")
)]
pub struct ApplyResult<T = serde_json::Value> {
    #[serde(default)]
    pub api_version: String,
    #[serde(default)]
    pub kind: String,
    #[serde(default = "Vec::new")]
    pub items: Vec<ApplyItem<T>>,
}

impl<T> ApplyResult<T> {
    pub const KIND: &'static str = "ApplyResult";

    pub fn new(items: Vec<ApplyItem<T>>) -> Self {
        ApplyResult {
            api_version: crate::API_VERSION.to_string(),
            kind: Self::KIND.to_string(),
            items,
        }
    }
}

/// What the apply did with one object: `created`, `configured`, `unchanged` or `pruned`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ApplyItem<T = serde_json::Value> {
    pub kind: String,
    pub name: String,
    pub action: String,
    #[serde(default)]
    pub object: T,
}

/// One entry as the API answers it (`TrashList.items`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TrashItem {
    pub uid: String,
    pub name: String,
    /// `project` (a deleted project's volumes), `container` (a replaced or deleted project's
    /// container) or `files` (a copy of a workspace taken before a forced checkout).
    #[serde(default)]
    pub kind: String,
    /// The store id of the controller whose trash holds it.
    #[serde(default)]
    pub controller: String,
    pub deleted_at: Option<DateTime<Utc>>,
    /// When the trash received the entry; it expires a retention later.
    pub trashed_at: Option<DateTime<Utc>>,
    pub deleted_by: String,
    pub reason: String,
    pub expires_at: Option<DateTime<Utc>>,
    pub bytes: u64,
}

/// `GET /apis/berth.dev/v1alpha1/trash`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TrashList {
    pub api_version: String,
    pub kind: String,
    pub items: Vec<TrashItem>,
    /// Why the purge is paused, while it is (the wall clock disagrees with the time elapsed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub purge_paused: Option<String>,
}

/// One image's warm pool (`PoolList.items`): members booted and ready to claim, how many the
/// configuration wants, how many projects claimed one since the daemon started, and why the
/// refill makes no member while it is held (`disk`: the storage pool would keep less free
/// than its reserve).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PoolEntry {
    pub image: String,
    pub ready: u64,
    pub wanted: u64,
    pub claims: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held: Option<String>,
}

/// `GET /apis/berth.dev/v1alpha1/pool`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PoolList {
    pub api_version: String,
    pub kind: String,
    pub items: Vec<PoolEntry>,
}

/// One row of the reaper's plan (`GET /apis/berth.dev/v1alpha1/reap`, `berth reap --dry-run`):
/// what it would do to a project next, as recorded by the last reap pass.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PlanEntry {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_action: Option<ReapAction>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_action_at: Option<DateTime<Utc>>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub protected_by: Vec<ProtectionReason>,
    /// Why, in words.
    #[serde(default)]
    pub reason: String,
}

/// The body of `POST .../projects/NAME/exec`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ExecCall {
    pub command: Vec<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub environment: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_seconds: Option<u64>,
}

/// The answer: the command ran (whatever its exit code), or printed past the server's output limit and
/// was stopped there (`outputCutAt`; the exit code is then the stopped command's).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ExecResult {
    pub exit_code: i32,
    pub stdout: String,
    pub stderr: String,
    /// Present when the output passed this many bytes: the command was stopped and the output
    /// is what came before.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_cut_at: Option<u64>,
}

/// The body of a workspace tool call, `POST .../projects/NAME/tools/TOOL`: what `berth mcp`
/// (or an agent running elsewhere) sends and the API reads. Absent and `null` fields alike take
/// their defaults; any other field is refused.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ToolCallBody {
    /// The caller's id of this execution: a retry with the same id is answered, not run again.
    pub execution_id: String,
    /// `/workspace` (the default) or a directory inside it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workspace_path: Option<String>,
    /// The tool's arguments, as its schema names them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arguments: Option<serde_json::Map<String, serde_json::Value>>,
    /// How long the call may run, in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    /// The caller's shell, which Bash's answer names.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shell: Option<ToolShell>,
}

/// The shell a tool caller runs, `{name, version}`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolShell {
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub version: Option<String>,
}

/// `berth exec -i/-t`'s websocket, client to daemon: a text message controlling the session
/// (binary messages are stdin). `{"resize":{"width":W,"height":H}}` or `{"eof":true}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExecControl {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resize: Option<ExecTerminalSize>,
    /// Stdin ended.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub eof: bool,
}

/// A terminal's size in characters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExecTerminalSize {
    pub width: u16,
    pub height: u16,
}

/// `berth exec -i/-t`'s websocket, daemon to client: the last text message before the close,
/// `{"exitCode":N}` or `{"error":"..."}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ExecEnd {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl ExecEnd {
    pub fn exited(code: i32) -> ExecEnd {
        ExecEnd {
            exit_code: Some(code),
            error: None,
        }
    }

    pub fn failed(error: impl Into<String>) -> ExecEnd {
        ExecEnd {
            exit_code: None,
            error: Some(error.into()),
        }
    }
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
    /// For 413: the most the request (or one object in it) may hold, in bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit_bytes: Option<u32>,
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
                limit_bytes: None,
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

    /// Reads the body of a failed response as the `Status` it should be; a body that is not
    /// one (a proxy's page, nothing at all) still yields a status with a useful message.
    pub fn from_body(code: u16, body: &[u8]) -> ApiStatus {
        match serde_json::from_slice::<ApiStatus>(body) {
            Ok(status) if !status.message.is_empty() || !status.reason.is_empty() => ApiStatus {
                code,
                reason: if status.reason.is_empty() {
                    default_reason(code).to_string()
                } else {
                    status.reason
                },
                ..status
            },
            _ => {
                let text = String::from_utf8_lossy(body);
                let text = text.trim();
                let message = if text.is_empty() {
                    format!("the server answered {code}")
                } else {
                    text.lines().next().unwrap_or(text).to_string()
                };
                ApiStatus::failure(code, default_reason(code), message)
            }
        }
    }

    pub fn is_not_found(&self) -> bool {
        self.code == 404
    }

    pub fn is_already_exists(&self) -> bool {
        self.reason == "AlreadyExists"
    }

    /// The message without the causes it repeats (`List is invalid: a: x; b: y` → `List is
    /// invalid`), since each cause gets a line of its own.
    pub fn headline(&self) -> &str {
        let joined = self
            .causes()
            .iter()
            .map(FieldError::to_string)
            .collect::<Vec<_>>()
            .join("; ");
        if joined.is_empty() {
            return &self.message;
        }
        match self.message.strip_suffix(&joined) {
            Some(head) if !head.trim_end_matches([':', ' ']).is_empty() => {
                head.trim_end_matches([':', ' '])
            }
            _ => &self.message,
        }
    }
}

/// The reason a status code stands for when the body did not say.
fn default_reason(code: u16) -> &'static str {
    match code {
        400 => "BadRequest",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "NotFound",
        409 => "Conflict",
        413 => "RequestEntityTooLarge",
        422 => "Invalid",
        500 => "InternalError",
        503 => "ServiceUnavailable",
        _ => "Unknown",
    }
}

impl std::fmt::Display for ApiStatus {
    /// `Error from server (Reason): message`, then one line per cause the message does not
    /// already carry, as kubectl prints it.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let headline = self.headline();
        write!(f, "Error from server ({}): {headline}", self.reason)?;
        for cause in self.causes() {
            let line = cause.to_string();
            if !line.is_empty() && !headline.contains(&line) {
                write!(f, "\n  {line}")?;
            }
        }
        Ok(())
    }
}

impl std::error::Error for ApiStatus {}

/// One line of a `?watch=true` stream: an object (typed by default), or for `ERROR` the
/// `Status` that ended the watch.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WatchEvent<T = Object> {
    #[serde(rename = "type")]
    pub type_: WatchEventType,
    pub object: T,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum WatchEventType {
    Added,
    Modified,
    Deleted,
    /// The watch ended (it fell behind); the object is a `Status`.
    Error,
}
