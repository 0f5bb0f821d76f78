//! `berth diff -f`: a dry-run apply compared with the live objects. Exit 0: no difference,
//! 1: differences, 2: an error.

use std::collections::HashMap;
use std::process::ExitCode;

use berth_api::Kind;
use berth_api::wire::ApplyItem;
use clap::Args;
use serde_json::{Map, Value, json};

use super::colour;
use super::render::{name_of, to_yaml};
use super::{Context, manifest, report, textdiff};
use crate::client::{ApplyOptions, Client, ClientError};

#[derive(Debug, Args)]
pub struct DiffArgs {
    #[command(flatten)]
    manifests: manifest::Files,
    /// Also show the objects `apply --prune` would delete from the applyset.
    #[arg(long, requires = "applyset")]
    prune: bool,
    /// The applyset the manifests belong to, as given to `apply --applyset`.
    #[arg(long, value_name = "NAME")]
    applyset: Option<String>,
}

const CONTEXT_LINES: usize = 3;

pub async fn run(context: &Context, args: DiffArgs) -> anyhow::Result<ExitCode> {
    match differences(context, &args).await {
        Ok(false) => Ok(ExitCode::SUCCESS),
        Ok(true) => Ok(ExitCode::from(1)),
        Err(err) => {
            report(&err);
            Ok(ExitCode::from(2))
        }
    }
}

/// Prints the diff of every object; true when any differs.
async fn differences(context: &Context, args: &DiffArgs) -> anyhow::Result<bool> {
    let options = ApplyOptions {
        dry_run: true,
        applyset: args.applyset.clone().map(|name| (name, args.prune)),
    };
    let (client, outcomes) = args.manifests.apply(context, &options).await?;
    let live_objects = LiveObjects::read(&client, &outcomes).await?;
    let mut differs = false;
    for outcome in outcomes {
        let Ok(resource) = outcome.kind.parse::<Kind>() else {
            continue;
        };
        let live = live_objects.get(&client, resource, &outcome.name).await?;
        let live_text = live
            .as_ref()
            .map(|o| to_yaml(&comparable(o)))
            .unwrap_or_default();
        // A pruned object would be gone: all of it is a removal.
        let merged_text = if outcome.action == "pruned" {
            String::new()
        } else {
            to_yaml(&comparable(&outcome.object))
        };
        let reference = format!("{}/{}", resource.singular(), outcome.name);
        let diff = textdiff::unified(
            &format!("live/{reference}"),
            &format!("merged/{reference}"),
            &live_text,
            &merged_text,
            CONTEXT_LINES,
        );
        if !diff.is_empty() {
            differs = true;
            if colour::stdout() {
                print!("{}", colour::diff(&diff));
            } else {
                print!("{diff}");
            }
        }
    }
    Ok(differs)
}

/// Above this many objects of one kind, one list call is cheaper than a GET each.
const LIST_THRESHOLD: usize = 20;

/// The live objects a diff compares against: listed once per kind for a large batch, read one
/// by one for a small one.
struct LiveObjects {
    listed: HashMap<Kind, HashMap<String, Value>>,
}

impl LiveObjects {
    async fn read(client: &Client, outcomes: &[ApplyItem]) -> Result<LiveObjects, ClientError> {
        let mut counts: HashMap<Kind, usize> = HashMap::new();
        for outcome in outcomes {
            if let Ok(resource) = outcome.kind.parse::<Kind>() {
                *counts.entry(resource).or_default() += 1;
            }
        }
        let mut listed = HashMap::new();
        for (resource, count) in counts {
            if count <= LIST_THRESHOLD {
                continue;
            }
            let list = client.list(resource, None).await?;
            let by_name: HashMap<String, Value> = list
                .get("items")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .map(|o| (name_of(o).to_string(), o.clone()))
                .collect();
            listed.insert(resource, by_name);
        }
        Ok(LiveObjects { listed })
    }

    async fn get(
        &self,
        client: &Client,
        resource: Kind,
        name: &str,
    ) -> Result<Option<Value>, ClientError> {
        match self.listed.get(&resource) {
            Some(by_name) => Ok(by_name.get(name).cloned()),
            None => client.get_opt(resource, name).await,
        }
    }
}

/// What a user writes: apiVersion, kind, the user-owned metadata and the spec. Status and
/// server-set metadata differ between any two reads and say nothing about the manifest.
pub fn comparable(object: &Value) -> Value {
    let mut metadata = Map::new();
    if let Some(source) = object.get("metadata").and_then(Value::as_object) {
        for key in ["name", "labels", "annotations"] {
            if let Some(value) = source.get(key).filter(|v| !is_empty(v)) {
                metadata.insert(key.to_string(), value.clone());
            }
        }
    }
    let mut out = Map::new();
    for key in ["apiVersion", "kind"] {
        if let Some(value) = object.get(key) {
            out.insert(key.to_string(), value.clone());
        }
    }
    out.insert("metadata".to_string(), Value::Object(metadata));
    out.insert(
        "spec".to_string(),
        object.get("spec").cloned().unwrap_or(json!({})),
    );
    Value::Object(out)
}

fn is_empty(value: &Value) -> bool {
    match value {
        Value::Null => true,
        Value::Object(map) => map.is_empty(),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_fields_do_not_count() {
        let live = json!({"apiVersion": "berth.dev/v1alpha1", "kind": "Project",
            "metadata": {"name": "a", "uid": "1", "resourceVersion": "9", "generation": 3,
                         "creationTimestamp": "2026-01-01T00:00:00Z", "labels": {}},
            "spec": {"image": "berth-base"}, "status": {"phase": "Ready"}});
        let merged = json!({"apiVersion": "berth.dev/v1alpha1", "kind": "Project",
            "metadata": {"name": "a", "uid": "1", "resourceVersion": "10", "generation": 4},
            "spec": {"image": "berth-base"}});
        assert_eq!(comparable(&live), comparable(&merged));
        let changed = json!({"apiVersion": "berth.dev/v1alpha1", "kind": "Project",
            "metadata": {"name": "a", "labels": {"team": "x"}}, "spec": {"image": "berth-base"}});
        let diff = textdiff::unified(
            "live",
            "merged",
            &to_yaml(&comparable(&live)),
            &to_yaml(&comparable(&changed)),
            3,
        );
        assert!(diff.contains("+  labels:\n+    team: x\n"), "{diff}");
    }
}
