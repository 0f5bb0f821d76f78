//! The warm pool: containers of the default image made ahead of time, booted once (so the
//! image is known to boot and LXD's first-start remap of the root filesystem is done) and
//! stopped again, holding no project's data. A new project of that image claims one instead of
//! creating its own: the member is renamed to the project's name, given the project's labels,
//! limits and volumes in one update, and started (`project/claim.rs`).
//!
//! Members are stopped because LXD renames only a stopped instance, and a project's container
//! is named after the project: a claim of a running member would have to stop it first, which
//! costs more than the boot it saves (measured in README's "Warm pool").
//!
//! A member is named `berth-pool-<controller>-<n>` and labelled [`POOL_LABEL`] with the
//! controller's id, so two daemons on one LXD never claim or delete each other's. The refill
//! ([`refill`]) is one task making one member at a time, never while a claimed container is
//! still on its way up ([`WarmPool::quiet`]); it deletes members the pool no longer
//! wants (a lower `pool.size`, another image) through [`crate::dispose::pool_member`].
//!
//! A stopped member holds no memory or CPU but a copy of its image on the storage pool (a full
//! unpacked one on `dir`), so members count against that pool's space: the refill makes one
//! only while the pool would keep [`RESERVE_PERCENT`] of its total plus the image's size free
//! ([`Held`]). A claim adds no member and is never held; a pool that does not know its total,
//! or whose space LXD cannot tell, holds nothing. The pool judged is `lxd.storagePool`: a member has no root disk of its own
//! and lands on the default profile's, which is that pool where LXD was set up as berth's
//! scripts do it.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use berth_api::Kind;
use berth_api::wire::PoolEntry;
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::Context;
use super::project::BOOT_POLL;
use super::status::ControllerRecord;
use crate::dispose;
use crate::layout::{POOL_LABEL, POOL_READY_LABEL, uid_label};
use crate::metrics::{ImageLabels, ImageReasonLabels, Metrics};
use crate::runtime::{
    CreateInstance, Created, ImageSource, Instance, InstancePatch, InstanceStatus, OperationStatus,
    RuntimeError, StopOptions,
};
use crate::store::Store;

/// The first wait after a failed refill pass; it doubles up to [`FAILED_MAX`].
const FAILED_FIRST: Duration = Duration::from_secs(5);
const FAILED_MAX: Duration = Duration::from_secs(300);
/// The longest the refill waits for a claimed container to answer before it makes the next
/// member anyway (a claim whose project never gets there holds it back no longer).
pub const CLAIM_QUIET: Duration = Duration::from_secs(10);
/// The share of the storage pool's total that the refill leaves free for projects' writes.
pub const RESERVE_PERCENT: u64 = 10;
/// The `reason` of `berth_pool_held` and of `berth get pool`'s HELD while the storage pool is
/// short.
const HELD_DISK: &str = "disk";

/// The warm pool of one controller: what it wants, the members the last pass found ready, and
/// the members a claim has taken but not yet recorded in its project.
#[derive(Debug, Default)]
pub struct WarmPool {
    /// The image alias members are made of (`defaults.image`).
    image: String,
    wanted: usize,
    state: Mutex<Members>,
    claims: AtomicU64,
    /// Wakes the refill after a claim.
    wake: Notify,
    /// Wakes a refill waiting for claimed containers to answer.
    answered: Notify,
}

#[derive(Debug, Default)]
struct Members {
    /// Ready members by name, with the fingerprint of their image.
    ready: BTreeMap<String, String>,
    /// Taken by a claim whose project has not recorded it yet.
    taken: BTreeSet<String>,
    /// Projects whose claimed container was started and has not answered yet, with when.
    starting: BTreeMap<String, Instant>,
    /// Why the last pass made no member though the pool was short, if it was held.
    held: Option<Held>,
    /// The size LXD gives for each image fingerprint, read once.
    image_sizes: BTreeMap<String, u64>,
}

