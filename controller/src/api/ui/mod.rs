//! The web console under `/ui/`: server-rendered pages with a little progressive JavaScript
//! (vendored into the binary), for the same people and with the same rights as the API.
//!
//! Who is calling comes from the console's own session cookie (set by signing in with a berth
//! token, or with a one-time token `berth ui` asks the daemon for) or an `Authorization:
//! Bearer` header, on either listener: a request through `berth ui`'s loopback port arrives on
//! the unix socket, and whoever merely connects there is not the local admin. A request the
//! session cookie carries that writes or upgrades to a websocket (`exec`, `portforward` under
//! `/ui/api/`) must come from the console's own origin (the `Origin` header names this very
//! scheme, host and port: cookies are not scoped by port, so a page another loopback port
//! serves is same-site with the console) and carry the session's CSRF token (a form field, an
//! `X-CSRF-Token` header, or a `csrf` query parameter on an upgrade, which a browser's
//! websocket cannot give headers). Every read and write goes through
//! the API in process ([`internal`]) as the signed-in caller, so a page shows and does exactly
//! what the API allows that caller: a non-member reads the API's 404 for another's project.

mod html;
mod internal;
mod live;
mod pages;
mod sessions;

use std::sync::Arc;

use bytes::Bytes;
use chrono::Utc;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::header::{
    AUTHORIZATION, CACHE_CONTROL, CONTENT_TYPE, HOST, HeaderMap, HeaderValue, LOCATION, ORIGIN,
    SET_COOKIE, UPGRADE,
};
use hyper::{Method, Request, Response, StatusCode};
use serde_json::{Value, json};

use super::authority::{self, Miss};
use super::error::ApiError;
use super::routes::{Outcome, Query, serialized};
use super::{ApiState, Body, Caller, Transport, access};
use berth_api::wire::API_PREFIX;
use html::{Header, esc, seg};
use internal::Answer;
use pages::{Filter, Project};
pub use sessions::{Principal, Sessions};

/// The console's session cookie.
const COOKIE: &str = "berth-console";
/// The query parameter that carries the session's CSRF token on a websocket upgrade.
const CSRF_PARAM: &str = "csrf";
/// The cookie the sign-in form's CSRF token is checked against before there is a session.
const SIGN_IN_COOKIE: &str = "berth-console-signin";
/// The most a form may hold.
const FORM_LIMIT: usize = 64 * 1024;
/// How much of the runner log the project page starts with.
const LOG_TAIL: usize = 64 * 1024;

const CSS: &str = include_str!("console.css");
const JS: &str = include_str!("console.js");

/// The console's state in the API: its sessions, and whether the TCP listener speaks HTTPS.
#[derive(Debug, Default)]
pub struct Console {
    pub sessions: Sessions,
    /// The TCP listener speaks HTTPS: cookies set there are `Secure`.
    pub tls: bool,
}

/// Whether `path` is the console's.
pub fn serves(path: &str) -> bool {
    path == "/ui" || path.starts_with("/ui/")
}

/// `POST .../uitokens` (admins): a one-time sign-in token for the caller, which `berth ui`
/// puts in the URL it prints.
pub(super) fn mint_sign_in(state: &ApiState, caller: &Caller) -> Outcome {
    access::require_admin(caller, "mint console sign-in tokens")?;
    let by_token = caller.transport == Transport::Tcp;
    let user_id = match by_token {
        true => state.store.user(&caller.identity)?.map(|user| user.id),
        false => None,
    };
    let token = state.console.sessions.mint_sign_in(Principal {
        identity: caller.identity.clone(),
        admin: true,
        by_token,
        user_id,
    });
    let expires = Utc::now()
        + chrono::Duration::from_std(sessions::SIGN_IN_TTL).unwrap_or(chrono::Duration::zero());
    Ok(serialized(
        StatusCode::CREATED,
        &json!({
            "apiVersion": berth_api::API_VERSION,
            "kind": "ConsoleSignIn",
            "token": token,
            "path": format!("/ui/?token={token}"),
            "expiresAt": expires.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        }),
    ))
}

/// One console request on `transport`.
pub async fn handle(
    state: Arc<ApiState>,
    transport: Transport,
    peer: &str,
    req: Request<Incoming>,
) -> Response<Body> {
    let secure = state.console.tls && transport == Transport::Tcp;
    let source = source_address(peer);
    let mut response = match route(&state, secure, source, req).await {
        Ok(response) => response,
        Err(err) => error_page(&err),
    };
    let previews = state.previews.as_ref().map(|p| p.site.csp_source());
    harden(response.headers_mut(), previews.as_deref());
    response
}

