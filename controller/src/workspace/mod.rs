//! A project's workspace as berth looks at it before destroying anything: the one-exec
//! inspection (`inspect`, `inspect.sh`), looking where the workspace is (`look`: its running
//! container, or its stopped one booted without the runner), from a short-lived inspection
//! instance when no container of the project's holds the volume (`inspection_instance`), and
//! the pure judgment of what protects it (`protection`). The reaper (`crate::scheduler`) and the
//! finalizer's deletion hold (`crate::reconcile::finalizer`) both build on it; it imports
//! neither.

pub mod inspect;
pub mod inspection_instance;
pub mod look;
pub mod protection;