/// The storage pool members go on would keep less free than its reserve with one more.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Held {
    storage_pool: String,
    free: u64,
    /// [`RESERVE_PERCENT`] of the pool's total plus the size of the member's image.
    reserve: u64,
}

impl WarmPool {
    /// A pool of `wanted` members of `image`; `wanted` 0 keeps none (and deletes what a
    /// larger pool left).
    pub fn new(image: &str, wanted: usize) -> WarmPool {
        WarmPool {
            image: image.to_string(),
            wanted,
            ..WarmPool::default()
        }
    }

    pub fn image(&self) -> &str {
        &self.image
    }

    pub fn wanted(&self) -> usize {
        self.wanted
    }

    /// What `berth get pool` shows.
    pub fn entry(&self) -> PoolEntry {
        let members = self.lock();
        PoolEntry {
            image: self.image.clone(),
            ready: members.ready.len() as u64,
            wanted: self.wanted as u64,
            claims: self.claims.load(Ordering::Relaxed),
            held: members.held.as_ref().map(|_| HELD_DISK.to_string()),
        }
    }

    /// Exposes the pool's metrics from the first scrape: none ready, none claimed yet.
    pub fn expose(&self, metrics: &Metrics) {
        self.gauge(metrics, self.lock().ready.len());
        metrics.pool_claims.get_or_create(&self.labels()).inc_by(0);
        let held = self.lock().held.is_some();
        self.held_gauge(metrics, held);
    }

    /// Takes a ready member of the image `fingerprint`, if there is one. It stays taken (no
    /// refill pass deletes it) until [`Self::release`], which the claim calls once its
    /// project recorded the member.
    pub fn take(&self, fingerprint: &str, metrics: &Metrics) -> Option<String> {
        let mut members = self.lock();
        let name = members
            .ready
            .iter()
            .find(|(_, f)| f.as_str() == fingerprint)
            .map(|(name, _)| name.clone())?;
        members.ready.remove(&name);
        members.taken.insert(name.clone());
        self.gauge(metrics, members.ready.len());
        Some(name)
    }

    /// The claim of `name` is recorded in its project (or did not happen).
    pub fn release(&self, name: &str) {
        self.lock().taken.remove(name);
    }

    /// The project `project` finished claiming a member and started it: counted, and the refill
    /// makes another once the container answered ([`Self::answered`]).
    pub fn claimed(&self, project: &str, metrics: &Metrics) {
        self.claims.fetch_add(1, Ordering::Relaxed);
        metrics.pool_claims.get_or_create(&self.labels()).inc();
        self.lock()
            .starting
            .insert(project.to_string(), Instant::now());
        self.wake.notify_one();
    }

    /// The container of `project` answers: a claim of it no longer holds the refill back.
    pub fn answered(&self, project: &str) {
        let mut members = self.lock();
        if members.starting.is_empty() {
            return;
        }
        if members.starting.remove(project).is_some() {
            self.answered.notify_one();
        }
    }

