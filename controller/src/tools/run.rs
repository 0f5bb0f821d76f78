//! One tool call carried out in the container: the scripts it runs, the content it stages
//! through LXD's file API, and the answer its outcome makes. Every exec runs under `setsid`
//! with the call's pid file, so a cancel or timeout kills whatever part is running.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};

use super::call::{self, DEFAULT_READ_LINES, MAX_FILE_BYTES, MAX_MATCHES, READ_LINE_MAX};
use super::error::{Reason, ToolError};
use super::pattern::{self, EreError, GlobError};
use super::script::{self, Verdict};
use super::{Shell, Tool, ToolCall, capped};
use crate::runtime::{ExecOutput, ExecRequest, FileWrite, Runtime, RuntimeError};

/// The exec's own deadline exceeds the tool's, so the tool's timeout is what fires.
const EXEC_GRACE: Duration = Duration::from_secs(30);
/// A short LXD call made around a tool (the shell check).
pub const SIDE_CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// A call's execution in one container.
pub struct Run<'a> {
    pub runtime: &'a Arc<dyn Runtime>,
    pub instance: &'a str,
    pub call: &'a ToolCall,
    /// Where the running script registers its process group; `.in` next to it is staged
    /// content, `.cancel` a cancel that came first.
    pub pidfile: &'a str,
    /// Bash's environment: the project's `spec.env` and secrets.
    pub env: BTreeMap<String, String>,
}

