//! `berth get KIND [NAME]`: tables aligned like kubectl's, or the objects as YAML, JSON or names.

use std::process::ExitCode;

use clap::Args;
use serde_json::Value;

use super::Context;
use super::render::{self, OutputFormat, name_of};
use crate::client::Resource;

#[derive(Debug, Args)]
pub struct GetArgs {
    /// project(s), agentprofile(s) or gitsource(s) (or proj, ap, gs); or KIND/NAME.
    #[arg(value_name = "KIND|KIND/NAME")]
    kind: String,
    /// One or more objects (NAME, or KIND/NAME after one); all of them when omitted.
    names: Vec<String>,
    /// Label selector, e.g. `team=payments,tier!=dev` or `team in (payments,infra),!canary`.
    #[arg(short = 'l', long = "selector", value_name = "SELECTOR")]
    selector: Option<String>,
    /// Output format.
    #[arg(short = 'o', long = "output", value_enum)]
    output: Option<OutputFormat>,
}

/// Accepts `project`, `projects`, `Project`, `proj`, and the same for every kind.
pub fn parse_resource(word: &str) -> Result<Resource, String> {
    Resource::from_cli(word).ok_or_else(|| {
        format!("unknown kind {word:?} (expected project, agentprofile or gitsource)")
    })
}

/// `KIND [NAME...]` or `KIND/NAME...` of one kind: the kind, and the names (none for all).
pub fn kind_and_names(first: &str, rest: &[String]) -> Result<(Resource, Vec<String>), String> {
    if !first.contains('/') && rest.is_empty() {
        return Ok((parse_resource(first)?, Vec::new()));
    }
    let words: Vec<String> = std::iter::once(first.to_string())
        .chain(rest.iter().cloned())
        .collect();
    let objects = parse_objects(&words)?;
    let kind = objects[0].0;
    if objects.iter().any(|(k, _)| *k != kind) {
        return Err("give objects of one kind at a time".to_string());
    }
    Ok((kind, objects.into_iter().map(|(_, name)| name).collect()))
}

/// The objects a command names, as kubectl takes them: `KIND NAME...` or `KIND/NAME...` (what
/// `-o name` prints), never a mix.
pub fn parse_objects(words: &[String]) -> Result<Vec<(Resource, String)>, String> {
    let Some(first) = words.first() else {
        return Ok(Vec::new());
    };
    if !first.contains('/') {
        let kind = parse_resource(first)?;
        return words[1..]
            .iter()
            .map(|name| match name.contains('/') {
                true => Err(format!(
                    "{name:?}: give either KIND NAME... or KIND/NAME..., not both"
                )),
                false => Ok((kind, name.clone())),
            })
            .collect();
    }
    words
        .iter()
        .map(|word| {
            let (kind, name) = word
                .split_once('/')
                .ok_or_else(|| format!("{word:?}: expected KIND/NAME, as the others are"))?;
            if name.is_empty() || name.contains('/') {
                return Err(format!("{word:?}: expected KIND/NAME"));
            }
            Ok((parse_resource(kind)?, name.to_string()))
        })
        .collect()
}

pub async fn run(context: &Context, args: GetArgs) -> anyhow::Result<ExitCode> {
    let client = context.client()?;
    // Like kubectl: with several names, those found are printed and each missing one gets an
    // error line of its own.
    let mut missing = Vec::new();
    let (kind, names) = kind_and_names(&args.kind, &args.names).map_err(anyhow::Error::msg)?;
    let (objects, list) = match names.as_slice() {
        [name] => {
            let object = client.get(kind, name).await?;
            (vec![object.clone()], object)
        }
        [_, _, ..] => {
            let mut objects = Vec::with_capacity(names.len());
            for name in &names {
                match client.get(kind, name).await {
                    Ok(object) => objects.push(object),
                    Err(err) if err.is_not_found() => missing.push(err),
                    Err(err) => return Err(err.into()),
                }
            }
            let list = serde_json::json!({"apiVersion": "v1", "kind": "List", "items": objects});
            (objects, list)
        }
        [] => {
            let list = client.list(kind, args.selector.as_deref()).await?;
            let items = list
                .get("items")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
            (items, list)
        }
    };
    match args.output {
        Some(OutputFormat::Yaml) => print!("{}", render::to_yaml(&list)),
        Some(OutputFormat::Json) => print!("{}", render::to_json(&list)),
        Some(OutputFormat::Name) => {
            for object in &objects {
                println!("{}/{}", kind, name_of(object));
            }
        }
        format @ (None | Some(OutputFormat::Wide)) => {
            if objects.is_empty() {
                if missing.is_empty() {
                    eprintln!("No resources found.");
                }
            } else {
                let wide = format == Some(OutputFormat::Wide);
                print!(
                    "{}",
                    render::table(kind, &objects, wide, chrono::Utc::now()).render()
                );
            }
        }
    }
    for err in &missing {
        eprintln!("{err}");
    }
    Ok(if missing.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(text: &str) -> Vec<String> {
        text.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn objects_are_named_as_kubectl_names_them() {
        let p = |name: &str| (Resource::Project, name.to_string());
        assert_eq!(
            parse_objects(&words("project a b")).unwrap(),
            [p("a"), p("b")]
        );
        assert_eq!(
            parse_objects(&words("proj/a projects/b")).unwrap(),
            [p("a"), p("b")]
        );
        assert_eq!(
            parse_objects(&words("gs/x ap/y")).unwrap(),
            [
                (Resource::GitSource, "x".to_string()),
                (Resource::AgentProfile, "y".to_string())
            ]
        );
        for bad in ["project a/b", "project/a b", "pod/a", "project/"] {
            assert!(parse_objects(&words(bad)).is_err(), "{bad}");
        }
        assert_eq!(
            kind_and_names("project/a", &words("project/b")).unwrap(),
            (Resource::Project, words("a b"))
        );
        assert_eq!(
            kind_and_names("proj", &[]).unwrap(),
            (Resource::Project, Vec::new())
        );
        assert!(kind_and_names("project/a", &words("gs/b")).is_err());
    }
}
