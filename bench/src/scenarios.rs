//! The scenarios: sequential latency, closed-loop throughput, idle tabs, session creation.
//! Each prints its rows as it measures them; Redis's own figures (per call, or per second
//! while idle) go into a second table printed after the first ([`Seen::redis_rows`]).

use std::path::Path;
use std::time::Duration;

use serde_json::Value;

use crate::callers::CallerKind;
use crate::redis::{Redis, Spent};
use crate::stats::{grouped, number, ratio};
use crate::system::{Logs, Mode, System, Target};
use crate::tabs::Transport;
use crate::{Bench, Worker, caller_name, transport_name};

/// What the current scenario has measured so far: the floor's and the memory mode's figures,
/// for the ratios of the rows after them, and the rows of the Redis table.
#[derive(Debug, Default)]
pub struct Seen {
    floor_latency: Option<Value>,
    floor_throughput: Vec<(usize, Value, f64)>,
    floor_idle: Option<f64>,
    floor_create: Vec<(usize, f64, f64)>,
    /// p50 of the memory mode by deployment (one tab, one caller).
    memory_p50: Vec<(Mode, f64)>,
    /// calls/s of the memory mode by deployment and callers.
    memory_rate: Vec<(Mode, usize, f64)>,
    /// Rows of the Redis table, printed after the scenario's own.
    pub redis_rows: Vec<String>,
}

/// The target running, with its Redis (dropped after it).
pub struct Running {
    pub system: System,
    redis: Option<Redis>,
}

/// Starts the target, with a fresh `redis-server` of its own for the Redis store.
pub async fn start(target: Target, bench: &Bench, dirs: &Dirs) -> anyhow::Result<Running> {
    let redis = match target {
        Target::Toolrelay {
            redis: Some(topology),
            ..
        } => Some(Redis::start(topology).await?),
        _ => None,
    };
    let mut env = redis.as_ref().map(Redis::env).unwrap_or_default();
    if redis.is_some() && bench.route == crate::RouteChoice::Routed {
        // Port 0: each relay's own gRPC port, as its listener bound it.
        env.push(("REPLICA_URL", "http://127.0.0.1:0".to_owned()));
    }
    let logs = Logs {
        call_line: !bench.no_call_log,
    };
    let system = System::start(target, &dirs.bin, &dirs.floor, &env, logs).await?;
    Ok(Running { system, redis })
}

/// What every run starts from: where toolrelay's binaries are (`--bin-dir`) and the floor
/// (next to the bench, so that every build is measured against the same floor), and what
/// the idle tabs register.
pub struct Dirs {
    pub bin: std::path::PathBuf,
    pub floor: std::path::PathBuf,
    /// The manifest the idle tabs register (`None`: `echo`).
    pub idle_manifest: Option<std::path::PathBuf>,
}

/// Whether the floor can stand in for toolrelay here.
fn supports(target: Target, transport: Transport, caller: CallerKind) -> bool {
    target != Target::Floor
        || (transport == Transport::Ws && matches!(caller, CallerKind::Http | CallerKind::Create))
}

fn mode_of(target: Target) -> Option<(Mode, bool)> {
    match target {
        Target::Toolrelay { mode, redis, .. } => Some((mode, redis.is_some())),
        Target::Floor => None,
    }
}

/// The header of the Redis table of the latency and throughput scenarios: with several Redis
/// nodes, a row for all of them and one for each (`node`).
pub const REDIS_PER_CALL: &str = "| relay | mode | store | tab | caller | callers | calls | node | Redis commands / call | round trips / call | Redis CPU µs / call | × a `SET` round trip (its CPU) | Redis CPU, % of a core | calls/s a Redis core carries | top commands / call | top µs in commands / call (a script's own included) | round trips by operation / call | Redis errors |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|";

/// The header of the Redis table of the idle scenario.
pub const REDIS_IDLE: &str = "| relay | mode | store | tab | tabs | node | window s | Redis commands / s | per tab per s | Redis CPU ms / s | round trips / s | top commands / s | round trips by operation / s | Redis errors | relay CPU ms / s | used_memory before (MB) | after (MB) | KB / session |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|";

/// `calls` calls by `callers`; their summary, the relay's CPU µs per call, and what Redis did
/// meanwhile (with the Redis store).
async fn measured(
    running: &Running,
    callers: &mut Worker,
    calls: usize,
) -> anyhow::Result<(Value, f64, Option<Spent>)> {
    let metrics = &running.system.metrics;
    let before = match &running.redis {
        Some(redis) => Some(redis.snapshot(metrics).await?),
        None => None,
    };
    let (summary, cpu) = callers.batch(&running.system, calls).await?;
    let spent = match (&running.redis, before) {
        (Some(redis), Some(before)) => Some(redis.then(metrics).await?.since(&before)),
        _ => None,
    };
    Ok((summary, cpu, spent))
}

