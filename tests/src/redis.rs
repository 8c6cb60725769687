//! A `redis-server` of the test's own, on an ephemeral loopback port: started by the test,
//! stopped (and restarted, for outage tests) by it, and killed when dropped.

use std::path::PathBuf;
use std::process::Stdio;

use tokio::process::{Child, Command};

use crate::{PATIENCE, free_port, wait_until};

/// A running `redis-server`.
pub struct RedisServer {
    port: u16,
    dir: PathBuf,
    durable: bool,
    cluster: bool,
    child: Option<Child>,
}

impl RedisServer {
    /// A throwaway Redis: nothing written to disk.
    pub async fn start() -> Self {
        Self::launch(false, false).await
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
        Self::unstarted(false, false)
    }

    async fn launch(durable: bool, cluster: bool) -> Self {
        let mut server = Self::unstarted(durable, cluster);
        server.run().await;
        server
    }

    fn unstarted(durable: bool, cluster: bool) -> Self {
        let port = free_port();
        let dir =
            std::env::temp_dir().join(format!("toolrelay-redis-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        Self {
            port,
            dir,
            durable,
            cluster,
            child: None,
        }
    }

    async fn run(&mut self) {
        let mut command = Command::new("redis-server");
        command
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--daemonize", "no", "--protected-mode", "yes"])
            .args(["--maxmemory-policy", "noeviction"])
            .arg("--dir")
            .arg(&self.dir);
        if self.durable {
            command.args(["--appendonly", "yes", "--appendfsync", "always"]);
        } else {
            command.args(["--appendonly", "no"]);
        }
        if self.cluster {
            command
                .args(["--cluster-enabled", "yes", "--cluster-config-file"])
                .arg(self.dir.join("nodes.conf"));
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
        wait_until(PATIENCE, async || {
            let pinged = self.ping().await;
            pinged.map_err(|_| format!("redis-server on port {} did not answer", self.port))
        })
        .await;
    }

    /// `redis://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    async fn connection(&self) -> redis::RedisResult<redis::aio::MultiplexedConnection> {
        redis::Client::open(self.url())?
            .get_multiplexed_async_connection()
            .await
    }

    async fn ping(&self) -> redis::RedisResult<()> {
        let mut connection = self.connection().await?;
        redis::cmd("PING").query_async(&mut connection).await
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
            .unwrap()
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
        let mut connection = self.connection().await.unwrap();
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query_async(&mut connection)
            .await
            .unwrap();
        info.lines()
            .filter_map(|line| {
                line.split_once("calls=")?
                    .1
                    .split(',')
                    .next()?
                    .parse::<u64>()
                    .ok()
            })
            .sum()
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
