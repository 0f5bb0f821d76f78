//! The warm pool against the fake runtime and a real store: the refill, a claim, the plain
//! create wherever the pool cannot serve, and claims interrupted at every call.

use std::sync::Arc;

use berth_api::{Kind, Phase, ProjectStatus};
use serde_json::{Value, json};

use std::time::Duration;

use super::{CLAIM_QUIET, Pass, WarmPool, member_prefix, pass};
use crate::layout::{CONTROLLER_LABEL, POOL_LABEL, POOL_READY_LABEL, UID_LABEL};
use crate::metrics::{ImageLabels, ImageReasonLabels, Metrics, ReasonLabels};
use crate::reconcile::{Action, Context, ControllerSettings, NoLaterSteps, WorkQueue, project};
use crate::runtime::{Instance, InstanceStatus, PoolSpace, RuntimeError};
use crate::store::{Commit, Desired, Store};
use crate::testing::fake_runtime::{FakeRuntime, Fault, fake_fingerprint};

/// More reconciles or passes than anything here needs; hitting it means a loop.
const MAX_ROUNDS: usize = 40;

struct Harness {
    _dir: tempfile::TempDir,
    store: Arc<Store>,
    fake: Arc<FakeRuntime>,
    ctx: Context,
}

impl Harness {
    fn new(size: usize) -> Harness {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(Store::open(&dir.path().join("berth.db")).unwrap());
        Harness::with(dir, store, Arc::new(FakeRuntime::new()), size)
    }

    /// Another daemon's run on the same store and LXD, with a pool of `size`.
    fn restarted(self, size: usize) -> Harness {
        Harness::with(self._dir, self.store, self.fake, size)
    }

    fn with(
        dir: tempfile::TempDir,
        store: Arc<Store>,
        fake: Arc<FakeRuntime>,
        size: usize,
    ) -> Harness {
        let metrics = Arc::new(Metrics::new());
        let settings = ControllerSettings {
            pool: Arc::new(WarmPool::new("berth-base", size)),
            ..ControllerSettings::default()
        };
        let queue = WorkQueue::new(1, settings.backoff, metrics.clone());
        let ctx = Context::new(
            store.clone(),
            fake.clone(),
            metrics,
            settings,
            Arc::new(NoLaterSteps),
            queue,
        );
        Harness {
            _dir: dir,
            store,
            fake,
            ctx,
        }
    }

    /// Fills the pool and starts a claim for a new project `name` that stops after the
    /// rename: the update fails as a killed daemon's would.
    async fn claim_killed_after_rename(&self, name: &str) {
        self.fill().await;
        self.apply(name, json!({"image": "berth-base"}));
        self.fake.fault_method(
            "patch_instance",
            Fault::Fail(RuntimeError::Transport {
                what: "injected".into(),
                message: "the daemon was killed".into(),
            }),
        );
        assert!(project::reconcile(&self.ctx, name).await.is_err());
    }

    /// Refill passes until the pool is as wanted.
    async fn fill(&self) {
        for _ in 0..MAX_ROUNDS {
            if pass(&self.ctx).await.unwrap() == Pass::Settled {
                return;
            }
        }
        panic!("the pool did not settle: {:?}", self.fake.calls());
    }

    fn members(&self) -> Vec<Instance> {
        let prefix = member_prefix(self.store.controller_id());
        self.fake
            .instance_names()
            .iter()
            .filter(|n| n.starts_with(&prefix))
            .map(|n| self.fake.instance(n).unwrap())
            .collect()
    }

    fn apply(&self, name: &str, spec: Value) {
        self.store
            .apply(Desired::project(name, spec), Commit::Persist)
            .unwrap();
    }

    async fn converge(&self, name: &str) -> Vec<String> {
        let mut errors = Vec::new();
        for _ in 0..MAX_ROUNDS {
            match project::reconcile(&self.ctx, name).await {
                Ok(Action::Done) => return errors,
                Ok(Action::Requeue(_)) => {}
                Err(e) => errors.push(e.to_string()),
            }
        }
        panic!("{name} did not converge; errors {errors:?}");
    }

    fn status(&self, name: &str) -> ProjectStatus {
        let object = self.store.get(Kind::Project, name).unwrap();
        serde_json::from_value(object.status.value()).unwrap_or_default()
    }

