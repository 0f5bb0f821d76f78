//! `?watch=true`: newline-delimited JSON `{type, object}`, first an `ADDED` for every existing
//! object, then each change as it commits. A watcher that falls too far behind gets an `ERROR`
//! (410 Expired) and the stream ends; it lists again and re-watches, as with Kubernetes.

use std::convert::Infallible;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;
use hyper::header::{CONTENT_TYPE, HeaderValue};
use hyper::{Response, StatusCode};
use serde::Serialize;
use serde_json::json;
use tokio::sync::{broadcast, mpsc};

use super::selector::LabelSelector;
use super::{ApiState, Body};
use crate::store::StoredObject;
use berth_api::Kind;

/// Lines buffered per watcher before the writer waits for the client.
const BUFFERED_LINES: usize = 256;

#[derive(Serialize)]
struct WatchEvent<'a> {
    #[serde(rename = "type")]
    type_: &'a str,
    object: &'a StoredObject,
}

fn line(type_: &str, object: &StoredObject) -> Bytes {
    let mut bytes = serde_json::to_vec(&WatchEvent { type_, object }).unwrap_or_default();
    bytes.push(b'\n');
    Bytes::from(bytes)
}

pub fn stream(
    state: &Arc<ApiState>,
    kind: Kind,
    selector: LabelSelector,
    name: Option<String>,
) -> Response<Body> {
    let wanted = move |object: &StoredObject| {
        name.as_deref().is_none_or(|n| n == object.name())
            && selector.matches(&object.metadata.labels)
    };
    let (existing, _, mut changes) = state.store.list_and_subscribe(kind.as_str());
    let (tx, rx) = mpsc::channel::<Bytes>(BUFFERED_LINES);
    let shutdown = state.shutdown.clone();
    tokio::spawn(async move {
        for object in existing.iter().filter(|o| wanted(o)) {
            if tx.send(line("ADDED", object)).await.is_err() {
                return;
            }
        }
        drop(existing);
        loop {
            let change = tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tx.closed() => return,
                change = changes.recv() => change,
            };
            match change {
                Ok(change) if change.kind == kind.as_str() && wanted(&change.object) => {
                    if tx
                        .send(line(change.type_.as_watch_type(), &change.object))
                        .await
                        .is_err()
                    {
                        return;
                    }
                }
                Ok(_) => {}
                Err(broadcast::error::RecvError::Lagged(missed)) => {
                    let expired = json!({
                        "type": "ERROR",
                        "object": {
                            "kind": "Status", "apiVersion": "v1", "status": "Failure",
                            "reason": "Expired", "code": 410,
                            "message": format!("the watch fell {missed} changes behind; list and watch again"),
                        }
                    });
                    let mut bytes = expired.to_string().into_bytes();
                    bytes.push(b'\n');
                    let _ = tx.send(Bytes::from(bytes)).await;
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
