//! Listeners and connections: the unix socket (local administrators) and optionally a TCP
//! address, HTTPS when `listen.tls` names a certificate and key (TLS 1.2 or later); graceful
//! shutdown stops accepting, lets requests in flight finish, then returns.
//!
//! Each listener is capped at `listen.maxConnections` (past it a connection is closed at once)
//! with a 10 s header deadline, and both are served by one `accept_loop`. A TCP connection is on
//! `Probation` until a request shows a valid token or console session: such connections hold at
//! most an eighth of the cap, a newer one closing the oldest, and are closed after 5 s. The
//! preview listener keeps the same rule (`Unproven`) until a member's token, ticket or cookie
//! is shown.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, UnixListener, UnixStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;

use crate::metrics::{ListenerLabels, Metrics};

use super::{ApiState, Caller, Transport, routes};

/// How long shutdown waits for requests in flight before giving up on them.
const DRAIN_DEADLINE: Duration = Duration::from_secs(10);
/// How long a TLS client may take to finish its handshake before it is dropped.
pub(super) const HANDSHAKE_DEADLINE: Duration = Duration::from_secs(10);
/// How long a client may take to send a request's headers, also between the requests of a
/// kept-alive connection: an idle or trickling client frees its slot after this.
pub const HEADER_DEADLINE: Duration = Duration::from_secs(10);
/// How long a TCP connection may stay open without a request that shows a valid token (or
/// console session): idle and anonymous clients free their place soon.
pub const UNAUTHENTICATED_DEADLINE: Duration = Duration::from_secs(5);
/// The share of `listen.maxConnections` that connections yet to show a token may hold, as a
/// divisor: past it the oldest of them is closed to make room. Anonymous clients can so never
/// hold the slots that users with a token need.
const UNAUTHENTICATED_SHARE: usize = 8;
/// What a plain-HTTP client past the connection cap reads before its connection is closed.
const REFUSAL: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\nconnection: close\r\n\
content-type: text/plain\r\ncontent-length: 33\r\n\r\ntoo many connections; retry later\n";

#[derive(Debug, thiserror::Error)]
pub enum ListenError {
    #[error("{}: another berth is already serving on this socket", path.display())]
    SocketInUse { path: PathBuf },
    #[error("listen.socket {}: {reason}", path.display())]
    UnsafeSocket { path: PathBuf, reason: String },
    #[error("{}: {source}", path.display())]
    Socket {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("listen.http {addr}: {source}")]
    Tcp {
        addr: String,
        #[source]
        source: std::io::Error,
    },
    #[error("listen.preview {addr}: {source}")]
    Preview {
        addr: String,
        #[source]
        source: std::io::Error,
    },
    #[error("listen.tls.{field} {}: {message}", path.display())]
    Tls {
        field: &'static str,
        path: PathBuf,
        message: String,
    },
}

/// Where the API is served.
pub struct Listeners {
    pub unix: UnixListener,
    pub unix_path: PathBuf,
    pub tcp: Option<TcpListener>,
    /// Set: the TCP listener speaks HTTPS.
    pub tls: Option<TlsAcceptor>,
    /// The most connections each listener holds open at once (`listen.maxConnections`); the
    /// unix socket has its own allowance, so a flood over TCP never locks out a local admin.
    pub max_connections: usize,
    /// Counts open and refused connections when set.
    pub metrics: Option<Arc<Metrics>>,
}

/// The connection slots of one listener. A connection past the cap is accepted and closed at
/// once, so it holds a file descriptor for no longer than that.
#[derive(Clone)]
pub(super) struct Slots {
    listener: &'static str,
    free: Arc<Semaphore>,
    metrics: Option<Arc<Metrics>>,
}

/// One open connection's slot, given back when the connection ends.
pub(super) struct Slot {
    _permit: OwnedSemaphorePermit,
    slots: Slots,
}

impl Slots {
    pub(super) fn new(listener: &'static str, max: usize, metrics: Option<Arc<Metrics>>) -> Slots {
        Slots {
            listener,
            free: Arc::new(Semaphore::new(max)),
            metrics,
        }
    }

    pub(super) fn take(&self) -> Option<Slot> {
        let Ok(permit) = Arc::clone(&self.free).try_acquire_owned() else {
            if let Some(metrics) = &self.metrics {
                metrics
                    .api_connections_refused
                    .get_or_create(&self.labels())
                    .inc();
            }
            return None;
        };
        if let Some(metrics) = &self.metrics {
            metrics.api_connections.get_or_create(&self.labels()).inc();
        }
        Some(Slot {
            _permit: permit,
            slots: self.clone(),
        })
    }

