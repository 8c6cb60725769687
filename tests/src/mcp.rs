//! MCP clients of a system's `/mcp` endpoints, as an assistant connects: rmcp's streamable
//! HTTP client, with a handler of the test's choice.

use rmcp::model::{CallToolRequestParams, CallToolResult, ClientConfig};
use rmcp::service::RunningService;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::{ClientHandler, Peer, RoleClient, ServiceExt};
use serde_json::{Value, json};

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

/// Calls a tool that is not there and returns the JSON-RPC error the server answered with
/// (panics on a result: a name that is no tool is a protocol error, not a tool's failure).
pub async fn call_unknown(client: &Peer<RoleClient>, name: &str) -> rmcp::ErrorData {
    let asked = client
        .call_tool(CallToolRequestParams::new(name.to_owned()))
        .await;
    match asked {
        Err(rmcp::ServiceError::McpError(error)) => error,
        other => panic!("calling {name:?} should be a JSON-RPC error, got {other:?}"),
    }
}

/// A JSON-RPC request as a 2026-07-28 client sends it, ready to send: no session, the
/// revision and the client in `_meta` and in the standard headers (`MCP-Protocol-Version`,
/// `Mcp-Method`, and `Mcp-Name` for a call).
pub fn sessionless_request(
    http: &reqwest::Client,
    url: &str,
    revision: &str,
    method: &str,
    mut params: Value,
) -> reqwest::RequestBuilder {
    params["_meta"] = json!({
        "io.modelcontextprotocol/protocolVersion": revision,
        "io.modelcontextprotocol/clientCapabilities": {},
        "io.modelcontextprotocol/clientInfo": {"name": "toolrelay-test", "version": "1.0.0"},
    });
    let mut request = http
        .post(url)
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", revision)
        .header("mcp-method", method);
    if let Some(name) = params["name"].as_str() {
        request = request.header("mcp-name", name);
    }
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params});
    request.json(&body)
}

/// The JSON-RPC answer in a response body: plain JSON, or the SSE event carrying it.
pub fn answer_of(body: &str) -> Value {
    if let Ok(value) = serde_json::from_str::<Value>(body) {
        return value;
    }
    body.lines()
        .filter_map(|line| line.strip_prefix("data:"))
        .filter_map(|data| serde_json::from_str::<Value>(data.trim()).ok())
        .find(|message| message.get("id").is_some())
        .unwrap_or_else(|| panic!("no JSON-RPC answer in {body:?}"))
}
