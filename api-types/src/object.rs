//! The kinds berth serves, an object of any of them, and decoding manifests into objects.
//!
//! `Kind` is the one kind enum, with every spelling of it (`KindNames`: kind, singular, plural,
//! short, list kind, what `kubectl api-resources` lists) and its lookups: `FromStr` takes the
//! exact kind, as manifests and stored rows spell it; `Kind::from_cli` a singular, plural or
//! short name in any case (every kind the CLI and the client take; an unknown word is answered
//! with the valid kinds); `Kind::from_plural` an API path's segment, exactly. `decode_manifest`
//! rejects unknown fields with their path and ignores server-set metadata and status;
//! `decode_stored` reads a stored object back. `kind_object!` declares each kind's object type
//! (apiVersion, kind, metadata, spec, status; `KIND`, `new`).

use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::{Map, Value};

use crate::error::ValidationErrors;
use crate::gitsource::{GitSource, validate_gitsource};
use crate::meta::{API_VERSION, Condition, ObjectMeta};
use crate::naming::validate_name;
use crate::profile::{AgentProfile, validate_profile};
use crate::project::{Defaults, Project, validate_project};

/// Declares a kind's object type: `apiVersion`, `kind`, `metadata`, `spec` and an optional
/// `status`, in that order, each defaulted when a manifest leaves it out, unknown fields
/// refused; `KIND`, the kind's name; and `new`, an object of that kind with a name and a spec.
macro_rules! kind_object {
    ($(#[$attr:meta])* $name:ident { spec: $spec:ty, status: $status:ty $(,)? }) => {
        $(#[$attr])*
        #[derive(
            Debug,
            Clone,
            PartialEq,
            ::serde::Serialize,
            ::serde::Deserialize,
            ::schemars::JsonSchema,
        )]
        #[serde(rename_all = "camelCase", deny_unknown_fields)]
        pub struct $name {
            #[serde(default)]
            pub api_version: String,
            #[serde(default)]
            pub kind: String,
            #[serde(default)]
            pub metadata: $crate::meta::ObjectMeta,
            #[serde(default)]
            pub spec: $spec,
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub status: Option<$status>,
        }

        impl $name {
            pub const KIND: &'static str = stringify!($name);

            pub fn new(name: impl Into<String>, spec: $spec) -> Self {
                $name {
                    api_version: $crate::meta::API_VERSION.to_string(),
                    kind: Self::KIND.to_string(),
                    metadata: $crate::meta::ObjectMeta {
                        name: name.into(),
                        ..$crate::meta::ObjectMeta::default()
                    },
                    spec,
                    status: None,
                }
            }
        }
    };
}

pub(crate) use kind_object;

/// A kind of object.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    Project,
    AgentProfile,
    GitSource,
}

/// A kind's names: what `kubectl api-resources` would list (NAME, SHORTNAMES, KIND) and every
/// spelling a user may type for it on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KindNames {
    /// `kind` in manifests and stored rows: `Project`.
    pub kind: &'static str,
    /// The lower-case singular of `project/NAME` references: `project`.
    pub singular: &'static str,
    /// The resource name in API paths: `projects`.
    pub plural: &'static str,
    /// The short name kubectl users type: `proj`.
    pub short: &'static str,
    /// The `kind` of a list of these: `ProjectList`.
    pub list_kind: &'static str,
}

impl Kind {
    /// Every kind, in the order objects of a batch are applied (profiles before the projects
    /// that name them is friendlier, though projects tolerate a missing profile).
    pub const ALL: [Kind; 3] = [Kind::AgentProfile, Kind::Project, Kind::GitSource];

    /// Every kind, in the order they are listed to users (help, errors naming the valid kinds).
    pub const LISTED: [Kind; 3] = [Kind::Project, Kind::AgentProfile, Kind::GitSource];