    fn uid(&self, name: &str) -> String {
        self.store
            .get(Kind::Project, name)
            .unwrap()
            .uid()
            .to_string()
    }

    fn claims(&self) -> u64 {
        let image = ImageLabels {
            image: "berth-base".into(),
        };
        self.ctx.metrics.pool_claims.get_or_create(&image).get()
    }

    fn fallbacks(&self, reason: &str) -> u64 {
        let reason = ReasonLabels {
            reason: reason.into(),
        };
        self.ctx.metrics.pool_fallbacks.get_or_create(&reason).get()
    }

    /// `name` is Ready in a container of its own name that carries its labels and its
    /// workspace volume, and no pool label.
    fn assert_claimed_ready(&self, name: &str) {
        let status = self.status(name);
        assert_eq!(status.phase, Phase::Ready, "{status:?}");
        let instance = self.fake.instance(name).expect("the project's container");
        assert_eq!(instance.config.get(UID_LABEL), Some(&self.uid(name)));
        assert_eq!(
            instance.config.get(CONTROLLER_LABEL).map(String::as_str),
            Some(self.store.controller_id())
        );
        assert_eq!(instance.config.get(POOL_LABEL), None);
        assert_eq!(instance.config.get(POOL_READY_LABEL), None);
        let workspace = instance.devices.get("workspace").expect("workspace device");
        assert_eq!(
            workspace.get("source"),
            Some(&crate::layout::DurableLayout::workspace_volume(
                &self.uid(name)
            ))
        );
        assert_eq!(instance.status, InstanceStatus::Running);
    }
}

#[tokio::test]
async fn the_refill_makes_booted_stopped_members_holding_nothing() {
    let h = Harness::new(2);
    h.fill().await;
    let members = h.members();
    assert_eq!(members.len(), 2);
    for member in &members {
        assert_eq!(member.status, InstanceStatus::Stopped);
        assert_eq!(
            member.config.get(POOL_LABEL).map(String::as_str),
            Some(h.store.controller_id())
        );
        assert_eq!(
            member.config.get(POOL_READY_LABEL).map(String::as_str),
            Some("true")
        );
        assert_eq!(member.config.get(UID_LABEL), None);
        assert!(member.devices.is_empty(), "{:?}", member.devices);
    }
    assert_eq!(h.fake.count("create_instance"), 2);
    assert_eq!(h.fake.count("start_instance"), 2);
    assert_eq!(h.ctx.settings.pool.entry().ready, 2);
    let image = ImageLabels {
        image: "berth-base".into(),
    };
    assert_eq!(h.ctx.metrics.pool_ready.get_or_create(&image).get(), 2);
    // Full: another pass makes nothing.
    assert_eq!(pass(&h.ctx).await.unwrap(), Pass::Settled);
    assert_eq!(h.fake.count("create_instance"), 2);
}

#[tokio::test]
async fn a_new_project_claims_a_member_and_the_pool_refills() {
    let h = Harness::new(2);
    h.fill().await;
    let before = h.members();
    h.apply("p", json!({"image": "berth-base"}));
    h.converge("p").await;
    h.assert_claimed_ready("p");
    // No container was created for the project: it took a member.
    assert_eq!(h.fake.count("create_instance"), 2);
    assert_eq!(h.members().len(), 1);
    assert!(
        before.iter().any(|m| h.fake.instance(&m.name).is_none()),
        "one member is now the project's"
    );
    assert_eq!(h.claims(), 1);
    assert_eq!(h.ctx.settings.pool.entry().claims, 1);
    h.fill().await;
    assert_eq!(h.members().len(), 2);
    assert_eq!(h.fake.count("create_instance"), 3);
}

