//! The tabs process (`toolrelay-bench tabs …`): creates N sessions, attaches a tab to each over
//! the chosen transport, registers `echo` (or the manifest of `--manifest`, such as the CODAP
//! plugin's), and answers every call at once with its arguments.
//!
//! Once every tab is attached it prints `{"ready":true,"sessions":["CODE:HANDLE",…]}` and
//! serves until stdin closes.

use std::time::Duration;

use anyhow::{Context, bail};
use clap::{Args, ValueEnum};
use futures::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio::io::AsyncReadExt;
use tokio::sync::oneshot;
use tokio_stream::wrappers::ReceiverStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use toolrelay::proto::v1::relay_client::RelayClient;
use toolrelay::proto::v1::{
    ProviderMessage, Register, Tool, ToolResponse, provider_message, relay_message,
};

/// How a tab is attached.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Transport {
    /// The WebSocket (`/api/sessions/{code}/ws`).
    Ws,
    /// Server-sent events (`/stream`), answers by `POST /response`.
    Sse,
    /// Polling `GET /request` back to back (no pause), answers by `POST /response`.
    Polling,
    /// A backend provider on gRPC `Connect`.
    Grpc,
}

/// Arguments of the tabs process.
#[derive(Debug, Clone, Args)]
pub struct TabArgs {
    /// The relay's HTTP base URL.
    #[arg(long)]
    pub base: String,
    /// The relay's gRPC URL (for `--transport grpc`).
    #[arg(long)]
    pub grpc: Option<String>,
    /// How the tabs attach.
    #[arg(long, value_enum)]
    pub transport: Transport,
    /// Sessions, one tab each.
    #[arg(long, default_value_t = 1)]
    pub sessions: usize,
    /// Sessions created and tabs attached at once.
    #[arg(long, default_value_t = 64)]
    pub concurrency: usize,
    /// A JSON file `{"tools": [...]}` every tab registers instead of `echo`.
    #[arg(long)]
    pub manifest: Option<std::path::PathBuf>,
}

/// A session the tabs process created.
#[derive(Debug, Clone)]
struct Session {
    code: String,
    token: String,
    /// The `/mcp/s/{handle}` secret (empty for the floor).
    handle: String,
}

fn echo_tool() -> Value {
    json!({"name": "echo", "description": "Echoes its arguments",
        "inputSchema": {"type": "object", "properties": {"text": {"type": "string"}}}})
}

/// The tools every tab registers: `--manifest`'s, or `echo`.
fn tools(args: &TabArgs) -> anyhow::Result<Value> {
    let Some(path) = &args.manifest else {
        return Ok(json!([echo_tool()]));
    };
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read the manifest {}", path.display()))?;
    let manifest: Value = serde_json::from_str(&text)?;
    match &manifest["tools"] {
        Value::Array(_) => Ok(manifest["tools"].clone()),
        _ => bail!("{} has no \"tools\" array", path.display()),
    }
}

/// Runs the tabs process.
pub async fn run(args: TabArgs) -> anyhow::Result<()> {
    crate::raise_open_files();
    let http = reqwest::Client::builder()
        .tcp_nodelay(true)
        .pool_max_idle_per_host(args.concurrency)
        .build()?;
    let grpc = match (&args.grpc, args.transport) {
        (Some(url), Transport::Grpc) => Some(
            tonic::transport::Endpoint::from_shared(url.clone())?
                .tcp_nodelay(true)
                .connect()
                .await?,
        ),
        (None, Transport::Grpc) => bail!("--grpc is needed for gRPC providers"),
        _ => None,
    };
    // Shared by every tab (the CODAP manifest is ~21 KB).
    let tools = std::sync::Arc::new(tools(&args)?);
    let started: Vec<anyhow::Result<(Session, tokio::task::JoinHandle<()>)>> =
        futures::stream::iter(0..args.sessions)
            .map(|_| {
                let (http, grpc, args) = (http.clone(), grpc.clone(), args.clone());
                let tools = std::sync::Arc::clone(&tools);
                async move {
                    let session = create(&http, &args.base).await?;
                    let (ready, attached) = oneshot::channel();
                    let task = {
                        let session = session.clone();
                        tokio::spawn(async move {
                            let served = match args.transport {
                                Transport::Ws => ws_tab(&args.base, &session, &tools, ready).await,
                                Transport::Sse => {
                                    sse_tab(&http, &args.base, &session, &tools, ready).await
                                }
                                Transport::Polling => {
                                    polling_tab(&http, &args.base, &session, &tools, ready).await
                                }
                                Transport::Grpc => {
                                    let channel = grpc.expect("checked above");
                                    grpc_tab(channel, &session, &tools, ready).await
                                }
                            };
                            if let Err(error) = served {
                                eprintln!("toolrelay-bench tab {}: {error:#}", session.code);
                            }
                        })
                    };
                    tokio::time::timeout(Duration::from_secs(60), attached)
                        .await
                        .context("a tab did not attach within 60 s")?
                        .context("a tab ended before it attached")?;
                    Ok((session, task))
                }
            })
            .buffer_unordered(args.concurrency.max(1))
            .collect()
            .await;
    let mut sessions = Vec::with_capacity(started.len());
    let mut tasks = Vec::with_capacity(started.len());
    for result in started {
        let (session, task) = result?;
        sessions.push(format!("{}:{}", session.code, session.handle));
        tasks.push(task);
    }
    println!("{}", json!({"ready": true, "sessions": sessions}));
    // Serve until the coordinator closes stdin (or kills this process).
    let mut sink = Vec::new();
    let _ = tokio::io::stdin().read_to_end(&mut sink).await;
    for task in tasks {
        task.abort();
    }
    Ok(())
}

