//! `berth wait KIND/NAME --for=condition=Ready|--for=delete|--for=jsonpath={.path}=VALUE
//! --timeout=5m`, printing each step while it waits.

use std::process::ExitCode;

use berth_api::Kind;
use clap::Args;

use super::progress::{self, Goal};
use super::{Context, duration};

#[derive(Debug, Args)]
pub struct WaitArgs {
    /// `project/NAME`, or `project NAME`.
    #[arg(required = true, num_args = 1..=2, value_name = "KIND/NAME")]
    object: Vec<String>,
    /// `condition=TYPE[=STATUS]` (STATUS defaults to True), `delete`, or
    /// `jsonpath={.status.agent.state}=VALUE` (what `-o jsonpath` would print).
    #[arg(
        long = "for",
        value_parser = parse_goal,
        value_name = "condition=TYPE|delete|jsonpath={PATH}=VALUE"
    )]
    for_: Goal,
    /// Give up after this long (exit 1).
    #[arg(long, default_value = "5m", value_parser = duration::parse)]
    timeout: std::time::Duration,
}

pub fn parse_goal(text: &str) -> Result<Goal, String> {
    if text == "delete" {
        return Ok(Goal::Deleted);
    }
    if let Some(rest) = text.strip_prefix("jsonpath=") {
        return parse_jsonpath_goal(rest);
    }
    let Some(rest) = text.strip_prefix("condition=") else {
        return Err(format!(
            "{text:?}: expected condition=TYPE[=STATUS], jsonpath={{PATH}}=VALUE or delete"
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

/// `{.status.phase}=Ready`, as kubectl takes it: the template up to its last `}`, then `=VALUE`.
fn parse_jsonpath_goal(text: &str) -> Result<Goal, String> {
    let expected = || format!("jsonpath={text:?}: expected jsonpath={{PATH}}=VALUE");
    let close = text.rfind('}').ok_or_else(expected)?;
    let (expression, rest) = text.split_at(close + 1);
    let value = rest.strip_prefix('=').ok_or_else(expected)?;
    if !expression.starts_with('{') || value.is_empty() {
        return Err(expected());
    }
    let template = super::jsonpath::Template::parse(expression)?;
    Ok(Goal::JsonPath {
        expression: expression.to_string(),
        template,
        value: value.to_string(),
    })
}

/// `project/NAME` or `project NAME`.
pub fn parse_object(words: &[String]) -> Result<(Kind, String), String> {
    let (kind, name) = match words {
        [single] => single
            .split_once('/')
            .ok_or_else(|| format!("{single:?}: expected KIND/NAME, e.g. project/payments-api"))?,
        [kind, name] => (kind.as_str(), name.as_str()),
        _ => return Err("expected KIND/NAME".to_string()),
    };
    let resource = Kind::from_cli(kind).map_err(|err| err.to_string())?;
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
    if args.for_ == Goal::Deleted && resource == Kind::Project {
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
        Goal::Deleted => println!("{}/{name} deleted", resource.singular()),
        _ => println!("{}/{name} condition met", resource.singular()),
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
        let Ok(Goal::JsonPath {
            expression,
            template,
            value,
        }) = parse_goal("jsonpath={.status.agent.state}=blocked")
        else {
            panic!("a jsonpath goal")
        };
        assert_eq!(
            (expression.as_str(), value.as_str()),
            ("{.status.agent.state}", "blocked")
        );
        let object = serde_json::json!({"status": {"agent": {"state": "blocked"}}});
        assert_eq!(template.render(&object), "blocked");
        for bad in [
            "jsonpath=",
            "jsonpath={.a}",
            "jsonpath={.a}=",
            "jsonpath=.a=b",
        ] {
            assert!(parse_goal(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn objects() {
        let words = |w: &[&str]| w.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            parse_object(&words(&["project/a"])),
            Ok((Kind::Project, "a".to_string()))
        );
        assert_eq!(
            parse_object(&words(&["gitsources", "b"])),
            Ok((Kind::GitSource, "b".to_string()))
        );
        assert!(parse_object(&words(&["a"])).is_err());
        assert!(parse_object(&words(&["widget/a"])).is_err());
    }
}
