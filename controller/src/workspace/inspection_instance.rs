//! Inspecting a workspace volume that no container of its project holds (the container
//! vanished, was deleted behind berth's back, or its name is taken by a container that is not
//! the project's): a short-lived inspection instance of its own, `berth-inspect-<uid>`, with the
//! volume attached read-only at /workspace, boots, runs the usual inspection, and is stopped and
//! deleted whatever happened.
//!
//! It carries `user.berth.controller` and `user.berth.inspects=<uid>`, never `user.berth.uid`:
//! everything that looks for a project's container (the reconciler, the resync's list, the
//! mass-vanish count, the orphan report) keys on that label, so nothing takes it for one. A
//! leftover from a crash is removed on the next attempt; an instance of that name without the
//! label is never touched.

use std::collections::BTreeMap;
use std::future::Future;
use std::time::Duration;

use super::look;
use crate::layout::CONTROLLER_LABEL;
use crate::runtime::{
    CreateInstance, Created, Device, ImageSource, OperationStatus, Runtime, RuntimeError,
    StopOptions,
};
use crate::workspace::inspect::{self, InspectError, Inspection};

/// The label naming the project uid whose workspace an inspection instance looks at.
pub const INSPECTS_LABEL: &str = "user.berth.inspects";

/// The inspection instance's name for the project `uid`.
pub fn instance_name(uid: &str) -> String {
    format!("berth-inspect-{uid}")
}

/// Whether `instance` is the inspection instance of the project `uid`.
pub fn is_inspection_of(config: &BTreeMap<String, String>, uid: &str) -> bool {
    config.get(INSPECTS_LABEL).is_some_and(|u| u == uid)
}

/// What the inspection instance is made of and where.
#[derive(Debug, Clone)]
pub struct VolumeInspection<'a> {
    /// The project's uid.
    pub uid: &'a str,
    /// The store's id, for `user.berth.controller`.
    pub controller: &'a str,
    pub pool: &'a str,
    /// The workspace volume.
    pub volume: &'a str,
    /// The cluster member holding the volume (`None` on a standalone server or a remote pool).
    pub location: Option<&'a str>,
    /// Images to make the instance from, in order of preference; the first that exists is used.
    pub images: Vec<ImageSource>,
    /// The deadline of each LXD call, of the boot, and of the inspection.
    pub timeout: Duration,
}

/// Why the inspection instance could not look.
#[derive(Debug, thiserror::Error)]
pub enum InstanceError {
    #[error(
        "an instance named {0} exists that is not berth's inspection of this project; left alone"
    )]
    NameTaken(String),
    #[error("no image to inspect the workspace with (tried {0})")]
    NoImage(String),
    #[error("{what}: {source}")]
    Runtime {
        what: &'static str,
        #[source]
        source: RuntimeError,
    },
    #[error("{what} did not finish within {timeout:?}")]
    Timeout {
        what: &'static str,
        timeout: Duration,
    },
    #[error("creating the inspection instance failed: {0}")]
    CreateFailed(String),
}

impl From<InstanceError> for InspectError {
    fn from(e: InstanceError) -> Self {
        InspectError::Exited {
            code: -1,
            detail: e.to_string(),
        }
    }
}

/// Inspects the workspace volume from an inspection instance. Any failure on the way (no image,
/// a name taken, LXD refusing, a boot that does not finish) is an inspection failure; the
/// instance is stopped and deleted afterwards in every case.
pub async fn inspect_volume(
    runtime: &dyn Runtime,
    request: &VolumeInspection<'_>,
    known: &inspect::Expected,
) -> Result<Inspection, InspectError> {
    let name = instance_name(request.uid);
    remove_leftover(runtime, request.uid, request.timeout).await?;
    let created = create(runtime, &name, request).await;
    let result = match created {
        Ok(()) => look(runtime, &name, request, known).await,
        Err(e) => Err(e.into()),
    };
    // Whatever happened, the instance goes; one left behind is removed on the next attempt.
    if let Err(e) = remove(runtime, &name, request.timeout).await {
        tracing::warn!(instance = name.as_str(), error = %e, "removing the inspection instance failed");
    }
    result
}

async fn look(
    runtime: &dyn Runtime,
    name: &str,
    request: &VolumeInspection<'_>,
    known: &inspect::Expected,
) -> Result<Inspection, InspectError> {
    look::boot(runtime, name, request.timeout)
        .await
        .map_err(|e| InspectError::Exited {
            code: -1,
            detail: e.to_string(),
        })?;
    inspect::inspect(runtime, name, known, request.timeout).await
}

