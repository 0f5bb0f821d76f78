//! `berth describe KIND NAME`: metadata, spec, status, conditions, container and recent events.

use std::fmt::Write as _;
use std::process::ExitCode;

use berth_api::Kind;
use chrono::{DateTime, Utc};
use clap::Args;
use serde_json::{Map, Value};

use super::Context;
use super::duration::human_age;
use super::events::event_rows;
use super::get::kind_and_names;
use super::render::{age_at, str_at, to_yaml, value_at};
use super::table::Table;

/// How many events `describe` shows, newest last.
const RECENT_EVENTS: usize = 15;

#[derive(Debug, Args)]
pub struct DescribeArgs {
    /// project, agentprofile or gitsource (or proj, ap, gs); or KIND/NAME.
    #[arg(value_name = "KIND|KIND/NAME", value_parser = super::get::kind_word)]
    kind: String,
    name: Option<String>,
}

pub async fn run(context: &Context, args: DescribeArgs) -> anyhow::Result<ExitCode> {
    let (kind, names) =
        kind_and_names(&args.kind, args.name.as_slice()).map_err(anyhow::Error::msg)?;
    let [name] = names.as_slice() else {
        anyhow::bail!("describe: name one object, as KIND NAME or KIND/NAME");
    };
    let client = context.client()?;
    let object = client.get(kind, name).await?;
    let events = match client.events(Some((kind, name))).await {
        Ok(list) => Ok(list
            .get("items")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default()),
        Err(err) => Err(err.to_string()),
    };
    print!("{}", describe(kind, &object, events, Utc::now()));
    if kind == Kind::Project {
        // Live figures only when the container runs; any failure just leaves the section out.
        let path = format!(
            "{}/runtime",
            crate::client::Client::object_path(Kind::Project, Some(name))
        );
        if let Ok(figures) = client.request_json(reqwest::Method::GET, &path, None).await
            && let Some(section) = crate::inspect::render::runtime_section(&figures)
        {
            print!("{section}");
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Status fields with a section of their own, or shown in the header.
const STATUS_SECTIONS: [&str; 9] = [
    "phase",
    "schedules",
    "location",
    "unsavedWork",
    "step",
    "observedGeneration",
    "message",
    "conditions",
    "container",
];

pub fn describe(
    resource: Kind,
    object: &Value,
    events: Result<Vec<Value>, String>,
    now: DateTime<Utc>,
) -> String {
    let mut out = String::new();
    let field = |out: &mut String, label: &str, value: &str| {
        let _ = writeln!(out, "{:<20}{value}", format!("{label}:"));
    };
    field(&mut out, "Name", str_at(object, "metadata.name"));
    field(&mut out, "Kind", resource.as_str());
    if resource == Kind::Project {
        field(&mut out, "Display Name", str_at(object, "spec.displayName"));
    }
    field(
        &mut out,
        "Labels",
        &pairs(value_at(object, "metadata.labels")),
    );
    field(
        &mut out,
        "Annotations",
        &pairs(value_at(object, "metadata.annotations")),
    );
    field(&mut out, "UID", str_at(object, "metadata.uid"));
    field(
        &mut out,
        "Generation",
        &number(value_at(object, "metadata.generation")),
    );
    field(
        &mut out,
        "Resource Version",
        &scalar_text(value_at(object, "metadata.resourceVersion")),
    );
    let created = str_at(object, "metadata.creationTimestamp");
    if !created.is_empty() {
        let age = age_at(object, "metadata.creationTimestamp", now);
        field(&mut out, "Created", &format!("{created} ({age} ago)"));
    }
    let deleting = str_at(object, "metadata.deletionTimestamp");
    if !deleting.is_empty() {
        field(&mut out, "Deleting Since", deleting);
    }
    if let Some(Value::Array(finalizers)) = value_at(object, "metadata.finalizers")
        && !finalizers.is_empty()
    {
        let names: Vec<String> = finalizers.iter().map(super::render::scalar).collect();
        field(&mut out, "Finalizers", &names.join(", "));
    }

    out.push_str("Spec:\n");
    match object.get("spec") {
        Some(spec) if spec.as_object().is_some_and(|m| !m.is_empty()) => {
            out.push_str(&indent(&to_yaml(&summarized(spec)), 2))
        }
        _ => out.push_str("  <none>\n"),
    }

    let status = object.get("status").cloned().unwrap_or(Value::Null);
    out.push_str("Status:\n");
    if status.as_object().is_none_or(Map::is_empty) {
        out.push_str("  <none: not yet observed>\n");
    } else {
        let sub = |out: &mut String, label: &str, value: String| {
            if !value.is_empty() {
                let _ = writeln!(out, "  {:<21}{value}", format!("{label}:"));
            }
        };
        sub(&mut out, "Phase", str_at(&status, "phase").to_string());
        sub(&mut out, "Step", str_at(&status, "step").to_string());
        sub(&mut out, "Member", str_at(&status, "location").to_string());
        sub(
            &mut out,
            "Observed Generation",
            number(status.get("observedGeneration")),
        );
        sub(&mut out, "Message", str_at(&status, "message").to_string());
        let rest: Map<String, Value> = status
            .as_object()
            .into_iter()
            .flatten()
            .filter(|(k, v)| !STATUS_SECTIONS.contains(&k.as_str()) && !v.is_null())
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        if !rest.is_empty() {
            out.push_str(&indent(&to_yaml(&Value::Object(rest)), 2));
        }
    }

    if let Some(Value::Array(conditions)) = status.get("conditions")
        && !conditions.is_empty()
    {
        out.push_str("Conditions:\n");
        let mut table = Table::new(["type", "status", "reason", "age", "message"]);
        let mut long_messages = Vec::new();
        for c in conditions {
            let message = str_at(c, "message").trim_end();
            let first_line = match message.split_once('\n') {
                Some((first, _)) => {
                    long_messages.push((str_at(c, "type"), message));
                    format!("{first} (continued below)")
                }
                None => message.to_string(),
            };
            table.row(vec![
                str_at(c, "type").to_string(),
                str_at(c, "status").to_string(),
                str_at(c, "reason").to_string(),
                age_at(c, "lastTransitionTime", now),
                first_line,
            ]);
        }
        out.push_str(&indent(&table.render(), 2));
        // A step deadline carries the container's console tail: shown whole, line by line.
        for (type_, message) in long_messages {
            let _ = writeln!(out, "  {type_} message:");
            out.push_str(&indent(message, 4));
        }
    }

    if let Some(unsaved) = status.get("unsavedWork").filter(|u| u.is_object()) {
        out.push_str(&unsaved_work_section(unsaved));
    }

    if let Some(section) = schedules_section(object, now) {
        out.push_str(&section);
    }

    if let Some(container) = status.get("container").filter(|c| !c.is_null()) {
        out.push_str("Container:\n");
        out.push_str(&indent(&to_yaml(container), 2));
    }

    out.push_str("Events:\n");
    match events {
        Err(reason) => {
            let _ = writeln!(out, "  <unavailable: {reason}>");
        }
        Ok(events) if events.is_empty() => out.push_str("  <none>\n"),
        Ok(mut events) => {
            events.sort_by_key(|e| str_at(e, "lastTimestamp").to_string());
            let skip = events.len().saturating_sub(RECENT_EVENTS);
            let mut table = Table::new(["type", "reason", "age", "message"]);
            for row in event_rows(&events[skip..], now) {
                table.row(vec![row.type_, row.reason, row.age, row.message]);
            }
            out.push_str(&indent(&table.render(), 2));
        }
    }
    out
}

/// `spec.schedules` with each one's next and last run (`status.schedules`, in spec order).
fn schedules_section(object: &Value, now: DateTime<Utc>) -> Option<String> {
    let specs = value_at(object, "spec.schedules")?.as_array()?;
    if specs.is_empty() {
        return None;
    }
    let recorded = value_at(object, "status.schedules").and_then(Value::as_array);
    let when = |entry: Option<&Value>, key: &str| -> String {
        let Some(at) = entry.and_then(|e| e.get(key)).and_then(Value::as_str) else {
            return String::new();
        };
        let relative = DateTime::parse_from_rfc3339(at)
            .map(|t| (t.with_timezone(&Utc) - now).num_seconds())
            .map(|s| match s {
                s if s > 0 => format!(" (in {})", human_age(s)),
                s => format!(" ({} ago)", human_age(-s)),
            })
            .unwrap_or_default();
        format!("{at}{relative}")
    };
    let mut table = Table::new(["cron", "timezone", "next run", "last run", "brief"]);
    for (n, spec) in specs.iter().enumerate() {
        // Written in spec order by the last round; an edit since shows no times until the next.
        let entry = recorded
            .and_then(|r| r.get(n))
            .filter(|e| e.get("cron") == spec.get("cron"));
        let brief = str_at(spec, "brief").lines().next().unwrap_or_default();
        table.row(vec![
            str_at(spec, "cron").to_string(),
            match str_at(spec, "timezone") {
                "" => "UTC".to_string(),
                zone => zone.to_string(),
            },
            when(entry, "nextRun"),
            when(entry, "lastRun"),
            brief.chars().take(60).collect(),
        ]);
    }
    Some(format!("Schedules:\n{}", indent(&table.render(), 2)))
}

/// `status.unsavedWork`: each kind of work found, and the files and refs that hold it (names
/// from the workspace, already sanitised and bounded by the controller; printed quoted when
/// they hold anything unusual all the same).
fn unsaved_work_section(unsaved: &Value) -> String {
    let mut out = String::from("Unsaved Work:\n");
    // A status this client cannot read is shown as it is, never as "none".
    let Ok(counts) = serde_json::from_value::<berth_api::UnsavedWork>(unsaved.clone()) else {
        out.push_str(&indent(&to_yaml(unsaved), 2));
        return out;
    };
    if !counts.any() {
        out.push_str("  <none>\n");
        return out;
    }
    let found = counts.summary();
    if !found.is_empty() {
        let _ = writeln!(out, "  {found}");
    }
    if let Some(Value::Array(files)) = unsaved.get("files") {
        for name in files.iter().filter_map(Value::as_str) {
            let plain = name.chars().all(|c| !c.is_control() && c != '"');
            if plain {
                let _ = writeln!(out, "    {name}");
            } else {
                let _ = writeln!(out, "    {name:?}");
            }
        }
    }
    out
}

/// Longest string `describe` prints from a spec; `get -o yaml` shows everything.
const SPEC_STRING_LIMIT: usize = 160;

/// The spec with long strings (a brief, a seed file's content) cut short.
fn summarized(value: &Value) -> Value {
    match value {
        Value::String(text) if text.chars().count() > SPEC_STRING_LIMIT => {
            let head: String = text.chars().take(SPEC_STRING_LIMIT).collect();
            let rest = text.chars().count() - SPEC_STRING_LIMIT;
            let unit = if rest == 1 { "character" } else { "characters" };
            Value::String(format!("{head}... ({rest} more {unit})"))
        }
        Value::Array(items) => Value::Array(items.iter().map(summarized).collect()),
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(k, v)| (k.clone(), summarized(v)))
                .collect(),
        ),
        other => other.clone(),
    }
}

fn pairs(map: Option<&Value>) -> String {
    match map.and_then(Value::as_object) {
        Some(map) if !map.is_empty() => map
            .iter()
            .map(|(k, v)| format!("{k}={}", super::render::scalar(v)))
            .collect::<Vec<_>>()
            .join(", "),
        _ => "<none>".to_string(),
    }
}

fn number(value: Option<&Value>) -> String {
    value.map(super::render::scalar).unwrap_or_default()
}

fn scalar_text(value: Option<&Value>) -> String {
    value.map(super::render::scalar).unwrap_or_default()
}

fn indent(text: &str, spaces: usize) -> String {
    let pad = " ".repeat(spaces);
    text.lines()
        .map(|line| {
            if line.is_empty() {
                "\n".to_string()
            } else {
                format!("{pad}{line}\n")
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn long_spec_strings_are_cut_short() {
        let spec = json!({"brief": "x".repeat(200), "seedFiles": [{"path": "a", "content": "y".repeat(161)}]});
        let short = summarized(&spec);
        assert_eq!(
            short["brief"],
            format!("{}... (40 more characters)", "x".repeat(160))
        );
        assert!(
            short["seedFiles"][0]["content"]
                .as_str()
                .unwrap()
                .ends_with("(1 more character)")
        );
        assert_eq!(short["seedFiles"][0]["path"], "a");
    }

    #[test]
    fn schedules_show_their_next_and_last_runs() {
        let now = DateTime::parse_from_rfc3339("2026-01-01T12:00:00Z")
            .unwrap()
            .with_timezone(&Utc);
        let object = json!({
            "spec": {"schedules": [
                {"cron": "0 * * * *", "brief": "Check the build\nthen report"},
                {"cron": "0 9 * * MON", "timezone": "Europe/Paris", "brief": "Weekly"}]},
            "status": {"schedules": [
                {"id": "s-1", "cron": "0 * * * *", "nextRun": "2026-01-01T13:00:00Z",
                 "lastRun": "2026-01-01T11:00:00Z"},
                {"id": "s-2", "cron": "0 8 * * MON", "nextRun": "2026-01-05T08:00:00Z"}]}
        });
        let section = schedules_section(&object, now).unwrap();
        let lines: Vec<&str> = section.lines().collect();
        assert_eq!(lines[0], "Schedules:");
        assert!(lines[1].trim_start().starts_with("CRON"), "{section}");
        assert!(
            lines[2].contains("UTC")
                && lines[2].contains("2026-01-01T13:00:00Z (in 60m)")
                && lines[2].contains("2026-01-01T11:00:00Z (60m ago)")
                && lines[2].trim_end().ends_with("Check the build"),
            "{section}"
        );
        // Recorded for another cron: an edit the scheduler has not planned yet.
        assert!(
            lines[3].contains("Europe/Paris") && !lines[3].contains("2026"),
            "{section}"
        );
        assert_eq!(schedules_section(&json!({"spec": {}}), now), None);
    }

    #[test]
    fn sections_in_order() {
        let now = DateTime::parse_from_rfc3339("2026-01-01T12:00:00Z")
            .unwrap()
            .with_timezone(&Utc);
        let object = json!({
            "kind": "Project",
            "metadata": {"name": "payments-api", "uid": "u1", "generation": 2, "resourceVersion": "7",
                         "labels": {"team": "payments"}, "creationTimestamp": "2026-01-01T11:00:00Z"},
            "spec": {"displayName": "Payments API", "image": "berth-base"},
            "status": {"phase": "Provisioning", "step": "Created", "observedGeneration": 2,
                       "location": "m2",
                       "conditions": [{"type": "Ready", "status": "False", "reason": "Starting",
                                       "lastTransitionTime": "2026-01-01T11:59:00Z", "message": ""}],
                       "container": {"name": "payments-api", "pid": 42},
                       "title": "Fix it"}
        });
        let mut object = object;
        object["status"]["conditions"]
            .as_array_mut()
            .unwrap()
            .push(json!({"type": "Reachable", "status": "False", "reason": "BootTimeout",
                         "lastTransitionTime": "2026-01-01T11:59:00Z",
                         "message": "no exec answer 120s after start; console tail:\n[ 1.0] init: ok\n[ 2.0] panic\n"}));
        let events = vec![
            json!({"type": "Normal", "reason": "Created", "message": "container created",
                                 "count": 2, "firstTimestamp": "2026-01-01T11:50:00Z",
                                 "lastTimestamp": "2026-01-01T11:58:00Z"}),
        ];
        object["status"]["unsavedWork"] = json!({
            "uncommitted": 0, "untracked": 1, "stashes": 0, "unpushed": 2, "ignored": 1,
            "files": ["notes.txt", "data/app.db", "refs/heads/wip"]
        });
        let text = describe(Kind::Project, &object, Ok(events), now);
        let expected = "\
Name:               payments-api
Kind:               Project
Display Name:       Payments API
Labels:             team=payments
Annotations:        <none>
UID:                u1
Generation:         2
Resource Version:   7
Created:            2026-01-01T11:00:00Z (60m ago)
Spec:
  displayName: Payments API
  image: berth-base
Status:
  Phase:               Provisioning
  Step:                Created
  Member:              m2
  Observed Generation: 2
  title: Fix it
Conditions:
  TYPE        STATUS   REASON        AGE   MESSAGE
  Ready       False    Starting      60s
  Reachable   False    BootTimeout   60s   no exec answer 120s after start; console tail: (continued below)
  Reachable message:
    no exec answer 120s after start; console tail:
    [ 1.0] init: ok
    [ 2.0] panic
Unsaved Work:
  1 untracked files, 2 commits on no remote, 1 ignored files that protect
    notes.txt
    data/app.db
    refs/heads/wip
Container:
  name: payments-api
  pid: 42
Events:
  TYPE     REASON    AGE                MESSAGE
  Normal   Created   2m (x2 over 10m)   container created
";
        assert_eq!(text, expected);
    }

    #[test]
    fn a_clean_workspace_says_so_and_odd_names_are_quoted() {
        let clean = json!({"uncommitted": 0, "untracked": 0, "stashes": 0, "unpushed": 0});
        assert_eq!(unsaved_work_section(&clean), "Unsaved Work:\n  <none>\n");
        let unreadable = json!({"uncommitted": "many"});
        assert_eq!(
            unsaved_work_section(&unreadable),
            "Unsaved Work:\n  uncommitted: many\n"
        );
        let odd = json!({"modifiedSeeds": 1, "files": ["a\"b"]});
        assert_eq!(
            unsaved_work_section(&odd),
            "Unsaved Work:\n  1 files berth wrote, changed since\n    \"a\\\"b\"\n"
        );
    }
}
