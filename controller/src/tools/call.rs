//! A tool call as the caller sends it, checked before anything is recorded or run: the tool
//! must be one berth offers and every argument one that tool knows.

use std::time::Duration;

use serde_json::{Map, Value, json};

use berth_api::wire::ToolCallBody;

use super::error::ToolError;

pub const WORKSPACE: &str = "/workspace";
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(120);
pub const MAX_TIMEOUT: Duration = Duration::from_secs(600);
/// A string argument that travels in the exec's environment (a command, a pattern, a path):
/// one entry there is limited to 128 KiB by the kernel.
pub const MAX_ARGUMENT_BYTES: usize = 64 * 1024;
/// A file's content: Write's `content`, Edit's strings and the file an Edit changes. Content
/// reaches the container through LXD's file API, so only the request body limits it; this
/// leaves room in [`MAX_REQUEST_BYTES`] for JSON escaping.
pub const MAX_FILE_BYTES: usize = 2 << 20;
/// A tool call's request body: as much as one object sent to the API.
pub const MAX_REQUEST_BYTES: usize = 3 << 20;
/// A tool's output is cut after this many bytes.
pub const MAX_OUTPUT_BYTES: usize = 256 * 1024;
/// Glob and Grep list at most this many matches.
pub const MAX_MATCHES: usize = 1000;
/// Read returns this many lines unless `limit` says otherwise.
pub const DEFAULT_READ_LINES: u64 = 2000;
/// Read cuts longer lines.
pub const READ_LINE_MAX: usize = 2000;
const MAX_EXECUTION_ID: usize = 128;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tool {
    Read,
    Glob,
    Grep,
    Write,
    Edit,
    Bash,
}

impl Tool {
    pub const ALL: [Tool; 6] = [
        Tool::Read,
        Tool::Glob,
        Tool::Grep,
        Tool::Write,
        Tool::Edit,
        Tool::Bash,
    ];

    pub fn parse(name: &str) -> Result<Tool, ToolError> {
        Tool::ALL
            .into_iter()
            .find(|t| t.as_str() == name)
            .ok_or_else(|| {
                unsupported(format!(
                    "tool {name:?} is not offered; the tools are Read, Glob, Grep, Write, Edit, Bash"
                ))
            })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Tool::Read => "Read",
            Tool::Glob => "Glob",
            Tool::Grep => "Grep",
            Tool::Write => "Write",
            Tool::Edit => "Edit",
            Tool::Bash => "Bash",
        }
    }

    /// Changes the workspace: its outcome matters when it is lost.
    pub fn mutates(self) -> bool {
        matches!(self, Tool::Write | Tool::Edit | Tool::Bash)
    }

    /// The arguments the tool takes: name, JSON type, required.
    pub fn arguments(self) -> &'static [(&'static str, &'static str, bool)] {
        match self {
            Tool::Read => &[
                ("file_path", "string", true),
                ("offset", "integer", false),
                ("limit", "integer", false),
            ],
            Tool::Glob => &[("pattern", "string", true), ("path", "string", false)],
            Tool::Grep => &[
                ("pattern", "string", true),
                ("path", "string", false),
                ("glob", "string", false),
                ("output_mode", "string", false),
            ],
            Tool::Write => &[("file_path", "string", true), ("content", "string", true)],
            Tool::Edit => &[
                ("file_path", "string", true),
                ("old_string", "string", true),
                ("new_string", "string", true),
                ("replace_all", "boolean", false),
            ],
            Tool::Bash => &[
                ("command", "string", true),
                ("timeout", "integer", false),
                ("description", "string", false),
            ],
        }
    }

    /// A JSON Schema of the arguments, for capability discovery.
    pub fn schema(self) -> Value {
        let mut properties = Map::new();
        let mut required = Vec::new();
        for (name, type_, needed) in self.arguments() {
            properties.insert(name.to_string(), json!({"type": type_}));
            if *needed {
                required.push(*name);
            }
        }
        json!({"type": "object", "properties": properties, "required": required, "additionalProperties": false})
    }
}

/// The shell a Bash caller expects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shell {
    pub name: String,
    pub version: String,
}

#[derive(Debug, Clone)]
pub struct ToolCall {
    pub tool: Tool,
    pub execution_id: String,
    pub workspace: String,
    pub arguments: Map<String, Value>,
    pub timeout: Duration,
    pub shell: Option<Shell>,
}

