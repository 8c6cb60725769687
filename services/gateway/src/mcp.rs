//! MCP (Streamable HTTP, with the official SDK `rmcp`): every tool for MCP clients such as
//! Claude, ChatGPT connectors, Cursor or a local agent.
//!
//! * `/mcp` — the built-in tools and the pairing tools `connect_session`, `list_session_tools`
//!   and `call_session_tool` (call by name: works in clients that ignore tool-list changes).
//! * `/mcp/s/{handle}` — a server scoped to one session: its tools are exactly the session's
//!   manifest (the tab's tools and the built-in ones); the handle is the session's 128-bit
//!   secret, so the URL can be pasted into a connector's settings.
//!
//! Results are MCP content: structured content plus a text rendering; tool failures are
//! `isError` results with the message; protocol errors are JSON-RPC errors. A call waiting for
//! the tab sends progress notifications when the client asked for them, and fails cleanly at
//! the relay's request timeout. Hosts and origins are checked by rmcp (allowed hosts from
//! `PUBLIC_BASE_URL`, allowed origins from `CORS_ORIGIN`).

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use poem::endpoint::TowerCompatExt;
use poem::{Endpoint, EndpointExt, IntoResponse, Request};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ClientJsonRpcMessage, ContentBlock,
    Implementation, InitializeRequestParams, InitializeResult, JsonObject, ListToolsResult,
    PaginatedRequestParams, ProgressNotificationParam, ServerCapabilities, ServerConfig, Tool,
};
use rmcp::service::RequestContext;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::session::store::{
    SessionState, SessionStore, SessionStoreError,
};
use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{ErrorData as McpError, RoleServer, ServerHandler};
use serde_json::{Value, json};
use toolrelay_relay::builtin::Scope;
use toolrelay_relay::clock::Clock;
use toolrelay_relay::store::Store;
use toolrelay_relay::{CallInput, Caller, ErrorInfo, ErrorKind, SessionCode};

use crate::api::State;
use crate::types::CallResponse;

/// How often a call waiting for the tab reports progress.
const PROGRESS_EVERY: Duration = Duration::from_secs(2);
/// How long another gateway can take over an MCP client session after it began.
const MCP_SESSION_LIFETIME: Duration = Duration::from_secs(24 * 3600);
/// How often a watcher of a session's tools checks that its MCP client is still there.
const CLIENT_CHECK_EVERY: Duration = Duration::from_secs(30);
/// How soon a watcher of a session's tools whose relay could not be reached asks again
/// (doubling up to 5 s).
const WATCH_RETRY: Duration = Duration::from_millis(500);

/// What the gateway tells a handler about the HTTP request (inserted by [`with_context`]).
#[derive(Debug, Clone)]
struct McpRequest {
    /// The `{handle}` of `/mcp/s/{handle}`.
    handle: Option<String>,
    /// The client, for rate limits.
    caller: Caller,
}

/// The MCP server of `/mcp` (scoped = false) or `/mcp/s/{handle}` (scoped = true).
#[derive(Clone)]
pub struct RelayMcp {
    state: State,
    scoped: bool,
}

/// The two MCP endpoints, ready to mount.
pub fn endpoints(state: &State) -> (impl Endpoint + 'static, impl Endpoint + 'static) {
    let make = |scoped: bool| {
        let state = state.clone();
        let mut config = server_config(&state);
        // A client's next request may reach another gateway (a round-robin balancer): that
        // gateway takes the session over from what the store keeps.
        config.session_store = Some(Arc::new(SharedSessions {
            store: Arc::clone(&state.store),
            clock: Clock::new(),
            namespace: if scoped { "s:" } else { "" },
        }));
        StreamableHttpService::new(
            move || {
                Ok(RelayMcp {
                    state: state.clone(),
                    scoped,
                })
            },
            Arc::new(LocalSessionManager::default()),
            config,
        )
    };
    (
        with_context(state.clone(), make(false).compat()),
        with_context(state.clone(), make(true).compat()),
    )
}

/// MCP client sessions kept in the gateway's store (Redis when gateways share one), so any
/// gateway can serve a session another made: rmcp keeps the client's `initialize`
/// parameters there and, on a request for a session it does not hold, replays the handshake.
struct SharedSessions {
    store: Arc<dyn Store>,
    clock: Clock,
    /// Keeps `/mcp` and `/mcp/s/{handle}` sessions apart.
    namespace: &'static str,
}

#[async_trait::async_trait]
impl SessionStore for SharedSessions {
    async fn load(&self, id: &str) -> Result<Option<SessionState>, SessionStoreError> {
        let Some(text) = self
            .store
            .mcp_session(&format!("{}{id}", self.namespace))
            .await?
        else {
            return Ok(None);
        };
        Ok(Some(serde_json::from_str(&text)?))
    }