    fn labels(&self) -> ListenerLabels {
        ListenerLabels {
            listener: self.listener,
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        // Counted up and down, never set from the semaphore: slots dropped at once would
        // otherwise race, and the last to set could leave a stale count for good.
        if let Some(metrics) = &self.slots.metrics {
            metrics
                .api_connections
                .get_or_create(&self.slots.labels())
                .dec();
        }
    }
}

/// The TCP connections of one listener that have not yet shown a valid token, oldest first.
#[derive(Clone)]
pub(super) struct Unproven {
    open: Arc<std::sync::Mutex<UnprovenList>>,
    share: usize,
}

/// Each unproven connection's slot is held here, not by the connection: closing one to make
/// room gives its slot back at once, before its task has even woken up.
#[derive(Default)]
struct UnprovenList {
    next: u64,
    open: std::collections::VecDeque<(u64, CancellationToken, Slot)>,
}

impl Unproven {
    pub(super) fn new(max_connections: usize) -> Unproven {
        Unproven {
            open: Arc::default(),
            share: (max_connections / UNAUTHENTICATED_SHARE).max(1),
        }
    }

    /// Registers a new connection with its slot, closing the oldest unproven one when the
    /// share is full.
    pub(super) fn admit(&self, slot: Slot) -> Probation {
        let mut list = self.open.lock().unwrap_or_else(|e| e.into_inner());
        while list.open.len() >= self.share {
            if !Self::close_oldest(&mut list) {
                break;
            }
        }
        list.next += 1;
        let id = list.next;
        let closed = CancellationToken::new();
        list.open.push_back((id, closed.clone(), slot));
        Probation {
            id,
            closed,
            kept: std::sync::Mutex::new(None),
            proven: std::sync::atomic::AtomicBool::new(false),
            unproven: self.clone(),
        }
    }

    /// Closes the oldest unproven connection, giving its slot back; false when there is none.
    pub(super) fn make_room(&self) -> bool {
        Self::close_oldest(&mut self.open.lock().unwrap_or_else(|e| e.into_inner()))
    }

    fn close_oldest(list: &mut UnprovenList) -> bool {
        match list.open.pop_front() {
            Some((_, closed, _slot)) => {
                closed.cancel();
                true
            }
            None => false,
        }
    }

    /// Takes connection `id` off the list: its slot, unless it was closed meanwhile.
    fn take(&self, id: u64) -> Option<Slot> {
        let mut list = self.open.lock().unwrap_or_else(|e| e.into_inner());
        let at = list.open.iter().position(|(open, _, _)| *open == id)?;
        list.open.remove(at).map(|(_, _, slot)| slot)
    }
}

/// A TCP connection until it shows a valid token: closed at [`UNAUTHENTICATED_DEADLINE`], or
/// earlier to make room for a newer connection.
pub(super) struct Probation {
    id: u64,
    closed: CancellationToken,
    /// The slot, once proven: held by the connection from then on.
    kept: std::sync::Mutex<Option<Slot>>,
    proven: std::sync::atomic::AtomicBool,
    unproven: Unproven,
}

impl Probation {
    pub(super) fn is_proven(&self) -> bool {
        self.proven.load(std::sync::atomic::Ordering::Relaxed)
    }

    pub(super) fn prove(&self) {
        if !self.proven.swap(true, std::sync::atomic::Ordering::Relaxed)
            && let Some(slot) = self.unproven.take(self.id)
        {
            *self.kept.lock().unwrap_or_else(|e| e.into_inner()) = Some(slot);
        }
    }

