//! Interactive exec: `POST /1.0/instances/NAME/exec` with `wait-for-websocket`, then the
//! operation's websockets (`/1.0/operations/ID/websocket?secret=...`) carry the process's
//! streams.
//!
//! With a terminal (`interactive: true`) LXD hands out fd `0`, which carries the pseudo terminal
//! both ways, and `control`, which takes window resizes. Without one it hands out `0` (stdin),
//! `1` and `2` (output) and `control`; closing `0` is end of file. LXD starts the process only
//! once every websocket is connected, and the operation ends when the process has exited.

use std::sync::Arc;
use std::time::Duration;

use futures::{SinkExt, StreamExt};
use reqwest::Method;
use serde_json::{Value, json};
use tokio::sync::{mpsc, oneshot};
use tokio_tungstenite::tungstenite::Message;

use crate::runtime::{
    ExecChunk, ExecInput, ExecRequest, InteractiveExec, RuntimeError, TerminalSize,
};

use super::endpoint::Endpoint;
use super::transport::{Transport, error_chain, parse_envelope};

/// How long one wait for the operation's result may take (waits repeat while it runs).
const RESULT_TIMEOUT: Duration = Duration::from_secs(30);
/// How long output may keep arriving after the process has exited.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(2);
/// Chunks buffered each way before the faster side waits.
const CHANNEL_DEPTH: usize = 64;

use super::websocket::Socket;

/// Where the operation websockets are reached.
pub(crate) struct Websockets<'a> {
    pub endpoint: &'a Endpoint,
    pub tls: Option<Arc<rustls::ClientConfig>>,
    pub project: &'a str,
}

/// The body of LXD's exec call running `command` (the request's own, or it wrapped to capture
/// its output) with the request's environment, directory and user; LXD records no output. The
/// caller adds `wait-for-websocket` and `interactive`, which differ between the two ways to exec.
pub(super) fn exec_body(command: &[String], request: &ExecRequest) -> Value {
    let mut body = json!({
        "command": command,
        "environment": request.env,
        "record-output": false,
    });
    if let Some(cwd) = &request.cwd {
        body["cwd"] = json!(cwd);
    }
    if let Some(uid) = request.uid {
        body["user"] = json!(uid);
    }
    if let Some(gid) = request.gid {
        body["group"] = json!(gid);
    }
    body
}

