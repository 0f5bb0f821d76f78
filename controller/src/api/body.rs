//! Request bodies: read with a size limit enforced while reading, decoded as JSON or YAML by
//! Content-Type.
//!
//! Decoding charges an estimate of each decoded part's memory against `DECODED_LIMIT` and
//! counts an apply's items against `APPLY_ITEMS`, refusing as it goes rather than after. An
//! apply's `items` are decoded one at a time and handed on as each is complete, so a `List`
//! never exists decoded all at once: each item is bounded like one object sent alone, and what
//! the caller keeps of them is charged at their compact size.

use bytes::Bytes;
use http_body_util::{BodyExt, Limited};
use hyper::header::{CONTENT_LENGTH, CONTENT_TYPE, HeaderMap};
use serde::de::{self, DeserializeSeed, MapAccess, SeqAccess, Visitor};
use serde_json::Value;
use std::cell::{Cell, RefCell};

use super::error::{ApiError, Cause};

pub use berth_api::wire::{APPLY_ITEMS, APPLY_LIMIT, OBJECT_LIMIT};
/// The most memory, as estimated while decoding, that one request body may decode to. Text of
/// a few bytes (`{"a":1}`) decodes to hundreds, so the decoded size is bounded as it is built,
/// not inferred from the length of the text. An apply's items are bounded each by it and, at
/// their compact size, all together.
pub const DECODED_LIMIT: usize = 96 << 20;

/// How long a client may take to send a whole body once its headers arrived; a client trickling
/// bytes would otherwise hold its connection (and the handler) indefinitely.
pub const BODY_DEADLINE: std::time::Duration = std::time::Duration::from_secs(60);

pub const APPLY_PATCH: &str = "application/apply-patch+yaml";
pub const MERGE_PATCH: &str = "application/merge-patch+json";

/// The media type of the request, lowercased and without parameters.
pub fn media_type(headers: &HeaderMap) -> Option<String> {
    let value = headers.get(CONTENT_TYPE)?.to_str().ok()?;
    let media = value.split(';').next()?.trim().to_ascii_lowercase();
    (!media.is_empty()).then_some(media)
}

pub async fn read<B>(body: B, headers: &HeaderMap, limit: usize) -> Result<Bytes, ApiError>
where
    B: hyper::body::Body,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let declared = headers
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|length| length > limit as u64) {
        return Err(ApiError::too_large(limit));
    }
    let collected =
        match tokio::time::timeout(BODY_DEADLINE, Limited::new(body, limit).collect()).await {
            Ok(collected) => collected,
            Err(_) => {
                return Err(ApiError::new(
                    hyper::StatusCode::REQUEST_TIMEOUT,
                    "Timeout",
                    format!(
                        "the request body did not arrive within {} s",
                        BODY_DEADLINE.as_secs()
                    ),
                ));
            }
        };
    match collected {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(err) if err.is::<http_body_util::LengthLimitError>() => Err(ApiError::too_large(limit)),
        Err(err) => Err(ApiError::bad_request(format!(
            "reading the request body: {err}"
        ))),
    }
}

/// Decodes a body as JSON or YAML. Without a Content-Type, JSON is tried first, as YAML would
/// also accept it but report errors less precisely.
pub fn decode(bytes: &[u8], media: Option<&str>) -> Result<Value, ApiError> {
    decode_as(bytes, media, |format| {
        let bounds = Bounds::new(DECODED_LIMIT, None);
        let decoded = decode_in(format, bytes, Node::top(&bounds));
        bounds.verdict(decoded)
    })
}

/// What the apply endpoint does with each item of a `List`, as soon as it is decoded.
pub trait ListItems {
    /// Takes `items[index]`. An error ends the decoding and is the answer to the request.
    fn take(&mut self, index: usize, item: Value) -> Result<(), ApiError>;
}

