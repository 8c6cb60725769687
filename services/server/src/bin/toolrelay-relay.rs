//! `toolrelay-relay`: the relay on its own, for split deployments. Serves gRPC (consumers,
//! the gateway, backend providers) and the browser WebSocket, whose port also answers
//! `/healthz`, `/readyz` and `/metrics` over plain HTTP (for probes and Prometheus).

use std::net::SocketAddr;
use std::process::ExitCode;

use clap::Parser;
use toolrelay_builtin::ToolArgs;
use toolrelay_relay::config::{ENV_GRPC_LISTEN, ENV_WS_LISTEN, LogArgs, RelayArgs, ServiceArgs};
use toolrelay_relay::server::{self, Listeners, bind, local};
use toolrelay_relay::{Metrics, telemetry};

/// jemalloc rather than glibc's malloc: parsing big MIP models on many threads left glibc's
/// per-thread arenas holding hundreds of MB that were free (see scripts/mip-memory.py).
#[cfg(not(feature = "system-allocator"))]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// The toolrelay relay: sessions, tool routing and provider streams over gRPC and WebSocket.
#[derive(Debug, Parser)]
#[command(name = "toolrelay-relay", version, about)]
struct Cli {
    #[command(flatten)]
    relay: RelayArgs,
    #[command(flatten)]
    tools: ToolArgs,
    #[command(flatten)]
    service: ServiceArgs,
    #[command(flatten)]
    log: LogArgs,
    /// Address of the browser WebSocket (`/api/sessions/{code}/ws?token=…`), which also
    /// answers `GET /healthz`, `/readyz` and `/metrics`.
    #[arg(long, env = ENV_WS_LISTEN, default_value = "127.0.0.1:8081")]
    ws_listen: SocketAddr,
}

#[tokio::main]
async fn main() -> ExitCode {
    // Before the settings: the default connection cap derives from the raised limit.
    toolrelay_relay::listen::raise_open_files_limit();
    let cli = Cli::parse();
    let _log = telemetry::init(cli.log.log_format);
    server::exit_code("toolrelay-relay", serve(cli).await)
}

async fn serve(cli: Cli) -> Result<(), String> {
    let config = cli.relay.relay_config(&cli.service)?;
    let tools = cli.tools.builtin_config()?;
    let grpc = bind(cli.relay.grpc_listen, ENV_GRPC_LISTEN).await?;
    let config = config.with_grpc_bound(grpc.local_addr().map_err(|error| error.to_string())?);
    let websocket = bind(cli.ws_listen, ENV_WS_LISTEN).await?;
    let metrics = Metrics::new("toolrelay-relay");
    // Built before the line saying it listens: building it checks the MIP sandbox.
    let tools = toolrelay_builtin::standard(&tools, &metrics);
    // Serves while the store connects: `/healthz` answers at once, `/readyz` once it is made.
    let (relay, connection) = server::start_relay(config, tools, &metrics);
    tracing::info!(grpc = %local(&grpc), websocket = %local(&websocket), "toolrelay-relay listening");
    let listeners = Listeners {
        grpc,
        websocket: Some(websocket),
    };
    tokio::select! {
        served = server::run(relay, listeners, server::shutdown_signal()) => {
            served.map_err(|error| error.to_string())
        }
        message = connection.failed() => Err(message),
    }
}
