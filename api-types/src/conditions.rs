//! Condition types and reasons, and the one function that updates a condition list.

use chrono::{DateTime, Utc};

use crate::meta::{Condition, ConditionStatus};

/// Condition types a status may carry.
pub mod condition_types {
    pub const READY: &str = "Ready";
    pub const MOUNTS_READY: &str = "MountsReady";
    pub const RESOURCES_APPLIED: &str = "ResourcesApplied";
    pub const PROVISIONED: &str = "Provisioned";
    pub const SECRETS_SYNCED: &str = "SecretsSynced";
    pub const REAP_PROTECTED: &str = "ReapProtected";
    pub const DELETION_BLOCKED: &str = "DeletionBlocked";
    pub const IMAGE_OUTDATED: &str = "ImageOutdated";
    /// A replacement of the container (`berth restart --recreate`, a new `spec.image`) waits:
    /// the container holds work outside /workspace that would go with it.
    pub const REPLACE_BLOCKED: &str = "ReplaceBlocked";
    /// The checkout waits: the workspace holds files berth did not write, and no repository.
    pub const CHECKOUT_BLOCKED: &str = "CheckoutBlocked";
    /// A changed `resources.disk` or `workspaceSize` is not applied yet: LXD refused it (a
    /// volume shrunk below what it holds); tried again each pass.
    pub const RESIZE_PENDING: &str = "ResizePending";
    /// A changed size is recorded but the storage pool does not enforce sizes (LXD's `dir`).
    pub const RESIZE_UNSUPPORTED: &str = "ResizeUnsupported";
    /// A capability of `spec.capabilities` could not be published (the image lacks what it
    /// needs); the project goes on without it. `False` once every capability is published.
    pub const CAPABILITY_FAILED: &str = "CapabilityFailed";
    /// GitSource: a sync is in progress.
    pub const RECONCILING: &str = "Reconciling";

    /// Every Project condition type, in the order `describe` shows them.
    pub const PROJECT: [&str; 13] = [
        READY,
        MOUNTS_READY,
        RESOURCES_APPLIED,
        PROVISIONED,
        SECRETS_SYNCED,
        REAP_PROTECTED,
        DELETION_BLOCKED,
        IMAGE_OUTDATED,
        REPLACE_BLOCKED,
        CHECKOUT_BLOCKED,
        RESIZE_PENDING,
        RESIZE_UNSUPPORTED,
        CAPABILITY_FAILED,
    ];
}

