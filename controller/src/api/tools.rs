//! `.../projects/NAME/tools/...`: the workspace tools endpoint over HTTP. The tools answer in
//! their own terms ([`ToolError`]); this is where each failure gets its status code and reason.

use hyper::body::Incoming;
use hyper::{Method, Request, StatusCode};

use super::error::ApiError;
use super::routes::{Outcome, Query, json_response, success};
use super::{ApiState, Caller, access, body};
use crate::tools::{self, Reason, Reply, Tool, ToolCall, ToolError};

/// Members only; `rest` is what follows `tools` in the path.
pub(super) async fn route(
    state: &ApiState,
    caller: &Caller,
    method: &Method,
    name: &str,
    rest: &[&str],
    query: &Query,
    req: Request<Incoming>,
) -> Outcome {
    let project = access::member_project(state, caller, name)?;
    tools::check_uid(&project, query.get("uid")).map_err(api_error)?;
    let Some(tools) = &state.tools else {
        return Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "Unreachable",
            "this daemon runs no workspace tools",
        ));
    };
    let (parts, incoming) = req.into_parts();
    let bytes = body::read(incoming, &parts.headers, tools::MAX_REQUEST_BYTES).await?;
    let answer = match (rest, method) {
        ([], &Method::GET) => tools.capabilities(&project).await.map(Reply::Output),
        (["instructions"], &Method::GET) => tools.instructions(&project).await.map(Reply::Output),
        (["executions", id], &Method::DELETE) => {
            let message = tools.cancel(&project, id).map_err(api_error)?;
            return Ok(success(message));
        }
        ([tool], &Method::POST) => {
            let call = Tool::parse(tool).and_then(|tool| ToolCall::parse(tool, &bytes));
            match call {
                Ok(call) => {
                    let answer = tools.call(&project, call).await;
                    // A tool call is activity: the workspace is in use, whatever its outcome.
                    state.inspector.activity.record(project.uid(), "tool");
                    answer
                }
                Err(err) => Err(err),
            }
        }
        _ => {
            return Err(ApiError::new(
                StatusCode::METHOD_NOT_ALLOWED,
                "MethodNotAllowed",
                format!("{method} is not supported on tools/{}", rest.join("/")),
            ));
        }
    };
    match answer.map_err(api_error)? {
        Reply::Output(output) => Ok(json_response(StatusCode::OK, &output)),
        Reply::Answered { code, body } => Ok(json_response(
            StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
            &body,
        )),
    }
}

/// The status code and reason each tool failure is answered with.
fn api_error(err: ToolError) -> ApiError {
    let (code, reason) = match err.reason {
        Reason::BadRequest => (StatusCode::BAD_REQUEST, "BadRequest"),
        Reason::Unsupported => (StatusCode::BAD_REQUEST, "Unsupported"),
        Reason::OutsideWorkspace => (StatusCode::FORBIDDEN, "OutsideWorkspace"),
        Reason::NotFound => (StatusCode::NOT_FOUND, "NotFound"),
        Reason::Conflict => (StatusCode::CONFLICT, "Conflict"),
        Reason::AlreadyExists => (StatusCode::CONFLICT, "AlreadyExists"),
        Reason::Invalid => (StatusCode::UNPROCESSABLE_ENTITY, "Invalid"),
        Reason::Cancelled => (StatusCode::CONFLICT, "Cancelled"),
        Reason::Timeout => (StatusCode::REQUEST_TIMEOUT, "Timeout"),
        Reason::OutcomeUnknown => (StatusCode::CONFLICT, "REMOTE_MUTATION_OUTCOME_UNKNOWN"),
        Reason::ShellMismatch => (StatusCode::PRECONDITION_FAILED, "ShellMismatch"),
        Reason::Unreachable => (StatusCode::SERVICE_UNAVAILABLE, "Unreachable"),
        Reason::NameConflict => (StatusCode::CONFLICT, "NameConflict"),
        Reason::ProjectReplaced => (StatusCode::CONFLICT, "ProjectReplaced"),
        Reason::Unavailable => (StatusCode::SERVICE_UNAVAILABLE, "ServiceUnavailable"),
        Reason::Internal => (StatusCode::INTERNAL_SERVER_ERROR, "InternalError"),
    };
    ApiError::new(code, reason, err.message)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tool_failures_keep_their_codes_and_reasons() {
        for (reason, code, name) in [
            (Reason::Unsupported, 400, "Unsupported"),
            (Reason::OutsideWorkspace, 403, "OutsideWorkspace"),
            (Reason::Timeout, 408, "Timeout"),
            (Reason::Cancelled, 409, "Cancelled"),
            (
                Reason::OutcomeUnknown,
                409,
                "REMOTE_MUTATION_OUTCOME_UNKNOWN",
            ),
            (Reason::ShellMismatch, 412, "ShellMismatch"),
            (Reason::Unreachable, 503, "Unreachable"),
            (Reason::NameConflict, 409, "NameConflict"),
            (Reason::ProjectReplaced, 409, "ProjectReplaced"),
        ] {
            let err = api_error(ToolError::new(reason, "why"));
            assert_eq!((err.code.as_u16(), err.reason), (code, name));
            assert_eq!(err.message, "why");
        }
    }
}
