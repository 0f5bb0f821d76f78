//! The preview listener (`listen.preview`) and the API routes beside it.
//!
//! A request for `<name>--<port>.<previewDomain>` reaches that port in the project's container,
//! and one for `<name>--ide.<previewDomain>` the project's IDE (code-server on
//! [`crate::agent::ide::PORT`], which `berth ide` starts), when it comes from a member:
//! `Authorization: Bearer <token>` (the API's tokens, checked as the API checks them), or the
//! cookie a one-time ticket set for that host. Everyone else gets the same 404, whatever was
//! missing. A member's request wakes an idled project as `berth start` does, counts as activity
//! (source `preview`, or `ide` on the IDE host), and is relayed as it is: bodies stream, and an
//! upgraded connection (websockets) is relayed byte for byte once the container agreed to it.
//! berth's own credentials (the bearer token, the preview cookie) never reach the container.
//!
//! Also here: `POST .../projects/NAME/previewtickets` (a member's ticket for one port) and
//! `GET .../projects/NAME/portforward?port=N` (`berth port-forward`: one connection over a
//! websocket, [`crate::preview::relay`]).

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::header::{
    AUTHORIZATION, CACHE_CONTROL, CONTENT_TYPE, COOKIE, HOST, HeaderValue, LOCATION, SET_COOKIE,
};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::json;
use tokio::net::{TcpListener, UnixStream};
use tokio_rustls::TlsAcceptor;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::protocol::Role;

use super::error::ApiError;
use super::routes::{Outcome, Query, serialized};
use super::server::{HANDSHAKE_DEADLINE, Probation, Slots, Unproven, serve_http1};
use super::{ApiState, Body, Caller, Transport, access, authority};
use crate::inspect::reach::Unreached;
use crate::preview::tickets::{Grant, SESSION_TTL, TICKET_TTL};
use crate::preview::upstream::UpstreamError;
use crate::preview::{Previews, Target};
use crate::store::StoredObject;

/// The cookie a ticket sets on its preview host.
pub const COOKIE_NAME: &str = "berth-preview";
/// The query parameter a ticket arrives in.
pub const TICKET_PARAM: &str = "berth-ticket";
/// How long a request waits for an idled project it woke.
const WAKE_DEADLINE: Duration = Duration::from_secs(120);
/// What every refused preview request reads, whatever was refused.
const NOT_FOUND: &str = "404 page not found\n";

type PreviewBody = BoxBody<Bytes, hyper::Error>;

/// Why a preview request goes no further.
enum Refusal {
    /// The one answer outsiders get: no such host, project or port, no or wrong credentials,
    /// not a member.
    NotFound,
    /// A member's project that cannot take the request now, said in words.
    Unavailable(String),
}