    /// Resolves when the connection is to be closed for never proving itself.
    pub(super) async fn expired(&self) {
        tokio::select! {
            _ = self.closed.cancelled() => {}
            _ = tokio::time::sleep(UNAUTHENTICATED_DEADLINE) => {
                if self.is_proven() {
                    std::future::pending::<()>().await;
                }
            }
        }
    }
}

impl Drop for Probation {
    fn drop(&mut self) {
        if !self.is_proven() {
            self.unproven.take(self.id);
        }
    }
}

/// Whether a TCP request shows who sent it: a valid bearer token or a live console session.
fn proves_itself(state: &ApiState, req: &Request<Incoming>) -> bool {
    let header = req
        .headers()
        .get(hyper::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    match crate::auth::bearer(header) {
        Some(token) => matches!(crate::auth::authenticate(&state.store, token), Ok(Some(_))),
        None => super::ui::has_session(state, req.headers()),
    }
}

/// Closes a connection past the cap at once; a plain-HTTP client is told why, if the kernel
/// takes the few bytes without waiting.
fn refuse<S: RefusedStream>(stream: S, listener: &'static str, max: usize, tls: bool) {
    if !tls {
        let _ = stream.write_now(REFUSAL);
    }
    tracing::debug!(
        listener,
        max,
        "refused a connection: listen.maxConnections are open"
    );
}

trait RefusedStream {
    fn write_now(&self, bytes: &[u8]) -> std::io::Result<usize>;
}

impl RefusedStream for tokio::net::TcpStream {
    fn write_now(&self, bytes: &[u8]) -> std::io::Result<usize> {
        self.try_write(bytes)
    }
}

impl RefusedStream for UnixStream {
    fn write_now(&self, bytes: &[u8]) -> std::io::Result<usize> {
        self.try_write(bytes)
    }
}

/// A TLS acceptor for the PEM certificate chain and private key at these paths. TLS 1.2 and
/// 1.3 only; HTTP/1.1.
pub fn tls_acceptor(cert: &Path, key: &Path) -> Result<TlsAcceptor, ListenError> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let tls_err = |field, path: &Path, message: String| ListenError::Tls {
        field,
        path: path.to_path_buf(),
        message,
    };
    let certs = CertificateDer::pem_file_iter(cert)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .map_err(|err| tls_err("cert", cert, err.to_string()))?;
    if certs.is_empty() {
        return Err(tls_err("cert", cert, "holds no PEM certificate".into()));
    }
    let private_key =
        PrivateKeyDer::from_pem_file(key).map_err(|err| tls_err("key", key, err.to_string()))?;
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .map_err(|err| tls_err("cert", cert, err.to_string()))?
        .with_no_client_auth()
        .with_single_cert(certs, private_key)
        .map_err(|err| tls_err("key", key, format!("does not fit the certificate: {err}")))?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
}

/// Binds the unix socket at `path` (mode 0660, parent directory created). A stale socket file
/// from a daemon that died is removed; a live one is refused.
pub async fn bind_unix(path: &Path) -> Result<UnixListener, ListenError> {
    let socket_err = |source| ListenError::Socket {
        path: path.to_path_buf(),
        source,
    };
    if let Some(parent) = path.parent()
        && !parent.as_os_str().is_empty()
        && !parent.exists()
    {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o755)
            .create(parent)
            .map_err(socket_err)?;
    }
    crate::config::check_socket_dir(path).map_err(|reason| ListenError::UnsafeSocket {
        path: path.to_path_buf(),
        reason,
    })?;
    if path.exists() {
        let answered =
            tokio::time::timeout(Duration::from_secs(2), UnixStream::connect(path)).await;
        if matches!(answered, Ok(Ok(_))) {
            return Err(ListenError::SocketInUse {
                path: path.to_path_buf(),
            });
        }
        std::fs::remove_file(path).map_err(socket_err)?;
    }
    let listener = UnixListener::bind(path).map_err(socket_err)?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o660)).map_err(socket_err)?;
    Ok(listener)
}

/// Binds the TCP listener; without TLS only on a loopback address, so tokens never cross a
/// network in clear text.
pub async fn bind_tcp(addr: &str, tls: bool) -> Result<TcpListener, ListenError> {
    let tcp_err = |source| ListenError::Tcp {
        addr: addr.to_string(),
        source,
    };
    bind_loopback_unless_tls(addr, tls, "127.0.0.1:7480", tcp_err).await
}

/// Binds the preview listener (`listen.preview`); without TLS only on a loopback address.
pub async fn bind_preview(addr: &str, tls: bool) -> Result<TcpListener, ListenError> {
    let preview_err = |source| ListenError::Preview {
        addr: addr.to_string(),
        source,
    };
    bind_loopback_unless_tls(addr, tls, "127.0.0.1:7481", preview_err).await
}

