//! The rules ARCHITECTURE.md states, kept by reading the source tree: which top-level module may
//! import which (one direction, no cycle), no `berth.dev/` name spelled outside `berth-api`,
//! feature `testing` only where the list below says, and a code-map entry in ARCHITECTURE.md for
//! every top-level module (and none for a module that does not exist).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Each top-level module and the top-level modules its production code may name (`crate::X`).
/// A new arrow is added here on purpose, and must not close a cycle.
#[rustfmt::skip]
const ALLOWED: &[(&str, &[&str])] = &[
    ("activity_log", &["scheduler"]),
    ("admission", &["agent", "file_roots", "runtime", "store"]),
    ("agent", &["file_roots", "runtime"]),
    ("api", &[
        "admission", "agent", "auth", "clock", "config", "inspect", "layout", "metrics", "network",
        "preview", "reconcile", "runtime", "scheduler", "secrets", "store", "tools", "trash",
        "workspace",
    ]),
    ("auth", &["store"]),
    ("cli", &[
        "api", "client", "config", "daemon", "gitops", "inspect", "manifests", "mcp", "preview",
        "scheduler", "trash", "workspace",
    ]),
    ("client", &["config"]),
    ("clock", &[]),
    ("config", &["trash"]),
    ("daemon", &[
        "activity_log", "admission", "api", "config", "file_roots", "gitops", "inspect", "lxd",
        "metrics", "preview", "reconcile", "runtime_handle", "scheduler", "secrets", "store",
        "tools", "trash",
    ]),
    ("dispose", &["clock", "layout", "runtime", "store", "trash"]),
    ("file_roots", &[]),
    ("gitops", &["admission", "manifests", "secrets", "store"]),
    ("inspect", &["activity_log", "layout", "runtime", "runtime_handle", "store"]),
    ("layout", &["runtime", "trash"]),
    ("lxd", &["runtime"]),
    ("manifests", &[]),
    ("mcp", &["client", "tools"]),
    ("metrics", &["lxd"]),
    ("network", &["runtime"]),
    ("preview", &["runtime"]),
    ("reconcile", &[
        "agent", "clock", "config", "dispose", "file_roots", "layout", "metrics", "runtime",
        "runtime_handle", "secrets", "store", "trash", "workspace",
    ]),
    ("runtime", &[]),
    ("runtime_handle", &["lxd", "runtime"]),
    ("scheduler", &[
        "agent", "clock", "config", "layout", "metrics", "network", "preview", "reconcile",
        "runtime", "store", "trash", "workspace",
    ]),
    ("secrets", &["store"]),
    ("store", &[]),
    ("testing", &[]),
    ("tools", &["agent", "inspect", "reconcile", "runtime", "runtime_handle", "secrets", "store"]),
    ("trash", &["admission", "agent", "clock", "metrics", "runtime", "store"]),
    ("workspace", &["agent", "layout", "runtime", "store"]),
];

/// The files that may name feature `testing`: the crate root (what the feature builds), the
/// fault points and the clock shift the end-to-end tests drive.
const TESTING_FEATURE: [&str; 3] = ["lib.rs", "reconcile/fault.rs", "clock.rs"];