impl Run<'_> {
    /// Carries out the call; its caller bounds it by the call's timeout and cancel.
    pub async fn tool(&self) -> Result<Value, ToolError> {
        let call = self.call;
        match call.tool {
            Tool::Read => {
                let output = self
                    .script(
                        script::READ,
                        [
                            ("BERTH_PATH", call.string("file_path")),
                            ("BERTH_OFFSET", call.integer("offset", 1).max(1).to_string()),
                            (
                                "BERTH_LIMIT",
                                call.integer("limit", DEFAULT_READ_LINES).to_string(),
                            ),
                            ("BERTH_LINE_MAX", READ_LINE_MAX.to_string()),
                        ],
                    )
                    .await?;
                self.listing(output)
            }
            Tool::Glob => self.glob().await,
            Tool::Grep => self.grep().await,
            Tool::Write => {
                let content = call.string("content").into_bytes();
                let written = self.write(&call.string("file_path"), content, None).await?;
                Ok(self.body(json!(written)))
            }
            Tool::Edit => self.edit().await,
            Tool::Bash => self.bash().await,
        }
    }

    async fn glob(&self) -> Result<Value, ToolError> {
        let call = self.call;
        let dir = match call.string("path") {
            p if p.is_empty() => call.workspace.clone(),
            p if p.starts_with('/') => p,
            p => format!("{}/{p}", call.workspace),
        };
        let search = pattern::glob_search(&call.workspace, &dir, &call.string("pattern"))
            .map_err(glob_error)?;
        let output = self
            .script(
                script::GLOB,
                [
                    ("BERTH_BASE", search.base),
                    ("BERTH_REGEX", search.regex),
                    ("BERTH_MAX_MATCHES", MAX_MATCHES.to_string()),
                ],
            )
            .await?;
        self.listing(output)
    }

    async fn grep(&self) -> Result<Value, ToolError> {
        let call = self.call;
        let regex = call.string("pattern");
        let glob = match call.string("glob") {
            g if g.is_empty() => String::new(),
            g => pattern::grep_glob(&g).map_err(glob_error)?,
        };
        // Both forms travel: the container picks PCRE when its grep has it.
        let (ere, icase, refusal, code) = match pattern::regex_to_ere(&regex) {
            Ok(ere) => (
                ere.pattern,
                if ere.case_insensitive { "-i" } else { "" },
                String::new(),
                0,
            ),
            Err(EreError::Invalid(message)) => (String::new(), "", message, script::REFUSED),
            Err(EreError::Unsupported(message)) => {
                (String::new(), "", message, script::UNSUPPORTED)
            }
        };
        let output = self
            .script(
                script::GREP,
                [
                    ("BERTH_PATH", call.string("path")),
                    ("BERTH_PATTERN", regex),
                    ("BERTH_PATTERN_ERE", ere),
                    ("BERTH_ICASE", icase.to_string()),
                    ("BERTH_ERE_REFUSAL", refusal),
                    ("BERTH_ERE_CODE", code.to_string()),
                    ("BERTH_GLOB_REGEX", glob),
                    ("BERTH_MODE", call.string("output_mode")),
                    ("BERTH_MAX_MATCHES", MAX_MATCHES.to_string()),
                ],
            )
            .await?;
        match Verdict::of(output.exit_code) {
            // Grep's own failure (a bad regular expression) is the caller's to fix.
            Verdict::Other(2) => Err(ToolError::bad_request(stderr_line(&output))),
            _ => self.listing(output),
        }
    }

    /// Edit: the file is read, changed here (exact bytes, no regular expression), and written
    /// back only if it still holds what was read.
    async fn edit(&self) -> Result<Value, ToolError> {
        let call = self.call;
        let path = call.string("file_path");
        let (old, new) = (call.string("old_string"), call.string("new_string"));
        if old.is_empty() {
            return Err(ToolError::bad_request("old_string is empty"));
        }
        if old == new {
            return Err(ToolError::bad_request(
                "old_string and new_string are the same",
            ));
        }
        let output = self
            .script(
                script::EDIT_READ,
                [
                    ("BERTH_PATH", path.clone()),
                    ("BERTH_MAX_BYTES", (MAX_FILE_BYTES + 1).to_string()),
                ],
            )
            .await?;
        if !output.success() {
            return Err(self.failure(&output));
        }
        let Some(at) = output.stdout.iter().position(|b| *b == 0) else {
            return Err(ToolError::internal("the Edit read gave no path"));
        };
        let (canonical, text) = (
            String::from_utf8_lossy(&output.stdout[..at]).into_owned(),
            &output.stdout[at + 1..],
        );
        if text.len() > MAX_FILE_BYTES {
            return Err(ToolError::bad_request(format!(
                "{path} is larger than {}, the most Edit changes; use Bash",
                call::size(MAX_FILE_BYTES)
            )));
        }
        if text.contains(&0) {
            return Err(ToolError::bad_request(format!("{path} is binary")));
        }
        let (edited, count) = replace(
            text,
            old.as_bytes(),
            new.as_bytes(),
            call.flag("replace_all"),
        );
        match count {
            0 => {
                return Err(ToolError::bad_request(format!(
                    "old_string was not found in {path}"
                )));
            }
            n if n > 1 && !call.flag("replace_all") => {
                return Err(ToolError::bad_request(format!(
                    "old_string occurs {n} times in {path}; give more context or set replace_all"
                )));
            }
            _ => {}
        }
        if edited.len() > MAX_FILE_BYTES {
            return Err(ToolError::bad_request(format!(
                "the edited {path} would be larger than {}",
                call::size(MAX_FILE_BYTES)
            )));
        }
        let expect = crate::agent::sha256_hex(text);
        self.write(&path, edited, Some(expect)).await?;
        Ok(self.body(json!(format!(
            "replaced {count} occurrence(s) in {canonical}"
        ))))
    }

    /// Stages `content` next to the pid file and has the Write script move it into place.
    async fn write(
        &self,
        path: &str,
        content: Vec<u8>,
        expect: Option<String>,
    ) -> Result<String, ToolError> {
        let source = format!("{}.in", self.pidfile);
        let staged = FileWrite {
            path: source.clone(),
            content,
            uid: 0,
            gid: 0,
            mode: 0o600,
        };
        self.runtime
            .file_write(self.instance, &staged)
            .await
            .map_err(|err| self.lxd_error(err))?;
        let env = [
            ("BERTH_PATH", path.to_string()),
            ("BERTH_SOURCE", source),
            ("BERTH_EXPECT", expect.unwrap_or_default()),
        ];
        let env = env.into_iter().map(|(k, v)| (k.to_string(), v)).collect();
        let output = self.exec_as(script::WRITE, env, Effect::Changes).await?;
        if Verdict::of(output.exit_code) == Verdict::Cancelled {
            return Err(ToolError::cancelled(&self.call.execution_id));
        }
        if !output.success() {
            return Err(self.failure(&output));
        }
        Ok(capped(&output.stdout))
    }

    async fn bash(&self) -> Result<Value, ToolError> {
        let call = self.call;
        if let Some(shell) = &call.shell {
            self.check_shell(shell).await?;
        }
        let mut env = self.env.clone();
        env.insert("BERTH_COMMAND".into(), call.string("command"));
        // One byte over the cap tells a stream that was cut from one that fit exactly.
        env.insert(
            "BERTH_MAX_BYTES".into(),
            (crate::tools::MAX_OUTPUT_BYTES + 1).to_string(),
        );
        let output = self.exec_as(script::BASH, env, Effect::Changes).await?;
        let Some((stderr, code)) = split_exit(&output.stderr).filter(|_| output.exit_code == 0)
        else {
            return Err(self.failure(&output));
        };
        let mut text = cut_stream(&output.stdout);
        let stderr = cut_stream(stderr);
        if !stderr.is_empty() {
            if !text.is_empty() && !text.ends_with('\n') {
                text.push('\n');
            }
            text.push_str(&stderr);
        }
        let mut body = self.body(json!(text));
        body["exitCode"] = json!(code);
        Ok(body)
    }

    async fn check_shell(&self, shell: &Shell) -> Result<(), ToolError> {
        let mismatch = |message: String| ToolError::new(Reason::ShellMismatch, message);
        if shell.name != "bash" {
            return Err(mismatch(format!(
                "shell.name: {:?} is not offered; Bash runs bash",
                shell.name
            )));
        }
        let found = probe(self.runtime, self.instance)
            .await?
            .bash
            .ok_or_else(|| {
                mismatch("shell: bash was declared but this workspace's image has no bash".into())
            })?;
        if version_matches(&shell.version, &found) {
            Ok(())
        } else {
            Err(mismatch(format!(
                "shell.version: {:?} was declared but the container has bash {found}",
                shell.version
            )))
        }
    }

    /// A script whose success is a listing: its stdout is the output.
    fn listing(&self, output: ExecOutput) -> Result<Value, ToolError> {
        if output.success() {
            Ok(self.body(json!(capped(&output.stdout))))
        } else {
            Err(self.failure(&output))
        }
    }

    fn failure(&self, output: &ExecOutput) -> ToolError {
        match Verdict::of(output.exit_code) {
            Verdict::Cancelled => ToolError::cancelled(&self.call.execution_id),
            verdict => verdict_error(verdict, output),
        }
    }

    fn body(&self, output: Value) -> Value {
        json!({
            "executionId": self.call.execution_id,
            "tool": self.call.tool.as_str(),
            "output": output,
        })
    }

    async fn script<const N: usize>(
        &self,
        body: &str,
        env: [(&str, String); N],
    ) -> Result<ExecOutput, ToolError> {
        let env = env.into_iter().map(|(k, v)| (k.to_string(), v)).collect();
        let output = self.exec(body, env).await?;
        if Verdict::of(output.exit_code) == Verdict::Cancelled {
            return Err(ToolError::cancelled(&self.call.execution_id));
        }
        Ok(output)
    }

    /// Runs `body` after the prelude, in its own session.
    async fn exec(
        &self,
        body: &str,
        env: BTreeMap<String, String>,
    ) -> Result<ExecOutput, ToolError> {
        self.exec_as(body, env, Effect::Reads).await
    }

    /// Runs `body`; for the exec that changes the workspace, an error that does not show LXD
    /// refused it leaves the change unknown: it may have run.
    async fn exec_as(
        &self,
        body: &str,
        mut env: BTreeMap<String, String>,
        effect: Effect,
    ) -> Result<ExecOutput, ToolError> {
        env.insert("BERTH_WORKSPACE".into(), self.call.workspace.clone());
        env.insert("BERTH_PIDFILE".into(), self.pidfile.to_string());
        let request = ExecRequest {
            env,
            ..ExecRequest::new(
                session(&format!("{}{body}", script::PRELUDE)),
                self.call.timeout + EXEC_GRACE,
            )
        };
        self.runtime
            .exec(self.instance, &request)
            .await
            .map_err(|err| match effect {
                Effect::Changes if may_have_run(&err) => self.outcome_unknown(&err),
                _ => self.lxd_error(err),
            })
    }

    /// A mutation whose exec was sent but whose answer was lost with the connection to LXD.
    fn outcome_unknown(&self, err: &RuntimeError) -> ToolError {
        ToolError::new(
            Reason::OutcomeUnknown,
            format!(
                "{}: {err}; execution {:?} was sent to the container but its answer was lost, so inspect the workspace instead of running it again",
                self.call.tool.as_str(),
                self.call.execution_id
            ),
        )
    }

    fn lxd_error(&self, err: RuntimeError) -> ToolError {
        let tool = self.call.tool.as_str();
        match err {
            // LXD did not answer in time (the tool's own deadline had not passed); the
            // caller kills what the call started.
            err @ RuntimeError::Timeout { .. } => ToolError::new(
                Reason::Timeout,
                format!("{tool}: {err}; what it started was killed"),
            ),
            // Only a container whose programs were replaced prints past the host's cap (the
            // scripts cut every stream far below it): what a mutation did is then unknown.
            err @ RuntimeError::TooLarge { .. } if self.call.tool.mutates() => ToolError::new(
                Reason::OutcomeUnknown,
                format!(
                    "{tool}: {err}; execution {:?} ran but its answer was not taken, so inspect the workspace instead of running it again",
                    self.call.execution_id
                ),
            ),
            err => exec_error(self.instance, &format!("running {tool}"), &err),
        }
    }
}

