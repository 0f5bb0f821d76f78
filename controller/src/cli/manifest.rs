//! Manifests read from files, directories or stdin: multi-document YAML (or JSON), with every
//! problem reported as `FILE: document N: line L column C: message`.

use std::collections::HashMap;
use std::fmt;
use std::io::Read;
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::client::{ClientError, Resource};

/// Where one object came from, for error messages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Source {
    pub file: String,
    /// 1-based index of the YAML document in its file.
    pub document: usize,
    /// 1-based index inside a `kind: List` (or `…List`) document.
    pub item: Option<usize>,
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: document {}", self.file, self.document)?;
        if let Some(item) = self.item {
            write!(f, ": item {item}")?;
        }
        Ok(())
    }
}

/// One object to send to the server.
#[derive(Debug, Clone, PartialEq)]
pub struct Manifest {
    pub source: Source,
    pub resource: Resource,
    pub name: String,
    pub object: Value,
}

impl Manifest {
    /// `project/payments-api`.
    pub fn reference(&self) -> String {
        format!("{}/{}", self.resource, self.name)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    #[error("{path}: {error}")]
    Read { path: String, error: std::io::Error },
    #[error("{file}: document {document}: line {line} column {column}: {message}")]
    Syntax {
        file: String,
        document: usize,
        line: usize,
        column: usize,
        message: String,
    },
    #[error("{at}: {message}")]
    Invalid { at: Source, message: String },
    /// A document past the bounds on alias expansion or nesting; its text names the document.
    #[error("{file}: {error}")]
    Bounds {
        file: String,
        error: berth_api::yaml::YamlError,
    },
    #[error("{0}: no .yaml, .yml or .json files found")]
    NoFiles(String),
    #[error("no objects found in {0}")]
    Empty(String),
}

/// Reads every `-f` argument in order; directories are read in name order, and recursively with
/// `recursive`. Returns the objects in the order they were written.
pub fn load(paths: &[String], recursive: bool) -> Result<Vec<Manifest>, ManifestError> {
    let mut manifests = Vec::new();
    for path in paths {
        if path == "-" {
            let mut text = String::new();
            std::io::stdin()
                .read_to_string(&mut text)
                .map_err(|error| ManifestError::Read {
                    path: "<stdin>".to_string(),
                    error,
                })?;
            manifests.extend(parse_documents("<stdin>", &text)?);
            continue;
        }
        let files = expand(Path::new(path), recursive)?;
        for file in files {
            let label = file.display().to_string();
            let text = std::fs::read_to_string(&file).map_err(|error| ManifestError::Read {
                path: label.clone(),
                error,
            })?;
            manifests.extend(parse_documents(&label, &text)?);
        }
    }
    if manifests.is_empty() {
        return Err(ManifestError::Empty(paths.join(", ")));
    }
    check_duplicates(&manifests)?;
    Ok(manifests)
}

fn expand(path: &Path, recursive: bool) -> Result<Vec<PathBuf>, ManifestError> {
    let label = path.display().to_string();
    let metadata = std::fs::metadata(path).map_err(|error| ManifestError::Read {
        path: label.clone(),
        error,
    })?;
    if !metadata.is_dir() {
        return Ok(vec![path.to_path_buf()]);
    }
    let mut files = Vec::new();
    collect_dir(path, recursive, &mut files)?;
    if files.is_empty() {
        return Err(ManifestError::NoFiles(label));
    }
    Ok(files)
}

fn collect_dir(dir: &Path, recursive: bool, out: &mut Vec<PathBuf>) -> Result<(), ManifestError> {
    let read_err = |error| ManifestError::Read {
        path: dir.display().to_string(),
        error,
    };
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(read_err)?
        .map(|entry| entry.map(|e| e.path()))
        .collect::<Result<_, _>>()
        .map_err(read_err)?;
    entries.sort();
    for entry in entries {
        let hidden = entry
            .file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with('.'));
        if hidden {
            continue;
        }
        if entry.is_dir() {
            if recursive {
                collect_dir(&entry, recursive, out)?;
            }
            continue;
        }
        let manifest_ext = entry
            .extension()
            .is_some_and(|e| e == "yaml" || e == "yml" || e == "json");
        if manifest_ext {
            out.push(entry);
        }
    }
    Ok(())
}

/// One YAML document's text and the file line it starts on.
struct Section {
    text: String,
    first_line: usize,
}

