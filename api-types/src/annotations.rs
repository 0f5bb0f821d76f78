//! Annotations berth acts on. Users (or the CLI on their behalf) set most of them; the controller
//! reads them and never writes spec. The server keeps `applyset` and `overrides` itself.

/// Changing its value restarts the project's container (host-driven, so it works on a wedged one).
pub const RESTARTED_AT: &str = "berth.dev/restartedAt";
/// Changing its value replaces the container (`berth restart --recreate`); the volumes stay.
pub const RECREATE_REQUESTED_AT: &str = "berth.dev/recreateRequestedAt";
/// Changing its value wakes an idled project (`berth start`).
pub const WOKEN_AT: &str = "berth.dev/wokenAt";
/// `paused` makes the controller leave the project alone.
pub const RECONCILE: &str = "berth.dev/reconcile";
pub const RECONCILE_PAUSED: &str = "paused";
/// `disabled` keeps an object out of applyset pruning.
pub const PRUNE: &str = "berth.dev/prune";
pub const PRUNE_DISABLED: &str = "disabled";
/// On a GitSource, changing its value triggers a sync now.
pub const REQUESTED_AT: &str = "berth.dev/requestedAt";
/// The applyset an object was last applied in (set by `apply --applyset`).
pub const APPLYSET: &str = "berth.dev/applyset";
/// On a Project: the fleet-defaulted spec fields (see [`crate::project::DEFAULTED_FIELDS`]) its
/// manifests override, comma-separated (`image,resources.cpu`). Kept by the server; a manifest's
/// own value is ignored. A defaulted field a manifest leaves out keeps its stored value unless
/// it is listed here: an override the manifest no longer sets falls back to the fleet default.
pub const OVERRIDES: &str = "berth.dev/overrides";
