//! The whole system for end-to-end tests over HTTP: one process (relay and gateway in this
//! test process, sharing nothing but the code the binaries run) or split (the real
//! `toolrelay-relay` and `toolrelay-gateway` binaries as two child processes talking gRPC).

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use futures::StreamExt;
use reqwest::StatusCode;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::net::TcpListener;
use tokio::process::{Child, Command};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use toolrelay_builtin::BuiltinConfig;
use toolrelay_gateway::config::{ENV_LISTEN, ENV_RELAY_URL, GatewayConfig};
use toolrelay_relay::config::{
    ENV_GATEWAY_SECRET, ENV_GRPC_LISTEN, ENV_LOG_FORMAT, ENV_REDIS_URL, ENV_WS_LISTEN,
};
use toolrelay_relay::{Relay, RelayConfig};

use crate::PATIENCE;

/// `TOOLRELAY_BINARIES`: the directory of the binaries the tests start (the release build, say);
/// by default the build the tests belong to.
pub const ENV_BINARIES: &str = "TOOLRELAY_BINARIES";

/// A running system and an HTTP client for it.
pub struct System {
    /// `http://127.0.0.1:port`.
    pub base: String,
    /// The relay's gRPC address.
    pub grpc: std::net::SocketAddr,
    /// The standalone relay's WebSocket (and probe) port, in a split system.
    pub relay_ws: Option<std::net::SocketAddr>,
    /// HTTP client.
    pub http: reqwest::Client,
    /// What child processes logged (empty for a system in this process).
    pub logs: Logs,
    running: Running,
    /// The Redis of a system running in Redis mode ([`crate::ENV_TEST_STORE`]).
    pub redis: Option<crate::redis::RedisServer>,
}

enum Running {
    InProcess {
        stop: Option<oneshot::Sender<()>>,
        task: Option<JoinHandle<Result<(), String>>>,
    },
    /// Child processes, the one serving the public port last.
    Processes(Vec<Child>),
}

/// An HTTP answer: status, headers and JSON body (`null` when the body is not JSON).
#[derive(Debug)]
pub struct Answer {
    /// The status.
    pub status: StatusCode,
    /// The headers.
    pub headers: reqwest::header::HeaderMap,
    /// The body as JSON.
    pub body: Value,
}

impl Answer {
    /// A header's value.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|value| value.to_str().ok())
    }

    /// Asserts a refusal as the SPEC shapes it: `status`, the stable name `error`, and a
    /// message that says what to do (the one check of a refusal, for every suite).
    #[track_caller]
    pub fn assert_refused(&self, status: StatusCode, error: &str) {
        assert_eq!(self.status, status, "{self:?}");
        assert_eq!(self.body["error"], error, "{self:?}");
        assert!(
            self.body["message"]
                .as_str()
                .is_some_and(|message| !message.trim().is_empty()),
            "a refusal without a message: {self:?}"
        );
    }

    /// Asserts the answer of the demo tab's `echo` of `text`: 200, a success, `{"text": text}`.
    #[track_caller]
    pub fn assert_echoed(&self, text: &str) {
        assert_eq!(self.status, StatusCode::OK, "{self:?}");
        assert_eq!(self.body["success"], true, "{self:?}");
        assert_eq!(
            self.body["result"],
            serde_json::json!({"text": text}),
            "{self:?}"
        );
    }
}

impl System {
    /// Relay and gateway in this process, with default settings.
    pub async fn start() -> Self {
        Self::with(RelayConfig::default(), |_| {}).await
    }

    /// Relay and gateway in this process, with these settings.
    pub async fn with(relay: RelayConfig, adjust: impl FnOnce(&mut GatewayConfig)) -> Self {
        Self::with_tools(relay, BuiltinConfig::default(), adjust).await
    }

    /// Relay and gateway in this process, with these settings and the built-in tools set up
    /// as `tools` says.
    pub async fn with_tools(
        relay: RelayConfig,
        tools: BuiltinConfig,
        adjust: impl FnOnce(&mut GatewayConfig),
    ) -> Self {
        relay.validate().unwrap();
        tools.validate().unwrap();
        let (relay, redis) = crate::test_relay_with(relay, &tools).await;
        let mut system = Self::serving(relay, adjust).await;
        system.redis = redis;
        system
    }