/// Splits a stream at `---` lines. A separator's own line is kept blank so line and column
/// numbers stay those of the file.
fn split_sections(text: &str) -> Vec<Section> {
    let mut sections = vec![Section {
        text: String::new(),
        first_line: 1,
    }];
    let mut saw_separator = false;
    for (index, line) in text.lines().enumerate() {
        let is_separator = line == "---"
            || line.starts_with("--- ")
            || line.starts_with("---\t")
            || line.trim_end() == "---";
        if is_separator {
            saw_separator = true;
            let rest = &line[3..];
            sections.push(Section {
                text: format!("   {rest}\n"),
                first_line: index + 1,
            });
            continue;
        }
        let current = sections.last_mut().expect("always one section");
        if line.trim_end() == "..." {
            current.text.push('\n');
        } else {
            current.text.push_str(line);
            current.text.push('\n');
        }
    }
    // A stream that opens with `---` has no document before it.
    if saw_separator && is_blank(&sections[0].text) {
        sections.remove(0);
    }
    sections
}

fn is_blank(text: &str) -> bool {
    text.lines().all(|l| {
        let t = l.trim();
        t.is_empty() || t.starts_with('#')
    })
}

/// Parses one file's documents; empty documents are skipped but still counted.
pub fn parse_documents(file: &str, text: &str) -> Result<Vec<Manifest>, ManifestError> {
    let mut out = Vec::new();
    for (index, section) in split_sections(text).into_iter().enumerate() {
        let document = index + 1;
        if is_blank(&section.text) {
            continue;
        }
        let value: Value = match berth_api::yaml::from_str(&section.text) {
            Ok(value) => value,
            Err(berth_api::yaml::YamlError::Syntax(err)) => {
                return Err(syntax_error(file, document, section.first_line, &err));
            }
            Err(error) => {
                return Err(ManifestError::Bounds {
                    file: file.to_string(),
                    error: error.in_document(document),
                });
            }
        };
        if value.is_null() {
            continue;
        }
        let source = Source {
            file: file.to_string(),
            document,
            item: None,
        };
        out.extend(objects_of(source, value)?);
    }
    Ok(out)
}

fn syntax_error(
    file: &str,
    document: usize,
    first_line: usize,
    err: &serde_yaml::Error,
) -> ManifestError {
    let text = err.to_string();
    let (line, column, message) = match err.location() {
        Some(location) => {
            let suffix = format!(" at line {} column {}", location.line(), location.column());
            let message = text.replacen(&suffix, "", 1);
            (
                location.line() + first_line - 1,
                location.column(),
                shift_line_numbers(&message, first_line - 1),
            )
        }
        None => (first_line, 1, text),
    };
    ManifestError::Syntax {
        file: file.to_string(),
        document,
        line,
        column,
        message,
    }
}

/// Rewrites every remaining `line N` in a parser message from document to file numbering.
fn shift_line_numbers(message: &str, offset: usize) -> String {
    if offset == 0 {
        return message.to_string();
    }
    let mut out = String::with_capacity(message.len());
    let mut rest = message;
    while let Some(pos) = rest.find("line ") {
        out.push_str(&rest[..pos + 5]);
        rest = &rest[pos + 5..];
        let digits = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        match rest[..digits].parse::<usize>() {
            Ok(n) if digits > 0 => out.push_str(&(n + offset).to_string()),
            _ => out.push_str(&rest[..digits]),
        }
        rest = &rest[digits..];
    }
    out.push_str(rest);
    out
}

/// One document is one object, or a `List` of them (what `get -o yaml` prints for a list).
fn objects_of(source: Source, value: Value) -> Result<Vec<Manifest>, ManifestError> {
    let invalid = |source: &Source, message: String| ManifestError::Invalid {
        at: source.clone(),
        message,
    };
    let Value::Object(map) = &value else {
        return Err(invalid(
            &source,
            "expected a mapping with apiVersion, kind and metadata".to_string(),
        ));
    };
    let kind = match map.get("kind") {
        Some(Value::String(kind)) => kind.clone(),
        Some(_) => return Err(invalid(&source, "kind: must be a string".to_string())),
        None => {
            return Err(invalid(
                &source,
                "kind: required field is missing".to_string(),
            ));
        }
    };
    if kind == "List" || (kind.ends_with("List") && map.contains_key("items")) {
        let Some(Value::Array(items)) = map.get("items") else {
            return Err(invalid(
                &source,
                "items: must be a list of objects".to_string(),
            ));
        };
        let mut out = Vec::new();
        for (index, item) in items.iter().enumerate() {
            let item_source = Source {
                item: Some(index + 1),
                ..source.clone()
            };
            out.push(single_object(item_source, item.clone())?);
        }
        return Ok(out);
    }
    Ok(vec![single_object(source, value)?])
}