    async fn store(&self, id: &str, state: &SessionState) -> Result<(), SessionStoreError> {
        let expires_at = self.clock.now().plus(MCP_SESSION_LIFETIME);
        self.store
            .put_mcp_session(
                &format!("{}{id}", self.namespace),
                serde_json::to_string(state)?,
                expires_at,
            )
            .await?;
        Ok(())
    }

    async fn delete(&self, id: &str) -> Result<(), SessionStoreError> {
        self.store
            .delete_mcp_session(&format!("{}{id}", self.namespace))
            .await?;
        Ok(())
    }
}

fn server_config(state: &State) -> StreamableHttpServerConfig {
    // The names REST's `Host` check answers to, and the public authority as written.
    let mut hosts = state.config.host_names();
    if let Ok(uri) = state.config.public_base_url.parse::<poem::http::Uri>()
        && let Some(authority) = uri.authority()
    {
        hosts.push(authority.as_str().to_owned());
    }
    let origins: Vec<String> = state
        .config
        .cors_origins
        .iter()
        .map(|origin| with_port(origin))
        .collect();
    StreamableHttpServerConfig::default()
        .with_allowed_hosts(hosts)
        .with_allowed_origins(origins)
        .with_cancellation_token(state.shutdown.child_token())
}

/// An origin with its port spelled out (rmcp matches ports exactly).
fn with_port(origin: &str) -> String {
    let after_scheme = origin.split_once("://").map_or(origin, |(_, rest)| rest);
    if after_scheme.contains(':') {
        origin.to_owned()
    } else if origin.starts_with("https://") {
        format!("{origin}:443")
    } else {
        format!("{origin}:80")
    }
}

/// Copies the path's `{handle}` and the client address into the request for the handler, and
/// answers a body that is not a JSON-RPC message with a JSON-RPC error (rmcp answers it with
/// a plain-text 415).
fn with_context<E: Endpoint + 'static>(state: State, endpoint: E) -> impl Endpoint {
    endpoint.around(move |endpoint, mut request: Request| {
        let state = state.clone();
        async move {
            if request.method() == poem::http::Method::POST {
                // The body is in memory already (the body-limit middleware read it).
                let body = request.take_body().into_bytes().await?;
                if let Some(refusal) = unreadable_message(&body) {
                    return Ok(refusal);
                }
                request.set_body(body);
            }
            let context = McpRequest {
                handle: request.raw_path_param("handle").map(str::to_owned),
                caller: state.caller(&request),
            };
            request.extensions_mut().insert(context);
            endpoint
                .call(request)
                .await
                .map(IntoResponse::into_response)
        }
    })
}

/// The JSON-RPC error for a body that is not JSON (-32700) or not a JSON-RPC message (-32600).
fn unreadable_message(body: &[u8]) -> Option<poem::Response> {
    let (code, message) = match serde_json::from_slice::<Value>(body) {
        Err(error) => (
            -32700,
            format!("Parse error: the body is not JSON ({error})"),
        ),
        Ok(value) => match serde_json::from_value::<ClientJsonRpcMessage>(value) {
            Ok(_) => return None,
            Err(error) => (
                -32600,
                format!("Invalid Request: the body is not a JSON-RPC 2.0 message ({error})"),
            ),
        },
    };
    let body = json!({"jsonrpc": "2.0", "id": null, "error": {"code": code, "message": message}});
    Some(
        poem::Response::builder()
            .status(poem::http::StatusCode::BAD_REQUEST)
            .content_type("application/json")
            .body(body.to_string()),
    )
}

/// The client of an MCP request (an unknown one, if the gateway's context is missing, shares
/// one budget with every other such request).
fn caller_of(context: &RequestContext<RoleServer>) -> Caller {
    request_of(context).map_or_else(
        || Caller::new(std::net::IpAddr::from([0, 0, 0, 0])),
        |request| request.caller,
    )
}

fn request_of(context: &RequestContext<RoleServer>) -> Option<McpRequest> {
    context
        .extensions
        .get::<poem::http::request::Parts>()
        .and_then(|parts| parts.extensions.get::<McpRequest>())
        .cloned()
}

fn mcp_session_of(context: &RequestContext<RoleServer>) -> Option<String> {
    context
        .extensions
        .get::<poem::http::request::Parts>()
        .and_then(|parts| parts.headers.get("mcp-session-id"))
        .and_then(|value| value.to_str().ok())
        .map(str::to_owned)
}