/// The console's content security policy; `form-action` gains the preview hosts when there are.
const CSP: &str = "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
                   connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'";

/// What every console answer carries: no caching, no framing, scripts and styles from the
/// console alone, and a referrer only to the console itself (a preview link's ticket stays out
/// of other sites' logs; `no-referrer` would make browsers send `Origin: null` on the console's
/// own forms, which the Origin check refuses). Forms post to the console alone, and a preview
/// form's answer may send the browser on to a preview host (`previews`, a CSP source).
fn harden(headers: &mut HeaderMap, previews: Option<&str>) {
    // A domain no header can carry leaves previews out, never the policy.
    let csp = previews
        .and_then(|p| HeaderValue::from_str(&format!("{CSP} {p}")).ok())
        .unwrap_or(HeaderValue::from_static(CSP));
    headers.insert("content-security-policy", csp);
    let fixed = [
        ("x-content-type-options", "nosniff"),
        ("referrer-policy", "same-origin"),
        ("x-frame-options", "DENY"),
    ];
    for (name, value) in fixed {
        headers.insert(name, HeaderValue::from_static(value));
    }
    headers
        .entry(CACHE_CONTROL)
        .or_insert(HeaderValue::from_static("no-store"));
}

/// Who is asking: a live session (with its CSRF token), or a bearer token's user.
struct Visitor {
    caller: Caller,
    /// Absent for a bearer token: no browser sends one by itself, so no CSRF token is needed.
    session: Option<sessions::Session>,
    cookie: Option<String>,
}

impl Visitor {
    fn header(&self) -> Option<Header<'_>> {
        self.session.as_ref().map(|s| Header {
            identity: &self.caller.identity,
            csrf: &s.csrf,
        })
    }

    fn csrf(&self) -> &str {
        self.session.as_ref().map(|s| s.csrf.as_str()).unwrap_or("")
    }
}

/// Whether a request carries the cookie of a live console session.
pub(super) fn has_session(state: &ApiState, headers: &HeaderMap) -> bool {
    cookie(headers, COOKIE).is_some_and(|value| state.console.sessions.get(value).is_some())
}

fn cookie<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get_all(hyper::header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v)
}

/// The visitor of a request, if signed in or carrying a valid bearer token. A session opened
/// with a user's token ends when the user is removed, and follows the user's admin right.
fn visitor(state: &ApiState, headers: &HeaderMap) -> Result<Option<Visitor>, ApiError> {
    if let Some(value) = cookie(headers, COOKIE)
        && let Some(session) = state.console.sessions.get(value)
    {
        let principal = &session.principal;
        let admin = if principal.by_token {
            match state.store.user(&principal.identity)? {
                // The same user, not another given the name since.
                Some(user) if principal.user_id.as_ref() == Some(&user.id) => user.admin,
                _ => {
                    state.console.sessions.close(value);
                    return Ok(None);
                }
            }
        } else {
            principal.admin
        };
        return Ok(Some(Visitor {
            caller: Caller {
                identity: principal.identity.clone(),
                transport: Transport::Tcp,
                admin,
            },
            session: Some(session.clone()),
            cookie: Some(value.to_string()),
        }));
    }
    if headers.contains_key(AUTHORIZATION) {
        let mut caller = access::authenticate_tcp(state, headers)?;
        caller.transport = Transport::Tcp;
        return Ok(Some(Visitor {
            caller,
            session: None,
            cookie: None,
        }));
    }
    Ok(None)
}

/// Whether the request's `Origin` is the console's own: the scheme this listener speaks and
/// the host and port the browser addressed (its `Host`), default ports made explicit.
fn from_own_origin(headers: &HeaderMap, secure: bool) -> bool {
    let scheme = if secure { "https" } else { "http" };
    let (Some(origin), Some(host)) = (
        headers.get(ORIGIN).and_then(|v| v.to_str().ok()),
        headers.get(HOST).and_then(|v| v.to_str().ok()),
    ) else {
        return false;
    };
    let (Ok(origin), Ok(own)) = (
        url::Url::parse(origin),
        url::Url::parse(&format!("{scheme}://{host}")),
    ) else {
        return false;
    };
    let place = |u: &url::Url| {
        (
            u.scheme().to_string(),
            u.host_str().map(str::to_ascii_lowercase),
            u.port_or_known_default(),
        )
    };
    own.path() == "/" && place(&origin) == place(&own)
}

