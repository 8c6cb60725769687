//! The browser WebSocket (tokio-tungstenite): `GET /api/sessions/{code}/ws?token=…`.
//!
//! JSON text frames with a `type` field ([`ProviderFrame`] up, [`RelayFrame`] down). The
//! upgrade always succeeds for a well-formed path, because a browser cannot read the status of
//! a refused upgrade: a refused attach is an `error` frame followed by a close with a 44xx code
//! (4400 bad input, 4401 token missing, 4403 token wrong, 4404 no such session).
//!
//! [`serve_listener`] runs the standalone relay's listener, whose port also answers the plain
//! HTTP of probes and scrapes ([`crate::probes`]); [`serve_upgraded`] serves a connection another
//! HTTP server (the gateway in one-process mode) has already upgraded.
//!
//! A tab is one task: [`serve_link`] runs the socket's loop and the link's driver
//! ([`crate::provider::LinkDriver`]) joined in it. The loop reads and writes the socket, records
//! the tab's answers itself ([`crate::provider::Answers`]) and hands the driver the rest; the
//! driver delivers calls, heartbeats and the connection's end down the link. Everything such a
//! task keeps while the tab is idle is paid by every tab, so what it awaits besides its events
//! is boxed and its channels allocate as they fill ([`crate::channel`]).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use futures::future::{Either, OptionFuture, join};
use futures::{FutureExt, SinkExt, StreamExt};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::error::CapacityError;
use tokio_tungstenite::tungstenite::handshake::server::{ErrorResponse, Request, Response};
use tokio_tungstenite::tungstenite::http::{StatusCode, Uri};
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::{CloseFrame, Role, WebSocketConfig};
use tokio_tungstenite::tungstenite::{Error as WsError, Message, Utf8Bytes};
use tokio_util::sync::CancellationToken;
use toolrelay::json::ReadError;
use toolrelay::wire::{ProviderFrame, ProviderResponse, RelayFrame};

use crate::caller::{CallerId, IdentityKind};
use crate::drain::Drain;
use crate::error::{ErrorCode, ErrorInfo, ErrorKind, RelayError};
use crate::limits::Caller;
use crate::listen::Connections;
use crate::metrics::Refusal;
use crate::provider::{Downlink, LinkDriver, ProviderLink, Uplink};
use crate::relay::{AnswerLimits, Relay, contain_response};
use crate::store::Transport;

/// Room for a frame's envelope around the largest response a provider may send.
const FRAME_OVERHEAD: usize = 64 * 1024;
/// How long a write to a provider may take before the connection counts as dead.
const SEND_TIMEOUT: Duration = Duration::from_secs(10);
/// Read and write buffer of a provider socket.
const SOCKET_BUFFER: usize = 4 * 1024;
/// How long the `ack` of a stored answer may wait for the next frame to the tab ([`HeldAcks`]).
const ACK_DELAY: Duration = Duration::from_millis(5);

/// The session code and token of a WebSocket URL `/api/sessions/{code}/ws?token=…`, or `None`
/// when the path is not that.
pub fn parse_target(uri: &Uri) -> Option<(String, Option<String>)> {
    let code = uri
        .path()
        .strip_prefix("/api/sessions/")?
        .strip_suffix("/ws")
        .filter(|code| !code.is_empty() && !code.contains('/'))?;
    let token = uri.query().and_then(|query| {
        form_urlencoded::parse(query.as_bytes())
            .find(|(key, _)| key == "token")
            .map(|(_, value)| value.into_owned())
    });
    Some((code.to_owned(), token))
}

/// Accepts WebSocket connections on `listener` until `stop` is cancelled, within the caps of
/// `connections` (each holds its slot until it closes).
pub async fn serve_listener(
    relay: Relay,
    listener: TcpListener,
    connections: Arc<Connections>,
    stop: CancellationToken,
) {
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    if let Some(slot) = connections.admit(peer.ip()) {
                        let relay = relay.clone();
                        let limits = connections.limits().header_read_timeout;
                        relay.drain().clone().spawn_socket(async move {
                            serve_tcp(relay, stream, peer, limits).await;
                            drop(slot);
                        });
                    }
                }
                Err(error) => {
                    // Out of file descriptors or similar: pause instead of spinning.
                    tracing::warn!(%error, "could not accept a WebSocket connection");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            },
        }
    }
}