    /// This relay and a gateway in front of it, in this process.
    pub async fn serving(relay: Relay, adjust: impl FnOnce(&mut GatewayConfig)) -> Self {
        let public = TcpListener::bind("127.0.0.1:0").await.unwrap();
        Self::serving_on(relay, public, adjust).await
    }

    /// Relay and gateway in this process, the gateway on `public` (an IPv6 or dual-stack
    /// listener, say).
    pub async fn listening(
        relay: RelayConfig,
        public: TcpListener,
        adjust: impl FnOnce(&mut GatewayConfig),
    ) -> Self {
        relay.validate().unwrap();
        let (relay, redis) = crate::test_relay(relay).await;
        let mut system = Self::serving_on(relay, public, adjust).await;
        system.redis = redis;
        system
    }

    /// This relay and a gateway in front of it on `public`, in this process.
    pub async fn serving_on(
        relay: Relay,
        public: TcpListener,
        adjust: impl FnOnce(&mut GatewayConfig),
    ) -> Self {
        let grpc = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", public.local_addr().unwrap());
        let grpc_address = grpc.local_addr().unwrap();
        let mut config = GatewayConfig::new(&base).unwrap();
        adjust(&mut config);
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let shutdown = async {
                let _ = stopped.await;
            };
            let gateway = toolrelay_gateway::server::Server::with_relay(relay, config, grpc);
            toolrelay_gateway::server::run(gateway, public, shutdown).await
        });
        Self {
            base,
            grpc: grpc_address,
            relay_ws: None,
            http: client(),
            logs: Logs::default(),
            running: Running::InProcess {
                stop: Some(stop),
                task: Some(task),
            },
            redis: None,
        }
    }

    /// The real binaries as two processes: `toolrelay-relay` and, in front of it over gRPC,
    /// `toolrelay-gateway`.
    pub async fn split() -> Self {
        Self::split_with(&[], &[]).await
    }

    /// [`System::split`] with extra environment variables for the relay and the gateway (both
    /// share [`crate::GATEWAY_SECRET`] unless these say otherwise; a `REDIS_URL` among the
    /// relay's is the gateway's too, in place of a Redis of the test's own).
    pub async fn split_with(relay_env: &[(&str, &str)], gateway_env: &[(&str, &str)]) -> Self {
        let mut env = vec![
            (ENV_GRPC_LISTEN, "127.0.0.1:0"),
            (ENV_WS_LISTEN, "127.0.0.1:0"),
            (ENV_GATEWAY_SECRET, crate::GATEWAY_SECRET),
        ];
        env.extend_from_slice(relay_env);
        // A Redis the relay's variables name is the gateway's too.
        let named = relay_env
            .iter()
            .find(|(name, _)| *name == ENV_REDIS_URL)
            .map(|(_, url)| (*url).to_owned());
        let redis = match named {
            Some(_) => None,
            None => crate::test_redis().await,
        };
        let redis_url = named.or_else(|| redis.as_ref().map(crate::redis::RedisServer::url));
        if let Some(url) = &redis_url
            && !relay_env.iter().any(|(name, _)| *name == ENV_REDIS_URL)
        {
            env.push((ENV_REDIS_URL, url));
        }
        let logs = Logs::default();
        let (relay, relay_line) = spawn_logged(
            "toolrelay-relay",
            &env,
            "toolrelay-relay listening",
            logs.clone(),
        )
        .await;
        let grpc: std::net::SocketAddr = relay_line["grpc"].as_str().unwrap().parse().unwrap();
        let relay_ws = relay_line["websocket"].as_str().unwrap().parse().unwrap();
        let relay_url = format!("http://{grpc}");
        let mut env = vec![
            (ENV_LISTEN, "127.0.0.1:0"),
            (ENV_RELAY_URL, relay_url.as_str()),
            (ENV_GATEWAY_SECRET, crate::GATEWAY_SECRET),
        ];
        if let Some(url) = &redis_url {
            env.push((ENV_REDIS_URL, url));
        }
        env.extend_from_slice(gateway_env);
        let (gateway, gateway_line) = spawn_logged(
            "toolrelay-gateway",
            &env,
            "toolrelay-gateway listening",
            logs.clone(),
        )
        .await;
        let base = format!("http://{}", gateway_line["listen"].as_str().unwrap());
        let (mut relay, mut gateway) = (relay, gateway);
        if redis.is_some() {
            until_serving(&format!("http://{relay_ws}/readyz"), &mut relay).await;
            until_serving(&format!("{base}/readyz"), &mut gateway).await;
        }
        Self {
            base,
            grpc,
            relay_ws: Some(relay_ws),
            http: client(),
            logs,
            running: Running::Processes(vec![relay, gateway]),
            redis,
        }
    }

    /// The real `toolrelay-relay` binary alone, with extra environment variables (in Redis
    /// mode, a Redis of its own unless `env` names one). `base` is its WebSocket port, which
    /// also answers `/healthz`, `/readyz` and `/metrics`; `grpc` its gRPC service.
    pub async fn relay_binary(env: &[(&str, &str)]) -> Self {
        let mut all = vec![
            (ENV_GRPC_LISTEN, "127.0.0.1:0"),
            (ENV_WS_LISTEN, "127.0.0.1:0"),
        ];
        all.extend_from_slice(env);
        let redis = if env.iter().any(|(name, _)| *name == ENV_REDIS_URL) {
            None
        } else {
            crate::test_redis().await
        };
        let redis_url = redis.as_ref().map(crate::redis::RedisServer::url);
        if let Some(url) = &redis_url {
            all.push((ENV_REDIS_URL, url));
        }
        let logs = Logs::default();
        let (mut child, line) = spawn_logged(
            "toolrelay-relay",
            &all,
            "toolrelay-relay listening",
            logs.clone(),
        )
        .await;
        let websocket: std::net::SocketAddr = line["websocket"].as_str().unwrap().parse().unwrap();
        if redis.is_some() {
            until_serving(&format!("http://{websocket}/readyz"), &mut child).await;
        }
        Self {
            base: format!("http://{websocket}"),
            grpc: line["grpc"].as_str().unwrap().parse().unwrap(),
            relay_ws: Some(websocket),
            http: client(),
            logs,
            running: Running::Processes(vec![child]),
            redis,
        }
    }

    /// The real one-process binary `toolrelay` as a child process, with extra environment
    /// variables (in Redis mode, a Redis of its own unless `env` names one).
    pub async fn binary(env: &[(&str, &str)]) -> Self {
        let mut all = vec![
            (ENV_LISTEN, "127.0.0.1:0"),
            (ENV_GRPC_LISTEN, "127.0.0.1:0"),
        ];
        all.extend_from_slice(env);
        let redis = if env.iter().any(|(name, _)| *name == ENV_REDIS_URL) {
            None
        } else {
            crate::test_redis().await
        };
        let redis_url = redis.as_ref().map(crate::redis::RedisServer::url);
        if let Some(url) = &redis_url {
            all.push((ENV_REDIS_URL, url));
        }
        let logs = Logs::default();
        let (mut child, line) =
            spawn_logged("toolrelay", &all, "toolrelay listening", logs.clone()).await;
        let base = format!("http://{}", line["listen"].as_str().unwrap());
        if redis.is_some() {
            until_serving(&format!("{base}/readyz"), &mut child).await;
        }
        Self {
            base,
            grpc: line["grpc"].as_str().unwrap().parse().unwrap(),
            relay_ws: None,
            http: client(),
            logs,
            running: Running::Processes(vec![child]),
            redis,
        }
    }

    /// The id of the process serving the public port, for a system of child processes.
    pub fn pid(&self) -> Option<u32> {
        match &self.running {
            Running::Processes(children) => children.last().and_then(Child::id),
            Running::InProcess { .. } => None,
        }
    }

    /// Sends SIGTERM (how Kubernetes stops a pod) to the process serving the public port.
    pub async fn terminate(&mut self) {
        let process = self.public_process("terminate");
        terminate(process).await;
    }

    /// Waits (with a deadline) for the process serving the public port to exit.
    pub async fn exited(&mut self) -> std::process::ExitStatus {
        exited(self.public_process("exited")).await
    }

    /// Sends SIGTERM to the relay process of a split system.
    pub async fn terminate_relay(&mut self) {
        terminate(self.relay_process("terminate_relay")).await;
    }

    /// Waits (with a deadline) for the relay process of a split system to exit.
    pub async fn relay_exited(&mut self) -> std::process::ExitStatus {
        exited(self.relay_process("relay_exited")).await
    }

    fn public_process(&mut self, what: &str) -> &mut Child {
        let Running::Processes(children) = &mut self.running else {
            panic!("{what} needs a system of child processes");
        };
        children.last_mut().unwrap()
    }

    fn relay_process(&mut self, what: &str) -> &mut Child {
        let Running::Processes(children) = &mut self.running else {
            panic!("{what} needs a split system");
        };
        assert_eq!(children.len(), 2, "{what} needs a split system");
        &mut children[0]
    }

    /// Kills the relay process of a split system at once, as a crash would.
    pub async fn kill_relay(&mut self) {
        self.relay_process("kill_relay").kill().await.unwrap();
    }

    /// An absolute URL.
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// The WebSocket URL of a session's provider socket on the public port.
    pub fn ws_url(&self, code: &str, token: &str) -> String {
        format!(
            "{}/api/sessions/{code}/ws?token={token}",
            self.base.replacen("http", "ws", 1)
        )
    }

    /// `GET path`. The future borrows nothing, so it can run beside other work.
    pub fn get(&self, path: &str) -> impl Future<Output = Answer> + use<> {
        send(self.http.get(self.url(path)))
    }

    /// `POST path` with a JSON body.
    pub fn post(&self, path: &str, body: Value) -> impl Future<Output = Answer> + use<> {
        send(self.http.post(self.url(path)).json(&body))
    }

    /// A request to send yourself.
    pub fn request(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        self.http.request(method, self.url(path))
    }

    /// A new session: `(code, providerToken)`.
    pub async fn create_session(&self) -> (String, String) {
        let created = self.post("/api/sessions", json!({})).await;
        assert_eq!(created.status, StatusCode::CREATED, "{created:?}");
        (
            created.body["code"].as_str().unwrap().to_owned(),
            created.body["providerToken"].as_str().unwrap().to_owned(),
        )
    }

    /// Registers tools by `PUT …/manifest`.
    pub async fn put_manifest(&self, code: &str, token: &str, tools: Value) {
        let answer = send(
            self.request(
                reqwest::Method::PUT,
                &format!("/api/sessions/{code}/manifest"),
            )
            .bearer_auth(token)
            .json(&json!({"tools": tools})),
        )
        .await;
        assert_eq!(answer.status, StatusCode::OK, "{answer:?}");
    }

    /// Stops the system and waits until it has stopped.
    pub async fn stop(mut self) {
        if let Running::InProcess { stop, task } = &mut self.running {
            if let Some(stop) = stop.take() {
                let _ = stop.send(());
            }
            if let Some(task) = task.take() {
                tokio::time::timeout(Duration::from_secs(20), task)
                    .await
                    .expect("the system stops within its drain timeout")
                    .unwrap()
                    .unwrap();
            }
        }
        // Child processes are killed when dropped (kill_on_drop).
    }
}

