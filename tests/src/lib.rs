//! Builders for end-to-end tests, so a test reads like its scenario:
//!
//! ```text
//! let relay = TestRelay::start().await;
//! let session = relay.create_session().await;
//! let mut tab = WsTab::attach(&relay, &session).await;
//! tab.register(json!([...])).await;
//! ```
//!
//! Servers listen on `127.0.0.1:0`; dropping a [`TestRelay`] stops it.
#![allow(clippy::unwrap_used, clippy::missing_panics_doc)] // test support fails loudly

pub mod balancer;
pub mod certs;
pub mod cluster;
pub mod deploy;
pub mod grpc;
pub mod guard;
pub mod mcp;
pub mod metrics;
pub mod mip;
pub mod recording;
pub mod redis;
pub mod remip;
pub mod sdk_tab;
pub mod store_fixture;
pub mod system;

use std::net::SocketAddr;
use std::time::Duration;

use futures::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};
use tonic::transport::{Channel, Endpoint};
use toolrelay::proto::v1::relay_client::RelayClient;
use toolrelay::proto::v1::{
    CallRequest, CreateSessionRequest, CreateSessionResponse, RequestState,
};
use toolrelay_builtin::BuiltinConfig;
use toolrelay_relay::RelayConfig;
use toolrelay_relay::server::{self, Listeners};

/// How long a test waits for something that should happen promptly.
pub const PATIENCE: Duration = Duration::from_secs(10);

/// When [`wait_until`] gives up, and how often it looks again meanwhile (every 20 ms unless
/// told). A [`Duration`] is that long from now.
#[derive(Clone, Copy, Debug)]
pub struct Deadline {
    at: tokio::time::Instant,
    every: Duration,
}

impl Deadline {
    /// `patience` from now.
    pub fn within(patience: Duration) -> Self {
        Self::at(tokio::time::Instant::now() + patience)
    }

    /// At the instant `at`.
    pub fn at(at: tokio::time::Instant) -> Self {
        Self {
            at,
            every: Duration::from_millis(20),
        }
    }

    /// Looking again every `every` instead.
    #[must_use]
    pub fn every(self, every: Duration) -> Self {
        Self { every, ..self }
    }
}

impl From<Duration> for Deadline {
    fn from(patience: Duration) -> Self {
        Self::within(patience)
    }
}

impl From<tokio::time::Instant> for Deadline {
    fn from(at: tokio::time::Instant) -> Self {
        Self::at(at)
    }
}

/// Looks at `condition` until it is met, then returns what it found: it answers `Ok` once met,
/// or `Err` with why not yet, which is the failure once the deadline has passed.
pub async fn wait_until<T, E: std::fmt::Display>(
    deadline: impl Into<Deadline>,
    mut condition: impl AsyncFnMut() -> Result<T, E>,
) -> T {
    let Deadline { at, every } = deadline.into();
    loop {
        match condition().await {
            Ok(found) => return found,
            Err(not_yet) => assert!(tokio::time::Instant::now() < at, "{not_yet}"),
        }
        tokio::time::sleep(every).await;
    }
}

/// The gateway secret the split systems share (`GATEWAY_SECRET` of their relays and gateways).
pub const GATEWAY_SECRET: &str = "test-gateway-secret-0123456789";

/// The relay's built-in tools, in the order every listing gives them.
pub const BUILTIN_TOOLS: [&str; 6] = [
    "encodePlantUML",
    "decodePlantUML",
    "generate_mip_problem",
    "solve_mip_problem",
    "validate_mip_solution",
    "get_mip_solution",
];

/// `/mcp`'s tools, in the order it lists them: the built-in ones, then the pairing tools (the
/// last, `codap_status`, only for `open_codap`'s app).
pub fn mcp_tools() -> Vec<&'static str> {
    BUILTIN_TOOLS
        .into_iter()
        .chain([
            "open_codap",
            "connect_session",
            "list_session_tools",
            "call_session_tool",
            "read_session_tool",
            "codap_status",
        ])
        .collect()
}

