//! Manifests read from files, directories or stdin, with every problem reported as
//! `FILE: document N: line L column C: message`. The reading is [`crate::manifests`]'; this
//! layer adds stdin, `-R`, and the kinds this client knows.

use std::io::Read;
use std::path::Path;

use berth_api::Kind;
use berth_api::wire::ApplyItem;
use serde_json::Value;

use super::Context;
use crate::client::{ApplyOptions, Client, ClientError};
use crate::manifests::{self as reader, Links, ReadError, Walk};

pub use crate::manifests::Source;

/// One object to send to the server.
#[derive(Debug, Clone, PartialEq)]
pub struct Manifest {
    pub source: Source,
    pub resource: Kind,
    pub name: String,
    pub object: Value,
}

impl Manifest {
    /// `project/payments-api`.
    pub fn reference(&self) -> String {
        format!("{}/{}", self.resource.singular(), self.name)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    #[error(transparent)]
    Read(#[from] ReadError),
    #[error("{at}: {message}")]
    Invalid { at: Source, message: String },
    #[error("{0}: no .yaml, .yml or .json files found")]
    NoFiles(String),
    #[error("no objects found in {0}")]
    Empty(String),
}

/// `-f FILE|DIR|-` and `-R`: the manifests `apply` and `diff` send.
#[derive(Debug, clap::Args)]
pub struct Files {
    /// Manifest file, directory, or `-` for stdin (repeatable).
    #[arg(
        short = 'f',
        long = "filename",
        required = true,
        value_name = "FILE|DIR|-"
    )]
    pub files: Vec<String>,
    /// Read directories recursively.
    #[arg(short = 'R', long)]
    pub recursive: bool,
}

impl Files {
    /// Reads the manifests, then sends them as one apply (or dry run) with the context's client;
    /// a failure names the file and document a server's complaint is about.
    pub async fn apply(
        &self,
        context: &Context,
        options: &ApplyOptions,
    ) -> anyhow::Result<(Client, Vec<ApplyItem>)> {
        let manifests = load(&self.files, self.recursive)?;
        let client = context.client()?;
        let items = manifests.iter().map(|m| m.object.clone()).collect();
        let outcomes = client
            .apply(items, options)
            .await
            .map_err(|err| locate_errors(err, &manifests, &self.files))?;
        Ok((client, outcomes))
    }
}

/// What `-f DIR` reads: YAML and JSON files, links followed (they are the user's own files).
const WALK_FLAT: Walk<'static> = Walk {
    recursive: false,
    extensions: &["yaml", "yml", "json"],
    links: Links::Follow,
};

/// Reads every `-f` argument in order; directories are read in name order, and recursively with
/// `recursive`. Returns the objects in the order they were written.
pub fn load(paths: &[String], recursive: bool) -> Result<Vec<Manifest>, ManifestError> {
    let walk = Walk {
        recursive,
        ..WALK_FLAT
    };
    let mut manifests = Vec::new();
    for path in paths {
        if path == "-" {
            let mut text = String::new();
            std::io::stdin()
                .read_to_string(&mut text)
                .map_err(|source| ReadError::Read {
                    file: "<stdin>".to_string(),
                    source,
                })?;
            manifests.extend(parse_documents("<stdin>", &text)?);
            continue;
        }
        let start = Path::new(path);
        let files = reader::files_under(None, start, &walk)?;
        if files.is_empty() {
            return Err(ManifestError::NoFiles(path.clone()));
        }
        for file in files {
            let label = file.display().to_string();
            for manifest in reader::read_file(&file, &label)? {
                manifests.push(known(manifest)?);
            }
        }
    }
    if manifests.is_empty() {
        return Err(ManifestError::Empty(paths.join(", ")));
    }
    check_duplicates(&manifests)?;
    Ok(manifests)
}

/// Parses one file's documents into objects of kinds this client knows.
pub fn parse_documents(file: &str, text: &str) -> Result<Vec<Manifest>, ManifestError> {
    reader::parse_documents(file, text)?
        .into_iter()
        .map(known)
        .collect()
}

