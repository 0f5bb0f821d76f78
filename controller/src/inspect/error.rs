//! Why looking into a project's container failed, in inspection's own terms; the API answers
//! each case with its status code and reason.

use crate::runtime::RuntimeError;

use super::reach::Unreached;

#[derive(Debug, thiserror::Error)]
pub enum InspectError {
    /// berth has no connection to LXD: not yet, or the daemon is paused.
    #[error("berth is not connected to LXD")]
    NotConnected,
    /// The container is not the project's, or not there, or LXD did not say.
    #[error(transparent)]
    Unreached(#[from] Unreached),
    /// LXD failed a call on the project's container `name`.
    #[error("{name}: {source}")]
    Runtime {
        name: String,
        #[source]
        source: RuntimeError,
    },
}

impl InspectError {
    pub fn runtime(name: &str, source: RuntimeError) -> Self {
        InspectError::Runtime {
            name: name.to_string(),
            source,
        }
    }
}
