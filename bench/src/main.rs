//! `toolrelay-bench`: measures toolrelay's full call loop — an LLM's call, the `tool-request`
//! pushed to a tab, the tab's answer, the result — against the real release binaries, beside
//! `toolrelay-floor` (the same loop with nothing else: `src/bin/toolrelay-floor.rs`) measured in
//! the same run, so that every figure comes with its ratio to the floor.
//!
//! ```text
//! cargo build --release -p toolrelay-bench -p toolrelay-relay -p toolrelay-gateway --bins
//! target/release/toolrelay-bench --scenario all --mode one,split
//! ```
//!
//! # Layout
//! * The coordinator (this file) starts the relay under test ([`system`]: toolrelay in one
//!   process or split, memory or Redis, or the floor), then the tabs and the callers, each a
//!   process of its own: this binary again, with the hidden subcommands `tabs` ([`tabs`]) and
//!   `callers` ([`callers`]), which talk to it in JSON lines on stdout.
//! * Scenarios: sequential latency, closed-loop throughput with the relay's CPU time per call,
//!   idle tabs with the relay's RSS and PSS per tab, session creation rate.

mod callers;
mod stats;
mod system;
mod tabs;

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::{Args, Parser, Subcommand, ValueEnum};
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

use callers::CallerKind;
use stats::{grouped, number, ratio};
use system::{Mode, Redis, System, Target};
use tabs::Transport;

/// Measures toolrelay's call loop against a minimal floor relay.
#[derive(Debug, Parser)]
#[command(name = "toolrelay-bench", version, about)]
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
    /// Redis (`REDIS_URL`), a `redis-server` the bench starts (AOF on, fsync every second).
    Redis,
    /// Memory, then Redis.
    Both,
}