/// Serves one connection of the port: a probe or scrape, or a WebSocket whose handshake must
/// arrive within `header_timeout` (a connection that does not is closed and counted).
async fn serve_tcp(relay: Relay, stream: TcpStream, peer: SocketAddr, header_timeout: Duration) {
    crate::server::no_delay(&stream);
    let timed_out = || {
        relay.metrics().refused(Refusal::HeaderTimeout);
        tracing::debug!(%peer, "closed a connection whose request head did not arrive in time");
    };
    // `/healthz`, `/readyz` and `/metrics` share the port: peeked, so a WebSocket handshake
    // reaches tungstenite untouched. Boxed, so that what answering them needs does not
    // enlarge the task every open WebSocket keeps. The whole head, peeked or read, arrives
    // within one header-read timeout.
    let deadline = tokio::time::Instant::now() + header_timeout;
    match tokio::time::timeout_at(deadline, crate::probes::is_plain_http(&stream)).await {
        Ok(Ok(true)) => return Box::pin(crate::probes::answer(&relay, stream, deadline)).await,
        Ok(Ok(false)) => {}
        Ok(Err(_)) => return,
        Err(_) => return timed_out(),
    }
    let mut target = None;
    // The callback's signature is tungstenite's; its error type is an HTTP response.
    #[allow(clippy::result_large_err)]
    let route = |request: &Request, response: Response| -> Result<Response, ErrorResponse> {
        match parse_target(request.uri()) {
            Some(found) => {
                target = Some(found);
                Ok(response)
            }
            None => {
                let mut refusal = ErrorResponse::new(Some(
                    "Not found: the provider WebSocket is /api/sessions/{code}/ws?token=…".into(),
                ));
                *refusal.status_mut() = StatusCode::NOT_FOUND;
                Err(refusal)
            }
        }
    };
    let settings = SocketSettings::of(&relay);
    let handshake =
        tokio_tungstenite::accept_hdr_async_with_config(stream, route, Some(settings.config));
    let socket = match tokio::time::timeout_at(deadline, handshake).await {
        Ok(Ok(socket)) => socket,
        Ok(Err(error)) => {
            if matches!(error, WsError::AttackAttempt) {
                // tungstenite's own bound on a handshake's head: 64 KiB.
                relay.metrics().refused(Refusal::HeaderTooLarge);
            }
            tracing::debug!(%error, "WebSocket handshake failed");
            return;
        }
        Err(_) => return timed_out(),
    };
    if let Some((code, token)) = target {
        let identity = token
            .as_deref()
            .filter(|token| !token.is_empty())
            .map(|token| CallerId::of(IdentityKind::ProviderToken, token));
        let caller = Caller::new(peer.ip()).with_identity(identity);
        serve_socket(relay, socket, &caller, &code, token.as_deref()).await;
    }
}

/// What serving a provider socket needs besides its link.
#[derive(Debug, Clone)]
pub struct SocketSettings {
    /// Frame and buffer sizes.
    pub config: WebSocketConfig,
    /// What an answer may be; one beyond becomes a failed answer for its caller.
    pub answers: AnswerLimits,
    /// The process's drain: a delivered call holds it open, and its end closes the socket
    /// with 1012 so that the tab reconnects elsewhere.
    pub drain: Drain,
}

impl SocketSettings {
    /// The settings of sockets this relay serves itself.
    pub fn of(relay: &Relay) -> Self {
        let answers = relay.answer_limits();
        Self {
            config: websocket_config(answers.max_bytes),
            answers,
            drain: relay.drain().clone(),
        }
    }
}

/// Serves a connection whose HTTP upgrade another server has completed (the gateway), with
/// the provider link it attached (or the reason it could not). (Not an `async fn`, for the
/// reason [`serve_link`] is not.)
pub fn serve_upgraded<'a, S>(
    io: S,
    settings: &'a SocketSettings,
    link: Result<ProviderLink, ErrorInfo>,
) -> impl Future<Output = ()> + 'a
where
    S: AsyncRead + AsyncWrite + Unpin + 'a,
{
    WebSocketStream::from_raw_socket(io, Role::Server, Some(settings.config))
        .then(move |socket| serve_link(socket, settings, link))
}