/// A request that writes (any method but GET and HEAD) or upgrades the connection.
fn acts(method: &Method, headers: &HeaderMap) -> bool {
    (method != Method::GET && method != Method::HEAD) || headers.contains_key(UPGRADE)
}

/// A request a cookie carries that acts must come from the console's own page.
fn require_own_origin(headers: &HeaderMap, secure: bool) -> Result<(), ApiError> {
    if from_own_origin(headers, secure) {
        return Ok(());
    }
    let sent = headers
        .get(ORIGIN)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("none");
    Err(ApiError::forbidden(format!(
        "Origin: {sent} is not this console's own; a request carried by the console's cookie \
         that writes or opens a websocket must come from the console's own page"
    )))
}

/// The address a connection came from, without its port (`tcp:127.0.0.1:40000` is
/// `tcp:127.0.0.1`; a unix socket's peer, `unix:<user>`, is itself): failed sign-ins are
/// counted by it.
fn source_address(peer: &str) -> &str {
    match peer.strip_prefix("tcp:") {
        Some(addr) => addr
            .rsplit_once(':')
            .map_or(peer, |(host, _)| &peer[..4 + host.len()]),
        None => peer,
    }
}

async fn route(
    state: &Arc<ApiState>,
    secure: bool,
    source: &str,
    req: Request<Incoming>,
) -> Outcome {
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let query = Query::parse(req.uri().query());
    if path == "/ui" {
        return Ok(redirect("/ui/"));
    }
    let rest = path.trim_start_matches("/ui/");
    let (entry, params) =
        authority::find(authority::CONSOLE, &method, &path).map_err(|miss| match miss {
            Miss::NotFound => ApiError::not_found(format!("no console page {path}")),
            Miss::Method => ApiError::method_not_allowed(&method, &path),
        })?;
    match (rest, &method) {
        ("static/console.css", &Method::GET) => return Ok(asset("text/css", CSS)),
        ("static/console.js", &Method::GET) => return Ok(asset("text/javascript", JS)),
        ("", &Method::GET) if query.get("token").is_some() => {
            return Ok(redeem_link(
                state,
                secure,
                source,
                query.get("token").unwrap_or_default(),
            ));
        }
        ("signin", &Method::POST) => {
            require_own_origin(req.headers(), secure)?;
            return sign_in(state, secure, source, req).await;
        }
        _ => {}
    }
    let Some(visitor) = visitor(state, req.headers())? else {
        if rest.starts_with("api/") || rest.ends_with("events") {
            return Err(access::unauthorized(
                "sign in to the console, or send Authorization: Bearer <token>",
            ));
        }
        return Ok(sign_in_page(secure, None, StatusCode::OK));
    };
    if visitor.session.is_some() && (entry.upgrade || acts(&method, req.headers())) {
        require_own_origin(req.headers(), secure)?;
    }
    authority::judge(state, &visitor.caller, entry, &params)?;
    let segments: Vec<String> = rest
        .split('/')
        .map(|s| {
            percent_encoding::percent_decode_str(s)
                .decode_utf8_lossy()
                .into_owned()
        })
        .collect();
    let segments: Vec<&str> = segments.iter().map(String::as_str).collect();
    if segments.first() == Some(&"api") {
        return passthrough(state, &visitor, req).await;
    }
    match (segments.as_slice(), &method) {
        ([""], &Method::GET) => fleet(state, &visitor, &query).await,
        (["events"], &Method::GET) => {
            let filter = Filter::from_query(&query);
            let selector = filter.label_selector().map_err(ApiError::bad_request)?;
            live::fleet(state, &visitor.caller, visitor.csrf(), filter, selector).await
        }
        (["signout"], &Method::POST) => sign_out(state, secure, &visitor, req).await,
        (["projects", name], &Method::GET) => {
            project_page(state, &visitor, name, query.get("done"), None).await
        }
        (["projects", name, "events"], &Method::GET) => {
            let offset = query.get("offset").and_then(|o| o.parse().ok());
            live::project(state, &visitor.caller, visitor.csrf(), name, offset).await
        }
        (["projects", name, "preview", port], &Method::POST) => {
            preview(state, &visitor, name, port, req).await
        }
        (["projects", name, "ide"], &Method::POST) => ide(state, &visitor, name, req).await,
        (["projects", name, action], &Method::POST) => {
            act(state, &visitor, name, action, req).await
        }
        _ => Err(ApiError::not_found(format!("no console page {path}"))),
    }
}

