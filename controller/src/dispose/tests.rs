//! The one disposal owner, kept so by reading the source tree: no module but [`crate::dispose`]
//! destroys an instance or a volume, besides the exceptions named here.

use std::path::{Path, PathBuf};

/// The runtime's destroying calls.
const DESTROYING: [&str; 2] = [".delete_instance(", ".delete_volume("];

/// Where else they may be called, and why.
const EXCEPTIONS: [(&str, &str); 4] = [
    ("dispose.rs", "the owner"),
    ("trash/mod.rs", "the trash's purge of expired items"),
    (
        "workspace/inspection_instance.rs",
        "the inspection instance's cleanup (never a project's)",
    ),
    ("lxd/client.rs", "the LXD implementation of the calls"),
];

fn sources(dir: &Path, found: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read the source tree") {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            sources(&path, found);
        } else if path.extension().is_some_and(|e| e == "rs") {
            found.push(path);
        }
    }
}

/// Test code drives the calls freely: test files, `testing/`, and a file's own test module.
fn production_part(relative: &str, text: &str) -> Option<String> {
    let file = relative.rsplit('/').next().unwrap_or(relative);
    if relative.starts_with("testing/")
        || file == "tests.rs"
        || file.ends_with("_tests.rs")
        || relative.contains("/tests/")
    {
        return None;
    }
    let end = text.find("#[cfg(test)]\nmod tests {").unwrap_or(text.len());
    Some(text[..end].to_string())
}

#[test]
fn only_the_owner_destroys_instances_and_volumes() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&root, &mut files);
    assert!(
        files.len() > 50,
        "the source tree was read: {}",
        files.len()
    );
    let mut offenders = Vec::new();
    let mut owner_calls = 0;
    for path in files {
        let relative = path
            .strip_prefix(&root)
            .expect("under src")
            .to_string_lossy()
            .replace('\\', "/");
        let text = std::fs::read_to_string(&path).expect("read a source file");
        let Some(production) = production_part(&relative, &text) else {
            continue;
        };
        for call in DESTROYING {
            let count = production.matches(call).count();
            if count == 0 {
                continue;
            }
            if relative == "dispose.rs" {
                owner_calls += count;
            } else if !EXCEPTIONS.iter().any(|(file, _)| *file == relative) {
                offenders.push(format!("{relative}: {call}"));
            }
        }
    }
    assert!(
        offenders.is_empty(),
        "only crate::dispose destroys instances and volumes; found: {offenders:?}"
    );
    assert!(owner_calls >= 2, "the owner's own calls are seen");
}

#[test]
fn a_call_outside_the_owner_is_caught() {
    let text = "async fn f(r: &dyn Runtime) { r.delete_instance(\"x\", t).await; }\n\
                #[cfg(test)]\nmod tests { fn g() { r.delete_volume(p, v, None); } }";
    let production = production_part("reconcile/project.rs", text).unwrap();
    assert!(production.contains(DESTROYING[0]));
    assert!(!production.contains(DESTROYING[1]));
    assert!(production_part("reconcile/tests.rs", text).is_none());
}
