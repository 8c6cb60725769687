//! Plain HTTP on the standalone relay's WebSocket port, for Kubernetes probes and Prometheus:
//! `GET /healthz` (200 while the process runs), `GET /readyz` (200 when the store answers and
//! the relay is not draining, else 503) and `GET /metrics` (the Prometheus text format);
//! anything else is 404.
//!
//! How the port tells them from a WebSocket: the first bytes of each new connection are
//! *peeked* (left in the socket) before the WebSocket handshake. One that does not begin as
//! every handshake here does (`GET /api/sessions/`) is plain HTTP, answered here and closed;
//! the rest goes on to tungstenite exactly as it arrived, so the WebSocket path is the same
//! code reading the same bytes as before. An HTTP server with upgrades (hyper) would also do,
//! but would put its own connection handling in front of every tab and keep its buffers
//! around each upgraded one; the peek costs a WebSocket nothing once its handshake is done.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::metrics::Refusal;
use crate::relay::Relay;

/// How every WebSocket handshake on the port begins (`/api/sessions/{code}/ws?token=…`).
const WEBSOCKET: &[u8] = b"GET /api/sessions/";
/// How long to wait for more of a request line that has only begun to arrive.
const MORE_BYTES: Duration = Duration::from_millis(5);
/// Longest request head read before answering.
const MAX_HEAD: usize = 8 * 1024;

/// Whether the connection is plain HTTP (anything but a WebSocket handshake), judged from its
/// first bytes without reading them; false too when the peer closed.
pub async fn is_plain_http(stream: &TcpStream) -> std::io::Result<bool> {
    let mut first = [0_u8; WEBSOCKET.len()];
    loop {
        let seen = stream.peek(&mut first).await?;
        if seen == 0 {
            return Ok(false);
        }
        if first[..seen] != WEBSOCKET[..seen] {
            return Ok(true);
        }
        if seen == WEBSOCKET.len() {
            return Ok(false);
        }
        // Peeking again at once would return the same bytes: wait for more to arrive.
        tokio::time::sleep(MORE_BYTES).await;
    }
}

/// Answers one plain HTTP request on `stream` and closes it: `/healthz`, `/readyz`,
/// `/metrics`, or 404. A head not read whole by `deadline`, or longer than 8 KiB, is not
/// answered (and is counted).
pub async fn answer(relay: &Relay, mut stream: TcpStream, deadline: tokio::time::Instant) {
    // The whole head is read first: closing a socket with unread bytes in it resets the
    // connection, and the client could lose the answer.
    let head = match tokio::time::timeout_at(deadline, read_head(&mut stream)).await {
        Ok(Head::Read(head)) => head,
        Ok(Head::Gone) => return,
        Ok(Head::TooLarge) => return relay.metrics().refused(Refusal::HeaderTooLarge),
        Err(_) => return relay.metrics().refused(Refusal::HeaderTimeout),
    };
    let plain = "text/plain; charset=utf-8";
    let (status, content_type, body) = match request_line(&head) {
        Some(("GET", "/healthz")) => ("200 OK", plain, "ok".to_owned()),
        Some(("GET", "/readyz")) => match relay.serving().await {
            Ok(()) => ("200 OK", plain, "ready".to_owned()),
            Err(error) => (
                "503 Service Unavailable",
                plain,
                format!("not ready: {}", crate::error::ErrorInfo::from(error).message),
            ),
        },
        Some(("GET", "/metrics")) => (
            "200 OK",
            crate::metrics::CONTENT_TYPE,
            relay.metrics().render().await,
        ),
        Some((_, "/healthz" | "/readyz" | "/metrics")) => (
            "405 Method Not Allowed",
            plain,
            "use GET".to_owned(),
        ),
        _ => (
            "404 Not Found",
            plain,
            "Not found: this port serves the provider WebSocket /api/sessions/{code}/ws?token=…, /healthz, /readyz and /metrics".to_owned(),
        ),
    };
    let head = format!(
        "HTTP/1.1 {status}\r\ncontent-type: {content_type}\r\ncontent-length: {}\r\ncache-control: no-store\r\nconnection: close\r\n\r\n",
        body.len()
    );
    let written = async {
        stream.write_all(head.as_bytes()).await?;
        stream.write_all(body.as_bytes()).await?;
        stream.shutdown().await
    };
    if let Err(error) = written.await {
        tracing::debug!(%error, "a probe or scrape went away before its answer");
    }
}

/// The method and path (without its query) of a request head.
fn request_line(head: &[u8]) -> Option<(&str, &str)> {
    let line = head.split(|byte| *byte == b'\n').next()?;
    let line = std::str::from_utf8(line).ok()?;
    let mut parts = line.split(' ');
    let (method, target) = (parts.next()?, parts.next()?);
    let path = target.split('?').next()?;
    Some((method, path))
}

/// A request head, as far as it could be read.
enum Head {
    /// Up to its blank line.
    Read(Vec<u8>),
    /// The peer left first.
    Gone,
    /// Longer than [`MAX_HEAD`].
    TooLarge,
}

/// Reads the request head up to its blank line.
async fn read_head(stream: &mut TcpStream) -> Head {
    let mut head = Vec::with_capacity(1024);
    let mut chunk = [0_u8; 1024];
    loop {
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => return Head::Gone,
            Ok(read) => head.extend_from_slice(&chunk[..read]),
        }
        if head.windows(4).any(|window| window == b"\r\n\r\n") {
            return Head::Read(head);
        }
        if head.len() > MAX_HEAD {
            return Head::TooLarge;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_lines_give_their_method_and_path() {
        assert_eq!(
            request_line(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"),
            Some(("GET", "/metrics"))
        );
        assert_eq!(
            request_line(b"GET /readyz?verbose=1 HTTP/1.1\r\n\r\n"),
            Some(("GET", "/readyz"))
        );
        assert_eq!(request_line(b"garbage"), None);
    }
}
