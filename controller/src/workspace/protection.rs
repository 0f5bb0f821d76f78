//! What protects a workspace from destruction no person forced (reaping, a GitOps prune, a
//! plain `berth delete`): the pure judgment both the reaper's decision
//! (`crate::scheduler::policy`) and the finalizer's deletion hold make.

use berth_api::{
    AgentState, ConditionStatus, ProjectStatus, ProtectionReason, UnsavedWork, condition_types,
    find_condition,
};

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

/// What protects a project by its recorded status: the one reading every view shares (the
/// scheduler's `status.reap.protectedBy`, `get -o wide`'s PROTECTED, `reap --dry-run`). The
/// last judgment (`status.reap.protectedBy`, written by the reap pass and by a held
/// deletion) is brought up to date with what was recorded since: the agent's state as it last
/// reported, the last inspection's findings, and a held deletion's reason.
pub fn recorded(status: &ProjectStatus) -> Vec<ProtectionReason> {
    let mut reasons: Vec<ProtectionReason> = status
        .reap
        .as_ref()
        .map(|r| r.protected_by.clone())
        .unwrap_or_default();
    let blocked = status
        .agent
        .as_ref()
        .is_some_and(|a| a.state == AgentState::Blocked);
    reasons.retain(|r| *r != ProtectionReason::AgentBlocked || blocked);
    if blocked {
        reasons.push(ProtectionReason::AgentBlocked);
    }
    if let Some(unsaved) = &status.unsaved_work {
        reasons.retain(|r| *r != ProtectionReason::UnsavedWork || unsaved.any());
        if unsaved.any() {
            reasons.push(ProtectionReason::UnsavedWork);
        }
    }
    let held = find_condition(&status.conditions, condition_types::DELETION_BLOCKED)
        .filter(|c| c.status == ConditionStatus::True);
    if let Some(reason) = held.and_then(|c| {
        ProtectionReason::ALL
            .into_iter()
            .find(|r| r.as_str() == c.reason)
    }) {
        reasons.push(reason);
    }
    ProtectionReason::ALL
        .into_iter()
        .filter(|r| reasons.contains(r))
        .collect()
}

/// Why `reasons` protect the workspace, for a message: the work found (counts, then a bounded
/// list of the files and of the commits on no remote), the agent's question, the inspection's
/// error. Empty when there is nothing to add to the reasons themselves.
pub fn cause(
    reasons: &[ProtectionReason],
    evidence: &Evidence,
    failure: Option<&str>,
    question: Option<&str>,
) -> String {
    let mut parts = Vec::new();
    if reasons.contains(&ProtectionReason::AgentBlocked) {
        match question.map(str::trim).filter(|q| !q.is_empty()) {
            Some(q) => parts.push(format!("the agent asks: {}", one_line(q))),
            None => parts.push("the agent waits for a person".to_string()),
        }
    }
    match evidence {
        Evidence::Inspected(u) if u.any() => parts.push(work(u)),
        Evidence::Failed if reasons.contains(&ProtectionReason::InspectionFailed) => {
            parts.push(match failure {
                Some(why) => format!("the workspace could not be inspected: {}", one_line(why)),
                None => "the workspace could not be inspected".to_string(),
            })
        }
        _ => {}
    }
    parts.join("; ")
}

/// The work found: its counts, the files and the commits that hold it (the first
/// [`SHOWN`] of each, and how many more).
fn work(u: &UnsavedWork) -> String {
    // A ref a named commit is on is said with the commit, not again among the files.
    let on: Vec<&str> = u
        .commits
        .iter()
        .filter_map(|c| c.split_once(" on ").map(|(_, r)| r))
        .collect();
    let files: Vec<&String> = u
        .files
        .iter()
        .filter(|f| !on.contains(&f.as_str()))
        .collect();
    let mut text = u.summary();
    if !files.is_empty() {
        // Everything counted as a file or ref (status names only the first 20 of them).
        let counted = [u.uncommitted, u.untracked, u.ignored, u.modified_seeds]
            .iter()
            .chain([&u.worktrees, &u32::from(u.stashes > 0)])
            .map(|&n| n as usize)
            .sum();
        text.push_str(&format!("; files: {}", bounded(&files, counted)));
    }
    if !u.commits.is_empty() {
        let commits: Vec<&String> = u.commits.iter().collect();
        text.push_str(&format!(
            "; commits on no remote: {}",
            bounded(&commits, u.unpushed as usize)
        ));
    }
    text
}

