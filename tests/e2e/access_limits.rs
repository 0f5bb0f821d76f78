//! Limits that keep one caller from exhausting the daemon for everyone, and revocation that
//! reaches what a removed user left open, end to end against a real `berth serve` with a TCP
//! listener: the memory one apply body may cost and the size of the errors it is answered
//! with; console sessions bound to the user (not the name), capped per user, sign-ins limited.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use crate::support::daemon::{Daemon, TcpClient};
use serde_json::Value;

const API: &str = "/apis/berth.dev/v1alpha1";

/// The daemon's peak resident memory, from the kernel.
fn peak_rss_bytes(daemon: &Daemon) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{}/status", daemon.pid())).unwrap();
    let kib: u64 = status
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .expect("VmHWM in /proc/PID/status");
    kib * 1024
}

/// `{"kind":"List","items":[{"a":1},...]}` of about `bytes` bytes: every item invalid.
fn junk_list(bytes: usize) -> Vec<u8> {
    let count = bytes / 8;
    let mut body = String::with_capacity(bytes + 64);
    body.push_str(r#"{"apiVersion":"v1","kind":"List","items":["#);
    for i in 0..count {
        if i > 0 {
            body.push(',');
        }
        body.push_str(r#"{"a":1}"#);
    }
    body.push_str("]}");
    body.into_bytes()
}

/// One Project of about `bytes` bytes whose spec holds a list of small objects: a few bytes of
/// text each, far more once decoded.
fn dense_project(bytes: usize) -> Vec<u8> {
    let count = bytes / 8;
    let objects = vec![r#"{"a":1}"#; count].join(",");
    format!(
        r#"{{"apiVersion":"berth.dev/v1alpha1","kind":"Project","metadata":{{"name":"dense"}},"spec":{{"seedFiles":[{objects}]}}}}"#
    )
    .into_bytes()
}

/// The answer to a body the daemon refuses: 413 or 422, small, and naming what was wrong.
fn assert_bounded_refusal(reply: &crate::support::daemon::Reply, what: &str) -> Value {
    assert!(
        matches!(reply.status, 413 | 422),
        "{what}: {}: {}",
        reply.status,
        String::from_utf8_lossy(&reply.body[..reply.body.len().min(2000)])
    );
    assert!(
        reply.body.len() < 16 << 10,
        "{what}: the {} answer is {} bytes",
        reply.status,
        reply.body.len()
    );
    let error = reply.json();
    let causes = error["details"]["causes"].as_array().map_or(0, Vec::len);
    assert!(causes <= 21, "{what}: {causes} causes");
    error
}

#[test]
fn apply_bodies_cost_bounded_memory_and_bounded_errors() {
    let daemon = Daemon::start_with(&["--listen", "127.0.0.1:0"]);
    let token = daemon.add_user("limited", false);
    let tcp = TcpClient::new(&daemon.tcp_addr(), Some(&token), None);
    assert_eq!(tcp.get("/healthz").status, 200);
    let idle = peak_rss_bytes(&daemon);

    // Ten thousand invalid items are admitted one by one; the answer lists the first few
    // problems and how many more there were.
    let reply = tcp.request(
        "POST",
        &format!("{API}/apply"),
        Some("application/json"),
        &junk_list(80_000),
    );
    let error = assert_bounded_refusal(&reply, "10,000 invalid items");
    assert_eq!(reply.status, 422, "{error}");
    let message = error["message"].as_str().unwrap();
    assert!(message.contains(" more"), "{message}");

    // Bodies of 4 and 30 MiB: more items than an apply takes.
    for mib in [4, 30] {
        let reply = tcp.request(
            "POST",
            &format!("{API}/apply"),
            Some("application/json"),
            &junk_list(mib << 20),
        );
        let error = assert_bounded_refusal(&reply, &format!("a {mib} MiB List"));
        assert_eq!(reply.status, 413, "{error}");
        let message = error["message"].as_str().unwrap();
        assert!(message.contains("items"), "{message}");
        assert_eq!(tcp.get("/healthz").status, 200);
    }

    // One object of just under 3 MiB that would decode to hundreds of MiB, alone and as the
    // single item of a List.
    let dense = dense_project(3_000_000);
    let reply = tcp.request(
        "POST",
        &format!("{API}/projects"),
        Some("application/json"),
        &dense,
    );
    assert_bounded_refusal(&reply, "a dense Project");
    let mut list = br#"{"apiVersion":"v1","kind":"List","items":["#.to_vec();
    list.extend_from_slice(&dense);
    list.extend_from_slice(b"]}");
    let reply = tcp.request(
        "POST",
        &format!("{API}/apply"),
        Some("application/json"),
        &list,
    );
    assert_bounded_refusal(&reply, "a List of one dense Project");

    // The daemon still answers, and nothing like the bodies' decoded size was ever held.
    assert_eq!(tcp.get(&format!("{API}/projects")).status, 200);
    let grew = peak_rss_bytes(&daemon).saturating_sub(idle);
    assert!(grew < 256 << 20, "the daemon grew by {} MiB", grew >> 20);
}

/// A browser as far as the console can tell: a cookie jar, one connection per request.
struct Browser {
    addr: String,
    cookies: BTreeMap<String, String>,
    /// The loopback address it connects from (127.0.0.1 unless set).
    from: Option<std::net::Ipv4Addr>,
}

impl Browser {
    fn new(addr: &str) -> Browser {
        Browser {
            addr: addr.to_string(),
            cookies: BTreeMap::new(),
            from: None,
        }
    }

    /// A browser on another loopback address (another machine, as far as the console knows).
    fn from(addr: &str, source: std::net::Ipv4Addr) -> Browser {
        Browser {
            from: Some(source),
            ..Browser::new(addr)
        }
    }

    fn connect(&self) -> TcpStream {
        let Some(source) = self.from else {
            return TcpStream::connect(&self.addr).expect("connect to the console");
        };
        let to: std::net::SocketAddr = self.addr.parse().expect("an IP:PORT");
        let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)
            .expect("a socket");
        socket
            .bind(&std::net::SocketAddr::from((source, 0)).into())
            .expect("bind the source address");
        socket.connect(&to.into()).expect("connect to the console");
        socket.into()
    }

    /// The status and body of one request.
    fn send(&mut self, method: &str, path: &str, body: &str) -> (u16, String) {
        let mut stream = self.connect();
        stream
            .set_read_timeout(Some(Duration::from_secs(60)))
            .unwrap();
        let jar: Vec<String> = self
            .cookies
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        let request = format!(
            "{method} {path} HTTP/1.1\r\nHost: {}\r\nOrigin: http://{}\r\nConnection: close\r\n\
             Content-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\n\
             Cookie: {}\r\n\r\n{body}",
            self.addr,
            self.addr,
            body.len(),
            jar.join("; ")
        );
        stream.write_all(request.as_bytes()).unwrap();
        let mut raw = Vec::new();
        stream.read_to_end(&mut raw).unwrap();
        let raw = String::from_utf8_lossy(&raw).into_owned();
        let (head, body) = raw.split_once("\r\n\r\n").unwrap_or((&raw, ""));
        for line in head.lines() {
            let Some((name, value)) = line.split_once(':') else {
                continue;
            };
            if !name.eq_ignore_ascii_case("set-cookie") {
                continue;
            }
            let pair = value.trim().split(';').next().unwrap_or_default();
            if let Some((k, v)) = pair.split_once('=') {
                if v.is_empty() || value.contains("Max-Age=0") {
                    self.cookies.remove(k);
                } else {
                    self.cookies.insert(k.to_string(), v.to_string());
                }
            }
        }
        let status = head
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        (status, body.to_string())
    }

    /// Signs in with `token` through the sign-in form: the answer's status.
    fn sign_in(&mut self, token: &str) -> u16 {
        let (status, form) = self.send("GET", "/ui/", "");
        assert_eq!(status, 200, "{form}");
        let at = form.find("name=\"csrf\" value=\"").expect("a CSRF field") + 19;
        let csrf = form[at..].split('"').next().unwrap().to_string();
        self.send("POST", "/ui/signin", &format!("csrf={csrf}&token={token}"))
            .0
    }

    /// Who the console says is signed in, if anyone.
    fn signed_in_as(&mut self) -> Option<String> {
        let (_, page) = self.send("GET", "/ui/", "");
        let at = page.find("Signed in as <strong>")? + 21;
        Some(page[at..].split('<').next()?.to_string())
    }
}

#[test]
fn a_console_session_ends_with_its_user_even_when_the_name_returns() {
    let daemon = Daemon::start_with(&["--listen", "127.0.0.1:0"]);
    let addr = daemon.tcp_addr();
    let token = daemon.add_user("mallory", false);
    let mut browser = Browser::new(&addr);
    assert_eq!(browser.sign_in(&token), 303);
    assert_eq!(browser.signed_in_as().as_deref(), Some("mallory"));

    // Removed, and before the old cookie is used again, the name is given to an admin.
    let reply = daemon.client().delete(&format!("{API}/users/mallory"));
    assert!(reply.status < 300, "{}", reply.text());
    daemon.add_user("mallory", true);
    assert_eq!(
        browser.signed_in_as(),
        None,
        "the old session is not the new user's"
    );
}

/// Failed sign-ins are limited per source address: past ten in a minute, even a valid token
/// from that address gets 429 and a Retry-After, while a person on another address signs in.
#[test]
fn failed_sign_ins_lock_out_their_address_and_nobody_else() {
    let daemon = Daemon::start_with(&["--listen", "127.0.0.1:0"]);
    let addr = daemon.tcp_addr();
    let token = daemon.add_user("ann", false);
    let guesser = std::net::Ipv4Addr::new(127, 0, 0, 1);
    for i in 0..10 {
        let status = Browser::from(&addr, guesser).sign_in(&format!("guess-{i}"));
        assert_eq!(status, 401, "guess {i}");
    }
    let mut locked = Browser::from(&addr, guesser);
    assert_eq!(locked.sign_in(&token), 429, "the guessing address waits");
    let (status, page) = locked.send("POST", "/ui/signin", "csrf=x&token=y");
    assert!(matches!(status, 403 | 429), "{status}: {page}");

    let mut elsewhere = Browser::from(&addr, std::net::Ipv4Addr::new(127, 0, 0, 2));
    assert_eq!(elsewhere.sign_in(&token), 303, "another address signs in");
    assert_eq!(elsewhere.signed_in_as().as_deref(), Some("ann"));
}

#[test]
fn one_users_sign_ins_never_sign_another_out() {
    let daemon = Daemon::start_with(&["--listen", "127.0.0.1:0"]);
    let addr = daemon.tcp_addr();
    let victim = daemon.add_user("victim", false);
    let flood = daemon.add_user("flood", false);
    let mut signed = Browser::new(&addr);
    assert_eq!(signed.sign_in(&victim), 303);

    // More sign-ins than the console keeps sessions, all with one token. Past the rate limit
    // they are refused; none of them signs the victim out.
    let mut statuses = BTreeMap::new();
    for _ in 0..4_100 {
        let status = Browser::new(&addr).sign_in(&flood);
        *statuses.entry(status).or_insert(0) += 1;
        if status == 429 && statuses[&429] >= 50 {
            break;
        }
    }
    assert!(
        statuses.keys().all(|s| matches!(s, 303 | 429)),
        "{statuses:?}"
    );
    assert_eq!(
        signed.signed_in_as().as_deref(),
        Some("victim"),
        "{statuses:?}"
    );
}

/// What a watch over plain TCP sent after its headers: each event, until the stream ended or
/// `until` returns true for an event.
fn watch_events(
    addr: &str,
    path: &str,
    token: &str,
    mut until: impl FnMut(&Value) -> bool,
    opened: impl FnOnce(),
) -> (Vec<Value>, bool) {
    use std::io::BufRead;
    let mut stream = TcpStream::connect(addr).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
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
    while line.trim() != "" || line.is_empty() {
        line.clear();
        if reader.read_line(&mut line).unwrap() == 0 {
            break;
        }
    }
    opened();
    let mut events = Vec::new();
    loop {
        let mut line = String::new();
        match reader.read_line(&mut line) {
            Ok(0) => return (events, true),
            Ok(_) if line.trim_start().starts_with('{') => {
                let event: Value = serde_json::from_str(line.trim()).expect("a JSON event");
                let done = until(&event);
                events.push(event);
                if done {
                    return (events, false);
                }
            }
            Ok(_) => {}
            // Still open and silent at the read deadline.
            Err(_) => return (events, false),
        }
    }
}

#[test]
fn an_open_watch_ends_when_its_user_is_removed() {
    let daemon = Daemon::start_with(&["--listen", "127.0.0.1:0"]);
    let addr = daemon.tcp_addr();
    let boss = daemon.add_user("boss", true);
    let local = daemon.client();
    let (events, ended) = watch_events(
        &addr,
        &format!("{API}/projects?watch=true"),
        &boss,
        |event| event["type"] == "ERROR",
        || {
            let reply = local.delete(&format!("{API}/users/boss"));
            assert!(reply.status < 300, "{}", reply.text());
            // The name given to someone else at once changes nothing for the stream.
            daemon.add_user("boss", true);
        },
    );
    let last = events.last().cloned().unwrap_or_default();
    assert!(
        ended || last["type"] == "ERROR",
        "the watch of a removed admin still streams: {events:?}"
    );
    if last["type"] == "ERROR" {
        assert_eq!(last["object"]["code"], 401, "{last}");
    }
}

#[test]
fn idle_connections_without_a_token_never_lock_out_a_user() {
    const CAP: usize = 64;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("berth.yaml");
    std::fs::write(&config, format!("listen: {{maxConnections: {CAP}}}\n")).unwrap();
    let daemon = Daemon::start_with(&[
        "--config",
        config.to_str().unwrap(),
        "--listen",
        "127.0.0.1:0",
    ]);
    let addr = daemon.tcp_addr();
    let token = daemon.add_user("patient", false);
    let tcp = TcpClient::new(&addr, Some(&token), None);
    assert_eq!(tcp.get(&format!("{API}/projects")).status, 200);

    // Twice the cap in connections that never send a byte, all held open by this process.
    let idle: Vec<TcpStream> = (0..2 * CAP)
        .map(|_| TcpStream::connect(&addr).expect("connect to the daemon"))
        .collect();
    // Each request below comes on a new connection, after all the idle ones were accepted or
    // refused; a user with a token is served, again and again.
    for _ in 0..5 {
        let reply = tcp.get(&format!("{API}/projects"));
        assert_eq!(reply.status, 200, "{}", reply.text());
    }
    // Unauthenticated requests still get answers of their own.
    let anonymous = tcp.with_token(None);
    assert_eq!(anonymous.get("/healthz").status, 200);
    drop(idle);
}

#[test]
fn an_open_exec_ends_when_its_user_leaves_the_project() {
    let mut berth = crate::harness::Berth::start_with(&[], &["--listen", "127.0.0.1:0"]);
    let addr = crate::support::daemon::logged_addr(&berth.log_text(), "serving the API over TCP");
    let name = crate::harness::unique_name();
    berth.create_project(&name, serde_json::json!({"image": "berth-tiny"}));
    let user = format!("execer-{name}");
    let reply = berth.client().post_json(
        &format!("{API}/users"),
        &serde_json::json!({"name": user, "admin": false}),
    );
    assert_eq!(reply.status, 201, "{}", reply.text());
    let token = reply.json()["token"].as_str().unwrap().to_string();
    let member = format!("{}/{name}/members/{user}", crate::harness::PROJECTS);
    let reply = berth.client().request("PUT", &member, None, b"");
    assert!(reply.status < 300, "{}", reply.text());
    berth.wait_ready(&name);

    // A member's interactive `cat`, its stdin held open by this test.
    let server = format!("http://{addr}");
    let mut exec = crate::support::cli::client(&["--server", &server, "--token", &token])
        .args(["exec", &name, "-i", "--", "cat"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run berth exec");
    let running = || {
        crate::harness::exec(&name, "ps -o comm= 2>/dev/null || ps")
            .unwrap_or_default()
            .lines()
            .any(|line| line.split_whitespace().any(|word| word == "cat"))
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    while !running() {
        assert!(
            std::time::Instant::now() < deadline,
            "cat never started in {name}\n{}",
            berth.log_text()
        );
        assert!(exec.try_wait().unwrap().is_none(), "berth exec ended early");
        std::thread::sleep(Duration::from_millis(200));
    }

    // The membership goes; the session goes with it, though the client keeps it open.
    let reply = berth.client().delete(&member);
    assert!(reply.status < 300, "{}", reply.text());
    let ended = crate::support::daemon::wait_with_deadline(&mut exec, Duration::from_secs(60));
    let still_running = running();
    if ended.is_none() {
        let _ = exec.kill();
        let _ = exec.wait();
    }
    assert!(
        ended.is_some(),
        "berth exec still runs after the membership was removed"
    );
    assert!(!still_running, "cat still runs in {name}");
    let mut stderr = String::new();
    std::io::Read::read_to_string(exec.stderr.as_mut().unwrap(), &mut stderr).unwrap();
    assert!(stderr.contains("revoked"), "{stderr}");
    berth.delete_project(&name);
}

#[test]
fn a_running_command_stops_when_its_user_leaves_the_project() {
    let mut berth = crate::harness::Berth::start_with(&[], &["--listen", "127.0.0.1:0"]);
    let addr = crate::support::daemon::logged_addr(&berth.log_text(), "serving the API over TCP");
    let name = crate::harness::unique_name();
    berth.create_project(&name, serde_json::json!({"image": "berth-tiny"}));
    let user = format!("runner-{name}");
    let reply = berth.client().post_json(
        &format!("{API}/users"),
        &serde_json::json!({"name": user, "admin": false}),
    );
    assert_eq!(reply.status, 201, "{}", reply.text());
    let token = reply.json()["token"].as_str().unwrap().to_string();
    let member = format!("{}/{name}/members/{user}", crate::harness::PROJECTS);
    let reply = berth.client().request("PUT", &member, None, b"");
    assert!(reply.status < 300, "{}", reply.text());
    berth.wait_ready(&name);

    // A member's command run to its end (no `-i`), longer than the test waits below.
    let server = format!("http://{addr}");
    let mut exec = crate::support::cli::client(&["--server", &server, "--token", &token])
        .args(["exec", &name])
        .args(["--timeout", "100", "--", "sleep", "97"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run berth exec");
    let running = || {
        crate::harness::exec(&name, "ps -o args= 2>/dev/null || ps")
            .unwrap_or_default()
            .contains("sleep 97")
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    while !running() {
        assert!(
            std::time::Instant::now() < deadline,
            "sleep never started in {name}\n{}",
            berth.log_text()
        );
        if let Some(status) = exec.try_wait().unwrap() {
            let mut stderr = String::new();
            std::io::Read::read_to_string(exec.stderr.as_mut().unwrap(), &mut stderr).unwrap();
            panic!("berth exec ended early ({status}): {stderr}");
        }
        std::thread::sleep(Duration::from_millis(200));
    }

    // The membership goes: the caller is told, and the command stops with it.
    let reply = berth.client().delete(&member);
    assert!(reply.status < 300, "{}", reply.text());
    let ended = crate::support::daemon::wait_with_deadline(&mut exec, Duration::from_secs(60));
    if ended.is_none() {
        let _ = exec.kill();
        let _ = exec.wait();
    }
    assert!(
        ended.is_some_and(|status| !status.success()),
        "berth exec still runs (or succeeded) after the membership was removed: {ended:?}"
    );
    let mut stderr = String::new();
    std::io::Read::read_to_string(exec.stderr.as_mut().unwrap(), &mut stderr).unwrap();
    assert!(stderr.contains("revoked"), "{stderr}");
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while running() {
        assert!(
            std::time::Instant::now() < deadline,
            "sleep still runs in {name} after its caller's access was revoked"
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    berth.delete_project(&name);
}
