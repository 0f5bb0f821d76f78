//! `berth ui [--port N]`: the web console for a local admin, served on a loopback port by
//! this process and carried to the daemon's unix socket, as `kubectl proxy` does. It prints a
//! URL with a one-time sign-in token the daemon minted for the socket's admin (as Jupyter
//! does): whoever else connects to the port reaches only the console's sign-in page, never the
//! API as the admin, since only `/ui/` is carried and the daemon signs console requests in by
//! their own session, not by the socket. Runs until interrupted.

use std::convert::Infallible;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{Context as _, bail};
use bytes::Bytes;
use clap::Args;
use http_body_util::{BodyExt, Full, combinators::BoxBody};
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use reqwest::Method;

use super::Context;
use crate::client::{API_PREFIX, Server};

#[derive(Debug, Args)]
pub struct UiArgs {
    /// The loopback port to serve the console on; 0 picks a free one.
    #[arg(long, default_value_t = 0)]
    port: u16,
}

type ProxyBody = BoxBody<Bytes, hyper::Error>;

pub async fn run(context: &Context, args: UiArgs) -> anyhow::Result<ExitCode> {
    let client = context.client()?;
    let Server::Unix(socket) = client.server().clone() else {
        bail!(
            "--server: berth ui serves the console through the daemon's unix socket; \
             on a TCP listener open /ui/ there and sign in with your token"
        );
    };
    let minted = client
        .request_json(Method::POST, &format!("{API_PREFIX}/uitokens"), None)
        .await?;
    let token = minted["token"]
        .as_str()
        .context("the daemon's answer carries no sign-in token")?
        .to_string();
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", args.port))
        .await
        .with_context(|| format!("--port {}: cannot listen on 127.0.0.1", args.port))?;
    let port = listener.local_addr()?.port();
    println!("Serving the berth console on http://127.0.0.1:{port}/ui/ (Ctrl-C stops)");
    println!("Open this URL to sign in (it works once): http://127.0.0.1:{port}/ui/?token={token}");
    std::io::stdout().flush()?;
    let socket = Arc::new(socket);
    loop {
        let (stream, _) = tokio::select! {
            _ = tokio::signal::ctrl_c() => return Ok(ExitCode::SUCCESS),
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    eprintln!("ui: accepting a connection: {e}");
                    continue;
                }
            },
        };
        let socket = Arc::clone(&socket);
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req| {
                let socket = Arc::clone(&socket);
                async move { Ok::<_, Infallible>(carry(&socket, req).await) }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

fn plain(code: StatusCode, text: &'static str) -> Response<ProxyBody> {
    let mut response = Response::new(
        Full::new(Bytes::from_static(text.as_bytes()))
            .map_err(|never| match never {})
            .boxed(),
    );
    *response.status_mut() = code;
    response
}

/// Whether a request path is the console's, the only thing this port carries.
pub fn carried(path: &str) -> bool {
    (path == "/ui" || path.starts_with("/ui/")) && !path.split('/').any(|s| s == "..")
}

/// Carries one console request to the daemon over a fresh unix connection.
async fn carry(socket: &Path, req: Request<Incoming>) -> Response<ProxyBody> {
    if !carried(req.uri().path()) {
        return plain(StatusCode::NOT_FOUND, "berth ui serves /ui/ only\n");
    }
    match forward(socket, req).await {
        Ok(response) => response.map(|body| body.boxed()),
        Err(e) => {
            eprintln!("ui: {e:#}");
            plain(StatusCode::BAD_GATEWAY, "the berth daemon did not answer\n")
        }
    }
}

async fn forward(socket: &Path, req: Request<Incoming>) -> anyhow::Result<Response<Incoming>> {
    let stream = tokio::net::UnixStream::connect(socket)
        .await
        .with_context(|| format!("connecting to {}", PathBuf::from(socket).display()))?;
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .context("HTTP handshake with the daemon")?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(sender.send_request(req).await?)
}

#[cfg(test)]
mod tests {
    use super::carried;

    #[test]
    fn only_the_console_is_carried() {
        let table = [
            ("/ui", true),
            ("/ui/", true),
            ("/ui/projects/web", true),
            ("/ui/api/apis/berth.dev/v1alpha1/projects", true),
            ("/apis/berth.dev/v1alpha1/projects", false),
            ("/healthz", false),
            ("/uix", false),
            ("/ui/../apis/berth.dev/v1alpha1/users", false),
            ("/", false),
        ];
        for (path, want) in table {
            assert_eq!(carried(path), want, "{path}");
        }
    }
}
