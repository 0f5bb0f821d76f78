//! `?watch=true`: newline-delimited JSON `{type, object}`, first an `ADDED` for every existing
//! object, then each change as it commits. A watcher that falls too far behind gets an `ERROR`
//! (410 Expired) and the stream ends; it lists again and re-watches, as with Kubernetes.
//!
//! A stream's `Holder` is checked again every second by user id: the stream ends once its user
//! is removed or loses the admin right it was opened with.

use std::collections::HashSet;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;
use hyper::header::{CONTENT_TYPE, HeaderValue};
use hyper::{Response, StatusCode};
use serde::Serialize;
use tokio::sync::{broadcast, mpsc};

use super::selector::LabelSelector;
use super::{ApiState, Body, Caller, Transport};
use crate::store::{ChangeType, StoredObject};
use berth_api::Kind;
use berth_api::wire::{ApiStatus, WatchEvent, WatchEventType};

/// Which objects a watcher may see, asked at each event (membership can change mid-watch).
pub type Filter = Box<dyn Fn(&StoredObject) -> bool + Send + Sync>;
/// What a watcher is sent of an object, when not the object as stored: a GitSource with the
/// project names its reader may not get hidden, judged at each event.
pub type Redact = Box<dyn Fn(&StoredObject) -> serde_json::Value + Send + Sync>;

/// Lines buffered per watcher before the writer waits for the client.
const BUFFERED_LINES: usize = 256;

/// How often an open stream (a watch, an exec) checks that its caller may still hold it.
pub const RECHECK: Duration = Duration::from_secs(1);

/// Who holds a long-lived stream, as authenticated when it opened. A TCP user is held by id:
/// removing the user, or taking away the admin right the stream was opened with, ends the
/// stream within [`RECHECK`], and a name added again is another user who inherits nothing.
pub struct Holder {
    identity: String,
    admin: bool,
    /// `None` for a local caller (the unix socket), whose right is the socket's.
    user_id: Option<String>,
}

impl Holder {
    pub fn of(state: &ApiState, caller: &Caller) -> Holder {
        let user_id = match caller.transport {
            Transport::Unix => None,
            // A user removed since the request was authenticated has no id: the stream ends at
            // its first check.
            Transport::Tcp => Some(
                state
                    .store
                    .user(&caller.identity)
                    .ok()
                    .flatten()
                    .map(|user| user.id)
                    .unwrap_or_default(),
            ),
        };
        Holder {
            identity: caller.identity.clone(),
            admin: caller.admin,
            user_id,
        }
    }

    /// Whether the holder may still hold its stream. A store that cannot answer revokes
    /// nothing: the next check asks again.
    fn holds(&self, state: &ApiState) -> bool {
        let Some(id) = &self.user_id else {
            return true;
        };
        match state.store.user(&self.identity) {
            Ok(Some(user)) => user.id == *id && (user.admin || !self.admin),
            Ok(None) => false,
            Err(_) => true,
        }
    }

    /// Resolves once the holder lost its right, or `also` says the stream's own right (e.g. a
    /// project's membership) is gone.
    pub async fn revoked(&self, state: &ApiState, also: impl Fn() -> bool) {
        let mut checks = tokio::time::interval(RECHECK);
        checks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            checks.tick().await;
            if !self.holds(state) || !also() {
                return;
            }
        }
    }
}

fn line<T: Serialize>(type_: WatchEventType, object: T) -> Bytes {
    let mut bytes = serde_json::to_vec(&WatchEvent { type_, object }).unwrap_or_default();
    bytes.push(b'\n');
    Bytes::from(bytes)
}

/// One event line for `object`, redacted for the watcher when it has to be.
fn object_line(type_: WatchEventType, object: &StoredObject, redact: Option<&Redact>) -> Bytes {
    match redact {
        Some(redact) => line(type_, redact(object)),
        None => line(type_, object),
    }
}

fn event_type(change: ChangeType) -> WatchEventType {
    match change {
        ChangeType::Added => WatchEventType::Added,
        ChangeType::Modified => WatchEventType::Modified,
        ChangeType::Deleted => WatchEventType::Deleted,
    }
}

pub fn stream(
    state: &Arc<ApiState>,
    caller: &Caller,
    kind: Kind,
    selector: LabelSelector,
    name: Option<String>,
    filter: Option<Filter>,
    redact: Option<Redact>,
) -> Response<Body> {
    let holder = Holder::of(state, caller);
    let state = Arc::clone(state);
    let wanted = move |object: &StoredObject| {
        name.as_deref().is_none_or(|n| n == object.name())
            && selector.matches(&object.metadata.labels)
            && filter.as_ref().is_none_or(|visible| visible(object))
    };
    let (existing, _, mut changes) = state.store.list_and_subscribe(kind);
    let (tx, rx) = mpsc::channel::<Bytes>(BUFFERED_LINES);
    let shutdown = state.shutdown.clone();
    tokio::spawn(async move {
        // A watcher hears of the deletion of whatever it was shown, even once the deletion has
        // taken the memberships that let it see the object.
        let mut shown: HashSet<String> = HashSet::new();
        for object in existing.iter().filter(|o| wanted(o)) {
            shown.insert(object.uid().to_string());
            if tx
                .send(object_line(WatchEventType::Added, object, redact.as_ref()))
                .await
                .is_err()
            {
                return;
            }
        }
        drop(existing);
        let revoked = holder.revoked(&state, || true);
        tokio::pin!(revoked);
        loop {
            let change = tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tx.closed() => return,
                () = &mut revoked => {
                    let revoked = ApiStatus::failure(
                        401,
                        "Unauthorized",
                        "the watch's caller was removed or lost the right it was opened with",
                    );
                    let _ = tx.send(line(WatchEventType::Error, revoked)).await;
                    return;
                }
                change = changes.recv() => change,
            };
            match change {
                Ok(change)
                    if change.kind == kind
                        && (wanted(&change.object)
                            || (change.type_ == ChangeType::Deleted
                                && shown.contains(&change.uid))) =>
                {
                    if change.type_ == ChangeType::Deleted {
                        shown.remove(&change.uid);
                    } else {
                        shown.insert(change.uid.clone());
                    }
                    let type_ = event_type(change.type_);
                    if tx
                        .send(object_line(type_, &change.object, redact.as_ref()))
                        .await
                        .is_err()
                    {
                        return;
                    }
                }
                Ok(_) => {}
                Err(broadcast::error::RecvError::Lagged(missed)) => {
                    let expired = ApiStatus::failure(
                        410,
                        "Expired",
                        format!("the watch fell {missed} changes behind; list and watch again"),
                    );
                    let _ = tx.send(line(WatchEventType::Error, expired)).await;
                    return;
                }
                Err(broadcast::error::RecvError::Closed) => return,
            }
        }
    });
    let frames = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv()
            .await
            .map(|bytes| (Ok::<_, Infallible>(Frame::data(bytes)), rx))
    });
    let mut response = Response::new(StreamBody::new(frames).boxed());
    *response.status_mut() = StatusCode::OK;
    response.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("application/json;stream=watch"),
    );
    response
}
