//! The web console against a real daemon (paused: nothing here needs a container), driven as a
//! browser drives it, over plain HTTP with a cookie jar: sign-in with a berth token exchanged
//! for a session cookie (its flags), sign-out, the CSRF token checked on every POST, every
//! value escaped, a non-member shown nothing of another's project (the same 404 as for a name
//! that does not exist), live rows as server-sent events, the API's bearer tokens on the
//! console's JSON calls, and `berth ui`: a one-time sign-in URL on a loopback port that carries
//! only the console.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use crate::support::daemon::Daemon;
use serde_json::{Value, json};

const P: &str = "/apis/berth.dev/v1alpha1";
const DEADLINE: Duration = Duration::from_secs(60);

/// One answer, read to its end.
#[derive(Debug)]
struct Page {
    status: u16,
    head: String,
    body: String,
}

impl Page {
    fn header(&self, name: &str) -> Option<String> {
        self.headers(name).into_iter().next()
    }

    fn headers(&self, name: &str) -> Vec<String> {
        self.head
            .lines()
            .filter_map(|line| {
                let (k, v) = line.split_once(':')?;
                k.trim()
                    .eq_ignore_ascii_case(name)
                    .then(|| v.trim().to_string())
            })
            .collect()
    }

    /// The value of the first `name="csrf"` field.
    fn csrf(&self) -> String {
        let at = self
            .body
            .find("name=\"csrf\" value=\"")
            .expect("a CSRF field")
            + 19;
        self.body[at..].split('"').next().unwrap().to_string()
    }
}

/// A browser, as far as the console can tell: a cookie jar, one connection per request.
struct Browser {
    addr: String,
    cookies: BTreeMap<String, String>,
}

impl Browser {
    fn new(addr: &str) -> Browser {
        Browser {
            addr: addr.to_string(),
            cookies: BTreeMap::new(),
        }
    }

    fn send(&mut self, method: &str, path: &str, extra: &[(&str, &str)], body: &str) -> Page {
        let mut stream = TcpStream::connect(&self.addr).expect("connect to the console");
        stream.set_read_timeout(Some(DEADLINE)).unwrap();
        // A browser names the page's origin on every write; this page is the console's own.
        let origin = if extra.iter().any(|(k, _)| k.eq_ignore_ascii_case("origin")) {
            String::new()
        } else {
            format!("Origin: http://{}\r\n", self.addr)
        };
        let mut request = format!(
            "{method} {path} HTTP/1.1\r\nHost: {}\r\n{origin}Connection: close\r\nContent-Length: {}\r\n",
            self.addr,
            body.len()
        );
        if !body.is_empty()
            && !extra
                .iter()
                .any(|(k, _)| k.eq_ignore_ascii_case("content-type"))
        {
            request.push_str("Content-Type: application/x-www-form-urlencoded\r\n");
        }
        if !self.cookies.is_empty() {
            let jar: Vec<String> = self
                .cookies
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect();
            request.push_str(&format!("Cookie: {}\r\n", jar.join("; ")));
        }
        for (k, v) in extra {
            request.push_str(&format!("{k}: {v}\r\n"));
        }
        request.push_str("\r\n");
        request.push_str(body);
        stream.write_all(request.as_bytes()).unwrap();
        let mut raw = Vec::new();
        stream.read_to_end(&mut raw).unwrap();
        let raw = String::from_utf8_lossy(&raw).into_owned();
        let (head, body) = raw.split_once("\r\n\r\n").unwrap_or((&raw, ""));
        let page = Page {
            status: head
                .split_whitespace()
                .nth(1)
                .and_then(|s| s.parse().ok())
                .unwrap_or(0),
            head: head.to_string(),
            body: body.to_string(),
        };
        for line in page.headers("set-cookie") {
            let pair = line.split(';').next().unwrap_or_default();
            if let Some((k, v)) = pair.split_once('=') {
                if v.is_empty() || line.contains("Max-Age=0") {
                    self.cookies.remove(k);
                } else {
                    self.cookies.insert(k.to_string(), v.to_string());
                }
            }
        }
        page
    }

    fn get(&mut self, path: &str) -> Page {
        self.send("GET", path, &[], "")
    }

    fn post(&mut self, path: &str, fields: &[(&str, &str)]) -> Page {
        let body = url_form(fields);
        self.send("POST", path, &[], &body)
    }