fn text(code: StatusCode, body: &str) -> Response<PreviewBody> {
    let mut response = Response::new(
        Full::new(Bytes::from(body.to_string()))
            .map_err(|never: Infallible| match never {})
            .boxed(),
    );
    *response.status_mut() = code;
    let headers = response.headers_mut();
    headers.insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

fn refused(refusal: Refusal) -> Response<PreviewBody> {
    match refusal {
        Refusal::NotFound => text(StatusCode::NOT_FOUND, NOT_FOUND),
        Refusal::Unavailable(why) => text(StatusCode::SERVICE_UNAVAILABLE, &format!("{why}\n")),
    }
}

/// Serves the preview listener until shutdown.
pub async fn serve_previews(
    state: Arc<ApiState>,
    listener: TcpListener,
    tls: Option<TlsAcceptor>,
    max_connections: usize,
    metrics: Option<Arc<crate::metrics::Metrics>>,
) {
    let Some(previews) = state.previews.clone() else {
        return;
    };
    let slots = Slots::new("preview", max_connections, metrics);
    // As on the API's TCP listener: a connection that has not yet shown a member's credentials
    // holds a small share of the slots for a short while, so idle or anonymous clients never
    // keep a member's browser out.
    let unproven = Unproven::new(max_connections);
    loop {
        let accepted = tokio::select! {
            _ = state.shutdown.cancelled() => return,
            accepted = listener.accept() => accepted,
        };
        let (stream, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(err) => {
                tracing::warn!(error = %err, "accepting a preview connection failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        // Past the cap the connection is dropped at once, unless an unproven one made room.
        let Some(slot) = slots
            .take()
            .or_else(|| unproven.make_room().then(|| slots.take()).flatten())
        else {
            continue;
        };
        let probation = Arc::new(unproven.admit(slot));
        let state = Arc::clone(&state);
        let previews = Arc::clone(&previews);
        let tls = tls.clone();
        tokio::spawn(async move {
            let served = async {
                match tls {
                    None => serve_connection(state, previews, stream, peer, &probation).await,
                    Some(acceptor) => {
                        match tokio::time::timeout(HANDSHAKE_DEADLINE, acceptor.accept(stream))
                            .await
                        {
                            Ok(Ok(stream)) => {
                                serve_connection(state, previews, stream, peer, &probation).await
                            }
                            _ => tracing::debug!(%peer, "preview TLS handshake failed"),
                        }
                    }
                }
            };
            tokio::select! {
                () = served => {}
                () = probation.expired() => {
                    tracing::debug!(%peer, "closed a preview connection that showed no credentials in time");
                }
            }
        });
    }
}

async fn serve_connection<S>(
    state: Arc<ApiState>,
    previews: Arc<Previews>,
    stream: S,
    peer: std::net::SocketAddr,
    probation: &Arc<Probation>,
) where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let shutdown = state.shutdown.clone();
    let probation = Arc::clone(probation);
    serve_http1(stream, shutdown, "preview connection", move |req| {
        let state = Arc::clone(&state);
        let previews = Arc::clone(&previews);
        let probation = Arc::clone(&probation);
        async move { handle(&state, &previews, req, peer, &probation).await }
    })
    .await;
}

/// One preview request: who asks, for which port, then through to the container.
async fn handle(
    state: &Arc<ApiState>,
    previews: &Arc<Previews>,
    mut req: Request<Incoming>,
    peer: std::net::SocketAddr,
    probation: &Probation,
) -> Response<PreviewBody> {
    let requested = req
        .headers()
        .get(HOST)
        .and_then(|h| h.to_str().ok())
        .map(str::to_string)
        .or_else(|| req.uri().authority().map(|a| a.to_string()))
        .unwrap_or_default();
    let Some((name, target, host)) = previews.site.parse_host(&requested) else {
        return refused(Refusal::NotFound);
    };
    let Some(project) = state.store.get(berth_api::Kind::Project, &name) else {
        return refused(Refusal::NotFound);
    };
    let query = Query::parse(req.uri().query());
    if let Some(ticket) = query.get(TICKET_PARAM) {
        return exchange(state, previews, &project, ticket, &host, &req, probation);
    }
    let Some(caller) = credentials(state, previews, &project, &mut req, &host) else {
        return refused(Refusal::NotFound);
    };
    if authority::judge_preview(state, &caller, &name).is_err() {
        return refused(Refusal::NotFound);
    }
    probation.prove();
    let (port, source) = match target {
        Target::Port(port) => (port, Source::Preview),
        Target::Ide => (crate::agent::ide::PORT, Source::Ide),
    };
    let upstream = match open_port(state, previews, &project, port, source).await {
        Ok(upstream) => upstream,
        Err(refusal) => return refused(refusal),
    };
    tracing::debug!(project = %name, port, caller = %caller.identity, source = source.as_str(), "preview");
    forward(
        state,
        &project,
        upstream,
        req,
        Forwarded {
            host: &requested,
            peer,
            tls: previews.site.tls,
        },
        source,
    )
    .await
}

/// What a relayed request counts as, and what a member reads when nothing answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    /// A port of the container (also `berth port-forward`).
    Preview,
    /// The IDE host.
    Ide,
}

impl Source {
    fn as_str(self) -> &'static str {
        match self {
            Source::Preview => "preview",
            Source::Ide => "ide",
        }
    }

    /// The answer when nothing took the request: for a port, the one 404 everyone reads; for
    /// the IDE (only members get this far), how to start it.
    fn nothing_there(self, project: &str) -> Refusal {
        match self {
            Source::Preview => Refusal::NotFound,
            Source::Ide => Refusal::Unavailable(format!(
                "the IDE of project {project} is not running: open it with `berth ide {project}` or the console's Open IDE"
            )),
        }
    }
}

/// The caller of a request with a valid bearer token or a live session cookie for `host`, each
/// for this very project. Berth's own credentials never reach the container, whichever of them
/// let the request in: the preview cookie is always taken out, and so is an `Authorization`
/// header carrying a berth token (valid or not, known by its prefix; another bearer token may be
/// the application's own, and goes on untouched).
fn credentials(
    state: &ApiState,
    previews: &Previews,
    project: &StoredObject,
    req: &mut Request<Incoming>,
    host: &str,
) -> Option<Caller> {
    let headers = req.headers_mut();
    let token = crate::auth::bearer(headers.get(AUTHORIZATION).and_then(|h| h.to_str().ok()))
        .map(str::to_string);
    let user = match token {
        Some(token) => {
            let user = crate::auth::authenticate(&state.store, &token)
                .ok()
                .flatten();
            if user.is_some() || token.starts_with(crate::auth::TOKEN_PREFIX) {
                headers.remove(AUTHORIZATION);
            }
            user
        }
        None => None,
    };
    let (session, others) = take_cookie(headers.get_all(COOKIE).iter());
    headers.remove(COOKIE);
    if !others.is_empty()
        && let Ok(value) = HeaderValue::from_str(&others)
    {
        headers.insert(COOKIE, value);
    }
    if let Some(user) = user {
        return Some(Caller {
            identity: user.name,
            transport: Transport::Tcp,
            admin: user.admin,
        });
    }
    let grant = previews.tickets.session(&session?, host)?;
    grant_caller(state, &grant, project)
}

/// The caller a ticket or session stands for, as it stands now: a removed user is nobody, a
/// demoted admin is no longer one, and a project made again under the name is another project.
fn grant_caller(state: &ApiState, grant: &Grant, project: &StoredObject) -> Option<Caller> {
    if grant.project_uid != project.uid() {
        return None;
    }
    if grant.identity.starts_with("unix:") {
        return Some(Caller::local(grant.identity.clone()));
    }
    let user = state.store.user(&grant.identity).ok()??;
    Some(Caller {
        identity: user.name,
        transport: Transport::Tcp,
        admin: user.admin,
    })
}

/// Berth's session cookie out of `Cookie` headers, and the other cookies joined again.
fn take_cookie<'a>(values: impl Iterator<Item = &'a HeaderValue>) -> (Option<String>, String) {
    let mut session = None;
    let mut others = Vec::new();
    for value in values {
        let Ok(value) = value.to_str() else { continue };
        for pair in value.split(';').map(str::trim).filter(|p| !p.is_empty()) {
            match pair.split_once('=') {
                Some((name, value)) if name.trim() == COOKIE_NAME => {
                    session = Some(value.trim().to_string());
                }
                _ => others.push(pair),
            }
        }
    }
    (session, others.join("; "))
}

