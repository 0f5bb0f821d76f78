//! Reading fields out of objects and printing them: `-o` formats, table columns, ages.

use berth_api::Kind;
use chrono::{DateTime, Utc};
use serde_json::Value;

use super::duration::human_age;
use super::table::Table;

/// `-o` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum OutputFormat {
    Wide,
    Yaml,
    Json,
    Name,
}

/// The string at a dotted path, or `""`.
pub fn str_at<'a>(object: &'a Value, path: &str) -> &'a str {
    value_at(object, path).and_then(Value::as_str).unwrap_or("")
}

/// The value at a dotted path.
pub fn value_at<'a>(object: &'a Value, path: &str) -> Option<&'a Value> {
    path.split('.').try_fold(object, |v, key| v.get(key))
}

pub fn name_of(object: &Value) -> &str {
    str_at(object, "metadata.name")
}

/// A condition of `status.conditions` by type.
pub fn condition<'a>(object: &'a Value, type_: &str) -> Option<&'a Value> {
    value_at(object, "status.conditions")?
        .as_array()?
        .iter()
        .find(|c| c.get("type").and_then(Value::as_str) == Some(type_))
}

/// Parses an RFC 3339 timestamp field.
pub fn time_at(object: &Value, path: &str) -> Option<DateTime<Utc>> {
    DateTime::parse_from_rfc3339(str_at(object, path))
        .ok()
        .map(|t| t.with_timezone(&Utc))
}

/// `3m20s`-style age of a timestamp field, `<unknown>` without one.
pub fn age_at(object: &Value, path: &str, now: DateTime<Utc>) -> String {
    match time_at(object, path) {
        Some(t) => human_age((now - t).num_seconds()),
        None => "<unknown>".to_string(),
    }
}

/// Strings of an array field joined by commas; a string field as itself.
pub fn joined_at(object: &Value, path: &str, key: Option<&str>) -> String {
    joined_with(object, path, key, ",")
}

/// Like [`joined_at`], with a chosen separator.
pub fn joined_with(object: &Value, path: &str, key: Option<&str>, separator: &str) -> String {
    match value_at(object, path) {
        Some(Value::Array(items)) => items
            .iter()
            .map(|item| {
                let item = key.and_then(|k| item.get(k)).unwrap_or(item);
                scalar(item)
            })
            .filter(|s| !s.is_empty())
            .collect::<Vec<_>>()
            .join(separator),
        Some(other) => scalar(other),
        None => String::new(),
    }
}

/// A scalar as text: strings unquoted, numbers and booleans as written, null as empty.
pub fn scalar(value: &Value) -> String {
    match value {
        Value::Null => String::new(),
        Value::String(s) => s.clone(),
        Value::Bool(_) | Value::Number(_) => value.to_string(),
        other => serde_json::to_string(other).unwrap_or_default(),
    }
}

pub fn to_yaml(value: &Value) -> String {
    serde_yaml::to_string(value).expect("a serde_json::Value always serialises to YAML")
}

pub fn to_json(value: &Value) -> String {
    let mut text =
        serde_json::to_string_pretty(value).expect("a serde_json::Value always serialises");
    text.push('\n');
    text
}

/// Which columns a table has beyond its kind's own.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Columns {
    /// The columns that need a wide terminal (`-o wide`).
    pub wide: bool,
    /// A LABELS column (`--show-labels`).
    pub labels: bool,
}

#[cfg(test)]
impl Columns {
    pub const PLAIN: Columns = Columns {
        wide: false,
        labels: false,
    };
    pub const WIDE: Columns = Columns {
        wide: true,
        labels: false,
    };
}

