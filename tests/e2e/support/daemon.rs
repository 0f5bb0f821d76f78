//! A real `berth serve` process for a test, and a small blocking HTTP/1.1 client that talks to it
//! over its unix socket.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

/// How long a daemon may take to answer `/healthz` after it is spawned.
const START_DEADLINE: Duration = Duration::from_secs(30);
/// How long a single request may take before the test fails instead of hanging.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

/// A `berth serve` on its own temporary data directory, killed on drop.
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
    /// Starts a paused daemon and waits until it answers.
    pub fn start() -> Daemon {
        Self::start_with(&[])
    }

    /// Starts a paused daemon with extra `serve` arguments.
    pub fn start_with(extra: &[&str]) -> Daemon {
        let mut args = vec!["--paused"];
        args.extend_from_slice(extra);
        Self::start_args(&args)
    }

    /// Starts a daemon whose controller runs, with extra `serve` arguments.
    pub fn start_running(extra: &[&str]) -> Daemon {
        Self::start_args(extra)
    }

    /// Starts a daemon whose controller runs, with `config` (YAML) as its berth.yaml.
    pub fn start_running_with_config(config: &str) -> Daemon {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("berth.yaml");
        std::fs::write(&path, config).expect("write berth.yaml");
        let path = path.to_str().expect("a utf-8 temp path").to_string();
        Self::start_in(dir, &["--config", &path])
    }

    /// Starts a daemon whose controller runs, with extra environment variables (e.g.
    /// `GIT_SSL_CAINFO` for a test's own TLS git server).
    pub fn start_running_with_env(extra: &[&str], env: &[(&str, &str)]) -> Daemon {
        let env = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Self::start_in_env(tempfile::tempdir().expect("temp dir"), extra, env)
    }

    fn start_args(args: &[&str]) -> Daemon {
        Self::start_in(tempfile::tempdir().expect("temp dir"), args)
    }

    fn start_in(dir: tempfile::TempDir, args: &[&str]) -> Daemon {
        Self::start_in_env(dir, args, Vec::new())
    }

    fn start_in_env(dir: tempfile::TempDir, args: &[&str], env: Vec<(String, String)>) -> Daemon {
        let data_dir = dir.path().join("data");
        let socket = dir.path().join("berth.sock");
        let log = dir.path().join("daemon.log");
        let child = spawn_serve_env(&data_dir, &socket, &log, args, &env);
        let mut daemon = Daemon {
            child: Some(child),
            args: args.iter().map(|a| a.to_string()).collect(),
            env,
            dir,
            data_dir,
            socket,
            log,
        };
        daemon.wait_healthy();
        daemon
    }

    /// Starts the daemon again on the same data directory and socket, after [`terminate`].
    ///
    /// [`terminate`]: Daemon::terminate
    pub fn restart(&mut self) {
        assert!(self.child.is_none(), "restart needs a terminated daemon");
        let args: Vec<&str> = self.args.iter().map(String::as_str).collect();
        self.child = Some(spawn_serve_env(
            &self.data_dir,
            &self.socket,
            &self.log,
            &args,
            &self.env,
        ));
        self.wait_healthy();
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
        let log = self.log_text();
        log.lines()
            .rev()
            .filter(|line| line.contains("serving the API over TCP"))
            .find_map(|line| {
                line.split_whitespace()
                    .find_map(|word| word.strip_prefix("addr="))
                    .map(str::to_string)
            })
            .unwrap_or_else(|| panic!("the daemon logged no TCP address:\n{log}"))
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

    /// What the daemon wrote to stderr so far.
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

    /// Kills the daemon with SIGKILL, as a crash or power cut would stop it.
    pub fn kill(&mut self) {
        let mut child = self.child.take().expect("daemon running");
        child.kill().expect("kill berth serve");
        child.wait().expect("reap berth serve");
    }

    /// Sends SIGTERM and waits for the process to exit.
    pub fn terminate(&mut self) -> ExitStatus {
        let child = self.child.as_mut().expect("daemon running");
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        )
        .expect("send SIGTERM");
        let status = wait_with_deadline(child, Duration::from_secs(30))
            .unwrap_or_else(|| panic!("berth serve ignored SIGTERM:\n{}", self.log_text()));
        self.child = None;
        status
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
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
    spawn_serve_env(data_dir, socket, log, args, &[])
}

fn spawn_serve_env(
    data_dir: &Path,
    socket: &Path,
    log: &Path,
    args: &[&str],
    env: &[(String, String)],
) -> Child {
    let log_file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .expect("daemon log file");
    Command::new(env!("CARGO_BIN_EXE_berth"))
        .arg("serve")
        .arg("--data-dir")
        .arg(data_dir)
        .arg("--socket")
        .arg(socket)
        .args(free_preview_port(args))
        .args(args)
        .env("BERTH_LOG", "info")
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log_file)
        .spawn()
        .expect("spawn berth serve")
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
