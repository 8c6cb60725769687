//! `toolrelay-bench`: measures toolrelay's full call loop — an LLM's call, the `tool-request`
//! pushed to a tab, the tab's answer, the result — against the real release binaries, beside
//! `toolrelay-floor` (the same loop with nothing else: `src/bin/toolrelay-floor.rs`) measured in
//! the same run, so that every figure comes with its ratio to the floor.
//!
//! ```text
//! cargo build --release -p toolrelay-bench -p toolrelay-server -p toolrelay-gateway --bins
//! target/release/toolrelay-bench --scenario all --mode one,split
//! bench/redis-fleet.sh            # the Redis fleet's set: two replicas on one Redis
//! ```
//!
//! # Layout
//! * The coordinator (this file) starts the relay under test ([`system`]: toolrelay in one
//!   process or split, memory or Redis — one replica or several on a Redis of its own
//!   ([`redis`]: one primary, a primary with a replica and `WAIT`, or a Cluster) — or the
//!   floor), then the tabs and the callers, each a process of its
//!   own: this binary again, with the hidden subcommands `tabs` ([`tabs`]) and `callers`
//!   ([`callers`]), which talk to it in JSON lines on stdout. With several replicas the tabs
//!   attach to the last and the callers call the first.
//! * Scenarios ([`scenarios`]): sequential latency, closed-loop throughput with the relay's
//!   CPU time per call, idle tabs with the relay's RSS and PSS per tab, session creation rate.
//!   On Redis, each also reports what Redis did: commands, CPU, errors and the relays' round
//!   trips per call, or per second over a quiet window of idle tabs, and memory per session.

mod callers;
mod redis;
mod scenarios;
mod stats;
mod system;
mod tabs;

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::{ArgAction, Args, Parser, Subcommand, ValueEnum};
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

use callers::CallerKind;
use scenarios::{Dirs, Seen};
use stats::number;
use system::{Mode, System, Target};
use tabs::Transport;

/// Measures toolrelay's call loop against a minimal floor relay.
#[derive(Debug, Parser)]
// A flag given twice takes its last value (`bench/redis-fleet.sh` passes its flags first),
// lists too (`ArgAction::Set`).
#[command(name = "toolrelay-bench", version, about, args_override_self = true)]
struct Cli {
    #[command(subcommand)]
    role: Option<Role>,
    #[command(flatten)]
    bench: Bench,
}

/// The processes the coordinator starts (this binary again).
#[derive(Debug, Subcommand)]
enum Role {
    /// Tabs: N sessions, a tab on each.
    #[command(hide = true)]
    Tabs(tabs::TabArgs),
    /// Callers: M concurrent callers in a closed loop.
    #[command(hide = true)]
    Callers(callers::CallerArgs),
}

/// What to measure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Scenario {
    /// One tab, one caller making calls one after another: p50 … max.
    Latency,
    /// `--sessions` tabs, `--callers` concurrent callers: calls/s, CPU per call, p99.9.
    Throughput,
    /// `--tabs` idle tabs with their sessions: the relay's memory per tab.
    Idle,
    /// Sessions created by `--create-callers` concurrent clients: sessions/s.
    Create,
    /// All of them.
    All,
}

/// The store(s) to measure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum StoreChoice {
    /// In memory (the default deployment).
    Memory,
    /// Redis the bench starts (AOF on, fsync every second), laid out as `--redis` says.
    Redis,
    /// Memory, then Redis.
    Both,
}

/// How replicas on Redis reach a call's tab.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum RouteChoice {
    /// By Redis pub/sub alone (no `REPLICA_URL`): the default deployment.
    Pubsub,
    /// Routed to the tab's replica (`REPLICA_URL` on each relay, the Redis store only).
    Routed,
}

