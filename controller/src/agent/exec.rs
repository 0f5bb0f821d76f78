//! Running a small shell script inside the container in one exec round trip, with its inputs as
//! positional arguments (never spliced into the script text, so no input can become code).

use std::collections::BTreeMap;
use std::time::Duration;

use sha2::{Digest, Sha256};

use super::{AgentError, Result};
use crate::runtime::{ExecOutput, ExecRequest, FileWrite, Runtime};

/// `sh -c SCRIPT berth ARGS...`: inside the script `$0` is `berth` and `$1...` are `args`.
pub(crate) async fn run_script_with_env(
    rt: &dyn Runtime,
    instance: &str,
    reason: &'static str,
    script: &str,
    args: &[&str],
    env: &BTreeMap<String, String>,
    timeout: Duration,
) -> Result<ExecOutput> {
    let mut command = vec!["sh".to_string(), "-c".to_string(), script.to_string()];
    command.push("berth".to_string());
    command.extend(args.iter().map(|a| a.to_string()));
    let mut request = ExecRequest::new(command, timeout);
    request.env = env.clone();
    rt.exec(instance, &request)
        .await
        .map_err(|source| AgentError::Runtime {
            reason,
            what: format!("exec in {instance}"),
            source,
        })
}

/// [`run_script_with_env`] with no environment beyond the container's.
pub(crate) async fn run_script(
    rt: &dyn Runtime,
    instance: &str,
    reason: &'static str,
    script: &str,
    args: &[&str],
    timeout: Duration,
) -> Result<ExecOutput> {
    let env = BTreeMap::new();
    run_script_with_env(rt, instance, reason, script, args, &env, timeout).await
}

/// `WHAT failed (exit N): LAST LINES`: how a script that exited non-zero is reported.
pub(crate) fn exit_failure(what: &str, out: &ExecOutput) -> String {
    format!(
        "{what} failed (exit {}): {}",
        out.exit_code,
        output_tail(out, 5)
    )
}

/// Writes a whole file through the runtime's file API (contents never travel in a command line).
pub(crate) async fn write_file(
    rt: &dyn Runtime,
    instance: &str,
    reason: &'static str,
    path: &str,
    content: &[u8],
    mode: u32,
) -> Result<()> {
    let file = FileWrite {
        path: path.to_string(),
        content: content.to_vec(),
        uid: 0,
        gid: 0,
        mode,
    };
    rt.file_write(instance, &file)
        .await
        .map_err(|source| AgentError::Runtime {
            reason,
            what: format!("write {path} in {instance}"),
            source,
        })
}

/// The last `lines` lines of a command's stderr (or stdout when stderr is empty), for an error
/// message that says what went wrong without flooding a condition.
pub(crate) fn output_tail(out: &ExecOutput, lines: usize) -> String {
    let err = out.stderr_str();
    let text = if err.trim().is_empty() {
        out.stdout_str()
    } else {
        err
    };
    let all: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    let start = all.len().saturating_sub(lines);
    let tail = all[start..].join(" | ");
    let tail: String = tail.chars().filter(|c| !c.is_control()).collect();
    if tail.chars().count() > 400 {
        let cut: String = tail.chars().skip(tail.chars().count() - 400).collect();
        format!("...{cut}")
    } else {
        tail
    }
}

/// Lowercase hex SHA-256, the form `sha256sum` prints.
pub fn sha256_hex(content: &[u8]) -> String {
    hex::encode(Sha256::digest(content))
}

/// Quotes a value for a POSIX shell: `'...'` with embedded quotes as `'\''`.
pub(crate) fn shell_quote(value: &str) -> String {
    format!("'{}'", value.replace('\'', r"'\''"))
}

/// The parent directory of an absolute path (`/` for a top-level entry).
pub(crate) fn parent_dir(path: &str) -> &str {
    match path.rfind('/') {
        Some(0) | None => "/",
        Some(i) => &path[..i],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shell_quote_survives_quotes_and_dollars() {
        assert_eq!(shell_quote("plain"), "'plain'");
        assert_eq!(shell_quote("it's $HOME"), r"'it'\''s $HOME'");
    }

    #[test]
    fn parent_dir_of_paths() {
        assert_eq!(parent_dir("/workspace/a/b.md"), "/workspace/a");
        assert_eq!(parent_dir("/x"), "/");
    }

    #[test]
    fn sha256_matches_sha256sum() {
        // printf 'hello\n' | sha256sum
        assert_eq!(
            sha256_hex(b"hello\n"),
            "5891b5b522d5df086d0ff0b110fbd9d21bb4fc7163af34d08286a2e846f6be03"
        );
    }

    #[test]
    fn output_tail_keeps_last_lines_without_control_characters() {
        let out = ExecOutput {
            exit_code: 1,
            stdout: b"ignored\n".to_vec(),
            stderr: b"one\ntwo\n\x1b[31mthree\n".to_vec(),
        };
        assert_eq!(output_tail(&out, 2), "two | [31mthree");
    }
}
