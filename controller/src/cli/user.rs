//! `berth user add|list|remove`: the users of the TCP listener (admins only). `add` prints the
//! new token once, alone on stdout, so `TOKEN=$(berth user add ana)` works; berth keeps only its
//! hash and cannot show it again.

use std::process::ExitCode;

use clap::{Args, Subcommand};
use reqwest::Method;
use serde_json::json;

use super::Context;
use super::table::Table;
use crate::client::{API_PREFIX, encode_segment};

#[derive(Debug, Args)]
pub struct UserArgs {
    #[command(subcommand)]
    command: UserCommand,
}

#[derive(Debug, Subcommand)]
enum UserCommand {
    /// Add a user and print its token (shown this once).
    Add {
        name: String,
        /// An admin bypasses membership and manages users, profiles and git sources.
        #[arg(long)]
        admin: bool,
    },
    /// List users.
    List,
    /// Remove a user: its token stops working and its memberships go.
    Remove { name: String },
}

pub async fn run(context: &Context, args: UserArgs) -> anyhow::Result<ExitCode> {
    let client = context.client()?;
    let users = format!("{API_PREFIX}/users");
    match args.command {
        UserCommand::Add { name, admin } => {
            berth_api::validate_name(&name)
                .map_err(|message| anyhow::anyhow!("NAME: {message}"))?;
            let body = json!({"name": name, "admin": admin})
                .to_string()
                .into_bytes();
            let added = client
                .request_json(Method::POST, &users, Some(("application/json", body)))
                .await?;
            let token = added["token"]
                .as_str()
                .ok_or_else(|| anyhow::anyhow!("the server returned no token for user {name}"))?;
            eprintln!(
                "user/{name} added{}; its token is shown this once:",
                if admin { " (admin)" } else { "" }
            );
            println!("{token}");
        }
        UserCommand::List => {
            let list = client.request_json(Method::GET, &users, None).await?;
            let mut table = Table::new(["name", "admin", "created"]);
            for item in list["items"].as_array().into_iter().flatten() {
                table.row(vec![
                    item["name"].as_str().unwrap_or_default().to_string(),
                    item["admin"].as_bool().unwrap_or_default().to_string(),
                    item["creationTimestamp"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string(),
                ]);
            }
            print!("{}", table.render());
        }
        UserCommand::Remove { name } => {
            client
                .request_json(
                    Method::DELETE,
                    &format!("{users}/{}", encode_segment(&name)),
                    None,
                )
                .await?;
            println!("user/{name} removed");
        }
    }
    Ok(ExitCode::SUCCESS)
}
