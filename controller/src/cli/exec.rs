//! `berth exec NAME -- CMD...`: runs a command in a project's container (in /workspace, with the
//! project's environment and secrets), prints its output and exits with its exit code.
//!
//! With `-i` (stdin) or `-t` (a terminal) the command's streams stay connected: the connection
//! to the server is upgraded to a websocket (the protocol is described in
//! `api/attach.rs`), the local terminal is put in raw mode while the session lasts, and
//! window size changes follow it.

use std::io::Write as _;
use std::process::ExitCode;

use anyhow::{Context as _, bail};
use clap::Args;
use futures::{SinkExt, StreamExt};
use reqwest::{Method, StatusCode};
use tokio::io::AsyncWriteExt;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::{self, Message, client::IntoClientRequest};

use super::Context;
use crate::client::{API_PREFIX, ClientError, Server, encode_segment};
use crate::inspect::exec::{ExecCall, ExecResult};
use berth_api::wire::{ExecControl, ExecEnd, ExecTerminalSize};

/// The API client gives up on a request after 120 s; a command must end before that.
const MAX_TIMEOUT_SECS: u64 = 110;
/// The exit status when berth stopped the command because its output passed the cap: berth's
/// own, as `docker run` answers 125 for its own failures, so a script can tell it from the
/// command's.
pub const OUTPUT_CUT_EXIT: u8 = 125;

#[derive(Debug, Args)]
pub struct ExecArgs {
    /// The project to run in.
    name: String,
    /// Pass stdin to the command.
    #[arg(short = 'i', long = "stdin")]
    stdin: bool,
    /// Run the command in a terminal (with -i, an interactive shell).
    #[arg(short = 't', long = "tty")]
    tty: bool,
    /// Working directory inside the container.
    #[arg(long, default_value = crate::inspect::exec::DEFAULT_CWD)]
    cwd: String,
    /// Extra environment, KEY=VALUE (repeatable).
    #[arg(short = 'e', long = "env", value_name = "KEY=VALUE")]
    env: Vec<String>,
    /// Seconds the command may run (without -i/-t).
    #[arg(long, default_value_t = 100)]
    timeout: u64,
    /// The command and its arguments, after `--`.
    #[arg(last = true, required = true, value_name = "CMD")]
    command: Vec<String>,
}

pub async fn run(context: &Context, args: ExecArgs) -> anyhow::Result<ExitCode> {
    if args.stdin || args.tty {
        return interactive(context, &args).await;
    }
    if args.timeout == 0 || args.timeout > MAX_TIMEOUT_SECS {
        bail!(
            "--timeout: {} is not between 1 and {MAX_TIMEOUT_SECS} seconds",
            args.timeout
        );
    }
    let mut environment = std::collections::BTreeMap::new();
    for pair in &args.env {
        let Some((key, value)) = pair.split_once('=') else {
            bail!("--env: {pair:?} is not KEY=VALUE");
        };
        environment.insert(key.to_string(), value.to_string());
    }
    let call = ExecCall {
        command: args.command,
        environment,
        cwd: Some(args.cwd),
        timeout_seconds: Some(args.timeout),
    };
    let path = format!("{API_PREFIX}/projects/{}/exec", encode_segment(&args.name));
    let body = serde_json::to_vec(&call)?;
    let reply = context
        .client()?
        .request_json(Method::POST, &path, Some(("application/json", body)))
        .await?;
    let result: ExecResult =
        serde_json::from_value(reply).context("reading the server's exec result")?;
    std::io::stdout().write_all(result.stdout.as_bytes())?;
    std::io::stdout().flush()?;
    std::io::stderr().write_all(result.stderr.as_bytes())?;
    if let Some(limit) = result.output_cut_at {
        eprintln!(
            "\nberth: output cut: the command printed more than {limit} bytes on one stream (the cap of berth exec), so berth stopped it; use -i to stream output without a cap"
        );
        return Ok(ExitCode::from(OUTPUT_CUT_EXIT));
    }
    // Exit codes beyond a byte (or negative, for a signal) still mean failure.
    Ok(match u8::try_from(result.exit_code) {
        Ok(code) => ExitCode::from(code),
        Err(_) => ExitCode::FAILURE,
    })
}