/// Decodes a `List` for the apply endpoint, handing each of its items to a sink made by `sink`
/// as soon as the item is decoded; the sink of the attempt that succeeded is returned (a body
/// without Content-Type may be tried as JSON, then as YAML, each with a fresh sink).
///
/// Refused while decoding: more than [`APPLY_ITEMS`] items, an item over [`OBJECT_LIMIT`] or
/// decoding to more than [`DECODED_LIMIT`], and items adding up to more than [`DECODED_LIMIT`]
/// at their compact size.
pub fn decode_list<S: ListItems>(
    bytes: &[u8],
    media: Option<&str>,
    sink: impl Fn() -> S,
) -> Result<S, ApiError> {
    decode_list_within(bytes, media, sink, DECODED_LIMIT)
}

/// [`decode_list`] with `limit` in place of [`DECODED_LIMIT`].
fn decode_list_within<S: ListItems>(
    bytes: &[u8],
    media: Option<&str>,
    sink: impl Fn() -> S,
    limit: usize,
) -> Result<S, ApiError> {
    decode_as(bytes, media, |format| {
        let mut items = sink();
        let mut take = |index: usize, item: Value| items.take(index, item);
        let bounds = Bounds::new(limit, Some(&mut take));
        let decoded = decode_in(format, bytes, Node::top(&bounds));
        let list = bounds.verdict(decoded)?;
        drop(bounds);
        match list {
            // The items went to the sink as they came: an `items` list decodes to `[]` here.
            Value::Object(list) if list.get("kind").and_then(Value::as_str) == Some("List") => {
                match list.get("items") {
                    None | Some(Value::Null | Value::Array(_)) => Ok(items),
                    Some(_) => Err(Failure::Refused(ApiError::invalid(
                        Some("List"),
                        None,
                        vec![Cause::new("items", "must be a list")],
                    ))),
                }
            }
            _ => Err(Failure::Refused(ApiError::bad_request(
                "the apply endpoint takes {apiVersion: v1, kind: List, items: [...]}",
            ))),
        }
    })
}

#[derive(Clone, Copy)]
enum Format {
    Json,
    Yaml,
}

/// Why one attempt at decoding failed: text that is not of the format tried (another may be
/// tried), or a refusal that is the answer.
enum Failure {
    NotJson(ApiError),
    Refused(ApiError),
}

impl Failure {
    fn into_error(self) -> ApiError {
        match self {
            Failure::NotJson(err) | Failure::Refused(err) => err,
        }
    }
}

/// Runs `attempt` in the body's format: the Content-Type's, or without one JSON and then, if
/// the text is not JSON, YAML.
fn decode_as<T>(
    bytes: &[u8],
    media: Option<&str>,
    attempt: impl Fn(Format) -> Result<T, Failure>,
) -> Result<T, ApiError> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Err(ApiError::bad_request("the request body is empty"));
    }
    let format = match media {
        Some(m) if m.ends_with("json") => Some(Format::Json),
        Some(m) if m.ends_with("yaml") => Some(Format::Yaml),
        // curl sends form-urlencoded for `-d`; like an absent type, it is guessed.
        Some(other)
            if !matches!(
                other,
                "text/plain" | "application/octet-stream" | "application/x-www-form-urlencoded"
            ) =>
        {
            return Err(ApiError::new(
                hyper::StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "UnsupportedMediaType",
                format!("Content-Type {other:?} is not supported; send JSON or YAML"),
            ));
        }
        _ => None,
    };
    let decoded = match format {
        Some(format) => attempt(format),
        None => match attempt(Format::Json) {
            Err(Failure::NotJson(_)) => attempt(Format::Yaml),
            decoded => decoded,
        },
    };
    decoded.map_err(Failure::into_error)
}

fn decode_in<'b>(format: Format, bytes: &[u8], node: Node<'b, '_>) -> Result<Value, Failure> {
    match format {
        Format::Json => {
            let mut decoder = serde_json::Deserializer::from_slice(bytes);
            node.deserialize(&mut decoder)
                .and_then(|value| decoder.end().map(|()| value))
                .map_err(|err| {
                    Failure::NotJson(ApiError::bad_request(format!(
                        "the request body is not valid JSON: {err}"
                    )))
                })
        }
        Format::Yaml => decode_yaml(bytes, node).map_err(Failure::Refused),
    }
}

