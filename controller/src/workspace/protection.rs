//! What protects a workspace from destruction no person forced (reaping, a GitOps prune, a
//! plain `berth delete`): the pure judgment both the reaper's decision
//! (`crate::scheduler::policy`) and the finalizer's deletion hold make.

use berth_api::{AgentState, ProtectionReason, UnsavedWork};

/// What the latest inspection of the workspace showed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Evidence {
    /// Inspected: these are the counts of work that exists nowhere else (all zero when clean).
    Inspected(UnsavedWork),
    /// The workspace could not be inspected (timeout, exec error, unreadable output). Could not
    /// tell is never "nothing to lose".
    Failed,
}

/// The reasons that protect a workspace from any destruction no person forced: reaping, a GitOps
/// prune, a plain `berth delete`. Empty for a project that never became Reachable.
pub fn protections(
    agent: AgentState,
    evidence: &Evidence,
    ever_reachable: bool,
) -> Vec<ProtectionReason> {
    if !ever_reachable {
        return Vec::new();
    }
    let mut reasons = Vec::new();
    if agent == AgentState::Blocked {
        reasons.push(ProtectionReason::AgentBlocked);
    }
    match evidence {
        Evidence::Inspected(unsaved) if unsaved.any() => {
            reasons.push(ProtectionReason::UnsavedWork)
        }
        Evidence::Inspected(_) => {}
        Evidence::Failed => reasons.push(ProtectionReason::InspectionFailed),
    }
    reasons
}

/// `AgentBlocked, UnsavedWork` for a message.
pub fn reasons_text(reasons: &[ProtectionReason]) -> String {
    reasons
        .iter()
        .map(|r| r.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}
