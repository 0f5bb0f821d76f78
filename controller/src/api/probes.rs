//! The routes outside the API prefix: liveness, readiness, the version and `/metrics`.

use hyper::body::Incoming;
use hyper::header::{CONTENT_TYPE, HeaderValue};
use hyper::{Request, Response, StatusCode};
use serde_json::json;

use super::error::ApiError;
use super::routes::{Outcome, json_response, text};
use super::{ApiState, Body};

/// `/healthz`, `/livez`: the process answers.
pub(super) fn live() -> Response<Body> {
    text(StatusCode::OK, "ok\n")
}

/// `/readyz`: the store is writable and every readiness check passes.
pub(super) fn ready(state: &ApiState) -> Response<Body> {
    let mut failures = Vec::new();
    if let Err(err) = state.store.check_writable() {
        failures.push(format!("store: {err}"));
    }
    for (name, check) in &state.readiness {
        if let Err(reason) = check() {
            failures.push(format!("{name}: {reason}"));
        }
    }
    if failures.is_empty() {
        text(StatusCode::OK, "ok\n")
    } else {
        text(
            StatusCode::SERVICE_UNAVAILABLE,
            &format!("{}\n", failures.join("\n")),
        )
    }
}

/// `/version`.
pub(super) fn version() -> Response<Body> {
    json_response(
        StatusCode::OK,
        &json!({"version": env!("CARGO_PKG_VERSION"), "gitCommit": option_env!("BERTH_GIT_COMMIT")}),
    )
}

/// `/metrics`: OpenMetrics for scrapers that ask for it (Prometheus does), the classic text
/// format for everything else, as Prometheus's own client libraries do.
pub(super) fn metrics(state: &ApiState, req: &Request<Incoming>) -> Outcome {
    let Some(render) = &state.metrics else {
        return Err(ApiError::not_found("this daemon serves no metrics"));
    };
    let openmetrics = req
        .headers()
        .get(hyper::header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|accept| accept.contains("application/openmetrics-text"));
    let (body, content_type) = if openmetrics {
        (
            render(),
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )
    } else {
        (
            crate::metrics::to_prometheus_text(&render()),
            "text/plain; version=0.0.4; charset=utf-8",
        )
    };
    let mut response = text(StatusCode::OK, &body);
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    Ok(response)
}
