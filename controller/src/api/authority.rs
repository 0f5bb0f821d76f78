//! The one authority: every route the API serves, with the right it needs, in one table that
//! the dispatcher reads before any handler runs (and the access matrix test reads to send each
//! route as every kind of caller). A path the table does not hold is answered 404, a method it
//! does not list for the path 405, whoever asks; a handler may narrow a right further (a list
//! shows what the caller may see, admission judges a write), never widen it.
//!
//! The console (`/ui/`) and the preview listener sign their own people in, and read their rows
//! here too: [`CONSOLE`] and [`PREVIEW`].

use hyper::Method;

use super::error::ApiError;
use super::{ApiState, Caller, Transport, access};
use berth_api::wire::API_PREFIX;

/// What a route needs of its caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Authority {
    /// Anyone, with no credential: what it answers holds no names and no secrets.
    Public,
    /// Any known caller; the handler shows and changes only what that caller may.
    Authenticated,
    /// A member of the project the path names (`{project}`), or an admin; anyone else hears
    /// 404, as of a project that does not exist (whether the project exists is then the
    /// handler's to say).
    Member,
    /// Admins only; anyone else 403.
    Admin,
    /// The local administrator on the unix socket (and the controller in process) alone.
    Local,
    /// A project token, for its own project alone: the agent socket's routes ([`AGENT`]).
    ProjectToken,
}

/// One route: its method, its path pattern (`{x}` is one segment, `{rest*}` any number of
/// them, `~` the API prefix), the authority it needs, and whether it upgrades to a websocket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Route {
    pub method: &'static str,
    pub pattern: &'static str,
    pub authority: Authority,
    pub upgrade: bool,
}

const fn route(method: &'static str, pattern: &'static str, authority: Authority) -> Route {
    Route {
        method,
        pattern,
        authority,
        upgrade: false,
    }
}

const fn upgrade(pattern: &'static str, authority: Authority) -> Route {
    Route {
        method: "GET",
        pattern,
        authority,
        upgrade: true,
    }
}

use Authority::{Admin, Authenticated, Local, Member, ProjectToken, Public};