/// Limits for provider sockets: a frame may carry the largest response a provider may send,
/// and the buffers fit the small JSON frames sockets mostly carry (tungstenite's 128 KiB
/// defaults cost ~142 KB per idle tab; a larger frame grows the buffer while it is read).
pub fn websocket_config(max_response_bytes: usize) -> WebSocketConfig {
    let limit = max_response_bytes + FRAME_OVERHEAD;
    WebSocketConfig::default()
        .read_buffer_size(SOCKET_BUFFER)
        .write_buffer_size(SOCKET_BUFFER)
        .max_message_size(Some(limit))
        .max_frame_size(Some(limit))
}

/// Attaches the socket as the session's provider and relays frames until either side ends.
pub async fn serve_socket<S>(
    relay: Relay,
    socket: WebSocketStream<S>,
    caller: &Caller,
    code: &str,
    token: Option<&str>,
) where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let link = relay
        .attach_for(caller, code, token, Transport::WebSocket)
        .await
        .map_err(ErrorInfo::from);
    serve_link(socket, &SocketSettings::of(&relay), link).await;
}

/// Relays frames between a socket and an attached provider link until either side ends; a
/// refused attach becomes an `error` frame and a close.
///
/// The link's driver runs in the same task, beside the socket's loop and polled first, so that
/// a call it delivers is written in the same wake-up. When the socket ends, the loop drops its
/// side of the link, and the driver, seeing the provider gone, records its departure.
/// (Not an `async fn`: its future would keep a moved-out copy of the socket and the link
/// beside the loop's, and an idle tab's task keeps it.)
pub fn serve_link<'a, S: Socket + 'a>(
    socket: S,
    settings: &'a SocketSettings,
    link: Result<ProviderLink, ErrorInfo>,
) -> impl Future<Output = ()> + 'a {
    match link {
        Ok(mut link) => {
            let driver = OptionFuture::from(link.driver.take().map(LinkDriver::run));
            let both = join(driver, relay_frames(socket, settings, link)).map(|_| ());
            Either::Left(crate::transport::rewoken::Rewoken::new(both))
        }
        Err(error) => Either::Right(refuse(socket, error)),
    }
}

/// A provider socket, as the adapter sees it: messages in, messages out. A tungstenite
/// [`WebSocketStream`] is one; so is a pair of channels in a test.
pub trait Socket:
    futures::Stream<Item = Result<Message, WsError>> + futures::Sink<Message, Error = WsError> + Unpin
{
}

impl<T> Socket for T where
    T: futures::Stream<Item = Result<Message, WsError>>
        + futures::Sink<Message, Error = WsError>
        + Unpin
{
}

/// Tells the provider why it could not attach, and closes.
async fn refuse<S: Socket>(mut socket: S, error: ErrorInfo) {
    let code = refusal_close_code(&error);
    let frame = RelayFrame::Error {
        error: error.code,
        message: error.message,
        request_id: None,
    };
    if Box::pin(send(&mut socket, text(&frame))).await {
        Box::pin(close(&mut socket, code, "refused")).await;
    }
}

