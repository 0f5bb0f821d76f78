//! The HTTP API: Kubernetes-shaped resources over a unix socket (and optionally loopback TCP),
//! backed by the store. Handlers admit what users send, the store decides what is written.

pub mod access;
pub mod agent_api;
mod apply;
mod attach;
pub mod authority;
mod body;
mod containers;
pub mod error;
mod ide;
mod members;
mod merge_patch;
mod preview;
mod probes;
mod reads;
mod responses;
mod routes;
mod secrets;
pub mod selector;
mod server;
mod tools;
mod trash;
mod ui;
mod users;
mod watch;
mod writes;

use std::convert::Infallible;
use std::path::PathBuf;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use tokio_util::sync::CancellationToken;

pub use crate::admission::{self, Admission};
pub use body::{APPLY_LIMIT, OBJECT_LIMIT};
pub use error::{ApiError, Cause};
pub use preview::serve_previews;
pub use server::{ListenError, Listeners, bind_preview, bind_tcp, bind_unix, serve, tls_acceptor};

use crate::secrets::Secrets;
use crate::store::Store;

pub type Body = BoxBody<Bytes, Infallible>;

/// A check `/readyz` runs besides the store's own: "LXD reachable", "controller started".
pub type ReadinessCheck = Arc<dyn Fn() -> Result<(), String> + Send + Sync>;

/// Renders the Prometheus exposition for `/metrics`.
pub type MetricsRenderer = Arc<dyn Fn() -> String + Send + Sync>;

/// Who is calling. On the unix socket that is the local administrator, named by the peer's
/// OS user (`unix:<user>`); on TCP, the user whose bearer token came with the request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    /// The name membership is recorded under.
    pub identity: String,
    pub transport: Transport,
    /// Admins bypass membership and alone delete projects, change resource limits and write
    /// AgentProfiles, GitSources and users.
    pub admin: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    Unix,
    Tcp,
}

impl Caller {
    /// The local administrator on the unix socket.
    pub fn local(identity: impl Into<String>) -> Caller {
        Caller {
            identity: identity.into(),
            transport: Transport::Unix,
            admin: true,
        }
    }

    /// Only the local administrator (and the controller, in process) writes status.
    pub fn may_write_status(&self) -> bool {
        self.transport == Transport::Unix
    }
}

/// What every handler shares.
pub struct ApiState {
    pub store: Arc<Store>,
    pub secrets: Arc<Secrets>,
    pub admission: Admission,
    /// Host paths under which a non-admin may name a `file://` repository.
    pub allowed_file_roots: Vec<PathBuf>,
    /// Host addresses besides loopback that `spec.forwards` may reach.
    pub allowed_forward_targets: Vec<String>,
    pub readiness: Vec<(String, ReadinessCheck)>,
    /// Serves `/metrics` when set; the metrics registry plugs in here.
    pub metrics: Option<MetricsRenderer>,
    /// Cancelled at shutdown: watch streams end so connections can drain.
    pub shutdown: CancellationToken,
    /// Runs the workspace tools; without it the tools endpoint answers 503.
    pub tools: Option<Arc<crate::tools::Tools>>,
    /// LXD for runtime inspection and exec, and the activity people caused through berth.
    pub inspector: Arc<crate::inspect::Inspector>,
    /// The trash of deleted projects; without it the trash routes answer 503.
    pub trash: Option<Arc<crate::trash::Trash>>,
    /// Preview tickets and the way into containers' ports; without it port-forward answers 503.
    pub previews: Option<Arc<crate::preview::Previews>>,
    /// The web console's sessions and sign-in tokens.
    pub console: ui::Console,
    /// The controller's warm pool, which `GET .../pool` shows.
    pub pool: Arc<crate::reconcile::pool::WarmPool>,
}

impl ApiState {
    pub fn new(
        store: Arc<Store>,
        secrets: Arc<Secrets>,
        admission: Admission,
        shutdown: CancellationToken,
    ) -> Self {
        let inspector = Arc::new(crate::inspect::Inspector::new(
            "LXD",
            store.controller_id(),
            None,
            Default::default(),
        ));
        ApiState {
            store,
            secrets,
            admission,
            allowed_file_roots: Vec::new(),
            allowed_forward_targets: Vec::new(),
            readiness: Vec::new(),
            metrics: None,
            shutdown,
            tools: None,
            inspector,
            trash: None,
            previews: None,
            console: ui::Console::default(),
            pool: Arc::default(),
        }
    }

    /// Shows `pool` at `GET .../pool`.
    pub fn with_pool(mut self, pool: Arc<crate::reconcile::pool::WarmPool>) -> Self {
        self.pool = pool;
        self
    }

    /// Marks the console's cookies `Secure` on the TCP listener, which speaks HTTPS.
    pub fn with_console_over_tls(mut self) -> Self {
        self.console.tls = true;
        self
    }

    /// Serves the trash routes.
    pub fn with_trash(mut self, trash: Arc<crate::trash::Trash>) -> Self {
        self.trash = Some(trash);
        self
    }

    /// Issues preview tickets and forwards ports through `previews`.
    pub fn with_previews(mut self, previews: Arc<crate::preview::Previews>) -> Self {
        self.previews = Some(previews);
        self
    }

    /// Serves the workspace tools endpoint.
    pub fn with_tools(mut self, tools: Arc<crate::tools::Tools>) -> Self {
        self.tools = Some(tools);
        self
    }

    /// Inspects and execs through `inspector` (whose runtime arrives when the controller connects).
    pub fn with_inspector(mut self, inspector: Arc<crate::inspect::Inspector>) -> Self {
        self.inspector = inspector;
        self
    }

    /// Serves `/metrics` from `render`.
    pub fn with_metrics(mut self, render: MetricsRenderer) -> Self {
        self.metrics = Some(render);
        self
    }

    /// Lets non-admins name `file://` repositories under these host paths.
    pub fn with_allowed_file_roots(mut self, roots: Vec<PathBuf>) -> Self {
        self.admission.file_roots = roots.clone();
        self.allowed_file_roots = roots;
        self
    }

    /// Lets `spec.forwards` reach these host addresses besides loopback.
    pub fn with_allowed_forward_targets(mut self, targets: Vec<String>) -> Self {
        self.admission.forward_targets = targets.clone();
        self.allowed_forward_targets = targets;
        self
    }

    /// Adds a named check to `/readyz`.
    pub fn with_readiness_check(mut self, name: &str, check: ReadinessCheck) -> Self {
        self.readiness.push((name.to_string(), check));
        self
    }
}
