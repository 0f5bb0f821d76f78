use super::*;
use berth_api::{BerthDuration, MaxAge, UnsavedWork};
use chrono::{Duration as Span, TimeZone};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use AgentState::{Blocked, Done, Idle, Unknown, Working};
use ProtectionReason::{AgentBlocked, InspectionFailed, UnsavedWork as Unsaved};
use ReapAction::{Delete, Stop};

fn t0() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, 0).unwrap()
}

fn policy(idle_hours: u64, action: IdleAction, max_age_days: Option<u64>) -> ResolvedReapPolicy {
    ResolvedReapPolicy {
        idle_after: BerthDuration::from_secs(idle_hours * 3600),
        idle_action: action,
        max_age: match max_age_days {
            Some(d) => MaxAge::After(BerthDuration::from_secs(d * 86_400)),
            None => MaxAge::Never,
        },
    }
}

fn clean() -> Evidence {
    Evidence::Inspected(UnsavedWork::default())
}

fn unsaved(uncommitted: u32, untracked: u32, stashes: u32, unpushed: u32) -> Evidence {
    Evidence::Inspected(UnsavedWork {
        uncommitted,
        untracked,
        stashes,
        unpushed,
        ..UnsavedWork::default()
    })
}

struct Row {
    name: &'static str,
    policy: ResolvedReapPolicy,
    /// Project age in hours at `now`.
    age_hours: i64,
    /// Hours since last activity (`None`: never active).
    idle_hours: Option<i64>,
    agent: AgentState,
    evidence: Evidence,
    reachable: bool,
    stopped: bool,
    previous: Option<ReapAction>,
    expect: Decision,
}

fn row(name: &'static str, age_hours: i64, idle_hours: Option<i64>, expect: Decision) -> Row {
    Row {
        name,
        policy: policy(2, IdleAction::Stop, Some(30)),
        age_hours,
        idle_hours,
        agent: Idle,
        evidence: clean(),
        reachable: true,
        stopped: false,
        previous: None,
        expect,
    }
}

fn refuse(action: ReapAction, reasons: &[ProtectionReason]) -> Decision {
    Decision::Refuse {
        action,
        reasons: reasons.to_vec(),
    }
}