/// What the socket is given to write for one message of the link (`None`: the link ended).
#[derive(Debug, PartialEq)]
enum Out {
    /// A WebSocket ping: every relay heartbeat carries one, which browsers answer by
    /// themselves; the relay counts the heartbeats left unanswered ([`Uplink::Heard`]).
    Ping,
    /// A frame of the tab protocol.
    Frame(Message),
    /// A frame that may wait for the next one, up to [`ACK_DELAY`]: the `ack` of an answer
    /// stored (see [`HeldAcks`]).
    Later(Message),
    /// The close, last.
    Close(CloseCode, &'static str),
}

/// What to write for `message`, in order: its frame (after a ping, for the relay's own
/// heartbeat), and the close after a final one. A link that ends with no final message ends
/// because the process drains (the tab reconnects) or because the relay dropped a tab that
/// answered no ping.
fn outgoing(message: Option<Downlink>, drained: bool) -> [Option<Out>; 3] {
    let Some(message) = message else {
        let close = if drained {
            Out::Close(CloseCode::Restart, "relay restarting")
        } else {
            Out::Close(CloseCode::Away, "no answer to pings")
        };
        return [Some(close), None, None];
    };
    let ping = matches!(
        message,
        Downlink::Heartbeat {
            answers_ping: false,
            ..
        }
    )
    .then_some(Out::Ping);
    let ending = message.is_final().then_some(match message {
        Downlink::Restarting => Out::Close(CloseCode::Restart, "relay restarting"),
        Downlink::Replaced => Out::Close(CloseCode::Normal, "replaced"),
        _ => Out::Close(CloseCode::Normal, "session ended"),
    });
    // An answer refused tells the tab why at once; one stored only lets it forget the answer.
    let stored = matches!(message, Downlink::Ack { refusal: None, .. });
    let frame = match &message {
        // Written from the call where the store holds it: no copy of it.
        Downlink::ToolRequest { request, .. } => text(&request.frame()),
        _ => text(&message.into_frame()),
    };
    let frame = if stored {
        Out::Later(frame)
    } else {
        Out::Frame(frame)
    };
    [ping, Some(frame), ending]
}

/// The `ack`s written to the socket's buffer and not sent yet. Each would otherwise be a write
/// of its own — a system call, and the tab's wake-up, for every answer — while a tab that is
/// kept busy is sent its next call within moments: an `ack` goes out with the next frame the
/// tab is sent, or by itself [`ACK_DELAY`] after the last. Nothing is weakened: the tab keeps
/// an answer until its `ack` and sends it again only after an `error` or a reconnect, when the
/// relay acknowledges it again as the answer it has.
#[derive(Default)]
struct HeldAcks {
    /// When to send them, while any may be held: set again for each one, and gone (with its
    /// allocation) once it has fired, so an idle tab keeps none.
    timer: Option<std::pin::Pin<Box<tokio::time::Sleep>>>,
}

impl HeldAcks {
    /// One more `ack` was written: the held ones go out [`ACK_DELAY`] from now.
    fn hold(&mut self) {
        let deadline = tokio::time::Instant::now() + ACK_DELAY;
        match &mut self.timer {
            Some(timer) => timer.as_mut().reset(deadline),
            None => self.timer = Some(Box::pin(tokio::time::sleep_until(deadline))),
        }
    }

    fn is_set(&self) -> bool {
        self.timer.is_some()
    }

