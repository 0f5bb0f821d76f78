//! What a tool call's end says to the agent: the output of a success, or a failure whose
//! first word is its reason (the API's `Status` reason, or the bridge's own for a call whose
//! answer never came), so an agent can tell "did not run" from "may have run".

use serde_json::{Map, Value};

use crate::client::ClientError;
use crate::tools::Tool;

/// The reason of a mutation whose outcome nobody knows (the API's word for it too).
pub const OUTCOME_UNKNOWN: &str = "REMOTE_MUTATION_OUTCOME_UNKNOWN";

/// A failed call, as the agent reads it: `REASON: message`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    pub reason: String,
    pub message: String,
}

impl Failure {
    pub fn new(reason: impl Into<String>, message: impl Into<String>) -> Failure {
        Failure {
            reason: reason.into(),
            message: message.into(),
        }
    }

    pub fn text(&self) -> String {
        format!("{}: {}", self.reason, self.message)
    }

    /// A failure before the call was sent: nothing ran.
    pub fn before_dispatch(err: &ClientError) -> Failure {
        match err {
            ClientError::Api(status) => Failure::new(&status.reason, status.headline()),
            ClientError::Unreachable { .. } => Failure::new(
                "Unreachable",
                format!("{err}; the call was not sent and nothing ran"),
            ),
            err => Failure::new(
                "Disconnected",
                format!("{err}; the call was not sent and nothing ran"),
            ),
        }
    }

    /// The server answered the call with a failure.
    pub fn answered(
        tool: Tool,
        execution_id: &str,
        arguments: &Map<String, Value>,
        err: &ClientError,
    ) -> Failure {
        let Some(status) = err.status() else {
            return Failure::before_dispatch(err);
        };
        let mut message = status.headline().to_string();
        match status.reason.as_str() {
            OUTCOME_UNKNOWN => {
                message = format!(
                    "{message} (execution {execution_id}). {} It was not retried.",
                    inspect(tool, arguments)
                );
            }
            "ProjectReplaced" => message.push_str(
                "; the project this session started with is gone: start a new session to work \
                 in the new one",
            ),
            _ => {}
        }
        Failure::new(&status.reason, message)
    }

    /// The call was sent but its answer never came (a broken connection, a daemon that died,
    /// no answer within the deadline). `cancel` is what the server said to the cancel sent
    /// afterwards.
    pub fn lost(
        tool: Tool,
        execution_id: &str,
        arguments: &Map<String, Value>,
        err: &ClientError,
        cancel: &str,
    ) -> Failure {
        let how = if is_timeout(err) {
            "no answer came in time"
        } else {
            "the connection to the berth server broke"
        };
        if tool.mutates() {
            return Failure::new(
                OUTCOME_UNKNOWN,
                format!(
                    "{} was sent as execution {execution_id} but {how} ({err}), so whether it \
                     changed the workspace is unknown; it was not retried. {} Cancel sent \
                     afterwards: {cancel}.",
                    tool.as_str(),
                    inspect(tool, arguments)
                ),
            );
        }
        Failure::new(
            if is_timeout(err) {
                "TimedOut"
            } else {
                "Disconnected"
            },
            format!(
                "{} (execution {execution_id}): {how} ({err}); it changes nothing, and was not \
                 retried. Cancel sent afterwards: {cancel}.",
                tool.as_str()
            ),
        )
    }

    /// The client cancelled the call; `dispatched`: the call had been sent.
    pub fn cancelled(tool: Tool, execution_id: &str, cancel: &str, dispatched: bool) -> Failure {
        let when = if dispatched {
            "while it ran"
        } else {
            "before it was sent"
        };
        Failure::new(
            "Cancelled",
            format!(
                "{} (execution {execution_id}) was cancelled {when}; the server said: {cancel}",
                tool.as_str()
            ),
        )
    }
}

/// What to look at before running a mutation whose outcome is unknown.
fn inspect(tool: Tool, arguments: &Map<String, Value>) -> String {
    let argument = |name: &str| {
        arguments
            .get(name)
            .and_then(Value::as_str)
            .unwrap_or("the file")
            .to_string()
    };
    match tool {
        Tool::Write => format!(
            "Read {} to see whether it holds the new content.",
            argument("file_path")
        ),
        Tool::Edit => format!(
            "Read {} to see whether the edit is there.",
            argument("file_path")
        ),
        Tool::Bash => {
            let command: String = argument("command").chars().take(200).collect();
            format!(
                "Inspect what the command `{command}` changes (Read, Glob, `git status`) before \
                 running it again."
            )
        }
        Tool::Read | Tool::Glob | Tool::Grep => "Nothing changed.".to_string(),
    }
}

fn is_timeout(err: &ClientError) -> bool {
    matches!(err, ClientError::Transport { reason, .. } if reason.contains("timed out"))
}