    /// Every name of this kind, from the one table of them.
    pub fn names(self) -> &'static KindNames {
        match self {
            Kind::Project => &KindNames {
                kind: "Project",
                singular: "project",
                plural: "projects",
                short: "proj",
                list_kind: "ProjectList",
            },
            Kind::AgentProfile => &KindNames {
                kind: "AgentProfile",
                singular: "agentprofile",
                plural: "agentprofiles",
                short: "ap",
                list_kind: "AgentProfileList",
            },
            Kind::GitSource => &KindNames {
                kind: "GitSource",
                singular: "gitsource",
                plural: "gitsources",
                short: "gs",
                list_kind: "GitSourceList",
            },
        }
    }

    pub fn as_str(&self) -> &'static str {
        self.names().kind
    }

    /// The lower-case singular of `project/NAME` references.
    pub fn singular(&self) -> &'static str {
        self.names().singular
    }

    /// The resource name in API paths.
    pub fn plural(&self) -> &'static str {
        self.names().plural
    }

    /// The short name kubectl users type (`proj`, `ap`, `gs`).
    pub fn short(&self) -> &'static str {
        self.names().short
    }

    /// The `kind` of a list of these.
    pub fn list_kind(&self) -> &'static str {
        self.names().list_kind
    }

    /// Reads a kind as a manifest or request body may spell it: singular or plural, any case.
    /// Short names are the command line's alone (`Kind::from_cli`).
    pub fn parse(s: &str) -> Option<Kind> {
        let lower = s.trim().to_ascii_lowercase();
        Kind::ALL
            .into_iter()
            .find(|k| lower == k.singular() || lower == k.plural())
    }

    /// Reads a kind as the command line takes it: singular, plural or short name, any case
    /// (`project`, `Projects`, `proj`).
    pub fn from_cli(word: &str) -> Result<Kind, UnknownCliKind> {
        let lower = word.to_ascii_lowercase();
        Kind::ALL
            .into_iter()
            .find(|k| lower == k.singular() || lower == k.plural() || lower == k.short())
            .ok_or_else(|| UnknownCliKind(word.to_string()))
    }

    /// The kind served under `/apis/berth.dev/v1alpha1/<plural>`: the plural exactly as the
    /// server spells it, never a short name.
    pub fn from_plural(segment: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| k.plural() == segment)
    }
}

/// A word the command line does not read as a kind; says what was given and the valid kinds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownCliKind(pub String);

impl std::fmt::Display for UnknownCliKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let [first, second, third] = Kind::LISTED.map(|k| k.singular());
        write!(
            f,
            "unknown kind {:?} (expected {first}, {second} or {third})",
            self.0
        )
    }
}

impl std::error::Error for UnknownCliKind {}

/// A kind's exact name, as `kind` is written in manifests and stored (`"Project"`).
impl std::str::FromStr for Kind {
    type Err = UnknownKind;

    fn from_str(s: &str) -> Result<Kind, UnknownKind> {
        Kind::ALL
            .into_iter()
            .find(|kind| kind.as_str() == s)
            .ok_or_else(|| UnknownKind(s.to_string()))
    }
}

/// A name that is no kind's exact name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not a known kind (Project, AgentProfile or GitSource)")]
pub struct UnknownKind(pub String);

impl Serialize for Kind {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for Kind {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Kind::parse(&s).ok_or_else(|| serde::de::Error::custom(unknown_kind_message(&s)))
    }
}

impl std::fmt::Display for Kind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An object of any kind.
// Unboxed so callers can build and match variants directly; objects are few and short-lived
// compared with the I/O around them.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq)]
pub enum Object {
    Project(Project),
    AgentProfile(AgentProfile),
    GitSource(GitSource),
}

impl Object {
    pub fn kind(&self) -> Kind {
        match self {
            Object::Project(_) => Kind::Project,
            Object::AgentProfile(_) => Kind::AgentProfile,
            Object::GitSource(_) => Kind::GitSource,
        }
    }

    pub fn name(&self) -> &str {
        &self.metadata().name
    }

    pub fn metadata(&self) -> &ObjectMeta {
        match self {
            Object::Project(o) => &o.metadata,
            Object::AgentProfile(o) => &o.metadata,
            Object::GitSource(o) => &o.metadata,
        }
    }

    pub fn metadata_mut(&mut self) -> &mut ObjectMeta {
        match self {
            Object::Project(o) => &mut o.metadata,
            Object::AgentProfile(o) => &mut o.metadata,
            Object::GitSource(o) => &mut o.metadata,
        }
    }

    /// The spec alone, as JSON: what `generation` tracks.
    pub fn spec_value(&self) -> Value {
        let v = match self {
            Object::Project(o) => serde_json::to_value(&o.spec),
            Object::AgentProfile(o) => serde_json::to_value(&o.spec),
            Object::GitSource(o) => serde_json::to_value(&o.spec),
        };
        v.unwrap_or(Value::Null)
    }

    /// The status alone, as JSON (`null` when none was written).
    pub fn status_value(&self) -> Value {
        let v = match self {
            Object::Project(o) => serde_json::to_value(&o.status),
            Object::AgentProfile(o) => serde_json::to_value(&o.status),
            Object::GitSource(o) => serde_json::to_value(&o.status),
        };
        v.unwrap_or(Value::Null)
    }

