//! Serving the relay: `run(relay, listeners, shutdown)` starts the gRPC service (with health
//! and reflection) and, when given a listener, the browser WebSocket; it returns after a
//! graceful shutdown. Binaries pass real listeners and a signal; tests pass `127.0.0.1:0`
//! listeners and a oneshot.

use std::future::Future;
use std::time::Duration;

use thiserror::Error;
use tokio::net::TcpListener;
use tokio_stream::wrappers::TcpListenerStream;
use tokio_util::sync::CancellationToken;
use toolrelay::proto::FILE_DESCRIPTOR_SET;
use toolrelay::proto::v1::relay_server::RelayServer;

use crate::clock::Clock;
use crate::config::RelayConfig;
use crate::grpc::RelayService;
use crate::relay::Relay;
use crate::store::memory::MemoryStore;
use crate::ws;

/// How long in-flight calls may take to finish after a shutdown signal.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(10);

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
    /// The gRPC server failed.
    #[error("the gRPC server failed: {0}")]
    Grpc(#[from] tonic::transport::Error),
}

/// A relay over a fresh in-memory store (one process, nothing shared).
pub fn memory_relay(config: RelayConfig) -> Relay {
    let clock = Clock::new();
    let store = MemoryStore::new(clock.clone(), config.response_retention);
    Relay::new(store, config, clock)
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

/// Serves until `shutdown` completes, then tells connected providers to reconnect, stops
/// accepting, and gives in-flight calls [`DRAIN_TIMEOUT`] to finish.
pub async fn run(
    relay: Relay,
    listeners: Listeners,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), ServeError> {
    let stop = CancellationToken::new();
    let (health, health_service) = tonic_health::server::health_reporter();
    health.set_serving::<RelayServer<RelayService>>().await;
    // v1 for current tools, v1alpha for grpcurl-style tools and Python's grpcio-reflection.
    let reflection_v1 = reflection().build_v1()?;
    let reflection_v1alpha = reflection().build_v1alpha()?;

    // HTTP/2 keepalive finds `Connect` streams whose peer vanished without closing them.
    let keepalive = relay.config().heartbeat_interval;
    let grpc = tonic::transport::Server::builder()
        .http2_keepalive_interval(Some(keepalive))
        .http2_keepalive_timeout(Some(Duration::from_secs(20)))
        .add_service(health_service)
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha)
        .add_service(RelayService::server(relay.clone()))
        .serve_with_incoming_shutdown(
            TcpListenerStream::new(listeners.grpc),
            stop.clone().cancelled_owned(),
        );
    let mut grpc = tokio::spawn(grpc);
    let websocket = listeners
        .websocket
        .map(|listener| tokio::spawn(ws::serve_listener(relay.clone(), listener, stop.clone())));

    tokio::select! {
        () = shutdown => {}
        finished = &mut grpc => {
            // The server ended on its own: that is an error worth reporting.
            stop.cancel();
            relay.shutdown();
            return match finished {
                Ok(result) => result.map_err(ServeError::from),
                Err(_) => Ok(()),
            };
        }
    }
    tracing::info!("shutting down: telling providers to reconnect and draining calls");
    health.set_not_serving::<RelayServer<RelayService>>().await;
    relay.shutdown();
    stop.cancel();
    if let Some(websocket) = websocket {
        let _ = websocket.await;
    }
    match tokio::time::timeout(DRAIN_TIMEOUT, &mut grpc).await {
        Ok(Ok(result)) => result?,
        Ok(Err(_)) => {}
        Err(_) => {
            tracing::warn!("calls still running after the drain timeout were cut off");
            grpc.abort();
        }
    }
    Ok(())
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