/// The demo tab's tools (see [`demo_tools`]) followed by the built-in ones.
pub fn tab_and_builtin_names() -> Vec<&'static str> {
    ["echo", "add"].into_iter().chain(BUILTIN_TOOLS).collect()
}

/// A relay serving gRPC and the browser WebSocket on ephemeral loopback ports.
pub struct TestRelay {
    /// The gRPC address.
    pub grpc: SocketAddr,
    /// The WebSocket address.
    pub websocket: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
    _redis: Option<redis::RedisServer>,
}

/// A channel to the gRPC server at `address`, connected.
pub async fn grpc_channel(address: SocketAddr) -> Channel {
    Endpoint::from_shared(format!("http://{address}"))
        .unwrap()
        .connect()
        .await
        .unwrap()
}

/// A gRPC client of the relay at `address`.
pub async fn relay_client(address: SocketAddr) -> RelayClient<Channel> {
    RelayClient::new(grpc_channel(address).await)
}

/// An HTTP client whose connections come from 127.0.0.2: a client address other than the
/// 127.0.0.1 every other client of a test comes from.
pub fn from_other_address() -> reqwest::Client {
    reqwest::Client::builder()
        .local_address(Some("127.0.0.2".parse().unwrap()))
        .build()
        .unwrap()
}

/// The variable that runs the end-to-end suites on Redis: `TOOLRELAY_TEST_STORE=redis`.
pub const ENV_TEST_STORE: &str = "TOOLRELAY_TEST_STORE";

/// The variable that chooses how replicas on Redis reach a call's tab in the suites:
/// `routed` (the default: each relay has `REPLICA_URL`, calls go to the tab's replica) or
/// `pubsub` (no `REPLICA_URL`: by Redis pub/sub alone).
pub const ENV_TEST_ROUTE: &str = "TOOLRELAY_TEST_ROUTE";

/// Whether relays on Redis route calls to their tab's replica in this run ([`ENV_TEST_ROUTE`]).
pub fn test_routed() -> bool {
    match std::env::var(ENV_TEST_ROUTE).as_deref() {
        Ok("routed" | "") | Err(_) => true,
        Ok("pubsub") => false,
        Ok(other) => panic!("{ENV_TEST_ROUTE}={other}: use routed or pubsub"),
    }
}

/// A Redis of the test's own when the suites run in Redis mode ([`ENV_TEST_STORE`]).
pub async fn test_redis() -> Option<redis::RedisServer> {
    match std::env::var(ENV_TEST_STORE).as_deref() {
        Ok("redis") => Some(redis::RedisServer::start().await),
        Ok("memory" | "") | Err(_) => None,
        Ok(other) => panic!("{ENV_TEST_STORE}={other}: use redis or memory"),
    }
}

/// A relay over the store of this test run: memory, or (in Redis mode) a Redis of its own,
/// returned with it so it lives as long as the relay. It runs the built-in tools with their
/// default settings.
pub async fn test_relay(
    config: RelayConfig,
) -> (toolrelay_relay::Relay, Option<redis::RedisServer>) {
    test_relay_with(config, &BuiltinConfig::default()).await
}

/// [`test_relay`] with the built-in tools set up as `tools` says.
pub async fn test_relay_with(
    mut config: RelayConfig,
    tools: &BuiltinConfig,
) -> (toolrelay_relay::Relay, Option<redis::RedisServer>) {
    let redis = test_redis().await;
    if let Some(redis) = &redis {
        config.store = toolrelay_relay::config::StoreConfig::Redis(Box::new(
            toolrelay_relay::config::RedisSettings::primary(redis.url(), "test:"),
        ));
    }
    let metrics = toolrelay_relay::Metrics::new("toolrelay-test");
    let tools = toolrelay_builtin::standard(tools, &metrics);
    (server::relay(config, tools, &metrics).await.unwrap(), redis)
}

impl TestRelay {
    /// A relay with the default settings.
    pub async fn start() -> Self {
        Self::with_config(RelayConfig::default()).await
    }

