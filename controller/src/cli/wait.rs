//! `berth wait KIND/NAME --for=condition=Ready|--for=delete --timeout=5m`, printing each step
//! while it waits.

use std::process::ExitCode;

use clap::Args;

use super::progress::{self, Goal};
use super::{Context, duration};
use crate::client::Resource;

#[derive(Debug, Args)]
pub struct WaitArgs {
    /// `project/NAME`, or `project NAME`.
    #[arg(required = true, num_args = 1..=2, value_name = "KIND/NAME")]
    object: Vec<String>,
    /// `condition=TYPE[=STATUS]` (STATUS defaults to True), or `delete`.
    #[arg(long = "for", value_parser = parse_goal, value_name = "condition=TYPE|delete")]
    for_: Goal,
    /// Give up after this long (exit 1).
    #[arg(long, default_value = "5m", value_parser = duration::parse)]
    timeout: std::time::Duration,
}

pub fn parse_goal(text: &str) -> Result<Goal, String> {
    if text == "delete" {
        return Ok(Goal::Deleted);
    }
    let Some(rest) = text.strip_prefix("condition=") else {
        return Err(format!(
            "{text:?}: expected condition=TYPE[=STATUS] or delete"
        ));
    };
    let (type_, status) = match rest.split_once('=') {
        Some((type_, status)) => (type_, status),
        None => (rest, "True"),
    };
    if type_.is_empty() || status.is_empty() {
        return Err(format!(
            "{text:?}: expected condition=TYPE[=STATUS] or delete"
        ));
    }
    let status = match status.to_ascii_lowercase().as_str() {
        "true" => "True",
        "false" => "False",
        "unknown" => "Unknown",
        _ => {
            return Err(format!(
                "{text:?}: a condition status is True, False or Unknown"
            ));
        }
    };
    Ok(Goal::Condition {
        type_: type_.to_string(),
        status: status.to_string(),
    })
}

/// `project/NAME` or `project NAME`.
pub fn parse_object(words: &[String]) -> Result<(Resource, String), String> {
    let (kind, name) = match words {
        [single] => single
            .split_once('/')
            .ok_or_else(|| format!("{single:?}: expected KIND/NAME, e.g. project/payments-api"))?,
        [kind, name] => (kind.as_str(), name.as_str()),
        _ => return Err("expected KIND/NAME".to_string()),
    };
    let resource = Resource::from_cli(kind).ok_or_else(|| {
        format!("unknown kind {kind:?} (expected project, agentprofile or gitsource)")
    })?;
    if name.is_empty() {
        return Err("expected KIND/NAME with a name".to_string());
    }
    Ok((resource, name.to_string()))
}

pub async fn run(context: &Context, args: WaitArgs) -> anyhow::Result<ExitCode> {
    let (resource, name) = parse_object(&args.object).map_err(anyhow::Error::msg)?;
    let client = context.client()?;
    if args.for_ != Goal::Deleted {
        // Waiting on an object that does not exist would only ever time out.
        client.get(resource, &name).await?;
    }
    if args.for_ == Goal::Deleted && resource == Resource::Project {
        // A held deletion is looked at again now, so the wait reads a fresh answer; a project
        // not being deleted (409) or gone (404) needs no look.
        match client.request_look(&name).await {
            Ok(_) => {}
            Err(err) if err.is_not_found() || err.is_conflict() => {}
            Err(err) => return Err(err.into()),
        }
    }
    let target = [(resource, name.clone())];
    progress::wait_for(&client, &target, args.for_.clone(), args.timeout, true).await?;
    match args.for_ {
        Goal::Deleted => println!("{resource}/{name} deleted"),
        _ => println!("{resource}/{name} condition met"),
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn goals() {
        let cond = |t: &str, s: &str| {
            Ok(Goal::Condition {
                type_: t.to_string(),
                status: s.to_string(),
            })
        };
        assert_eq!(parse_goal("condition=Ready"), cond("Ready", "True"));
        assert_eq!(parse_goal("condition=Ready=false"), cond("Ready", "False"));
        assert_eq!(parse_goal("delete"), Ok(Goal::Deleted));
        assert!(parse_goal("ready").is_err());
        assert!(parse_goal("condition=").is_err());
        assert!(parse_goal("condition=Ready=maybe").is_err());
    }

    #[test]
    fn objects() {
        let words = |w: &[&str]| w.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            parse_object(&words(&["project/a"])),
            Ok((Resource::Project, "a".to_string()))
        );
        assert_eq!(
            parse_object(&words(&["gitsources", "b"])),
            Ok((Resource::GitSource, "b".to_string()))
        );
        assert!(parse_object(&words(&["a"])).is_err());
        assert!(parse_object(&words(&["widget/a"])).is_err());
    }
}
