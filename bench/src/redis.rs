//! The bench's own Redis — one primary, a primary with a replica (with or without `WAIT`), or a
//! Cluster of three primaries — and what it costs: snapshots of each node's `INFO all`
//! (commands run, CPU, errors, memory) and of the relays' store operations (`/metrics`), and
//! the difference of two snapshots per call or per second, for all nodes and for each.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::ValueEnum;
use tokio::process::{Child, Command};

use crate::stats::grouped;

/// How the bench's Redis is laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Topology {
    /// One primary (`REDIS_URL`).
    Primary,
    /// One primary and a replica following it, no `WAIT`: what replication alone costs.
    Replicated,
    /// One primary and a replica, with `REDIS_WAIT_REPLICAS=1`: the queue and finish scripts
    /// wait for the replica's acknowledgement (`WAIT` pipelined in the same round trip).
    Wait,
    /// A Redis Cluster of three primaries (`REDIS_CLUSTER_URLS`), made with
    /// `redis-cli --cluster create`.
    Cluster,
}

impl Topology {
    /// The table's store cell.
    pub fn cell(self) -> &'static str {
        match self {
            Topology::Primary => "redis",
            Topology::Replicated => "redis + replica",
            Topology::Wait => "redis + replica, WAIT 1",
            Topology::Cluster => "redis cluster ×3",
        }
    }
}

/// The bench's Redis: its nodes, killed when dropped.
pub struct Redis {
    topology: Topology,
    nodes: Vec<Node>,
    /// Redis process CPU (s) of one `SET` in its own round trip, measured on the primary
    /// before the relays connect ([`Node::set_round_trip_cpu`]); `None` on a Cluster.
    set_round_trip: Option<f64>,
}

/// `SET`s timed for [`Node::set_round_trip_cpu`].
const SET_ROUND_TRIPS: usize = 20_000;

/// One `redis-server` on an ephemeral loopback port, with AOF on and fsync every second (as
/// deployed).
struct Node {
    /// What it is in the tables: `primary`, `replica`, `shard 1` …
    name: String,
    port: u16,
    process: Child,
    dir: PathBuf,
}

fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

impl Node {
    /// Starts a node with `extra` arguments (`--replicaof …`, the Cluster's); answers once it
    /// answers `INFO`.
    async fn start(name: String, extra: &[String]) -> anyhow::Result<Self> {
        let port = free_port()?;
        let dir = std::env::temp_dir().join(format!("toolrelay-bench-redis-{port}"));
        // A fresh directory: the AOF of an earlier run must not be loaded.
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)?;
        let process = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", ""])
            .args(["--appendonly", "yes", "--appendfsync", "everysec"])
            .args(["--maxmemory-policy", "noeviction"])
            // A replica is sent the data at once (Redis waits 5 s for more replicas otherwise).
            .args(["--repl-diskless-sync-delay", "0"])
            .arg("--dir")
            .arg(&dir)
            .args(extra)
            .stdout(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .context("cannot start redis-server: run scripts/setup.sh --test, which installs it")?;
        let node = Self {
            name,
            port,
            process,
            dir,
        };
        node.until("redis-server did not answer", |_| true).await?;
        Ok(node)
    }