impl ToolCall {
    pub fn parse(tool: Tool, body: &[u8]) -> Result<ToolCall, ToolError> {
        let value: Value = serde_json::from_slice(body)
            .map_err(|err| ToolError::bad_request(format!("the body is not JSON: {err}")))?;
        if !value.is_object() {
            return Err(ToolError::bad_request("the body must be a JSON object"));
        }
        let body: ToolCallBody = serde_path_to_error::deserialize(value).map_err(|err| {
            let message = format!("{}: {}", err.path(), err.inner());
            if err.inner().to_string().starts_with("unknown field") {
                unsupported(message)
            } else {
                ToolError::bad_request(message)
            }
        })?;
        let execution_id = execution_id(&body.execution_id)?;
        let workspace = match &body.workspace_path {
            None => WORKSPACE.to_string(),
            Some(path) => workspace_path(path)?,
        };
        let arguments = body.arguments.unwrap_or_default();
        check_arguments(tool, &arguments)?;
        let mut timeout = match body.timeout_ms {
            None => DEFAULT_TIMEOUT,
            Some(ms) => millis("timeoutMs", &Value::from(ms))?,
        };
        if tool == Tool::Bash
            && let Some(v) = arguments.get("timeout")
        {
            timeout = timeout.min(millis("arguments.timeout", v)?);
        }
        let shell = body.shell.map(|shell| Shell {
            name: shell.name.unwrap_or_default(),
            version: shell.version.unwrap_or_default(),
        });
        Ok(ToolCall {
            tool,
            execution_id,
            workspace,
            arguments,
            timeout,
            shell,
        })
    }

    /// A string argument, empty when absent.
    pub fn string(&self, key: &str) -> String {
        match self.arguments.get(key) {
            Some(Value::String(s)) => s.clone(),
            _ => String::new(),
        }
    }

    /// An integer argument, `default` when absent.
    pub fn integer(&self, key: &str, default: u64) -> u64 {
        self.arguments
            .get(key)
            .and_then(Value::as_u64)
            .unwrap_or(default)
    }

    pub fn flag(&self, key: &str) -> bool {
        self.arguments.get(key) == Some(&Value::Bool(true))
    }
}

/// The most bytes the string argument `key` may hold.
pub fn argument_limit(key: &str) -> usize {
    match key {
        "content" | "old_string" | "new_string" => MAX_FILE_BYTES,
        _ => MAX_ARGUMENT_BYTES,
    }
}

/// `2 MiB`, `64 KiB`.
pub fn size(bytes: usize) -> String {
    if bytes >= 1 << 20 && bytes.is_multiple_of(1 << 20) {
        format!("{} MiB", bytes >> 20)
    } else {
        format!("{} KiB", bytes / 1024)
    }
}

