//! Every listener's connections (SPEC §10): at most `MAX_CONNECTIONS_PER_IP` open from one
//! client address (an IPv6 client by its /64, see [`client_key`]) and `MAX_CONNECTIONS` in
//! all (default from `RLIMIT_NOFILE`), a header-read timeout, a bound on the bytes of a
//! request head, and a keep-alive idle timeout that runs only *between* requests.
//!
//! [`serve`] runs an HTTP listener — the gateway's (poem) and the relay's gRPC (tonic) — by
//! serving each accepted connection through hyper-util itself rather than through poem's or
//! tonic's `Server`. Why: poem's `idle_timeout` counts socket silence, so it would cut a 40 s
//! `/call`, a `?wait=30` poll, an SSE stream or a WebSocket; neither server has a header-read
//! timeout; and a wrapping acceptor only sees bytes, not where one request ends and the next
//! begins. Serving the connection ourselves, we see every request start (the service is
//! called) and end (its response body is dropped), so a connection is *busy* while one is in
//! flight and *between requests* otherwise. hyper's own `header_read_timeout` is not used: in
//! hyper 1.x it also runs while a kept-alive connection waits for its next request, so it
//! would be the idle timeout too. Instead a small watcher per connection gives a request head
//! [`ConnectionLimits::header_read_timeout`] to arrive from the connection's first byte (or
//! from the accept), and a quiet kept-alive connection [`ConnectionLimits::keep_alive_idle`];
//! head bytes are capped by hyper (`max_buf_size` for HTTP/1, answering 431;
//! `max_header_list_size` for HTTP/2).
//!
//! The relay's WebSocket port is not HTTP served by hyper (see [`crate::probes`]); it takes its
//! slots from the same [`Connections`] and applies the same header-read timeout itself; its
//! heads are bounded by tungstenite (64 KiB, fixed) and the probes' reader (8 KiB). An
//! upgraded WebSocket keeps its slot, but no timeout here applies to it (its heartbeats do).

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use ipnet::IpNet;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::limits::{DEFAULT_IPV6_PREFIX, client_key, is_within};
use crate::locked;
use crate::metrics::{Metrics, Refusal};

/// Default of `HEADER_READ_TIMEOUT_SECONDS`.
pub const DEFAULT_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// Default of `MAX_HEADER_BYTES`.
pub const DEFAULT_MAX_HEADER_BYTES: usize = 64 * 1024;
/// Default of `KEEP_ALIVE_IDLE_SECONDS`.
pub const DEFAULT_KEEP_ALIVE_IDLE: Duration = Duration::from_secs(60);
/// Default of `MAX_CONNECTIONS_PER_IP`.
pub const DEFAULT_MAX_CONNECTIONS_PER_IP: usize = 5_000;
/// Smallest `MAX_HEADER_BYTES`: hyper reads at least this much at a time.
pub const MIN_HEADER_BYTES: usize = 8 * 1024;

/// What every listener allows a connection.
#[derive(Debug, Clone)]
pub struct ConnectionLimits {
    /// How long a request head may take to arrive, from its first byte (or the accept).
    pub header_read_timeout: Duration,
    /// Most bytes of a request head buffered.
    pub max_header_bytes: usize,
    /// How long a kept-alive connection may wait for its next request.
    pub keep_alive_idle: Duration,
    /// Most connections open from one client address.
    pub max_per_address: usize,
    /// Most connections open in all (every listener of the process).
    pub max_total: usize,
    /// Peers with no per-address cap (trusted proxies, whose connections carry many clients);
    /// they still count in the total.
    pub uncapped: Vec<IpNet>,
    /// Length of the IPv6 prefix one client is keyed by (`GUARD_IPV6_PREFIX`).
    pub ipv6_prefix: u8,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        Self {
            header_read_timeout: DEFAULT_HEADER_READ_TIMEOUT,
            max_header_bytes: DEFAULT_MAX_HEADER_BYTES,
            keep_alive_idle: DEFAULT_KEEP_ALIVE_IDLE,
            max_per_address: DEFAULT_MAX_CONNECTIONS_PER_IP,
            max_total: default_max_connections(),
            uncapped: Vec::new(),
            ipv6_prefix: DEFAULT_IPV6_PREFIX,
        }
    }
}