/// Aliases are bounded before anything is built (`berth_api::yaml`): a few kilobytes of them
/// would otherwise expand to gigabytes here.
fn decode_yaml(bytes: &[u8], node: Node<'_, '_>) -> Result<Value, ApiError> {
    use berth_api::yaml::{self, YamlError};
    yaml::from_slice_seed(bytes, node).map_err(|err| match err {
        YamlError::Syntax(err) => {
            ApiError::bad_request(format!("the request body is not valid YAML: {err}"))
        }
        err @ YamlError::TooLarge { limit, .. } => {
            ApiError::too_large_because(limit, err.to_string())
        }
        err @ YamlError::TooDeep { .. } => ApiError::bad_request(err.to_string()),
    })
}

/// Which bound a decode reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Exceeded {
    Items,
    Memory,
    /// `items[i]` alone decodes to more than [`DECODED_LIMIT`].
    ItemMemory(usize),
}

/// Where decoded items go, one at a time.
type Sink<'s> = &'s mut dyn FnMut(usize, Value) -> Result<(), ApiError>;

/// What one body may decode to, charged as it is decoded.
struct Bounds<'s> {
    /// The estimated bytes allowed in all.
    limit: usize,
    /// Estimated bytes still allowed.
    memory: Cell<usize>,
    exceeded: Cell<Option<Exceeded>>,
    /// Where the top-level `items` go, for a `List`; `None` for a single object.
    sink: Option<RefCell<Sink<'s>>>,
    /// How many items were taken.
    taken: Cell<usize>,
    /// Whether the top-level `items` key was read: the items of a second one would be applied
    /// too, where a decoded map would have kept only the last.
    items_read: Cell<bool>,
    /// Why an item was refused: the answer, whatever error the decoder made of it.
    refused: RefCell<Option<ApiError>>,
}

/// Estimated heap costs, close to what `serde_json::Value` (a `BTreeMap` for objects) holds:
/// a value is 32 bytes and may sit in a vector up to twice its length; a map allocates a node
/// of eleven entries on its first key; a string holds its bytes.
const VALUE_COST: usize = 2 * std::mem::size_of::<Value>();
const MAP_NODE_COST: usize = 640;
const ENTRY_COST: usize = 64;

impl<'s> Bounds<'s> {
    fn new(limit: usize, sink: Option<Sink<'s>>) -> Self {
        Bounds {
            limit,
            memory: Cell::new(limit),
            exceeded: Cell::new(None),
            sink: sink.map(RefCell::new),
            taken: Cell::new(0),
            items_read: Cell::new(false),
            refused: RefCell::new(None),
        }
    }

    /// `decoded` unless a bound was reached or an item refused, which is then the answer.
    fn verdict(&self, decoded: Result<Value, Failure>) -> Result<Value, Failure> {
        if let Some(refused) = self.refused.take() {
            return Err(Failure::Refused(refused));
        }
        let too_large = |limit, message: String| {
            Err(Failure::Refused(ApiError::too_large_because(
                limit, message,
            )))
        };
        match self.exceeded.get() {
            Some(Exceeded::Items) => too_large(
                APPLY_LIMIT,
                format!(
                    "items: the List holds more than {APPLY_ITEMS} items, the most one apply takes; \
                 send it in parts"
                ),
            ),
            Some(Exceeded::Memory) => too_large(
                self.limit,
                format!(
                    "the request body decodes to more than {} MiB of objects; send less at once",
                    self.limit >> 20
                ),
            ),
            Some(Exceeded::ItemMemory(index)) => too_large(
                self.limit,
                format!(
                    "items[{index}]: the object decodes to more than {} MiB",
                    self.limit >> 20
                ),
            ),
            None => decoded,
        }
    }

    fn charge<E: de::Error>(&self, bytes: usize) -> Result<(), E> {
        match self.memory.get().checked_sub(bytes) {
            Some(left) => {
                self.memory.set(left);
                Ok(())
            }
            None => self.exceed(Exceeded::Memory),
        }
    }

    fn exceed<E: de::Error>(&self, what: Exceeded) -> Result<(), E> {
        self.exceeded.set(Some(what));
        Err(E::custom("the request body exceeds a limit"))
    }

