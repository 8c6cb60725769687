//! The relay replicas behind a gateway's `RELAY_URL`: one gRPC channel — one HTTP/2
//! connection — per replica, taken in turn.
//!
//! `RELAY_URL` lists one URL or several, comma-separated. A URL whose host is a name is
//! resolved again every [`RESOLVE_EVERY`], and every address it has is a replica of its own:
//! a Kubernetes headless Service lists each ready relay pod, so the gateway spreads its calls
//! over all of them and follows the pods as they come and go. (A plain Service has one
//! address, and its one connection would pin one pod.)
//!
//! A replica that does not answer — its process died, its connection broke — is passed over
//! for [`PASS_OVER`], and the call is tried on the next one when that is safe (see
//! [`Retry`]): every call and wait carries its `requestId`, so asking another replica again is
//! the same call, never a second one. A replica that refuses a call because it is draining
//! (`shutting_down`, a rolling restart) is passed over the same way, and a call that is safe
//! to ask again is tried on each other replica once before its caller hears the refusal.

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::Duration;

use tokio::time::Instant;
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Status};

use crate::error::ErrorCode;
use crate::grpc::ERROR_METADATA;

/// How often names in `RELAY_URL` are resolved again.
pub const RESOLVE_EVERY: Duration = Duration::from_secs(5);
/// How long a replica that did not answer is passed over.
pub const PASS_OVER: Duration = Duration::from_secs(2);
/// Most replicas one call is tried on.
const MAX_ATTEMPTS: usize = 3;
/// How long a pool of one replica waits before it tries a call again on it.
const RETRY_PAUSE: Duration = Duration::from_millis(100);

/// Whether a call may be tried again on another replica after its replica did not answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Retry {
    /// Asking again is the same call (reads, and calls named by their `requestId`).
    Safe,
    /// Only if the replica refused the connection, so the call never reached it (ending a
    /// session, posting an answer, polling for calls).
    IfNotSent,
}

/// The replicas, kept up to date in the background. Cheap to clone.
#[derive(Clone, Debug)]
pub struct RelayPool {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    targets: Vec<Target>,
    /// The replicas of each target, in `targets` order.
    replicas: RwLock<Vec<Vec<Arc<Replica>>>>,
    next: AtomicUsize,
}

/// One URL of `RELAY_URL`.
#[derive(Debug)]
struct Target {
    url: String,
    host: String,
    port: u16,
    /// Whether the host is an address already: nothing to resolve.
    literal: bool,
}

/// One relay replica and the connection to it.
#[derive(Debug)]
struct Replica {
    /// `http://address:port`, or the URL as given until its name is resolved.
    url: String,
    channel: Channel,
    passed_over_until: Mutex<Option<Instant>>,
}

impl Replica {
    fn new(url: String) -> Result<Arc<Self>, String> {
        let endpoint = Endpoint::from_shared(url.clone())
            .map_err(|error| format!("{url} is not a usable relay URL: {error}"))?
            .connect_timeout(Duration::from_secs(5))
            .tcp_nodelay(true)
            // A relay that vanished without closing the connection (a lost node) is noticed
            // by its silence, not only when a call times out.
            .http2_keep_alive_interval(Duration::from_secs(10))
            .keep_alive_timeout(Duration::from_secs(5))
            .keep_alive_while_idle(true);
        Ok(Arc::new(Self {
            url,
            channel: endpoint.connect_lazy(),
            passed_over_until: Mutex::new(None),
        }))
    }

    fn passed_over(&self, now: Instant) -> bool {
        self.lock().is_some_and(|until| until > now)
    }

    fn pass_over(&self) {
        *self.lock() = Some(Instant::now() + PASS_OVER);
    }

