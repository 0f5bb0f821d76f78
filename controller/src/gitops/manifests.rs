//! The manifests of one revision: every `*.yaml`/`*.yml` under the GitSource's `path`, read in
//! path order, multi-document, each problem reported as `FILE: document N: ...` with the file's
//! path inside the repository.

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

/// One object of the repository, not yet admitted.
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

/// The most manifest bytes one revision may hold: what the API takes in one apply.
pub const MAX_BYTES: u64 = 32 << 20;

#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("spec.path: the manifests under {path:?} total more than {} MiB", MAX_BYTES >> 20)]
    TooLarge { path: String },
    #[error("spec.path: {0:?} does not exist in this revision")]
    NoPath(String),
    #[error("spec.path: {0:?} is a symbolic link; berth does not follow links in a repository")]
    LinkedPath(String),
    #[error("{file}: a symbolic link; berth does not follow links in a repository")]
    Link { file: String },
    #[error("{file}: {source}")]
    Read {
        file: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{file}: document {document}: {message}")]
    Syntax {
        file: String,
        document: usize,
        message: String,
    },
    #[error("{at}: {message}")]
    Invalid { at: Source, message: String },
    /// A document past the bounds on alias expansion or nesting; nothing of the revision is
    /// applied.
    #[error("{file}: {error}")]
    Bounds {
        file: String,
        error: berth_api::yaml::YamlError,
    },
    #[error("{at} ({reference}): also defined in {first}")]
    Duplicate {
        at: String,
        reference: String,
        first: String,
    },
}

/// Reads the manifests under `path` of the checkout at `root`, in the order of their paths.
pub fn load(root: &Path, path: &str) -> Result<Vec<Manifest>, LoadError> {
    let trimmed = path.trim_matches('/');
    let start = if trimmed.is_empty() || trimmed == "." {
        root.to_path_buf()
    } else {
        root.join(trimmed)
    };
    match std::fs::symlink_metadata(&start) {
        Ok(meta) if meta.file_type().is_symlink() => {
            return Err(LoadError::LinkedPath(path.to_string()));
        }
        Ok(_) => {}
        Err(_) => return Err(LoadError::NoPath(path.to_string())),
    }
    let mut files = Vec::new();
    collect(root, &start, &mut files)?;
    files.sort();
    let mut total = 0u64;
    for relative in &files {
        let meta = std::fs::metadata(root.join(relative)).map_err(|source| LoadError::Read {
            file: relative.display().to_string(),
            source,
        })?;
        total += meta.len();
        if total > MAX_BYTES {
            return Err(LoadError::TooLarge {
                path: path.to_string(),
            });
        }
    }
    let mut manifests = Vec::new();
    for relative in files {
        let label = relative.display().to_string();
        let text =
            std::fs::read_to_string(root.join(&relative)).map_err(|source| LoadError::Read {
                file: label.clone(),
                source,
            })?;
        manifests.extend(parse_documents(&label, &text)?);
    }
    let mut seen: HashMap<(String, String), String> = HashMap::new();
    for m in &manifests {
        if let Some(first) = seen.insert((m.kind.clone(), m.name.clone()), m.source.to_string()) {
            return Err(LoadError::Duplicate {
                at: m.source.to_string(),
                reference: m.reference(),
                first,
            });
        }
    }
    Ok(manifests)
}

/// Parses one file's documents. serde_yaml reports positions in the whole file, so a syntax
/// error's `line L column C` is the editor's.
fn parse_documents(file: &str, text: &str) -> Result<Vec<Manifest>, LoadError> {
    let mut out = Vec::new();
    for (index, document) in berth_api::yaml::documents(text).enumerate() {
        let source = Source {
            file: file.to_string(),
            document: index + 1,
            item: None,
        };
        let value = document.map_err(|err| match err {
            berth_api::yaml::YamlError::Syntax(err) => LoadError::Syntax {
                file: file.to_string(),
                document: index + 1,
                message: err.to_string(),
            },
            error => LoadError::Bounds {
                file: file.to_string(),
                error,
            },
        })?;
        match value {
            Value::Null => {}
            Value::Object(ref map) if map.get("kind").and_then(Value::as_str) == Some("List") => {
                let Some(Value::Array(items)) = map.get("items") else {
                    return Err(LoadError::Invalid {
                        at: source,
                        message: "items: must be a list of objects".to_string(),
                    });
                };
                for (i, item) in items.iter().enumerate() {
                    let at = Source {
                        item: Some(i + 1),
                        ..source.clone()
                    };
                    out.push(object_of(at, item.clone())?);
                }
            }
            value => out.push(object_of(source, value)?),
        }
    }
    Ok(out)
}

