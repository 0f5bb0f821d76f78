//! `berth events [KIND NAME]`: what happened recently, oldest first.

use std::collections::HashSet;
use std::io::Write as _;
use std::process::ExitCode;
use std::time::Duration;

use berth_api::Kind;
use chrono::{DateTime, Utc};
use clap::Args;
use serde_json::Value;

use super::Context;
use super::colour;
use super::duration::human_age;
use super::get::parse_objects;
use super::render::{self, OutputFormat, str_at, time_at};
use super::table::Table;

/// How often `events -w` asks for new events.
const WATCH_POLL: Duration = Duration::from_secs(2);

#[derive(Debug, Args)]
pub struct EventsArgs {
    /// Only events about one object: NAME (a project), KIND NAME or KIND/NAME.
    #[arg(value_name = "[KIND] NAME", num_args = 0..=2)]
    object: Vec<String>,
    /// Output format (yaml or json print the EventList).
    #[arg(short = 'o', long = "output", value_enum)]
    output: Option<OutputFormat>,
    /// After the listing, print each new event as it comes, until interrupted.
    #[arg(short = 'w', long)]
    watch: bool,
}

/// The object `events` is about: none, `NAME` (a project), `KIND NAME` or `KIND/NAME`.
fn object_of(words: &[String]) -> Result<Option<(Kind, String)>, String> {
    match words {
        [] => Ok(None),
        [one] if !one.contains('/') => Ok(Some((Kind::Project, one.clone()))),
        _ => {
            let objects = parse_objects(words)?;
            match objects.as_slice() {
                [one] => Ok(Some(one.clone())),
                _ => Err("events are about one object: [KIND] NAME or KIND/NAME".to_string()),
            }
        }
    }
}

/// One event as the tables print it.
pub struct EventRow {
    pub last_seen: String,
    pub type_: String,
    pub reason: String,
    pub object: String,
    /// describe's form: `5m (x3 over 10m)`.
    pub age: String,
    pub message: String,
}

pub fn event_rows(events: &[Value], now: DateTime<Utc>) -> Vec<EventRow> {
    events
        .iter()
        .map(|event| {
            let last = time_at(event, "lastTimestamp").or_else(|| time_at(event, "firstTimestamp"));
            let first = time_at(event, "firstTimestamp").or(last);
            let since = |t: Option<DateTime<Utc>>| {
                t.map_or_else(
                    || "<unknown>".to_string(),
                    |t| human_age((now - t).num_seconds()),
                )
            };
            let count = event.get("count").and_then(Value::as_i64).unwrap_or(1);
            let last_seen = since(last);
            let age = if count > 1 {
                format!("{last_seen} (x{count} over {})", since(first))
            } else {
                last_seen.clone()
            };
            let kind = str_at(event, "involvedObject.kind");
            let name = str_at(event, "involvedObject.name");
            let object = match kind.parse::<Kind>() {
                Ok(kind) => format!("{}/{name}", kind.singular()),
                Err(_) if kind.is_empty() => name.to_string(),
                Err(_) => format!("{}/{name}", kind.to_lowercase()),
            };
            EventRow {
                last_seen,
                type_: str_at(event, "type").to_string(),
                reason: str_at(event, "reason").to_string(),
                object,
                age,
                message: str_at(event, "message").to_string(),
            }
        })
        .collect()
}