/// `?berth-ticket=T`: a valid ticket for this host and project sets the session cookie and
/// sends the browser to the same address without the ticket.
fn exchange(
    state: &ApiState,
    previews: &Previews,
    project: &StoredObject,
    ticket: &str,
    host: &str,
    req: &Request<Incoming>,
    probation: &Probation,
) -> Response<PreviewBody> {
    let Some((cookie, grant)) = previews.tickets.redeem(ticket, host) else {
        return refused(Refusal::NotFound);
    };
    let Some(caller) = grant_caller(state, &grant, project) else {
        return refused(Refusal::NotFound);
    };
    if authority::judge_preview(state, &caller, project.name()).is_err() {
        return refused(Refusal::NotFound);
    }
    probation.prove();
    let rest: Vec<(String, String)> =
        url::form_urlencoded::parse(req.uri().query().unwrap_or_default().as_bytes())
            .filter(|(k, _)| k != TICKET_PARAM)
            .map(|(k, v)| (k.into_owned(), v.into_owned()))
            .collect();
    let mut location = req.uri().path().to_string();
    if !rest.is_empty() {
        location.push('?');
        location.push_str(
            &url::form_urlencoded::Serializer::new(String::new())
                .extend_pairs(rest)
                .finish(),
        );
    }
    let secure = if previews.site.tls { "; Secure" } else { "" };
    let set_cookie = format!(
        "{COOKIE_NAME}={cookie}; Path=/; Max-Age={}; HttpOnly; SameSite=Lax{secure}",
        SESSION_TTL.as_secs()
    );
    let mut response = text(StatusCode::SEE_OTHER, "");
    let headers = response.headers_mut();
    match (
        HeaderValue::from_str(&location),
        HeaderValue::from_str(&set_cookie),
    ) {
        (Ok(location), Ok(set_cookie)) => {
            headers.insert(LOCATION, location);
            headers.insert(SET_COOKIE, set_cookie);
            response
        }
        _ => refused(Refusal::NotFound),
    }
}

