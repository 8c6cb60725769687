//! `toolrelay`: the whole system in one process with the in-memory store — the gateway (REST
//! API, SSE, polling, the browser WebSocket) on `--listen` (default 127.0.0.1:8080) and the
//! relay's gRPC service on `--grpc-listen` (default 127.0.0.1:50051), so backend services can
//! attach too. With `--relay-url` it is the gateway alone, in front of a `toolrelay-relay`.

use std::process::ExitCode;

use clap::Parser;
use toolrelay_gateway::config::{ENV_LISTEN, GatewayArgs};
use toolrelay_gateway::server;
use toolrelay_relay::config::{ENV_GRPC_LISTEN, LogArgs, RelayArgs};
use toolrelay_relay::server::{bind, exit_code, local, memory_relay, shutdown_signal};
use toolrelay_relay::telemetry;

/// toolrelay: lets an LLM call tools that live in a browser tab, a backend service or the relay.
#[derive(Debug, Parser)]
#[command(name = "toolrelay", version, about)]
struct Cli {
    #[command(flatten)]
    gateway: GatewayArgs,
    #[command(flatten)]
    relay: RelayArgs,
    #[command(flatten)]
    log: LogArgs,
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    telemetry::init(cli.log.log_format);
    exit_code("toolrelay", serve(cli).await)
}

async fn serve(cli: Cli) -> Result<(), String> {
    let public = bind(cli.gateway.listen, ENV_LISTEN).await?;
    let bound = public.local_addr().map_err(|error| error.to_string())?;
    let config = cli.gateway.gateway_config(bound)?;
    if let Some(url) = &cli.gateway.relay_url {
        return server::run_split("toolrelay gateway", url, config, public, shutdown_signal())
            .await;
    }
    let relay_config = cli.relay.relay_config()?;
    let grpc = bind(cli.relay.grpc_listen, ENV_GRPC_LISTEN).await?;
    tracing::info!(
        listen = %local(&public),
        grpc = %local(&grpc),
        public_base_url = %config.public_base_url,
        "toolrelay listening"
    );
    server::run_all(
        memory_relay(relay_config),
        config,
        public,
        grpc,
        shutdown_signal(),
    )
    .await
}
