//! The one launcher of a test's `berth serve` ([`Daemon`], started paused or running through
//! [`Launch`]), and the small blocking HTTP/1.1 clients that talk to it over its unix socket
//! and its TCP listener.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

/// How long a daemon may take to answer `/healthz` after it is spawned.
const START_DEADLINE: Duration = Duration::from_secs(30);
/// How long a daemon may take to shut down after SIGTERM, or to exit at a fault point.
const EXIT_DEADLINE: Duration = Duration::from_secs(60);
/// How long `/readyz` may take to answer 200: the store open, LXD connected.
const CONNECT_DEADLINE: Duration = Duration::from_secs(120);
/// How long a single request may take before the test fails instead of hanging.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

/// How a test's `berth serve` is started: paused or running, its extra arguments, environment,
/// berth.yaml and fault point. [`Daemon::paused`] and [`Daemon::running`] begin one;
/// [`Launch::start`] spawns the daemon and waits until it answers.
pub struct Launch {
    paused: bool,
    args: Vec<String>,
    env: Vec<(String, String)>,
    config: Option<String>,
    fault: Option<String>,
}

impl Launch {
    /// Extra `serve` arguments (after `--data-dir` and `--socket`).
    pub fn args(mut self, args: &[&str]) -> Launch {
        self.args.extend(args.iter().map(|a| a.to_string()));
        self
    }

    /// An environment variable the daemon gets beyond the test's own (overriding the default
    /// `BERTH_LOG=info`), kept for restarts.
    pub fn env(mut self, key: &str, value: &str) -> Launch {
        self.env.push((key.to_string(), value.to_string()));
        self
    }

    /// [`Launch::env`] for each pair.
    pub fn envs(self, env: &[(&str, &str)]) -> Launch {
        env.iter().fold(self, |launch, (k, v)| launch.env(k, v))
    }

    /// `config` (YAML) as the daemon's berth.yaml, written into its temporary directory.
    pub fn config(mut self, config: &str) -> Launch {
        self.config = Some(config.to_string());
        self
    }

    /// Arms a fault point (`BERTH_FAULT`) for the first start only.
    pub fn fault(mut self, fault: Option<&str>) -> Launch {
        self.fault = fault.map(str::to_string);
        self
    }

    /// Spawns the daemon on a fresh temporary data directory and waits until it answers
    /// `/healthz`.
    pub fn start(self) -> Daemon {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut args = Vec::new();
        if self.paused {
            args.push("--paused".to_string());
        }
        if let Some(config) = &self.config {
            let path = dir.path().join("berth.yaml");
            std::fs::write(&path, config).expect("write berth.yaml");
            args.push("--config".to_string());
            args.push(path.to_str().expect("a utf-8 temp path").to_string());
        }
        args.extend(self.args);
        let mut daemon = Daemon {
            child: None,
            args,
            env: self.env,
            data_dir: dir.path().join("data"),
            socket: dir.path().join("berth.sock"),
            log: dir.path().join("daemon.log"),
            dir,
        };
        daemon.spawn(self.fault.as_deref());
        daemon
    }
}

/// A `berth serve` on its own temporary data directory and socket: the one launcher of the
/// end-to-end tests. Killed on drop, and what its projects left in LXD's trash deleted.
pub struct Daemon {
    child: Option<Child>,
    /// The `serve` arguments after `--data-dir` and `--socket`, kept for restarts.
    args: Vec<String>,
    /// Environment variables the daemon gets beyond the test's own, kept for restarts.
    env: Vec<(String, String)>,
    pub dir: tempfile::TempDir,
    pub data_dir: PathBuf,
    pub socket: PathBuf,
    pub log: PathBuf,
}

impl Daemon {
    /// A daemon whose controller is paused (`--paused`): the API, the store and the CLI, no
    /// LXD work.
    pub fn paused() -> Launch {
        Launch {
            paused: true,
            args: Vec::new(),
            env: Vec::new(),
            config: None,
            fault: None,
        }
    }

