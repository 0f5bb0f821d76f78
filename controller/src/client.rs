//! The HTTP client for berth's API, spoken over the daemon's unix socket or over TCP.
//!
//! Objects travel as `serde_json::Value`: the client prints, diffs and patches whatever the server
//! returns, so a field added to a kind needs no change here.
//!
//! It speaks `berth_api::wire`'s types and addresses objects by `berth_api::Kind`. Its one TLS
//! trust policy, `tls_config` (the `--certificate-authority` bundle alone, else the system's
//! roots), is the one `berth exec -it`'s websocket uses too.

use std::fmt;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::time::Duration;

use berth_api::Kind;
use berth_api::wire::{ApplyItem, ApplyResult};
use bytes::Bytes;
use futures::{Stream, StreamExt};
use reqwest::{Method, StatusCode};
use serde_json::Value;
use url::Url;

pub use berth_api::API_PREFIX;

/// How long one ordinary request may take; watches have no overall limit.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(120);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Where the daemon listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Server {
    Unix(PathBuf),
    Http(Url),
}

impl Server {
    /// A value starting with `http://` or `https://` is a URL; `unix:///path` or any other
    /// value is a socket path.
    pub fn parse(value: &str) -> Result<Server, ClientError> {
        let trimmed = value.trim();
        if trimmed.is_empty() {
            return Err(ClientError::BadServer(value.to_string()));
        }
        if trimmed.starts_with("http://") || trimmed.starts_with("https://") {
            let url = Url::parse(trimmed).map_err(|_| ClientError::BadServer(value.to_string()))?;
            return Ok(Server::Http(url));
        }
        // LXD spells its socket `unix:///path`; accept that spelling too.
        if let Some(path) = trimmed.strip_prefix("unix://") {
            if path.is_empty() {
                return Err(ClientError::BadServer(value.to_string()));
            }
            return Ok(Server::Unix(PathBuf::from(path)));
        }
        if trimmed.contains("://") {
            return Err(ClientError::BadServer(value.to_string()));
        }
        Ok(Server::Unix(PathBuf::from(trimmed)))
    }
}

impl fmt::Display for Server {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Server::Unix(path) => write!(f, "{}", path.display()),
            Server::Http(url) => write!(f, "{url}"),
        }
    }
}

/// A Kubernetes-style `Status` the server answered a failed request with: the same wire type
/// the server writes.
pub use berth_api::wire::ApiStatus;

/// The `Status` of a failed response; an empty body says which code came back.
pub(crate) fn status_of(code: StatusCode, body: &[u8]) -> Box<ApiStatus> {
    if body.trim_ascii().is_empty() {
        return Box::new(ApiStatus::from_body(
            code.as_u16(),
            format!("the server answered {code}").as_bytes(),
        ));
    }
    Box::new(ApiStatus::from_body(code.as_u16(), body))
}

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("--server {0:?}: expected a unix socket path or an http(s) URL")]
    BadServer(String),
    #[error("cannot reach the berth server at {server}: {reason}")]
    Unreachable { server: String, reason: String },
    #[error("{0}")]
    Api(Box<ApiStatus>),
    #[error("{method} {path}: {reason}")]
    Transport {
        method: Method,
        path: String,
        reason: String,
    },
    #[error("{method} {path}: the server's answer is not valid JSON: {source}")]
    Decode {
        method: Method,
        path: String,
        #[source]
        source: serde_json::Error,
    },
    /// Checked before sending: a server refusing a body mid-upload closes the connection, and
    /// the client would see a broken pipe instead of the server's 413.
    #[error(
        "the apply request is {:.1} MiB, over the server's limit of {} MiB for one apply",
        *.bytes as f64 / f64::from(1u32 << 20),
        .limit >> 20
    )]
    ApplyTooLarge { bytes: usize, limit: usize },
    #[error("cannot build the HTTP client: {0}")]
    Build(#[source] reqwest::Error),
    /// The certificates to trust could not be used.
    #[error("--certificate-authority: {0}")]
    Trust(String),
    #[error("--certificate-authority {}: {source}", path.display())]
    CertificateAuthority {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("--token-file {}: {reason}", path.display())]
    TokenFile { path: PathBuf, reason: String },
    #[error("--token and --token-file (or BERTH_TOKEN and BERTH_TOKEN_FILE) are both set; use one")]
    TwoTokens,
    /// The socket's directory is another user's or writable by others: nothing is sent.
    #[error("refusing the berth server at {}: {reason}", path.display())]
    UnsafeSocket { path: PathBuf, reason: String },
}

