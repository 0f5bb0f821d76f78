//! The manifest reader: multi-document YAML (or JSON) files, decoded with the bounded decoder,
//! each object checked for a kind and a name, every problem reported as `FILE: document N: ...`.
//! The CLI (files, directories, stdin) and GitOps (a checkout it must not escape) are thin
//! layers over it.
//!
//! Directories are walked in path order, links followed for a user's own files and refused in a
//! repository; a problem is named `FILE: document N[: item M]: ...`, a syntax error with the
//! file's line and column. Documents are decoded through `berth_api::yaml`'s bounded decoder.

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};

use serde_json::Value;

/// Where one object came from: `deploy/app.yaml: document 2` (`: item 3` inside a `List`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Source {
    pub file: String,
    /// 1-based, counting empty documents too, so it matches what an editor shows.
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

/// One object as written, not yet admitted: its kind is whatever the document says.
#[derive(Debug, Clone, PartialEq)]
pub struct Manifest {
    pub source: Source,
    pub kind: String,
    pub name: String,
    pub object: Value,
}

impl Manifest {
    /// `Project/payments-api`, as inventories name objects.
    pub fn reference(&self) -> String {
        format!("{}/{}", self.kind, self.name)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("{file}: {source}")]
    Read {
        file: String,
        #[source]
        source: std::io::Error,
    },
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
    #[error("{file}: a symbolic link; berth does not follow links in a repository")]
    Link { file: String },
}

/// Whether a directory walk follows symbolic links.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Links {
    /// A user's own files: a link is read as what it points to.
    Follow,
    /// A repository's files: a link named like a manifest is refused, any other skipped, so a
    /// repository cannot make the daemon read files outside it.
    Refuse,
}

/// How to walk a directory for manifest files.
#[derive(Debug, Clone, Copy)]
pub struct Walk<'a> {
    pub recursive: bool,
    /// File name endings that are manifests, without the dot.
    pub extensions: &'a [&'a str],
    pub links: Links,
}

/// The manifest files under `start`, in path order, hidden entries skipped. Paths (and the
/// names in errors) are relative to `root` when one is given, else as `start` was written.
pub fn files_under(
    root: Option<&Path>,
    start: &Path,
    walk: &Walk<'_>,
) -> Result<Vec<PathBuf>, ReadError> {
    let mut files = Vec::new();
    collect(root, start, walk, &mut files)?;
    files.sort();
    Ok(files)
}

fn collect(
    root: Option<&Path>,
    dir: &Path,
    walk: &Walk<'_>,
    out: &mut Vec<PathBuf>,
) -> Result<(), ReadError> {
    let relative = |p: &Path| match root {
        Some(root) => p.strip_prefix(root).unwrap_or(p).to_path_buf(),
        None => p.to_path_buf(),
    };
    let read_err = |source| ReadError::Read {
        file: relative(dir).display().to_string(),
        source,
    };
    let meta = match walk.links {
        Links::Follow => std::fs::metadata(dir),
        Links::Refuse => std::fs::symlink_metadata(dir),
    }
    .map_err(read_err)?;
    if !meta.is_dir() {
        out.push(relative(dir));
        return Ok(());
    }
    for entry in std::fs::read_dir(dir).map_err(read_err)? {
        let entry = entry.map_err(read_err)?;
        let path = entry.path();
        if entry.file_name().to_string_lossy().starts_with('.') {
            continue;
        }
        let is_manifest = path
            .extension()
            .is_some_and(|e| walk.extensions.iter().any(|x| e == *x));
        let mut file_type = entry.file_type().map_err(read_err)?;
        if file_type.is_symlink() {
            match walk.links {
                Links::Refuse if is_manifest => {
                    return Err(ReadError::Link {
                        file: relative(&path).display().to_string(),
                    });
                }
                Links::Refuse => continue,
                Links::Follow => match std::fs::metadata(&path) {
                    Ok(meta) => file_type = meta.file_type(),
                    // A dangling link is not a manifest.
                    Err(_) => continue,
                },
            }
        }
        if file_type.is_dir() {
            if walk.recursive {
                collect(root, &path, walk, out)?;
            }
        } else if file_type.is_file() && is_manifest {
            out.push(relative(&path));
        }
    }
    Ok(())
}

/// Reads and parses one file; `label` is its name in errors and sources.
pub fn read_file(path: &Path, label: &str) -> Result<Vec<Manifest>, ReadError> {
    let text = std::fs::read_to_string(path).map_err(|source| ReadError::Read {
        file: label.to_string(),
        source,
    })?;
    parse_documents(label, &text)
}

/// Parses one file's documents; empty documents are skipped but still counted. serde_yaml
/// reports positions in the whole stream, so a syntax error's `line L column C` is the editor's.
pub fn parse_documents(file: &str, text: &str) -> Result<Vec<Manifest>, ReadError> {
    let mut out = Vec::new();
    for (index, document) in berth_api::yaml::documents(text).enumerate() {
        let source = Source {
            file: file.to_string(),
            document: index + 1,
            item: None,
        };
        let value = document.map_err(|err| match err {
            berth_api::yaml::YamlError::Syntax(err) => syntax_error(file, index + 1, &err),
            error => ReadError::Bounds {
                file: file.to_string(),
                error,
            },
        })?;
        if !value.is_null() {
            out.extend(objects_of(source, value)?);
        }
    }
    Ok(out)
}

