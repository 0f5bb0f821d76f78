//! One HTTP request to LXD: the project parameter, a deadline, the observer, and the mapping of
//! LXD's response envelope to values or typed errors.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use reqwest::Method;
use reqwest::header::HeaderMap;
use serde::Deserialize;
use tokio::time::Instant;

use crate::runtime::RuntimeError;

use super::endpoint::{Endpoint, LxdConfig};
use super::{RequestObserver, tls};

/// Host used in URLs sent over the unix socket; LXD ignores it.
const UNIX_BASE: &str = "http://lxd";

pub(crate) struct Transport {
    http: reqwest::Client,
    base: String,
    project: String,
    request_timeout: Duration,
    observer: Option<Arc<dyn RequestObserver>>,
}

/// A response body and its status, before interpreting LXD's envelope.
#[derive(Debug)]
pub(crate) struct RawResponse {
    pub status: u16,
    pub headers: HeaderMap,
    pub body: Bytes,
    /// The body was longer than the call's [`Keep`] allowed, so `body` holds only part of it.
    pub cut: bool,
}

/// How much of a response body a call keeps: bodies that carry a container's content (a file,
/// a log) are read with a bound, never whole on faith.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Keep {
    All,
    /// At most this many bytes; past them reading stops (and the connection is dropped).
    AtMost(usize),
    /// The last this many bytes, reading through the body.
    Last(usize),
}

/// Reads `response`'s body as `keep` says: the bytes kept and whether any were left out.
async fn read_body(
    mut response: reqwest::Response,
    keep: Keep,
) -> Result<(Bytes, bool), reqwest::Error> {
    let bound = match keep {
        Keep::All => return Ok((response.bytes().await?, false)),
        Keep::AtMost(n) | Keep::Last(n) => n,
    };
    if keep == Keep::AtMost(bound)
        && response
            .content_length()
            .is_some_and(|length| length > bound as u64)
    {
        return Ok((Bytes::new(), true));
    }
    let mut body: Vec<u8> = Vec::new();
    let mut cut = false;
    while let Some(chunk) = response.chunk().await? {
        match keep {
            Keep::AtMost(_) if body.len() + chunk.len() > bound => return Ok((body.into(), true)),
            Keep::Last(_) if body.len() + chunk.len() > 2 * bound.max(1 << 16) => {
                // Compacted now and then rather than at every chunk.
                body.extend_from_slice(&chunk);
                body.drain(..body.len() - bound);
                cut = true;
            }
            _ => body.extend_from_slice(&chunk),
        }
    }
    if let Keep::Last(_) = keep
        && body.len() > bound
    {
        body.drain(..body.len() - bound);
        cut = true;
    }
    Ok((body.into(), cut))
}

/// A successful LXD response.
#[derive(Debug)]
pub(crate) enum Reply {
    Sync {
        metadata: serde_json::Value,
        etag: Option<String>,
    },
    /// 202 with an operation to wait for.
    Async { operation: String },
}

impl Reply {
    pub fn into_metadata(self) -> serde_json::Value {
        match self {
            Reply::Sync { metadata, .. } => metadata,
            Reply::Async { .. } => serde_json::Value::Null,
        }
    }
}

impl Transport {
    pub fn new(config: &LxdConfig) -> Result<Transport, RuntimeError> {
        let builder = reqwest::Client::builder()
            .connect_timeout(config.request_timeout.min(Duration::from_secs(10)))
            .pool_idle_timeout(Duration::from_secs(30))
            .http1_only();
        let (builder, base) = match &config.endpoint {
            // LXD 5.0 stops accepting on its unix socket while an accepted connection has sent
            // nothing yet. A pooled client opens connections it may never use (it races a new
            // connection against an idle one), which wedges the daemon for every client, its own
            // start hooks included. A unix connection is cheap: keep none idle.
            Endpoint::Unix(path) => (
                builder.unix_socket(path.clone()).pool_max_idle_per_host(0),
                UNIX_BASE.to_string(),
            ),
            Endpoint::Https(https) => (
                builder.tls_backend_preconfigured(tls::client_config(https)?),
                https.url.clone(),
            ),
        };
        let http = builder
            .build()
            .map_err(|e| RuntimeError::Config(format!("HTTP client: {}", error_chain(&e))))?;
        Ok(Transport {
            http,
            base,
            project: config.project.clone(),
            request_timeout: config.request_timeout,
            observer: config.observer.clone(),
        })
    }

    pub fn request_timeout(&self) -> Duration {
        self.request_timeout
    }