fn check_arguments(tool: Tool, args: &Map<String, Value>) -> Result<(), ToolError> {
    let known = tool.arguments();
    for (key, value) in args {
        let Some((_, type_, _)) = known.iter().find(|(name, _, _)| name == key) else {
            return Err(unsupported(format!(
                "{} has no argument {key:?}; it takes {}",
                tool.as_str(),
                known
                    .iter()
                    .map(|(n, _, _)| *n)
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        };
        let fits = match *type_ {
            "string" => value
                .as_str()
                .is_some_and(|s| s.len() <= argument_limit(key)),
            "integer" => value.as_u64().is_some(),
            "boolean" => value.is_boolean(),
            _ => false,
        } || value.is_null();
        if !fits {
            return Err(ToolError::bad_request(format!(
                "arguments.{key}: must be a {type_}{}",
                if *type_ == "string" {
                    format!(" of at most {}", size(argument_limit(key)))
                } else {
                    String::new()
                }
            )));
        }
        if value.as_str().is_some_and(|s| s.contains('\0')) {
            return Err(ToolError::bad_request(format!(
                "arguments.{key}: must not contain NUL"
            )));
        }
    }
    for (name, _, required) in known {
        if *required && args.get(*name).is_none_or(Value::is_null) {
            return Err(ToolError::bad_request(format!(
                "arguments.{name}: required for {}",
                tool.as_str()
            )));
        }
    }
    if tool == Tool::Grep
        && let Some(mode) = args.get("output_mode").and_then(Value::as_str)
        && !["content", "files_with_matches", "count"].contains(&mode)
    {
        return Err(unsupported(format!(
            "arguments.output_mode: {mode:?} is not one of content, files_with_matches, count"
        )));
    }
    Ok(())
}

fn execution_id(id: &str) -> Result<String, ToolError> {
    let ok = !id.is_empty()
        && id.len() <= MAX_EXECUTION_ID
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.:".contains(c));
    if ok {
        Ok(id.to_string())
    } else {
        Err(ToolError::bad_request(format!(
            "executionId: {id:?} must be 1-{MAX_EXECUTION_ID} letters, digits, '-', '_', '.' or ':'"
        )))
    }
}

/// `/workspace` or a directory under it, without `..`; the container resolves links.
fn workspace_path(path: &str) -> Result<String, ToolError> {
    let trimmed = path.trim_end_matches('/');
    let inside = trimmed == WORKSPACE || trimmed.starts_with("/workspace/");
    if !inside || trimmed.split('/').any(|s| s == "..") {
        return Err(ToolError::outside(format!(
            "workspacePath: {path:?} is not {WORKSPACE} or inside it"
        )));
    }
    Ok(trimmed.to_string())
}

fn millis(field: &str, value: &Value) -> Result<Duration, ToolError> {
    match value.as_u64() {
        Some(ms) if ms > 0 && ms <= MAX_TIMEOUT.as_millis() as u64 => Ok(Duration::from_millis(ms)),
        _ => Err(ToolError::bad_request(format!(
            "{field}: must be milliseconds between 1 and {}",
            MAX_TIMEOUT.as_millis()
        ))),
    }
}

fn unsupported(message: impl Into<String>) -> ToolError {
    ToolError::unsupported(message)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::error::Reason;

    fn parse(tool: Tool, body: Value) -> Result<ToolCall, ToolError> {
        ToolCall::parse(tool, body.to_string().as_bytes())
    }

    #[test]
    fn unknown_tools_and_arguments_are_unsupported() {
        assert_eq!(
            Tool::parse("WebFetch").unwrap_err().reason,
            Reason::Unsupported
        );
        let err = parse(
            Tool::Read,
            json!({"executionId": "a", "arguments": {"file_path": "x", "encoding": "utf8"}}),
        )
        .unwrap_err();
        assert_eq!(err.reason, Reason::Unsupported);
        assert!(err.message.contains("encoding"), "{}", err.message);
    }

    #[test]
    fn missing_and_mistyped_arguments_are_bad_requests() {
        let err = parse(
            Tool::Write,
            json!({"executionId": "a", "arguments": {"file_path": "x"}}),
        )
        .unwrap_err();
        assert_eq!(
            (err.reason, err.message.contains("content")),
            (Reason::BadRequest, true)
        );
        let err = parse(
            Tool::Read,
            json!({"executionId": "a", "arguments": {"file_path": 3}}),
        )
        .unwrap_err();
        assert_eq!(err.reason, Reason::BadRequest);
        let err = parse(Tool::Read, json!({"arguments": {"file_path": "x"}})).unwrap_err();
        assert!(err.message.contains("executionId"));
    }

    #[test]
    fn workspace_path_stays_under_the_workspace() {
        for bad in ["/", "/etc", "/workspace/../etc", "/workspacex", "workspace"] {
            let err = parse(
                Tool::Read,
                json!({"executionId": "a", "workspacePath": bad, "arguments": {"file_path": "x"}}),
            )
            .unwrap_err();
            assert_eq!(err.reason, Reason::OutsideWorkspace, "{bad}");
        }
        let ok = parse(
            Tool::Read,
            json!({"executionId": "a", "workspacePath": "/workspace/sub/", "arguments": {"file_path": "x"}}),
        )
        .unwrap();
        assert_eq!(ok.workspace, "/workspace/sub");
    }

    #[test]
    fn content_may_be_larger_than_what_an_environment_carries() {
        let big = "x".repeat(MAX_ARGUMENT_BYTES + 1);
        let write = |content: &str| {
            parse(
                Tool::Write,
                json!({"executionId": "a", "arguments": {"file_path": "f", "content": content}}),
            )
        };
        assert!(write(&big).is_ok());
        let err = write(&"x".repeat(MAX_FILE_BYTES + 1)).unwrap_err();
        assert!(err.message.contains("at most 2 MiB"), "{}", err.message);
        let err = parse(
            Tool::Bash,
            json!({"executionId": "a", "arguments": {"command": big}}),
        )
        .unwrap_err();
        assert!(err.message.contains("at most 64 KiB"), "{}", err.message);
    }

    #[test]
    fn bash_timeout_is_the_smaller_of_both() {
        let call = parse(
            Tool::Bash,
            json!({"executionId": "a", "timeoutMs": 5000, "arguments": {"command": "true", "timeout": 2000}}),
        )
        .unwrap();
        assert_eq!(call.timeout, Duration::from_secs(2));
    }

    mod properties {
        use proptest::prelude::*;
        use serde_json::{Map, Value};

        use super::*;
        use crate::tools::pattern;

        /// Lexically resolved `path` (absolute), or `None` when it climbs above `/`.
        fn resolve(path: &str) -> Option<Vec<&str>> {
            let mut parts = Vec::new();
            for part in path.split('/') {
                match part {
                    "" | "." => {}
                    ".." => {
                        parts.pop()?;
                    }
                    part => parts.push(part),
                }
            }
            Some(parts)
        }

        fn inside_workspace(path: &str) -> bool {
            path.starts_with('/') && resolve(path).is_some_and(|p| p.first() == Some(&"workspace"))
        }

        fn json() -> impl Strategy<Value = Value> {
            let leaf = prop_oneof![
                Just(Value::Null),
                any::<bool>().prop_map(Value::Bool),
                any::<i64>().prop_map(Value::from),
                any::<f64>().prop_map(
                    |f| serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number)
                ),
                ".{0,8}".prop_map(Value::String),
            ];
            leaf.prop_recursive(3, 16, 4, |inner| {
                prop_oneof![
                    proptest::collection::vec(inner.clone(), 0..3).prop_map(Value::Array),
                    proptest::collection::btree_map(".{0,6}", inner, 0..3)
                        .prop_map(|m| Value::Object(m.into_iter().collect())),
                ]
            })
        }

        /// An argument name a tool takes, or another.
        fn argument() -> impl Strategy<Value = String> {
            prop_oneof![
                proptest::sample::select(vec![
                    "file_path",
                    "offset",
                    "limit",
                    "pattern",
                    "path",
                    "glob",
                    "output_mode",
                    "content",
                    "old_string",
                    "new_string",
                    "replace_all",
                    "command",
                    "timeout",
                    "description",
                ])
                .prop_map(str::to_string),
                "[a-z_]{1,8}",
            ]
        }

        fn path() -> impl Strategy<Value = String> {
            proptest::collection::vec(
                proptest::sample::select(vec![
                    "",
                    ".",
                    "..",
                    "workspace",
                    "etc",
                    "a",
                    "*",
                    "**",
                    "x?",
                ]),
                0..6,
            )
            .prop_flat_map(|parts| {
                any::<bool>().prop_map(move |absolute| {
                    let joined = parts.join("/");
                    if absolute {
                        format!("/{joined}")
                    } else {
                        joined
                    }
                })
            })
        }

        proptest! {
            #![proptest_config(crate::testing::proptest_config())]

            /// Any body: a call or a 4xx naming what is wrong, never a panic; a call it accepts
            /// works inside /workspace and carries every required argument.
            #[test]
            fn any_body_is_a_call_or_a_client_error(
                tool in proptest::sample::select(Tool::ALL.to_vec()),
                id in prop_oneof![Just(Value::from("call-1")), json()],
                workspace in prop_oneof![path().prop_map(Value::String), json()],
                args in proptest::collection::btree_map(argument(), json(), 0..4),
                timeout in prop_oneof![Just(Value::Null), json()],
            ) {
                let body = serde_json::json!({
                    "executionId": id,
                    "workspacePath": workspace,
                    "arguments": Value::Object(args.into_iter().collect::<Map<_, _>>()),
                    "timeoutMs": timeout,
                });
                match ToolCall::parse(tool, body.to_string().as_bytes()) {
                    Ok(call) => {
                        prop_assert!(inside_workspace(&call.workspace), "{}", call.workspace);
                        for (name, _, required) in tool.arguments() {
                            prop_assert!(!required || call.arguments.get(*name).is_some_and(|v| !v.is_null()));
                        }
                        prop_assert!(call.timeout > Duration::ZERO && call.timeout <= MAX_TIMEOUT);
                    }
                    Err(err) => {
                        // The caller's fault, every time (answered 400 or 403).
                        prop_assert!(
                            matches!(err.reason, Reason::BadRequest | Reason::Unsupported | Reason::OutsideWorkspace),
                            "{:?}", err
                        );
                        prop_assert!(!err.message.is_empty());
                    }
                }
            }

            /// Any bytes at all: refused cleanly when not a call.
            #[test]
            fn any_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
                let _ = ToolCall::parse(Tool::Read, &bytes);
            }

            /// A workspacePath is taken only when it lies in /workspace, however it is spelled.
            #[test]
            fn a_workspace_path_outside_is_always_refused(path in path()) {
                match workspace_path(&path) {
                    Ok(taken) => {
                        prop_assert!(inside_workspace(&path), "{} taken as {}", path, taken);
                        prop_assert!(inside_workspace(&taken));
                    }
                    Err(err) => prop_assert_eq!(err.reason, Reason::OutsideWorkspace),
                }
            }

            /// A Glob searches only under /workspace, from any directory and pattern.
            #[test]
            fn a_glob_searches_only_inside_the_workspace(dir in path(), pattern in path()) {
                let dir = if dir.starts_with('/') { dir } else { format!("/workspace/{dir}") };
                if let Ok(search) = pattern::glob_search(WORKSPACE, &dir, &pattern) {
                    prop_assert!(inside_workspace(&search.base), "{} from {} {}", search.base, dir, pattern);
                }
            }

            /// Patterns of any text translate or are refused, never panic.
            #[test]
            fn any_pattern_translates_or_is_refused(text in ".{0,16}") {
                let _ = pattern::glob_to_ere(&text);
                let _ = pattern::grep_glob(&text);
                let _ = pattern::regex_to_ere(&text);
            }
        }
    }
}
