//! Serving the relay: `run(relay, listeners, shutdown)` starts the gRPC service (with health
//! and reflection) and, when given a listener, the browser WebSocket; it returns after a
//! graceful shutdown. Binaries pass real listeners and a signal; tests pass `127.0.0.1:0`
//! listeners and a oneshot.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use thiserror::Error;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tonic::service::Routes;
use tonic::transport::server::TcpConnectInfo;
use toolrelay::proto::FILE_DESCRIPTOR_SET;

use crate::builtin::Registry;
use crate::clock::Clock;
use crate::config::{ENV_GATEWAY_SECRET, RelayConfig, StoreConfig};
use crate::grpc::RelayService;
use crate::limits::CORRELATION_ID_METADATA;
use crate::listen::{self, Connections, Protocol};
use crate::metrics::Metrics;
use crate::relay::Relay;
use crate::store::Store;
use crate::store::connecting::{Connecting, Connection};
use crate::store::memory::{MemoryStore, StoreLimits};
use crate::store::redis::RedisStore;
use crate::telemetry::RequestContext;
use crate::ws;

/// How long the servers may take to close their connections once the drain has ended.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(5);

/// Where the relay listens.
#[derive(Debug)]
pub struct Listeners {
    /// The gRPC service.
    pub grpc: TcpListener,
    /// The browser WebSocket, when the relay serves it itself (standalone relay).
    pub websocket: Option<TcpListener>,
}