/// Every route of the API, on the unix socket, on TCP and under `/ui/api/`.
pub const ROUTES: &[Route] = &[
    route("GET", "/healthz", Public),
    route("GET", "/livez", Public),
    route("GET", "/readyz", Public),
    route("GET", "/metrics", Public),
    route("GET", "/version", Authenticated),
    route("POST", "~/apply", Authenticated),
    route("GET", "~/events", Authenticated),
    route("POST", "~/uitokens", Admin),
    route("GET", "~/reap", Authenticated),
    route("GET", "~/pool", Authenticated),
    route("GET", "~/trash", Admin),
    route("POST", "~/trash/purge", Admin),
    route("POST", "~/trash/{uid}/restore", Admin),
    route("GET", "~/trash/{uid}/files", Admin),
    route("GET", "~/users", Admin),
    route("POST", "~/users", Admin),
    route("GET", "~/users/{user}", Admin),
    route("DELETE", "~/users/{user}", Admin),
    // Projects. A create may name any project not yet taken, and so may a replace or a
    // server-side apply (PUT, PATCH): their handlers judge membership of an existing project
    // (404 to an outsider) after reading what was sent. Deleting one and changing its
    // resources are for admins, which the handlers check past membership.
    route("GET", "~/projects", Authenticated),
    route("POST", "~/projects", Authenticated),
    route("GET", "~/projects/{project}", Member),
    route("PUT", "~/projects/{project}", Authenticated),
    route("PATCH", "~/projects/{project}", Authenticated),
    route("DELETE", "~/projects/{project}", Member),
    route("GET", "~/projects/{project}/status", Member),
    route("PUT", "~/projects/{project}/status", Local),
    route("GET", "~/projects/{project}/events", Member),
    route("GET", "~/projects/{project}/secrets", Member),
    route("GET", "~/projects/{project}/secrets/{key}", Member),
    route("PUT", "~/projects/{project}/secrets/{key}", Member),
    route("DELETE", "~/projects/{project}/secrets/{key}", Member),
    route("GET", "~/projects/{project}/tools", Member),
    route("GET", "~/projects/{project}/tools/instructions", Member),
    route("POST", "~/projects/{project}/tools/{tool}", Member),
    route(
        "DELETE",
        "~/projects/{project}/tools/executions/{id}",
        Member,
    ),
    route("GET", "~/projects/{project}/runtime", Member),
    upgrade("~/projects/{project}/exec", Member),
    route("POST", "~/projects/{project}/exec", Member),
    route("POST", "~/projects/{project}/answer", Member),
    route("POST", "~/projects/{project}/repairnetwork", Member),
    route("GET", "~/projects/{project}/logs", Member),
    route("GET", "~/projects/{project}/logs/{offset}", Member),
    route("POST", "~/projects/{project}/previewtickets", Member),
    upgrade("~/projects/{project}/portforward", Member),
    route("POST", "~/projects/{project}/ide", Member),
    route("POST", "~/projects/{project}/look", Member),
    route("POST", "~/projects/{project}/forcecheckout", Member),
    route("POST", "~/projects/{project}/forcereplace", Member),
    route("GET", "~/projects/{project}/members", Member),
    route("GET", "~/projects/{project}/members/{user}", Member),
    route("PUT", "~/projects/{project}/members/{user}", Member),
    route("DELETE", "~/projects/{project}/members/{user}", Member),
    // AgentProfiles: every user reads them; admins write them (`/apply` lets anyone send one
    // unchanged, so a user's manifest may list the profile it uses).
    route("GET", "~/agentprofiles", Authenticated),
    route("POST", "~/agentprofiles", Admin),
    route("GET", "~/agentprofiles/{name}", Authenticated),
    route("PUT", "~/agentprofiles/{name}", Admin),
    route("PATCH", "~/agentprofiles/{name}", Admin),
    route("DELETE", "~/agentprofiles/{name}", Admin),
    route("GET", "~/agentprofiles/{name}/status", Authenticated),
    route("PUT", "~/agentprofiles/{name}/status", Local),
    route("GET", "~/agentprofiles/{name}/events", Authenticated),
    // GitSources: a non-admin sees those managing a project it is a member of (404 for the
    // rest, from the handler); admins write them.
    route("GET", "~/gitsources", Authenticated),
    route("POST", "~/gitsources", Admin),
    route("GET", "~/gitsources/{name}", Authenticated),
    route("PUT", "~/gitsources/{name}", Admin),
    route("PATCH", "~/gitsources/{name}", Admin),
    route("DELETE", "~/gitsources/{name}", Admin),
    route("GET", "~/gitsources/{name}/status", Authenticated),
    route("PUT", "~/gitsources/{name}/status", Local),
    route("GET", "~/gitsources/{name}/events", Authenticated),
    route("GET", "~/gitsources/{name}/secrets", Admin),
    route("PUT", "~/gitsources/{name}/secrets/{key}", Admin),
    route("DELETE", "~/gitsources/{name}/secrets/{key}", Admin),
];

/// The console's routes (`/ui/`). Its own pages and server-sent events are for a signed-in
/// visitor (a session cookie or a bearer token), who then reads through the API as itself;
/// `/ui/api/...` is the API, each request judged by its row in [`ROUTES`]. A request the
/// session cookie carries that writes or upgrades also needs the console's own `Origin` and
/// the session's CSRF token.
pub const CONSOLE: &[Route] = &[
    route("GET", "/ui", Public),
    route("GET", "/ui/static/console.css", Public),
    route("GET", "/ui/static/console.js", Public),
    route("POST", "/ui/signin", Public),
    route("GET", "/ui/", Authenticated),
    route("GET", "/ui/events", Authenticated),
    route("POST", "/ui/signout", Authenticated),
    route("GET", "/ui/projects/{project}", Member),
    route("GET", "/ui/projects/{project}/events", Member),
    route("POST", "/ui/projects/{project}/preview/{port}", Member),
    route("POST", "/ui/projects/{project}/{action}", Member),
    route("GET", "/ui/api/{rest*}", Authenticated),
    route("POST", "/ui/api/{rest*}", Authenticated),
    route("PUT", "/ui/api/{rest*}", Authenticated),
    route("PATCH", "/ui/api/{rest*}", Authenticated),
    route("DELETE", "/ui/api/{rest*}", Authenticated),
];