/// Raises the soft limit of open files to the hard limit, so that the connection cap (not the
/// kernel) decides; returns the soft limit now in force. Binaries call it at start.
pub fn raise_open_files_limit() -> u64 {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok((soft, hard)) if soft < hard => match setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
            Ok(()) => hard,
            Err(error) => {
                tracing::warn!(%error, soft, hard, "could not raise the open-files limit");
                soft
            }
        },
        Ok((soft, _)) => soft,
        Err(_) => 1024,
    }
}

/// The default `MAX_CONNECTIONS`: the open-files limit in force, less room for the store's
/// connections, files, the sandbox's pipes and outgoing connections (an eighth, at least 256).
pub fn default_max_connections() -> usize {
    use nix::sys::resource::{Resource, getrlimit};
    let files = getrlimit(Resource::RLIMIT_NOFILE).map_or(1024, |(soft, _)| soft);
    let files = usize::try_from(files).unwrap_or(usize::MAX).min(1 << 24);
    files.saturating_sub((files / 8).max(256)).max(64)
}

/// The connections open in a process, counted per client address and in all. Shared by every
/// listener of the process (the file descriptors are the process's).
#[derive(Debug)]
pub struct Connections {
    limits: ConnectionLimits,
    metrics: Metrics,
    total: AtomicUsize,
    /// Open connections by client key. A std mutex: held for one map update, never across an
    /// `.await`.
    per_address: Mutex<HashMap<IpAddr, usize>>,
}

impl Connections {
    /// Connections within `limits`, refusals counted in `metrics`.
    pub fn new(limits: ConnectionLimits, metrics: Metrics) -> Arc<Self> {
        Arc::new(Self {
            limits,
            metrics,
            total: AtomicUsize::new(0),
            per_address: Mutex::new(HashMap::new()),
        })
    }

    /// The limits.
    pub fn limits(&self) -> &ConnectionLimits {
        &self.limits
    }

    /// The metrics refusals are counted in.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// Connections open now.
    pub fn open(&self) -> usize {
        self.total.load(Ordering::Relaxed)
    }

    /// A slot for a connection from `peer`, held until it closes; `None` (counted) when a cap
    /// is reached, and the connection is to be closed at once.
    pub fn admit(self: &Arc<Self>, peer: IpAddr) -> Option<Slot> {
        if self.total.fetch_add(1, Ordering::AcqRel) >= self.limits.max_total {
            self.total.fetch_sub(1, Ordering::AcqRel);
            self.metrics.refused(Refusal::ConnectionsTotal);
            tracing::debug!(%peer, "connection refused: {} are open", self.limits.max_total);
            return None;
        }
        let key = (!is_within(&self.limits.uncapped, peer))
            .then(|| client_key(peer, self.limits.ipv6_prefix));
        if let Some(key) = key {
            let mut open = locked(&self.per_address);
            let count = open.entry(key).or_insert(0);
            if *count >= self.limits.max_per_address {
                drop(open);
                self.total.fetch_sub(1, Ordering::AcqRel);
                self.metrics.refused(Refusal::ConnectionsPerAddress);
                tracing::debug!(%peer, "connection refused: too many from this address");
                return None;
            }
            *count += 1;
        }
        Some(Slot {
            connections: Arc::clone(self),
            key,
        })
    }
}

