//! `toolrelay-bench`: measures toolrelay's full call loop — an LLM's `POST /call`, the
//! `tool-request` pushed to a tab over its WebSocket, the tab's answer, the `200` — against the
//! real binaries, each in a process of its own, so that what is measured is what is deployed.
//!
//! ```text
//! cargo build --release --workspace --bins
//! cargo run --release -p toolrelay-bench -- --mode split --calls 5000
//! ```
//!
//! The relay under test is started from `--bin-dir` (default: the directory of this binary,
//! i.e. `target/release`) with ephemeral loopback ports. One tab answers every call at once;
//! one caller makes the calls one after another over a kept-alive HTTP connection. The report
//! gives the latency of the loop (p50, p90, p99, p99.9, max) and the calls per second.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::{Parser, ValueEnum};
use futures::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio_tungstenite::tungstenite::Message;

/// How the relay under test is deployed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Mode {
    /// `toolrelay`: gateway and relay in one process.
    One,
    /// `toolrelay-relay` and `toolrelay-gateway` talking gRPC; the tab on the gateway.
    Split,
}

/// Measures the full call loop of the real binaries.
#[derive(Debug, Parser)]
#[command(name = "toolrelay-bench", version, about)]
struct Cli {
    /// Deployment to measure.
    #[arg(long, value_enum, default_value_t = Mode::One)]
    mode: Mode,
    /// Calls to measure.
    #[arg(long, default_value_t = 5_000)]
    calls: usize,
    /// Calls made first and not measured.
    #[arg(long, default_value_t = 500)]
    warmup: usize,
    /// Where the toolrelay binaries are (default: next to this one).
    #[arg(long)]
    bin_dir: Option<PathBuf>,
    /// Where the state lives: in memory, in a Redis the bench starts (`redis-server`, AOF on
    /// with fsync every second), or both, one after the other in the same run.
    #[arg(long, value_enum, default_value_t = StoreChoice::Memory)]
    store: StoreChoice,
}

/// The store(s) to measure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum StoreChoice {
    /// In memory (the default deployment).
    Memory,
    /// Redis (`REDIS_URL`).
    Redis,
    /// Memory, then Redis.
    Both,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let bin_dir = match &cli.bin_dir {
        Some(dir) => dir.clone(),
        None => std::env::current_exe()?
            .parent()
            .context("the bench binary has no directory")?
            .to_path_buf(),
    };
    let stores: &[bool] = match cli.store {
        StoreChoice::Memory => &[false],
        StoreChoice::Redis => &[true],
        StoreChoice::Both => &[false, true],
    };
    println!(
        "mode {:?}: {} sequential calls, tab on WebSocket",
        cli.mode, cli.calls
    );
    println!(
        "| store | p50 | p90 | p99 | p99.9 | max | calls/s | Redis round trips / call | Redis commands / call | Redis busy µs / call |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for &redis in stores {
        let redis = if redis {
            Some(Redis::start().await?)
        } else {
            None
        };
        let row = measure(&cli, &bin_dir, redis.as_ref()).await?;
        println!("{row}");
    }
    Ok(())
}