impl Drop for System {
    fn drop(&mut self) {
        if let Running::InProcess { stop, .. } = &mut self.running
            && let Some(stop) = stop.take()
        {
            let _ = stop.send(());
        }
    }
}

/// A session of `system` whose WebSocket tab has registered the demo tools: code, token, tab.
pub async fn paired(system: &System) -> (String, String, crate::WsTab) {
    let (code, token) = system.create_session().await;
    let mut tab = crate::WsTab::attach_url(&system.ws_url(&code, &token)).await;
    tab.register(crate::demo_tools()).await;
    (code, token, tab)
}

/// Sends SIGTERM to a child process.
pub(crate) async fn terminate(process: &Child) {
    let pid = process.id().expect("the process runs");
    let status = Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .await
        .unwrap();
    assert!(status.success());
}

/// Waits (with a deadline) for a child process to exit.
pub(crate) async fn exited(process: &mut Child) -> std::process::ExitStatus {
    tokio::time::timeout(Duration::from_secs(30), process.wait())
        .await
        .expect("the process exits")
        .unwrap()
}

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap()
}

/// Sends a request and reads the answer.
pub async fn send(request: reqwest::RequestBuilder) -> Answer {
    answer(request.send().await.unwrap()).await
}

async fn answer(response: reqwest::Response) -> Answer {
    let status = response.status();
    let headers = response.headers().clone();
    let bytes = response.bytes().await.unwrap();
    Answer {
        status,
        headers,
        body: serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    }
}