/// A member's project made ready (woken when idled; activity recorded) and a connection to
/// its port.
async fn open_port(
    state: &ApiState,
    previews: &Previews,
    project: &StoredObject,
    port: u16,
    source: Source,
) -> Result<UnixStream, Refusal> {
    let deadline = tokio::time::Instant::now() + WAKE_DEADLINE;
    let cancel = state.shutdown.child_token();
    if let Err(e) = crate::tools::wake::ensure_awake(
        &state.store,
        project,
        deadline,
        &cancel,
        source.as_str(),
        crate::tools::wake::Waker {
            by: match source {
                Source::Preview => "a preview request",
                Source::Ide => "an IDE request",
            },
            retry: "send it again",
        },
    )
    .await
    {
        return Err(Refusal::Unavailable(format!(
            "project {} cannot take the request: {e}",
            project.name()
        )));
    }
    state
        .inspector
        .activity
        .record(project.uid(), source.as_str());
    let (runtime, instance) = match state.inspector.reach(project).await {
        Ok(reached) => reached,
        // Not the project's own container: it is as if there were none.
        Err(crate::inspect::InspectError::Unreached(
            Unreached::Foreign(_) | Unreached::Absent(_),
        )) => return Err(Refusal::NotFound),
        Err(e) => return Err(Refusal::Unavailable(e.to_string())),
    };
    match previews
        .upstreams
        .connect(runtime.as_ref(), &instance, project.uid(), port)
        .await
    {
        Ok(stream) => Ok(stream),
        Err(UpstreamError::Socket { .. }) => Err(source.nothing_there(project.name())),
        Err(e) => Err(Refusal::Unavailable(format!(
            "project {}: {e}",
            project.name()
        ))),
    }
}

/// What the container hears of the client, as `X-Forwarded-*` headers.
struct Forwarded<'a> {
    /// The `Host` the client sent, the listener's port included: an application that compares
    /// it with the browser's `Origin` (code-server refuses a websocket whose origin names
    /// another host) finds the two agree.
    host: &'a str,
    peer: std::net::SocketAddr,
    /// The listener speaks HTTPS.
    tls: bool,
}

/// Sends the request on to the container's port and its answer back; an upgrade the
/// container agrees to becomes a byte relay between the two connections.
async fn forward(
    state: &ApiState,
    project: &StoredObject,
    upstream: UnixStream,
    mut req: Request<Incoming>,
    client: Forwarded<'_>,
    source: Source,
) -> Response<PreviewBody> {
    let (mut sender, conn) =
        match hyper::client::conn::http1::handshake(TokioIo::new(upstream)).await {
            Ok(handshake) => handshake,
            Err(_) => return refused(source.nothing_there(project.name())),
        };
    tokio::spawn(async move {
        let _ = conn.with_upgrades().await;
    });
    let downstream = hyper::upgrade::on(&mut req);
    let headers = req.headers_mut();
    for (name, value) in [
        ("x-forwarded-host", client.host.to_string()),
        (
            "x-forwarded-proto",
            if client.tls { "https" } else { "http" }.to_string(),
        ),
        ("x-forwarded-for", client.peer.ip().to_string()),
    ] {
        if let Ok(value) = HeaderValue::from_str(&value) {
            headers.insert(name, value);
        }
    }
    if let Some(path) = req.uri().path_and_query().cloned() {
        *req.uri_mut() = path.into();
    }
    let mut response = match sender.send_request(req).await {
        Ok(response) => response,
        // Nothing listens on the port (the proxy closed at once), or it broke off.
        Err(_) => return refused(source.nothing_there(project.name())),
    };
    if response.status() == StatusCode::SWITCHING_PROTOCOLS {
        let upstream = hyper::upgrade::on(&mut response);
        let session = state
            .inspector
            .activity
            .open(project.uid(), source.as_str());
        tokio::spawn(async move {
            let _session = session;
            if let (Ok(down), Ok(up)) = tokio::join!(downstream, upstream) {
                let _ =
                    tokio::io::copy_bidirectional(&mut TokioIo::new(down), &mut TokioIo::new(up))
                        .await;
            }
        });
    }
    response.map(BodyExt::boxed)
}

/// `POST .../projects/NAME/previewtickets` with `{"port": N}`: a one-time ticket for the
/// caller on that port's preview host, and the URL that carries it.
pub(super) async fn issue_ticket(
    state: &ApiState,
    caller: &Caller,
    name: &str,
    req: Request<Incoming>,
) -> Outcome {
    let project = access::member_project(state, caller, name)?;
    let (parts, incoming) = req.into_parts();
    let bytes = super::body::read(incoming, &parts.headers, 4096).await?;
    let port = serde_json::from_slice::<serde_json::Value>(&bytes)
        .ok()
        .and_then(|v| v.get("port").and_then(serde_json::Value::as_u64))
        .and_then(|p| u16::try_from(p).ok())
        .filter(|p| *p > 0)
        .ok_or_else(|| ApiError::bad_request("port: a port number from 1 to 65535 is required"))?;
    let previews = served(state)?;
    let issued = ticket(previews, caller, &project, Target::Port(port))?;
    Ok(serialized(
        StatusCode::CREATED,
        &json!({
            "apiVersion": berth_api::API_VERSION,
            "kind": "PreviewTicket",
            "project": name,
            "port": port,
            "ticket": issued.ticket,
            "url": issued.url,
            "expiresAt": issued.expires_at,
        }),
    ))
}