    /// The whole object as JSON, `apiVersion` and `kind` filled in.
    pub fn to_value(&self) -> Value {
        let mut v = match self {
            Object::Project(o) => serde_json::to_value(o),
            Object::AgentProfile(o) => serde_json::to_value(o),
            Object::GitSource(o) => serde_json::to_value(o),
        }
        .unwrap_or(Value::Null);
        if let Value::Object(map) = &mut v {
            map.insert("apiVersion".into(), Value::String(API_VERSION.into()));
            map.insert("kind".into(), Value::String(self.kind().as_str().into()));
        }
        v
    }

    /// Replaces the status with `status` as the status path receives it (`null` clears it).
    /// Fields are named under `status.`.
    pub fn set_status_value(&mut self, status: Value) -> Result<(), ValidationErrors> {
        fn decode<T: DeserializeOwned>(v: Value) -> Result<Option<T>, ValidationErrors> {
            if v.is_null() {
                return Ok(None);
            }
            serde_path_to_error::deserialize::<_, T>(&v)
                .map(Some)
                .map_err(|e| {
                    let (field, message, _) = describe_error(e);
                    let field = if field.is_empty() {
                        "status".to_string()
                    } else {
                        format!("status.{field}")
                    };
                    ValidationErrors::one(field, message)
                })
        }
        match self {
            Object::Project(o) => o.status = decode(status)?,
            Object::AgentProfile(o) => o.status = decode(status)?,
            Object::GitSource(o) => o.status = decode(status)?,
        }
        Ok(())
    }

    /// The status conditions (empty without a status).
    pub fn conditions(&self) -> &[Condition] {
        match self {
            Object::Project(o) => o.status.as_ref().map(|s| s.conditions.as_slice()),
            Object::AgentProfile(o) => o.status.as_ref().map(|s| s.conditions.as_slice()),
            Object::GitSource(o) => o.status.as_ref().map(|s| s.conditions.as_slice()),
        }
        .unwrap_or(&[])
    }

    /// Which generation the status describes (`None` without a status).
    pub fn observed_generation(&self) -> Option<i64> {
        match self {
            Object::Project(o) => o.status.as_ref().map(|s| s.observed_generation),
            Object::AgentProfile(o) => o.status.as_ref().map(|s| s.observed_generation),
            Object::GitSource(o) => o.status.as_ref().map(|s| s.observed_generation),
        }
    }

    /// Resolves fleet defaults into a project's spec (admission); other kinds default at
    /// decode and are left as they are.
    pub fn apply_defaults(&mut self, defaults: &Defaults) {
        if let Object::Project(p) = self {
            p.apply_defaults(defaults);
        }
    }

    /// `Kind/name`, as inventories and messages name objects.
    pub fn key(&self) -> String {
        format!("{}/{}", self.kind().as_str(), self.name())
    }

    /// Checks everything a user could have got wrong and reports every problem found.
    pub fn validate(&self) -> Result<(), ValidationErrors> {
        let mut errs = ValidationErrors::new();
        validate_metadata(self.metadata(), &mut errs);
        match self {
            Object::Project(p) => validate_project(p, &mut errs),
            Object::AgentProfile(p) => validate_profile(p, &mut errs),
            Object::GitSource(g) => validate_gitsource(g, &mut errs),
        }
        errs.into_result()
    }
}

impl From<Project> for Object {
    fn from(o: Project) -> Self {
        Object::Project(o)
    }
}

impl From<AgentProfile> for Object {
    fn from(o: AgentProfile) -> Self {
        Object::AgentProfile(o)
    }
}

impl From<GitSource> for Object {
    fn from(o: GitSource) -> Self {
        Object::GitSource(o)
    }
}

impl Serialize for Object {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.to_value().serialize(s)
    }
}

/// Deserializes a stored object (see [`decode_stored`]).
impl<'de> Deserialize<'de> for Object {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v = Value::deserialize(d)?;
        decode_stored(v).map_err(serde::de::Error::custom)
    }
}

fn validate_metadata(m: &ObjectMeta, errs: &mut ValidationErrors) {
    if let Err(e) = validate_name(&m.name) {
        errs.push("metadata.name", e);
    }
    for (key, value) in &m.labels {
        if let Err(e) = validate_label_key(key) {
            errs.push(format!("metadata.labels.{key}"), e);
        }
        if let Err(e) = validate_label_value(value) {
            errs.push(format!("metadata.labels.{key}"), e);
        }
    }
    for key in m.annotations.keys() {
        if let Err(e) = validate_label_key(key) {
            errs.push(format!("metadata.annotations.{key}"), e);
        }
    }
}

