//! What the bench starts and watches: the relay under test (toolrelay in one process or split,
//! or the floor), a `redis-server`, and the processes' CPU time and memory from `/proc`.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::ValueEnum;
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// How toolrelay is deployed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Mode {
    /// `toolrelay`: gateway and relay in one process.
    One,
    /// `toolrelay-relay` and `toolrelay-gateway` talking gRPC; tabs and callers on the gateway.
    Split,
}

/// What is measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// toolrelay, deployed so, with or without Redis.
    Toolrelay { mode: Mode, redis: bool },
    /// `toolrelay-floor`.
    Floor,
}

impl Target {
    /// The table cells naming the target: what, mode, store.
    pub fn cells(self) -> String {
        match self {
            Target::Floor => "floor | – | –".to_owned(),
            Target::Toolrelay { mode, redis } => format!(
                "toolrelay | {} | {}",
                match mode {
                    Mode::One => "one",
                    Mode::Split => "split",
                },
                if redis { "redis" } else { "memory" }
            ),
        }
    }
}

/// The relay under test: its processes (killed when dropped) and URLs.
pub struct System {
    /// The public HTTP base URL (the gateway's in split mode).
    pub base: String,
    /// The gRPC URL of the relay (none for the floor).
    pub grpc: Option<String>,
    processes: Vec<Child>,
}

impl System {
    /// Starts the target with ephemeral loopback ports; `redis_url` for the Redis store.
    pub async fn start(
        target: Target,
        bin_dir: &Path,
        redis_url: Option<&str>,
        call_log: bool,
    ) -> anyhow::Result<Self> {
        // toolrelay logs every finished call at `info` (its default level); without it, the
        // relay's own events stay at `warn`.
        let quiet = if call_log {
            ""
        } else {
            ",toolrelay_relay::relay=warn"
        };
        // The bench makes thousands of calls a minute from one address to one session, and
        // creates thousands of sessions and holds thousands of connections (tabs) from one
        // address. A split gateway proves itself to its relay with the secret both are given.
        let limits = [
            ("RATE_LIMIT_REQUEST_PER_CODE", "100000000"),
            ("RATE_LIMIT_SESSION_PER_IP", "100000000"),
            ("MAX_CONNECTIONS_PER_IP", "1000000"),
            ("REDIS_URL", redis_url.unwrap_or("")),
            ("GATEWAY_SECRET", "bench-gateway-secret-0123456789"),
        ];
        match target {
            Target::Floor => {
                let (child, line) = spawn(
                    bin_dir,
                    "toolrelay-floor",
                    &[("LISTEN_ADDR", "127.0.0.1:0")],
                    "",
                    "toolrelay-floor listening",
                )
                .await?;
                Ok(Self {
                    base: format!("http://{}", field(&line, "listen")?),
                    grpc: None,
                    processes: vec![child],
                })
            }
            Target::Toolrelay {
                mode: Mode::One, ..
            } => {
                let mut env = vec![
                    ("LISTEN_ADDR", "127.0.0.1:0"),
                    ("GRPC_LISTEN_ADDR", "127.0.0.1:0"),
                ];
                env.extend(limits);
                let (child, line) =
                    spawn(bin_dir, "toolrelay", &env, quiet, "toolrelay listening").await?;
                Ok(Self {
                    base: format!("http://{}", field(&line, "listen")?),
                    grpc: Some(format!("http://{}", field(&line, "grpc")?)),
                    processes: vec![child],
                })
            }
            Target::Toolrelay {
                mode: Mode::Split, ..
            } => {
                let mut env = vec![
                    ("GRPC_LISTEN_ADDR", "127.0.0.1:0"),
                    ("WS_LISTEN_ADDR", "127.0.0.1:0"),
                ];
                env.extend(limits);
                let (relay, line) = spawn(
                    bin_dir,
                    "toolrelay-relay",
                    &env,
                    quiet,
                    "toolrelay-relay listening",
                )
                .await?;
                let relay_url = format!("http://{}", field(&line, "grpc")?);
                // The limits are the gateway's in older builds: set for both.
                let mut env = vec![("LISTEN_ADDR", "127.0.0.1:0"), ("RELAY_URL", &relay_url)];
                env.extend(limits);
                let (gateway, line) = spawn(
                    bin_dir,
                    "toolrelay-gateway",
                    &env,
                    quiet,
                    "toolrelay-gateway listening",
                )
                .await?;
                Ok(Self {
                    base: format!("http://{}", field(&line, "listen")?),
                    grpc: Some(relay_url),
                    processes: vec![relay, gateway],
                })
            }
        }
    }

