//! `berth secret set|list|delete`: a project's secrets. `set` reads the value from stdin (or
//! `--from-file`), never from the command line, where shell history and `ps` would keep it.

use std::io::{IsTerminal, Read};
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::{Args, Subcommand};
use reqwest::Method;

use super::Context;
use super::table::Table;
use crate::client::{API_PREFIX, encode_segment};

#[derive(Debug, Args)]
pub struct SecretArgs {
    #[command(subcommand)]
    command: SecretCommand,
}

#[derive(Debug, Subcommand)]
enum SecretCommand {
    /// Set a secret from stdin (one trailing newline dropped) or --from-file (taken as is).
    Set {
        /// The project.
        project: String,
        /// An environment variable name, e.g. API_TOKEN.
        key: String,
        /// Read the value from this file instead of stdin.
        #[arg(long, value_name = "FILE")]
        from_file: Option<PathBuf>,
    },
    /// List a project's secret keys and when each changed; never the values.
    List {
        /// The project.
        project: String,
    },
    /// Delete a secret.
    Delete {
        /// The project.
        project: String,
        key: String,
    },
}

fn path(project: &str, key: Option<&str>) -> String {
    secrets_path("projects", project, key)
}

/// `.../PLURAL/NAME/secrets[/KEY]`: where a project's secrets or a GitSource's credentials live.
pub(super) fn secrets_path(plural: &str, name: &str, key: Option<&str>) -> String {
    let base = format!("{API_PREFIX}/{plural}/{}/secrets", encode_segment(name));
    match key {
        Some(key) => format!("{base}/{}", encode_segment(key)),
        None => base,
    }
}

/// The value to set: the file's bytes as they are, or stdin's.
pub(super) fn read_value(from_file: Option<PathBuf>) -> anyhow::Result<Vec<u8>> {
    match from_file {
        Some(file) => {
            std::fs::read(&file).with_context(|| format!("--from-file {}", file.display()))
        }
        None => read_stdin(),
    }
}

/// Prints a `SecretKeyList`: each key and when it changed, never a value.
pub(super) fn print_keys(list: &serde_json::Value) {
    let mut table = Table::new(["key", "updated"]);
    for item in list["items"].as_array().into_iter().flatten() {
        table.row(vec![
            item["key"].as_str().unwrap_or_default().to_string(),
            item["updateTime"].as_str().unwrap_or_default().to_string(),
        ]);
    }
    print!("{}", table.render());
}

pub async fn run(context: &Context, args: SecretArgs) -> anyhow::Result<ExitCode> {
    let client = context.client()?;
    match args.command {
        SecretCommand::Set {
            project,
            key,
            from_file,
        } => {
            berth_api::validate_env_key(&key)
                .map_err(|message| anyhow::anyhow!("KEY: {message}"))?;
            let value = read_value(from_file)?;
            client
                .request_json(
                    Method::PUT,
                    &path(&project, Some(&key)),
                    Some(("application/octet-stream", value)),
                )
                .await?;
            println!("secret/{key} set in project {project}");
        }
        SecretCommand::List { project } => {
            let list = client
                .request_json(Method::GET, &path(&project, None), None)
                .await?;
            print_keys(&list);
        }
        SecretCommand::Delete { project, key } => {
            client
                .request_json(Method::DELETE, &path(&project, Some(&key)), None)
                .await?;
            println!("secret/{key} deleted from project {project}");
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The value from stdin; `echo value | berth secret set` should not store the newline.
pub(super) fn read_stdin() -> anyhow::Result<Vec<u8>> {
    let mut stdin = std::io::stdin();
    if stdin.is_terminal() {
        eprintln!("reading the value from stdin; end it with Ctrl-D");
    }
    let mut value = Vec::new();
    stdin
        .read_to_end(&mut value)
        .context("reading the value from stdin")?;
    if value.ends_with(b"\r\n") {
        value.truncate(value.len() - 2);
    } else if value.ends_with(b"\n") {
        value.truncate(value.len() - 1);
    }
    Ok(value)
}
