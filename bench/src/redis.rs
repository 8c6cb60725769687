//! The bench's own `redis-server`, and what it costs: snapshots of `INFO all` (commands run,
//! CPU, errors, memory) and of the relays' store operations (`/metrics`), and the difference
//! of two snapshots per call or per second.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use tokio::process::{Child, Command};

use crate::stats::grouped;

/// A `redis-server` of the bench's own on an ephemeral loopback port, with AOF on and fsync
/// every second (as deployed); killed when dropped.
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
        // A fresh directory: the AOF of an earlier run must not be loaded.
        let _ = std::fs::remove_dir_all(&dir);
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
        while redis.info().await.is_err() {
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

    /// `INFO all` as `field → value` (`cmdstat_evalsha → calls=…,usec=…`, `used_memory → …`).
    async fn info(&self) -> anyhow::Result<BTreeMap<String, String>> {
        let output = Command::new("redis-cli")
            .args(["-p", &self.port.to_string(), "INFO", "all"])
            .output()
            .await
            .context("cannot run redis-cli")?;
        if !output.status.success() {
            bail!("redis-cli INFO failed");
        }
        let text = String::from_utf8_lossy(&output.stdout);
        if !text.contains("redis_version:") {
            bail!("redis-cli INFO said {text}");
        }
        Ok(text
            .lines()
            .filter_map(|line| {
                let (name, value) = line.trim().split_once(':')?;
                Some((name.to_owned(), value.to_owned()))
            })
            .collect())
    }

    /// What Redis has done so far, and the store operations the relays at `metrics` (their
    /// `/metrics` URLs) have counted.
    pub async fn snapshot(&self, metrics: &[String]) -> anyhow::Result<Snapshot> {
        // The relays' page first and Redis second, and the reverse in the next snapshot
        // (`Snapshot::then`): what reading `/metrics` makes Redis do stays out of Redis's
        // figures, and only the second page's own operations (a few) into the relays'.
        let operations = store_operations(metrics).await?;
        let info = self.info().await?;
        Ok(Snapshot::parse(&info, operations))
    }

    /// [`Redis::snapshot`] in the other order, to close a window opened by it.
    pub async fn then(&self, metrics: &[String]) -> anyhow::Result<Snapshot> {
        let info = self.info().await?;
        let operations = store_operations(metrics).await?;
        Ok(Snapshot::parse(&info, operations))
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The relays' store operations by `operation`: the sum of
/// `toolrelay_store_operation_duration_seconds_count{operation="…"}` over every relay.
///
/// This is what the bench calls **round trips**: each store operation is one request the
/// relay sends Redis and waits for (a script, a read, a pipeline); commands a script runs
/// inside Redis are not round trips, and neither are pub/sub messages Redis pushes.
async fn store_operations(metrics: &[String]) -> anyhow::Result<BTreeMap<String, f64>> {
    let http = reqwest::Client::new();
    let mut operations = BTreeMap::new();
    for url in metrics {
        let page = http
            .get(url)
            .timeout(Duration::from_secs(30))
            .send()
            .await
            .with_context(|| format!("GET {url}"))?
            .error_for_status()?
            .text()
            .await?;
        for line in page.lines() {
            let Some(rest) = line.strip_prefix("toolrelay_store_operation_duration_seconds_count")
            else {
                continue;
            };
            let Some((labels, count)) = rest.rsplit_once(' ') else {
                continue;
            };
            let operation = labels
                .split_once("operation=\"")
                .and_then(|(_, rest)| rest.split_once('"'))
                .map_or("?", |(name, _)| name);
            *operations.entry(operation.to_owned()).or_insert(0.0) +=
                count.parse::<f64>().unwrap_or(0.0);
        }
    }
    Ok(operations)
}

/// Redis's counters at one moment, and the relays' store operations.
#[derive(Debug, Clone)]
pub struct Snapshot {
    at: Instant,
    /// Calls per command (`cmdstat_*`), the commands scripts run inside included.
    commands: BTreeMap<String, u64>,
    /// µs spent per command (`usec`: a script's includes the commands it runs).
    busy: BTreeMap<String, u64>,
    /// Failed or rejected calls per command.
    failed: BTreeMap<String, u64>,
    /// Errors by kind (`errorstat_*`: `NOSCRIPT`, `ERR`, …).
    errors: BTreeMap<String, u64>,
    /// `used_cpu_sys` + `used_cpu_user`, seconds.
    cpu: f64,
    /// `used_memory`, bytes.
    pub used_memory: u64,
    /// The relays' store operations by operation.
    operations: BTreeMap<String, f64>,
}

/// Commands the bench itself sends (its `INFO`s), left out of every count.
const OWN: &[&str] = &["info"];

impl Snapshot {
    fn parse(info: &BTreeMap<String, String>, operations: BTreeMap<String, f64>) -> Self {
        let stat = |value: &str, key: &str| -> u64 {
            value
                .split(',')
                .find_map(|field| field.strip_prefix(key)?.strip_prefix('='))
                .and_then(|n| n.parse().ok())
                .unwrap_or(0)
        };
        let number = |name: &str| -> f64 {
            info.get(name)
                .and_then(|value| value.parse().ok())
                .unwrap_or(0.0)
        };
        let mut commands = BTreeMap::new();
        let mut busy = BTreeMap::new();
        let mut failed = BTreeMap::new();
        let mut errors = BTreeMap::new();
        for (name, value) in info {
            if let Some(command) = name.strip_prefix("cmdstat_") {
                if OWN.contains(&command) {
                    continue;
                }
                commands.insert(command.to_owned(), stat(value, "calls"));
                busy.insert(command.to_owned(), stat(value, "usec"));
                let refused = stat(value, "failed_calls") + stat(value, "rejected_calls");
                if refused > 0 {
                    failed.insert(command.to_owned(), refused);
                }
            } else if let Some(kind) = name.strip_prefix("errorstat_") {
                errors.insert(kind.to_owned(), stat(value, "count"));
            }
        }
        Self {
            at: Instant::now(),
            commands,
            busy,
            failed,
            errors,
            cpu: number("used_cpu_sys") + number("used_cpu_user"),
            used_memory: number("used_memory") as u64,
            operations,
        }
    }

    /// What happened between `before` and this snapshot.
    pub fn since(&self, before: &Snapshot) -> Spent {
        let delta = |now: &BTreeMap<String, u64>, then: &BTreeMap<String, u64>| {
            now.iter()
                .map(|(name, n)| {
                    (
                        name.clone(),
                        n - then.get(name).copied().unwrap_or(0).min(*n),
                    )
                })
                .filter(|(_, n)| *n > 0)
                .collect::<BTreeMap<_, _>>()
        };
        Spent {
            seconds: self.at.duration_since(before.at).as_secs_f64(),
            commands: delta(&self.commands, &before.commands),
            busy: delta(&self.busy, &before.busy),
            failed: delta(&self.failed, &before.failed),
            errors: delta(&self.errors, &before.errors),
            cpu: (self.cpu - before.cpu).max(0.0),
            operations: self
                .operations
                .iter()
                .map(|(name, n)| {
                    let then = before.operations.get(name).copied().unwrap_or(0.0);
                    (name.clone(), (n - then).max(0.0))
                })
                .filter(|(_, n)| *n > 0.0)
                .collect(),
        }
    }
}

/// What Redis did between two snapshots.
#[derive(Debug, Clone)]
pub struct Spent {
    /// Wall time between the snapshots.
    pub seconds: f64,
    commands: BTreeMap<String, u64>,
    /// µs spent per command (a script's includes the commands it runs).
    busy: BTreeMap<String, u64>,
    failed: BTreeMap<String, u64>,
    errors: BTreeMap<String, u64>,
    /// Redis CPU time, seconds.
    cpu: f64,
    /// The relays' store operations (round trips) by operation.
    operations: BTreeMap<String, f64>,
}

/// How many commands (or operations) the "top" cells name.
const TOP: usize = 5;

/// The largest counts, as `name count÷per`, most first.
fn top<'a>(counts: impl Iterator<Item = (&'a String, f64)>, per: f64, decimals: usize) -> String {
    let mut ranked: Vec<(&String, f64)> = counts.collect();
    ranked.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(b.0)));
    let cells: Vec<String> = ranked
        .iter()
        .take(TOP)
        .map(|(name, n)| format!("{name} {:.decimals$}", n / per))
        .collect();
    if cells.is_empty() {
        "–".to_owned()
    } else {
        cells.join(", ")
    }
}

