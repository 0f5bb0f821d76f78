//! Reaction-time benchmark against the fake runtime: a fleet of N Ready agent projects (default
//! 1,000; each names the offline `shell` AgentProfile and has a brief) on a real store, driven
//! as the daemon drives them: the real controller with the real agent steps and their watch,
//! and the real scheduler loop at its default interval (`scheduler.interval: 30s`). A fake
//! agent (`berth::testing::fake_agent`) plays each container's agent. Events land on random
//! projects at random moments over about two scheduler rounds, and each is timed from the
//! moment it happened to the first status write that reflects it:
//!   - a spec change: `status.observedGeneration` reaches the new generation;
//!   - a container that vanished (deleted behind berth's back, with LXD's `instance-deleted`
//!     event): phase `Missing`;
//!   - an agent that went blocked (it writes `/run/berth/agent.json` saying so, through the
//!     runtime's file API as an agent in the container does): `status.agent.state: blocked`.
//!
//! Prints p50 and p99 per event. Run with `scripts/bench-reconcile` (or `cargo run --release -p
//! berth --features testing --example bench-reaction -- [N] [SAMPLES]`).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use berth::activity_log::ActivityLog;
use berth::agent::STATUS_FILE;
use berth::metrics::Metrics;
use berth::reconcile::{AgentSettings, AgentSteps, ControllerSettings, spawn_controller};
use berth::runtime::{EventKind, ExecOutput, Runtime, RuntimeEvent};
use berth::scheduler::passes::{DaemonPasses, PassSettings};
use berth::secrets::Secrets;
use berth::store::{Commit, Desired, Store, StoredObject};
use berth::testing::fake_agent::{FakeAgent, shell_profile_spec};
use berth::testing::fake_runtime::FakeRuntime;
use berth::testing::inspection::{FakeWorkspace, inspection_report, is_inspection};
use berth_api::AgentState;
use rand::Rng;
use serde_json::json;
use tokio_util::sync::CancellationToken;

mod table;

/// The scheduler's default `interval`.
const INTERVAL: Duration = Duration::from_secs(30);
/// The goal for p99.
const TARGET: Duration = Duration::from_secs(1);
/// Events are spread over this long: two scheduler rounds and a bit.
const SPREAD: Duration = Duration::from_secs(70);
const CONVERGE_DEADLINE: Duration = Duration::from_secs(300);
const BATCH: usize = 1000;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    SpecChange,
    Vanished,
    AgentBlocked,
}

impl Kind {
    fn label(self) -> &'static str {
        match self {
            Kind::SpecChange => "spec change -> observedGeneration",
            Kind::Vanished => "container vanished -> Missing",
            Kind::AgentBlocked => "agent blocked -> agent.state",
        }
    }

    /// Whether the stored object's status reflects the event.
    fn reflected(self, object: &StoredObject, generation: i64) -> bool {
        let status = object.status.value();
        match self {
            Kind::SpecChange => status["observedGeneration"].as_i64() >= Some(generation),
            Kind::Vanished => status["phase"] == "Missing",
            Kind::AgentBlocked => status["agent"]["state"] == "blocked",
        }
    }
}

/// An event that happened and is not reflected yet: when, and the generation it needs.
struct Pending {
    kind: Kind,
    at: Instant,
    generation: i64,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let count: usize = match args.next() {
        Some(n) => n.parse().context("N must be a number of projects")?,
        None => 1_000,
    };
    let samples: usize = match args.next() {
        Some(n) => n
            .parse()
            .context("SAMPLES must be a number of events per kind")?,
        None => 60,
    };
    if samples * 3 > count {
        bail!(
            "{samples} events of each of 3 kinds need at least {} projects",
            samples * 3
        );
    }
    let dir = tempfile::tempdir().context("creating a temp dir for the store")?;
    let store = Arc::new(Store::open(&dir.path().join("berth.db")).context("opening the store")?);
    let secrets =
        Arc::new(Secrets::open(store.clone(), dir.path()).context("opening the secrets")?);
    store
        .apply(
            Desired::of(berth_api::Kind::AgentProfile, "shell", shell_profile_spec()),
            Commit::Persist,
        )
        .map_err(|e| anyhow::anyhow!("storing the shell AgentProfile: {e}"))?;
    let names: Vec<String> = (0..count).map(|i| format!("react-{i:05}")).collect();
    for chunk in names.chunks(BATCH) {
        let batch = chunk.iter().map(|name| desired(name, "8h")).collect();
        store
            .apply_batch(batch, Commit::Persist)
            .map_err(|f| anyhow::anyhow!("seeding the store: {}", f.error))?;
    }