/// A connection's place in [`Connections`], given back when dropped.
#[derive(Debug)]
pub struct Slot {
    connections: Arc<Connections>,
    key: Option<IpAddr>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        if let Some(key) = self.key {
            let mut open = locked(&self.connections.per_address);
            if let Some(count) = open.get_mut(&key) {
                *count -= 1;
                if *count == 0 {
                    open.remove(&key);
                }
            }
        }
        self.connections.total.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The HTTP a listener speaks.
#[derive(Debug, Clone, Copy)]
pub enum Protocol {
    /// HTTP/1.1 (with upgrades) and HTTP/2: the gateway.
    Http,
    /// HTTP/2 only, pinging every `keepalive` (the answer due within 20 s): gRPC.
    Grpc {
        /// Interval of HTTP/2 pings, which find streams whose peer vanished.
        keepalive: Duration,
    },
}

/// Accepts connections on `listener` and serves each with the service `make(peer, local)`
/// builds, within `connections`' limits, until `stop` is cancelled; then lets every
/// connection finish its requests for up to `close_timeout` and cuts off the rest.
pub async fn serve<M, S, B>(
    listener: TcpListener,
    connections: Arc<Connections>,
    protocol: Protocol,
    make: M,
    stop: CancellationToken,
    close_timeout: Duration,
) where
    M: Fn(SocketAddr, SocketAddr) -> S,
    S: hyper::service::Service<Request<Incoming>, Response = Response<B>> + Send + Sync + 'static,
    S::Future: Send + 'static,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    B: Body<Data = Bytes> + Send + Unpin + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let builder = Arc::new(builder(protocol, connections.limits()));
    let local = listener.local_addr().ok();
    // Each connection task holds a sender: all are gone when every connection has closed.
    let (open, mut closed) = tokio::sync::mpsc::channel::<Infallible>(1);
    let cut_off = CancellationToken::new();
    loop {
        let (stream, peer) = tokio::select! {
            () = stop.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    // Out of file descriptors or similar: pause instead of spinning.
                    tracing::warn!(%error, "could not accept a connection");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let Some(slot) = connections.admit(peer.ip()) else {
            continue;
        };
        crate::server::no_delay(&stream);
        let service = make(peer, local.unwrap_or(peer));
        let task = Connection {
            builder: Arc::clone(&builder),
            limits: connections.limits().clone(),
            metrics: connections.metrics().clone(),
            stop: stop.clone(),
            cut_off: cut_off.clone(),
            _open: open.clone(),
        };
        tokio::spawn(super::rewoken::Rewoken::new(
            task.serve(stream, slot, service),
        ));
    }
    drop(listener);
    drop(open);
    if tokio::time::timeout(close_timeout, closed.recv())
        .await
        .is_err()
    {
        tracing::warn!("connections still open after the drain were cut off");
        cut_off.cancel();
    }
}

fn builder(protocol: Protocol, limits: &ConnectionLimits) -> auto::Builder<TokioExecutor> {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    let header_bytes = u32::try_from(limits.max_header_bytes).unwrap_or(u32::MAX);
    builder
        .http1()
        // Our watcher times head reads: hyper's would also end kept-alive connections.
        .header_read_timeout(None)
        .max_buf_size(limits.max_header_bytes.max(MIN_HEADER_BYTES));
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_header_list_size(header_bytes);
    match protocol {
        Protocol::Http => {
            // As poem's server sets them.
            builder.http2().max_pending_accept_reset_streams(Some(20));
            builder
        }
        Protocol::Grpc { keepalive } => {
            builder
                .http2()
                .keep_alive_interval(Some(keepalive))
                .keep_alive_timeout(Duration::from_secs(20));
            builder.http2_only()
        }
    }
}

/// One connection's task.
struct Connection {
    builder: Arc<auto::Builder<TokioExecutor>>,
    limits: ConnectionLimits,
    metrics: Metrics,
    stop: CancellationToken,
    cut_off: CancellationToken,
    _open: tokio::sync::mpsc::Sender<Infallible>,
}

impl Connection {
    async fn serve<S, B>(self, stream: TcpStream, slot: Slot, service: S)
    where
        S: hyper::service::Service<Request<Incoming>, Response = Response<B>>
            + Send
            + Sync
            + 'static,
        S::Future: Send + 'static,
        S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
        B: Body<Data = Bytes> + Send + Unpin + 'static,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let activity = Arc::new(Activity::default());
        let io = Watched {
            stream,
            activity: Arc::clone(&activity),
            _slot: slot,
        };
        let service = Tracked {
            inner: service,
            activity: Arc::clone(&activity),
        };
        let connection = self
            .builder
            .serve_connection_with_upgrades(TokioIo::new(io), service);
        let mut connection = std::pin::pin!(connection);
        let quiet = activity.quiet(&self.limits);
        tokio::select! {
            served = connection.as_mut() => return self.ended(served),
            quiet = quiet => match quiet {
                Quiet::HeaderTimeout => {
                    // Nothing is in flight: closing loses nothing.
                    self.metrics.refused(Refusal::HeaderTimeout);
                    tracing::debug!("closed a connection whose request head did not arrive in time");
                    return;
                }
                Quiet::Idle => connection.as_mut().graceful_shutdown(),
            },
            () = self.stop.cancelled() => connection.as_mut().graceful_shutdown(),
        }
        tokio::select! {
            served = connection => self.ended(served),
            () = self.cut_off.cancelled() => {}
        }
    }

