//! berth's manifest types: what a user or a GitOps repository writes, and what the controller
//! reports back. No I/O and no async runtime: third parties import this crate to write manifests.

pub mod meta;

pub use meta::{API_VERSION, Condition, ConditionStatus, ObjectMeta};
