//! What the bench starts and watches: the relay under test (toolrelay in one process or split,
//! one replica or several on the bench's Redis, or the floor), and the processes' CPU time and memory
//! from `/proc`.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::ValueEnum;
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use crate::redis::Topology;

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
    /// toolrelay, deployed so, in memory or on Redis laid out so; `replicas` of it on one
    /// Redis.
    Toolrelay {
        mode: Mode,
        redis: Option<Topology>,
        replicas: usize,
    },
    /// `toolrelay-floor`.
    Floor,
}

impl Target {
    /// The table cells naming the target: what, mode (`one ×2`: two replicas), store.
    pub fn cells(self) -> String {
        match self {
            Target::Floor => "floor | – | –".to_owned(),
            Target::Toolrelay {
                mode,
                redis,
                replicas,
            } => format!(
                "toolrelay | {}{} | {}",
                match mode {
                    Mode::One => "one",
                    Mode::Split => "split",
                },
                if replicas > 1 {
                    format!(" ×{replicas}")
                } else {
                    String::new()
                },
                redis.map_or("memory", Topology::cell)
            ),
        }
    }
}

/// The relay under test: its processes (killed when dropped) and URLs. With several replicas
/// (on one Redis), callers use the first and tabs the last.
pub struct System {
    /// The public HTTP base URL callers use (the gateway's in split mode).
    pub base: String,
    /// The gRPC URL of the relay callers use (none for the floor).
    pub grpc: Option<String>,
    /// The public HTTP base URL tabs use (`base` with one replica).
    pub tab_base: String,
    /// The gRPC URL tabs use (`grpc` with one replica).
    pub tab_grpc: Option<String>,
    /// The `/metrics` URL of every process that holds a store (none for the floor).
    pub metrics: Vec<String>,
    processes: Vec<Child>,
}

/// What toolrelay logs in a run: as deployed, or without what it logs for every call.
#[derive(Debug, Clone, Copy)]
pub struct Logs {
    /// The `info` line per finished call.
    pub call_line: bool,
}

/// The module the line per finished call is logged from (its `answers`), with the relay's
/// other events.
const CALL_LINE_MODULE: &str = "toolrelay_relay::domain::relay";

impl Logs {
    /// The `RUST_LOG` directives that turn off what is off, after the binary's own `=info`
    /// (`toolrelay`, or in a split deployment `toolrelay_relay` and `toolrelay_gateway`). Each
    /// names the module its events are logged from: a directive matches targets by prefix, so
    /// a name that is only re-exported (`toolrelay_relay::relay`) matches nothing.
    fn directives(self) -> String {
        let mut directives = String::new();
        if !self.call_line {
            directives.push_str(&format!(",{CALL_LINE_MODULE}=warn"));
        }
        directives
    }
}

impl System {
    /// Starts the target with ephemeral loopback ports; `redis` (`REDIS_URL`, …) for the
    /// Redis store.
    /// The floor is `floor_dir/toolrelay-floor`, toolrelay's binaries are in `bin_dir`.
    pub async fn start(
        target: Target,
        bin_dir: &Path,
        floor_dir: &Path,
        redis: &[(&str, String)],
        logs: Logs,
    ) -> anyhow::Result<Self> {
        let replicas = match target {
            Target::Toolrelay { replicas, .. } => replicas.max(1),
            Target::Floor => 1,
        };
        let mut started = Vec::with_capacity(replicas);
        for _ in 0..replicas {
            let replica = Replica::start(target, bin_dir, floor_dir, redis, logs).await?;
            if target != Target::Floor {
                // It listens while it connects to its store; it serves once `/readyz` is green.
                ready(&replica.base).await?;
            }
            started.push(replica);
        }
        let first = &started[0];
        let last = &started[replicas - 1];
        Ok(Self {
            base: first.base.clone(),
            grpc: first.grpc.clone(),
            tab_base: last.base.clone(),
            tab_grpc: last.grpc.clone(),
            metrics: started.iter().filter_map(|r| r.metrics.clone()).collect(),
            processes: started.into_iter().flat_map(|r| r.processes).collect(),
        })
    }

