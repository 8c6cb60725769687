//! MCP clients of a system's `/mcp` endpoints, as an assistant connects: rmcp's streamable
//! HTTP client, with a handler of the test's choice.

use rmcp::model::{CallToolRequestParams, CallToolResult, ClientConfig};
use rmcp::service::RunningService;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::{ClientHandler, Peer, RoleClient, ServiceExt};
use serde_json::Value;

/// A plain MCP client (it hears nothing the server sends of its own accord).
pub type Mcp = RunningService<RoleClient, ClientConfig>;

/// A plain MCP client of `url` (`…/mcp`, or a connector URL `…/mcp/s/{handle}`).
pub async fn connect(url: &str) -> Mcp {
    connect_with(ClientConfig::default(), url).await
}

/// An MCP client of `url` whose notifications go to `handler`.
pub async fn connect_with<H: ClientHandler>(
    handler: H,
    url: &str,
) -> RunningService<RoleClient, H> {
    let transport = StreamableHttpClientTransport::from_config(
        StreamableHttpClientTransportConfig::with_uri(url),
    );
    handler.serve(transport).await.unwrap()
}

/// Calls the tool `name` with `arguments` (a JSON object); the result, a failed call's too.
pub async fn call(client: &Peer<RoleClient>, name: &str, arguments: Value) -> CallToolResult {
    let arguments = arguments.as_object().cloned().unwrap();
    client
        .call_tool(CallToolRequestParams::new(name.to_owned()).with_arguments(arguments))
        .await
        .unwrap()
}