    /// Starts a request to an API `path` (`/1.0/...`); `what` names it in errors.
    pub fn call(&self, method: Method, path: &str, what: impl Into<String>) -> Call<'_> {
        Call {
            transport: self,
            method,
            path: path.to_string(),
            query: vec![("project".to_string(), self.project.clone())],
            body: None,
            headers: Vec::new(),
            timeout: self.request_timeout,
            what: what.into(),
            keep: Keep::All,
        }
    }

    fn url(&self, path: &str, query: &[(String, String)]) -> Result<url::Url, RuntimeError> {
        let mut url = url::Url::parse(&format!("{}{}", self.base, path))
            .map_err(|e| RuntimeError::Config(format!("bad LXD URL for {path:?}: {e}")))?;
        // A path that already carries a query (log paths LXD hands back) keeps it.
        if !query.is_empty() {
            let mut pairs = url.query_pairs_mut();
            for (k, v) in query {
                pairs.append_pair(k, v);
            }
        }
        Ok(url)
    }
}

pub(crate) struct Call<'a> {
    transport: &'a Transport,
    method: Method,
    path: String,
    query: Vec<(String, String)>,
    body: Option<Body>,
    headers: Vec<(&'static str, String)>,
    timeout: Duration,
    what: String,
    keep: Keep,
}

enum Body {
    Json(serde_json::Value),
    Bytes(Vec<u8>),
}