/// Measures one deployment; its report as a table row.
async fn measure(cli: &Cli, bin_dir: &Path, redis: Option<&Redis>) -> anyhow::Result<String> {
    let system = System::start(cli.mode, bin_dir, redis.map(Redis::url).as_deref()).await?;
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(1)
        .build()?;
    let created: Value = http
        .post(format!("{}/api/sessions", system.base))
        .send()
        .await?
        .error_for_status()?
        .json()
        .await?;
    let code = created["code"].as_str().context("no code")?.to_owned();
    let token = created["providerToken"]
        .as_str()
        .context("no token")?
        .to_owned();
    let tab = tokio::spawn(echo_tab(system.ws_url(&code, &token)));

    let call_url = format!("{}/api/sessions/{code}/call", system.base);
    let body = json!({"functionName": "echo", "args": {"text": "bench"}}).to_string();
    // The tab registers its tool right after it connects; wait until calls go through.
    let ready_by = Instant::now() + Duration::from_secs(10);
    while call(&http, &call_url, &body).await.is_err() {
        if Instant::now() > ready_by {
            bail!("the tab never became ready");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for _ in 0..cli.warmup {
        call(&http, &call_url, &body).await?;
    }
    let before = match redis {
        Some(redis) => Some(redis.command_stats().await?),
        None => None,
    };
    let mut latencies = Vec::with_capacity(cli.calls);
    let started = Instant::now();
    for _ in 0..cli.calls {
        let began = Instant::now();
        call(&http, &call_url, &body).await?;
        latencies.push(began.elapsed());
    }
    let elapsed = started.elapsed();
    let per_call = match (redis, before) {
        (Some(redis), Some(before)) => {
            let after = redis.command_stats().await?;
            let spent = |name: &str| {
                let (calls, usec) = after.get(name).copied().unwrap_or_default();
                let (calls_before, usec_before) = before.get(name).copied().unwrap_or_default();
                (calls - calls_before, usec - usec_before)
            };
            // Every command Redis ran, those inside the scripts included, and the time it spent
            // on what replicas send (a script's time includes the commands it runs, which
            // `commandstats` also lists on their own: they are not added twice).
            let all: u64 = after.keys().map(|name| spent(name).0).sum();
            let busy: u64 = ["evalsha", "eval", "ping", "subscribe", "unsubscribe"]
                .iter()
                .map(|name| spent(name).1)
                .sum();
            // The round trips: what clients sent, watched with MONITOR over more calls (it
            // shows a command run inside a script as `[0 lua]`, so those are left out).
            let monitor = redis.monitor().await?;
            for _ in 0..COUNTED_CALLS {
                call(&http, &call_url, &body).await?;
            }
            let sent = monitor.count().await?;
            let calls = cli.calls as f64;
            (
                format!("{:.2}", sent as f64 / COUNTED_CALLS as f64),
                format!("{:.1}", all as f64 / calls),
                format!("{:.0}", busy as f64 / calls),
            )
        }
        _ => ("–".to_owned(), "–".to_owned(), "–".to_owned()),
    };
    tab.abort();
    drop(system);

    latencies.sort();
    let at = |q: f64| {
        let index = ((latencies.len() as f64 * q).ceil() as usize).clamp(1, latencies.len());
        micros(latencies[index - 1])
    };
    Ok(format!(
        "| {} | {} µs | {} µs | {} µs | {} µs | {} µs | {:.0} | {} | {} | {} |",
        if redis.is_some() { "redis" } else { "memory" },
        at(0.5),
        at(0.9),
        at(0.99),
        at(0.999),
        micros(*latencies.last().context("no calls measured")?),
        cli.calls as f64 / elapsed.as_secs_f64(),
        per_call.0,
        per_call.1,
        per_call.2,
    ))
}

/// A `redis-server` of the bench's own on an ephemeral loopback port; killed when dropped.
struct Redis {
    port: u16,
    _process: Child,
    dir: PathBuf,
}

impl Redis {
    async fn start() -> anyhow::Result<Self> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let dir = std::env::temp_dir().join(format!("toolrelay-bench-redis-{port}"));
        std::fs::create_dir_all(&dir)?;
        let process = Command::new("redis-server")
            .args([
                "--port",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
            ])
            .args(["--appendonly", "yes", "--appendfsync", "everysec"])
            .args(["--maxmemory-policy", "noeviction"])
            .arg("--dir")
            .arg(&dir)
            .stdout(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .context("cannot start redis-server: run scripts/setup.sh --test, which installs it")?;
        let redis = Self {
            port,
            _process: process,
            dir,
        };
        let ready_by = Instant::now() + Duration::from_secs(10);
        while redis.command_stats().await.is_err() {
            if Instant::now() > ready_by {
                bail!("redis-server did not answer");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(redis)
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Starts watching the commands clients send (`redis-cli MONITOR`), from its `OK` on.
    async fn monitor(&self) -> anyhow::Result<Monitor> {
        let mut process = Command::new("redis-cli")
            .args(["-p", &self.port.to_string(), "MONITOR"])
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .context("cannot start redis-cli")?;
        let mut lines = BufReader::new(process.stdout.take().context("no stdout")?).lines();
        let ok = tokio::time::timeout(Duration::from_secs(10), lines.next_line()).await;
        if !matches!(ok, Ok(Ok(Some(ref line))) if line == "OK") {
            bail!("MONITOR did not start: {ok:?}");
        }
        Ok(Monitor {
            port: self.port,
            lines,
            _process: process,
        })
    }

    /// `INFO commandstats`: how often each command ran, and the microseconds it took.
    async fn command_stats(
        &self,
    ) -> anyhow::Result<std::collections::BTreeMap<String, (u64, u64)>> {
        let output = Command::new("redis-cli")
            .args(["-p", &self.port.to_string(), "INFO", "commandstats"])
            .output()
            .await?;
        if !output.status.success() {
            bail!("redis-cli failed");
        }
        Ok(String::from_utf8_lossy(&output.stdout)
            .lines()
            .filter_map(|line| {
                let (name, rest) = line.trim().strip_prefix("cmdstat_")?.split_once(':')?;
                let field = |key: &str| {
                    rest.split(',')
                        .find_map(|field| field.strip_prefix(key)?.strip_prefix('='))?
                        .parse::<u64>()
                        .ok()
                };
                Some((name.to_owned(), (field("calls")?, field("usec")?)))
            })
            .collect())
    }
}

/// Calls whose round trips to Redis are counted with MONITOR (after the measured ones, which
/// MONITOR would slow down).
const COUNTED_CALLS: usize = 200;

/// A running `redis-cli MONITOR`.
struct Monitor {
    port: u16,
    lines: tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
    _process: Child,
}

impl Monitor {
    /// The commands clients sent since it started (not those scripts ran): read up to a
    /// marker sent last, so that nothing still in the pipe is missed.
    async fn count(mut self) -> anyhow::Result<usize> {
        const MARKER: &str = "toolrelay-bench-counted";
        let sent = Command::new("redis-cli")
            .args(["-p", &self.port.to_string(), "ECHO", MARKER])
            .output()
            .await?;
        if !sent.status.success() {
            bail!("redis-cli ECHO failed");
        }
        let mut count = 0;
        let deadline = Duration::from_secs(30);
        loop {
            let line = tokio::time::timeout(deadline, self.lines.next_line())
                .await
                .context("MONITOR went quiet before the marker")??
                .context("MONITOR ended before the marker")?;
            if line.contains(MARKER) {
                return Ok(count);
            }
            // `<time> [<db> <client address>] "COMMAND" …`, `[<db> lua]` inside a script.
            if !line.contains(" lua]") {
                count += 1;
            }
        }
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn micros(duration: Duration) -> u128 {
    duration.as_micros()
}

/// One call; an error unless the tab answered it.
async fn call(http: &reqwest::Client, url: &str, body: &str) -> anyhow::Result<()> {
    let response = http
        .post(url)
        .header("content-type", "application/json")
        .body(body.to_owned())
        .send()
        .await?;
    if response.status() != reqwest::StatusCode::OK {
        bail!("HTTP {}", response.status());
    }
    let answer: Value = response.json().await?;
    if answer["success"] != true {
        bail!("the call failed: {answer}");
    }
    Ok(())
}

/// A tab that registers `echo` and answers every call at once.
async fn echo_tab(url: String) -> anyhow::Result<()> {
    let (mut socket, _) = tokio_tungstenite::connect_async(&url).await?;
    let tools = json!([{"name": "echo", "description": "Echoes", "inputSchema": {
        "type": "object", "properties": {"text": {"type": "string"}}}}]);
    socket
        .send(Message::text(
            json!({"type": "register", "tools": tools}).to_string(),
        ))
        .await?;
    while let Some(message) = socket.next().await {
        let Message::Text(text) = message? else {
            continue;
        };
        let frame: Value = serde_json::from_str(&text)?;
        if frame["type"] == "tool-request" {
            let answer = json!({"type": "response", "requestId": frame["requestId"],
                "success": true, "result": frame["args"]});
            socket.send(Message::text(answer.to_string())).await?;
        }
    }
    Ok(())
}

/// The relay under test: its processes (killed when dropped) and public URL.
struct System {
    base: String,
    _processes: Vec<Child>,
}

impl System {
    async fn start(mode: Mode, bin_dir: &Path, redis_url: Option<&str>) -> anyhow::Result<Self> {
        // The bench makes thousands of calls a minute from one address to one session.
        let limits = [
            ("RATE_LIMIT_REQUEST_PER_CODE", "10000000"),
            ("REDIS_URL", redis_url.unwrap_or("")),
        ];
        match mode {
            Mode::One => {
                let (child, line) = spawn(
                    bin_dir,
                    "toolrelay",
                    &[
                        ("LISTEN_ADDR", "127.0.0.1:0"),
                        ("GRPC_LISTEN_ADDR", "127.0.0.1:0"),
                        limits[0],
                        limits[1],
                    ],
                    "toolrelay listening",
                )
                .await?;
                Ok(Self {
                    base: format!("http://{}", field(&line, "listen")?),
                    _processes: vec![child],
                })
            }
            Mode::Split => {
                let (relay, line) = spawn(
                    bin_dir,
                    "toolrelay-relay",
                    &[
                        ("GRPC_LISTEN_ADDR", "127.0.0.1:0"),
                        ("WS_LISTEN_ADDR", "127.0.0.1:0"),
                        limits[0],
                        limits[1],
                    ],
                    "toolrelay-relay listening",
                )
                .await?;
                let relay_url = format!("http://{}", field(&line, "grpc")?);
                // The limit is the gateway's in older builds: set for both.
                let (gateway, line) = spawn(
                    bin_dir,
                    "toolrelay-gateway",
                    &[
                        ("LISTEN_ADDR", "127.0.0.1:0"),
                        ("RELAY_URL", &relay_url),
                        limits[0],
                        limits[1],
                    ],
                    "toolrelay-gateway listening",
                )
                .await?;
                Ok(Self {
                    base: format!("http://{}", field(&line, "listen")?),
                    _processes: vec![relay, gateway],
                })
            }
        }
    }

    fn ws_url(&self, code: &str, token: &str) -> String {
        format!(
            "{}/api/sessions/{code}/ws?token={token}",
            self.base.replacen("http", "ws", 1)
        )
    }
}

fn field(line: &Value, name: &str) -> anyhow::Result<String> {
    line[name]
        .as_str()
        .map(str::to_owned)
        .with_context(|| format!("the listening line has no {name}: {line}"))
}

/// Starts a binary with JSON logs (warnings only) and waits for its line saying `ready`.
async fn spawn(
    bin_dir: &Path,
    name: &str,
    env: &[(&str, &str)],
    ready: &str,
) -> anyhow::Result<(Child, Value)> {
    let path = bin_dir.join(name);
    let mut child = Command::new(&path)
        .envs(env.iter().copied())
        .env("LOG_FORMAT", "json")
        .env("RUST_LOG", format!("warn,{}=info", name.replace('-', "_")))
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .with_context(|| {
            format!(
                "cannot start {}: build it first (cargo build --release --workspace --bins)",
                path.display()
            )
        })?;
    let stdout = child.stdout.take().context("no stdout")?;
    let mut lines = BufReader::new(stdout).lines();
    let line = tokio::time::timeout(Duration::from_secs(20), async {
        while let Some(line) = lines.next_line().await? {
            if let Ok(entry) = serde_json::from_str::<Value>(&line)
                && entry["message"] == ready
            {
                return Ok(entry);
            }
        }
        bail!("{name} exited before it was ready")
    })
    .await
    .with_context(|| format!("{name} did not start in time"))??;
    // Keep reading, so a full pipe never blocks the process.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    Ok((child, line))
}