fn known(manifest: reader::Manifest) -> Result<Manifest, ManifestError> {
    let Ok(resource) = manifest.kind.parse::<Kind>() else {
        let known: Vec<&str> = Kind::LISTED.iter().map(|k| k.as_str()).collect();
        return Err(ManifestError::Invalid {
            message: format!(
                "kind: unknown kind {:?} (expected one of {})",
                manifest.kind,
                known.join(", ")
            ),
            at: manifest.source,
        });
    };
    Ok(Manifest {
        source: manifest.source,
        resource,
        name: manifest.name,
        object: manifest.object,
    })
}

/// Two documents naming the same object would make the result depend on their order.
fn check_duplicates(manifests: &[Manifest]) -> Result<(), ManifestError> {
    let Some((again, first)) = reader::first_duplicate(manifests, |m| (m.resource, m.name.clone()))
    else {
        return Ok(());
    };
    Err(ManifestError::Invalid {
        at: again.source.clone(),
        message: format!("{} is also defined in {}", again.reference(), first.source),
    })
}

/// Rewrites a server-side field path such as `items[2].spec.image` to the manifest it came
/// from: `deploy/app.yaml: document 3: spec.image`.
pub fn locate_field(manifests: &[Manifest], field: &str) -> Option<String> {
    let rest = field.strip_prefix("items[")?;
    let close = rest.find(']')?;
    let index: usize = rest[..close].parse().ok()?;
    let manifest = manifests.get(index)?;
    let path = rest[close + 1..].trim_start_matches('.');
    if path.is_empty() {
        Some(format!("{} ({})", manifest.source, manifest.reference()))
    } else {
        Some(format!(
            "{} ({}): {path}",
            manifest.source,
            manifest.reference()
        ))
    }
}

/// What a failed apply (or diff) reports: a server's `items[N]...` field paths pointed back at
/// the file and document they came from, and a request too large to send named by its files.
pub fn locate_errors(err: ClientError, manifests: &[Manifest], files: &[String]) -> anyhow::Error {
    let status = match err {
        ClientError::Api(status) => status,
        err @ ClientError::ApplyTooLarge { .. } => {
            return anyhow::anyhow!("{}: {err}; apply them in parts", files.join(", "));
        }
        err => return err.into(),
    };
    let mut message = status.headline().to_string();
    if let Some(located) = locate_prefix(&message, manifests) {
        message = located;
    }
    // The batch is the server's word for what the user gave as files: say what happened.
    if message == "List is invalid" && !status.causes().is_empty() {
        let problems = status.causes().len();
        message = format!(
            "{}: {problems} problem{}, nothing was applied",
            files.join(", "),
            if problems == 1 { "" } else { "s" }
        );
    }
    let causes = status
        .causes()
        .iter()
        .map(|cause| {
            let mut cause = cause.clone();
            if let Some(located) = locate_field(manifests, &cause.field) {
                cause.field = located;
            }
            cause
        })
        .collect();
    let mut status = status;
    status.message = message;
    if let Some(details) = status.details.as_mut() {
        details.causes = causes;
    }
    ClientError::Api(status).into()
}