    /// Signs in with `token` through the sign-in form.
    fn sign_in(&mut self, token: &str) -> Page {
        let form = self.get("/ui/");
        assert_eq!(form.status, 200, "{form:?}");
        let csrf = form.csrf();
        self.post("/ui/signin", &[("csrf", &csrf), ("token", token)])
    }
}

fn url_form(fields: &[(&str, &str)]) -> String {
    let mut form = String::new();
    for (k, v) in fields {
        if !form.is_empty() {
            form.push('&');
        }
        form.push_str(k);
        form.push('=');
        form.push_str(&percent_encode(v));
    }
    form
}

fn percent_encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            b => format!("%{b:02X}"),
        })
        .collect()
}

fn project(name: &str) -> Value {
    json!({"apiVersion": "berth.dev/v1alpha1", "kind": "Project",
           "metadata": {"name": name}, "spec": {"image": "berth-tiny"}})
}

fn create(daemon: &Daemon, name: &str) {
    let reply = daemon
        .client()
        .post_json(&format!("{P}/projects"), &project(name));
    assert_eq!(reply.status, 201, "{}", reply.text());
}

fn tcp_daemon() -> Daemon {
    Daemon::start_with(&["--listen", "127.0.0.1:0"])
}

#[test]
fn a_token_signs_in_to_a_session_cookie_and_sign_out_ends_it() {
    let daemon = tcp_daemon();
    let addr = daemon.tcp_addr();
    let alice = daemon.add_user("alice", false);
    let mut browser = Browser::new(&addr);

    let form = browser.get("/ui/");
    assert!(form.body.contains("<label for=\"token\">"), "{}", form.body);
    assert!(form.header("content-security-policy").is_some());

    // The sign-in form's own CSRF token is checked against its cookie.
    let forged = browser.post("/ui/signin", &[("csrf", "forged"), ("token", &alice)]);
    assert_eq!(forged.status, 403, "{forged:?}");
    assert!(forged.body.contains("csrf:"), "{}", forged.body);
    assert!(!browser.cookies.contains_key("berth-console"));

    let wrong = browser.sign_in("berth_not-a-token");
    assert_eq!(wrong.status, 401, "{wrong:?}");
    assert!(wrong.body.contains("token: that token is not valid"));

    let signed = browser.sign_in(&alice);
    assert_eq!(signed.status, 303, "{signed:?}");
    assert_eq!(signed.header("location").as_deref(), Some("/ui/"));
    let cookie = signed
        .headers("set-cookie")
        .into_iter()
        .find(|c| c.starts_with("berth-console="))
        .expect("a session cookie");
    for flag in ["HttpOnly", "SameSite=Strict", "Path=/ui/", "Max-Age="] {
        assert!(cookie.contains(flag), "{flag} in {cookie}");
    }
    assert!(!cookie.contains("Secure"), "plain HTTP: {cookie}");
    assert!(!cookie.contains(&alice), "the token is not the cookie");

    let fleet = browser.get("/ui/");
    assert!(fleet.body.contains("Signed in as <strong>alice</strong>"));

    // Sign-out is a form like any other: without the session's token it does nothing.
    let refused = browser.post("/ui/signout", &[("csrf", "nope")]);
    assert_eq!(refused.status, 403);
    assert!(browser.get("/ui/").body.contains("Signed in as"));
    let csrf = browser.get("/ui/").csrf();
    let out = browser.post("/ui/signout", &[("csrf", &csrf)]);
    assert_eq!(out.status, 303);
    let cookie_after = browser.cookies.get("berth-console").cloned();
    assert!(cookie_after.is_none(), "the browser dropped it");
    // The old cookie is no good either.
    let mut replay = Browser::new(&addr);
    replay.cookies.insert(
        "berth-console".into(),
        cookie.split(';').next().unwrap()["berth-console=".len()..].to_string(),
    );
    assert!(replay.get("/ui/").body.contains("Sign in to berth"));

    // A removed user's session ends with the user.
    let mut again = Browser::new(&addr);
    assert_eq!(again.sign_in(&alice).status, 303);
    assert!(again.get("/ui/").body.contains("Signed in as"));
    let reply = daemon.client().delete(&format!("{P}/users/alice"));
    assert!(reply.status < 300, "{}", reply.text());
    assert!(again.get("/ui/").body.contains("Sign in to berth"));
}

