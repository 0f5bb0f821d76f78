//! The `berth` client end to end: the real binary against a real `berth serve --paused` (real
//! SQLite, real unix socket), one daemon per test. Where a test needs the controller's part (a
//! status moving through the steps), it writes status through the API exactly as the controller
//! does, since a paused daemon's controller acts on nothing.

use std::io::Read;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::support::cli::{Run, finish};
use crate::support::daemon::Daemon;

/// Generous: the machine is small and shared.
const COMMAND_DEADLINE: Duration = Duration::from_secs(90);
/// The same, for a condition the test polls.
const CONDITION_DEADLINE: Duration = Duration::from_secs(60);

fn project(name: &str, extra: &str) -> String {
    format!("apiVersion: berth.dev/v1alpha1\nkind: Project\nmetadata:\n  name: {name}\n{extra}")
}

const TWO_PROJECTS: &str = "\
apiVersion: berth.dev/v1alpha1
kind: Project
metadata:
  name: payments-api
  labels: {team: payments}
spec:
  displayName: Payments API
  env: {NODE_ENV: development}
---
# a comment-only document is skipped
---
apiVersion: berth.dev/v1alpha1
kind: Project
metadata:
  name: web
  labels: {team: frontend}
spec:
  image: berth-base
";

fn names_in(run: &Run) -> Vec<String> {
    run.stdout.lines().map(str::to_string).collect()
}

