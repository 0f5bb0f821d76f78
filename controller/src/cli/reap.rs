//! `berth reap --dry-run`: what the reaper will do next to each project, and what protects it.
//! The plan is read from the server (`GET /apis/berth.dev/v1alpha1/reap`); nothing is changed.

use std::process::ExitCode;

use chrono::{DateTime, Utc};
use clap::Args;
use reqwest::Method;

use super::Context;
use super::render::{self, OutputFormat};
use super::table::Table;
use crate::client::API_PREFIX;
use crate::scheduler::passes::PlanEntry;

#[derive(Debug, Args)]
pub struct ReapArgs {
    /// Show the plan without acting (the only mode: reaping is the scheduler's).
    #[arg(long, required = true)]
    dry_run: bool,
    /// Output format (yaml or json print the plan as the server returns it).
    #[arg(short = 'o', long = "output", value_enum)]
    output: Option<OutputFormat>,
}

pub async fn run(context: &Context, args: ReapArgs) -> anyhow::Result<ExitCode> {
    let client = context.client()?;
    let plan = client
        .request_json(Method::GET, &format!("{API_PREFIX}/reap"), None)
        .await?;
    match args.output {
        Some(OutputFormat::Yaml) => print!("{}", render::to_yaml(&plan)),
        Some(OutputFormat::Json) => print!("{}", render::to_json(&plan)),
        _ => {
            let entries: Vec<PlanEntry> = plan
                .get("items")
                .cloned()
                .map(serde_json::from_value)
                .transpose()?
                .unwrap_or_default();
            if entries.is_empty() {
                eprintln!("No projects found.");
                return Ok(ExitCode::SUCCESS);
            }
            print!("{}", plan_table(&entries, Utc::now()));
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// NAME, NEXT ACTION, AT, PROTECTED BY, REASON.
fn plan_table(entries: &[PlanEntry], now: DateTime<Utc>) -> String {
    let mut table = Table::new(["name", "next action", "at", "protected by", "reason"]);
    for entry in entries {
        let action = entry.next_action.map_or("<none>".to_string(), |a| {
            serde_json::to_value(a)
                .ok()
                .and_then(|v| v.as_str().map(str::to_string))
                .unwrap_or_default()
        });
        let at = entry.next_action_at.map_or("-".to_string(), |at| {
            let secs = (at - now).num_seconds();
            if secs <= 0 {
                "due".to_string()
            } else {
                format!("in {}", super::duration::human_age(secs))
            }
        });
        let protected = if entry.protected_by.is_empty() {
            "-".to_string()
        } else {
            entry
                .protected_by
                .iter()
                .map(|r| r.as_str())
                .collect::<Vec<_>>()
                .join(",")
        };
        table.row(vec![
            entry.name.clone(),
            action,
            at,
            protected,
            entry.reason.clone(),
        ]);
    }
    table.render()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    fn entry(value: Value) -> PlanEntry {
        serde_json::from_value(value).expect("a plan entry")
    }

    #[test]
    fn the_table_shows_action_time_and_protection() {
        let now = DateTime::parse_from_rfc3339("2026-01-01T12:00:00Z")
            .unwrap()
            .with_timezone(&Utc);
        let rows = [
            entry(json!({"name": "web", "nextAction": "Stop",
                         "nextActionAt": "2026-01-01T11:00:00Z",
                         "protectedBy": ["UnsavedWork"], "reason": "protected by UnsavedWork"})),
            entry(json!({"name": "api", "nextAction": "Delete",
                         "nextActionAt": "2026-01-01T14:00:00Z", "reason": ""})),
            entry(json!({"name": "idle", "reason": "idled at 2026-01-01T10:00:00Z"})),
            entry(json!({"name": "new", "reason": "not inspected yet"})),
        ];
        let text = plan_table(&rows, now);
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[0].starts_with("NAME"), "{text}");
        assert!(lines[0].contains("PROTECTED BY"), "{text}");
        assert!(
            lines[1].contains("Stop") && lines[1].contains("due"),
            "{text}"
        );
        assert!(lines[1].contains("UnsavedWork"), "{text}");
        assert!(
            lines[2].contains("Delete") && lines[2].contains("in "),
            "{text}"
        );
        assert!(lines[3].contains("<none>"), "{text}");
        assert!(
            lines[4].contains("<none>") && lines[4].ends_with("not inspected yet"),
            "{text}"
        );
    }
}
