//! Durations as people write them in manifests: `30s`, `5m`, `2h`, `30d`, `1h30m`.
//!
//! Compared by value; where a field allows it, `never` stands for no limit. Every duration is at
//! most `MAX_DURATION_TEXT` (`36500d`).

use std::borrow::Cow;
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use chrono::{DateTime, Utc};
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

/// The longest span berth takes in a manifest or its configuration: 100 years. Anything
/// longer means "never" in practice, and times computed from it stay far from the ends of what
/// clocks and timers can hold.
pub const MAX_DURATION: Duration = Duration::from_secs(36_500 * 86_400);
/// [`MAX_DURATION`] as people write it.
pub const MAX_DURATION_TEXT: &str = "36500d";

/// The text did not parse as a duration.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DurationError {
    #[error("{0:?} is not a duration (write e.g. 30s, 5m, 2h, 30d or 1h30m)")]
    Malformed(String),
    /// Too long even to count; past [`MAX_DURATION`] in any case.
    #[error("{0:?} is too long: at most {MAX_DURATION_TEXT}")]
    TooLong(String),
}

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

    /// The time this span after `start`, a span past [`MAX_DURATION`] counting as the cap: an
    /// object stored before durations were capped must not overflow (and panic) wherever its
    /// time is computed, nor write a time no reader can parse back.
    pub fn after(&self, start: DateTime<Utc>) -> DateTime<Utc> {
        let span = chrono::Duration::from_std(self.capped()).unwrap_or(chrono::Duration::MAX);
        start
            .checked_add_signed(span)
            .unwrap_or(DateTime::<Utc>::MAX_UTC)
    }

    /// The span, at most [`MAX_DURATION`]: for timers and deadlines, which overflow past it.
    pub fn capped(&self) -> Duration {
        self.duration.min(MAX_DURATION)
    }

    /// Refuses a span past [`MAX_DURATION`] (validation; decoding accepts what was stored).
    pub fn check_cap(&self) -> Result<(), String> {
        if self.duration > MAX_DURATION {
            Err(DurationError::TooLong(self.text.clone()).to_string())
        } else {
            Ok(())
        }
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
        let err = || DurationError::Malformed(s.to_string());
        let too_long = || DurationError::TooLong(s.trim().to_string());
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
            // Only digits: the one way this fails is a number past u64.
            let number: u64 = rest[..digits].parse().map_err(|_| too_long())?;
            rest = &rest[digits..];
            let unit_len = rest
                .find(|c: char| c.is_ascii_digit())
                .unwrap_or(rest.len());
            let unit = &rest[..unit_len];
            rest = &rest[unit_len..];
            let part = match unit {
                "ms" => Duration::from_millis(number),
                "s" => Duration::from_secs(number),
                "m" => Duration::from_secs(number.checked_mul(60).ok_or_else(too_long)?),
                "h" => Duration::from_secs(number.checked_mul(3_600).ok_or_else(too_long)?),
                "d" => Duration::from_secs(number.checked_mul(86_400).ok_or_else(too_long)?),
                "w" => Duration::from_secs(number.checked_mul(604_800).ok_or_else(too_long)?),
                _ => return Err(err()),
            };
            total = total.checked_add(part).ok_or_else(too_long)?;
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
pub enum MaxAgeError {
    #[error("{0:?} is not a duration or \"never\" (write e.g. 30d)")]
    Malformed(String),
    #[error(transparent)]
    TooLong(DurationError),
}

impl FromStr for MaxAge {
    type Err = MaxAgeError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s.trim() == "never" {
            return Ok(MaxAge::Never);
        }
        s.parse().map(MaxAge::After).map_err(|e| match e {
            DurationError::TooLong(_) => MaxAgeError::TooLong(e),
            DurationError::Malformed(_) => MaxAgeError::Malformed(s.to_string()),
        })
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_past_the_cap_count_as_the_cap_in_time_arithmetic() {
        let start = DateTime::parse_from_rfc3339("2026-01-01T00:00:00Z")
            .unwrap()
            .to_utc();
        let cap: BerthDuration = MAX_DURATION_TEXT.parse().unwrap();
        assert_eq!(cap.as_std(), MAX_DURATION);
        assert_eq!(cap.check_cap(), Ok(()));
        let at_cap = cap.after(start);
        for huge in [
            "100000000d".parse().unwrap(),
            BerthDuration::from_std(Duration::MAX),
        ] {
            assert_eq!(huge.after(start), at_cap, "{huge}");
            assert_eq!(huge.capped(), MAX_DURATION);
            assert!(huge.check_cap().unwrap_err().ends_with("at most 36500d"));
        }
        // Written and read back as status holds it.
        let text = serde_json::to_string(&at_cap).unwrap();
        assert_eq!(
            serde_json::from_str::<DateTime<Utc>>(&text).unwrap(),
            at_cap
        );
        assert_eq!(
            "1d".parse::<BerthDuration>().unwrap().after(start),
            start + chrono::Duration::days(1)
        );
        assert_eq!(
            "99999999999999999999s".parse::<BerthDuration>(),
            Err(DurationError::TooLong("99999999999999999999s".into()))
        );
    }
}
