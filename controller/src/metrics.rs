//! Every Prometheus metric berth exposes on `/metrics`, registered in one place.
//!
//! Names are registered without the `berth_` prefix, the `_total` suffix and the unit:
//! prometheus-client adds them. No label carries a project name, so the number of series stays
//! bounded however many projects the store holds.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Registry, Unit};

/// Outcome of one reconcile, the `result` label of `berth_reconcile_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReconcileResult {
    Success,
    Error,
    Requeue,
}

impl ReconcileResult {
    pub const ALL: [ReconcileResult; 3] = [Self::Success, Self::Error, Self::Requeue];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Success => "success",
            Self::Error => "error",
            Self::Requeue => "requeue",
        }
    }
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabels {
    pub result: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PhaseLabels {
    pub phase: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StepLabels {
    pub step: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ActionLabels {
    pub action: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    pub reason: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PassLabels {
    pub pass: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LxdRequestLabels {
    pub method: String,
    pub code: u16,
}

/// Which API listener: `unix` or `tcp`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ListenerLabels {
    pub listener: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct VersionLabels {
    pub version: &'static str,
}

/// The API listeners, the `listener` label.
const LISTENERS: [&str; 2] = ["unix", "tcp"];

/// Label values known in advance, exposed at 0 from the first scrape.
const PHASES: [&str; 7] = [
    "Pending",
    "Provisioning",
    "Ready",
    "Stopped",
    "Error",
    "Missing",
    "Deleting",
];
const REAP_ACTIONS: [&str; 2] = ["stop", "delete"];
const REAP_REFUSALS: [&str; 3] = ["AgentBlocked", "UnsavedWork", "InspectionFailed"];
/// The scheduler's passes, in the order it runs them.
pub const PASSES: [&str; 4] = ["resync", "activity", "reap", "housekeeping"];

/// Buckets from 1 ms to about 2 min: LXD calls and steps span that range.
fn seconds_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 2.0, 18))
}

/// Typed handles to every metric, plus the registry that encodes them.
///
/// Handles are cheap to clone (they share their values), so components keep the ones they feed.
pub struct Metrics {
    registry: Registry,
    pub reconcile: Family<ResultLabels, Counter>,
    pub reconcile_errors: Counter,
    pub reconcile_duration: Histogram,
    pub scheduler_overruns: Counter,
    pub containers_vanished: Counter,
    pub orphan_containers: Gauge,
    /// Volumes in the trash, and the bytes they use (0 for those the pool cannot size).
    pub trash_volumes: Gauge,
    pub trash_bytes: Gauge,
    pub workqueue_depth: Gauge,
    pub workqueue_adds: Counter,
    pub workqueue_retries: Counter,
    pub workqueue_queue_duration: Histogram,
    pub projects: Family<PhaseLabels, Gauge>,
    pub step_duration: Family<StepLabels, Histogram, fn() -> Histogram>,
    pub reap_actions: Family<ActionLabels, Counter>,
    pub reap_refusals: Family<ReasonLabels, Counter>,
    pub lxd_requests: Family<LxdRequestLabels, Counter>,
    pub lxd_request_duration: Histogram,
    pub scheduler_pass_duration: Family<PassLabels, Histogram, fn() -> Histogram>,
    pub scheduler_panics: Family<PassLabels, Counter>,
    pub build_info: Family<VersionLabels, Gauge>,
    /// Open API connections, and those refused past `listen.maxConnections`, by listener.
    pub api_connections: Family<ListenerLabels, Gauge>,
    pub api_connections_refused: Family<ListenerLabels, Counter>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("berth");
        let m = Metrics {
            registry: Registry::default(),
            reconcile: Family::default(),
            reconcile_errors: Counter::default(),
            reconcile_duration: seconds_histogram(),
            scheduler_overruns: Counter::default(),
            containers_vanished: Counter::default(),
            orphan_containers: Gauge::default(),
            trash_volumes: Gauge::default(),
            trash_bytes: Gauge::default(),
            workqueue_depth: Gauge::default(),
            workqueue_adds: Counter::default(),
            workqueue_retries: Counter::default(),
            workqueue_queue_duration: seconds_histogram(),
            projects: Family::default(),
            step_duration: Family::new_with_constructor(seconds_histogram),
            reap_actions: Family::default(),
            reap_refusals: Family::default(),
            lxd_requests: Family::default(),
            lxd_request_duration: seconds_histogram(),
            scheduler_pass_duration: Family::new_with_constructor(seconds_histogram),
            scheduler_panics: Family::default(),
            build_info: Family::default(),
            api_connections: Family::default(),
            api_connections_refused: Family::default(),
        };

        registry.register(
            "reconcile",
            "Reconciles finished, by result",
            m.reconcile.clone(),
        );
        registry.register(
            "reconcile_errors",
            "Reconciles that ended in an error",
            m.reconcile_errors.clone(),
        );
        registry.register_with_unit(
            "reconcile_duration",
            "Time one reconcile took",
            Unit::Seconds,
            m.reconcile_duration.clone(),
        );
        registry.register(
            "scheduler_overruns",
            "Scheduler passes that outran their interval",
            m.scheduler_overruns.clone(),
        );
        registry.register(
            "containers_vanished",
            "Times many containers vanished at once and berth recreated none of them",
            m.containers_vanished.clone(),
        );
        registry.register(
            "orphan_containers",
            "Containers labelled by berth whose project is gone, as housekeeping last counted them",
            m.orphan_containers.clone(),
        );
        registry.register(
            "workqueue_depth",
            "Projects waiting in the work queue",
            m.workqueue_depth.clone(),
        );
        registry.register(
            "workqueue_adds",
            "Requests added to the work queue",
            m.workqueue_adds.clone(),
        );
        registry.register(
            "workqueue_retries",
            "Reconciles scheduled again after an error",
            m.workqueue_retries.clone(),
        );
        registry.register_with_unit(
            "workqueue_queue_duration",
            "Time a project waited in the queue past its due time",
            Unit::Seconds,
            m.workqueue_queue_duration.clone(),
        );
        registry.register(
            "trash_volumes",
            "Volumes of deleted projects kept in the trash",
            m.trash_volumes.clone(),
        );
        registry.register(
            "trash_bytes",
            "Bytes the trash's volumes use (0 for volumes the storage pool cannot size)",
            m.trash_bytes.clone(),
        );
        registry.register("projects", "Projects by phase", m.projects.clone());
        registry.register_with_unit(
            "step_duration",
            "Time to complete one durable step",
            Unit::Seconds,
            m.step_duration.clone(),
        );
        registry.register(
            "reap_actions",
            "Projects reaped, by action",
            m.reap_actions.clone(),
        );
        registry.register(
            "reap_refusals",
            "Reaps declined, by protecting reason",
            m.reap_refusals.clone(),
        );
        registry.register(
            "lxd_requests",
            "Requests sent to LXD, by method and HTTP status",
            m.lxd_requests.clone(),
        );
        registry.register_with_unit(
            "lxd_request_duration",
            "Time LXD took to answer a request",
            Unit::Seconds,
            m.lxd_request_duration.clone(),
        );
        registry.register_with_unit(
            "scheduler_pass_duration",
            "Time one scheduler pass took, by pass",
            Unit::Seconds,
            m.scheduler_pass_duration.clone(),
        );
        registry.register(
            "scheduler_panics",
            "Scheduler passes that panicked, by pass (the loop goes on)",
            m.scheduler_panics.clone(),
        );
        // A gauge rather than an OpenMetrics info metric: the classic text parser (and promtool)
        // reads it too.
        registry.register(
            "build_info",
            "The running berth version; always 1",
            m.build_info.clone(),
        );

        registry.register(
            "api_connections",
            "Open API connections, by listener",
            m.api_connections.clone(),
        );
        registry.register(
            "api_connections_refused",
            "API connections closed at once because the listener had listen.maxConnections open",
            m.api_connections_refused.clone(),
        );

        // Series a dashboard expects from the first scrape, before anything happened.
        for result in ReconcileResult::ALL {
            let _created = m.reconcile.get_or_create(&ResultLabels {
                result: result.as_str(),
            });
        }
        for phase in PHASES {
            let _created = m.projects.get_or_create(&PhaseLabels {
                phase: phase.to_string(),
            });
        }
        for action in REAP_ACTIONS {
            let _created = m.reap_actions.get_or_create(&ActionLabels { action });
        }
        for reason in REAP_REFUSALS {
            let _created = m.reap_refusals.get_or_create(&ReasonLabels {
                reason: reason.to_string(),
            });
        }
        for pass in PASSES {
            let _created = m
                .scheduler_pass_duration
                .get_or_create(&PassLabels { pass });
            let _created = m.scheduler_panics.get_or_create(&PassLabels { pass });
        }
        for listener in LISTENERS {
            let labels = ListenerLabels { listener };
            let _created = m.api_connections.get_or_create(&labels);
            let _created = m.api_connections_refused.get_or_create(&labels);
        }
        m.build_info
            .get_or_create(&VersionLabels {
                version: env!("CARGO_PKG_VERSION"),
            })
            .set(1);

        Metrics { registry, ..m }
    }

    /// The OpenMetrics text exposition served on `/metrics`.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        encode(&mut out, &self.registry).expect("writing to a String cannot fail");
        out
    }

    pub fn record_reconcile(&self, result: ReconcileResult, seconds: f64) {
        self.reconcile
            .get_or_create(&ResultLabels {
                result: result.as_str(),
            })
            .inc();
        if result == ReconcileResult::Error {
            self.reconcile_errors.inc();
        }
        self.reconcile_duration.observe(seconds);
    }

    pub fn observe_step(&self, step: &str, seconds: f64) {
        self.step_duration
            .get_or_create(&StepLabels {
                step: step.to_string(),
            })
            .observe(seconds);
    }

    pub fn observe_pass(&self, pass: &'static str, seconds: f64) {
        self.scheduler_pass_duration
            .get_or_create(&PassLabels { pass })
            .observe(seconds);
    }

    /// One more `scheduler_panics_total{pass}`.
    pub fn count_scheduler_panic(&self, pass: &'static str) {
        self.scheduler_panics
            .get_or_create(&PassLabels { pass })
            .inc();
    }

    /// One more `reap_refusals_total{reason}`: an action (or a deletion) declined for `reason`.
    pub fn count_refusal(&self, reason: &str) {
        self.reap_refusals
            .get_or_create(&ReasonLabels {
                reason: reason.to_string(),
            })
            .inc();
    }

    /// Sets the `projects{phase}` gauges to a fresh count; phases absent from `counts` read 0.
    pub fn set_project_phases<'a>(&self, counts: impl IntoIterator<Item = (&'a str, i64)>) {
        let counts: Vec<(&str, i64)> = counts.into_iter().collect();
        for phase in PHASES {
            let count = counts
                .iter()
                .filter(|(p, _)| *p == phase)
                .map(|(_, c)| *c)
                .sum();
            self.projects
                .get_or_create(&PhaseLabels {
                    phase: phase.to_string(),
                })
                .set(count);
        }
    }

    /// Records one answered LXD request: the LXD client calls this for every request it makes.
    pub fn observe_lxd_request(&self, method: &str, code: u16, seconds: f64) {
        self.lxd_requests
            .get_or_create(&LxdRequestLabels {
                method: method.to_string(),
                code,
            })
            .inc();
        self.lxd_request_duration.observe(seconds);
    }
}