fn object_of(source: Source, object: Value) -> Result<Manifest, LoadError> {
    let invalid = |message: &str| LoadError::Invalid {
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

/// Collects the manifest files under `dir` as paths relative to `root`. Hidden entries (`.git`
/// among them) are skipped; links are never followed, so a repository cannot make the daemon
/// read files outside it.
fn collect(root: &Path, dir: &Path, out: &mut Vec<PathBuf>) -> Result<(), LoadError> {
    let relative = |p: &Path| p.strip_prefix(root).unwrap_or(p).to_path_buf();
    let read_err = |source| LoadError::Read {
        file: relative(dir).display().to_string(),
        source,
    };
    let meta = std::fs::symlink_metadata(dir).map_err(read_err)?;
    if meta.is_file() {
        out.push(relative(dir));
        return Ok(());
    }
    for entry in std::fs::read_dir(dir).map_err(read_err)? {
        let entry = entry.map_err(read_err)?;
        let path = entry.path();
        if entry.file_name().to_string_lossy().starts_with('.') {
            continue;
        }
        let file_type = entry.file_type().map_err(read_err)?;
        let is_manifest = path.extension().is_some_and(|e| e == "yaml" || e == "yml");
        if file_type.is_symlink() {
            if is_manifest {
                return Err(LoadError::Link {
                    file: relative(&path).display().to_string(),
                });
            }
            continue;
        }
        if file_type.is_dir() {
            collect(root, &path, out)?;
        } else if file_type.is_file() && is_manifest {
            out.push(relative(&path));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const PROFILE: &str =
        "apiVersion: berth.dev/v1alpha1\nkind: AgentProfile\nmetadata:\n  name: NAME\nspec: {}\n";

    fn write(root: &Path, file: &str, text: &str) {
        let path = root.join(file);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }

    #[test]
    fn reads_yaml_recursively_in_path_order_and_skips_the_rest() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        write(root, "deploy/b.yaml", &PROFILE.replace("NAME", "b"));
        write(
            root,
            "deploy/a/x.yml",
            &format!(
                "{}---\n# nothing\n---\n{}",
                PROFILE.replace("NAME", "a1"),
                PROFILE.replace("NAME", "a2")
            ),
        );
        write(root, "deploy/notes.txt", "not a manifest");
        write(root, "deploy/.hidden.yaml", "not: [valid");
        write(root, "other/c.yaml", &PROFILE.replace("NAME", "c"));
        let got: Vec<String> = load(root, "deploy")
            .unwrap()
            .iter()
            .map(|m| format!("{}={}", m.source, m.name))
            .collect();
        assert_eq!(
            got,
            [
                "deploy/a/x.yml: document 1=a1",
                "deploy/a/x.yml: document 3=a2",
                "deploy/b.yaml: document 1=b"
            ]
        );
        assert_eq!(load(root, ".").unwrap().len(), 4);
    }

    #[test]
    fn problems_name_the_file_in_the_repository() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        write(
            root,
            "m/bad.yaml",
            &format!("{}---\nkind: [unclosed\n", PROFILE.replace("NAME", "ok")),
        );
        let err = load(root, "m").unwrap_err().to_string();
        assert!(err.starts_with("m/bad.yaml: document 2: "), "{err}");
        assert!(err.contains("line 7"), "{err}");
        assert!(matches!(load(root, "missing"), Err(LoadError::NoPath(_))));

        write(root, "d/one.yaml", &PROFILE.replace("NAME", "same"));
        write(root, "d/two.yaml", &PROFILE.replace("NAME", "same"));
        let err = load(root, "d").unwrap_err().to_string();
        assert!(
            err.contains("d/two.yaml") && err.contains("d/one.yaml"),
            "{err}"
        );

        std::os::unix::fs::symlink("/etc/hostname", root.join("d/link.yaml")).unwrap();
        let err = load(root, "d").unwrap_err().to_string();
        assert!(err.contains("d/link.yaml: a symbolic link"), "{err}");
    }
}