#[test]
fn apply_then_get_yaml_applies_back_unchanged() {
    let daemon = Daemon::start();
    let file = daemon.file("projects.yaml", TWO_PROJECTS);
    let run = daemon.berth(&["apply", "-f", &file]).ok();
    assert_eq!(
        names_in(&run),
        ["project/payments-api created", "project/web created"]
    );

    // With the status a controller writes, too.
    daemon.put_status(
        "payments-api",
        json!({"observedGeneration": 1, "phase": "Provisioning", "step": "Created",
               "conditions": [{"type": "Ready", "status": "False", "reason": "Starting",
                               "message": "booting", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}),
    );

    // One object's YAML, and the whole list's, both apply back as they are.
    let one = daemon
        .berth(&["get", "project", "payments-api", "-o", "yaml"])
        .ok();
    assert!(one.stdout.contains("kind: Project"), "{}", one.stdout);
    let one_file = daemon.file("one.yaml", &one.stdout);
    let back = daemon.berth(&["apply", "-f", &one_file]).ok();
    assert_eq!(names_in(&back), ["project/payments-api unchanged"]);

    let list = daemon.berth(&["get", "projects", "-o", "yaml"]).ok();
    assert!(list.stdout.contains("kind: ProjectList"), "{}", list.stdout);
    let back = daemon
        .berth_with_stdin(&["apply", "-f", "-"], Some(&list.stdout))
        .ok();
    assert_eq!(
        names_in(&back),
        ["project/payments-api unchanged", "project/web unchanged"]
    );

    let json = daemon.object("project", "payments-api");
    assert_eq!(json["spec"]["displayName"], "Payments API");
    assert_eq!(json["metadata"]["labels"]["team"], "payments");

    let described = daemon.berth(&["describe", "project", "payments-api"]).ok();
    for expected in [
        "Name:               payments-api",
        "Display Name:       Payments API",
        "Labels:             team=payments",
        "Spec:",
        "NODE_ENV: development",
        "Status:",
        "  Phase:               Provisioning",
        "  Step:                Created",
        "Conditions:",
        "  Ready   False    Starting",
        "Events:",
    ] {
        assert!(
            described.stdout.contains(expected),
            "{expected:?} in {}",
            described.stdout
        );
    }
}

#[test]
fn reapplying_changes_no_resource_version_and_a_spec_change_moves_generation() {
    let daemon = Daemon::start();
    let file = daemon.file("projects.yaml", TWO_PROJECTS);
    daemon.berth(&["apply", "-f", &file]).ok();
    let before = daemon.object("project", "web");

    let again = daemon.berth(&["apply", "-f", &file]).ok();
    assert_eq!(
        names_in(&again),
        ["project/payments-api unchanged", "project/web unchanged"]
    );
    let after = daemon.object("project", "web");
    assert_eq!(
        before["metadata"]["resourceVersion"],
        after["metadata"]["resourceVersion"]
    );
    assert_eq!(
        before["metadata"]["generation"],
        after["metadata"]["generation"]
    );

    let dry = daemon.file("dry.yaml", &project("web", "spec:\n  brief: do a thing\n"));
    let run = daemon.berth(&["apply", "-f", &dry, "--dry-run"]).ok();
    assert_eq!(names_in(&run), ["project/web configured (dry run)"]);
    assert_eq!(
        daemon.object("project", "web")["metadata"]["generation"],
        before["metadata"]["generation"]
    );

    daemon.berth(&["apply", "-f", &dry]).ok();
    let changed = daemon.object("project", "web");
    assert_eq!(changed["spec"]["brief"], "do a thing");
    assert_eq!(
        changed["metadata"]["generation"].as_i64().unwrap(),
        before["metadata"]["generation"].as_i64().unwrap() + 1
    );
}

#[test]
fn a_bad_batch_persists_nothing_and_names_where_it_is_wrong() {
    let good = project("good-one", "spec:\n  displayName: Good\n");
    // (documents after the good one, what stderr must say)
    let cases: &[(&str, &[&str])] = &[
        (
            "apiVersion: berth.dev/v1alpha1\nkind: Project\nmetadata:\n\tname: tabbed\n",
            &["batch.yaml: document 3: line 16 column 1:"],
        ),
        (
            "apiVersion: berth.dev/v1alpha1\nkind: Project\nmetadata: {name: x\n",
            &["batch.yaml: document 3: line 16 column 1:"],
        ),
        (
            "apiVersion: berth.dev/v1alpha1\nkind: Project\nmetadata:\n  name: odd\nspecc: {}\n",
            &[
                "batch.yaml: document 3 (project/odd): specc",
                "unknown field",
            ],
        ),
        (
            "apiVersion: berth.dev/v1alpha1\nkind: Project\nmetadata:\n  name: Not_A_Name\n",
            &["batch.yaml: document 3 (project/Not_A_Name): metadata.name"],
        ),
        (
            "apiVersion: berth.dev/v1alpha1\nkind: Project\nmetadata:\n  name: big\nspec:\n  resources: {memory: 4 gigs}\n",
            &[
                "batch.yaml: document 3 (project/big): spec.resources.memory: \"4 gigs\" is not a quantity",
            ],
        ),
        (
            "apiVersion: berth.dev/v1alpha1\nkind: Widget\nmetadata:\n  name: w\n",
            &["batch.yaml: document 3: kind: unknown kind \"Widget\""],
        ),
        (
            "apiVersion: berth.dev/v1alpha1\nkind: Project\nmetadata:\n  name: num\n  labels: {x: 1}\n  annotations: {y: true}\n",
            &[
                "batch.yaml: document 3 (project/num): metadata.annotations.y: must be a string",
                "batch.yaml: document 3 (project/num): metadata.labels.x: must be a string",
            ],
        ),
    ];
    let daemon = Daemon::start();
    for (bad, expected) in cases {
        let text = format!("{good}---\n{}---\n{bad}", project("second-good", ""));
        let file = daemon.file("batch.yaml", &text);
        let run = daemon.berth(&["apply", "-f", &file]).fails(1);
        for needle in *expected {
            assert!(
                run.stderr.contains(needle),
                "{needle:?} in {:?}",
                run.stderr
            );
        }
        // One line of reason, plus at most one line per cause.
        assert!(run.stderr.lines().count() <= 3, "{:?}", run.stderr);
        let listed = daemon.berth(&["get", "projects", "-o", "name"]).ok();
        assert_eq!(
            listed.stdout, "",
            "nothing persists from a bad batch: {bad}"
        );
    }
}

#[test]
fn unknown_fields_are_rejected_with_their_path() {
    let daemon = Daemon::start();
    let cases = [
        ("specc: {}\n", "specc"),
        ("status: {}\nextra: 1\n", "extra"),
        ("spec:\n  imagee: berth-base\n", "spec.imagee"),
        (
            "spec:\n  seedFiles: [{path: a, content: b, colour: red}]\n",
            "spec.seedFiles[0].colour",
        ),
        ("metadata2: {}\n", "metadata2"),
    ];
    for (extra, path) in cases {
        let file = daemon.file("typo.yaml", &project("typo", extra));
        let run = daemon.berth(&["apply", "-f", &file]).fails(1);
        assert!(
            run.stderr.starts_with("Error from server (Invalid): "),
            "{:?}",
            run.stderr
        );
        assert!(
            run.stderr.contains(&format!("{path}: unknown field")),
            "{path} in {:?}",
            run.stderr
        );
    }
}

#[test]
fn diff_exits_0_when_same_1_when_different_2_on_error() {
    let daemon = Daemon::start();
    let file = daemon.file("projects.yaml", TWO_PROJECTS);
    daemon.berth(&["apply", "-f", &file]).ok();

    let same = daemon.berth(&["diff", "-f", &file]).fails(0);
    assert_eq!(same.stdout, "");

    let changed = daemon.file(
        "changed.yaml",
        &TWO_PROJECTS.replace("NODE_ENV: development", "NODE_ENV: production"),
    );
    let run = daemon.berth(&["diff", "-f", &changed]).fails(1);
    assert!(
        run.stdout
            .contains("--- live/project/payments-api\n+++ merged/project/payments-api\n"),
        "{}",
        run.stdout
    );
    assert!(
        run.stdout
            .contains("-    NODE_ENV: development\n+    NODE_ENV: production\n"),
        "{}",
        run.stdout
    );
    assert!(
        !run.stdout.contains("project/web"),
        "web is unchanged: {}",
        run.stdout
    );

    let new = daemon.file("new.yaml", &project("brand-new", ""));
    let run = daemon.berth(&["diff", "-f", &new]).fails(1);
    assert!(run.stdout.contains("+  name: brand-new"), "{}", run.stdout);
    // A diff writes nothing.
    daemon.berth(&["get", "project", "brand-new"]).fails(1);

    // A large batch is compared against one list call; the answer is the same.
    let many: Vec<String> = (0..30).map(|i| project(&format!("many-{i}"), "")).collect();
    let many_file = daemon.file("many.yaml", &many.join("---\n"));
    daemon.berth(&["apply", "-f", &many_file]).ok();
    daemon.berth(&["diff", "-f", &many_file]).fails(0);
    let one_changed = many.join("---\n").replacen(
        "name: many-7\n",
        "name: many-7\n  labels: {changed: \"yes\"}\n",
        1,
    );
    let changed_file = daemon.file("many-changed.yaml", &one_changed);
    let run = daemon.berth(&["diff", "-f", &changed_file]).fails(1);
    assert_eq!(
        run.stdout.matches("--- live/").count(),
        1,
        "only many-7 differs: {}",
        run.stdout
    );
    assert!(
        run.stdout.contains("+++ merged/project/many-7\n"),
        "{}",
        run.stdout
    );

    let missing = daemon.dir.path().join("missing.yaml");
    let run = daemon
        .berth(&["diff", "-f", missing.to_str().unwrap()])
        .fails(2);
    assert!(run.stderr.contains("missing.yaml"), "{}", run.stderr);
    let invalid = daemon.file("invalid.yaml", &project("bad", "specc: {}\n"));
    daemon.berth(&["diff", "-f", &invalid]).fails(2);
}

#[test]
fn delete_waits_until_gone() {
    let daemon = Daemon::start();
    let file = daemon.file("projects.yaml", TWO_PROJECTS);
    daemon.berth(&["apply", "-f", &file]).ok();

    let run = daemon.berth(&["delete", "project", "web"]).ok();
    assert_eq!(run.stdout, "project/web deleted\n");
    let gone = daemon.berth(&["get", "project", "web"]).fails(1);
    assert!(
        gone.stderr.starts_with("Error from server (NotFound): "),
        "{}",
        gone.stderr
    );

    let run = daemon.berth(&["delete", "-f", &file, "--wait=false"]);
    // payments-api is deleted; web no longer exists, which is an error.
    assert_eq!(run.code, 1, "{run:?}");
    assert!(run.stderr.contains("NotFound"), "{run:?}");

    daemon.berth(&["apply", "-f", &file]).ok();
    let run = daemon.berth(&["delete", "-f", &file]).ok();
    assert_eq!(
        names_in(&run),
        ["project/payments-api deleted", "project/web deleted"]
    );
    assert_eq!(
        daemon.berth(&["get", "projects", "-o", "name"]).ok().stdout,
        ""
    );
}

#[test]
fn a_held_deletion_exits_1_with_its_reason() {
    let daemon = Daemon::start();
    let file = daemon.file("p.yaml", &project("held", ""));
    daemon.berth(&["apply", "-f", &file]).ok();
    // A finalizer holds the deletion, as the controller's does.
    let mut object = daemon.object("project", "held");
    object["metadata"]["finalizers"] = json!(["berth.dev/test-hold"]);
    daemon.put("projects/held", &object);

    let child = daemon
        .command(&["delete", "project", "held", "--timeout=60s"])
        .stdin(Stdio::null())
        .spawn()
        .expect("run berth delete");
    // Once the deletion is marked, the controller reports why it holds it, answering the
    // fresh look the delete asked for.
    daemon.wait_until(CONDITION_DEADLINE, "the condition", || {
        !daemon.object("project", "held")["metadata"]["deletionTimestamp"].is_null()
    });
    let requested =
        daemon.object("project", "held")["metadata"]["annotations"]["berth.dev/lookRequestedAt"]
            .clone();
    assert!(requested.is_string(), "a delete asks for a fresh look");
    daemon.put_status(
        "held",
        json!({"phase": "Deleting", "conditions": [{
            "type": "DeletionBlocked", "status": "True", "reason": "UnsavedWork",
            "message": "2 uncommitted files", "lastTransitionTime": "2026-01-01T00:00:00Z"}],
            "deletionHold": {"answered": requested}}),
    );
    let run = finish(child, &["delete"]).fails(1);
    assert!(
        run.stderr
            .contains("project/held: deletion blocked: UnsavedWork: 2 uncommitted files"),
        "{run:?}"
    );
}

#[test]
fn create_project_derives_names_and_takes_the_next_suffix() {
    let daemon = Daemon::start();
    let cases = [
        ("Payments API", Ok("payments-api")),
        ("Payments-API!", Ok("payments-api-2")),
        ("Payments API 2", Ok("payments-api-2-2")),
        ("payments api", Err("Conflict")),
        ("!!!", Err("DISPLAY_NAME")),
    ];
    for (display, expected) in cases {
        let run = daemon.berth(&["create", "project", display, "--brief", "look around"]);
        match expected {
            Ok(name) => {
                let run = run.ok();
                assert_eq!(run.stdout, format!("project/{name} created\n"));
                let object = daemon.object("project", name);
                assert_eq!(object["spec"]["displayName"], display);
                assert_eq!(object["spec"]["brief"], "look around");
            }
            Err(needle) => {
                let run = run.fails(1);
                assert!(run.stderr.contains(needle), "{needle} in {run:?}");
            }
        }
    }
}

#[test]
fn get_tables_align_and_name_output_is_kind_slash_name() {
    let daemon = Daemon::start();
    let file = daemon.file("projects.yaml", TWO_PROJECTS);
    daemon.berth(&["apply", "-f", &file]).ok();

    for args in [
        &["get", "projects"][..],
        &["get", "project", "-o", "wide"][..],
    ] {
        let run = daemon.berth(args).ok();
        let lines: Vec<&str> = run.stdout.lines().collect();
        assert_eq!(lines.len(), 3, "{}", run.stdout);
        assert!(
            lines[0].starts_with("NAME           DISPLAY NAME   PHASE     STEP   AGE"),
            "{}",
            run.stdout
        );
        // Every column starts where its header starts.
        let starts: Vec<usize> = column_starts(lines[0]);
        for line in &lines[1..] {
            for &start in &starts[..3] {
                assert!(
                    start == 0
                        || line.as_bytes()[start - 1] == b' ' && line.as_bytes()[start] != b' ',
                    "column at {start} misaligned in {line:?}"
                );
            }
            assert!(!line.ends_with(' '));
        }
        assert!(
            lines[1].starts_with("payments-api   Payments API   Pending"),
            "{}",
            run.stdout
        );
        assert!(
            lines[2].starts_with("web            web            Pending"),
            "{}",
            run.stdout
        );
    }

    let wide = daemon.berth(&["get", "projects", "-o", "wide"]).ok();
    assert!(
        wide.stdout
            .lines()
            .next()
            .unwrap()
            .ends_with("IMAGE        AGENT   TITLE   PROTECTED   PORTS   NEXT RUN   MEMBER"),
        "{}",
        wide.stdout
    );

    let names = daemon.berth(&["get", "projects", "-o", "name"]).ok();
    assert_eq!(names.stdout, "project/payments-api\nproject/web\n");
    let two = daemon
        .berth(&["get", "projects", "web", "payments-api", "-o", "name"])
        .ok();
    assert_eq!(two.stdout, "project/web\nproject/payments-api\n");
    let two_yaml = daemon
        .berth(&["get", "projects", "web", "payments-api", "-o", "yaml"])
        .ok();
    let back = daemon
        .berth_with_stdin(&["apply", "-f", "-"], Some(&two_yaml.stdout))
        .ok();
    assert_eq!(
        names_in(&back),
        ["project/web unchanged", "project/payments-api unchanged"]
    );
    let selected = daemon
        .berth(&["get", "projects", "-l", "team=frontend", "-o", "name"])
        .ok();
    assert_eq!(selected.stdout, "project/web\n");
    let selected = daemon
        .berth(&["get", "projects", "-l", "team!=frontend", "-o", "name"])
        .ok();
    assert_eq!(selected.stdout, "project/payments-api\n");

    let empty = daemon.berth(&["get", "agentprofiles"]).ok();
    assert_eq!(empty.stdout, "");
    assert_eq!(empty.stderr, "No resources found.\n");

    let unknown = daemon.berth(&["get", "widgets"]);
    assert_ne!(unknown.code, 0);
    assert!(
        unknown.stderr.contains("unknown kind \"widgets\""),
        "{unknown:?}"
    );
}

/// Every spelling of a kind the command line takes (singular, plural, short name, any case)
/// names the same objects, alone and in `KIND/NAME`; any other word is refused with one line
/// naming it and the valid kinds.
#[test]
fn every_spelling_of_a_kind_names_the_same_objects() {
    let daemon = Daemon::start();
    let file = daemon.file("p.yaml", &project("spelled", ""));
    daemon.berth(&["apply", "-f", &file]).ok();

    for word in ["project", "projects", "proj", "Project", "PROJECTS", "Proj"] {
        let all = daemon.berth(&["get", word, "-o", "name"]).ok();
        assert_eq!(all.stdout, "project/spelled\n", "get {word}");
        let one = format!("{word}/spelled");
        let named = daemon.berth(&["get", &one, "-o", "name"]).ok();
        assert_eq!(named.stdout, "project/spelled\n", "get {one}");
        let described = daemon.berth(&["describe", word, "spelled"]).ok();
        assert!(
            described.stdout.contains("Kind:               Project\n"),
            "describe {word}: {described:?}"
        );
    }
    for word in [
        "agentprofile",
        "agentprofiles",
        "ap",
        "AgentProfile",
        "gitsource",
        "gitsources",
        "gs",
        "GitSource",
    ] {
        let none = daemon.berth(&["get", word]).ok();
        assert_eq!(
            (none.stdout.as_str(), none.stderr.as_str()),
            ("", "No resources found.\n"),
            "get {word}"
        );
    }

    for word in ["widgets", "pods", "projs", "po"] {
        let expected =
            format!("unknown kind {word:?} (expected project, agentprofile or gitsource)");
        let refused = daemon.berth(&["delete", word, "spelled"]).fails(1);
        assert_eq!(
            refused.stderr,
            format!("error: {expected}\n"),
            "delete {word}"
        );
        let refused = daemon.berth(&["get", word]);
        assert_ne!(refused.code, 0, "get {word}: {refused:?}");
        let first = refused.stderr.lines().next().unwrap_or_default();
        assert!(
            first.starts_with("error: ") && first.ends_with(&expected),
            "get {word}: {refused:?}"
        );
    }
    let kept = daemon.berth(&["get", "projects", "-o", "name"]).ok();
    assert_eq!(kept.stdout, "project/spelled\n");
}

fn column_starts(header: &str) -> Vec<usize> {
    let bytes = header.as_bytes();
    (0..bytes.len())
        .filter(|&i| bytes[i] != b' ' && (i == 0 || header[..i].ends_with("   ")))
        .collect()
}

#[test]
fn wait_times_out_with_a_message_and_apply_wait_prints_each_step() {
    let daemon = Daemon::start();
    let file = daemon.file("p.yaml", &project("slow", ""));
    daemon.berth(&["apply", "-f", &file]).ok();

    let run = daemon
        .berth(&[
            "wait",
            "project/slow",
            "--for=condition=Ready",
            "--timeout=1s",
        ])
        .fails(1);
    assert!(
        run.stderr
            .contains("timed out after 1s waiting for project/slow to have condition Ready=True"),
        "{run:?}"
    );
    let run = daemon
        .berth(&["wait", "project/absent", "--for=condition=Ready"])
        .fails(1);
    assert!(run.stderr.contains("NotFound"), "{run:?}");
    daemon
        .berth(&["wait", "project/absent", "--for=delete"])
        .ok();

    // apply --wait follows the steps the controller records, then ends on Ready.
    let generation = daemon.object("project", "slow")["metadata"]["generation"].clone();
    let child = daemon
        .command(&["apply", "-f", &file, "--wait", "--timeout=60s"])
        .stdin(Stdio::null())
        .spawn()
        .expect("run berth apply --wait");
    for step in ["Created", "Started", "Reachable"] {
        daemon.put_status(
            "slow",
            json!({"observedGeneration": generation, "phase": "Provisioning", "step": step}),
        );
    }
    daemon.put_status(
        "slow",
        json!({"observedGeneration": generation, "phase": "Ready", "step": "Seeded",
               "conditions": [{"type": "Ready", "status": "True", "reason": "Seeded",
                               "lastTransitionTime": "2026-01-01T00:00:00Z"}]}),
    );
    let run = finish(child, &["apply", "--wait"]).ok();
    let lines = names_in(&run);
    assert_eq!(
        lines.first().map(String::as_str),
        Some("project/slow unchanged")
    );
    assert_eq!(lines.last().map(String::as_str), Some("project/slow ready"));
    assert!(lines.contains(&"slow: Seeded".to_string()), "{lines:?}");
    // Steps print in order, each once.
    let steps: Vec<&String> = lines.iter().filter(|l| l.starts_with("slow: ")).collect();
    let mut sorted = steps.clone();
    sorted.dedup();
    assert_eq!(steps, sorted, "{lines:?}");

    let run = daemon
        .berth(&[
            "wait",
            "project/slow",
            "--for=condition=Ready",
            "--timeout=30s",
        ])
        .ok();
    assert_eq!(
        run.stdout.lines().last(),
        Some("project/slow condition met")
    );
}

#[test]
fn stop_start_and_restart_set_the_right_fields() {
    let daemon = Daemon::start();
    let file = daemon.file("p.yaml", &project("power", ""));
    daemon.berth(&["apply", "-f", &file]).ok();

    // (command, field that must hold a value afterwards, expected value or None for a timestamp)
    let cases: &[(&[&str], &str, Option<&str>)] = &[
        (&["stop", "power"], "/spec/state", Some("Stopped")),
        (&["start", "power"], "/spec/state", Some("Running")),
        (
            &["start", "power"],
            "/metadata/annotations/berth.dev~1wokenAt",
            None,
        ),
        (
            &["restart", "power"],
            "/metadata/annotations/berth.dev~1restartedAt",
            None,
        ),
        (
            &["restart", "power", "--recreate"],
            "/metadata/annotations/berth.dev~1recreateRequestedAt",
            None,
        ),
    ];
    for (args, pointer, expected) in cases {
        let before = daemon.object("project", "power");
        daemon.berth(args).ok();
        let after = daemon.object("project", "power");
        let value = after
            .pointer(pointer)
            .and_then(Value::as_str)
            .unwrap_or_else(|| panic!("{args:?} left no {pointer} in {after}"));
        match expected {
            Some(expected) => assert_eq!(value, *expected, "{args:?}"),
            None => {
                chrono::DateTime::parse_from_rfc3339(value)
                    .unwrap_or_else(|err| panic!("{args:?}: {value:?} is not RFC 3339: {err}"));
            }
        }
        // Only a spec change moves the generation.
        let spec_changed = before["spec"] != after["spec"];
        let generation = |o: &Value| o["metadata"]["generation"].as_i64().unwrap();
        assert_eq!(
            generation(&after),
            generation(&before) + i64::from(spec_changed),
            "{args:?}"
        );
    }
    let run = daemon.berth(&["stop", "absent"]).fails(1);
    assert!(run.stderr.contains("NotFound"), "{run:?}");
}

#[test]
fn version_and_completion_and_unreachable_server() {
    let daemon = Daemon::start();
    let run = daemon.berth(&["version"]).ok();
    let version = env!("CARGO_PKG_VERSION");
    assert_eq!(
        run.stdout,
        format!("Client Version: {version}\nServer Version: {version}\n")
    );
    for shell in ["bash", "zsh", "fish"] {
        let run = daemon.berth(&["completion", shell]).ok();
        assert!(run.stdout.contains("berth"), "{shell}");
    }

    let nowhere = daemon.dir.path().join("nowhere.sock");
    let run = daemon
        .berth(&["get", "projects", "--server", nowhere.to_str().unwrap()])
        .fails(1);
    assert_eq!(run.stderr.lines().count(), 1, "{run:?}");
    assert!(
        run.stderr.contains("cannot reach the berth server"),
        "{run:?}"
    );
}

fn example(path: &str) -> String {
    format!("{}/../examples/{path}", env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn the_examples_parse_and_apply() {
    let text = std::fs::read_to_string(example("berth.yaml")).expect("examples/berth.yaml");
    let config = berth::config::Config::parse(&text).expect("examples/berth.yaml parses");
    config.validate().expect("examples/berth.yaml is valid");
    assert_eq!(
        config,
        berth::config::Config {
            data_dir: "/var/lib/berth".into(),
            listen: berth::config::ListenConfig {
                socket: "/run/berth/berth.sock".into(),
                ..config.listen.clone()
            },
            ..Default::default()
        },
        "the sample shows the defaults"
    );

    let daemon = Daemon::start();
    let quickstart = example("quickstart/project.yaml");
    let run = daemon.berth(&["apply", "-f", &quickstart]).ok();
    assert_eq!(run.stdout, "project/quickstart created\n");
    daemon.berth(&["diff", "-f", &quickstart]).ok();
    let object = daemon.object("project", "quickstart");
    assert_eq!(object["spec"]["image"], "berth-base");

    // The GitOps layout is valid as a whole, and its projects apply and diff clean.
    let gitops = example("gitops");
    let run = daemon
        .berth(&["apply", "-f", &gitops, "-R", "--dry-run"])
        .ok();
    assert_eq!(run.stdout.lines().count(), 4, "{}", run.stdout);
    assert!(
        run.stdout.contains("gitsource/fleet created (dry run)"),
        "{}",
        run.stdout
    );
    let projects = example("gitops/projects");
    let run = daemon.berth(&["apply", "-f", &projects, "-R"]).ok();
    assert_eq!(
        names_in(&run),
        [
            "project/payments-api created",
            "project/payments-worker created",
            "project/storefront created"
        ]
    );
    daemon.berth(&["diff", "-f", &projects, "-R"]).ok();
}

#[test]
fn the_client_reaches_a_tcp_listener_and_watches_changes() {
    // A free loopback port: bind, read it, release it for the daemon.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let address = format!("127.0.0.1:{port}");
    let daemon = Daemon::start_with(&["--listen", &address]);
    let file = daemon.file("p.yaml", &project("over-tcp", ""));
    daemon.berth(&["apply", "-f", &file]).ok();
    let url = format!("http://{address}");
    let token = daemon
        .berth(&["user", "add", "cli-tcp", "--admin"])
        .ok()
        .stdout;
    let run = daemon
        .berth(&[
            "get",
            "projects",
            "-o",
            "name",
            "--server",
            &url,
            "--token",
            token.trim(),
        ])
        .ok();
    assert_eq!(run.stdout, "project/over-tcp\n");

    // The watch the waits rely on: the existing object first, then each change.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        use berth::client::{Client, Server};
        use berth_api::Kind;
        use berth_api::WatchEventType;
        let client = Client::new(Server::Unix(daemon.socket.clone()), None).expect("client");
        let mut watch = client.watch(Kind::Project).await.expect("watch");
        let first = next_event(&mut watch).await;
        assert_eq!(
            (first.type_, first.object["metadata"]["name"].as_str()),
            (WatchEventType::Added, Some("over-tcp"))
        );
        let patch = json!({"metadata": {"labels": {"seen": "yes"}}});
        client
            .merge_patch(Kind::Project, "over-tcp", &patch)
            .await
            .expect("patch");
        let second = next_event(&mut watch).await;
        assert_eq!(second.type_, WatchEventType::Modified);
        assert_eq!(second.object["metadata"]["labels"]["seen"], "yes");
        client
            .delete(Kind::Project, "over-tcp", false)
            .await
            .expect("delete");
        let third = next_event(&mut watch).await;
        assert_eq!(third.type_, WatchEventType::Deleted);
    });
}

#[test]
fn directories_apply_recursively_in_name_order() {
    let daemon = Daemon::start();
    daemon.file("repo/b.yaml", &project("bee", ""));
    daemon.file("repo/a.yml", &project("ay", ""));
    daemon.file("repo/README.md", "not a manifest");
    daemon.file("repo/nested/c.yaml", &project("sea", ""));
    let dir = daemon.dir.path().join("repo");
    let dir = dir.to_str().unwrap();

    let flat = daemon.berth(&["apply", "-f", dir, "--dry-run"]).ok();
    assert_eq!(
        names_in(&flat),
        [
            "project/ay created (dry run)",
            "project/bee created (dry run)"
        ]
    );
    assert_eq!(
        daemon.berth(&["get", "projects", "-o", "name"]).ok().stdout,
        ""
    );

    let deep = daemon.berth(&["apply", "-f", dir, "-R"]).ok();
    assert_eq!(
        names_in(&deep),
        [
            "project/ay created",
            "project/bee created",
            "project/sea created"
        ]
    );
    daemon.berth(&["diff", "-f", dir, "-R"]).ok();
    let run = daemon.berth(&["delete", "-f", dir, "-R"]).ok();
    assert_eq!(run.stdout.lines().count(), 3);
}

async fn next_event(watch: &mut berth::client::WatchStream) -> berth::client::WatchEvent {
    use futures::StreamExt;
    tokio::time::timeout(Duration::from_secs(30), watch.next())
        .await
        .expect("a watch event within 30s")
        .expect("the watch stays open")
        .expect("a well-formed event")
}

#[test]
fn a_wait_outlives_a_daemon_restart() {
    let mut daemon = Daemon::start();
    let file = daemon.file("p.yaml", &project("sturdy", ""));
    daemon.berth(&["apply", "-f", &file]).ok();
    let generation = daemon.object("project", "sturdy")["metadata"]["generation"].clone();
    daemon.put_status(
        "sturdy",
        json!({"observedGeneration": generation, "phase": "Provisioning", "step": "Created"}),
    );

    let mut child = daemon
        .command(&[
            "wait",
            "project/sturdy",
            "--for=condition=Ready",
            "--timeout=90s",
        ])
        .stdin(Stdio::null())
        .spawn()
        .expect("run berth wait");
    // Its first progress line says the wait has read the object and is following it.
    let stdout = child.stdout.take().expect("stdout pipe");
    let (lines_tx, lines) = std::sync::mpsc::channel::<String>();
    let reader = std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
        {
            let _ = lines_tx.send(line);
        }
    });
    let first = lines
        .recv_timeout(COMMAND_DEADLINE)
        .expect("a progress line from berth wait");
    assert_eq!(first, "sturdy: Created");

    daemon.terminate();
    daemon.restart();
    daemon.put_status(
        "sturdy",
        json!({"observedGeneration": generation, "phase": "Ready", "step": "Reachable",
               "conditions": [{"type": "Ready", "status": "True", "reason": "Reachable",
                               "lastTransitionTime": "2026-01-01T00:00:00Z"}]}),
    );
    let run = finish(child, &["wait"]).ok();
    reader.join().expect("stdout reader");
    let rest: Vec<String> = lines.try_iter().collect();
    assert_eq!(
        rest.last().map(String::as_str),
        Some("project/sturdy condition met"),
        "{rest:?} {run:?}"
    );
}

