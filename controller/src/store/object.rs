//! The stored form of an object and the records the store hands out about it.
//!
//! Spec and status are held as `Doc`s, canonical JSON text decoded where read: a decoded value
//! costs several times its text, and every object is in memory. A GitSource's URL credentials
//! are redacted when a `StoredObject` is shown.

use std::collections::BTreeMap;
use std::sync::Arc;

use berth_api::{API_VERSION, Kind, ObjectMeta};
use serde::de::DeserializeOwned;
use serde::ser::{Serialize, SerializeMap, Serializer};
use serde_json::Value;
use serde_json::value::RawValue;

/// A JSON document (an object's spec or status) held as its compact text.
///
/// The store keeps every object in memory, and a decoded `Value` costs several times its text
/// (a map node for every object in it, however small): 10,000 projects' specs and statuses take
/// about 80 MB as values and 16 MB as text. Readers decode what they need, when they need it.
/// The text is canonical (written from a `Value`, whose keys are sorted), so two documents are
/// equal exactly when their texts are.
#[derive(Clone)]
pub struct Doc(Box<RawValue>);

impl Doc {
    pub fn new(value: &Value) -> Doc {
        Doc(serde_json::value::to_raw_value(value).expect("a Value always serializes"))
    }

    pub fn null() -> Doc {
        Doc::new(&Value::Null)
    }

    /// The document, decoded.
    pub fn value(&self) -> Value {
        serde_json::from_str(self.0.get()).unwrap_or(Value::Null)
    }

    /// The document decoded as `T`.
    pub fn decode<T: DeserializeOwned>(&self) -> Result<T, serde_json::Error> {
        serde_json::from_str(self.0.get())
    }

    /// The value of one top-level field. Only that field is decoded; the others are scanned
    /// past as text. For several fields, decode once with [`Doc::value`] or [`Doc::decode`].
    pub fn get(&self, key: &str) -> Option<Value> {
        let fields: BTreeMap<std::borrow::Cow<'_, str>, &RawValue> =
            serde_json::from_str(self.0.get()).ok()?;
        serde_json::from_str(fields.get(key)?.get()).ok()
    }

    /// The value at a JSON pointer (`/reap/idledAt`); only its top-level field is decoded.
    pub fn pointer(&self, pointer: &str) -> Option<Value> {
        let Some(path) = pointer.strip_prefix('/') else {
            return self.value().pointer_mut(pointer).map(Value::take);
        };
        let (first, rest) = match path.find('/') {
            Some(at) => (&path[..at], &path[at..]),
            None => (path, ""),
        };
        let mut field = self.get(&first.replace("~1", "/").replace("~0", "~"))?;
        field.pointer_mut(rest).map(Value::take)
    }

    /// A top-level string field.
    pub fn get_str(&self, key: &str) -> Option<String> {
        match self.get(key)? {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    pub fn is_null(&self) -> bool {
        self.0.get() == "null"
    }

    pub fn as_str(&self) -> &str {
        self.0.get()
    }
}

impl Default for Doc {
    fn default() -> Self {
        Doc::null()
    }
}

impl From<Value> for Doc {
    fn from(value: Value) -> Doc {
        Doc::new(&value)
    }
}

impl From<&Value> for Doc {
    fn from(value: &Value) -> Doc {
        Doc::new(value)
    }
}

impl PartialEq for Doc {
    fn eq(&self, other: &Doc) -> bool {
        self.0.get() == other.0.get()
    }
}

impl PartialEq<Value> for Doc {
    fn eq(&self, other: &Value) -> bool {
        serde_json::to_string(other).is_ok_and(|text| text == self.0.get())
    }
}

impl PartialEq<Doc> for Value {
    fn eq(&self, other: &Doc) -> bool {
        other == self
    }
}

impl std::fmt::Debug for Doc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0.get())
    }
}

impl std::fmt::Display for Doc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0.get())
    }
}

impl Serialize for Doc {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(serializer)
    }
}