#[test]
fn decision_table() {
    const DAY: i64 = 24;
    let due_stop = Decision::Due { action: Stop };
    let act_stop = Decision::Act { action: Stop };
    let due_delete = Decision::Due { action: Delete };
    let act_delete = Decision::Act { action: Delete };
    let rows = vec![
        row("recently active", 5, Some(1), Decision::Keep),
        row("idle, first pass", 5, Some(3), due_stop.clone()),
        Row {
            previous: Some(Stop),
            ..row("idle, second pass agrees", 5, Some(3), act_stop.clone())
        },
        Row {
            previous: Some(Delete),
            ..row(
                "previous pass saw another action",
                5,
                Some(3),
                due_stop.clone(),
            )
        },
        row("never active, young", 1, None, Decision::Keep),
        row("never active, past idle window", 3, None, due_stop.clone()),
        Row {
            agent: Working,
            previous: Some(Stop),
            ..row(
                "working agent but no recent activity",
                5,
                Some(3),
                act_stop.clone(),
            )
        },
        Row {
            agent: Blocked,
            previous: Some(Stop),
            ..row("blocked agent", 5, Some(3), refuse(Stop, &[AgentBlocked]))
        },
        Row {
            evidence: unsaved(1, 0, 0, 0),
            previous: Some(Stop),
            ..row("uncommitted change", 5, Some(3), refuse(Stop, &[Unsaved]))
        },
        Row {
            evidence: unsaved(0, 1, 0, 0),
            ..row("untracked file", 5, Some(3), refuse(Stop, &[Unsaved]))
        },
        Row {
            evidence: unsaved(0, 0, 1, 0),
            ..row("stash", 5, Some(3), refuse(Stop, &[Unsaved]))
        },
        Row {
            evidence: unsaved(0, 0, 0, 1),
            ..row("unpushed commit", 5, Some(3), refuse(Stop, &[Unsaved]))
        },
        Row {
            evidence: Evidence::Failed,
            previous: Some(Stop),
            ..row(
                "inspection failed",
                5,
                Some(3),
                refuse(Stop, &[InspectionFailed]),
            )
        },
        Row {
            agent: Blocked,
            evidence: unsaved(2, 1, 0, 3),
            ..row(
                "blocked with unsaved work",
                5,
                Some(3),
                refuse(Stop, &[AgentBlocked, Unsaved]),
            )
        },
        Row {
            agent: Blocked,
            evidence: Evidence::Failed,
            ..row(
                "blocked, inspection failed",
                5,
                Some(3),
                refuse(Stop, &[AgentBlocked, InspectionFailed]),
            )
        },
        Row {
            reachable: false,
            evidence: Evidence::Failed,
            previous: Some(Stop),
            ..row(
                "never reachable: nothing to lose",
                5,
                Some(3),
                act_stop.clone(),
            )
        },
        Row {
            reachable: false,
            evidence: unsaved(3, 0, 0, 0),
            ..row(
                "never reachable ignores counts",
                5,
                Some(3),
                due_stop.clone(),
            )
        },
        // maxAge.
        row("old and idle", 31 * DAY, Some(3), due_delete.clone()),
        Row {
            previous: Some(Delete),
            ..row(
                "old and idle, second pass",
                31 * DAY,
                Some(3),
                act_delete.clone(),
            )
        },
        Row {
            previous: Some(Stop),
            ..row(
                "old: previous saw stop, now delete",
                31 * DAY,
                Some(3),
                due_delete.clone(),
            )
        },
        row(
            "old but active within idle window",
            31 * DAY,
            Some(1),
            Decision::Keep,
        ),
        Row {
            evidence: unsaved(0, 0, 0, 1),
            previous: Some(Delete),
            ..row(
                "old with unpushed commit",
                31 * DAY,
                Some(3),
                refuse(Delete, &[Unsaved]),
            )
        },
        Row {
            agent: Blocked,
            previous: Some(Delete),
            ..row(
                "old with blocked agent",
                31 * DAY,
                Some(30),
                refuse(Delete, &[AgentBlocked]),
            )
        },
        Row {
            evidence: Evidence::Failed,
            previous: Some(Delete),
            ..row(
                "old, inspection failed",
                31 * DAY,
                Some(30),
                refuse(Delete, &[InspectionFailed]),
            )
        },
        Row {
            policy: policy(2, IdleAction::Stop, None),
            previous: Some(Delete),
            stopped: true,
            ..row(
                "maxAge never, idled",
                400 * DAY,
                Some(300 * DAY),
                Decision::Keep,
            )
        },
        Row {
            policy: policy(2, IdleAction::Stop, None),
            previous: Some(Stop),
            ..row("maxAge never, idle", 400 * DAY, Some(3), act_stop.clone())
        },
        Row {
            stopped: true,
            previous: Some(Stop),
            ..row("already idled, young", 5, Some(3), Decision::Keep)
        },
        Row {
            stopped: true,
            previous: Some(Delete),
            ..row(
                "idled and now old",
                31 * DAY,
                Some(10 * DAY),
                act_delete.clone(),
            )
        },
        Row {
            stopped: true,
            evidence: unsaved(1, 0, 0, 0),
            previous: Some(Delete),
            ..row(
                "idled, old, unsaved",
                31 * DAY,
                Some(10 * DAY),
                refuse(Delete, &[Unsaved]),
            )
        },
        // idleAction Delete.
        Row {
            policy: policy(2, IdleAction::Delete, Some(30)),
            previous: Some(Delete),
            ..row("idle delete", 5, Some(3), act_delete.clone())
        },
        Row {
            policy: policy(2, IdleAction::Delete, None),
            evidence: unsaved(0, 1, 0, 0),
            ..row(
                "idle delete, untracked",
                5,
                Some(3),
                refuse(Delete, &[Unsaved]),
            )
        },
        Row {
            policy: policy(2, IdleAction::Delete, None),
            agent: Done,
            stopped: true,
            ..row(
                "idle delete applies to stopped",
                5,
                Some(3),
                due_delete.clone(),
            )
        },
        Row {
            agent: Unknown,
            ..row("exactly at idle boundary", 5, Some(2), due_stop.clone())
        },
    ];
    let mut failures = Vec::new();
    for r in &rows {
        let now = t0() + Span::days(500);
        let subject = ReapSubject {
            now,
            policy: &r.policy,
            created_at: now - Span::hours(r.age_hours),
            last_active_at: r.idle_hours.map(|h| now - Span::hours(h)),
            ready_since: None,
            building: false,
            agent: r.agent,
            evidence: r.evidence.clone(),
            ever_reachable: r.reachable,
            stopped: r.stopped,
            previous_due: r.previous,
        };
        let got = decide(&subject).decision;
        if got != r.expect {
            failures.push(format!(
                "{}: expected {:?}, got {:?}",
                r.name, r.expect, got
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn status_shows_next_action_and_protections_before_due() {
    let p = policy(2, IdleAction::Stop, Some(30));
    let created = t0();
    let active = created + Span::hours(1);
    let subject = ReapSubject {
        now: created + Span::hours(2),
        policy: &p,
        created_at: created,
        last_active_at: Some(active),
        ready_since: None,
        building: false,
        agent: Blocked,
        evidence: unsaved(0, 0, 1, 0),
        ever_reachable: true,
        stopped: false,
        previous_due: None,
    };
    let v = decide(&subject);
    assert_eq!(v.decision, Decision::Keep);
    assert_eq!(v.protected_by, vec![AgentBlocked, Unsaved]);
    assert_eq!(v.next_action, Some(Stop));
    assert_eq!(v.next_action_at, Some(active + Span::hours(2)));

    // Idled: the next thing is the age deletion, at creation + 30d.
    let idled = ReapSubject {
        stopped: true,
        ..subject.clone()
    };
    let v = decide(&idled);
    assert_eq!(v.next_action, Some(Delete));
    assert_eq!(v.next_action_at, Some(created + Span::days(30)));

    // Idled with maxAge never: nothing will ever come.
    let never = policy(2, IdleAction::Stop, None);
    let v = decide(&ReapSubject {
        policy: &never,
        ..idled
    });
    assert_eq!((v.next_action, v.next_action_at), (None, None));
    assert_eq!(v.decision, Decision::Keep);
}

#[test]
fn activity_before_creation_counts_from_creation() {
    // A clock skew between the container and the host must not make a new project look idle.
    let p = policy(2, IdleAction::Stop, None);
    let created = t0();
    let v = decide(&ReapSubject {
        now: created + Span::hours(1),
        policy: &p,
        created_at: created,
        last_active_at: Some(created - Span::days(10)),
        ready_since: None,
        building: false,
        agent: Idle,
        evidence: clean(),
        ever_reachable: true,
        stopped: false,
        previous_due: Some(Stop),
    });
    assert_eq!(v.decision, Decision::Keep);
}

#[test]
fn a_slow_build_is_not_idleness() {
    // idleAfter 2h, and the first build takes 5h: nothing is due while it builds, and once the
    // project is Ready the idle window counts from then, not from its creation.
    let p = policy(2, IdleAction::Delete, None);
    let created = t0();
    let building = ReapSubject {
        now: created + Span::hours(5),
        policy: &p,
        created_at: created,
        last_active_at: None,
        ready_since: None,
        building: true,
        agent: Unknown,
        evidence: clean(),
        ever_reachable: true,
        stopped: false,
        previous_due: Some(Delete),
    };
    let v = decide(&building);
    assert_eq!(v.decision, Decision::Keep);
    assert_eq!((v.next_action, v.next_action_at), (None, None));

    let ready_at = created + Span::hours(5);
    let ready = ReapSubject {
        now: ready_at + Span::hours(1),
        building: false,
        ready_since: Some(ready_at),
        ..building.clone()
    };
    let v = decide(&ready);
    assert_eq!(v.decision, Decision::Keep);
    assert_eq!(v.next_action, Some(Delete));
    assert_eq!(v.next_action_at, Some(ready_at + Span::hours(2)));

    // A build never suspends maxAge.
    let aged = policy(2, IdleAction::Stop, Some(1));
    let v = decide(&ReapSubject {
        now: created + Span::days(2),
        policy: &aged,
        ..building
    });
    assert_eq!(v.decision, Decision::Act { action: Delete });
}

#[test]
fn protections_guard_deletion_paths() {
    assert_eq!(protections(Idle, &clean(), true), vec![]);
    assert_eq!(
        protections(Blocked, &Evidence::Failed, true),
        vec![AgentBlocked, InspectionFailed]
    );
    assert_eq!(protections(Blocked, &Evidence::Failed, false), vec![]);
}

/// One simulated workspace: its true state, which the inspection may or may not see.
struct World {
    policy: ResolvedReapPolicy,
    created_at: DateTime<Utc>,
    last_active_at: Option<DateTime<Utc>>,
    unsaved: UnsavedWork,
    agent: AgentState,
    reachable: bool,
    /// What status says of it: the step moves back (a new image, a recreate, a vanished
    /// container, every boot), `firstReachableAt` never does. The policy learns "ever
    /// reachable" only from this, as the passes do.
    status: berth_api::ProjectStatus,
    stopped: bool,
    previous_due: Option<ReapAction>,
    /// Since when the project has been continuously unprotected, reachable-or-not, and idle.
    reapable_since: Option<DateTime<Utc>>,
    gone: bool,
}

/// Thousands of workspace-days of random use. Asserts on every action that the workspace was
/// not protected at that moment (by its true state, not only what the inspection saw), that it
/// was due by the policy, and that unprotected idle workspaces do get reaped soon after they
/// become due.
#[test]
fn randomized_simulation_never_reaps_protected_work() {
    let mut rng = StdRng::seed_from_u64(0x6265_7274_6800_0006);
    let pass = Span::seconds(30 * 60);
    let days = 60;
    let workspaces = 120;
    let mut reaped = [0usize; 2];
    let mut refused = 0usize;
    for w in 0..workspaces {
        let idle_hours = rng.random_range(1..=12);
        let idle_action = if rng.random_bool(0.25) {
            IdleAction::Delete
        } else {
            IdleAction::Stop
        };
        let max_age = if rng.random_bool(0.3) {
            None
        } else {
            Some(rng.random_range(2..=20))
        };
        let start = t0() + Span::minutes(rng.random_range(0..600));
        let mut world = World {
            policy: policy(idle_hours, idle_action, max_age),
            created_at: start,
            last_active_at: None,
            unsaved: UnsavedWork::default(),
            agent: Unknown,
            reachable: false,
            status: berth_api::ProjectStatus::default(),
            stopped: false,
            previous_due: None,
            reapable_since: None,
            gone: false,
        };
        // Each workspace has its own temperament: how often it is used, how tidy it is.
        let p_active = rng.random_range(0.0..0.3);
        let p_dirty = rng.random_range(0.0..0.2);
        let p_save = rng.random_range(0.0..0.3);
        let p_block = rng.random_range(0.0..0.05);
        let p_fail = if w % 3 == 0 {
            0.0
        } else {
            rng.random_range(0.0..0.2)
        };
        let mut now = start;
        let end = start + Span::days(days);
        while now < end && !world.gone {
            now += pass;
            // The world changes between passes.
            if !world.reachable && rng.random_bool(0.5) {
                world.reachable = true;
                world.status.step = Some(berth_api::Step::Reachable);
                world.status.first_reachable_at.get_or_insert(now);
            }
            // The step goes back now and then, and forward again once the container answers.
            if world.reachable && rng.random_bool(0.05) {
                world.status.step = Some(
                    [
                        berth_api::Step::Requested,
                        berth_api::Step::Started,
                        berth_api::Step::Seeded,
                    ][rng.random_range(0..3)],
                );
            }
            let woken = world.stopped && rng.random_bool(0.01);
            if woken {
                world.stopped = false;
            }
            if !world.stopped && rng.random_bool(p_active) || woken {
                world.last_active_at = Some(now - Span::minutes(rng.random_range(0..30)));
                if world.reachable && rng.random_bool(p_dirty) {
                    match rng.random_range(0..4) {
                        0 => world.unsaved.uncommitted += 1,
                        1 => world.unsaved.untracked += 1,
                        2 => world.unsaved.stashes += 1,
                        _ => world.unsaved.unpushed += 1,
                    }
                }
                if world.reachable && rng.random_bool(p_block) {
                    world.agent = Blocked;
                }
            }
            if rng.random_bool(p_save) {
                world.unsaved = UnsavedWork::default();
            }
            if world.agent == Blocked && rng.random_bool(0.1) {
                world.agent = Done;
            }
            let truly_protected =
                world.reachable && (world.unsaved.any() || world.agent == Blocked);

            let inspect = |world: &World, rng: &mut StdRng| {
                if rng.random_bool(p_fail) {
                    Evidence::Failed
                } else {
                    Evidence::Inspected(world.unsaved.clone())
                }
            };
            let evidence = inspect(&world, &mut rng);
            fn subject(world: &World, now: DateTime<Utc>, evidence: Evidence) -> ReapSubject<'_> {
                ReapSubject {
                    now,
                    policy: &world.policy,
                    created_at: world.created_at,
                    last_active_at: world.last_active_at,
                    ready_since: None,
                    building: false,
                    agent: world.agent,
                    evidence,
                    ever_reachable: crate::reconcile::status::ever_reachable(&world.status),
                    stopped: world.stopped,
                    previous_due: world.previous_due,
                }
            }
            let verdict = decide(&subject(&world, now, evidence));
            if matches!(verdict.decision, Decision::Refuse { .. }) {
                refused += 1;
            }
            world.previous_due = verdict.due_action();

            // Liveness bookkeeping: due by the policy, and nothing true protects it.
            let due_by_policy = verdict.next_action_at.is_some_and(|at| now >= at);
            if due_by_policy && !truly_protected {
                world.reapable_since.get_or_insert(now);
            } else {
                world.reapable_since = None;
            }

            if let Some(action) = verdict.act() {
                // The re-check right before acting, with a fresh inspection.
                let fresh = inspect(&world, &mut rng);
                let recheck = decide(&subject(&world, now, fresh));
                if recheck.act() != Some(action) {
                    continue;
                }
                // Safety: nothing protected is ever reaped.
                assert!(
                    !truly_protected,
                    "workspace {w} reaped ({action:?}) while protected: unsaved {:?}, agent {:?}",
                    world.unsaved, world.agent
                );
                // And only when the policy says so.
                let idle_for = now - world.last_active_at.unwrap_or(world.created_at);
                assert!(
                    idle_for >= world.policy.idle_after.as_chrono(),
                    "workspace {w} reaped after only {idle_for} idle"
                );
                if action == Delete && world.policy.idle_action == IdleAction::Stop {
                    let limit = world.policy.max_age.limit().expect("maxAge never deleted");
                    assert!(now - world.created_at >= limit.as_chrono());
                }
                match action {
                    Stop => {
                        assert!(!world.stopped, "workspace {w} stopped twice");
                        world.stopped = true;
                        reaped[0] += 1;
                    }
                    Delete => {
                        world.gone = true;
                        reaped[1] += 1;
                    }
                }
                world.reapable_since = None;
                world.previous_due = None;
                continue;
            }

            // Liveness: an unprotected workspace due for reaping is reaped within a few passes
            // (failed inspections aside, which may hold it for a while).
            if let Some(since) = world.reapable_since
                && p_fail == 0.0
            {
                assert!(
                    now - since <= pass * 3,
                    "workspace {w} due since {since} but still not reaped at {now}"
                );
            }
        }
    }
    // The simulation must actually exercise every path, or it proves nothing.
    assert!(reaped[0] > 50, "too few stops: {reaped:?}");
    assert!(reaped[1] > 20, "too few deletes: {reaped:?}");
    assert!(refused > 100, "too few refusals: {refused}");
}

#[test]
fn randomized_simulation_reaps_unprotected_idle_projects_promptly() {
    // With perfect inspections and no protection, every due project is acted on by the second
    // pass that sees it due.
    let mut rng = StdRng::seed_from_u64(42);
    for _ in 0..2000 {
        let p = policy(
            rng.random_range(1..48),
            IdleAction::Stop,
            Some(rng.random_range(1..60)),
        );
        let created = t0();
        let last = created + Span::minutes(rng.random_range(0..10_000));
        let now = last + p.idle_after.as_chrono() + Span::minutes(rng.random_range(0..10_000));
        let mut subject = ReapSubject {
            now,
            policy: &p,
            created_at: created,
            last_active_at: Some(last),
            ready_since: None,
            building: false,
            agent: Done,
            evidence: clean(),
            ever_reachable: true,
            stopped: false,
            previous_due: None,
        };
        let first = decide(&subject);
        let action = first.due_action().expect("due");
        assert!(matches!(first.decision, Decision::Due { .. }));
        subject.previous_due = Some(action);
        assert_eq!(decide(&subject).act(), Some(action));
    }
}

/// Projects stored before durations were capped at admission may hold any length; deciding on
/// them must not overflow the time arithmetic (a panic there would stop the reap pass).
#[test]
fn durations_stored_before_the_cap_decide_without_overflow() {
    let huge = [
        BerthDuration::from_secs(100_000_000 * 86_400),
        BerthDuration::from_std(std::time::Duration::MAX),
    ];
    for idle_after in &huge {
        for max_age in [MaxAge::Never, MaxAge::After(idle_after.clone())] {
            for idle_action in [IdleAction::Stop, IdleAction::Delete] {
                let policy = ResolvedReapPolicy {
                    idle_after: idle_after.clone(),
                    idle_action,
                    max_age: max_age.clone(),
                };
                let now = t0();
                let subject = ReapSubject {
                    now,
                    policy: &policy,
                    created_at: now - Span::days(400),
                    last_active_at: Some(now - Span::days(300)),
                    ready_since: None,
                    building: false,
                    agent: Idle,
                    evidence: clean(),
                    ever_reachable: true,
                    stopped: false,
                    previous_due: None,
                };
                let verdict = decide(&subject);
                assert_eq!(verdict.decision, Decision::Keep, "{idle_after} {max_age}");
                assert!(verdict.next_action_at.is_none_or(|at| at > now));
            }
        }
    }
}