fn asset(media: &'static str, text: &'static str) -> Response<Body> {
    let mut response = Response::new(Full::new(Bytes::from_static(text.as_bytes())).boxed());
    let headers = response.headers_mut();
    headers.insert(
        CONTENT_TYPE,
        HeaderValue::from_str(&format!("{media}; charset=utf-8"))
            .unwrap_or(HeaderValue::from_static("text/plain")),
    );
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    response
}

fn html_response(code: StatusCode, html: String) -> Response<Body> {
    let mut response = Response::new(Full::new(Bytes::from(html)).boxed());
    *response.status_mut() = code;
    response.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    response
}

fn redirect(location: &str) -> Response<Body> {
    let mut response = html_response(StatusCode::SEE_OTHER, String::new());
    if let Ok(value) = HeaderValue::from_str(location) {
        response.headers_mut().insert(LOCATION, value);
    }
    response
}

fn set_cookie(response: &mut Response<Body>, value: String) {
    if let Ok(value) = HeaderValue::from_str(&value) {
        response.headers_mut().append(SET_COOKIE, value);
    }
}

/// `name=value` for the console's path only, never readable by scripts, never sent by
/// another site's request, and only over HTTPS when the listener speaks it.
fn cookie_line(name: &str, value: &str, max_age: u64, secure: bool) -> String {
    format!(
        "{name}={value}; Path=/ui/; Max-Age={max_age}; HttpOnly; SameSite=Strict{}",
        if secure { "; Secure" } else { "" }
    )
}

fn error_page(err: &ApiError) -> Response<Body> {
    let main = format!(
        "<h1>{}</h1><p class=\"error\" role=\"alert\">{}</p><p><a href=\"/ui/\">Back to the fleet</a></p>",
        esc(err.code.canonical_reason().unwrap_or("Error")),
        esc(&err.message)
    );
    html_response(err.code, html::page("Error", None, &main))
}

/// The sign-in page, with a fresh pre-session CSRF token in its form and in a cookie.
fn sign_in_page(secure: bool, message: Option<&str>, code: StatusCode) -> Response<Body> {
    let csrf = sessions::secret();
    let mut main = String::from("<h1>Sign in to berth</h1>");
    if let Some(message) = message {
        main.push_str(&format!(
            "<p class=\"error\" role=\"alert\">{}</p>",
            esc(message)
        ));
    }
    main.push_str(&format!(
        "<form method=\"post\" action=\"/ui/signin\" class=\"signin\">\
         <input type=\"hidden\" name=\"csrf\" value=\"{}\">\
         <label for=\"token\">Your berth token</label>\
         <input id=\"token\" name=\"token\" type=\"password\" autocomplete=\"current-password\" required>\
         <p class=\"sub\" id=\"token-help\">The token <code>berth user add</code> printed for you; \
         a local admin runs <code>berth ui</code> instead.</p>\
         <button type=\"submit\">Sign in</button></form>",
        esc(&csrf)
    ));
    let mut response = html_response(code, html::page("Sign in", None, &main));
    set_cookie(
        &mut response,
        cookie_line(SIGN_IN_COOKIE, &csrf, 3600, secure),
    );
    response
}

/// Opens a session for `principal` and sends the browser to the fleet.
fn signed_in(state: &ApiState, secure: bool, principal: Principal) -> Response<Body> {
    let value = match state.console.sessions.open(principal) {
        Ok((value, _)) => value,
        Err(refused) => {
            let code = match refused {
                sessions::Refused::TooOften => StatusCode::TOO_MANY_REQUESTS,
                sessions::Refused::Full => StatusCode::SERVICE_UNAVAILABLE,
            };
            return sign_in_page(secure, Some(&format!("sign-in: {refused}")), code);
        }
    };
    let mut response = redirect("/ui/");
    set_cookie(
        &mut response,
        cookie_line(COOKIE, &value, sessions::SESSION_TTL.as_secs(), secure),
    );
    set_cookie(&mut response, cookie_line(SIGN_IN_COOKIE, "", 0, secure));
    response
}

/// `GET /ui/?token=T`: a one-time sign-in token, used up whatever happens next.
fn redeem_link(state: &ApiState, secure: bool, source: &str, token: &str) -> Response<Body> {
    let sessions = &state.console.sessions;
    if sessions.failing(source) {
        return too_many_failures(secure);
    }
    match sessions.redeem_sign_in(token) {
        Some(principal) => signed_in(state, secure, principal),
        None => {
            sessions.count_failure(source);
            sign_in_page(
                secure,
                Some("This sign-in link was used already or has expired: run berth ui again."),
                StatusCode::UNAUTHORIZED,
            )
        }
    }
}

