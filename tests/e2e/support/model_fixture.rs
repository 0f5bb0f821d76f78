//! The scripted local model (`model_fixture.py`) as a child process: fake Anthropic Messages
//! and OpenAI Responses on one loopback port and a refusing, counting HTTPS_PROXY on another.
//! It answers a brief ([`ModelFixture::start`]) or plays a step script
//! ([`ModelFixture::play`], [`ModelFixture::play_gated`]). Killed when dropped.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use serde_json::Value;

pub struct ModelFixture {
    child: Child,
    pub model_port: u16,
    pub proxy_port: u16,
    /// With a step script: where every request is logged.
    log: Option<PathBuf>,
}

/// What the model replies with (see the script's header).
pub struct Script<'a> {
    /// The answer to the title request: a string unique to the test run.
    pub title: &'a str,
    /// A string only the brief contains.
    pub brief_mark: &'a str,
    /// The file the scripted Write tool call creates, and its content.
    pub file: &'a str,
    pub file_content: &'a str,
    /// The scripted Bash command (one that needs a permission).
    pub bash: &'a str,
}

impl ModelFixture {
    pub fn start(script: &Script) -> ModelFixture {
        Self::spawn(
            &[
                "--title",
                script.title,
                "--brief-mark",
                script.brief_mark,
                "--file",
                script.file,
                "--file-content",
                script.file_content,
                "--bash",
                script.bash,
            ],
            None,
        )
    }

    /// Plays `steps` (`{"steps": [{"tool": NAME, "input": {..}} | {"text": ".."}, ..]}`) to
    /// an agent running its own loop; its script and request log are kept in `dir`.
    pub fn play(dir: &Path, steps: &Value) -> ModelFixture {
        Self::play_script(dir, steps, None)
    }

    /// [`ModelFixture::play`], whose replies to requests offering tools wait until `gate`
    /// exists (the test creates it once the container is ready for the agent's first step).
    pub fn play_gated(dir: &Path, steps: &Value, gate: &Path) -> ModelFixture {
        Self::play_script(dir, steps, Some(gate))
    }

    fn play_script(dir: &Path, steps: &Value, gate: Option<&Path>) -> ModelFixture {
        let script = dir.join("script.json");
        std::fs::write(&script, steps.to_string()).unwrap();
        let log = dir.join("requests.jsonl");
        let mut args = vec![
            "--script".to_string(),
            script.to_str().unwrap().to_string(),
            "--log".to_string(),
            log.to_str().unwrap().to_string(),
        ];
        if let Some(gate) = gate {
            args.extend(["--gate".to_string(), gate.to_str().unwrap().to_string()]);
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        Self::spawn(&args, Some(log))
    }

    fn spawn(args: &[&str], log: Option<PathBuf>) -> ModelFixture {
        let path =
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/e2e/support/model_fixture.py");
        let mut child = Command::new("python3")
            .arg(path)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("python3 runs the model fixture");
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let mut port = |what: &str| -> u16 {
            let line = lines
                .next()
                .unwrap_or_else(|| panic!("model fixture printed no {what} port"))
                .unwrap();
            let (name, port) = line.split_once(' ').expect("`NAME PORT`");
            assert_eq!(name, what, "{line}");
            port.parse().expect("a port")
        };
        let model_port = port("model");
        let proxy_port = port("proxy");
        ModelFixture {
            child,
            model_port,
            proxy_port,
            log,
        }
    }

    /// With a step script: the requests the agent sent, in order.
    pub fn requests(&self) -> Vec<Value> {
        let log = self.log.as_ref().expect("a fixture playing a step script");
        std::fs::read_to_string(log)
            .unwrap_or_default()
            .lines()
            .map(|line| serde_json::from_str(line).unwrap())
            .collect()
    }

    /// What the fixture was asked: `requests`, `titleRequests`, `briefRequests`,
    /// `writeResults`, `bashResults` [{result, isError}], `proxyConnections`.
    pub fn stats(&self) -> Value {
        use std::io::{Read, Write};
        let mut stream =
            std::net::TcpStream::connect(("127.0.0.1", self.model_port)).expect("fixture answers");
        stream
            .set_read_timeout(Some(std::time::Duration::from_secs(10)))
            .unwrap();
        stream
            .write_all(b"GET /_fixture/stats HTTP/1.0\r\nHost: fixture\r\n\r\n")
            .unwrap();
        let mut reply = String::new();
        stream.read_to_string(&mut reply).unwrap();
        let body = reply.split_once("\r\n\r\n").expect("an HTTP reply").1;
        serde_json::from_str(body).expect("stats JSON")
    }
}

impl Drop for ModelFixture {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