    /// A relay with these settings.
    pub async fn with_config(config: RelayConfig) -> Self {
        let redis = test_redis().await;
        Self::serving(config, redis).await
    }

    /// A relay with these settings on a Redis of its own, whatever the test run's store
    /// ([`TestRelay::redis`]).
    pub async fn on_redis(config: RelayConfig) -> Self {
        Self::serving(config, Some(redis::RedisServer::start().await)).await
    }

    /// Its Redis, when it has one.
    pub fn redis(&self) -> Option<&redis::RedisServer> {
        self._redis.as_ref()
    }

    async fn serving(mut config: RelayConfig, redis: Option<redis::RedisServer>) -> Self {
        config.validate().unwrap();
        let grpc = TcpListener::bind("127.0.0.1:0").await.unwrap();
        if let Some(redis) = &redis {
            let mut settings =
                toolrelay_relay::config::RedisSettings::primary(redis.url(), "test:");
            // One replica: every call routed is handed to its tab in the process.
            if test_routed() {
                settings.routing = Some(toolrelay_relay::config::Routing {
                    url: format!("http://{}", grpc.local_addr().unwrap()),
                    proof: GATEWAY_SECRET.to_owned(),
                });
            }
            config.store = toolrelay_relay::config::StoreConfig::Redis(Box::new(settings));
        }
        let websocket = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addresses = (grpc.local_addr().unwrap(), websocket.local_addr().unwrap());
        let metrics = toolrelay_relay::Metrics::new("toolrelay-test");
        let tools = toolrelay_builtin::standard(&BuiltinConfig::default(), &metrics);
        let relay = server::relay(config, tools, &metrics).await.unwrap();
        let (stop, stopped) = oneshot::channel::<()>();
        let listeners = Listeners {
            grpc,
            websocket: Some(websocket),
        };
        let task = tokio::spawn(async move {
            let shutdown = async {
                let _ = stopped.await;
            };
            server::run(relay, listeners, shutdown).await.unwrap();
        });
        Self {
            grpc: addresses.0,
            websocket: addresses.1,
            stop: Some(stop),
            task: Some(task),
            _redis: redis,
        }
    }

    /// A gRPC client of the relay.
    pub async fn client(&self) -> RelayClient<Channel> {
        relay_client(self.grpc).await
    }

    /// A new session, created over gRPC.
    pub async fn create_session(&self) -> CreateSessionResponse {
        self.client()
            .await
            .create_session(CreateSessionRequest {})
            .await
            .unwrap()
            .into_inner()
    }

    /// A session whose tab is attached over WebSocket and has registered [`demo_tools`].
    pub async fn paired(&self) -> (CreateSessionResponse, WsTab) {
        let session = self.create_session().await;
        let mut tab = WsTab::attach(self, &session).await;
        tab.register(demo_tools()).await;
        (session, tab)
    }

    /// Starts a gRPC `Call` in the background; await the handle for its outcome.
    pub async fn spawn_call(
        &self,
        request: CallRequest,
    ) -> JoinHandle<Result<RequestState, tonic::Status>> {
        let mut client = self.client().await;
        tokio::spawn(async move { client.call(request).await.map(tonic::Response::into_inner) })
    }

    /// The provider WebSocket URL of a session.
    pub fn ws_url(&self, code: &str, token: Option<&str>) -> String {
        let base = format!("ws://{}/api/sessions/{code}/ws", self.websocket);
        match token {
            Some(token) => format!("{base}?token={token}"),
            None => base,
        }
    }

    /// Stops the relay and waits until it has stopped.
    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            tokio::time::timeout(Duration::from_secs(15), task)
                .await
                .expect("the relay stops within its drain timeout")
                .unwrap();
        }
    }
}

impl Drop for TestRelay {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// A gRPC request carrying the provider token as `authorization: Bearer …`.
pub fn with_token<T>(message: T, token: &str) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request
        .metadata_mut()
        .insert("authorization", format!("Bearer {token}").parse().unwrap());
    request
}