async fn create(http: &reqwest::Client, base: &str) -> anyhow::Result<Session> {
    let response = http.post(format!("{base}/api/sessions")).send().await?;
    if response.status() != reqwest::StatusCode::CREATED {
        bail!("creating a session: HTTP {}", response.status());
    }
    let created: Value = response.json().await?;
    let text = |name: &str| created[name].as_str().unwrap_or_default().to_owned();
    let connector = text("connectorUrl");
    Ok(Session {
        code: text("code"),
        token: text("providerToken"),
        handle: connector
            .rsplit_once("/mcp/s/")
            .map(|(_, handle)| handle.to_owned())
            .unwrap_or_default(),
    })
}

/// The answer to a `tool-request` frame (its arguments back).
fn answer(request: &Value) -> Value {
    json!({"requestId": request["requestId"], "success": true, "result": request["args"]})
}

async fn ws_tab(
    base: &str,
    session: &Session,
    tools: &Value,
    ready: oneshot::Sender<()>,
) -> anyhow::Result<()> {
    let url = format!(
        "{}/api/sessions/{}/ws?token={}",
        base.replacen("http", "ws", 1),
        session.code,
        session.token
    );
    // Small buffers on the tabs' side too, so that 20,000 tabs fit in memory.
    let config = WebSocketConfig::default()
        .read_buffer_size(4096)
        .write_buffer_size(4096);
    let (mut socket, _) =
        tokio_tungstenite::connect_async_with_config(&url, Some(config), true).await?;
    let register = json!({"type": "register", "tools": tools});
    socket.send(Message::text(register.to_string())).await?;
    let mut ready = Some(ready);
    while let Some(message) = socket.next().await {
        let Message::Text(text) = message? else {
            continue;
        };
        let frame: Value = serde_json::from_str(&text)?;
        match frame["type"].as_str() {
            Some("tool-request") => {
                let mut reply = answer(&frame);
                reply["type"] = json!("response");
                socket.send(Message::text(reply.to_string())).await?;
            }
            Some("registered") => {
                if let Some(ready) = ready.take() {
                    let _ = ready.send(());
                }
            }
            Some("error") => bail!("the relay said {frame}"),
            _ => {}
        }
    }
    Ok(())
}

async fn put_manifest(
    http: &reqwest::Client,
    base: &str,
    session: &Session,
    tools: &Value,
) -> anyhow::Result<()> {
    let url = format!("{base}/api/sessions/{}/manifest", session.code);
    as_tab(
        http.put(url),
        session,
        &json!({"tools": tools}),
        "PUT manifest",
    )
    .await
}

async fn post_answer(
    http: &reqwest::Client,
    base: &str,
    session: &Session,
    request: &Value,
) -> anyhow::Result<()> {
    let url = format!("{base}/api/sessions/{}/response", session.code);
    as_tab(http.post(url), session, &answer(request), "POST response").await
}

/// Sends `body` with the session's provider token; fails unless the relay accepts it.
async fn as_tab(
    request: reqwest::RequestBuilder,
    session: &Session,
    body: &Value,
    what: &str,
) -> anyhow::Result<()> {
    let response = request
        .bearer_auth(&session.token)
        .json(body)
        .send()
        .await?;
    if !response.status().is_success() {
        bail!("{what}: HTTP {}", response.status());
    }
    Ok(())
}

