//! Shared by the `ops_*` tests: the external tools they drive (promtool, Prometheus, curl) and
//! free loopback ports.
#![allow(dead_code)]

use std::io::Write;
use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Fails the test with the way out when a tool the tests need is missing.
pub fn require_tool(tool: &str) {
    let found = Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        found,
        "{tool} is not installed; run scripts/setup-test-deps first"
    );
}

/// Runs `promtool check metrics` on an exposition; `Err` carries promtool's complaints.
pub fn promtool_check(exposition: &str) -> Result<(), String> {
    require_tool("promtool");
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn promtool");
    child
        .stdin
        .take()
        .expect("promtool stdin")
        .write_all(exposition.as_bytes())
        .expect("feed promtool");
    let out = wait_output(child, Duration::from_secs(60));
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "promtool check metrics exited with {}:\n{}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

fn wait_output(mut child: Child, deadline: Duration) -> std::process::Output {
    let until = Instant::now() + deadline;
    while child.try_wait().expect("wait on child").is_none() {
        if Instant::now() > until {
            let _ = child.kill();
            panic!("a child process did not finish within {deadline:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().expect("child output")
}

/// A loopback port nobody listens on right now.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .expect("bind a loopback port")
        .local_addr()
        .expect("local address")
        .port()
}

/// `GET url` with curl, bounded; `None` when nothing answered yet.
pub fn http_get(url: &str, accept: Option<&str>) -> Option<String> {
    require_tool("curl");
    let mut command = Command::new("curl");
    command.args(["-sS", "--fail", "--max-time", "10", "--noproxy", "*"]);
    if let Some(accept) = accept {
        command.args(["-H", &format!("Accept: {accept}")]);
    }
    let child = command
        .arg(url)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn curl");
    let out = wait_output(child, Duration::from_secs(30));
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

/// A real Prometheus server on a loopback port, killed on drop.
pub struct Prometheus {
    child: Child,
    pub port: u16,
    log: std::path::PathBuf,
}

impl Prometheus {
    /// Starts Prometheus scraping `target` (host:port) every second, keeping its data in `dir`.
    pub fn start(dir: &Path, target: &str) -> Prometheus {
        require_tool("prometheus");
        let config = dir.join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n\
                 scrape_configs:\n  - job_name: berth\n    static_configs:\n      - targets: ['{target}']\n"
            ),
        )
        .expect("write prometheus.yml");
        let port = free_port();
        let log = dir.join("prometheus.log");
        let log_file = std::fs::File::create(&log).expect("prometheus log");
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("tsdb").display()
            ))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log_file)
            .spawn()
            .expect("spawn prometheus");
        Prometheus { child, port, log }
    }

    /// Runs an instant query through Prometheus's HTTP API until it returns a series, or fails
    /// the test after `deadline`.
    pub fn query_until_found(&mut self, query: &str, deadline: Duration) -> serde_json::Value {
        let url = format!(
            "http://127.0.0.1:{}/api/v1/query?query={}",
            self.port,
            url_encode(query)
        );
        let until = Instant::now() + deadline;
        let mut last = String::new();
        loop {
            if let Some(status) = self.child.try_wait().expect("wait on prometheus") {
                panic!("prometheus exited with {status}:\n{}", self.log_text());
            }
            if let Some(body) = http_get(&url, None) {
                let reply: serde_json::Value =
                    serde_json::from_str(&body).expect("Prometheus answers JSON");
                if reply["data"]["result"]
                    .as_array()
                    .is_some_and(|r| !r.is_empty())
                {
                    return reply;
                }
                last = body;
            }
            assert!(
                Instant::now() < until,
                "Prometheus returned no {query} within {deadline:?}; last answer: {last}\n{}",
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn url_encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// One request with curl: `(status, body)`. The token, when given, goes as a bearer token.
pub fn http_request(
    method: &str,
    url: &str,
    token: Option<&str>,
    json_body: Option<&serde_json::Value>,
) -> (u16, String) {
    require_tool("curl");
    let mut command = Command::new("curl");
    command.args([
        "-sS",
        "--max-time",
        "60",
        "--noproxy",
        "*",
        "-X",
        method,
        "-w",
        "\n%{http_code}",
    ]);
    if let Some(token) = token {
        command.args(["-H", &format!("Authorization: Bearer {token}")]);
    }
    if let Some(body) = json_body {
        command.args(["-H", "Content-Type: application/json", "--data-binary"]);
        command.arg(body.to_string());
    }
    let child = command
        .arg(url)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn curl");
    let out = wait_output(child, Duration::from_secs(90));
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", &text));
    let code = code.trim().parse().unwrap_or_else(|_| {
        panic!(
            "{method} {url}: no HTTP status from curl: {text}{}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (code, body.to_string())
}
