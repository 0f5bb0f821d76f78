//! `POST .../apply`: a list of objects applied in one transaction, optionally as an applyset
//! with prune, each item admitted and size-checked and every failure named by its index.
//!
//! A `List` of 100,000 objects is tens of megabytes of text and several times that decoded, so
//! nothing holds all of it decoded at once: each item is admitted as it is decoded and kept in
//! its compact form ([`Staged`]), a few large applies decode at a time ([`DECODING`]), and the
//! answer is written out as it is sent.

use std::collections::{BTreeMap, HashMap};
use std::convert::Infallible;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::{BodyExt, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::header::{CONTENT_TYPE, HeaderValue};
use hyper::{Request, Response};
use serde_json::Value;
use serde_json::value::RawValue;
use tokio::sync::Semaphore;

use berth_api::Kind;
use berth_api::wire::{ApplyItem, ApplyResult};

use super::access;
use super::admission::Refusal;
use super::body::{self, APPLY_LIMIT, ListItems};
use super::error::{ApiError, Cause};
use super::responses::{blocking, warned};
use super::routes::{Outcome, Query};
use super::writes::PATCH_ATTEMPTS;
use super::{ApiState, Body, Caller};
use crate::runtime::HostCapacity;
use crate::store::{self, AppliedSet, ApplyParams, Desired, Doc, Expected, SetParams};
use crate::store::{StoreError, StoredObject};

/// How many applies decode and admit at once. Each holds up to [`body::DECODED_LIMIT`] of
/// admitted objects until it is written; more callers wait rather than multiply that.
static DECODING: Semaphore = Semaphore::const_new(2);

/// `POST /apis/berth.dev/v1alpha1/apply`: a `List` of objects of any kind, every one admitted
/// before any is written, all written in one transaction.
pub(super) async fn apply_list(
    state: &Arc<ApiState>,
    caller: &Caller,
    req: Request<Incoming>,
    query: &Query,
) -> Outcome {
    let commit = query.commit()?;
    let prune = query.flag("prune")?;
    if prune {
        // Pruning deletes, and deleting is for admins.
        access::require_admin(caller, "prune an applyset")?;
    }
    let applyset = match query.get("applyset") {
        None | Some("") => None,
        Some(name) => {
            berth_api::validate_name(name)
                .map_err(|message| ApiError::bad_request(format!("applyset: {message}")))?;
            state
                .admission
                .check_applyset(access::admitter(caller), name)
                .map_err(|refusal| refusal.into_api_error(Some("List"), None))?;
            Some(name.to_string())
        }
    };
    if prune && applyset.is_none() {
        return Err(ApiError::bad_request(
            "prune needs applyset=NAME: berth prunes only what a named set applied before",
        ));
    }
    let media = body::media_type(req.headers());
    let (parts, incoming) = req.into_parts();
    let bytes = body::read(incoming, &parts.headers, APPLY_LIMIT)
        .await
        .map_err(|err| err.about("List", None))?;
    let _decoding = DECODING
        .acquire()
        .await
        .map_err(|_| ApiError::internal("the apply decoder is closed"))?;
    // Decoding and admitting 100,000 objects takes seconds: off the async workers.
    let admitted = {
        let state = Arc::clone(state);
        let caller = caller.clone();
        let applyset = applyset.clone();
        blocking(move || {
            let admitting = || Admitting::new(&state, &caller, applyset.as_deref());
            body::decode_list(&bytes, media.as_deref(), admitting).and_then(Admitting::finish)
        })
        .await??
    };
    let Admitted { batch, warnings } = admitted;
    // The set is recorded on every object before access is checked (`Staged::desired`): moving
    // an object into a set (whose prune may delete it) is a write of that object, with the same
    // right.
    let batch = Arc::new(Batch {
        staged: batch,
        applyset: applyset.clone(),
    });
    // As for one object: access is decided on each object as read, and the batch is written
    // only while every object is still as read; otherwise all of it is judged again.
    let mut attempts = 0;
    let outcome = loop {
        attempts += 1;
        let (state, caller, batch) = (Arc::clone(state), caller.clone(), Arc::clone(&batch));
        // Judging and writing 100,000 objects takes seconds too.
        let written = blocking(move || {
            let checked = check_batch(&state, &caller, &batch)?;
            let store = &state.store;
            let params = ApplyParams::by(&caller.identity, commit);
            Ok::<_, ApiError>(match &batch.applyset {
                Some(set) => store.apply_set(set, checked, SetParams::from(params).pruning(prune)),
                None => store
                    .apply_batch(checked, params)
                    .map(|applied| AppliedSet {
                        applied,
                        pruned: Vec::new(),
                        conflicts: Vec::new(),
                    }),
            })
        })
        .await??;
        match written {
            Err(failure)
                if matches!(failure.error, StoreError::Moved { .. })
                    && attempts < PATCH_ATTEMPTS => {}
            written => break written?,
        }
    };
    drop(batch);
    Ok(warned(answer(outcome), &warnings))
}

/// An admitted object as an apply keeps it until it is written: its metadata and spec as
/// compact text, a few times smaller than the maps and values it is rebuilt into when needed
/// (about 1 KB an object as values, 400 bytes as text).
struct Staged {
    kind: Kind,
    name: String,
    /// `(labels, annotations, finalizers)`.
    metadata: Box<RawValue>,
    spec: Doc,
}

type Metadata = (
    BTreeMap<String, String>,
    BTreeMap<String, String>,
    Option<Vec<String>>,
);

impl Staged {
    fn new(desired: Desired) -> Self {
        let metadata: Metadata = (desired.labels, desired.annotations, desired.finalizers);
        Staged {
            // Maps of strings always serialize.
            metadata: serde_json::value::to_raw_value(&metadata).expect("metadata serializes"),
            spec: Doc::new(&desired.spec),
            kind: desired.kind,
            name: desired.name,
        }
    }

    /// The object as admitted, recorded in `applyset` when there is one.
    fn desired(&self, applyset: Option<&str>) -> Desired {
        // Written above from this very type.
        let (labels, mut annotations, finalizers): Metadata =
            serde_json::from_str(self.metadata.get()).expect("staged metadata decodes");
        if let Some(set) = applyset {
            annotations.insert(
                berth_api::annotations::APPLYSET.to_string(),
                set.to_string(),
            );
        }
        Desired {
            kind: self.kind,
            name: self.name.clone(),
            labels,
            annotations,
            finalizers,
            spec: self.spec.value(),
        }
    }
}

/// Each object of `batch` with what it must still be when written, once `caller` may write it
/// over what is stored now.
fn check_batch(
    state: &ApiState,
    caller: &Caller,
    batch: &Arc<Batch>,
) -> Result<Vec<Checked>, ApiError> {
    let mut checked = Vec::with_capacity(batch.staged.len());
    for (index, staged) in batch.staged.iter().enumerate() {
        let current = state.store.get(staged.kind, &staged.name);
        let desired = staged.desired(batch.applyset.as_deref());
        access::check_write(state, caller, &desired, current.as_deref())
            .map_err(|err| err.in_item(index))?;
        checked.push(Checked {
            batch: Arc::clone(batch),
            index,
            expected: Expected::of(current.as_deref()),
        });
    }
    Ok(checked)
}

/// What an apply writes, kept until written (a write that finds an object moved is judged
/// again from it).
struct Batch {
    staged: Vec<Staged>,
    applyset: Option<String>,
}

/// One object of the batch as its access was checked, rebuilt only as the store writes it.
struct Checked {
    batch: Arc<Batch>,
    index: usize,
    expected: Expected,
}

impl From<Checked> for store::ApplyItem {
    fn from(checked: Checked) -> Self {
        let batch = &checked.batch;
        let desired = batch.staged[checked.index].desired(batch.applyset.as_deref());
        (desired, checked.expected).into()
    }
}

/// The items of a `List` admitted one by one as they are decoded: refusals that concern one
/// item are gathered (every item is named), one the caller cannot be told about ends it.
struct Admitting<'a> {
    state: &'a ApiState,
    caller: &'a Caller,
    applyset: Option<&'a str>,
    batch: Vec<Staged>,
    seen: HashMap<(Kind, String), usize>,
    causes: Vec<Cause>,
    // A server-owned annotation anywhere makes the batch a bad request (400), not an invalid one.
    server_owned: Vec<Cause>,
    warnings: Vec<String>,
    /// Warnings past [`WARNINGS_SHOWN`], counted.
    more_warnings: usize,
    /// The host's capacity as read when the apply began: every item is warned against the same.
    host: Option<HostCapacity>,
}