fn syntax_error(file: &str, document: usize, err: &serde_yaml::Error) -> ReadError {
    let text = err.to_string();
    let (line, column, message) = match err.location() {
        Some(location) => {
            let suffix = format!(" at line {} column {}", location.line(), location.column());
            (
                location.line(),
                location.column(),
                text.replacen(&suffix, "", 1),
            )
        }
        None => (1, 1, text),
    };
    ReadError::Syntax {
        file: file.to_string(),
        document,
        line,
        column,
        message,
    }
}

/// One document is one object, or a `List` of them (what `get -o yaml` prints for a list).
fn objects_of(source: Source, value: Value) -> Result<Vec<Manifest>, ReadError> {
    let is_list = match value.get("kind") {
        Some(Value::String(kind)) => {
            kind == "List" || (kind.ends_with("List") && value.get("items").is_some())
        }
        _ => false,
    };
    if !is_list {
        return Ok(vec![object_of(source, value)?]);
    }
    let Some(Value::Array(items)) = value.get("items") else {
        return Err(ReadError::Invalid {
            at: source,
            message: "items: must be a list of objects".to_string(),
        });
    };
    items
        .iter()
        .enumerate()
        .map(|(index, item)| {
            let at = Source {
                item: Some(index + 1),
                ..source.clone()
            };
            object_of(at, item.clone())
        })
        .collect()
}

fn object_of(source: Source, object: Value) -> Result<Manifest, ReadError> {
    let invalid = |message: &str| ReadError::Invalid {
        at: source.clone(),
        message: message.to_string(),
    };
    if !object.is_object() {
        return Err(invalid(
            "expected a mapping with apiVersion, kind and metadata",
        ));
    }
    let kind = match object.get("kind") {
        Some(Value::String(kind)) if !kind.is_empty() => kind.clone(),
        Some(_) => return Err(invalid("kind: must be a non-empty string")),
        None => return Err(invalid("kind: required field is missing")),
    };
    let name = match object.get("metadata").and_then(|m| m.get("name")) {
        Some(Value::String(name)) if !name.trim().is_empty() => name.clone(),
        Some(Value::String(_)) | None => {
            return Err(invalid("metadata.name: required field is missing"));
        }
        Some(_) => return Err(invalid("metadata.name: must be a string")),
    };
    Ok(Manifest {
        source,
        kind,
        name,
        object,
    })
}

/// The first object named twice, as (the later, the earlier): two documents naming the same
/// object would make the result depend on their order.
pub fn first_duplicate<T, K: Eq + std::hash::Hash>(
    items: &[T],
    key: impl Fn(&T) -> K,
) -> Option<(&T, &T)> {
    let mut seen: HashMap<K, &T> = HashMap::new();
    for item in items {
        if let Some(first) = seen.insert(key(item), item) {
            return Some((item, first));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "apiVersion: berth.dev/v1alpha1\nkind: Project\nmetadata:\n  name: a\n";

    fn refs(manifests: &[Manifest]) -> Vec<String> {
        manifests
            .iter()
            .map(|m| format!("{}={}/{}", m.source, m.kind, m.name))
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
    fn documents_are_counted_empty_ones_skipped_and_lists_flattened() {
        let text = format!(
            "---\n{GOOD}---\n# only a comment\n---\n{}\n---\n",
            GOOD.replace("name: a", "name: b")
                .replace("Project", "AgentProfile")
        );
        assert_eq!(
            refs(&parse_documents("f.yaml", &text).unwrap()),
            [
                "f.yaml: document 1=Project/a",
                "f.yaml: document 3=AgentProfile/b"
            ]
        );
        let list = "apiVersion: v1\nkind: ProjectList\nitems:\n- kind: Project\n  metadata: {name: x}\n- kind: Project\n  metadata: {name: y}\n";
        assert_eq!(
            refs(&parse_documents("l.yaml", list).unwrap()),
            [
                "l.yaml: document 1: item 1=Project/x",
                "l.yaml: document 1: item 2=Project/y"
            ]
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
                "kind: List\nitems: 3\n",
                "f.yaml: document 1: items: must be a list",
            ),
            (
                "kind: Project\nmetadata: {}\n",
                "f.yaml: document 1: metadata.name: required",
            ),
        ];
        for (text, expected) in cases {
            let message = parse_documents("f.yaml", text).expect_err(text).to_string();
            assert!(
                message.starts_with(expected),
                "got {message:?}, want prefix {expected:?}"
            );
        }
    }

    #[test]
    fn walks_in_path_order_with_links_followed_or_refused() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        for file in ["d/b.yaml", "d/a/x.yml", "d/notes.txt", "d/.hidden.yaml"] {
            let path = root.join(file);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, GOOD).unwrap();
        }
        let walk = |recursive, links| Walk {
            recursive,
            extensions: &["yaml", "yml"],
            links,
        };
        let found = |recursive, links| {
            files_under(Some(root), &root.join("d"), &walk(recursive, links))
                .map(|files| files.iter().map(|f| f.display().to_string()).collect())
        };
        let all: Vec<String> = found(true, Links::Refuse).unwrap();
        assert_eq!(all, ["d/a/x.yml", "d/b.yaml"]);
        let flat: Vec<String> = found(false, Links::Follow).unwrap();
        assert_eq!(flat, ["d/b.yaml"]);

        std::os::unix::fs::symlink(root.join("d/b.yaml"), root.join("d/c.yaml")).unwrap();
        let followed: Vec<String> = found(false, Links::Follow).unwrap();
        assert_eq!(followed, ["d/b.yaml", "d/c.yaml"]);
        let err = found(true, Links::Refuse).unwrap_err().to_string();
        assert!(err.starts_with("d/c.yaml: a symbolic link"), "{err}");
    }
}
