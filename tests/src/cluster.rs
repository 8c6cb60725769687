//! Several replicas on one Redis, as real processes: N `toolrelay-relay`s and M
//! `toolrelay-gateway`s (gateway `i` in front of relay `i % N`, or of all of them), and a
//! `redis-server` with its
//! append-only file on. Every one of them can be killed (`SIGKILL`) or, for Redis, stopped
//! and started again, and a relay stopped (`SIGTERM`); dropping the cluster stops what is
//! left.

use std::net::SocketAddr;

use serde_json::{Value, json};
use tokio::process::Child;
use toolrelay_gateway::config::{ENV_LISTEN, ENV_RELAY_URL};
use toolrelay_relay::config::{
    ENV_GATEWAY_SECRET, ENV_GRPC_LISTEN, ENV_REDIS_URL, ENV_REPLICA_URL, ENV_WS_LISTEN,
};

use crate::redis::RedisServer;
use crate::system::{Answer, Logs, send, spawn_logged, until_serving};

/// One replica's process.
struct Replica {
    child: Option<Child>,
}

impl Replica {
    async fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill().await.unwrap();
        }
    }

    /// The process id, while it runs (a restarted process would have another).
    fn running(&mut self) -> Option<u32> {
        let child = self.child.as_mut()?;
        match child.try_wait() {
            Ok(None) => child.id(),
            _ => None,
        }
    }
}

/// The relays, gateways and Redis.
pub struct Cluster {
    /// The Redis all of them share (on a Redis Cluster, its first node).
    pub redis: RedisServer,
    /// The other nodes of a Redis Cluster, or the other servers of a group, kept running.
    pub more_redis: Vec<RedisServer>,
    /// Each relay's browser WebSocket address.
    pub relay_websockets: Vec<SocketAddr>,
    /// Each gateway's `http://127.0.0.1:port`.
    pub gateways: Vec<String>,
    /// What each relay logged.
    pub relay_logs: Vec<Logs>,
    /// What the gateways logged.
    pub gateway_logs: Logs,
    relays: Vec<Replica>,
    gateway_processes: Vec<Replica>,
    http: reqwest::Client,
    _one_at_a_time: tokio::sync::OwnedMutexGuard<()>,
}

/// Clusters of one test binary start one at a time: each is five processes, and on a
/// 2-core machine several at once would measure the machine, not the code.
static RUNNING: std::sync::LazyLock<std::sync::Arc<tokio::sync::Mutex<()>>> =
    std::sync::LazyLock::new(Default::default);

impl Cluster {
    /// `relays` relays and `gateways` gateways on a Redis with AOF, gateway `i` in front of
    /// relay `i % relays`; `env` goes to every process.
    pub async fn start(relays: usize, gateways: usize, env: &[(&str, &str)]) -> Self {
        Self::start_with(relays, gateways, env, false).await
    }

    /// Like [`Cluster::start`], with every gateway in front of every relay (`RELAY_URL` lists
    /// them all).
    pub async fn balanced(relays: usize, gateways: usize, env: &[(&str, &str)]) -> Self {
        Self::start_with(relays, gateways, env, true).await
    }

    async fn start_with(
        relays: usize,
        gateways: usize,
        env: &[(&str, &str)],
        balanced: bool,
    ) -> Self {
        let one_at_a_time = std::sync::Arc::clone(&RUNNING).lock_owned().await;
        let redis = RedisServer::durable().await;
        let url = redis.url();
        let mut all = vec![(ENV_REDIS_URL, url.as_str())];
        all.extend_from_slice(env);
        Self::launch(
            redis,
            Vec::new(),
            relays,
            gateways,
            &all,
            balanced,
            one_at_a_time,
        )
        .await
    }

    /// `relays` relays and `gateways` gateways, every gateway in front of every relay, on the
    /// Redis `redis` (with `more`: a Redis Cluster's other nodes, say), reached as `env` says
    /// (it names the Redis: `REDIS_URL`, the Sentinels or the Cluster, with any user and
    /// certificates); `env` goes to every process.
    pub async fn on(
        redis: RedisServer,
        more: Vec<RedisServer>,
        relays: usize,
        gateways: usize,
        env: &[(&str, &str)],
    ) -> Self {
        let one_at_a_time = std::sync::Arc::clone(&RUNNING).lock_owned().await;
        Self::launch(redis, more, relays, gateways, env, true, one_at_a_time).await
    }