/// The most `Warning` headers an apply answers with: 100,000 projects over the host's capacity
/// would otherwise be 100,000 headers.
const WARNINGS_SHOWN: usize = 20;

struct Admitted {
    batch: Vec<Staged>,
    warnings: Vec<String>,
}

impl<'a> Admitting<'a> {
    fn new(state: &'a ApiState, caller: &'a Caller, applyset: Option<&'a str>) -> Self {
        Admitting {
            state,
            caller,
            applyset,
            batch: Vec::new(),
            seen: HashMap::new(),
            causes: Vec::new(),
            server_owned: Vec::new(),
            warnings: Vec::new(),
            more_warnings: 0,
            host: state.admission.host(),
        }
    }

    fn finish(self) -> Result<Admitted, ApiError> {
        if !self.server_owned.is_empty() {
            return Err(Refusal::ServerOwned(self.server_owned).into_api_error(Some("List"), None));
        }
        if !self.causes.is_empty() {
            return Err(ApiError::invalid(Some("List"), None, self.causes));
        }
        let mut warnings = self.warnings;
        if self.more_warnings > 0 {
            warnings.push(format!("and {} more warnings", self.more_warnings));
        }
        Ok(Admitted {
            batch: self.batch,
            warnings,
        })
    }
}

impl ListItems for Admitting<'_> {
    fn take(&mut self, index: usize, item: Value) -> Result<(), ApiError> {
        let state = self.state;
        let admitted = state.admission.admit_into(
            access::admitter(self.caller),
            &item,
            &state.store,
            self.applyset,
        );
        match admitted {
            Ok(admitted) => {
                let desired = admitted.desired;
                let key = (desired.kind, desired.name.clone());
                if let Some(first) = self.seen.insert(key, index) {
                    self.causes.push(Cause::new(
                        format!("items[{index}].metadata.name"),
                        format!("{:?} is also items[{first}]", desired.name),
                    ));
                }
                for warning in state.admission.warnings_against(&desired, self.host) {
                    if self.warnings.len() < WARNINGS_SHOWN {
                        self.warnings.push(warning);
                    } else {
                        self.more_warnings += 1;
                    }
                }
                self.batch.push(Staged::new(desired));
                Ok(())
            }
            Err(refusal @ (Refusal::Forbidden(_) | Refusal::Hidden(..))) => {
                let kind = item.get("kind").and_then(Value::as_str);
                let name = item.pointer("/metadata/name").and_then(Value::as_str);
                Err(refusal.into_api_error(kind, name).in_item(index))
            }
            Err(refusal) => {
                let refusal = refusal.map_causes(|c| {
                    let field = if c.field.is_empty() {
                        format!("items[{index}]")
                    } else {
                        format!("items[{index}].{}", c.field)
                    };
                    Cause::new(field, c.message)
                });
                match refusal {
                    Refusal::Invalid(item_causes) => self.causes.extend(item_causes),
                    Refusal::ServerOwned(item_causes) => self.server_owned.extend(item_causes),
                    other => return Err(other.into_api_error(Some("List"), None)),
                }
                Ok(())
            }
        }
    }
}

