//! A `redis-server` of the test's own, on an ephemeral loopback port: started by the test,
//! stopped (and restarted, for outage tests) by it, and killed when dropped.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use tokio::process::{Child, Command};
use tokio::time::timeout;

use crate::{PATIENCE, free_port, wait_until};

/// How long one try to reach a starting redis-server may take.
const ATTEMPT: Duration = Duration::from_secs(1);
/// What redis-server logs to, in its directory.
const LOG_FILE: &str = "redis.log";

/// A running `redis-server`.
pub struct RedisServer {
    port: u16,
    /// The Cluster bus port, when it is a Cluster node.
    bus_port: u16,
    dir: PathBuf,
    durable: bool,
    cluster: bool,
    options: RedisOptions,
    child: Option<Child>,
}

/// How a test Redis is set up beyond a plain throwaway one.
#[derive(Clone, Debug, Default)]
pub struct RedisOptions {
    /// TLS only (no plain port), with `server.pem` of these certificates' directory
    /// ([`crate::certs::TestCertificates`]); clients must show a certificate its CA signed.
    pub tls: Option<PathBuf>,
    /// ACL users, each the words after `--user` (the default user is turned off when set).
    pub users: Vec<Vec<String>>,
    /// The user and password the test itself connects as (to ping, inspect, fill).
    pub admin: Option<(String, String)>,
    /// The primary it replicates, by port (with the same TLS and admin user).
    pub replica_of: Option<u16>,
}

impl RedisServer {
    /// A throwaway Redis: nothing written to disk.
    pub async fn start() -> Self {
        Self::launch(false, false).await
    }

    /// A throwaway Redis set up as `options` say.
    pub async fn with(options: RedisOptions) -> Self {
        Self::launch_with(false, false, options).await
    }

    /// A Redis with the append-only file on (`appendfsync always`), so a restart keeps
    /// everything written before it.
    pub async fn durable() -> Self {
        Self::launch(true, false).await
    }

    /// A throwaway Redis Cluster node that owns every slot: it serves every key as a plain
    /// Redis does, but refuses a script that touches keys of two slots (Redis applies its
    /// Cluster rules to scripts that declare a `#!lua` line), so a store that strays out of a
    /// session's slot fails on it.
    pub async fn cluster_node() -> Self {
        let server = Self::launch(false, true).await;
        let mut connection = server.connection().await.unwrap();
        let () = redis::cmd("CLUSTER")
            .arg("ADDSLOTSRANGE")
            .arg(0)
            .arg(16383)
            .query_async(&mut connection)
            .await
            .unwrap();
        wait_until(PATIENCE, async || {
            let info: String = redis::cmd("CLUSTER")
                .arg("INFO")
                .query_async(&mut connection)
                .await
                .unwrap();
            if info.contains("cluster_state:ok") {
                Ok(())
            } else {
                Err(format!("the cluster node did not come up: {info}"))
            }
        })
        .await;
        server
    }

    /// A throwaway Redis that is not running yet: its port is chosen and nothing listens on
    /// it, so a replica can be started against a Redis that is away;
    /// [`RedisServer::restart`] starts it.
    pub fn away() -> Self {
        Self::unstarted(false, false, RedisOptions::default())
    }

    async fn launch(durable: bool, cluster: bool) -> Self {
        Self::launch_with(durable, cluster, RedisOptions::default()).await
    }

    async fn launch_with(durable: bool, cluster: bool, options: RedisOptions) -> Self {
        // A port found free may be taken before redis-server binds it (another test's server
        // or connection): a server that exits as it starts is started again on other ports.
        for _ in 0..5 {
            let mut server = Self::unstarted(durable, cluster, options.clone());
            server.spawn();
            if server.answered_or_exited().await {
                return server;
            }
        }
        panic!("redis-server exited as it started, on five free ports in a row");
    }