/// Every source file under `src/` with its production text: comments out, and each item marked
/// `#[cfg(test)]` at the top level of the file left out (a `mod x;` line, or a block up to its
/// closing `}` at column 0). Test files, `testing/` and this file are not production.
fn production() -> Vec<(String, String)> {
    fn walk(dir: &Path, root: &Path, out: &mut Vec<(String, String)>) {
        for entry in std::fs::read_dir(dir).expect("read the source tree") {
            let path = entry.expect("a directory entry").path();
            if path.is_dir() {
                walk(&path, root, out);
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let relative = path
                .strip_prefix(root)
                .expect("under src")
                .to_string_lossy()
                .replace('\\', "/");
            let file = relative.rsplit('/').next().unwrap_or(&relative);
            if relative.starts_with("testing/") || file == "tests.rs" || file.ends_with("_tests.rs")
            {
                continue;
            }
            let text = std::fs::read_to_string(&path).expect("read a source file");
            out.push((relative, production_text(&text)));
        }
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut out = Vec::new();
    walk(&root, &root, &mut out);
    assert!(out.len() > 50, "the source tree was read: {}", out.len());
    out
}

fn production_text(text: &str) -> String {
    let mut kept = String::new();
    let mut lines = text.lines();
    while let Some(line) = lines.next() {
        if line == "#[cfg(test)]" {
            for item in lines.by_ref() {
                if item.starts_with("#[") {
                    continue;
                }
                if !item.trim_end().ends_with(';') {
                    for rest in lines.by_ref() {
                        if rest == "}" {
                            break;
                        }
                    }
                }
                break;
            }
            continue;
        }
        if line.trim_start().starts_with("//") {
            continue;
        }
        kept.push_str(line);
        kept.push('\n');
    }
    kept
}

fn top_level(relative: &str) -> &str {
    let first = relative.split('/').next().unwrap_or(relative);
    first.strip_suffix(".rs").unwrap_or(first)
}

#[test]
fn top_level_modules_import_only_what_the_table_allows() {
    let allowed: BTreeMap<&str, BTreeSet<&str>> = ALLOWED
        .iter()
        .map(|(module, deps)| (*module, deps.iter().copied().collect()))
        .collect();
    let sources = production();
    let modules: BTreeSet<&str> = sources.iter().map(|(r, _)| top_level(r)).collect();
    let mut offenders = Vec::new();
    for (relative, text) in &sources {
        let module = top_level(relative);
        if matches!(module, "lib" | "main" | "invariants_tests") {
            continue;
        }
        let Some(may) = allowed.get(module) else {
            offenders.push(format!("{module}: not in the table"));
            continue;
        };
        for used in text.split("crate::").skip(1) {
            let name: String = used
                .chars()
                .take_while(|c| c.is_ascii_lowercase() || *c == '_')
                .collect();
            if name != module && modules.contains(name.as_str()) && !may.contains(name.as_str()) {
                offenders.push(format!("{relative}: crate::{name}"));
            }
        }
    }
    offenders.sort();
    offenders.dedup();
    assert!(
        offenders.is_empty(),
        "imports the table in invariants_tests.rs does not allow (add the arrow on purpose, \
         or move the code): {offenders:#?}"
    );
}

#[test]
fn the_allowed_imports_have_no_cycle() {
    let graph: BTreeMap<&str, &[&str]> = ALLOWED.iter().copied().collect();
    // Kahn's algorithm: what never reaches in-degree zero sits on a cycle.
    let mut pending: BTreeMap<&str, usize> = graph.keys().map(|m| (*m, 0)).collect();
    for deps in graph.values() {
        for dep in *deps {
            *pending.entry(dep).or_default() += 1;
        }
    }
    let mut ready: Vec<&str> = pending
        .iter()
        .filter(|(_, n)| **n == 0)
        .map(|(m, _)| *m)
        .collect();
    let mut seen = 0;
    while let Some(module) = ready.pop() {
        seen += 1;
        for dep in graph.get(module).copied().unwrap_or_default() {
            let n = pending.get_mut(dep).expect("counted");
            *n -= 1;
            if *n == 0 {
                ready.push(dep);
            }
        }
    }
    let on_cycle: Vec<&str> = pending
        .iter()
        .filter(|(_, n)| **n > 0)
        .map(|(m, _)| *m)
        .collect();
    assert_eq!(seen, pending.len(), "a cycle through {on_cycle:?}");
}

/// The crate's top-level modules as `lib.rs` declares them, each with whether it is built
/// only for tests (`#[cfg(test)]`, or `cfg(any(test, ...))` like `testing`).
fn declared_modules() -> Vec<(String, bool)> {
    let lib = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("src/lib.rs"))
        .expect("read lib.rs");
    let mut modules = Vec::new();
    let mut test_only = false;
    for line in lib.lines().map(str::trim) {
        if line.starts_with("#[cfg(") {
            test_only = line.contains("test");
            continue;
        }
        let declared = line
            .strip_prefix("pub mod ")
            .or_else(|| line.strip_prefix("mod "))
            .and_then(|rest| rest.strip_suffix(';'));
        if let Some(name) = declared {
            modules.push((name.to_string(), test_only));
        }
        test_only = false;
    }
    assert!(modules.len() > 20, "lib.rs was read: {modules:?}");
    modules
}

/// ARCHITECTURE.md's code map has an entry (a line `- \`NAME/\`` or `- \`NAME.rs\`` under
/// `### \`controller/\``) for every top-level module of the crate, and names none that does not
/// exist, there or as `crate::NAME` anywhere in the document.
#[test]
fn the_code_map_names_every_top_level_module() {
    let doc =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../ARCHITECTURE.md"))
            .expect("read ARCHITECTURE.md");
    let declared = declared_modules();
    let existing: BTreeSet<&str> = declared
        .iter()
        .map(|(name, _)| name.as_str())
        .chain(["main", "lib"])
        .collect();
    let section = doc
        .split("### `controller/`")
        .nth(1)
        .expect("ARCHITECTURE.md has a `### `controller/`` section");
    let section = section.split("\n#").next().unwrap_or(section);
    let entries: BTreeSet<&str> = section
        .lines()
        .filter_map(|line| line.strip_prefix("- `"))
        .filter_map(|rest| rest.split('`').next())
        .map(|name| {
            name.strip_suffix('/')
                .or_else(|| name.strip_suffix(".rs"))
                .unwrap_or(name)
        })
        .collect();
    let missing: Vec<&str> = declared
        .iter()
        .filter(|(name, test_only)| !test_only && !entries.contains(name.as_str()))
        .map(|(name, _)| name.as_str())
        .collect();
    let unknown: BTreeSet<&str> = entries
        .iter()
        .copied()
        .chain(doc.split("crate::").skip(1).map(|rest| {
            let end = rest
                .find(|c: char| !(c.is_ascii_lowercase() || c == '_'))
                .unwrap_or(rest.len());
            &rest[..end]
        }))
        .filter(|name| !existing.contains(name))
        .collect();
    assert!(
        missing.is_empty(),
        "top-level modules without a code-map entry in ARCHITECTURE.md: {missing:?}"
    );
    assert!(
        unknown.is_empty(),
        "ARCHITECTURE.md names top-level modules that do not exist: {unknown:?}"
    );
}

#[test]
fn berth_dev_names_are_spelled_only_in_berth_api() {
    let offenders: Vec<String> = production()
        .into_iter()
        .filter(|(relative, _)| relative != "invariants_tests.rs")
        .flat_map(|(relative, text)| {
            text.lines()
                .filter(|line| line.contains("\"berth.dev/"))
                .map(|line| format!("{relative}: {}", line.trim()))
                .collect::<Vec<_>>()
        })
        .collect();
    assert!(
        offenders.is_empty(),
        "name these through berth_api (annotations, API_VERSION, ...): {offenders:#?}"
    );
}

#[test]
fn feature_testing_is_named_only_where_allowed() {
    let offenders: Vec<String> = production()
        .into_iter()
        .filter(|(relative, text)| {
            text.contains("feature = \"testing\"") && !TESTING_FEATURE.contains(&relative.as_str())
        })
        .map(|(relative, _)| relative)
        .collect();
    assert!(
        offenders.is_empty(),
        "production code gated on feature testing: {offenders:?}"
    );
}

/// Every field of a Project's status has its writers declared in `PROJECT_FIELDS`, and every
/// declared field is one the status has: a field nobody owns is one no writer may set.
#[test]
fn every_project_status_field_has_an_owner() {
    let (_, schema) = berth_api::schemas()
        .into_iter()
        .find(|(file, _)| *file == "project.json")
        .expect("the Project schema");
    let fields: BTreeSet<String> = schema["$defs"]["ProjectStatus"]["properties"]
        .as_object()
        .expect("the status has properties")
        .keys()
        .cloned()
        .collect();
    let owned: BTreeSet<String> = crate::store::PROJECT_FIELDS
        .iter()
        .filter(|f| !f.owners.is_empty())
        .map(|f| f.name.to_string())
        .collect();
    let unowned: Vec<&String> = fields.difference(&owned).collect();
    // The reconciler's own record (`status.controller`: when a step started, ...) is JSON it
    // alone reads, outside the typed status.
    let unknown: Vec<&String> = owned
        .difference(&fields)
        .filter(|f| f.as_str() != "controller")
        .collect();
    assert!(
        unowned.is_empty(),
        "status fields without an owner in PROJECT_FIELDS: {unowned:?}"
    );
    assert!(
        unknown.is_empty(),
        "PROJECT_FIELDS names fields the status lacks: {unknown:?}"
    );
}

/// Events are written by the store's one recorder (`record_or_warn`, `publish_event`, which
/// log a failure and keep writes off the async workers): nobody outside the store calls the
/// raw write.
#[test]
fn events_are_recorded_only_through_the_recorder() {
    let bypasses: Vec<String> = production()
        .into_iter()
        .filter(|(file, text)| !file.starts_with("store/") && text.contains(".record_event("))
        .map(|(file, _)| file)
        .collect();
    assert!(
        bypasses.is_empty(),
        "events recorded around the recorder in {bypasses:?}"
    );
}

/// The store's writes of objects, their status and their events, one entry point per verb
/// (with its parameters in a struct: `PostParams`, `ApplyParams`, `SetParams`, `StatusWrite`);
/// the raw status and event writes stay private to the store.
const STORE_WRITES: &[&str] = &[
    "apply",
    "apply_batch",
    "apply_set",
    "create",
    "delete",
    "publish_event",
    "record_or_warn",
    "replace",
    "request_forced_checkout",
    "request_forced_replace",
    "request_look",
    "set_finalizers",
    "write_status",
    "write_status_typed",
];

/// No write entry point comes back public beside the verbs: a `pub fn` of the store named like
/// a write of an object (create, replace, apply, update, record, write, set, delete, request,
/// publish, alone or followed by `_`) is one of [`STORE_WRITES`]. `store/access.rs` holds users,
/// membership and secrets, not objects.
#[test]
fn the_store_writes_objects_only_through_its_verbs() {
    const WRITE_VERBS: [&str; 10] = [
        "create", "replace", "apply", "update", "record", "write", "set", "delete", "request",
        "publish",
    ];
    let mut public = BTreeSet::new();
    for (file, text) in production() {
        if !file.starts_with("store/") || file == "store/access.rs" {
            continue;
        }
        for line in text.lines() {
            let line = line.trim_start();
            let Some(rest) = line
                .strip_prefix("pub fn ")
                .or_else(|| line.strip_prefix("pub async fn "))
            else {
                continue;
            };
            let name: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            let write = WRITE_VERBS.iter().any(|verb| {
                name.strip_prefix(verb)
                    .is_some_and(|rest| rest.is_empty() || rest.starts_with('_'))
            });
            if write {
                public.insert(name);
            }
        }
    }
    let expected: BTreeSet<String> = STORE_WRITES.iter().map(|s| s.to_string()).collect();
    let extra: Vec<&String> = public.difference(&expected).collect();
    let missing: Vec<&String> = expected.difference(&public).collect();
    assert!(
        extra.is_empty(),
        "public store writes beside the verbs (make them private, or a parameter): {extra:?}"
    );
    assert!(
        missing.is_empty(),
        "store verbs this test no longer finds (update STORE_WRITES): {missing:?}"
    );
}
