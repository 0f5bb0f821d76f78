//! `berth create project DISPLAY_NAME`: the server derives the name from the display name
//! (`metadata.generateName`), taking the next free suffix when another project holds it.

use std::collections::BTreeMap;
use std::process::ExitCode;

use berth_api::Kind;
use clap::{Args, Subcommand};
use serde_json::{Map, Value, json};

use super::progress::{self, Goal};
use super::render::name_of;
use super::{Context, render};

#[derive(Debug, Args)]
pub struct CreateArgs {
    #[command(subcommand)]
    kind: CreateKind,
}

#[derive(Debug, Subcommand)]
enum CreateKind {
    /// A project; its name is derived from DISPLAY_NAME (`Payments API` → `payments-api`).
    Project(CreateProjectArgs),
}

#[derive(Debug, Args)]
struct CreateProjectArgs {
    /// The human-facing name; unique case-insensitively, and the source of the object's name.
    display_name: String,
    /// The AgentProfile that runs the agent.
    #[arg(long)]
    agent: Option<String>,
    /// LXD image alias or fingerprint (default from the server's config).
    #[arg(long)]
    image: Option<String>,
    /// The agent's task.
    #[arg(long)]
    brief: Option<String>,
    /// Memory limit, e.g. `4GiB` (spec.resources.memory).
    #[arg(long)]
    memory: Option<String>,
    /// CPU limit, e.g. `2` (spec.resources.cpu).
    #[arg(long)]
    cpu: Option<String>,
    /// Repository cloned into /workspace once (spec.repo.url), e.g. `file:///srv/app.git`.
    #[arg(long)]
    repo: Option<String>,
    /// The branch of --repo to check out (spec.repo.branch).
    #[arg(long, requires = "repo")]
    branch: Option<String>,
    /// Wait until the project is Ready, printing each step.
    #[arg(long)]
    wait: bool,
    /// How long --wait waits.
    #[arg(long, default_value = "5m", value_parser = super::duration::parse)]
    timeout: std::time::Duration,
    /// A label, `KEY=VALUE` (repeatable).
    #[arg(short = 'l', long = "label", value_parser = parse_label, value_name = "KEY=VALUE")]
    labels: Vec<(String, String)>,
    /// Print the created object (yaml, json) or its reference (name).
    #[arg(short = 'o', long = "output", value_enum)]
    output: Option<render::OutputFormat>,
}

fn parse_label(text: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((key, value)) if !key.is_empty() => Ok((key.to_string(), value.to_string())),
        _ => Err(format!("{text:?}: expected KEY=VALUE")),
    }
}

pub async fn run(context: &Context, args: CreateArgs) -> anyhow::Result<ExitCode> {
    match args.kind {
        CreateKind::Project(args) => create_project(context, args).await,
    }
}

async fn create_project(context: &Context, args: CreateProjectArgs) -> anyhow::Result<ExitCode> {
    let display_name = args.display_name.trim();
    if display_name.is_empty() {
        anyhow::bail!("DISPLAY_NAME: must not be empty");
    }
    if berth_api::slugify(display_name).is_none() {
        anyhow::bail!(
            "DISPLAY_NAME: {display_name:?} has no letters or digits to derive a name from"
        );
    }
    let client = context.client()?;

    let mut spec = Map::new();
    spec.insert("displayName".into(), json!(display_name));
    for (key, value) in [
        ("agent", &args.agent),
        ("image", &args.image),
        ("brief", &args.brief),
    ] {
        if let Some(value) = value {
            spec.insert(key.into(), json!(value));
        }
    }
    let mut resources = Map::new();
    for (key, value) in [("memory", &args.memory), ("cpu", &args.cpu)] {
        if let Some(value) = value {
            resources.insert(key.into(), json!(value));
        }
    }
    if !resources.is_empty() {
        spec.insert("resources".into(), Value::Object(resources));
    }
    if let Some(url) = &args.repo {
        let mut repo = json!({"url": url});
        if let Some(branch) = &args.branch {
            repo["branch"] = json!(branch);
        }
        spec.insert("repo".into(), repo);
    }
    let labels: BTreeMap<String, String> = args.labels.into_iter().collect();

    // The server derives the name (the slug, or the next free `-N`), so two creates of one
    // display name never race each other to the same name.
    let mut metadata = json!({ "generateName": display_name });
    if !labels.is_empty() {
        metadata["labels"] = json!(labels);
    }
    let object = json!({
        "apiVersion": berth_api::API_VERSION,
        "kind": "Project",
        "metadata": metadata,
        "spec": spec,
    });
    let created = client.create(Kind::Project, &object).await?;
    let name = name_of(&created).to_string();
    match args.output {
        Some(render::OutputFormat::Yaml) => print!("{}", render::to_yaml(&created)),
        Some(render::OutputFormat::Json) => print!("{}", render::to_json(&created)),
        Some(render::OutputFormat::Name) => println!("project/{name}"),
        _ => println!("project/{name} created"),
    }
    if args.wait {
        let target = [(Kind::Project, name.clone())];
        let print = args.output.is_none();
        let reached =
            progress::wait_for(&client, &target, Goal::Ready, args.timeout, print).await?;
        if print {
            println!("project/{name} {}", reached.word(&target[0]));
        }
    }
    Ok(ExitCode::SUCCESS)
}