/// The refill makes no member while a claimed container is on its way up: it waits until the
/// project's container answered, or at most `CLAIM_QUIET` for a claim that never gets there.
#[tokio::test(start_paused = true)]
async fn the_refill_waits_while_a_claimed_container_starts() {
    let h = Harness::new(2);
    let pool = &h.ctx.settings.pool;
    let metrics = &h.ctx.metrics;
    pool.claimed("p", metrics);
    let quiet = pool.quiet();
    tokio::pin!(quiet);
    assert!(
        tokio::time::timeout(CLAIM_QUIET / 2, &mut quiet)
            .await
            .is_err(),
        "the refill waits while p starts"
    );
    pool.answered("p");
    tokio::time::timeout(Duration::from_millis(1), &mut quiet)
        .await
        .expect("the refill goes on once p answered");

    // A claim whose project never answers holds it back for CLAIM_QUIET at most.
    pool.claimed("q", metrics);
    let started = tokio::time::Instant::now();
    pool.quiet().await;
    assert_eq!(started.elapsed(), CLAIM_QUIET);

    // A project converged from a claim answered on its way.
    h.fill().await;
    h.apply("r", json!({"image": "berth-base"}));
    h.converge("r").await;
    h.assert_claimed_ready("r");
    tokio::time::timeout(Duration::from_millis(1), pool.quiet())
        .await
        .expect("r's claim no longer holds the refill back");
}

/// Another image, a stopped project and an empty pool each take the plain create, and the
/// pool's members stay as they were.
#[tokio::test]
async fn what_the_pool_cannot_serve_is_created_as_before() {
    let h = Harness::new(1);
    h.fill().await;
    let member = h.members()[0].name.clone();
    h.apply("tiny", json!({"image": "berth-tiny"}));
    h.converge("tiny").await;
    h.apply("off", json!({"image": "berth-base", "state": "Stopped"}));
    h.converge("off").await;
    assert_eq!(h.status("off").phase, Phase::Stopped);
    assert!(
        h.fake.instance(&member).is_some(),
        "the member is untouched"
    );
    assert_eq!(h.claims(), 0);
    assert_eq!(h.fake.count("create_instance"), 3);

    h.apply("first", json!({"image": "berth-base"}));
    h.converge("first").await;
    h.assert_claimed_ready("first");
    // The pool is empty until the refill runs: the next one is created.
    h.apply("second", json!({"image": "berth-base"}));
    h.converge("second").await;
    assert_eq!(h.status("second").phase, Phase::Ready);
    assert_eq!(h.claims(), 1);
    assert_eq!(h.fallbacks("empty"), 1);
    assert_eq!(h.fake.count("create_instance"), 4);
}

/// A daemon killed after the rename and before the update (here: the update fails, and the
/// next reconcile starts from the store and LXD alone) finishes the same claim: one
/// container, the member not lost, nothing created.
#[tokio::test]
async fn a_claim_interrupted_between_rename_and_update_resumes() {
    let h = Harness::new(1);
    h.claim_killed_after_rename("p").await;
    let renamed = h.fake.instance("p").expect("renamed before the kill");
    assert_eq!(renamed.config.get(UID_LABEL), None);
    assert!(h.members().is_empty());
    // A new daemon: the pool's memory is gone, the record is not. Its refill must not take
    // the half-claimed container for an orphan.
    let h = h.restarted(1);
    h.fill().await;
    assert!(h.fake.instance("p").is_some());
    h.converge("p").await;
    h.assert_claimed_ready("p");
    assert_eq!(h.fake.count("create_instance"), 2, "one member, one refill");
    assert_eq!(h.fake.count("rename_instance"), 1);
}

/// Every call of a claim fails once, or has its reply lost once: the project still becomes
/// Ready in one container, and no member is lost or claimed twice.
#[tokio::test]
async fn any_one_failing_or_lost_call_of_a_claim_converges_without_repeats() {
    let calls = {
        let h = Harness::new(1);
        h.fill().await;
        let filled = h.fake.calls().len() as u64;
        h.apply("p", json!({"image": "berth-base"}));
        h.converge("p").await;
        h.fake.calls().len() as u64 - filled
    };
    for n in 1..=calls {
        for fault in [
            Fault::LoseReply,
            Fault::Fail(RuntimeError::Transport {
                what: "injected".into(),
                message: "connection refused".into(),
            }),
        ] {
            let h = Harness::new(1);
            h.fill().await;
            let filled = h.fake.calls().len() as u64;
            h.apply("p", json!({"image": "berth-base"}));
            h.fake.fault_nth_call(filled + n, fault.clone());
            h.converge("p").await;
            let status = h.status("p");
            assert_eq!(status.phase, Phase::Ready, "call {n} {fault:?}");
            let uid = h.uid("p");
            let labelled: Vec<String> = h
                .fake
                .instance_names()
                .into_iter()
                .filter(|name| h.fake.instance(name).unwrap().config.get(UID_LABEL) == Some(&uid))
                .collect();
            assert_eq!(labelled, ["p"], "call {n} {fault:?}");
            // The member was claimed, or (its claim given up before the rename) is still
            // the pool's: never both, never neither.
            let outcome = (h.fake.count("create_instance"), h.members().len());
            assert!(
                outcome == (1, 0) || outcome == (2, 1),
                "call {n} {fault:?}: (creates, members) {outcome:?}"
            );
        }
    }
}