    // Every workspace answers the inspection as a clean one holding its agent's status file,
    // as the inspection script reads it; the fake agent answers the agent steps' execs.
    let fake = Arc::new(FakeRuntime::new());
    let agent = FakeAgent::install(&fake);
    let files = Arc::downgrade(&fake);
    fake.on_exec(move |name, request| {
        is_inspection(request).then(|| {
            let agent_json = Weak::upgrade(&files)
                .and_then(|fake| fake.file(name, STATUS_FILE))
                .map(|json| String::from_utf8_lossy(&json).into_owned());
            let report = inspection_report(&FakeWorkspace {
                agent_json,
                ..FakeWorkspace::default()
            });
            Ok(ExecOutput {
                exit_code: 0,
                stdout: report.into_bytes(),
                stderr: Vec::new(),
            })
        })
    });

    let metrics = Arc::new(Metrics::new());
    let cancel = CancellationToken::new();
    // As the daemon builds them: the agent steps, the controller running them, their watch.
    let runtime = fake.clone() as Arc<dyn Runtime>;
    let agent_steps = Arc::new(AgentSteps::new(
        store.clone(),
        secrets,
        runtime.clone(),
        AgentSettings::default(),
    ));
    let controller = spawn_controller(
        store.clone(),
        runtime,
        metrics.clone(),
        ControllerSettings::default(),
        agent_steps.clone(),
        cancel.clone(),
    );
    let agent_watch = agent_steps.spawn_watch(controller.queue.clone(), cancel.child_token());
    let deadline = Instant::now() + CONVERGE_DEADLINE;
    while ready_count(&store) < count || controller.queue.depth() > 0 {
        if Instant::now() > deadline {
            bail!("only {} of {count} projects Ready", ready_count(&store));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    let passes = DaemonPasses::new(
        store.clone(),
        fake.clone(),
        controller.queue.clone(),
        metrics,
        Arc::new(ActivityLog::default()),
        PassSettings {
            workers: 8,
            inspect_timeout: Duration::from_secs(30),
            preview_site: berth::preview::PreviewSite::new("localhost", false, None),
            recheck_interval: Duration::from_secs(180),
        },
    );
    let scheduler = tokio::spawn(berth::scheduler::run(
        Arc::new(passes),
        INTERVAL,
        cancel.child_token(),
        Arc::default(),
    ));

    // Each event on a project of its own, at a random moment within SPREAD.
    let mut rng = rand::rng();
    let mut plan: Vec<(Duration, Kind, String)> = Vec::new();
    let mut shuffled = names.clone();
    for i in (1..shuffled.len()).rev() {
        shuffled.swap(i, rng.random_range(0..=i));
    }
    let mut targets = shuffled.into_iter();
    for kind in [Kind::SpecChange, Kind::Vanished, Kind::AgentBlocked] {
        for _ in 0..samples {
            let at = SPREAD.mul_f64(rng.random::<f64>());
            plan.push((at, kind, targets.next().expect("enough projects")));
        }
    }
    plan.sort();

    let pending: Arc<Mutex<BTreeMap<String, Pending>>> = Arc::default();
    let took: Arc<Mutex<Vec<(Kind, Duration)>>> = Arc::default();
    let watcher = {
        let (pending, took, store) = (pending.clone(), took.clone(), store.clone());
        let mut changes = store.subscribe();
        tokio::spawn(async move {
            loop {
                let name = match changes.recv().await {
                    Ok(change) => Some(change.name),
                    // Missed writes: look at every pending project instead.
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => None,
                    Err(_) => return,
                };
                let seen = Instant::now();
                let mut pending = pending.lock().unwrap();
                let names: Vec<String> = match name {
                    Some(name) => vec![name],
                    None => pending.keys().cloned().collect(),
                };
                for name in names {
                    let Some(event) = pending.get(&name) else {
                        continue;
                    };
                    let Some(object) = store.get(berth_api::Kind::Project, &name) else {
                        continue;
                    };
                    if event.kind.reflected(&object, event.generation) {
                        took.lock().unwrap().push((event.kind, seen - event.at));
                        pending.remove(&name);
                    }
                }
            }
        })
    };

    let started = Instant::now();
    for (offset, kind, name) in &plan {
        tokio::time::sleep_until((started + *offset).into()).await;
        // Registered before the event happens, so no write that reflects it goes unseen.
        let generation = match kind {
            Kind::SpecChange => {
                store
                    .get(berth_api::Kind::Project, name)
                    .map_or(0, |o| o.generation())
                    + 1
            }
            _ => 0,
        };
        pending.lock().unwrap().insert(
            name.clone(),
            Pending {
                kind: *kind,
                at: Instant::now(),
                generation,
            },
        );
        match kind {
            Kind::SpecChange => {
                store
                    .apply(desired(name, "9h"), Commit::Persist)
                    .map_err(|e| anyhow::anyhow!("changing {name}'s spec: {e}"))?;
            }
            Kind::Vanished => {
                fake.vanish(name);
                fake.emit(RuntimeEvent {
                    kind: EventKind::Lifecycle,
                    action: "instance-deleted".into(),
                    source: format!("/1.0/instances/{name}"),
                    instance: Some(name.clone()),
                    location: "none".into(),
                    timestamp: None,
                });
            }
            Kind::AgentBlocked => {
                agent
                    .report(name, AgentState::Blocked, "which database?")
                    .await
                    .with_context(|| format!("{name}'s agent reporting blocked"))?;
            }
        }
    }
    // Two rounds of the scheduler past the last event, and a margin.
    let deadline = Instant::now() + 2 * INTERVAL + Duration::from_secs(30);
    while !pending.lock().unwrap().is_empty() {
        if Instant::now() > deadline {
            let left: Vec<String> = pending
                .lock()
                .unwrap()
                .iter()
                .map(|(n, e)| format!("{n} ({})", e.kind.label()))
                .take(5)
                .collect();
            bail!("events not reflected in status: {}", left.join(", "));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    cancel.cancel();
    watcher.abort();
    let _ = scheduler.await;
    controller.shutdown().await;
    let _ = agent_watch.await;

    println!(
        "reaction time with the fake runtime, {count} projects, scheduler interval {}s, {samples} events of each kind",
        INTERVAL.as_secs()
    );
    println!(
        "{:<38} {:>10} {:>10} {:>10} {:>7}",
        "event -> status", "p50", "p99", "target", "result"
    );
    let took = took.lock().unwrap();
    for kind in [Kind::SpecChange, Kind::Vanished, Kind::AgentBlocked] {
        let mut times: Vec<Duration> = took
            .iter()
            .filter(|(k, _)| *k == kind)
            .map(|(_, t)| *t)
            .collect();
        times.sort();
        let (p50, p99) = (percentile(&times, 0.50), percentile(&times, 0.99));
        let result = if p99 < TARGET { "ok" } else { "SLOW" };
        println!(
            "{:<38} {:>10} {:>10} {:>10} {:>7}",
            kind.label(),
            ms(p50),
            ms(p99),
            format!("< {}", ms(TARGET)),
            result
        );
        let measure = format!("reaction, {count} projects: {}", kind.label());
        table::row(&format!("{measure}, p50"), &ms(p50), "-", "-", "-", "-");
        table::row(
            &format!("{measure}, p99"),
            &ms(p99),
            "-",
            "-",
            &format!("< {}", ms(TARGET)),
            result,
        );
    }
    Ok(())
}

/// An agent project as admission stores it, with `idleAfter` as its only variable.
fn desired(name: &str, idle_after: &str) -> Desired {
    let mut project = berth_api::Project::new(
        name,
        serde_json::from_value(json!({
            "image": "berth-tiny",
            "agent": "shell",
            "brief": "Keep the build green.",
            "reap": {"idleAfter": idle_after},
        }))
        .expect("a valid spec"),
    );
    project.apply_defaults(&berth_api::Defaults::default());
    Desired {
        kind: berth_api::Kind::Project,
        name: name.to_string(),
        labels: BTreeMap::new(),
        annotations: BTreeMap::new(),
        finalizers: None,
        spec: serde_json::to_value(&project.spec).expect("a spec serializes"),
    }
}

fn ready_count(store: &Store) -> usize {
    store
        .list(berth_api::Kind::Project)
        .iter()
        .filter(|p| p.status.get_str("phase").as_deref() == Some("Ready"))
        .count()
}

/// The value below which `q` of the sorted `times` lie (nearest rank).
fn percentile(times: &[Duration], q: f64) -> Duration {
    if times.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((q * times.len() as f64).ceil() as usize).clamp(1, times.len());
    times[rank - 1]
}

fn ms(d: Duration) -> String {
    format!("{:.0} ms", d.as_secs_f64() * 1e3)
}