/// The previews when the listener serves them; a ticket is worth nothing otherwise.
pub(super) fn served(state: &ApiState) -> Result<&Previews, ApiError> {
    state
        .previews
        .as_deref()
        .filter(|p| p.listening)
        .ok_or_else(|| {
            ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "ServiceUnavailable",
                "previews are not served (listen.preview is empty)",
            )
        })
}

/// A one-time ticket, the URL that carries it, and when it expires (RFC 3339).
pub(super) struct Issued {
    pub ticket: String,
    pub url: String,
    pub expires_at: String,
}

/// A one-time ticket for `caller` on the host of `target` in `project`.
pub(super) fn ticket(
    previews: &Previews,
    caller: &Caller,
    project: &StoredObject,
    target: Target,
) -> Result<Issued, ApiError> {
    let name = project.name();
    let ticket = previews
        .tickets
        .issue(Grant {
            identity: caller.identity.clone(),
            admin: caller.admin,
            project_uid: project.uid().to_string(),
            host: previews.site.target_host(name, target),
        })
        .map_err(|full| {
            ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "ServiceUnavailable",
                full.to_string(),
            )
        })?;
    let url = format!(
        "{}/?{TICKET_PARAM}={ticket}",
        previews.site.target_url(name, target)
    );
    let expires = chrono::Utc::now()
        + chrono::Duration::from_std(TICKET_TTL).unwrap_or(chrono::Duration::zero());
    Ok(Issued {
        ticket,
        url,
        expires_at: expires.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
    })
}

/// `GET .../projects/NAME/portforward?port=N` with a websocket upgrade: one connection to the
/// port in the member's project, relayed over the websocket ([`crate::preview::relay`]).
pub(super) async fn port_forward(
    state: &ApiState,
    caller: &Caller,
    name: &str,
    query: &Query,
    req: Request<Incoming>,
) -> Result<Response<Body>, ApiError> {
    let project = access::member_project(state, caller, name)?;
    let port = query
        .get("port")
        .and_then(|p| p.parse::<u16>().ok())
        .filter(|p| *p > 0)
        .ok_or_else(|| ApiError::bad_request("port: a port number from 1 to 65535 is required"))?;
    let Some(key) = super::attach::websocket_key(&req) else {
        return Err(ApiError::bad_request(
            "portforward needs a websocket upgrade (Upgrade: websocket, Sec-WebSocket-Key)",
        ));
    };
    let previews = state.previews.as_ref().ok_or_else(|| {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "ServiceUnavailable",
            "this server forwards no ports",
        )
    })?;
    let upstream = open_port(state, previews, &project, port, Source::Preview)
        .await
        .map_err(|refusal| match refusal {
            Refusal::NotFound => ApiError::new(
                StatusCode::BAD_GATEWAY,
                "Unreachable",
                format!("nothing in project {name} could be reached on port {port}"),
            ),
            Refusal::Unavailable(why) => {
                ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "Unreachable", why)
            }
        })?;
    tracing::info!(project = name, port, caller = %caller.identity, "port-forward");
    let session = state.inspector.activity.open(project.uid(), "preview");
    tokio::spawn(async move {
        let _session = session;
        if let Ok(upgraded) = hyper::upgrade::on(req).await {
            let socket =
                WebSocketStream::from_raw_socket(TokioIo::new(upgraded), Role::Server, None).await;
            crate::preview::relay::relay(socket, upstream).await;
        }
    });
    super::attach::switching_protocols(&key)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_session_cookie_is_taken_out_and_the_others_kept() {
        let values = [
            HeaderValue::from_static("a=1; berth-preview=s3cret"),
            HeaderValue::from_static("b=2"),
        ];
        let (session, others) = take_cookie(values.iter());
        assert_eq!(session.as_deref(), Some("s3cret"));
        assert_eq!(others, "a=1; b=2");
        let (none, kept) = take_cookie([HeaderValue::from_static("x=y")].iter());
        assert!(none.is_none());
        assert_eq!(kept, "x=y");
    }
}