/// One object as the store holds it: server-set metadata filled in, spec as admitted (defaults
/// resolved), status as the controller last wrote it (`null` when it never did).
#[derive(Debug, Clone, PartialEq)]
pub struct StoredObject {
    pub kind: Kind,
    pub metadata: ObjectMeta,
    pub spec: Doc,
    pub status: Doc,
}

impl StoredObject {
    pub fn name(&self) -> &str {
        &self.metadata.name
    }

    pub fn uid(&self) -> &str {
        self.metadata.uid.as_deref().unwrap_or_default()
    }

    pub fn generation(&self) -> i64 {
        self.metadata.generation.unwrap_or_default()
    }

    pub fn resource_version(&self) -> u64 {
        self.metadata
            .resource_version
            .as_deref()
            .and_then(|rv| rv.parse().ok())
            .unwrap_or_default()
    }

    pub fn is_deleting(&self) -> bool {
        self.metadata.deletion_timestamp.is_some()
    }

    /// The wire form: `{apiVersion, kind, metadata, spec, status?}`.
    pub fn to_value(&self) -> Value {
        serde_json::to_value(self).unwrap_or(Value::Null)
    }
}

/// Every string in `value` with the credentials of the URLs in it replaced by `***`.
fn redact_strings(value: &mut Value) {
    match value {
        Value::String(text) => {
            if let std::borrow::Cow::Owned(redacted) = berth_api::redact_credentials(text) {
                *text = redacted;
            }
        }
        Value::Array(items) => items.iter_mut().for_each(redact_strings),
        Value::Object(fields) => fields.values_mut().for_each(redact_strings),
        _ => {}
    }
}

/// `doc` as shown: a GitSource's spec and status with the credentials of any URL redacted
/// (one stored before such URLs were refused still has them; git reads the stored one).
fn shown(kind: Kind, doc: &Doc) -> Option<Value> {
    let text = doc.as_str();
    if kind != Kind::GitSource || !text.contains('@') {
        return None;
    }
    let mut value = doc.value();
    redact_strings(&mut value);
    Some(value)
}

impl Serialize for StoredObject {
    /// The wire form, for every listing, get, watch and write response.
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let fields = if self.status.is_null() { 4 } else { 5 };
        let mut map = serializer.serialize_map(Some(fields))?;
        map.serialize_entry("apiVersion", API_VERSION)?;
        map.serialize_entry("kind", &self.kind)?;
        map.serialize_entry("metadata", &self.metadata)?;
        match shown(self.kind, &self.spec) {
            Some(spec) => map.serialize_entry("spec", &spec)?,
            None => map.serialize_entry("spec", &self.spec)?,
        }
        if !self.status.is_null() {
            match shown(self.kind, &self.status) {
                Some(status) => map.serialize_entry("status", &status)?,
                None => map.serialize_entry("status", &self.status)?,
            }
        }
        map.end()
    }
}

/// The user-written part of an object: what create, replace and apply carry. Spec is already
/// validated and defaulted by admission.
#[derive(Debug, Clone, PartialEq)]
pub struct Desired {
    pub kind: Kind,
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
    /// `None` keeps the stored finalizers: a manifest applied by a user must not drop the ones
    /// the controller put there.
    pub finalizers: Option<Vec<String>>,
    pub spec: Value,
}

/// The object as a write's access was checked against it, checked again under the store's lock,
/// so a write allowed as a create never lands on an object someone made meanwhile, nor one
/// allowed against one version on another.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expected {
    Absent,
    Version(u64),
}

impl Expected {
    pub fn of(current: Option<&StoredObject>) -> Expected {
        match current {
            None => Expected::Absent,
            Some(current) => Expected::Version(current.resource_version()),
        }
    }
}

/// What a write did to one object, as `berth apply` reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Created,
    Configured,
    Unchanged,
}

impl Action {
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Created => "created",
            Action::Configured => "configured",
            Action::Unchanged => "unchanged",
        }
    }
}