#[test]
fn prune_deletes_only_what_left_the_applyset() {
    let daemon = Daemon::start();
    daemon.file("fleet/a.yaml", &project("alpha", ""));
    daemon.file("fleet/b.yaml", &project("bravo", ""));
    daemon.file(
        "fleet/c.yaml",
        &project("charlie", "  annotations: {berth.dev/prune: disabled}\n"),
    );
    let outside = daemon.file("outside.yaml", &project("outsider", ""));
    daemon.berth(&["apply", "-f", &outside]).ok();
    let dir = daemon.dir.path().join("fleet");
    let dir = dir.to_str().unwrap();
    let with_set = |args: &[&str]| {
        let mut all = args.to_vec();
        all.extend(["--prune", "--applyset", "fleet"]);
        daemon.berth(&all)
    };

    let first = with_set(&["apply", "-f", dir]).ok();
    assert_eq!(
        names_in(&first),
        [
            "project/alpha created",
            "project/bravo created",
            "project/charlie created"
        ]
    );
    with_set(&["diff", "-f", dir]).fails(0);

    std::fs::remove_file(daemon.dir.path().join("fleet/b.yaml")).unwrap();
    std::fs::remove_file(daemon.dir.path().join("fleet/c.yaml")).unwrap();
    let diff = with_set(&["diff", "-f", dir]).fails(1);
    assert!(
        diff.stdout.contains("--- live/project/bravo\n"),
        "{}",
        diff.stdout
    );
    assert!(diff.stdout.contains("-  name: bravo\n"), "{}", diff.stdout);
    assert!(
        !diff.stdout.contains("charlie"),
        "opted out: {}",
        diff.stdout
    );

    let second = with_set(&["apply", "-f", dir]).ok();
    assert_eq!(
        names_in(&second),
        ["project/alpha unchanged", "project/bravo pruned"]
    );
    let left = daemon.berth(&["get", "projects", "-o", "name"]).ok();
    assert_eq!(
        left.stdout, "project/alpha\nproject/charlie\nproject/outsider\n",
        "only bravo left the set; charlie opted out; outsider was never in it"
    );
}