/// Starts the command and connects its websockets; the returned session pipes bytes until the
/// process exits.
pub(crate) async fn start(
    transport: Arc<Transport>,
    websockets: Websockets<'_>,
    name: &str,
    request: &ExecRequest,
    terminal: Option<TerminalSize>,
) -> Result<InteractiveExec, RuntimeError> {
    let what = format!("interactive exec in {name}");
    let mut body = exec_body(&request.command, request);
    body["wait-for-websocket"] = json!(true);
    body["interactive"] = json!(terminal.is_some());
    if let Some(size) = terminal {
        body["width"] = json!(size.width);
        body["height"] = json!(size.height);
        // A terminal without TERM shows no colours and confuses full-screen programs.
        if !request.env.contains_key("TERM") {
            body["environment"]["TERM"] = json!("xterm-256color");
        }
    }
    let path = format!(
        "/1.0/instances/{}/exec",
        percent_encoding::utf8_percent_encode(name, percent_encoding::NON_ALPHANUMERIC)
    );
    let raw = transport
        .call(Method::POST, &path, what.clone())
        .json(body)
        .timeout(request.timeout.min(transport.request_timeout()))
        .send_raw()
        .await?;
    // Errors come back typed; a success is an operation whose metadata has the secrets.
    parse_envelope(&what, &raw)?;
    let envelope: Value = serde_json::from_slice(&raw.body).map_err(|e| protocol(&what, e))?;
    let operation = envelope["metadata"]["id"]
        .as_str()
        .ok_or_else(|| protocol(&what, "exec answered without an operation id"))?
        .to_string();
    let fds = &envelope["metadata"]["metadata"]["fds"];
    let secret = |fd: &str| {
        fds[fd]
            .as_str()
            .map(str::to_string)
            .ok_or_else(|| protocol(&what, format!("exec answered without a secret for fd {fd}")))
    };
    let names: &[&str] = if terminal.is_some() {
        &["0", "control"]
    } else {
        &["0", "1", "2", "control"]
    };
    let mut sockets = Vec::new();
    for fd in names {
        let secret = secret(fd)?;
        let url_path = format!(
            "/1.0/operations/{operation}/websocket?secret={}&project={}",
            encode(&secret),
            encode(websockets.project)
        );
        let connect = super::websocket::connect(
            websockets.endpoint,
            websockets.tls.clone(),
            &url_path,
            "interactive exec",
        );
        let socket = tokio::time::timeout(request.timeout, connect)
            .await
            .map_err(|_| RuntimeError::Timeout {
                what: format!("{what}: connect fd {fd}"),
                after: request.timeout,
            })??;
        sockets.push(socket);
    }
    let (input_tx, input_rx) = mpsc::channel(CHANNEL_DEPTH);
    let (output_tx, output_rx) = mpsc::channel(CHANNEL_DEPTH);
    let (exit_tx, exit_rx) = oneshot::channel();
    tokio::spawn(async move {
        let piped = pipe(sockets, terminal.is_some(), input_rx, output_tx);
        let exited = exit_code(&transport, &operation, &what);
        tokio::pin!(piped, exited);
        // LXD may keep a terminal's websocket open after the process has exited: whichever
        // comes first, the streams' end or the operation's, ends the session.
        let result = tokio::select! {
            piped_result = &mut piped => match piped_result {
                Ok(()) => exited.await,
                Err(e) => Err(e),
            },
            result = &mut exited => {
                // Output still in flight is delivered before the streams are dropped.
                let _ = tokio::time::timeout(DRAIN_TIMEOUT, piped).await;
                result
            }
        };
        let _ = exit_tx.send(result);
    });
    Ok(InteractiveExec {
        input: input_tx,
        output: output_rx,
        exit: exit_rx,
    })
}

