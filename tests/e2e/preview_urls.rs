//! Preview URLs and `berth port-forward` against a real daemon on real LXD: servers started
//! inside a berth-tiny container (busybox `httpd` and `nc`) are reached through the preview
//! listener by members only (bearer token, or the cookie a one-time ticket sets), with an
//! upgraded connection and a streamed response relayed as they happen; everyone else reads
//! the same 404; `berth port-forward` carries a request; a preview request wakes an idled
//! project and counts as activity.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::harness::{Berth, PROJECTS, bearer, connect, get};
use crate::support::daemon::TcpClient;
use serde_json::{Value, json};

/// Generous: a request through LXD's proxy answers in milliseconds, but the machine is shared.
const DEADLINE: Duration = Duration::from_secs(120);
const INDEX: &str = "hello from inside the container\n";

/// Busybox servers inside the container: `httpd` on 8000, an upgrade that echoes on 8001, and
/// a response that sends its second half only once `/tmp/go` exists on 8002.
const SERVERS: &str = r#"
mkdir -p /www /srv
printf 'hello from inside the container\n' > /www/index.html
cat > /srv/head.sh <<'EOF'
while IFS= read -r line; do
    line=$(printf '%s' "$line" | tr -d '\r')
    [ -z "$line" ] && break
done
EOF
cat > /srv/upgrade.sh <<'EOF'
#!/bin/sh
. /srv/head.sh
printf 'HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n'
exec cat
EOF
cat > /srv/stream.sh <<'EOF'
#!/bin/sh
. /srv/head.sh
printf 'HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\n\r\n'
printf '6\r\nfirst\n\r\n'
while [ ! -e /tmp/go ]; do sleep 0.1; done
printf '7\r\nsecond\n\r\n0\r\n\r\n'
EOF
chmod +x /srv/upgrade.sh /srv/stream.sh
busybox httpd -p 8000 -h /www
setsid busybox nc -ll -p 8001 -e /srv/upgrade.sh </dev/null >/dev/null 2>&1 &
setsid busybox nc -ll -p 8002 -e /srv/stream.sh </dev/null >/dev/null 2>&1 &
"#;

