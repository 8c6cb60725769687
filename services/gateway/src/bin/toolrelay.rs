//! `toolrelay`: the whole system in one process, with the in-memory store. The browser
//! WebSocket is served on `--listen` (default 127.0.0.1:8080) and gRPC on `--grpc-listen`
//! (default 127.0.0.1:50051), so backend services can attach too.

use std::net::SocketAddr;
use std::process::ExitCode;

use clap::Parser;
use toolrelay_relay::config::{ENV_GRPC_LISTEN, RelayArgs};
use toolrelay_relay::server::{self, Listeners, bind};
use toolrelay_relay::telemetry;

/// `LISTEN_ADDR`: the public HTTP/WebSocket address.
const ENV_LISTEN: &str = "LISTEN_ADDR";

/// toolrelay: lets an LLM call tools that live in a browser tab, a backend service or the relay.
#[derive(Debug, Parser)]
#[command(name = "toolrelay", version, about)]
struct Cli {
    /// Public address (the browser WebSocket `/api/sessions/{code}/ws`).
    #[arg(long, env = ENV_LISTEN, default_value = "127.0.0.1:8080")]
    listen: SocketAddr,
    #[command(flatten)]
    relay: RelayArgs,
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    telemetry::init(cli.relay.log_format);
    match serve(cli).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("toolrelay: {message}");
            ExitCode::FAILURE
        }
    }
}

async fn serve(cli: Cli) -> Result<(), String> {
    let config = cli.relay.relay_config()?;
    let public = bind(cli.listen, ENV_LISTEN).await?;
    let grpc = bind(cli.relay.grpc_listen, ENV_GRPC_LISTEN).await?;
    let relay = server::memory_relay(config);
    tracing::info!(listen = %cli.listen, grpc = %cli.relay.grpc_listen, "toolrelay listening");
    let listeners = Listeners {
        grpc,
        websocket: Some(public),
    };
    server::run(relay, listeners, server::shutdown_signal())
        .await
        .map_err(|error| error.to_string())
}