    /// Waits (with a deadline) until the server answers (`true`) or its process has exited
    /// (`false`).
    async fn answered_or_exited(&mut self) -> bool {
        let deadline = tokio::time::Instant::now() + PATIENCE;
        loop {
            // Answered by this process, not by another server holding the port. Each try is
            // short: another test's listener that took the port may never answer at all.
            let answered = timeout(ATTEMPT, self.process_id()).await;
            if let Some(pid) = self.child.as_ref().and_then(Child::id)
                && answered.ok().flatten() == Some(pid)
            {
                return true;
            }
            let exited = self
                .child
                .as_mut()
                .is_none_or(|child| !matches!(child.try_wait(), Ok(None)));
            if exited {
                return false;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "redis-server on port {} did not answer; its log ends:\n{}",
                self.port,
                self.log_tail()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    fn unstarted(durable: bool, cluster: bool, options: RedisOptions) -> Self {
        let port = free_port();
        let dir =
            std::env::temp_dir().join(format!("toolrelay-redis-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        Self {
            port,
            bus_port: free_port(),
            dir,
            durable,
            cluster,
            options,
            child: None,
        }
    }

    /// Starts the process on its port and waits (with a deadline) until it answers.
    async fn run(&mut self) {
        self.spawn();
        wait_until(PATIENCE, async || {
            match timeout(ATTEMPT, self.ping()).await {
                Ok(Ok(())) => Ok(()),
                _ => Err(format!(
                    "redis-server on port {} did not answer; its log ends:\n{}",
                    self.port,
                    self.log_tail()
                )),
            }
        })
        .await;
    }

    /// The last lines redis-server logged, for a message saying why it did not answer.
    fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.dir.join(LOG_FILE)).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(12)..].join("\n")
    }

    /// Starts the process on its port.
    fn spawn(&mut self) {
        let mut command = Command::new("redis-server");
        let port = self.port.to_string();
        match &self.options.tls {
            None => command.args(["--port", &port]),
            Some(dir) => command
                .args(["--port", "0", "--tls-port", &port])
                .arg("--tls-cert-file")
                .arg(dir.join("server.pem"))
                .arg("--tls-key-file")
                .arg(dir.join("server.key"))
                .arg("--tls-ca-cert-file")
                .arg(dir.join("ca.pem"))
                .args(["--tls-auth-clients", "yes", "--tls-replication", "yes"]),
        };
        if !self.options.users.is_empty() {
            command.args(["--user", "default", "off"]);
            for user in &self.options.users {
                command.arg("--user").args(user);
            }
        }
        if let Some(primary) = self.options.replica_of {
            command.args(["--replicaof", "127.0.0.1", &primary.to_string()]);
            if let Some((user, password)) = &self.options.admin {
                command.args(["--masteruser", user, "--masterauth", password]);
            }
        }
        command
            .args(["--bind", "127.0.0.1"])
            .args(["--save", "", "--daemonize", "no", "--protected-mode", "yes"])
            .args(["--maxmemory-policy", "noeviction"])
            // A replica is sent the data at once (Redis waits 5 s for more replicas otherwise).
            .args(["--repl-diskless-sync-delay", "0"])
            .arg("--dir")
            .arg(&self.dir)
            // Kept with its files (its stdout is not), for a message when it does not answer.
            .arg("--logfile")
            .arg(self.dir.join(LOG_FILE));
        if self.durable {
            command.args(["--appendonly", "yes", "--appendfsync", "always"]);
        } else {
            command.args(["--appendonly", "no"]);
        }
        if self.cluster && self.options.tls.is_some() {
            // The Cluster bus over TLS too, and the clients told the TLS port.
            command.args(["--tls-cluster", "yes"]);
        }
        if self.cluster {
            // The bus port is chosen too: the default (port + 10000) can pass 65535 or collide.
            command
                .args(["--cluster-enabled", "yes", "--cluster-config-file"])
                .arg(self.dir.join("nodes.conf"))
                .args(["--cluster-port", &self.bus_port.to_string()])
                .args(["--cluster-require-full-coverage", "no"])
                .args(["--cluster-node-timeout", "2000"]);
        }
        let child = command
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|error| {
                panic!("redis-server cannot start ({error}): run scripts/setup.sh --test (scripts/test.sh does), which installs Debian's redis-server")
            });
        self.child = Some(child);
    }