/// Binds `addr` (an address like `example`), refusing one off loopback without TLS.
async fn bind_loopback_unless_tls(
    addr: &str,
    tls: bool,
    example: &str,
    err: impl Fn(std::io::Error) -> ListenError,
) -> Result<TcpListener, ListenError> {
    let parsed: SocketAddr = crate::config::parse_listen_addr(addr).ok_or_else(|| {
        err(std::io::Error::other(format!(
            "not an address like {example}"
        )))
    })?;
    if !tls && !parsed.ip().is_loopback() {
        return Err(err(std::io::Error::other(
            "only loopback addresses are served without TLS (set listen.tls.cert and listen.tls.key)",
        )));
    }
    TcpListener::bind(parsed).await.map_err(err)
}

/// Serves until `state.shutdown` is cancelled, then drains connections and removes the socket.
pub async fn serve(state: Arc<ApiState>, listeners: Listeners) {
    // Every connection holds a sender; when all are dropped, draining is done.
    let (alive, mut drained) = mpsc::channel::<()>(1);
    let shutdown = state.shutdown.clone();
    let max = listeners.max_connections;
    let unix = {
        let state = Arc::clone(&state);
        let alive = alive.clone();
        let slots = Slots::new("unix", max, listeners.metrics.clone());
        tokio::spawn(accept_loop(
            Arc::clone(&state),
            listeners.unix,
            slots,
            max,
            false,
            || false,
            move |stream: UnixStream, _, slot| {
                let caller = Caller::local(unix_identity(&stream));
                spawn_connection(
                    Arc::clone(&state),
                    caller,
                    stream,
                    Held::Slot(slot),
                    alive.clone(),
                );
            },
        ))
    };
    let tls = listeners.tls;
    let tcp = listeners.tcp.map(|listener| {
        let state = Arc::clone(&state);
        let alive = alive.clone();
        let slots = Slots::new("tcp", max, listeners.metrics.clone());
        let unproven = Unproven::new(max);
        let room = unproven.clone();
        let refusal_is_tls = tls.is_some();
        tokio::spawn(accept_loop(
            Arc::clone(&state),
            listener,
            slots,
            max,
            refusal_is_tls,
            move || room.make_room(),
            move |stream, peer: SocketAddr, slot| {
                // Who it is comes from the bearer token of each request.
                let caller = Caller {
                    identity: format!("tcp:{peer}"),
                    transport: Transport::Tcp,
                    admin: false,
                };
                let probation = unproven.admit(slot);
                match &tls {
                    None => spawn_connection(
                        Arc::clone(&state),
                        caller,
                        stream,
                        Held::OnProbation(probation),
                        alive.clone(),
                    ),
                    Some(acceptor) => spawn_tls_connection(
                        Arc::clone(&state),
                        caller,
                        acceptor.clone(),
                        stream,
                        probation,
                        alive.clone(),
                    ),
                }
            },
        ))
    });
    drop(alive);
    shutdown.cancelled().await;
    let _ = unix.await;
    if let Some(tcp) = tcp {
        let _ = tcp.await;
    }
    let _ = std::fs::remove_file(&listeners.unix_path);
    if tokio::time::timeout(DRAIN_DEADLINE, drained.recv())
        .await
        .is_err()
    {
        tracing::warn!("requests still in flight after the drain deadline; closing anyway");
    }
}

/// Accepts on one listener until shutdown: a connection past the cap is refused at once
/// (told why unless `tls`) unless `make_room` closed another, any other is handed to `serve`
/// with its slot.
async fn accept_loop<L: Accept>(
    state: Arc<ApiState>,
    listener: L,
    slots: Slots,
    max: usize,
    tls: bool,
    make_room: impl Fn() -> bool,
    serve: impl Fn(L::Stream, L::Peer, Slot),
) {
    loop {
        let accepted = tokio::select! {
            _ = state.shutdown.cancelled() => return,
            accepted = listener.accept_one() => accepted,
        };
        match accepted {
            Ok((stream, peer)) => match slots
                .take()
                .or_else(|| make_room().then(|| slots.take()).flatten())
            {
                Some(slot) => serve(stream, peer, slot),
                None => refuse(stream, slots.listener, max, tls),
            },
            Err(err) => accept_failed(err).await,
        }
    }
}

/// A listener [`accept_loop`] serves: the unix socket or the TCP address.
trait Accept {
    type Stream: RefusedStream;
    type Peer;
    fn accept_one(
        &self,
    ) -> impl std::future::Future<Output = std::io::Result<(Self::Stream, Self::Peer)>> + Send;
}

impl Accept for UnixListener {
    type Stream = UnixStream;
    type Peer = tokio::net::unix::SocketAddr;
    fn accept_one(
        &self,
    ) -> impl std::future::Future<Output = std::io::Result<(UnixStream, Self::Peer)>> + Send {
        self.accept()
    }
}