/// Whether an exec changes the workspace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Effect {
    Reads,
    Changes,
}

/// An exec error after which the command may have run: the connection broke, the operation
/// vanished, or the answer made no sense. LXD's own refusals (a missing or stopped container,
/// a missing command) and the exec's deadline (what it started is killed) say otherwise.
fn may_have_run(err: &RuntimeError) -> bool {
    match err {
        RuntimeError::Transport { .. }
        | RuntimeError::OperationVanished { .. }
        | RuntimeError::Protocol { .. } => true,
        RuntimeError::OperationFailed { message, .. } => {
            !(message.contains("Command not found")
                || message.contains("executable file not found"))
        }
        _ => false,
    }
}

/// `setsid sh -c SCRIPT`: the script leads its own process group, which a cancel kills.
/// LXD's exec never hands over a group leader, so `setsid` never forks here.
pub fn session(script: &str) -> Vec<String> {
    ["setsid", "sh", "-c", script]
        .into_iter()
        .map(String::from)
        .collect()
}

/// What a failed exec means for the caller: a missing container or a stopped one is
/// unreachable, a command the image lacks is unsupported.
pub fn exec_error(instance: &str, doing: &str, err: &RuntimeError) -> ToolError {
    if err.is_not_found() {
        return ToolError::unreachable(format!("the container {instance:?} does not exist"));
    }
    if err
        .lxd_message()
        .is_some_and(|m| m.contains("Command not found") || m.contains("executable file not found"))
    {
        return ToolError::unsupported(format!(
            "{doing}: this workspace's image lacks sh or setsid, which the tools need ({err})"
        ));
    }
    ToolError::unreachable(format!("{doing} in the container {instance:?}: {err}"))
}

