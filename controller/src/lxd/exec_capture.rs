//! How a command's output comes back from a non-interactive exec, with a cap and without LXD
//! recording it on the host.
//!
//! LXD 5.0 offers two ways: `record-output`, which writes every byte into LXD's log directory
//! on the host (unbounded: `cat /dev/urandom` fills the host's disk) and has the daemon read it
//! back whole; and websockets, which LXD 5.0 now and then closes before the last output arrived
//! when several execs run at once. So the command runs under a one-line `sh` wrapper that sends
//! each stream into a file in the container's own `/tmp`, and the client reads at most the cap
//! of each back through the file API (a ranged read), then deletes the files.
//!
//! While a command runs, the client looks at the two files' sizes now and then (a one-byte
//! ranged read carries the size) and, once either passes the cap, kills every process writing
//! into them, so a command that prints without end stops there. Nothing in this relies on
//! programs of the container beyond `sh` and its builtins: the agent is root in its container
//! and may replace even those, but what it writes lands in its own storage, which it can fill
//! anyway, and the daemon never reads past the cap.

use std::sync::Arc;
use std::time::Duration;

use reqwest::Method;

use super::transport::{Keep, Reply, Transport, parse_envelope};
use crate::runtime::{ExecOutput, RuntimeError};

type Result<T, E = RuntimeError> = std::result::Result<T, E>;

/// The wrapper: `sh -c WRAPPER sh OUT ERR COMMAND...` runs the command with its streams in the
/// files. `set -C` refuses to follow anything that already sits at the (random) paths.
const WRAPPER: &str = r#"o=$1 e=$2
shift 2
set -C
exec "$@" >"$o" 2>"$e""#;