/// Moves bytes until every output stream of the process has closed.
async fn pipe(
    sockets: Vec<Socket>,
    terminal: bool,
    mut input: mpsc::Receiver<ExecInput>,
    output: mpsc::Sender<ExecChunk>,
) -> Result<(), RuntimeError> {
    let mut sockets = sockets.into_iter();
    let (stdin, stdin_stream, control, outputs) = if terminal {
        let (Some(fd0), Some(control)) = (sockets.next(), sockets.next()) else {
            return Err(transport_error("interactive exec: missing websockets"));
        };
        // The terminal carries input and output over one websocket.
        let (sink, stream) = fd0.split();
        (sink, None, control, vec![(1u8, stream)])
    } else {
        let (Some(fd0), Some(fd1), Some(fd2), Some(control)) = (
            sockets.next(),
            sockets.next(),
            sockets.next(),
            sockets.next(),
        ) else {
            return Err(transport_error("exec: missing websockets"));
        };
        let (sink, stream) = fd0.split();
        (
            sink,
            Some(stream),
            control,
            vec![(1u8, fd1.split().1), (2u8, fd2.split().1)],
        )
    };
    let (mut control_sink, mut control_stream) = control.split();
    // Read the sockets that carry nothing for us (control, and stdin without a terminal) so
    // that LXD's keepalive pings are answered.
    let drain_control = async {
        let stdin_side = async {
            if let Some(mut stream) = stdin_stream {
                while let Some(Ok(_)) = stream.next().await {}
            }
        };
        let control_side = async { while let Some(Ok(_)) = control_stream.next().await {} };
        futures::join!(stdin_side, control_side);
        std::future::pending::<()>().await;
    };
    let mut stdin = Some(stdin);
    let forward_input = async {
        while let Some(message) = input.recv().await {
            let sent = match message {
                ExecInput::Data(bytes) => match stdin.as_mut() {
                    Some(sink) => sink.send(Message::binary(bytes)).await,
                    None => Ok(()),
                },
                ExecInput::Eof => match stdin.take() {
                    // With a terminal, end of file is the terminal's business (^D); closing
                    // its only websocket would end the session.
                    Some(mut sink) if !terminal => sink.close().await,
                    Some(sink) => {
                        stdin = Some(sink);
                        Ok(())
                    }
                    None => Ok(()),
                },
                ExecInput::Resize(size) => {
                    let resize = json!({
                        "command": "window-resize",
                        "args": {"width": size.width.to_string(), "height": size.height.to_string()},
                    });
                    control_sink.send(Message::text(resize.to_string())).await
                }
            };
            if sent.is_err() {
                // The process is gone; its outputs will say so.
                std::future::pending::<()>().await;
            }
        }
        // The holder dropped the session: closing the websockets hangs up the terminal.
    };
    let forward_outputs = futures::future::join_all(outputs.into_iter().map(|(fd, mut stream)| {
        let output = output.clone();
        async move {
            while let Some(message) = stream.next().await {
                let data = match message {
                    Ok(Message::Binary(bytes)) => bytes.to_vec(),
                    Ok(Message::Text(text)) => text.as_bytes().to_vec(),
                    // Reading on after a close sends the reply LXD waits for.
                    Ok(_) => continue,
                    // LXD drops the connection without a closing handshake when the
                    // process exits; the operation's result says how it ended.
                    Err(e) => {
                        tracing::debug!(fd, error = %error_chain(&e), "exec output stream ended");
                        break;
                    }
                };
                // LXD marks the end of a stream with an empty message, and (with a terminal)
                // finishes the operation only once the connection is closed in answer.
                if data.is_empty() {
                    break;
                }
                if output.send(ExecChunk { fd, data }).await.is_err() {
                    break;
                }
            }
        }
    }));
    tokio::select! {
        _ = forward_outputs => Ok(()),
        () = forward_input => Ok(()),
        () = drain_control => Ok(()),
    }
}

/// The exit code LXD recorded once the process ended, waiting as long as it runs.
async fn exit_code(
    transport: &Transport,
    operation: &str,
    what: &str,
) -> Result<i32, RuntimeError> {
    loop {
        let reply = transport
            .call(
                Method::GET,
                &format!("/1.0/operations/{operation}/wait"),
                what.to_string(),
            )
            .query("timeout", RESULT_TIMEOUT.as_secs().to_string())
            .timeout(RESULT_TIMEOUT + Duration::from_secs(5))
            .send()
            .await?
            .into_metadata();
        if let Some(error) = reply["err"].as_str().filter(|e| !e.is_empty()) {
            return Err(RuntimeError::OperationFailed {
                what: what.to_string(),
                message: error.to_string(),
            });
        }
        // 103 is Running: the wait timed out while the process still runs.
        if reply["status_code"].as_i64() == Some(103) {
            continue;
        }
        return reply["metadata"]["return"]
            .as_i64()
            .map(|code| i32::try_from(code).unwrap_or(-1))
            .ok_or_else(|| protocol(what, "exec finished without an exit code"));
    }
}

fn encode(value: &str) -> String {
    percent_encoding::utf8_percent_encode(value, percent_encoding::NON_ALPHANUMERIC).to_string()
}

fn transport_error(message: &str) -> RuntimeError {
    RuntimeError::Transport {
        what: "interactive exec".to_string(),
        message: message.to_string(),
    }
}

fn protocol(what: &str, message: impl std::fmt::Display) -> RuntimeError {
    RuntimeError::Protocol {
        what: what.to_string(),
        message: message.to_string(),
    }
}