    /// Hands `items[index]` to the sink: counted against [`APPLY_ITEMS`], checked against
    /// [`OBJECT_LIMIT`], and charged at its compact size, which is about what is kept of it.
    fn take<E: de::Error>(&self, sink: &RefCell<Sink<'s>>, item: Value) -> Result<(), E> {
        let index = self.taken.get();
        if index == APPLY_ITEMS {
            return self.exceed(Exceeded::Items);
        }
        self.taken.set(index + 1);
        let size = compact_size(&item);
        if size > OBJECT_LIMIT {
            return self.refuse(object_too_large(index, &item, size));
        }
        self.charge(size)?;
        let taken = (sink.borrow_mut())(index, item);
        taken.or_else(|refused| self.refuse(refused))
    }

    fn refuse<E: de::Error>(&self, refused: ApiError) -> Result<(), E> {
        *self.refused.borrow_mut() = Some(refused);
        Err(E::custom("an item was refused"))
    }
}

/// The length of `value` written as compact JSON.
fn compact_size(value: &Value) -> usize {
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
    let _ = serde_json::to_writer(&mut size, value);
    size.0
}

/// One object of a batch may hold no more than one object sent alone.
fn object_too_large(index: usize, item: &Value, size: usize) -> ApiError {
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
    ApiError::too_large_because(
        OBJECT_LIMIT,
        format!(
            "items[{index}]: {subject} is {:.1} MiB, over the limit of {} MiB for one object",
            size as f64 / f64::from(1u32 << 20),
            OBJECT_LIMIT >> 20
        ),
    )
    .with_object(kind, name)
}

/// Where a value sits: the document itself, the `items` of the top-level object, or anywhere
/// else.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Place {
    Top,
    Items,
    Inside,
}

/// Decodes one value into a `serde_json::Value`, charging [`Bounds`] before each part is
/// kept, so decoding stops at the bound rather than after building everything.
struct Node<'b, 's> {
    bounds: &'b Bounds<'s>,
    place: Place,
}

impl<'b, 's> Node<'b, 's> {
    fn top(bounds: &'b Bounds<'s>) -> Self {
        Node {
            bounds,
            place: Place::Top,
        }
    }

    fn inside(&self, place: Place) -> Self {
        Node {
            bounds: self.bounds,
            place,
        }
    }

    fn string<E: de::Error>(&self, s: String) -> Result<Value, E> {
        self.bounds.charge(s.len())?;
        Ok(Value::String(s))
    }

    /// The `items` of a `List`, each decoded under bounds of its own (one object's) and handed
    /// to the sink before the next is read.
    fn items<'de, A: SeqAccess<'de>>(
        &self,
        sink: &RefCell<Sink<'s>>,
        mut seq: A,
    ) -> Result<Value, A::Error> {
        loop {
            let bounds = Bounds::new(self.bounds.limit, None);
            let item = seq.next_element_seed(Node {
                bounds: &bounds,
                place: Place::Inside,
            });
            if bounds.exceeded.get().is_some() {
                let index = self.bounds.taken.get();
                return self
                    .bounds
                    .exceed(Exceeded::ItemMemory(index))
                    .map(|()| Value::Null);
            }
            let Some(item) = item? else {
                return Ok(Value::Array(Vec::new()));
            };
            self.bounds.take(sink, item)?;
        }
    }
}

impl<'de> DeserializeSeed<'de> for Node<'_, '_> {
    type Value = Value;