/// The preview listener's one route: any request for `<project>--<port>.<previewDomain>`,
/// upgrades included, from a member (bearer token or the ticket's cookie); everyone else
/// reads one 404.
pub const PREVIEW: &[Route] = &[Route {
    method: "*",
    pattern: "//{project}--{port}.{previewDomain}/{rest*}",
    authority: Member,
    upgrade: true,
}];

/// The agent socket's routes (`api::agent_api`): a project's agent lists and adds its own
/// project's schedules, by the project token its `schedules` capability gave it. Nothing else
/// is reachable there, and a project token opens nothing on the other listeners.
pub const AGENT: &[Route] = &[
    route("GET", "/agent/v1/schedules", ProjectToken),
    route("POST", "/agent/v1/schedules", ProjectToken),
];

/// The placeholders a path bound: each name and its segment(s), percent-decoded.
pub type Params = Vec<(&'static str, String)>;

/// Why a request has no route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Miss {
    /// No route has the path.
    NotFound,
    /// Some route has the path, none the method.
    Method,
}

/// The route of `method path` in `table`, and the segments its placeholders matched.
pub fn find<'t>(
    table: &'t [Route],
    method: &Method,
    path: &str,
) -> Result<(&'t Route, Params), Miss> {
    let mut miss = Miss::NotFound;
    for route in table {
        if let Some(params) = matches(route.pattern, path) {
            if route.method == method.as_str() || route.method == "*" {
                return Ok((route, params));
            }
            miss = Miss::Method;
        }
    }
    Err(miss)
}

/// The placeholders of `pattern` bound to `path`'s segments (percent-decoded), if it matches.
fn matches(pattern: &'static str, path: &str) -> Option<Params> {
    let (pattern, path) = match pattern.strip_prefix('~') {
        Some(rest) => (
            rest,
            path.strip_prefix(API_PREFIX)
                .filter(|p| p.is_empty() || p.starts_with('/'))?,
        ),
        None => (pattern, path),
    };
    // `/ui` (sent on to `/ui/`) and `/ui/` (the fleet) are two routes; elsewhere a trailing
    // slash is no segment.
    if pattern == "/ui" || pattern == "/ui/" {
        return (path == pattern).then(Vec::new);
    }
    let want: Vec<&'static str> = pattern.split('/').filter(|s| !s.is_empty()).collect();
    let have: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let mut params = Vec::new();
    for (i, segment) in want.iter().enumerate() {
        if let Some(name) = segment.strip_prefix('{').and_then(|s| s.strip_suffix("*}")) {
            params.push((name, have.get(i..)?.join("/")));
            return Some(params);
        }
        let got = have.get(i)?;
        match segment.strip_prefix('{').and_then(|s| s.strip_suffix('}')) {
            Some(name) => params.push((
                name,
                percent_encoding::percent_decode_str(got)
                    .decode_utf8_lossy()
                    .into_owned(),
            )),
            None if segment == got => {}
            None => return None,
        }
    }
    (want.len() == have.len()).then_some(params)
}

/// Whether `path` is served to anyone on TCP, without a token.
pub fn is_public(method: &Method, path: &str) -> bool {
    find(ROUTES, method, path).is_ok_and(|(route, _)| route.authority == Public)
}

/// Answers whether `caller` may reach `method path` on the API, before any handler runs:
/// the route's authority, judged once here for every listener and the console.
pub fn admit(
    state: &ApiState,
    caller: &Caller,
    method: &Method,
    path: &str,
) -> Result<(), ApiError> {
    let (route, params) = match find(ROUTES, method, path) {
        Ok(found) => found,
        Err(Miss::NotFound) => return Err(ApiError::not_found(format!("no route for {path}"))),
        Err(Miss::Method) => return Err(ApiError::method_not_allowed(method, path)),
    };
    judge(state, caller, route, &params)
}