/// How many objects of the answer are written into one piece of the body.
const ANSWER_CHUNK: usize = 1000;

/// The `ApplyResult`, written a piece at a time as the connection takes it: for 100,000 objects
/// it is tens of megabytes, which need not exist at once.
fn answer(outcome: AppliedSet) -> Response<Body> {
    let items: Vec<(Arc<StoredObject>, &'static str)> = outcome
        .applied
        .into_iter()
        .map(|(object, action)| (object, action.as_str()))
        .chain(
            outcome
                .pruned
                .iter()
                .map(|deletion| (Arc::clone(deletion.object()), "pruned")),
        )
        .collect();
    let head = answer_head();
    let count = items.len();
    let pieces = (0..count).step_by(ANSWER_CHUNK).map(move |start| {
        let mut piece = Vec::new();
        for (index, (object, action)) in items.iter().enumerate().skip(start).take(ANSWER_CHUNK) {
            if index > 0 {
                piece.push(b',');
            }
            let item = ApplyItem {
                kind: object.kind.to_string(),
                name: object.name().to_string(),
                action: action.to_string(),
                object: &**object,
            };
            // A stored object always serializes: its maps have string keys.
            serde_json::to_writer(&mut piece, &item).expect("a stored object serializes");
        }
        Bytes::from(piece)
    });
    let frames = std::iter::once(head)
        .chain(pieces)
        .chain(std::iter::once(Bytes::from_static(b"]}\n")))
        .map(|bytes| Ok::<_, Infallible>(Frame::data(bytes)));
    let mut response = Response::new(StreamBody::new(futures::stream::iter(frames)).boxed());
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

/// `{"apiVersion":...,"kind":"ApplyResult","items":[`: the answer up to its first item, as
/// `ApplyResult` serializes it.
fn answer_head() -> Bytes {
    let empty: ApplyResult<()> = ApplyResult::new(Vec::new());
    let mut head = serde_json::to_vec(&empty).expect("an empty ApplyResult serializes");
    // `...,"items":[]}` without its last two bytes.
    head.truncate(head.len() - 2);
    Bytes::from(head)
}