#[test]
fn a_non_member_sees_nothing_of_another_members_project() {
    let daemon = tcp_daemon();
    let addr = daemon.tcp_addr();
    let alice = daemon.add_user("alice", false);
    let bob = daemon.add_user("bob", false);
    create(&daemon, "alices");
    daemon.add_member("alices", "alice");

    let mut a = Browser::new(&addr);
    assert_eq!(a.sign_in(&alice).status, 303);
    assert!(a.get("/ui/").body.contains("data-name=\"alices\""));
    assert_eq!(a.get("/ui/projects/alices").status, 200);

    let mut b = Browser::new(&addr);
    assert_eq!(b.sign_in(&bob).status, 303);
    let fleet = b.get("/ui/");
    assert_eq!(fleet.status, 200);
    assert!(!fleet.body.contains("alices"), "{}", fleet.body);
    let csrf = fleet.csrf();

    // Every way in reads exactly as a name that does not exist.
    let paths = [
        ("GET", "/ui/projects/{}"),
        ("GET", "/ui/projects/{}/events"),
        ("POST", "/ui/projects/{}/preview/8000"),
        ("GET", "/ui/api/apis/berth.dev/v1alpha1/projects/{}"),
        ("POST", "/ui/projects/{}/answer"),
        ("POST", "/ui/projects/{}/stop"),
    ];
    for (method, path) in paths {
        let mut read = |name: &str| {
            let path = path.replace("{}", name);
            let page = if method == "GET" {
                b.get(&path)
            } else {
                b.post(&path, &[("csrf", &csrf), ("text", "hi")])
            };
            (page.status, page.body.replace(name, "NAME"))
        };
        let existing = read("alices");
        let missing = read("nobodys");
        assert_eq!(existing.0, 404, "{method} {path}: {}", existing.1);
        assert_eq!(existing, missing, "{method} {path}");
    }
    // The live fleet tells bob nothing of it either.
    let mut stream = sse(&addr, "/ui/events", &b.cookies);
    let reply = daemon.client().request(
        "PATCH",
        &format!("{P}/projects/alices"),
        Some("application/merge-patch+json"),
        br#"{"metadata":{"labels":{"moved":"yes"}}}"#,
    );
    assert!(reply.status < 300, "{}", reply.text());
    // alice's stream shows the change; bob's, read past the same moment, does not.
    let mut alices = sse(&addr, "/ui/events", &a.cookies);
    alices.read_until("moved=yes");
    stream.send_marker(&daemon);
    let seen = stream.read_until("marker-");
    assert!(!seen.contains("alices"), "{seen}");
}

/// A server-sent event stream, read as it comes.
struct Stream {
    reader: BufReader<TcpStream>,
    seen: String,
}

fn sse(addr: &str, path: &str, cookies: &BTreeMap<String, String>) -> Stream {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream.set_read_timeout(Some(DEADLINE)).unwrap();
    let jar: Vec<String> = cookies.iter().map(|(k, v)| format!("{k}={v}")).collect();
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nAccept: text/event-stream\r\nCookie: {}\r\n\r\n",
        jar.join("; ")
    )
    .unwrap();
    Stream {
        reader: BufReader::new(stream),
        seen: String::new(),
    }
}

impl Stream {
    /// Reads until `needle` shows, returning all read so far.
    fn read_until(&mut self, needle: &str) -> String {
        let until = Instant::now() + DEADLINE;
        while !self.seen.contains(needle) {
            assert!(Instant::now() < until, "no {needle:?} in {}", self.seen);
            let mut line = String::new();
            match self.reader.read_line(&mut line) {
                Ok(0) => panic!("the stream ended before {needle:?}: {}", self.seen),
                Ok(_) => self.seen.push_str(&line),
                Err(e) => panic!("reading the stream: {e}; so far {}", self.seen),
            }
        }
        self.seen.clone()
    }

    /// A project of bob's own whose row marks a point in bob's stream.
    fn send_marker(&self, daemon: &Daemon) {
        create(daemon, "marker-b");
        daemon.add_member("marker-b", "bob");
        // A membership is no change of the object: a label change shows it to the watch.
        let reply = daemon.client().request(
            "PATCH",
            &format!("{P}/projects/marker-b"),
            Some("application/merge-patch+json"),
            br#"{"metadata":{"labels":{"marker":"yes"}}}"#,
        );
        assert!(reply.status < 300, "{}", reply.text());
    }
}

