//! `berth apply`: every document in one all-or-nothing call, printed like kubectl.

use std::process::ExitCode;

use clap::Args;

use super::manifest::{self, Manifest};
use super::progress::{self, Goal};
use super::{Context, duration};
use crate::client::{ApiStatus, ApplyOptions, ClientError, Resource};

#[derive(Debug, Args)]
pub struct ApplyArgs {
    /// Manifest file, directory, or `-` for stdin (repeatable).
    #[arg(
        short = 'f',
        long = "filename",
        required = true,
        value_name = "FILE|DIR|-"
    )]
    files: Vec<String>,
    /// Read directories recursively.
    #[arg(short = 'R', long)]
    recursive: bool,
    /// Validate and show what would change, writing nothing.
    #[arg(long)]
    dry_run: bool,
    /// Delete objects that were in the applyset's previous inventory and are not in this one.
    #[arg(long, requires = "applyset")]
    prune: bool,
    /// Name of the set of objects these manifests make up (recorded server-side).
    #[arg(long, value_name = "NAME")]
    applyset: Option<String>,
    /// Wait until every object is Ready (or Stopped) for its current generation.
    #[arg(long)]
    wait: bool,
    /// How long --wait waits.
    #[arg(long, default_value = "5m", value_parser = duration::parse)]
    timeout: std::time::Duration,
}

pub async fn run(context: &Context, args: ApplyArgs) -> anyhow::Result<ExitCode> {
    let manifests = manifest::load(&args.files, args.recursive)?;
    let client = context.client()?;
    let options = ApplyOptions {
        dry_run: args.dry_run,
        applyset: args.applyset.map(|name| (name, args.prune)),
    };
    let items = manifests.iter().map(|m| m.object.clone()).collect();
    let outcomes = client
        .apply(items, &options)
        .await
        .map_err(|err| locate_errors(err, &manifests))?;

    let suffix = if args.dry_run { " (dry run)" } else { "" };
    let mut targets = Vec::new();
    let mut pruned = Vec::new();
    for outcome in &outcomes {
        let resource = Resource::from_kind(&outcome.kind);
        let label =
            resource.map_or_else(|| outcome.kind.to_lowercase(), |r| r.singular().to_string());
        // A prune is only asked for here: a project holding unsaved work is kept, so its line
        // waits until the deletion ends or is held.
        if outcome.action == "pruned"
            && !args.dry_run
            && let Some(resource) = resource
        {
            pruned.push((resource, outcome.name.clone()));
            continue;
        }
        println!("{label}/{} {}{suffix}", outcome.name, outcome.action);
        if let Some(resource) = resource
            && outcome.action != "pruned"
            && outcome.action != "deleted"
        {
            targets.push((resource, outcome.name.clone()));
        }
    }
    let mut held = 0;
    for target in &pruned {
        let (resource, name) = target;
        match progress::wait_for(
            &client,
            std::slice::from_ref(target),
            Goal::Deleted,
            args.timeout,
            false,
        )
        .await
        {
            Ok(()) => println!("{}/{name} pruned", resource.singular()),
            Err(progress::WaitError::Failed { message, .. }) => {
                held += 1;
                println!(
                    "{}/{name} prune held, not deleted: {message}",
                    resource.singular()
                );
            }
            Err(e) => return Err(e.into()),
        }
    }

    if args.wait && !args.dry_run && !targets.is_empty() {
        progress::wait_for(&client, &targets, Goal::Ready, args.timeout, true).await?;
        for (resource, name) in &targets {
            println!("{resource}/{name} ready");
        }
    }
    if held > 0 {
        anyhow::bail!(
            "{held} pruned object(s) held: their deletion waits until the work is saved, or berth delete --force"
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// Points a server's `items[N]...` field paths back at the file and document they came from.
fn locate_errors(err: ClientError, manifests: &[Manifest]) -> ClientError {
    let ClientError::Api(status) = err else {
        return err;
    };
    let mut message = status.headline().to_string();
    if let Some(located) = locate_prefix(&message, manifests) {
        message = located;
    }
    let causes = status
        .causes
        .iter()
        .map(|cause| {
            let mut cause = cause.clone();
            if let Some(located) = manifest::locate_field(manifests, &cause.field) {
                cause.field = located;
            }
            cause
        })
        .collect();
    ClientError::Api(ApiStatus {
        message,
        causes,
        ..status
    })
}

/// A message that starts with `items[N]` gets the same treatment as a cause's field.
fn locate_prefix(message: &str, manifests: &[Manifest]) -> Option<String> {
    if !message.starts_with("items[") {
        return None;
    }
    let end = message.find([':', ' ']).unwrap_or(message.len());
    let located = manifest::locate_field(manifests, &message[..end])?;
    Some(format!("{located}{}", &message[end..]))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::StatusCause;

    #[test]
    fn server_errors_name_the_document() {
        let manifests = manifest::parse_documents(
            "app.yaml",
            "kind: Project\nmetadata: {name: a}\n---\nkind: Project\nmetadata: {name: b}\n",
        )
        .unwrap();
        let err = ClientError::Api(ApiStatus {
            code: 422,
            reason: "Invalid".to_string(),
            message: "items[1].spec.imagee: unknown field".to_string(),
            causes: vec![StatusCause {
                field: "items[1].spec.imagee".to_string(),
                message: "unknown field".to_string(),
            }],
        });
        let located = locate_errors(err, &manifests).to_string();
        assert_eq!(
            located,
            "Error from server (Invalid): app.yaml: document 2 (project/b): spec.imagee: unknown field"
        );

        let err = ClientError::Api(ApiStatus {
            code: 422,
            reason: "Invalid".to_string(),
            message: "List is invalid: items[0].specc: unknown field; items[1].kind: required"
                .to_string(),
            causes: vec![
                StatusCause {
                    field: "items[0].specc".to_string(),
                    message: "unknown field".to_string(),
                },
                StatusCause {
                    field: "items[1].kind".to_string(),
                    message: "required".to_string(),
                },
            ],
        });
        assert_eq!(
            locate_errors(err, &manifests).to_string(),
            "Error from server (Invalid): List is invalid\n  \
             app.yaml: document 1 (project/a): specc: unknown field\n  \
             app.yaml: document 2 (project/b): kind: required"
        );
    }
}
