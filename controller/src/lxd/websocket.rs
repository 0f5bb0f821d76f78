//! Opening a websocket to LXD, over the unix socket or TLS: the events stream and the
//! interactive exec's streams both start here.

use std::sync::Arc;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio_tungstenite::WebSocketStream;

use crate::runtime::RuntimeError;

use super::endpoint::Endpoint;
use super::transport::error_chain;

pub(super) trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

pub(super) type Socket = WebSocketStream<Box<dyn Io>>;

/// Connects to `path` (with its query) on LXD and completes the websocket handshake. `what`
/// names the caller's purpose in errors.
pub(super) async fn connect(
    endpoint: &Endpoint,
    tls: Option<Arc<rustls::ClientConfig>>,
    path: &str,
    what: &str,
) -> Result<Socket, RuntimeError> {
    let transport = |message: String| RuntimeError::Transport {
        what: what.to_string(),
        message,
    };
    let (url, stream): (String, Box<dyn Io>) = match endpoint {
        Endpoint::Unix(socket) => {
            let stream = tokio::net::UnixStream::connect(socket)
                .await
                .map_err(|e| transport(format!("{}: {e}", socket.display())))?;
            (format!("ws://lxd{path}"), Box::new(stream))
        }
        Endpoint::Https(https) => {
            let url = url::Url::parse(&https.url)
                .map_err(|e| RuntimeError::Config(format!("lxd.endpoint: {e}")))?;
            let host = url
                .host_str()
                .ok_or_else(|| RuntimeError::Config("lxd.endpoint has no host".into()))?
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_string();
            let port = url.port_or_known_default().unwrap_or(8443);
            let tcp = tokio::net::TcpStream::connect((host.as_str(), port))
                .await
                .map_err(|e| transport(format!("{host}:{port}: {e}")))?;
            let config = tls.ok_or_else(|| {
                RuntimeError::Config("https endpoint without a TLS configuration".into())
            })?;
            let server_name = rustls::pki_types::ServerName::try_from(host.clone())
                .map_err(|e| RuntimeError::Config(format!("lxd.endpoint host: {e}")))?;
            let stream = tokio_rustls::TlsConnector::from(config)
                .connect(server_name, tcp)
                .await
                .map_err(|e| transport(error_chain(&e)))?;
            (format!("wss://{host}:{port}{path}"), Box::new(stream))
        }
    };
    let (socket, _response) = tokio_tungstenite::client_async(url, stream)
        .await
        .map_err(|e| transport(error_chain(&e)))?;
    Ok(socket)
}
