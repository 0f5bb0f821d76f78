//! berth's manifest types: what a user or a GitOps repository writes, and what the controller
//! reports back. No I/O and no async runtime: third parties import this crate to write manifests.
//!
//! ```
//! use berth_api::{Defaults, Object, decode_manifest};
//!
//! let manifest: serde_json::Value = serde_yaml::from_str(
//!     "apiVersion: berth.dev/v1alpha1
//! kind: Project
//! metadata: {name: payments-api}
//! spec: {displayName: Payments API, resources: {memory: 8GiB}}
//! ",
//! )
//! .unwrap();
//! let Object::Project(mut project) = decode_manifest(manifest).unwrap() else {
//!     unreachable!()
//! };
//! project.apply_defaults(&Defaults::default());
//! assert_eq!(project.spec.image, "berth-base");
//! assert_eq!(project.spec.resources.memory.unwrap().as_bytes(), 8 << 30);
//!
//! let bad = serde_yaml::from_str(
//!     "apiVersion: berth.dev/v1alpha1
//! kind: Project
//! metadata: {name: p}
//! spec: {resources: {memory: 4 gigs}}
//! ",
//! )
//! .unwrap();
//! assert_eq!(
//!     decode_manifest(bad).unwrap_err().to_string(),
//!     "spec.resources.memory: \"4 gigs\" is not a quantity"
//! );
//! ```

pub mod annotations;
pub mod conditions;
pub mod duration;
pub mod error;
pub mod files;
pub mod gitsource;
pub mod meta;
pub mod naming;
pub mod object;
pub mod power;
pub mod profile;
pub mod project;
pub mod quantity;
pub mod schedule;
pub mod schema;
pub mod wire;
pub mod yaml;

pub use conditions::{
    condition_types, find_condition, is_condition_true, reasons, remove_condition, set_condition,
};
pub use duration::{BerthDuration, MAX_DURATION, MAX_DURATION_TEXT, MaxAge};
pub use error::{FieldError, ValidationErrors};
pub use files::{FileMode, MergeMode, WORKSPACE_DIR, workspace_dir_path, workspace_file_path};
pub use gitsource::{
    GitSource, GitSourceSpec, GitSourceStatus, file_url_path, redact_credentials,
    url_has_credentials, validate_git_url,
};
pub use meta::{API_VERSION, Condition, ConditionStatus, ObjectMeta, TEARDOWN_FINALIZER};
pub use naming::{derive_name, display_name_key, slugify, validate_env_key, validate_name};
pub use object::{
    Kind, KindNames, Object, UnknownCliKind, UnknownKind, decode_manifest, decode_stored,
};
pub use profile::{
    AgentInstall, AgentInstructions, AgentProfile, AgentProfileSpec, AgentProfileStatus,
    AgentRunner, AgentSkill, CredentialRef, MAX_SKILLS, RunnerProtocol, RuntimeAsset,
};
pub use project::{
    AGENT_API_PORT, ActivitySource, ActivityStatus, AgentState, AgentStatus, Capability,
    ContainerStatus, DEFAULTED_FIELDS, Defaults, DeletionHold, Forward, IdleAction,
    MIN_MEMORY_BYTES, MIN_PROCESSES, NetworkStatus, Phase, PortStatus, PowerState, Project,
    ProjectSpec, ProjectStatus, ProtectionReason, ReapAction, ReapPolicy, ReapStatus, Repo,
    ResolvedReapPolicy, Resources, SeedFile, Step, UnsavedWork,
};
pub use quantity::{CpuQuantity, Quantity};
pub use schedule::{Schedule, ScheduleSpec, ScheduleStatus, ScheduledBrief};
pub use schema::schemas;
pub use wire::{
    API_PREFIX, ApiStatus, ListMeta, ObjectList, StatusDetails, WatchEvent, WatchEventType,
};