    fn ended(&self, served: Result<(), Box<dyn std::error::Error + Send + Sync>>) {
        let Err(error) = served else { return };
        if error
            .downcast_ref::<hyper::Error>()
            .is_some_and(hyper::Error::is_parse_too_large)
        {
            // hyper has answered 431.
            self.metrics.refused(Refusal::HeaderTooLarge);
        }
        tracing::debug!(%error, "connection ended with an error");
    }
}

/// What a connection is doing, as its service and its socket see it.
#[derive(Debug, Default)]
struct Activity {
    /// Requests whose response has not been sent whole.
    in_flight: AtomicUsize,
    /// Requests started on the connection.
    started: AtomicUsize,
    /// Bytes arrived while no request was in flight (an HTTP/1 head has begun).
    head_begun: AtomicBool,
    /// The connection speaks HTTP/2, whose pings and settings are bytes but not heads.
    http2: AtomicBool,
    /// Woken on each of the above.
    changed: Notify,
}

/// Why a connection is to be closed.
enum Quiet {
    /// A request head took longer than the header-read timeout.
    HeaderTimeout,
    /// No request came for the keep-alive idle timeout.
    Idle,
}

impl Activity {
    /// Completes when the connection has been quiet too long: a head not arriving in time,
    /// or no request for the idle timeout. Never while a request is in flight.
    async fn quiet(&self, limits: &ConnectionLimits) -> Quiet {
        let mut deadline = tokio::time::Instant::now() + limits.header_read_timeout;
        let mut awaiting_head = true;
        // Requests started when last seen idle: one may have come and gone in between.
        let mut seen = 0;
        loop {
            // `notify_one` keeps a wake-up for a later `notified`: none is lost in between.
            let changed = self.changed.notified();
            if self.in_flight.load(Ordering::Acquire) > 0 {
                changed.await;
                continue;
            }
            let started = self.started.load(Ordering::Acquire);
            if started != seen {
                seen = started;
                awaiting_head = false;
                deadline = tokio::time::Instant::now() + limits.keep_alive_idle;
            }
            if !awaiting_head && self.head_begun.load(Ordering::Acquire) {
                awaiting_head = true;
                deadline = tokio::time::Instant::now() + limits.header_read_timeout;
            }
            tokio::select! {
                () = changed => {}
                () = tokio::time::sleep_until(deadline) => {
                    if self.in_flight.load(Ordering::Acquire) == 0 {
                        return if awaiting_head { Quiet::HeaderTimeout } else { Quiet::Idle };
                    }
                }
            }
        }
    }

    fn start(self: &Arc<Self>, http2: bool) -> InFlight {
        if http2 {
            self.http2.store(true, Ordering::Release);
        }
        self.head_begun.store(false, Ordering::Release);
        self.started.fetch_add(1, Ordering::AcqRel);
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        self.changed.notify_one();
        InFlight(Arc::clone(self))
    }
}