/// A pool made smaller (here: none) deletes its surplus members, a member left half made is
/// deleted, and another controller's members are never touched.
#[tokio::test]
async fn a_smaller_pool_deletes_only_its_own_surplus() {
    let h = Harness::new(2);
    h.fill().await;
    let mut theirs = h.members()[0].clone();
    theirs.name = "berth-pool-other-1".into();
    theirs
        .config
        .insert(POOL_LABEL.into(), "another-controller".into());
    h.fake.insert_instance(theirs);
    let mut half = h.members()[0].clone();
    half.name = format!("{}9", member_prefix(h.store.controller_id()));
    half.config.remove(POOL_READY_LABEL);
    h.fake.insert_instance(half.clone());

    let h = h.restarted(1);
    h.fill().await;
    assert_eq!(h.members().len(), 1);
    assert!(h.fake.instance(&half.name).is_none(), "half made: deleted");

    let h = h.restarted(0);
    h.fill().await;
    assert!(h.members().is_empty());
    assert!(h.fake.instance("berth-pool-other-1").is_some());
    assert_eq!(h.ctx.settings.pool.entry().ready, 0);
}

/// A project deleted between the rename and the update leaves a container of its name that
/// still carries the pool's label and nothing of the project's: the finalizer leaves it alone
/// (it lacks the project's uid label), and the refill deletes it once no project records it.
#[tokio::test]
async fn a_member_left_by_a_project_deleted_mid_claim_is_deleted() {
    let h = Harness::new(1);
    h.claim_killed_after_rename("p").await;
    assert!(h.fake.instance("p").is_some());
    let forced = std::collections::BTreeMap::from([(
        berth_api::annotations::FORCE_DELETE.to_string(),
        "true".to_string(),
    )]);
    h.store
        .delete(Kind::Project, "p", None, forced, Commit::Persist)
        .unwrap();
    h.converge("p").await;
    assert!(h.store.get(Kind::Project, "p").is_none());
    assert!(
        h.fake.instance("p").is_some(),
        "the finalizer left it alone"
    );
    h.fill().await;
    assert!(h.fake.instance("p").is_none(), "the refill deleted it");
    assert_eq!(h.members().len(), 1);
}

const GIB: u64 = 1 << 30;

/// The log lines of the current thread while it lives (the tests run on one thread).
struct Logs {
    text: Arc<std::sync::Mutex<Vec<u8>>>,
    _guard: tracing::subscriber::DefaultGuard,
}

impl Logs {
    fn capture() -> Logs {
        let text = Arc::new(std::sync::Mutex::new(Vec::new()));
        let sink = text.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_ansi(false)
            .with_max_level(tracing::Level::INFO)
            .with_writer(move || Sink(sink.clone()))
            .finish();
        Logs {
            text,
            _guard: tracing::subscriber::set_default(subscriber),
        }
    }

    /// The lines that contain `needle`.
    fn lines(&self, needle: &str) -> Vec<String> {
        String::from_utf8_lossy(&self.text.lock().unwrap())
            .lines()
            .filter(|l| l.contains(needle))
            .map(String::from)
            .collect()
    }
}