/// The coordinator's options.
#[derive(Debug, Clone, Args)]
struct Bench {
    /// Scenarios, comma-separated.
    #[arg(long, value_enum, value_delimiter = ',', default_value = "latency")]
    scenario: Vec<Scenario>,
    /// Deployments of toolrelay, comma-separated.
    #[arg(long, value_enum, value_delimiter = ',', default_value = "one")]
    mode: Vec<Mode>,
    /// Where toolrelay keeps its state.
    #[arg(long, value_enum, default_value_t = StoreChoice::Memory)]
    store: StoreChoice,
    /// How tabs attach, comma-separated (the floor has WebSocket only; idle: ws, sse, grpc).
    #[arg(long, value_enum, value_delimiter = ',', default_value = "ws")]
    transport: Vec<Transport>,
    /// How callers call, comma-separated (the floor has HTTP only).
    #[arg(long, value_enum, value_delimiter = ',', default_value = "http")]
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
    #[arg(long, value_delimiter = ',', default_value = "50,200")]
    callers: Vec<usize>,
    /// Idle tabs (each with its session) in the idle scenario.
    #[arg(long, default_value_t = 1_000)]
    tabs: usize,
    /// Sessions created per run of the create scenario.
    #[arg(long, default_value_t = 5_000)]
    create: usize,
    /// Concurrent creating clients in the create scenario, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,50")]
    create_callers: Vec<usize>,
    /// Run toolrelay without its `info` line per finished call (deployed: with it).
    #[arg(long)]
    no_call_log: bool,
    /// Leave the floor out.
    #[arg(long)]
    no_floor: bool,
    /// Where the toolrelay binaries and `toolrelay-floor` are (default: next to this one).
    #[arg(long)]
    bin_dir: Option<PathBuf>,
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

/// The floor's figures of the current scenario, for the ratios of the rows after it.
#[derive(Debug, Default)]
struct FloorFigures {
    latency: Option<Value>,
    throughput: Vec<(usize, Value, f64)>,
    idle: Option<f64>,
    create: Vec<(usize, f64, f64)>,
}

async fn coordinate(bench: Bench) -> anyhow::Result<()> {
    raise_open_files();
    let bin_dir = match &bench.bin_dir {
        Some(dir) => dir.clone(),
        None => std::env::current_exe()?
            .parent()
            .context("the bench binary has no directory")?
            .to_path_buf(),
    };
    let stores: &[bool] = match bench.store {
        StoreChoice::Memory => &[false],
        StoreChoice::Redis => &[true],
        StoreChoice::Both => &[false, true],
    };
    let mut targets = Vec::new();
    if !bench.no_floor {
        targets.push(Target::Floor);
    }
    for &mode in &bench.mode {
        for &redis in stores {
            targets.push(Target::Toolrelay { mode, redis });
        }
    }
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
        let mut floor = FloorFigures::default();
        println!();
        match scenario {
            Scenario::Latency => {
                println!(
                    "Sequential latency: one tab, one caller, {} calls (µs)\n",
                    bench.calls
                );
                println!(
                    "| relay | mode | store | tab | caller | p50 | p90 | p99 | p99.9 | max | calls/s | CPU µs/call | p50 ÷ floor | p99 ÷ floor | Redis round trips / call | Redis commands / call | Redis busy µs / call |"
                );
                println!("|{}", "---|".repeat(17));
            }
            Scenario::Throughput => {
                println!(
                    "Closed-loop throughput: {} sessions with a tab each, {} calls per run (latency in µs)\n",
                    bench.sessions, bench.throughput_calls
                );
                println!(
                    "| relay | mode | store | tab | caller | callers | errors | calls/s | ÷ floor | CPU µs/call | ÷ floor | p50 | p99 | p99.9 | p99.9 ÷ floor |"
                );
                println!("|{}", "---|".repeat(15));
            }
            Scenario::Idle => {
                println!("Idle tabs: {} tabs, each with its session\n", bench.tabs);
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
                Scenario::Latency => latency(&bench, &bin_dir, target, &mut floor).await,
                Scenario::Throughput => throughput(&bench, &bin_dir, target, &mut floor).await,
                Scenario::Idle => idle(&bench, &bin_dir, target, &mut floor).await,
                Scenario::Create => create(&bench, &bin_dir, target, &mut floor).await,
                Scenario::All => Ok(()),
            };
            if let Err(error) = result {
                println!("| {} | failed: {error:#} |", target.cells());
            }
        }
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

/// The target running, with its Redis (dropped after it).
struct Running {
    system: System,
    redis: Option<Redis>,
}

async fn start(
    target: Target,
    bench: &Bench,
    bin_dir: &std::path::Path,
) -> anyhow::Result<Running> {
    let redis = match target {
        Target::Toolrelay { redis: true, .. } => Some(Redis::start().await?),
        _ => None,
    };
    let redis_url = redis.as_ref().map(Redis::url);
    let system = System::start(target, bin_dir, redis_url.as_deref(), !bench.no_call_log).await?;
    Ok(Running { system, redis })
}

/// Whether the floor can stand in for toolrelay here.
fn supports(target: Target, transport: Transport, caller: CallerKind) -> bool {
    target != Target::Floor
        || (transport == Transport::Ws && matches!(caller, CallerKind::Http | CallerKind::Create))
}

fn transport_name(transport: Transport) -> &'static str {
    match transport {
        Transport::Ws => "ws",
        Transport::Sse => "sse",
        Transport::Polling => "polling",
        Transport::Grpc => "grpc",
    }
}

fn caller_name(caller: CallerKind) -> &'static str {
    match caller {
        CallerKind::Http => "http",
        CallerKind::Grpc => "grpc",
        CallerKind::Mcp => "mcp",
        CallerKind::Create => "create",
    }
}

