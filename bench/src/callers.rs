//! The callers process (`toolrelay-bench callers …`): M callers, each making calls one after
//! another to its session (caller i to session i mod N) — a closed loop.
//!
//! It warms up, prints `{"warm":true}`, then for every line `go N` on stdin makes N calls in
//! all (split between the callers) and prints the batch's summary ([`crate::stats::summary`]);
//! it ends when stdin closes. The coordinator reads the relay's CPU time around each batch.

use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use bytes::Bytes;
use clap::{Args, ValueEnum};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};
use tonic::transport::Channel;
use toolrelay::proto::v1::relay_client::RelayClient;
use toolrelay::proto::v1::{CallRequest, RequestStatus};

/// How a caller reaches the relay.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum CallerKind {
    /// `POST /api/sessions/{code}/call`, kept-alive HTTP/1.
    Http,
    /// gRPC `Call` (the generated tonic client), one HTTP/2 connection for all callers.
    Grpc,
    /// MCP `tools/call` on `/mcp/s/{handle}` (Streamable HTTP), one MCP session per caller.
    Mcp,
    /// Not a call: `POST /api/sessions` (session creation rate).
    Create,
}

/// Arguments of the callers process.
#[derive(Debug, Clone, Args)]
pub struct CallerArgs {
    /// The relay's HTTP base URL.
    #[arg(long)]
    pub base: String,
    /// The relay's gRPC URL (for `--caller grpc`).
    #[arg(long)]
    pub grpc: Option<String>,
    /// How to call.
    #[arg(long, value_enum)]
    pub caller: CallerKind,
    /// The sessions, `CODE:HANDLE` comma-separated.
    #[arg(long, value_delimiter = ',')]
    pub sessions: Vec<String>,
    /// Concurrent callers.
    #[arg(long, default_value_t = 1)]
    pub callers: usize,
    /// Calls made first (in all) and not measured.
    #[arg(long, default_value_t = 500)]
    pub warmup: usize,
}

/// One caller's connection to the relay.
enum Caller {
    Http {
        client: reqwest::Client,
        url: String,
        body: Bytes,
    },
    Grpc {
        client: RelayClient<Channel>,
        code: String,
    },
    Mcp {
        client: reqwest::Client,
        url: String,
        session: String,
        next_id: u64,
    },
}

/// The arguments every call sends.
fn arguments() -> Value {
    json!({"text": "bench"})
}

const MCP_ACCEPT: &str = "application/json, text/event-stream";
const MCP_VERSION: &str = "2025-06-18";

impl Caller {
    async fn new(
        args: &CallerArgs,
        session: &str,
        channel: Option<&Channel>,
    ) -> anyhow::Result<Self> {
        let (code, handle) = session.split_once(':').unwrap_or((session, ""));
        let http = || {
            reqwest::Client::builder()
                .pool_max_idle_per_host(1)
                .tcp_nodelay(true)
                .timeout(Duration::from_secs(60))
                .build()
        };
        Ok(match args.caller {
            CallerKind::Http => Caller::Http {
                client: http()?,
                url: format!("{}/api/sessions/{code}/call", args.base),
                body: Bytes::from(json!({"functionName": "echo", "args": arguments()}).to_string()),
            },
            CallerKind::Create => Caller::Http {
                client: http()?,
                url: format!("{}/api/sessions", args.base),
                body: Bytes::new(),
            },
            CallerKind::Grpc => Caller::Grpc {
                client: RelayClient::new(channel.context("--grpc is needed")?.clone()),
                code: code.to_owned(),
            },
            CallerKind::Mcp => {
                let client = http()?;
                let url = format!("{}/mcp/s/{handle}", args.base);
                let initialize = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize",
                    "params": {"protocolVersion": MCP_VERSION, "capabilities": {},
                        "clientInfo": {"name": "toolrelay-bench", "version": "1"}}});
                let response = client
                    .post(&url)
                    .header("accept", MCP_ACCEPT)
                    .json(&initialize)
                    .send()
                    .await?;
                if !response.status().is_success() {
                    bail!("MCP initialize: HTTP {}", response.status());
                }
                let session = response
                    .headers()
                    .get("mcp-session-id")
                    .context("MCP initialize: no mcp-session-id")?
                    .to_str()?
                    .to_owned();
                response.bytes().await?;
                let initialized = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
                let response = client
                    .post(&url)
                    .header("accept", MCP_ACCEPT)
                    .header("mcp-session-id", &session)
                    .header("mcp-protocol-version", MCP_VERSION)
                    .json(&initialized)
                    .send()
                    .await?;
                if !response.status().is_success() {
                    bail!("MCP initialized: HTTP {}", response.status());
                }
                response.bytes().await?;
                Caller::Mcp {
                    client,
                    url,
                    session,
                    next_id: 1,
                }
            }
        })
    }

    /// One call; an error unless the tab answered it (or the session was created).
    async fn call(&mut self) -> anyhow::Result<()> {
        match self {
            Caller::Http { client, url, body } => {
                let response = client
                    .post(url.as_str())
                    .header("content-type", "application/json")
                    .body(body.clone())
                    .send()
                    .await?;
                let status = response.status();
                let bytes = response.bytes().await?;
                if body.is_empty() {
                    // Session creation.
                    if status != reqwest::StatusCode::CREATED {
                        bail!("HTTP {status}");
                    }
                    return Ok(());
                }
                if status != reqwest::StatusCode::OK {
                    bail!("HTTP {status}: {}", String::from_utf8_lossy(&bytes));
                }
                let answer: Value = serde_json::from_slice(&bytes)?;
                if answer["success"] != true {
                    bail!("the call failed: {answer}");
                }
                Ok(())
            }
            Caller::Grpc { client, code } => {
                let state = client
                    .call(CallRequest {
                        code: code.clone(),
                        function_name: "echo".into(),
                        args: Some(toolrelay::json::to_struct(&arguments())),
                        ..CallRequest::default()
                    })
                    .await?
                    .into_inner();
                if state.status != RequestStatus::Completed as i32 {
                    bail!("the call ended {:?}", state.status());
                }
                Ok(())
            }
            Caller::Mcp {
                client,
                url,
                session,
                next_id,
            } => {
                let id = *next_id;
                *next_id += 1;
                let request = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
                    "params": {"name": "echo", "arguments": arguments()}});
                let response = client
                    .post(url.as_str())
                    .header("accept", MCP_ACCEPT)
                    .header("mcp-session-id", session.as_str())
                    .header("mcp-protocol-version", MCP_VERSION)
                    .json(&request)
                    .send()
                    .await?;
                let status = response.status();
                let text = response.text().await?;
                if !status.is_success() {
                    bail!("MCP tools/call: HTTP {status}: {text}");
                }
                // A JSON body, or an SSE stream whose `data:` lines carry the messages.
                let answer = std::iter::once(text.as_str())
                    .chain(text.lines().filter_map(|line| line.strip_prefix("data:")))
                    .filter_map(|data| serde_json::from_str::<Value>(data.trim()).ok())
                    .find(|message| message["id"] == id)
                    .with_context(|| format!("MCP tools/call: no answer in {text}"))?;
                if answer["result"].is_null() || answer["result"]["isError"] == true {
                    bail!("MCP tools/call failed: {answer}");
                }
                Ok(())
            }
        }
    }
}

