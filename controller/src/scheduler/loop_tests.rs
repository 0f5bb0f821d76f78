use super::*;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Passes that take a scripted time and record when they ran.
#[derive(Default)]
struct Recorder {
    /// How long each pass takes, per round (the last entry repeats).
    durations: Mutex<Vec<BTreeMap<Pass, Duration>>>,
    log: Mutex<Vec<(Pass, Instant, Instant)>>,
    finished: Mutex<Vec<(Pass, Duration)>>,
    overruns: Mutex<Vec<Duration>>,
    /// Per round, how long its passes say they waited for a saturated reconciler.
    waits: Mutex<Vec<Duration>>,
    running: AtomicUsize,
    max_running: AtomicUsize,
    /// Per pass, the rounds (0-based) in which it panics.
    panics_in: Mutex<BTreeMap<Pass, Vec<usize>>>,
    panicked: Mutex<Vec<(Pass, String)>>,
}

#[async_trait]
impl Passes for Recorder {
    async fn run(&self, pass: Pass) {
        let now_running = self.running.fetch_add(1, Ordering::SeqCst) + 1;
        self.max_running.fetch_max(now_running, Ordering::SeqCst);
        let start = Instant::now();
        let round = self
            .log
            .lock()
            .unwrap()
            .iter()
            .filter(|(p, _, _)| *p == pass)
            .count();
        let took = {
            let durations = self.durations.lock().unwrap();
            let plan = durations
                .get(round)
                .or(durations.last())
                .cloned()
                .unwrap_or_default();
            plan.get(&pass).copied().unwrap_or_default()
        };
        tokio::time::sleep(took).await;
        self.running.fetch_sub(1, Ordering::SeqCst);
        self.log.lock().unwrap().push((pass, start, Instant::now()));
        let panics = self.panics_in.lock().unwrap().get(&pass).cloned();
        if panics.is_some_and(|rounds| rounds.contains(&round)) {
            panic!("{} broke in round {round}", pass.label());
        }
    }

    fn pass_panicked(&self, pass: Pass, message: &str) {
        self.panicked
            .lock()
            .unwrap()
            .push((pass, message.to_string()));
    }

    fn pass_finished(&self, pass: Pass, took: Duration) {
        self.finished.lock().unwrap().push((pass, took));
    }

    fn overrun(&self, took: Duration) {
        self.overruns.lock().unwrap().push(took);
    }

    fn take_waited(&self) -> Duration {
        let mut waits = self.waits.lock().unwrap();
        if waits.is_empty() {
            Duration::ZERO
        } else {
            waits.remove(0)
        }
    }
}

fn plan(entries: &[(Pass, u64)]) -> BTreeMap<Pass, Duration> {
    entries
        .iter()
        .map(|(p, s)| (*p, Duration::from_secs(*s)))
        .collect()
}

const INTERVAL: Duration = Duration::from_secs(30);

async fn run_for(recorder: Arc<Recorder>, rounds_time: Duration) {
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(run(
        recorder,
        INTERVAL,
        shutdown.clone(),
        Arc::new(Health::default()),
    ));
    tokio::time::sleep(rounds_time).await;
    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(3600), task)
        .await
        .expect("loop stops on shutdown")
        .expect("loop task");
}

#[tokio::test(start_paused = true)]
async fn passes_run_in_order_every_interval_without_overlap() {
    let recorder = Arc::new(Recorder::default());
    *recorder.durations.lock().unwrap() = vec![plan(&[
        (Pass::Resync, 1),
        (Pass::Activity, 5),
        (Pass::Reap, 2),
        (Pass::Housekeeping, 1),
    ])];
    let origin = Instant::now();
    run_for(recorder.clone(), Duration::from_secs(100)).await;

    let log = recorder.log.lock().unwrap().clone();
    let order: Vec<Pass> = log.iter().map(|(p, _, _)| *p).collect();
    assert_eq!(
        order,
        [Pass::ALL; 4].concat(),
        "four rounds, passes in order"
    );
    for pair in log.windows(2) {
        assert!(
            pair[1].1 >= pair[0].2,
            "a pass started before the previous ended"
        );
    }
    assert_eq!(recorder.max_running.load(Ordering::SeqCst), 1);
    // Rounds start on the interval, whatever their passes took.
    let round_starts: Vec<Duration> = log
        .iter()
        .filter(|(p, _, _)| *p == Pass::Resync)
        .map(|(_, start, _)| *start - origin)
        .collect();
    assert_eq!(
        round_starts,
        [0, 30, 60, 90].map(Duration::from_secs).to_vec()
    );
    assert!(recorder.overruns.lock().unwrap().is_empty());
    let finished = recorder.finished.lock().unwrap().clone();
    assert_eq!(finished.len(), 4 * Pass::ALL.len());
    assert_eq!(finished[2], (Pass::Activity, Duration::from_secs(5)));
}

