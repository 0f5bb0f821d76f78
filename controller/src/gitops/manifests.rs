//! The manifests of one revision: every `*.yaml`/`*.yml` under the GitSource's `path`, read in
//! path order with [`crate::manifests`]' reader, each problem named by the file's path inside
//! the repository. Links are never followed and the whole is bounded in size.

use std::path::Path;

use crate::manifests::{self as reader, Links, ReadError, Walk};

pub use crate::manifests::{Manifest, Source};

/// The most manifest bytes one revision may hold: what the API takes in one apply.
pub const MAX_BYTES: u64 = 32 << 20;

/// A repository's manifests: YAML only, recursively, no link followed.
const WALK: Walk<'static> = Walk {
    recursive: true,
    extensions: &["yaml", "yml"],
    links: Links::Refuse,
};

#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("spec.path: the manifests under {path:?} total more than {} MiB", MAX_BYTES >> 20)]
    TooLarge { path: String },
    #[error("spec.path: {0:?} does not exist in this revision")]
    NoPath(String),
    #[error("spec.path: {0:?} is a symbolic link; berth does not follow links in a repository")]
    LinkedPath(String),
    #[error(transparent)]
    Read(#[from] ReadError),
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
    let files = reader::files_under(Some(root), &start, &WALK)?;
    let mut total = 0u64;
    for relative in &files {
        let meta = std::fs::metadata(root.join(relative)).map_err(|source| ReadError::Read {
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
        manifests.extend(reader::read_file(&root.join(&relative), &label)?);
    }
    if let Some((again, first)) =
        reader::first_duplicate(&manifests, |m| (m.kind.clone(), m.name.clone()))
    {
        return Err(LoadError::Duplicate {
            at: again.source.to_string(),
            reference: again.reference(),
            first: first.source.to_string(),
        });
    }
    Ok(manifests)
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