/// Removes the inspection instance of the project `uid` left by an earlier attempt (a crash
/// between creating and deleting it, which would also keep its workspace volume in use);
/// refuses when the name is someone else's, which is left alone.
pub async fn remove_leftover(
    runtime: &dyn Runtime,
    uid: &str,
    timeout: Duration,
) -> Result<(), InstanceError> {
    let name = instance_name(uid);
    let found = within(timeout, "reading the inspection instance", async {
        runtime.get_instance(&name).await
    })
    .await?;
    match found {
        None => Ok(()),
        Some(instance) if is_inspection_of(&instance.config, uid) => {
            tracing::info!(
                instance = name.as_str(),
                "removing a leftover inspection instance"
            );
            remove(runtime, &name, timeout).await
        }
        Some(_) => Err(InstanceError::NameTaken(name)),
    }
}

async fn create(
    runtime: &dyn Runtime,
    name: &str,
    request: &VolumeInspection<'_>,
) -> Result<(), InstanceError> {
    let image = image(runtime, request).await?;
    let workspace: Device = BTreeMap::from([
        ("type".to_string(), "disk".to_string()),
        ("pool".to_string(), request.pool.to_string()),
        ("source".to_string(), request.volume.to_string()),
        ("path".to_string(), inspect::WORKSPACE.to_string()),
        ("readonly".to_string(), "true".to_string()),
    ]);
    let create = CreateInstance {
        name: name.to_string(),
        image,
        config: BTreeMap::from([
            (CONTROLLER_LABEL.to_string(), request.controller.to_string()),
            (INSPECTS_LABEL.to_string(), request.uid.to_string()),
        ]),
        devices: BTreeMap::from([("workspace".to_string(), workspace)]),
        profiles: Vec::new(),
        target: request.location.map(str::to_string),
        known_absent: false,
    };
    let created = within(request.timeout, "creating the inspection instance", async {
        runtime.create_instance(&create).await
    })
    .await?;
    let operation = match created {
        Created::Submitted { operation } => operation,
        // Removed just before: someone else made it meanwhile.
        Created::Exists(_) => return Err(InstanceError::NameTaken(name.to_string())),
    };
    let done = within(request.timeout, "creating the inspection instance", async {
        runtime.wait_operation(&operation, request.timeout).await
    })
    .await;
    match done {
        Ok(op) if op.status == OperationStatus::Success => Ok(()),
        Ok(op) => Err(InstanceError::CreateFailed(format!(
            "the operation is {:?} after {:?}",
            op.status, request.timeout
        ))),
        Err(InstanceError::Runtime {
            source: RuntimeError::OperationFailed { message, .. },
            ..
        }) => Err(InstanceError::CreateFailed(message)),
        // Judged by the instance itself when LXD forgot the operation.
        Err(InstanceError::Runtime {
            source: RuntimeError::OperationVanished { .. },
            ..
        }) => match runtime.get_instance(name).await {
            Ok(Some(_)) => Ok(()),
            _ => Err(InstanceError::CreateFailed(
                "the operation vanished and the instance is not there".into(),
            )),
        },
        Err(e) => Err(e),
    }
}

/// The first image of the request's list that exists, as a fingerprint.
async fn image(
    runtime: &dyn Runtime,
    request: &VolumeInspection<'_>,
) -> Result<ImageSource, InstanceError> {
    for candidate in &request.images {
        let found = within(request.timeout, "resolving an image", async {
            runtime.resolve_image(candidate).await
        })
        .await?;
        if let Some(fingerprint) = found {
            return Ok(ImageSource::Fingerprint(fingerprint));
        }
    }
    let tried: Vec<&str> = request.images.iter().map(ImageSource::as_str).collect();
    Err(InstanceError::NoImage(tried.join(", ")))
}

/// Stops (by force: nothing in it needs a clean shutdown) and deletes the inspection instance;
/// a missing one is fine.
async fn remove(runtime: &dyn Runtime, name: &str, timeout: Duration) -> Result<(), InstanceError> {
    let stop = StopOptions::kill();
    match within(timeout, "stopping the inspection instance", async {
        runtime.stop_instance(name, stop).await
    })
    .await
    {
        Ok(())
        | Err(InstanceError::Runtime {
            source: RuntimeError::NotFound { .. },
            ..
        }) => {}
        Err(e) => return Err(e),
    }
    within(timeout, "deleting the inspection instance", async {
        runtime.delete_instance(name, timeout).await
    })
    .await
}

/// One LXD call under a deadline of its own, whatever the client's.
async fn within<T>(
    timeout: Duration,
    what: &'static str,
    call: impl Future<Output = Result<T, RuntimeError>>,
) -> Result<T, InstanceError> {
    match tokio::time::timeout(timeout + Duration::from_secs(5), call).await {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(source)) => Err(InstanceError::Runtime { what, source }),
        Err(_) => Err(InstanceError::Timeout { what, timeout }),
    }
}
