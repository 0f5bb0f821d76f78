//! Every Prometheus metric berth exposes on `/metrics`, registered in one place.
//!
//! Names are registered without the `berth_` prefix, the `_total` suffix and the unit:
//! prometheus-client adds them. No label carries a project name, so the number of series stays
//! bounded however many projects the store holds. The standard `process_*` figures every exporter
//! has are read from `/proc/self` at each scrape ([`ProcessCollector`]).
//!
//! The held deletions' age is computed at each scrape from when the oldest was asked for;
//! `reconcile::triggers::count_phases` recounts phases, held deletions and steps past their
//! deadline from the store.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::text::encode;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
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
pub struct ImageLabels {
    pub image: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ImageReasonLabels {
    pub image: String,
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
pub const PASSES: [&str; 6] = [
    "resync",
    "schedules",
    "activity",
    "network",
    "reap",
    "housekeeping",
];

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
    /// Creates LXD refused with the fleet's default limits, made again without them.
    pub fleet_defaults_refused: Counter,
    pub orphan_containers: Gauge,
    /// Volumes in the trash, and the bytes they use (0 for those the pool cannot size).
    pub trash_volumes: Gauge,
    pub trash_bytes: Gauge,
    /// Containers in the trash (replaced, or a deleted project's).
    pub trash_containers: Gauge,
    /// 1 while the trash's purge waits for the wall clock to agree with the elapsed time again.
    pub trash_purge_paused: Gauge,
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
    /// When each pass last finished (Unix seconds): status no longer shows when the activity
    /// pass last looked, since a look that finds nothing new writes nothing.
    pub scheduler_last_pass: Family<PassLabels, Gauge>,
    /// Workspace inspections the scheduler made, by result (`ok`, `failed`).
    pub scheduler_inspections: Family<ResultLabels, Counter>,
    pub build_info: Family<VersionLabels, Gauge>,
    /// Open API connections, and those refused past `listen.maxConnections`, by listener.
    pub api_connections: Family<ListenerLabels, Gauge>,
    pub api_connections_refused: Family<ListenerLabels, Counter>,
    /// Deletions held because the workspace holds work no person forced past, and when the
    /// oldest of them was asked for (its age is computed at each scrape).
    pub deletions_held: Gauge,
    pub deletion_held_since: HeldSince,
    /// Projects whose status says a step ran past its deadline.
    pub projects_step_timeout: Gauge,
    /// Warm pool members ready to be claimed, by image.
    pub pool_ready: Family<ImageLabels, Gauge>,
    /// New projects that took a warm pool member, by image.
    pub pool_claims: Family<ImageLabels, Counter>,
    /// New projects of the pool's image created the plain way, by why (`empty`: no member
    /// was ready; `lost`: the member claimed went away before it was renamed).
    pub pool_fallbacks: Family<ReasonLabels, Counter>,
    /// 1 while the warm pool's refill makes no member, by image and why (`disk`: the storage
    /// pool would keep less free than its reserve); 0 otherwise.
    pub pool_held: Family<ImageReasonLabels, Gauge>,
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
        let m = Metrics {
            registry: Registry::default(),
            reconcile: Family::default(),
            reconcile_errors: Counter::default(),
            reconcile_duration: seconds_histogram(),
            scheduler_overruns: Counter::default(),
            containers_vanished: Counter::default(),
            fleet_defaults_refused: Counter::default(),
            orphan_containers: Gauge::default(),
            trash_volumes: Gauge::default(),
            trash_bytes: Gauge::default(),
            trash_containers: Gauge::default(),
            trash_purge_paused: Gauge::default(),
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
            scheduler_last_pass: Family::default(),
            scheduler_inspections: Family::default(),
            build_info: Family::default(),
            api_connections: Family::default(),
            api_connections_refused: Family::default(),
            deletions_held: Gauge::default(),
            deletion_held_since: HeldSince::default(),
            projects_step_timeout: Gauge::default(),
            pool_ready: Family::default(),
            pool_claims: Family::default(),
            pool_fallbacks: Family::default(),
            pool_held: Family::default(),
        };

        // `process_*` carry no prefix; everything else is `berth_*`.
        let mut root = Registry::default();
        root.register_collector(Box::new(ProcessCollector));
        let registry = root.sub_registry_with_prefix("berth");
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
            "fleet_defaults_refused",
            "Containers LXD would not create with the fleet's default limits, created without them",
            m.fleet_defaults_refused.clone(),
        );
        registry.register(
            "pool_ready",
            "Warm pool members ready to be claimed by a new project, by image",
            m.pool_ready.clone(),
        );
        registry.register(
            "pool_claims",
            "New projects that took a warm pool member instead of creating a container",
            m.pool_claims.clone(),
        );
        registry.register(
            "pool_fallbacks",
            "New projects of the warm pool's image created without a pool member, by reason",
            m.pool_fallbacks.clone(),
        );
        registry.register(
            "pool_held",
            "1 while the warm pool makes no member, by image and reason (disk: storage pool reserve)",
            m.pool_held.clone(),
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
        registry.register(
            "trash_containers",
            "Containers kept in the trash (replaced ones, and deleted projects')",
            m.trash_containers.clone(),
        );
        registry.register(
            "trash_purge_paused",
            "1 while the trash's purge is paused because the wall clock jumped",
            m.trash_purge_paused.clone(),
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
        registry.register(
            "scheduler_last_pass_timestamp_seconds",
            "When each scheduler pass last finished, in Unix seconds",
            m.scheduler_last_pass.clone(),
        );
        registry.register(
            "scheduler_inspections",
            "Workspace inspections the scheduler made, by result",
            m.scheduler_inspections.clone(),
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
        registry.register(
            "deletions_held",
            "Projects whose deletion is held because their workspace holds work (DeletionBlocked)",
            m.deletions_held.clone(),
        );
        registry.register_collector(Box::new(m.deletion_held_since.clone()));
        registry.register(
            "projects_step_timeout",
            "Projects stuck in one step past its deadline (StepTimeout, BootTimeout, \
             BriefNotAcknowledged)",
            m.projects_step_timeout.clone(),
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
            let _created = m.scheduler_last_pass.get_or_create(&PassLabels { pass });
        }
        for result in ["ok", "failed"] {
            let _created = m
                .scheduler_inspections
                .get_or_create(&ResultLabels { result });
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

        Metrics {
            registry: root,
            ..m
        }
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

    /// `pass` finished at `unix_seconds`.
    pub fn pass_finished_at(&self, pass: &'static str, unix_seconds: i64) {
        self.scheduler_last_pass
            .get_or_create(&PassLabels { pass })
            .set(unix_seconds);
    }

    /// One more `scheduler_inspections_total{result}`.
    pub fn count_inspection(&self, ok: bool) {
        let result = if ok { "ok" } else { "failed" };
        self.scheduler_inspections
            .get_or_create(&ResultLabels { result })
            .inc();
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

impl Metrics {
    /// Sets `deletions_held` and when the oldest held deletion was asked for (`None`: none held).
    pub fn set_deletions_held(&self, count: i64, oldest: Option<chrono::DateTime<chrono::Utc>>) {
        self.deletions_held.set(count);
        self.deletion_held_since.set(oldest);
    }
}

/// When the oldest held deletion was asked for, as `berth_deletion_held_oldest_seconds`: its age
/// at the moment of the scrape (0 when none is held), so the figure grows between recounts.
#[derive(Debug, Clone, Default)]
pub struct HeldSince(Arc<AtomicI64>);

/// Stored for "no held deletion": no deletion is asked for at the epoch.
const NONE_HELD: i64 = 0;

impl HeldSince {
    fn set(&self, since: Option<chrono::DateTime<chrono::Utc>>) {
        let millis = since.map_or(NONE_HELD, |t| t.timestamp_millis().max(1));
        self.0.store(millis, Ordering::Relaxed);
    }

    fn age_seconds(&self, now: chrono::DateTime<chrono::Utc>) -> f64 {
        match self.0.load(Ordering::Relaxed) {
            NONE_HELD => 0.0,
            since => ((now.timestamp_millis() - since).max(0) as f64) / 1000.0,
        }
    }
}

impl Collector for HeldSince {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let gauge = ConstGauge::new(self.age_seconds(chrono::Utc::now()));
        let metric = encoder.encode_descriptor(
            "deletion_held_oldest",
            "Age of the oldest deletion held because its workspace holds work; 0 when none is held",
            Some(&Unit::Seconds),
            gauge.metric_type(),
        )?;
        gauge.encode(metric)
    }
}

/// The standard process metrics (`process_resident_memory_bytes`, `process_cpu_seconds_total`,
/// `process_open_fds`, `process_max_fds`, `process_start_time_seconds`), read from `/proc/self`
/// at each scrape. A figure that cannot be read is left out rather than reported as 0.
#[derive(Debug)]
pub struct ProcessCollector;

/// The kernel reports CPU times in `/proc` in USER_HZ, fixed at 100 for user space on Linux.
const USER_HZ: f64 = 100.0;

/// What one scrape reads about this process.
#[derive(Debug, Default, PartialEq)]
pub struct ProcessFigures {
    pub resident_memory_bytes: Option<f64>,
    pub cpu_seconds: Option<f64>,
    pub open_fds: Option<i64>,
    pub max_fds: Option<i64>,
    pub start_time_seconds: Option<f64>,
}

impl ProcessFigures {
    pub fn read() -> ProcessFigures {
        let stat = std::fs::read_to_string("/proc/self/stat").ok();
        let stat = stat.as_deref().and_then(parse_stat);
        let boot_time = std::fs::read_to_string("/proc/stat")
            .ok()
            .and_then(|text| parse_boot_time(&text));
        ProcessFigures {
            resident_memory_bytes: std::fs::read_to_string("/proc/self/status")
                .ok()
                .and_then(|text| parse_vm_rss(&text)),
            cpu_seconds: stat.map(|s| (s.utime + s.stime) as f64 / USER_HZ),
            open_fds: std::fs::read_dir("/proc/self/fd")
                .ok()
                .map(|entries| entries.count() as i64),
            max_fds: nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
                .ok()
                .map(|(soft, _)| i64::try_from(soft).unwrap_or(i64::MAX)),
            start_time_seconds: stat
                .zip(boot_time)
                .map(|(s, boot)| boot as f64 + s.start_ticks as f64 / USER_HZ),
        }
    }
}

/// The fields of `/proc/self/stat` berth reports: user and system CPU time and the start time,
/// in ticks (the start time since boot).
#[derive(Debug, Clone, Copy, PartialEq)]
struct Stat {
    utime: u64,
    stime: u64,
    start_ticks: u64,
}

/// Fields 14, 15 and 22 of `/proc/PID/stat`, counted after the command name, which is in
/// parentheses and may itself hold spaces and parentheses.
fn parse_stat(text: &str) -> Option<Stat> {
    let after_comm = &text[text.rfind(')')? + 1..];
    // After the name come field 3 (state) onwards.
    let fields: Vec<&str> = after_comm.split_whitespace().collect();
    let field = |n: usize| fields.get(n - 3)?.parse::<u64>().ok();
    Some(Stat {
        utime: field(14)?,
        stime: field(15)?,
        start_ticks: field(22)?,
    })
}

/// `btime` of `/proc/stat`: when the machine booted, in seconds since the epoch.
fn parse_boot_time(text: &str) -> Option<u64> {
    text.lines()
        .find_map(|line| line.strip_prefix("btime "))
        .and_then(|value| value.trim().parse().ok())
}

/// `VmRSS` of `/proc/self/status` (in kB there), in bytes.
fn parse_vm_rss(text: &str) -> Option<f64> {
    let line = text.lines().find_map(|line| line.strip_prefix("VmRSS:"))?;
    let kb: f64 = line.trim().strip_suffix("kB")?.trim().parse().ok()?;
    Some(kb * 1024.0)
}

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let figures = ProcessFigures::read();
        if let Some(bytes) = figures.resident_memory_bytes {
            let gauge = ConstGauge::new(bytes);
            let metric = encoder.encode_descriptor(
                "process_resident_memory",
                "Resident memory size in bytes",
                Some(&Unit::Bytes),
                gauge.metric_type(),
            )?;
            gauge.encode(metric)?;
        }
        if let Some(seconds) = figures.cpu_seconds {
            let counter = ConstCounter::new(seconds);
            let metric = encoder.encode_descriptor(
                "process_cpu",
                "Total user and system CPU time spent in seconds",
                Some(&Unit::Seconds),
                counter.metric_type(),
            )?;
            counter.encode(metric)?;
        }
        if let Some(open) = figures.open_fds {
            let gauge = ConstGauge::new(open);
            let metric = encoder.encode_descriptor(
                "process_open_fds",
                "Number of open file descriptors",
                None,
                gauge.metric_type(),
            )?;
            gauge.encode(metric)?;
        }
        if let Some(max) = figures.max_fds {
            let gauge = ConstGauge::new(max);
            let metric = encoder.encode_descriptor(
                "process_max_fds",
                "Maximum number of open file descriptors",
                None,
                gauge.metric_type(),
            )?;
            gauge.encode(metric)?;
        }
        if let Some(start) = figures.start_time_seconds {
            let gauge = ConstGauge::new(start);
            let metric = encoder.encode_descriptor(
                "process_start_time",
                "Start time of the process since unix epoch in seconds",
                Some(&Unit::Seconds),
                gauge.metric_type(),
            )?;
            gauge.encode(metric)?;
        }
        Ok(())
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
        "berth_fleet_defaults_refused_total",
        "berth_orphan_containers",
        "berth_trash_volumes",
        "berth_trash_bytes",
        "berth_trash_containers",
        "berth_trash_purge_paused",
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
        "berth_scheduler_last_pass_timestamp_seconds",
        "berth_scheduler_inspections_total",
        "berth_build_info",
        "berth_deletions_held",
        "berth_deletion_held_oldest_seconds",
        "berth_projects_step_timeout",
        "berth_pool_ready",
        "berth_pool_claims_total",
        "berth_pool_fallbacks_total",
        "berth_pool_held",
        "process_resident_memory_bytes",
        "process_cpu_seconds_total",
        "process_open_fds",
        "process_max_fds",
        "process_start_time_seconds",
    ];

    #[test]
    fn exposition_names_every_metric() {
        let metrics = Metrics::new();
        // Families whose label values are open show up once something was observed.
        metrics.observe_step("Created", 0.5);
        metrics.observe_lxd_request("GET", 200, 0.01);
        let image = ImageLabels {
            image: "berth-base".into(),
        };
        metrics.pool_ready.get_or_create(&image).set(1);
        metrics.pool_claims.get_or_create(&image).inc();
        metrics
            .pool_fallbacks
            .get_or_create(&ReasonLabels {
                reason: "empty".into(),
            })
            .inc();
        metrics
            .pool_held
            .get_or_create(&ImageReasonLabels {
                image: "berth-base".into(),
                reason: "disk".into(),
            })
            .set(0);
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

    #[test]
    fn process_figures_are_this_process() {
        let figures = ProcessFigures::read();
        let rss = figures.resident_memory_bytes.expect("VmRSS");
        assert!(rss > 1024.0 * 1024.0, "{figures:?}");
        assert!(figures.cpu_seconds.expect("cpu") >= 0.0);
        let open = figures.open_fds.expect("open fds");
        let max = figures.max_fds.expect("max fds");
        assert!(open >= 3 && open <= max, "{figures:?}");
        let now = chrono::Utc::now().timestamp() as f64;
        let start = figures.start_time_seconds.expect("start time");
        // Started before now, and not before the test binary could have been built today.
        assert!(
            start <= now + 1.0 && start > now - 86_400.0,
            "{start} vs {now}"
        );
    }

    #[test]
    fn stat_fields_are_counted_after_the_command_name() {
        let line = "4242 (a (odd) name) S 1 4242 4242 0 -1 4194560 1500 0 0 0 \
                    250 75 0 0 20 0 9 0 123456 1000000 2000 18446744073709551615";
        assert_eq!(
            parse_stat(line),
            Some(Stat {
                utime: 250,
                stime: 75,
                start_ticks: 123456
            })
        );
        assert_eq!(parse_stat("garbage"), None);
        assert_eq!(
            parse_boot_time("cpu 1 2 3\nbtime 1700000000\n"),
            Some(1_700_000_000)
        );
        assert_eq!(
            parse_vm_rss("Name:\tberth\nVmRSS:\t   2048 kB\n"),
            Some(2048.0 * 1024.0)
        );
    }

    #[test]
    fn process_metrics_carry_no_prefix_and_counters_end_in_total() {
        let text = to_prometheus_text(&Metrics::new().encode());
        assert!(
            text.contains("# TYPE process_cpu_seconds_total counter"),
            "{text}"
        );
        assert!(
            text.contains("# TYPE process_resident_memory_bytes gauge"),
            "{text}"
        );
        assert!(!text.contains("berth_process_"), "{text}");
    }

    #[test]
    fn held_deletion_age_is_measured_at_the_scrape() {
        let metrics = Metrics::new();
        let text = metrics.encode();
        assert!(text.contains("berth_deletions_held 0\n"), "{text}");
        assert!(
            text.contains("berth_deletion_held_oldest_seconds 0.0\n"),
            "{text}"
        );

        let asked = chrono::Utc::now() - chrono::Duration::hours(25);
        metrics.set_deletions_held(2, Some(asked));
        let text = metrics.encode();
        assert!(text.contains("berth_deletions_held 2\n"), "{text}");
        let age: f64 = text
            .lines()
            .find_map(|l| l.strip_prefix("berth_deletion_held_oldest_seconds "))
            .expect("age line")
            .parse()
            .expect("a number");
        assert!((90_000.0..90_060.0).contains(&age), "{age}");

        metrics.set_deletions_held(0, None);
        assert!(
            metrics
                .encode()
                .contains("berth_deletion_held_oldest_seconds 0.0\n")
        );
    }
}
