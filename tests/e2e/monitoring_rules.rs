//! The monitoring examples hold: `promtool check rules` and `promtool test rules` pass on
//! `examples/monitoring/`, the chart ships the same rules, and every metric an alert or the
//! Grafana dashboard names is one a real daemon exposes on `/metrics`.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::Command;

use crate::harness::Berth;
use serde_json::json;

fn repo_path(path: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(path)
}

fn read(path: &str) -> String {
    std::fs::read_to_string(repo_path(path)).unwrap_or_else(|e| panic!("read {path}: {e}"))
}

/// Runs promtool in `examples/monitoring`; its output on failure.
fn promtool(args: &[&str]) {
    let out = Command::new("promtool")
        .args(args)
        .current_dir(repo_path("examples/monitoring"))
        .output()
        .expect("promtool (Debian package prometheus; scripts/setup-test-deps installs it)");
    assert!(
        out.status.success(),
        "promtool {args:?} failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn promtool_checks_and_tests_every_rule() {
    promtool(&["check", "rules", "alerts.yaml"]);
    promtool(&["test", "rules", "alerts_test.yaml"]);

    // Every alert of the rules file has a test that expects it to fire.
    let rules = read("examples/monitoring/alerts.yaml");
    let tests = read("examples/monitoring/alerts_test.yaml");
    let alerts: Vec<&str> = rules
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- alert: "))
        .collect();
    assert!(alerts.len() >= 8, "{alerts:?}");
    for alert in alerts {
        let fires = tests.split("alertname: ").skip(1).any(|after| {
            after.starts_with(&format!("{alert}\n"))
                && after
                    .lines()
                    .nth(1)
                    .is_some_and(|l| l.trim() == "exp_alerts:")
        });
        assert!(fires, "no test expects {alert} to fire");
    }
}

#[test]
fn the_chart_ships_the_example_rules() {
    assert_eq!(
        read("charts/berth/files/alerts.yaml"),
        read("examples/monitoring/alerts.yaml"),
        "charts/berth/files/alerts.yaml differs from examples/monitoring/alerts.yaml: copy it"
    );
}

/// Every metric name in a PromQL expression: identifiers of berth's and the process's families.
fn metric_names(expr: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut word = String::new();
    let mut quoted = None;
    for c in expr.chars().chain(std::iter::once(' ')) {
        if let Some(q) = quoted {
            if c == q {
                quoted = None;
            }
            continue;
        }
        if c == '"' || c == '\'' || c == '`' {
            quoted = Some(c);
            word.clear();
            continue;
        }
        if c.is_ascii_alphanumeric() || c == '_' || c == ':' {
            word.push(c);
            continue;
        }
        if word.starts_with("berth_") || word.starts_with("process_") {
            names.insert(std::mem::take(&mut word));
        }
        word.clear();
    }
    names
}

/// Every series name a scrape of `text` (the classic text format) can hold: each family's
/// name, and for a histogram its `_bucket`, `_sum` and `_count`.
fn exposed_names(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("# TYPE ") else {
            continue;
        };
        let (name, kind) = rest.split_once(' ').expect("# TYPE name kind");
        names.insert(name.to_string());
        if kind == "histogram" {
            for suffix in ["_bucket", "_sum", "_count"] {
                names.insert(format!("{name}{suffix}"));
            }
        }
    }
    names
}

/// The expressions of the rules file and of every dashboard panel.
fn expressions() -> Vec<(String, String)> {
    let mut exprs = Vec::new();
    let rules: serde_yaml::Value =
        serde_yaml::from_str(&read("examples/monitoring/alerts.yaml")).expect("alerts.yaml");
    for group in rules["groups"].as_sequence().expect("groups") {
        for rule in group["rules"].as_sequence().expect("rules") {
            let alert = rule["alert"].as_str().expect("alert").to_string();
            let expr = rule["expr"].as_str().expect("expr").to_string();
            exprs.push((format!("alert {alert}"), expr));
        }
    }
    let dashboard: serde_json::Value =
        serde_json::from_str(&read("examples/monitoring/dashboard.json")).expect("dashboard.json");
    let panels = dashboard["panels"].as_array().expect("panels");
    let mut queried = 0;
    for panel in panels {
        let title = panel["title"].as_str().expect("every panel has a title");
        if panel["type"] == "row" {
            continue;
        }
        let targets = panel["targets"].as_array().expect("targets");
        assert!(!targets.is_empty(), "panel {title} queries nothing");
        for target in targets {
            let expr = target["expr"].as_str().expect("expr").to_string();
            exprs.push((format!("panel {title}"), expr));
            queried += 1;
        }
    }
    assert!(queried >= 10, "the dashboard has {queried} queries");
    exprs
}

#[test]
fn alerts_and_dashboard_name_only_metrics_berth_exposes() {
    // Families labelled by what happened (a step, an LXD request's code) show once it happened:
    // a project brought to Ready on the real LXD makes them all appear.
    let mut berth = Berth::start(None);
    let name = crate::harness::unique_name();
    berth.create_project(&name, json!({"image": "berth-tiny"}));
    berth.wait_ready(&name);
    let text = berth.client().get("/metrics").text();
    let exposed = exposed_names(&text);
    assert!(exposed.contains("berth_build_info"), "{text}");

    let mut missing = Vec::new();
    let mut named = BTreeSet::new();
    for (place, expr) in expressions() {
        let names = metric_names(&expr);
        assert!(
            !names.is_empty() || expr.contains("up{"),
            "{place} names no metric: {expr}"
        );
        for name in names {
            if !exposed.contains(&name) {
                missing.push(format!("{place}: {name}"));
            }
            named.insert(name);
        }
    }
    assert!(
        missing.is_empty(),
        "metrics berth does not expose:\n{}\n--- exposition ---\n{text}",
        missing.join("\n")
    );
    // What the dashboard and alerts promise to show.
    for name in [
        "berth_projects",
        "berth_reconcile_total",
        "berth_reconcile_duration_seconds_bucket",
        "berth_reap_actions_total",
        "berth_reap_refusals_total",
        "berth_lxd_request_duration_seconds_bucket",
        "berth_deletion_held_oldest_seconds",
        "berth_projects_step_timeout",
        "berth_orphan_containers",
        "berth_scheduler_overruns_total",
        "berth_workqueue_depth",
        "berth_lxd_requests_total",
    ] {
        assert!(named.contains(name), "nothing shows {name}");
    }
}

#[test]
fn metric_names_are_read_outside_labels_and_strings() {
    let names = metric_names(
        r#"sum by (le) (rate(berth_x_bucket{job="berth_not_a_metric"}[5m])) / process_open_fds"#,
    );
    assert_eq!(
        names.into_iter().collect::<Vec<_>>(),
        ["berth_x_bucket", "process_open_fds"]
    );
}