/// Why serving stopped with an error.
#[derive(Debug, Error)]
pub enum ServeError {
    /// The reflection service could not be built from the descriptor sets.
    #[error("gRPC reflection could not be set up: {0}")]
    Reflection(#[from] tonic_reflection::server::Error),
}

/// A relay over a fresh in-memory store (one process, nothing shared) running `tools`,
/// reporting to `metrics`.
pub fn memory_relay(config: RelayConfig, tools: Registry, metrics: &Metrics) -> Relay {
    let clock = Clock::new();
    let store = MemoryStore::observed(clock.clone(), store_limits(&config), metrics.clone());
    Relay::with_tools(store, config, clock, tools, metrics.clone())
}

/// A relay over the store its configuration names, running `tools` (the binaries pass
/// `toolrelay-builtin`'s standard registry), reporting to `metrics`, once its store is
/// connected. With Redis this waits (saying so in the log) until Redis answers.
pub async fn relay(
    config: RelayConfig,
    tools: Registry,
    metrics: &Metrics,
) -> Result<Relay, String> {
    let (relay, mut connection) = start_relay(config, tools, metrics);
    connection.ready().await?;
    Ok(relay)
}

/// [`relay`] at once, its store connecting in the background: the binaries serve (and answer
/// `/healthz`) meanwhile, with `/readyz` red and requests refused with 503 `store_unavailable`
/// until Redis answers. The connection ends the process if it fails for good
/// ([`Connection::failed`]).
pub fn start_relay(config: RelayConfig, tools: Registry, metrics: &Metrics) -> (Relay, Connection) {
    if config.store == StoreConfig::Memory {
        return (memory_relay(config, tools, metrics), Connection::made());
    }
    let clock = Clock::new();
    let (store, connection) = start_store(&config.store, &clock, store_limits(&config), metrics);
    let relay = Relay::with_tools(store, config, clock, tools, metrics.clone());
    (relay, connection)
}

/// The store `config` names, within `limits`, counting what it expires into `metrics`. A Redis
/// store connects in the background ([`Connecting`]): it answers [`StoreError`]s until Redis
/// answers.
///
/// [`StoreError`]: crate::error::StoreError
pub fn start_store(
    config: &StoreConfig,
    clock: &Clock,
    limits: StoreLimits,
    metrics: &Metrics,
) -> (Arc<dyn Store>, Connection) {
    match config {
        StoreConfig::Memory => (
            MemoryStore::observed(clock.clone(), limits, metrics.clone()),
            Connection::made(),
        ),
        StoreConfig::Redis(settings) => {
            let (settings, metrics) = (settings.clone(), metrics.clone());
            let connect_clock = clock.clone();
            let connect = async move {
                let store = RedisStore::connect(&settings, connect_clock, limits, metrics)
                    .await
                    .map_err(|error| error.to_string())?;
                tracing::info!(prefix = %settings.prefix, "state in Redis, shared with every replica using it");
                Ok(store as Arc<dyn Store>)
            };
            let (store, connection) = Connecting::start("Redis".to_owned(), clock.clone(), connect);
            (store, connection)
        }
    }
}

fn store_limits(config: &RelayConfig) -> StoreLimits {
    StoreLimits {
        answer_budget: config.response_budget,
        session_answer_budget: crate::store::rules::share_of(
            config.response_budget,
            config.response_session_share,
        ),
        ..StoreLimits::keeping(config.response_retention)
    }
}

/// Binds a listener; the error names the setting (`variable`) that chose the address.
pub async fn bind(address: std::net::SocketAddr, variable: &str) -> Result<TcpListener, String> {
    TcpListener::bind(address).await.map_err(|error| {
        format!("cannot listen on {address} (set by {variable} or its flag): {error}")
    })
}

/// A binary's exit: success, or the error on stderr (prefixed with the binary's name) and a
/// failure code.
pub fn exit_code(binary: &str, served: Result<(), String>) -> std::process::ExitCode {
    match served {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("{binary}: {message}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// The address a listener is bound to (the real port when it was bound to port 0), for logs.
pub fn local(listener: &TcpListener) -> String {
    listener.local_addr().map_or_else(
        |error| format!("(unknown: {error})"),
        |address| address.to_string(),
    )
}

/// How often the gRPC health status is brought in line with the store's while serving.
const STORE_CHECK_EVERY: Duration = Duration::from_secs(1);
/// How often while not serving: a store that answers again (or a connection just made at
/// start) is served at once.
const STORE_RECHECK_EVERY: Duration = Duration::from_millis(200);

/// Keeps the gRPC health status (what a split gateway's `/readyz` and Kubernetes probes ask)
/// in line with the store: not serving while it does not answer, serving again when it does.
async fn watch_store(
    relay: Relay,
    health: tonic_health::server::HealthReporter,
    stop: CancellationToken,
) {
    let mut serving = true;
    // The first check at once: a store still connecting turns the status red from the start.
    let mut wait = Duration::ZERO;
    loop {
        tokio::select! {
            () = tokio::time::sleep(wait) => {}
            () = stop.cancelled() => return,
        }
        match (relay.ready().await, serving) {
            (Err(error), true) => {
                tracing::warn!(%error, "the store does not answer: not serving until it does");
                health.set_not_serving::<RelayService>().await;
                serving = false;
            }
            (Ok(()), false) => {
                tracing::info!("the store answers again: serving");
                health.set_serving::<RelayService>().await;
                serving = true;
            }
            _ => {}
        }
        wait = if serving {
            STORE_CHECK_EVERY
        } else {
            STORE_RECHECK_EVERY
        };
    }
}

/// Serves until `shutdown` completes, then drains (see [`crate::drain`]): new sessions, calls
/// and attaches are refused while connected providers may still answer what they were given,
/// until every such call is answered or the drain deadline passes; then providers are told to
/// reconnect elsewhere and the servers stop. Its listeners share connection caps of their own.
pub async fn run(
    relay: Relay,
    listeners: Listeners,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), ServeError> {
    let connections = Connections::new(relay.config().connections.clone(), relay.metrics().clone());
    run_sharing(relay, listeners, connections, shutdown).await
}

/// [`run`], with the listeners' connections counted in `connections`, which other listeners of
/// the process (the one-process gateway's) share.
pub async fn run_sharing(
    relay: Relay,
    listeners: Listeners,
    connections: Arc<Connections>,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), ServeError> {
    let stop = CancellationToken::new();
    let (health, health_service) = tonic_health::server::health_reporter();
    health.set_serving::<RelayService>().await;
    // v1 for current tools, v1alpha for grpcurl-style tools and Python's grpcio-reflection.
    let reflection_v1 = reflection().build_v1()?;
    let reflection_v1alpha = reflection().build_v1alpha()?;

    if relay.config().gateway_secrets.is_none() {
        tracing::info!(
            "{ENV_GATEWAY_SECRET} is not set: the gRPC port believes no client address a peer names, and counts every request against its peer (a gateway in another process needs the same secret)"
        );
    }
    let routes = Routes::new(health_service)
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha)
        .add_service(RelayService::server(relay.clone()))
        .prepare();
    // HTTP/2 keepalive finds `Connect` streams whose peer vanished without closing them.
    let keepalive = relay.config().heartbeat_interval;
    let grpc = listen::serve(
        listeners.grpc,
        Arc::clone(&connections),
        Protocol::Grpc { keepalive },
        move |peer, local| GrpcConnection {
            routes: routes.clone(),
            info: TcpConnectInfo {
                local_addr: Some(local),
                remote_addr: Some(peer),
            },
        },
        stop.clone(),
        CLOSE_TIMEOUT,
    );
    let grpc = tokio::spawn(grpc);
    let websocket = listeners.websocket.map(|listener| {
        tokio::spawn(ws::serve_listener(
            relay.clone(),
            listener,
            Arc::clone(&connections),
            stop.clone(),
        ))
    });
    let watching = tokio::spawn(watch_store(relay.clone(), health.clone(), stop.clone()));

    shutdown.await;
    // Health turns red first, so load balancers stop sending work while the drain runs; the
    // listeners stay open, because tabs still answer over them.
    watching.abort();
    health.set_not_serving::<RelayService>().await;
    // Other relays share a Redis store: they take over this one's tabs and their queued calls.
    if relay.config().store != StoreConfig::Memory {
        relay.drain().hand_over();
        tracing::info!(
            "draining: refusing new work and delivering no new call; each tab moves to another relay once its delivered calls are answered"
        );
    } else {
        tracing::info!("draining: refusing new work, waiting for delivered calls to be answered");
    }
    let unanswered = relay.drain().run(relay.config().drain_timeout).await;
    tracing::info!(
        unanswered,
        "drained: telling providers to reconnect and stopping"
    );
    stop.cancel();
    if let Some(websocket) = websocket {
        let _ = websocket.await;
    }
    if !relay.drain().sockets_closed(CLOSE_TIMEOUT).await {
        tracing::warn!("some tabs' WebSockets did not close in time");
    }
    // The server cuts off what is still open CLOSE_TIMEOUT after the stop.
    let _ = grpc.await;
    Ok(())
}

/// One gRPC connection's service: tonic's routes, with the connection's addresses where tonic
/// looks for them (`Request::remote_addr`) and each RPC in its context for the logs.
struct GrpcConnection {
    routes: Routes,
    info: TcpConnectInfo,
}

impl hyper::service::Service<hyper::Request<hyper::body::Incoming>> for GrpcConnection {
    type Response = hyper::Response<tonic::body::Body>;
    type Error = std::convert::Infallible;
    type Future = futures::future::BoxFuture<'static, Result<Self::Response, Self::Error>>;

    fn call(&self, mut request: hyper::Request<hyper::body::Incoming>) -> Self::Future {
        request.extensions_mut().insert(self.info.clone());
        let context = rpc_context(&request);
        let mut routes = self.routes.clone();
        Box::pin(context.scope(tonic::codegen::Service::call(&mut routes, request)))
    }
}

/// The context of one RPC for the logs: its method and correlation id (the caller's
/// `x-request-id`, which a gateway passes on, or a new one), so that every log line of the call
/// carries them.
fn rpc_context<B>(request: &hyper::Request<B>) -> RequestContext {
    let sent = request
        .headers()
        .get(CORRELATION_ID_METADATA)
        .and_then(|value| value.to_str().ok());
    RequestContext::rpc(
        RequestContext::correlation_id_from(sent),
        request.uri().clone(),
    )
}

/// Turns Nagle's algorithm off on a connection: every message the relay sends is small and
/// wanted now (and tonic applies `TCP_NODELAY` only to listeners it binds itself). Every
/// socket the relay and the gateway accept goes through here.
pub fn no_delay(stream: &tokio::net::TcpStream) {
    if let Err(error) = stream.set_nodelay(true) {
        tracing::debug!(%error, "could not disable Nagle's algorithm");
    }
}

fn reflection() -> tonic_reflection::server::Builder<'static> {
    tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
}

/// Completes on Ctrl-C or SIGTERM (how Kubernetes stops a pod).
pub async fn shutdown_signal() {
    let interrupt = async {
        if let Err(error) = tokio::signal::ctrl_c().await {
            tracing::error!(%error, "cannot listen for Ctrl-C");
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(error) => {
                tracing::error!(%error, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = interrupt => {}
        () = terminate => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn accepted_grpc_connections_have_nagle_off() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let _client = tokio::net::TcpStream::connect(address).await.unwrap();
        let (stream, _) = listener.accept().await.unwrap();
        no_delay(&stream);
        assert!(stream.nodelay().unwrap());
    }
}
