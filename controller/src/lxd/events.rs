//! The `/1.0/events` websocket, over the unix socket or TLS.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
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
        let ws = super::websocket::connect(endpoint, tls, &query, WHAT).await?;
        Ok(stream_events(ws))
    };
    match tokio::time::timeout(timeout, connect).await {
        Ok(result) => result,
        Err(_) => Err(RuntimeError::Timeout {
            what: WHAT.to_string(),
            after: timeout,
        }),
    }
}

/// The events an open websocket carries, until it closes.
fn stream_events(ws: super::websocket::Socket) -> EventStream {
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
    Box::pin(events)
}
