//! Objects as tests write them to a store (the user-written part built in one line, a project
//! as the reconciler leaves it once it holds the teardown finalizer) and containers as LXD
//! lists them.

use std::collections::BTreeMap;
use std::sync::Arc;

use berth_api::Kind;
use serde_json::{Value, json};

use crate::layout::FINALIZER;
use crate::runtime::{Instance, InstanceStatus};
use crate::store::{Commit, Desired, FieldManager, StatusWrite, Store, StoreError, StoredObject};

impl Desired {
    /// An object of `kind` with `spec`, and no labels, annotations or finalizers.
    pub fn of(kind: Kind, name: &str, spec: Value) -> Desired {
        Desired {
            kind,
            name: name.to_string(),
            labels: BTreeMap::new(),
            annotations: BTreeMap::new(),
            finalizers: None,
            spec,
        }
    }

    /// A project with `spec`, and no labels, annotations or finalizers.
    pub fn project(name: &str, spec: Value) -> Desired {
        Desired::of(Kind::Project, name, spec)
    }

    pub fn with_labels(self, labels: BTreeMap<String, String>) -> Desired {
        Desired { labels, ..self }
    }

    pub fn with_annotations(self, annotations: BTreeMap<String, String>) -> Desired {
        Desired {
            annotations,
            ..self
        }
    }

    pub fn with_finalizers(self, finalizers: Option<Vec<String>>) -> Desired {
        Desired { finalizers, ..self }
    }
}

impl Instance {
    /// A running container on a standalone server, with `config` (its `user.*` labels among
    /// them) and no profiles, devices or state.
    pub fn running(name: &str, config: BTreeMap<String, String>) -> Instance {
        Instance {
            name: name.to_string(),
            status: InstanceStatus::Running,
            status_code: InstanceStatus::Running.code(),
            location: "none".to_string(),
            profiles: Vec::new(),
            config,
            devices: BTreeMap::new(),
            created_at: None,
            last_used_at: None,
            state: None,
        }
    }

    /// A running container labelled with `labels` (`user.*` keys and their values).
    pub fn labelled(name: &str, labels: &[(&str, &str)]) -> Instance {
        let config = labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Instance::running(name, config)
    }
}

impl Store {
    /// Writes `status` whole through the status path, as an administrator's status PUT does
    /// (`expected_rv`, when given, pinned): how a test sets the scene.
    pub fn put_status(
        &self,
        kind: Kind,
        name: &str,
        expected_rv: Option<u64>,
        status: Value,
    ) -> Result<Arc<StoredObject>, StoreError> {
        let write = StatusWrite::new(kind, name, FieldManager::Server).pinned(expected_rv);
        self.write_status(write, |_| status.clone())?
            .require(kind, name)
    }
}

/// A project (image `berth-base`) holding the teardown finalizer, with `status` written as the
/// controller would have: what a deletion then holds until the finalizer lets it go.
pub fn finalized_project(store: &Store, name: &str, status: Value) -> Arc<StoredObject> {
    let desired = Desired::project(name, json!({"image": "berth-base"}))
        .with_finalizers(Some(vec![FINALIZER.to_string()]));
    store.apply(desired, Commit::Persist).unwrap();
    store.put_status(Kind::Project, name, None, status).unwrap()
}

/// Asks for the deletion of project `name` with `annotations` (`forceDelete`, ...); the project
/// as the store holds it after (deleting, while its finalizer holds it).
pub fn delete_project(
    store: &Store,
    name: &str,
    annotations: BTreeMap<String, String>,
) -> Option<Arc<StoredObject>> {
    store
        .delete(Kind::Project, name, None, annotations, Commit::Persist)
        .unwrap();
    store.get(Kind::Project, name)
}