    /// A daemon whose controller runs against the real LXD.
    pub fn running() -> Launch {
        Launch {
            paused: false,
            ..Daemon::paused()
        }
    }

    /// Starts a paused daemon and waits until it answers.
    pub fn start() -> Daemon {
        Daemon::paused().start()
    }

    /// Starts a paused daemon with extra `serve` arguments.
    pub fn start_with(extra: &[&str]) -> Daemon {
        Daemon::paused().args(extra).start()
    }

    fn spawn(&mut self, fault: Option<&str>) {
        self.spawn_with(fault, &[]);
    }

    fn spawn_with(&mut self, fault: Option<&str>, extra: &[&str]) {
        let mut args = self.args.clone();
        args.extend(extra.iter().map(|a| a.to_string()));
        let mut command = serve_command(&self.data_dir, &self.socket, &self.log, &args);
        command
            .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .env_remove("BERTH_FAULT");
        if let Some(fault) = fault {
            command.env("BERTH_FAULT", fault);
        }
        self.child = Some(command.spawn().expect("spawn berth serve"));
        self.wait_healthy();
    }

    /// Starts the daemon again on the same data directory and socket, after [`terminate`],
    /// [`kill`] or a fault point's exit.
    ///
    /// [`terminate`]: Daemon::terminate
    /// [`kill`]: Daemon::kill
    pub fn restart(&mut self) {
        self.restart_with(None);
    }

    /// [`Daemon::restart`] with a fault point armed (or none).
    pub fn restart_with(&mut self, fault: Option<&str>) {
        assert!(self.child.is_none(), "restart needs a stopped daemon");
        self.spawn(fault);
    }

    /// Starts the daemon again on the same data directory and socket with its controller
    /// paused (`--paused`): to record what a test needs the controller not to see yet.
    pub fn restart_paused(&mut self) {
        assert!(self.child.is_none(), "restart needs a stopped daemon");
        self.spawn_with(None, &["--paused"]);
    }

    pub fn client(&self) -> Client {
        Client::new(&self.socket)
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().map(Child::id).unwrap_or_default()
    }

    /// The address the preview listener serves on (as the daemon logged it).
    pub fn preview_addr(&self) -> String {
        logged_addr(&self.log_text(), "serving previews")
    }

    /// The TCP address the daemon serves on (as it logged it), for `--listen 127.0.0.1:0`.
    pub fn tcp_addr(&self) -> String {
        logged_addr(&self.log_text(), "serving the API over TCP")
    }

    /// Adds a user over the unix socket (as the local admin) and returns its token.
    pub fn add_user(&self, name: &str, admin: bool) -> String {
        let reply = self.client().post_json(
            "/apis/berth.dev/v1alpha1/users",
            &serde_json::json!({"name": name, "admin": admin}),
        );
        assert_eq!(reply.status, 201, "adding user {name}: {}", reply.text());
        reply.json()["token"]
            .as_str()
            .expect("a token in the reply")
            .to_string()
    }

    /// [`super::eventually`], failing with this daemon's log.
    pub fn eventually<T>(
        &self,
        deadline: Duration,
        what: &str,
        check: impl FnMut() -> Option<T>,
    ) -> T {
        super::eventually(
            deadline,
            what,
            || format!("\n--- daemon log ---\n{}", self.log_text()),
            check,
        )
    }

    /// [`Daemon::eventually`] for a condition that holds or not.
    pub fn wait_until(&self, deadline: Duration, what: &str, mut check: impl FnMut() -> bool) {
        self.eventually(deadline, what, || check().then_some(()));
    }

