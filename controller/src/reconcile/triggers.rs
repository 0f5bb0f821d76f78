//! What makes a project's reconcile run: a change to its spec or metadata in the store, an LXD
//! event about its container, and a periodic resync of every project.
//!
//! An LXD lifecycle event is a trigger; an operation event is not (berth waits on its own
//! operations, and every change by anyone ends in a lifecycle event), nor are commands run and
//! files moved in a container, which change nothing a reconcile converges, nor the creates and
//! starts `own_changes.rs` expects of berth's own calls; the controller's own status and finalizer
//! writes are not changes either. The resync is one list call without state: a container whose
//! last-used time moved, or whose pid berth never read, is read afresh for its pid. The timer and
//! the scheduler's pass skip a resync right after another listed, and passes started together wait
//! for one another's list under the snapshot's listing lock, so there is one list per interval; a
//! (re)connected event stream lists at once. `berth_projects{phase}` is recounted after changes
//! (`count_phases`).

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use berth_api::Kind;
use futures::StreamExt;
use tokio::sync::broadcast::error::RecvError;
use tokio_util::sync::CancellationToken;

use super::Context;
use super::snapshot::Strays;
use crate::runtime::EventKind;

/// Requests every project: after missed changes, a reconnect, or on the resync timer.
pub fn request_all(ctx: &Context) {
    for project in ctx.store.list(Kind::Project) {
        ctx.queue.request_now(project.name());
    }
}

/// Follows the store's change feed. The controller's own status writes are ignored (they would
/// only re-run what just ran); a changed AgentProfile requests every project, since homes and
/// `ProfileNotFound` depend on it.
pub async fn watch_store(ctx: Arc<Context>, cancel: CancellationToken) {
    let mut changes = ctx.store.subscribe();
    request_all(&ctx);
    loop {
        let change = tokio::select! {
            _ = cancel.cancelled() => return,
            change = changes.recv() => change,
        };
        match change {
            Ok(change) if change.kind == Kind::Project => {
                if change.desired_changed {
                    ctx.queue.request_change(&change.name);
                }
            }
            Ok(change) if change.kind == Kind::AgentProfile => request_all(&ctx),
            Ok(_) => {}
            Err(RecvError::Lagged(missed)) => {
                tracing::warn!(missed, "fell behind the store's change feed; resyncing");
                request_all(&ctx);
            }
            Err(RecvError::Closed) => return,
        }
    }
}

/// Follows LXD's event stream, requesting the project an instance event is about. The stream is
/// reconnected when it breaks (LXD restarted), and every project is resynced then, since events
/// may have been missed meanwhile.
pub async fn watch_lxd_events(ctx: Arc<Context>, cancel: CancellationToken) {
    let mut delay = Duration::from_millis(500);
    loop {
        let stream = tokio::select! {
            _ = cancel.cancelled() => return,
            stream = ctx.runtime.events() => stream,
        };
        match stream {
            Ok(mut events) => {
                delay = Duration::from_millis(500);
                // Events may have been missed until now: list afresh (which requests every
                // project), so the snapshot holds a list that the events since complete.
                {
                    let _listing = ctx.snapshot.listing().await;
                    ctx.snapshot.following_events();
                    resync_pass(&ctx).await;
                }
                loop {
                    let event = tokio::select! {
                        _ = cancel.cancelled() => return,
                        event = events.next() => event,
                    };
                    match event {
                        Some(Ok(event)) => {
                            // An alias moved (an image rebuilt): what aliases resolved to is
                            // asked again.
                            if event.kind == EventKind::Lifecycle
                                && event.action.starts_with("image-")
                            {
                                ctx.snapshot.forget_images();
                            }
                            // A lifecycle event follows every change to an instance, whoever
                            // made it; the operation events around it (several per call, most
                            // of them about berth's own calls, which it waits on itself) would
                            // only run the same reconcile again. Any instance's is noted, not
                            // only a project's: a project applied for that name later must not
                            // take it for absent on the strength of an older list.
                            if event.kind == EventKind::Lifecycle
                                && !converges_nothing(&event.action)
                                && let Some(name) = event.instance
                            {
                                ctx.snapshot.forget(&name);
                                if ctx.store.get(Kind::Project, &name).is_some()
                                    && !ctx.own_changes.announced(&name, &event.action)
                                {
                                    ctx.queue.request_now(&name);
                                }
                            }
                        }
                        Some(Err(e)) => {
                            tracing::warn!(error = %e, "LXD event stream broke; reconnecting");
                            ctx.snapshot.events_lost();
                            break;
                        }
                        None => {
                            tracing::warn!("LXD event stream ended; reconnecting");
                            ctx.snapshot.events_lost();
                            break;
                        }
                    }
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, retry_in = ?delay, "cannot subscribe to LXD events");
            }
        }
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(delay) => {}
        }
        delay = (delay * 2).min(Duration::from_secs(30));
    }
}

/// Lifecycle actions that change nothing a reconcile converges (the instance's existence,
/// power state, config and devices): commands run and files or logs read and written in it.
/// berth's own steps, inspections and agent watches cause most of them; a reconcile for each
/// would read the container again for nothing. Any other action, known or not, requests one.
fn converges_nothing(action: &str) -> bool {
    const QUIET: [&str; 5] = [
        "instance-exec",
        "instance-file-",
        "instance-log-",
        "instance-console",
        "instance-metadata-",
    ];
    QUIET.iter().any(|prefix| action.starts_with(prefix))
}

/// Requests every project each resync interval, so drift the events missed is caught; see
/// [`resync_unless_fresh`].
pub async fn resync(ctx: Arc<Context>, cancel: CancellationToken) {
    let interval = ctx.settings.resync_interval;
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // The first tick is immediate; `watch_store` already requested everything at start.
    ticker.tick().await;
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = ticker.tick() => {}
        }
        resync_unless_fresh(&ctx).await;
    }
}

