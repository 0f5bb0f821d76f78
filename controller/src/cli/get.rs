//! `berth get KIND [NAME]`: tables aligned like kubectl's, or the objects as YAML, JSON or names.

use std::collections::{BTreeMap, HashMap};
use std::process::ExitCode;

use berth_api::Kind;
use clap::Args;
use serde_json::Value;

use super::Context;
use super::colour;
use super::jsonpath::Template;
use super::render::{self, Columns, OutputFormat, name_of};
use super::table::Table;
use crate::api::selector::LabelSelector;

#[derive(Debug, Args)]
pub struct GetArgs {
    /// project(s), agentprofile(s) or gitsource(s) (or proj, ap, gs); or KIND/NAME; or pool
    /// (the warm pool of containers new projects claim).
    #[arg(value_name = "KIND|KIND/NAME", value_parser = kind_word)]
    kind: String,
    /// One or more objects (NAME, or KIND/NAME after one); all of them when omitted.
    names: Vec<String>,
    /// Label selector, e.g. `team=payments,tier!=dev` or `team in (payments,infra),!canary`.
    #[arg(short = 'l', long = "selector", value_name = "SELECTOR")]
    selector: Option<String>,
    /// Output format: wide, yaml, json, name, or jsonpath=TEMPLATE (e.g.
    /// `jsonpath={.status.phase}`).
    #[arg(short = 'o', long = "output", value_parser = parse_output, value_name = "FORMAT")]
    output: Option<GetOutput>,
    /// A LABELS column in tables.
    #[arg(long)]
    show_labels: bool,
    /// After the listing, print each change as it happens, until interrupted.
    #[arg(short = 'w', long)]
    watch: bool,
}

/// What `get -o` prints.
#[derive(Debug, Clone)]
enum GetOutput {
    Format(OutputFormat),
    JsonPath(Template),
}

fn parse_output(word: &str) -> Result<GetOutput, String> {
    if let Some(template) = word.strip_prefix("jsonpath=") {
        return Template::parse(template).map(GetOutput::JsonPath);
    }
    <OutputFormat as clap::ValueEnum>::from_str(word, false)
        .map(GetOutput::Format)
        .map_err(|_| {
            format!("unknown output format {word:?} (expected wide, yaml, json, name or jsonpath=TEMPLATE)")
        })
}

/// Accepts `project`, `projects`, `Project`, `proj`, and the same for every kind.
pub fn parse_kind(word: &str) -> Result<Kind, String> {
    Kind::from_cli(word).map_err(|err| err.to_string())
}

/// What `berth get` takes for the warm pool, which is no kind of object.
const POOL: &str = "pool";

/// `KIND` or `KIND/NAME` of a kind berth knows (or `pool`), checked as the command line is read.
pub fn kind_word(word: &str) -> Result<String, String> {
    if word == POOL {
        return Ok(word.to_string());
    }
    let kind = word.split_once('/').map_or(word, |(kind, _)| kind);
    parse_kind(kind).map(|_| word.to_string())
}

