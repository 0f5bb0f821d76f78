//! `berth port-forward`'s wire: one local connection carried over one websocket between the CLI
//! and the daemon. Binary messages are the connection's bytes; the text message `eof` says the
//! sender's side stopped writing (a TCP half-close), so a request whose client shuts its write
//! side still gets its answer. Either side closes the websocket once both directions ended;
//! a websocket that breaks ends the connection at once.

use futures::{SinkExt, StreamExt};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_util::sync::CancellationToken;

/// The text message that says "no more bytes from this side".
pub const EOF: &str = "eof";
const CHUNK: usize = 64 * 1024;

/// Relays between `socket` and `stream` until both directions ended or the websocket broke.
pub async fn relay<W, S>(socket: WebSocketStream<W>, stream: S)
where
    W: AsyncRead + AsyncWrite + Unpin,
    S: AsyncRead + AsyncWrite + Unpin,
{
    let (mut sink, mut source) = socket.split();
    let (mut read, mut write) = tokio::io::split(stream);
    let broken = CancellationToken::new();
    let inbound = async {
        while let Some(message) = source.next().await {
            match message {
                Ok(Message::Binary(bytes)) => {
                    if write.write_all(&bytes).await.is_err() {
                        break;
                    }
                }
                Ok(Message::Text(text)) if text.as_str() == EOF => {
                    let _ = write.shutdown().await;
                    return;
                }
                Ok(Message::Close(_)) | Err(_) => break,
                Ok(_) => {}
            }
        }
        broken.cancel();
    };
    let outbound = async {
        let mut buf = vec![0u8; CHUNK];
        loop {
            let read = tokio::select! {
                () = broken.cancelled() => return,
                read = read.read(&mut buf) => read,
            };
            match read {
                Ok(0) => {
                    let _ = sink.send(Message::text(EOF)).await;
                    return;
                }
                Ok(n) => {
                    if sink.send(Message::binary(buf[..n].to_vec())).await.is_err() {
                        broken.cancel();
                        return;
                    }
                }
                Err(_) => {
                    broken.cancel();
                    return;
                }
            }
        }
    };
    tokio::join!(inbound, outbound);
    let _ = sink.close().await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio_tungstenite::tungstenite::protocol::Role;

    /// Two relays back to back over an in-memory websocket: bytes cross both ways, and a
    /// half-close on one end reaches the other while the answer still comes back.
    #[tokio::test]
    async fn bytes_and_half_closes_cross_both_ways() {
        let (ws_a, ws_b) = tokio::io::duplex(1024);
        let (local, mut client) = tokio::io::duplex(1024);
        let (remote, mut server) = tokio::io::duplex(1024);
        let a = WebSocketStream::from_raw_socket(ws_a, Role::Client, None);
        let b = WebSocketStream::from_raw_socket(ws_b, Role::Server, None);
        let (a, b) = tokio::join!(a, b);
        let relays = tokio::spawn(async move {
            tokio::join!(relay(a, local), relay(b, remote));
        });
        client.write_all(b"ping").await.unwrap();
        client.shutdown().await.unwrap();
        let mut got = Vec::new();
        server.read_to_end(&mut got).await.unwrap();
        assert_eq!(got, b"ping");
        server.write_all(b"pong").await.unwrap();
        server.shutdown().await.unwrap();
        let mut answer = Vec::new();
        client.read_to_end(&mut answer).await.unwrap();
        assert_eq!(answer, b"pong");
        relays.await.unwrap();
    }
}