    /// Waits while a claimed container is on its way up, each for at most [`CLAIM_QUIET`]: a
    /// member made meanwhile (an image unpacked, a container booted) would take the host's disk
    /// and CPU from the start a person is waiting on.
    pub async fn quiet(&self) {
        loop {
            let wait = {
                let mut members = self.lock();
                members.starting.retain(|_, at| at.elapsed() < CLAIM_QUIET);
                members
                    .starting
                    .values()
                    .map(|at| CLAIM_QUIET.saturating_sub(at.elapsed()))
                    .max()
            };
            let Some(wait) = wait else {
                return;
            };
            tokio::select! {
                _ = self.answered.notified() => {}
                _ = tokio::time::sleep(wait) => {}
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Members> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn labels(&self) -> ImageLabels {
        ImageLabels {
            image: self.image.clone(),
        }
    }

    fn gauge(&self, metrics: &Metrics, ready: usize) {
        metrics
            .pool_ready
            .get_or_create(&self.labels())
            .set(i64::try_from(ready).unwrap_or(i64::MAX));
    }

    fn held_gauge(&self, metrics: &Metrics, held: bool) {
        let labels = ImageReasonLabels {
            image: self.image.clone(),
            reason: HELD_DISK.to_string(),
        };
        metrics
            .pool_held
            .get_or_create(&labels)
            .set(i64::from(held));
    }

    /// Records whether the refill is held, saying so when that changes.
    fn hold(&self, metrics: &Metrics, held: Option<Held>) {
        let mut members = self.lock();
        match (&members.held, &held) {
            (None, Some(now)) => tracing::warn!(
                image = self.image.as_str(),
                storage_pool = now.storage_pool.as_str(),
                free_bytes = now.free,
                reserve_bytes = now.reserve,
                "the warm pool makes no member: its storage pool would keep less free than the reserve"
            ),
            (Some(was), None) => tracing::info!(
                image = self.image.as_str(),
                storage_pool = was.storage_pool.as_str(),
                "the warm pool's storage pool has room again; members are made"
            ),
            _ => {}
        }
        self.held_gauge(metrics, held.is_some());
        members.held = held;
    }

    /// Takes `name` out of the ready members so no claim takes it; false when a claim has it.
    fn retire(&self, name: &str) -> bool {
        let mut members = self.lock();
        if members.taken.contains(name) {
            return false;
        }
        members.ready.remove(name);
        true
    }
}

/// What every member name of the controller `controller` starts with.
pub fn member_prefix(controller: &str) -> String {
    let short: String = controller
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .take(8)
        .collect();
    format!("berth-pool-{}-", short.to_ascii_lowercase())
}

/// Whether `instance` is an unclaimed member of the controller `controller`'s pool.
pub fn is_member(instance: &Instance, controller: &str) -> bool {
    instance.config.get(POOL_LABEL).map(String::as_str) == Some(controller)
        && uid_label(&instance.config).is_none()
}

/// The labels a claim clears, in the same update that sets the project's.
pub fn claim_clears() -> [(String, String); 2] {
    [
        (POOL_LABEL.to_string(), String::new()),
        (POOL_READY_LABEL.to_string(), String::new()),
    ]
}

/// Keeps the pool at its size until `cancel`: a pass, then the next at once while it made a
/// member, else after a claim or a resync interval; a failing pass waits longer each time.
/// Without a pool it ends after the first pass that deleted every member. The controller runs
/// it only while the daemon is not paused.
pub async fn refill(ctx: std::sync::Arc<Context>, cancel: CancellationToken) {
    let pool = &ctx.settings.pool;
    let mut failed = FAILED_FIRST;
    loop {
        let outcome = tokio::select! {
            _ = cancel.cancelled() => return,
            outcome = async {
                pool.quiet().await;
                pass(&ctx).await
            } => outcome,
        };
        let wait = match outcome {
            Ok(Pass::Made) => {
                failed = FAILED_FIRST;
                continue;
            }
            // No pool: what an earlier, larger one left is gone, and nothing is made again.
            Ok(Pass::Settled) if pool.wanted == 0 => return,
            Ok(Pass::Settled) => {
                failed = FAILED_FIRST;
                ctx.settings.resync_interval
            }
            Err(e) => {
                tracing::warn!(error = %e, retry_in = ?failed, "the warm pool's refill failed");
                let wait = failed;
                failed = (failed * 2).min(FAILED_MAX);
                wait
            }
        };
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = pool.wake.notified() => {}
            _ = tokio::time::sleep(wait) => {}
        }
    }
}

/// What one refill pass did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pass {
    /// Made a member: the pass runs again at once.
    Made,
    /// The pool is as wanted (or no member can be made: of a missing image, or on a storage
    /// pool short of its reserve).
    Settled,
}

/// One refill pass: reads the members from LXD; deletes those left half made by a daemon
/// stopped mid-way, those of an image the alias no longer names, those past the size, and
/// those a deleted project had taken mid-claim; then makes one member when the pool is short,
/// unless the storage pool would keep less free than its reserve (the pass is held).
pub async fn pass(ctx: &Context) -> Result<Pass, RuntimeError> {
    let pool = &ctx.settings.pool;
    let runtime = &*ctx.runtime;
    let controller = ctx.store.controller_id().to_string();
    let prefix = member_prefix(&controller);
    let fingerprint = match pool.wanted {
        0 => None,
        _ => {
            runtime
                .resolve_image(&ImageSource::Alias(pool.image.clone()))
                .await?
        }
    };
    let listed = runtime.list_instances(Some(POOL_LABEL), false).await?;
    // Read after the list (taken first): a claim records its member before it releases it, so
    // a member taken before the list is in one of the two.
    let taken = pool.lock().taken.clone();
    let claiming = claiming(&ctx.store);
    let number = |name: &str| {
        name.strip_prefix(&prefix)
            .and_then(|n| n.parse::<u64>().ok())
    };
    // A new member's name is none a claim in progress still refers to.
    let highest = listed
        .iter()
        .map(|i| i.name.as_str())
        .chain(taken.iter().map(String::as_str))
        .chain(claiming.iter().map(String::as_str))
        .filter_map(number)
        .max()
        .unwrap_or(0);
    let mut ready = BTreeMap::new();
    let mut doomed = Vec::new();
    for member in listed.iter().filter(|i| is_member(i, &controller)) {
        let name = member.name.as_str();
        if taken.contains(name) || claiming.contains(name) {
            continue;
        }
        if number(name).is_none() {
            // Renamed by a claim no project records any more (its project was deleted mid-claim):
            // it was never given a project's data.
            doomed.push(name.to_string());
            continue;
        }
        let booted = member
            .config
            .get(POOL_READY_LABEL)
            .is_some_and(|v| v == "true")
            && member.status == InstanceStatus::Stopped;
        match (booted, member.base_image(), fingerprint.as_deref()) {
            (true, Some(image), Some(wanted)) if image == wanted => {
                ready.insert(name.to_string(), image.to_string());
            }
            _ => doomed.push(name.to_string()),
        }
    }
    while ready.len() > pool.wanted {
        let (surplus, _) = ready.pop_last().expect("more than wanted");
        doomed.push(surplus);
    }
    {
        let mut members = pool.lock();
        // A claim may have taken one since the list.
        ready.retain(|name, _| !members.taken.contains(name));
        members.ready = ready;
        pool.gauge(&ctx.metrics, members.ready.len());
    }
    for name in doomed {
        if !pool.retire(&name) {
            continue;
        }
        dispose::pool_member(runtime, &controller, &name, ctx.settings.timeouts.delete).await?;
    }
    let short = pool.lock().ready.len() < pool.wanted;
    let held = match fingerprint.as_deref() {
        Some(fingerprint) if short => disk_short(ctx, fingerprint).await?,
        _ => None,
    };
    let holding = held.is_some();
    pool.hold(&ctx.metrics, held);
    match fingerprint {
        Some(_) if holding => Ok(Pass::Settled),
        Some(fingerprint) if short => {
            let name = format!("{prefix}{}", highest + 1);
            make(ctx, &controller, &name, &fingerprint).await?;
            let mut members = pool.lock();
            members.ready.insert(name, fingerprint);
            pool.gauge(&ctx.metrics, members.ready.len());
            Ok(Pass::Made)
        }
        None if pool.wanted > 0 => {
            tracing::warn!(
                image = pool.image.as_str(),
                "the warm pool's image is not in LXD; no member is made"
            );
            Ok(Pass::Settled)
        }
        _ => Ok(Pass::Settled),
    }
}

/// Whether one more member of the image `fingerprint` would leave the storage pool less free
/// than its reserve ([`RESERVE_PERCENT`] of its total plus the image's size); `None` when it
/// would not, or when the pool does not know its total and nothing can be judged.
async fn disk_short(ctx: &Context, fingerprint: &str) -> Result<Option<Held>, RuntimeError> {
    let runtime = &*ctx.runtime;
    let storage_pool = &ctx.settings.storage_pool;
    // A pool whose space LXD cannot tell is judged as one that does not know its total: the
    // reserve guards the host's disk, and a refill stopped by a read it cannot make would
    // guard nothing.
    let space = match runtime.storage_pool_space(storage_pool).await {
        Ok(space) => space,
        Err(e) => {
            tracing::debug!(storage_pool = storage_pool.as_str(), error = %e,
                "the storage pool's space could not be read; the reserve is not judged");
            return Ok(None);
        }
    };
    if space.total == 0 {
        return Ok(None);
    }
    let pool = &ctx.settings.pool;
    let known = pool.lock().image_sizes.get(fingerprint).copied();
    let image = match known {
        Some(size) => size,
        None => {
            // An image gone since it was resolved: the create fails and says so.
            let Some(size) = runtime.image_size(fingerprint).await? else {
                return Ok(None);
            };
            pool.lock()
                .image_sizes
                .insert(fingerprint.to_string(), size);
            size
        }
    };
    let reserve = (space.total / 100)
        .saturating_mul(RESERVE_PERCENT)
        .saturating_add(image);
    let free = space.free();
    Ok((free < reserve).then(|| Held {
        storage_pool: storage_pool.clone(),
        free,
        reserve,
    }))
}

/// The names of members that projects recorded as claimed, and of those projects (a member
/// renamed but not yet given the project's labels carries the project's name). Only a status
/// whose text names a pool member is decoded: a pass reads every project.
fn claiming(store: &Store) -> HashSet<String> {
    let mut names = HashSet::new();
    for project in store.list(Kind::Project) {
        if !project.status.as_str().contains("\"poolMember\"") {
            continue;
        }
        if let Some(member) = ControllerRecord::of(&project).pool_member {
            names.insert(member);
            names.insert(project.name().to_string());
        }
    }
    names
}

/// Makes the member `name`: created with the pool's label alone (no device, volume, secret or
/// limit of any project), started, probed until a command answers, stopped, and marked ready.
/// A daemon stopped mid-way leaves it unmarked, and the next pass deletes it.
async fn make(
    ctx: &Context,
    controller: &str,
    name: &str,
    fingerprint: &str,
) -> Result<(), RuntimeError> {
    let runtime = &*ctx.runtime;
    let timeouts = &ctx.settings.timeouts;
    let request = CreateInstance {
        name: name.to_string(),
        image: ImageSource::Fingerprint(fingerprint.to_string()),
        config: BTreeMap::from([(POOL_LABEL.to_string(), controller.to_string())]),
        devices: BTreeMap::new(),
        profiles: Vec::new(),
        target: None,
        known_absent: false,
    };
    match runtime.create_instance(&request).await? {
        Created::Submitted { operation } => {
            let done = runtime.wait_operation(&operation, timeouts.create).await?;
            if done.status != OperationStatus::Success {
                return Err(RuntimeError::Timeout {
                    what: format!("create pool member {name}"),
                    after: timeouts.create,
                });
            }
        }
        Created::Exists(existing) if is_member(&existing, controller) => {}
        Created::Exists(_) => {
            return Err(RuntimeError::Conflict {
                what: format!("create pool member {name}"),
                message: "an instance of that name exists and is not this pool's".into(),
            });
        }
    }
    runtime.start_instance(name, timeouts.start).await?;
    let booting = tokio::time::Instant::now();
    while !super::project::answers(runtime, name, timeouts.exec).await? {
        if booting.elapsed() > timeouts.boot {
            return Err(RuntimeError::Timeout {
                what: format!("boot pool member {name}"),
                after: timeouts.boot,
            });
        }
        tokio::time::sleep(BOOT_POLL).await;
    }
    // Nothing in it is anyone's: no clean shutdown to wait for.
    let stop = StopOptions::kill();
    runtime.stop_instance(name, stop).await?;
    let mut ready = InstancePatch::default();
    ready
        .config
        .insert(POOL_READY_LABEL.to_string(), "true".to_string());
    runtime.patch_instance(name, &ready).await?;
    tracing::info!(member = name, "warm pool member ready");
    Ok(())
}

#[cfg(test)]
#[path = "pool_tests.rs"]
mod tests;