/// Starts the servers and waits until `httpd` answers inside.
fn start_servers(name: &str) {
    crate::harness::exec(name, SERVERS).expect("start the servers");
    let deadline = Instant::now() + DEADLINE;
    while crate::harness::exec(name, "busybox wget -q -O - http://127.0.0.1:8000/").as_deref()
        != Ok(INDEX)
    {
        assert!(Instant::now() < deadline, "httpd did not come up in {name}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn members_reach_a_containers_servers_through_the_preview_listener() {
    let mut berth = Berth::start_with(&[], &[]);
    let addr = berth.preview_addr();
    let port = addr.rsplit_once(':').unwrap().1.to_string();
    let name = crate::harness::unique_name();
    berth.create_project(&name, json!({"image": "berth-tiny"}));
    let alice = berth.add_user(&format!("alice-{name}"), false);
    let bob = berth.add_user(&format!("bob-{name}"), false);
    berth.add_member(&name, &format!("alice-{name}"));
    berth.wait_ready(&name);
    start_servers(&name);
    let host = format!("{name}--8000.localhost:{port}");

    // A member's bearer token gets through; the token does not.
    let answer = get(&addr, &host, "/", &[bearer(&alice)]);
    assert_eq!(
        (answer.status, answer.body.as_str()),
        (200, INDEX),
        "{answer:?}\n{}",
        berth.log_text()
    );

    // status.ports carries the listener's port (the scheduler reports ports bound beyond
    // loopback: httpd binds every address).
    let project = berth.wait_for(&name, "port 8000 reported", |p| {
        p["status"]["ports"]
            .as_array()
            .is_some_and(|ports| ports.iter().any(|p| p["port"] == 8000))
    });
    let url = project["status"]["ports"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["port"] == 8000)
        .unwrap()["url"]
        .clone();
    assert_eq!(url, json!(format!("http://{name}--8000.localhost:{port}")));

    // Everyone else reads one and the same 404.
    let refusals = [
        ("no credentials", get(&addr, &host, "/", &[])),
        ("not a member", get(&addr, &host, "/", &[bearer(&bob)])),
        (
            "an unknown token",
            get(&addr, &host, "/", &[bearer("berth_nope")]),
        ),
        (
            "an unknown project",
            get(
                &addr,
                &format!("nope-{name}--8000.localhost"),
                "/",
                &[bearer(&alice)],
            ),
        ),
        (
            "an unknown port",
            get(
                &addr,
                &format!("{name}--8999.localhost"),
                "/",
                &[bearer(&alice)],
            ),
        ),
        (
            "a made-up cookie",
            get(
                &addr,
                &host,
                "/",
                &["Cookie: berth-preview=forged".to_string()],
            ),
        ),
        (
            "another domain",
            get(
                &addr,
                &format!("{name}--8000.example"),
                "/",
                &[bearer(&alice)],
            ),
        ),
    ];
    let (_, first) = &refusals[0];
    assert_eq!(first.status, 404, "{first:?}");
    for (what, answer) in &refusals {
        assert_eq!(
            (answer.status, &answer.body),
            (first.status, &first.body),
            "{what}: {answer:?}"
        );
        assert!(!answer.body.contains(&name), "{what} names the project");
    }

    // A one-time ticket sets a cookie for that host alone, and is good once.
    let reply = berth.client().post_json(
        &format!("{PROJECTS}/{name}/previewtickets"),
        &json!({"port": 8000}),
    );
    assert_eq!(reply.status, 201, "{}", reply.text());
    let ticket = reply.json();
    let link = ticket["url"].as_str().unwrap().to_string();
    let path = &link[link.find("/?").unwrap()..];
    assert!(link.starts_with(&format!(
        "http://{name}--8000.localhost:{port}/?berth-ticket="
    )));
    let exchange = get(&addr, &host, path, &[]);
    assert_eq!(exchange.status, 303, "{exchange:?}");
    assert_eq!(exchange.header("location").as_deref(), Some("/"));
    let set_cookie = exchange.header("set-cookie").expect("a cookie");
    for part in ["HttpOnly", "SameSite=Lax", "Path=/"] {
        assert!(set_cookie.contains(part), "{set_cookie}");
    }
    assert!(!set_cookie.contains("Domain"), "host-only: {set_cookie}");
    let cookie = set_cookie.split(';').next().unwrap().to_string();
    let answer = get(&addr, &host, "/", &[format!("Cookie: {cookie}")]);
    assert_eq!(
        (answer.status, answer.body.as_str()),
        (200, INDEX),
        "{answer:?}"
    );
    let again = get(&addr, &host, path, &[]);
    assert_eq!(
        (again.status, &again.body),
        (404, &first.body),
        "a ticket is good once"
    );
    let elsewhere = get(
        &addr,
        &format!("{name}--8001.localhost"),
        "/",
        &[format!("Cookie: {cookie}")],
    );
    assert_eq!(
        elsewhere.status, 404,
        "the cookie is for one host: {elsewhere:?}"
    );

    // An upgraded connection is relayed byte for byte both ways.
    let mut stream = connect(&addr);
    write!(
        stream,
        "GET /echo HTTP/1.1\r\nHost: {name}--8001.localhost\r\n{}\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n",
        bearer(&alice)
    )
    .unwrap();
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut status = String::new();
    reader.read_line(&mut status).unwrap();
    assert!(status.starts_with("HTTP/1.1 101"), "{status}");
    loop {
        let mut line = String::new();
        reader.read_line(&mut line).unwrap();
        if line == "\r\n" {
            break;
        }
    }
    for message in ["ping\n", "second message\n"] {
        stream.write_all(message.as_bytes()).unwrap();
        let mut echoed = String::new();
        reader.read_line(&mut echoed).unwrap();
        assert_eq!(echoed, message);
    }
    drop(stream);

    // A streamed response arrives as it is written: the first half before the second exists.
    let mut stream = connect(&addr);
    write!(
        stream,
        "GET / HTTP/1.1\r\nHost: {name}--8002.localhost\r\n{}\r\nConnection: close\r\n\r\n",
        bearer(&alice)
    )
    .unwrap();
    let mut reader = BufReader::new(stream);
    let mut seen = String::new();
    while !seen.contains("first\n") {
        let mut line = String::new();
        assert!(
            reader.read_line(&mut line).unwrap() > 0,
            "ended early: {seen}"
        );
        seen.push_str(&line);
    }
    assert!(!seen.contains("second"), "{seen}");
    crate::harness::exec(&name, "touch /tmp/go").unwrap();
    let mut rest = String::new();
    reader.read_to_string(&mut rest).unwrap();
    assert!(rest.contains("second\n"), "{rest}");

    // `berth port-forward` on a free local port carries a request.
    let mut forward = berth
        .command(&["port-forward", &name, ":8000"])
        .spawn()
        .expect("spawn port-forward");
    let mut out = BufReader::new(forward.stdout.take().unwrap());
    let mut first_line = String::new();
    out.read_line(&mut first_line).unwrap();
    let local = first_line
        .strip_prefix("Forwarding from ")
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or_else(|| panic!("{first_line:?}"))
        .to_string();
    assert!(first_line.trim_end().ends_with("-> 8000"), "{first_line}");
    let answer = get(&local, "anything", "/", &[]);
    assert_eq!(
        (answer.status, answer.body.as_str()),
        (200, INDEX),
        "{answer:?}"
    );
    let _ = Command::new("kill")
        .args(["-INT", &forward.id().to_string()])
        .status();
    let status = crate::support::daemon::wait_with_deadline(&mut forward, DEADLINE)
        .expect("port-forward ends on Ctrl-C");
    assert!(status.success(), "{status}");
}

fn idled(project: &Value) -> Option<String> {
    project["status"]["reap"]["idledAt"]
        .as_str()
        .map(str::to_string)
}

#[test]
fn a_preview_request_wakes_an_idled_project_and_counts_as_activity() {
    let config = tempfile::tempdir().expect("config dir");
    let config_file = config.path().join("berth.yaml");
    std::fs::write(&config_file, "scheduler: {interval: 1s, workers: 4}\n").unwrap();
    let mut berth = Berth::start_with(&[], &["--config", &config_file.to_string_lossy()]);
    let addr = berth.preview_addr();
    let name = crate::harness::unique_name();
    berth.create_project(
        &name,
        json!({"image": "berth-tiny", "reap": {"idleAfter": "4s", "idleAction": "Stop"}}),
    );
    let alice = berth.add_user(&format!("alice-{name}"), false);
    berth.add_member(&name, &format!("alice-{name}"));
    berth.wait_for(&name, "idled and stopped", |p| {
        idled(p).is_some() && crate::harness::instance_state(&name).as_deref() == Some("STOPPED")
    });

    // The request wakes the project and waits for it; nothing listens after the boot yet.
    let host = format!("{name}--8000.localhost");
    let answer = get(&addr, &host, "/", &[bearer(&alice)]);
    assert_eq!(answer.status, 404, "{answer:?}\n{}", berth.log_text());
    let project = berth.get_project(&name).unwrap();
    assert!(
        project["metadata"]["annotations"]["berth.dev/wokenAt"].is_string(),
        "{}",
        project["metadata"]
    );
    assert_eq!(
        crate::harness::instance_state(&name).as_deref(),
        Some("RUNNING")
    );
    let events = berth
        .client()
        .get(&format!("{PROJECTS}/{name}/events"))
        .json();
    assert!(
        events["items"].as_array().unwrap().iter().any(|e| {
            e["reason"] == "WakeRequested"
                && e["message"] == "a preview request woke the idled project"
        }),
        "{events}"
    );

    // Kept up from here on; a server answers, and the request counts as activity.
    berth.patch_project(&name, json!({"spec": {"reap": {"idleAfter": "1h"}}}));
    berth.wait_for(&name, "running with the new spec", |p| {
        idled(p).is_none()
            && p["status"]["observedGeneration"] == p["metadata"]["generation"]
            && p["status"]["activity"]["inspectedAt"].is_string()
            && crate::harness::instance_state(&name).as_deref() == Some("RUNNING")
    });
    start_servers(&name);
    let deadline = Instant::now() + DEADLINE;
    loop {
        let answer = get(&addr, &host, "/", &[bearer(&alice)]);
        assert_eq!(
            (answer.status, answer.body.as_str()),
            (200, INDEX),
            "{answer:?}"
        );
        let project = berth.get_project(&name).unwrap();
        if project["status"]["activity"]["source"] == "preview" {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "activity never came from the preview: {}",
            project["status"]["activity"]
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// A member's ticket, exchanged on the preview listener for the session cookie it sets.
fn session_cookie(api: &TcpClient, addr: &str, project: &str, host: &str) -> String {
    let reply = api.json(
        "POST",
        &format!("{PROJECTS}/{project}/previewtickets"),
        &json!({"port": 8000}),
    );
    assert_eq!(reply.status, 201, "{}", reply.text());
    let link = reply.json()["url"].as_str().unwrap().to_string();
    let exchange = get(addr, host, &link[link.find("/?").unwrap()..], &[]);
    assert_eq!(exchange.status, 303, "{exchange:?}");
    let set_cookie = exchange.header("set-cookie").expect("a cookie");
    format!("Cookie: {}", set_cookie.split(';').next().unwrap())
}

#[test]
fn idle_connections_and_another_members_tickets_never_keep_a_member_out() {
    const CAP: usize = 64;
    /// The most preview sessions one user holds (`preview::tickets`).
    const PER_USER: usize = 64;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("berth.yaml");
    std::fs::write(&config, format!("listen: {{maxConnections: {CAP}}}\n")).unwrap();
    let mut berth = Berth::start_with(
        &[],
        &[
            "--config",
            config.to_str().unwrap(),
            "--listen",
            "127.0.0.1:0",
        ],
    );
    let api = crate::support::daemon::logged_addr(&berth.log_text(), "serving the API over TCP");
    let addr = berth.preview_addr();
    let name = crate::harness::unique_name();
    berth.create_project(&name, json!({"image": "berth-tiny"}));
    let (alice, mallory) = (format!("alice-{name}"), format!("mallory-{name}"));
    let alice_api = TcpClient::new(&api, Some(&berth.add_user(&alice, false)), None);
    let mallory_api = TcpClient::new(&api, Some(&berth.add_user(&mallory, false)), None);
    berth.add_member(&name, &alice);
    berth.add_member(&name, &mallory);
    berth.wait_ready(&name);
    start_servers(&name);
    let host = format!("{name}--8000.localhost");
    let alice_cookie = session_cookie(&alice_api, &addr, &name, &host);
    let answer = get(&addr, &host, "/", std::slice::from_ref(&alice_cookie));
    assert_eq!(
        (answer.status, answer.body.as_str()),
        (200, INDEX),
        "{answer:?}"
    );

    // Another member mints and redeems four times the per-user number of sessions: her own
    // oldest end, never Alice's.
    for _ in 0..4 * PER_USER {
        session_cookie(&mallory_api, &addr, &name, &host);
    }
    let answer = get(&addr, &host, "/", std::slice::from_ref(&alice_cookie));
    assert_eq!(
        (answer.status, answer.body.as_str()),
        (200, INDEX),
        "Alice's preview session after another member's many: {answer:?}"
    );

    // Twice the cap in connections that never send a byte, all held open by this process;
    // Alice's requests, each on a new connection, are served again and again.
    let idle: Vec<TcpStream> = (0..2 * CAP)
        .map(|_| TcpStream::connect(&addr).expect("connect to the preview listener"))
        .collect();
    for _ in 0..5 {
        let answer = get(&addr, &host, "/", std::slice::from_ref(&alice_cookie));
        assert_eq!(
            (answer.status, answer.body.as_str()),
            (200, INDEX),
            "a member's preview beside {} idle connections: {answer:?}",
            idle.len()
        );
    }
    drop(idle);
}