    fn deserialize<D: de::Deserializer<'de>>(self, decoder: D) -> Result<Value, D::Error> {
        decoder.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Node<'_, '_> {
    type Value = Value;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Value, E> {
        Ok(serde_json::Number::from_f64(v).map_or(Value::Null, Value::Number))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Value, E> {
        self.string(v.to_owned())
    }

    fn visit_string<E: de::Error>(self, v: String) -> Result<Value, E> {
        self.string(v)
    }

    fn visit_none<E: de::Error>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_unit<E: de::Error>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_some<D: de::Deserializer<'de>>(self, decoder: D) -> Result<Value, D::Error> {
        self.deserialize(decoder)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        if self.place == Place::Items
            && let Some(sink) = &self.bounds.sink
        {
            return self.items(sink, seq);
        }
        let mut values = Vec::new();
        loop {
            self.bounds.charge(VALUE_COST)?;
            let Some(value) = seq.next_element_seed(self.inside(Place::Inside))? else {
                break;
            };
            values.push(value);
        }
        Ok(Value::Array(values))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut object = serde_json::Map::new();
        while let Some(key) = map.next_key::<String>()? {
            let cost = if object.is_empty() { MAP_NODE_COST } else { 0 };
            self.bounds.charge(cost + ENTRY_COST + key.len())?;
            let place = if self.place == Place::Top && key == "items" {
                if self.bounds.sink.is_some() && self.bounds.items_read.replace(true) {
                    let twice = ApiError::bad_request("items: the List gives its items twice");
                    self.bounds.refuse(twice)?;
                }
                Place::Items
            } else {
                Place::Inside
            };
            let value = map.next_value_seed(self.inside(place))?;
            object.insert(key, value);
        }
        Ok(Value::Object(object))
    }
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;

    use futures::StreamExt;
    use hyper::body::Frame;
    use serde_json::json;

    use super::*;

    /// A body that sends `prefix` and then nothing, forever.
    fn trickle(prefix: &'static [u8]) -> impl hyper::body::Body<Data = Bytes, Error = Infallible> {
        let first = futures::stream::iter([Ok(Frame::data(Bytes::from_static(prefix)))]);
        http_body_util::StreamBody::new(first.chain(futures::stream::pending()))
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_that_stops_arriving_is_answered_408_at_the_deadline() {
        let started = tokio::time::Instant::now();
        let err = read(trickle(b"{\"kind\":"), &HeaderMap::new(), OBJECT_LIMIT)
            .await
            .unwrap_err();
        assert_eq!(err.code.as_u16(), 408, "{}", err.message);
        assert_eq!(started.elapsed(), BODY_DEADLINE);
        // A body that arrives whole is read as before.
        let whole = http_body_util::Full::new(Bytes::from_static(b"{}"));
        assert_eq!(
            &read(whole, &HeaderMap::new(), OBJECT_LIMIT).await.unwrap()[..],
            b"{}"
        );
    }

    fn list_of(count: usize) -> String {
        let items = vec![r#"{"kind":"Project"}"#; count].join(",");
        format!(r#"{{"kind":"List","items":[{items}]}}"#)
    }

    /// A sink that keeps its items and logs every index it is given, across attempts; it
    /// refuses `items[refuse_at]`.
    #[derive(Debug)]
    struct Kept<'a> {
        log: &'a RefCell<Vec<usize>>,
        items: Vec<Value>,
        refuse_at: Option<usize>,
    }

    impl ListItems for Kept<'_> {
        fn take(&mut self, index: usize, item: Value) -> Result<(), ApiError> {
            self.log.borrow_mut().push(index);
            if self.refuse_at == Some(index) {
                return Err(ApiError::forbidden(format!("items[{index}]: refused")));
            }
            self.items.push(item);
            Ok(())
        }
    }

    fn keep<'a>(log: &'a RefCell<Vec<usize>>, refuse_at: Option<usize>) -> impl Fn() -> Kept<'a> {
        move || Kept {
            log,
            items: Vec::new(),
            refuse_at,
        }
    }

