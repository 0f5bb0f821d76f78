//! Request bodies: read with a size limit enforced while reading, decoded as JSON or YAML by
//! Content-Type.
//!
//! Decoding charges an estimate of each decoded part's memory against `DECODED_LIMIT` and
//! counts an apply's items against `APPLY_ITEMS`, refusing as it goes rather than after.

use bytes::Bytes;
use http_body_util::{BodyExt, Limited};
use hyper::header::{CONTENT_LENGTH, CONTENT_TYPE, HeaderMap};
use serde::de::{self, DeserializeSeed, MapAccess, SeqAccess, Visitor};
use serde_json::Value;
use std::cell::Cell;

use super::error::ApiError;

pub use berth_api::wire::{APPLY_ITEMS, APPLY_LIMIT, OBJECT_LIMIT};
/// The most memory, as estimated while decoding, that one request body may decode to. Text of
/// a few bytes (`{"a":1}`) decodes to hundreds, so the decoded size is bounded as it is built,
/// not inferred from the length of the text.
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
    decode_bounded(bytes, media, &Bounds::object())
}

/// The items of a `List` for the apply endpoint, refused while decoding once there are more
/// than [`APPLY_ITEMS`] of them or they decode to more than [`DECODED_LIMIT`].
pub fn decode_list(bytes: &[u8], media: Option<&str>) -> Result<Vec<Value>, ApiError> {
    let value = decode_bounded(bytes, media, &Bounds::list())?;
    match value {
        Value::Object(mut list) if list.get("kind").and_then(Value::as_str) == Some("List") => {
            match list.remove("items") {
                Some(Value::Array(items)) => Ok(items),
                None | Some(Value::Null) => Ok(Vec::new()),
                Some(_) => Err(ApiError::invalid(
                    Some("List"),
                    None,
                    vec![super::error::Cause::new("items", "must be a list")],
                )),
            }
        }
        _ => Err(ApiError::bad_request(
            "the apply endpoint takes {apiVersion: v1, kind: List, items: [...]}",
        )),
    }
}

fn decode_bounded(bytes: &[u8], media: Option<&str>, bounds: &Bounds) -> Result<Value, ApiError> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Err(ApiError::bad_request("the request body is empty"));
    }
    let decoded = decode_as(bytes, media, bounds);
    // A bound reached is the answer, whatever error the decoder made of it.
    match bounds.exceeded.get() {
        Some(Exceeded::Items) => Err(ApiError::too_large_because(
            APPLY_LIMIT,
            format!(
                "items: the List holds more than {APPLY_ITEMS} items, the most one apply takes; \
                 send it in parts"
            ),
        )),
        Some(Exceeded::Memory) => Err(ApiError::too_large_because(
            DECODED_LIMIT,
            format!(
                "the request body decodes to more than {} MiB of objects; send less at once",
                DECODED_LIMIT >> 20
            ),
        )),
        None => decoded,
    }
}

fn decode_as(bytes: &[u8], media: Option<&str>, bounds: &Bounds) -> Result<Value, ApiError> {
    let decode_json = |bytes| decode_json(bytes, bounds);
    let decode_yaml = |bytes| decode_yaml(bytes, bounds);
    match media {
        Some(m) if m.ends_with("json") => decode_json(bytes),
        Some(m) if m.ends_with("yaml") => decode_yaml(bytes),
        // curl sends form-urlencoded for `-d`; like an absent type, it is guessed.
        Some(other)
            if !matches!(
                other,
                "text/plain" | "application/octet-stream" | "application/x-www-form-urlencoded"
            ) =>
        {
            Err(ApiError::new(
                hyper::StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "UnsupportedMediaType",
                format!("Content-Type {other:?} is not supported; send JSON or YAML"),
            ))
        }
        _ => decode_json(bytes).or_else(|err| match bounds.exceeded.get() {
            Some(_) => Err(err),
            None => decode_yaml(bytes),
        }),
    }
}

