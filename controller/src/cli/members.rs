//! `berth members list|add|remove`: who may see and change a project.

use std::process::ExitCode;

use clap::{Args, Subcommand};
use reqwest::Method;

use super::Context;
use crate::client::{API_PREFIX, encode_segment};

#[derive(Debug, Args)]
pub struct MembersArgs {
    #[command(subcommand)]
    command: MembersCommand,
}

#[derive(Debug, Subcommand)]
enum MembersCommand {
    /// List a project's members.
    List { project: String },
    /// Make a user (or a local user, unix:NAME) a member of a project.
    Add { project: String, user: String },
    /// Remove a member; only an admin may remove the last one.
    Remove { project: String, user: String },
}

fn path(project: &str, user: Option<&str>) -> String {
    let base = format!("{API_PREFIX}/projects/{}/members", encode_segment(project));
    match user {
        Some(user) => format!("{base}/{}", encode_segment(user)),
        None => base,
    }
}

pub async fn run(context: &Context, args: MembersArgs) -> anyhow::Result<ExitCode> {
    let client = context.client()?;
    match args.command {
        MembersCommand::List { project } => {
            let list = client
                .request_json(Method::GET, &path(&project, None), None)
                .await?;
            for item in list["items"].as_array().into_iter().flatten() {
                println!("{}", item["name"].as_str().unwrap_or_default());
            }
        }
        MembersCommand::Add { project, user } => {
            client
                .request_json(Method::PUT, &path(&project, Some(&user)), None)
                .await?;
            println!("{user} is a member of project {project}");
        }
        MembersCommand::Remove { project, user } => {
            client
                .request_json(Method::DELETE, &path(&project, Some(&user)), None)
                .await?;
            println!("{user} is no longer a member of project {project}");
        }
    }
    Ok(ExitCode::SUCCESS)
}
