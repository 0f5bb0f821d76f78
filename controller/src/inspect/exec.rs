//! Running one command in a project's container for a member (`berth exec`): in /workspace,
//! with the project's environment and secrets, counted as activity.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::runtime::{ExecOutput, ExecRequest};

/// Where commands run unless the request says otherwise.
pub const DEFAULT_CWD: &str = "/workspace";
/// How long a command may run unless the request says otherwise, and at most.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);
const MAX_TIMEOUT: Duration = Duration::from_secs(3600);
/// The most of each stream (stdout, stderr) one `berth exec` returns. Past it the command is
/// stopped (its next write fails) and the answer carries what came before, saying it was cut.
pub const OUTPUT_LIMIT: usize = 8 << 20;

pub use berth_api::wire::{ExecCall, ExecResult};

impl From<ExecOutput> for ExecResult {
    fn from(output: ExecOutput) -> Self {
        ExecResult {
            exit_code: output.exit_code,
            stdout: output.stdout_str(),
            stderr: output.stderr_str(),
            output_cut_at: None,
        }
    }
}

/// The answer for a command stopped at the output cap: what it printed up to there.
pub fn cut(output: &ExecOutput, limit: u64) -> ExecResult {
    ExecResult {
        exit_code: output.exit_code,
        stdout: output.stdout_str(),
        stderr: output.stderr_str(),
        output_cut_at: Some(limit),
    }
}

/// A field of the call that cannot be run, with the field it names.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct InvalidCall {
    pub field: &'static str,
    pub message: String,
}

fn invalid(field: &'static str, message: impl Into<String>) -> InvalidCall {
    InvalidCall {
        field,
        message: message.into(),
    }
}

/// The runtime request: the project's `spec.env`, then its secrets, then the call's own
/// environment (each later one wins), in /workspace unless told otherwise.
pub fn to_request(
    call: &ExecCall,
    project_env: &BTreeMap<String, String>,
    secrets: BTreeMap<String, String>,
) -> Result<ExecRequest, InvalidCall> {
    if call.command.is_empty() || call.command[0].is_empty() {
        return Err(invalid("command", "must name a program to run"));
    }
    for key in call.environment.keys() {
        if !is_env_name(key) {
            return Err(invalid(
                "environment",
                format!("{key:?} is not an environment variable name"),
            ));
        }
    }
    let cwd = call.cwd.clone().unwrap_or_else(|| DEFAULT_CWD.to_string());
    if !cwd.starts_with('/') {
        return Err(invalid("cwd", format!("{cwd:?} is not an absolute path")));
    }
    let timeout = match call.timeout_seconds {
        None => DEFAULT_TIMEOUT,
        Some(0) => return Err(invalid("timeoutSeconds", "must be at least 1")),
        Some(secs) if Duration::from_secs(secs) > MAX_TIMEOUT => {
            return Err(invalid(
                "timeoutSeconds",
                format!("{secs} is over the limit of {}", MAX_TIMEOUT.as_secs()),
            ));
        }
        Some(secs) => Duration::from_secs(secs),
    };
    let mut request = ExecRequest::new(call.command.clone(), timeout);
    request.max_output = OUTPUT_LIMIT;
    request.cwd = Some(cwd);
    request.env = project_env.clone();
    request.env.extend(secrets);
    request
        .env
        .extend(call.environment.iter().map(|(k, v)| (k.clone(), v.clone())));
    Ok(request)
}

fn is_env_name(key: &str) -> bool {
    let mut chars = key.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(command: &[&str]) -> ExecCall {
        ExecCall {
            command: command.iter().map(|s| s.to_string()).collect(),
            environment: BTreeMap::new(),
            cwd: None,
            timeout_seconds: None,
        }
    }

    #[test]
    fn environment_layers_project_then_secrets_then_call() {
        let mut c = call(&["env"]);
        c.environment.insert("A".into(), "call".into());
        let project = BTreeMap::from([("A".into(), "project".into()), ("B".into(), "p".into())]);
        let secrets = BTreeMap::from([("B".into(), "secret".into()), ("C".into(), "s".into())]);
        let request = to_request(&c, &project, secrets).unwrap();
        assert_eq!(request.env["A"], "call");
        assert_eq!(request.env["B"], "secret");
        assert_eq!(request.env["C"], "s");
        assert_eq!(request.cwd.as_deref(), Some("/workspace"));
        assert_eq!(request.timeout, DEFAULT_TIMEOUT);
    }

    #[test]
    fn a_cut_answer_says_where_and_a_whole_one_says_nothing() {
        let output = ExecOutput {
            exit_code: 0,
            stdout: b"out".to_vec(),
            stderr: b"err".to_vec(),
        };
        let whole = serde_json::to_value(ExecResult::from(output.clone())).unwrap();
        assert_eq!(
            whole,
            serde_json::json!({"exitCode": 0, "stdout": "out", "stderr": "err"})
        );
        let cut = serde_json::to_value(cut(&output, 8)).unwrap();
        assert_eq!(cut["outputCutAt"], 8);
        assert_eq!(cut["exitCode"], 0);
        assert_eq!(cut["stdout"], "out");
        let request = to_request(&call(&["yes"]), &BTreeMap::new(), BTreeMap::new()).unwrap();
        assert_eq!(request.max_output, OUTPUT_LIMIT);
    }

    #[test]
    fn bad_calls_name_their_field() {
        let table: Vec<(ExecCall, &str)> = vec![
            (call(&[]), "command"),
            (
                ExecCall {
                    cwd: Some("workspace".into()),
                    ..call(&["ls"])
                },
                "cwd",
            ),
            (
                ExecCall {
                    timeout_seconds: Some(0),
                    ..call(&["ls"])
                },
                "timeoutSeconds",
            ),
            (
                ExecCall {
                    environment: BTreeMap::from([("1X".into(), "v".into())]),
                    ..call(&["ls"])
                },
                "environment",
            ),
        ];
        for (bad, field) in table {
            let err = to_request(&bad, &BTreeMap::new(), BTreeMap::new()).unwrap_err();
            assert_eq!(err.field, field, "{bad:?}");
        }
    }
}