/// The answer to a source address past its failed sign-ins: 429, with when to try again.
fn too_many_failures(secure: bool) -> Response<Body> {
    let mut response = sign_in_page(
        secure,
        Some("sign-in: too many failed sign-ins from this address; wait a minute and try again."),
        StatusCode::TOO_MANY_REQUESTS,
    );
    let retry = sessions::SIGN_IN_WINDOW.as_secs().to_string();
    if let Ok(value) = hyper::header::HeaderValue::from_str(&retry) {
        response
            .headers_mut()
            .insert(hyper::header::RETRY_AFTER, value);
    }
    response
}

/// A form's fields.
async fn form(req: Request<Incoming>) -> Result<(HeaderMap, Query), ApiError> {
    let (parts, incoming) = req.into_parts();
    let bytes = super::body::read(incoming, &parts.headers, FORM_LIMIT).await?;
    let text =
        std::str::from_utf8(&bytes).map_err(|_| ApiError::bad_request("the form is not UTF-8"))?;
    Ok((parts.headers, Query::parse(Some(text))))
}

/// `POST /ui/signin`: a berth token for a session. A source address that failed too often
/// within the window is refused before its token is looked at.
async fn sign_in(state: &ApiState, secure: bool, source: &str, req: Request<Incoming>) -> Outcome {
    let (headers, fields) = form(req).await?;
    let expected = cookie(&headers, SIGN_IN_COOKIE).unwrap_or_default();
    let sent = fields.get("csrf").unwrap_or_default();
    if expected.is_empty() || !sessions::same(expected, sent) {
        return Ok(sign_in_page(
            secure,
            Some("csrf: the form was not the one this console gave; try again."),
            StatusCode::FORBIDDEN,
        ));
    }
    if state.console.sessions.failing(source) {
        return Ok(too_many_failures(secure));
    }
    let token = fields.get("token").unwrap_or_default().trim();
    match crate::auth::authenticate(&state.store, token)? {
        Some(user) => Ok(signed_in(
            state,
            secure,
            Principal {
                identity: user.name,
                admin: user.admin,
                by_token: true,
                user_id: Some(user.id),
            },
        )),
        None => {
            state.console.sessions.count_failure(source);
            Ok(sign_in_page(
                secure,
                Some("token: that token is not valid."),
                StatusCode::UNAUTHORIZED,
            ))
        }
    }
}

/// The form's fields, once its CSRF token is the session's.
async fn checked_form(visitor: &Visitor, req: Request<Incoming>) -> Result<Query, ApiError> {
    let (_, fields) = form(req).await?;
    match &visitor.session {
        Some(session) if session.check_csrf(fields.get("csrf")) => Ok(fields),
        Some(_) => Err(ApiError::forbidden(
            "csrf: the form's token is not this session's; reload the page and try again",
        )),
        // A bearer token is never sent by a browser on its own: no CSRF to fear.
        None => Ok(fields),
    }
}

async fn sign_out(
    state: &ApiState,
    secure: bool,
    visitor: &Visitor,
    req: Request<Incoming>,
) -> Outcome {
    checked_form(visitor, req).await?;
    if let Some(value) = &visitor.cookie {
        state.console.sessions.close(value);
    }
    let mut response = redirect("/ui/");
    set_cookie(&mut response, cookie_line(COOKIE, "", 0, secure));
    Ok(response)
}

fn projects_path(name: &str, rest: &str) -> String {
    format!("{API_PREFIX}/projects/{}{rest}", seg(name))
}

/// An API answer that failed, as the error the page shows (404 stays 404, naming nothing more
/// than the API did).
fn failed(answer: &Answer) -> ApiError {
    ApiError::new(answer.code, "Failed", answer.message())
}

/// `GET /ui/`: the fleet.
async fn fleet(state: &Arc<ApiState>, visitor: &Visitor, query: &Query) -> Outcome {
    let filter = Filter::from_query(query);
    let (mut projects, error) = match filter.label_selector() {
        Ok(_) => {
            let path = format!(
                "{API_PREFIX}/projects?{}",
                url::form_urlencoded::Serializer::new(String::new())
                    .append_pair("labelSelector", &filter.selector)
                    .finish()
            );
            let answer = internal::call(state, &visitor.caller, Method::GET, &path, None).await;
            if !answer.ok() {
                return Err(failed(&answer));
            }
            let items = answer.body["items"].as_array().cloned().unwrap_or_default();
            let projects: Vec<Project> = items
                .into_iter()
                .map(Project::decode)
                .filter(|p| filter.shows_state(p))
                .collect();
            (projects, None)
        }
        Err(e) => (Vec::new(), Some(e)),
    };
    pages::sort(&mut projects, &filter);
    let main = pages::fleet(
        &projects,
        &filter,
        Utc::now(),
        visitor.csrf(),
        error.as_deref(),
    );
    let code = if error.is_some() {
        StatusCode::BAD_REQUEST
    } else {
        StatusCode::OK
    };
    Ok(html_response(
        code,
        html::page("Fleet", visitor.header().as_ref(), &main),
    ))
}