/// Runs the command with its streams connected over a websocket; exits with its exit code.
async fn interactive(context: &Context, args: &ExecArgs) -> anyhow::Result<ExitCode> {
    let client = context.client()?;
    // `-it` with input that is not a terminal (a pipe, /dev/null) runs without one, as
    // kubectl does: a terminal would never pass the input's end on, so the command would wait
    // for more forever.
    let input_is_terminal = std::io::IsTerminal::is_terminal(&std::io::stdin());
    let tty = args.tty && (!args.stdin || input_is_terminal);
    if args.tty && !tty {
        eprintln!("warning: input is not a terminal: running without one (-t ignored)");
    }
    let terminal = tty.then(local_terminal_size);
    let mut query = url::form_urlencoded::Serializer::new(String::new());
    for word in &args.command {
        query.append_pair("command", word);
    }
    query.append_pair("cwd", &args.cwd);
    for pair in &args.env {
        if !pair.contains('=') {
            bail!("--env: {pair:?} is not KEY=VALUE");
        }
        query.append_pair("env", pair);
    }
    if let Some((width, height)) = terminal {
        query.append_pair("tty", "true");
        query.append_pair("width", &width.to_string());
        query.append_pair("height", &height.to_string());
    }
    let path = format!(
        "{API_PREFIX}/projects/{}/exec?{}",
        encode_segment(&args.name),
        query.finish()
    );
    let socket = connect(
        client.server(),
        context.global.token.as_deref(),
        context.global.certificate_authority.as_deref(),
        &path,
    )
    .await?;
    // Raw mode only when a person types: piped input stays as it is.
    let _raw = if tty && args.stdin {
        RawMode::enter()?
    } else {
        None
    };
    let (mut sink, mut stream) = socket.split();
    let (input_tx, mut input_rx) = tokio::sync::mpsc::channel::<Option<Vec<u8>>>(16);
    if args.stdin {
        // A plain thread: a blocked read of the terminal must not hold up the runtime's exit.
        std::thread::spawn(move || {
            let mut stdin = std::io::stdin().lock();
            let mut buffer = vec![0u8; 8192];
            loop {
                match std::io::Read::read(&mut stdin, &mut buffer) {
                    Ok(0) | Err(_) => {
                        let _ = input_tx.blocking_send(None);
                        return;
                    }
                    Ok(n) => {
                        if input_tx.blocking_send(Some(buffer[..n].to_vec())).is_err() {
                            return;
                        }
                    }
                }
            }
        });
    } else {
        drop(input_tx);
    }
    let mut resizes = if tty {
        Some(tokio::signal::unix::signal(
            tokio::signal::unix::SignalKind::window_change(),
        )?)
    } else {
        None
    };
    let mut stdout = tokio::io::stdout();
    let mut stderr = tokio::io::stderr();
    let mut input_open = args.stdin;
    loop {
        tokio::select! {
            message = stream.next() => {
                let message = match message {
                    None => bail!("exec: the server closed the session without an exit code"),
                    Some(message) => message.context("exec: reading from the server")?,
                };
                match message {
                    Message::Binary(frame) => {
                        let Some((&fd, data)) = frame.split_first() else { continue };
                        if fd == 2 {
                            stderr.write_all(data).await?;
                            stderr.flush().await?;
                        } else {
                            stdout.write_all(data).await?;
                            stdout.flush().await?;
                        }
                    }
                    Message::Text(text) => {
                        let end: ExecEnd = serde_json::from_str(text.as_str())
                            .context("exec: reading the server's final message")?;
                        if let Some(error) = end.error {
                            bail!("exec: {error}");
                        }
                        let code = end.exit_code.unwrap_or(-1);
                        let _ = sink.close().await;
                        return Ok(match u8::try_from(code) {
                            Ok(code) => ExitCode::from(code),
                            Err(_) => ExitCode::FAILURE,
                        });
                    }
                    Message::Close(_) => bail!("exec: the server closed the session without an exit code"),
                    _ => {}
                }
            }
            chunk = input_rx.recv(), if input_open => {
                let message = match chunk.flatten() {
                    Some(bytes) => Message::binary(bytes),
                    None => {
                        input_open = false;
                        Message::text(control(ExecControl { eof: true, resize: None }))
                    }
                };
                sink.send(message).await.context("exec: writing to the server")?;
            }
            Some(()) = async { match resizes.as_mut() { Some(signal) => signal.recv().await, None => std::future::pending().await } } => {
                let (width, height) = local_terminal_size();
                let resize = ExecControl { resize: Some(ExecTerminalSize { width, height }), eof: false };
                sink.send(Message::text(control(resize))).await.context("exec: writing to the server")?;
            }
        }
    }
}

fn control(control: ExecControl) -> String {
    serde_json::to_string(&control).unwrap_or_default()
}

pub(super) trait Io: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send> Io for T {}