/// The classic Prometheus text format (0.0.4) of an OpenMetrics exposition, for scrapers that
/// do not ask for OpenMetrics (promtool, curl): counters are declared under their `_total`
/// name, and the `# UNIT` and `# EOF` lines that format does not know are left out.
pub fn to_prometheus_text(openmetrics: &str) -> String {
    let mut out = String::with_capacity(openmetrics.len());
    // A family's HELP line waits for its TYPE line, which says whether the name changes.
    let mut help: Option<(&str, &str)> = None;
    for line in openmetrics.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        if let Some(rest) = line.strip_prefix("# HELP ") {
            help = Some(rest.split_once(' ').unwrap_or((rest, "")));
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap_or((rest, "untyped"));
            let (name, kind) = match kind {
                "counter" if !name.ends_with("_total") => (format!("{name}_total"), kind),
                "info" => (format!("{name}_info"), "gauge"),
                "stateset" | "gaugehistogram" | "unknown" => (name.to_string(), "untyped"),
                _ => (name.to_string(), kind),
            };
            if let Some((_, text)) = help.take() {
                out.push_str(&format!("# HELP {name} {text}\n"));
            }
            out.push_str(&format!("# TYPE {name} {kind}\n"));
            continue;
        }
        out.push_str(line);
        out.push('\n');
    }
    out
}

