//! `berth rename NAME "New display name"`: changes a project's display name (a merge patch of
//! `spec.displayName`). The object's name stays: it is the container's and the volumes' name.
//! Another project holding the display name (case-insensitively) is the server's 409.

use std::process::ExitCode;

use berth_api::Kind;
use clap::Args;
use serde_json::json;

use super::Context;

#[derive(Debug, Args)]
pub struct RenameArgs {
    /// The project.
    project: String,
    /// Its new display name; several words are joined with spaces.
    #[arg(required = true, num_args = 1..)]
    display_name: Vec<String>,
}

pub async fn run(context: &Context, args: RenameArgs) -> anyhow::Result<ExitCode> {
    let display_name = args.display_name.join(" ");
    let display_name = display_name.trim();
    if display_name.is_empty() {
        anyhow::bail!("DISPLAY_NAME: must not be empty");
    }
    let client = context.client()?;
    let patch = json!({ "spec": { "displayName": display_name } });
    client
        .merge_patch(Kind::Project, &args.project, &patch)
        .await?;
    println!("project/{} renamed to {display_name:?}", args.project);
    Ok(ExitCode::SUCCESS)
}
