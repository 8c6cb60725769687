//! An LLM-side MCP client for the browser tests, on rmcp's own client over Streamable HTTP.
//!
//! `mcp-call URL TOOL JSON_ARGUMENTS` calls the tool and prints its result as JSON.
//! `mcp-call --watch-list-changed URL SECONDS` prints `{"ready":true}` once connected, waits
//! (at most SECONDS) for `notifications/tools/list_changed`, then prints `{"tools":[names]}`;
//! it fails if none arrives in time.

use std::time::Duration;

use anyhow::{Context, bail};
use rmcp::model::{CallToolRequestParams, ClientConfig};
use rmcp::service::NotificationContext;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::{ClientHandler, RoleClient, ServiceExt};
use serde_json::{Value, json};
use tokio::sync::Notify;

#[derive(Clone, Default)]
struct Client {
    list_changed: std::sync::Arc<Notify>,
}

impl ClientHandler for Client {
    async fn on_tool_list_changed(&self, _context: NotificationContext<RoleClient>) {
        self.list_changed.notify_one();
    }

    fn get_info(&self) -> ClientConfig {
        ClientConfig::default()
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let client = Client::default();
    let list_changed = client.list_changed.clone();
    let watch = args.first().map(String::as_str) == Some("--watch-list-changed");
    let rest = if watch { &args[1..] } else { &args[..] };
    let usage =
        "usage: mcp-call URL TOOL JSON_ARGUMENTS | mcp-call --watch-list-changed URL SECONDS";
    let url = rest.first().context(usage)?;
    let transport = StreamableHttpClientTransport::from_config(
        StreamableHttpClientTransportConfig::with_uri(url.as_str()),
    );
    let connection = client.serve(transport).await.context("connecting")?;

    let output = if watch {
        let seconds: u64 = rest.get(1).context(usage)?.parse().context("SECONDS")?;
        println!("{}", json!({ "ready": true }));
        if tokio::time::timeout(Duration::from_secs(seconds), list_changed.notified())
            .await
            .is_err()
        {
            bail!("no notifications/tools/list_changed within {seconds} s");
        }
        let tools = connection.list_tools(None).await.context("tools/list")?;
        let names: Vec<String> = tools.tools.iter().map(|t| t.name.to_string()).collect();
        json!({ "tools": names })
    } else {
        let (Some(name), Some(arguments)) = (rest.get(1), rest.get(2)) else {
            bail!(usage);
        };
        let arguments: Value = serde_json::from_str(arguments).context("JSON_ARGUMENTS")?;
        let Value::Object(arguments) = arguments else {
            bail!("JSON_ARGUMENTS must be an object");
        };
        let result = connection
            .call_tool(CallToolRequestParams::new(name.clone()).with_arguments(arguments))
            .await
            .context("tools/call")?;
        serde_json::to_value(result)?
    };
    println!("{output}");
    connection.cancel().await.ok();
    Ok(())
}