    /// `redis://127.0.0.1:<port>` (`rediss://` with TLS), with no user or password.
    pub fn url(&self) -> String {
        let scheme = if self.options.tls.is_some() {
            "rediss"
        } else {
            "redis"
        };
        format!("{scheme}://127.0.0.1:{}", self.port)
    }

    /// Its port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// A connection as the test's own user (the admin user, the CA and client certificate
    /// when it has them).
    pub async fn connection(&self) -> redis::RedisResult<redis::aio::MultiplexedConnection> {
        toolrelay_relay::store::redis::install_tls_provider();
        let mut info = redis::IntoConnectionInfo::into_connection_info(self.url())?;
        if let Some((user, password)) = &self.options.admin {
            let settings = info
                .redis_settings()
                .clone()
                .set_username(user)
                .set_password(password);
            info = info.set_redis_settings(settings);
        }
        let client = match &self.options.tls {
            None => redis::Client::open(info)?,
            Some(dir) => redis::Client::build_with_tls(
                info,
                redis::TlsCertificates {
                    client_tls: Some(redis::ClientTlsConfig {
                        client_cert: std::fs::read(dir.join("server.pem"))?,
                        client_key: std::fs::read(dir.join("server.key"))?,
                    }),
                    root_cert: Some(std::fs::read(dir.join("ca.pem"))?),
                },
            )?,
        };
        client.get_multiplexed_async_connection().await
    }

    /// The process id the server at its port reports, if one answers.
    async fn process_id(&self) -> Option<u32> {
        let mut connection = self.connection().await.ok()?;
        let info: String = redis::cmd("INFO")
            .arg("server")
            .query_async(&mut connection)
            .await
            .ok()?;
        info.lines()
            .find_map(|line| line.strip_prefix("process_id:"))
            .and_then(|pid| pid.trim().parse().ok())
    }

    async fn ping(&self) -> redis::RedisResult<()> {
        let mut connection = self.connection().await?;
        redis::cmd("PING").query_async(&mut connection).await
    }

    /// As a Cluster node: the port of the primary holding `key`'s slot.
    pub async fn primary_port_of(&self, key: &str) -> u16 {
        let mut connection = self.connection().await.unwrap();
        let slot: u16 = redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(key)
            .query_async(&mut connection)
            .await
            .unwrap();
        let ranges: Vec<(u16, u16, (String, u16))> = {
            let ranges: Vec<redis::Value> = redis::cmd("CLUSTER")
                .arg("SLOTS")
                .query_async(&mut connection)
                .await
                .unwrap();
            ranges
                .into_iter()
                .map(|range| {
                    let redis::Value::Array(items) = range else {
                        panic!("CLUSTER SLOTS answered {range:?}")
                    };
                    let mut items = items.into_iter();
                    let mut next = || items.next().unwrap();
                    let from = redis::from_redis_value(next()).unwrap();
                    let to = redis::from_redis_value(next()).unwrap();
                    let primary: Vec<redis::Value> = redis::from_redis_value(next()).unwrap();
                    let mut primary = primary.into_iter();
                    let host = redis::from_redis_value(primary.next().unwrap()).unwrap();
                    let port = redis::from_redis_value(primary.next().unwrap()).unwrap();
                    (from, to, (host, port))
                })
                .collect()
        };
        ranges
            .into_iter()
            .find(|(from, to, _)| (*from..=*to).contains(&slot))
            .map(|(_, _, (_, port))| port)
            .unwrap_or_else(|| panic!("no node holds the slot of {key}"))
    }

    /// Replicas that are in sync with it (`INFO replication`'s replicas `state=online`).
    pub async fn replicas_online(&self) -> usize {
        let Ok(mut connection) = self.connection().await else {
            return 0;
        };
        let info: String = redis::cmd("INFO")
            .arg("replication")
            .query_async(&mut connection)
            .await
            .unwrap_or_default();
        info.lines()
            .filter(|line| line.starts_with("slave") && line.contains("state=online"))
            .count()
    }