#[test]
fn every_post_needs_the_sessions_csrf_token_and_acts_as_the_cli() {
    let daemon = tcp_daemon();
    let addr = daemon.tcp_addr();
    let alice = daemon.add_user("alice", false);
    let root = daemon.add_user("root", true);
    create(&daemon, "web");
    daemon.add_member("web", "alice");
    let mut a = Browser::new(&addr);
    assert_eq!(a.sign_in(&alice).status, 303);
    let page = a.get("/ui/projects/web");
    let csrf = page.csrf();
    let state = |daemon: &Daemon| {
        daemon.client().get(&format!("{P}/projects/web")).json()["spec"]["state"].clone()
    };
    let before = state(&daemon);
    for action in ["answer", "start", "stop", "restart", "delete"] {
        for sent in [None, Some("forged")] {
            let mut fields = vec![("text", "hi")];
            if let Some(sent) = sent {
                fields.push(("csrf", sent));
            }
            let page = a.post(&format!("/ui/projects/web/{action}"), &fields);
            assert_eq!(page.status, 403, "{action} {sent:?}: {}", page.body);
        }
    }
    assert_eq!(state(&daemon), before, "nothing changed");

    let stopped = a.post("/ui/projects/web/stop", &[("csrf", &csrf)]);
    assert_eq!(stopped.status, 303, "{}", stopped.body);
    assert_eq!(
        stopped.header("location").as_deref(),
        Some("/ui/projects/web?done=stop")
    );
    assert_eq!(state(&daemon), json!("Stopped"));
    let started = a.post("/ui/projects/web/start", &[("csrf", &csrf)]);
    assert_eq!(started.status, 303);
    assert_eq!(state(&daemon), json!("Running"));

    // Deleting is for admins, as in the CLI; the page says so and offers no form.
    assert!(
        a.get("/ui/projects/web")
            .body
            .contains("Deleting a project is for admins")
    );
    let refused = a.post("/ui/projects/web/delete", &[("csrf", &csrf)]);
    assert_eq!(refused.status, 403, "{}", refused.body);
    assert!(refused.body.contains("admins only"), "{}", refused.body);
    // Nobody waits: the agent is not blocked, and the API's word is shown.
    let answer = a.post(
        "/ui/projects/web/answer",
        &[("csrf", &csrf), ("text", "blue")],
    );
    assert!(answer.status >= 400, "{}", answer.body);

    let mut r = Browser::new(&addr);
    assert_eq!(r.sign_in(&root).status, 303);
    let page = r.get("/ui/projects/web");
    assert!(page.body.contains("name=\"force\""), "an admin may force");
    let deleted = r.post(
        "/ui/projects/web/delete",
        &[("csrf", &page.csrf()), ("force", "true")],
    );
    assert_eq!(deleted.status, 303, "{}", deleted.body);
    let gone = daemon.client().get(&format!("{P}/projects/web"));
    let forced = gone.status == 404
        || gone.json()["metadata"]["annotations"]["berth.dev/forceDelete"] == "true";
    assert!(forced, "{}", gone.text());
}

#[test]
fn every_value_rendered_is_escaped() {
    let daemon = tcp_daemon();
    let addr = daemon.tcp_addr();
    let root = daemon.add_user("root", true);
    create(&daemon, "esc");
    let status = json!({"status": {
        "phase": "Ready",
        "title": "<script>alert('title')</script>",
        "message": "\"><img src=x onerror=alert(1)>",
        "agent": {"state": "blocked", "message": "<b>bold</b> & co"},
        "unsavedWork": {"untracked": 1, "files": ["<i>x</i>.txt"]},
        "reap": {"protectedBy": ["UnsavedWork"]},
    }});
    let reply = daemon
        .client()
        .put_json(&format!("{P}/projects/esc/status"), &status);
    assert_eq!(reply.status, 200, "{}", reply.text());
    let mut r = Browser::new(&addr);
    assert_eq!(r.sign_in(&root).status, 303);
    for path in ["/ui/", "/ui/projects/esc"] {
        let page = r.get(path);
        assert_eq!(page.status, 200, "{path}");
        for raw in ["<script>alert", "<img src=x", "<b>bold", "<i>x</i>"] {
            assert!(
                !page.body.contains(raw),
                "{raw} raw in {path}: {}",
                page.body
            );
        }
        for escaped in [
            "&lt;script&gt;alert(&#39;title&#39;)&lt;/script&gt;",
            "&lt;i&gt;x&lt;/i&gt;.txt",
        ] {
            assert!(page.body.contains(escaped), "{escaped} in {path}");
        }
    }
    let project = r.get("/ui/projects/esc").body;
    assert!(project.contains("&lt;b&gt;bold&lt;/b&gt; &amp; co"));
    assert!(project.contains("&quot;&gt;&lt;img src=x onerror=alert(1)&gt;"));
}