impl Spent {
    /// Every command Redis ran, scripts' inner commands included (`EVALSHA` counts once, and
    /// so does each `redis.call` inside it).
    pub fn commands(&self) -> u64 {
        self.commands.values().sum()
    }

    /// The relays' store operations, all of them.
    fn round_trips(&self) -> f64 {
        self.operations.values().sum()
    }

    /// The cells of a per-call row: commands, round trips, Redis CPU µs, Redis CPU % of a
    /// core, the calls/s a Redis core would carry at that cost, the top commands per call, the
    /// top µs in commands per call (a script's own including its commands), the
    /// round trips by operation per call, errors.
    pub fn per_call_cells(&self, calls: f64) -> String {
        let calls = calls.max(1.0);
        let cpu_per_call = self.cpu / calls;
        format!(
            "{:.1} | {:.2} | {:.1} | {:.0} % | {} | {} | {} | {} | {}",
            self.commands() as f64 / calls,
            self.round_trips() / calls,
            cpu_per_call * 1e6,
            self.cpu * 100.0 / self.seconds.max(1e-9),
            grouped(1.0 / cpu_per_call.max(1e-9)),
            top(self.commands.iter().map(|(k, v)| (k, *v as f64)), calls, 2),
            top(self.busy.iter().map(|(k, v)| (k, *v as f64)), calls, 1),
            top(self.operations.iter().map(|(k, v)| (k, *v)), calls, 2),
            self.errors_cell(),
        )
    }

    /// The cells of an idle row over `tabs` tabs: seconds, commands/s, per tab per second,
    /// Redis CPU ms/s, round trips/s, the top commands per second, errors.
    pub fn idle_cells(&self, tabs: usize) -> String {
        let seconds = self.seconds.max(1e-9);
        let rate = self.commands() as f64 / seconds;
        format!(
            "{:.0} | {} | {:.4} | {:.1} | {:.1} | {} | {} | {}",
            self.seconds,
            grouped(rate),
            rate / tabs.max(1) as f64,
            self.cpu * 1e3 / seconds,
            self.round_trips() / seconds,
            top(
                self.commands.iter().map(|(k, v)| (k, *v as f64)),
                seconds,
                1
            ),
            top(self.operations.iter().map(|(k, v)| (k, *v)), seconds, 1),
            self.errors_cell(),
        )
    }

    /// `INFO errorstats` and the failed calls of `INFO commandstats` in the window, or `none`.
    fn errors_cell(&self) -> String {
        let mut cells: Vec<String> = self
            .errors
            .iter()
            .map(|(kind, n)| format!("{kind} {n}"))
            .collect();
        cells.extend(
            self.failed
                .iter()
                .map(|(command, n)| format!("{command} failed {n}")),
        );
        if cells.is_empty() {
            "none".to_owned()
        } else {
            cells.join(", ")
        }
    }
}
