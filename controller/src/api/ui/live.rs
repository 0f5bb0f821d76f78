//! Live pages: the API's watch, read in process as the signed-in caller, turned into
//! server-sent events that carry freshly rendered HTML (the page swaps it in place, no
//! reload, no polling). The fleet gets a `row` (or `gone`) per changed project; a project page
//! gets its `summary` again after each change of the project, and the runner log's new text
//! as `log`, followed as `berth logs -f` follows it.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use chrono::Utc;
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;
use hyper::header::{CACHE_CONTROL, CONTENT_TYPE, HeaderValue};
use hyper::{Method, Response, StatusCode};
use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::super::error::ApiError;
use super::super::routes::Outcome;
use super::super::selector::LabelSelector;
use super::super::{ApiState, Body, Caller};
use super::internal;
use super::pages::{self, Filter, Project};
use berth_api::wire::API_PREFIX;

/// How often a project page's runner log is read on from where it ended.
const LOG_FOLLOW: Duration = Duration::from_secs(2);
/// Events buffered per page before the writer waits for the browser.
const BUFFERED: usize = 64;
/// What the browser waits before reconnecting a stream that ended (a watch expired, a restart).
const RETRY_MS: u64 = 2000;

/// One server-sent event.
fn event(name: &str, data: &Value) -> Bytes {
    // JSON has no raw newline, so the data is one `data:` line.
    Bytes::from(format!("event: {name}\ndata: {data}\n\n"))
}

fn stream(rx: mpsc::Receiver<Bytes>) -> Response<Body> {
    let frames = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv()
            .await
            .map(|bytes| (Ok::<_, Infallible>(Frame::data(bytes)), rx))
    });
    let mut response = Response::new(StreamBody::new(frames).boxed());
    *response.status_mut() = StatusCode::OK;
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

/// Opens a watch as `caller`; an error answer (a project the caller may not see) as the
/// API's error.
async fn watch(
    state: &Arc<ApiState>,
    caller: &Caller,
    path: &str,
) -> Result<hyper::body::Incoming, ApiError> {
    let response = internal::open(state, caller, Method::GET, path, None)
        .await
        .map_err(ApiError::internal)?;
    if !response.status().is_success() {
        let code = response.status();
        let bytes = response
            .into_body()
            .collect()
            .await
            .map(|c| c.to_bytes())
            .unwrap_or_default();
        let message = serde_json::from_slice::<Value>(&bytes)
            .ok()
            .and_then(|v| v["message"].as_str().map(str::to_string))
            .unwrap_or_else(|| code.to_string());
        return Err(ApiError::new(code, "Failed", message));
    }
    Ok(response.into_body())
}

/// The watch's events, one JSON line at a time, until it ends.
struct Lines {
    body: hyper::body::Incoming,
    buffer: Vec<u8>,
}

impl Lines {
    /// Tells the browser how soon to reconnect, then reads `body`; `None` once the page left.
    async fn start(body: hyper::body::Incoming, tx: &mpsc::Sender<Bytes>) -> Option<Lines> {
        let retry = Bytes::from(format!("retry: {RETRY_MS}\n\n"));
        tx.send(retry).await.ok()?;
        Some(Lines {
            body,
            buffer: Vec::new(),
        })
    }

    async fn next(&mut self) -> Option<Value> {
        loop {
            if let Some(at) = self.buffer.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = self.buffer.drain(..=at).collect();
                match serde_json::from_slice(&line) {
                    Ok(value) => return Some(value),
                    Err(_) => continue,
                }
            }
            let frame = self.body.frame().await?.ok()?;
            if let Ok(data) = frame.into_data() {
                self.buffer.extend_from_slice(&data);
            }
        }
    }
}

/// `GET /ui/events?labelSelector=...&state=...`: the fleet's rows as they change.
pub async fn fleet(
    state: &Arc<ApiState>,
    caller: &Caller,
    csrf: &str,
    filter: Filter,
    selector: LabelSelector,
) -> Outcome {
    let body = watch(state, caller, &format!("{API_PREFIX}/projects?watch=true")).await?;
    let (tx, rx) = mpsc::channel::<Bytes>(BUFFERED);
    let csrf = csrf.to_string();
    tokio::spawn(async move {
        let Some(mut lines) = Lines::start(body, &tx).await else {
            return;
        };
        while let Some(change) = lines.next().await {
            let message = match change["type"].as_str() {
                Some("ERROR") | None => return,
                Some(kind) => {
                    let project = Project::decode(change["object"].clone());
                    let shown = kind != "DELETED"
                        && selector.matches(&project.meta.labels)
                        && filter.shows_state(&project);
                    if shown {
                        event(
                            "row",
                            &json!({
                                "uid": project.uid(),
                                "name": project.name(),
                                "html": pages::fleet_row(&project, Utc::now(), &csrf),
                            }),
                        )
                    } else {
                        event("gone", &json!({"uid": project.uid()}))
                    }
                }
            };
            if tx.send(message).await.is_err() {
                return;
            }
        }
    });
    Ok(stream(rx))
}

/// `GET /ui/projects/NAME/events?offset=K`: the project page's summary after each change, and
/// its runner log from byte K on.
pub async fn project(
    state: &Arc<ApiState>,
    caller: &Caller,
    csrf: &str,
    name: &str,
    offset: Option<u64>,
) -> Outcome {
    let path = super::projects_path(name, "");
    let body = watch(state, caller, &format!("{path}?watch=true")).await?;
    let (tx, rx) = mpsc::channel::<Bytes>(BUFFERED);
    let state = Arc::clone(state);
    let caller = caller.clone();
    let csrf = csrf.to_string();
    tokio::spawn(async move {
        let Some(mut lines) = Lines::start(body, &tx).await else {
            return;
        };
        let mut offset = offset;
        let mut follow = tokio::time::interval(LOG_FOLLOW);
        follow.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let message = tokio::select! {
                _ = state.shutdown.cancelled() => return,
                _ = tx.closed() => return,
                change = lines.next() => match change {
                    None => return,
                    Some(change) => summary(&state, &caller, &csrf, &path, &change).await,
                },
                _ = follow.tick(), if offset.is_some() => {
                    let from = offset.unwrap_or(0);
                    let answer = internal::call(
                        &state, &caller, Method::GET, &format!("{path}/logs?offset={from}"), None,
                    ).await;
                    let text = answer.body["text"].as_str().unwrap_or_default();
                    offset = answer.body["nextOffset"].as_u64().or(offset);
                    if !answer.ok() || text.is_empty() {
                        continue;
                    }
                    Some(event("log", &json!({"text": text})))
                }
            };
            match message {
                Some(message) => {
                    if tx.send(message).await.is_err() {
                        return;
                    }
                }
                None => return,
            }
        }
    });
    Ok(stream(rx))
}

/// The `summary` event for one watch event (`gone` once deleted); `None` ends the stream.
async fn summary(
    state: &Arc<ApiState>,
    caller: &Caller,
    csrf: &str,
    path: &str,
    change: &Value,
) -> Option<Bytes> {
    match change["type"].as_str()? {
        "ERROR" => None,
        "DELETED" => Some(event("gone", &json!({}))),
        _ => {
            let project = Project::decode(change["object"].clone());
            let events =
                internal::call(state, caller, Method::GET, &format!("{path}/events"), None).await;
            Some(event(
                "summary",
                &json!({
                    "html": pages::project_summary(&project, &events.body, Utc::now(), csrf),
                    "blocked": project.question().is_some(),
                    "title": project.title(),
                }),
            ))
        }
    }
}
