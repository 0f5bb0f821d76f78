//! The store from async code: blocking calls moved off the async workers, and the one event
//! recorder (an event that cannot be recorded is logged, never a failure of what it reports).
//!
//! `Store::call` and `store::blocking` run store work off the async workers; the recorder is
//! `record_or_warn` (sync callers) and `publish_event` (async).

use std::sync::Arc;

use super::{EventType, Store, StoredObject};

/// A store call that did not finish: it panicked, or the runtime is shutting down.
#[derive(Debug, thiserror::Error)]
#[error("a store call did not finish: {0}")]
pub struct Unfinished(#[from] tokio::task::JoinError);

/// Runs `f` on the blocking pool: store writes commit to SQLite synchronously and wait for the
/// disk.
pub async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, Unfinished> {
    Ok(tokio::task::spawn_blocking(f).await?)
}

impl Store {
    /// Runs `f` over this store on the blocking pool (see [`blocking`]). A panic in `f` is
    /// resumed in the caller, as if it had run there.
    pub async fn call<T: Send + 'static>(
        self: &Arc<Self>,
        f: impl FnOnce(&Store) -> T + Send + 'static,
    ) -> T {
        let store = Arc::clone(self);
        match tokio::task::spawn_blocking(move || f(&store)).await {
            Ok(value) => value,
            Err(e) => match e.try_into_panic() {
                Ok(payload) => std::panic::resume_unwind(payload),
                Err(e) => panic!("a store call did not finish: {e}"),
            },
        }
    }

    /// Records an event about `object`; a failure to record it is logged.
    pub fn record_or_warn(
        &self,
        object: &StoredObject,
        type_: EventType,
        reason: &str,
        message: &str,
    ) {
        if let Err(e) = self.record_event(object, type_, reason, message) {
            tracing::warn!(
                kind = object.kind.as_str(),
                name = object.name(),
                reason,
                error = %e,
                "could not record an event"
            );
        }
    }

    /// [`Store::record_or_warn`] on the blocking pool.
    pub async fn publish_event(
        self: &Arc<Self>,
        object: &StoredObject,
        type_: EventType,
        reason: &str,
        message: &str,
    ) {
        let object = object.clone();
        let (reason, message) = (reason.to_string(), message.to_string());
        self.call(move |store| store.record_or_warn(&object, type_, &reason, &message))
            .await;
    }
}