fn is_label_segment(s: &str, max: usize) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= max
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
}

/// Kubernetes label and annotation key rules: an optional DNS prefix and `/`, then a name of at
/// most 63 characters (letters, digits, `-`, `_`, `.`, alphanumeric at both ends).
pub fn validate_label_key(key: &str) -> Result<(), String> {
    let (prefix, name) = match key.rsplit_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    let prefix_ok = prefix.is_none_or(|p| {
        p.len() <= 253
            && p.split('.').all(|part| {
                let b = part.as_bytes();
                !b.is_empty()
                    && b[0].is_ascii_alphanumeric()
                    && b[b.len() - 1].is_ascii_alphanumeric()
                    && b.iter()
                        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
            })
    });
    if prefix_ok && is_label_segment(name, 63) {
        Ok(())
    } else {
        Err(format!(
            "{key:?} is not a valid key (optional DNS prefix and '/', then at most 63 letters, digits, '-', '_', '.')"
        ))
    }
}

/// Label values: empty, or at most 63 letters, digits, `-`, `_`, `.`, alphanumeric at both ends.
pub fn validate_label_value(value: &str) -> Result<(), String> {
    if value.is_empty() || is_label_segment(value, 63) {
        Ok(())
    } else {
        Err(format!(
            "{value:?} is not a valid label value (at most 63 letters, digits, '-', '_', '.', starting and ending with a letter or digit)"
        ))
    }
}

/// Metadata the server owns. A manifest may carry it (it is what `get -o yaml` prints) but
/// applying ignores it.
const SERVER_SET_METADATA: [&str; 6] = [
    "uid",
    "generation",
    "resourceVersion",
    "creationTimestamp",
    "deletionTimestamp",
    "finalizers",
];

/// Bound on decode passes: each pass removes one bad field so the next can find the one after.
const MAX_DECODE_PASSES: usize = 64;

/// Decodes a manifest as a user wrote it. Checks `apiVersion` and `kind`, rejects unknown fields
/// with their path, ignores `status` and server-set metadata (uid, generation, resourceVersion,
/// timestamps, finalizers) so `get -o yaml` output applies back cleanly, then validates. Every
/// problem is reported, not just the first.
pub fn decode_manifest(value: Value) -> Result<Object, ValidationErrors> {
    let mut errs = ValidationErrors::new();
    let Value::Object(mut map) = value else {
        return Err(ValidationErrors::one(
            "",
            format!("a manifest must be a mapping, not {}", json_type(&value)),
        ));
    };
    let kind = check_header(&map, &mut errs)?;
    map.remove("status");
    strip_nulls(&mut map);
    if let Some(Value::Object(meta)) = map.get_mut("metadata") {
        for key in SERVER_SET_METADATA {
            meta.remove(key);
        }
    }
    let value = Value::Object(map);
    let mut removed = Vec::new();
    let object = match kind {
        Kind::Project => {
            decode_lenient::<Project>(value, &mut errs, &mut removed).map(Object::from)
        }
        Kind::AgentProfile => {
            decode_lenient::<AgentProfile>(value, &mut errs, &mut removed).map(Object::from)
        }
        Kind::GitSource => {
            decode_lenient::<GitSource>(value, &mut errs, &mut removed).map(Object::from)
        }
    };
    let Some(mut object) = object else {
        sort_causes(&mut errs);
        return Err(errs);
    };
    if let Err(found) = object.validate() {
        // A field dropped for failing to decode would also read as missing: say it once.
        errs.causes.extend(
            found
                .causes
                .into_iter()
                .filter(|c| !removed.iter().any(|r| is_same_or_below(&c.field, r))),
        );
    }
    if !errs.is_empty() {
        sort_causes(&mut errs);
        return Err(errs);
    }
    set_header(&mut object);
    Ok(object)
}