impl ClientError {
    /// The server's `Status`, when the failure is one.
    pub fn status(&self) -> Option<&ApiStatus> {
        match self {
            ClientError::Api(status) => Some(status.as_ref()),
            _ => None,
        }
    }

    pub fn is_not_found(&self) -> bool {
        self.status().is_some_and(ApiStatus::is_not_found)
    }

    pub fn is_conflict(&self) -> bool {
        self.status().is_some_and(|s| s.code == 409)
    }
}

/// One line of a `?watch=true` stream, its object as JSON.
pub type WatchEvent = berth_api::wire::WatchEvent<Value>;

pub type WatchStream = Pin<Box<dyn Stream<Item = Result<WatchEvent, ClientError>> + Send>>;

/// What `apply` should do besides writing.
#[derive(Debug, Clone, Default)]
pub struct ApplyOptions {
    pub dry_run: bool,
    /// `(applyset, prune)`: records the inventory and, with prune, deletes what left the set.
    pub applyset: Option<(String, bool)>,
}

/// The one TLS trust policy of a client of `--server https://...`: the certificates of the
/// `--certificate-authority` PEM bundle alone when given, the system's roots otherwise; TLS 1.2
/// or later, like the listener. The API client and `exec -it`'s websocket both use it.
pub fn tls_config(ca_pem: Option<&[u8]>) -> Result<rustls::ClientConfig, ClientError> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;

    let mut roots = rustls::RootCertStore::empty();
    match ca_pem {
        Some(pem) => {
            for cert in CertificateDer::pem_slice_iter(pem) {
                let cert = cert.map_err(|e| ClientError::Trust(e.to_string()))?;
                roots
                    .add(cert)
                    .map_err(|e| ClientError::Trust(e.to_string()))?;
            }
            if roots.is_empty() {
                return Err(ClientError::Trust("holds no PEM certificate".to_string()));
            }
        }
        None => {
            for cert in rustls_native_certs::load_native_certs().certs {
                // A system certificate rustls cannot use is skipped, as browsers do.
                let _ = roots.add(cert);
            }
        }
    }
    let provider = std::sync::Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    Ok(rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| ClientError::Trust(e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth())
}

/// A connection to one berth server.
#[derive(Debug, Clone)]
pub struct Client {
    http: reqwest::Client,
    base: Url,
    server: Server,
    token: Option<String>,
}

impl Client {
    pub fn new(server: Server, token: Option<String>) -> Result<Client, ClientError> {
        Self::with_certificate_authority(server, token, None)
    }

    /// A client that trusts only the PEM certificate(s) in `ca_pem` for an https server (a
    /// self-signed daemon certificate, or the CA that signed it).
    pub fn with_certificate_authority(
        server: Server,
        token: Option<String>,
        ca_pem: Option<&[u8]>,
    ) -> Result<Client, ClientError> {
        let mut builder = reqwest::Client::builder()
            .connect_timeout(CONNECT_TIMEOUT)
            .user_agent(concat!("berth/", env!("CARGO_PKG_VERSION")));
        // The API and `exec -it`'s websocket trust the same certificates.
        builder = builder.tls_backend_preconfigured(tls_config(ca_pem)?);
        if let Server::Unix(path) = &server {
            crate::config::check_socket_dir(path).map_err(|reason| ClientError::UnsafeSocket {
                path: path.clone(),
                reason,
            })?;
        }
        let (builder, base) = match &server {
            Server::Unix(path) => (
                builder.unix_socket(path.as_path()),
                Url::parse("http://localhost/").expect("a constant URL parses"),
            ),
            Server::Http(url) => {
                let mut base = url.clone();
                if !base.path().ends_with('/') {
                    let path = format!("{}/", base.path());
                    base.set_path(&path);
                }
                (builder, base)
            }
        };
        let http = builder.build().map_err(ClientError::Build)?;
        Ok(Client {
            http,
            base,
            server,
            token: token.filter(|t| !t.is_empty()),
        })
    }