/// The table `get` prints for a kind.
pub fn table(resource: Kind, objects: &[Value], columns: Columns, now: DateTime<Utc>) -> Table {
    let wide = columns.wide;
    let mut headers: Vec<&str> = match resource {
        Kind::Project => vec!["name", "display name", "phase", "step", "age", "message"],
        Kind::AgentProfile => vec!["name", "home", "version", "age"],
        Kind::GitSource => vec!["name", "url", "ref", "ready", "revision", "age", "message"],
    };
    if wide {
        headers.extend(match resource {
            Kind::Project => &[
                "image",
                "agent",
                "title",
                "protected",
                "ports",
                "next run",
                "member",
            ][..],
            Kind::AgentProfile => &["runner"][..],
            Kind::GitSource => &["path", "interval", "suspend"][..],
        });
    }
    let mut table = Table::new(headers);
    for object in objects {
        let age = age_at(object, "metadata.creationTimestamp", now);
        let mut row: Vec<String> = match resource {
            Kind::Project => vec![
                name_of(object).to_string(),
                str_at(object, "spec.displayName").to_string(),
                or_default(str_at(object, "status.phase"), "Pending"),
                str_at(object, "status.step").to_string(),
                age,
                held_message(object),
            ],
            Kind::AgentProfile => vec![
                name_of(object).to_string(),
                str_at(object, "spec.home").to_string(),
                str_at(object, "spec.install.version").to_string(),
                age,
            ],
            Kind::GitSource => vec![
                name_of(object).to_string(),
                str_at(object, "spec.url").to_string(),
                scalar(value_at(object, "spec.ref").unwrap_or(&Value::Null)),
                condition(object, "Ready")
                    .map(|c| str_at(c, "status").to_string())
                    .unwrap_or_else(|| "Unknown".to_string()),
                short_revision(str_at(object, "status.lastAppliedRevision")),
                age,
                not_ready_message(object),
            ],
        };
        if wide {
            match resource {
                Kind::Project => row.extend([
                    str_at(object, "spec.image").to_string(),
                    agent_cell(object),
                    str_at(object, "status.title").to_string(),
                    protected_cell(object),
                    joined_at(object, "status.ports", Some("port")),
                    next_run_cell(object, now),
                    // The cluster member, last: empty on a single LXD server.
                    str_at(object, "status.location").to_string(),
                ]),
                Kind::AgentProfile => {
                    row.push(joined_with(object, "spec.runner.command", None, " "))
                }
                Kind::GitSource => row.extend([
                    str_at(object, "spec.path").to_string(),
                    scalar(value_at(object, "spec.interval").unwrap_or(&Value::Null)),
                    scalar(value_at(object, "spec.suspend").unwrap_or(&Value::Null)),
                ]),
            }
        }
        if columns.labels {
            row.push(labels_cell(object));
        }
        table.row(row);
    }
    if columns.labels {
        table.push_header("labels");
    }
    table
}

/// When the project's next scheduled brief is due (`in 25m`), empty without schedules.
fn next_run_cell(object: &Value, now: DateTime<Utc>) -> String {
    let next = value_at(object, "status.schedules")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|s| s.get("nextRun").and_then(Value::as_str))
        .filter_map(|t| DateTime::parse_from_rfc3339(t).ok())
        .map(|t| t.with_timezone(&Utc))
        .min();
    match next {
        Some(t) if t > now => format!("in {}", human_age((t - now).num_seconds())),
        Some(_) => "due".to_string(),
        None => String::new(),
    }
}

/// `key=value,...` of the object's labels, `<none>` without any, as kubectl shows them.
fn labels_cell(object: &Value) -> String {
    match value_at(object, "metadata.labels").and_then(Value::as_object) {
        Some(labels) if !labels.is_empty() => labels
            .iter()
            .map(|(k, v)| format!("{k}={}", scalar(v)))
            .collect::<Vec<_>>()
            .join(","),
        _ => "<none>".to_string(),
    }
}

/// A commit id as people read it (12 characters, as `git log --oneline` grows to on big
/// repositories); anything else as it is.
fn short_revision(revision: &str) -> String {
    let is_sha = revision.len() >= 40 && revision.chars().all(|c| c.is_ascii_hexdigit());
    match is_sha {
        true => revision[..12].to_string(),
        false => revision.to_string(),
    }
}

/// Why a project is held (`Reason: message`, its first line): empty when it is Ready or its
/// Ready condition has no message (the step or phase says it all).
fn held_message(object: &Value) -> String {
    match condition(object, "Ready") {
        Some(c) if str_at(c, "status") != "True" && !str_at(c, "message").is_empty() => {
            let why = reason_and_message(c);
            why.lines().next().unwrap_or_default().to_string()
        }
        _ => String::new(),
    }
}

/// Why an object is not Ready (`Reason: message`); empty when it is.
fn not_ready_message(object: &Value) -> String {
    match condition(object, "Ready") {
        Some(c) if str_at(c, "status") != "True" => reason_and_message(c),
        _ => String::new(),
    }
}

/// A condition's `Reason: message`, or whichever of the two it has.
pub fn reason_and_message(condition: &Value) -> String {
    match (str_at(condition, "reason"), str_at(condition, "message")) {
        ("", message) => message.to_string(),
        (reason, "") => reason.to_string(),
        (reason, message) => format!("{reason}: {message}"),
    }
}

/// What protects a project, read as every view reads it
/// ([`crate::workspace::protection::recorded`]): `AgentBlocked,UnsavedWork`.
fn protected_cell(object: &Value) -> String {
    let status: berth_api::ProjectStatus = object
        .get("status")
        .and_then(|s| serde_json::from_value(s.clone()).ok())
        .unwrap_or_default();
    crate::workspace::protection::recorded(&status)
        .iter()
        .map(|r| r.as_str())
        .collect::<Vec<_>>()
        .join(",")
}

/// The agent profile with what the agent last reported: `shell (done)`.
fn agent_cell(object: &Value) -> String {
    let agent = str_at(object, "spec.agent");
    let state = str_at(object, "status.agent.state");
    match (agent.is_empty(), state.is_empty()) {
        (true, _) => String::new(),
        (false, true) => agent.to_string(),
        (false, false) => format!("{agent} ({state})"),
    }
}