struct Sink(Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Sink {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Harness {
    /// `berth_pool_held{image="berth-base", reason="disk"}`.
    fn held_gauge(&self) -> i64 {
        let labels = ImageReasonLabels {
            image: "berth-base".into(),
            reason: "disk".into(),
        };
        self.ctx.metrics.pool_held.get_or_create(&labels).get()
    }

    /// The `default` storage pool has `total` bytes and `free` of them free; the pool's image
    /// is 1 GiB.
    fn storage(&self, total: u64, free: u64) {
        self.fake
            .set_image_size(&fake_fingerprint("berth-base"), GIB);
        self.fake.set_pool_space(
            "default",
            PoolSpace {
                used: total - free,
                total,
            },
        );
    }
}

/// One member more would leave less free than 10% of the storage pool plus the image: the
/// refill makes none, says so once, and shows it; once space frees up it makes members again.
#[tokio::test]
async fn a_storage_pool_short_of_its_reserve_holds_the_refill() {
    let logs = Logs::capture();
    let h = Harness::new(2);
    // 100 GiB with 10.5 free: the reserve is 10 GiB plus the 1 GiB image.
    h.storage(100 * GIB, 21 * GIB / 2);
    for _ in 0..3 {
        assert_eq!(pass(&h.ctx).await.unwrap(), Pass::Settled);
    }
    assert_eq!(h.fake.count("create_instance"), 0);
    assert!(h.members().is_empty());
    assert_eq!(h.held_gauge(), 1);
    assert_eq!(h.ctx.settings.pool.entry().held.as_deref(), Some("disk"));
    let said = logs.lines("makes no member");
    assert_eq!(said.len(), 1, "{said:?}");
    assert!(said[0].contains("WARN"), "{}", said[0]);
    assert!(said[0].contains("storage_pool=\"default\""), "{}", said[0]);
    assert!(
        said[0].contains(&format!("free_bytes={}", 21 * GIB / 2)),
        "{}",
        said[0]
    );
    assert!(
        said[0].contains(&format!("reserve_bytes={}", 11 * GIB)),
        "{}",
        said[0]
    );
    // The image's size is read once and kept.
    assert_eq!(h.fake.count("image_size"), 1);

    // Space freed: the next pass makes a member, and the pool fills.
    h.storage(100 * GIB, 12 * GIB);
    assert_eq!(pass(&h.ctx).await.unwrap(), Pass::Made);
    assert_eq!(h.held_gauge(), 0);
    assert_eq!(h.ctx.settings.pool.entry().held, None);
    assert_eq!(logs.lines("has room again").len(), 1);
    h.fill().await;
    assert_eq!(h.members().len(), 2);
    assert_eq!(logs.lines("makes no member").len(), 1);
    assert_eq!(h.fake.count("image_size"), 1);
}

/// A storage pool that does not know its total (LXD answers 0) holds nothing.
#[tokio::test]
async fn a_storage_pool_of_unknown_size_refills_as_before() {
    let h = Harness::new(2);
    h.fake.set_pool_space(
        "default",
        PoolSpace {
            used: 500 * GIB,
            total: 0,
        },
    );
    h.fill().await;
    assert_eq!(h.members().len(), 2);
    assert!(h.fake.count("storage_pool_space") > 0);
    assert_eq!(h.held_gauge(), 0);
    assert_eq!(h.ctx.settings.pool.entry().held, None);
}

/// A storage pool whose space LXD cannot tell (an error) holds nothing either: the refill goes
/// on as before rather than stopping at a read it cannot make.
#[tokio::test]
async fn a_storage_pool_whose_space_cannot_be_read_refills_as_before() {
    let h = Harness::new(2);
    for _ in 0..4 {
        h.fake.fault_method(
            "storage_pool_space",
            Fault::Fail(RuntimeError::Transport {
                what: "storage pool resources".into(),
                message: "injected".into(),
            }),
        );
    }
    h.fill().await;
    assert_eq!(h.members().len(), 2);
    assert_eq!(h.held_gauge(), 0);
    assert_eq!(h.ctx.settings.pool.entry().held, None);
}

/// A held refill takes nothing from claims: a new project still takes a ready member, and no
/// member replaces it while the storage pool is short.
#[tokio::test]
async fn a_claim_is_not_held_by_a_short_storage_pool() {
    let h = Harness::new(2);
    h.fill().await;
    h.storage(100 * GIB, 5 * GIB);
    h.apply("p", json!({"image": "berth-base"}));
    h.converge("p").await;
    h.assert_claimed_ready("p");
    assert_eq!(h.claims(), 1);
    h.fill().await;
    assert_eq!(h.members().len(), 1);
    assert_eq!(h.fake.count("create_instance"), 2);
    assert_eq!(h.held_gauge(), 1);
}
