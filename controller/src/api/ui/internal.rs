//! The console acts through the API itself: each of its reads and writes is one API request
//! made in process, on behalf of the session's caller, and answered by the very handlers that
//! answer the CLI (access, holds and validation included). The request crosses an in-memory
//! pipe as HTTP/1, which gives the handlers the streamed body they read.

use std::sync::Arc;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::header::{CONTENT_TYPE, HOST};
use hyper::server::conn::http1 as server_http1;
use hyper::service::service_fn;
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::Value;

use super::super::routes;
use super::super::{ApiState, Body, Caller};

/// The most an in-process answer the console reads may hold (a runner log chunk is the largest).
const ANSWER_LIMIT: usize = 8 * 1024 * 1024;
/// How many bytes the pipe buffers each way.
const PIPE: usize = 64 * 1024;

/// What an API call answered: its code and its JSON body (a `Status` object for an error).
#[derive(Debug, Clone)]
pub struct Answer {
    pub code: StatusCode,
    pub body: Value,
}

impl Answer {
    pub fn ok(&self) -> bool {
        self.code.is_success()
    }

    /// The message of a `Status` error, or the code's reason.
    pub fn message(&self) -> String {
        self.body
            .get("message")
            .and_then(Value::as_str)
            .map(str::to_string)
            .unwrap_or_else(|| self.code.to_string())
    }

    fn failed(message: impl Into<String>) -> Answer {
        Answer {
            code: StatusCode::INTERNAL_SERVER_ERROR,
            body: serde_json::json!({"message": message.into()}),
        }
    }
}

/// A JSON body and its media type (`application/json`, `application/merge-patch+json`).
pub type Sent<'a> = (&'a str, &'a Value);

/// Opens `method path_and_query` (with `body`) on the API as `caller`, and leaves the
/// response unread: a watch streams.
pub async fn open(
    state: &Arc<ApiState>,
    caller: &Caller,
    method: Method,
    path_and_query: &str,
    body: Option<Sent<'_>>,
) -> Result<hyper::Response<hyper::body::Incoming>, String> {
    let (client_io, server_io) = tokio::io::duplex(PIPE);
    let service = {
        let state = Arc::clone(state);
        let caller = caller.clone();
        service_fn(move |req| {
            let state = Arc::clone(&state);
            let caller = caller.clone();
            async move {
                let response: hyper::Response<Body> = routes::handle_as(&state, &caller, req).await;
                Ok::<_, std::convert::Infallible>(response)
            }
        })
    };
    tokio::spawn(async move {
        let _ = server_http1::Builder::new()
            .serve_connection(TokioIo::new(server_io), service)
            .await;
    });
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(client_io))
        .await
        .map_err(|e| format!("in-process API connection: {e}"))?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    let mut request = Request::builder()
        .method(method)
        .uri(path_and_query)
        .header(HOST, "berth");
    let bytes = match body {
        Some((media, value)) => {
            request = request.header(CONTENT_TYPE, media);
            Bytes::from(serde_json::to_vec(value).unwrap_or_default())
        }
        None => Bytes::new(),
    };
    let request = request
        .body(Full::new(bytes))
        .map_err(|e| format!("in-process API request {path_and_query}: {e}"))?;
    sender
        .send_request(request)
        .await
        .map_err(|e| format!("in-process API request {path_and_query}: {e}"))
}

/// Calls the API as `caller` and reads the whole answer.
pub async fn call(
    state: &Arc<ApiState>,
    caller: &Caller,
    method: Method,
    path_and_query: &str,
    body: Option<Sent<'_>>,
) -> Answer {
    let response = match open(state, caller, method, path_and_query, body).await {
        Ok(response) => response,
        Err(e) => return Answer::failed(e),
    };
    let code = response.status();
    let bytes = match Limited::new(response.into_body(), ANSWER_LIMIT)
        .collect()
        .await
    {
        Ok(collected) => collected.to_bytes(),
        Err(e) => return Answer::failed(format!("reading {path_and_query}: {e}")),
    };
    let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    Answer { code, body }
}