/// A message that starts with `items[N]` gets the same treatment as a cause's field.
fn locate_prefix(message: &str, manifests: &[Manifest]) -> Option<String> {
    if !message.starts_with("items[") {
        return None;
    }
    let end = message.find([':', ' ']).unwrap_or(message.len());
    let located = locate_field(manifests, &message[..end])?;
    Some(format!("{located}{}", &message[end..]))
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "apiVersion: berth.dev/v1alpha1\nkind: Project\nmetadata:\n  name: a\n";

    #[test]
    fn unknown_kinds_and_names_given_twice_name_their_document() {
        // What this layer adds to the reader's own checks: known kinds, one object per name.
        let cases: &[(&str, &str)] = &[
            (
                "kind: Widget\nmetadata: {name: a}\n",
                "f.yaml: document 1: kind: unknown kind \"Widget\"",
            ),
            (
                "kind: Project\nmetadata: {name: a}\n---\nkind: Project\nmetadata: {name: a}\n",
                "f.yaml: document 2: project/a is also defined in f.yaml: document 1",
            ),
        ];
        for (text, expected) in cases {
            let err = parse_documents("f.yaml", text)
                .and_then(|m| check_duplicates(&m).map(|()| m))
                .expect_err(text);
            let message = err.to_string();
            assert!(
                message.starts_with(expected),
                "got {message:?}, want prefix {expected:?}"
            );
        }
    }

    #[test]
    fn directories_are_read_in_order_and_recursively_on_request() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("b.yaml"),
            GOOD.replace("name: a", "name: b"),
        )
        .unwrap();
        std::fs::write(dir.path().join("a.yml"), GOOD).unwrap();
        std::fs::write(dir.path().join("notes.txt"), "not a manifest").unwrap();
        std::fs::create_dir(dir.path().join("nested")).unwrap();
        std::fs::write(
            dir.path().join("nested/c.yaml"),
            GOOD.replace("name: a", "name: c"),
        )
        .unwrap();
        let top = dir.path().to_string_lossy().to_string();

        let flat = load(std::slice::from_ref(&top), false).unwrap();
        let flat: Vec<String> = flat.iter().map(Manifest::reference).collect();
        assert_eq!(flat, ["project/a", "project/b"]);

        let deep = load(&[top], true).unwrap();
        let deep: Vec<String> = deep.iter().map(Manifest::reference).collect();
        assert_eq!(deep, ["project/a", "project/b", "project/c"]);
    }

    #[test]
    fn server_field_paths_point_back_at_documents() {
        let manifests = parse_documents(
            "f.yaml",
            &format!("{GOOD}---\n{}", GOOD.replace("name: a", "name: b")),
        )
        .unwrap();
        assert_eq!(
            locate_field(&manifests, "items[1].spec.colour").as_deref(),
            Some("f.yaml: document 2 (project/b): spec.colour")
        );
        assert_eq!(locate_field(&manifests, "spec.colour"), None);
        assert_eq!(locate_field(&manifests, "items[9].spec"), None);
    }

    #[test]
    fn server_errors_name_the_document() {
        use crate::client::ApiStatus;
        use berth_api::FieldError;
        use berth_api::wire::StatusDetails;
        let invalid = |message: &str, causes: Vec<FieldError>| ApiStatus {
            details: Some(StatusDetails {
                causes,
                ..StatusDetails::default()
            }),
            ..ApiStatus::failure(422, "Invalid", message)
        };
        let files = ["app.yaml".to_string()];
        let manifests = parse_documents(
            "app.yaml",
            "kind: Project\nmetadata: {name: a}\n---\nkind: Project\nmetadata: {name: b}\n",
        )
        .unwrap();
        let err = ClientError::Api(Box::new(invalid(
            "items[1].spec.imagee: unknown field",
            vec![FieldError::new("items[1].spec.imagee", "unknown field")],
        )));
        let located = locate_errors(err, &manifests, &files).to_string();
        assert_eq!(
            located,
            "Error from server (Invalid): app.yaml: document 2 (project/b): spec.imagee: unknown field"
        );

        let err = ClientError::Api(Box::new(invalid(
            "List is invalid: items[0].specc: unknown field; items[1].kind: required",
            vec![
                FieldError::new("items[0].specc", "unknown field"),
                FieldError::new("items[1].kind", "required"),
            ],
        )));
        assert_eq!(
            locate_errors(err, &manifests, &files).to_string(),
            "Error from server (Invalid): app.yaml: 2 problems, nothing was applied\n  \
             app.yaml: document 1 (project/a): specc: unknown field\n  \
             app.yaml: document 2 (project/b): kind: required"
        );

        let err = ClientError::ApplyTooLarge {
            bytes: 37 << 20,
            limit: 32 << 20,
        };
        assert_eq!(
            locate_errors(err, &manifests, &files).to_string(),
            "app.yaml: the apply request is 37.0 MiB, over the server's limit of 32 MiB for one apply; apply them in parts"
        );
    }
}
