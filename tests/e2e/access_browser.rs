//! The browser's edges, attacked as a page in the same browser and as another local user, against
//! the real daemon on real LXD: a websocket upgrade of the console's `exec` and `portforward`
//! carried by the session cookie needs the console's own `Origin` and the session's CSRF token
//! (a page on another loopback port is same-site with the console); the preview listener relays
//! none of berth's own credentials to the container, whichever of them let the request in; and
//! neither `berth serve` nor the CLI uses a unix socket whose directory another user controls.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::harness::{Berth, PROJECTS};
use serde_json::json;

/// Generous: a container's boot and LXD's proxy on a busy shared machine.
const DEADLINE: Duration = Duration::from_secs(120);
const INDEX: &str = "hello from inside the container\n";
/// A key any websocket handshake may use (RFC 6455's example).
const WS_KEY: &str = "dGhlIHNhbXBsZSBub25jZQ==";

/// The API's TCP address, as the daemon logged it.
fn tcp_addr(berth: &Berth) -> String {
    let log = berth.log_text();
    log.lines()
        .filter(|line| line.contains("serving the API over TCP"))
        .find_map(|line| {
            line.split_whitespace()
                .find_map(|word| word.strip_prefix("addr="))
                .map(str::to_string)
        })
        .unwrap_or_else(|| panic!("the daemon logged no TCP address:\n{log}"))
}