/// `sh -c STOP sh OUT ERR` kills every process whose stdout or stderr is one of the files (the
/// command and whatever it started that kept its streams), with shell builtins only.
const STOP: &str = r#"for f in /proc/[0-9]*/fd/1 /proc/[0-9]*/fd/2; do
  if [ "$f" -ef "$1" ] || [ "$f" -ef "$2" ]; then
    p=${f#/proc/}
    kill -9 "${p%%/*}" 2>/dev/null
  fi
done
exit 0"#;

/// How long stopping a command may take.
const STOP_TIMEOUT: Duration = Duration::from_secs(30);
/// How soon the sizes are first looked at, and the longest gap between two looks.
const FIRST_LOOK: Duration = Duration::from_millis(250);
const LONGEST_GAP: Duration = Duration::from_secs(2);

/// Where one exec's streams land in the container.
#[derive(Debug, Clone)]
pub(crate) struct Capture {
    stdout: String,
    stderr: String,
    cap: usize,
}

/// What one look at a stream's file found: up to the cap of its bytes (when read) and its size.
struct Stream {
    bytes: Vec<u8>,
    size: u64,
}

impl Capture {
    /// Fresh, unguessable paths for one exec keeping up to `cap` bytes of each stream.
    pub fn new(cap: usize) -> Capture {
        let id = uuid::Uuid::new_v4().simple();
        Capture {
            stdout: format!("/tmp/.berth-exec-{id}.out"),
            stderr: format!("/tmp/.berth-exec-{id}.err"),
            cap,
        }
    }

    /// The command to hand LXD in place of `command`.
    pub fn wrap(&self, command: &[String]) -> Vec<String> {
        let mut wrapped = vec![
            "sh".to_string(),
            "-c".to_string(),
            WRAPPER.to_string(),
            "sh".to_string(),
            self.stdout.clone(),
            self.stderr.clone(),
        ];
        wrapped.extend(command.iter().cloned());
        wrapped
    }

    /// The gaps between looks at the sizes while the command runs: quick at first, since most
    /// commands end in moments, then every [`LONGEST_GAP`].
    pub fn gaps() -> impl Iterator<Item = Duration> {
        std::iter::successors(Some(FIRST_LOOK), |gap| Some((*gap * 2).min(LONGEST_GAP)))
    }

    /// Whether either stream has passed the cap so far (sizes only, nothing read).
    pub async fn past_cap(&self, transport: &Transport, instance: &str) -> Result<bool> {
        let (stdout, stderr) = futures::join!(
            self.look(transport, instance, &self.stdout, false),
            self.look(transport, instance, &self.stderr, false)
        );
        Ok(stdout?.size > self.cap as u64 || stderr?.size > self.cap as u64)
    }

    /// Kills what writes into the files (a stream passed the cap, or nobody waits for the
    /// command any more); what ended meanwhile is no matter.
    pub async fn stop(&self, transport: &Transport, instance: &str) -> Result<()> {
        let body = serde_json::json!({
            "command": ["sh", "-c", STOP, "sh", self.stdout, self.stderr],
            "wait-for-websocket": false,
            "interactive": false,
            "record-output": false,
        });
        let what = format!("stop a command in {instance}");
        let submitted = transport
            .call(
                Method::POST,
                &format!("{}/exec", super::client::instance_path(instance)),
                what.clone(),
            )
            .json(body)
            .send()
            .await?;
        // Done only once the script ran: the files it compares against must still be there.
        if let Reply::Async { operation } = submitted {
            super::client::wait_operation(transport, &operation, &what, STOP_TIMEOUT).await?;
        }
        Ok(())
    }

    /// Reads both streams back, each up to the cap, and deletes the files in the background.
    /// A stream past the cap makes the answer [`RuntimeError::TooLarge`] carrying the exit code
    /// and the output up to it.
    pub async fn collect(
        &self,
        transport: &Arc<Transport>,
        instance: &str,
        what: &str,
        exit_code: i32,
    ) -> Result<ExecOutput> {
        let (stdout, stderr) = futures::join!(
            self.look(transport, instance, &self.stdout, true),
            self.look(transport, instance, &self.stderr, true)
        );
        self.remove_later(transport, instance);
        let (stdout, stderr) = (stdout?, stderr?);
        let cut = stdout.size > self.cap as u64 || stderr.size > self.cap as u64;
        let output = ExecOutput {
            exit_code,
            stdout: stdout.bytes,
            stderr: stderr.bytes,
        };
        if cut {
            return Err(RuntimeError::TooLarge {
                what: what.to_string(),
                limit: self.cap as u64,
                partial: Some(Box::new(output)),
            });
        }
        Ok(output)
    }

    /// One stream's file: its size, and up to the cap of its bytes when `read` (one byte
    /// otherwise). A missing file means the wrapper could not write into `/tmp`, which is an
    /// error, never an empty output.
    async fn look(
        &self,
        transport: &Transport,
        instance: &str,
        path: &str,
        read: bool,
    ) -> Result<Stream> {
        let what = format!("read the output of an exec in {instance}");
        let wanted = if read { self.cap.max(1) } else { 1 };
        let raw = transport
            .call(Method::GET, &files_path(instance), what.clone())
            .query("path", path)
            .header("Range", format!("bytes=0-{}", wanted - 1))
            .keep(Keep::AtMost(wanted))
            .send_raw()
            .await?;
        let header = |name: &str| {
            raw.headers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string)
        };
        match raw.status {
            // A ranged answer names the whole size: `bytes 0-N/SIZE`, or `bytes */0` for an
            // empty file, which no range fits.
            206 | 416 => {
                let size = header("content-range")
                    .and_then(|range| range.rsplit('/').next()?.parse::<u64>().ok())
                    .ok_or_else(|| RuntimeError::Protocol {
                        what: what.clone(),
                        message: "a ranged read without the file's size".into(),
                    })?;
                let bytes = if read && raw.status == 206 {
                    raw.body.to_vec()
                } else {
                    Vec::new()
                };
                Ok(Stream { bytes, size })
            }
            // The whole file, from a server that ignores ranges: `cut` says there was more.
            200 => {
                let mut bytes = raw.body.to_vec();
                let size = if raw.cut {
                    u64::MAX
                } else {
                    bytes.len() as u64
                };
                bytes.truncate(if read { self.cap } else { 0 });
                Ok(Stream { bytes, size })
            }
            404 => Err(RuntimeError::Protocol {
                what,
                message: format!(
                    "the command's output was not written to {path} (is /tmp writable in the container?)"
                ),
            }),
            _ => {
                parse_envelope(&what, &raw)?;
                Err(RuntimeError::Protocol {
                    what,
                    message: format!("unexpected status {} reading {path}", raw.status),
                })
            }
        }
    }

    /// Stops the command and deletes the files in the background: for a command whose caller
    /// no longer waits for it (its timeout passed, or the caller went away or lost its right).
    pub fn abandon(&self, transport: &Arc<Transport>, instance: &str) {
        let (capture, transport, instance) =
            (self.clone(), Arc::clone(transport), instance.to_string());
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        runtime.spawn(async move {
            if let Err(e) = capture.stop(&transport, &instance).await {
                tracing::warn!(instance, error = %e, "could not stop an abandoned command");
            }
            capture.remove_later(&transport, &instance);
        });
    }

    /// Until [`Running::finished`], dropping the returned guard abandons the command: a
    /// caller that stops waiting (a dropped request, a revoked right) leaves nothing running.
    pub fn running<'a>(&'a self, transport: &'a Arc<Transport>, instance: &'a str) -> Running<'a> {
        Running {
            capture: self,
            transport,
            instance,
            finished: false,
        }
    }

    /// Deletes the files without holding up the answer; a failed delete leaves a file in the
    /// container's `/tmp`, which is not worth failing the command for.
    pub fn remove_later(&self, transport: &Arc<Transport>, instance: &str) {
        let transport = Arc::clone(transport);
        let instance = instance.to_string();
        let paths = [self.stdout.clone(), self.stderr.clone()];
        tokio::spawn(async move {
            for path in paths {
                let result = transport
                    .call(
                        Method::DELETE,
                        &files_path(&instance),
                        format!("delete exec output in {instance}"),
                    )
                    .query("path", path)
                    .send()
                    .await;
                if let Err(e) = result
                    && !e.is_not_found()
                {
                    tracing::debug!(instance, error = %e, "could not delete exec output");
                }
            }
        });
    }
}

