//! `berth trash list [--all] [-o json|yaml]`: the projects deletions put in the trash, and the
//! containers replacements put there, newest last, with when they expire
//! (`GET /apis/berth.dev/v1alpha1/trash[?all=true]`, admins; `--all` adds the entries of every
//! other controller id sharing the pool, as a lost store leaves them). `berth trash cp
//! ITEM:PATH LOCALPATH` copies a file out of a trashed container (`GET
//! .../trash/ITEM/files?path=PATH`). `berth trash purge` trusts the daemon's clock again after
//! a jump paused the purge, and purges what expired (`POST .../trash/purge`).

use std::process::ExitCode;

use chrono::{DateTime, Utc};
use clap::{Args, Subcommand};
use reqwest::Method;

use super::Context;
use super::render::{self, OutputFormat};
use super::table::Table;
use crate::client::API_PREFIX;
use crate::trash::TrashItem;

#[derive(Debug, Args)]
pub struct TrashArgs {
    #[command(subcommand)]
    command: TrashCommand,
}

#[derive(Debug, Subcommand)]
enum TrashCommand {
    /// List the trash: NAME, UID, KIND, DELETED, BY, REASON, EXPIRES, SIZE.
    List {
        /// Also the entries of other controller ids sharing the storage pool (a store that was
        /// lost left its entries under its old id); adds a CONTROLLER column.
        #[arg(long)]
        all: bool,
        /// Output format (yaml or json print the TrashList as the server returns it).
        #[arg(short = 'o', long = "output", value_enum)]
        output: Option<OutputFormat>,
    },
    /// Purge what expired now, trusting the daemon's wall clock as it reads (ends the pause a
    /// clock jump of more than an hour put on the purge).
    Purge,
    /// Copy a file out of a trashed container: ITEM:PATH (ITEM as `trash list` shows it, PATH
    /// absolute inside the container) to LOCALPATH (a file, or a directory to copy into).
    Cp {
        source: String,
        local: std::path::PathBuf,
    },
}

pub async fn run(context: &Context, args: TrashArgs) -> anyhow::Result<ExitCode> {
    let (all, output) = match args.command {
        TrashCommand::List { all, output } => (all, output),
        TrashCommand::Cp { source, local } => return copy(context, &source, &local).await,
        TrashCommand::Purge => return purge(context).await,
    };
    let client = context.client()?;
    let query: &[(&str, &str)] = if all { &[("all", "true")] } else { &[] };
    let list = client
        .get_json(&format!("{API_PREFIX}/trash"), query)
        .await?;
    if let Some(paused) = list.get("purgePaused").and_then(serde_json::Value::as_str) {
        eprintln!("Purging is paused: {paused}.");
    }
    match output {
        Some(OutputFormat::Yaml) => print!("{}", render::to_yaml(&list)),
        Some(OutputFormat::Json) => print!("{}", render::to_json(&list)),
        _ => {
            let items: Vec<TrashItem> = list
                .get("items")
                .cloned()
                .map(serde_json::from_value)
                .transpose()?
                .unwrap_or_default();
            if items.is_empty() {
                eprintln!("The trash is empty.");
                return Ok(ExitCode::SUCCESS);
            }
            print!("{}", trash_table(&items, Utc::now(), all));
        }
    }
    Ok(ExitCode::SUCCESS)
}

async fn purge(context: &Context) -> anyhow::Result<ExitCode> {
    let client = context.client()?;
    let answer = client
        .request_json(Method::POST, &format!("{API_PREFIX}/trash/purge"), None)
        .await?;
    let purged: Vec<&str> = answer
        .get("purged")
        .and_then(serde_json::Value::as_array)
        .map(|uids| uids.iter().filter_map(serde_json::Value::as_str).collect())
        .unwrap_or_default();
    if purged.is_empty() {
        println!("Nothing in the trash had expired; purging runs on the daemon's clock again.");
    }
    for uid in purged {
        println!("purged {uid}");
    }
    Ok(ExitCode::SUCCESS)
}

/// `ITEM:PATH` split in two; the path must be absolute.
fn item_and_path(source: &str) -> anyhow::Result<(&str, &str)> {
    match source.split_once(':') {
        Some((item, path)) if !item.is_empty() && path.starts_with('/') => Ok((item, path)),
        _ => anyhow::bail!(
            "source: {source:?} is not ITEM:PATH with an absolute PATH (for example u-1-ct-1:/root/notes.txt)"
        ),
    }
}