/// Decodes an object as the store holds it: server-set metadata and status kept, no validation.
pub fn decode_stored(value: Value) -> Result<Object, ValidationErrors> {
    let Value::Object(map) = &value else {
        return Err(ValidationErrors::one(
            "",
            format!("an object must be a mapping, not {}", json_type(&value)),
        ));
    };
    let kind_text = map.get("kind").and_then(Value::as_str).unwrap_or("");
    let kind = Kind::parse(kind_text)
        .ok_or_else(|| ValidationErrors::one("kind", unknown_kind_message(kind_text)))?;
    let mut object = match kind {
        Kind::Project => decode_strict::<Project>(&value).map(Object::from),
        Kind::AgentProfile => decode_strict::<AgentProfile>(&value).map(Object::from),
        Kind::GitSource => decode_strict::<GitSource>(&value).map(Object::from),
    }?;
    set_header(&mut object);
    Ok(object)
}

/// Orders causes by field, list indices numerically (`[2]` before `[10]`); causes of one field
/// keep their order.
fn sort_causes(errs: &mut ValidationErrors) {
    fn key(field: &str) -> String {
        let mut out = String::with_capacity(field.len() + 8);
        let mut rest = field;
        while let Some(open) = rest.find('[') {
            out.push_str(&rest[..=open]);
            rest = &rest[open + 1..];
            let digits = rest
                .find(|c: char| !c.is_ascii_digit())
                .unwrap_or(rest.len());
            out.push_str(&format!("{:0>12}", &rest[..digits]));
            rest = &rest[digits..];
        }
        out.push_str(rest);
        out
    }
    errs.causes.sort_by_cached_key(|c| key(&c.field));
}

/// A key written with no value (`spec:` or `resources:` on a line of its own) means the same as
/// leaving it out, as in Kubernetes manifests.
fn strip_nulls(map: &mut Map<String, Value>) {
    map.retain(|_, v| !v.is_null());
    for v in map.values_mut() {
        match v {
            Value::Object(m) => strip_nulls(m),
            Value::Array(items) => {
                for item in items {
                    if let Value::Object(m) = item {
                        strip_nulls(m);
                    }
                }
            }
            _ => {}
        }
    }
}

fn set_header(object: &mut Object) {
    let (api_version, kind) = match object {
        Object::Project(o) => (&mut o.api_version, &mut o.kind),
        Object::AgentProfile(o) => (&mut o.api_version, &mut o.kind),
        Object::GitSource(o) => (&mut o.api_version, &mut o.kind),
    };
    *api_version = API_VERSION.to_string();
    *kind = object_kind_str(kind).to_string();
}

fn object_kind_str(kind: &str) -> &'static str {
    Kind::parse(kind).map(|k| k.as_str()).unwrap_or("")
}

fn unknown_kind_message(kind: &str) -> String {
    if kind.is_empty() {
        "required".to_string()
    } else {
        format!("{kind:?} is not a known kind (Project, AgentProfile or GitSource)")
    }
}

/// Checks `apiVersion` and `kind`; the kind is needed to go on, the version is not.
fn check_header(
    map: &Map<String, Value>,
    errs: &mut ValidationErrors,
) -> Result<Kind, ValidationErrors> {
    match map.get("apiVersion") {
        None => errs.push("apiVersion", "required"),
        Some(Value::String(v)) if v == API_VERSION => {}
        Some(v) => errs.push(
            "apiVersion",
            format!("{} is not supported (use {API_VERSION})", show(v)),
        ),
    }
    match map.get("kind") {
        None => {
            errs.push("kind", "required");
            Err(errs.clone())
        }
        Some(Value::String(k)) => match k.parse::<Kind>() {
            Ok(kind) => Ok(kind),
            Err(_) => {
                let message = match Kind::parse(k) {
                    Some(kind) => format!("{k:?} is not a known kind (did you mean {kind}?)"),
                    None => unknown_kind_message(k),
                };
                errs.push("kind", message);
                Err(errs.clone())
            }
        },
        Some(v) => {
            errs.push("kind", format!("{} is not a known kind", show(v)));
            Err(errs.clone())
        }
    }
}

fn show(v: &Value) -> String {
    serde_json::to_string(v).unwrap_or_default()
}

fn json_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "a mapping",
    }
}

fn is_same_or_below(field: &str, root: &str) -> bool {
    field == root
        || field
            .strip_prefix(root)
            .is_some_and(|rest| rest.starts_with('.') || rest.starts_with('['))
}

fn decode_strict<T: DeserializeOwned>(value: &Value) -> Result<T, ValidationErrors> {
    serde_path_to_error::deserialize::<_, T>(value).map_err(|e| {
        let (field, message, _) = describe_error(e);
        ValidationErrors::one(field, message)
    })
}

