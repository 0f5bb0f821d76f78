//! Annotations berth acts on. Users (or the CLI on their behalf) set most of them; the controller
//! reads them and never writes spec. The server keeps `applyset` and `overrides` itself.

/// Changing its value restarts the project's container (host-driven, so it works on a wedged one).
pub const RESTARTED_AT: &str = "berth.dev/restartedAt";
/// Changing its value replaces the container (`berth restart --recreate`); the volumes stay.
pub const RECREATE_REQUESTED_AT: &str = "berth.dev/recreateRequestedAt";
/// Equal to [`RECREATE_REQUESTED_AT`]: that replacement goes ahead whatever the container holds
/// outside /workspace (`berth restart --recreate --force`; the old container goes to the trash
/// either way). Any other value forces nothing. Server-owned: only
/// `POST .../projects/NAME/forcereplace` writes it, with the recreate request it forces.
pub const FORCE_REPLACE: &str = "berth.dev/forceReplace";
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

/// How an object was asked to go. The server records these on the object from the delete request
/// itself (or from the reaper, or a GitOps prune); a manifest, merge patch or GitSource carrying
/// one is refused, so nothing but a person's delete request can force a deletion.
///
/// `"true"`: the deletion was forced (`DELETE ...?force=true`): the workspace goes whatever it
/// holds (into the trash, unless purged).
pub const FORCE_DELETE: &str = "berth.dev/forceDelete";
/// `"true"`: the deletion skips the trash (`DELETE ...?force=true&purge=true`, admins only).
pub const PURGE: &str = "berth.dev/purge";
/// Who asked for the deletion (the caller's name, `unix:<user>` on the local socket).
pub const DELETED_BY: &str = "berth.dev/deletedBy";
/// Why the object is being deleted when no person asked: `reaper` (maxAge or idleAction Delete)
/// or `prune` (an applyset or GitSource no longer holds it).
pub const REAPED_BY: &str = "berth.dev/reapedBy";

/// On a Project being deleted: changing its value asks the finalizer to look at a held
/// workspace again now rather than at its next interval. The server sets it on every delete
/// request of a Project and on `POST .../projects/NAME/look` (`berth wait --for=delete`).
pub const LOOK_REQUESTED_AT: &str = "berth.dev/lookRequestedAt";

/// Server-owned metadata: what a manifest, a patch or a GitSource may repeat as stored but
/// never add, change or drop. Admission reads these two lists and nothing else.
///
/// `metadata.finalizers`: the controller adds `berth.dev/teardown` and removes it once the
/// workspace is in the trash; dropping it would remove the object and leave the container and
/// its volumes outside the trash, and adding a foreign one would hold a deletion for ever.
pub const SERVER_OWNED_FIELDS: [&str; 1] = ["finalizers"];

/// On a Project whose checkout is held (`CheckoutBlocked`): the time a member asked for the
/// checkout anyway (`POST .../projects/NAME/forcecheckout`, `berth checkout NAME --force`). A
/// request made after the hold began forces it: the workspace volume is copied into the trash,
/// then the checkout writes over the files.
pub const FORCE_CHECKOUT: &str = "berth.dev/forceCheckout";

/// Annotations only the server writes (see [`FORCE_DELETE`]).
pub const SERVER_OWNED: [&str; 7] = [
    FORCE_DELETE,
    PURGE,
    DELETED_BY,
    REAPED_BY,
    LOOK_REQUESTED_AT,
    FORCE_CHECKOUT,
    FORCE_REPLACE,
];
