//! Files berth writes into containers: their modes, and the rules for where they may go.

use std::borrow::Cow;
use std::fmt;
use std::str::FromStr;

use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The mount point of the durable workspace volume in every container.
pub const WORKSPACE_DIR: &str = "/workspace";

/// A Unix permission mode, written as an octal string such as `"0644"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FileMode(u32);

/// The text is not an octal mode.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not an octal file mode (write e.g. \"0644\")")]
pub struct FileModeError(pub String);

impl FileMode {
    pub fn new(bits: u32) -> Option<Self> {
        (bits <= 0o7777).then_some(FileMode(bits))
    }

    pub fn bits(self) -> u32 {
        self.0
    }
}

impl FromStr for FileMode {
    type Err = FileModeError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || FileModeError(s.to_string());
        let t = s.trim();
        let digits = t.strip_prefix("0o").unwrap_or(t);
        if digits.is_empty()
            || digits.len() > 5
            || !digits.bytes().all(|b| (b'0'..=b'7').contains(&b))
        {
            return Err(err());
        }
        let bits = u32::from_str_radix(digits, 8).map_err(|_| err())?;
        FileMode::new(bits).ok_or_else(err)
    }
}

impl fmt::Display for FileMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:04o}", self.0)
    }
}

impl Serialize for FileMode {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

// Only strings: a bare number is ambiguous. YAML reads `0o644` as 420 and JSON clients write
// 420 for 0644, while `644` means 0644 to most people; a quoted "0644" has one reading.
impl<'de> Deserialize<'de> for FileMode {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = FileMode;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an octal file mode as a string, such as \"0644\"")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<FileMode, E> {
                v.parse().map_err(E::custom)
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<FileMode, E> {
                Err(E::custom(format!(
                    "the number {v} is ambiguous as a file mode: write the octal mode in quotes, e.g. \"0644\""
                )))
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<FileMode, E> {
                Err(E::custom(format!(
                    "the number {v} is ambiguous as a file mode: write the octal mode in quotes, e.g. \"0644\""
                )))
            }
        }
        d.deserialize_any(V)
    }
}

impl JsonSchema for FileMode {
    fn schema_name() -> Cow<'static, str> {
        "FileMode".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "type": "string",
            "pattern": r"^(0o)?[0-7]{1,5}$",
            "description": "An octal Unix permission mode as a string, e.g. \"0644\".",
        })
    }
}

/// How a seed file meets a file berth already wrote at the same path (the instructions file).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum MergeMode {
    /// The seed file's content replaces the file.
    #[default]
    Replace,
    /// The seed file's content is appended to what berth wrote.
    Append,
}

/// Splits a path into its normal components, refusing `..` (which could climb out of the
/// directory the path must stay in).
fn components(path: &str) -> Result<Vec<&str>, String> {
    let mut parts = Vec::new();
    for part in path.split('/') {
        match part {
            "" | "." => {}
            ".." => return Err(format!("{path:?} must not contain '..'")),
            p => parts.push(p),
        }
    }
    Ok(parts)
}

fn check_chars(path: &str) -> Result<(), String> {
    if path.chars().any(char::is_control) {
        return Err(format!("{path:?} must not contain control characters"));
    }
    Ok(())
}

/// Resolves a file path that must lie under /workspace: relative paths are taken from
/// /workspace, absolute ones must already lie under it. Returns the normalized absolute path.
pub fn workspace_file_path(path: &str) -> Result<String, String> {
    if path.is_empty() {
        return Err("required".to_string());
    }
    check_chars(path)?;
    if path.ends_with('/') {
        return Err(format!("{path:?} must name a file, not a directory"));
    }
    let rest = if path.starts_with('/') {
        let parts = components(path)?;
        if parts.first() != Some(&"workspace") {
            return Err(format!("{path:?} must lie under {WORKSPACE_DIR}"));
        }
        parts[1..].to_vec()
    } else {
        components(path)?
    };
    if rest.is_empty() {
        return Err(format!("{path:?} must name a file under {WORKSPACE_DIR}"));
    }
    Ok(format!("{WORKSPACE_DIR}/{}", rest.join("/")))
}

/// Resolves a directory that must lie under /workspace, as [`workspace_file_path`] resolves a
/// file (a trailing `/` allowed). /workspace itself is refused: berth places nothing at its top.
pub fn workspace_dir_path(path: &str) -> Result<String, String> {
    let trimmed = path.trim_end_matches('/');
    if trimmed.is_empty() && !path.is_empty() {
        return Err(format!("{path:?} must lie under {WORKSPACE_DIR}"));
    }
    workspace_file_path(trimmed).map_err(|e| {
        if e.contains("must name a file") {
            format!("{path:?} must name a directory under {WORKSPACE_DIR}")
        } else {
            e
        }
    })
}

/// Checks an absolute path and returns it normalized (no `.`, no doubled or trailing `/`).
pub fn absolute_path(path: &str) -> Result<String, String> {
    if path.is_empty() {
        return Err("required".to_string());
    }
    check_chars(path)?;
    if !path.starts_with('/') {
        return Err(format!("{path:?} must be an absolute path"));
    }
    let parts = components(path)?;
    Ok(format!("/{}", parts.join("/")))
}

/// Whether normalized absolute `path` is `dir` or lies below it.
pub fn is_within(path: &str, dir: &str) -> bool {
    let dir = dir.trim_end_matches('/');
    dir.is_empty() || path == dir || path.strip_prefix(dir).is_some_and(|r| r.starts_with('/'))
}