impl Call<'_> {
    pub fn query(mut self, key: &str, value: impl Into<String>) -> Self {
        self.query.push((key.to_string(), value.into()));
        self
    }

    pub fn query_opt(self, key: &str, value: Option<&str>) -> Self {
        match value {
            Some(v) if !v.is_empty() => self.query(key, v),
            _ => self,
        }
    }

    pub fn json(mut self, body: serde_json::Value) -> Self {
        self.body = Some(Body::Json(body));
        self
    }

    pub fn bytes(mut self, body: Vec<u8>) -> Self {
        self.body = Some(Body::Bytes(body));
        self
    }

    pub fn header(mut self, name: &'static str, value: impl Into<String>) -> Self {
        self.headers.push((name, value.into()));
        self
    }

    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// How much of the response body to keep (all of it unless told).
    pub fn keep(mut self, keep: Keep) -> Self {
        self.keep = keep;
        self
    }

    /// Sends and returns the body as it came, whatever the status.
    pub async fn send_raw(self) -> Result<RawResponse, RuntimeError> {
        let url = self.transport.url(&self.path, &self.query)?;
        let mut request = self.transport.http.request(self.method.clone(), url);
        for (name, value) in &self.headers {
            request = request.header(*name, value);
        }
        request = match self.body {
            Some(Body::Json(v)) => request.json(&v),
            Some(Body::Bytes(b)) => request
                .header("Content-Type", "application/octet-stream")
                .body(b),
            None => request,
        };
        // LXD under load may close a connection before it answers: a read is safe to send
        // again, once.
        let again = (self.method == reqwest::Method::GET)
            .then(|| request.try_clone())
            .flatten();
        let started = Instant::now();
        let exchange = async {
            let response = match request.send().await {
                Ok(response) => response,
                Err(e) if e.is_request() && !e.is_timeout() && again.is_some() => {
                    tracing::debug!(path = %self.path, error = %error_chain(&e), "LXD closed the connection unanswered; sending the read again");
                    again.expect("checked above").send().await?
                }
                Err(e) => return Err(e),
            };
            let status = response.status().as_u16();
            let headers = response.headers().clone();
            let (body, cut) = read_body(response, self.keep).await?;
            Ok::<_, reqwest::Error>(RawResponse {
                status,
                headers,
                body,
                cut,
            })
        };
        let outcome = tokio::time::timeout(self.timeout, exchange).await;
        let elapsed = started.elapsed().as_secs_f64();
        let observe = |code: u16| {
            tracing::debug!(
                method = %self.method,
                path = %self.path,
                code,
                ms = (elapsed * 1000.0).round(),
                "LXD request"
            );
            if let Some(observer) = &self.transport.observer {
                observer.observe(self.method.as_str(), code, elapsed);
            }
        };
        match outcome {
            Ok(Ok(raw)) => {
                observe(raw.status);
                Ok(raw)
            }
            Ok(Err(e)) => {
                observe(0);
                Err(RuntimeError::Transport {
                    what: self.what,
                    message: error_chain(&e),
                })
            }
            Err(_) => {
                observe(0);
                Err(RuntimeError::Timeout {
                    what: self.what,
                    after: self.timeout,
                })
            }
        }
    }

    /// Sends and interprets LXD's envelope: a sync result, an operation, or a typed error.
    pub async fn send(self) -> Result<Reply, RuntimeError> {
        let what = self.what.clone();
        let raw = self.send_raw().await?;
        parse_envelope(&what, &raw)
    }

    /// Sends and returns the sync metadata deserialized, `None` on 404.
    pub async fn get_opt<T: for<'de> Deserialize<'de>>(self) -> Result<Option<T>, RuntimeError> {
        let what = self.what.clone();
        match self.send().await {
            Ok(reply) => decode(&what, reply.into_metadata()).map(Some),
            Err(RuntimeError::NotFound { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Sends and returns the sync metadata deserialized.
    pub async fn get<T: for<'de> Deserialize<'de>>(self) -> Result<T, RuntimeError> {
        let what = self.what.clone();
        decode(&what, self.send().await?.into_metadata())
    }
}

pub(crate) fn decode<T: for<'de> Deserialize<'de>>(
    what: &str,
    value: serde_json::Value,
) -> Result<T, RuntimeError> {
    serde_json::from_value(value).map_err(|e| RuntimeError::Protocol {
        what: what.to_string(),
        message: e.to_string(),
    })
}

#[derive(Deserialize)]
struct Envelope {
    #[serde(rename = "type", default)]
    kind: String,
    #[serde(default)]
    error: String,
    #[serde(default)]
    error_code: u16,
    #[serde(default)]
    operation: String,
    #[serde(default)]
    metadata: serde_json::Value,
}

/// Interprets a response of LXD's REST API.
pub(crate) fn parse_envelope(what: &str, raw: &RawResponse) -> Result<Reply, RuntimeError> {
    let envelope: Envelope = match serde_json::from_slice(&raw.body) {
        Ok(e) => e,
        Err(e) => {
            if raw.status >= 400 {
                return Err(status_error(
                    what,
                    raw.status,
                    String::from_utf8_lossy(&raw.body).trim().to_string(),
                ));
            }
            return Err(RuntimeError::Protocol {
                what: what.to_string(),
                message: format!("HTTP {} with a body that is not LXD JSON: {e}", raw.status),
            });
        }
    };
    if envelope.kind == "error" || raw.status >= 400 {
        let code = if envelope.error_code != 0 {
            envelope.error_code
        } else {
            raw.status
        };
        return Err(status_error(what, code, envelope.error));
    }
    match envelope.kind.as_str() {
        "async" => {
            let operation = operation_id(&envelope.operation)
                .or_else(|| {
                    envelope
                        .metadata
                        .get("id")
                        .and_then(|v| v.as_str())
                        .map(str::to_string)
                })
                .ok_or_else(|| RuntimeError::Protocol {
                    what: what.to_string(),
                    message: "async response without an operation".into(),
                })?;
            Ok(Reply::Async { operation })
        }
        "sync" => Ok(Reply::Sync {
            metadata: envelope.metadata,
            etag: raw
                .headers
                .get("etag")
                .and_then(|v| v.to_str().ok())
                .map(str::to_string),
        }),
        other => Err(RuntimeError::Protocol {
            what: what.to_string(),
            message: format!("unknown response type {other:?}"),
        }),
    }
}

/// The operation id from `/1.0/operations/UUID` (clustered servers append `?project=P`).
pub(crate) fn operation_id(path: &str) -> Option<String> {
    let path = path.split('?').next()?;
    let id = path.rsplit('/').next()?;
    (!id.is_empty()).then(|| id.to_string())
}

/// An error status with LXD's message as the matching typed error.
pub(crate) fn status_error(what: &str, status: u16, message: String) -> RuntimeError {
    match status {
        404 => RuntimeError::NotFound {
            what: what.to_string(),
            message,
        },
        _ if says_busy(&message) => RuntimeError::Busy {
            what: what.to_string(),
            message,
        },
        409 => RuntimeError::Conflict {
            what: what.to_string(),
            message,
        },
        _ => RuntimeError::Rejected {
            what: what.to_string(),
            status,
            message,
        },
    }
}

/// Whether LXD's message says the target is busy with another operation ("Instance is busy
/// running a stop operation"): the word itself, not a name that contains it (`busybox`). The
/// one place berth reads that from LXD's wording.
pub(crate) fn says_busy(message: &str) -> bool {
    message
        .split(|c: char| !c.is_ascii_alphanumeric())
        .any(|word| word.eq_ignore_ascii_case("busy"))
}

/// The error and its causes on one line: reqwest's top-level message alone ("error sending
/// request") hides the reason (no such socket, connection refused, certificate mismatch).
pub(crate) fn error_chain(error: &dyn std::error::Error) -> String {
    let mut message = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let text = cause.to_string();
        if !message.contains(&text) {
            message.push_str(": ");
            message.push_str(&text);
        }
        source = cause.source();
    }
    message
}