/// `KIND [NAME...]` or `KIND/NAME...` of one kind: the kind, and the names (none for all).
pub fn kind_and_names(first: &str, rest: &[String]) -> Result<(Kind, Vec<String>), String> {
    if !first.contains('/') && rest.is_empty() {
        return Ok((parse_kind(first)?, Vec::new()));
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
pub fn parse_objects(words: &[String]) -> Result<Vec<(Kind, String)>, String> {
    let Some(first) = words.first() else {
        return Ok(Vec::new());
    };
    if !first.contains('/') {
        let kind = parse_kind(first)?;
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
            Ok((parse_kind(kind)?, name.to_string()))
        })
        .collect()
}

pub async fn run(context: &Context, args: GetArgs) -> anyhow::Result<ExitCode> {
    if args.kind == POOL {
        return pool(context, &args).await;
    }
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
    let columns = Columns {
        wide: matches!(args.output, Some(GetOutput::Format(OutputFormat::Wide))),
        labels: args.show_labels,
    };
    let mut shown = coloured(render::table(kind, &objects, columns, chrono::Utc::now()));
    match &args.output {
        Some(GetOutput::Format(OutputFormat::Yaml)) => print!("{}", render::to_yaml(&list)),
        Some(GetOutput::Format(OutputFormat::Json)) => print!("{}", render::to_json(&list)),
        Some(GetOutput::JsonPath(template)) => print!("{}", template.render(&list)),
        Some(GetOutput::Format(OutputFormat::Name)) => {
            for object in &objects {
                println!("{}/{}", kind.singular(), name_of(object));
            }
        }
        None | Some(GetOutput::Format(OutputFormat::Wide)) => {
            if !objects.is_empty() {
                print!("{}", shown.render());
            } else if missing.is_empty() && !args.watch {
                eprintln!("No resources found.");
            }
        }
    }
    for err in &missing {
        eprintln!("{err}");
    }
    if args.watch {
        let seen: HashMap<String, String> = objects
            .iter()
            .map(|o| (name_of(o).to_string(), resource_version(o)))
            .collect();
        watch(context, kind, &names, &args, columns, seen, &mut shown).await?;
    }
    Ok(if missing.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// A table with its phases coloured on a terminal.
fn coloured(table: Table) -> Table {
    table.paint("phase", colour::phase, colour::stdout())
}

fn resource_version(object: &Value) -> String {
    render::str_at(object, "metadata.resourceVersion").to_string()
}

/// `get -w`: each change after the listing, one row (or document, or name) per change, until
/// interrupted or the server ends the watch.
async fn watch(
    context: &Context,
    kind: Kind,
    names: &[String],
    args: &GetArgs,
    columns: Columns,
    mut seen: HashMap<String, String>,
    shown: &mut Table,
) -> anyhow::Result<()> {
    use futures::StreamExt as _;
    use std::io::Write as _;

    let client = context.client()?;
    let selector = match &args.selector {
        Some(s) => Some(LabelSelector::parse(s).map_err(anyhow::Error::msg)?),
        None => None,
    };
    let mut events = client.watch(kind).await?;
    while let Some(event) = events.next().await {
        let event = event?;
        let object = &event.object;
        let name = name_of(object).to_string();
        if !names.is_empty() && !names.contains(&name) {
            continue;
        }
        if let Some(selector) = &selector {
            let labels: BTreeMap<String, String> = render::value_at(object, "metadata.labels")
                .and_then(|l| serde_json::from_value(l.clone()).ok())
                .unwrap_or_default();
            if !selector.matches(&labels) {
                continue;
            }
        }
        // The watch starts with every object as it is: those listed above already show.
        let version = resource_version(object);
        if seen.get(&name) == Some(&version) {
            continue;
        }
        seen.insert(name.clone(), version);
        let text = match &args.output {
            Some(GetOutput::Format(OutputFormat::Yaml)) => {
                format!("---\n{}", render::to_yaml(object))
            }
            Some(GetOutput::Format(OutputFormat::Json)) => render::to_json(object),
            Some(GetOutput::JsonPath(template)) => template.render(object),
            Some(GetOutput::Format(OutputFormat::Name)) => format!("{}/{name}\n", kind.singular()),
            None | Some(GetOutput::Format(OutputFormat::Wide)) => {
                let row = coloured(render::table(
                    kind,
                    std::slice::from_ref(object),
                    columns,
                    chrono::Utc::now(),
                ));
                let text = if shown.is_empty() {
                    row.render()
                } else {
                    row.render_rows_under(shown)
                };
                *shown = row;
                text
            }
        };
        let mut out = std::io::stdout().lock();
        out.write_all(text.as_bytes()).and_then(|()| out.flush())?;
    }
    Ok(())
}

/// `berth get pool`: the warm pool as a table (IMAGE, READY, WANTED, CLAIMS, HELD: why the
/// refill makes no member, `-` while it makes them), or the server's `PoolList` as YAML or JSON.
async fn pool(context: &Context, args: &GetArgs) -> anyhow::Result<ExitCode> {
    if !args.names.is_empty() || args.selector.is_some() || args.watch {
        anyhow::bail!("get pool takes no names, --selector or --watch");
    }
    let client = context.client()?;
    let path = format!("{}/pool", berth_api::wire::API_PREFIX);
    let list = client.get_json(&path, &[]).await?;
    match &args.output {
        Some(GetOutput::Format(OutputFormat::Yaml)) => print!("{}", render::to_yaml(&list)),
        Some(GetOutput::Format(OutputFormat::Json)) => print!("{}", render::to_json(&list)),
        None | Some(GetOutput::Format(OutputFormat::Wide)) => {
            let pool: berth_api::wire::PoolList = serde_json::from_value(list)?;
            print!("{}", pool_table(&pool.items));
        }
        Some(_) => anyhow::bail!("-o: get pool prints a table, yaml or json"),
    }
    Ok(ExitCode::SUCCESS)
}

fn pool_table(items: &[berth_api::wire::PoolEntry]) -> String {
    let mut table = Table::new(["image", "ready", "wanted", "claims", "held"]);
    for item in items {
        table.row(vec![
            item.image.clone(),
            item.ready.to_string(),
            item.wanted.to_string(),
            item.claims.to_string(),
            item.held.clone().unwrap_or_else(|| "-".to_string()),
        ]);
    }
    table.render()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(text: &str) -> Vec<String> {
        text.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn the_pool_table_says_why_the_refill_is_held() {
        let entry = |held: Option<&str>| berth_api::wire::PoolEntry {
            image: "berth-agents".into(),
            ready: 0,
            wanted: 8,
            claims: 2,
            held: held.map(String::from),
        };
        let text = pool_table(&[entry(Some("disk"))]);
        let lines: Vec<Vec<String>> = text.lines().map(words).collect();
        assert_eq!(lines[0], ["IMAGE", "READY", "WANTED", "CLAIMS", "HELD"]);
        assert_eq!(lines[1], ["berth-agents", "0", "8", "2", "disk"]);
        let text = pool_table(&[entry(None)]);
        assert_eq!(words(text.lines().nth(1).unwrap())[4], "-");
    }

    #[test]
    fn objects_are_named_as_kubectl_names_them() {
        let p = |name: &str| (Kind::Project, name.to_string());
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
                (Kind::GitSource, "x".to_string()),
                (Kind::AgentProfile, "y".to_string())
            ]
        );
        for bad in ["project a/b", "project/a b", "pod/a", "project/"] {
            assert!(parse_objects(&words(bad)).is_err(), "{bad}");
        }
        assert_eq!(
            kind_and_names("project/a", &words("project/b")).unwrap(),
            (Kind::Project, words("a b"))
        );
        assert_eq!(
            kind_and_names("proj", &[]).unwrap(),
            (Kind::Project, Vec::new())
        );
        assert!(kind_and_names("project/a", &words("gs/b")).is_err());
    }
}
