//! Who may do what over TCP, as a table: every request is sent as each kind of caller (no token,
//! a bad token, a user who is not a member, a member, an admin) to a real daemon on loopback,
//! and the answer's code is checked against the row.

use crate::harness::project;
use crate::support::daemon::{Daemon, TcpClient};
use berth::api::authority;
use serde_json::{Value, json};

const P: &str = "/apis/berth.dev/v1alpha1";

/// The callers, in the order of each row's expected codes.
const WHO: [&str; 5] = ["none", "bad", "outsider", "member", "admin"];

fn profile(name: &str) -> Value {
    json!({"apiVersion": "berth.dev/v1alpha1", "kind": "AgentProfile", "metadata": {"name": name},
           "spec": {"home": "/root/.shell", "runner": {"command": ["sh"]}, "install": {"check": "true"}}})
}

/// One request, run as each caller after its `setup` (sent on the unix socket as the local
/// admin). `{who}` in paths and bodies is the caller's name, so writes do not collide.
struct Row {
    what: &'static str,
    setup: &'static [(&'static str, &'static str, &'static str)],
    method: &'static str,
    path: &'static str,
    content_type: &'static str,
    body: &'static str,
    expect: [u16; 5],
}

const JSON: &str = "application/json";
const MERGE: &str = "application/merge-patch+json";
const ANON: [u16; 2] = [401, 401];

