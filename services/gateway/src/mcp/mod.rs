//! MCP (Streamable HTTP, with the official SDK `rmcp`): every tool for MCP clients such as
//! Claude, ChatGPT connectors, Cursor or a local agent.
//!
//! * `/mcp` — the built-in tools and the pairing tools `open_codap` (an MCP App: a CODAP
//!   paired with the conversation, its page the resource `ui://toolrelay/codap`),
//!   `connect_session`, `list_session_tools`, `call_session_tool` and `read_session_tool`
//!   (call by name: works in clients that ignore tool-list changes).
//! * `/mcp/s/{handle}` — a server scoped to one session: its tools are exactly the session's
//!   manifest (the tab's tools and the built-in ones); the handle is the session's 128-bit
//!   secret, so the URL can be pasted into a connector's settings.
//!
//! Results are MCP content: structured content plus a text rendering; tool failures are
//! `isError` results with the message; protocol errors are JSON-RPC errors. A call waiting for
//! the tab sends progress notifications when the client asked for them, and fails cleanly at
//! the relay's request timeout. Hosts and origins are checked by rmcp (allowed hosts from
//! `PUBLIC_BASE_URL`, allowed origins from `CORS_ORIGIN`).
//!
//! Client sessions are bounded (see [`Keeper`]): at most `MCP_SESSIONS_PER_IP` live ones per
//! client address and `MCP_MAX_SESSIONS` in all, counted in the store so the caps hold across
//! gateways; a session unused for `MCP_SESSION_IDLE_SECONDS` ends in the gateway (rmcp's
//! keep-alive) and in the store (its expiry slides on every request).
//!
//! # Layout
//!
//! This file is the rmcp wiring: the two endpoints, the HTTP context a handler reads, and
//! [`ServerHandler`] answering `initialize`, `tools/list` and `tools/call` by handing each to
//! its tool. `sessions` keeps client sessions within their caps and shared between gateways;
//! `tools` is what a tool call means (a session's tools listed, called and watched, built-in
//! tools called, results as MCP content); `pairing` holds the pairing tools of `/mcp`, one
//! variant of `Pairing` each.

mod app;
mod pairing;
mod sessions;
mod tools;

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Duration;

use poem::endpoint::TowerCompatExt;
use poem::{Endpoint, EndpointExt, IntoResponse, Request};
use rmcp::model::{
    CacheScope, CallToolRequestParams, CallToolResponse, ClientJsonRpcMessage, ClientRequest,
    DiscoverResult, Implementation, InitializeRequestParams, InitializeResult, ListResourcesResult,
    ListToolsResult, PaginatedRequestParams, ProtocolVersion, ReadResourceRequestParams,
    ReadResourceResponse, ServerCapabilities, ServerConfig, SubscriptionFilter, Tool,
};
use rmcp::service::{RequestContext, SubscriptionContext};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{ErrorData as McpError, RoleServer, ServerHandler};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;
use toolrelay::wire::LogLevel;
use toolrelay_relay::front::Caller;
use toolrelay_relay::front::Clock;
use toolrelay_relay::front::ops::ListTools;

use crate::api::State;
use pairing::Pairing;
use sessions::{Keeper, OPENED, Running, SharedSessions};
use tools::{listed, relay_icon};

/// Messages a session's channels hold before the sender waits (rmcp's default is 16; a
/// session's calls are few, and every slot is memory held by every idle session).
const SESSION_CHANNEL_CAPACITY: usize = 4;
/// How long a new session may wait for its `initialize` to be answered.
const SESSION_INIT_TIMEOUT: Duration = Duration::from_secs(10);

/// The MCP revisions served, oldest first. The four with an `initialize` handshake keep a
/// client session (`Mcp-Session-Id`); 2026-07-28 is sessionless (`server/discover`, then
/// every request self-contained, any gateway answering it). `initialize` asking for a
/// revision not here is answered with 2025-11-25, as the handshake allows; a request whose
/// `_meta` names one gets JSON-RPC error -32022 listing these (rmcp). Named one by one rather
/// than rmcp's list of every revision it knows, so a newer rmcp serves nothing new unasked.
static REVISIONS: [ProtocolVersion; 5] = [
    ProtocolVersion::V_2024_11_05,
    ProtocolVersion::V_2025_03_26,
    ProtocolVersion::V_2025_06_18,
    ProtocolVersion::V_2025_11_25,
    ProtocolVersion::V_2026_07_28,
];