/// The body of a call of the demo tab's `echo` with `text` (see [`crate::demo_tools`]).
pub fn echo_call(text: &str) -> Value {
    json!({"functionName": "echo", "args": {"text": text}})
}

/// The tab's answer to a call, posted over HTTP.
pub async fn post_answer(
    system: &System,
    code: &str,
    token: &str,
    request_id: &str,
    result: Value,
) {
    let answer = send(
        system
            .request(
                reqwest::Method::POST,
                &format!("/api/sessions/{code}/response"),
            )
            .bearer_auth(token)
            .json(&json!({"requestId": request_id, "success": true, "result": result})),
    )
    .await;
    assert_eq!(answer.status, StatusCode::OK, "{answer:?}");
    assert_eq!(answer.body["accepted"], true);
}

/// A workspace binary, built next to the test executables (`cargo test --workspace` and
/// `scripts/test.sh` build every binary), or in [`ENV_BINARIES`] when it is set.
pub fn binary(name: &str) -> PathBuf {
    let path = match std::env::var_os(ENV_BINARIES) {
        Some(dir) => PathBuf::from(dir).join(name),
        None => {
            let exe = std::env::current_exe().unwrap();
            let dir = exe.parent().and_then(|deps| deps.parent()).unwrap();
            dir.join(name)
        }
    };
    assert!(
        path.exists(),
        "{} is missing: build the binaries first (cargo build --workspace --bins; scripts/test.sh does)",
        path.display()
    );
    path
}