    /// Waits (10 s at most) until its `INFO all` passes `ready`.
    async fn until(
        &self,
        failure: &str,
        ready: impl Fn(&BTreeMap<String, String>) -> bool,
    ) -> anyhow::Result<()> {
        let by = Instant::now() + Duration::from_secs(10);
        loop {
            match self.info().await {
                Ok(info) if ready(&info) => return Ok(()),
                _ if Instant::now() > by => bail!("{failure} (port {})", self.port),
                _ => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// What one `SET` in its own round trip costs this Redis's process in CPU (s): `INFO cpu`
    /// before and after `redis-benchmark -t set -c 1 -P 1` (one client, no pipelining), over
    /// [`SET_ROUND_TRIPS`] of them — the syscalls of a round trip, the AOF's share of a write:
    /// the unit the per-call figures are given in.
    async fn set_round_trip_cpu(&self) -> anyhow::Result<f64> {
        let before = Counters::parse(&self.info().await?);
        let output = Command::new("redis-benchmark")
            .args([
                "-p",
                &self.port.to_string(),
                "-t",
                "set",
                "-c",
                "1",
                "-P",
                "1",
                "-q",
            ])
            .args(["-n", &SET_ROUND_TRIPS.to_string()])
            .output()
            .await
            .context("cannot run redis-benchmark")?;
        if !output.status.success() {
            bail!("redis-benchmark failed");
        }
        let after = Counters::parse(&self.info().await?);
        let spent = after.since(&before);
        // INFO itself costs a little, and is counted twice: left in (it is well under 1 %).
        Ok(spent.cpu / SET_ROUND_TRIPS as f64)
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
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.process.start_kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Redis {
    pub async fn start(topology: Topology) -> anyhow::Result<Self> {
        let nodes = match topology {
            Topology::Primary => vec![Node::start("primary".to_owned(), &[]).await?],
            Topology::Replicated | Topology::Wait => {
                let primary = Node::start("primary".to_owned(), &[]).await?;
                let follow = [
                    "--replicaof".to_owned(),
                    "127.0.0.1".to_owned(),
                    primary.port.to_string(),
                ];
                let replica = Node::start("replica".to_owned(), &follow).await?;
                primary
                    .until("the replica did not come online", |info| {
                        info.get("slave0")
                            .is_some_and(|s| s.contains("state=online"))
                    })
                    .await?;
                vec![primary, replica]
            }
            Topology::Cluster => cluster().await?,
        };
        let set_round_trip = match topology {
            // A key's slot decides which shard answers: no one node's figure.
            Topology::Cluster => None,
            _ => Some(nodes[0].set_round_trip_cpu().await?),
        };
        Ok(Self {
            topology,
            nodes,
            set_round_trip,
        })
    }

    /// The relays' settings for this Redis.
    pub fn env(&self) -> Vec<(&'static str, String)> {
        let urls: Vec<String> = self.nodes.iter().map(Node::url).collect();
        match self.topology {
            Topology::Primary | Topology::Replicated => vec![("REDIS_URL", urls[0].clone())],
            Topology::Wait => vec![
                ("REDIS_URL", urls[0].clone()),
                ("REDIS_WAIT_REPLICAS", "1".to_owned()),
            ],
            Topology::Cluster => vec![("REDIS_CLUSTER_URLS", urls.join(","))],
        }
    }

    /// What Redis has done so far, and the store operations the relays at `metrics` (their
    /// `/metrics` URLs) have counted.
    pub async fn snapshot(&self, metrics: &[String]) -> anyhow::Result<Snapshot> {
        // The relays' page first and Redis second, and the reverse in the next snapshot
        // (`Snapshot::then`): what reading `/metrics` makes Redis do stays out of Redis's
        // figures, and only the second page's own operations (a few) into the relays'.
        let operations = store_operations(metrics).await?;
        let nodes = self.counters().await?;
        Ok(Snapshot::new(nodes, operations, self.set_round_trip))
    }

    /// [`Redis::snapshot`] in the other order, to close a window opened by it.
    pub async fn then(&self, metrics: &[String]) -> anyhow::Result<Snapshot> {
        let nodes = self.counters().await?;
        let operations = store_operations(metrics).await?;
        Ok(Snapshot::new(nodes, operations, self.set_round_trip))
    }

    async fn counters(&self) -> anyhow::Result<Vec<(String, Counters)>> {
        let mut nodes = Vec::with_capacity(self.nodes.len());
        for node in &self.nodes {
            nodes.push((node.name.clone(), Counters::parse(&node.info().await?)));
        }
        Ok(nodes)
    }
}

/// Three Cluster nodes (bus ports chosen, so none passes 65535 or collides), made a Cluster of
/// three primaries by `redis-cli --cluster create`, each with `cluster-require-full-coverage no`.
async fn cluster() -> anyhow::Result<Vec<Node>> {
    let mut nodes = Vec::new();
    for shard in 1..=3 {
        let bus = free_port()?;
        let settings = [
            "--cluster-enabled".to_owned(),
            "yes".to_owned(),
            "--cluster-config-file".to_owned(),
            "nodes.conf".to_owned(),
            "--cluster-port".to_owned(),
            bus.to_string(),
            "--cluster-require-full-coverage".to_owned(),
            "no".to_owned(),
            "--cluster-node-timeout".to_owned(),
            "2000".to_owned(),
        ];
        nodes.push(Node::start(format!("shard {shard}"), &settings).await?);
    }
    let addresses: Vec<String> = nodes
        .iter()
        .map(|node| format!("127.0.0.1:{}", node.port))
        .collect();
    let created = Command::new("redis-cli")
        .args(["--cluster", "create"])
        .args(&addresses)
        .args(["--cluster-replicas", "0", "--cluster-yes"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .await
        .context("cannot run redis-cli")?;
    if !created.status.success() {
        bail!(
            "redis-cli --cluster create failed: {}",
            String::from_utf8_lossy(&created.stderr)
        );
    }
    for node in &nodes {
        // `INFO all` has no Cluster state: ask `CLUSTER INFO`.
        let by = Instant::now() + Duration::from_secs(10);
        loop {
            let output = Command::new("redis-cli")
                .args(["-p", &node.port.to_string(), "CLUSTER", "INFO"])
                .output()
                .await?;
            let info = String::from_utf8_lossy(&output.stdout);
            if info.contains("cluster_state:ok") && info.contains("cluster_known_nodes:3") {
                break;
            }
            if Instant::now() > by {
                bail!("the Cluster did not come up: {info}");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    Ok(nodes)
}

/// The relays' store operations by `operation`: the sum of
/// `toolrelay_store_operation_duration_seconds_count{operation="…"}` over every relay.
///
/// This is what the bench calls **round trips**: each store operation is one request the
/// relay sends Redis and waits for (a script, a read, a pipeline); commands a script runs
/// inside Redis are not round trips, and neither are pub/sub messages Redis pushes. (On a
/// Cluster, a pipeline that spans shards is one operation but a request to each shard.)
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

/// One node's counters at one moment, or what they grew by between two.
#[derive(Debug, Clone, Default)]
pub struct Counters {
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
    /// `used_memory`, bytes (at the later snapshot, in a difference).
    used_memory: u64,
}

/// Commands the bench itself sends (its `INFO`s), left out of every count.
const OWN: &[&str] = &["info"];

impl Counters {
    fn parse(info: &BTreeMap<String, String>) -> Self {
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
        let mut counters = Self {
            cpu: number("used_cpu_sys") + number("used_cpu_user"),
            used_memory: number("used_memory") as u64,
            ..Self::default()
        };
        for (name, value) in info {
            if let Some(command) = name.strip_prefix("cmdstat_") {
                if OWN.contains(&command) {
                    continue;
                }
                counters
                    .commands
                    .insert(command.to_owned(), stat(value, "calls"));
                counters
                    .busy
                    .insert(command.to_owned(), stat(value, "usec"));
                let refused = stat(value, "failed_calls") + stat(value, "rejected_calls");
                if refused > 0 {
                    counters.failed.insert(command.to_owned(), refused);
                }
            } else if let Some(kind) = name.strip_prefix("errorstat_") {
                counters
                    .errors
                    .insert(kind.to_owned(), stat(value, "count"));
            }
        }
        counters
    }

    /// What grew between `before` and these counters.
    fn since(&self, before: &Counters) -> Counters {
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
        Counters {
            commands: delta(&self.commands, &before.commands),
            busy: delta(&self.busy, &before.busy),
            failed: delta(&self.failed, &before.failed),
            errors: delta(&self.errors, &before.errors),
            cpu: (self.cpu - before.cpu).max(0.0),
            used_memory: self.used_memory,
        }
    }

    /// These and `other` added up.
    fn plus(mut self, other: &Counters) -> Counters {
        for (mine, theirs) in [
            (&mut self.commands, &other.commands),
            (&mut self.busy, &other.busy),
            (&mut self.failed, &other.failed),
            (&mut self.errors, &other.errors),
        ] {
            for (name, n) in theirs {
                *mine.entry(name.clone()).or_insert(0) += n;
            }
        }
        self.cpu += other.cpu;
        self.used_memory += other.used_memory;
        self
    }

    /// Every command Redis ran, scripts' inner commands included (`EVALSHA` counts once, and
    /// so does each `redis.call` inside it).
    fn total(&self) -> u64 {
        self.commands.values().sum()
    }

    /// `INFO errorstats` and the failed calls of `INFO commandstats`, or `none`.
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

/// Every node's counters at one moment, and the relays' store operations.
#[derive(Debug, Clone)]
pub struct Snapshot {
    at: Instant,
    /// By node, in the order the bench started them.
    nodes: Vec<(String, Counters)>,
    /// The relays' store operations by operation.
    operations: BTreeMap<String, f64>,
    /// [`Redis::set_round_trip`].
    set_round_trip: Option<f64>,
}

impl Snapshot {
    fn new(
        nodes: Vec<(String, Counters)>,
        operations: BTreeMap<String, f64>,
        set_round_trip: Option<f64>,
    ) -> Self {
        Self {
            at: Instant::now(),
            nodes,
            operations,
            set_round_trip,
        }
    }

    /// What happened between `before` and this snapshot.
    pub fn since(&self, before: &Snapshot) -> Spent {
        Spent {
            seconds: self.at.duration_since(before.at).as_secs_f64(),
            nodes: self
                .nodes
                .iter()
                .zip(&before.nodes)
                .map(|((name, now), (_, then))| (name.clone(), now.since(then)))
                .collect(),
            operations: self
                .operations
                .iter()
                .map(|(name, n)| {
                    let then = before.operations.get(name).copied().unwrap_or(0.0);
                    (name.clone(), (n - then).max(0.0))
                })
                .filter(|(_, n)| *n > 0.0)
                .collect(),
            set_round_trip: self.set_round_trip,
        }
    }

    /// `used_memory` of each node, bytes.
    pub fn used_memory(&self) -> Vec<u64> {
        self.nodes.iter().map(|(_, n)| n.used_memory).collect()
    }
}

/// What Redis did between two snapshots.
#[derive(Debug, Clone)]
pub struct Spent {
    /// Wall time between the snapshots.
    pub seconds: f64,
    /// By node.
    nodes: Vec<(String, Counters)>,
    /// The relays' store operations (round trips) by operation.
    operations: BTreeMap<String, f64>,
    /// [`Redis::set_round_trip`].
    set_round_trip: Option<f64>,
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
    /// The relays' store operations, all of them.
    fn round_trips(&self) -> f64 {
        self.operations.values().sum()
    }

    /// The rows to print, each a node cell and its counters: one node alone; several, their
    /// sum (`all`) first and then each, so a Cluster's share of the work per shard shows. The
    /// relays' round trips belong to the `all` row only (`whole`).
    fn rows(&self) -> Vec<(String, Counters, bool)> {
        if let [(name, counters)] = self.nodes.as_slice() {
            return vec![(name.clone(), counters.clone(), true)];
        }
        let all = self
            .nodes
            .iter()
            .fold(Counters::default(), |sum, (_, n)| sum.plus(n));
        let mut rows = vec![("all".to_owned(), all, true)];
        rows.extend(
            self.nodes
                .iter()
                .map(|(name, counters)| (name.clone(), counters.clone(), false)),
        );
        rows
    }

    /// Per-call rows' cells, each: node, commands, round trips, Redis CPU µs, that as a multiple
    /// of one `SET` round trip's, Redis CPU % of a core, the calls/s a Redis core would carry
    /// at that cost, the top commands per call, the
    /// top µs in commands per call (a script's own including its commands), the round trips
    /// by operation per call, errors.
    pub fn per_call_rows(&self, calls: f64) -> Vec<String> {
        let calls = calls.max(1.0);
        self.rows()
            .into_iter()
            .map(|(node, counters, whole)| {
                let cpu_per_call = counters.cpu / calls;
                let (trips, by_operation) = if whole {
                    (
                        format!("{:.2}", self.round_trips() / calls),
                        top(self.operations.iter().map(|(k, v)| (k, *v)), calls, 2),
                    )
                } else {
                    ("–".to_owned(), "–".to_owned())
                };
                let in_sets = self
                    .set_round_trip
                    .filter(|set| *set > 0.0)
                    .map_or_else(
                        || "–".to_owned(),
                        |set| format!("{:.1} (of {:.0} µs)", cpu_per_call / set, set * 1e6),
                    );
                format!(
                    "{node} | {:.1} | {trips} | {:.1} | {in_sets} | {:.0} % | {} | {} | {} | {by_operation} | {}",
                    counters.total() as f64 / calls,
                    cpu_per_call * 1e6,
                    counters.cpu * 100.0 / self.seconds.max(1e-9),
                    grouped(1.0 / cpu_per_call.max(1e-9)),
                    top(counters.commands.iter().map(|(k, v)| (k, *v as f64)), calls, 2),
                    top(counters.busy.iter().map(|(k, v)| (k, *v as f64)), calls, 1),
                    counters.errors_cell(),
                )
            })
            .collect()
    }

    /// Idle rows' cells over `tabs` tabs, each: node, seconds, commands/s, per tab per second,
    /// Redis CPU ms/s, round trips/s, the top commands per second, errors; and the node's
    /// index (`None`: all nodes), for its memory.
    pub fn idle_rows(&self, tabs: usize) -> Vec<(Option<usize>, String)> {
        let seconds = self.seconds.max(1e-9);
        let several = self.nodes.len() > 1;
        self.rows()
            .into_iter()
            .enumerate()
            .map(|(i, (node, counters, whole))| {
                let rate = counters.total() as f64 / seconds;
                let (trips, by_operation) = if whole {
                    (
                        format!("{:.1}", self.round_trips() / seconds),
                        top(self.operations.iter().map(|(k, v)| (k, *v)), seconds, 1),
                    )
                } else {
                    ("–".to_owned(), "–".to_owned())
                };
                let index = match (several, i) {
                    (true, 0) => None,
                    (true, i) => Some(i - 1),
                    (false, _) => Some(0),
                };
                let cells = format!(
                    "{node} | {:.0} | {} | {:.4} | {:.1} | {trips} | {} | {by_operation} | {}",
                    self.seconds,
                    grouped(rate),
                    rate / tabs.max(1) as f64,
                    counters.cpu * 1e3 / seconds,
                    top(
                        counters.commands.iter().map(|(k, v)| (k, *v as f64)),
                        seconds,
                        1
                    ),
                    counters.errors_cell(),
                );
                (index, cells)
            })
            .collect()
    }
}