fn or_default(value: &str, default: &str) -> String {
    if value.is_empty() {
        default.to_string()
    } else {
        value.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn now() -> DateTime<Utc> {
        DateTime::parse_from_rfc3339("2026-01-01T12:00:00Z")
            .unwrap()
            .with_timezone(&Utc)
    }

    #[test]
    fn project_tables_plain_and_wide() {
        let objects = vec![
            json!({"metadata": {"name": "payments-api", "creationTimestamp": "2026-01-01T11:55:00Z"},
                   "spec": {"displayName": "Payments API", "image": "berth-base", "agent": "shell"},
                   "status": {"phase": "Ready", "step": "Briefed", "title": "Fix the test",
                              "agent": {"state": "blocked"},
                              "reap": {"protectedBy": ["UnsavedWork", "AgentBlocked"]},
                              "ports": [{"port": 3000, "url": "http://x"}, {"port": 8080}],
                              "schedules": [{"id": "s-1", "cron": "0 * * * *", "nextRun": "2026-01-01T12:25:00Z"},
                                            {"id": "s-2", "cron": "0 9 * * *", "nextRun": "2026-01-02T09:00:00Z"}],
                              "location": "m2"}}),
            json!({"metadata": {"name": "new", "creationTimestamp": "2026-01-01T11:59:30Z"},
                   "spec": {"displayName": "new"}}),
        ];
        let plain = table(Kind::Project, &objects, Columns::PLAIN, now()).render();
        assert_eq!(
            plain,
            "\
NAME           DISPLAY NAME   PHASE     STEP      AGE   MESSAGE
payments-api   Payments API   Ready     Briefed   5m
new            new            Pending             30s
"
        );
        let wide = table(Kind::Project, &objects, Columns::WIDE, now()).render();
        let first = wide.lines().nth(1).unwrap();
        assert!(
            first.ends_with(
                "berth-base   shell (blocked)   Fix the test   AgentBlocked,UnsavedWork   3000,8080   in 25m     m2"
            ),
            "{first:?}"
        );
        assert!(wide.starts_with("NAME "));
        assert!(wide.lines().next().unwrap().ends_with(
            "IMAGE        AGENT             TITLE          PROTECTED                  PORTS       NEXT RUN   MEMBER"
        ));
    }

    #[test]
    fn other_kinds_have_their_own_columns() {
        let profile = json!({"metadata": {"name": "shell", "creationTimestamp": "2026-01-01T11:00:00Z"},
            "spec": {"home": "/root/.shell", "install": {"version": "1.0"},
                     "runner": {"command": ["run", "a,b", "{briefFile}"]}}});
        assert_eq!(
            table(Kind::AgentProfile, &[profile], Columns::WIDE, now()).render(),
            "NAME    HOME           VERSION   AGE   RUNNER\nshell   /root/.shell   1.0       60m   run a,b {briefFile}\n"
        );
        let source = json!({"metadata": {"name": "fleet", "labels": {"team": "infra"}},
            "spec": {"url": "file:///srv/fleet.git", "ref": "main"},
            "status": {"lastAppliedRevision": "abc123", "conditions": [{"type": "Ready", "status": "True"}]}});
        assert_eq!(
            table(Kind::GitSource, &[source], Columns::PLAIN, now()).render(),
            "NAME    URL                     REF    READY   REVISION   AGE         MESSAGE\nfleet   file:///srv/fleet.git   main   True    abc123     <unknown>\n"
        );
        let failing = json!({"metadata": {"name": "fleet"},
            "spec": {"url": "file:///srv/fleet.git", "ref": "main"},
            "status": {"lastAppliedRevision": "0123456789abcdef0123456789abcdef01234567",
                       "conditions": [{"type": "Ready", "status": "False", "reason": "ApplyFailed",
                                       "message": "project/a: spec.memory: too small"}]}});
        let labelled = Columns {
            wide: false,
            labels: true,
        };
        let lines = table(Kind::GitSource, &[failing], labelled, now()).render();
        let row = lines.lines().nth(1).unwrap();
        assert!(row.contains(" 0123456789ab "), "{row}");
        assert!(
            row.ends_with("ApplyFailed: project/a: spec.memory: too small   <none>"),
            "{row}"
        );
        assert!(lines.starts_with("NAME ") && lines.lines().next().unwrap().ends_with("LABELS"));
    }

    #[test]
    fn field_access() {
        let object = json!({"status": {"conditions": [{"type": "Ready", "status": "True"}]}});
        assert_eq!(
            str_at(condition(&object, "Ready").unwrap(), "status"),
            "True"
        );
        assert!(condition(&object, "MountsReady").is_none());
        assert_eq!(
            age_at(&object, "metadata.creationTimestamp", now()),
            "<unknown>"
        );
    }
}
