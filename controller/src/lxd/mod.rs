//! A client for LXD's REST API over the local unix socket or HTTPS, implementing
//! [`crate::runtime::Runtime`].
//!
//! Every request carries the configured LXD project and has a deadline; async operations are
//! waited on right away (they vanish from LXD soon after finishing); exec output is recorded,
//! read and its logs deleted.
//!
//! Its parts: `client.rs` (operations, instances, files, custom volumes), `endpoint.rs` (where
//! LXD is), `transport.rs` (one request: a read LXD dropped unanswered is sent again once, a write
//! never; `Busy` and the other typed errors mapped from LXD's envelope), `tls.rs` (the server's
//! certificate pinned), `wire.rs`, `websocket.rs` (every websocket: `events.rs`, the event
//! stream, and `exec_ws.rs`, interactive exec), `exec_capture.rs` (output into the container's
//! `/tmp`, read back under a cap; a command nobody waits for any more, past its timeout or dropped
//! by its caller, is stopped by the `Running` guard, so the API's exec drops it when its caller
//! loses the right), `file_watch.rs` (`Runtime::watch_files`) and `nic_restart.rs`
//! (`Runtime::restart_nics`).

mod client;
mod endpoint;
mod events;
mod exec_capture;
mod exec_ws;
mod file_watch;
mod nic_restart;
mod tls;
mod transport;
mod websocket;
mod wire;

pub use client::LxdClient;
pub use endpoint::{DEFAULT_SOCKET, Endpoint, HttpsEndpoint, LxdConfig, normalize_fingerprint};
pub use tls::{certificate_fingerprint, pem_file_fingerprint};

/// Told about every LXD request, for metrics (`lxd_requests_total{method,code}`,
/// `lxd_request_duration_seconds`). `code` is the HTTP status, 0 when no response arrived.
pub trait RequestObserver: Send + Sync {
    fn observe(&self, method: &str, code: u16, seconds: f64);
}

#[cfg(test)]
mod tests;