/// What a finished action says on the page it returns to.
fn done_note(done: &str) -> Option<&'static str> {
    match done {
        "answered" => Some("Your answer was sent to the agent."),
        "start" => Some("Asked to start."),
        "stop" => Some("Asked to stop."),
        "restart" => Some("Asked to restart."),
        "delete" => Some("Asked to delete."),
        _ => None,
    }
}

/// `GET /ui/projects/NAME`: one project; `problem` is the error of a form just sent.
async fn project_page(
    state: &Arc<ApiState>,
    visitor: &Visitor,
    name: &str,
    done: Option<&str>,
    problem: Option<&ApiError>,
) -> Outcome {
    let caller = &visitor.caller;
    let answer = internal::call(state, caller, Method::GET, &projects_path(name, ""), None).await;
    if !answer.ok() {
        return Err(failed(&answer));
    }
    let project = Project::decode(answer.body);
    let (events_path, runtime_path, log_path) = (
        projects_path(name, "/events"),
        projects_path(name, "/runtime"),
        projects_path(name, &format!("/logs?tailBytes={LOG_TAIL}")),
    );
    let (events, runtime, log) = tokio::join!(
        internal::call(state, caller, Method::GET, &events_path, None),
        internal::call(state, caller, Method::GET, &runtime_path, None),
        internal::call(state, caller, Method::GET, &log_path, None),
    );
    let profiles = profiles_of(state, caller, &project).await;
    let now = Utc::now();
    let csrf = esc(visitor.csrf());
    let action = |what: &str| format!("/ui/projects/{}/{what}", seg(name));
    let mut main = format!(
        "<p class=\"crumbs\"><a href=\"/ui/\">Fleet</a> / {}</p><h1>{}</h1>",
        esc(name),
        esc(project.title())
    );
    if let Some(note) = done.and_then(done_note) {
        main.push_str(&format!("<p class=\"note\" role=\"status\">{note}</p>"));
    }
    if let Some(problem) = problem {
        main.push_str(&format!(
            "<p class=\"error\" role=\"alert\">{}</p>",
            esc(&problem.message)
        ));
    }
    main.push_str(&format!(
        "<div id=\"project-live\" data-name=\"{}\" data-offset=\"{}\">{}</div>",
        esc(name),
        log.body["nextOffset"].as_u64().unwrap_or(0),
        pages::project_summary(&project, &events.body, now, visitor.csrf())
    ));
    // The answer form stays put across live updates (what is typed is kept); it shows while
    // the agent waits.
    let hidden = if project.question().is_some() {
        ""
    } else {
        " hidden"
    };
    main.push_str(&format!(
        "<section id=\"answer\" aria-labelledby=\"h-answer\"{hidden}><h2 id=\"h-answer\">Answer the agent</h2>\
         <form method=\"post\" action=\"{}\"><input type=\"hidden\" name=\"csrf\" value=\"{csrf}\">\
         <label for=\"answer-text\">Your answer</label>\
         <textarea id=\"answer-text\" name=\"text\" rows=\"3\" required></textarea>\
         <button type=\"submit\">Send answer</button></form></section>",
        action("answer")
    ));
    main.push_str("<section aria-labelledby=\"h-actions\"><h2 id=\"h-actions\">Actions</h2><div class=\"actions\">");
    for (what, label) in [("start", "Start"), ("stop", "Stop"), ("restart", "Restart")] {
        main.push_str(&format!(
            "<form method=\"post\" action=\"{}\" class=\"inline\"><input type=\"hidden\" name=\"csrf\" value=\"{csrf}\">\
             <button type=\"submit\">{label}</button></form>",
            action(what)
        ));
    }
    main.push_str(&format!(
        "<form method=\"post\" action=\"{}\" class=\"inline\"><input type=\"hidden\" name=\"csrf\" value=\"{csrf}\">\
         <button type=\"submit\" title=\"Start code-server in the container if it is not running, and open it\">Open IDE</button></form>",
        action("ide")
    ));
    main.push_str("</div>");
    if caller.admin {
        main.push_str(&format!(
            "<form method=\"post\" action=\"{}\" class=\"delete\"><input type=\"hidden\" name=\"csrf\" value=\"{csrf}\">\
             <p>A deletion waits while the workspace holds work (unsaved files, commits on no remote, \
             a waiting agent), as <code>berth delete</code> does.</p>\
             <input type=\"checkbox\" id=\"force\" name=\"force\" value=\"true\">\
             <label for=\"force\">Force: delete even what holds work (admins)</label>\
             <button type=\"submit\" class=\"danger\">Delete</button></form>",
            action("delete")
        ));
    } else {
        main.push_str("<p class=\"sub\">Deleting a project is for admins.</p>");
    }
    main.push_str("</section>");
    main.push_str(&format!(
        "<section aria-labelledby=\"h-log\"><h2 id=\"h-log\">Runner log</h2>{}</section>",
        if log.ok() {
            format!(
                "<pre id=\"log\" tabindex=\"0\" aria-label=\"Runner log\">{}</pre>",
                esc(log.body["text"].as_str().unwrap_or_default())
            )
        } else {
            format!(
                "<pre id=\"log\" tabindex=\"0\" aria-label=\"Runner log\" hidden></pre><p class=\"sub\">{}</p>",
                esc(&log.message())
            )
        }
    ));
    main.push_str(&pages::skills(&project, &profiles));
    main.push_str(&format!(
        "<section aria-labelledby=\"h-runtime\"><h2 id=\"h-runtime\">Runtime</h2>{}</section>",
        if runtime.ok() {
            pages::runtime_figures(Ok(&runtime.body))
        } else {
            pages::runtime_figures(Err(&runtime.message()))
        }
    ));
    main.push_str(&format!(
        "<section aria-labelledby=\"h-spec\"><h2 id=\"h-spec\">Spec</h2>{}</section>",
        pages::spec(&project)
    ));
    let code = problem.map(|p| p.code).unwrap_or(StatusCode::OK);
    Ok(html_response(
        code,
        html::page(project.title(), visitor.header().as_ref(), &main),
    ))
}

