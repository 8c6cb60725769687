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
//!
//! Client sessions are bounded (see [`Keeper`]): at most `MCP_SESSIONS_PER_IP` live ones per
//! client address and `MCP_MAX_SESSIONS` in all, counted in the store so the caps hold across
//! gateways; a session unused for `MCP_SESSION_IDLE_SECONDS` ends in the gateway (rmcp's
//! keep-alive) and in the store (its expiry slides on every request).

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use poem::endpoint::TowerCompatExt;
use poem::{Endpoint, EndpointExt, IntoResponse, Request};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ClientJsonRpcMessage, ClientRequest,
    ContentBlock, Implementation, InitializeRequestParams, InitializeResult, JsonObject,
    ListToolsResult, PaginatedRequestParams, ProgressNotificationParam, ServerCapabilities,
    ServerConfig, Tool,
};
use rmcp::service::RequestContext;
use rmcp::transport::streamable_http_server::session::SessionManager;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::session::store::{
    SessionState, SessionStore, SessionStoreError,
};
use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{ErrorData as McpError, RoleServer, ServerHandler};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;
use toolrelay_relay::builtin::{FailureCode, Scope};
use toolrelay_relay::clock::{Clock, Timestamp};
use toolrelay_relay::code::random_id;
use toolrelay_relay::limits::client_key;
use toolrelay_relay::metrics::Refusal;
use toolrelay_relay::store::{McpSessionCaps, McpSessionStore, McpSessionsFull};
use toolrelay_relay::{CallInput, Caller, ErrorCode, ErrorInfo, ErrorKind, SessionCode};

use crate::api::State;
use crate::types::CallResponse;

/// How often a call waiting for the tab reports progress.
const PROGRESS_EVERY: Duration = Duration::from_secs(2);
/// Messages a session's channels hold before the sender waits (rmcp's default is 16; a
/// session's calls are few, and every slot is memory held by every idle session).
const SESSION_CHANNEL_CAPACITY: usize = 4;
/// How long a new session may wait for its `initialize` to be answered.
const SESSION_INIT_TIMEOUT: Duration = Duration::from_secs(10);
/// Sessions a gateway keeps running at most (both endpoints together). A running session
/// costs ~80 KiB in rmcp (its worker, its service loop and seven channels, each of which
/// allocates a block of 32 messages at once, whatever its capacity); past this many, the one
/// used longest ago is stopped here, and its next request takes it over again from the store,
/// as another gateway would. So 10,000 live sessions cost the store a few hundred bytes each
/// and the gateway at most ~80 MiB.
const RUNNING_SESSIONS: usize = 1_000;
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

/// The MCP server of `/mcp` (scoped = false) or `/mcp/s/{handle}` (scoped = true), one per
/// client session.
pub struct RelayMcp {
    state: State,
    scoped: bool,
    ended: SessionEnd,
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
            store: Arc::clone(&state.store),
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
                })
            },
            sessions,
            config,
        );
        with_context(keeper, service.compat())
    };
    (make(false), make(true))
}

tokio::task_local! {
    /// The place [`Keeper::open`] took for the session an `initialize` is creating, for
    /// [`SharedSessions::store`] (rmcp stores the session in the request's task).
    static OPENED: Opened;
}

/// A place taken in the session caps.
#[derive(Debug, Clone)]
struct Opened {
    slot: String,
    /// The client's key (`limits::client_key`).
    address: String,
}

/// Keeps MCP client sessions bounded: takes a place in the caps for each `initialize`,
/// refusing it when the client or everyone has no more; slides a session's expiry on each
/// request; and ends in this gateway a session the store has let go (expired or deleted
/// elsewhere), so that a session lives no longer here than in the store.
#[derive(Clone)]
struct Keeper {
    state: State,
    sessions: Arc<LocalSessionManager>,
    namespace: &'static str,
    clock: Clock,
    running: Arc<std::sync::Mutex<Running>>,
}

