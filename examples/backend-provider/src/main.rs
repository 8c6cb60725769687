//! `toolrelay-example-provider`: attaches to a toolrelay session over gRPC and serves two tools.
//!
//! Without `--code` it creates its own session and prints the pairing code for the LLM.

use std::time::Duration;

use clap::Parser;
use tonic::transport::Endpoint;
use toolrelay::proto::v1::CreateSessionRequest;
use toolrelay::proto::v1::relay_client::RelayClient;
use toolrelay_example_provider::{Ended, serve};

/// An example backend tool provider for toolrelay.
#[derive(Debug, Parser)]
#[command(name = "toolrelay-example-provider", version, about)]
struct Cli {
    /// The relay's gRPC address.
    #[arg(long, env = "RELAY_URL", default_value = "http://127.0.0.1:50051")]
    relay_url: String,
    /// Session code to serve; a new session is created when absent.
    #[arg(long, requires = "token")]
    code: Option<String>,
    /// The session's provider token.
    #[arg(long, env = "PROVIDER_TOKEN", hide_env_values = true)]
    token: Option<String>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let channel = Endpoint::from_shared(cli.relay_url.clone())?
        .connect()
        .await?;
    let mut client = RelayClient::new(channel);
    let (code, token) = match (cli.code, cli.token) {
        (Some(code), Some(token)) => (code, token),
        _ => {
            let session = client
                .create_session(CreateSessionRequest {})
                .await?
                .into_inner();
            println!(
                "Pairing code: {}-{}",
                &session.code[..4],
                &session.code[4..]
            );
            (session.code, session.provider_token)
        }
    };
    let mut backoff = Duration::from_millis(250);
    loop {
        match serve(client.clone(), &code, &token, async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await
        {
            Ok(Ended::Shutdown) => return Ok(()),
            Ok(Ended::SessionEnded) => {
                println!("The session ended.");
                return Ok(());
            }
            Ok(Ended::Closed(reason)) => println!("Disconnected: {reason}; reconnecting."),
            Err(status)
                if status.code() == tonic::Code::NotFound
                    || status.code() == tonic::Code::PermissionDenied =>
            {
                anyhow::bail!("{}", status.message());
            }
            Err(status) => println!("Connection failed: {}; reconnecting.", status.message()),
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(10));
    }
}