pub async fn run(context: &Context, args: EventsArgs) -> anyhow::Result<ExitCode> {
    let client = context.client()?;
    let object = object_of(&args.object).map_err(anyhow::Error::msg)?;
    let object = object.as_ref().map(|(kind, name)| (*kind, name.as_str()));
    let list = client.events(object).await?;
    let mut events = items(&list);
    match args.output {
        Some(OutputFormat::Yaml) => print!("{}", render::to_yaml(&list)),
        Some(OutputFormat::Json) => print!("{}", render::to_json(&list)),
        _ if events.is_empty() && !args.watch => eprintln!("No events found."),
        _ => {
            events.sort_by_key(|e| str_at(e, "lastTimestamp").to_string());
            print!("{}", event_table(&events).render());
        }
    }
    if !args.watch {
        return Ok(ExitCode::SUCCESS);
    }
    // Events have no watch of their own: ask again every few seconds and print what is new
    // (a new event, or one seen again).
    let mut seen: HashSet<(String, i64)> = events.iter().map(event_key).collect();
    let mut above = event_table(&events);
    loop {
        tokio::time::sleep(WATCH_POLL).await;
        let mut fresh: Vec<Value> = items(&client.events(object).await?)
            .into_iter()
            .filter(|e| seen.insert(event_key(e)))
            .collect();
        if fresh.is_empty() {
            continue;
        }
        fresh.sort_by_key(|e| str_at(e, "lastTimestamp").to_string());
        let text = match args.output {
            Some(OutputFormat::Yaml) => fresh
                .iter()
                .map(|e| format!("---\n{}", render::to_yaml(e)))
                .collect(),
            Some(OutputFormat::Json) => fresh.iter().map(render::to_json).collect(),
            _ => {
                let table = event_table(&fresh);
                let text = if above.is_empty() {
                    table.render()
                } else {
                    table.render_rows_under(&above)
                };
                above = table;
                text
            }
        };
        let mut out = std::io::stdout().lock();
        out.write_all(text.as_bytes()).and_then(|()| out.flush())?;
    }
}

fn items(list: &Value) -> Vec<Value> {
    list.get("items")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default()
}

/// An event as it was seen: its name and how many times it had happened.
fn event_key(event: &Value) -> (String, i64) {
    (
        str_at(event, "metadata.name").to_string(),
        event.get("count").and_then(Value::as_i64).unwrap_or(1),
    )
}

fn event_table(events: &[Value]) -> Table {
    let mut table = Table::new(["last seen", "type", "reason", "object", "message"]);
    for row in event_rows(events, Utc::now()) {
        table.row(vec![
            row.last_seen,
            row.type_,
            row.reason,
            row.object,
            row.message,
        ]);
    }
    table.paint("type", colour::event_type, colour::stdout())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn events_are_about_a_project_by_default_or_a_named_object() {
        let words =
            |text: &str| -> Vec<String> { text.split_whitespace().map(String::from).collect() };
        let project = |name: &str| Some((Kind::Project, name.to_string()));
        assert_eq!(object_of(&[]).unwrap(), None);
        assert_eq!(object_of(&words("web")).unwrap(), project("web"));
        assert_eq!(object_of(&words("proj web")).unwrap(), project("web"));
        assert_eq!(object_of(&words("project/web")).unwrap(), project("web"));
        assert_eq!(
            object_of(&words("gs/fleet")).unwrap(),
            Some((Kind::GitSource, "fleet".to_string()))
        );
        assert!(object_of(&words("project/a project/b")).is_err());
        assert!(object_of(&words("pod web")).is_err());
    }

    #[test]
    fn rows_show_counts_and_objects() {
        let now = DateTime::parse_from_rfc3339("2026-01-01T12:00:00Z")
            .unwrap()
            .with_timezone(&Utc);
        let events = [
            json!({"type": "Warning", "reason": "QuotaNotEnforced", "message": "pool dir has no quotas",
                   "count": 3, "firstTimestamp": "2026-01-01T11:00:00Z", "lastTimestamp": "2026-01-01T11:58:00Z",
                   "involvedObject": {"kind": "Project", "name": "payments-api"}}),
            json!({"type": "Normal", "reason": "Synced", "message": "",
                   "lastTimestamp": "2026-01-01T11:59:30Z",
                   "involvedObject": {"kind": "Widget", "name": "w"}}),
        ];
        let rows = event_rows(&events, now);
        assert_eq!(rows[0].object, "project/payments-api");
        assert_eq!(rows[0].age, "2m (x3 over 60m)");
        assert_eq!(rows[0].last_seen, "2m");
        assert_eq!(rows[1].object, "widget/w");
        assert_eq!(rows[1].age, "30s");
    }
}