    /// The process ids of the relay under test (two per replica in split mode).
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

/// One replica: its process or two, its URLs.
struct Replica {
    base: String,
    grpc: Option<String>,
    metrics: Option<String>,
    processes: Vec<Child>,
}

impl Replica {
    async fn start(
        target: Target,
        bin_dir: &Path,
        floor_dir: &Path,
        redis: &[(&str, String)],
        logs: Logs,
    ) -> anyhow::Result<Self> {
        let quiet = &logs.directives();
        // The bench makes thousands of calls a minute from one address to one session, and
        // creates thousands of sessions and holds thousands of connections (tabs) from one
        // address. A split gateway proves itself to its relay with the secret both are given.
        let mut limits = vec![
            ("RATE_LIMIT_REQUEST_PER_CODE", "100000000"),
            ("RATE_LIMIT_SESSION_PER_IP", "100000000"),
            ("MAX_CONNECTIONS_PER_IP", "1000000"),
            ("GATEWAY_SECRET", "bench-gateway-secret-0123456789"),
        ];
        // Unset, the state lives in the process (an empty REDIS_URL is refused at start).
        limits.extend(redis.iter().map(|(name, value)| (*name, value.as_str())));
        match target {
            Target::Floor => {
                let (child, line) = spawn(
                    floor_dir,
                    "toolrelay-floor",
                    &[("LISTEN_ADDR", "127.0.0.1:0")],
                    "",
                    "toolrelay-floor listening",
                )
                .await?;
                Ok(Self {
                    base: format!("http://{}", field(&line, "listen")?),
                    grpc: None,
                    metrics: None,
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
                env.extend(limits.iter().copied());
                let (child, line) =
                    spawn(bin_dir, "toolrelay", &env, quiet, "toolrelay listening").await?;
                let base = format!("http://{}", field(&line, "listen")?);
                Ok(Self {
                    metrics: Some(format!("{base}/metrics")),
                    base,
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
                env.extend(limits.iter().copied());
                let (relay, line) = spawn(
                    bin_dir,
                    "toolrelay-relay",
                    &env,
                    quiet,
                    "toolrelay-relay listening",
                )
                .await?;
                let relay_url = format!("http://{}", field(&line, "grpc")?);
                // The relay's WebSocket port also answers `/metrics` (its store's figures).
                let metrics = format!("http://{}/metrics", field(&line, "websocket")?);
                // The limits are the gateway's in older builds: set for both.
                let mut env = vec![("LISTEN_ADDR", "127.0.0.1:0"), ("RELAY_URL", &relay_url)];
                env.extend(limits.iter().copied());
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
                    metrics: Some(metrics),
                    processes: vec![relay, gateway],
                })
            }
        }
    }
}

/// Waits (30 s at most) until `base`'s `/readyz` answers 200.
async fn ready(base: &str) -> anyhow::Result<()> {
    let http = reqwest::Client::new();
    let by = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let answer = http
            .get(format!("{base}/readyz"))
            .timeout(Duration::from_secs(5))
            .send()
            .await;
        match answer {
            Ok(answer) if answer.status().is_success() => return Ok(()),
            _ if std::time::Instant::now() > by => bail!("{base}/readyz stayed red for 30 s"),
            _ => tokio::time::sleep(Duration::from_millis(50)).await,
        }
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
        // The store is the bench's choice (`REDIS_URL` … in `env` or none), not the shell's.
        .env_remove("REDIS_URL")
        .env_remove("REDIS_CLUSTER_URLS")
        .env_remove("REDIS_SENTINELS")
        .env_remove("REDIS_WAIT_REPLICAS")
        .env_remove("REPLICA_URL")
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
    // Keep reading, so a full pipe never blocks the process; its warnings and errors go to
    // the bench's stderr (a figure measured while the relay complained is not one to keep).
    let binary = name.to_owned();
    tokio::spawn(async move {
        while let Ok(Some(line)) = lines.next_line().await {
            if let Ok(entry) = serde_json::from_str::<Value>(&line)
                && matches!(entry["level"].as_str(), Some("WARN" | "ERROR"))
            {
                eprintln!("[{binary}] {line}");
            }
        }
    });
    Ok((child, line))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The source of module `path` (`crate::a::b`): its file, or the files of its folder.
    fn module_source(path: &str) -> String {
        let mut parts = path.split("::");
        let folder = match parts.next() {
            Some("toolrelay_relay") => "services/relay/src",
            Some("toolrelay_gateway") => "services/gateway/src",
            other => panic!("no crate of the workspace: {other:?}"),
        };
        let mut at = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("..")
            .join(folder);
        at.extend(parts);
        let file = at.with_extension("rs");
        if file.is_file() {
            return std::fs::read_to_string(&file).expect("a module's file reads");
        }
        let files = std::fs::read_dir(&at)
            .unwrap_or_else(|error| panic!("{path} is no module ({}): {error}", at.display()));
        files
            .map(|entry| entry.expect("a folder's entry").path())
            .filter(|file| file.extension().is_some_and(|extension| extension == "rs"))
            .map(|file| std::fs::read_to_string(file).expect("a module's file reads"))
            .collect()
    }

    /// A directive naming a module that moved matches nothing and turns nothing off (as
    /// `--no-call-log` did from 29 to 30 November): each names the module its lines are in.
    #[test]
    fn the_call_line_directive_names_the_module_the_line_is_logged_from() {
        assert_eq!(Logs { call_line: true }.directives(), "");
        let quiet = Logs { call_line: false }.directives();
        assert_eq!(quiet, format!(",{CALL_LINE_MODULE}=warn"));
        let source = module_source(CALL_LINE_MODULE);
        assert!(
            source.contains("\"call finished\""),
            "{CALL_LINE_MODULE} has no \"call finished\""
        );
    }
}