    fn answered(&self) {
        *self.lock() = None;
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Instant>> {
        self.passed_over_until
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl RelayPool {
    /// The replicas behind `urls` (comma-separated `http://host:port`). Connects lazily, so
    /// the gateway starts while the relays are still coming up; a malformed URL is an error
    /// now. Must be called within a Tokio runtime: names are resolved in a background task,
    /// which ends with the last clone of the pool.
    pub fn new(urls: &str) -> Result<Self, String> {
        let targets = urls
            .split(',')
            .map(str::trim)
            .filter(|url| !url.is_empty())
            .map(Target::parse)
            .collect::<Result<Vec<_>, _>>()?;
        if targets.is_empty() {
            return Err(
                "no relay URL given: use http://host:port (for example http://toolrelay-relay:50051), several comma-separated".into(),
            );
        }
        // Until a name is resolved, its URL stands for it (the connection resolves it).
        let replicas = targets
            .iter()
            .map(|target| Replica::new(target.url.clone()).map(|replica| vec![replica]))
            .collect::<Result<Vec<_>, _>>()?;
        let pool = Self {
            inner: Arc::new(Inner {
                targets,
                replicas: RwLock::new(replicas),
                next: AtomicUsize::new(0),
            }),
        };
        if pool.inner.targets.iter().any(|target| !target.literal) {
            tokio::spawn(resolve_forever(Arc::downgrade(&pool.inner)));
        }
        Ok(pool)
    }

    /// The replicas' URLs now.
    pub fn replicas(&self) -> Vec<String> {
        self.inner
            .snapshot()
            .iter()
            .map(|replica| replica.url.clone())
            .collect()
    }

    /// Runs `attempt` on a replica's channel, and on the next replica when this one did not
    /// answer and `retry` allows it (at most `MAX_ATTEMPTS` replicas), or when it is draining
    /// and `retry` is [`Retry::Safe`] (every replica once at most). A pool of one replica
    /// tries it once more, after [`RETRY_PAUSE`], when it did not answer and `retry` allows
    /// it: a connection that could not be made (the channel reports a failed connection to
    /// one call, and the next connects again) does not fail the call.
    pub async fn run<T, F, Fut>(&self, retry: Retry, mut attempt: F) -> Result<T, Status>
    where
        F: FnMut(Channel) -> Fut,
        Fut: Future<Output = Result<T, Status>>,
    {
        let mut tried: Vec<Arc<Replica>> = Vec::new();
        loop {
            let replica = self.inner.pick(&tried);
            match attempt(replica.channel.clone()).await {
                Err(status) if !answered(&status) => {
                    replica.pass_over();
                    let retriable = tried.len() + 1 < MAX_ATTEMPTS
                        && (retry == Retry::Safe || not_sent(&status));
                    let elsewhere = self.inner.has_untried(&tried, &replica);
                    let once_more = tried.is_empty() && self.inner.is_single();
                    let again = retriable && (elsewhere || once_more);
                    tracing::warn!(
                        replica = %replica.url,
                        code = ?status.code(),
                        detail = status.message(),
                        cause = ?std::error::Error::source(&status),
                        trying_again = again,
                        "a relay replica did not answer"
                    );
                    if !again {
                        return Err(status);
                    }
                    if once_more {
                        tokio::time::sleep(RETRY_PAUSE).await;
                    }
                    tried.push(replica);
                }
                Err(status) if retry == Retry::Safe && draining(&status) => {
                    // Refused before it did anything: another replica takes the call.
                    replica.pass_over();
                    let again = self.inner.has_untried(&tried, &replica);
                    tracing::info!(
                        replica = %replica.url,
                        trying_another = again,
                        "a relay replica is draining"
                    );
                    if !again {
                        return Err(status);
                    }
                    tried.push(replica);
                }
                outcome => {
                    replica.answered();
                    return outcome;
                }
            }
        }
    }
}

impl Inner {
    fn snapshot(&self) -> Vec<Arc<Replica>> {
        self.replicas
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .iter()
            .flatten()
            .cloned()
            .collect()
    }

    /// The next replica in turn that was not tried and is not passed over; failing that, one
    /// that was not tried; failing that, the next in turn.
    fn pick(&self, tried: &[Arc<Replica>]) -> Arc<Replica> {
        let replicas = self.snapshot();
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        let now = Instant::now();
        let in_turn = || (0..replicas.len()).map(|n| &replicas[(start + n) % replicas.len()]);
        let untried = |replica: &&Arc<Replica>| !tried.iter().any(|t| Arc::ptr_eq(t, replica));
        in_turn()
            .filter(untried)
            .find(|replica| !replica.passed_over(now))
            .or_else(|| in_turn().find(untried))
            .or_else(|| in_turn().next())
            .cloned()
            .expect("a pool has a replica per target at least")
    }

    /// Whether the pool has one replica only.
    fn is_single(&self) -> bool {
        self.replicas
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .iter()
            .map(Vec::len)
            .sum::<usize>()
            == 1
    }

    fn has_untried(&self, tried: &[Arc<Replica>], current: &Arc<Replica>) -> bool {
        self.snapshot().iter().any(|replica| {
            !Arc::ptr_eq(replica, current) && !tried.iter().any(|t| Arc::ptr_eq(t, replica))
        })
    }
}

impl Target {
    fn parse(url: &str) -> Result<Self, String> {
        let uri: tonic::codegen::http::Uri = url
            .parse()
            .map_err(|error| format!("{url:?} is not a URL ({error}); use http://host:port"))?;
        let host = uri.host().filter(|host| !host.is_empty());
        let (Some("http"), Some(host)) = (uri.scheme_str(), host) else {
            return Err(format!(
                "{url:?} is not a relay URL: use http://host:port (for example http://toolrelay-relay:50051); the relay's gRPC is plain HTTP/2 inside the cluster"
            ));
        };
        let host = host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned();
        Ok(Self {
            url: url.trim_end_matches('/').to_owned(),
            literal: host.parse::<IpAddr>().is_ok(),
            port: uri.port_u16().unwrap_or(80),
            host,
        })
    }

    /// The target's addresses now, in a stable order; `None` when the name does not resolve.
    async fn resolve(&self) -> Option<Vec<SocketAddr>> {
        match tokio::net::lookup_host((self.host.as_str(), self.port)).await {
            Ok(found) => {
                let mut found: Vec<_> = found.collect();
                found.sort_unstable();
                found.dedup();
                (!found.is_empty()).then_some(found)
            }
            Err(error) => {
                tracing::warn!(relay = %self.url, %error, "the relay's name does not resolve; keeping the replicas known");
                None
            }
        }
    }
}

/// Resolves the pool's names now and every [`RESOLVE_EVERY`]; a replica that stays keeps its
/// connection, one that is gone is dropped, a new one is added. Ends with the pool.
async fn resolve_forever(pool: Weak<Inner>) {
    let mut every = tokio::time::interval(RESOLVE_EVERY);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        every.tick().await;
        let Some(inner) = pool.upgrade() else { return };
        for (index, target) in inner.targets.iter().enumerate() {
            if target.literal {
                continue;
            }
            let Some(addresses) = target.resolve().await else {
                continue;
            };
            let urls: Vec<String> = addresses
                .iter()
                .map(|address| format!("http://{address}"))
                .collect();
            let known = inner.replicas.read().map(|all| all[index].clone());
            let Ok(known) = known else { return };
            if known.iter().map(|replica| &replica.url).eq(urls.iter()) {
                continue;
            }
            let replicas: Vec<_> = urls
                .into_iter()
                .filter_map(
                    |url| match known.iter().find(|replica| replica.url == url) {
                        Some(replica) => Some(Arc::clone(replica)),
                        None => Replica::new(url).ok(),
                    },
                )
                .collect();
            tracing::info!(
                relay = %target.url,
                replicas = ?replicas.iter().map(|replica| replica.url.as_str()).collect::<Vec<_>>(),
                "relay replicas"
            );
            if let Ok(mut all) = inner.replicas.write() {
                all[index] = replicas;
            }
        }
    }
}

/// Whether the relay answered (with a result or its own error), as opposed to the call
/// failing on the way: the relay names each of its errors in `x-error`. (A relay that stops
/// resets the HTTP/2 streams still open on its connections, which tonic reports as
/// `Internal` "h2 protocol error" or `Cancelled`.)
fn answered(status: &Status) -> bool {
    status.metadata().get(ERROR_METADATA).is_some()
        || !matches!(
            status.code(),
            Code::Unavailable | Code::Unknown | Code::Internal | Code::Cancelled
        )
}

/// Whether the relay refused the call because it is draining.
fn draining(status: &Status) -> bool {
    status
        .metadata()
        .get(ERROR_METADATA)
        .and_then(|value| value.to_str().ok())
        .and_then(ErrorCode::parse)
        == Some(ErrorCode::ShuttingDown)
}

/// Whether the call never reached the relay: the connection to it was refused or could not
/// be made.
fn not_sent(status: &Status) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(status);
    while let Some(error) = source {
        if let Some(io) = error.downcast_ref::<std::io::Error>()
            && matches!(
                io.kind(),
                std::io::ErrorKind::ConnectionRefused | std::io::ErrorKind::TimedOut
            )
        {
            return true;
        }
        source = error.source();
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn urls_are_checked_and_listed_in_order() {
        let pool = RelayPool::new("http://127.0.0.1:50051, http://[::1]:50052/").unwrap();
        assert_eq!(
            pool.replicas(),
            ["http://127.0.0.1:50051", "http://[::1]:50052"]
        );
        for bad in [
            "",
            " , ",
            "relay:50051",
            "https://relay:50051",
            "ftp://relay",
        ] {
            let error = RelayPool::new(bad).unwrap_err();
            assert!(error.contains("http://host:port"), "{bad}: {error}");
        }
    }

    #[tokio::test]
    async fn a_name_becomes_a_replica_per_address() {
        let pool = RelayPool::new("http://localhost:50051").unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while pool.replicas() == ["http://localhost:50051"] {
            assert!(Instant::now() < deadline, "localhost was never resolved");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let replicas = pool.replicas();
        assert!(
            replicas.contains(&"http://127.0.0.1:50051".to_owned()),
            "{replicas:?}"
        );
    }

    #[tokio::test]
    async fn a_call_moves_on_from_a_replica_that_refuses_it() {
        // Nothing listens on the first port: the call is not sent there, and moves on.
        let closed_port = closed_port();
        let pool = RelayPool::new(&format!(
            "http://127.0.0.1:{closed_port},http://127.0.0.1:{closed_port}"
        ))
        .unwrap();
        let (outcome, seen) = checked(&pool, Retry::IfNotSent).await;
        let status = outcome.unwrap_err();
        assert_eq!(status.code(), Code::Unavailable, "{status:?}");
        assert!(not_sent(&status), "{status:?}");
        assert_eq!(seen, 2, "tried on both replicas");
    }

    /// A port nothing listens on.
    fn closed_port() -> u16 {
        let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        closed.local_addr().unwrap().port()
    }

    /// A health check run through `pool`, and how many replicas it was tried on.
    async fn checked(pool: &RelayPool, retry: Retry) -> (Result<(), Status>, usize) {
        let mut seen = 0;
        let outcome = pool
            .run(retry, |channel| {
                seen += 1;
                async move {
                    let mut health = tonic_health::pb::health_client::HealthClient::new(channel);
                    health
                        .check(tonic_health::pb::HealthCheckRequest::default())
                        .await
                        .map(|_| ())
                }
            })
            .await;
        (outcome, seen)
    }

    #[tokio::test]
    async fn a_pool_of_one_tries_its_replica_once_more_when_a_connection_failed() {
        // The replica closes its first connection unanswered, and serves the next.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let incoming = futures::stream::unfold((listener, true), |(listener, first)| async move {
            if first {
                drop(listener.accept().await);
            }
            let accepted = listener.accept().await.map(|(stream, _)| stream);
            Some((accepted, (listener, false)))
        });
        let (_reporter, health) = tonic_health::server::health_reporter();
        let server = tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(health)
                .serve_with_incoming(incoming),
        );
        let pool = RelayPool::new(&format!("http://127.0.0.1:{port}")).unwrap();
        let (outcome, seen) = checked(&pool, Retry::Safe).await;
        server.abort();
        assert!(outcome.is_ok(), "{outcome:?}");
        assert_eq!(seen, 2, "the failed connection, then the call answered");

        // Nothing listens: the call is tried twice (it was not sent), then fails.
        let pool = RelayPool::new(&format!("http://127.0.0.1:{}", closed_port())).unwrap();
        let (outcome, seen) = checked(&pool, Retry::IfNotSent).await;
        let status = outcome.unwrap_err();
        assert!(not_sent(&status), "{status:?}");
        assert_eq!(seen, 2, "tried once more, and no more");
    }
}
