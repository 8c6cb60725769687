//! Plain HTTP on the standalone relay's WebSocket port, for Kubernetes probes and Prometheus:
//! `GET /healthz` (200 while the process runs), `GET /readyz` (200 when the store answers and
//! the relay is not draining, else 503) and `GET /metrics` (the Prometheus text format).
//!
//! How the port tells them from a WebSocket: the first bytes of each new connection are
//! *peeked* (left in the socket) before the WebSocket handshake. A request line naming one of
//! these paths is answered here, and the connection closed; anything else goes on to
//! tungstenite exactly as it arrived, so the WebSocket path is the same code reading the same
//! bytes as before. An HTTP server with upgrades (hyper) would also do, but would put its own
//! connection handling in front of every tab, and keep its buffers around each upgraded one;
//! the peek costs a WebSocket nothing once its handshake is done.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::api::RelayApi;
use crate::relay::Relay;

/// What a plain HTTP request on the WebSocket port asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Page {
    /// `GET /healthz`.
    Health,
    /// `GET /readyz`.
    Ready,
    /// `GET /metrics`.
    Metrics,
}

/// The request lines answered here, up to the path's end.
const PAGES: [(&[u8], Page); 3] = [
    (b"GET /healthz", Page::Health),
    (b"GET /readyz", Page::Ready),
    (b"GET /metrics", Page::Metrics),
];
/// How long to wait for more of a request line that has only begun to arrive.
const MORE_BYTES: Duration = Duration::from_millis(5);
/// Longest request head read (and thrown away) before answering.
const MAX_HEAD: usize = 8 * 1024;

/// Which page the connection asks for, judged from its first bytes without reading them;
/// `None` for anything else (a WebSocket handshake), or when the peer closed.
pub async fn page_asked(stream: &TcpStream) -> std::io::Result<Option<Page>> {
    let mut first = [0_u8; 16];
    loop {
        let seen = stream.peek(&mut first).await?;
        if seen == 0 {
            return Ok(None);
        }
        match judge(&first[..seen]) {
            Judged::Page(page) => return Ok(Some(page)),
            Judged::Other => return Ok(None),
            // Peeking again at once would return the same bytes: wait for more to arrive.
            Judged::TooShort => tokio::time::sleep(MORE_BYTES).await,
        }
    }
}

enum Judged {
    Page(Page),
    Other,
    TooShort,
}

/// What the first bytes of a connection are: one of the pages (its path ends with a space or a
/// query), something else, or too short to tell.
fn judge(seen: &[u8]) -> Judged {
    let mut undecided = false;
    for (line, page) in PAGES {
        let common = seen.len().min(line.len());
        if seen[..common] != line[..common] {
            continue;
        }
        match seen.get(line.len()) {
            Some(b' ' | b'?') => return Judged::Page(page),
            Some(_) => {}
            None => undecided = true,
        }
    }
    if undecided {
        Judged::TooShort
    } else {
        Judged::Other
    }
}

/// Answers `page` on `stream` and closes it.
pub async fn answer(relay: &Relay, mut stream: TcpStream, page: Page) {
    // The whole request is read first: closing a socket with unread bytes in it resets the
    // connection, and the client could lose the answer.
    if !read_head(&mut stream).await {
        return;
    }
    let (status, content_type, body) = match page {
        Page::Health => ("200 OK", "text/plain; charset=utf-8", "ok".to_owned()),
        Page::Ready => match RelayApi::ready(relay).await {
            Ok(()) => ("200 OK", "text/plain; charset=utf-8", "ready".to_owned()),
            Err(error) => (
                "503 Service Unavailable",
                "text/plain; charset=utf-8",
                format!("not ready: {}", error.message),
            ),
        },
        Page::Metrics => (
            "200 OK",
            crate::metrics::CONTENT_TYPE,
            relay.metrics().render().await,
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

/// Reads the request head up to its blank line; false when it is too long or the peer left.
async fn read_head(stream: &mut TcpStream) -> bool {
    let mut head = Vec::with_capacity(1024);
    let mut chunk = [0_u8; 1024];
    loop {
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => return false,
            Ok(read) => head.extend_from_slice(&chunk[..read]),
        }
        if head.windows(4).any(|window| window == b"\r\n\r\n") {
            return true;
        }
        if head.len() > MAX_HEAD {
            return false;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn judged(bytes: &[u8]) -> Option<Option<Page>> {
        match judge(bytes) {
            Judged::Page(page) => Some(Some(page)),
            Judged::Other => Some(None),
            Judged::TooShort => None,
        }
    }

    #[test]
    fn request_lines_are_told_apart_from_their_first_bytes() {
        assert_eq!(
            judged(b"GET /metrics HTTP/1.1\r\n"),
            Some(Some(Page::Metrics))
        );
        assert_eq!(judged(b"GET /readyz?x=1 HTTP/1.1"), Some(Some(Page::Ready)));
        assert_eq!(judged(b"GET /healthz HTTP/1.1\r"), Some(Some(Page::Health)));
        assert_eq!(judged(b"GET /api/sessions/ABCD"), Some(None));
        assert_eq!(judged(b"GET /metricsx HTTP/1.1"), Some(None));
        assert_eq!(judged(b"POST /metrics HTTP/1.1"), Some(None));
        // Not enough to tell yet: wait for more.
        assert_eq!(judged(b"GET /"), None);
        assert_eq!(judged(b"GET /metrics"), None);
        assert_eq!(judged(b"G"), None);
    }
}