/// A command in flight: abandoned (stopped, its files deleted) when dropped before it finished.
pub(crate) struct Running<'a> {
    capture: &'a Capture,
    transport: &'a Arc<Transport>,
    instance: &'a str,
    finished: bool,
}

impl Running<'_> {
    /// The command ended (or was stopped) and its files are being dealt with: nothing to undo.
    pub fn finished(mut self) {
        self.finished = true;
    }
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        if !self.finished {
            self.capture.abandon(self.transport, self.instance);
        }
    }
}

fn files_path(instance: &str) -> String {
    format!("{}/files", super::client::instance_path(instance))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wrapper_passes_the_command_after_its_own_arguments() {
        let capture = Capture::new(10);
        let wrapped = capture.wrap(&["echo".into(), "a b".into()]);
        assert_eq!(wrapped[..2], ["sh", "-c"]);
        assert_eq!(wrapped[3], "sh");
        assert!(wrapped[4].starts_with("/tmp/.berth-exec-") && wrapped[4].ends_with(".out"));
        assert!(wrapped[5].ends_with(".err"));
        assert_eq!(wrapped[6..], ["echo", "a b"]);
        assert_ne!(Capture::new(10).stdout, capture.stdout);
    }

    #[test]
    fn looks_come_quickly_then_every_two_seconds() {
        let gaps: Vec<u64> = Capture::gaps()
            .take(6)
            .map(|g| g.as_millis() as u64)
            .collect();
        assert_eq!(gaps, [250, 500, 1000, 2000, 2000, 2000]);
    }

    /// The wrapper and the stop script, run by the host's `sh` against real files: the exit
    /// code is the command's, each stream lands in its file, an existing file at a path is never
    /// followed, and the stop script kills the command and what it started, and nothing else.
    #[test]
    fn the_wrapper_keeps_the_exit_code_and_the_stop_script_ends_the_writers() {
        let dir = tempfile::tempdir().unwrap();
        let path = |name: &str| dir.path().join(name);
        let wrapped = |out: &str, err: &str, script: &str| {
            let mut command = std::process::Command::new("sh");
            command
                .args(["-c", WRAPPER, "sh"])
                .args([path(out), path(err)])
                .args(["sh", "-c", script]);
            command
        };
        let code = wrapped("out", "err", "echo hi; echo oh >&2; exit 3")
            .status()
            .unwrap()
            .code();
        assert_eq!(code, Some(3));
        assert_eq!(std::fs::read(path("out")).unwrap(), b"hi\n");
        assert_eq!(std::fs::read(path("err")).unwrap(), b"oh\n");
        // A second run finds the files there and refuses to write through them.
        let again = wrapped("out", "err", "echo again").status().unwrap();
        assert!(!again.success());
        assert_eq!(std::fs::read(path("out")).unwrap(), b"hi\n");

        let mut endless = wrapped("yes.out", "yes.err", "yes & yes >&2")
            .spawn()
            .unwrap();
        let mut bystander = std::process::Command::new("sleep")
            .arg("60")
            .spawn()
            .unwrap();
        let grown = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while std::fs::metadata(path("yes.err")).map_or(0, |m| m.len()) == 0 {
            assert!(std::time::Instant::now() < grown, "nothing written");
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let stop = std::process::Command::new("sh")
            .args(["-c", STOP, "sh"])
            .args([path("yes.out"), path("yes.err")])
            .status()
            .unwrap();
        assert!(stop.success());
        assert!(!endless.wait().unwrap().success());
        let size = std::fs::metadata(path("yes.out")).unwrap().len();
        std::thread::sleep(std::time::Duration::from_millis(200));
        assert_eq!(
            std::fs::metadata(path("yes.out")).unwrap().len(),
            size,
            "the background writer was stopped too"
        );
        assert!(bystander.try_wait().unwrap().is_none(), "others live on");
        bystander.kill().unwrap();
        bystander.wait().unwrap();
    }
}