pub async fn latency(
    bench: &Bench,
    dirs: &Dirs,
    target: Target,
    seen: &mut Seen,
) -> anyhow::Result<()> {
    let running = start(target, bench, dirs).await?;
    let system = &running.system;
    for &transport in &bench.transport {
        for &caller in &bench.caller {
            if !supports(target, transport, caller) || caller == CallerKind::Create {
                continue;
            }
            let row = async {
                let (_tabs, sessions) = Worker::tabs(system, transport, 1, None).await?;
                let mut callers =
                    Worker::callers(system, caller, &sessions, 1, bench.warmup).await?;
                measured(&running, &mut callers, bench.calls).await
            }
            .await;
            let cells = format!(
                "{} | {} | {}",
                target.cells(),
                transport_name(transport),
                caller_name(caller)
            );
            let (summary, cpu, spent) = match row {
                Ok(row) => row,
                Err(error) => {
                    println!("| {cells} | failed: {error:#} |");
                    continue;
                }
            };
            let base = seen.floor_latency.as_ref();
            let q = |name: &str| grouped(number(&summary, name));
            let p50 = number(&summary, "p50");
            let memory = mode_of(target).and_then(|(mode, _)| {
                seen.memory_p50
                    .iter()
                    .find(|(m, _)| *m == mode)
                    .map(|(_, p50)| *p50)
            });
            println!(
                "| {cells} | {} | {} | {} | {} | {} | {} | {:.0} | {} | {} | {} |",
                q("p50"),
                q("p90"),
                q("p99"),
                q("p999"),
                q("max"),
                grouped(number(&summary, "perSecond")),
                cpu,
                ratio(p50, base.map(|b| number(b, "p50"))),
                ratio(number(&summary, "p99"), base.map(|b| number(b, "p99"))),
                ratio(p50, memory),
            );
            if number(&summary, "errors") > 0.0 {
                println!("| {cells} | {} calls failed |", summary["errors"]);
            }
            if let Some(spent) = spent {
                let calls = number(&summary, "calls");
                for row in spent.per_call_rows(calls) {
                    seen.redis_rows
                        .push(format!("| {cells} | 1 | {} | {row} |", grouped(calls)));
                }
            }
            match mode_of(target) {
                None => seen.floor_latency = Some(summary),
                Some((mode, false)) => seen.memory_p50.push((mode, p50)),
                Some((_, true)) => {}
            }
        }
    }
    Ok(())
}

pub async fn throughput(
    bench: &Bench,
    dirs: &Dirs,
    target: Target,
    seen: &mut Seen,
) -> anyhow::Result<()> {
    let running = start(target, bench, dirs).await?;
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
            let tabs = Worker::tabs(system, transport, bench.sessions, None).await;
            let (_tabs, sessions) = match tabs {
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
                    measured(&running, &mut callers, bench.throughput_calls).await
                }
                .await;
                let (summary, cpu, spent) = match run {
                    Ok(run) => run,
                    Err(error) => {
                        println!("| {cells} | {count} | failed: {error:#} |");
                        continue;
                    }
                };
                let base = seen
                    .floor_throughput
                    .iter()
                    .find(|(callers, _, _)| *callers == count);
                let rate = number(&summary, "perSecond");
                let memory = mode_of(target).and_then(|(mode, _)| {
                    seen.memory_rate
                        .iter()
                        .find(|(m, c, _)| *m == mode && *c == count)
                        .map(|(_, _, rate)| *rate)
                });
                println!(
                    "| {cells} | {count} | {} | {} | {} | {} | {:.0} | {} | {} | {} | {} | {} |",
                    summary["errors"],
                    grouped(rate),
                    ratio(rate, base.map(|(_, b, _)| number(b, "perSecond"))),
                    ratio(rate, memory),
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
                if let Some(spent) = spent {
                    let calls = number(&summary, "calls");
                    for row in spent.per_call_rows(calls) {
                        seen.redis_rows.push(format!(
                            "| {cells} | {count} | {} | {row} |",
                            grouped(calls)
                        ));
                    }
                }
                match mode_of(target) {
                    None => seen.floor_throughput.push((count, summary, cpu)),
                    Some((mode, false)) => seen.memory_rate.push((mode, count, rate)),
                    Some((_, true)) => {}
                }
            }
        }
    }
    Ok(())
}

/// What an idle run measured.
struct Idle {
    /// The relay's RSS and PSS (KB) before the tabs and with them.
    rss: ((u64, u64), (u64, u64)),
    /// With Redis: what it did over the quiet window, the relay's CPU ms/s meanwhile, and
    /// each node's `used_memory` before the sessions and with them.
    redis: Option<(Spent, f64, Vec<u64>, Vec<u64>)>,
}