    /// What the daemon wrote to stderr so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn wait_healthy(&mut self) {
        let deadline = Instant::now() + START_DEADLINE;
        loop {
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                panic!(
                    "berth serve exited with {status} before answering:\n{}",
                    self.log_text()
                );
            }
            if let Ok(reply) = self.client().try_request("GET", "/healthz", None, &[])
                && reply.status == 200
            {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "berth serve did not answer /healthz within {START_DEADLINE:?}:\n{}",
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(25));
        }
    }

    /// Waits until `/readyz` answers 200: the store open, LXD connected, the controller
    /// running. A daemon just started answers `/healthz` before it reaches LXD.
    pub fn wait_connected(&self) {
        self.eventually(CONNECT_DEADLINE, "berth serve to become ready", || {
            self.client()
                .try_request("GET", "/readyz", None, &[])
                .is_ok_and(|reply| reply.status == 200)
                .then_some(())
        });
    }

    /// Kills the daemon with SIGKILL, as a crash or power cut would stop it (if it still runs).
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Sends SIGTERM and waits for the process to exit, as an operator's stop does.
    pub fn terminate(&mut self) -> ExitStatus {
        let child = self.child.as_mut().expect("daemon running");
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        )
        .expect("send SIGTERM");
        self.wait_exit(EXIT_DEADLINE)
    }

    /// Waits for the daemon to exit (by itself at a fault point, or after a signal) and
    /// returns how it exited.
    pub fn wait_exit(&mut self, deadline: Duration) -> ExitStatus {
        let child = self.child.as_mut().expect("daemon running");
        let status = wait_with_deadline(child, deadline)
            .unwrap_or_else(|| panic!("berth serve did not exit:\n{}", self.log_text()));
        self.child = None;
        status
    }

    /// Whether the daemon process is still there (not killed, terminated or exited).
    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// The value of one sample on `/metrics` (`name{labels}`), failing when it is absent.
    pub fn metric(&self, sample: &str) -> f64 {
        let text = self.client().get("/metrics").text();
        text.lines()
            .find_map(|l| {
                l.strip_prefix(sample)?
                    .strip_prefix(' ')?
                    .trim()
                    .parse()
                    .ok()
            })
            .unwrap_or_else(|| panic!("no {sample} on /metrics:\n{text}"))
    }

    /// Waits until the scheduler ran its `pass` `n` more times.
    pub fn wait_passes(&self, pass: &str, n: u32) {
        let sample = format!("berth_scheduler_pass_duration_seconds_count{{pass=\"{pass}\"}}");
        let target = self.metric(&sample) + f64::from(n);
        self.wait_until(
            crate::harness::READY_DEADLINE,
            &format!("{n} more {pass} passes"),
            || self.metric(&sample) >= target,
        );
    }

    /// Writes a file under the test's temp dir and returns its path.
    pub fn file(&self, name: &str, content: &str) -> String {
        let path = self.dir.path().join(name);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).expect("a directory for the file");
        }
        std::fs::write(&path, content).expect("write the file");
        path.to_string_lossy().into_owned()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.kill();
        // What the test's projects left in the trash, by the controller ids its stores had.
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        crate::support::lxd::delete_trash_of(&crate::support::lxd::controller_ids(&log));
    }
}

/// `--preview 127.0.0.1:0` unless the test chose the preview listener itself: test daemons run
/// side by side, so none takes the default port.
pub fn free_preview_port(args: &[impl AsRef<str>]) -> Vec<&'static str> {
    if args.iter().any(|a| a.as_ref().starts_with("--preview")) {
        Vec::new()
    } else {
        vec!["--preview", "127.0.0.1:0"]
    }
}

/// Spawns `berth serve --paused` without waiting for it.
pub fn spawn_serve(data_dir: &Path, socket: &Path, log: &Path, extra: &[&str]) -> Child {
    let mut args = vec!["--paused"];
    args.extend_from_slice(extra);
    spawn_serve_args(data_dir, socket, log, &args)
}

/// Spawns `berth serve --data-dir DIR --socket PATH ARGS...` without waiting for it; its stderr
/// goes to `log`.
pub fn spawn_serve_args(data_dir: &Path, socket: &Path, log: &Path, args: &[&str]) -> Child {
    serve_command(data_dir, socket, log, args)
        .spawn()
        .expect("spawn berth serve")
}