/// The sessions running in this gateway, by last use (some may have ended since).
#[derive(Default)]
struct Running {
    uses: u64,
    by_use: std::collections::BTreeMap<u64, (Arc<LocalSessionManager>, &'static str, String)>,
    last_use: std::collections::HashMap<(&'static str, String), u64>,
}

impl Keeper {
    fn expiry(&self) -> Timestamp {
        self.clock.now().plus(self.state.config.mcp_sessions.idle)
    }

    /// A place for a new session of `caller`, or the refusal to answer its `initialize`
    /// (`request_id`) with.
    async fn open(&self, caller: &Caller, request_id: &Value) -> Result<Opened, poem::Response> {
        let limits = self.state.config.mcp_sessions;
        let address = client_key(caller.address, limits.ipv6_prefix).to_string();
        let slot = format!("{}opening:{}", self.namespace, random_id());
        let caps = McpSessionCaps {
            per_address: limits.per_address.get(),
            total: limits.total.get(),
        };
        let wait = limits.idle.as_secs().max(1);
        match self
            .state
            .store
            .open_mcp_session(&slot, &address, caps, self.expiry())
            .await
        {
            Ok(Ok(())) => Ok(Opened { slot, address }),
            Ok(Err(McpSessionsFull::PerAddress)) => {
                self.state.metrics.refused(Refusal::McpSessionsPerAddress);
                Err(refusal(
                    poem::http::StatusCode::TOO_MANY_REQUESTS,
                    request_id,
                    wait,
                    &format!(
                        "Too many MCP sessions from your address (MCP_SESSIONS_PER_IP = {}): end sessions you no longer use (DELETE /mcp with their Mcp-Session-Id) or wait for idle ones to end.",
                        caps.per_address
                    ),
                ))
            }
            Ok(Err(McpSessionsFull::Total)) => {
                self.state.metrics.refused(Refusal::McpSessionsTotal);
                Err(refusal(
                    poem::http::StatusCode::SERVICE_UNAVAILABLE,
                    request_id,
                    wait,
                    &format!(
                        "The relay holds as many MCP sessions as it may (MCP_MAX_SESSIONS = {}): try again later.",
                        caps.total
                    ),
                ))
            }
            Err(error) => {
                tracing::warn!(%error, "the store could not open an MCP session");
                Err(refusal(
                    poem::http::StatusCode::SERVICE_UNAVAILABLE,
                    request_id,
                    1,
                    "The relay cannot open an MCP session right now: try again in a moment.",
                ))
            }
        }
    }

    /// A request of session `id` came: it lives on from now, unless the store let it go.
    async fn touch(&self, id: &str) {
        let kept = self
            .state
            .store
            .touch_mcp_session(&format!("{}{id}", self.namespace), self.expiry())
            .await;
        if let Ok(false) = kept {
            // rmcp then answers 404, and the client starts a new session.
            let _ = self.sessions.close_session(&id.into()).await;
        } else {
            self.used(id);
        }
    }

    /// Session `id` runs here now (it began, or a request for it came): the one used longest
    /// ago stops if too many run.
    fn used(&self, id: &str) {
        let stopping = {
            // A std mutex: held for a few map operations, never across an await.
            let mut running = self
                .running
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            running.uses += 1;
            let now = running.uses;
            if let Some(before) = running
                .last_use
                .insert((self.namespace, id.to_owned()), now)
            {
                running.by_use.remove(&before);
            }
            running.by_use.insert(
                now,
                (Arc::clone(&self.sessions), self.namespace, id.to_owned()),
            );
            if running.by_use.len() > RUNNING_SESSIONS {
                running
                    .by_use
                    .pop_first()
                    .map(|(_, (sessions, namespace, id))| {
                        running.last_use.remove(&(namespace, id.clone()));
                        (sessions, id)
                    })
            } else {
                None
            }
        };
        if let Some((sessions, id)) = stopping {
            // Only here: the store keeps it, so its next request takes it over again.
            tokio::spawn(async move {
                let _ = sessions.close_session(&id.as_str().into()).await;
            });
        }
    }
}

/// A JSON-RPC error refusing a new session, with `Retry-After`.
fn refusal(
    status: poem::http::StatusCode,
    request_id: &Value,
    retry_after: u64,
    message: &str,
) -> poem::Response {
    let body =
        json!({"jsonrpc": "2.0", "id": request_id, "error": {"code": -32000, "message": message}});
    poem::Response::builder()
        .status(status)
        .header(poem::http::header::RETRY_AFTER, retry_after)
        .content_type("application/json")
        .body(body.to_string())
}

/// MCP client sessions kept in the gateway's store (Redis when gateways share one), so any
/// gateway can serve a session another made: rmcp keeps the client's `initialize`
/// parameters there and, on a request for a session it does not hold, replays the handshake.
struct SharedSessions {
    store: Arc<dyn McpSessionStore>,
    clock: Clock,
    /// Keeps `/mcp` and `/mcp/s/{handle}` sessions apart.
    namespace: &'static str,
    /// How long an unused session is kept.
    idle: Duration,
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
        let id = format!("{}{id}", self.namespace);
        // Always in an `initialize` the keeper let through; a session stored otherwise is
        // kept, counted under no address.
        let opened = OPENED.try_with(Opened::clone).unwrap_or_else(|_| Opened {
            slot: id.clone(),
            address: "unknown".to_owned(),
        });
        self.store
            .put_mcp_session(
                &id,
                &opened.slot,
                &opened.address,
                serde_json::to_string(state)?,
                self.clock.now().plus(self.idle),
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
        // The server's end or the session's.
        let stopping = self.state.shutdown.clone();
        let ended = self.ended.0.clone();
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
                            () = ended.cancelled() => return,
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
                        () = ended.cancelled() => return,
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
            return failure(
                ErrorCode::ToolError.as_str(),
                "The call ended without an answer.",
            );
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
            (false, None) => failure(
                ErrorCode::ToolError.as_str(),
                "The tool failed without a message.",
            ),
        }
    }

    /// A built-in tool, outside any session (scope: the MCP session when there is one).
    async fn call_builtin(
        &self,
        name: &str,
        arguments: Value,
        context: &RequestContext<RoleServer>,
    ) -> CallToolResult {
        let caller = caller_of(context);
        if let Err(limited) = self.state.limits.tool_call(caller.address).await {
            return failure(limited.code.as_str(), &limited.message);
        }
        let scope = mcp_session_of(context).map_or(Scope::None, Scope::Mcp);
        match self
            .state
            .relay
            .call_tool(&caller, name, arguments, scope)
            .await
        {
            Ok(Ok(value)) => success(value),
            Ok(Err(error)) => failure(&error.code.to_string(), &error.message),
            // The relay could not be reached (the gateway's own callers are let in).
            Err(refused) => failure(
                &FailureCode::from(refused.code).to_string(),
                &refused.message,
            ),
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
            .tools(&caller_of(&context))
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