/// Every AgentProfile the project lists, as the API answers the caller (or why not).
async fn profiles_of(
    state: &Arc<ApiState>,
    caller: &Caller,
    project: &Project,
) -> Vec<(String, Result<Value, String>)> {
    let spec: berth_api::ProjectSpec = project
        .raw
        .get("spec")
        .and_then(|s| serde_json::from_value(s.clone()).ok())
        .unwrap_or_default();
    let mut profiles = Vec::new();
    for name in spec.profiles() {
        let path = format!("{API_PREFIX}/agentprofiles/{}", seg(&name));
        let answer = internal::call(state, caller, Method::GET, &path, None).await;
        let read = if answer.ok() {
            Ok(answer.body)
        } else {
            Err(answer.message())
        };
        profiles.push((name, read));
    }
    profiles
}

/// `POST /ui/projects/NAME/{answer,start,stop,restart,delete}`: the same API calls the CLI
/// makes (`berth answer`, `start`, `stop`, `restart`, `delete [--force]`).
async fn act(
    state: &Arc<ApiState>,
    visitor: &Visitor,
    name: &str,
    action: &str,
    req: Request<Incoming>,
) -> Outcome {
    let fields = checked_form(visitor, req).await?;
    let now = Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    let merge = "application/merge-patch+json";
    let (method, path, body, done): (Method, String, Option<(&str, Value)>, &str) = match action {
        "answer" => {
            let text = fields.get("text").unwrap_or_default();
            (
                Method::POST,
                projects_path(name, "/answer"),
                Some(("application/json", json!({ "text": text }))),
                "answered",
            )
        }
        "start" => (
            Method::PATCH,
            projects_path(name, ""),
            Some((merge, berth_api::power::start_patch(&now))),
            "start",
        ),
        "stop" => (
            Method::PATCH,
            projects_path(name, ""),
            Some((merge, berth_api::power::stop_patch())),
            "stop",
        ),
        "restart" => (
            Method::PATCH,
            projects_path(name, ""),
            Some((merge, berth_api::power::restart_patch(false, &now))),
            "restart",
        ),
        "delete" => {
            let force = fields.get("force") == Some("true");
            let path = if force {
                projects_path(name, "?force=true")
            } else {
                projects_path(name, "")
            };
            (Method::DELETE, path, None, "delete")
        }
        _ => return Err(ApiError::not_found(format!("no console action {action:?}"))),
    };
    let sent = body.as_ref().map(|(media, value)| (*media, value));
    let answer = internal::call(state, &visitor.caller, method, &path, sent).await;
    if !answer.ok() {
        let problem = failed(&answer);
        // The page again, saying what went wrong; a project the caller may not see is the
        // API's 404 page.
        return project_page(state, visitor, name, None, Some(&problem)).await;
    }
    Ok(redirect(&format!("/ui/projects/{}?done={done}", seg(name))))
}