    /// What it holds in memory now (`INFO memory`'s `used_memory`, bytes).
    pub async fn used_memory(&self) -> u64 {
        let mut connection = self.connection().await.unwrap();
        let info: String = redis::cmd("INFO")
            .arg("memory")
            .query_async(&mut connection)
            .await
            .unwrap();
        info.lines()
            .find_map(|line| line.strip_prefix("used_memory:"))
            .and_then(|bytes| bytes.trim().parse().ok())
            .expect("INFO memory gives used_memory")
    }

    /// What its keys hold in memory now: `MEMORY USAGE … SAMPLES 0` of every key, summed (the
    /// key, its value whole, its tables' slots and Redis's bookkeeping of it; bytes). Unlike
    /// `used_memory`, it holds nothing of the clients': Redis 7.0 counts a client's buffers
    /// (`mem_clients_normal`) only from time to time, so for a while they show as data, ~180 KB
    /// of them moved a slope over 400 calls by ~400 bytes a call.
    pub async fn keys_memory(&self) -> u64 {
        let mut connection = self.connection().await.unwrap();
        let mut keys = Vec::new();
        let mut cursor = 0u64;
        loop {
            let (next, batch): (u64, Vec<String>) = redis::cmd("SCAN")
                .arg(cursor)
                .arg("COUNT")
                .arg(1000)
                .query_async(&mut connection)
                .await
                .unwrap();
            keys.extend(batch);
            if next == 0 {
                break;
            }
            cursor = next;
        }
        let mut total = 0;
        for key in keys {
            // A key gone since the scan has no usage.
            let used: Option<u64> = redis::cmd("MEMORY")
                .arg("USAGE")
                .arg(&key)
                .arg("SAMPLES")
                .arg(0)
                .query_async(&mut connection)
                .await
                .unwrap();
            total += used.unwrap_or(0);
        }
        total
    }

    /// `CONFIG SET name value`.
    pub async fn config_set(&self, name: &str, value: &str) {
        let mut connection = self.connection().await.unwrap();
        let () = redis::cmd("CONFIG")
            .arg("SET")
            .arg(name)
            .arg(value)
            .query_async(&mut connection)
            .await
            .unwrap();
    }

    /// Fills it as sessions would: a `maxmemory` a little above what it holds, then filler
    /// keys written until Redis refuses one with `OOM` (it runs with `noeviction`). The limit
    /// then goes a little below what it holds, so that buffers freed later (the filler's
    /// connection's) leave no room for another write.
    pub async fn fill(&self) {
        let room = self.used_memory().await + 2 * 1024 * 1024;
        self.config_set("maxmemory", &room.to_string()).await;
        let mut connection = self.connection().await.unwrap();
        let filler = "x".repeat(64 * 1024);
        for key in 0..1000 {
            let written: redis::RedisResult<()> = redis::cmd("SET")
                .arg(format!("filler:{key}"))
                .arg(&filler)
                .query_async(&mut connection)
                .await;
            match written {
                Ok(()) => {}
                Err(error) if error.code() == Some("OOM") => {
                    drop(connection);
                    let full = self.used_memory().await - 512 * 1024;
                    self.config_set("maxmemory", &full.to_string()).await;
                    return;
                }
                Err(error) => panic!("filling Redis failed otherwise: {error}"),
            }
        }
        panic!("Redis took 64 MB of filler over a maxmemory of {room} bytes");
    }

    /// Commands it has run since it started, the commands that scripts run counted one by
    /// one (`INFO commandstats`' calls, summed; the `INFO` asking for it included).
    pub async fn commands_run(&self) -> u64 {
        self.command_calls()
            .await
            .into_iter()
            .map(|(_, calls)| calls)
            .sum()
    }

    /// Scripts it has run since it started (`INFO commandstats`' `EVALSHA` calls).
    pub async fn scripts_run(&self) -> u64 {
        self.calls_of("evalsha").await
    }