#[test]
fn stop_and_start_wait_for_the_state_they_asked_for() {
    let daemon = Daemon::start();
    let file = daemon.file("p.yaml", &project("toggle", ""));
    daemon.berth(&["apply", "-f", &file]).ok();
    let generation = |daemon: &Daemon| {
        daemon.object("project", "toggle")["metadata"]["generation"]
            .as_i64()
            .unwrap()
    };
    let ready = |generation: i64| {
        json!({"observedGeneration": generation, "phase": "Ready", "step": "Reachable",
               "conditions": [{"type": "Ready", "status": "True", "reason": "Reachable",
                               "lastTransitionTime": "2026-01-01T00:00:00Z"}]})
    };
    let before = generation(&daemon);
    daemon.put_status("toggle", ready(before));

    // (command, status the controller then reports, last line printed)
    let cases = [
        ("stop", "Stopped", "project/toggle stopped"),
        ("start", "Ready", "project/toggle running"),
    ];
    for (command, phase, last_line) in cases {
        let previous = generation(&daemon);
        let child = daemon
            .command(&[command, "toggle", "--wait", "--timeout=60s"])
            .stdin(Stdio::null())
            .spawn()
            .expect("run berth");
        // The patch moves the generation; the controller then reports on the new one.
        daemon.wait_until(CONDITION_DEADLINE, "the condition", || {
            generation(&daemon) > previous
        });
        let current = generation(&daemon);
        let status = if phase == "Stopped" {
            json!({"observedGeneration": current, "phase": "Stopped", "step": "Reachable",
                   "conditions": [{"type": "Ready", "status": "False", "reason": "Stopped",
                                   "lastTransitionTime": "2026-01-01T00:00:00Z"}]})
        } else {
            ready(current)
        };
        daemon.put_status("toggle", status);
        let run = finish(child, &[command]).ok();
        assert_eq!(run.stdout.lines().last(), Some(last_line), "{run:?}");
        if phase == "Stopped" {
            // The progress shows the phase reached, not the step it had got to.
            assert!(
                run.stdout.lines().any(|l| l == "toggle: Stopped"),
                "{run:?}"
            );
            // Stopping it again changes nothing, and says so.
            let again = daemon.berth(&["stop", "toggle", "--wait"]).ok();
            assert_eq!(again.stdout, "project/toggle already stopped\n");
            assert_eq!(generation(&daemon), current);
            // An apply that waits says where it ended.
            let file = daemon.file(
                "stopped.yaml",
                &project("toggle", "spec:\n  state: Stopped\n"),
            );
            let applied = daemon.berth(&["apply", "-f", &file, "--wait"]).ok();
            assert_eq!(
                applied.stdout.lines().last(),
                Some("project/toggle stopped"),
                "{applied:?}"
            );
        }
    }
}