impl Accept for TcpListener {
    type Stream = tokio::net::TcpStream;
    type Peer = SocketAddr;
    fn accept_one(
        &self,
    ) -> impl std::future::Future<Output = std::io::Result<(Self::Stream, SocketAddr)>> + Send {
        self.accept()
    }
}

async fn accept_failed(err: std::io::Error) {
    // Out of file descriptors and the like: back off instead of spinning.
    tracing::warn!(error = %err, "accepting a connection failed");
    tokio::time::sleep(Duration::from_millis(100)).await;
}

/// Finishes the TLS handshake off the accept loop, then serves the connection.
fn spawn_tls_connection(
    state: Arc<ApiState>,
    caller: Caller,
    acceptor: TlsAcceptor,
    stream: tokio::net::TcpStream,
    probation: Probation,
    alive: mpsc::Sender<()>,
) {
    tokio::spawn(async move {
        let handshake = tokio::select! {
            handshake = tokio::time::timeout(HANDSHAKE_DEADLINE, acceptor.accept(stream)) => handshake,
            () = probation.expired() => return,
        };
        match handshake {
            Ok(Ok(tls)) => {
                spawn_connection(state, caller, tls, Held::OnProbation(probation), alive)
            }
            Ok(Err(err)) => {
                tracing::debug!(peer = %caller.identity, error = %err, "TLS handshake failed")
            }
            Err(_) => tracing::debug!(peer = %caller.identity, "TLS handshake timed out"),
        }
    });
}

/// How a connection holds its place: its own slot (the unix socket), or on probation until it
/// shows a token (TCP).
enum Held {
    Slot(Slot),
    OnProbation(Probation),
}

fn spawn_connection<S>(
    state: Arc<ApiState>,
    caller: Caller,
    stream: S,
    held: Held,
    alive: mpsc::Sender<()>,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    tokio::spawn(async move {
        let _alive = alive;
        let (_slot, probation) = match held {
            Held::Slot(slot) => (Some(slot), None),
            Held::OnProbation(probation) => (None, Some(Arc::new(probation))),
        };
        let shutdown = state.shutdown.clone();
        let on_probation = probation.clone();
        let served = serve_http1(stream, shutdown, "connection", move |req| {
            if let Some(probation) = &on_probation
                && !probation.is_proven()
                && proves_itself(&state, &req)
            {
                probation.prove();
            }
            routes::handle(Arc::clone(&state), caller.clone(), req)
        });
        match probation {
            None => served.await,
            Some(probation) => tokio::select! {
                () = served => {}
                () = probation.expired() => {
                    tracing::debug!("closed a connection that showed no token in time");
                }
            },
        }
    });
}

/// Serves one HTTP/1 connection with `handle`: headers within [`HEADER_DEADLINE`], upgrades
/// allowed (`berth exec -i`, port-forward and previews relay websockets), and at shutdown the
/// request in flight finishes before the connection closes. `what` names it in the debug log.
pub(super) async fn serve_http1<S, F, Fut, B>(
    stream: S,
    shutdown: CancellationToken,
    what: &'static str,
    handle: F,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    F: Fn(Request<Incoming>) -> Fut + Send + 'static,
    Fut: Future<Output = Response<B>> + Send + 'static,
    B: hyper::body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let service = service_fn(move |req| {
        let response = handle(req);
        async move { Ok::<_, Infallible>(response.await) }
    });
    let conn = http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_DEADLINE)
        .serve_connection(TokioIo::new(stream), service)
        .with_upgrades();
    tokio::pin!(conn);
    let result = tokio::select! {
        result = conn.as_mut() => result,
        _ = shutdown.cancelled() => {
            conn.as_mut().graceful_shutdown();
            conn.await
        }
    };
    if let Err(err) = result
        && !err.is_incomplete_message()
    {
        tracing::debug!(error = %err, "{what} ended with an error");
    }
}

/// `unix:<user>` of the peer, from its socket credentials; the daemon's own user if the
/// kernel will not say.
fn unix_identity(stream: &UnixStream) -> String {
    let uid = stream
        .peer_cred()
        .map(|cred| cred.uid())
        .unwrap_or_else(|_| nix::unistd::getuid().as_raw());
    let name = nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid))
        .ok()
        .flatten()
        .map(|user| user.name)
        .unwrap_or_else(|| uid.to_string());
    format!("unix:{name}")
}