    /// The process ids of the relay under test (two in split mode).
    pub fn pids(&self) -> Vec<u32> {
        self.processes.iter().filter_map(Child::id).collect()
    }

    /// CPU time the relay's processes have used, user and system.
    pub fn cpu(&self) -> anyhow::Result<Duration> {
        let mut ticks = 0;
        for pid in self.pids() {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
            // After the command's `(name)`: state is field 3, utime 14 and stime 15.
            let rest = stat.rsplit_once(')').context("a /proc stat")?.1;
            let fields: Vec<&str> = rest.split_whitespace().collect();
            let field = |n: usize| -> anyhow::Result<u64> {
                Ok(fields.get(n - 3).context("a short /proc stat")?.parse()?)
            };
            ticks += field(14)? + field(15)?;
        }
        Ok(Duration::from_secs_f64(ticks as f64 / clock_ticks() as f64))
    }

    /// The relay's resident memory, RSS and PSS in KB, all its processes summed
    /// (`/proc/<pid>/smaps_rollup`).
    pub fn memory(&self) -> anyhow::Result<(u64, u64)> {
        let (mut rss, mut pss) = (0, 0);
        for pid in self.pids() {
            let rollup = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup"))?;
            for line in rollup.lines() {
                let value = || -> u64 {
                    line.split_whitespace()
                        .nth(1)
                        .and_then(|kb| kb.parse().ok())
                        .unwrap_or(0)
                };
                if line.starts_with("Rss:") {
                    rss += value();
                } else if line.starts_with("Pss:") {
                    pss += value();
                }
            }
        }
        Ok((rss, pss))
    }
}

/// Clock ticks per second of `/proc/<pid>/stat` (`getconf CLK_TCK`; 100 on Linux).
fn clock_ticks() -> u64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|output| String::from_utf8(output.stdout).ok())
        .and_then(|text| text.trim().parse().ok())
        .unwrap_or(100)
}

/// A `redis-server` of the bench's own on an ephemeral loopback port; killed when dropped.
pub struct Redis {
    port: u16,
    _process: Child,
    dir: PathBuf,
}

impl Redis {
    pub async fn start() -> anyhow::Result<Self> {
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

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Starts watching the commands clients send (`redis-cli MONITOR`), from its `OK` on.
    pub async fn monitor(&self) -> anyhow::Result<Monitor> {
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
    pub async fn command_stats(
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
pub const COUNTED_CALLS: usize = 200;

/// A running `redis-cli MONITOR`.
pub struct Monitor {
    port: u16,
    lines: tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
    _process: Child,
}

impl Monitor {
    /// The commands clients sent since it started (not those scripts ran): read up to a
    /// marker sent last, so that nothing still in the pipe is missed.
    pub async fn count(mut self) -> anyhow::Result<usize> {
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

pub fn field(line: &Value, name: &str) -> anyhow::Result<String> {
    line[name]
        .as_str()
        .map(str::to_owned)
        .with_context(|| format!("the listening line has no {name}: {line}"))
}

/// Starts a binary with JSON logs (warnings only) and waits for its line saying `ready`.
pub async fn spawn(
    bin_dir: &Path,
    name: &str,
    env: &[(&str, &str)],
    extra_log: &str,
    ready: &str,
) -> anyhow::Result<(Child, Value)> {
    let path = bin_dir.join(name);
    let mut child = Command::new(&path)
        .envs(env.iter().copied())
        .env("LOG_FORMAT", "json")
        .env(
            "RUST_LOG",
            format!("warn,{}=info{extra_log}", name.replace('-', "_")),
        )
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
