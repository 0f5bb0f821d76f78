//! The `/1.0/events` websocket, over the unix socket or TLS.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_tungstenite::tungstenite::Message;

use crate::runtime::{EventStream, RuntimeError};

use super::endpoint::Endpoint;
use super::transport::error_chain;
use super::wire::parse_event;

const WHAT: &str = "subscribe to LXD events";

/// Connects the websocket (within `timeout`) and returns its events as a stream that ends when
/// the connection does.
pub(crate) async fn subscribe(
    endpoint: &Endpoint,
    tls: Option<Arc<rustls::ClientConfig>>,
    project: &str,
    timeout: Duration,
) -> Result<EventStream, RuntimeError> {
    let query = format!(
        "/1.0/events?type=lifecycle,operation&project={}",
        percent_encoding::utf8_percent_encode(project, percent_encoding::NON_ALPHANUMERIC)
    );
    let connect = async {
        match endpoint {
            Endpoint::Unix(path) => {
                let stream = tokio::net::UnixStream::connect(path)
                    .await
                    .map_err(|e| transport(format!("{}: {e}", path.display())))?;
                handshake(format!("ws://lxd{query}"), stream).await
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
                handshake(format!("wss://{host}:{port}{query}"), stream).await
            }
        }
    };
    match tokio::time::timeout(timeout, connect).await {
        Ok(result) => result,
        Err(_) => Err(RuntimeError::Timeout {
            what: WHAT.to_string(),
            after: timeout,
        }),
    }
}

fn transport(message: String) -> RuntimeError {
    RuntimeError::Transport {
        what: WHAT.to_string(),
        message,
    }
}

async fn handshake<S>(url: String, stream: S) -> Result<EventStream, RuntimeError>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (ws, _response) = tokio_tungstenite::client_async(url, stream)
        .await
        .map_err(|e| transport(error_chain(&e)))?;
    let events = futures::stream::unfold(Some(ws), |state| async move {
        let mut ws = state?;
        loop {
            match ws.next().await {
                None | Some(Ok(Message::Close(_))) => return None,
                Some(Ok(Message::Text(text))) => {
                    if let Some(event) = parse_event(text.as_str()) {
                        return Some((Ok(event), Some(ws)));
                    }
                }
                Some(Ok(_)) => {}
                Some(Err(e)) => {
                    let error = RuntimeError::Transport {
                        what: "LXD event stream".to_string(),
                        message: error_chain(&e),
                    };
                    return Some((Err(error), None));
                }
            }
        }
    });
    Ok(Box::pin(events))
}