/// The stable error name a relay status carries in its `x-error` trailer.
pub fn error_name(status: &tonic::Status) -> String {
    status
        .metadata()
        .get("x-error")
        .and_then(|value| value.to_str().ok())
        .unwrap_or_default()
        .to_owned()
}

/// The Python of the test venv that `scripts/setup.sh --test` builds (`TOOLRELAY_TEST_PYTHON`
/// names it; `scripts/test.sh` sets it).
pub fn test_python() -> std::path::PathBuf {
    let python = std::env::var_os("TOOLRELAY_TEST_PYTHON").map_or_else(
        || {
            let home = std::env::var_os("HOME").unwrap_or_default();
            std::path::Path::new(&home).join(".cache/toolrelay/test-venv/bin/python")
        },
        std::path::PathBuf::from,
    );
    assert!(
        python.exists(),
        "{} is missing: run scripts/setup.sh --test (scripts/test.sh does) to create the test venv",
        python.display()
    );
    python
}

/// A loopback port nothing listens on (right after this returns), for servers that bind it
/// themselves.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A file of the repository, from the tests crate.
pub fn repo_file(path: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(path)
}

/// Runs the test venv's Python on `tests/python/{script}` with a temporary file (named after
/// `name`, removed afterwards) holding `contents` as its argument.
pub async fn python_on_file(script: &str, name: &str, contents: &[u8]) -> std::process::Output {
    static FILES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let file = std::env::temp_dir().join(format!(
        "toolrelay-{}-{}-{name}",
        std::process::id(),
        FILES.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    ));
    std::fs::write(&file, contents).unwrap();
    let output = tokio::process::Command::new(test_python())
        .arg(repo_file(&format!("tests/python/{script}")))
        .arg(&file)
        .output()
        .await
        .unwrap();
    std::fs::remove_file(&file).unwrap();
    output
}

/// A browser tab attached to a session over the provider WebSocket.
pub struct WsTab {
    socket: WebSocketStream<MaybeTlsStream<TcpStream>>,
    /// The `welcome` frame.
    pub welcome: Value,
}

impl WsTab {
    /// Connects with the session's token and reads the `welcome` frame.
    pub async fn attach(relay: &TestRelay, session: &CreateSessionResponse) -> Self {
        Self::attach_url(&relay.ws_url(&session.code, Some(&session.provider_token))).await
    }

    /// Connects to a provider WebSocket URL and reads the `welcome` frame.
    pub async fn attach_url(url: &str) -> Self {
        let mut socket = Self::connect(url).await;
        let welcome = socket.recv().await;
        assert_eq!(welcome["type"], "welcome", "{welcome}");
        socket.welcome = welcome;
        socket
    }

    /// Connects to `url` without reading anything.
    pub async fn connect(url: &str) -> Self {
        Self::open(url).await.unwrap()
    }

    /// Connects to `url` without reading anything; `None` when nothing listens there.
    pub async fn try_connect(url: &str) -> Option<Self> {
        Self::open(url).await.ok()
    }

    /// Like a browser's, the socket sends each frame at once (`TCP_NODELAY`): two frames in a
    /// row are not held back for the relay's TCP acknowledgement of the first.
    async fn open(url: &str) -> Result<Self, tokio_tungstenite::tungstenite::Error> {
        let (socket, _) = tokio_tungstenite::connect_async_with_config(url, None, true).await?;
        Ok(Self {
            socket,
            welcome: Value::Null,
        })
    }

    /// Sends a JSON frame.
    pub async fn send(&mut self, frame: Value) {
        self.socket
            .send(Message::text(frame.to_string()))
            .await
            .unwrap();
    }

    /// Sends a raw text frame.
    pub async fn send_text(&mut self, text: &str) {
        self.socket
            .send(Message::text(text.to_owned()))
            .await
            .unwrap();
    }

    /// The next JSON frame, skipping heartbeats; panics if the socket closes first.
    pub async fn recv(&mut self) -> Value {
        loop {
            let frame = self
                .next_frame()
                .await
                .expect("the relay closed the WebSocket");
            if frame["type"] != "heartbeat" {
                return frame;
            }
        }
    }