pub async fn idle(
    bench: &Bench,
    dirs: &Dirs,
    target: Target,
    seen: &mut Seen,
) -> anyhow::Result<()> {
    for &transport in &bench.transport {
        if !matches!(transport, Transport::Ws | Transport::Sse | Transport::Grpc)
            || !supports(target, transport, CallerKind::Http)
        {
            continue;
        }
        let cells = format!("{} | {}", target.cells(), transport_name(transport));
        let measured = async {
            // A fresh relay and a fresh Redis for each run.
            let running = start(target, bench, dirs).await?;
            let system = &running.system;
            // A settled baseline: what the relay (and Redis) hold before any session.
            tokio::time::sleep(Duration::from_secs(1)).await;
            let before = system.memory()?;
            let redis_before = match &running.redis {
                Some(redis) => Some(redis.snapshot(&system.metrics).await?),
                None => None,
            };
            let manifest = dirs.idle_manifest.as_deref();
            let (tabs, _) = Worker::tabs(system, transport, bench.tabs, manifest).await?;
            tokio::time::sleep(Duration::from_secs(2)).await;
            let after = system.memory()?;
            let redis = match (&running.redis, redis_before) {
                (Some(redis), Some(empty)) => {
                    Some(quiet_window(redis, system, &empty, bench.idle_window).await?)
                }
                _ => None,
            };
            drop(tabs);
            anyhow::Ok(Idle {
                rss: (before, after),
                redis,
            })
        }
        .await;
        let Idle {
            rss: ((rss0, pss0), (rss1, pss1)),
            redis,
        } = match measured {
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
            ratio(rss_per_tab, seen.floor_idle),
        );
        if let Some((spent, relay_cpu, empty, full)) = redis {
            let mb = |bytes: u64| bytes as f64 / (1024.0 * 1024.0);
            for (node, row) in spent.idle_rows(bench.tabs) {
                // The node's memory, or all nodes' (`None`).
                let memory = |all: &[u64]| match node {
                    Some(i) => all.get(i).copied().unwrap_or(0),
                    None => all.iter().sum(),
                };
                let (empty, full) = (memory(&empty), memory(&full));
                seen.redis_rows.push(format!(
                    "| {cells} | {} | {row} | {relay_cpu:.1} | {:.1} | {:.1} | {:.2} |",
                    grouped(tabs),
                    mb(empty),
                    mb(full),
                    (full as f64 - empty as f64) / 1024.0 / tabs,
                ));
            }
        }
        if target == Target::Floor {
            seen.floor_idle = Some(rss_per_tab);
        }
    }
    Ok(())
}

/// Redis over a quiet window of `seconds` with the tabs attached and nobody calling: what it
/// did, the relay's CPU ms/s meanwhile, `used_memory` before the sessions (`empty`) and with
/// them (at the window's start).
async fn quiet_window(
    redis: &Redis,
    system: &System,
    empty: &crate::redis::Snapshot,
    seconds: u64,
) -> anyhow::Result<(Spent, f64, Vec<u64>, Vec<u64>)> {
    let start = redis.snapshot(&system.metrics).await?;
    let cpu = system.cpu()?;
    tokio::time::sleep(Duration::from_secs(seconds)).await;
    let end = redis.then(&system.metrics).await?;
    let relay_cpu = system.cpu()?.saturating_sub(cpu);
    let spent = end.since(&start);
    let relay_ms_per_second = relay_cpu.as_secs_f64() * 1e3 / spent.seconds.max(1e-9);
    Ok((
        spent,
        relay_ms_per_second,
        empty.used_memory(),
        start.used_memory(),
    ))
}

pub async fn create(
    bench: &Bench,
    dirs: &Dirs,
    target: Target,
    seen: &mut Seen,
) -> anyhow::Result<()> {
    for &count in &bench.create_callers {
        let measured = async {
            let running = start(target, bench, dirs).await?;
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
        let base = seen
            .floor_create
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
            seen.floor_create.push((count, rate, cpu));
        }
    }
    Ok(())
}

/// The CODAP plugin's manifest as the plugin registers it, written to a file for the tabs
/// processes: built by `bench/codap-manifest.mjs` from the plugin's own modules (Node.js).
pub fn codap_manifest() -> anyhow::Result<(std::path::PathBuf, usize)> {
    use anyhow::Context;
    let bench_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let script = bench_dir.join("codap-manifest.mjs");
    let root = bench_dir.parent().context("the bench has no workspace")?;
    let output = std::process::Command::new("node")
        .arg(&script)
        .arg(root)
        .output()
        .context("cannot run node (the CODAP manifest is built by bench/codap-manifest.mjs; --idle-manifest echo needs no node)")?;
    if !output.status.success() {
        anyhow::bail!(
            "{} failed: {}",
            script.display(),
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let path = std::env::temp_dir().join(format!(
        "toolrelay-bench-codap-manifest-{}.json",
        std::process::id()
    ));
    std::fs::write(&path, &output.stdout)?;
    Ok((path, output.stdout.len()))
}