/// Decodes, and on an error records it, removes the offending field and tries again, so one
/// pass reports every bad field. `None` when decoding cannot go on.
fn decode_lenient<T: DeserializeOwned>(
    mut value: Value,
    errs: &mut ValidationErrors,
    removed: &mut Vec<String>,
) -> Option<T> {
    for _ in 0..MAX_DECODE_PASSES {
        match serde_path_to_error::deserialize::<_, T>(&value) {
            Ok(t) => return Some(t),
            Err(e) => {
                let (field, message, segments) = describe_error(e);
                let removable = remove_at(&mut value, &segments);
                errs.push(field.clone(), message);
                if !removable {
                    return None;
                }
                removed.push(field);
            }
        }
    }
    None
}

/// One step of the path to a bad value.
#[derive(Debug, Clone)]
enum Segment {
    Key(String),
    Index(usize),
}

/// Turns a path-tracked serde error into (field path, message, segments of the value to drop).
fn describe_error(
    e: serde_path_to_error::Error<serde_json::Error>,
) -> (String, String, Vec<Segment>) {
    let mut segments: Vec<Segment> = e
        .path()
        .iter()
        .filter_map(|s| match s {
            serde_path_to_error::Segment::Seq { index } => Some(Segment::Index(*index)),
            serde_path_to_error::Segment::Map { key } => Some(Segment::Key(key.clone())),
            _ => None,
        })
        .collect();
    let message = e.into_inner().to_string();
    // serde names unknown and missing fields in the message; make them part of the path so the
    // user sees where the field is, and so an unknown one can be dropped.
    let message = if let Some(name) = backticked(&message, "unknown field `") {
        if !matches!(segments.last(), Some(Segment::Key(k)) if *k == name) {
            segments.push(Segment::Key(name));
        }
        let expected = message
            .split_once(", expected ")
            .map(|(_, rest)| format!(" (expected {rest})"))
            .unwrap_or_default();
        format!("unknown field{expected}")
    } else if let Some(name) = backticked(&message, "missing field `") {
        segments.push(Segment::Key(name));
        "required".to_string()
    } else if let Some(name) = backticked(&message, "unknown variant `") {
        let expected = message
            .split_once(", expected ")
            .map(|(_, rest)| format!(" (expected {rest})"))
            .unwrap_or_default();
        format!("{name:?} is not a valid value{expected}")
    } else {
        plain_type_message(message)
    };
    (render_path(&segments), message, segments)
}

/// Says serde's type mismatches in the words of YAML, not of Rust.
fn plain_type_message(message: String) -> String {
    let message = message.replacen("invalid type: map,", "invalid type: mapping,", 1);
    if let Some(found) = message.strip_suffix(", expected string or map") {
        // Every enum here is a set of plain names; "or map" would only confuse.
        format!("{found}, expected a string")
    } else if message == "invalid value: map, expected map with a single key" {
        "invalid type: mapping, expected a string".to_string()
    } else if let Some(found) = message.strip_suffix(", expected a map") {
        format!("{found}, expected a mapping")
    } else if let Some((found, _)) = message.split_once(", expected struct ") {
        format!("{found}, expected a mapping")
    } else {
        message
    }
}

fn backticked(message: &str, prefix: &str) -> Option<String> {
    let rest = message.strip_prefix(prefix)?;
    rest.split_once('`').map(|(name, _)| name.to_string())
}

fn render_path(segments: &[Segment]) -> String {
    let mut out = String::new();
    for s in segments {
        match s {
            Segment::Key(k) => {
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(k);
            }
            Segment::Index(i) => out.push_str(&format!("[{i}]")),
        }
    }
    out
}

/// Removes the value at `segments` so decoding can go on past it. A bad list element takes its
/// whole list with it (removing one element would shift the indices of later errors). Returns
/// false when nothing could be removed.
fn remove_at(value: &mut Value, segments: &[Segment]) -> bool {
    let last_key = segments.iter().rposition(|s| matches!(s, Segment::Key(_)));
    let Some(last_key) = last_key else {
        return false;
    };
    let mut cursor = value;
    for s in &segments[..last_key] {
        cursor = match (s, cursor) {
            (Segment::Key(k), Value::Object(m)) => match m.get_mut(k) {
                Some(v) => v,
                None => return false,
            },
            (Segment::Index(i), Value::Array(a)) => match a.get_mut(*i) {
                Some(v) => v,
                None => return false,
            },
            _ => return false,
        };
    }
    match (&segments[last_key], cursor) {
        (Segment::Key(k), Value::Object(m)) => m.remove(k).is_some(),
        _ => false,
    }
}