/// The coordinator's options.
#[derive(Debug, Clone, Args)]
struct Bench {
    /// Scenarios, comma-separated.
    #[arg(long, value_enum, value_delimiter = ',', action = ArgAction::Set, default_value = "latency")]
    scenario: Vec<Scenario>,
    /// Deployments of toolrelay, comma-separated.
    #[arg(long, value_enum, value_delimiter = ',', action = ArgAction::Set, default_value = "one")]
    mode: Vec<Mode>,
    /// Where toolrelay keeps its state.
    #[arg(long, value_enum, default_value_t = StoreChoice::Memory)]
    store: StoreChoice,
    /// How the bench's Redis is laid out, comma-separated, each measured in turn (the Redis
    /// store only): `primary,wait` shows what `WAIT` costs, `primary,cluster` what a Cluster of
    /// three primaries carries per shard.
    #[arg(long, value_enum, value_delimiter = ',', action = ArgAction::Set, default_value = "primary")]
    redis: Vec<redis::Topology>,
    /// How replicas on Redis reach a call's tab: by pub/sub, or routed to the tab's replica
    /// (`REPLICA_URL`).
    #[arg(long, value_enum, default_value_t = RouteChoice::Pubsub)]
    route: RouteChoice,
    /// How tabs attach, comma-separated (the floor has WebSocket only; idle: ws, sse, grpc).
    #[arg(long, value_enum, value_delimiter = ',', action = ArgAction::Set, default_value = "ws")]
    transport: Vec<Transport>,
    /// How callers call, comma-separated (the floor has HTTP only).
    #[arg(long, value_enum, value_delimiter = ',', action = ArgAction::Set, default_value = "http")]
    caller: Vec<CallerKind>,
    /// Calls measured in the latency scenario.
    #[arg(long, default_value_t = 5_000)]
    calls: usize,
    /// Calls measured per run of the throughput scenario (all callers together).
    #[arg(long, default_value_t = 40_000)]
    throughput_calls: usize,
    /// Calls made first and not measured (all callers together).
    #[arg(long, default_value_t = 500)]
    warmup: usize,
    /// Sessions (each with a tab) in the throughput scenario.
    #[arg(long, default_value_t = 50)]
    sessions: usize,
    /// Concurrent callers in the throughput scenario, comma-separated.
    #[arg(long, value_delimiter = ',', action = ArgAction::Set, default_value = "50,200")]
    callers: Vec<usize>,
    /// Idle tabs (each with its session) in the idle scenario.
    #[arg(long, default_value_t = 3_000)]
    tabs: usize,
    /// Seconds of the idle scenario's quiet window on Redis (longer than the relay's periodic
    /// work, so that all of it is seen).
    #[arg(long, default_value_t = 65)]
    idle_window: u64,
    /// What each idle tab registers: the CODAP plugin's manifest (built from the plugin's
    /// modules by `bench/codap-manifest.mjs`, with Node.js) or `echo`.
    #[arg(long, value_enum, default_value_t = IdleManifest::Codap)]
    idle_manifest: IdleManifest,
    /// toolrelay replicas on one Redis (the Redis store only): tabs on the last, callers on
    /// the first. The memory mode and the floor stay one process.
    #[arg(long, default_value_t = 1)]
    replicas: usize,
    /// Sessions created per run of the create scenario.
    #[arg(long, default_value_t = 5_000)]
    create: usize,
    /// Concurrent creating clients in the create scenario, comma-separated.
    #[arg(long, value_delimiter = ',', action = ArgAction::Set, default_value = "1,50")]
    create_callers: Vec<usize>,
    /// Run toolrelay without its `info` line per finished call (deployed: with it).
    #[arg(long)]
    no_call_log: bool,
    /// Leave the floor out.
    #[arg(long)]
    no_floor: bool,
    /// Where the toolrelay binaries are (default: next to this one; the floor always is).
    #[arg(long)]
    bin_dir: Option<PathBuf>,
}

/// What the idle tabs register.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum IdleManifest {
    /// The CODAP plugin's manifest (services/gateway/plugin/tools.js).
    Codap,
    /// One small function.
    Echo,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.role {
        Some(Role::Tabs(args)) => tabs::run(args).await,
        Some(Role::Callers(args)) => callers::run(args).await,
        None => coordinate(cli.bench).await,
    }
}

/// Raises this process's soft limit of open files to its hard limit (children inherit it):
/// an idle tab is a socket, and so is each caller.
pub fn raise_open_files() {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    if let Ok((_, hard)) = getrlimit(Resource::RLIMIT_NOFILE) {
        let _ = setrlimit(Resource::RLIMIT_NOFILE, hard, hard);
    }
}