/// `berth serve --data-dir DIR --socket PATH [--preview 127.0.0.1:0] ARGS...` with
/// `BERTH_LOG=info`, no stdin or stdout, and stderr appended to `log`.
fn serve_command(data_dir: &Path, socket: &Path, log: &Path, args: &[impl AsRef<str>]) -> Command {
    let log_file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .expect("daemon log file");
    let mut command = Command::new(env!("CARGO_BIN_EXE_berth"));
    command
        .arg("serve")
        .arg("--data-dir")
        .arg(data_dir)
        .arg("--socket")
        .arg(socket)
        .args(free_preview_port(args))
        .args(args.iter().map(AsRef::as_ref))
        .env("BERTH_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log_file);
    command
}

/// Waits for `child` to exit, up to `deadline`.
pub fn wait_with_deadline(child: &mut Child, deadline: Duration) -> Option<ExitStatus> {
    let until = Instant::now() + deadline;
    while Instant::now() < until {
        if let Some(status) = child.try_wait().expect("wait on child") {
            return Some(status);
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    None
}

/// One HTTP response.
#[derive(Debug, Clone)]
pub struct Reply {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Reply {
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|err| {
            panic!(
                "response ({}) is not JSON: {err}: {}",
                self.status,
                String::from_utf8_lossy(&self.body)
            )
        })
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// A blocking HTTP/1.1 client over a unix socket: one connection per request.
#[derive(Debug, Clone)]
pub struct Client {
    socket: PathBuf,
}

impl Client {
    pub fn new(socket: &Path) -> Client {
        Client {
            socket: socket.to_path_buf(),
        }
    }

    pub fn get(&self, path: &str) -> Reply {
        self.request("GET", path, None, &[])
    }

    /// The object `berth.dev/v1alpha1/PLURAL/NAME`, `None` when there is none (404); any other
    /// answer fails the test.
    pub fn object(&self, plural: &str, name: &str) -> Option<Value> {
        let reply = self.get(&format!("/apis/berth.dev/v1alpha1/{plural}/{name}"));
        match reply.status {
            200 => Some(reply.json()),
            404 => None,
            other => panic!("GET {plural}/{name}: {other}: {}", reply.text()),
        }
    }

    pub fn delete(&self, path: &str) -> Reply {
        self.request("DELETE", path, None, &[])
    }

    pub fn post_json(&self, path: &str, body: &Value) -> Reply {
        self.request(
            "POST",
            path,
            Some("application/json"),
            body.to_string().as_bytes(),
        )
    }

    pub fn put_json(&self, path: &str, body: &Value) -> Reply {
        self.request(
            "PUT",
            path,
            Some("application/json"),
            body.to_string().as_bytes(),
        )
    }

    pub fn request(
        &self,
        method: &str,
        path: &str,
        content_type: Option<&str>,
        body: &[u8],
    ) -> Reply {
        self.try_request(method, path, content_type, body)
            .unwrap_or_else(|err| panic!("{method} {path}: {err}"))
    }

    pub fn try_request(
        &self,
        method: &str,
        path: &str,
        content_type: Option<&str>,
        body: &[u8],
    ) -> std::io::Result<Reply> {
        let mut reader = self.send(method, path, content_type, body)?;
        let (status, headers) = read_head(&mut reader)?;
        let body = read_body(&mut reader, &headers)?;
        Ok(Reply {
            status,
            headers,
            body,
        })
    }

    /// Opens a watch (`?watch=true`) and returns its stream of events.
    pub fn watch(&self, path: &str) -> Watch {
        let mut reader = self
            .send("GET", path, None, &[])
            .unwrap_or_else(|err| panic!("watch {path}: {err}"));
        let (status, headers) = read_head(&mut reader).expect("watch response head");
        assert_eq!(status, 200, "watch {path} answered {status}");
        let chunked = header(&headers, "transfer-encoding").is_some_and(|v| v.contains("chunked"));
        Watch {
            reader,
            chunked,
            pending: Vec::new(),
        }
    }

    fn send(
        &self,
        method: &str,
        path: &str,
        content_type: Option<&str>,
        body: &[u8],
    ) -> std::io::Result<BufReader<UnixStream>> {
        let mut stream = UnixStream::connect(&self.socket)?;
        stream.set_read_timeout(Some(REQUEST_TIMEOUT))?;
        stream.set_write_timeout(Some(REQUEST_TIMEOUT))?;
        let mut head = format!(
            "{method} {path} HTTP/1.1\r\nHost: berth\r\nConnection: close\r\nContent-Length: {}\r\n",
            body.len()
        );
        if let Some(content_type) = content_type {
            head.push_str(&format!("Content-Type: {content_type}\r\n"));
        }
        head.push_str("\r\n");
        stream.write_all(head.as_bytes())?;
        // The server may answer (413) before reading the whole body; that is not an error here.
        let _ = stream.write_all(body);
        Ok(BufReader::new(stream))
    }
}

fn header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.as_str())
}

fn read_head(reader: &mut BufReader<UnixStream>) -> std::io::Result<(u16, Vec<(String, String)>)> {
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let status = line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("bad status line {line:?}")))?;
    let mut headers = Vec::new();
    loop {
        line.clear();
        reader.read_line(&mut line)?;
        let trimmed = line.trim_end();
        if trimmed.is_empty() {
            break;
        }
        if let Some((k, v)) = trimmed.split_once(':') {
            headers.push((k.trim().to_string(), v.trim().to_string()));
        }
    }
    Ok((status, headers))
}