    #[allow(clippy::too_many_arguments)] // the private constructor behind the public ones
    async fn launch(
        redis: RedisServer,
        more_redis: Vec<RedisServer>,
        relays: usize,
        gateways: usize,
        env: &[(&str, &str)],
        balanced: bool,
        one_at_a_time: tokio::sync::OwnedMutexGuard<()>,
    ) -> Self {
        let gateway_logs = Logs::default();
        let mut relay_logs = Vec::new();
        let mut relay_processes = Vec::new();
        let mut relay_websockets = Vec::new();
        let mut relay_grpc = Vec::new();
        for _ in 0..relays {
            let mut all = vec![
                (ENV_GRPC_LISTEN, "127.0.0.1:0"),
                (ENV_WS_LISTEN, "127.0.0.1:0"),
                (ENV_GATEWAY_SECRET, crate::GATEWAY_SECRET),
            ];
            // Port 0: the port its gRPC listener binds.
            if crate::test_routed() {
                all.push((ENV_REPLICA_URL, "http://127.0.0.1:0"));
            }
            all.extend_from_slice(env);
            let logs = Logs::default();
            let (child, line) = spawn_logged(
                "toolrelay-relay",
                &all,
                "toolrelay-relay listening",
                logs.clone(),
            )
            .await;
            relay_logs.push(logs);
            relay_grpc.push(format!("http://{}", line["grpc"].as_str().unwrap()));
            relay_websockets.push(line["websocket"].as_str().unwrap().parse().unwrap());
            relay_processes.push(Replica { child: Some(child) });
        }
        let mut gateway_processes = Vec::new();
        let mut gateway_bases = Vec::new();
        for index in 0..gateways {
            let relay_url = if balanced {
                relay_grpc.join(",")
            } else {
                relay_grpc[index % relays].clone()
            };
            let mut all = vec![
                (ENV_LISTEN, "127.0.0.1:0"),
                (ENV_RELAY_URL, relay_url.as_str()),
                (ENV_GATEWAY_SECRET, crate::GATEWAY_SECRET),
            ];
            all.extend_from_slice(env);
            let (child, line) = spawn_logged(
                "toolrelay-gateway",
                &all,
                "toolrelay-gateway listening",
                gateway_logs.clone(),
            )
            .await;
            gateway_bases.push(format!("http://{}", line["listen"].as_str().unwrap()));
            gateway_processes.push(Replica { child: Some(child) });
        }
        for (relay, process) in relay_websockets.iter().zip(&mut relay_processes) {
            let process = process.child.as_mut().expect("started above");
            until_serving(&format!("http://{relay}/readyz"), process).await;
        }
        for (gateway, process) in gateway_bases.iter().zip(&mut gateway_processes) {
            let process = process.child.as_mut().expect("started above");
            until_serving(&format!("{gateway}/readyz"), process).await;
        }
        Self {
            redis,
            more_redis,
            relay_websockets,
            gateways: gateway_bases,
            relay_logs,
            gateway_logs,
            relays: relay_processes,
            gateway_processes,
            http: reqwest::Client::builder()
                .timeout(std::time::Duration::from_secs(60))
                .build()
                .unwrap(),
            _one_at_a_time: one_at_a_time,
        }
    }

    /// The tab WebSocket URL of a session on relay `relay`.
    pub fn tab_url(&self, relay: usize, code: &str, token: &str) -> String {
        format!(
            "ws://{}/api/sessions/{code}/ws?token={token}",
            self.relay_websockets[relay]
        )
    }

    /// `GET path` on gateway `gateway`.
    pub fn get(&self, gateway: usize, path: &str) -> impl Future<Output = Answer> + use<> {
        send(self.http.get(format!("{}{path}", self.gateways[gateway])))
    }

    /// `POST path` with a JSON body on gateway `gateway`.
    pub fn post(
        &self,
        gateway: usize,
        path: &str,
        body: Value,
    ) -> impl Future<Output = Answer> + use<> {
        send(
            self.http
                .post(format!("{}{path}", self.gateways[gateway]))
                .json(&body),
        )
    }

    /// A new session, made through gateway `gateway`: its code and provider token.
    pub async fn create_session(&self, gateway: usize) -> (String, String) {
        let created = self
            .post(gateway, "/api/sessions", serde_json::json!({}))
            .await;
        assert_eq!(created.status.as_u16(), 201, "{created:?}");
        (
            created.body["code"].as_str().unwrap().to_owned(),
            created.body["providerToken"].as_str().unwrap().to_owned(),
        )
    }

    /// Waits (with a deadline) until gateway `gateway` sees the session `code`'s tab connected
    /// and lists its demo tools: attached and registered, through any replica.
    pub async fn until_tab_registered(&self, gateway: usize, code: &str) {
        crate::wait_until(crate::PATIENCE, async || {
            // The tab attaches before it registers its tools: wait for both.
            let session = self.get(gateway, &format!("/api/sessions/{code}")).await;
            let tools = self
                .get(gateway, &format!("/api/sessions/{code}/metadata"))
                .await;
            if session.body["providerConnected"] == true && tools.body["tools"][0]["id"] == "demo" {
                Ok(())
            } else {
                Err(format!("the tab never showed up: {session:?} {tools:?}"))
            }
        })
        .await;
    }

    /// Kills relay `index` with `SIGKILL`.
    pub async fn kill_relay(&mut self, index: usize) {
        self.relays[index].kill().await;
    }

    /// Sends relay `index` `SIGTERM` (how Kubernetes stops a pod in a rolling restart).
    pub async fn terminate_relay(&mut self, index: usize) {
        let child = self.relays[index].child.as_ref().expect("the relay runs");
        crate::system::terminate(child).await;
    }

    /// Waits (with a deadline) for relay `index` to exit.
    pub async fn relay_exited(&mut self, index: usize) -> std::process::ExitStatus {
        let child = self.relays[index].child.as_mut().expect("the relay runs");
        crate::system::exited(child).await
    }

    /// The process ids of the relays and gateways not killed, `None` for one that has exited:
    /// the same list before and after an event means no process stopped or restarted.
    pub fn processes(&mut self) -> Vec<Option<u32>> {
        self.relays
            .iter_mut()
            .chain(self.gateway_processes.iter_mut())
            .map(Replica::running)
            .collect()
    }

    /// Kills gateway `index` with `SIGKILL`.
    pub async fn kill_gateway(&mut self, index: usize) {
        self.gateway_processes[index].kill().await;
    }
}

/// The body of a call of the demo tab's `echo` of `text` with the requestId `id`.
pub fn echo(id: &str, text: &str) -> Value {
    json!({"requestId": id, "functionName": "echo", "args": {"text": text}, "timeoutMs": 30_000})
}