async fn latency(
    bench: &Bench,
    bin_dir: &std::path::Path,
    target: Target,
    floor: &mut FloorFigures,
) -> anyhow::Result<()> {
    let running = start(target, bench, bin_dir).await?;
    let system = &running.system;
    for &transport in &bench.transport {
        for &caller in &bench.caller {
            if !supports(target, transport, caller) || caller == CallerKind::Create {
                continue;
            }
            let row = async {
                let (_tabs, sessions) = Worker::tabs(system, transport, 1).await?;
                let mut callers =
                    Worker::callers(system, caller, &sessions, 1, bench.warmup).await?;
                let before_stats = match &running.redis {
                    Some(redis) => Some(redis.command_stats().await?),
                    None => None,
                };
                let (summary, cpu) = callers.batch(system, bench.calls).await?;
                let redis_cells = match (&running.redis, before_stats) {
                    (Some(redis), Some(before)) => {
                        let after = redis.command_stats().await?;
                        let spent = |name: &str| {
                            let (calls, usec) = after.get(name).copied().unwrap_or_default();
                            let (calls_before, usec_before) =
                                before.get(name).copied().unwrap_or_default();
                            (calls - calls_before, usec - usec_before)
                        };
                        // Every command Redis ran, those inside the scripts included, and the
                        // time it spent on what replicas send (a script's time includes the
                        // commands it runs, which `commandstats` also lists on their own).
                        let all: u64 = after.keys().map(|name| spent(name).0).sum();
                        let busy: u64 = ["evalsha", "eval", "ping", "subscribe", "unsubscribe"]
                            .iter()
                            .map(|name| spent(name).1)
                            .sum();
                        // The round trips: what clients sent, watched with MONITOR over more
                        // calls (it shows a command run inside a script as `[0 lua]`).
                        let monitor = redis.monitor().await?;
                        callers.batch(system, system::COUNTED_CALLS).await?;
                        let sent = monitor.count().await?;
                        let calls = number(&summary, "calls").max(1.0);
                        format!(
                            "{:.2} | {:.1} | {:.0}",
                            sent as f64 / system::COUNTED_CALLS as f64,
                            all as f64 / calls,
                            busy as f64 / calls
                        )
                    }
                    _ => "– | – | –".to_owned(),
                };
                anyhow::Ok((summary, cpu, redis_cells))
            }
            .await;
            let cells = format!(
                "{} | {} | {}",
                target.cells(),
                transport_name(transport),
                caller_name(caller)
            );
            let (summary, cpu, redis_cells) = match row {
                Ok(row) => row,
                Err(error) => {
                    println!("| {cells} | failed: {error:#} |");
                    continue;
                }
            };
            let base = floor.latency.as_ref();
            let q = |name: &str| grouped(number(&summary, name));
            println!(
                "| {cells} | {} | {} | {} | {} | {} | {} | {:.0} | {} | {} | {redis_cells} |",
                q("p50"),
                q("p90"),
                q("p99"),
                q("p999"),
                q("max"),
                grouped(number(&summary, "perSecond")),
                cpu,
                ratio(number(&summary, "p50"), base.map(|b| number(b, "p50"))),
                ratio(number(&summary, "p99"), base.map(|b| number(b, "p99"))),
            );
            if number(&summary, "errors") > 0.0 {
                println!("| {cells} | {} calls failed |", summary["errors"]);
            }
            if target == Target::Floor {
                floor.latency = Some(summary);
            }
        }
    }
    Ok(())
}

async fn throughput(
    bench: &Bench,
    bin_dir: &std::path::Path,
    target: Target,
    floor: &mut FloorFigures,
) -> anyhow::Result<()> {
    let running = start(target, bench, bin_dir).await?;
    let system = &running.system;
    for &transport in &bench.transport {
        for &caller in &bench.caller {
            if !supports(target, transport, caller) || caller == CallerKind::Create {
                continue;
            }
            let cells = format!(
                "{} | {} | {}",
                target.cells(),
                transport_name(transport),
                caller_name(caller)
            );
            let (_tabs, sessions) = match Worker::tabs(system, transport, bench.sessions).await {
                Ok(tabs) => tabs,
                Err(error) => {
                    println!("| {cells} | failed: {error:#} |");
                    continue;
                }
            };
            for &count in &bench.callers {
                let run = async {
                    let mut callers =
                        Worker::callers(system, caller, &sessions, count, bench.warmup.max(count))
                            .await?;
                    callers.batch(system, bench.throughput_calls).await
                }
                .await;
                let (summary, cpu) = match run {
                    Ok(run) => run,
                    Err(error) => {
                        println!("| {cells} | {count} | failed: {error:#} |");
                        continue;
                    }
                };
                let base = floor
                    .throughput
                    .iter()
                    .find(|(callers, _, _)| *callers == count);
                let rate = number(&summary, "perSecond");
                println!(
                    "| {cells} | {count} | {} | {} | {} | {:.0} | {} | {} | {} | {} | {} |",
                    summary["errors"],
                    grouped(rate),
                    ratio(rate, base.map(|(_, b, _)| number(b, "perSecond"))),
                    cpu,
                    ratio(cpu, base.map(|(_, _, cpu)| *cpu)),
                    grouped(number(&summary, "p50")),
                    grouped(number(&summary, "p99")),
                    grouped(number(&summary, "p999")),
                    ratio(
                        number(&summary, "p999"),
                        base.map(|(_, b, _)| number(b, "p999"))
                    ),
                );
                if target == Target::Floor {
                    floor.throughput.push((count, summary, cpu));
                }
            }
        }
    }
    Ok(())
}

