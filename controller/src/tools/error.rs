//! Why a tool call failed, in the tools' own terms. The API answers each [`Reason`] with its
//! status code and reason (`api::tools`); an execution's record keeps the typed failure, so a
//! repeated id is answered as the first call was.

use serde::{Deserialize, Serialize};

use crate::store::StoreError;

/// A failed tool call: what kind of failure, and a one-line message for the caller.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("{message}")]
pub struct ToolError {
    pub reason: Reason,
    pub message: String,
}

/// The kinds of failure the tools protocol (`berth.dev/tools/v1`) names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Reason {
    /// The request is malformed: not JSON, a missing or mistyped field.
    BadRequest,
    /// A tool, argument or feature berth does not offer (or the image lacks).
    Unsupported,
    /// A path outside `/workspace`.
    OutsideWorkspace,
    NotFound,
    /// The execution is running, or the file changed under an Edit.
    Conflict,
    AlreadyExists,
    Invalid,
    Cancelled,
    Timeout,
    /// A mutating execution started but its outcome was lost: never run again.
    OutcomeUnknown,
    /// The declared shell is not the container's.
    ShellMismatch,
    /// The container cannot take the call (absent, stopped, LXD not answering).
    Unreachable,
    /// A container of the project's name that is not the project's.
    NameConflict,
    /// The project under the name is not the one the caller resolved (`?uid=`).
    ProjectReplaced,
    /// The store cannot be written now.
    Unavailable,
    Internal,
}

impl ToolError {
    pub fn new(reason: Reason, message: impl Into<String>) -> Self {
        ToolError {
            reason,
            message: message.into(),
        }
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(Reason::BadRequest, message)
    }

    pub fn unsupported(message: impl Into<String>) -> Self {
        Self::new(Reason::Unsupported, message)
    }

    pub fn outside(message: impl Into<String>) -> Self {
        Self::new(Reason::OutsideWorkspace, message)
    }

    pub fn unreachable(message: impl Into<String>) -> Self {
        Self::new(Reason::Unreachable, message)
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(Reason::Internal, message)
    }

    pub fn cancelled(id: &str) -> Self {
        Self::new(Reason::Cancelled, format!("execution {id:?} was cancelled"))
    }
}

impl From<StoreError> for ToolError {
    fn from(err: StoreError) -> Self {
        let reason = match &err {
            StoreError::NotFound { .. } => Reason::NotFound,
            StoreError::AlreadyExists { .. } => Reason::AlreadyExists,
            StoreError::Moved { .. } | StoreError::Conflict { .. } => Reason::Conflict,
            StoreError::Invalid { .. } => Reason::Invalid,
            StoreError::Unwritable(_) | StoreError::Io { .. } => Reason::Unavailable,
            StoreError::Sqlite(_)
            | StoreError::Corrupt { .. }
            | StoreError::SchemaTooNew { .. } => Reason::Internal,
        };
        ToolError::new(reason, err.to_string())
    }
}

impl From<crate::inspect::reach::Unreached> for ToolError {
    /// A foreign container is a name conflict; an absent one, or LXD not saying, unreachable.
    fn from(unreached: crate::inspect::reach::Unreached) -> Self {
        use crate::inspect::reach::Unreached;
        match unreached {
            foreign @ Unreached::Foreign(_) => {
                ToolError::new(Reason::NameConflict, foreign.to_string())
            }
            Unreached::Absent(name) => {
                ToolError::unreachable(format!("the container {name:?} does not exist"))
            }
            err @ Unreached::Runtime { .. } => ToolError::unreachable(err.to_string()),
        }
    }
}