    pub fn server(&self) -> &Server {
        &self.server
    }

    /// Any API path, for the endpoints that are not objects (users, secrets, members).
    pub async fn request_json(
        &self,
        method: Method,
        path: &str,
        body: Option<(&'static str, Vec<u8>)>,
    ) -> Result<Value, ClientError> {
        self.call(method, path, &[], body).await
    }

    /// Any API path with a query and a deadline of the caller's: a workspace tool call may run
    /// longer than an ordinary request.
    pub async fn request_json_within(
        &self,
        method: Method,
        path: &str,
        query: &[(&str, &str)],
        body: Option<(&'static str, Vec<u8>)>,
        deadline: Duration,
    ) -> Result<Value, ClientError> {
        self.call_within(method, path, query, body, deadline).await
    }

    /// `GET` any API path with a query.
    pub async fn get_json(&self, path: &str, query: &[(&str, &str)]) -> Result<Value, ClientError> {
        self.call(Method::GET, path, query, None).await
    }

    /// `/apis/berth.dev/v1alpha1/projects[/NAME]`.
    pub fn object_path(resource: Kind, name: Option<&str>) -> String {
        match name {
            Some(name) => format!(
                "{API_PREFIX}/{}/{}",
                resource.plural(),
                encode_segment(name)
            ),
            None => format!("{API_PREFIX}/{}", resource.plural()),
        }
    }

    fn url(&self, path: &str, query: &[(&str, &str)]) -> Url {
        let mut url = self.base.clone();
        let joined = format!("{}{}", self.base.path().trim_end_matches('/'), path);
        url.set_path(&joined);
        if !query.is_empty() {
            url.query_pairs_mut().extend_pairs(query);
        }
        url
    }

    fn request(
        &self,
        method: Method,
        path: &str,
        query: &[(&str, &str)],
    ) -> reqwest::RequestBuilder {
        let mut request = self.http.request(method, self.url(path, query));
        if let Some(token) = &self.token {
            request = request.bearer_auth(token);
        }
        request
    }

    async fn send(
        &self,
        method: Method,
        path: &str,
        request: reqwest::RequestBuilder,
    ) -> Result<Bytes, ClientError> {
        let response = request
            .send()
            .await
            .map_err(|err| self.transport(&method, path, err))?;
        let code = response.status();
        // As kubectl does: the server's warnings go to stderr, and the command carries on.
        for warning in response.headers().get_all(reqwest::header::WARNING) {
            if let Some(text) = warning.to_str().ok().and_then(warning_text) {
                eprintln!("Warning: {text}");
            }
        }
        let body = response
            .bytes()
            .await
            .map_err(|err| self.transport(&method, path, err))?;
        if code.is_success() {
            Ok(body)
        } else {
            Err(ClientError::Api(status_of(code, &body)))
        }
    }

    fn transport(&self, method: &Method, path: &str, err: reqwest::Error) -> ClientError {
        let reason = with_hint(&self.server, root_cause(&err));
        if err.is_connect() {
            return ClientError::Unreachable {
                server: self.server.to_string(),
                reason,
            };
        }
        if err.is_timeout() {
            return ClientError::Transport {
                method: method.clone(),
                path: path.to_string(),
                reason: "timed out waiting for the server".to_string(),
            };
        }
        ClientError::Transport {
            method: method.clone(),
            path: path.to_string(),
            reason,
        }
    }

    /// [`Client::call`] on one kind's collection (`name` `None`) or one object of it.
    async fn object_call(
        &self,
        method: Method,
        resource: Kind,
        name: Option<&str>,
        query: &[(&str, &str)],
        body: Option<(&'static str, Vec<u8>)>,
    ) -> Result<Value, ClientError> {
        let path = Self::object_path(resource, name);
        self.call(method, &path, query, body).await
    }

    /// [`Client::object_call`] sending `body` as JSON of the given media type.
    async fn object_write(
        &self,
        method: Method,
        resource: Kind,
        name: Option<&str>,
        content_type: &'static str,
        body: &Value,
    ) -> Result<Value, ClientError> {
        self.object_call(
            method,
            resource,
            name,
            &[],
            Some((content_type, to_json(body))),
        )
        .await
    }

    async fn call(
        &self,
        method: Method,
        path: &str,
        query: &[(&str, &str)],
        body: Option<(&'static str, Vec<u8>)>,
    ) -> Result<Value, ClientError> {
        self.call_within(method, path, query, body, REQUEST_TIMEOUT)
            .await
    }

    async fn call_within(
        &self,
        method: Method,
        path: &str,
        query: &[(&str, &str)],
        body: Option<(&'static str, Vec<u8>)>,
        deadline: Duration,
    ) -> Result<Value, ClientError> {
        if let Server::Unix(socket) = &self.server {
            check_socket(socket, &self.server)?;
        }
        let mut request = self
            .request(method.clone(), path, query)
            .timeout(deadline)
            .header(reqwest::header::ACCEPT, "application/json");
        if let Some((content_type, bytes)) = body {
            request = request
                .header(reqwest::header::CONTENT_TYPE, content_type)
                .body(bytes);
        }
        let bytes = self.send(method.clone(), path, request).await?;
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Ok(Value::Null);
        }
        serde_json::from_slice(&bytes).map_err(|source| ClientError::Decode {
            method,
            path: path.to_string(),
            source,
        })
    }

    pub async fn get(&self, resource: Kind, name: &str) -> Result<Value, ClientError> {
        self.object_call(Method::GET, resource, Some(name), &[], None)
            .await
    }

    /// `None` when the object does not exist.
    pub async fn get_opt(&self, resource: Kind, name: &str) -> Result<Option<Value>, ClientError> {
        match self.get(resource, name).await {
            Ok(object) => Ok(Some(object)),
            Err(err) if err.is_not_found() => Ok(None),
            Err(err) => Err(err),
        }
    }

    /// The `…List` object, optionally narrowed by a label selector.
    pub async fn list(&self, resource: Kind, selector: Option<&str>) -> Result<Value, ClientError> {
        let query: Vec<(&str, &str)> = selector.map(|s| ("labelSelector", s)).into_iter().collect();
        self.object_call(Method::GET, resource, None, &query, None)
            .await
    }

    pub async fn create(&self, resource: Kind, object: &Value) -> Result<Value, ClientError> {
        self.object_write(Method::POST, resource, None, "application/json", object)
            .await
    }

    /// A JSON merge patch (RFC 7386) of one object.
    pub async fn merge_patch(
        &self,
        resource: Kind,
        name: &str,
        patch: &Value,
    ) -> Result<Value, ClientError> {
        self.object_write(
            Method::PATCH,
            resource,
            Some(name),
            "application/merge-patch+json",
            patch,
        )
        .await
    }

    pub async fn delete(
        &self,
        resource: Kind,
        name: &str,
        force: bool,
    ) -> Result<Value, ClientError> {
        self.delete_with(resource, name, force, false).await
    }

    /// A deletion that may also skip the trash (`purge`, which the server takes only forced).
    pub async fn delete_with(
        &self,
        resource: Kind,
        name: &str,
        force: bool,
        purge: bool,
    ) -> Result<Value, ClientError> {
        let query: &[(&str, &str)] = match (force, purge) {
            (_, true) => &[("force", "true"), ("purge", "true")],
            (true, false) => &[("force", "true")],
            (false, false) => &[],
        };
        self.call(
            Method::DELETE,
            &Self::object_path(resource, Some(name)),
            query,
            None,
        )
        .await
    }

    /// Asks for a fresh look at the workspace of a project being deleted (a held deletion is
    /// looked at again now); answers the project, or 409 when it is not being deleted.
    pub async fn request_look(&self, name: &str) -> Result<Value, ClientError> {
        let path = format!("{}/look", Self::object_path(Kind::Project, Some(name)));
        self.call(Method::POST, &path, &[], None).await
    }

    /// Asks for a project's held checkout to be forced (its workspace copied to the trash
    /// first); answers the project.
    pub async fn request_forced_checkout(&self, name: &str) -> Result<Value, ClientError> {
        let path = format!(
            "{}/forcecheckout",
            Self::object_path(Kind::Project, Some(name))
        );
        self.call(Method::POST, &path, &[], None).await
    }

    /// Re-applies the network configuration of a project's container and restarts its
    /// networking; answers every NIC as LXD reports it afterwards.
    pub async fn repair_network(&self, name: &str) -> Result<Value, ClientError> {
        let path = format!(
            "{}/repairnetwork",
            Self::object_path(Kind::Project, Some(name))
        );
        self.call(Method::POST, &path, &[], None).await
    }

    /// Starts the IDE in a project if it is not running; answers its URL with a one-time
    /// ticket, and whether it was started now. The server may first wake an idled project
    /// (up to 2 min) and then wait for code-server (up to 90 s).
    pub async fn open_ide(&self, name: &str) -> Result<Value, ClientError> {
        let path = format!("{}/ide", Self::object_path(Kind::Project, Some(name)));
        self.call_within(Method::POST, &path, &[], None, Duration::from_secs(300))
            .await
    }

    /// Asks for a project's container to be replaced now whatever it holds outside /workspace
    /// (the old one still goes to the trash); answers the project.
    pub async fn request_forced_replace(&self, name: &str) -> Result<Value, ClientError> {
        let path = format!(
            "{}/forcereplace",
            Self::object_path(Kind::Project, Some(name))
        );
        self.call(Method::POST, &path, &[], None).await
    }

    /// Sends every object in one all-or-nothing call.
    pub async fn apply(
        &self,
        items: Vec<Value>,
        options: &ApplyOptions,
    ) -> Result<Vec<ApplyItem>, ClientError> {
        let mut query: Vec<(&str, &str)> = Vec::new();
        if options.dry_run {
            query.push(("dryRun", "All"));
        }
        if let Some((applyset, prune)) = &options.applyset {
            query.push(("applyset", applyset.as_str()));
            if *prune {
                query.push(("prune", "true"));
            }
        }
        let list = serde_json::json!({"apiVersion": "v1", "kind": "List", "items": items});
        let body = to_json(&list);
        drop(list);
        if body.len() > berth_api::wire::APPLY_LIMIT {
            return Err(ClientError::ApplyTooLarge {
                bytes: body.len(),
                limit: berth_api::wire::APPLY_LIMIT,
            });
        }
        let path = format!("{API_PREFIX}/apply");
        let answer = self
            .call(
                Method::POST,
                &path,
                &query,
                Some(("application/json", body)),
            )
            .await?;
        serde_json::from_value::<ApplyResult>(answer)
            .map(|result| result.items)
            .map_err(|source| ClientError::Decode {
                method: Method::POST,
                path,
                source,
            })
    }

    /// Events for one object, or for every object when `object` is `None`.
    pub async fn events(&self, object: Option<(Kind, &str)>) -> Result<Value, ClientError> {
        let path = match object {
            Some((resource, name)) => format!("{}/events", Self::object_path(resource, Some(name))),
            None => format!("{API_PREFIX}/events"),
        };
        self.call(Method::GET, &path, &[], None).await
    }

    pub async fn version(&self) -> Result<Value, ClientError> {
        self.call(Method::GET, "/version", &[], None).await
    }

    /// Streams changes to one collection as newline-delimited JSON events: an `ADDED` for each
    /// existing object first, then every change.
    pub async fn watch(&self, resource: Kind) -> Result<WatchStream, ClientError> {
        self.watch_path(Self::object_path(resource, None)).await
    }

    /// Like [`Client::watch`], for one object.
    pub async fn watch_object(
        &self,
        resource: Kind,
        name: &str,
    ) -> Result<WatchStream, ClientError> {
        self.watch_path(Self::object_path(resource, Some(name)))
            .await
    }

    async fn watch_path(&self, path: String) -> Result<WatchStream, ClientError> {
        if let Server::Unix(socket) = &self.server {
            check_socket(socket, &self.server)?;
        }
        let response = self
            .request(Method::GET, &path, &[("watch", "true")])
            .header(reqwest::header::ACCEPT, "application/json")
            .send()
            .await
            .map_err(|err| self.transport(&Method::GET, &path, err))?;
        let code = response.status();
        if !code.is_success() {
            let body = response.bytes().await.unwrap_or_default();
            return Err(ClientError::Api(status_of(code, &body)));
        }
        let lines = split_lines(response.bytes_stream());
        Ok(Box::pin(lines.filter_map(move |line| {
            let path = path.clone();
            async move {
                match line {
                    Err(err) => Some(Err(ClientError::Transport {
                        method: Method::GET,
                        path,
                        reason: root_cause(&err),
                    })),
                    Ok(line) if line.iter().all(u8::is_ascii_whitespace) => None,
                    Ok(line) => Some(serde_json::from_slice::<WatchEvent>(&line).map_err(
                        |source| ClientError::Decode {
                            method: Method::GET,
                            path,
                            source,
                        },
                    )),
                }
            }
        })))
    }
}

/// Splits a byte stream into lines, whatever the chunk boundaries; a last line without a newline
/// still counts.
fn split_lines<S>(chunks: S) -> impl Stream<Item = Result<Vec<u8>, reqwest::Error>> + Send
where
    S: Stream<Item = Result<Bytes, reqwest::Error>> + Send + 'static,
{
    struct State<S> {
        chunks: Pin<Box<S>>,
        buffer: Vec<u8>,
        done: bool,
    }
    let state = State {
        chunks: Box::pin(chunks),
        buffer: Vec::new(),
        done: false,
    };
    futures::stream::unfold(state, |mut state| async move {
        loop {
            if let Some(pos) = state.buffer.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = state.buffer.drain(..=pos).collect();
                return Some((Ok(line), state));
            }
            if state.done {
                if state.buffer.is_empty() {
                    return None;
                }
                let line = std::mem::take(&mut state.buffer);
                return Some((Ok(line), state));
            }
            match state.chunks.next().await {
                Some(Ok(chunk)) => state.buffer.extend_from_slice(&chunk),
                Some(Err(err)) => {
                    state.done = true;
                    state.buffer.clear();
                    return Some((Err(err), state));
                }
                None => state.done = true,
            }
        }
    })
}

fn to_json(value: &Value) -> Vec<u8> {
    serde_json::to_vec(value).expect("a serde_json::Value always serialises")
}

/// Percent-encodes one path segment, so a name can never change the path.
pub(crate) fn encode_segment(segment: &str) -> String {
    percent_encoding::utf8_percent_encode(segment, percent_encoding::NON_ALPHANUMERIC)
        .to_string()
        .replace("%2D", "-")
        .replace("%2E", ".")
        .replace("%5F", "_")
}

/// A missing socket is the commonest mistake; say so plainly instead of a connect error.
fn check_socket(socket: &Path, server: &Server) -> Result<(), ClientError> {
    if socket.exists() {
        return Ok(());
    }
    Err(ClientError::Unreachable {
        server: server.to_string(),
        reason: "no such socket (is `berth serve` running? set --server or BERTH_SERVER)"
            .to_string(),
    })
}

/// A transport failure's reason, with what to do about it where the cause is a usual mistake:
/// plain HTTP sent to the TLS listener, or a certificate the client will not trust.
fn with_hint(server: &Server, reason: String) -> String {
    let hint = match server {
        Server::Http(url) if url.scheme() == "http" && reason.contains("invalid HTTP") => {
            let mut https = url.clone();
            let _ = https.set_scheme("https");
            format!(
                "the server does not answer in plain HTTP; if it serves TLS, use --server {}",
                https.as_str().trim_end_matches('/')
            )
        }
        Server::Http(_) if reason.contains("CaUsedAsEndEntity") => {
            "the server's certificate is a CA certificate; serve a server certificate signed by a CA (README, Access)"
                .to_string()
        }
        Server::Http(_) if reason.contains("UnknownIssuer") => {
            "the server's certificate is not signed by a CA this client trusts; name its CA with --certificate-authority FILE (or BERTH_CA_CERT)"
                .to_string()
        }
        _ => return reason,
    };
    format!("{reason} ({hint})")
}

/// The innermost error message, which is the one that says what went wrong.
fn root_cause(err: &(dyn std::error::Error + 'static)) -> String {
    let mut current = err;
    while let Some(next) = current.source() {
        current = next;
    }
    current.to_string()
}

/// The text of a `Warning` header the API sends (`299 - "text"`, RFC 7234's quoting undone);
/// `None` for other codes or a malformed value.
fn warning_text(header: &str) -> Option<String> {
    let quoted = header.strip_prefix("299 - \"")?;
    let mut text = String::with_capacity(quoted.len());
    let mut chars = quoted.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => text.push(chars.next()?),
            '"' => return Some(text),
            c => text.push(c),
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    use berth_api::WatchEventType;

    #[test]
    fn a_warning_header_reads_back_as_its_text() {
        assert_eq!(
            warning_text(r#"299 - "spec.resources.cpu 16 is \"more\" than this host has""#),
            Some(r#"spec.resources.cpu 16 is "more" than this host has"#.to_string())
        );
        assert_eq!(warning_text(r#"199 - "misc""#), None);
        assert_eq!(warning_text(r#"299 - "unterminated"#), None);
    }

    #[test]
    fn servers_parse_as_sockets_or_urls() {
        assert_eq!(
            Server::parse("/run/berth/berth.sock").unwrap(),
            Server::Unix(PathBuf::from("/run/berth/berth.sock"))
        );
        assert_eq!(
            Server::parse("relative.sock").unwrap(),
            Server::Unix(PathBuf::from("relative.sock"))
        );
        assert_eq!(
            Server::parse("unix:///run/berth/berth.sock").unwrap(),
            Server::Unix(PathBuf::from("/run/berth/berth.sock"))
        );
        assert!(matches!(
            Server::parse("http://127.0.0.1:7480").unwrap(),
            Server::Http(_)
        ));
        for bad in ["", "  ", "ftp://host/x", "http://", "unix://"] {
            assert!(Server::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn object_paths_encode_names() {
        assert_eq!(
            Client::object_path(Kind::Project, Some("a b/c")),
            "/apis/berth.dev/v1alpha1/projects/a%20b%2Fc"
        );
    }

    #[test]
    fn status_bodies_and_other_bodies_both_make_errors() {
        let status = br#"{"kind":"Status","status":"Failure","reason":"AlreadyExists","message":"Project \"a\" already exists","code":409}"#;
        let parsed = status_of(StatusCode::CONFLICT, status);
        assert!(parsed.is_already_exists());
        assert_eq!(
            parsed.to_string(),
            "Error from server (AlreadyExists): Project \"a\" already exists"
        );
        let plain = status_of(StatusCode::BAD_GATEWAY, b"upstream gone\nmore");
        assert_eq!(
            plain.to_string(),
            "Error from server (Unknown): upstream gone"
        );
        let empty = status_of(StatusCode::NOT_FOUND, b"");
        assert!(empty.is_not_found());
        assert_eq!(
            empty.to_string(),
            "Error from server (NotFound): the server answered 404 Not Found"
        );
    }

    #[tokio::test]
    async fn watch_lines_survive_any_chunking() {
        let chunks: Vec<Result<Bytes, reqwest::Error>> = vec![
            Ok(Bytes::from_static(b"{\"type\":\"ADDED\",")),
            Ok(Bytes::from_static(b"\"object\":{}}\n{\"type\":\"MODI")),
            Ok(Bytes::from_static(
                b"FIED\",\"object\":{}}\n\n{\"type\":\"DELETED\",\"object\":{}}",
            )),
        ];
        let lines: Vec<Vec<u8>> = split_lines(futures::stream::iter(chunks))
            .map(|line| line.expect("no transport error"))
            .collect()
            .await;
        let events: Vec<WatchEventType> = lines
            .iter()
            .filter(|l| !l.iter().all(u8::is_ascii_whitespace))
            .map(|l| serde_json::from_slice::<WatchEvent>(l).unwrap().type_)
            .collect();
        assert_eq!(
            events,
            [
                WatchEventType::Added,
                WatchEventType::Modified,
                WatchEventType::Deleted
            ]
        );
    }

    /// A one-shot HTTP server on loopback that records the request it got.
    fn answer_once(response: String) -> (String, std::thread::JoinHandle<String>) {
        use std::io::{Read, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let handle = std::thread::spawn(move || {
            let (mut stream, _) = listener.accept().unwrap();
            stream
                .set_read_timeout(Some(Duration::from_secs(30)))
                .unwrap();
            let mut request = Vec::new();
            let mut buf = [0u8; 4096];
            // Read the head, then as much body as it announces, before answering.
            let complete = |request: &[u8]| {
                let Some(end) = request.windows(4).position(|w| w == b"\r\n\r\n") else {
                    return false;
                };
                let head = String::from_utf8_lossy(&request[..end]).to_ascii_lowercase();
                let length = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length:"))
                    .and_then(|v| v.trim().parse::<usize>().ok())
                    .unwrap_or(0);
                request.len() >= end + 4 + length
            };
            while !complete(&request) {
                let n = stream.read(&mut buf).unwrap();
                if n == 0 {
                    break;
                }
                request.extend_from_slice(&buf[..n]);
            }
            stream.write_all(response.as_bytes()).unwrap();
            String::from_utf8_lossy(&request).into_owned()
        });
        (url, handle)
    }

    #[tokio::test]
    async fn the_token_travels_as_a_bearer_header_and_selectors_as_a_query() {
        let body = r#"{"apiVersion":"berth.dev/v1alpha1","kind":"ProjectList","items":[]}"#;
        let response = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        );
        let (url, server) = answer_once(response);
        let client = Client::new(Server::parse(&url).unwrap(), Some("s3cret".to_string())).unwrap();
        let list = client
            .list(Kind::Project, Some("team=a,tier!=dev"))
            .await
            .unwrap();
        assert_eq!(list["kind"], "ProjectList");
        let request = server.join().unwrap();
        let first_line = request.lines().next().unwrap();
        assert_eq!(
            first_line,
            "GET /apis/berth.dev/v1alpha1/projects?labelSelector=team%3Da%2Ctier%21%3Ddev HTTP/1.1"
        );
        assert!(
            request
                .to_ascii_lowercase()
                .contains("authorization: bearer s3cret\r\n"),
            "{request}"
        );
    }

    #[tokio::test]
    async fn apply_sends_one_list_with_dry_run_and_applyset_in_the_query() {
        let body = r#"{"kind":"ApplyResult","items":[{"kind":"Project","name":"a","action":"created","object":{}}]}"#;
        let response = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        );
        let (url, server) = answer_once(response);
        let client = Client::new(Server::parse(&url).unwrap(), None).unwrap();
        let options = ApplyOptions {
            dry_run: true,
            applyset: Some(("fleet".to_string(), true)),
        };
        let outcomes = client
            .apply(vec![serde_json::json!({"kind": "Project"})], &options)
            .await
            .unwrap();
        assert_eq!(outcomes[0].action, "created");
        let request = server.join().unwrap();
        assert_eq!(
            request.lines().next().unwrap(),
            "POST /apis/berth.dev/v1alpha1/apply?dryRun=All&applyset=fleet&prune=true HTTP/1.1"
        );
        assert!(
            !request.to_ascii_lowercase().contains("authorization:"),
            "{request}"
        );
    }
}