/// Opens the connection and upgrades it; a refusal reads like any other server error.
pub(super) async fn connect(
    server: &Server,
    token: Option<&str>,
    certificate_authority: Option<&std::path::Path>,
    path: &str,
) -> anyhow::Result<WebSocketStream<Box<dyn Io>>> {
    let (url, stream): (String, Box<dyn Io>) = match server {
        Server::Unix(socket) => {
            let stream = tokio::net::UnixStream::connect(socket)
                .await
                .map_err(|e| unreachable(server, &e))?;
            (format!("ws://localhost{path}"), Box::new(stream))
        }
        Server::Http(base) if base.scheme() == "http" => {
            let host = base.host_str().context("--server has no host")?.to_string();
            let port = base.port_or_known_default().unwrap_or(80);
            let stream = tokio::net::TcpStream::connect((host.trim_matches(['[', ']']), port))
                .await
                .map_err(|e| unreachable(server, &e))?;
            let prefix = base.path().trim_end_matches('/');
            (
                format!("ws://{host}:{port}{prefix}{path}"),
                Box::new(stream),
            )
        }
        Server::Http(base) => {
            let host = base.host_str().context("--server has no host")?.to_string();
            let port = base.port_or_known_default().unwrap_or(443);
            let bare = host.trim_matches(['[', ']']).to_string();
            let tcp = tokio::net::TcpStream::connect((bare.as_str(), port))
                .await
                .map_err(|e| unreachable(server, &e))?;
            let name = rustls::pki_types::ServerName::try_from(bare)
                .context("--server: not a valid TLS server name")?;
            let stream = tls_connector(certificate_authority)?
                .connect(name, tcp)
                .await
                .map_err(|e| unreachable(server, &e))?;
            let prefix = base.path().trim_end_matches('/');
            // The stream is TLS already: the websocket handshake itself is plain over it.
            (
                format!("ws://{host}:{port}{prefix}{path}"),
                Box::new(stream),
            )
        }
    };
    let mut request = url
        .into_client_request()
        .context("building the websocket request")?;
    if let Some(token) = token.filter(|t| !t.is_empty()) {
        request.headers_mut().insert(
            reqwest::header::AUTHORIZATION,
            format!("Bearer {token}")
                .parse()
                .context("--token: not a valid header value")?,
        );
    }
    match tokio_tungstenite::client_async(request, stream).await {
        Ok((socket, _response)) => Ok(socket),
        Err(tungstenite::Error::Http(response)) => {
            let code = StatusCode::from_u16(response.status().as_u16())
                .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            let body = response.body().clone().unwrap_or_default();
            Err(ClientError::Api(crate::client::status_of(code, &body)).into())
        }
        Err(e) => Err(anyhow::anyhow!("upgrading the connection: {e}")),
    }
}

/// TLS for an https server, by the API client's one trust policy ([`crate::client::tls_config`]).
fn tls_connector(
    certificate_authority: Option<&std::path::Path>,
) -> anyhow::Result<tokio_rustls::TlsConnector> {
    let pem = certificate_authority
        .map(|path| {
            std::fs::read(path)
                .with_context(|| format!("--certificate-authority {}", path.display()))
        })
        .transpose()?;
    let config = crate::client::tls_config(pem.as_deref())?;
    Ok(tokio_rustls::TlsConnector::from(std::sync::Arc::new(
        config,
    )))
}

fn unreachable(server: &Server, e: &std::io::Error) -> anyhow::Error {
    ClientError::Unreachable {
        server: server.to_string(),
        reason: e.to_string(),
    }
    .into()
}

/// The size of the terminal on stdout (or stdin), 80x24 when there is none.
fn local_terminal_size() -> (u16, u16) {
    [
        rustix::termios::tcgetwinsize(rustix::stdio::stdout()),
        rustix::termios::tcgetwinsize(rustix::stdio::stdin()),
    ]
    .into_iter()
    .flatten()
    .find(|size| size.ws_col > 0 && size.ws_row > 0)
    .map(|size| (size.ws_col, size.ws_row))
    .unwrap_or((80, 24))
}

/// The local terminal in raw mode (keys go to the remote terminal as typed); restored on drop,
/// whichever way the session ends.
struct RawMode {
    saved: rustix::termios::Termios,
}

impl RawMode {
    /// `None` when stdin is not a terminal.
    fn enter() -> anyhow::Result<Option<RawMode>> {
        let stdin = rustix::stdio::stdin();
        if !rustix::termios::isatty(stdin) {
            return Ok(None);
        }
        let saved = rustix::termios::tcgetattr(stdin).context("reading the terminal's mode")?;
        let mut raw = saved.clone();
        raw.make_raw();
        rustix::termios::tcsetattr(stdin, rustix::termios::OptionalActions::Now, &raw)
            .context("putting the terminal in raw mode")?;
        Ok(Some(RawMode { saved }))
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        let _ = rustix::termios::tcsetattr(
            rustix::stdio::stdin(),
            rustix::termios::OptionalActions::Now,
            &self.saved,
        );
    }
}