async fn idle(
    bench: &Bench,
    bin_dir: &std::path::Path,
    target: Target,
    floor: &mut FloorFigures,
) -> anyhow::Result<()> {
    for &transport in &bench.transport {
        if !matches!(transport, Transport::Ws | Transport::Sse | Transport::Grpc)
            || !supports(target, transport, CallerKind::Http)
        {
            continue;
        }
        let cells = format!("{} | {}", target.cells(), transport_name(transport));
        let measured = async {
            let running = start(target, bench, bin_dir).await?;
            let system = &running.system;
            // A settled baseline: what the relay holds before any session.
            tokio::time::sleep(Duration::from_secs(1)).await;
            let before = system.memory()?;
            let (tabs, _) = Worker::tabs(system, transport, bench.tabs).await?;
            tokio::time::sleep(Duration::from_secs(2)).await;
            let after = system.memory()?;
            drop(tabs);
            anyhow::Ok((before, after))
        }
        .await;
        let ((rss0, pss0), (rss1, pss1)) = match measured {
            Ok(measured) => measured,
            Err(error) => {
                println!("| {cells} | failed: {error:#} |");
                continue;
            }
        };
        let tabs = bench.tabs.max(1) as f64;
        let rss_per_tab = (rss1 as f64 - rss0 as f64) / tabs;
        let pss_per_tab = (pss1 as f64 - pss0 as f64) / tabs;
        println!(
            "| {cells} | {} | {:.1} | {:.1} | {rss_per_tab:.1} | {pss_per_tab:.1} | {} |",
            grouped(tabs),
            rss0 as f64 / 1024.0,
            rss1 as f64 / 1024.0,
            ratio(rss_per_tab, floor.idle),
        );
        if target == Target::Floor {
            floor.idle = Some(rss_per_tab);
        }
    }
    Ok(())
}

async fn create(
    bench: &Bench,
    bin_dir: &std::path::Path,
    target: Target,
    floor: &mut FloorFigures,
) -> anyhow::Result<()> {
    for &count in &bench.create_callers {
        let measured = async {
            let running = start(target, bench, bin_dir).await?;
            let system = &running.system;
            let mut creators =
                Worker::callers(system, CallerKind::Create, &[], count, count.max(10)).await?;
            tokio::time::sleep(Duration::from_millis(500)).await;
            let (rss0, _) = system.memory()?;
            let (summary, cpu) = creators.batch(system, bench.create).await?;
            let (rss1, _) = system.memory()?;
            let per_session = (rss1 as f64 - rss0 as f64) / number(&summary, "calls").max(1.0);
            anyhow::Ok((summary, cpu, per_session))
        }
        .await;
        let (summary, cpu, per_session) = match measured {
            Ok(measured) => measured,
            Err(error) => {
                println!("| {} | {count} | failed: {error:#} |", target.cells());
                continue;
            }
        };
        let rate = number(&summary, "perSecond");
        let base = floor
            .create
            .iter()
            .find(|(clients, _, _)| *clients == count);
        println!(
            "| {} | {count} | {} | {} | {} | {cpu:.0} | {} | {per_session:.1} | {} | {} |",
            target.cells(),
            summary["errors"],
            grouped(rate),
            ratio(rate, base.map(|(_, rate, _)| *rate)),
            ratio(cpu, base.map(|(_, _, cpu)| *cpu)),
            grouped(number(&summary, "p50")),
            grouped(number(&summary, "p99")),
        );
        if target == Target::Floor {
            floor.create.push((count, rate, cpu));
        }
    }
    Ok(())
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
    async fn tabs(
        system: &System,
        transport: Transport,
        sessions: usize,
    ) -> anyhow::Result<(Self, Vec<String>)> {
        let mut args = vec![
            "tabs".to_owned(),
            "--base".to_owned(),
            system.base.clone(),
            "--transport".to_owned(),
            transport_name(transport).to_owned(),
            "--sessions".to_owned(),
            sessions.to_string(),
        ];
        if let Some(grpc) = &system.grpc {
            args.extend(["--grpc".to_owned(), grpc.clone()]);
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