fn decode_json(bytes: &[u8], bounds: &Bounds) -> Result<Value, ApiError> {
    let mut decoder = serde_json::Deserializer::from_slice(bytes);
    Node::top(bounds)
        .deserialize(&mut decoder)
        .and_then(|value| decoder.end().map(|()| value))
        .map_err(|err| ApiError::bad_request(format!("the request body is not valid JSON: {err}")))
}

/// Aliases are bounded before anything is built (`berth_api::yaml`): a few kilobytes of them
/// would otherwise expand to gigabytes here.
fn decode_yaml(bytes: &[u8], bounds: &Bounds) -> Result<Value, ApiError> {
    use berth_api::yaml::{self, YamlError};
    yaml::from_slice_seed(bytes, Node::top(bounds)).map_err(|err| match err {
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
}

/// What one body may decode to, charged as it is decoded.
struct Bounds {
    /// The items of the top-level `items` list still allowed; `None` for a single object.
    items: Option<Cell<usize>>,
    /// Estimated bytes still allowed.
    memory: Cell<usize>,
    exceeded: Cell<Option<Exceeded>>,
}

/// Estimated heap costs, close to what `serde_json::Value` (a `BTreeMap` for objects) holds:
/// a value is 32 bytes and may sit in a vector up to twice its length; a map allocates a node
/// of eleven entries on its first key; a string holds its bytes.
const VALUE_COST: usize = 2 * std::mem::size_of::<Value>();
const MAP_NODE_COST: usize = 640;
const ENTRY_COST: usize = 64;

impl Bounds {
    fn object() -> Bounds {
        Bounds {
            items: None,
            memory: Cell::new(DECODED_LIMIT),
            exceeded: Cell::new(None),
        }
    }

    fn list() -> Bounds {
        Bounds {
            items: Some(Cell::new(APPLY_ITEMS)),
            ..Bounds::object()
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

    fn take_item<E: de::Error>(&self) -> Result<(), E> {
        match &self.items {
            Some(left) if left.get() == 0 => self.exceed(Exceeded::Items),
            Some(left) => {
                left.set(left.get() - 1);
                Ok(())
            }
            None => Ok(()),
        }
    }

    fn exceed<E: de::Error>(&self, what: Exceeded) -> Result<(), E> {
        self.exceeded.set(Some(what));
        Err(E::custom("the request body exceeds a limit"))
    }
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
struct Node<'b> {
    bounds: &'b Bounds,
    place: Place,
}

impl<'b> Node<'b> {
    fn top(bounds: &'b Bounds) -> Self {
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
}

impl<'de> DeserializeSeed<'de> for Node<'_> {
    type Value = Value;

    fn deserialize<D: de::Deserializer<'de>>(self, decoder: D) -> Result<Value, D::Error> {
        decoder.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Node<'_> {
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
        let mut values = Vec::new();
        loop {
            self.bounds.charge(VALUE_COST)?;
            let Some(value) = seq.next_element_seed(self.inside(Place::Inside))? else {
                break;
            };
            if self.place == Place::Items {
                self.bounds.take_item()?;
            }
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

    #[test]
    fn a_list_holds_at_most_the_item_limit() {
        let full = list_of(APPLY_ITEMS);
        assert_eq!(
            decode_list(full.as_bytes(), None).unwrap().len(),
            APPLY_ITEMS
        );
        let over = list_of(APPLY_ITEMS + 1);
        for media in [None, Some("application/json"), Some("application/yaml")] {
            let err = decode_list(over.as_bytes(), media).unwrap_err();
            assert_eq!(err.code.as_u16(), 413, "{media:?}: {}", err.message);
            assert!(err.message.starts_with("items: "), "{}", err.message);
        }
        // A single object may hold a long list of its own.
        let object = format!(r#"{{"kind":"Project","x":{}}}"#, list_of(APPLY_ITEMS + 1));
        assert!(decode(object.as_bytes(), None).is_ok());
        assert_eq!(
            decode_list(b"{\"kind\":\"Project\"}", None)
                .unwrap_err()
                .code
                .as_u16(),
            400
        );
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
