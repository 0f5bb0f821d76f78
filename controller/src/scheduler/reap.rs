//! Carrying a reap decision to the edge of acting: the evidence an inspection gives the policy,
//! the fresh re-check right before acting, inspecting a stopped container, and the status the
//! verdict shows. The action itself (stop, delete) is the reconciler's, under the project's slot.

use std::time::Duration;

use berth_api::{ActivityStatus, ReapStatus, UnsavedWork};
use chrono::{DateTime, Utc};

use super::activity::{self, ActivityInputs, Touches};
use super::policy::{self, ReapSubject, Verdict};
use crate::runtime::Runtime;
use crate::workspace::inspect::{Expected, InspectError, Inspection};
use crate::workspace::look::{evidence_of, inspect_in_place};

/// `status.unsavedWork`: the counts, or `None` when the inspection failed (unknown, not zero).
pub fn unsaved_work_status(result: &Result<Inspection, InspectError>) -> Option<UnsavedWork> {
    result.as_ref().ok().map(|i| i.unsaved.clone())
}

/// `status.reap` for a verdict; `idled_at` is carried over from the current status.
pub fn reap_status(verdict: &Verdict, idled_at: Option<DateTime<Utc>>) -> ReapStatus {
    ReapStatus {
        protected_by: verdict.protected_by.clone(),
        next_action: verdict.next_action,
        next_action_at: verdict.next_action_at,
        idled_at,
    }
}

/// What the passes saw of a project before the re-check, for judging its activity by the same
/// rules as the activity pass.
#[derive(Debug, Clone, Copy, Default)]
pub struct Seen<'a> {
    /// The activity pass's last inspection of the running container.
    pub previous: Option<&'a Inspection>,
    /// `status.activity` as recorded.
    pub activity: Option<&'a ActivityStatus>,
    pub touches: Touches,
}

/// The re-check's outcome.
#[derive(Debug)]
pub struct Recheck {
    pub verdict: Verdict,
    pub result: Result<Inspection, InspectError>,
    /// The container was stopped, so it was booted for the inspection and stopped again.
    pub booted: bool,
}

/// The last word before acting: inspects the workspace again where it is (a stopped container
/// is booted without its runner, then stopped again) and decides again with what it finds,
/// activity included, judged as the activity pass judges it. Act only when the returned
/// verdict's [`Verdict::act`] is the action planned; anything else (new work, a blocked agent,
/// a failed inspection, fresh activity) holds the project.
pub async fn recheck(
    runtime: &dyn Runtime,
    instance: &str,
    expected: &Expected,
    timeout: Duration,
    subject: ReapSubject<'_>,
    seen: Seen<'_>,
) -> Recheck {
    let (result, booted) = inspect_in_place(runtime, instance, expected, timeout).await;
    let (evidence, agent) = evidence_of(&result, subject.agent);
    let activity = activity::update_activity(&ActivityInputs {
        now: subject.now,
        previous_status: seen.activity,
        // A boot starts the CPU figures afresh: the last inspection cannot be compared.
        previous: seen.previous.filter(|_| !booted),
        current: result.as_ref().ok(),
        touches: seen.touches,
        cpu_threshold: activity::DEFAULT_CPU_THRESHOLD,
    });
    let verdict = policy::decide(&ReapSubject {
        evidence,
        agent,
        last_active_at: activity.last_active_at.max(subject.last_active_at),
        // What LXD says now, not what status said: a project woken meanwhile is not idle-stopped.
        stopped: booted,
        ..subject
    });
    Recheck {
        verdict,
        result,
        booted,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workspace::inspect::{AgentReport, WorkspaceKind};
    use crate::workspace::protection::Evidence;
    use berth_api::{AgentState, ProtectionReason, ReapAction};

    fn inspection(unsaved: UnsavedWork, agent: Option<AgentState>) -> Inspection {
        Inspection {
            agent: agent.map(|state| AgentReport {
                state,
                brief_id: None,
                title: None,
                message: None,
                updated_at: None,
                session_id: None,
                exit_code: None,
            }),
            agent_unreadable: false,
            kind: WorkspaceKind::Git,
            unsaved,
            ports: Vec::new(),
            cpu: Duration::ZERO,
            newest_mtime: None,
            ipv4: None,
        }
    }

    #[test]
    fn evidence_takes_the_agent_from_the_file_or_keeps_the_recorded_state() {
        let dirty = UnsavedWork {
            unpushed: 1,
            ..UnsavedWork::default()
        };
        let ok = Ok(inspection(dirty.clone(), Some(AgentState::Working)));
        assert_eq!(
            evidence_of(&ok, AgentState::Blocked),
            (Evidence::Inspected(dirty.clone()), AgentState::Working)
        );
        // After a reboot the status file is gone: a blocked agent stays blocked.
        let rebooted = Ok(inspection(UnsavedWork::default(), None));
        assert_eq!(
            evidence_of(&rebooted, AgentState::Blocked).1,
            AgentState::Blocked
        );
        let failed = Err(InspectError::Timeout(Duration::from_secs(1)));
        assert_eq!(
            evidence_of(&failed, AgentState::Idle),
            (Evidence::Failed, AgentState::Idle)
        );
        assert_eq!(unsaved_work_status(&failed), None);
        assert_eq!(unsaved_work_status(&ok), Some(dirty));
    }

    #[test]
    fn reap_status_shows_the_verdict() {
        let verdict = Verdict {
            decision: policy::Decision::Refuse {
                action: ReapAction::Stop,
                reasons: vec![ProtectionReason::UnsavedWork],
            },
            protected_by: vec![ProtectionReason::UnsavedWork],
            next_action: Some(ReapAction::Stop),
            next_action_at: None,
        };
        let status = reap_status(&verdict, None);
        assert_eq!(status.protected_by, vec![ProtectionReason::UnsavedWork]);
        assert_eq!(status.next_action, Some(ReapAction::Stop));
    }
}
