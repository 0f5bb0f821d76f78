//! The one way to wake an idled project without touching its spec: `berth.dev/wokenAt`, set to
//! a time later than the idling, which the reconciler reads as "start it again" (see
//! [`super::status::idling`]). A tool call, a preview request and a scheduled brief all wake
//! through [`request_wake`]; `berth start` sends the same annotation as a patch.

use berth_api::Kind;
use berth_api::annotations::WOKEN_AT;
use chrono::SecondsFormat;

use crate::store::{Commit, Desired, EventType, Store, StoreError};

/// Attempts at writing the annotation while other writers move the resourceVersion.
const WRITE_ATTEMPTS: usize = 5;

/// Why a wake was not written.
#[derive(Debug, thiserror::Error)]
pub enum WakeError {
    #[error("project {0:?} was deleted")]
    Gone(String),
    #[error("project {0:?} is idled and waking it kept conflicting with other writes")]
    Contended(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Sets `berth.dev/wokenAt` on project `name` (while it is still the one of `uid`) to now and
/// records a `WakeRequested` event saying `by` woke it. Blocking: call it from a store thread.
pub fn request_wake(store: &Store, name: &str, uid: &str, by: &str) -> Result<(), WakeError> {
    // The daemon's clock, which the reaper's idling was recorded by.
    let at = crate::clock::now().to_rfc3339_opts(SecondsFormat::Secs, true);
    let message = format!("{by} woke the idled project");
    for _ in 0..WRITE_ATTEMPTS {
        let Some(current) = store.get(Kind::Project, name).filter(|o| o.uid() == uid) else {
            return Err(WakeError::Gone(name.to_string()));
        };
        let mut annotations = current.metadata.annotations.clone();
        annotations.insert(WOKEN_AT.to_string(), at.clone());
        let desired = Desired {
            kind: Kind::Project,
            name: name.to_string(),
            labels: current.metadata.labels.clone(),
            annotations,
            finalizers: None,
            spec: current.spec.value(),
        };
        match store.replace(desired, Some(current.resource_version()), Commit::Persist) {
            Ok((object, _)) => {
                store.record_or_warn(&object, EventType::Normal, "WakeRequested", &message);
                return Ok(());
            }
            Err(StoreError::Conflict { .. }) => continue,
            Err(err) => return Err(WakeError::Store(err)),
        }
    }
    Err(WakeError::Contended(name.to_string()))
}