fn rows() -> Vec<Row> {
    let row = |what, method, path, body: &'static str, expect: [u16; 3]| Row {
        what,
        setup: &[],
        method,
        path,
        content_type: if body.starts_with("{\"spec\"") {
            MERGE
        } else {
            JSON
        },
        body,
        expect: [ANON[0], ANON[1], expect[0], expect[1], expect[2]],
    };
    let with = |mut row: Row, setup| {
        row.setup = setup;
        row
    };
    vec![
        // Health, readiness and metrics hold no names and no secrets: no token needed.
        Row {
            expect: [200; 5],
            ..row("healthz", "GET", "/healthz", "", [200; 3])
        },
        Row {
            expect: [200; 5],
            ..row("livez", "GET", "/livez", "", [200; 3])
        },
        Row {
            expect: [200; 5],
            ..row("readyz", "GET", "/readyz", "", [200; 3])
        },
        row(
            "version needs a token",
            "GET",
            "/version",
            "",
            [200, 200, 200],
        ),
        row("list projects", "GET", "/P/projects", "", [200, 200, 200]),
        row(
            "get a project",
            "GET",
            "/P/projects/alpha",
            "",
            [404, 200, 200],
        ),
        row(
            "get a missing project",
            "GET",
            "/P/projects/nope",
            "",
            [404, 404, 404],
        ),
        row(
            "delete a missing project",
            "DELETE",
            "/P/projects/nope",
            "",
            [404, 404, 404],
        ),
        row(
            "list members of a missing project",
            "GET",
            "/P/projects/nope/members",
            "",
            [404, 404, 404],
        ),
        row(
            "project status",
            "GET",
            "/P/projects/alpha/status",
            "",
            [404, 200, 200],
        ),
        row(
            "project events",
            "GET",
            "/P/projects/alpha/events",
            "",
            [404, 200, 200],
        ),
        row(
            "create a project",
            "POST",
            "/P/projects",
            r#"{"apiVersion":"berth.dev/v1alpha1","kind":"Project","metadata":{"name":"new-{who}"},"spec":{}}"#,
            [201, 201, 201],
        ),
        row(
            "create a project with resources",
            "POST",
            "/P/projects",
            r#"{"apiVersion":"berth.dev/v1alpha1","kind":"Project","metadata":{"name":"big-{who}"},"spec":{"resources":{"cpu":"64"}}}"#,
            [403, 403, 201],
        ),
        row(
            "a file:// repository outside allowedFileRoots",
            "POST",
            "/P/projects",
            r#"{"apiVersion":"berth.dev/v1alpha1","kind":"Project","metadata":{"name":"file-{who}"},"spec":{"repo":{"url":"file:///etc/secret-repo"}}}"#,
            [403, 403, 201],
        ),
        row(
            "a file:// repository under allowedFileRoots",
            "POST",
            "/P/projects",
            r#"{"apiVersion":"berth.dev/v1alpha1","kind":"Project","metadata":{"name":"ok-file-{who}"},"spec":{"repo":{"url":"file:///srv/berth-repos/app.git"}}}"#,
            [201, 201, 201],
        ),
        row(
            "change a project's brief",
            "PATCH",
            "/P/projects/alpha",
            r#"{"spec":{"brief":"by {who}"}}"#,
            [404, 200, 200],
        ),
        row(
            "change a project's resources",
            "PATCH",
            "/P/projects/alpha",
            r#"{"spec":{"resources":{"cpu":"3"}}}"#,
            [404, 403, 200],
        ),
        row(
            "write project status over TCP",
            "PUT",
            "/P/projects/alpha/status",
            r#"{"status":{"phase":"Ready"}}"#,
            [403, 403, 403],
        ),
        with(
            row(
                "delete a project",
                "DELETE",
                "/P/projects/doomed-{who}",
                "",
                [404, 403, 200],
            ),
            &[
                (
                    "POST",
                    "/P/projects",
                    r#"{"apiVersion":"berth.dev/v1alpha1","kind":"Project","metadata":{"name":"doomed-{who}"},"spec":{}}"#,
                ),
                ("PUT", "/P/projects/doomed-{who}/members/mia", ""),
            ],
        ),
        row(
            "list members",
            "GET",
            "/P/projects/alpha/members",
            "",
            [404, 200, 200],
        ),
        with(
            row(
                "add a member",
                "PUT",
                "/P/projects/alpha/members/extra",
                "",
                [404, 201, 201],
            ),
            &[("DELETE", "/P/projects/alpha/members/extra", "")],
        ),
        with(
            row(
                "remove a member",
                "DELETE",
                "/P/projects/alpha/members/extra",
                "",
                [404, 200, 200],
            ),
            &[("PUT", "/P/projects/alpha/members/extra", "")],
        ),
        with(
            row(
                "remove the last member",
                "DELETE",
                "/P/projects/solo/members/mia",
                "",
                [404, 403, 200],
            ),
            &[("PUT", "/P/projects/solo/members/mia", "")],
        ),
        row(
            "list secrets",
            "GET",
            "/P/projects/alpha/secrets",
            "",
            [404, 200, 200],
        ),
        row(
            "read a secret",
            "GET",
            "/P/projects/alpha/secrets/API_KEY",
            "",
            [404, 200, 200],
        ),
        row(
            "set a secret",
            "PUT",
            "/P/projects/alpha/secrets/SET_BY_{who}",
            r#"{"value":"v"}"#,
            [404, 200, 200],
        ),
        with(
            row(
                "delete a secret",
                "DELETE",
                "/P/projects/alpha/secrets/TMP",
                "",
                [404, 200, 200],
            ),
            &[("PUT", "/P/projects/alpha/secrets/TMP", r#"{"value":"t"}"#)],
        ),
        row("list users", "GET", "/P/users", "", [403, 403, 200]),
        row(
            "add a user",
            "POST",
            "/P/users",
            r#"{"name":"u-{who}"}"#,
            [403, 403, 201],
        ),
        with(
            row(
                "remove a user",
                "DELETE",
                "/P/users/gone-{who}",
                "",
                [403, 403, 200],
            ),
            &[("POST", "/P/users", r#"{"name":"gone-{who}"}"#)],
        ),
        row(
            "list agentprofiles",
            "GET",
            "/P/agentprofiles",
            "",
            [200, 200, 200],
        ),
        row(
            "apply an agentprofile unchanged",
            "POST",
            "/P/apply",
            r#"{"apiVersion":"v1","kind":"List","items":[{"apiVersion":"berth.dev/v1alpha1","kind":"AgentProfile","metadata":{"name":"shell"},"spec":{"home":"/root/.shell","runner":{"command":["sh"]},"install":{"check":"true"}}}]}"#,
            [200, 200, 200],
        ),
        row(
            "apply an agentprofile changed",
            "POST",
            "/P/apply",
            r#"{"apiVersion":"v1","kind":"List","items":[{"apiVersion":"berth.dev/v1alpha1","kind":"AgentProfile","metadata":{"name":"shell-{who}"},"spec":{"home":"/root/.shell","runner":{"command":["sh"]},"install":{"check":"true"}}}]}"#,
            [403, 403, 200],
        ),
        row(
            "get an agentprofile",
            "GET",
            "/P/agentprofiles/shell",
            "",
            [200, 200, 200],
        ),
        row(
            "create an agentprofile",
            "POST",
            "/P/agentprofiles",
            r#"{"apiVersion":"berth.dev/v1alpha1","kind":"AgentProfile","metadata":{"name":"prof-{who}"},"spec":{"home":"/root/.p","runner":{"command":["sh"]},"install":{"check":"true"}}}"#,
            [403, 403, 201],
        ),
        with(
            row(
                "delete an agentprofile",
                "DELETE",
                "/P/agentprofiles/doomed-{who}",
                "",
                [403, 403, 200],
            ),
            &[(
                "POST",
                "/P/agentprofiles",
                r#"{"apiVersion":"berth.dev/v1alpha1","kind":"AgentProfile","metadata":{"name":"doomed-{who}"},"spec":{"home":"/root/.p","runner":{"command":["sh"]},"install":{"check":"true"}}}"#,
            )],
        ),
        row(
            "apply a project and a profile in one list",
            "POST",
            "/P/apply",
            r#"{"apiVersion":"v1","kind":"List","items":[{"apiVersion":"berth.dev/v1alpha1","kind":"Project","metadata":{"name":"set-{who}"},"spec":{}},{"apiVersion":"berth.dev/v1alpha1","kind":"AgentProfile","metadata":{"name":"set-{who}"},"spec":{"home":"/root/.p","runner":{"command":["sh"]},"install":{"check":"true"}}}]}"#,
            [403, 403, 200],
        ),
        row(
            "create a gitsource",
            "POST",
            "/P/gitsources",
            r#"{"apiVersion":"berth.dev/v1alpha1","kind":"GitSource","metadata":{"name":"git-{who}"},"spec":{"url":"https://git.example/fleet.git","ref":"main"}}"#,
            [403, 403, 201],
        ),
        row(
            "list gitsources",
            "GET",
            "/P/gitsources",
            "",
            [200, 200, 200],
        ),
        row(
            "apply a project",
            "POST",
            "/P/apply",
            r#"{"apiVersion":"v1","kind":"List","items":[{"apiVersion":"berth.dev/v1alpha1","kind":"Project","metadata":{"name":"applied-{who}"},"spec":{}}]}"#,
            [200, 200, 200],
        ),
        with(
            row(
                "apply over an existing project",
                "POST",
                "/P/apply",
                r#"{"apiVersion":"v1","kind":"List","items":[{"apiVersion":"berth.dev/v1alpha1","kind":"Project","metadata":{"name":"solo"},"spec":{"brief":"x"}}]}"#,
                [404, 200, 200],
            ),
            &[("PUT", "/P/projects/solo/members/mia", "")],
        ),
        Row {
            expect: [200; 5],
            ..row("metrics", "GET", "/metrics", "", [200; 3])
        },
        row("recent events", "GET", "/P/events", "", [200, 200, 200]),
        row(
            "what the reaper would do",
            "GET",
            "/P/reap",
            "",
            [200, 200, 200],
        ),
        row("the warm pool", "GET", "/P/pool", "", [200, 200, 200]),
        row(
            "mint a console sign-in token",
            "POST",
            "/P/uitokens",
            "",
            [403, 403, 201],
        ),
        row("list the trash", "GET", "/P/trash", "", [403, 403, 503]),
        row(
            "list every controller's trash",
            "GET",
            "/P/trash?all=true",
            "",
            [403, 403, 503],
        ),
        row(
            "purge the trash",
            "POST",
            "/P/trash/purge",
            "",
            [403, 403, 503],
        ),
        row(
            "restore from the trash",
            "POST",
            "/P/trash/nope/restore",
            "",
            [403, 403, 503],
        ),
        row(
            "read a file from the trash",
            "GET",
            "/P/trash/nope/files?path=/etc/hostname",
            "",
            [403, 403, 503],
        ),
        row("get a user", "GET", "/P/users/mia", "", [403, 403, 200]),
        row(
            "replace a project",
            "PUT",
            "/P/projects/alpha",
            r#"{"apiVersion":"berth.dev/v1alpha1","kind":"Project","metadata":{"name":"alpha"},"spec":{"brief":"put by {who}"}}"#,
            // A member's replace may leave out the resources it may not change: they stay.
            [404, 200, 200],
        ),
        row(
            "replace a missing project",
            "PUT",
            "/P/projects/put-{who}",
            r#"{"apiVersion":"berth.dev/v1alpha1","kind":"Project","metadata":{"name":"put-{who}"},"spec":{}}"#,
            [404, 404, 404],
        ),
        row(
            "project tools",
            "GET",
            "/P/projects/alpha/tools",
            "",
            [404, 200, 200],
        ),
        row(
            "project tool instructions",
            "GET",
            "/P/projects/alpha/tools/instructions",
            "",
            [404, 503, 503],
        ),
        row(
            "call a project tool",
            "POST",
            "/P/projects/alpha/tools/nope",
            "{}",
            [404, 400, 400],
        ),
        row(
            "cancel a tool execution",
            "DELETE",
            "/P/projects/alpha/tools/executions/nope",
            "",
            [404, 200, 200],
        ),
        row(
            "runtime figures",
            "GET",
            "/P/projects/alpha/runtime",
            "",
            [404, 503, 503],
        ),
        row(
            "exec without an upgrade",
            "GET",
            "/P/projects/alpha/exec?command=true",
            "",
            [404, 400, 400],
        ),
        row(
            "exec",
            "POST",
            "/P/projects/alpha/exec",
            r#"{"command":["true"]}"#,
            [404, 503, 503],
        ),
        row(
            "answer the agent",
            "POST",
            "/P/projects/alpha/answer",
            r#"{"text":"yes"}"#,
            [404, 503, 503],
        ),
        row(
            "repair the network",
            "POST",
            "/P/projects/alpha/repairnetwork",
            "",
            [404, 503, 503],
        ),
        row(
            "runner log",
            "GET",
            "/P/projects/alpha/logs",
            "",
            [404, 404, 404],
        ),
        row(
            "runner log at an offset",
            "GET",
            "/P/projects/alpha/logs/0",
            "",
            [404, 404, 404],
        ),
        row(
            "a preview ticket",
            "POST",
            "/P/projects/alpha/previewtickets",
            r#"{"port":8000}"#,
            [404, 201, 201],
        ),
        row(
            "port-forward without an upgrade",
            "GET",
            "/P/projects/alpha/portforward?port=8000",
            "",
            [404, 400, 400],
        ),
        row(
            "open the IDE",
            "POST",
            "/P/projects/alpha/ide",
            "",
            [404, 503, 503],
        ),
        row(
            "look again",
            "POST",
            "/P/projects/alpha/look",
            "",
            [404, 409, 409],
        ),
        row(
            "force a held checkout",
            "POST",
            "/P/projects/alpha/forcecheckout",
            "",
            [404, 200, 200],
        ),
        row(
            "force a replacement",
            "POST",
            "/P/projects/alpha/forcereplace",
            "",
            [404, 200, 200],
        ),
        row(
            "get a member",
            "GET",
            "/P/projects/alpha/members/mia",
            "",
            [404, 200, 200],
        ),
        row(
            "replace an agentprofile",
            "PUT",
            "/P/agentprofiles/shell",
            r#"{"apiVersion":"berth.dev/v1alpha1","kind":"AgentProfile","metadata":{"name":"shell"},"spec":{"home":"/root/.shell","runner":{"command":["sh","-l"]},"install":{"check":"true"}}}"#,
            [403, 403, 200],
        ),
        row(
            "change an agentprofile",
            "PATCH",
            "/P/agentprofiles/shell",
            r#"{"spec":{"install":{"check":"true "}}}"#,
            [403, 403, 200],
        ),
        row(
            "agentprofile status",
            "GET",
            "/P/agentprofiles/shell/status",
            "",
            [200, 200, 200],
        ),
        row(
            "write agentprofile status over TCP",
            "PUT",
            "/P/agentprofiles/shell/status",
            r#"{"status":{}}"#,
            [403, 403, 403],
        ),
        row(
            "agentprofile events",
            "GET",
            "/P/agentprofiles/shell/events",
            "",
            [200, 200, 200],
        ),
        with(
            row(
                "get a gitsource",
                "GET",
                "/P/gitsources/gs",
                "",
                [404, 404, 200],
            ),
            &[(
                "POST",
                "/P/gitsources",
                r#"{"apiVersion":"berth.dev/v1alpha1","kind":"GitSource","metadata":{"name":"gs"},"spec":{"url":"https://git.example/fleet.git","ref":"main"}}"#,
            )],
        ),
        with(
            row(
                "replace a gitsource",
                "PUT",
                "/P/gitsources/gs",
                r#"{"apiVersion":"berth.dev/v1alpha1","kind":"GitSource","metadata":{"name":"gs"},"spec":{"url":"https://git.example/fleet.git","ref":"main"}}"#,
                [403, 403, 200],
            ),
            &[(
                "POST",
                "/P/gitsources",
                r#"{"apiVersion":"berth.dev/v1alpha1","kind":"GitSource","metadata":{"name":"gs"},"spec":{"url":"https://git.example/fleet.git","ref":"main"}}"#,
            )],
        ),
        with(
            row(
                "change a gitsource",
                "PATCH",
                "/P/gitsources/gs",
                r#"{"spec":{"ref":"main"}}"#,
                [403, 403, 200],
            ),
            &[(
                "POST",
                "/P/gitsources",
                r#"{"apiVersion":"berth.dev/v1alpha1","kind":"GitSource","metadata":{"name":"gs"},"spec":{"url":"https://git.example/fleet.git","ref":"main"}}"#,
            )],
        ),
        with(
            row(
                "delete a gitsource",
                "DELETE",
                "/P/gitsources/gs",
                "",
                [403, 403, 200],
            ),
            &[(
                "POST",
                "/P/gitsources",
                r#"{"apiVersion":"berth.dev/v1alpha1","kind":"GitSource","metadata":{"name":"gs"},"spec":{"url":"https://git.example/fleet.git","ref":"main"}}"#,
            )],
        ),
        with(
            row(
                "gitsource status",
                "GET",
                "/P/gitsources/gs/status",
                "",
                [404, 404, 200],
            ),
            &[(
                "POST",
                "/P/gitsources",
                r#"{"apiVersion":"berth.dev/v1alpha1","kind":"GitSource","metadata":{"name":"gs"},"spec":{"url":"https://git.example/fleet.git","ref":"main"}}"#,
            )],
        ),
        with(
            row(
                "write gitsource status over TCP",
                "PUT",
                "/P/gitsources/gs/status",
                r#"{"status":{}}"#,
                [403, 403, 403],
            ),
            &[(
                "POST",
                "/P/gitsources",
                r#"{"apiVersion":"berth.dev/v1alpha1","kind":"GitSource","metadata":{"name":"gs"},"spec":{"url":"https://git.example/fleet.git","ref":"main"}}"#,
            )],
        ),
        with(
            row(
                "gitsource events",
                "GET",
                "/P/gitsources/gs/events",
                "",
                [404, 404, 200],
            ),
            &[(
                "POST",
                "/P/gitsources",
                r#"{"apiVersion":"berth.dev/v1alpha1","kind":"GitSource","metadata":{"name":"gs"},"spec":{"url":"https://git.example/fleet.git","ref":"main"}}"#,
            )],
        ),
        with(
            row(
                "gitsource credentials",
                "GET",
                "/P/gitsources/gs/secrets",
                "",
                [403, 403, 200],
            ),
            &[(
                "POST",
                "/P/gitsources",
                r#"{"apiVersion":"berth.dev/v1alpha1","kind":"GitSource","metadata":{"name":"gs"},"spec":{"url":"https://git.example/fleet.git","ref":"main"}}"#,
            )],
        ),
        with(
            row(
                "set a gitsource credential",
                "PUT",
                "/P/gitsources/gs/secrets/password",
                r#"{"value":"v"}"#,
                [403, 403, 200],
            ),
            &[(
                "POST",
                "/P/gitsources",
                r#"{"apiVersion":"berth.dev/v1alpha1","kind":"GitSource","metadata":{"name":"gs"},"spec":{"url":"https://git.example/fleet.git","ref":"main"}}"#,
            )],
        ),
        with(
            row(
                "delete a gitsource credential",
                "DELETE",
                "/P/gitsources/gs/secrets/password",
                "",
                [403, 403, 200],
            ),
            &[
                (
                    "POST",
                    "/P/gitsources",
                    r#"{"apiVersion":"berth.dev/v1alpha1","kind":"GitSource","metadata":{"name":"gs"},"spec":{"url":"https://git.example/fleet.git","ref":"main"}}"#,
                ),
                (
                    "PUT",
                    "/P/gitsources/gs/secrets/password",
                    r#"{"value":"v"}"#,
                ),
            ],
        ),
        row(
            "prune an applyset",
            "POST",
            "/P/apply?applyset=s-{who}&prune=true",
            r#"{"apiVersion":"v1","kind":"List","items":[]}"#,
            [403, 403, 200],
        ),
    ]
}

fn fill(template: &str, who: &str) -> String {
    template
        .replace("/P/", &format!("{P}/"))
        .replace("{who}", who)
}

/// The router's own table: a route added without a row here fails this test.
#[test]
fn every_route_of_the_router_has_a_row() {
    let rows = rows();
    let missing: Vec<String> = authority::ROUTES
        .iter()
        .filter(|route| {
            !rows.iter().any(|row| {
                let method = row.method.parse::<hyper::Method>().unwrap();
                let path = fill(row.path, "who");
                let path = path.split('?').next().unwrap_or_default();
                authority::find(std::slice::from_ref(*route), &method, path).is_ok()
            })
        })
        .map(|route| format!("{} {}", route.method, route.pattern))
        .collect();
    assert!(
        missing.is_empty(),
        "routes without a row in the access matrix: {missing:#?}"
    );
}

#[test]
fn the_access_matrix_holds_over_tcp() {
    let config_dir = tempfile::tempdir().unwrap();
    let config = config_dir.path().join("berth.yaml");
    std::fs::write(&config, "allowedFileRoots: [/srv/berth-repos]\n").unwrap();
    let daemon = Daemon::start_with(&[
        "--listen",
        "127.0.0.1:0",
        "--config",
        config.to_str().unwrap(),
    ]);
    let local = daemon.client();
    let admin = daemon.add_user("ada", true);
    let member = daemon.add_user("mia", false);
    let outsider = daemon.add_user("otto", false);
    daemon.add_user("extra", false);

    // Fixtures, as the local admin: alpha (members: the local admin, mia), solo (mia alone).
    for name in ["alpha", "solo"] {
        let reply = local.post_json(&format!("{P}/projects"), &project(name, json!({})));
        assert_eq!(reply.status, 201, "{}", reply.text());
    }
    for (method, path) in [
        ("PUT", "/P/projects/alpha/members/mia"),
        ("PUT", "/P/projects/solo/members/mia"),
    ] {
        let reply = local.request(method, &fill(path, ""), None, b"");
        assert!(reply.status < 300, "{path}: {}", reply.text());
    }
    let creator = local.get(&format!("{P}/projects/solo/members")).json();
    // The local admin who created it is a member, as `unix:<os user>`.
    let creator = creator["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| m["name"].as_str())
        .find(|name| name.starts_with("unix:"))
        .unwrap_or_else(|| panic!("no unix: member in {creator}"))
        .to_string();
    let reply = local.request(
        "DELETE",
        &format!("{P}/projects/solo/members/{creator}"),
        None,
        b"",
    );
    assert_eq!(reply.status, 200, "{}", reply.text());
    let reply = local.put_json(
        &format!("{P}/projects/alpha/secrets/API_KEY"),
        &json!({"value": "k"}),
    );
    assert_eq!(reply.status, 200, "{}", reply.text());
    let reply = local.post_json(&format!("{P}/agentprofiles"), &profile("shell"));
    assert_eq!(reply.status, 201, "{}", reply.text());

    let tcp = TcpClient::new(&daemon.tcp_addr(), None, None);
    let callers = [
        tcp.with_token(None),
        tcp.with_token(Some("berth_not-a-token-anybody-holds")),
        tcp.with_token(Some(&outsider)),
        tcp.with_token(Some(&member)),
        tcp.with_token(Some(&admin)),
    ];

    let mut failures = Vec::new();
    for row in rows() {
        for (index, who) in WHO.iter().enumerate() {
            for (method, path, body) in row.setup {
                let body = fill(body, who);
                let content_type = (!body.is_empty()).then_some(JSON);
                local.request(method, &fill(path, who), content_type, body.as_bytes());
            }
            let path = fill(row.path, who);
            let body = fill(row.body, who);
            let content_type = (!body.is_empty()).then_some(row.content_type);
            let reply = callers[index].request(row.method, &path, content_type, body.as_bytes());
            let expected = row.expect[index];
            if reply.status != expected {
                failures.push(format!(
                    "{} as {who}: {} {path} answered {} (expected {expected}): {}",
                    row.what,
                    row.method,
                    reply.status,
                    reply.text()
                ));
                continue;
            }
            // Refusals are Kubernetes Status objects.
            if expected == 401 || expected == 403 {
                let status = reply.json();
                let reason = if expected == 401 {
                    "Unauthorized"
                } else {
                    "Forbidden"
                };
                if status["kind"] != "Status"
                    || status["code"] != expected
                    || status["reason"] != reason
                {
                    failures.push(format!(
                        "{} as {who}: not a {reason} Status: {status}",
                        row.what
                    ));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));

    // What an outsider hears of a project it is not a member of is, word for word, what it
    // hears of a name nobody holds: nothing tells it which names are taken.
    for (method, path) in [
        ("GET", "/P/projects/{name}"),
        ("GET", "/P/projects/{name}/events"),
        ("GET", "/P/projects/{name}/members"),
        ("GET", "/P/projects/{name}/secrets"),
        ("DELETE", "/P/projects/{name}"),
    ] {
        let answer = |name: &str| {
            let reply =
                callers[2].request(method, &fill(&path.replace("{name}", name), ""), None, b"");
            (reply.status, reply.text().replace(name, "NAME"))
        };
        assert_eq!(answer("alpha"), answer("never-made"), "{method} {path}");
    }

    // Lists show a non-admin only its own projects; the creator of a project is its member.
    let names = |client: &TcpClient| -> Vec<String> {
        let list = client.get(&format!("{P}/projects")).json();
        assert_eq!(list["kind"], "ProjectList");
        list["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|o| o["metadata"]["name"].as_str().unwrap().to_string())
            .collect()
    };
    let seen_by_member = names(&callers[3]);
    for name in ["alpha", "solo", "new-member", "applied-member"] {
        assert!(
            seen_by_member.contains(&name.to_string()),
            "{seen_by_member:?}"
        );
    }
    for hidden in ["new-outsider", "new-admin", "applied-outsider", "big-admin"] {
        assert!(
            !seen_by_member.contains(&hidden.to_string()),
            "{seen_by_member:?}"
        );
    }
    let seen_by_outsider = names(&callers[2]);
    assert!(
        !seen_by_outsider.contains(&"alpha".to_string()),
        "{seen_by_outsider:?}"
    );
    assert!(
        seen_by_outsider.contains(&"new-outsider".to_string()),
        "{seen_by_outsider:?}"
    );
    let seen_by_admin = names(&callers[4]);
    assert!(
        seen_by_admin.len() > seen_by_member.len()
            && seen_by_admin.contains(&"new-outsider".to_string())
    );
    let members = callers[3]
        .get(&format!("{P}/projects/new-member/members"))
        .json();
    assert_eq!(members["items"], json!([{"name": "mia"}]));

    // The global event list and a watch of all projects are filtered the same way.
    let events = callers[2].get(&format!("{P}/events")).json();
    for event in events["items"].as_array().unwrap() {
        let name = event["involvedObject"]["name"].as_str().unwrap_or_default();
        assert!(name != "alpha" && name != "solo", "{event}");
    }

    // A non-admin's watch skips projects it is not a member of: the project the admin creates
    // first never shows, the one the outsider creates next does.
    let mut watch = RawWatch::open(
        &daemon.tcp_addr(),
        &format!("{P}/projects?watch=true"),
        &outsider,
    );
    let mut initial = Vec::new();
    let reply = callers[4].json(
        "POST",
        &format!("{P}/projects"),
        &project("admins-only", json!({})),
    );
    assert_eq!(reply.status, 201, "{}", reply.text());
    let reply = callers[2].json(
        "POST",
        &format!("{P}/projects"),
        &project("outsiders-own", json!({})),
    );
    assert_eq!(reply.status, 201, "{}", reply.text());
    loop {
        let event = watch.next_event();
        let name = event["object"]["metadata"]["name"]
            .as_str()
            .unwrap()
            .to_string();
        assert_ne!(name, "admins-only", "{event}");
        assert_ne!(name, "alpha", "{event}");
        if name == "outsiders-own" {
            break;
        }
        initial.push(name);
    }
    assert!(
        initial.iter().all(|n| n.ends_with("-outsider")),
        "{initial:?}"
    );

    // A removed user's token stops working at once.
    let reply = callers[4].request("DELETE", &format!("{P}/users/otto"), None, b"");
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_eq!(callers[2].get(&format!("{P}/projects")).status, 401);
}

#[test]
fn tokens_are_shown_once_and_stored_only_as_hashes() {
    let daemon = Daemon::start_with(&["--listen", "127.0.0.1:0"]);
    let token = daemon.add_user("hash-only", false);
    assert!(token.starts_with("berth_"), "{token}");
    let listed = daemon.client().get(&format!("{P}/users")).text();
    assert!(
        listed.contains("hash-only") && !listed.contains(&token),
        "{listed}"
    );
    let shown = daemon.client().get(&format!("{P}/users/hash-only")).text();
    assert!(!shown.contains(&token), "{shown}");
    let again = daemon
        .client()
        .post_json(&format!("{P}/users"), &json!({"name": "hash-only"}));
    assert_eq!(again.status, 409, "{}", again.text());
    crate::support::daemon::assert_nowhere_under(&daemon.data_dir, token.as_bytes());
}

/// Re-applying an admin's AgentProfile or GitSource unchanged is allowed to any user, but
/// with `?applyset=` it would move the object into that set, whose next prune deletes it: that
/// is a write of the object, and only an admin may make it.
#[test]
fn moving_an_admin_object_into_an_applyset_is_an_admin_write() {
    let daemon = Daemon::start_with(&["--listen", "127.0.0.1:0"]);
    let local = daemon.client();
    let admin = daemon.add_user("ada", true);
    let user = daemon.add_user("mia", false);
    let gitsource = json!({"apiVersion": "berth.dev/v1alpha1", "kind": "GitSource",
        "metadata": {"name": "fleet"},
        "spec": {"url": "https://git.example/fleet.git", "ref": "main", "suspend": true}});
    let objects = [
        ("agentprofiles", profile("shell")),
        ("gitsources", gitsource),
    ];
    for (plural, object) in &objects {
        let reply = local.post_json(&format!("{P}/{plural}"), object);
        assert_eq!(reply.status, 201, "{}", reply.text());
    }
    let tcp = TcpClient::new(&daemon.tcp_addr(), None, None);
    let (user, admin) = (tcp.with_token(Some(&user)), tcp.with_token(Some(&admin)));
    let annotation = |plural: &str, name: &str| -> Value {
        let object = local.get(&format!("{P}/{plural}/{name}")).json();
        object["metadata"]["annotations"]["berth.dev/applyset"].clone()
    };
    for (plural, object) in &objects {
        let name = object["metadata"]["name"].as_str().unwrap();
        let list = json!({"apiVersion": "v1", "kind": "List", "items": [object]});
        let before = local.get(&format!("{P}/{plural}/{name}")).json();

        // Unchanged and without a set: nothing is written, so anyone may.
        let reply = user.json("POST", &format!("{P}/apply"), &list);
        assert_eq!(reply.status, 200, "{plural}: {}", reply.text());

        // A replace that changes only the finalizers is refused: they are the server's.
        let mut finalized = before.clone();
        finalized["metadata"]["finalizers"] = json!(["example.com/keep"]);
        let reply = user.json("PUT", &format!("{P}/{plural}/{name}"), &finalized);
        // A project's replace reaches admission (server-owned, 400); the other kinds are written
        // by admins alone, which the route table answers first (403).
        let refused = if *plural == "projects" { 400 } else { 403 };
        assert_eq!(reply.status, refused, "{plural}: {}", reply.text());
        let after = local.get(&format!("{P}/{plural}/{name}")).json();
        assert_eq!(
            after["metadata"]["resourceVersion"], before["metadata"]["resourceVersion"],
            "{plural}: the refused replace wrote the object: {after}"
        );

        // Into a set: refused, and the object is neither re-tagged nor rewritten.
        let reply = user.json("POST", &format!("{P}/apply?applyset=prune-me"), &list);
        assert_eq!(reply.status, 403, "{plural}: {}", reply.text());
        let status = reply.json();
        assert_eq!(status["reason"], "Forbidden", "{status}");
        let after = local.get(&format!("{P}/{plural}/{name}")).json();
        assert_eq!(annotation(plural, name), Value::Null, "{plural}: {after}");
        assert_eq!(
            after["metadata"]["resourceVersion"], before["metadata"]["resourceVersion"],
            "{plural}: the refused apply wrote the object"
        );

        // An admin may; once it is the set's, a user re-applying it to the same set changes
        // nothing and is allowed, and moving it to another set is refused again.
        let reply = admin.json("POST", &format!("{P}/apply?applyset=prune-me"), &list);
        assert_eq!(reply.status, 200, "{plural}: {}", reply.text());
        assert_eq!(annotation(plural, name), json!("prune-me"));
        let reply = user.json("POST", &format!("{P}/apply?applyset=prune-me"), &list);
        assert_eq!(reply.status, 200, "{plural}: {}", reply.text());
        let reply = user.json("POST", &format!("{P}/apply?applyset=elsewhere"), &list);
        assert_eq!(reply.status, 403, "{plural}: {}", reply.text());
        assert_eq!(annotation(plural, name), json!("prune-me"));
    }
}

/// A watch over plain TCP, read line by line as the events arrive.
struct RawWatch {
    reader: std::io::BufReader<std::net::TcpStream>,
}

impl RawWatch {
    fn open(addr: &str, path: &str, token: &str) -> RawWatch {
        use std::io::{BufRead, Write};
        let mut stream = std::net::TcpStream::connect(addr).expect("connect");
        stream
            .set_read_timeout(Some(std::time::Duration::from_secs(60)))
            .unwrap();
        write!(
            stream,
            "GET {path} HTTP/1.1\r\nHost: berth\r\nAuthorization: Bearer {token}\r\n\r\n"
        )
        .unwrap();
        let mut reader = std::io::BufReader::new(stream);
        let mut line = String::new();
        reader.read_line(&mut line).unwrap();
        assert!(line.contains(" 200 "), "{line}");
        loop {
            line.clear();
            reader.read_line(&mut line).unwrap();
            if line.trim().is_empty() {
                break;
            }
        }
        RawWatch { reader }
    }

    /// The next event; chunk-size lines of the chunked body are skipped.
    fn next_event(&mut self) -> Value {
        use std::io::BufRead;
        loop {
            let mut line = String::new();
            let read = self.reader.read_line(&mut line).expect("read the watch");
            assert!(read > 0, "the watch ended");
            if line.trim_start().starts_with('{') {
                return serde_json::from_str(line.trim()).expect("a JSON event");
            }
        }
    }
}

/// A git repository with one commit at `dir`.
fn git_repository(dir: &std::path::Path) {
    std::fs::create_dir_all(dir).unwrap();
    let git = |args: &[&str]| {
        let out = std::process::Command::new("git")
            .args(["-c", "user.name=t", "-c", "user.email=t@example.invalid"])
            .arg("-C")
            .arg(dir)
            .args(args)
            .output()
            .expect("run git");
        assert!(out.status.success(), "git {args:?}: {out:?}");
    };
    git(&["init", "-q"]);
    std::fs::write(dir.join("README"), "hi\n").unwrap();
    git(&["add", "."]);
    git(&["commit", "-qm", "one"]);
}

#[test]
fn a_file_repository_leading_outside_allowed_file_roots_is_refused_at_admission() {
    let host = tempfile::tempdir().unwrap();
    let allowed = host.path().join("allowed");
    let outside = host.path().join("outside");
    git_repository(&allowed.join("app"));
    git_repository(&outside);
    let link = allowed.join("link");
    std::os::unix::fs::symlink(&outside, &link).unwrap();
    let gitfile = allowed.join("gitfile");
    std::fs::create_dir_all(&gitfile).unwrap();
    std::fs::write(
        gitfile.join(".git"),
        format!("gitdir: {}\n", outside.join(".git").display()),
    )
    .unwrap();
    let borrower = allowed.join("borrower");
    git_repository(&borrower);
    std::fs::write(
        borrower.join(".git/objects/info/alternates"),
        format!("{}\n", outside.join(".git/objects").display()),
    )
    .unwrap();

    let config = host.path().join("berth.yaml");
    std::fs::write(
        &config,
        format!("allowedFileRoots: [{}]\n", allowed.display()),
    )
    .unwrap();
    let daemon = Daemon::start_with(&[
        "--listen",
        "127.0.0.1:0",
        "--config",
        config.to_str().unwrap(),
    ]);
    let tcp = TcpClient::new(&daemon.tcp_addr(), None, None);
    let user = tcp.with_token(Some(&daemon.add_user("uma", false)));
    let admin = tcp.with_token(Some(&daemon.add_user("ada", true)));
    let create = |client: &TcpClient, name: &str, path: &std::path::Path| {
        client.json(
            "POST",
            &format!("{P}/projects"),
            &project(
                name,
                json!({"repo": {"url": format!("file://{}", path.display())}}),
            ),
        )
    };

    for (name, escape) in [
        ("link", &link),
        ("gitfile", &gitfile),
        ("borrower", &borrower),
    ] {
        let reply = create(&user, name, escape);
        assert_eq!(reply.status, 403, "{name}: {}", reply.text());
        let message = reply.json()["message"].as_str().unwrap().to_string();
        assert!(
            message.starts_with("spec.repo.url: ")
                && message.contains("leads outside allowedFileRoots")
                && message.contains(&outside.display().to_string()),
            "{name}: {message}"
        );
        // An admin may name any host path, as before.
        let reply = create(&admin, &format!("{name}-admin"), escape);
        assert_eq!(reply.status, 201, "{name}: {}", reply.text());
    }
    // A repository that stays under the root, and one not there yet (judged at checkout).
    assert_eq!(create(&user, "app", &allowed.join("app")).status, 201);
    assert_eq!(create(&user, "later", &allowed.join("later")).status, 201);
}