async fn coordinate(bench: Bench) -> anyhow::Result<()> {
    raise_open_files();
    let own_dir = std::env::current_exe()?
        .parent()
        .context("the bench binary has no directory")?
        .to_path_buf();
    let scenarios = if bench.scenario.contains(&Scenario::All) {
        vec![
            Scenario::Latency,
            Scenario::Throughput,
            Scenario::Idle,
            Scenario::Create,
        ]
    } else {
        bench.scenario.clone()
    };
    let idle_manifest =
        if scenarios.contains(&Scenario::Idle) && bench.idle_manifest == IdleManifest::Codap {
            Some(scenarios::codap_manifest()?)
        } else {
            None
        };
    let dirs = Dirs {
        bin: bench.bin_dir.clone().unwrap_or_else(|| own_dir.clone()),
        floor: own_dir,
        idle_manifest: idle_manifest.as_ref().map(|(path, _)| path.clone()),
    };
    if bench.store != StoreChoice::Memory {
        println!("Redis: calls between replicas {:?}", bench.route);
    }
    let redis: Vec<Option<redis::Topology>> = bench.redis.iter().copied().map(Some).collect();
    let stores: Vec<Option<redis::Topology>> = match bench.store {
        StoreChoice::Memory => vec![None],
        StoreChoice::Redis => redis,
        StoreChoice::Both => std::iter::once(None).chain(redis).collect(),
    };
    let mut targets = Vec::new();
    if !bench.no_floor {
        targets.push(Target::Floor);
    }
    for &mode in &bench.mode {
        for &redis in &stores {
            // Several replicas share their state through Redis only.
            let replicas = if redis.is_some() {
                bench.replicas.max(1)
            } else {
                1
            };
            targets.push(Target::Toolrelay {
                mode,
                redis,
                replicas,
            });
        }
    }
    println!(
        "toolrelay binaries: {}",
        std::fs::canonicalize(&dirs.bin)
            .unwrap_or_else(|_| dirs.bin.clone())
            .display()
    );
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!(
        "toolrelay-bench: {} cores, load average {} at the start",
        std::thread::available_parallelism().map_or(0, usize::from),
        load.split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ")
    );
    for scenario in scenarios {
        let mut seen = Seen::default();
        println!();
        match scenario {
            Scenario::Latency => {
                println!(
                    "Sequential latency: one tab, one caller, {} calls (µs)\n",
                    bench.calls
                );
                println!(
                    "| relay | mode | store | tab | caller | p50 | p90 | p99 | p99.9 | max | calls/s | CPU µs/call | p50 ÷ floor | p99 ÷ floor | p50 ÷ memory |"
                );
                println!("|{}", "---|".repeat(15));
            }
            Scenario::Throughput => {
                println!(
                    "Closed-loop throughput: {} sessions with a tab each, {} calls per run (latency in µs)\n",
                    bench.sessions, bench.throughput_calls
                );
                println!(
                    "| relay | mode | store | tab | caller | callers | errors | calls/s | ÷ floor | ÷ memory | CPU µs/call | ÷ floor | p50 | p99 | p99.9 | p99.9 ÷ floor |"
                );
                println!("|{}", "---|".repeat(16));
            }
            Scenario::Idle => {
                let registered = match &idle_manifest {
                    Some((_, bytes)) => format!(
                        "the CODAP plugin's manifest ({} bytes)",
                        stats::grouped(*bytes as f64)
                    ),
                    None => "`echo`".to_owned(),
                };
                println!(
                    "Idle tabs: {} tabs, each with its session, registering {registered}\n",
                    bench.tabs
                );
                println!(
                    "| relay | mode | store | tab | tabs | RSS before (MB) | RSS after (MB) | RSS KB/tab | PSS KB/tab | RSS ÷ floor |"
                );
                println!("|{}", "---|".repeat(10));
            }
            Scenario::Create => {
                println!("Session creation: {} sessions per run\n", bench.create);
                println!(
                    "| relay | mode | store | clients | errors | sessions/s | ÷ floor | CPU µs/session | ÷ floor | RSS KB/session | p50 µs | p99 µs |"
                );
                println!("|{}", "---|".repeat(12));
            }
            Scenario::All => unreachable!("expanded above"),
        }
        for &target in &targets {
            let result = match scenario {
                Scenario::Latency => scenarios::latency(&bench, &dirs, target, &mut seen).await,
                Scenario::Throughput => {
                    scenarios::throughput(&bench, &dirs, target, &mut seen).await
                }
                Scenario::Idle => scenarios::idle(&bench, &dirs, target, &mut seen).await,
                Scenario::Create => scenarios::create(&bench, &dirs, target, &mut seen).await,
                Scenario::All => Ok(()),
            };
            if let Err(error) = result {
                println!("| {} | failed: {error:#} |", target.cells());
            }
        }
        if !seen.redis_rows.is_empty() {
            if scenario == Scenario::Idle {
                println!(
                    "\nRedis while the tabs are idle: a quiet window of {} s after they attached; memory per session from `used_memory` before the sessions and with them\n",
                    bench.idle_window
                );
                if bench.idle_window < 30 {
                    println!(
                        "(A window under 30 s may miss some of the relay's periodic work: measure with the default 65 s.)\n"
                    );
                }
                println!("{}", scenarios::REDIS_IDLE);
            } else {
                println!(
                    "\nRedis per call (`INFO commandstats`, `INFO cpu`, `INFO errorstats` before and after; round trips: the relays' store operations)\n"
                );
                println!("{}", scenarios::REDIS_PER_CALL);
            }
            for row in &seen.redis_rows {
                println!("{row}");
            }
        }
    }
    if let Some((path, _)) = &idle_manifest {
        let _ = std::fs::remove_file(path);
    }
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!(
        "\nload average {} at the end",
        load.split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ")
    );
    Ok(())
}