/// How many names of each list a message shows.
const SHOWN: usize = 10;

/// The first [`SHOWN`] of `names`, and how many more of `total` there are.
fn bounded(names: &[&String], total: usize) -> String {
    let shown = names.len().min(SHOWN);
    let mut text = names[..shown]
        .iter()
        .map(|n| n.as_str())
        .collect::<Vec<_>>()
        .join(", ");
    let more = total.max(names.len()).saturating_sub(shown);
    if more > 0 {
        text.push_str(&format!(" and {more} more"));
    }
    text
}

/// Untrusted text for a one-line message: its first line, control characters replaced, at
/// most 200 characters.
fn one_line(text: &str) -> String {
    const MAX: usize = 200;
    let line = text.lines().next().unwrap_or("");
    let mut out: String = line
        .chars()
        .map(|c| if c.is_control() { '?' } else { c })
        .take(MAX)
        .collect();
    if line.chars().count() > MAX {
        out.push('…');
    }
    out
}

/// `AgentBlocked, UnsavedWork` for a message.
pub fn reasons_text(reasons: &[ProtectionReason]) -> String {
    reasons
        .iter()
        .map(|r| r.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn status(value: serde_json::Value) -> ProjectStatus {
        serde_json::from_value(value).unwrap()
    }

    /// Every view reads the recorded status the same way, brought up to date with what was
    /// recorded after the last reap pass.
    #[test]
    fn the_recorded_protections() {
        let cases = [
            // The agent finished after the pass that saw it blocked.
            (
                json!({"agent": {"state": "done"}, "reap": {"protectedBy": ["AgentBlocked"]}}),
                vec![],
            ),
            // ... and blocked after a pass that saw nothing.
            (
                json!({"agent": {"state": "blocked"}, "reap": {}}),
                vec![ProtectionReason::AgentBlocked],
            ),
            // Work saved since.
            (
                json!({"unsavedWork": {"uncommitted": 0, "untracked": 0, "stashes": 0, "unpushed": 0},
                       "reap": {"protectedBy": ["UnsavedWork", "InspectionFailed"]}}),
                vec![ProtectionReason::InspectionFailed],
            ),
            // A held deletion, which no reap pass looks at.
            (
                json!({"conditions": [{"type": "DeletionBlocked", "status": "True",
                                       "reason": "UnsavedWork", "message": "held",
                                       "lastTransitionTime": "2026-01-01T00:00:00Z"}]}),
                vec![ProtectionReason::UnsavedWork],
            ),
            (
                json!({"conditions": [{"type": "DeletionBlocked", "status": "False",
                                       "reason": "WorkSaved", "message": "",
                                       "lastTransitionTime": "2026-01-01T00:00:00Z"}]}),
                vec![],
            ),
        ];
        for (recorded_status, want) in cases {
            assert_eq!(
                recorded(&status(recorded_status.clone())),
                want,
                "{recorded_status}"
            );
        }
    }

    #[test]
    fn a_cause_names_the_files_the_commits_the_question_and_the_error() {
        let work = UnsavedWork {
            untracked: 1,
            unpushed: 1,
            files: vec!["notes.txt".into(), "refs/heads/main".into()],
            commits: vec!["1a2b3c4 on refs/heads/main".into()],
            ..UnsavedWork::default()
        };
        let reasons = [
            ProtectionReason::AgentBlocked,
            ProtectionReason::UnsavedWork,
        ];
        assert_eq!(
            cause(
                &reasons,
                &Evidence::Inspected(work),
                None,
                Some("Which port?\nmore")
            ),
            "the agent asks: Which port?; 1 untracked files, 1 commits on no remote; \
             files: notes.txt; commits on no remote: 1a2b3c4 on refs/heads/main"
        );
        assert_eq!(
            cause(
                &[ProtectionReason::InspectionFailed],
                &Evidence::Failed,
                Some("exec timed out after 60s"),
                None
            ),
            "the workspace could not be inspected: exec timed out after 60s"
        );
    }
}
