//! `/metrics` of a real daemon: promtool accepts it, every metric of the contract is there, no
//! label carries a project name, and a real Prometheus server scrapes it over loopback TCP.

use std::time::{Duration, Instant};

use crate::harness::Berth;
use crate::support::daemon::Daemon;
use serde_json::json;

/// Every metric DESIGN.md names, as exposed (prefix, `_total` and unit included).
const CONTRACT: &[&str] = &[
    "berth_reconcile_total",
    "berth_reconcile_errors_total",
    "berth_reconcile_duration_seconds",
    "berth_scheduler_overruns_total",
    "berth_containers_vanished_total",
    "berth_workqueue_depth",
    "berth_workqueue_adds_total",
    "berth_workqueue_retries_total",
    "berth_workqueue_queue_duration_seconds",
    "berth_projects",
    "berth_step_duration_seconds",
    "berth_reap_actions_total",
    "berth_reap_refusals_total",
    "berth_lxd_requests_total",
    "berth_lxd_request_duration_seconds",
    "berth_scheduler_pass_duration_seconds",
    "berth_build_info",
    "berth_deletions_held",
    "berth_deletion_held_oldest_seconds",
    "berth_projects_step_timeout",
    "berth_pool_ready",
    "berth_pool_claims_total",
    "process_resident_memory_bytes",
    "process_cpu_seconds_total",
    "process_open_fds",
    "process_max_fds",
    "process_start_time_seconds",
];

/// The value of the sample written exactly as `series`, if exposed.
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines().filter(|l| !l.starts_with('#')).find_map(|l| {
        l.strip_prefix(series)?
            .strip_prefix(' ')?
            .trim()
            .parse()
            .ok()
    })
}

/// The metric a sample line belongs to: its name up to the labels or the value.
fn has_samples(text: &str, name: &str) -> bool {
    text.lines().filter(|l| !l.starts_with('#')).any(|l| {
        l.strip_prefix(name).is_some_and(|rest| {
            rest.starts_with('{')
                || rest.starts_with(' ')
                || rest.starts_with("_bucket")
                || rest.starts_with("_count")
        })
    })
}

/// Every label value of every sample.
fn label_values(text: &str) -> Vec<String> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| Some(&l[l.find('{')? + 1..l.rfind('}')?]))
        .flat_map(|labels| labels.split("\","))
        .filter_map(|pair| pair.split_once('='))
        .map(|(_, v)| v.trim_matches('"').to_string())
        .collect()
}

#[test]
fn metrics_pass_promtool_and_carry_no_project_name() {
    let mut berth = Berth::start(None);

    // Before any project exists nothing was reconciled, and the result series are already there.
    let before = berth.client().get("/metrics");
    assert_eq!(before.status, 200, "{}", before.text());
    let before = before.text();
    for result in ["success", "error", "requeue"] {
        assert_eq!(
            sample(
                &before,
                &format!("berth_reconcile_total{{result=\"{result}\"}}")
            ),
            Some(0.0),
            "berth_reconcile_total{{result={result}}} is not exposed at 0:\n{before}"
        );
    }
    if let Err(problems) = crate::ops::promtool_check(&before) {
        panic!("{problems}\n--- exposition ---\n{before}");
    }

    let name = crate::harness::unique_name();
    berth.create_project(&name, json!({"image": "berth-tiny"}));
    berth.wait_ready(&name);

    // The phase gauges follow within a couple of seconds (the deadline is for a loaded machine).
    let deadline = Instant::now() + Duration::from_secs(120);
    let after = loop {
        let text = berth.client().get("/metrics").text();
        if sample(&text, "berth_projects{phase=\"Ready\"}").is_some_and(|v| v >= 1.0) {
            break text;
        }
        assert!(
            Instant::now() < deadline,
            "the Ready project is not counted in berth_projects:\n{text}"
        );
        std::thread::sleep(Duration::from_millis(500));
    };
    if let Err(problems) = crate::ops::promtool_check(&after) {
        panic!("{problems}\n--- exposition ---\n{after}");
    }
    for metric in CONTRACT {
        assert!(
            has_samples(&after, metric),
            "{metric} has no sample after a project became Ready:\n{after}"
        );
    }
    assert!(
        sample(&after, "berth_reconcile_total{result=\"success\"}").is_some_and(|v| v >= 1.0),
        "no successful reconcile counted:\n{after}"
    );
    // Every step of the way is timed, the first one (from the project's creation) included.
    for step in ["Created", "Started", "Reachable"] {
        assert!(
            sample(
                &after,
                &format!("berth_step_duration_seconds_count{{step=\"{step}\"}}")
            )
            .is_some_and(|v| v >= 1.0),
            "step {step} was not timed:\n{after}"
        );
    }
    let values = label_values(&after);
    assert!(!values.is_empty(), "no labels parsed from:\n{after}");
    assert!(
        !values.iter().any(|v| v == &name) && !after.contains(&name),
        "a label carries the project name {name}:\n{after}"
    );

    // A restarted daemon counts its projects from the start, not at 0 until its first resync.
    berth.kill();
    berth.restart();
    let text = berth.client().get("/metrics").text();
    assert!(
        sample(&text, "berth_projects{phase=\"Ready\"}").is_some_and(|v| v >= 1.0),
        "berth_projects after a restart:\n{text}"
    );

    berth.delete_project(&name);
}

#[test]
fn a_real_prometheus_scrapes_the_daemon() {
    crate::ops::require_tool("prometheus");
    let daemon = Daemon::start_with(&["--listen", "127.0.0.1:0"]);
    let addr = daemon.tcp_addr();

    // The TCP listener serves /metrics without a token, in both formats.
    let text = crate::ops::http_get(&format!("http://{addr}/metrics"), None)
        .expect("the daemon answers /metrics over TCP without a token");
    assert!(
        text.contains("# TYPE berth_reconcile_total counter"),
        "{text}"
    );
    let openmetrics = crate::ops::http_get(
        &format!("http://{addr}/metrics"),
        Some("application/openmetrics-text;version=1.0.0"),
    )
    .expect("OpenMetrics over TCP");
    assert!(openmetrics.ends_with("# EOF\n"), "{openmetrics}");

    let dir = tempfile::tempdir().expect("temp dir");
    let mut prometheus = crate::ops::Prometheus::start(dir.path(), &addr);
    let reply = prometheus.query_until_found("berth_build_info", Duration::from_secs(60));
    let series = &reply["data"]["result"][0];
    assert_eq!(series["metric"]["job"], "berth", "{reply}");
    assert_eq!(
        series["metric"]["version"],
        env!("CARGO_PKG_VERSION"),
        "{reply}"
    );
    assert_eq!(series["value"][1], "1", "{reply}");
    // The counters reach Prometheus under their contract names too.
    prometheus.query_until_found(
        "berth_reconcile_total{result=\"success\"}",
        Duration::from_secs(60),
    );
}