/// A resync pass, unless another listed the fleet less than half an interval ago (the event
/// watch does when it connects): one list per interval is the work, whoever starts it. Passes
/// started together (the timer's and the scheduler's) list once: the later waits for the
/// earlier's list and then finds it fresh.
///
/// Answers the strays of the list it made or found fresh, for housekeeping; `None` when no
/// list has succeeded yet.
pub async fn resync_unless_fresh(ctx: &Context) -> Option<Arc<Strays>> {
    let interval = ctx.settings.resync_interval;
    let _listing = ctx.snapshot.listing().await;
    if ctx.snapshot.age().is_none_or(|age| age >= interval / 2) {
        resync_pass(ctx).await;
    }
    ctx.snapshot
        .strays()
        .filter(|strays| strays.listed_at.elapsed() < interval)
}

/// One resync pass: one list call for the whole fleet, then every project requested; the
/// reconciles take their container from that list instead of reading it again.
pub async fn resync_pass(ctx: &Context) {
    let started = tokio::time::Instant::now();
    ctx.fleet.invalidate().await;
    let listed_at = tokio::time::Instant::now();
    // Without state: LXD would gather every running container's processes, memory and network
    // for it, which costs more than the whole rest of a pass. A reconcile reads the state of a
    // container it sees started since it last looked (`reconcile::project`).
    // Every instance, berth's or not: the snapshot answers for names the list lacks.
    // Projects read on both sides of the list: one created or deleted meanwhile has its uid in
    // one of them, so its container is no stray.
    let before = ctx.store.list(Kind::Project);
    match ctx.runtime.list_instances(None, false).await {
        Ok(listed) => {
            ctx.fleet.seed(&listed, listed_at).await;
            let projects = ctx.store.list(Kind::Project);
            let known: HashSet<&str> = before.iter().chain(&projects).map(|p| p.uid()).collect();
            ctx.snapshot
                .keep_strays(Strays::of(&listed, |uid| known.contains(uid), listed_at));
            ctx.snapshot
                .replace(projects.iter().map(|p| p.name()), listed, listed_at);
        }
        Err(e) => tracing::warn!(error = %e, "resync: listing LXD instances failed"),
    }
    request_all(ctx);
    ctx.metrics
        .observe_pass("resync", started.elapsed().as_secs_f64());
}

/// How soon `berth_projects{phase}` follows a project's change of phase, at most.
const PHASE_GAUGE_DELAY: Duration = Duration::from_secs(2);

/// Keeps `berth_projects{phase}` current: recounted once any project changed, at most every
/// [`PHASE_GAUGE_DELAY`], so a fleet busy converging costs one count per interval, not one per
/// write.
pub async fn watch_phases(ctx: Arc<Context>, cancel: CancellationToken) {
    let mut changes = ctx.store.subscribe();
    let mut ticker = tokio::time::interval(PHASE_GAUGE_DELAY);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut changed = true;
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            change = changes.recv() => match change {
                Ok(change) => changed |= change.kind == Kind::Project,
                Err(RecvError::Lagged(_)) => changed = true,
                Err(RecvError::Closed) => return,
            },
            _ = ticker.tick(), if changed => {
                count_phases(&ctx.store, &ctx.metrics);
                changed = false;
            }
        }
    }
}

/// Sets `berth_projects{phase}` from the phases the store holds, and from the conditions the
/// held deletions (`berth_deletions_held`, `berth_deletion_held_oldest_seconds`) and the steps
/// past their deadline (`berth_projects_step_timeout`).
pub fn count_phases(store: &crate::store::Store, metrics: &crate::metrics::Metrics) {
    let mut counts: std::collections::HashMap<&'static str, i64> = std::collections::HashMap::new();
    let (mut held, mut oldest_held, mut timed_out) = (0, None, 0);
    for project in store.list(Kind::Project) {
        let phase = project
            .status
            .get("phase")
            .and_then(|p| serde_json::from_value::<berth_api::Phase>(p).ok())
            .unwrap_or_default();
        *counts.entry(phase.as_str()).or_default() += 1;
        let conditions: Vec<berth_api::Condition> = project
            .status
            .get("conditions")
            .and_then(|c| serde_json::from_value(c).ok())
            .unwrap_or_default();
        let is_true = |c: &berth_api::Condition| c.status == berth_api::ConditionStatus::True;
        if let Some(asked) = project.metadata.deletion_timestamp
            && conditions.iter().any(|c| {
                c.type_ == berth_api::conditions::condition_types::DELETION_BLOCKED && is_true(c)
            })
        {
            held += 1;
            oldest_held =
                Some(oldest_held.map_or(asked, |o: chrono::DateTime<chrono::Utc>| o.min(asked)));
        }
        if conditions
            .iter()
            .any(|c| !is_true(c) && STEP_DEADLINE_REASONS.contains(&c.reason.as_str()))
        {
            timed_out += 1;
        }
    }
    metrics.set_project_phases(counts);
    metrics.set_deletions_held(held, oldest_held);
    metrics.projects_step_timeout.set(timed_out);
}

/// Condition reasons saying a step ran past its deadline.
const STEP_DEADLINE_REASONS: [&str; 3] = [
    berth_api::conditions::reasons::STEP_TIMEOUT,
    berth_api::conditions::reasons::BOOT_TIMEOUT,
    berth_api::conditions::reasons::BRIEF_NOT_ACKNOWLEDGED,
];

#[cfg(test)]
#[path = "triggers_tests.rs"]
mod tests;
