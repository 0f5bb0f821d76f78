//! berth's manifest types: what a user or a GitOps repository writes, and what the controller
//! reports back. No I/O and no async runtime: third parties import this crate to write manifests.

pub mod annotations;
pub mod conditions;
pub mod duration;
pub mod error;
pub mod files;
pub mod gitsource;
pub mod meta;
pub mod naming;
pub mod object;
pub mod profile;
pub mod project;
pub mod quantity;
pub mod schema;

pub use conditions::{
    condition_types, find_condition, is_condition_true, reasons, remove_condition, set_condition,
};
pub use duration::{BerthDuration, MaxAge};
pub use error::{FieldError, ValidationErrors};
pub use files::{FileMode, MergeMode, WORKSPACE_DIR};
pub use gitsource::{GitSource, GitSourceSpec, GitSourceStatus};
pub use meta::{API_VERSION, Condition, ConditionStatus, ObjectMeta};
pub use naming::{derive_name, display_name_key, slugify, validate_env_key, validate_name};
pub use object::{Kind, Object, decode_manifest, decode_stored};
pub use profile::{
    AgentInstall, AgentInstructions, AgentProfile, AgentProfileSpec, AgentProfileStatus,
    AgentRunner, CredentialRef, RuntimeAsset,
};
pub use project::{
    ActivitySource, ActivityStatus, AgentState, AgentStatus, ContainerStatus, Defaults, IdleAction,
    Phase, PortStatus, PowerState, Project, ProjectSpec, ProjectStatus, ProtectionReason,
    ReapAction, ReapPolicy, ReapStatus, Repo, ResolvedReapPolicy, Resources, SeedFile, Step,
    UnsavedWork,
};
pub use quantity::{CpuQuantity, Quantity};
pub use schema::schemas;