    /// The next JSON frame (heartbeats included, acknowledgements of answers left out), or
    /// `None` once the socket is closed.
    pub async fn next_frame(&mut self) -> Option<Value> {
        loop {
            let frame = self.next_any_frame().await?;
            // Acknowledgements of the tab's answers are the SDK's business (see `sdk_tab`);
            // these tests read what comes besides them.
            if frame["type"] != "ack" {
                return Some(frame);
            }
        }
    }

    /// The next JSON frame, whatever it is, or `None` once the socket is closed.
    pub async fn next_any_frame(&mut self) -> Option<Value> {
        loop {
            let message = tokio::time::timeout(PATIENCE, self.socket.next())
                .await
                .expect("no frame from the relay in time");
            match message {
                Some(Ok(Message::Text(text))) => return Some(serde_json::from_str(&text).unwrap()),
                Some(Ok(Message::Close(_))) | None | Some(Err(_)) => return None,
                Some(Ok(_)) => {}
            }
        }
    }

    /// Reads until the relay closes the socket; returns the close frame.
    pub async fn closed(&mut self) -> Option<CloseFrame> {
        loop {
            let message = tokio::time::timeout(PATIENCE, self.socket.next())
                .await
                .expect("the relay did not close the WebSocket in time");
            match message {
                Some(Ok(Message::Close(frame))) => return frame,
                None | Some(Err(_)) => return None,
                Some(Ok(_)) => {}
            }
        }
    }

    /// Registers tools and waits for `registered`.
    pub async fn register(&mut self, tools: Value) -> Value {
        self.send(json!({"type": "register", "tools": tools})).await;
        let reply = self.recv().await;
        assert_eq!(reply["type"], "registered", "{reply}");
        reply
    }

    /// Waits for the next `tool-request`.
    pub async fn next_request(&mut self) -> Value {
        let frame = self.recv().await;
        assert_eq!(frame["type"], "tool-request", "{frame}");
        frame
    }

    /// Answers a call successfully.
    pub async fn answer(&mut self, request_id: &str, result: Value) {
        self.send(
            json!({"type": "response", "requestId": request_id, "success": true, "result": result}),
        )
        .await;
    }

    /// Answers a call and waits for the relay's acknowledgement: the answer is stored, and
    /// anyone reading the call from now on sees it (frames that come first are skipped).
    pub async fn answer_stored(&mut self, request_id: &str, result: Value) {
        self.answer(request_id, result).await;
        loop {
            let frame = self
                .next_any_frame()
                .await
                .expect("the relay closed the WebSocket before acknowledging the answer");
            if frame["type"] == "ack" && frame["requestId"] == request_id {
                assert!(
                    frame.get("error").is_none(),
                    "the answer was refused: {frame}"
                );
                return;
            }
        }
    }

    /// Closes the socket as a tab would when its page goes away.
    pub async fn close(mut self) {
        let _ = self.socket.close(None).await;
    }
}

