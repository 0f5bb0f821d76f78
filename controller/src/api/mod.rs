//! The HTTP API: Kubernetes-shaped resources over a unix socket (and optionally loopback TCP),
//! backed by the store. Handlers admit what users send, the store decides what is written.

pub mod admission;
mod body;
pub mod error;
mod merge_patch;
mod routes;
pub mod selector;
mod server;
mod watch;

use std::convert::Infallible;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use tokio_util::sync::CancellationToken;

pub use admission::Admission;
pub use error::{ApiError, Cause};
pub use routes::FORCE_DELETE_ANNOTATION;
pub use server::{ListenError, Listeners, bind_tcp, bind_unix, serve};

use crate::store::Store;

pub type Body = BoxBody<Bytes, Infallible>;

/// A check `/readyz` runs besides the store's own: "LXD reachable", "controller started".
pub type ReadinessCheck = Arc<dyn Fn() -> Result<(), String> + Send + Sync>;

/// Renders the Prometheus exposition for `/metrics`.
pub type MetricsRenderer = Arc<dyn Fn() -> String + Send + Sync>;

/// Who is calling. On the unix socket that is the local administrator, named by the peer's
/// OS user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    pub identity: String,
    pub transport: Transport,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    Unix,
    Tcp,
}

impl Caller {
    /// Only the local administrator (and the controller, in process) writes status.
    pub fn may_write_status(&self) -> bool {
        self.transport == Transport::Unix
    }
}

/// What every handler shares.
pub struct ApiState {
    pub store: Arc<Store>,
    pub admission: Admission,
    pub readiness: Vec<(String, ReadinessCheck)>,
    /// Serves `/metrics` when set; the metrics registry plugs in here.
    pub metrics: Option<MetricsRenderer>,
    /// Cancelled at shutdown: watch streams end so connections can drain.
    pub shutdown: CancellationToken,
}

impl ApiState {
    pub fn new(store: Arc<Store>, admission: Admission, shutdown: CancellationToken) -> Self {
        ApiState {
            store,
            admission,
            readiness: Vec::new(),
            metrics: None,
            shutdown,
        }
    }

    /// Serves `/metrics` from `render`.
    pub fn with_metrics(mut self, render: MetricsRenderer) -> Self {
        self.metrics = Some(render);
        self
    }

    /// Adds a named check to `/readyz`.
    pub fn with_readiness_check(mut self, name: &str, check: ReadinessCheck) -> Self {
        self.readiness.push((name.to_string(), check));
        self
    }
}
