//! `berth get KIND [NAME]`: tables aligned like kubectl's, or the objects as YAML, JSON or names.

use std::process::ExitCode;

use clap::Args;
use serde_json::Value;

use super::Context;
use super::render::{self, OutputFormat, name_of};
use crate::client::Resource;

#[derive(Debug, Args)]
pub struct GetArgs {
    /// project(s), agentprofile(s) or gitsource(s).
    #[arg(value_parser = parse_resource)]
    kind: Resource,
    /// One or more objects; all of them when omitted.
    names: Vec<String>,
    /// Label selector, e.g. `team=payments,tier!=dev` or `team in (payments,infra),!canary`.
    #[arg(short = 'l', long = "selector", value_name = "SELECTOR")]
    selector: Option<String>,
    /// Output format.
    #[arg(short = 'o', long = "output", value_enum)]
    output: Option<OutputFormat>,
}

/// Accepts `project`, `projects`, `Project`, and the same for every kind.
pub fn parse_resource(word: &str) -> Result<Resource, String> {
    Resource::from_cli(word).ok_or_else(|| {
        format!("unknown kind {word:?} (expected project, agentprofile or gitsource)")
    })
}

pub async fn run(context: &Context, args: GetArgs) -> anyhow::Result<ExitCode> {
    let client = context.client()?;
    // Like kubectl: with several names, those found are printed and each missing one gets an
    // error line of its own.
    let mut missing = Vec::new();
    let (objects, list) = match args.names.as_slice() {
        [name] => {
            let object = client.get(args.kind, name).await?;
            (vec![object.clone()], object)
        }
        [_, _, ..] => {
            let mut objects = Vec::with_capacity(args.names.len());
            for name in &args.names {
                match client.get(args.kind, name).await {
                    Ok(object) => objects.push(object),
                    Err(err) if err.is_not_found() => missing.push(err),
                    Err(err) => return Err(err.into()),
                }
            }
            let list = serde_json::json!({"apiVersion": "v1", "kind": "List", "items": objects});
            (objects, list)
        }
        [] => {
            let list = client.list(args.kind, args.selector.as_deref()).await?;
            let items = list
                .get("items")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
            (items, list)
        }
    };
    match args.output {
        Some(OutputFormat::Yaml) => print!("{}", render::to_yaml(&list)),
        Some(OutputFormat::Json) => print!("{}", render::to_json(&list)),
        Some(OutputFormat::Name) => {
            for object in &objects {
                println!("{}/{}", args.kind, name_of(object));
            }
        }
        format @ (None | Some(OutputFormat::Wide)) => {
            if objects.is_empty() {
                if missing.is_empty() {
                    eprintln!("No resources found.");
                }
            } else {
                let wide = format == Some(OutputFormat::Wide);
                print!(
                    "{}",
                    render::table(args.kind, &objects, wide, chrono::Utc::now()).render()
                );
            }
        }
    }
    for err in &missing {
        eprintln!("{err}");
    }
    Ok(if missing.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
