//! Objects as tests write them to a store: the user-written part built in one line, and a
//! project as the reconciler leaves it once it holds the teardown finalizer.

use std::collections::BTreeMap;
use std::sync::Arc;

use berth_api::Kind;
use serde_json::{Value, json};

use crate::layout::FINALIZER;
use crate::store::{Commit, Desired, Store, StoredObject};

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

/// A project (image `berth-base`) holding the teardown finalizer, with `status` written as the
/// controller would have: what a deletion then holds until the finalizer lets it go.
pub fn finalized_project(store: &Store, name: &str, status: Value) -> Arc<StoredObject> {
    let desired = Desired::project(name, json!({"image": "berth-base"}))
        .with_finalizers(Some(vec![FINALIZER.to_string()]));
    store.apply(desired, Commit::Persist).unwrap();
    store
        .update_status(Kind::Project, name, None, status, Commit::Persist)
        .unwrap()
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
