//! The `berth` client as a test runs it: one way to build the command ([`client`], or
//! [`Daemon::command`] against a test's daemon), one way to collect what it did ([`collect`],
//! with a deadline, so a hung command fails the test instead of hanging the run), and the
//! shorthands built on them.

use std::io::{Read, Write};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::daemon::Daemon;

/// Generous: the machine is small and shared, and some commands wait (`--timeout=3m`).
const COMMAND_DEADLINE: Duration = Duration::from_secs(300);

/// What one `berth` invocation did, as text.
#[derive(Debug)]
pub struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Run {
    pub fn success(&self) -> bool {
        self.code == 0
    }

    #[track_caller]
    pub fn ok(self) -> Run {
        assert_eq!(self.code, 0, "berth failed: {self:?}");
        self
    }

    #[track_caller]
    pub fn fails(self, code: i32) -> Run {
        assert_eq!(self.code, code, "wanted exit {code}: {self:?}");
        self
    }
}

impl From<Output> for Run {
    fn from(out: Output) -> Run {
        Run {
            code: out.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }
}

/// `berth ARGS` with no `BERTH_*` variables from the environment (no server, token or CA but
/// what the caller gives), no colour, stdout and stderr piped, stdin null; the caller may change
/// any of it before running it with [`output`] or [`run_with_input`] (or spawning it and handing
/// the child to [`collect`] or [`finish`]).
pub fn client(args: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_berth"));
    command
        .args(args)
        .env_remove("BERTH_SERVER")
        .env_remove("BERTH_TOKEN")
        .env_remove("BERTH_TOKEN_FILE")
        .env_remove("BERTH_CA_CERT")
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    command
}

/// Runs `command` (a [`client`] or [`Daemon::command`], changed as the caller needs) and
/// collects what it did.
pub fn output(command: &mut Command) -> Output {
    let args: Vec<String> = command
        .get_args()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    collect(command.spawn().expect("run berth"), &args)
}

/// Runs `command` (a [`client`] or [`Daemon::command`]) with `stdin` as its input and collects
/// what it did.
pub fn run_with_input(mut command: Command, args: &[&str], stdin: &[u8]) -> Output {
    let mut child = command.stdin(Stdio::piped()).spawn().expect("run berth");
    let mut input = child.stdin.take().expect("stdin pipe");
    // A command that exits before reading all of it is no error here.
    let _ = input.write_all(stdin);
    drop(input);
    collect(child, args)
}

/// `berth ARGS` with `stdin` against whatever server the arguments name, read as text.
pub fn berth(args: &[&str], stdin: &[u8]) -> Run {
    run_with_input(client(args), args, stdin).into()
}

impl Daemon {
    /// [`client`] against this daemon's socket (`BERTH_SERVER`, so an explicit `--server`
    /// wins).
    pub fn command(&self, args: &[&str]) -> Command {
        let mut command = client(args);
        command.env("BERTH_SERVER", &self.socket);
        command
    }

    /// Runs `berth ARGS` against this daemon and returns its exit and output.
    pub fn cli(&self, args: &[&str]) -> Output {
        output(&mut self.command(args))
    }

    /// [`Daemon::cli`] with `stdin` as the command's input.
    pub fn cli_input(&self, args: &[&str], stdin: &[u8]) -> Output {
        run_with_input(self.command(args), args, stdin)
    }

    /// [`Daemon::cli`] that must succeed; its stdout.
    pub fn cli_ok(&self, args: &[&str]) -> String {
        let out = self.cli(args);
        assert!(
            out.status.success(),
            "berth {args:?}: {}",
            super::said(&out)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// [`Daemon::cli`], read as text.
    pub fn berth(&self, args: &[&str]) -> Run {
        self.cli(args).into()
    }

    /// [`Daemon::berth`] with `stdin` (if any) as the command's input.
    pub fn berth_with_stdin(&self, args: &[&str], stdin: Option<&str>) -> Run {
        match stdin {
            Some(input) => self.cli_input(args, input.as_bytes()).into(),
            None => self.berth(args),
        }
    }

    /// The object as the server stores it (`berth get KIND NAME -o json`).
    pub fn object(&self, kind: &str, name: &str) -> Value {
        let run = self.berth(&["get", kind, name, "-o", "json"]).ok();
        serde_json::from_str(&run.stdout).expect("get -o json prints JSON")
    }

    /// Writes through the API on the unix socket, as the controller does.
    pub fn put(&self, path: &str, body: &Value) {
        let path = format!("/apis/berth.dev/v1alpha1/{path}");
        let reply = self.client().put_json(&path, body);
        assert!(
            (200..300).contains(&reply.status),
            "PUT {path}: {}: {}",
            reply.status,
            reply.text()
        );
    }

    /// Writes the project's status as the controller does (a paused daemon's controller
    /// writes none).
    pub fn put_status(&self, name: &str, status: Value) {
        self.put(
            &format!("projects/{name}/status"),
            &json!({"status": status}),
        );
    }
}

/// Collects a child's exit and output, killing it if it outlives the deadline. A caller that
/// took stdout to read it as it comes gets an empty one here.
pub fn collect(mut child: Child, args: &[&str]) -> Output {
    let stdout = child.stdout.take();
    let stderr = child.stderr.take();
    let read = |pipe: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            if let Some(mut pipe) = pipe {
                let _ = pipe.read_to_end(&mut bytes);
            }
            bytes
        })
    };
    let out = read(stdout.map(|p| Box::new(p) as Box<dyn Read + Send>));
    let err = read(stderr.map(|p| Box::new(p) as Box<dyn Read + Send>));
    let deadline = Instant::now() + COMMAND_DEADLINE;
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for berth") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("berth {args:?} did not finish within {COMMAND_DEADLINE:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    Output {
        status,
        stdout: out.join().expect("stdout reader"),
        stderr: err.join().expect("stderr reader"),
    }
}

/// [`collect`], read as text.
pub fn finish(child: Child, args: &[&str]) -> Run {
    collect(child, args).into()
}
