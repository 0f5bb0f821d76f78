//! `berth gitsource secret set|list|delete`: the credentials a GitSource's `spec.secretRef`
//! names (admins only). `set` reads the value from stdin or `--from-file`, never from the
//! command line, where shell history and `ps` would keep it. A change asks the GitSource of that
//! name to sync at once (`berth.dev/requestedAt`), so new credentials are tried now.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::{Args, Subcommand};
use reqwest::Method;

use super::Context;
use super::table::Table;
use crate::client::{API_PREFIX, Client, Resource, encode_segment};
use crate::gitops::CREDENTIAL_KEYS;

#[derive(Debug, Args)]
pub struct GitSourceArgs {
    #[command(subcommand)]
    command: GitSourceCommand,
}

#[derive(Debug, Subcommand)]
enum GitSourceCommand {
    /// Set, list or delete the credentials of a GitSource.
    Secret {
        #[command(subcommand)]
        command: SecretCommand,
    },
}

#[derive(Debug, Subcommand)]
enum SecretCommand {
    /// Set a credential from stdin (one trailing newline dropped) or --from-file.
    Set {
        /// The GitSource (the name its spec.secretRef gives).
        gitsource: String,
        /// `username`, and `password` or `token`.
        #[arg(value_parser = CREDENTIAL_KEYS)]
        key: String,
        /// Read the value from this file instead of stdin.
        #[arg(long, value_name = "FILE")]
        from_file: Option<PathBuf>,
    },
    /// List a GitSource's credential keys and when each changed; never the values.
    List {
        /// The GitSource.
        gitsource: String,
    },
    /// Delete a credential.
    Delete {
        /// The GitSource.
        gitsource: String,
        #[arg(value_parser = CREDENTIAL_KEYS)]
        key: String,
    },
}

fn path(gitsource: &str, key: Option<&str>) -> String {
    let base = format!(
        "{API_PREFIX}/gitsources/{}/secrets",
        encode_segment(gitsource)
    );
    match key {
        Some(key) => format!("{base}/{}", encode_segment(key)),
        None => base,
    }
}

/// Asks the GitSource to sync now. The credential is already changed, so a refusal here (a
/// GitSource whose stored URL still carries credentials takes no write until it drops them)
/// is a warning: the next poll uses the new credential anyway.
async fn request_sync(client: &Client, gitsource: &str) {
    let at = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Nanos, true);
    let patch = serde_json::json!({"metadata": {"annotations": {
        berth_api::annotations::REQUESTED_AT: at,
    }}});
    if let Err(err) = client
        .merge_patch(Resource::GitSource, gitsource, &patch)
        .await
    {
        eprintln!("warning: gitsource/{gitsource} will use it from its next poll: {err}");
    }
}

pub async fn run(context: &Context, args: GitSourceArgs) -> anyhow::Result<ExitCode> {
    let client = context.client()?;
    let GitSourceCommand::Secret { command } = args.command;
    match command {
        SecretCommand::Set {
            gitsource,
            key,
            from_file,
        } => {
            let mut value = match from_file {
                Some(file) => std::fs::read(&file)
                    .with_context(|| format!("--from-file {}", file.display()))?,
                None => super::secret::read_stdin()?,
            };
            // git takes one line: a token file's newline is not part of the token.
            while value.last().is_some_and(|b| matches!(b, b'\n' | b'\r')) {
                value.pop();
            }
            client
                .request_json(
                    Method::PUT,
                    &path(&gitsource, Some(&key)),
                    Some(("application/octet-stream", value)),
                )
                .await?;
            println!("credential {key} set for gitsource/{gitsource}");
            request_sync(&client, &gitsource).await;
        }
        SecretCommand::List { gitsource } => {
            let list = client
                .request_json(Method::GET, &path(&gitsource, None), None)
                .await?;
            let mut table = Table::new(["key", "updated"]);
            for item in list["items"].as_array().into_iter().flatten() {
                table.row(vec![
                    item["key"].as_str().unwrap_or_default().to_string(),
                    item["updateTime"].as_str().unwrap_or_default().to_string(),
                ]);
            }
            print!("{}", table.render());
        }
        SecretCommand::Delete { gitsource, key } => {
            client
                .request_json(Method::DELETE, &path(&gitsource, Some(&key)), None)
                .await?;
            println!("credential {key} deleted from gitsource/{gitsource}");
            request_sync(&client, &gitsource).await;
        }
    }
    Ok(ExitCode::SUCCESS)
}
