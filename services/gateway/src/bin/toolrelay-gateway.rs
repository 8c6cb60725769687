//! `toolrelay-gateway`: the gateway alone, in front of a `toolrelay-relay` reached over gRPC
//! (`RELAY_URL`), for split deployments.

use std::process::ExitCode;

use clap::Parser;
use toolrelay_gateway::config::{ENV_LISTEN, ENV_RELAY_URL, GatewayArgs};
use toolrelay_gateway::server::{self, Server};
use toolrelay_relay::config::{LogArgs, ServiceArgs};
use toolrelay_relay::server::{bind, exit_code, shutdown_signal};
use toolrelay_relay::{Metrics, telemetry};

/// jemalloc, as in `toolrelay` and `toolrelay-relay`: glibc's malloc kept the memory of 10,000
/// MCP sessions after they ended (its arenas are not given back); jemalloc's background thread
/// returns it.
#[cfg(not(feature = "system-allocator"))]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// The toolrelay gateway: REST API, SSE and polling fallbacks, OpenAPI, in front of a relay.
#[derive(Debug, Parser)]
#[command(
    name = "toolrelay-gateway",
    version,
    about,
    mut_arg("relay_url", |arg| arg
        .required(true)
        .help("The relay's gRPC URL, e.g. http://relay:50051: the gateway keeps no state and reaches a toolrelay-relay over gRPC"))
)]
struct Cli {
    #[command(flatten)]
    gateway: GatewayArgs,
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
    exit_code("toolrelay-gateway", serve(cli).await)
}

async fn serve(cli: Cli) -> Result<(), String> {
    let Some(url) = cli.gateway.relay_url.clone() else {
        return Err(format!(
            "{ENV_RELAY_URL} (or --relay-url) is required: the gateway reaches a toolrelay-relay over gRPC. Run `toolrelay` for everything in one process."
        ));
    };
    let public = bind(cli.gateway.listen, ENV_LISTEN).await?;
    let bound = public.local_addr().map_err(|error| error.to_string())?;
    let config = cli.gateway.gateway_config(bound, &cli.service)?;
    let gateway = Server::in_front_of(&url, config, Metrics::new("toolrelay-gateway"))?
        .named("toolrelay-gateway")
        .drain_timeout(cli.service.drain_timeout());
    server::run(gateway, public, shutdown_signal()).await
}