    /// How often it ran `command` (lower case; those its scripts ran included) since it started.
    pub async fn calls_of(&self, command: &str) -> u64 {
        let mut calls = self.command_calls().await.into_iter();
        calls
            .find_map(|(name, calls)| (name == command).then_some(calls))
            .unwrap_or(0)
    }

    /// `INFO commandstats` as `(command, calls)`.
    async fn command_calls(&self) -> Vec<(String, u64)> {
        let mut connection = self.connection().await.unwrap();
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query_async(&mut connection)
            .await
            .unwrap();
        info.lines()
            .filter_map(|line| {
                let (command, stats) = line.strip_prefix("cmdstat_")?.split_once(':')?;
                let calls = stats
                    .strip_prefix("calls=")?
                    .split(',')
                    .next()?
                    .parse()
                    .ok()?;
                Some((command.to_owned(), calls))
            })
            .collect()
    }

    /// Stops it (SIGKILL: what a crash or a pulled plug does).
    pub async fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill().await;
        }
    }

    /// Freezes it (`SIGSTOP`): connections stay open and nothing is answered, as when Redis
    /// stalls; [`RedisServer::resume`] lets it go on where it stopped.
    pub async fn pause(&self) {
        self.signal("-STOP").await;
    }

    /// Lets a paused Redis go on (`SIGCONT`).
    pub async fn resume(&self) {
        self.signal("-CONT").await;
    }

    async fn signal(&self, signal: &str) {
        let pid = self
            .child
            .as_ref()
            .and_then(Child::id)
            .expect("redis-server runs");
        let status = Command::new("kill")
            .args([signal, &pid.to_string()])
            .status()
            .await
            .unwrap();
        assert!(status.success(), "kill {signal} {pid} failed");
    }

    /// Starts it again on the same port (and, when durable, from its append-only file).
    pub async fn restart(&mut self) {
        self.stop().await;
        self.run().await;
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        if let Some(child) = self.child.as_mut() {
            let _ = child.start_kill();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A Redis Cluster of three primaries (no replicas) on ephemeral loopback ports, made with
/// `redis-cli --cluster create`, each node with `cluster-require-full-coverage no` (a shard
/// that is down costs only its own slots) and a 2 s node timeout.
pub struct RedisCluster {
    /// Its nodes; node `i` holds the `i`th third of the slots.
    pub nodes: Vec<RedisServer>,
}

impl RedisCluster {
    /// Starts three nodes and makes them a Cluster.
    pub async fn start() -> Self {
        Self::with(RedisOptions::default()).await
    }

    /// [`RedisCluster::start`], each node set up as `options` say (ACL users, say).
    pub async fn with(options: RedisOptions) -> Self {
        let mut nodes = Vec::new();
        for _ in 0..3 {
            nodes.push(RedisServer::launch_with(false, true, options.clone()).await);
        }
        let mut login = Vec::new();
        if let Some((user, password)) = &options.admin {
            login = vec![
                "--user".to_owned(),
                user.clone(),
                "--pass".to_owned(),
                password.clone(),
            ];
        }
        if let Some(dir) = &options.tls {
            let file = |name: &str| dir.join(name).to_str().unwrap().to_owned();
            login.extend([
                "--tls".to_owned(),
                "--cacert".to_owned(),
                file("ca.pem"),
                "--cert".to_owned(),
                file("server.pem"),
                "--key".to_owned(),
                file("server.key"),
            ]);
        }
        let addresses: Vec<String> = nodes
            .iter()
            .map(|node| format!("127.0.0.1:{}", node.port))
            .collect();
        let created = Command::new("redis-cli")
            .args(&login)
            .args(["--cluster", "create"])
            .args(&addresses)
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .output()
            .await
            .unwrap_or_else(|error| {
                panic!("redis-cli cannot run ({error}): run scripts/setup.sh --test")
            });
        assert!(
            created.status.success(),
            "redis-cli --cluster create failed: {}",
            String::from_utf8_lossy(&created.stderr)
        );
        let cluster = Self { nodes };
        for node in &cluster.nodes {
            wait_until(PATIENCE, async || {
                let mut connection = node.connection().await.map_err(|error| error.to_string())?;
                let info: String = redis::cmd("CLUSTER")
                    .arg("INFO")
                    .query_async(&mut connection)
                    .await
                    .map_err(|error| error.to_string())?;
                if info.contains("cluster_state:ok") && info.contains("cluster_known_nodes:3") {
                    Ok(())
                } else {
                    Err(format!("the cluster did not come up: {info}"))
                }
            })
            .await;
        }
        cluster
    }

    /// The seed nodes, as `REDIS_CLUSTER_URLS` takes them.
    pub fn urls(&self) -> String {
        self.nodes
            .iter()
            .map(RedisServer::url)
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The node holding `key`'s slot.
    pub async fn node_of(&self, key: &str) -> usize {
        let port = self.nodes[0].primary_port_of(key).await;
        self.nodes
            .iter()
            .position(|node| node.port == port)
            .unwrap()
    }
}

/// A Redis Sentinel (`redis-server <conf> --sentinel`) on an ephemeral loopback port,
/// watching the primary on `primary` under the name `master`, with short timeouts (down after
/// 1 s), killed when dropped.
pub struct RedisSentinel {
    port: u16,
    dir: PathBuf,
    child: Child,
}

impl RedisSentinel {
    /// Starts one; `quorum` Sentinels must agree that the primary is down. A primary is down
    /// after 2 s without an answer: with 1 s, a CI machine under load once had the Sentinels
    /// judge the newly promoted primary down and fail back to the old one, restarted empty.
    pub async fn start(master: &str, primary: u16, quorum: u32) -> Self {
        let port = free_port();
        let dir =
            std::env::temp_dir().join(format!("toolrelay-sentinel-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let config = dir.join("sentinel.conf");
        std::fs::write(
            &config,
            format!(
                "port {port}\nbind 127.0.0.1\ndir {dir}\nsentinel monitor {master} 127.0.0.1 {primary} {quorum}\nsentinel down-after-milliseconds {master} 2000\nsentinel failover-timeout {master} 5000\nsentinel parallel-syncs {master} 1\n",
                dir = dir.display()
            ),
        )
        .unwrap();
        let child = Command::new("redis-server")
            .arg(&config)
            .arg("--sentinel")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|error| {
                panic!(
                    "redis-server --sentinel cannot start ({error}): run scripts/setup.sh --test"
                )
            });
        let sentinel = Self { port, dir, child };
        wait_until(PATIENCE, async || {
            sentinel.primary(master).await.map(|_| ()).ok_or(format!(
                "the Sentinel on port {port} does not know {master}"
            ))
        })
        .await;
        sentinel
    }

    /// `127.0.0.1:<port>`.
    pub fn address(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// How many replicas and other Sentinels it knows for `master`, when it answers.
    pub async fn peers(&self, master: &str) -> Option<(u32, u32)> {
        let client = redis::Client::open(format!("redis://{}", self.address())).ok()?;
        let mut connection = client.get_multiplexed_async_connection().await.ok()?;
        let fields: Vec<String> = redis::cmd("SENTINEL")
            .arg("master")
            .arg(master)
            .query_async(&mut connection)
            .await
            .ok()?;
        let field = |name: &str| {
            let at = fields.iter().position(|field| field == name)?;
            fields.get(at + 1)?.parse().ok()
        };
        Some((field("num-slaves")?, field("num-other-sentinels")?))
    }

    /// The port of the primary it names for `master`, when it answers.
    pub async fn primary(&self, master: &str) -> Option<u16> {
        let client = redis::Client::open(format!("redis://{}", self.address())).ok()?;
        let mut connection = client.get_multiplexed_async_connection().await.ok()?;
        let (_, port): (String, u16) = redis::cmd("SENTINEL")
            .arg("get-master-addr-by-name")
            .arg(master)
            .query_async(&mut connection)
            .await
            .ok()?;
        Some(port)
    }
}

impl Drop for RedisSentinel {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
