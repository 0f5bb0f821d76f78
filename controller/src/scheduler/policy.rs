//! The reap decision: given what is known about one project, what the reaper may do to it.
//!
//! Pure and clock-free (the caller passes `now`), so every rule can be checked in a table and in
//! a long randomized simulation. The rules, from DESIGN "Scheduler and reaping":
//! - `idleAfter` without activity → `idleAction`; `maxAge` → Delete, but never while the project
//!   was active within its `idleAfter` window; `maxAge: never` disables it;
//! - a project is reaped only when two consecutive passes agree it is due;
//! - a blocked agent, unsaved work and a failed inspection each refuse, for both actions;
//! - a project that never became Reachable (no `status.firstReachableAt`, whatever its step says
//!   now) has nothing to lose, so nothing protects it;
//! - a build in progress (phase Pending or Provisioning) is berth's own work, not idleness: no idle
//!   action comes while it lasts, and the idle window counts from when the project became Ready at
//!   the earliest, so a slow first build is never stopped or deleted for being idle.

use berth_api::{AgentState, IdleAction, ProtectionReason, ReapAction, ResolvedReapPolicy};
use chrono::{DateTime, Utc};

pub use crate::workspace::protection::{Evidence, protections};

/// Everything the decision looks at for one project.
#[derive(Debug, Clone)]
pub struct ReapSubject<'a> {
    pub now: DateTime<Utc>,
    pub policy: &'a ResolvedReapPolicy,
    /// `metadata.creationTimestamp`: the project's age counts from here.
    pub created_at: DateTime<Utc>,
    /// `status.activity.lastActiveAt`; a project never seen active is idle since its creation
    /// (or since it became Ready, see [`ReapSubject::ready_since`]).
    pub last_active_at: Option<DateTime<Utc>>,
    /// When the `Ready` condition last became true, if it is true now: the idle window starts
    /// there at the earliest.
    pub ready_since: Option<DateTime<Utc>>,
    /// The reconciler is building the project (phase Pending or Provisioning): no idle action is
    /// due while it does.
    pub building: bool,
    /// The agent's reported state; `Blocked` protects the project.
    pub agent: AgentState,
    pub evidence: Evidence,
    /// Whether the project ever reached the point where it could hold work (its container ran
    /// and the workspace was mounted): `status.firstReachableAt`, never the current step, which
    /// moves back. Before that there is nothing to lose.
    pub ever_reachable: bool,
    /// The container is already stopped (idled by the reaper, or stopped by its spec), so an
    /// idle Stop is moot; only a Delete can still come.
    pub stopped: bool,
    /// The action the previous pass found due (see [`Verdict::due_action`]); `None` when it
    /// found nothing due, refused, or this is the first pass.
    pub previous_due: Option<ReapAction>,
}

/// What this pass concludes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Nothing is due.
    Keep,
    /// Due for the first time (or again after a refusal): the next pass acts if it agrees.
    Due { action: ReapAction },
    /// Two consecutive passes agree and nothing protects it: act (after a fresh re-check).
    Act { action: ReapAction },
    /// Due, but something protects it.
    Refuse {
        action: ReapAction,
        reasons: Vec<ProtectionReason>,
    },
}

/// A decision with what status shows about it (`status.reap`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    pub decision: Decision,
    /// Every reason that protects the project right now, due or not (`status.reap.protectedBy`).
    pub protected_by: Vec<ProtectionReason>,
    /// The next action the reaper would take and from when (`status.reap.nextAction{,At}`);
    /// `None` when no action will ever come without a change (idled with `maxAge: never`).
    pub next_action: Option<ReapAction>,
    pub next_action_at: Option<DateTime<Utc>>,
}

impl Verdict {
    /// The action this pass found due and unprotected: what the next pass passes as
    /// [`ReapSubject::previous_due`].
    pub fn due_action(&self) -> Option<ReapAction> {
        match self.decision {
            Decision::Due { action } | Decision::Act { action } => Some(action),
            Decision::Keep | Decision::Refuse { .. } => None,
        }
    }

    /// The action to carry out now, if any.
    pub fn act(&self) -> Option<ReapAction> {
        match self.decision {
            Decision::Act { action } => Some(action),
            _ => None,
        }
    }
}

/// Decides what the reaper may do to one project in this pass.
pub fn decide(subject: &ReapSubject<'_>) -> Verdict {
    let protected_by = protections(subject.agent, &subject.evidence, subject.ever_reachable);
    let (next_action, next_action_at) = schedule(subject);
    let due = match (next_action, next_action_at) {
        (Some(action), Some(at)) if subject.now >= at => Some(action),
        _ => None,
    };
    let decision = match due {
        None => Decision::Keep,
        Some(action) if !protected_by.is_empty() => Decision::Refuse {
            action,
            reasons: protected_by.clone(),
        },
        Some(action) if subject.previous_due == Some(action) => Decision::Act { action },
        Some(action) => Decision::Due { action },
    };
    Verdict {
        decision,
        protected_by,
        next_action,
        next_action_at,
    }
}

/// The next action and the time it becomes due, ignoring protections.
fn schedule(subject: &ReapSubject<'_>) -> (Option<ReapAction>, Option<DateTime<Utc>>) {
    let policy = subject.policy;
    let last_active = [subject.last_active_at, subject.ready_since]
        .into_iter()
        .flatten()
        .fold(subject.created_at, DateTime::max);
    let idle_at = policy.idle_after.after(last_active);
    // maxAge waits for the idle window too: an active project is never deleted for its age.
    let aged_at = policy
        .max_age
        .limit()
        .map(|limit| limit.after(subject.created_at).max(idle_at));
    let idle_action = match policy.idle_action {
        // A build in progress is not idleness.
        _ if subject.building => None,
        // Already stopped by the reaper: stopping again does nothing.
        IdleAction::Stop if subject.stopped => None,
        IdleAction::Stop => Some(ReapAction::Stop),
        IdleAction::Delete => Some(ReapAction::Delete),
    };
    match (idle_action, aged_at) {
        // Deleting subsumes stopping once both are due.
        (Some(ReapAction::Stop), Some(aged)) if aged <= idle_at.max(subject.now) => {
            (Some(ReapAction::Delete), Some(aged))
        }
        (Some(action), _) => (Some(action), Some(idle_at)),
        (None, Some(aged)) => (Some(ReapAction::Delete), Some(aged)),
        (None, None) => (None, None),
    }
}

#[cfg(test)]
#[path = "policy_tests.rs"]
mod tests;