#[tokio::test(start_paused = true)]
async fn a_round_that_outruns_the_interval_is_counted_and_not_piled_up() {
    let recorder = Arc::new(Recorder::default());
    // First round: the activity pass takes 70s (over two intervals); then rounds are quick.
    *recorder.durations.lock().unwrap() = vec![
        plan(&[(Pass::Activity, 70), (Pass::Reap, 1)]),
        plan(&[(Pass::Activity, 1)]),
    ];
    let origin = Instant::now();
    run_for(recorder.clone(), Duration::from_secs(110)).await;

    let overruns = recorder.overruns.lock().unwrap().clone();
    assert_eq!(
        overruns,
        vec![Duration::from_secs(71)],
        "one overrun, counted once"
    );
    let round_starts: Vec<Duration> = recorder
        .log
        .lock()
        .unwrap()
        .iter()
        .filter(|(p, _, _)| *p == Pass::Resync)
        .map(|(_, start, _)| *start - origin)
        .collect();
    // The second round starts when the first ends (71s), not at 30s or 60s, and no missed
    // rounds are run to catch up: the third comes one interval after the second.
    assert_eq!(round_starts, [0, 71, 101].map(Duration::from_secs).to_vec());
    assert_eq!(recorder.max_running.load(Ordering::SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn a_round_long_only_for_giving_way_to_the_reconciler_is_no_overrun() {
    let recorder = Arc::new(Recorder::default());
    // Two long rounds: the first waited 60 of its 71 s for a saturated reconciler, the second
    // only 10 of its 71 s.
    *recorder.durations.lock().unwrap() = vec![
        plan(&[(Pass::Activity, 70), (Pass::Reap, 1)]),
        plan(&[(Pass::Activity, 70), (Pass::Reap, 1)]),
        plan(&[(Pass::Activity, 1)]),
    ];
    *recorder.waits.lock().unwrap() = vec![Duration::from_secs(60), Duration::from_secs(10)];
    run_for(recorder.clone(), Duration::from_secs(150)).await;
    assert_eq!(
        recorder.overruns.lock().unwrap().clone(),
        vec![Duration::from_secs(71)],
        "only the round that fell behind on its own"
    );
}

#[tokio::test(start_paused = true)]
async fn shutdown_lets_the_running_pass_finish() {
    let recorder = Arc::new(Recorder::default());
    *recorder.durations.lock().unwrap() = vec![plan(&[(Pass::Reap, 20)])];
    // Cancelled at 5s, during the reap pass (0s-20s).
    run_for(recorder.clone(), Duration::from_secs(5)).await;
    let order: Vec<Pass> = recorder
        .log
        .lock()
        .unwrap()
        .iter()
        .map(|(p, _, _)| *p)
        .collect();
    assert_eq!(
        order,
        vec![
            Pass::Resync,
            Pass::Schedules,
            Pass::Activity,
            Pass::Network,
            Pass::Reap
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn a_pass_that_panics_is_counted_and_the_loop_goes_on() {
    let recorder = Arc::new(Recorder::default());
    // The reap pass panics in rounds 0-3 and recovers in round 4; housekeeping once, in round 1.
    *recorder.panics_in.lock().unwrap() = BTreeMap::from([
        (Pass::Reap, vec![0, 1, 2, 3]),
        (Pass::Housekeeping, vec![1]),
    ]);
    let health = Arc::new(Health::default());
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(run(
        recorder.clone(),
        INTERVAL,
        shutdown.clone(),
        health.clone(),
    ));
    let rounds = |recorder: &Recorder| {
        recorder
            .log
            .lock()
            .unwrap()
            .iter()
            .filter(|(p, _, _)| *p == Pass::Housekeeping)
            .count()
    };
    // Two rounds in: panics counted, every pass after them ran, still ready.
    tokio::time::sleep(INTERVAL + Duration::from_secs(1)).await;
    assert_eq!(rounds(&recorder), 2);
    assert_eq!(health.check(), Ok(()));
    // Three rounds in a row: the reap pass cannot run, and readiness says so.
    tokio::time::sleep(INTERVAL).await;
    let unready = health.check().unwrap_err();
    assert!(
        unready.contains("reap") && unready.contains("3 times in a row"),
        "{unready}"
    );
    assert!(unready.contains("reap broke in round 2"), "{unready}");
    // It recovers in round 4: ready again.
    tokio::time::sleep(INTERVAL * 2).await;
    assert_eq!(rounds(&recorder), 5);
    assert_eq!(health.check(), Ok(()));
    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(3600), task)
        .await
        .expect("loop stops on shutdown")
        .expect("the loop itself never panics");

    let panicked = recorder.panicked.lock().unwrap().clone();
    let passes: Vec<Pass> = panicked.iter().map(|(p, _)| *p).collect();
    assert_eq!(
        passes,
        [
            Pass::Reap,
            Pass::Reap,
            Pass::Housekeeping,
            Pass::Reap,
            Pass::Reap
        ]
    );
    assert_eq!(panicked[0].1, "reap broke in round 0");
    // Every pass of every round ran, in order, panics or not.
    let order: Vec<Pass> = recorder
        .log
        .lock()
        .unwrap()
        .iter()
        .map(|(p, _, _)| *p)
        .collect();
    assert_eq!(order, [Pass::ALL; 5].concat());
    assert_eq!(recorder.finished.lock().unwrap().len(), 5 * Pass::ALL.len());
    // A loop that ended is not ready.
    assert!(health.check().unwrap_err().contains("stopped"));
}

#[tokio::test(start_paused = true)]
async fn bounded_caps_concurrency_and_times_out_each_item() {
    let running = Arc::new(AtomicUsize::new(0));
    let peak = Arc::new(AtomicUsize::new(0));
    let items: Vec<u64> = (0..20).collect();
    let started = Instant::now();
    let results = bounded(items, 4, Duration::from_secs(10), |i| {
        let running = running.clone();
        let peak = peak.clone();
        async move {
            let now = running.fetch_add(1, Ordering::SeqCst) + 1;
            peak.fetch_max(now, Ordering::SeqCst);
            // Every fifth item hangs.
            let took = if i % 5 == 0 { 3600 } else { 2 };
            let _guard = Decrement(running);
            tokio::time::sleep(Duration::from_secs(took)).await;
            i * 2
        }
    })
    .await;
    assert_eq!(peak.load(Ordering::SeqCst), 4);
    assert_eq!(results.len(), 20);
    for (i, result) in &results {
        if i % 5 == 0 {
            assert_eq!(*result, None, "item {i} should have timed out");
        } else {
            assert_eq!(*result, Some(i * 2));
        }
    }
    assert!(started.elapsed() < Duration::from_secs(60));
}

struct Decrement(Arc<AtomicUsize>);

impl Drop for Decrement {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

#[tokio::test(start_paused = true)]
async fn inspect_all_turns_a_hung_exec_into_inspection_failed() {
    use crate::runtime::{ExecOutput, Instance};
    use crate::testing::fake_runtime::FakeRuntime;

    let fake = Arc::new(FakeRuntime::new());
    for name in ["slow", "fast"] {
        fake.insert_instance(Instance::running(name, BTreeMap::new()));
    }
    // "fast" answers with garbage (a parse failure); "slow" never gets a chance to answer
    // because every exec is delayed past the timeout.
    fake.on_exec(|_, _| {
        Some(Ok(ExecOutput {
            exit_code: 0,
            stdout: b"not a report".to_vec(),
            stderr: Vec::new(),
        }))
    });
    let runtime: Arc<dyn Runtime> = fake.clone();
    let targets = vec![
        InspectTarget {
            instance: "fast".into(),
            expected: Expected::default(),
        },
        InspectTarget {
            instance: "missing".into(),
            expected: Expected::default(),
        },
    ];
    let results = inspect_all(runtime.clone(), targets.clone(), 2, Duration::from_secs(10)).await;
    assert!(matches!(results["fast"], Err(InspectError::Parse(_))));
    assert!(matches!(results["missing"], Err(InspectError::Exec(_))));

    fake.set_latency(Duration::from_secs(3600));
    let results = inspect_all(runtime, targets, 2, Duration::from_secs(10)).await;
    assert!(matches!(results["fast"], Err(InspectError::Timeout(_))));
}