/// Waits (up to [`crate::PATIENCE`]) until `GET url` (a `/readyz`) answers 200: a binary
/// serves at once and connects to its Redis in the background, so "listening" is not "ready".
pub async fn until_ready(url: &str) {
    let http = client();
    crate::wait_until(crate::PATIENCE, async || {
        // A connection refused is not ready yet either: the deadline decides, and its error
        // says which it was.
        let sent = http
            .get(url)
            .send()
            .await
            .map_err(|error| format!("{url}: {error:?}"))?;
        let ready = answer(sent).await;
        if ready.status == StatusCode::OK {
            Ok(())
        } else {
            Err(format!("{url}: {ready:?}"))
        }
    })
    .await;
}

/// [`until_ready`] for `process`, which serves `url`: if the process exits meanwhile the test
/// fails at once, saying how it ended (a signal, an exit code), not at the deadline with only
/// a refused connection to show.
pub(crate) async fn until_serving(url: &str, process: &mut Child) {
    tokio::select! {
        () = until_ready(url) => {}
        ended = process.wait() => panic!(
            "the process serving {url} ended before it was ready: {ended:?} (its log lines and stderr are above)"
        ),
    }
}

/// Starts a binary with JSON logs and waits for its log line containing `ready`.
/// Everything the child processes of a system logged, line by line (stdout and stderr).
#[derive(Clone, Default)]
pub struct Logs(std::sync::Arc<std::sync::Mutex<Vec<String>>>);

impl Logs {
    /// The lines so far.
    pub fn lines(&self) -> Vec<String> {
        self.0.lock().unwrap().clone()
    }

    /// Waits (up to [`crate::PATIENCE`]) for a line that `wanted` picks, and returns it: a
    /// process writes its log lines from a thread of its own, a little after the event.
    pub async fn until(&self, what: &str, wanted: impl Fn(&str) -> bool) -> String {
        crate::wait_until(crate::PATIENCE, async || {
            let lines = self.lines();
            let found = lines.iter().find(|line| wanted(line)).cloned();
            found.ok_or_else(|| format!("no log line {what}: {lines:#?}"))
        })
        .await
    }

    fn push(&self, line: String) {
        self.0.lock().unwrap().push(line);
    }
}