/// A field at a dotted path of an object, as text (`""` when absent).
fn text_at(object: &Value, path: &str) -> String {
    path.split('.')
        .try_fold(object, |v, key| v.get(key))
        .map(|v| v.as_str().map_or_else(|| v.to_string(), str::to_string))
        .unwrap_or_default()
}

#[test]
fn new_fleet_defaults_reach_new_projects_only() {
    let config_dir = tempfile::tempdir().expect("config dir");
    let config = config_dir.path().join("berth.yaml");
    std::fs::write(&config, "").expect("write berth.yaml");
    let mut daemon = Daemon::start_with(&["--config", config.to_str().unwrap()]);

    // (name, manifest spec when created, manifest spec applied after the defaults changed,
    //  action then, fields wanted after it)
    type Case = (
        &'static str,
        &'static str,
        &'static str,
        &'static str,
        &'static [(&'static str, &'static str)],
    );
    let cases: &[Case] = &[
        (
            "gamma",
            "",
            "",
            "unchanged",
            &[
                ("spec.image", "berth-base"),
                ("spec.resources.cpu", "2"),
                ("spec.resources.memory", "4GiB"),
                ("spec.resources.disk", ""),
                ("spec.reap.idleAction", "Stop"),
                ("metadata.generation", "1"),
            ],
        ),
        (
            "own-image",
            "spec:\n  image: custom\n",
            "spec:\n  image: custom\n",
            "unchanged",
            &[("spec.image", "custom"), ("spec.resources.cpu", "2")],
        ),
        (
            "more-cpu",
            "spec:\n  resources: {cpu: \"8\"}\n",
            "spec:\n  resources: {cpu: \"8\"}\n  brief: go on\n",
            "configured",
            &[
                ("spec.resources.cpu", "8"),
                ("spec.image", "berth-base"),
                ("spec.reap.idleAction", "Stop"),
                ("metadata.generation", "2"),
            ],
        ),
        (
            // An override the manifest no longer sets falls back to today's fleet default.
            "cpu-taken-back",
            "spec:\n  resources: {cpu: \"8\"}\n",
            "",
            "configured",
            &[
                ("spec.resources.cpu", "4"),
                ("spec.image", "berth-base"),
                ("spec.resources.disk", ""),
                ("metadata.generation", "2"),
                ("metadata.annotations", ""),
            ],
        ),
        (
            // Set to the value it already held: it stays defaulted, and stays put when left out.
            "written-out",
            "",
            "spec:\n  image: berth-base\n  resources: {cpu: \"2\"}\n",
            "unchanged",
            &[("spec.image", "berth-base"), ("spec.resources.cpu", "2")],
        ),
    ];
    let mut files = Vec::new();
    for (name, created, _, _, _) in cases {
        let file = daemon.file(&format!("{name}.yaml"), &project(name, created));
        daemon.berth(&["apply", "-f", &file]).ok();
        files.push(file);
    }

    std::fs::write(
        &config,
        "defaults:\n  image: other-image\n  resources: {cpu: \"4\", disk: 10GiB}\n  reap: {idleAction: Delete}\n",
    )
    .expect("write berth.yaml");
    daemon.terminate();
    daemon.restart();

    for ((name, _, reapplied, action, wanted), file) in cases.iter().zip(&files) {
        std::fs::write(file, project(name, reapplied)).expect("rewrite manifest");
        let rv = text_at(&daemon.object("project", name), "metadata.resourceVersion");
        // Diff, dry run and apply agree.
        let diff = daemon.berth(&["diff", "-f", file]);
        assert_eq!(
            diff.code,
            i32::from(*action != "unchanged"),
            "{name}: diff: {diff:?}"
        );
        let dry = daemon.berth(&["apply", "-f", file, "--dry-run"]).ok();
        assert_eq!(
            dry.stdout,
            format!("project/{name} {action} (dry run)\n"),
            "{name}"
        );
        let run = daemon.berth(&["apply", "-f", file]).ok();
        assert_eq!(run.stdout, format!("project/{name} {action}\n"), "{name}");
        let object = daemon.object("project", name);
        for (path, value) in *wanted {
            assert_eq!(text_at(&object, path), *value, "{name}: {path} in {object}");
        }
        if *action == "unchanged" {
            assert_eq!(text_at(&object, "metadata.resourceVersion"), rv, "{name}");
        }
        // And again: the second apply of the same manifest changes nothing.
        let again = daemon.berth(&["apply", "-f", file]).ok();
        assert_eq!(
            again.stdout,
            format!("project/{name} unchanged\n"),
            "{name}"
        );
    }

    // A project created now takes the new defaults.
    let file = daemon.file("fresh.yaml", &project("fresh", ""));
    daemon.berth(&["apply", "-f", &file]).ok();
    let fresh = daemon.object("project", "fresh");
    for (path, value) in [
        ("spec.image", "other-image"),
        ("spec.resources.cpu", "4"),
        ("spec.resources.disk", "10GiB"),
        ("spec.reap.idleAction", "Delete"),
    ] {
        assert_eq!(text_at(&fresh, path), value, "fresh: {path}");
    }
}