fn read_body(
    reader: &mut BufReader<UnixStream>,
    headers: &[(String, String)],
) -> std::io::Result<Vec<u8>> {
    let mut body = Vec::new();
    if header(headers, "transfer-encoding").is_some_and(|v| v.contains("chunked")) {
        while let Some(chunk) = read_chunk(reader)? {
            body.extend_from_slice(&chunk);
        }
    } else if let Some(length) = header(headers, "content-length").and_then(|v| v.parse().ok()) {
        body.resize(length, 0);
        reader.read_exact(&mut body)?;
    } else {
        reader.read_to_end(&mut body)?;
    }
    Ok(body)
}

/// One chunk of a chunked body; `None` at the end.
fn read_chunk(reader: &mut BufReader<UnixStream>) -> std::io::Result<Option<Vec<u8>>> {
    let mut line = String::new();
    if reader.read_line(&mut line)? == 0 {
        return Ok(None);
    }
    let size = usize::from_str_radix(line.trim().split(';').next().unwrap_or("0"), 16)
        .map_err(|_| std::io::Error::other(format!("bad chunk size {line:?}")))?;
    if size == 0 {
        line.clear();
        reader.read_line(&mut line)?;
        return Ok(None);
    }
    let mut chunk = vec![0; size];
    reader.read_exact(&mut chunk)?;
    line.clear();
    reader.read_line(&mut line)?;
    Ok(Some(chunk))
}

/// The events of a watch, one JSON object per line.
pub struct Watch {
    reader: BufReader<UnixStream>,
    chunked: bool,
    pending: Vec<u8>,
}

impl Watch {
    /// The next event, or `None` when the server ended the stream.
    pub fn next_event(&mut self) -> Option<Value> {
        loop {
            if let Some(end) = self.pending.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = self.pending.drain(..=end).collect();
                return Some(serde_json::from_slice(&line).expect("watch line is JSON"));
            }
            let more = if self.chunked {
                read_chunk(&mut self.reader).expect("read watch chunk")
            } else {
                let mut buf = vec![0; 8192];
                let n = self.reader.read(&mut buf).expect("read watch");
                buf.truncate(n);
                (n > 0).then_some(buf)
            };
            self.pending.extend_from_slice(&more?);
        }
    }
}

/// A blocking client for the TCP listener (HTTP or HTTPS), with an optional bearer token.
pub struct TcpClient {
    addr: String,
    ca_pem: Option<Vec<u8>>,
    base: String,
    token: Option<String>,
    http: reqwest::Client,
    runtime: tokio::runtime::Runtime,
}