/// A request in flight, until its response has been sent (or abandoned).
struct InFlight(Arc<Activity>);

impl Drop for InFlight {
    fn drop(&mut self) {
        if self.0.in_flight.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.changed.notify_one();
        }
    }
}

/// A service whose requests count as in flight until their response body is done.
struct Tracked<S> {
    inner: S,
    activity: Arc<Activity>,
}

impl<S, B> hyper::service::Service<Request<Incoming>> for Tracked<S>
where
    S: hyper::service::Service<Request<Incoming>, Response = Response<B>>,
    S::Future: Send + 'static,
{
    type Response = Response<TrackedBody<B>>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, S::Error>> + Send>>;

    fn call(&self, request: Request<Incoming>) -> Self::Future {
        let in_flight = self
            .activity
            .start(request.version() == hyper::Version::HTTP_2);
        let answer = self.inner.call(request);
        Box::pin(async move {
            let response = answer.await?;
            Ok(response.map(|body| TrackedBody {
                body,
                _in_flight: in_flight,
            }))
        })
    }
}

/// A response body that keeps its request in flight until hyper drops it (sent, or the
/// connection gone).
struct TrackedBody<B> {
    body: B,
    _in_flight: InFlight,
}

impl<B: Body + Unpin> Body for TrackedBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// The socket of a connection: notes bytes arriving between requests, and holds the
/// connection's slot for as long as it lives (an upgraded WebSocket included).
struct Watched {
    stream: TcpStream,
    activity: Arc<Activity>,
    _slot: Slot,
}

impl AsyncRead for Watched {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let read = Pin::new(&mut self.stream).poll_read(cx, buf);
        let activity = &self.activity;
        if buf.filled().len() > before
            && activity.in_flight.load(Ordering::Acquire) == 0
            && !activity.http2.load(Ordering::Acquire)
            && !activity.head_begun.swap(true, Ordering::AcqRel)
        {
            activity.changed.notify_one();
        }
        read
    }
}

impl AsyncWrite for Watched {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn connections(per_address: usize, total: usize) -> Arc<Connections> {
        Connections::new(
            ConnectionLimits {
                max_per_address: per_address,
                max_total: total,
                uncapped: vec!["10.0.0.0/8".parse().unwrap()],
                ..ConnectionLimits::default()
            },
            Metrics::default(),
        )
    }

    #[test]
    fn connections_are_capped_per_address_and_in_all() {
        let connections = connections(2, 4);
        let ip = |text: &str| text.parse::<IpAddr>().unwrap();
        let first = connections.admit(ip("192.0.2.1")).unwrap();
        let _second = connections.admit(ip("192.0.2.1")).unwrap();
        assert!(connections.admit(ip("192.0.2.1")).is_none());
        // One /64 is one client.
        let _v6 = connections.admit(ip("2001:db8::1")).unwrap();
        let _v6b = connections.admit(ip("2001:db8::2")).unwrap();
        assert!(connections.admit(ip("2001:db8::3")).is_none());
        assert!(
            connections.admit(ip("10.1.2.3")).is_none(),
            "the total is full"
        );
        drop(first);
        assert_eq!(connections.open(), 3);
        let _again = connections.admit(ip("192.0.2.1")).unwrap();
        assert_eq!(connections.open(), 4);
    }

    #[test]
    fn trusted_proxies_count_only_in_the_total() {
        let connections = connections(1, 3);
        let proxy: IpAddr = "10.1.2.3".parse().unwrap();
        let held: Vec<_> = (0..3).map(|_| connections.admit(proxy).unwrap()).collect();
        assert!(connections.admit(proxy).is_none());
        drop(held);
        assert_eq!(connections.open(), 0);
    }

    #[test]
    fn the_default_total_leaves_room_below_the_open_files_limit() {
        let files = usize::try_from(raise_open_files_limit()).unwrap();
        let total = default_max_connections();
        assert!(total < files && total >= 64, "{total} of {files}");
    }
}