#[test]
fn get_selects_with_set_based_selectors_and_reports_each_missing_name() {
    let daemon = Daemon::start();
    let manifests: Vec<String> = [
        ("pay", "team: payments"),
        ("infra", "team: infra"),
        ("web", "team: web"),
        ("loose", "tier: \"1\""),
    ]
    .iter()
    .map(|(name, labels)| {
        format!("apiVersion: berth.dev/v1alpha1\nkind: Project\nmetadata:\n  name: {name}\n  labels: {{{labels}}}\n")
    })
    .collect();
    let file = daemon.file("labelled.yaml", &manifests.join("---\n"));
    daemon.berth(&["apply", "-f", &file]).ok();

    let cases: &[(&str, &[&str])] = &[
        (
            "team in (payments,infra)",
            &["project/infra", "project/pay"],
        ),
        (
            "team in (payments, infra), !tier",
            &["project/infra", "project/pay"],
        ),
        (
            "team notin (payments,infra)",
            &["project/loose", "project/web"],
        ),
        ("!team", &["project/loose"]),
        ("team", &["project/infra", "project/pay", "project/web"]),
        ("team=web", &["project/web"]),
        ("team!=web,tier", &["project/loose"]),
        ("tier>0", &["project/loose"]),
    ];
    for (selector, wanted) in cases {
        let run = daemon
            .berth(&["get", "projects", "-l", selector, "-o", "name"])
            .ok();
        assert_eq!(names_in(&run), *wanted, "{selector}");
    }
    let bad = daemon
        .berth(&["get", "projects", "-l", "team in (payments"])
        .fails(1);
    assert!(
        bad.stderr
            .contains("labelSelector: \"team in (payments\": expected ',' or ')'"),
        "{}",
        bad.stderr
    );

    // Found objects print; each missing one gets its own error line; the exit says some were.
    let run = daemon
        .berth(&["get", "projects", "pay", "nope", "web", "gone"])
        .fails(1);
    let rows: Vec<&str> = run.stdout.lines().collect();
    assert_eq!(rows.len(), 3, "{}", run.stdout);
    assert!(rows[0].starts_with("NAME"));
    assert!(
        rows[1].starts_with("pay ") && rows[2].starts_with("web "),
        "{}",
        run.stdout
    );
    assert_eq!(
        run.stderr,
        "Error from server (NotFound): Project \"nope\" not found\n\
         Error from server (NotFound): Project \"gone\" not found\n"
    );
    let run = daemon
        .berth(&["get", "projects", "nope", "pay", "-o", "name"])
        .fails(1);
    assert_eq!(run.stdout, "project/pay\n");
    let run = daemon.berth(&["get", "projects", "nope", "gone"]).fails(1);
    assert_eq!(run.stdout, "");
    assert_eq!(run.stderr.lines().count(), 2, "{}", run.stderr);
}

#[test]
fn a_reader_that_goes_away_ends_any_output_quietly() {
    let daemon = Daemon::start();
    // Enough output to outgrow a pipe's buffer in every format.
    let manifests: Vec<String> = (0..1000)
        .map(|i| project(&format!("p{i:04}-{}", "x".repeat(55)), ""))
        .collect();
    let file = daemon.file("many.yaml", &manifests.join("---\n"));
    daemon.berth(&["apply", "-f", &file]).ok();
    for args in [
        &["get", "projects", "-o", "name"][..],
        &["get", "projects"],
        &["get", "projects", "-o", "wide"],
        &["get", "projects", "-o", "yaml"],
        &["get", "projects", "-o", "json"],
        &["apply", "-f", &file],
        &["completion", "bash"],
        &["completion", "zsh"],
    ] {
        let mut child = daemon
            .command(args)
            .env("RUST_BACKTRACE", "1")
            .stdin(Stdio::null())
            .spawn()
            .expect("run berth");
        // Read a little, as `head -1` does, then go away.
        let mut stdout = child.stdout.take().expect("stdout pipe");
        let mut first = [0u8; 1];
        stdout.read_exact(&mut first).expect("some output");
        drop(stdout);
        let run = finish(child, args);
        // A completion script may fit in the pipe whole before the reader goes away.
        let fits = args[0] == "completion" && run.code == 0;
        assert!(run.code == 141 || fits, "{args:?}: {run:?}");
        assert_eq!(run.stderr, "", "{args:?}");
    }
}

#[test]
fn diff_and_apply_report_a_bad_batch_alike() {
    let daemon = Daemon::start();
    let good = project("delta-one", "");
    let cases = [
        (
            "typo.yaml",
            project("delta", "spec:\n  displayNme: Delta\n"),
        ),
        ("bad-name.yaml", project("Delta_2", "")),
        ("bad-label.yaml", project("delta", "  labels: {x: 1}\n")),
        (
            "big-object.yaml",
            project(
                "delta",
                &format!("spec:\n  brief: {}\n", "b".repeat((3 << 20) + 8)),
            ),
        ),
    ];
    for (name, bad) in cases {
        let file = daemon.file(name, &format!("{good}---\n{bad}"));
        let apply = daemon.berth(&["apply", "-f", &file]).fails(1);
        let diff = daemon.berth(&["diff", "-f", &file]).fails(2);
        assert_eq!(diff.stderr, apply.stderr, "{name}");
        assert!(
            apply
                .stderr
                .contains(&format!("{file}: document 2 (project/")),
            "{name}: {}",
            apply.stderr
        );
    }

    // Over the apply limit: the client says so itself, every time, naming file and limit.
    let huge = daemon.file(
        "huge.yaml",
        &project(
            "huge",
            &format!("spec:\n  brief: {}\n", "h".repeat(65 << 20)),
        ),
    );
    for command in ["apply", "diff"] {
        let run = daemon.berth(&[command, "-f", &huge]);
        assert_eq!(run.code, if command == "diff" { 2 } else { 1 }, "{run:?}");
        assert_eq!(
            run.stderr,
            format!(
                "error: {huge}: the apply request is 65.0 MiB, over the server's limit of 64 MiB for one apply; apply them in parts\n"
            )
        );
    }
    daemon.berth(&["get", "projects", "delta-one"]).fails(1);
}