/// Condition reasons. The names of `Step` (`Created`, ..., `Briefed`) are reasons too: `Ready`
/// is `False` with the last step reached as reason while a project is being built.
pub mod reasons {
    pub const NAME_CONFLICT: &str = "NameConflict";
    pub const PROFILE_NOT_FOUND: &str = "ProfileNotFound";
    pub const IMAGE_NOT_FOUND: &str = "ImageNotFound";
    pub const BOOT_TIMEOUT: &str = "BootTimeout";
    pub const STEP_TIMEOUT: &str = "StepTimeout";
    /// A step failed; the message names the step and carries the cause.
    pub const STEP_FAILED: &str = "StepFailed";
    /// The cluster member holding the project is offline: berth waits for it.
    pub const MEMBER_OFFLINE: &str = "MemberOffline";
    /// The cluster member holding the project is evacuated: its container stays stopped there
    /// until the member is restored.
    pub const MEMBER_EVACUATED: &str = "MemberEvacuated";
    /// No cluster member may take a new project (none online, or `lxd.target` names no member).
    pub const NO_MEMBER_AVAILABLE: &str = "NoMemberAvailable";
    pub const QUOTA_NOT_ENFORCED: &str = "QuotaNotEnforced";
    pub const BRIEF_NOT_ACKNOWLEDGED: &str = "BriefNotAcknowledged";
    pub const RECONCILE_PAUSED: &str = "ReconcilePaused";
    /// Reap protections (also `status.reap.protectedBy` values).
    pub const AGENT_BLOCKED: &str = "AgentBlocked";
    pub const UNSAVED_WORK: &str = "UnsavedWork";
    pub const INSPECTION_FAILED: &str = "InspectionFailed";
    /// Lifecycle.
    pub const MISSING: &str = "Missing";
    pub const STOPPED: &str = "Stopped";
    pub const IDLED: &str = "Idled";
    /// Ready's reason while a replacement of the container is held.
    pub const REPLACE_BLOCKED: &str = "ReplaceBlocked";
    pub const DELETING: &str = "Deleting";
    pub const PROVISIONING_FAILED: &str = "ProvisioningFailed";
    pub const RESOURCES_REJECTED: &str = "ResourcesRejected";
    /// A size LXD refused to change (`ResizePending`).
    pub const RESIZE_REFUSED: &str = "ResizeRefused";
    pub const APPLIED: &str = "Applied";
    pub const NEW_IMAGE_AVAILABLE: &str = "NewImageAvailable";
    /// `CapabilityFailed=True`: the image lacks what a capability needs.
    pub const CAPABILITY_UNAVAILABLE: &str = "CapabilityUnavailable";
    /// `CapabilityFailed=False`: every capability of the spec is in the workspace.
    pub const PUBLISHED: &str = "Published";
    /// GitSource sync outcomes.
    pub const SUCCEEDED: &str = "Succeeded";
    pub const PROGRESSING: &str = "Progressing";
    pub const FETCH_FAILED: &str = "FetchFailed";
    pub const APPLY_FAILED: &str = "ApplyFailed";
    pub const PRUNE_FAILED: &str = "PruneFailed";
    /// Manifests naming objects another applyset owns, which are left to it.
    pub const APPLYSET_CONFLICT: &str = "ApplysetConflict";
    pub const SUSPENDED: &str = "Suspended";
    /// `CheckoutBlocked=True`: the workspace holds files berth did not write (`False` carries
    /// the step's name, `CheckedOut`, once the checkout is done).
    pub const CHECKOUT_BLOCKED: &str = "CheckoutBlocked";
}

/// Sets the condition of type `type_`, adding it when absent. `last_transition_time` moves to
/// `now` only when the status changes (or the condition is new), so it tells how long the
/// current status has held. Returns whether anything changed: the controller writes status only
/// when something did.
pub fn set_condition(
    conds: &mut Vec<Condition>,
    type_: &str,
    status: ConditionStatus,
    reason: &str,
    message: &str,
    generation: i64,
    now: DateTime<Utc>,
) -> bool {
    match conds.iter_mut().find(|c| c.type_ == type_) {
        Some(existing) => {
            let mut changed = false;
            if existing.status != status {
                existing.status = status;
                existing.last_transition_time = now;
                changed = true;
            }
            if existing.reason != reason {
                existing.reason = reason.to_string();
                changed = true;
            }
            if existing.message != message {
                existing.message = message.to_string();
                changed = true;
            }
            if existing.observed_generation != generation {
                existing.observed_generation = generation;
                changed = true;
            }
            changed
        }
        None => {
            conds.push(Condition {
                type_: type_.to_string(),
                status,
                reason: reason.to_string(),
                message: message.to_string(),
                last_transition_time: now,
                observed_generation: generation,
            });
            true
        }
    }
}

/// Removes the condition of type `type_`; returns whether there was one.
pub fn remove_condition(conds: &mut Vec<Condition>, type_: &str) -> bool {
    let before = conds.len();
    conds.retain(|c| c.type_ != type_);
    conds.len() != before
}

/// The condition of type `type_`, if present.
pub fn find_condition<'a>(conds: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conds.iter().find(|c| c.type_ == type_)
}

/// Whether the condition of type `type_` is present and `True`.
pub fn is_condition_true(conds: &[Condition], type_: &str) -> bool {
    find_condition(conds, type_).is_some_and(|c| c.status == ConditionStatus::True)
}