/// The outcome of a delete: gone at once, or held by finalizers with `deletionTimestamp` set.
#[derive(Debug, Clone, PartialEq)]
pub enum Deletion {
    Deleted(Arc<StoredObject>),
    Deleting(Arc<StoredObject>),
}

impl Deletion {
    pub fn object(&self) -> &Arc<StoredObject> {
        match self {
            Deletion::Deleted(object) | Deletion::Deleting(object) => object,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChangeType {
    Added,
    Modified,
    Deleted,
}

impl ChangeType {
    /// The watch event type: `ADDED`, `MODIFIED`, `DELETED`.
    pub fn as_watch_type(self) -> &'static str {
        match self {
            ChangeType::Added => "ADDED",
            ChangeType::Modified => "MODIFIED",
            ChangeType::Deleted => "DELETED",
        }
    }
}

/// One committed write, in resourceVersion order, as the change feed carries it.
#[derive(Debug, Clone)]
pub struct Change {
    pub type_: ChangeType,
    pub kind: Kind,
    pub name: String,
    pub uid: String,
    pub resource_version: u64,
    pub generation: i64,
    /// Whether what the object asks for moved (spec, labels, annotations, the object itself);
    /// false when only its status or finalizers did, the controller's own bookkeeping, which
    /// it does not answer with another reconcile.
    pub desired_changed: bool,
    /// The object after the write; for `Deleted`, its last state.
    pub object: Arc<StoredObject>,
}

impl Change {
    pub(super) fn new(
        type_: ChangeType,
        object: &Arc<StoredObject>,
        desired_changed: bool,
    ) -> Self {
        Change {
            type_,
            kind: object.kind,
            name: object.name().to_string(),
            uid: object.uid().to_string(),
            resource_version: object.resource_version(),
            generation: object.generation(),
            desired_changed,
            object: Arc::clone(object),
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::{Doc, Kind, ObjectMeta, StoredObject};

    #[test]
    fn a_gitsource_is_shown_without_the_credentials_of_its_url() {
        let object = StoredObject {
            kind: Kind::GitSource,
            metadata: ObjectMeta {
                name: "fleet".to_string(),
                ..ObjectMeta::default()
            },
            spec: Doc::new(&serde_json::json!({"url": "https://bot:s3cr3t@git.example/f.git"})),
            status: Doc::new(&serde_json::json!({"conditions": [
                {"type": "Ready", "message": "cannot fetch 'https://bot:s3cr3t@git.example/f.git/'"}
            ]})),
        };
        let shown = serde_json::to_string(&object).unwrap();
        assert!(
            !shown.contains("s3cr3t") && !shown.contains("bot"),
            "{shown}"
        );
        assert_eq!(
            object.to_value()["spec"]["url"],
            "https://***@git.example/f.git"
        );
        // What the store holds is untouched: git still needs it.
        assert!(object.spec.as_str().contains("s3cr3t"));
    }

    #[test]
    fn fields_and_pointers_read_what_the_whole_document_holds() {
        let value = json!({"phase": "Ready", "reap": {"idledAt": "t", "a/b": {"~x": 1}},
            "list": [1, {"k": "v"}], "n": null});
        let doc = Doc::new(&value);
        for key in ["phase", "reap", "list", "n", "absent"] {
            assert_eq!(doc.get(key), value.get(key).cloned(), "{key}");
        }
        assert_eq!(doc.get_str("phase").as_deref(), Some("Ready"));
        assert_eq!(doc.get_str("reap"), None);
        for pointer in [
            "",
            "/reap",
            "/reap/idledAt",
            "/reap/a~1b/~0x",
            "/list/1/k",
            "/list/5",
            "/absent/x",
            "/n",
        ] {
            assert_eq!(
                doc.pointer(pointer),
                value.pointer(pointer).cloned(),
                "{pointer}"
            );
        }
        let scalar = Doc::new(&json!("text"));
        assert_eq!(scalar.get("phase"), None);
        assert_eq!(scalar.pointer("/phase"), None);
        assert_eq!(Doc::null().get("phase"), None);
    }
}