async fn sse_tab(
    http: &reqwest::Client,
    base: &str,
    session: &Session,
    tools: &Value,
    ready: oneshot::Sender<()>,
) -> anyhow::Result<()> {
    put_manifest(http, base, session, tools).await?;
    // A client of its own: the stream holds its connection for good.
    let stream_client = reqwest::Client::builder().tcp_nodelay(true).build()?;
    let response = stream_client
        .get(format!(
            "{base}/api/sessions/{}/stream?token={}",
            session.code, session.token
        ))
        .header("accept", "text/event-stream")
        .send()
        .await?;
    if !response.status().is_success() {
        bail!("GET stream: HTTP {}", response.status());
    }
    let mut ready = Some(ready);
    let mut body = response.bytes_stream();
    let mut pending = String::new();
    while let Some(chunk) = body.next().await {
        pending.push_str(&String::from_utf8_lossy(&chunk?));
        while let Some(end) = pending.find("\n\n") {
            let event: String = pending.drain(..end + 2).collect();
            let data: String = event
                .lines()
                .filter_map(|line| line.strip_prefix("data:"))
                .map(str::trim_start)
                .collect();
            let Ok(frame) = serde_json::from_str::<Value>(&data) else {
                continue;
            };
            match frame["type"].as_str() {
                Some("tool-request") => post_answer(http, base, session, &frame).await?,
                Some("connected") => {
                    if let Some(ready) = ready.take() {
                        let _ = ready.send(());
                    }
                }
                _ => {}
            }
        }
    }
    Ok(())
}

async fn polling_tab(
    http: &reqwest::Client,
    base: &str,
    session: &Session,
    tools: &Value,
    ready: oneshot::Sender<()>,
) -> anyhow::Result<()> {
    put_manifest(http, base, session, tools).await?;
    let url = format!("{base}/api/sessions/{}/request", session.code);
    let mut ready = Some(ready);
    loop {
        let response = http.get(&url).bearer_auth(&session.token).send().await?;
        if !response.status().is_success() {
            bail!("GET request: HTTP {}", response.status());
        }
        let calls: Vec<Value> = response.json().await?;
        if let Some(ready) = ready.take() {
            let _ = ready.send(());
        }
        for call in &calls {
            post_answer(http, base, session, call).await?;
        }
    }
}

async fn grpc_tab(
    channel: tonic::transport::Channel,
    session: &Session,
    tools: &Value,
    ready: oneshot::Sender<()>,
) -> anyhow::Result<()> {
    let mut client = RelayClient::new(channel);
    let (outbound, to_relay) = tokio::sync::mpsc::channel(16);
    let tool = echo_tool();
    let register = provider_message::Kind::Register(if *tools == json!([tool]) {
        Register {
            tools: vec![Tool {
                name: "echo".into(),
                description: tool["description"].as_str().unwrap_or_default().into(),
                input_schema: Some(toolrelay::json::to_struct(&tool["inputSchema"])),
                ..Tool::default()
            }],
            ..Register::default()
        }
    } else {
        // Any other manifest as the browser protocol's JSON.
        Register {
            tools_json: tools.to_string(),
            ..Register::default()
        }
    });
    outbound
        .send(ProviderMessage {
            kind: Some(register),
        })
        .await?;
    let mut request = tonic::Request::new(ReceiverStream::new(to_relay));
    let metadata = request.metadata_mut();
    metadata.insert("x-session-code", session.code.parse()?);
    metadata.insert(
        "authorization",
        format!("Bearer {}", session.token).parse()?,
    );
    let mut inbound = client.connect(request).await?.into_inner();
    let mut ready = Some(ready);
    while let Some(message) = inbound.next().await {
        match message?.kind {
            Some(relay_message::Kind::ToolRequest(call)) => {
                let response = ToolResponse {
                    request_id: call.request_id,
                    success: true,
                    result: call.args.map(|args| {
                        toolrelay::json::to_value(&toolrelay::json::from_struct(&args))
                    }),
                    error: None,
                    content: Vec::new(),
                    structured_content: None,
                };
                let reply = provider_message::Kind::Response(response);
                outbound.send(ProviderMessage { kind: Some(reply) }).await?;
            }
            Some(relay_message::Kind::Registered(_)) => {
                if let Some(ready) = ready.take() {
                    let _ = ready.send(());
                }
            }
            Some(relay_message::Kind::Error(error)) => bail!("the relay said {error:?}"),
            _ => {}
        }
    }
    Ok(())
}