    /// The same `List` as JSON and as YAML (a flow sequence of the JSON items).
    fn both(items: &[String]) -> [(String, &'static str); 2] {
        let items = items.join(",");
        [
            (
                format!(r#"{{"kind":"List","items":[{items}]}}"#),
                "application/json",
            ),
            (
                format!("kind: List\nitems: [{items}]\n"),
                "application/yaml",
            ),
        ]
    }

    #[test]
    fn a_list_holds_at_most_the_item_limit() {
        let log = RefCell::new(Vec::new());
        let full = list_of(APPLY_ITEMS);
        let kept = decode_list(full.as_bytes(), None, keep(&log, None)).unwrap();
        assert_eq!(kept.items.len(), APPLY_ITEMS);
        let over = list_of(APPLY_ITEMS + 1);
        for media in [None, Some("application/json"), Some("application/yaml")] {
            log.borrow_mut().clear();
            let err = decode_list(over.as_bytes(), media, keep(&log, None)).unwrap_err();
            assert_eq!(err.code.as_u16(), 413, "{media:?}: {}", err.message);
            assert!(err.message.starts_with("items: "), "{}", err.message);
            // Refused at the first item too many, the ones before it handed on one by one.
            assert_eq!(log.borrow().len(), APPLY_ITEMS, "{media:?}");
        }
        // A single object may hold a long list of its own.
        let object = format!(r#"{{"kind":"Project","x":{}}}"#, list_of(APPLY_ITEMS + 1));
        assert!(decode(object.as_bytes(), None).is_ok());
    }

    #[test]
    fn a_list_is_a_list_of_items_in_any_order_of_its_fields() {
        let log = RefCell::new(Vec::new());
        let decoded = |body: &str| decode_list(body.as_bytes(), None, keep(&log, None));
        let kept = decoded(r#"{"items":[{"a":1},{"b":2}],"kind":"List"}"#).unwrap();
        assert_eq!(kept.items, [json!({"a": 1}), json!({"b": 2})]);
        assert!(decoded(r#"{"kind":"List"}"#).unwrap().items.is_empty());
        assert!(decoded("kind: List\nitems:\n").unwrap().items.is_empty());
        for (body, code, says) in [
            (r#"{"kind":"Project"}"#, 400, "the apply endpoint takes"),
            (
                r#"{"kind":"List","items":{"a":1}}"#,
                422,
                "items: must be a list",
            ),
            ("[1, 2]", 400, "the apply endpoint takes"),
            (
                r#"{"kind":"List","items":[],"items":[]}"#,
                400,
                "items twice",
            ),
        ] {
            let err = decoded(body).unwrap_err();
            assert_eq!(err.code.as_u16(), code, "{body}: {}", err.message);
            assert!(err.message.contains(says), "{body}: {}", err.message);
        }
    }

    #[test]
    fn each_item_is_bounded_alone_and_what_is_kept_of_them_all_together() {
        let limit = 1 << 20;
        let log = RefCell::new(Vec::new());
        // Three maps an item: about 2 KiB each decoded, 19 bytes of compact text. Two thousand
        // decode to four times the limit, but never at once, and keep 38 KB.
        let nested = r#"{"a":{"b":{"c":1}}}"#.to_string();
        // One item decoding past the limit alone: maps of seven bytes of text each.
        let dense = format!(
            "[{}]",
            vec![r#"{"a":1}"#; limit / MAP_NODE_COST + 1].join(",")
        );
        // Items of 10 KiB of text each: 120 of them keep more than the limit.
        let long = format!(r#"{{"a":"{}"}}"#, "x".repeat(10 << 10));
        for (body, media) in both(&vec![nested.clone(); 2000]) {
            let kept =
                decode_list_within(body.as_bytes(), Some(media), keep(&log, None), limit).unwrap();
            assert_eq!(kept.items.len(), 2000, "{media}");
        }
        let items = [nested.clone(), nested.clone(), dense, nested];
        for (body, media) in both(&items) {
            log.borrow_mut().clear();
            let err = decode_list_within(body.as_bytes(), Some(media), keep(&log, None), limit)
                .unwrap_err();
            assert_eq!(err.code.as_u16(), 413, "{media}: {}", err.message);
            assert_eq!(
                err.message, "items[2]: the object decodes to more than 1 MiB",
                "{media}"
            );
            assert_eq!(*log.borrow(), [0, 1], "{media}");
        }
        for (body, media) in both(&vec![long; 120]) {
            log.borrow_mut().clear();
            let err = decode_list_within(body.as_bytes(), Some(media), keep(&log, None), limit)
                .unwrap_err();
            assert_eq!(err.code.as_u16(), 413, "{media}: {}", err.message);
            assert!(
                err.message.contains("more than 1 MiB of objects"),
                "{}",
                err.message
            );
            // Refused at the item that would pass the limit, not after reading them all.
            assert_eq!(log.borrow().len(), limit / (10 << 10), "{media}");
        }
    }

    #[test]
    fn an_item_larger_than_one_object_is_refused_by_its_index() {
        let log = RefCell::new(Vec::new());
        let big = format!(
            r#"{{"kind":"Project","metadata":{{"name":"big"}},"spec":{{"brief":"{}"}}}}"#,
            "x".repeat(OBJECT_LIMIT)
        );
        let items = [r#"{"kind":"Project"}"#.to_string(), big];
        for (body, media) in both(&items) {
            log.borrow_mut().clear();
            let err = decode_list(body.as_bytes(), Some(media), keep(&log, None)).unwrap_err();
            assert_eq!(err.code.as_u16(), 413, "{media}: {}", err.message);
            assert!(
                err.message
                    .starts_with("items[1]: Project \"big\" is 3.0 MiB"),
                "{media}: {}",
                err.message
            );
            assert_eq!(*log.borrow(), [0], "{media}");
        }
    }

    #[test]
    fn a_refused_item_ends_the_decoding_and_is_the_answer() {
        let log = RefCell::new(Vec::new());
        let items = vec![r#"{"a":1}"#.to_string(); 5];
        let [(json, _), (yaml, _)] = both(&items);
        for (body, media) in [
            (&json, Some("application/json")),
            (&json, None),
            (&yaml, Some("application/yaml")),
            (&yaml, None),
        ] {
            log.borrow_mut().clear();
            let err = decode_list(body.as_bytes(), media, keep(&log, Some(2))).unwrap_err();
            assert_eq!(err.code.as_u16(), 403, "{media:?}: {}", err.message);
            assert_eq!(err.message, "items[2]: refused", "{media:?}");
            // Nothing after it is read, and a refusal is not a reason to try YAML.
            let seen = *log.borrow() == [0, 1, 2] || (media.is_none() && body == &yaml);
            assert!(seen, "{media:?}: {:?}", log.borrow());
        }
    }

    #[test]
    fn a_list_read_as_yaml_after_json_failed_starts_afresh() {
        let log = RefCell::new(Vec::new());
        // Valid JSON up to a comment, which only YAML takes: both items were handed to the
        // JSON attempt's sink before the text failed as JSON.
        let body = b"{\"kind\":\"List\",\"items\":[{\"a\":1},{\"b\":2}]} # a comment\n";
        let kept = decode_list(body, None, keep(&log, None)).unwrap();
        assert_eq!(kept.items, [json!({"a": 1}), json!({"b": 2})]);
        assert_eq!(*log.borrow(), [0, 1, 0, 1]);
    }

    #[test]
    fn what_a_body_decodes_to_is_bounded_while_decoding() {
        // Seven bytes of text per object, hundreds of bytes once decoded.
        let count = DECODED_LIMIT / MAP_NODE_COST + 1;
        let dense = format!("[{}]", vec![r#"{"a":1}"#; count].join(","));
        let err = decode(dense.as_bytes(), Some("application/json")).unwrap_err();
        assert_eq!(err.code.as_u16(), 413, "{}", err.message);
        assert!(err.message.contains("MiB of objects"), "{}", err.message);
        let err = decode(dense.as_bytes(), None).unwrap_err();
        assert_eq!(err.code.as_u16(), 413, "{}", err.message);
        // The same values, decoded, equal what serde_json builds.
        let small = br#"{"a":[1,-2,3.5,"x",null,true,{"b":{}}],"c":"d"}"#;
        let expected: Value = serde_json::from_slice(small).unwrap();
        assert_eq!(decode(small, Some("application/json")).unwrap(), expected);
        assert_eq!(decode(small, Some("application/yaml")).unwrap(), expected);
    }

    #[test]
    fn decodes_by_media_type() {
        let yaml = b"kind: Project\nmetadata:\n  name: a\n";
        assert_eq!(
            decode(yaml, Some(APPLY_PATCH)).unwrap()["metadata"]["name"],
            "a"
        );
        assert_eq!(decode(yaml, None).unwrap()["kind"], "Project");
        assert_eq!(
            decode(br#"{"kind":"Project"}"#, Some("application/json")).unwrap()["kind"],
            "Project"
        );
        let err = decode(b"kind: [", Some("application/yaml")).unwrap_err();
        assert!(err.message.contains("line"), "{}", err.message);
        assert_eq!(
            decode(b"{}", Some("image/png")).unwrap_err().code.as_u16(),
            415
        );
        assert_eq!(decode(b"  ", None).unwrap_err().code.as_u16(), 400);
    }
}
