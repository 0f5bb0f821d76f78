//! The agent's own report, `/run/berth/agent.json`, read as untrusted input: whatever the agent
//! writes, berth stores a known state and short printable text.

use berth_api::{AgentState, AgentStatus};
use chrono::{DateTime, Utc};
use serde_json::Value;

use super::{AgentError, Result, STATUS_FILE, STATUS_FILE_MAX_BYTES};
use crate::runtime::Runtime;

/// At most this many characters of an agent's title or message are kept.
pub const MAX_UNTRUSTED_CHARS: usize = 200;

/// What the agent says about itself.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AgentReport {
    pub status: AgentStatus,
    /// Its own summary of the work; `None` when it gave none.
    pub title: Option<String>,
}

/// Reads the agent's status file; `None` when there is none (no runner yet, or a fresh boot).
pub async fn read_agent_status(rt: &dyn Runtime, instance: &str) -> Result<Option<AgentReport>> {
    match rt
        .file_read(instance, STATUS_FILE, STATUS_FILE_MAX_BYTES)
        .await
    {
        Ok(bytes) => Ok(Some(parse_agent_status(&bytes))),
        Err(e) if e.is_not_found() => Ok(None),
        Err(source) => Err(AgentError::Runtime {
            reason: "StatusUnreadable",
            what: format!("read {STATUS_FILE} in {instance}"),
            source,
        }),
    }
}

/// Parses a status file. Anything that is not the contract's shape yields state `unknown`
/// rather than an error: the agent is running something, berth just cannot tell what.
pub fn parse_agent_status(bytes: &[u8]) -> AgentReport {
    let Ok(Value::Object(map)) = serde_json::from_slice::<Value>(bytes) else {
        return AgentReport::default();
    };
    let text = |key: &str| {
        map.get(key)
            .and_then(Value::as_str)
            .map(sanitize_untrusted)
            .filter(|s| !s.is_empty())
    };
    let state = map
        .get("state")
        .and_then(Value::as_str)
        .map_or(AgentState::Unknown, |s| AgentState::parse(s.trim()));
    let updated_at = map
        .get("updatedAt")
        .and_then(Value::as_str)
        .and_then(|s| DateTime::parse_from_rfc3339(s.trim()).ok())
        .map(|t| t.with_timezone(&Utc));
    AgentReport {
        status: AgentStatus {
            state,
            message: text("message").unwrap_or_default(),
            brief_id: text("briefId"),
            updated_at,
            session_id: text("sessionId"),
            exit_code: map
                .get("exitCode")
                .and_then(Value::as_i64)
                .and_then(|c| i32::try_from(c).ok()),
        },
        title: text("title"),
    }
}

/// Control characters (newlines, escapes, ...) removed, whitespace trimmed, at most
/// [`MAX_UNTRUSTED_CHARS`] characters.
pub fn sanitize_untrusted(text: &str) -> String {
    let cleaned: String = text
        .chars()
        .filter(|c| !c.is_control() && !is_bidi_control(*c))
        .collect();
    cleaned.trim().chars().take(MAX_UNTRUSTED_CHARS).collect()
}

/// Unicode controls that reorder or hide text on a terminal without being `is_control`.
fn is_bidi_control(c: char) -> bool {
    matches!(c, '\u{200b}'..='\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}' | '\u{feff}')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_files_are_parsed_leniently() {
        // (file, state, message, briefId, title)
        type Case<'a> = (
            &'a str,
            AgentState,
            &'a str,
            Option<&'a str>,
            Option<&'a str>,
        );
        let cases: &[Case] = &[
            (
                r#"{"briefId":"b-1","state":"blocked","title":"Fix it","message":"Which DB?","updatedAt":"2026-11-30T06:00:00Z"}"#,
                AgentState::Blocked,
                "Which DB?",
                Some("b-1"),
                Some("Fix it"),
            ),
            (r#"{"state":"done"}"#, AgentState::Done, "", None, None),
            (
                r#"{"state":"sleeping","briefId":"x"}"#,
                AgentState::Unknown,
                "",
                Some("x"),
                None,
            ),
            (
                r#"{"state":7,"message":["no"]}"#,
                AgentState::Unknown,
                "",
                None,
                None,
            ),
            ("not json", AgentState::Unknown, "", None, None),
            ("[1,2]", AgentState::Unknown, "", None, None),
            (
                r#"{"state":" working ","title":"  "}"#,
                AgentState::Working,
                "",
                None,
                None,
            ),
        ];
        for (input, state, message, brief, title) in cases {
            let got = parse_agent_status(input.as_bytes());
            assert_eq!(got.status.state, *state, "{input}");
            assert_eq!(got.status.message, *message, "{input}");
            assert_eq!(got.status.brief_id.as_deref(), *brief, "{input}");
            assert_eq!(got.title.as_deref(), *title, "{input}");
        }
        let timed =
            parse_agent_status(br#"{"state":"idle","updatedAt":"2026-11-30T07:00:00+01:00"}"#);
        assert_eq!(
            timed.status.updated_at.unwrap().to_rfc3339(),
            "2026-11-30T06:00:00+00:00"
        );
        assert!(
            parse_agent_status(br#"{"updatedAt":"yesterday"}"#)
                .status
                .updated_at
                .is_none()
        );
    }

    #[test]
    fn untrusted_text_is_stripped_and_capped() {
        assert_eq!(sanitize_untrusted("a\nb\x1b[31mc\u{7}"), "ab[31mc");
        assert_eq!(sanitize_untrusted("  spaced  "), "spaced");
        assert_eq!(sanitize_untrusted("evil\u{202e}txt"), "eviltxt");
        let long = "é".repeat(500);
        assert_eq!(
            sanitize_untrusted(&long).chars().count(),
            MAX_UNTRUSTED_CHARS
        );
        let json = format!(r#"{{"state":"working","message":"{}"}}"#, "x".repeat(1000));
        assert_eq!(
            parse_agent_status(json.as_bytes()).status.message.len(),
            MAX_UNTRUSTED_CHARS
        );
    }
}
