//! `berth events [KIND NAME]`: what happened recently, oldest first.

use std::process::ExitCode;

use chrono::{DateTime, Utc};
use clap::Args;
use serde_json::Value;

use super::Context;
use super::duration::human_age;
use super::get::parse_resource;
use super::render::{self, OutputFormat, str_at, time_at};
use super::table::Table;
use crate::client::Resource;

#[derive(Debug, Args)]
pub struct EventsArgs {
    /// Only events about this kind of object (with NAME).
    #[arg(value_parser = parse_resource, requires = "name")]
    kind: Option<Resource>,
    /// Only events about this object.
    name: Option<String>,
    /// Output format (yaml or json print the EventList).
    #[arg(short = 'o', long = "output", value_enum)]
    output: Option<OutputFormat>,
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
            let object = match Resource::from_kind(kind) {
                Some(resource) => format!("{resource}/{name}"),
                None if kind.is_empty() => name.to_string(),
                None => format!("{}/{name}", kind.to_lowercase()),
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
    let object = match (args.kind, args.name.as_deref()) {
        (Some(kind), Some(name)) => Some((kind, name)),
        _ => None,
    };
    let list = client.events(object).await?;
    match args.output {
        Some(OutputFormat::Yaml) => print!("{}", render::to_yaml(&list)),
        Some(OutputFormat::Json) => print!("{}", render::to_json(&list)),
        _ => {
            let mut events = list
                .get("items")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
            if events.is_empty() {
                eprintln!("No events found.");
                return Ok(ExitCode::SUCCESS);
            }
            events.sort_by_key(|e| str_at(e, "lastTimestamp").to_string());
            let mut table = Table::new(["last seen", "type", "reason", "object", "message"]);
            for row in event_rows(&events, Utc::now()) {
                table.row(vec![
                    row.last_seen,
                    row.type_,
                    row.reason,
                    row.object,
                    row.message,
                ]);
            }
            print!("{}", table.render());
        }
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

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