#[test]
fn a_held_prune_says_so_and_why() {
    let daemon = Daemon::start();
    for name in ["keep", "done", "held"] {
        daemon.file(&format!("set/{name}.yaml"), &project(name, ""));
    }
    let dir = daemon.dir.path().join("set");
    let dir = dir.to_str().unwrap();
    let apply = [
        "apply",
        "-f",
        dir,
        "--prune",
        "--applyset",
        "set",
        "--timeout=60s",
    ];
    daemon.berth(&apply).ok();
    // Finalizers hold both deletions, as the controller's teardown does.
    for name in ["done", "held"] {
        let mut object = daemon.object("project", name);
        object["metadata"]["finalizers"] = json!(["berth.dev/test-hold"]);
        daemon.put(&format!("projects/{name}"), &object);
        std::fs::remove_file(daemon.dir.path().join(format!("set/{name}.yaml"))).unwrap();
    }

    let child = daemon
        .command(&apply)
        .stdin(Stdio::null())
        .spawn()
        .expect("run berth apply");
    let deleting =
        |name: &str| !daemon.object("project", name)["metadata"]["deletionTimestamp"].is_null();
    daemon.wait_until(CONDITION_DEADLINE, "the condition", || {
        deleting("done") && deleting("held")
    });
    // One teardown finishes; the other finds unsaved work and holds the deletion.
    let mut done = daemon.object("project", "done");
    done["metadata"]["finalizers"] = json!([]);
    daemon.put("projects/done", &done);
    daemon.put_status(
        "held",
        json!({"phase": "Deleting", "conditions": [{
            "type": "DeletionBlocked", "status": "True", "reason": "UnsavedWork",
            "message": "2 uncommitted files", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}),
    );
    // Held is not done: the apply exits 1 and says why, as `berth delete` does.
    let run = finish(child, &apply).fails(1);
    assert_eq!(
        names_in(&run),
        [
            "project/keep unchanged",
            "project/done pruned",
            "project/held pruned, deletion held: UnsavedWork: 2 uncommitted files (it stays \
             Deleting until that is resolved; `berth delete project held --force` deletes it now)",
        ]
    );
    daemon.berth(&["get", "project", "done"]).fails(1);
    assert!(deleting("held"), "a held project stays, in Deleting");
}

#[test]
fn reap_plan_and_wide_listing_say_where_a_project_stands() {
    let daemon = Daemon::start();
    let file = daemon.file(
        "agents.yaml",
        &[
            project("fresh", "spec:\n  agent: shell\n"),
            project("worked", "spec:\n  agent: shell\n"),
        ]
        .join("---\n"),
    );
    daemon.berth(&["apply", "-f", &file]).ok();
    daemon.put_status(
        "worked",
        json!({"phase": "Ready", "agent": {"state": "done"},
               "activity": {"inspectedAt": "2026-01-01T00:00:00Z"}}),
    );

    let plan = daemon.berth(&["reap", "--dry-run"]).ok();
    let fresh = plan
        .stdout
        .lines()
        .find(|l| l.starts_with("fresh "))
        .expect("fresh row");
    assert!(
        fresh.contains("<none>") && fresh.ends_with("not inspected yet"),
        "{}",
        plan.stdout
    );
    let worked = plan
        .stdout
        .lines()
        .find(|l| l.starts_with("worked "))
        .expect("worked row");
    assert!(!worked.contains("not inspected"), "{}", plan.stdout);

    let wide = daemon.berth(&["get", "projects", "-o", "wide"]).ok();
    let row = |name: &str| {
        wide.stdout
            .lines()
            .find(|l| l.starts_with(&format!("{name} ")))
            .unwrap_or_else(|| panic!("{name} in {}", wide.stdout))
            .to_string()
    };
    assert!(
        row("worked").ends_with(" berth-base   shell (done)"),
        "{}",
        wide.stdout
    );
    // Nothing reported yet: the profile alone (the empty columns after it are trimmed).
    assert!(
        row("fresh").ends_with(" berth-base   shell"),
        "{}",
        wide.stdout
    );
}

#[test]
fn a_manifest_or_patch_carrying_a_force_is_refused_naming_it() {
    const REFUSAL: &str = "metadata.annotations[berth.dev/forceDelete]: set only by a delete request (berth delete --force)";
    let daemon = Daemon::start();
    let armed = project(
        "armed",
        "  annotations: {berth.dev/forceDelete: \"true\"}\nspec: {displayName: Armed}\n",
    );
    let file = daemon.file("armed.yaml", &armed);
    let run = daemon.berth(&["apply", "-f", &file]).fails(1);
    assert!(run.stderr.contains(REFUSAL), "{:?}", run.stderr);
    assert_eq!(run.stderr.trim().lines().count(), 1, "{:?}", run.stderr);
    daemon.berth(&["get", "project", "armed"]).fails(1);

    // With other manifests beside it, nothing of the batch is applied.
    let dir = daemon.dir.path().join("fleet");
    daemon.file(
        "fleet/a.yaml",
        &project("calm", "spec: {displayName: Calm}\n"),
    );
    daemon.file("fleet/b.yaml", &armed);
    let run = daemon
        .berth(&["apply", "-f", &dir.to_string_lossy()])
        .fails(1);
    assert!(run.stderr.contains(REFUSAL), "{:?}", run.stderr);
    daemon.berth(&["get", "project", "calm"]).fails(1);

    // An existing project cannot be armed by a patch either.
    let file = daemon.file("calm.yaml", &project("calm", "spec: {displayName: Calm}\n"));
    daemon.berth(&["apply", "-f", &file]).ok();
    let reply = daemon.client().request(
        "PATCH",
        "/apis/berth.dev/v1alpha1/projects/calm",
        Some("application/merge-patch+json"),
        br#"{"metadata": {"annotations": {"berth.dev/forceDelete": "true"}}}"#,
    );
    assert_eq!(reply.status, 400, "{}", reply.text());
    assert!(reply.text().contains(REFUSAL), "{}", reply.text());
    let stored = daemon.object("project", "calm");
    assert!(
        stored["metadata"]["annotations"]
            .get("berth.dev/forceDelete")
            .is_none(),
        "{stored}"
    );
}

#[test]
fn objects_are_named_as_kubectl_names_them_and_a_missing_one_stops_nothing() {
    let daemon = Daemon::start();
    let manifests: Vec<String> = ["kn-a", "kn-b", "kn-c", "kn-d"]
        .iter()
        .map(|name| {
            let team = if *name == "kn-d" { "other" } else { "kn" };
            project(name, &format!("  labels: {{team: {team}}}\n"))
        })
        .collect();
    let file = daemon.file("kn.yaml", &manifests.join("---\n"));
    daemon.berth(&["apply", "-f", &file]).ok();

    // What `-o name` prints is taken back, and short names work.
    let names = daemon
        .berth(&["get", "projects", "-l", "team=kn", "-o", "name"])
        .ok();
    let listed: Vec<&str> = names.stdout.lines().collect();
    assert_eq!(listed, ["project/kn-a", "project/kn-b", "project/kn-c"]);
    let mut get = vec!["get"];
    get.extend(&listed);
    get.extend(["-o", "name"]);
    assert_eq!(daemon.berth(&get).ok().stdout, names.stdout);
    assert!(
        daemon
            .berth(&["get", "proj", "kn-a"])
            .ok()
            .stdout
            .contains("kn-a")
    );
    let described = daemon.berth(&["describe", "proj/kn-a"]).ok();
    assert!(described.stdout.contains("kn-a"), "{described:?}");
    daemon.berth(&["get", "project/kn-a", "gs/x"]).fails(1);

    // A missing one is reported; the others are deleted all the same.
    let run = daemon
        .berth(&["delete", "project/kn-a", "project/absent", "project/kn-b"])
        .fails(1);
    assert!(run.stderr.contains("absent"), "{run:?}");
    assert!(run.stdout.contains("project/kn-a deleted"), "{run:?}");
    assert!(run.stdout.contains("project/kn-b deleted"), "{run:?}");
    let run = daemon
        .berth(&["delete", "proj", "absent", "--ignore-not-found"])
        .ok();
    assert_eq!(run.stderr, "", "{run:?}");

    // By label: kn-c goes, kn-d of another team stays.
    let run = daemon.berth(&["delete", "project", "-l", "team=kn"]).ok();
    assert_eq!(run.stdout, "project/kn-c deleted\n", "{run:?}");
    let left = daemon.berth(&["get", "projects", "-o", "name"]).ok();
    assert_eq!(left.stdout, "project/kn-d\n");
    let run = daemon.berth(&["delete", "project", "-l", "team=kn"]).ok();
    assert!(run.stdout.contains("No projects match"), "{run:?}");
}

#[test]
fn logs_of_a_project_without_an_agent_say_so() {
    let daemon = Daemon::start();
    let file = daemon.file("plain.yaml", &project("plain", ""));
    daemon.berth(&["apply", "-f", &file]).ok();
    for args in [&["logs", "plain"][..], &["logs", "-f", "plain"]] {
        let run = daemon.berth(args).fails(1);
        assert!(run.stderr.contains("project plain has no agent"), "{run:?}");
        assert_eq!(run.stdout, "", "{run:?}");
    }
}

/// Lines a running `berth` prints, as they come.
struct Lines {
    child: Child,
    lines: std::sync::mpsc::Receiver<String>,
    seen: Vec<String>,
}

impl Lines {
    fn spawn(daemon: &Daemon, args: &[&str]) -> Lines {
        let mut child = daemon
            .command(args)
            .stdin(Stdio::null())
            .spawn()
            .expect("run berth");
        let stdout = child.stdout.take().expect("stdout pipe");
        let (send, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            use std::io::BufRead;
            for line in std::io::BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if send.send(line).is_err() {
                    break;
                }
            }
        });
        Lines {
            child,
            lines,
            seen: Vec::new(),
        }
    }

    /// Waits for a line that satisfies `wanted`, returning it.
    #[track_caller]
    fn until(&mut self, what: &str, wanted: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + COMMAND_DEADLINE;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    self.seen.push(line.clone());
                    if wanted(&line) {
                        return line;
                    }
                }
                Err(_) => panic!(
                    "no line {what} within {COMMAND_DEADLINE:?}: {:?}",
                    self.seen
                ),
            }
        }
    }
}

impl Drop for Lines {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn get_prints_jsonpath_labels_and_follows_changes() {
    let daemon = Daemon::start();
    let file = daemon.file("projects.yaml", TWO_PROJECTS);
    daemon.berth(&["apply", "-f", &file]).ok();