fn tool(name: &str, description: &str, schema: Value) -> Tool {
    let schema: JsonObject = schema.as_object().cloned().unwrap_or_default();
    Tool::new(name.to_owned(), description.to_owned(), Arc::new(schema))
}

/// The pairing tools of `/mcp`.
fn pairing_tools() -> Vec<Tool> {
    let session = json!({"type": "string", "description": "The session: its handle (from connect_session) or the pairing code the user gave you."});
    vec![
        tool(
            "connect_session",
            "Pairs with the user's tab. Ask the user for the pairing code shown in the plugin (like ABCD-EFGH). Returns the session handle, a connector URL for this session, and its tools.",
            json!({"type": "object", "properties": {"code": {"type": "string", "description": "The pairing code, e.g. ABCD-EFGH."}}, "required": ["code"]}),
        ),
        tool(
            "list_session_tools",
            "Lists the tools of a paired session with the JSON Schema of their arguments.",
            json!({"type": "object", "properties": {"session": session}, "required": ["session"]}),
        ),
        tool(
            "call_session_tool",
            "Calls a tool of a paired session by name, e.g. {\"session\": \"<handle>\", \"name\": \"createGraph\", \"arguments\": {...}}.",
            json!({"type": "object", "properties": {
                "session": session,
                "name": {"type": "string", "description": "The tool's name, from list_session_tools."},
                "arguments": {"type": "object", "description": "The tool's arguments."}
            }, "required": ["session", "name"]}),
        ),
    ]
}

/// A successful result: the value as structured content (wrapped when not an object) and as
/// text, cut to the size an LLM can take like every other answer.
fn success(value: Value) -> CallToolResult {
    let text = serde_json::to_string_pretty(&value).unwrap_or_else(|_| value.to_string());
    let mut result = CallToolResult::success(vec![ContentBlock::text(text)]);
    result.structured_content = Some(match value {
        Value::Object(_) => value,
        other => json!({"result": other}),
    });
    result
}

/// A tool failure: `isError` with the message (and the error's name, for programs).
fn failure(code: &str, message: &str) -> CallToolResult {
    let mut result = CallToolResult::error(vec![ContentBlock::text(message.to_owned())]);
    result.structured_content = Some(json!({"error": {"code": code, "message": message}}));
    result
}

fn from_error(error: &ErrorInfo) -> CallToolResult {
    failure(error.code.as_str(), &error.message)
}

impl RelayMcp {
    /// On `/mcp/s/{handle}`, a task telling the client each time the session's tools change
    /// (the tab reloads, registers more), for as long as the client stays and the session
    /// lives.
    fn watch_tools(&self, context: &RequestContext<RoleServer>) {
        if !self.scoped {
            return;
        }
        let Some(request) = request_of(context) else {
            return;
        };
        let peer = context.peer.clone();
        let relay = Arc::clone(&self.state.relay);
        let stopping = self.state.shutdown.clone();
        tokio::spawn(async move {
            let handle = request.handle.unwrap_or_default();
            let mut still_there = tokio::time::interval(CLIENT_CHECK_EVERY);
            let mut retry = WATCH_RETRY;
            let mut resumed = false;
            loop {
                // A relay that cannot be reached (a replica died, the store is away) is asked
                // again; only a session that is gone ends the watch.
                let watched = match relay.resolve_handle(&request.caller, &handle).await {
                    Ok(code) => relay.manifest_changes(&request.caller, &code).await,
                    Err(error) => Err(error),
                };
                let mut changes = match watched {
                    Ok(changes) => changes,
                    Err(error) if error.kind == ErrorKind::NotFound => return,
                    Err(_) => {
                        tokio::select! {
                            () = tokio::time::sleep(retry) => {}
                            () = stopping.cancelled() => return,
                        }
                        retry = (retry * 2).min(Duration::from_secs(5));
                        if peer.is_transport_closed() {
                            return;
                        }
                        continue;
                    }
                };
                retry = WATCH_RETRY;
                // The tools may have changed while the watch was broken.
                if resumed && peer.notify_tool_list_changed().await.is_err() {
                    return;
                }
                resumed = true;
                loop {
                    tokio::select! {
                        change = changes.next() => match change {
                            Some(()) => {
                                if peer.notify_tool_list_changed().await.is_err() {
                                    return;
                                }
                            }
                            // The session ended, or the stream broke: look again.
                            None => break,
                        },
                        _ = still_there.tick() => {
                            if peer.is_transport_closed() {
                                return;
                            }
                        }
                        () = stopping.cancelled() => return,
                    }
                }
            }
        });
    }

