//! The runtime's errors: typed, so the reconciler can tell "not there" from "try again" from
//! "LXD said no".

use std::time::Duration;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RuntimeError {
    /// The named thing (instance, volume, file, image, operation) does not exist; `message` is
    /// LXD's when it gave one.
    #[error("{what}: not found{}", if message.is_empty() { String::new() } else { format!(" ({message})") })]
    NotFound { what: String, message: String },

    /// It already exists or is in a state that forbids the call.
    #[error("{what}: conflict: {message}")]
    Conflict { what: String, message: String },

    /// An async operation ended in failure; `message` is LXD's.
    #[error("{what} failed: {message}")]
    OperationFailed { what: String, message: String },

    /// The operation is gone (finished and expired, or the daemon restarted): its outcome must be
    /// judged by the state of what it acted on.
    #[error("operation {operation} no longer exists; judge its outcome by the instance's state")]
    OperationVanished { operation: String },

    /// Did not finish within its deadline. The side effect may still happen.
    #[error("{what} did not finish within {after:?}")]
    Timeout { what: String, after: Duration },

    /// Could not reach the server or the connection broke mid-call.
    #[error("cannot reach the container runtime ({what}): {message}")]
    Transport { what: String, message: String },

    /// The server refused the request (HTTP 4xx/5xx); `message` is LXD's.
    #[error("{what} rejected ({status}): {message}")]
    Rejected {
        what: String,
        status: u16,
        message: String,
    },

    /// The instance (or volume) is busy with another operation: LXD refuses the call for now,
    /// and the same call succeeds once that operation lets go. Classified by the LXD client
    /// from LXD's message, so nothing else reads LXD's wording.
    #[error("{what}: busy: {message}")]
    Busy { what: String, message: String },

    /// The server answered something that is not LXD's API shape.
    #[error("unexpected response to {what}: {message}")]
    Protocol { what: String, message: String },

    /// The client was configured wrongly (endpoint, certificates, fingerprint).
    #[error("runtime configuration: {0}")]
    Config(String),

    /// More bytes came from the container than the caller's cap: an exec's output (the command
    /// was stopped at the cap, and `partial` holds its output up to it) or a file (not read past
    /// the cap). Never a short answer taken for a whole one.
    #[error("{what}: more than {limit} bytes, the cap; stopped there")]
    TooLarge {
        what: String,
        limit: u64,
        partial: Option<Box<super::ExecOutput>>,
    },
}

impl RuntimeError {
    pub fn is_not_found(&self) -> bool {
        matches!(self, RuntimeError::NotFound { .. })
    }

    /// Worth retrying later without changing anything: the outcome was unknown or the server
    /// was unreachable.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            RuntimeError::Transport { .. }
                | RuntimeError::Timeout { .. }
                | RuntimeError::OperationVanished { .. }
        )
    }

    /// The target was busy with another operation; the call may be made again shortly.
    pub fn is_busy(&self) -> bool {
        matches!(self, RuntimeError::Busy { .. })
    }

    /// A create operation that failed because an instance of that name exists (LXD checks
    /// the name only inside the operation).
    pub fn is_already_exists(&self) -> bool {
        matches!(self, RuntimeError::OperationFailed { message, .. }
            if message.contains("already exists"))
    }

    /// LXD's own message, when the error carries one.
    pub fn lxd_message(&self) -> Option<&str> {
        match self {
            RuntimeError::Conflict { message, .. }
            | RuntimeError::Busy { message, .. }
            | RuntimeError::OperationFailed { message, .. }
            | RuntimeError::Rejected { message, .. } => Some(message),
            RuntimeError::NotFound { message, .. } if !message.is_empty() => Some(message),
            _ => None,
        }
    }
}