/// Whether `caller` has `route`'s authority, given the placeholders the path bound.
pub fn judge(
    state: &ApiState,
    caller: &Caller,
    route: &Route,
    params: &[(&'static str, String)],
) -> Result<(), ApiError> {
    match route.authority {
        Public | Authenticated => Ok(()),
        // An admin may reach a project's routes whatever the project: its events outlive it.
        Member if caller.admin => Ok(()),
        Member => {
            let project = params
                .iter()
                .find(|(name, _)| *name == "project")
                .map(|(_, value)| value.as_str())
                .unwrap_or_default();
            access::member_project(state, caller, project).map(|_| ())
        }
        Admin => access::require_admin(caller, &format!("{} {}", route.method, route.pattern)),
        Local if caller.transport == Transport::Unix => Ok(()),
        Local => Err(ApiError::forbidden(format!(
            "{} {}: only the local administrator on the unix socket",
            route.method, route.pattern
        ))),
        // Judged by the agent socket alone, which finds the project from the token.
        ProjectToken => Err(ApiError::not_found(format!(
            "no route for {}",
            route.pattern
        ))),
    }
}

/// Whether `caller` may reach `project` through the preview listener ([`PREVIEW`]'s row).
pub fn judge_preview(state: &ApiState, caller: &Caller, project: &str) -> Result<(), ApiError> {
    judge(
        state,
        caller,
        &PREVIEW[0],
        &[("project", project.to_string())],
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn found(method: Method, path: &str) -> Option<Route> {
        find(ROUTES, &method, path).ok().map(|(route, _)| *route)
    }

    #[test]
    fn paths_find_their_routes_and_bind_the_project() {
        let exec = format!("{API_PREFIX}/projects/alpha/exec");
        let (route, params) = find(ROUTES, &Method::GET, &exec).unwrap();
        assert!(route.upgrade);
        assert_eq!(route.authority, Member);
        assert_eq!(params, vec![("project", "alpha".to_string())]);
        let encoded = format!("{API_PREFIX}/projects/alpha/members/unix%3Aroot");
        let (_, params) = find(ROUTES, &Method::PUT, &encoded).unwrap();
        assert_eq!(params[1], ("user", "unix:root".to_string()));
        assert_eq!(
            found(Method::GET, &format!("{API_PREFIX}/projects/")).map(|r| r.authority),
            Some(Authenticated)
        );
        assert_eq!(
            find(
                ROUTES,
                &Method::POST,
                &format!("{API_PREFIX}/projects/a/runtime")
            )
            .err(),
            Some(Miss::Method)
        );
        assert_eq!(
            find(ROUTES, &Method::GET, &format!("{API_PREFIX}/widgets")).err(),
            Some(Miss::NotFound)
        );
        assert_eq!(
            find(ROUTES, &Method::GET, "/apis/other/v1/projects").err(),
            Some(Miss::NotFound)
        );
        let tool = format!("{API_PREFIX}/projects/a/tools/executions/e-1");
        assert_eq!(
            found(Method::DELETE, &tool).map(|r| r.authority),
            Some(Member)
        );
    }

    #[test]
    fn only_health_readiness_and_metrics_are_public() {
        for path in ["/healthz", "/livez", "/readyz", "/metrics", "/healthz/"] {
            assert!(is_public(&Method::GET, path), "{path}");
        }
        for path in ["/version", "/healthzz", &format!("{API_PREFIX}/projects")] {
            assert!(!is_public(&Method::GET, path), "{path}");
        }
        assert!(!is_public(&Method::POST, "/metrics"));
    }

    #[test]
    fn every_route_is_listed_once() {
        for table in [ROUTES, CONSOLE, AGENT] {
            for (i, route) in table.iter().enumerate() {
                assert!(
                    !table[..i]
                        .iter()
                        .any(|r| r.method == route.method && r.pattern == route.pattern),
                    "{} {} twice",
                    route.method,
                    route.pattern
                );
                assert_eq!(
                    route.upgrade,
                    route.pattern.ends_with("/exec") && route.method == "GET"
                        || route.pattern.ends_with("/portforward"),
                    "{} {}: only exec and portforward upgrade",
                    route.method,
                    route.pattern
                );
            }
        }
    }

    #[test]
    fn console_paths_find_their_routes() {
        let console = |method: Method, path: &str| {
            find(CONSOLE, &method, path).ok().map(|(r, _)| r.authority)
        };
        assert_eq!(console(Method::GET, "/ui"), Some(Public));
        assert_eq!(console(Method::GET, "/ui/"), Some(Authenticated));
        assert_eq!(console(Method::GET, "/ui/projects/a"), Some(Member));
        assert_eq!(console(Method::POST, "/ui/projects/a/stop"), Some(Member));
        assert_eq!(
            console(Method::GET, &format!("/ui/api{API_PREFIX}/projects/a/exec")),
            Some(Authenticated)
        );
        assert_eq!(console(Method::GET, "/ui/nope"), None);
    }
}