/// What a workspace's image offers the tools.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Offer {
    /// Bash's version, when there is bash.
    pub bash: Option<String>,
    /// Whether grep understands PCRE (`-P`); POSIX extended expressions otherwise.
    pub pcre: bool,
    pub setsid: bool,
}

/// Asks the container what it offers (one exec, no process group needed).
pub async fn probe(runtime: &Arc<dyn Runtime>, instance: &str) -> Result<Offer, ToolError> {
    let request = ExecRequest::new(["sh", "-c", script::PROBE], SIDE_CALL_TIMEOUT);
    let output = runtime
        .exec(instance, &request)
        .await
        .map_err(|err| exec_error(instance, "asking what the workspace offers", &err))?;
    if !output.success() {
        return Err(ToolError::internal(format!(
            "asking what the workspace offers failed: {}",
            stderr_line(&output)
        )));
    }
    Ok(Offer::parse(&String::from_utf8_lossy(&output.stdout)))
}

impl Offer {
    fn parse(text: &str) -> Offer {
        let value = |key: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(key)?.strip_prefix(' '))
                .map(str::trim)
                .filter(|v| *v != "-")
        };
        Offer {
            bash: value("bash").map(str::to_string),
            pcre: value("grep") == Some("pcre"),
            setsid: value("setsid").is_some(),
        }
    }

    /// Why `tool` cannot run here, if it cannot.
    pub fn lacks(&self, tool: Tool) -> Option<String> {
        if !self.setsid {
            return Some("this workspace's image has no setsid, which every tool needs".into());
        }
        (tool == Tool::Bash && self.bash.is_none())
            .then(|| "this workspace's image has no bash".to_string())
    }

    pub fn to_value(&self) -> Value {
        json!({
            "bash": self.bash,
            "grep": if self.pcre {
                "PCRE (grep -P): ripgrep syntax, look-around and backreferences"
            } else {
                "POSIX extended (grep -E): ripgrep syntax is translated; \\p{..}, look-around, inline flags other than a leading (?i) and non-ASCII are refused"
            },
            "grepDialect": if self.pcre { "pcre" } else { "ere" },
        })
    }
}

