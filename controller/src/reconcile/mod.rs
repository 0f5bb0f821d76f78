//! The controller: a work queue of project names and the reconcile that drives each project's
//! LXD container, volumes and status toward its spec.

pub mod envelope;
pub mod layout;
pub mod queue;

pub use queue::{Action, Backoff, KeyLock, WorkQueue};
