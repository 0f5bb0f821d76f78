//! `POST .../apply`: a list of objects applied in one transaction, optionally as an applyset
//! with prune, each item admitted and size-checked and every failure named by its index.

use std::collections::HashMap;
use std::sync::Arc;

use hyper::body::Incoming;
use hyper::{Request, StatusCode};
use serde_json::Value;

use berth_api::Kind;
use berth_api::wire::{ApplyItem, ApplyResult};

use super::access;
use super::admission::Refusal;
use super::body::{self, APPLY_LIMIT, OBJECT_LIMIT};
use super::error::{ApiError, Cause};
use super::responses::{blocking, serialized, warned};
use super::routes::{Outcome, Query};
use super::writes::PATCH_ATTEMPTS;
use super::{ApiState, Caller};
use crate::store::{AppliedSet, ApplyParams, Expected, SetParams, StoredObject};

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
    let items = body::decode_list(&bytes, media.as_deref())?;
    drop(bytes);
    for (index, item) in items.iter().enumerate() {
        check_object_size(index, item)?;
    }
    let mut causes = Vec::new();
    // A server-owned annotation anywhere makes the batch a bad request (400), not an invalid one.
    let mut server_owned = Vec::new();
    let mut batch = Vec::with_capacity(items.len());
    let mut warnings = Vec::new();
    let mut seen: HashMap<(Kind, String), usize> = HashMap::with_capacity(items.len());
    for (index, item) in items.iter().enumerate() {
        match state.admission.admit_into(
            access::admitter(caller),
            item,
            &state.store,
            applyset.as_deref(),
        ) {
            Ok(admitted) => {
                let key = (admitted.desired.kind, admitted.desired.name.clone());
                if let Some(first) = seen.insert(key, index) {
                    causes.push(Cause::new(
                        format!("items[{index}].metadata.name"),
                        format!("{:?} is also items[{first}]", admitted.desired.name),
                    ));
                }
                warnings.extend(state.admission.warnings(&admitted.desired));
                batch.push(admitted.desired);
            }
            Err(refusal @ (Refusal::Forbidden(_) | Refusal::Hidden(..))) => {
                let kind = item.get("kind").and_then(Value::as_str);
                let name = item.pointer("/metadata/name").and_then(Value::as_str);
                return Err(refusal.into_api_error(kind, name).in_item(index));
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
                    Refusal::Invalid(item_causes) => causes.extend(item_causes),
                    Refusal::ServerOwned(item_causes) => server_owned.extend(item_causes),
                    other => return Err(other.into_api_error(Some("List"), None)),
                }
            }
        }
    }
    drop(items);
    if !server_owned.is_empty() {
        return Err(Refusal::ServerOwned(server_owned).into_api_error(Some("List"), None));
    }
    if !causes.is_empty() {
        return Err(ApiError::invalid(Some("List"), None, causes));
    }
    // The set is recorded on every object before access is checked: moving an object into a
    // set (whose prune may delete it) is a write of that object, with the same right.
    if let Some(set) = &applyset {
        for desired in &mut batch {
            desired
                .annotations
                .insert(berth_api::annotations::APPLYSET.to_string(), set.clone());
        }
    }
    // As for one object: access is decided on each object as read, and the batch is written
    // only while every object is still as read; otherwise all of it is judged again.
    let mut attempts = 0;
    let outcome = loop {
        attempts += 1;
        let mut checked = Vec::with_capacity(batch.len());
        for (index, desired) in batch.iter().enumerate() {
            let current = state.store.get(desired.kind, &desired.name);
            access::check_write(state, caller, desired, current.as_deref())
                .map_err(|err| err.in_item(index))?;
            checked.push((desired.clone(), Expected::of(current.as_deref())));
        }
        let store = Arc::clone(&state.store);
        let creator = caller.identity.clone();
        let written = match applyset.clone() {
            Some(set) => {
                blocking(move || {
                    let params = SetParams::from(ApplyParams::by(&creator, commit));
                    store.apply_set(&set, checked, params.pruning(prune))
                })
                .await?
            }
            None => blocking(move || store.apply_batch(checked, ApplyParams::by(&creator, commit)))
                .await?
                .map(|applied| AppliedSet {
                    applied,
                    pruned: Vec::new(),
                    conflicts: Vec::new(),
                }),
        };
        match written {
            Err(failure)
                if matches!(failure.error, crate::store::StoreError::Moved { .. })
                    && attempts < PATCH_ATTEMPTS => {}
            written => break written?,
        }
    };
    fn item<'o>(object: &'o StoredObject, action: &str) -> ApplyItem<&'o StoredObject> {
        ApplyItem {
            kind: object.kind.to_string(),
            name: object.name().to_string(),
            action: action.to_string(),
            object,
        }
    }
    let applied = outcome
        .applied
        .iter()
        .map(|(object, action)| item(object, action.as_str()));
    let pruned = outcome
        .pruned
        .iter()
        .map(|deletion| item(deletion.object(), "pruned"));
    let body: ApplyResult<&StoredObject> = ApplyResult::new(applied.chain(pruned).collect());
    Ok(warned(serialized(StatusCode::OK, &body), &warnings))
}

/// One object of a batch may hold no more than one object sent alone.
pub(super) fn check_object_size(index: usize, item: &Value) -> Result<(), ApiError> {
    struct Counter(usize);
    impl std::io::Write for Counter {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut size = Counter(0);
    // Writing a Value to a counter cannot fail.
    let _ = serde_json::to_writer(&mut size, item);
    if size.0 <= OBJECT_LIMIT {
        return Ok(());
    }
    let kind = item.get("kind").and_then(Value::as_str).unwrap_or_default();
    let name = item
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let subject = match (kind.is_empty(), name.is_empty()) {
        (false, false) => format!("{kind} {name:?}"),
        (false, true) => kind.to_string(),
        _ => "the object".to_string(),
    };
    Err(ApiError::too_large_because(
        OBJECT_LIMIT,
        format!(
            "items[{index}]: {subject} is {:.1} MiB, over the limit of {} MiB for one object",
            size.0 as f64 / f64::from(1u32 << 20),
            OBJECT_LIMIT >> 20
        ),
    )
    .with_object(kind, name))
}