/// Replaces the first (or every) non-overlapping occurrence of `old`; the count is of all.
fn replace(text: &[u8], old: &[u8], new: &[u8], all: bool) -> (Vec<u8>, usize) {
    if old.is_empty() {
        return (text.to_vec(), 0);
    }
    // Text files take the linear-time string search; other bytes the plain one.
    if let (Ok(text), Ok(old), Ok(new)) = (
        std::str::from_utf8(text),
        std::str::from_utf8(old),
        std::str::from_utf8(new),
    ) {
        let count = text.matches(old).count();
        let out = if all {
            text.replace(old, new)
        } else {
            text.replacen(old, new, 1)
        };
        return (out.into_bytes(), count);
    }
    let mut out = Vec::with_capacity(text.len());
    let mut count = 0;
    let mut rest = text;
    while let Some(at) = rest.windows(old.len()).position(|w| w == old) {
        count += 1;
        out.extend_from_slice(&rest[..at]);
        out.extend_from_slice(if all || count == 1 { new } else { old });
        rest = &rest[at + old.len()..];
    }
    out.extend_from_slice(rest);
    (out, count)
}

fn glob_error(err: GlobError) -> ToolError {
    match err {
        GlobError::Outside(message) => ToolError::outside(message),
        GlobError::Invalid(message) => ToolError::bad_request(message),
    }
}

pub fn verdict_error(verdict: Verdict, output: &ExecOutput) -> ToolError {
    let message = stderr_line(output);
    match verdict {
        Verdict::Outside => ToolError::outside(message),
        Verdict::NotFound => ToolError::new(Reason::NotFound, message),
        Verdict::Refused => ToolError::bad_request(message),
        Verdict::NoWorkspace => ToolError::unreachable(message),
        Verdict::Cancelled => ToolError::new(Reason::Cancelled, message),
        Verdict::Unsupported => ToolError::unsupported(message),
        Verdict::Changed => ToolError::new(Reason::Conflict, message),
        Verdict::Ok | Verdict::Other(_) => ToolError::internal(format!(
            "the tool failed (exit {}): {message}",
            output.exit_code
        )),
    }
}

/// A Bash stream as the container cut it (at one byte over the cap, the rest dropped there): at
/// most [`MAX_OUTPUT_BYTES`](crate::tools::MAX_OUTPUT_BYTES), with a note when it was cut.
fn cut_stream(bytes: &[u8]) -> String {
    let max = crate::tools::MAX_OUTPUT_BYTES;
    if bytes.len() <= max {
        return String::from_utf8_lossy(bytes).into_owned();
    }
    let text = String::from_utf8_lossy(&bytes[..max]);
    // A character split by the cut decodes as one replacement character at the end: drop it.
    let text = text.strip_suffix('\u{fffd}').unwrap_or(&text);
    format!("{text}\n[output cut at {max} bytes; the rest was discarded]")
}

/// The Bash command's stderr and exit code, when the script got as far as running it.
fn split_exit(stderr: &[u8]) -> Option<(&[u8], i32)> {
    let marker = script::EXIT_MARKER.as_bytes();
    let at = stderr.windows(marker.len()).rposition(|w| w == marker)?;
    let code = std::str::from_utf8(&stderr[at + marker.len()..])
        .ok()?
        .trim()
        .parse()
        .ok()?;
    Some((&stderr[..at], code))
}

pub fn stderr_line(output: &ExecOutput) -> String {
    let text = String::from_utf8_lossy(&output.stderr);
    let text = text.trim();
    if text.is_empty() {
        format!("the tool failed with exit code {}", output.exit_code)
    } else {
        text.chars().take(2000).collect()
    }
}

/// "5", "5.2" and "5.2.15" all match "5.2.15(1)-release"; "5.1" and "5.21" do not.
fn version_matches(declared: &str, found: &str) -> bool {
    if declared.is_empty() {
        return true;
    }
    let found_parts: Vec<&str> = found
        .split(|c: char| !c.is_ascii_digit())
        .filter(|s| !s.is_empty())
        .collect();
    let declared_parts: Vec<&str> = declared.split('.').collect();
    declared_parts.len() <= found_parts.len()
        && declared_parts.iter().zip(&found_parts).all(|(d, f)| d == f)
}

#[cfg(test)]
#[path = "run_tests.rs"]
mod tests;