async fn copy(
    context: &Context,
    source: &str,
    local: &std::path::Path,
) -> anyhow::Result<ExitCode> {
    use base64::Engine;
    let (item, path) = item_and_path(source)?;
    let client = context.client()?;
    let answer = client
        .get_json(
            &format!(
                "{API_PREFIX}/trash/{}/files",
                crate::client::encode_segment(item)
            ),
            &[("path", path)],
        )
        .await?;
    let content = answer
        .get("content")
        .and_then(serde_json::Value::as_str)
        .ok_or_else(|| anyhow::anyhow!("the server's answer carries no content"))?;
    let bytes = base64::engine::general_purpose::STANDARD.decode(content)?;
    let target = if local.is_dir() {
        let file = path
            .rsplit('/')
            .next()
            .filter(|f| !f.is_empty())
            .unwrap_or("file");
        local.join(file)
    } else {
        local.to_path_buf()
    };
    std::fs::write(&target, &bytes)
        .map_err(|e| anyhow::anyhow!("LOCALPATH: {}: {e}", target.display()))?;
    println!(
        "{item}:{path} -> {} ({} bytes)",
        target.display(),
        bytes.len()
    );
    Ok(ExitCode::SUCCESS)
}

fn trash_table(items: &[TrashItem], now: DateTime<Utc>, controllers: bool) -> String {
    let mut columns = vec![
        "name", "uid", "kind", "deleted", "by", "reason", "expires", "size",
    ];
    if controllers {
        columns.push("controller");
    }
    let mut table = Table::new(columns);
    for item in items {
        let deleted = item.deleted_at.map_or("-".to_string(), |at| {
            format!(
                "{} ago",
                super::duration::human_age((now - at).num_seconds().max(0))
            )
        });
        let expires = item.expires_at.map_or("never".to_string(), |at| {
            let secs = (at - now).num_seconds();
            if secs <= 0 {
                "due".to_string()
            } else {
                format!("in {}", super::duration::human_age(secs))
            }
        });
        let size = if item.bytes == 0 {
            "-".to_string()
        } else {
            bytes(item.bytes)
        };
        let mut row = vec![
            item.name.clone(),
            item.uid.clone(),
            item.kind.clone(),
            deleted,
            item.deleted_by.clone(),
            item.reason.clone(),
            expires,
            size,
        ];
        if controllers {
            row.push(item.controller.clone());
        }
        table.row(row);
    }
    table.render()
}

/// Bytes in binary units, one decimal.
fn bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = n as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{n}B")
    } else {
        format!("{value:.1}{}", UNITS[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_shows_age_expiry_and_size() {
        let now: DateTime<Utc> = "2026-01-10T00:00:00Z".parse().unwrap();
        let items = vec![TrashItem {
            uid: "u-1".into(),
            name: "pay".into(),
            kind: "project".into(),
            controller: "c-1".into(),
            deleted_at: Some("2026-01-09T00:00:00Z".parse().unwrap()),
            trashed_at: Some("2026-01-09T00:00:00Z".parse().unwrap()),
            deleted_by: "unix:root".into(),
            reason: "forced".into(),
            expires_at: Some("2026-01-16T00:00:00Z".parse().unwrap()),
            bytes: 3 << 20,
        }];
        let text = trash_table(&items, now, true);
        let row = text.lines().nth(1).unwrap();
        for cell in [
            "pay",
            "u-1",
            "project",
            "c-1",
            "24h ago",
            "unix:root",
            "forced",
            "in 6d",
            "3.0MiB",
        ] {
            assert!(row.contains(cell), "{cell} in {row:?}");
        }
        assert_eq!(bytes(0), "0B");
        assert_eq!(bytes(1536), "1.5KiB");
    }

    #[test]
    fn a_source_is_an_item_and_an_absolute_path() {
        assert_eq!(
            item_and_path("u-1-ct-2:/root/wt/a.txt").unwrap(),
            ("u-1-ct-2", "/root/wt/a.txt")
        );
        for bad in ["u-1-ct-2", "u-1-ct-2:rel", ":/x"] {
            let e = item_and_path(bad).unwrap_err().to_string();
            assert!(e.starts_with("source:"), "{e}");
        }
    }
}
