//! Request bodies: read with a size limit enforced while reading, decoded as JSON or YAML by
//! Content-Type.

use bytes::Bytes;
use http_body_util::{BodyExt, Limited};
use hyper::header::{CONTENT_LENGTH, CONTENT_TYPE, HeaderMap};
use serde_json::Value;

use super::error::ApiError;

/// One object: create, replace, patch, status.
pub const OBJECT_LIMIT: usize = 3 << 20;
/// A `List` for the apply endpoint.
pub const APPLY_LIMIT: usize = 32 << 20;

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
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Err(ApiError::bad_request("the request body is empty"));
    }
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
        _ => decode_json(bytes).or_else(|_| decode_yaml(bytes)),
    }
}

fn decode_json(bytes: &[u8]) -> Result<Value, ApiError> {
    serde_json::from_slice(bytes)
        .map_err(|err| ApiError::bad_request(format!("the request body is not valid JSON: {err}")))
}

/// Aliases are bounded before anything is built (`berth_api::yaml`): a few kilobytes of them
/// would otherwise expand to gigabytes here.
fn decode_yaml(bytes: &[u8]) -> Result<Value, ApiError> {
    use berth_api::yaml::{self, YamlError};
    yaml::from_slice(bytes).map_err(|err| match err {
        YamlError::Syntax(err) => {
            ApiError::bad_request(format!("the request body is not valid YAML: {err}"))
        }
        err @ YamlError::TooLarge { limit, .. } => {
            ApiError::too_large_because(limit, err.to_string())
        }
        err @ YamlError::TooDeep { .. } => ApiError::bad_request(err.to_string()),
    })
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
