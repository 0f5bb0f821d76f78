//! Durations as people write them in manifests: `30s`, `5m`, `2h`, `30d`, `1h30m`.

use std::borrow::Cow;
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::quantity::string_serde;

/// A span of time made of one or more `<number><unit>` parts, units `ms`, `s`, `m`, `h`, `d`
/// (24 h) and `w` (7 d). Keeps the text the user wrote; compares by length.
#[derive(Debug, Clone)]
pub struct BerthDuration {
    duration: Duration,
    text: String,
}

/// The text did not parse as a duration.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not a duration (write e.g. 30s, 5m, 2h, 30d or 1h30m)")]
pub struct DurationError(pub String);

/// Pattern of the JSON Schema for durations.
pub const DURATION_PATTERN: &str = r"^([0-9]+(ms|s|m|h|d|w))+$";

impl BerthDuration {
    /// Written in the largest unit that divides it (`90s` → `90s`, `7200s` → `2h`).
    pub fn from_std(duration: Duration) -> Self {
        let text = if duration.subsec_millis() != 0 || duration.as_secs() == 0 {
            format!("{}ms", duration.as_millis())
        } else {
            let secs = duration.as_secs();
            [
                ("w", 604_800),
                ("d", 86_400),
                ("h", 3_600),
                ("m", 60),
                ("s", 1),
            ]
            .iter()
            .find(|(_, n)| secs.is_multiple_of(*n))
            .map(|(u, n)| format!("{}{u}", secs / n))
            .unwrap_or_else(|| format!("{secs}s"))
        };
        BerthDuration { duration, text }
    }

    pub fn from_secs(secs: u64) -> Self {
        BerthDuration::from_std(Duration::from_secs(secs))
    }

    pub fn as_std(&self) -> Duration {
        self.duration
    }

    /// The same span as a `chrono` duration, for arithmetic on timestamps.
    pub fn as_chrono(&self) -> chrono::Duration {
        chrono::Duration::from_std(self.duration).unwrap_or(chrono::Duration::MAX)
    }

    pub fn is_zero(&self) -> bool {
        self.duration.is_zero()
    }

    /// The text the user wrote.
    pub fn as_str(&self) -> &str {
        &self.text
    }
}

impl FromStr for BerthDuration {
    type Err = DurationError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || DurationError(s.to_string());
        let text = s.trim();
        if text.is_empty() {
            return Err(err());
        }
        let mut total = Duration::ZERO;
        let mut rest = text;
        while !rest.is_empty() {
            let digits = rest.find(|c: char| !c.is_ascii_digit()).ok_or_else(err)?;
            if digits == 0 {
                return Err(err());
            }
            let number: u64 = rest[..digits].parse().map_err(|_| err())?;
            rest = &rest[digits..];
            let unit_len = rest
                .find(|c: char| c.is_ascii_digit())
                .unwrap_or(rest.len());
            let unit = &rest[..unit_len];
            rest = &rest[unit_len..];
            let part = match unit {
                "ms" => Duration::from_millis(number),
                "s" => Duration::from_secs(number),
                "m" => Duration::from_secs(number.checked_mul(60).ok_or_else(err)?),
                "h" => Duration::from_secs(number.checked_mul(3_600).ok_or_else(err)?),
                "d" => Duration::from_secs(number.checked_mul(86_400).ok_or_else(err)?),
                "w" => Duration::from_secs(number.checked_mul(604_800).ok_or_else(err)?),
                _ => return Err(err()),
            };
            total = total.checked_add(part).ok_or_else(err)?;
        }
        Ok(BerthDuration {
            duration: total,
            text: text.to_string(),
        })
    }
}

impl fmt::Display for BerthDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl PartialEq for BerthDuration {
    fn eq(&self, other: &Self) -> bool {
        self.duration == other.duration
    }
}

impl Eq for BerthDuration {}

impl PartialOrd for BerthDuration {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for BerthDuration {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.duration.cmp(&other.duration)
    }
}

string_serde!(
    BerthDuration,
    "Duration",
    "a duration such as 30s, 5m, 2h or 30d",
    DURATION_PATTERN,
    "A duration: one or more number-unit parts, units ms, s, m, h, d, w; e.g. 30s, 5m, 2h, 30d, 1h30m."
);

/// How old a project may grow before it is deleted: a duration, or `never`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MaxAge {
    Never,
    After(BerthDuration),
}

impl MaxAge {
    /// The age limit, `None` for `never`.
    pub fn limit(&self) -> Option<&BerthDuration> {
        match self {
            MaxAge::Never => None,
            MaxAge::After(d) => Some(d),
        }
    }
}

/// The text is neither `never` nor a duration.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not a duration or \"never\" (write e.g. 30d)")]
pub struct MaxAgeError(pub String);

impl FromStr for MaxAge {
    type Err = MaxAgeError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s.trim() == "never" {
            return Ok(MaxAge::Never);
        }
        s.parse()
            .map(MaxAge::After)
            .map_err(|_| MaxAgeError(s.to_string()))
    }
}

impl fmt::Display for MaxAge {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MaxAge::Never => f.write_str("never"),
            MaxAge::After(d) => d.fmt(f),
        }
    }
}

string_serde!(
    MaxAge,
    "MaxAge",
    "a duration such as 30d, or never",
    r"^(never|([0-9]+(ms|s|m|h|d|w))+)$",
    "A duration (e.g. 30d) after which the project is deleted, or never."
);
