//! Responses: JSON bodies, `Success` statuses, `Warning` headers, plain text; and `blocking`,
//! a store call moved off the async workers.

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::header::{CONTENT_TYPE, HeaderValue, WARNING};
use hyper::{Response, StatusCode};
use serde::Serialize;
use serde_json::{Value, json};

use super::Body;
use super::error::ApiError;

pub(super) fn json_response(code: StatusCode, value: &Value) -> Response<Body> {
    serialized(code, value)
}

/// 200 with a `Success` Status saying what was done, as Kubernetes answers a delete of a
/// thing that is not an object.
pub(super) fn success(message: impl Into<String>) -> Response<Body> {
    let message = message.into();
    serialized(
        StatusCode::OK,
        &json!({
            "kind": "Status", "apiVersion": "v1", "status": "Success", "code": 200,
            "message": message,
        }),
    )
}

/// `response` with each warning as a `Warning: 299 - "..."` header (RFC 7234), as Kubernetes
/// answers admission warnings; a client prints them and carries on.
pub(super) fn warned(mut response: Response<Body>, warnings: &[String]) -> Response<Body> {
    for warning in warnings {
        let quoted = warning.replace('\\', "\\\\").replace('"', "\\\"");
        if let Ok(value) = HeaderValue::from_str(&format!("299 - \"{quoted}\"")) {
            response.headers_mut().append(WARNING, value);
        }
    }
    response
}

pub(super) fn serialized<T: Serialize + ?Sized>(code: StatusCode, value: &T) -> Response<Body> {
    match serde_json::to_vec(value) {
        Ok(mut bytes) => {
            bytes.push(b'\n');
            bytes_response(code, "application/json", Bytes::from(bytes))
        }
        Err(err) => {
            let err = ApiError::internal(format!("encoding the response: {err}"));
            let bytes = serde_json::to_vec(&err.to_value()).unwrap_or_default();
            bytes_response(err.code, "application/json", Bytes::from(bytes))
        }
    }
}

pub fn text(code: StatusCode, body: &str) -> Response<Body> {
    bytes_response(
        code,
        "text/plain; charset=utf-8",
        Bytes::from(body.to_string()),
    )
}

pub(super) fn bytes_response(
    code: StatusCode,
    content_type: &'static str,
    bytes: Bytes,
) -> Response<Body> {
    let mut response = Response::new(Full::new(bytes).boxed());
    *response.status_mut() = code;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}

/// Store writes hold a lock and wait on the disk; keep them off the async workers.
pub(super) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, ApiError> {
    crate::store::blocking(f)
        .await
        .map_err(|err| ApiError::internal(err.to_string()))
}