/// `POST /ui/projects/NAME/preview/PORT` (a form, with the session's CSRF token): a one-time
/// preview ticket through the API, and the browser sent to the preview host with it.
async fn preview(
    state: &Arc<ApiState>,
    visitor: &Visitor,
    name: &str,
    port: &str,
    req: Request<Incoming>,
) -> Outcome {
    checked_form(visitor, req).await?;
    let port: u16 = port
        .parse()
        .map_err(|_| ApiError::bad_request(format!("port: {port:?} is not a port number")))?;
    let body = json!({ "port": port });
    let answer = internal::call(
        state,
        &visitor.caller,
        Method::POST,
        &projects_path(name, "/previewtickets"),
        Some(("application/json", &body)),
    )
    .await;
    match answer.body["url"].as_str() {
        Some(url) if answer.ok() => Ok(redirect(url)),
        _ => Err(failed(&answer)),
    }
}

/// `POST /ui/projects/NAME/ide` (a form, with the session's CSRF token): the IDE started
/// through the API if it is not running, and the browser sent to the IDE host with the
/// one-time ticket the API answered; a failure is the project page again, saying why.
async fn ide(
    state: &Arc<ApiState>,
    visitor: &Visitor,
    name: &str,
    req: Request<Incoming>,
) -> Outcome {
    checked_form(visitor, req).await?;
    let answer = internal::call(
        state,
        &visitor.caller,
        Method::POST,
        &projects_path(name, "/ide"),
        None,
    )
    .await;
    match answer.body["url"].as_str() {
        Some(url) if answer.ok() => Ok(redirect(url)),
        _ => project_page(state, visitor, name, None, Some(&failed(&answer))).await,
    }
}

/// `/ui/api/<API path>`: the API itself for the console's JSON calls, as the signed-in caller
/// or a bearer token's user. A write or an upgrade from a session (its origin already checked)
/// needs the session's CSRF token, in `X-CSRF-Token` or, on an upgrade, the `csrf` query
/// parameter, which is taken out before the API sees the query.
async fn passthrough(state: &Arc<ApiState>, visitor: &Visitor, req: Request<Incoming>) -> Outcome {
    let (mut parts, body) = req.into_parts();
    let (in_query, inner) = without_csrf_param(&parts.uri);
    let token = parts
        .headers
        .get("x-csrf-token")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
        .or(in_query);
    if let Some(session) = &visitor.session
        && acts(&parts.method, &parts.headers)
        && !session.check_csrf(token.as_deref())
    {
        return Err(ApiError::forbidden(
            "X-CSRF-Token: a write or websocket from a console session carries the session's \
             CSRF token (the X-CSRF-Token header, or the csrf query parameter on an upgrade)",
        ));
    }
    parts.uri = inner
        .parse()
        .map_err(|_| ApiError::bad_request(format!("{inner}: not a path")))?;
    Ok(super::routes::handle_as(state, &visitor.caller, Request::from_parts(parts, body)).await)
}

/// The `csrf` query parameter, and the API path and query the passthrough sends on: the
/// request's own under `/ui/api`, less that parameter.
fn without_csrf_param(uri: &hyper::Uri) -> (Option<String>, String) {
    let path = uri.path().trim_start_matches("/ui/api").to_string();
    let Some(query) = uri.query() else {
        return (None, path);
    };
    let mut token = None;
    let mut kept = url::form_urlencoded::Serializer::new(String::new());
    for (key, value) in url::form_urlencoded::parse(query.as_bytes()) {
        if key == CSRF_PARAM {
            token.get_or_insert(value.into_owned());
        } else {
            kept.append_pair(&key, &value);
        }
    }
    let inner = match (&token, kept.finish()) {
        (None, _) => format!("{path}?{query}"),
        (Some(_), kept) if kept.is_empty() => path,
        (Some(_), kept) => format!("{path}?{kept}"),
    };
    (token, inner)
}