    /// Completes when the held `ack`s are due (never while none is held).
    async fn due(&mut self) {
        match &mut self.timer {
            Some(timer) => timer.as_mut().await,
            None => std::future::pending().await,
        }
        self.timer = None;
    }
}

/// What came in from the socket, for the link.
#[derive(Debug, PartialEq)]
enum In {
    /// Word for the relay: a frame, or that the tab answered a ping.
    Up(Option<Uplink>, Option<(ErrorCode, String)>),
    /// Nothing to pass on.
    Nothing,
    /// Close the socket so, and stop.
    Close(CloseCode, &'static str),
    /// The socket ended.
    End,
}

fn incoming(message: Option<Result<Message, WsError>>, limits: AnswerLimits) -> In {
    match message {
        // Anything the tab sends says it is there, even a frame it is told it got wrong.
        Some(Ok(Message::Text(body))) => {
            let (frame, refusal) = read_frame(&body, limits);
            In::Up(Some(frame.map_or(Uplink::Heard, Uplink::Frame)), refusal)
        }
        Some(Ok(Message::Binary(_))) => In::Up(
            Some(Uplink::Heard),
            Some((
                ErrorCode::InvalidFrame,
                "Binary frames are not understood; send JSON as text frames.".to_owned(),
            )),
        ),
        // A pong answers the ping of a heartbeat; a ping of the tab's own (tungstenite answers
        // it) says it is there too.
        Some(Ok(Message::Pong(_) | Message::Ping(_))) => In::Up(Some(Uplink::Heard), None),
        Some(Ok(Message::Frame(_))) => In::Nothing,
        Some(Err(WsError::Capacity(CapacityError::MessageTooLong { size, max_size }))) => {
            tracing::debug!(size, max_size, "a provider sent a frame over the limit");
            In::Close(CloseCode::Size, "frame too large")
        }
        Some(Ok(Message::Close(_)) | Err(_)) | None => In::End,
    }
}

/// Relays frames between a socket and an attached provider link until either side ends: IO
/// only. What the tab sends goes up the link (a pong as [`Uplink::Heard`]: this transport
/// pings its tab, and says so first), what comes down is written; the connection's state and
/// decisions are the relay's ([`crate::provider`]).
async fn relay_frames<S: Socket>(mut socket: S, settings: &SocketSettings, mut link: ProviderLink) {
    // What the loop awaits besides the socket and the link is boxed: this future is what an
    // idle tab's task keeps, and a write is short-lived. `pending`: word read from the socket
    // and not yet taken by the link; while some waits, the loop stops reading but keeps
    // writing, so a full uplink can never block the downlink.
    let mut pending = Some(Uplink::Heard);
    let mut held = HeldAcks::default();
    let mut drained = std::pin::pin!(settings.drain.ended());
    loop {
        tokio::select! {
            // The drain first: when it ends, the link to a relay elsewhere may close at the
            // same moment, and the tab must hear 1012 (reconnect), not a plain close.
            biased;
            // The process is stopping (a gateway whose relay goes on included): the tab hears
            // why, and reconnects elsewhere.
            () = &mut drained => return Box::pin(restart(&mut socket)).await,
            message = link.downlink.recv() => {
                let drained = settings.drain.has_ended();
                if !Box::pin(write_down(&mut socket, message, drained, &mut held)).await {
                    return;
                }
            }
            () = held.due(), if held.is_set() => {
                // Nothing else went to the tab since: the acks go by themselves (or, if
                // something did, there is nothing left to write).
                if !Box::pin(flush(&mut socket)).await {
                    return;
                }
            }
            permit = link.uplink.reserve(), if pending.is_some() => {
                match (permit, pending.take()) {
                    (Ok(permit), Some(up)) => permit.send(up),
                    _ => return,
                }
            }
            message = socket.next(), if pending.is_none() => match incoming(message, settings.answers) {
                In::Up(up, refusal) => {
                    pending = up;
                    if let Some((error, message)) = refusal {
                        let frame = RelayFrame::Error { error, message, request_id: None };
                        if !Box::pin(send(&mut socket, text(&frame))).await {
                            return;
                        }
                    }
                }
                In::Nothing => {}
                In::Close(code, reason) => {
                    Box::pin(close(&mut socket, code, reason)).await;
                    return;
                }
                In::End => return,
            },
        }
    }
}

/// Writes what came down the link ([`outgoing`]); false when the socket is done with (closed,
/// or gone). A frame sent takes the held acks with it: they are ahead of it in the buffer.
async fn write_down<S: Socket>(
    socket: &mut S,
    message: Option<Downlink>,
    drained: bool,
    held: &mut HeldAcks,
) -> bool {
    for out in outgoing(message, drained).into_iter().flatten() {
        let sent = match out {
            Out::Ping => send(socket, Message::Ping(Default::default())).await,
            Out::Frame(frame) => send(socket, frame).await,
            Out::Later(frame) => {
                held.hold();
                feed(socket, frame).await
            }
            Out::Close(code, reason) => {
                close(socket, code, reason).await;
                false
            }
        };
        if !sent {
            return false;
        }
    }
    true
}

/// Tells the tab the relay restarts, and closes with 1012: it reconnects elsewhere.
async fn restart<S: Socket>(socket: &mut S) {
    if send(socket, text(&Downlink::Restarting.to_frame())).await {
        close(socket, CloseCode::Restart, "relay restarting").await;
    }
}

/// A frame from the provider, and the error to tell it about, if any. An answer that is too
/// deep or too large — even one too deep to parse — still reaches its caller, as a failed
/// answer: refusing it outright would leave the call to be delivered again and again.
fn read_frame(
    body: &str,
    limits: AnswerLimits,
) -> (Option<ProviderFrame>, Option<(ErrorCode, String)>) {
    match ProviderFrame::from_json(body) {
        Ok(ProviderFrame::Response(response)) => {
            let (response, refused) = contain_response(*response, limits);
            let refusal = refused.map(|error| (error.code(), error.to_string()));
            (Some(ProviderFrame::Response(Box::new(response))), refusal)
        }
        Ok(frame) => (Some(frame), None),
        Err(error) => {
            let message = format!(
                "Frames are JSON objects whose type is register, response, progress, log, approval, disconnect-caller or ping ({error})."
            );
            match unreadable_answer(body, &error, limits) {
                Some((response, refusal)) => (
                    Some(ProviderFrame::Response(Box::new(response))),
                    Some((refusal.code(), refusal.to_string())),
                ),
                None => (None, Some((ErrorCode::InvalidFrame, message))),
            }
        }
    }
}

/// The failed answer to give the caller of a `response` frame that could not be read (nested
/// past the JSON parser's own limit, say), when its `requestId` can still be found: serde
/// skips the fields it does not need without recursing.
fn unreadable_answer(
    body: &str,
    error: &ReadError,
    limits: AnswerLimits,
) -> Option<(ProviderResponse, RelayError)> {
    #[derive(serde::Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Head {
        #[serde(rename = "type")]
        kind: String,
        request_id: String,
    }
    let head: Head = serde_json::from_str(body).ok()?;
    if head.kind != "response" {
        return None;
    }
    let refusal = match error {
        ReadError::TooDeep(_) => RelayError::NestedTooDeeply {
            what: "The tool's answer is",
            limit: limits.max_depth,
        },
        ReadError::Invalid(error) => RelayError::InvalidResponse {
            reason: format!("it could not be read ({error})"),
        },
    };
    let response = ProviderResponse {
        request_id: head.request_id,
        success: Some(false),
        result: None,
        error: Some(serde_json::json!({
            "code": refusal.name(),
            "message": format!("The tool's answer could not be used: {refusal}"),
        })),
        content: None,
        structured_content: None,
    };
    Some((response, refusal))
}

/// Sends one message; false when the peer is gone or stopped reading for [`SEND_TIMEOUT`].
async fn send<S: Socket>(socket: &mut S, message: Message) -> bool {
    in_time(socket.send(message)).await
}

/// Writes one message to the socket's buffer, to go with the next [`send`] or [`flush`]
/// (at once only when the buffer is full); false as [`send`].
async fn feed<S: Socket>(socket: &mut S, message: Message) -> bool {
    in_time(socket.feed(message)).await
}

/// Sends what the socket's buffer holds; false as [`send`].
async fn flush<S: Socket>(socket: &mut S) -> bool {
    in_time(socket.flush()).await
}

/// Whether a write to the socket succeeded within [`SEND_TIMEOUT`].
async fn in_time(write: impl Future<Output = Result<(), WsError>>) -> bool {
    matches!(tokio::time::timeout(SEND_TIMEOUT, write).await, Ok(Ok(())))
}

async fn close<S: Socket>(socket: &mut S, code: CloseCode, reason: &'static str) {
    let closing = Message::Close(Some(close_frame(code, reason)));
    let _ = tokio::time::timeout(SEND_TIMEOUT, socket.send(closing)).await;
}

fn refusal_close_code(error: &ErrorInfo) -> CloseCode {
    CloseCode::from(match error.kind {
        ErrorKind::Unauthenticated => 4401,
        ErrorKind::Forbidden => 4403,
        ErrorKind::NotFound => 4404,
        ErrorKind::TooManyRequests => 4429,
        ErrorKind::Unavailable => 1013,
        _ => 4400,
    })
}

fn close_frame(code: CloseCode, reason: &'static str) -> CloseFrame {
    CloseFrame {
        code,
        reason: Utf8Bytes::from_static(reason),
    }
}

/// A frame as a text message, its text one allocation ([`toolrelay::json::to_string_sized`]).
fn text(frame: &impl serde::Serialize) -> Message {
    // Serialising these plain structs cannot fail; an empty object is the harmless fallback.
    Message::text(toolrelay::json::to_string_sized(frame).unwrap_or_else(|_| "{}".to_owned()))
}

#[cfg(test)]
mod tests;
