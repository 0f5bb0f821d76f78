//! `berth exec -i/-t`: a member's command with its streams connected, over a websocket.
//!
//! `GET .../projects/NAME/exec?command=sh&command=-c&command=...&tty=true&width=80&height=24`
//! (also `cwd=`, repeatable `env=KEY=VALUE`) with `Connection: Upgrade`, `Upgrade: websocket`.
//! Refusals (not a member, bad query, container not running) are ordinary JSON error replies;
//! once the command has started the daemon answers 101 and the websocket carries:
//!
//! - client to daemon: binary messages are stdin; text messages are JSON controls,
//!   `{"resize":{"width":W,"height":H}}` and `{"eof":true}` (stdin ended);
//! - daemon to client: binary messages are output, the first byte naming the stream (1 stdout,
//!   2 stderr; a terminal is all 1) and the rest its bytes; then one text message,
//!   `{"exitCode":N}` or `{"error":"..."}`, and a close.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures::{SinkExt, StreamExt};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::header::{CONNECTION, HeaderValue, SEC_WEBSOCKET_ACCEPT, SEC_WEBSOCKET_KEY, UPGRADE};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::Role;

use super::error::ApiError;
use super::{ApiState, Body, Caller, access};
use crate::inspect::exec::ExecCall;
use crate::runtime::{ExecInput, InteractiveExec, TerminalSize};
use berth_api::wire::{ExecControl, ExecEnd};

/// How long starting the command (and connecting LXD's websockets) may take.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// What the query asks to run.
struct Attach {
    call: ExecCall,
    terminal: Option<TerminalSize>,
}

fn parse_query(query: Option<&str>) -> Result<Attach, ApiError> {
    let mut command = Vec::new();
    let mut environment = BTreeMap::new();
    let mut cwd = None;
    let mut tty = false;
    let (mut width, mut height) = (80u16, 24u16);
    let number = |key: &str, value: &str| {
        value.parse::<u16>().ok().filter(|n| *n > 0).ok_or_else(|| {
            ApiError::bad_request(format!("{key}: {value:?} is not a positive number"))
        })
    };
    for (key, value) in url::form_urlencoded::parse(query.unwrap_or_default().as_bytes()) {
        match key.as_ref() {
            "command" => command.push(value.into_owned()),
            "cwd" => cwd = Some(value.into_owned()),
            "env" => {
                let Some((k, v)) = value.split_once('=') else {
                    return Err(ApiError::bad_request(format!(
                        "env: {value:?} is not KEY=VALUE"
                    )));
                };
                environment.insert(k.to_string(), v.to_string());
            }
            "tty" => {
                tty = match value.as_ref() {
                    "true" | "1" | "" => true,
                    "false" | "0" => false,
                    other => {
                        return Err(ApiError::bad_request(format!(
                            "tty: {other:?} is not true or false"
                        )));
                    }
                }
            }
            "width" => width = number("width", &value)?,
            "height" => height = number("height", &value)?,
            other => {
                return Err(ApiError::bad_request(format!(
                    "{other}: not a parameter of exec"
                )));
            }
        }
    }
    Ok(Attach {
        call: ExecCall {
            command,
            environment,
            cwd,
            timeout_seconds: Some(START_TIMEOUT.as_secs()),
        },
        terminal: tty.then_some(TerminalSize { width, height }),
    })
}

/// Starts a member's command and answers 101; the websocket then carries its streams.
pub(super) async fn attach(
    state: &Arc<ApiState>,
    caller: &Caller,
    name: &str,
    req: Request<Incoming>,
) -> Result<Response<Body>, ApiError> {
    let project = access::member_project(state, caller, name)?;
    let Some(key) = websocket_key(&req) else {
        return Err(ApiError::bad_request(
            "GET exec needs a websocket upgrade (Upgrade: websocket, Sec-WebSocket-Key); \
             use POST for a command that runs to completion",
        ));
    };
    let attach = parse_query(req.uri().query())?;
    let request = super::containers::exec_request(state, &project, &attach.call)?;
    tracing::info!(project = name, caller = %caller.identity, tty = attach.terminal.is_some(), "exec (interactive)");
    // A person acts in the project for as long as the session is open, whatever the command's
    // outcome: held until the relay ends (or the start fails), and its end recorded too.
    let (session, session_open) = state
        .inspector
        .exec_interactive(&project, &request, attach.terminal)
        .await?;
    let project_name = name.to_string();
    // The session lasts while its caller may still exec here: removing the user, or their
    // membership, ends it within `watch::RECHECK`.
    let holder = super::watch::Holder::of(state, caller);
    let (state, caller) = (Arc::clone(state), caller.clone());
    tokio::spawn(async move {
        let _session_open = session_open;
        match hyper::upgrade::on(req).await {
            Ok(upgraded) => {
                let socket =
                    WebSocketStream::from_raw_socket(TokioIo::new(upgraded), Role::Server, None)
                        .await;
                let revoked = holder.revoked(&state, || {
                    access::member_project(&state, &caller, &project_name).is_ok()
                });
                relay(socket, session, revoked).await;
            }
            Err(e) => {
                tracing::warn!(project = project_name, error = %e, "exec upgrade failed");
            }
        }
    });
    switching_protocols(&key)
}