/// A success's text: the tool's output, and Bash's exit code when it is not 0.
pub fn success_text(reply: &Value) -> String {
    let mut text = match reply.get("output") {
        Some(Value::String(output)) => output.clone(),
        Some(other) => other.to_string(),
        None => String::new(),
    };
    if let Some(code) = reply.get("exitCode").and_then(Value::as_i64)
        && code != 0
    {
        if !text.is_empty() && !text.ends_with('\n') {
            text.push('\n');
        }
        text.push_str(&format!("[exit code {code}]"));
    }
    text
}

#[cfg(test)]
mod tests {
    use reqwest::Method;
    use serde_json::json;

    use super::*;
    use crate::client::ApiStatus;

    fn api(code: u16, reason: &str, message: &str) -> ClientError {
        ClientError::Api(Box::new(ApiStatus {
            code,
            reason: reason.into(),
            message: message.into(),
            api_version: "v1".into(),
            kind: "Status".into(),
            status: "Failure".into(),
            details: None,
        }))
    }

    fn broken(reason: &str) -> ClientError {
        ClientError::Transport {
            method: Method::POST,
            path: "/tools/Bash".into(),
            reason: reason.into(),
        }
    }

    #[test]
    fn every_end_of_a_call_names_its_reason() {
        let args = json!({"file_path": "/workspace/a.txt", "command": "make install"});
        let args = args.as_object().unwrap();
        let unreachable = ClientError::Unreachable {
            server: "/run/berth.sock".into(),
            reason: "connection refused".into(),
        };
        // (tool, how it ended, reason, words the message must hold)
        let cases: Vec<(Tool, Failure, &str, &[&str])> = vec![
            (
                Tool::Write,
                Failure::answered(
                    Tool::Write,
                    "x",
                    args,
                    &api(403, "OutsideWorkspace", "/etc/passwd is outside /workspace"),
                ),
                "OutsideWorkspace",
                &["/etc/passwd"],
            ),
            (
                Tool::Bash,
                Failure::answered(Tool::Bash, "x", args, &api(409, OUTCOME_UNKNOWN, "lost")),
                OUTCOME_UNKNOWN,
                &["make install", "not retried"],
            ),
            (
                Tool::Read,
                Failure::answered(
                    Tool::Read,
                    "x",
                    args,
                    &api(409, "ProjectReplaced", "uid changed"),
                ),
                "ProjectReplaced",
                &["new session"],
            ),
            (
                Tool::Write,
                Failure::lost(Tool::Write, "x", args, &broken("connection closed"), "gone"),
                OUTCOME_UNKNOWN,
                &["/workspace/a.txt", "not retried", "connection"],
            ),
            (
                Tool::Edit,
                Failure::lost(
                    Tool::Edit,
                    "x",
                    args,
                    &broken("timed out waiting for the server"),
                    "ok",
                ),
                OUTCOME_UNKNOWN,
                &["in time", "Read /workspace/a.txt"],
            ),
            (
                Tool::Grep,
                Failure::lost(Tool::Grep, "x", args, &broken("connection closed"), "gone"),
                "Disconnected",
                &["changes nothing"],
            ),
            (
                Tool::Glob,
                Failure::lost(
                    Tool::Glob,
                    "x",
                    args,
                    &broken("timed out waiting for the server"),
                    "gone",
                ),
                "TimedOut",
                &["changes nothing"],
            ),
            (
                Tool::Bash,
                Failure::before_dispatch(&unreachable),
                "Unreachable",
                &["nothing ran"],
            ),
            (
                Tool::Bash,
                Failure::cancelled(Tool::Bash, "x", "execution \"x\" cancelled", true),
                "Cancelled",
                &["while it ran"],
            ),
            (
                Tool::Write,
                Failure::cancelled(
                    Tool::Write,
                    "x",
                    "cancelled before it was dispatched",
                    false,
                ),
                "Cancelled",
                &["before it was sent"],
            ),
        ];
        for (tool, failure, reason, words) in cases {
            assert_eq!(failure.reason, reason, "{tool:?}: {}", failure.text());
            assert!(failure.text().starts_with(&format!("{reason}: ")));
            for word in words {
                assert!(
                    failure.message.contains(word),
                    "{tool:?}: {:?} lacks {word:?}",
                    failure.message
                );
            }
        }
    }

    #[test]
    fn a_success_shows_the_output_and_a_failing_exit_code() {
        let cases = [
            (json!({"output": "a\nb\n"}), "a\nb\n"),
            (json!({"output": "x", "exitCode": 0}), "x"),
            (json!({"output": "x", "exitCode": 3}), "x\n[exit code 3]"),
            (json!({"output": "", "exitCode": 1}), "[exit code 1]"),
        ];
        for (reply, want) in cases {
            assert_eq!(success_text(&reply), want, "{reply}");
        }
    }
}