impl crate::lxd::RequestObserver for Metrics {
    fn observe(&self, method: &str, code: u16, seconds: f64) {
        self.observe_lxd_request(method, code, seconds);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every name DESIGN.md promises, as exposed.
    const EXPOSED: &[&str] = &[
        "berth_reconcile_total",
        "berth_reconcile_errors_total",
        "berth_reconcile_duration_seconds",
        "berth_scheduler_overruns_total",
        "berth_containers_vanished_total",
        "berth_orphan_containers",
        "berth_trash_volumes",
        "berth_trash_bytes",
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
        "berth_scheduler_panics_total",
        "berth_build_info",
    ];

    #[test]
    fn exposition_names_every_metric() {
        let metrics = Metrics::new();
        // Families whose label values are open show up once something was observed.
        metrics.observe_step("Created", 0.5);
        metrics.observe_lxd_request("GET", 200, 0.01);
        let text = metrics.encode();
        for name in EXPOSED {
            assert!(
                text.lines()
                    .any(|line| !line.starts_with('#') && line.starts_with(name)),
                "missing {name} in:\n{text}"
            );
        }
    }

    #[test]
    fn reconcile_results_start_at_zero_and_build_info_is_one() {
        let text = Metrics::new().encode();
        for pass in PASSES {
            assert!(
                text.contains(&format!(
                    "berth_scheduler_panics_total{{pass=\"{pass}\"}} 0"
                )),
                "{text}"
            );
        }
        for result in ["success", "error", "requeue"] {
            assert!(
                text.contains(&format!("berth_reconcile_total{{result=\"{result}\"}} 0")),
                "{text}"
            );
        }
        assert!(text.contains(&format!(
            "berth_build_info{{version=\"{}\"}} 1",
            env!("CARGO_PKG_VERSION")
        )));
    }

    #[test]
    fn lxd_requests_are_counted_by_method_and_code() {
        let metrics = Metrics::new();
        metrics.observe_lxd_request("GET", 200, 0.01);
        metrics.observe_lxd_request("GET", 200, 0.02);
        metrics.observe_lxd_request("POST", 404, 0.01);
        let text = metrics.encode();
        assert!(text.contains("berth_lxd_requests_total{method=\"GET\",code=\"200\"} 2"));
        assert!(text.contains("berth_lxd_requests_total{method=\"POST\",code=\"404\"} 1"));
        assert!(text.contains("berth_lxd_request_duration_seconds_count 3"));
    }

    #[test]
    fn the_text_format_names_counters_by_their_samples() {
        let text = to_prometheus_text(&Metrics::new().encode());
        assert!(text.contains("# HELP berth_reconcile_total Reconciles finished"));
        assert!(text.contains("# TYPE berth_reconcile_total counter"));
        assert!(text.contains("# TYPE berth_reconcile_duration_seconds histogram"));
        assert!(text.contains("# TYPE berth_build_info gauge"));
        assert!(
            !text.contains("# EOF") && !text.contains("# UNIT"),
            "{text}"
        );
    }

    #[test]
    fn errors_count_twice() {
        let metrics = Metrics::new();
        metrics.record_reconcile(ReconcileResult::Error, 0.1);
        let text = metrics.encode();
        assert!(text.contains("berth_reconcile_total{result=\"error\"} 1"));
        assert!(text.contains("berth_reconcile_errors_total 1"));
    }
}
