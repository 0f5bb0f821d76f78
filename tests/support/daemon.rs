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

    fn start_args(args: &[&str]) -> Daemon {
        let dir = tempfile::tempdir().expect("temp dir");
        let data_dir = dir.path().join("data");
        let socket = dir.path().join("berth.sock");
        let log = dir.path().join("daemon.log");
        let child = spawn_serve_args(&data_dir, &socket, &log, args);
        let mut daemon = Daemon {
            child: Some(child),
            args: args.iter().map(|a| a.to_string()).collect(),
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
        self.child = Some(spawn_serve_args(
            &self.data_dir,
            &self.socket,
            &self.log,
            &args,
        ));
        self.wait_healthy();
    }

    pub fn client(&self) -> Client {
        Client::new(&self.socket)
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().map(Child::id).unwrap_or_default()
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
        .args(args)
        .env("BERTH_LOG", "info")
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