/// The tools of the test tab: `echo {text}` and `add {a, b}` in a group `demo`.
pub fn demo_tools() -> Value {
    json!([{
        "id": "demo",
        "description": "Demo tools",
        "functions": [
            {"name": "echo", "description": "Echoes text", "parameters": {
                "type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}},
            {"name": "add", "description": "Adds", "parameters": {
                "type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}, "required": ["a", "b"]}}
        ]
    }])
}

/// A backend provider attached to a session over the relay's gRPC `Connect` stream.
pub struct GrpcProvider {
    outbound: tokio::sync::mpsc::Sender<toolrelay::proto::v1::ProviderMessage>,
    inbound: tonic::Streaming<toolrelay::proto::v1::RelayMessage>,
}

impl GrpcProvider {
    /// Attaches to session `code` on the relay's gRPC port at `grpc`, registers `tools` (as
    /// JSON, grouped like [`demo_tools`]) and waits until they are registered.
    pub async fn attach(grpc: SocketAddr, code: &str, token: &str, tools: &Value) -> Self {
        Self::connect(grpc, code, token, tools)
            .await
            .expect("the relay took the provider")
    }

    /// Like [`GrpcProvider::attach`], or the status the relay refused the stream with.
    pub async fn connect(
        grpc: SocketAddr,
        code: &str,
        token: &str,
        tools: &Value,
    ) -> Result<Self, tonic::Status> {
        Self::connect_approving(grpc, code, token, tools, false).await
    }

    /// Like [`GrpcProvider::connect`], saying at `Register` whether the person approves new
    /// callers (`approves`).
    pub async fn connect_approving(
        grpc: SocketAddr,
        code: &str,
        token: &str,
        tools: &Value,
        approves: bool,
    ) -> Result<Self, tonic::Status> {
        use toolrelay::proto::v1::{ProviderMessage, Register, provider_message, relay_message};
        let channel = grpc_channel(grpc).await;
        let (outbound, messages) = tokio::sync::mpsc::channel(16);
        let register = provider_message::Kind::Register(Register {
            tools: Vec::new(),
            tools_json: tools.to_string(),
            approves,
        });
        outbound
            .send(ProviderMessage {
                kind: Some(register),
            })
            .await
            .unwrap();
        let mut request = with_token(tokio_stream::wrappers::ReceiverStream::new(messages), token);
        request
            .metadata_mut()
            .insert("x-session-code", code.parse().unwrap());
        let inbound = RelayClient::new(channel)
            .connect(request)
            .await?
            .into_inner();
        let mut provider = Self { outbound, inbound };
        loop {
            match provider.next().await {
                Some(relay_message::Kind::Registered(_)) => return Ok(provider),
                Some(relay_message::Kind::Error(error)) => {
                    panic!("registration refused: {error:?}")
                }
                Some(_) => {}
                None => panic!("the relay ended the stream before registering"),
            }
        }
    }

    /// The next message other than a heartbeat or an answer's acknowledgement, or `None` once
    /// the stream has ended.
    pub async fn next(&mut self) -> Option<toolrelay::proto::v1::relay_message::Kind> {
        use toolrelay::proto::v1::relay_message::Kind;
        loop {
            let message = tokio::time::timeout(PATIENCE, self.inbound.message())
                .await
                .expect("no message from the relay in time");
            match message {
                Ok(Some(message)) => match message.kind {
                    Some(Kind::Heartbeat(_) | Kind::Ack(_)) | None => {}
                    Some(kind) => return Some(kind),
                },
                Ok(None) | Err(_) => return None,
            }
        }
    }

    /// Waits for the next call.
    pub async fn next_request(&mut self) -> toolrelay::proto::v1::ToolRequest {
        match self.next().await {
            Some(toolrelay::proto::v1::relay_message::Kind::ToolRequest(request)) => request,
            other => panic!("expected a tool request, got {other:?}"),
        }
    }

    /// Sends a message up the stream.
    pub async fn send(&mut self, kind: toolrelay::proto::v1::provider_message::Kind) {
        let message = toolrelay::proto::v1::ProviderMessage { kind: Some(kind) };
        self.outbound.send(message).await.unwrap();
    }

    /// Answers a call successfully.
    pub async fn answer(&mut self, request_id: &str, result: &Value) {
        use toolrelay::proto::v1::{ProviderMessage, ToolResponse, provider_message};
        let response = ToolResponse {
            request_id: request_id.to_owned(),
            success: true,
            result: Some(toolrelay::json::to_value(result)),
            error: None,
            content: Vec::new(),
            structured_content: None,
        };
        self.outbound
            .send(ProviderMessage {
                kind: Some(provider_message::Kind::Response(response)),
            })
            .await
            .unwrap();
    }

    /// Reads until the relay ends the stream; returns the error names it sent on the way
    /// (`shutting_down` when it is stopping).
    pub async fn ended(&mut self) -> Vec<String> {
        let mut errors = Vec::new();
        while let Some(kind) = self.next().await {
            if let toolrelay::proto::v1::relay_message::Kind::Error(error) = kind {
                errors.push(error.error);
            }
        }
        errors
    }
}