/// Starts a binary with JSON logs (`RUST_LOG=info` unless `env` says otherwise), keeps its
/// output in `logs`, and waits for its log line whose message is `ready`.
pub(crate) async fn spawn_logged(
    name: &str,
    env: &[(&str, &str)],
    ready: &str,
    logs: Logs,
) -> (Child, Value) {
    let mut child = Command::new(binary(name))
        .env(ENV_LOG_FORMAT, "json")
        .env("RUST_LOG", "info")
        .envs(env.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let stderr = child.stderr.take().unwrap();
    let (found, mut lines) = mpsc::channel::<Value>(1);
    let ready = ready.to_owned();
    let name = name.to_owned();
    {
        let (logs, name) = (logs.clone(), name.clone());
        tokio::spawn(async move {
            let mut reader = BufReader::new(stderr).lines();
            while let Ok(Some(line)) = reader.next_line().await {
                eprintln!("[{name}] {line}");
                logs.push(line);
            }
        });
    }
    tokio::spawn(async move {
        let mut reader = BufReader::new(stdout).lines();
        while let Ok(Some(line)) = reader.next_line().await {
            // Shown with the test's output when it fails.
            println!("[{name}] {line}");
            if let Ok(entry) = serde_json::from_str::<Value>(&line)
                && entry["message"].as_str() == Some(ready.as_str())
            {
                let _ = found.send(entry).await;
            }
            logs.push(line);
        }
    });
    let line = tokio::time::timeout(PATIENCE, lines.recv())
        .await
        .expect("the binary started")
        .unwrap();
    (child, line)
}

/// A tab attached over server-sent events.
pub struct SseTab {
    events: mpsc::Receiver<SseEvent>,
    reader: JoinHandle<()>,
}

/// One server-sent event.
#[derive(Debug, Clone)]
pub struct SseEvent {
    /// `event:`.
    pub kind: String,
    /// `id:`, if any.
    pub id: Option<String>,
    /// `data:` as JSON.
    pub data: Value,
}

impl SseTab {
    /// Opens the stream, resuming after `last_event_id` when given, and reads `connected`.
    pub async fn open(system: &System, path: &str, last_event_id: Option<&str>) -> Self {
        let mut request = system
            .http
            .get(system.url(path))
            .header("accept", "text/event-stream");
        if let Some(id) = last_event_id {
            request = request.header("last-event-id", id);
        }
        let response = request.send().await.unwrap();
        assert_eq!(response.status(), StatusCode::OK, "the stream opened");
        let (sender, events) = mpsc::channel(64);
        let reader = tokio::spawn(async move {
            let mut body = response.bytes_stream();
            let mut buffer = String::new();
            while let Some(Ok(chunk)) = body.next().await {
                buffer.push_str(&String::from_utf8_lossy(&chunk));
                while let Some(end) = buffer.find("\n\n") {
                    let block: String = buffer.drain(..end + 2).collect();
                    if let Some(event) = parse_event(&block)
                        && sender.send(event).await.is_err()
                    {
                        return;
                    }
                }
            }
        });
        let mut tab = Self { events, reader };
        let connected = tab.next().await;
        assert_eq!(connected.kind, "connected", "{connected:?}");
        tab
    }

    /// The next event other than a heartbeat.
    pub async fn next(&mut self) -> SseEvent {
        loop {
            let event = tokio::time::timeout(PATIENCE, self.events.recv())
                .await
                .expect("no event in time")
                .expect("the stream ended");
            if event.kind != "heartbeat" {
                return event;
            }
        }
    }

    /// Waits (with a deadline) until the server ends the stream; returns the events it sent
    /// before (heartbeats left out).
    pub async fn ended(&mut self) -> Vec<SseEvent> {
        let mut events = Vec::new();
        loop {
            let event = tokio::time::timeout(PATIENCE, self.events.recv())
                .await
                .expect("the stream did not end in time");
            match event {
                Some(event) if event.kind == "heartbeat" => {}
                Some(event) => events.push(event),
                None => return events,
            }
        }
    }

    /// Drops the connection, as a network blip would.
    pub fn drop_connection(self) {
        self.reader.abort();
    }
}

impl Drop for SseTab {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

fn parse_event(block: &str) -> Option<SseEvent> {
    let mut kind = "message".to_owned();
    let mut id = None;
    let mut data = String::new();
    for line in block.lines() {
        if let Some(value) = line.strip_prefix("event:") {
            kind = value.trim().to_owned();
        } else if let Some(value) = line.strip_prefix("id:") {
            id = Some(value.trim().to_owned());
        } else if let Some(value) = line.strip_prefix("data:") {
            data.push_str(value.trim_start());
        }
    }
    if data.is_empty() && kind == "message" {
        return None;
    }
    Some(SseEvent {
        kind,
        id,
        data: serde_json::from_str(&data).unwrap_or(Value::Null),
    })
}
