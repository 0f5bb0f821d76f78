//! Whether the container named like a project is that project's, checked before anything
//! reaches into it on a person's behalf (exec, the workspace tools, `answer`, `logs`, the
//! runtime figures).
//!
//! A project's name is also its LXD instance name, and anyone may create a project of any free
//! name: without this check a user who names a project after someone else's container (another
//! daemon's, or anything else in the LXD project) would become root in it. Only a container
//! that carries the project's uid in `user.berth.uid` and this store's id in
//! `user.berth.controller` is the project's. One labelled before controllers were named (no
//! controller label) counts as this controller's, as orphan reporting counts it.

use std::time::Duration;

use crate::layout::{CONTROLLER_LABEL, uid_label};
use crate::runtime::{Instance, Runtime, RuntimeError};

/// How long reading the instance may take.
const READ_TIMEOUT: Duration = Duration::from_secs(30);

/// Why a project's container cannot be reached.
#[derive(Debug, thiserror::Error)]
pub enum Unreached {
    /// A container of that name exists but is not this project's.
    #[error("{0}")]
    Foreign(String),
    /// No container of that name exists.
    #[error("the project {0:?} has no container")]
    Absent(String),
    /// LXD did not say (an error, or no answer in time).
    #[error("reading the container {name:?}: {source}")]
    Runtime {
        name: String,
        #[source]
        source: RuntimeError,
    },
}

/// Whether `instance` is the container of the project `uid` made by the controller
/// `controller`; the refusal names what is wrong in one line.
pub fn check_owner(instance: &Instance, uid: &str, controller: &str) -> Result<(), Unreached> {
    let foreign = |why: String| {
        Err(Unreached::Foreign(format!(
            "the container {:?} is not this project's ({why}); berth does not reach into it",
            instance.name
        )))
    };
    match uid_label(&instance.config) {
        Some(label) if label == uid => {}
        Some(_) => return foreign("it belongs to another berth project".to_string()),
        None => return foreign("it was not made by berth".to_string()),
    }
    match instance.config.get(CONTROLLER_LABEL) {
        Some(label) if label != controller => {
            foreign("another berth controller made it".to_string())
        }
        _ => Ok(()),
    }
}

/// Reads the container `name` and returns it only if it is the project `uid`'s, made by the
/// controller `controller` (with its state, so callers need not read it again).
pub async fn owned_container(
    runtime: &dyn Runtime,
    name: &str,
    uid: &str,
    controller: &str,
) -> Result<Instance, Unreached> {
    let read = tokio::time::timeout(READ_TIMEOUT, runtime.get_instance(name))
        .await
        .unwrap_or_else(|_| {
            Err(RuntimeError::Timeout {
                what: format!("read instance {name}"),
                after: READ_TIMEOUT,
            })
        });
    match read {
        Ok(Some(instance)) => {
            check_owner(&instance, uid, controller)?;
            Ok(instance)
        }
        Ok(None) => Err(Unreached::Absent(name.to_string())),
        Err(source) => Err(Unreached::Runtime {
            name: name.to_string(),
            source,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::UID_LABEL;

    #[test]
    fn only_the_projects_own_container_is_reached() {
        const UID: &str = UID_LABEL;
        const BY: &str = CONTROLLER_LABEL;
        let table: [(&[(&str, &str)], bool); 6] = [
            (&[(UID, "u1"), (BY, "c1")], true),
            // Labelled before controllers were named.
            (&[(UID, "u1")], true),
            (&[], false),
            (&[("user.other", "u1")], false),
            (&[(UID, "u2"), (BY, "c1")], false),
            (&[(UID, "u1"), (BY, "c2")], false),
        ];
        for (labels, reached) in table {
            let outcome = check_owner(&Instance::labelled("web", labels), "u1", "c1");
            assert_eq!(outcome.is_ok(), reached, "{labels:?}");
            if let Err(refusal) = outcome {
                // Answered 409 NameConflict (`api::containers`).
                assert!(matches!(refusal, Unreached::Foreign(_)), "{refusal}");
                assert!(!refusal.to_string().contains('\n'), "{refusal}");
            }
        }
    }
}