/// The `Sec-WebSocket-Key` of a request asking for a websocket upgrade; `None` for any other.
pub(super) fn websocket_key(req: &Request<Incoming>) -> Option<HeaderValue> {
    let upgrade = req
        .headers()
        .get(UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("websocket"));
    upgrade
        .then(|| req.headers().get(SEC_WEBSOCKET_KEY).cloned())
        .flatten()
}

/// The 101 that accepts the websocket of `key`.
pub(super) fn switching_protocols(key: &HeaderValue) -> Result<Response<Body>, ApiError> {
    let accept = tokio_tungstenite::tungstenite::handshake::derive_accept_key(key.as_bytes());
    let mut response = Response::new(
        http_body_util::Empty::new()
            .map_err(|never| match never {})
            .boxed(),
    );
    *response.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    let headers = response.headers_mut();
    headers.insert(CONNECTION, HeaderValue::from_static("Upgrade"));
    headers.insert(UPGRADE, HeaderValue::from_static("websocket"));
    headers.insert(
        SEC_WEBSOCKET_ACCEPT,
        HeaderValue::from_str(&accept).map_err(|e| ApiError::internal(e.to_string()))?,
    );
    Ok(response)
}

/// Pipes the client's websocket to the session until the process exits, then reports its exit;
/// or until `revoked`, when the session is dropped (which hangs it up) and the client told.
async fn relay<S>(
    socket: WebSocketStream<S>,
    session: InteractiveExec,
    revoked: impl Future<Output = ()>,
) where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let InteractiveExec {
        input,
        mut output,
        exit,
    } = session;
    let (mut sink, mut stream) = socket.split();
    let from_client = async {
        while let Some(Ok(message)) = stream.next().await {
            let forwarded = match message {
                Message::Binary(bytes) => input.send(ExecInput::Data(bytes.to_vec())).await,
                Message::Text(text) => match serde_json::from_str::<ExecControl>(text.as_str()) {
                    Ok(ExecControl {
                        resize: Some(size), ..
                    }) => {
                        input
                            .send(ExecInput::Resize(TerminalSize {
                                width: size.width,
                                height: size.height,
                            }))
                            .await
                    }
                    Ok(ExecControl { eof: true, .. }) => input.send(ExecInput::Eof).await,
                    Ok(_) => Ok(()),
                    Err(e) => {
                        tracing::debug!(error = %e, "ignoring an unknown exec control message");
                        Ok(())
                    }
                },
                Message::Close(_) => return,
                _ => Ok(()),
            };
            if forwarded.is_err() {
                // The process has ended; its last output and exit code are on their way.
                std::future::pending::<()>().await;
            }
        }
        // The client went away: dropping the session ends it (a shell is hung up).
    };
    let to_client = async {
        while let Some(chunk) = output.recv().await {
            let mut frame = Vec::with_capacity(chunk.data.len() + 1);
            frame.push(chunk.fd);
            frame.extend_from_slice(&chunk.data);
            if sink.send(Message::binary(frame)).await.is_err() {
                return false;
            }
        }
        true
    };
    let connected = tokio::select! {
        connected = to_client => Some(connected),
        () = from_client => Some(false),
        () = revoked => None,
    };
    let Some(connected) = connected else {
        drop((input, output, exit));
        let revoked = ExecEnd::failed("access to this project was revoked");
        let _ = sink.send(end_message(&revoked)).await;
        let _ = sink.close().await;
        return;
    };
    if !connected {
        return;
    }
    let last = match exit.await {
        Ok(Ok(code)) => ExecEnd::exited(code),
        Ok(Err(e)) => ExecEnd::failed(e.to_string()),
        Err(_) => ExecEnd::failed("the exec session ended without an exit code"),
    };
    let _ = sink.send(end_message(&last)).await;
    let _ = sink.close().await;
}

fn end_message(end: &ExecEnd) -> Message {
    Message::text(serde_json::to_string(end).unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_query_names_the_command_and_terminal() {
        let attach = parse_query(Some(
            "command=sh&command=-c&command=echo+a&tty=true&width=100&env=A%3Db",
        ))
        .unwrap();
        assert_eq!(attach.call.command, ["sh", "-c", "echo a"]);
        assert_eq!(attach.call.environment["A"], "b");
        assert_eq!(
            attach.terminal,
            Some(TerminalSize {
                width: 100,
                height: 24
            })
        );
        assert!(parse_query(Some("command=ls")).unwrap().terminal.is_none());
    }

    #[test]
    fn bad_parameters_are_named() {
        for (query, field) in [
            ("width=0", "width"),
            ("tty=maybe", "tty"),
            ("env=novalue", "env"),
            ("colour=red", "colour"),
        ] {
            let err = parse_query(Some(query)).err().expect(query);
            assert!(err.message.starts_with(field), "{query}: {}", err.message);
        }
    }
}
