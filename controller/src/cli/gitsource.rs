//! `berth gitsource secret set|list|delete`: the credentials a GitSource's `spec.secretRef`
//! names (admins only). `set` reads the value from stdin or `--from-file`, never from the
//! command line, where shell history and `ps` would keep it. A change asks the GitSource of that
//! name to sync at once (`berth.dev/requestedAt`), so new credentials are tried now.

use std::path::PathBuf;
use std::process::ExitCode;

use berth_api::Kind;
use clap::{Args, Subcommand};
use reqwest::Method;

use super::Context;
use crate::client::Client;
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
    super::secret::secrets_path("gitsources", gitsource, key)
}

/// Asks the GitSource to sync now. The credential is already changed, so a refusal here (a
/// GitSource whose stored URL still carries credentials takes no write until it drops them)
/// is a warning: the next poll uses the new credential anyway.
async fn request_sync(client: &Client, gitsource: &str) {
    let at = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Nanos, true);
    let patch = serde_json::json!({"metadata": {"annotations": {
        berth_api::annotations::REQUESTED_AT: at,
    }}});
    if let Err(err) = client.merge_patch(Kind::GitSource, gitsource, &patch).await {
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
            let mut value = super::secret::read_value(from_file)?;
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
            super::secret::print_keys(&list);
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
