//! `toolrelay`: the whole system in one process with the in-memory store — the gateway (REST
//! API, SSE, polling, the browser WebSocket) on `--listen` (default 127.0.0.1:8080) and the
//! relay's gRPC service on `--grpc-listen` (default 127.0.0.1:50051), so backend services can
//! attach too. With `--relay-url` it is the gateway alone, in front of a `toolrelay-relay`.

use std::process::ExitCode;

use clap::Parser;
use toolrelay_builtin::ToolArgs;
use toolrelay_gateway::config::{ENV_LISTEN, GatewayArgs};
use toolrelay_gateway::server::{self, Server};
use toolrelay_relay::config::{ENV_GRPC_LISTEN, LogArgs, RelayArgs, ServiceArgs};
use toolrelay_relay::server::{bind, exit_code, shutdown_signal, start_relay};
use toolrelay_relay::{Metrics, telemetry};

/// jemalloc rather than glibc's malloc: parsing big MIP models on many threads left glibc's
/// per-thread arenas holding hundreds of MB that were free (see scripts/mip-memory.py).
#[cfg(not(feature = "system-allocator"))]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// toolrelay: lets an LLM call tools that live in a browser tab, a backend service or the relay.
#[derive(Debug, Parser)]
#[command(name = "toolrelay", version, about)]
struct Cli {
    #[command(flatten)]
    gateway: GatewayArgs,
    #[command(flatten)]
    relay: RelayArgs,
    #[command(flatten)]
    tools: ToolArgs,
    #[command(flatten)]
    service: ServiceArgs,
    #[command(flatten)]
    log: LogArgs,
}

#[tokio::main]
async fn main() -> ExitCode {
    // Before the settings: the default connection cap derives from the raised limit.
    toolrelay_relay::listen::raise_open_files_limit();
    let cli = Cli::parse();
    let _log = telemetry::init(cli.log.log_format);
    exit_code("toolrelay", serve(cli).await)
}

async fn serve(cli: Cli) -> Result<(), String> {
    let public = bind(cli.gateway.listen, ENV_LISTEN).await?;
    let bound = public.local_addr().map_err(|error| error.to_string())?;
    let config = cli.gateway.gateway_config(bound, &cli.service)?;
    if let Some(url) = &cli.gateway.relay_url {
        let gateway = Server::in_front_of(url, config, Metrics::new("toolrelay"))?
            .named("toolrelay gateway")
            .drain_timeout(cli.service.drain_timeout());
        return server::run(gateway, public, shutdown_signal()).await;
    }
    let relay_config = cli.relay.relay_config(&cli.service)?;
    let tools = cli.tools.builtin_config()?;
    let grpc = bind(cli.relay.grpc_listen, ENV_GRPC_LISTEN).await?;
    let relay_config =
        relay_config.with_grpc_bound(grpc.local_addr().map_err(|error| error.to_string())?);
    let metrics = Metrics::new("toolrelay");
    // Built before the line saying it listens: building it checks the MIP sandbox.
    let tools = toolrelay_builtin::standard(&tools, &metrics);
    // Serves while the store connects: `/healthz` answers at once, `/readyz` once it is made.
    let (relay, connection) = start_relay(relay_config, tools, &metrics);
    let gateway = Server::with_relay(relay, config, grpc);
    tokio::select! {
        served = server::run(gateway, public, shutdown_signal()) => served,
        message = connection.failed() => Err(message),
    }
}