    /// The session code of `/mcp/s/{handle}`.
    async fn scoped_code(&self, context: &RequestContext<RoleServer>) -> Result<String, ErrorInfo> {
        let handle = request_of(context)
            .and_then(|request| request.handle)
            .unwrap_or_default();
        self.state
            .relay
            .resolve_handle(&caller_of(context), &handle)
            .await
    }

    /// A session given as a handle or a pairing code.
    async fn session_code(&self, caller: &Caller, session: &str) -> Result<String, ErrorInfo> {
        if SessionCode::parse(session).is_ok() {
            return Ok(session.to_owned());
        }
        self.state.relay.resolve_handle(caller, session).await
    }

    /// The session's tools, as MCP tools.
    async fn session_tools(&self, caller: &Caller, code: &str) -> Result<Vec<Tool>, ErrorInfo> {
        let manifest = self.state.relay.manifest(caller, code).await?;
        Ok(manifest
            .flat()
            .tools
            .into_iter()
            .map(|t| tool(&t.name, &t.description, t.input_schema))
            .collect())
    }

    /// Calls a tool of a session and waits for its answer, reporting progress meanwhile.
    async fn call_in_session(
        &self,
        code: &str,
        name: &str,
        arguments: Value,
        context: &RequestContext<RoleServer>,
    ) -> CallToolResult {
        let caller = &caller_of(context);
        let relay = &self.state.relay;
        let call = CallInput {
            function_name: name.to_owned(),
            args: arguments,
            ..CallInput::default()
        };
        let mut view = match relay.submit(caller, code, call).await {
            Ok(view) => view,
            Err(error) => return from_error(&error),
        };
        let token = context.meta.get_progress_token();
        let mut waited = 0.0;
        while view.response.is_none() {
            tokio::select! {
                next = relay.await_response(caller, code, &view.request_id, PROGRESS_EVERY) => match next {
                    Ok(next) => view = next,
                    Err(error) => return from_error(&error),
                },
                () = context.ct.cancelled() => return failure("cancelled", "The call was cancelled by the client."),
            }
            if view.response.is_none()
                && let Some(token) = token.clone()
            {
                waited += PROGRESS_EVERY.as_secs_f64();
                let message = if view.provider_connected {
                    format!("Waiting for the tab to answer ({waited:.0} s)")
                } else {
                    format!("{} ({waited:.0} s)", crate::types::NO_TAB)
                };
                let note = ProgressNotificationParam::new(token, waited).with_message(message);
                let _ = context.peer.notify_progress(note).await;
            }
        }
        let Some(response) = view.response else {
            return failure("tool_error", "The call ended without an answer.");
        };
        let answer = CallResponse::from(response);
        match (answer.success, answer.error) {
            (true, _) => {
                let mut value = answer.result.unwrap_or(Value::Null);
                if answer.truncated == Some(true) {
                    value = json!({"truncated": true, "note": answer.note, "result": value});
                }
                success(value)
            }
            (false, Some(error)) => failure(&error.code, &error.message),
            (false, None) => failure("tool_error", "The tool failed without a message."),
        }
    }

    /// A built-in tool, outside any session (scope: the MCP session when there is one).
    async fn call_builtin(
        &self,
        name: &str,
        arguments: Value,
        context: &RequestContext<RoleServer>,
    ) -> CallToolResult {
        if let Err(limited) = self
            .state
            .limits
            .tool_call(caller_of(context).address)
            .await
        {
            return failure(limited.code.as_str(), &limited.message);
        }
        let scope = mcp_session_of(context).map_or(Scope::None, Scope::Mcp);
        match self.state.relay.call_tool(name, arguments, scope).await {
            Ok(value) => success(value),
            Err(error) => failure(&error.code, &error.message),
        }
    }

