//! Looking before replacing a container. A replacement (`berth restart --recreate`, a new
//! `spec.image`) keeps the volumes, but the container's own filesystem goes to the trash with
//! it: work there (a linked worktree outside /workspace) would leave the live project. So a
//! replacement nobody forced inspects the container first, with the same one-exec inspection a
//! held deletion uses, and waits while it finds such work (`ReplaceBlocked=True`, Ready=False
//! with the files named, a Warning event), looking again every `scheduler.recheckInterval`.
//! `berth restart --recreate --force` (annotation `berth.dev/forceReplace` equal to the
//! recreate request) goes ahead; the old container goes to the trash either way.
//!
//! `berth.dev/forceReplace` is server-owned: only `POST .../forcereplace` writes it, with the
//! request it forces. The old container goes to the trash through `crate::dispose`.

use std::time::Duration;

use berth_api::{
    ConditionStatus, ProjectStatus, UnsavedWork, annotations, condition_types, reasons,
};

use crate::reconcile::status::{Draft, ever_reachable};
use crate::reconcile::{Context, ReconcileError};
use crate::store::{EventType, StoredObject};
use crate::workspace::inspect::{self, InspectError};
use crate::workspace::look;

/// One inspection's deadline (a stopped container also gets this long to boot).
const INSPECT_TIMEOUT: Duration = Duration::from_secs(60);

/// Whether a person forced the pending recreate: `berth.dev/forceReplace` names it.
pub fn forced(object: &StoredObject) -> bool {
    let annotations = &object.metadata.annotations;
    annotations
        .get(annotations::FORCE_REPLACE)
        .is_some_and(|f| annotations.get(annotations::RECREATE_REQUESTED_AT) == Some(f))
}

/// Decides whether the container `name` of `object` may be replaced now. When it may not,
/// `draft` carries `ReplaceBlocked=True` and Ready=False saying why, and the returned
/// duration is when to look again; the caller commits and requeues.
pub async fn hold(
    ctx: &Context,
    object: &StoredObject,
    draft: &mut Draft,
    why: &str,
) -> Result<Option<Duration>, ReconcileError> {
    let status: &ProjectStatus = &draft.status;
    // A container that never became reachable never held anyone's work.
    if !ever_reachable(status) {
        return Ok(None);
    }
    let known = inspect::expected_of(object);
    let (result, _booted) =
        look::inspect_in_place(ctx.runtime.as_ref(), object.name(), &known, INSPECT_TIMEOUT).await;
    let Some(cause) = outside_work(result.as_ref().map(|i| &i.unsaved)) else {
        release(
            draft,
            "WorkSaved",
            "nothing outside /workspace to lose: replacing",
        );
        return Ok(None);
    };
    let reason = match result {
        Ok(_) => reasons::UNSAVED_WORK,
        Err(_) => reasons::INSPECTION_FAILED,
    };
    let every = ctx.settings.held_recheck;
    let message = format!(
        "replacement ({why}) held: the container holds {cause}, which would leave the project with it; \
         save the work, or replace with `berth restart --recreate --force` (the old container goes to \
         the trash either way); looked at again every {}",
        berth_api::BerthDuration::from_std(every).as_str()
    );
    let changed = draft.set_condition(
        condition_types::REPLACE_BLOCKED,
        ConditionStatus::True,
        reason,
        &message,
    );
    let phase = draft.status.phase;
    draft.set_not_ready(phase, reasons::REPLACE_BLOCKED, &message);
    if changed {
        tracing::warn!(cause = cause.as_str(), "replacement held");
        ctx.store
            .publish_event(object, EventType::Warning, "ReplaceBlocked", &message)
            .await;
    }
    Ok(Some(every))
}

/// A replacement goes ahead: a hold it had is released with `reason`.
pub fn release(draft: &mut Draft, reason: &str, message: &str) {
    if draft
        .condition(condition_types::REPLACE_BLOCKED)
        .is_some_and(|c| c.status == ConditionStatus::True)
    {
        draft.set_condition(
            condition_types::REPLACE_BLOCKED,
            ConditionStatus::False,
            reason,
            message,
        );
    }
}

/// The work outside /workspace an inspection found, in words (the worktrees and the files in
/// them), or why it could not tell; `None` when there is none. Work inside /workspace is on
/// the workspace volume, which stays with the project.
fn outside_work(result: Result<&UnsavedWork, &InspectError>) -> Option<String> {
    let unsaved = match result {
        Ok(unsaved) => unsaved,
        Err(e) => return Some(format!("what the inspection could not tell ({e})")),
    };
    if unsaved.worktrees == 0 {
        return None;
    }
    let files: Vec<&str> = unsaved
        .files
        .iter()
        .map(String::as_str)
        .filter(|f| f.starts_with('/') || f.contains(" in /"))
        .collect();
    let worktrees = if unsaved.worktrees == 1 {
        "1 worktree outside /workspace".to_string()
    } else {
        format!("{} worktrees outside /workspace", unsaved.worktrees)
    };
    Some(if files.is_empty() {
        worktrees
    } else {
        format!("{worktrees} ({})", files.join(", "))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_work_outside_the_workspace_holds_a_replacement() {
        let inside = UnsavedWork {
            uncommitted: 2,
            files: vec!["src/main.rs".into()],
            ..UnsavedWork::default()
        };
        assert_eq!(outside_work(Ok(&inside)), None);
        let outside = UnsavedWork {
            uncommitted: 1,
            untracked: 1,
            worktrees: 1,
            files: vec![
                "/root/wt".into(),
                "a.txt in /root/wt".into(),
                "src/main.rs".into(),
            ],
            ..UnsavedWork::default()
        };
        assert_eq!(
            outside_work(Ok(&outside)).as_deref(),
            Some("1 worktree outside /workspace (/root/wt, a.txt in /root/wt)")
        );
        let failed = InspectError::Exited {
            code: 1,
            detail: "no shell".into(),
        };
        assert!(outside_work(Err(&failed)).is_some_and(|w| w.contains("could not tell")));
    }
}