/// The `--transport` name of a transport.
pub fn transport_name(transport: Transport) -> &'static str {
    match transport {
        Transport::Ws => "ws",
        Transport::Sse => "sse",
        Transport::Polling => "polling",
        Transport::Grpc => "grpc",
    }
}

/// The `--caller` name of a caller.
pub fn caller_name(caller: CallerKind) -> &'static str {
    match caller {
        CallerKind::Http => "http",
        CallerKind::Grpc => "grpc",
        CallerKind::Mcp => "mcp",
        CallerKind::Create => "create",
    }
}

/// A tabs or callers process: this binary again, speaking JSON lines; killed when dropped.
struct Worker {
    _child: Child,
    stdin: ChildStdin,
    lines: Lines<BufReader<ChildStdout>>,
}

impl Worker {
    async fn start(args: &[String]) -> anyhow::Result<Self> {
        let mut child = Command::new(std::env::current_exe()?)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()?;
        let stdin = child.stdin.take().context("no stdin")?;
        let lines = BufReader::new(child.stdout.take().context("no stdout")?).lines();
        Ok(Self {
            _child: child,
            stdin,
            lines,
        })
    }

    /// The next JSON line, within `within`.
    async fn read(&mut self, within: Duration) -> anyhow::Result<Value> {
        loop {
            let line = tokio::time::timeout(within, self.lines.next_line())
                .await
                .context("a bench process went quiet")??
                .context("a bench process ended")?;
            if let Ok(value) = serde_json::from_str(&line) {
                return Ok(value);
            }
        }
    }

    /// `sessions` sessions with a tab each, attached; the tabs and the sessions
    /// (`CODE:HANDLE`).
    /// With several replicas, on the last (`System::tab_base`); each registers `manifest`
    /// (a JSON file), or `echo`.
    async fn tabs(
        system: &System,
        transport: Transport,
        sessions: usize,
        manifest: Option<&std::path::Path>,
    ) -> anyhow::Result<(Self, Vec<String>)> {
        let mut args = vec![
            "tabs".to_owned(),
            "--base".to_owned(),
            system.tab_base.clone(),
            "--transport".to_owned(),
            transport_name(transport).to_owned(),
            "--sessions".to_owned(),
            sessions.to_string(),
        ];
        if let Some(grpc) = &system.tab_grpc {
            args.extend(["--grpc".to_owned(), grpc.clone()]);
        }
        if let Some(manifest) = manifest {
            args.extend(["--manifest".to_owned(), manifest.display().to_string()]);
        }
        let mut worker = Self::start(&args).await?;
        let ready = worker.read(Duration::from_secs(600)).await?;
        if ready["ready"] != true {
            bail!("the tabs said {ready}");
        }
        let sessions = ready["sessions"]
            .as_array()
            .context("no sessions")?
            .iter()
            .filter_map(|session| session.as_str().map(str::to_owned))
            .collect();
        Ok((worker, sessions))
    }

    /// `count` callers over the sessions, warmed up.
    async fn callers(
        system: &System,
        caller: CallerKind,
        sessions: &[String],
        count: usize,
        warmup: usize,
    ) -> anyhow::Result<Self> {
        let mut args = vec![
            "callers".to_owned(),
            "--base".to_owned(),
            system.base.clone(),
            "--caller".to_owned(),
            caller_name(caller).to_owned(),
            "--callers".to_owned(),
            count.to_string(),
            "--warmup".to_owned(),
            warmup.to_string(),
        ];
        if !sessions.is_empty() {
            args.extend(["--sessions".to_owned(), sessions.join(",")]);
        }
        if let Some(grpc) = &system.grpc {
            args.extend(["--grpc".to_owned(), grpc.clone()]);
        }
        let mut worker = Self::start(&args).await?;
        let warm = worker.read(Duration::from_secs(300)).await?;
        if warm["warm"] != true {
            bail!("the callers said {warm}");
        }
        Ok(worker)
    }

    /// `calls` calls; their summary and the relay's CPU time per call in µs.
    async fn batch(&mut self, system: &System, calls: usize) -> anyhow::Result<(Value, f64)> {
        let cpu_before = system.cpu()?;
        self.stdin
            .write_all(format!("go {calls}\n").as_bytes())
            .await?;
        self.stdin.flush().await?;
        let summary = self.read(Duration::from_secs(1800)).await?;
        let cpu = system.cpu()?.saturating_sub(cpu_before);
        let answered = number(&summary, "calls").max(1.0);
        Ok((summary, cpu.as_secs_f64() * 1e6 / answered))
    }
}