    async fn call_pairing(
        &self,
        name: &str,
        arguments: &Value,
        context: &RequestContext<RoleServer>,
    ) -> CallToolResult {
        let text = |key: &str| {
            arguments
                .get(key)
                .and_then(Value::as_str)
                .map(str::to_owned)
        };
        let caller = &caller_of(context);
        match name {
            "connect_session" => {
                let Some(code) = text("code") else {
                    return failure(
                        "invalid_arguments",
                        "connect_session needs {\"code\": \"<pairing code>\"}: ask the user for the code shown in the plugin.",
                    );
                };
                let status = match self.state.relay.session_status(caller, &code).await {
                    Ok(status) => status,
                    Err(error) => return from_error(&error),
                };
                let tools = match self.session_tools(caller, &code).await {
                    Ok(tools) => tools,
                    Err(error) => return from_error(&error),
                };
                success(json!({
                    "handle": status.mcp_handle,
                    // The plain form for programs; the hyphenated one to show people.
                    "code": status.code.as_str(),
                    "displayCode": status.code.display(),
                    "connectorUrl": self.state.url(&format!("/mcp/s/{}", status.mcp_handle)),
                    "expiresAt": status.expires_at.rfc3339(),
                    "tools": tools.iter().map(|t| json!({"name": t.name, "description": t.description})).collect::<Vec<_>>(),
                }))
            }
            "list_session_tools" => {
                let Some(session) = text("session") else {
                    return failure(
                        "invalid_arguments",
                        "list_session_tools needs {\"session\": \"<handle or code>\"}.",
                    );
                };
                let tools = match self.session_code(caller, &session).await {
                    Ok(code) => self.session_tools(caller, &code).await,
                    Err(error) => Err(error),
                };
                match tools {
                    Ok(tools) => success(json!({"tools": tools.iter().map(|t| json!({
                        "name": t.name, "description": t.description, "inputSchema": &*t.input_schema
                    })).collect::<Vec<_>>()})),
                    Err(error) => from_error(&error),
                }
            }
            _ => {
                let (Some(session), Some(tool_name)) = (text("session"), text("name")) else {
                    return failure(
                        "invalid_arguments",
                        "call_session_tool needs {\"session\": \"<handle or code>\", \"name\": \"<tool>\", \"arguments\": {...}}.",
                    );
                };
                let arguments = arguments.get("arguments").cloned().unwrap_or(Value::Null);
                match self.session_code(caller, &session).await {
                    Ok(code) => {
                        self.call_in_session(&code, &tool_name, arguments, context)
                            .await
                    }
                    Err(error) => from_error(&error),
                }
            }
        }
    }
}

impl ServerHandler for RelayMcp {
    fn get_info(&self) -> ServerConfig {
        let instructions = if self.scoped {
            "Tools in the user's browser tab (a CODAP document) and tools built into the relay. Call them by name."
        } else {
            "Tools built into the relay, and pairing with a user's browser tab: ask the user for the pairing code shown in the plugin, call connect_session with it, then call_session_tool."
        };
        ServerConfig::new(
            ServerCapabilities::builder()
                .enable_tools()
                .enable_tool_list_changed()
                .build(),
        )
        .with_server_info(Implementation::new("toolrelay", env!("CARGO_PKG_VERSION")))
        .with_instructions(instructions.to_owned())
    }

    /// Starts, on `/mcp/s/{handle}`, the watcher that tells the client each time the session's
    /// tools change. At `initialize` rather than at `notifications/initialized`: behind a
    /// round-robin balancer that notification may reach another gateway, and so may the
    /// client's event stream; every gateway that has seen the session watches (a gateway
    /// that takes a session over replays `initialize`).
    async fn initialize(
        &self,
        request: InitializeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<InitializeResult, McpError> {
        context.peer.set_peer_info(request.clone());
        self.watch_tools(&context);
        self.negotiate_initialize(&request)
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        if self.scoped {
            let tools = match self.scoped_code(&context).await {
                Ok(code) => self.session_tools(&caller_of(&context), &code).await,
                Err(error) => Err(error),
            };
            return tools.map(ListToolsResult::with_all_items).map_err(|error| {
                McpError::invalid_params(error.message, Some(json!({"error": error.code.as_str()})))
            });
        }
        let builtins = self
            .state
            .relay
            .tools()
            .await
            .map_err(|error| McpError::internal_error(error.message, None))?;
        let mut tools: Vec<Tool> = builtins
            .into_iter()
            .map(|t| tool(&t.name, &t.description, t.input_schema))
            .collect();
        tools.extend(pairing_tools());
        Ok(ListToolsResult::with_all_items(tools))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let name = request.name.to_string();
        let arguments = Value::Object(request.arguments.unwrap_or_default());
        let result = if self.scoped {
            match self.scoped_code(&context).await {
                Ok(code) => {
                    self.call_in_session(&code, &name, arguments, &context)
                        .await
                }
                Err(error) => from_error(&error),
            }
        } else if pairing_tools().iter().any(|t| t.name == name) {
            self.call_pairing(&name, &arguments, &context).await
        } else {
            self.call_builtin(&name, arguments, &context).await
        };
        Ok(result.into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn origins_get_explicit_ports() {
        assert_eq!(
            with_port("https://codap.concord.org"),
            "https://codap.concord.org:443"
        );
        assert_eq!(with_port("http://127.0.0.1:8080"), "http://127.0.0.1:8080");
        assert_eq!(with_port("http://localhost"), "http://localhost:80");
    }
}