fn single_object(source: Source, value: Value) -> Result<Manifest, ManifestError> {
    let invalid = |message: String| ManifestError::Invalid {
        at: source.clone(),
        message,
    };
    let kind = match value.get("kind") {
        Some(Value::String(kind)) => kind.clone(),
        Some(_) => return Err(invalid("kind: must be a string".to_string())),
        None => return Err(invalid("kind: required field is missing".to_string())),
    };
    let Some(resource) = Resource::from_kind(&kind) else {
        let known: Vec<&str> = Resource::ALL.iter().map(|r| r.kind()).collect();
        return Err(invalid(format!(
            "kind: unknown kind {kind:?} (expected one of {})",
            known.join(", ")
        )));
    };
    let name = match value.get("metadata").and_then(|m| m.get("name")) {
        Some(Value::String(name)) if !name.trim().is_empty() => name.clone(),
        Some(Value::String(_)) | None => {
            return Err(invalid(
                "metadata.name: required field is missing".to_string(),
            ));
        }
        Some(_) => return Err(invalid("metadata.name: must be a string".to_string())),
    };
    Ok(Manifest {
        source,
        resource,
        name,
        object: value,
    })
}

/// Two documents naming the same object would make the result depend on their order.
fn check_duplicates(manifests: &[Manifest]) -> Result<(), ManifestError> {
    let mut seen: HashMap<(Resource, &str), &Source> = HashMap::new();
    for manifest in manifests {
        if let Some(first) = seen.insert(
            (manifest.resource, manifest.name.as_str()),
            &manifest.source,
        ) {
            return Err(ManifestError::Invalid {
                at: manifest.source.clone(),
                message: format!("{} is also defined in {first}", manifest.reference()),
            });
        }
    }
    Ok(())
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

    fn names(manifests: &[Manifest]) -> Vec<(String, usize)> {
        manifests
            .iter()
            .map(|m| (m.reference(), m.source.document))
            .collect()
    }

    #[test]
    fn a_document_whose_aliases_expand_past_the_bound_is_refused_by_its_number() {
        let bomb = format!(
            "a: &a \"{}\"\nb: [{}]\n",
            "x".repeat(100_000),
            vec!["*a"; 15_000].join(",")
        );
        let text = format!("kind: Project\nmetadata: {{name: a}}\n---\n{bomb}");
        let err = parse_documents("f.yaml", &text).unwrap_err().to_string();
        assert!(
            err.starts_with("f.yaml: document 2: YAML expands beyond "),
            "{err}"
        );
    }

    #[test]
    fn documents_are_counted_and_empty_ones_skipped() {
        let text = format!(
            "---\n{GOOD}---\n# only a comment\n---\n{}\n---\n",
            GOOD.replace("name: a", "name: b")
                .replace("Project", "AgentProfile")
        );
        let manifests = parse_documents("f.yaml", &text).unwrap();
        assert_eq!(
            names(&manifests),
            vec![
                ("project/a".to_string(), 1),
                ("agentprofile/b".to_string(), 3)
            ]
        );
    }

    #[test]
    fn lists_are_flattened() {
        let text = "apiVersion: v1\nkind: ProjectList\nitems:\n- apiVersion: berth.dev/v1alpha1\n  kind: Project\n  metadata: {name: x}\n- apiVersion: berth.dev/v1alpha1\n  kind: Project\n  metadata: {name: y}\n";
        let manifests = parse_documents("list.yaml", text).unwrap();
        assert_eq!(manifests.len(), 2);
        assert_eq!(
            manifests[1].source.to_string(),
            "list.yaml: document 1: item 2"
        );
    }

    #[test]
    fn bad_documents_name_file_document_and_position() {
        let cases: &[(&str, &str)] = &[
            (
                // a tab-indented key in the second document, on line 7 of the file
                "kind: Project\nmetadata:\n  name: a\n---\nkind: Project\nmetadata:\n\tname: b\n",
                "f.yaml: document 2: line 7 column 1: ",
            ),
            (
                "kind: Project\nmetadata: {name: a\n",
                "f.yaml: document 1: line 3 column 1: ",
            ),
            (
                "kind: Project\nmetadata:\n  name: a\n---\n- just\n- a list\n",
                "f.yaml: document 2: expected a mapping",
            ),
            (
                "metadata: {name: a}\n",
                "f.yaml: document 1: kind: required field is missing",
            ),
            (
                "kind: Widget\nmetadata: {name: a}\n",
                "f.yaml: document 1: kind: unknown kind \"Widget\"",
            ),
            (
                "kind: Project\nmetadata: {}\n",
                "f.yaml: document 1: metadata.name: required",
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
    fn later_line_numbers_in_messages_are_shifted() {
        assert_eq!(
            shift_line_numbers("found x, while parsing a mapping at line 2 column 3", 10),
            "found x, while parsing a mapping at line 12 column 3"
        );
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