/// How long (ms) a 2026-07-28 client may keep `server/discover` and `/mcp`'s `tools/list`
/// (the same for every caller, so `cacheScope: public`): the built-in and pairing tools only
/// change with a new release. A session's own tools (`/mcp/s/{handle}`) change with its tab:
/// `ttlMs: 0`, `cacheScope: private`.
const LISTING_TTL_MS: u64 = 300_000;

/// What the gateway tells a handler about the HTTP request (inserted by [`with_context`]).
#[derive(Debug, Clone)]
struct McpRequest {
    /// The `{handle}` of `/mcp/s/{handle}`.
    handle: Option<String>,
    /// The client, for rate limits.
    caller: Caller,
}

/// The MCP server of `/mcp` (scoped = false) or `/mcp/s/{handle}` (scoped = true), one per
/// client session.
pub struct RelayMcp {
    state: State,
    scoped: bool,
    ended: SessionEnd,
    /// The least level of the tabs' log messages the client gets (`logging/setLevel`; info
    /// until it says). Kept by the gateway that was asked.
    log_level: std::sync::Mutex<LogLevel>,
}

impl RelayMcp {
    /// The least level of log message the client gets.
    fn log_level(&self) -> LogLevel {
        *self
            .log_level
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Cancelled when a session's server is dropped (rmcp drops it when the session ends): ends
/// the session's watcher with it.
struct SessionEnd(CancellationToken);

impl Drop for SessionEnd {
    fn drop(&mut self) {
        self.0.cancel();
    }
}

/// The two MCP endpoints, ready to mount.
pub fn endpoints(state: &State) -> (impl Endpoint + 'static, impl Endpoint + 'static) {
    let running = Arc::new(std::sync::Mutex::new(Running::default()));
    let make = |scoped: bool| {
        let state = state.clone();
        let namespace = if scoped { "s:" } else { "" };
        let mut config = server_config(&state);
        // A client's next request may reach another gateway (a round-robin balancer): that
        // gateway takes the session over from what the store keeps.
        config.session_store = Some(Arc::new(SharedSessions {
            store: Arc::clone(&state.store)
                as Arc<dyn toolrelay_relay::front::store::McpSessionStore>,
            clock: Clock::new(),
            namespace,
            idle: state.config.mcp_sessions.idle,
        }));
        let mut sessions = LocalSessionManager::default();
        sessions.session_config.keep_alive = Some(state.config.mcp_sessions.idle);
        sessions.session_config.channel_capacity = SESSION_CHANNEL_CAPACITY;
        sessions.session_config.init_timeout = Some(SESSION_INIT_TIMEOUT);
        let sessions = Arc::new(sessions);
        let keeper = Keeper {
            state: state.clone(),
            sessions: Arc::clone(&sessions),
            namespace,
            clock: Clock::new(),
            running: Arc::clone(&running),
        };
        let service = StreamableHttpService::new(
            move || {
                Ok(RelayMcp {
                    state: state.clone(),
                    scoped,
                    ended: SessionEnd(CancellationToken::new()),
                    log_level: std::sync::Mutex::new(LogLevel::Info),
                })
            },
            sessions,
            config,
        );
        with_context(keeper, service.compat())
    };
    (make(false), make(true))
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

/// Copies the path's `{handle}` and the client address into the request for the handler;
/// answers a body that is not a JSON-RPC message with a JSON-RPC error (rmcp answers it with
/// a plain-text 415); keeps sessions within their caps and idle time ([`Keeper`]); and
/// answers an ended session's `DELETE` with 200 (rmcp's 202 makes clients report a failure).
fn with_context<E: Endpoint + 'static>(keeper: Keeper, endpoint: E) -> impl Endpoint {
    endpoint.around(move |endpoint, mut request: Request| {
        let keeper = keeper.clone();
        async move {
            let mut initialize = None;
            if request.method() == poem::http::Method::POST {
                // The body is in memory already (the body-limit middleware read it).
                let body = request.take_body().into_bytes().await?;
                match read_message(&body) {
                    Err(refusal) => return Ok(*refusal),
                    Ok(message) => initialize = initialize_id(&message),
                }
                request.set_body(body);
            }
            let caller = keeper.state.caller(&request);
            let session = request
                .headers()
                .get("mcp-session-id")
                .and_then(|value| value.to_str().ok())
                .map(str::to_owned);
            let context = McpRequest {
                handle: request.raw_path_param("handle").map(str::to_owned),
                caller: caller.clone(),
            };
            request.extensions_mut().insert(context);
            let deleting = request.method() == poem::http::Method::DELETE;
            if let Some(session) = &session {
                keeper.touch(session).await;
            }
            let opening = match (&initialize, &session) {
                (Some(request_id), None) => match keeper.open(&caller, request_id).await {
                    Ok(opened) => Some(opened),
                    Err(refusal) => return Ok(refusal),
                },
                _ => None,
            };
            let Some(opened) = opening else {
                let mut response = endpoint.call(request).await?.into_response();
                if deleting && response.status() == poem::http::StatusCode::ACCEPTED {
                    response.set_status(poem::http::StatusCode::OK);
                }
                return Ok(response);
            };
            let response = OPENED
                .scope(opened.clone(), endpoint.call(request))
                .await
                .map(IntoResponse::into_response);
            let created = response.as_ref().ok().and_then(|response| {
                response
                    .headers()
                    .get("mcp-session-id")
                    .and_then(|value| value.to_str().ok())
            });
            if let Some(id) = created {
                keeper.used(id);
            } else {
                // No session took the place: free it.
                let _ = keeper.state.store.delete_mcp_session(&opened.slot).await;
            }
            response
        }
    })
}

/// The request id of an `initialize` request.
fn initialize_id(message: &ClientJsonRpcMessage) -> Option<Value> {
    match message {
        ClientJsonRpcMessage::Request(request)
            if matches!(request.request, ClientRequest::InitializeRequest(_)) =>
        {
            serde_json::to_value(&request.id).ok()
        }
        _ => None,
    }
}

/// The JSON-RPC message in `body`, or the JSON-RPC error for a body that is not JSON (-32700)
/// or not a JSON-RPC message (-32600).
fn read_message(body: &[u8]) -> Result<ClientJsonRpcMessage, Box<poem::Response>> {
    let (code, message) = match serde_json::from_slice::<Value>(body) {
        Err(error) => (
            -32700,
            format!("Parse error: the body is not JSON ({error})"),
        ),
        Ok(value) => match serde_json::from_value::<ClientJsonRpcMessage>(value) {
            Ok(message) => return Ok(message),
            Err(error) => (
                -32600,
                format!("Invalid Request: the body is not a JSON-RPC 2.0 message ({error})"),
            ),
        },
    };
    let body = json!({"jsonrpc": "2.0", "id": null, "error": {"code": code, "message": message}});
    Err(Box::new(
        poem::Response::builder()
            .status(poem::http::StatusCode::BAD_REQUEST)
            .content_type("application/json")
            .body(body.to_string()),
    ))
}

/// The client of an MCP request (an unknown one, if the gateway's context is missing, shares
/// one budget with every other such request).
fn caller_of(context: &RequestContext<RoleServer>) -> Caller {
    // What the client says it is (its `initialize`'s clientInfo), for a person asked to allow it.
    let label = context.peer.peer_info().map(|info| {
        let client = &info.client_info;
        format!("{} {}", client.name, client.version)
    });
    request_of(context)
        .map_or_else(
            || Caller::new(std::net::IpAddr::from([0, 0, 0, 0])),
            |request| request.caller,
        )
        .with_label(label.as_deref())
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

impl ServerHandler for RelayMcp {
    fn get_info(&self) -> ServerConfig {
        let instructions = if self.scoped {
            "Tools in the user's browser tab (a CODAP document) and tools built into the relay. Call them by name."
        } else {
            "Tools built into the relay, and pairing with a user's browser tab. To work in CODAP (data tables, graphs), call open_codap: it opens a CODAP paired with this conversation; then call_session_tool. Or ask the user for the pairing code shown in their plugin, call connect_session with it, then call_session_tool."
        };
        // Logging: a tab's log messages about a call reach its client at or above the level
        // it set (`logging/setLevel`; deprecated from 2026-07-28 on, SEP-2577). Prompts: none, listed as such rather than
        // refused. Resources: `/mcp` has its app's page, `/mcp/s/{handle}` none.
        #[allow(deprecated)]
        let capabilities = ServerCapabilities::builder()
            .enable_logging()
            .enable_prompts()
            .enable_resources()
            .enable_tools()
            .enable_tool_list_changed()
            .build();
        ServerConfig::new(capabilities)
            .with_server_info(
                Implementation::new("toolrelay", env!("CARGO_PKG_VERSION"))
                    .with_title("toolrelay")
                    .with_icons(vec![relay_icon()]),
            )
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

    fn supported_protocol_versions(&self) -> Cow<'static, [ProtocolVersion]> {
        Cow::Borrowed(&REVISIONS)
    }

    /// The 2026-07-28 entry: what `initialize` answers, the same for every caller.
    async fn discover(
        &self,
        _context: RequestContext<RoleServer>,
    ) -> Result<DiscoverResult, McpError> {
        Ok(
            DiscoverResult::from_server_info(REVISIONS.to_vec(), self.get_info())
                .with_ttl_ms(LISTING_TTL_MS)
                .with_cache_scope(CacheScope::Public),
        )
    }

    /// 2026-07-28's way to hear that the tools changed: followed on `/mcp/s/{handle}`; `/mcp`'s
    /// tools never change, so there the acknowledgement accepts nothing and the stream ends.
    fn accepted_subscription_filter(
        &self,
        requested: &SubscriptionFilter,
    ) -> Option<SubscriptionFilter> {
        let mut accepted = SubscriptionFilter::new();
        if self.scoped {
            accepted.tools_list_changed = requested.tools_list_changed;
        }
        Some(accepted)
    }

    async fn listen(&self, subscription: SubscriptionContext) -> Result<(), McpError> {
        if subscription.accepted().tools_list_changed == Some(true) {
            self.listen_tools(&subscription).await;
        }
        Ok(())
    }

    /// The least level of the tabs' log messages this client gets, from now on.
    #[allow(deprecated)] // logging, deprecated from 2026-07-28 on, is still in the older ones
    async fn set_level(
        &self,
        request: rmcp::model::SetLevelRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        let level = serde_json::to_value(request.level)
            .and_then(serde_json::from_value)
            .map_err(|_| McpError::invalid_params("no such log level", None))?;
        *self
            .log_level
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = level;
        Ok(())
    }

    async fn list_resources(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, McpError> {
        Ok(if self.scoped {
            ListResourcesResult::default()
        } else {
            self.list_app()
        })
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, McpError> {
        let page = if self.scoped {
            None
        } else {
            self.read_app(&request.uri)
        };
        page.map(Into::into).ok_or_else(|| {
            McpError::resource_not_found(
                format!(
                    "No resource {}: resources/list names the ones there are.",
                    request.uri
                ),
                // The resource asked for, as the spec's resource-not-found error carries it.
                Some(json!({"uri": request.uri})),
            )
        })
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        if self.scoped {
            let handle = Self::scoped_handle(&context);
            let tools = self.session_tools(&caller_of(&context), &handle).await;
            return tools
                .map(|tools| {
                    ListToolsResult::with_all_items(tools)
                        .with_ttl_ms(0)
                        .with_cache_scope(CacheScope::Private)
                })
                .map_err(|error| {
                    McpError::invalid_params(
                        error.message,
                        Some(json!({"error": error.code.as_str()})),
                    )
                });
        }
        let builtins = self
            .state
            .relay
            .run(&caller_of(&context), ListTools)
            .await
            .map_err(|error| McpError::internal_error(error.message, None))?;
        let mut tools: Vec<Tool> = builtins
            .into_iter()
            .map(|builtin| listed(builtin.into()))
            .collect();
        tools.extend(Pairing::tools());
        Ok(ListToolsResult::with_all_items(tools)
            .with_ttl_ms(LISTING_TTL_MS)
            .with_cache_scope(CacheScope::Public))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let name = request.name.to_string();
        let arguments = Value::Object(request.arguments.unwrap_or_default());
        let called = if self.scoped {
            let handle = Self::scoped_handle(&context);
            self.call_in_session(&handle, &name, arguments, false, &context)
                .await
        } else if let Some(pairing) = Pairing::named(&name) {
            self.call_pairing(pairing, &arguments, &context)
                .await
                .into()
        } else {
            self.call_builtin(&name, arguments, &context).await
        };
        Ok(called.answering_tools_call()?.into())
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