impl TcpClient {
    /// `http://ADDR`, or `https://localhost:PORT` trusting only `ca_pem` when given.
    pub fn new(addr: &str, token: Option<&str>, ca_pem: Option<&[u8]>) -> TcpClient {
        // Each client has its own runtime, and pooled connections belong to the runtime that
        // opened them: no pooling, one connection per request.
        let mut builder = reqwest::Client::builder()
            .timeout(REQUEST_TIMEOUT)
            .connect_timeout(Duration::from_secs(10))
            .pool_max_idle_per_host(0);
        let base = match ca_pem {
            Some(pem) => {
                let port = addr.rsplit_once(':').map(|(_, p)| p).unwrap_or_default();
                builder = builder
                    .tls_certs_only([reqwest::Certificate::from_pem(pem).expect("CA PEM")])
                    // The certificate names localhost; the daemon listens on 127.0.0.1.
                    .resolve("localhost", addr.parse().expect("a socket address"));
                format!("https://localhost:{port}")
            }
            None => format!("http://{addr}"),
        };
        TcpClient {
            addr: addr.to_string(),
            ca_pem: ca_pem.map(<[u8]>::to_vec),
            base,
            token: token.map(str::to_string),
            http: builder.build().expect("reqwest client"),
            runtime: tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("tokio runtime"),
        }
    }

    /// The same server as another user (or none).
    pub fn with_token(&self, token: Option<&str>) -> TcpClient {
        TcpClient::new(&self.addr, token, self.ca_pem.as_deref())
    }

    pub fn try_request(
        &self,
        method: &str,
        path: &str,
        content_type: Option<&str>,
        body: &[u8],
    ) -> Result<Reply, reqwest::Error> {
        let method = reqwest::Method::from_bytes(method.as_bytes()).expect("an HTTP method");
        let mut request = self
            .http
            .request(method, format!("{}{path}", self.base))
            .body(body.to_vec());
        if let Some(content_type) = content_type {
            request = request.header("content-type", content_type);
        }
        if let Some(token) = &self.token {
            request = request.bearer_auth(token);
        }
        self.runtime.block_on(async move {
            let response = request.send().await?;
            let status = response.status().as_u16();
            let headers = response
                .headers()
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_str().unwrap_or_default().to_string()))
                .collect();
            let body = response.bytes().await?.to_vec();
            Ok(Reply {
                status,
                headers,
                body,
            })
        })
    }

    pub fn request(
        &self,
        method: &str,
        path: &str,
        content_type: Option<&str>,
        body: &[u8],
    ) -> Reply {
        self.try_request(method, path, content_type, body)
            .unwrap_or_else(|err| panic!("{method} {path}: {err:?}"))
    }

    pub fn get(&self, path: &str) -> Reply {
        self.request("GET", path, None, &[])
    }

    pub fn json(&self, method: &str, path: &str, body: &Value) -> Reply {
        self.request(
            method,
            path,
            Some("application/json"),
            body.to_string().as_bytes(),
        )
    }
}

/// Fails if any file under `dir` holds `needle`: for values that must never be written in
/// plain text (secrets, tokens).
pub fn assert_nowhere_under(dir: &Path, needle: &[u8]) {
    let mut pending = vec![dir.to_path_buf()];
    let mut files = 0;
    while let Some(path) = pending.pop() {
        let meta = std::fs::symlink_metadata(&path).expect("stat under the data dir");
        if meta.is_dir() {
            for entry in std::fs::read_dir(&path).expect("read dir") {
                pending.push(entry.expect("dir entry").path());
            }
        } else if meta.is_file() {
            files += 1;
            let bytes = std::fs::read(&path).expect("read file");
            assert!(
                !bytes.windows(needle.len()).any(|w| w == needle),
                "{} holds the value in plain text",
                path.display()
            );
        }
    }
    assert!(files > 0, "nothing under {}", dir.display());
}

/// The `addr=` of the last log line containing `message`.
pub fn logged_addr(log: &str, message: &str) -> String {
    log.lines()
        .rev()
        .filter(|line| line.contains(message))
        .find_map(|line| {
            line.split_whitespace()
                .find_map(|word| word.strip_prefix("addr="))
                .map(str::to_string)
        })
        .unwrap_or_else(|| panic!("the daemon logged no {message:?} address:\n{log}"))
}