/// Runs `script` in the container, then waits until `probe` prints `expected` there.
fn start_in(name: &str, script: &str, probe: &str, expected: &str) {
    crate::harness::exec(name, script).expect("start the server");
    let deadline = Instant::now() + DEADLINE;
    while crate::harness::exec(name, probe).as_deref() != Ok(expected) {
        assert!(
            Instant::now() < deadline,
            "{probe} did not answer in {name}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// One HTTP/1.1 exchange: the status and head, and the body read to the end.
struct Answer {
    status: u16,
    head: String,
    body: String,
}

fn send(addr: &str, request: &str) -> Answer {
    let mut stream = TcpStream::connect(addr).expect("connect");
    stream.set_read_timeout(Some(DEADLINE)).unwrap();
    stream.write_all(request.as_bytes()).unwrap();
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).unwrap();
    let raw = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = raw.split_once("\r\n\r\n").unwrap_or((&raw, ""));
    Answer {
        status: head
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or(0),
        head: head.to_string(),
        body: body.to_string(),
    }
}

/// A signed-in console session: its cookies and its CSRF token.
struct Session {
    addr: String,
    cookies: BTreeMap<String, String>,
    csrf: String,
}

fn set_cookies(head: &str, jar: &mut BTreeMap<String, String>) {
    for line in head.lines() {
        let Some((k, v)) = line.split_once(':') else {
            continue;
        };
        if !k.trim().eq_ignore_ascii_case("set-cookie") {
            continue;
        }
        let pair = v.trim().split(';').next().unwrap_or_default();
        if let Some((name, value)) = pair.split_once('=') {
            if value.is_empty() {
                jar.remove(name);
            } else {
                jar.insert(name.to_string(), value.to_string());
            }
        }
    }
}

fn csrf_field(body: &str) -> String {
    let at = body.find("name=\"csrf\" value=\"").expect("a CSRF field") + 19;
    body[at..].split('"').next().unwrap().to_string()
}

impl Session {
    fn cookie_line(&self) -> String {
        let jar: Vec<String> = self
            .cookies
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        format!("Cookie: {}\r\n", jar.join("; "))
    }

    fn own_origin(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Signs in with `token` through the sign-in form, as the browser on the console's page.
    fn sign_in(addr: &str, token: &str) -> Session {
        let mut session = Session {
            addr: addr.to_string(),
            cookies: BTreeMap::new(),
            csrf: String::new(),
        };
        let form = send(
            addr,
            &format!("GET /ui/ HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"),
        );
        assert_eq!(form.status, 200, "{}", form.head);
        set_cookies(&form.head, &mut session.cookies);
        let body = format!("csrf={}&token={token}", csrf_field(&form.body));
        let signed = send(
            addr,
            &format!(
                "POST /ui/signin HTTP/1.1\r\nHost: {addr}\r\nOrigin: http://{addr}\r\n{}\
                 Content-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\n\
                 Connection: close\r\n\r\n{body}",
                session.cookie_line(),
                body.len()
            ),
        );
        assert_eq!(signed.status, 303, "{}\n{}", signed.head, signed.body);
        set_cookies(&signed.head, &mut session.cookies);
        let fleet = send(
            addr,
            &format!(
                "GET /ui/ HTTP/1.1\r\nHost: {addr}\r\n{}Connection: close\r\n\r\n",
                session.cookie_line()
            ),
        );
        assert_eq!(fleet.status, 200, "{}", fleet.head);
        session.csrf = csrf_field(&fleet.body);
        session
    }

    /// A websocket upgrade of `path` carried by the session cookie, with `origin` (if any):
    /// the answer's status line and the open stream.
    fn upgrade(&self, path: &str, origin: Option<&str>) -> (String, BufReader<TcpStream>) {
        let mut stream = TcpStream::connect(&self.addr).expect("connect to the console");
        stream.set_read_timeout(Some(DEADLINE)).unwrap();
        let origin = origin
            .map(|o| format!("Origin: {o}\r\n"))
            .unwrap_or_default();
        write!(
            stream,
            "GET {path} HTTP/1.1\r\nHost: {}\r\n{origin}{}Connection: Upgrade\r\nUpgrade: websocket\r\n\
             Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: {WS_KEY}\r\n\r\n",
            self.addr,
            self.cookie_line()
        )
        .unwrap();
        let mut reader = BufReader::new(stream);
        let mut status = String::new();
        reader.read_line(&mut status).unwrap();
        loop {
            let mut line = String::new();
            if reader.read_line(&mut line).unwrap() == 0 || line == "\r\n" {
                break;
            }
        }
        (status.trim_end().to_string(), reader)
    }
}

/// One websocket frame from the server (never masked): its opcode and payload.
fn read_frame(reader: &mut BufReader<TcpStream>) -> Option<(u8, Vec<u8>)> {
    let mut head = [0u8; 2];
    reader.read_exact(&mut head).ok()?;
    let len = match head[1] & 0x7f {
        126 => {
            let mut ext = [0u8; 2];
            reader.read_exact(&mut ext).ok()?;
            u64::from(u16::from_be_bytes(ext))
        }
        127 => {
            let mut ext = [0u8; 8];
            reader.read_exact(&mut ext).ok()?;
            u64::from_be_bytes(ext)
        }
        n => u64::from(n),
    };
    let mut payload = vec![0u8; len as usize];
    reader.read_exact(&mut payload).ok()?;
    Some((head[0] & 0x0f, payload))
}

/// A client's frame (masked, with a zero key: the payload goes as it is).
fn write_frame(stream: &mut TcpStream, opcode: u8, payload: &[u8]) {
    assert!(payload.len() < 126);
    let mut frame = vec![0x80 | opcode, 0x80 | payload.len() as u8, 0, 0, 0, 0];
    frame.extend_from_slice(payload);
    stream.write_all(&frame).unwrap();
}

#[test]
fn console_upgrades_need_the_consoles_own_origin_and_csrf_token() {
    let mut berth = Berth::start_with(&[], &["--listen", "127.0.0.1:0"]);
    let addr = tcp_addr(&berth);
    let name = crate::harness::unique_name();
    berth.create_project(&name, json!({"image": "berth-tiny"}));
    let user = format!("alice-{name}");
    let alice = berth.add_user(&user, false);
    berth.add_member(&name, &user);
    berth.wait_ready(&name);
    start_in(
        &name,
        "mkdir -p /www && printf 'hello from inside the container\\n' > /www/index.html \
         && busybox httpd -p 8000 -h /www",
        "busybox wget -q -O - http://127.0.0.1:8000/",
        INDEX,
    );
    let session = Session::sign_in(&addr, &alice);
    let own = session.own_origin();
    // A page on another loopback port (an app opened through `berth port-forward`) is
    // same-site with the console: its cookie goes along, its Origin tells it apart.
    let other_port = format!("http://{}", berth.preview_addr());
    let exec = format!("/ui/api{PROJECTS}/{name}/exec?command=echo&command=ran-by-exec");
    let forward = format!("/ui/api{PROJECTS}/{name}/portforward?port=8000");
    let with_token = |path: &str, token: &str| format!("{path}&csrf={token}");
    let refusals = [
        (
            "exec, another port's page",
            exec.clone(),
            Some(other_port.as_str()),
        ),
        (
            "exec, another port's page with the token",
            with_token(&exec, &session.csrf),
            Some(other_port.as_str()),
        ),
        (
            "exec, another site",
            with_token(&exec, &session.csrf),
            Some("http://evil.example"),
        ),
        ("exec, no Origin", with_token(&exec, &session.csrf), None),
        (
            "exec, own Origin without the token",
            exec.clone(),
            Some(own.as_str()),
        ),
        (
            "exec, own Origin with a wrong token",
            with_token(&exec, "forged"),
            Some(own.as_str()),
        ),
        (
            "portforward, another port's page",
            forward.clone(),
            Some(other_port.as_str()),
        ),
        (
            "portforward, own Origin without the token",
            forward.clone(),
            Some(own.as_str()),
        ),
    ];
    for (what, path, origin) in &refusals {
        let (status, _) = session.upgrade(path, *origin);
        assert!(
            status.starts_with("HTTP/1.1 403"),
            "{what}: {status}\n{}",
            berth.log_text()
        );
    }

    // The console's own page with the session's token: the command runs.
    let (status, mut reader) = session.upgrade(&with_token(&exec, &session.csrf), Some(&own));
    assert!(status.starts_with("HTTP/1.1 101"), "exec: {status}");
    let mut output = Vec::new();
    let end = loop {
        match read_frame(&mut reader) {
            Some((2, payload)) if !payload.is_empty() => output.extend_from_slice(&payload[1..]),
            Some((1, text)) => break String::from_utf8_lossy(&text).into_owned(),
            Some((8, _)) | None => panic!("exec closed before its exit code"),
            Some(_) => {}
        }
    };
    assert_eq!(String::from_utf8_lossy(&output), "ran-by-exec\n");
    assert!(end.contains("\"exitCode\":0"), "{end}");

    // ... and a port is forwarded.
    let (status, mut reader) = session.upgrade(&with_token(&forward, &session.csrf), Some(&own));
    assert!(status.starts_with("HTTP/1.1 101"), "portforward: {status}");
    let mut stream = reader.get_ref().try_clone().unwrap();
    write_frame(&mut stream, 2, b"GET / HTTP/1.0\r\nHost: x\r\n\r\n");
    let mut answer = Vec::new();
    while let Some((opcode, payload)) = read_frame(&mut reader) {
        match opcode {
            2 => answer.extend_from_slice(&payload),
            8 => break,
            _ => {}
        }
        if String::from_utf8_lossy(&answer).contains(INDEX) {
            break;
        }
    }
    assert!(
        String::from_utf8_lossy(&answer).contains(INDEX),
        "{}",
        String::from_utf8_lossy(&answer)
    );

    // A form the session cookie carries from another port's page is refused as well, even
    // with the token.
    let body = format!("csrf={}", session.csrf);
    let post = |origin: &str| {
        send(
            &addr,
            &format!(
                "POST /ui/projects/{name}/stop HTTP/1.1\r\nHost: {addr}\r\nOrigin: {origin}\r\n{}\
                 Content-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\n\
                 Connection: close\r\n\r\n{body}",
                session.cookie_line(),
                body.len()
            ),
        )
    };
    let foreign = post(&other_port);
    assert_eq!(foreign.status, 403, "{}", foreign.head);
    assert!(foreign.body.contains("Origin"), "{}", foreign.body);
    let project = berth.get_project(&name).expect("the project");
    assert_ne!(
        project["spec"]["state"], "Stopped",
        "the foreign form acted"
    );
    let own_form = post(&own);
    assert_eq!(own_form.status, 303, "{}\n{}", own_form.head, own_form.body);
}

/// A server in the container that appends the head of every request it gets to `/tmp/seen`.
const RECORDER: &str = r#"
mkdir -p /srv
cat > /srv/record.sh <<'EOF'
#!/bin/sh
while IFS= read -r line; do
    line=$(printf '%s' "$line" | tr -d '\r')
    [ -z "$line" ] && break
    printf '%s\n' "$line" >> /tmp/seen
done
printf -- '--\n' >> /tmp/seen
printf 'HTTP/1.1 200 OK\r\nContent-Length: 3\r\nConnection: close\r\n\r\nok\n'
EOF
chmod +x /srv/record.sh
setsid busybox nc -ll -p 8003 -e /srv/record.sh </dev/null >/dev/null 2>&1 &
"#;

#[test]
fn the_preview_listener_relays_none_of_berths_credentials() {
    let mut berth = Berth::start_with(&[], &[]);
    let addr = berth.preview_addr();
    let name = crate::harness::unique_name();
    berth.create_project(&name, json!({"image": "berth-tiny"}));
    let user = format!("alice-{name}");
    let alice = berth.add_user(&user, false);
    berth.add_member(&name, &user);
    berth.wait_ready(&name);
    crate::harness::exec(&name, RECORDER).expect("start the recorder");
    let host = format!("{name}--8003.localhost");
    let reply = berth.client().post_json(
        &format!("{PROJECTS}/{name}/previewtickets"),
        &json!({"port": 8003}),
    );
    assert_eq!(reply.status, 201, "{}", reply.text());
    let link = reply.json()["url"].as_str().unwrap().to_string();
    let path = &link[link.find("/?").unwrap()..];
    let exchange = send(
        &addr,
        &format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"),
    );
    assert_eq!(exchange.status, 303, "{}", exchange.head);
    let mut jar = BTreeMap::new();
    set_cookies(&exchange.head, &mut jar);
    let preview_cookie = jar
        .get("berth-preview")
        .expect("the preview cookie")
        .clone();

    let get = |headers: &str| {
        let deadline = Instant::now() + DEADLINE;
        loop {
            let answer = send(
                &addr,
                &format!("GET / HTTP/1.1\r\nHost: {host}\r\n{headers}Connection: close\r\n\r\n"),
            );
            if answer.status == 200 {
                return answer;
            }
            // The recorder may still be starting: the listener answers 502 until it binds.
            assert!(
                answer.status >= 500 && Instant::now() < deadline,
                "{}\n{}",
                answer.head,
                answer.body
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    };
    // Both a bearer token and the preview cookie: neither goes on; the app's cookie does.
    get(&format!(
        "Authorization: Bearer {alice}\r\nCookie: app=kept-1; berth-preview={preview_cookie}\r\n"
    ));
    // The cookie lets the request in; the application's own bearer token goes on.
    get(&format!(
        "Authorization: Bearer app-own-token\r\nCookie: berth-preview={preview_cookie}; app=kept-2\r\n"
    ));
    // The cookie lets the request in; a berth token berth does not know stays out too.
    get(&format!(
        "Authorization: Bearer berth_revoked0000\r\nCookie: berth-preview={preview_cookie}\r\n"
    ));
    let seen = crate::harness::read_file(&name, "/tmp/seen").expect("read what the container saw");
    for kept in ["app=kept-1", "app=kept-2", "Bearer app-own-token"] {
        assert!(seen.contains(kept), "{kept} was not relayed:\n{seen}");
    }
    for secret in [
        preview_cookie.as_str(),
        "berth-preview",
        alice.as_str(),
        "berth_revoked0000",
    ] {
        assert!(
            !seen.contains(secret),
            "{secret} reached the container:\n{seen}"
        );
    }
}

/// A uid no account uses, with `/tmp/berth-<uid>` free: the other local user's target.
fn throwaway_uid() -> u32 {
    let base = 61_000 + std::process::id() % 2_000 * 2;
    (base..base + 400)
        .step_by(2)
        .find(|uid| !Path::new(&format!("/tmp/berth-{uid}")).exists())
        .expect("a free uid")
}

/// Runs `berth ARGS` as `uid`, without `XDG_RUNTIME_DIR` (the socket defaults to
/// `/tmp/berth-<uid>`) unless `runtime_dir` is given.
fn berth_as(uid: u32, home: &Path, runtime_dir: Option<&Path>, args: &[&str]) -> Command {
    let mut command = Command::new("setpriv");
    command
        .arg(format!("--reuid={uid}"))
        .arg(format!("--regid={uid}"))
        .arg("--clear-groups")
        .arg(env!("CARGO_BIN_EXE_berth"))
        .args(args)
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .env("HOME", home)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(dir) = runtime_dir {
        command.env("XDG_RUNTIME_DIR", dir);
    }
    command
}

fn chown(path: &Path, uid: u32) {
    std::os::unix::fs::chown(path, Some(uid), Some(uid)).expect("chown");
}

/// Removes what the test made under `/tmp` however it ends.
struct Made(Vec<PathBuf>);

impl Drop for Made {
    fn drop(&mut self) {
        for path in &self.0 {
            let _ = std::fs::remove_dir_all(path);
        }
    }
}

/// `berth serve` as `uid` must exit with an error naming `dir`, and never serve in it.
fn serve_refuses(uid: u32, home: &Path, runtime_dir: Option<&Path>, dir: &Path) {
    let data = home.join("data");
    let mut child = berth_as(
        uid,
        home,
        runtime_dir,
        &["serve", "--paused", "--data-dir", data.to_str().unwrap()],
    )
    .spawn()
    .expect("spawn berth serve");
    let deadline = Instant::now() + DEADLINE;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if dir.join("berth.sock").exists() || Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "berth serve as uid {uid} served in {} (or did not stop)",
                dir.display()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    assert!(!status.success(), "{stderr}");
    assert!(
        stderr.contains(&dir.display().to_string()),
        "the error names the directory: {stderr}"
    );
}

#[test]
fn a_socket_directory_another_user_controls_is_refused() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "this test runs as root: it plays two users with setpriv"
    );
    let uid = throwaway_uid();
    let intruder = uid + 1;
    let home = tempfile::tempdir().expect("temp dir");
    chown(home.path(), uid);
    let default_dir = PathBuf::from(format!("/tmp/berth-{uid}"));
    let runtime = tempfile::tempdir().expect("temp dir");
    let made = Made(vec![default_dir.clone()]);

    // The intruder made the default socket directory first, open to all.
    std::fs::create_dir(&default_dir).unwrap();
    chown(&default_dir, intruder);
    std::fs::set_permissions(&default_dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    serve_refuses(uid, home.path(), None, &default_dir);

    // The same under $XDG_RUNTIME_DIR: `berth/` there is the intruder's.
    let xdg = runtime.path().join("run");
    std::fs::create_dir(&xdg).unwrap();
    std::fs::set_permissions(&xdg, std::fs::Permissions::from_mode(0o777)).unwrap();
    let xdg_berth = xdg.join("berth");
    std::fs::create_dir(&xdg_berth).unwrap();
    chown(&xdg_berth, intruder);
    std::fs::set_permissions(&xdg_berth, std::fs::Permissions::from_mode(0o777)).unwrap();
    serve_refuses(uid, home.path(), Some(&xdg), &xdg_berth);

    // The intruder's socket in the default directory: the CLI sends it nothing, not even a
    // secret's value.
    let listener = UnixListener::bind(default_dir.join("berth.sock")).unwrap();
    listener.set_nonblocking(true).unwrap();
    std::fs::set_permissions(
        default_dir.join("berth.sock"),
        std::fs::Permissions::from_mode(0o777),
    )
    .unwrap();
    let value = home.path().join("value");
    std::fs::write(&value, "very-secret-value").unwrap();
    let output = berth_as(
        uid,
        home.path(),
        None,
        &[
            "secret",
            "set",
            "demo",
            "API_KEY",
            "--from-file",
            value.to_str().unwrap(),
        ],
    )
    .output()
    .expect("run berth");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{stderr}");
    assert!(
        stderr.contains(&default_dir.display().to_string()),
        "the error names the directory: {stderr}"
    );
    assert_eq!(
        stderr.lines().count(),
        1,
        "one line, naming the problem: {stderr}"
    );
    match listener.accept() {
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
        Ok(_) => panic!("the CLI connected to the intruder's socket"),
        Err(e) => panic!("accept: {e}"),
    }

    // The user's own directory, but writable by others: refused too.
    drop(listener);
    std::fs::remove_dir_all(&default_dir).unwrap();
    std::fs::create_dir(&default_dir).unwrap();
    chown(&default_dir, uid);
    std::fs::set_permissions(&default_dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    serve_refuses(uid, home.path(), None, &default_dir);
    let output = berth_as(uid, home.path(), None, &["get", "projects"])
        .output()
        .expect("run berth");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{stderr}");
    assert!(stderr.contains("writable by others"), "{stderr}");
    drop(made);
}