/// Runs the callers process.
pub async fn run(args: CallerArgs) -> anyhow::Result<()> {
    crate::raise_open_files();
    let channel = match (&args.grpc, args.caller) {
        (Some(url), CallerKind::Grpc) => Some(
            tonic::transport::Endpoint::from_shared(url.clone())?
                .tcp_nodelay(true)
                .connect()
                .await?,
        ),
        _ => None,
    };
    if args.sessions.is_empty() && args.caller != CallerKind::Create {
        bail!("no sessions to call");
    }
    let mut callers = Vec::with_capacity(args.callers);
    for i in 0..args.callers {
        let session = if args.sessions.is_empty() {
            ""
        } else {
            &args.sessions[i % args.sessions.len()]
        };
        callers.push(Caller::new(&args, session, channel.as_ref()).await?);
    }
    // The first call of each caller waits until its tab answers (a polling tab, say, counts as
    // connected once it has polled).
    let ready_by = Instant::now() + Duration::from_secs(30);
    for caller in &mut callers {
        loop {
            match caller.call().await {
                Ok(()) => break,
                Err(error) if Instant::now() > ready_by => {
                    bail!("the first call never went through: {error:#}")
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        }
    }
    let (callers, _) = batch(callers, args.warmup).await;
    let mut callers = callers;
    println!("{}", json!({"warm": true}));
    let mut stdin = BufReader::new(tokio::io::stdin()).lines();
    while let Some(line) = stdin.next_line().await? {
        let Some(count) = line.strip_prefix("go ") else {
            continue;
        };
        let count: usize = count.trim().parse().context("go N")?;
        let (back, summary) = batch(callers, count).await;
        callers = back;
        println!("{summary}");
    }
    Ok(())
}

/// `count` calls split between the callers, all running at once; the callers back, and the
/// batch's summary.
async fn batch(callers: Vec<Caller>, count: usize) -> (Vec<Caller>, Value) {
    let n = callers.len().max(1);
    let started = Instant::now();
    let tasks: Vec<_> = callers
        .into_iter()
        .enumerate()
        .map(|(i, mut caller)| {
            let calls = count / n + usize::from(i < count % n);
            tokio::spawn(async move {
                let mut latencies = Vec::with_capacity(calls);
                let mut errors = 0;
                for _ in 0..calls {
                    let began = Instant::now();
                    match caller.call().await {
                        Ok(()) => latencies.push(began.elapsed()),
                        Err(error) => {
                            if errors == 0 {
                                eprintln!("toolrelay-bench callers: {error:#}");
                            }
                            errors += 1;
                        }
                    }
                }
                (caller, latencies, errors)
            })
        })
        .collect();
    let mut back = Vec::with_capacity(n);
    let mut latencies = Vec::with_capacity(count);
    let mut errors = 0;
    for task in tasks {
        if let Ok((caller, mine, failed)) = task.await {
            back.push(caller);
            latencies.extend(mine);
            errors += failed;
        }
    }
    let elapsed = started.elapsed();
    (back, crate::stats::summary(latencies, errors, elapsed))
}