#[test]
fn bearer_tokens_work_on_the_consoles_json_calls() {
    let daemon = tcp_daemon();
    let addr = daemon.tcp_addr();
    let alice = daemon.add_user("alice", false);
    create(&daemon, "mine");
    daemon.add_member("mine", "alice");
    let mut browser = Browser::new(&addr);
    let bearer = format!("Bearer {alice}");
    let list = browser.send(
        "GET",
        "/ui/api/apis/berth.dev/v1alpha1/projects",
        &[("Authorization", &bearer)],
        "",
    );
    assert_eq!(list.status, 200, "{list:?}");
    assert!(list.body.contains("\"mine\""));
    let none = browser.get("/ui/api/apis/berth.dev/v1alpha1/projects");
    assert_eq!(none.status, 401);
    // A session's JSON write needs its CSRF token in a header.
    assert_eq!(browser.sign_in(&alice).status, 303);
    let csrf = browser.get("/ui/").csrf();
    let body = r#"{"metadata":{"labels":{"k":"v"}}}"#;
    let path = "/ui/api/apis/berth.dev/v1alpha1/projects/mine";
    let patch = |browser: &mut Browser, extra: &[(&str, &str)]| {
        let mut headers = vec![("Content-Type", "application/merge-patch+json")];
        headers.extend_from_slice(extra);
        browser.send("PATCH", path, &headers, body)
    };
    assert_eq!(patch(&mut browser, &[]).status, 403);
    let ok = patch(&mut browser, &[("X-CSRF-Token", &csrf)]);
    assert_eq!(ok.status, 200, "{ok:?}");
}

/// `berth ui` as the local admin would run it.
struct Ui {
    child: Child,
    url: String,
    port: String,
}

impl Drop for Ui {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn berth_ui(daemon: &Daemon) -> Ui {
    let mut child = daemon
        .command(&["ui"])
        .stderr(Stdio::inherit())
        .spawn()
        .expect("berth ui");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let url = loop {
        let line = lines.next().expect("berth ui printed its URL").unwrap();
        if let Some(at) = line.find("http://127.0.0.1:")
            && line.contains("?token=")
        {
            break line[at..].trim().to_string();
        }
    };
    let port = url["http://127.0.0.1:".len()..]
        .split('/')
        .next()
        .unwrap()
        .to_string();
    Ui { child, url, port }
}

#[test]
fn berth_ui_signs_in_once_and_carries_only_the_console() {
    let daemon = Daemon::start();
    create(&daemon, "admins-own");
    let ui = berth_ui(&daemon);
    let addr = format!("127.0.0.1:{}", ui.port);
    let path = &ui.url[format!("http://{addr}").len()..];
    assert!(path.starts_with("/ui/?token="), "{}", ui.url);

    // Whoever merely connects is not the admin: no API, only the sign-in page.
    let mut stranger = Browser::new(&addr);
    for api in [
        format!("{P}/projects"),
        "/healthz".to_string(),
        format!("/ui/../{P}/projects"),
    ] {
        let page = stranger.get(&api);
        assert_eq!(page.status, 404, "{api}: {page:?}");
        assert!(!page.body.contains("admins-own"), "{api}");
    }
    let page = stranger.get("/ui/");
    assert!(page.body.contains("Sign in to berth"));
    assert!(!page.body.contains("admins-own"));
    assert_eq!(
        stranger.get(&format!("/ui/api{P}/projects")).status,
        401,
        "the socket's admin right does not pass through"
    );

    let mut admin = Browser::new(&addr);
    let signed = admin.get(path);
    assert_eq!(signed.status, 303, "{signed:?}");
    let fleet = admin.get("/ui/");
    assert!(
        fleet.body.contains("Signed in as <strong>unix:"),
        "{}",
        fleet.body
    );
    assert!(fleet.body.contains("data-name=\"admins-own\""));

    // The token is used up.
    let mut late = Browser::new(&addr);
    let again = late.get(path);
    assert_eq!(again.status, 401);
    assert!(again.body.contains("used already or has expired"));
    assert!(late.get("/ui/").body.contains("Sign in to berth"));

    // Minting is for admins: a user's token gets 403.
    let tcp = Daemon::start_with(&["--listen", "127.0.0.1:0"]);
    let carol = tcp.add_user("carol", false);
    let client = crate::support::daemon::TcpClient::new(&tcp.tcp_addr(), Some(&carol), None);
    let reply = client.request("POST", &format!("{P}/uitokens"), None, b"");
    assert_eq!(reply.status, 403, "{}", reply.text());
}