    let run = daemon
        .berth(&[
            "get",
            "projects",
            "-o",
            "jsonpath={.items[*].metadata.name}",
        ])
        .ok();
    assert_eq!(run.stdout, "payments-api web");
    let run = daemon
        .berth(&["get", "proj/web", "-o", "jsonpath={.spec.image}{\"\\n\"}"])
        .ok();
    assert_eq!(run.stdout, "berth-base\n");
    let run = daemon
        .berth(&["get", "projects", "-o", "jsonpath={.items"])
        .fails(2);
    assert!(run.stderr.contains("jsonpath"), "{run:?}");

    let run = daemon.berth(&["get", "projects", "--show-labels"]).ok();
    let lines = names_in(&run);
    assert!(lines[0].ends_with("LABELS"), "{lines:?}");
    assert!(lines[1].ends_with("team=payments"), "{lines:?}");
    assert!(lines[2].ends_with("team=frontend"), "{lines:?}");

    // -w: the table, then a row per change; a selector keeps other projects out.
    let mut watch = Lines::spawn(&daemon, &["get", "projects", "-w", "-l", "team=frontend"]);
    watch.until("with the header", |l| l.starts_with("NAME"));
    watch.until("listing web", |l| l.starts_with("web "));
    daemon.put_status(
        "payments-api",
        json!({"observedGeneration": 1, "phase": "Ready", "step": "Seeded"}),
    );
    daemon.put_status(
        "web",
        json!({"observedGeneration": 1, "phase": "Ready", "step": "Seeded"}),
    );
    let row = watch.until("for web's change", |l| l.contains("Ready"));
    assert!(row.starts_with("web "), "{row}");
    assert!(
        !watch.seen.iter().any(|l| l.starts_with("payments-api")),
        "{:?}",
        watch.seen
    );
}

#[test]
fn create_takes_the_common_fields_and_restart_waits_for_a_new_start() {
    let daemon = Daemon::start();
    let run = daemon
        .berth(&[
            "create",
            "project",
            "Flag Demo",
            "--memory",
            "1GiB",
            "--cpu",
            "2",
            "--repo",
            "file:///srv/app.git",
            "--branch",
            "dev",
            "-o",
            "json",
        ])
        .ok();
    let created: Value = serde_json::from_str(&run.stdout).expect("JSON");
    assert_eq!(created["metadata"]["name"], "flag-demo");
    assert_eq!(created["spec"]["resources"]["memory"], "1GiB");
    assert_eq!(created["spec"]["resources"]["cpu"], "2");
    assert_eq!(created["spec"]["repo"]["url"], "file:///srv/app.git");
    assert_eq!(created["spec"]["repo"]["branch"], "dev");
    let run = daemon
        .berth(&["create", "project", "No Repo", "--branch", "dev"])
        .fails(2);
    assert!(run.stderr.contains("--repo"), "{run:?}");

    let ready = |started: &str| {
        json!({"observedGeneration": 1, "phase": "Ready", "step": "Seeded",
               "container": {"name": "flag-demo", "lastUsedAt": started},
               "conditions": [{"type": "Ready", "status": "True", "reason": "Seeded",
                               "observedGeneration": 1,
                               "lastTransitionTime": "2026-01-01T00:00:00Z"}]})
    };
    daemon.put_status("flag-demo", ready("2026-01-01T00:00:00Z"));
    let child = daemon
        .command(&["restart", "flag-demo", "--wait", "--timeout=60s"])
        .stdin(Stdio::null())
        .spawn()
        .expect("run berth restart --wait");
    // Ready before and after: only the container's new start ends the wait.
    let deadline = Instant::now() + COMMAND_DEADLINE;
    while daemon.object("project", "flag-demo")["metadata"]["annotations"]["berth.dev/restartedAt"]
        .is_null()
    {
        assert!(Instant::now() < deadline, "the restart was never requested");
        std::thread::sleep(Duration::from_millis(50));
    }
    daemon.put_status("flag-demo", ready("2026-01-01T00:00:00Z"));
    daemon.put_status("flag-demo", ready("2026-01-01T00:05:00Z"));
    let run = finish(child, &["restart", "--wait"]).ok();
    let lines = names_in(&run);
    assert_eq!(
        lines.first().map(String::as_str),
        Some("project/flag-demo restart requested")
    );
    assert_eq!(
        lines.last().map(String::as_str),
        Some("project/flag-demo running"),
        "{lines:?}"
    );
}

#[test]
fn colour_only_on_a_terminal_and_never_with_no_color() {
    let daemon = Daemon::start();
    let file = daemon.file("projects.yaml", TWO_PROJECTS);
    daemon.berth(&["apply", "-f", &file]).ok();
    daemon.put_status(
        "web",
        json!({"observedGeneration": 1, "phase": "Ready", "step": "Seeded"}),
    );
    // `script` gives berth a terminal for its stdout.
    let on_a_terminal = |no_color: Option<&str>| -> String {
        let mut command = Command::new("script");
        command
            .args([
                "-qec",
                &format!("{} get projects", env!("CARGO_BIN_EXE_berth")),
                "/dev/null",
            ])
            .env("BERTH_SERVER", daemon.socket.clone())
            .env_remove("BERTH_TOKEN")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        match no_color {
            Some(value) => command.env("NO_COLOR", value),
            None => command.env_remove("NO_COLOR"),
        };
        let child = command.spawn().expect("run script");
        finish(child, &["get", "projects"]).ok().stdout
    };
    let coloured = on_a_terminal(None);
    assert!(coloured.contains("\x1b[32mReady\x1b[0m"), "{coloured:?}");
    let plain = on_a_terminal(Some("1"));
    assert!(
        plain.contains("Ready") && !plain.contains('\x1b'),
        "{plain:?}"
    );
    let piped = daemon.berth(&["get", "projects"]).ok();
    assert!(!piped.stdout.contains('\x1b'), "{piped:?}");
}

#[test]
fn the_server_derives_a_generated_name_and_rename_changes_the_display_name() {
    let daemon = Daemon::start();
    // Over the API: metadata.generateName, as `berth create project` sends it.
    let post = |basis: &str| {
        daemon.client().post_json(
            "/apis/berth.dev/v1alpha1/projects",
            &serde_json::json!({
                "apiVersion": "berth.dev/v1alpha1",
                "kind": "Project",
                "metadata": {"generateName": basis},
                "spec": {},
            }),
        )
    };
    let first = post("Web Shop");
    assert_eq!(first.status, 201, "{}", first.text());
    assert_eq!(first.json()["metadata"]["name"], "web-shop");
    assert_eq!(first.json()["spec"]["displayName"], "Web Shop");
    // The same display name is still the one project's: 409, nothing made.
    let again = post("web shop");
    assert_eq!(again.status, 409, "{}", again.text());
    let reply = daemon.client().post_json(
        "/apis/berth.dev/v1alpha1/projects",
        &serde_json::json!({
            "apiVersion": "berth.dev/v1alpha1",
            "kind": "Project",
            "metadata": {"generateName": "Web Shop"},
            "spec": {"displayName": "Web Shop (staging)"},
        }),
    );
    assert_eq!(reply.status, 201, "{}", reply.text());
    assert_eq!(reply.json()["metadata"]["name"], "web-shop-2");
    let both = daemon.client().post_json(
        "/apis/berth.dev/v1alpha1/projects",
        &serde_json::json!({
            "metadata": {"name": "x", "generateName": "Web Shop"},
            "spec": {},
        }),
    );
    assert_eq!(both.status, 400, "{}", both.text());
    assert!(
        both.text().contains("metadata.generateName"),
        "{}",
        both.text()
    );

    // `berth rename`: the display name changes, the name stays; a taken one is 409.
    let run = daemon.berth(&["rename", "web-shop", "Storefront"]).ok();
    assert_eq!(run.stdout, "project/web-shop renamed to \"Storefront\"\n");
    assert_eq!(
        daemon.object("project", "web-shop")["spec"]["displayName"],
        "Storefront"
    );
    let run = daemon
        .berth(&["rename", "web-shop-2", "storefront"])
        .fails(1);
    assert!(run.stderr.contains("Conflict"), "{run:?}");
    assert_eq!(
        daemon.object("project", "web-shop-2")["spec"]["displayName"],
        "Web Shop (staging)"
    );
    let run = daemon.berth(&["rename", "nope", "Anything"]).fails(1);
    assert!(
        run.stderr.contains("NotFound") || run.stderr.contains("not found"),
        "{run:?}"
    );
}
