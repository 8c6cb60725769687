//! The way to Redis: clients built from the settings (TLS with a CA and a client certificate,
//! an ACL user and its password), the command connection, and, with Sentinel, the primary
//! followed through failovers.
//!
//! * **Start.** [`Link::connect`] waits (retrying, and saying so in the log) while Redis is
//!   unreachable, so a replica started before its Redis comes up does not crash-loop; what
//!   waiting cannot mend — a refused password, a missing permission, a certificate not
//!   trusted, a URL that is not one — ends the start with a message naming the variable.
//! * **Commands** go through [`Connection`], a `ConnectionManager` that is retried once on a
//!   connection found dropped (after a Redis restart the first command on each idle
//!   connection meets the dead socket; it was never carried out, and the manager has a fresh
//!   connection for the retry).
//! * **Sentinel.** A watcher asks the Sentinels for the primary every [`FOLLOW`]; when they
//!   name another one it connects there, swaps the command connection, counts a failover and
//!   tells the event hub to reconnect ([`Link::primary_changed`]). While the old primary is
//!   gone and no new one is named, commands fail (the store is unreachable, `/readyz` red).
//! * **Cluster.** The `redis` crate's cluster client routes each command to the shard that
//!   holds its slot and follows the cluster's own failovers; it speaks RESP3, so that the
//!   event hub can take sharded pub/sub (`SSUBSCRIBE`) messages from it. A pipeline whose
//!   commands fall in several slots is sent as its commands, all at once.

use std::sync::{Arc, RwLock};
use std::time::Duration;

use futures::FutureExt;
use futures::future::BoxFuture;
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use redis::sentinel::{SentinelClient, SentinelClientBuilder, SentinelServerType};
use redis::{
    Client, ConnectionAddr, ErrorKind, IntoConnectionInfo, ProtocolVersion, PushInfo, RedisError,
    ServerErrorKind, TlsCertificates, TlsMode,
};
use tokio::sync::{mpsc, watch};

use super::RESPONSE_TIMEOUT;
use crate::config::{
    ENV_REDIS_CA_FILE, ENV_REDIS_CLIENT_CERT_FILE, ENV_REDIS_CLUSTER_URLS, ENV_REDIS_PASSWORD_FILE,
    ENV_REDIS_SENTINEL_PASSWORD_FILE, ENV_REDIS_SENTINELS, ENV_REDIS_URL, ENV_REDIS_USERNAME,
    ENV_REDIS_WAIT_REPLICAS, RedisSettings, Topology,
};
use crate::error::StoreError;
use crate::metrics::Metrics;

/// How often a replica on Sentinel asks which primary to use.
const FOLLOW: Duration = Duration::from_secs(1);

/// The way to Redis: one primary (named, or found through the Sentinels), or a Cluster.
pub(super) struct Link {
    way: Way,
    /// Bumped when the primary changes; the event hub reconnects on it.
    changed: watch::Sender<u64>,
    metrics: Metrics,
}

enum Way {
    Primary(Box<Primaries>),
    Cluster(Shards),
}

/// A Redis Cluster: one connection that routes each command to its shard, and the sharded
/// pub/sub messages it receives (taken by the event hub).
struct Shards {
    connection: ClusterConnection,
    pushes: std::sync::Mutex<Option<mpsc::UnboundedReceiver<PushInfo>>>,
}

/// The connection to the current primary, and how to find the next one.
struct Primaries {
    current: RwLock<Primary>,
    /// How many connections writes that wait for replicas get (0 without `WAIT`).
    waiting: usize,
    /// The next of them to use.
    next_waiting: std::sync::atomic::AtomicUsize,
    /// The Sentinels, when the primary is found through them.
    sentinels: Option<Sentinels>,
}

/// One primary: its address (for the log and the metrics), a client for new connections
/// (the event hub's), the shared command connection, and the connections for writes that
/// wait for replicas.
#[derive(Clone)]
struct Primary {
    address: String,
    client: Client,
    commands: ConnectionManager,
    /// `WAIT` holds up every later command of its connection until the replicas confirm (or
    /// its time runs out, while a replica is missing): writes that wait get connections of
    /// their own, so that nothing else queues behind them. Empty without `WAIT`.
    waiting: Arc<[ConnectionManager]>,
}

/// Connections for writes that wait for replicas, per process.
const WAITING_CONNECTIONS: usize = 8;

/// The command connection: cheap to clone. To one primary it is retried once on a
/// connection found dropped; to a Cluster, the cluster client retries as it sees fit.
#[derive(Clone)]
pub(super) enum Connection {
    Primary(ConnectionManager),
    Cluster(ClusterConnection),
}

impl Link {
    /// Connects as `settings` say, waiting while Redis cannot be reached; what waiting cannot
    /// mend is an error naming the variable to fix.
    pub(super) async fn connect(
        settings: &RedisSettings,
        metrics: Metrics,
    ) -> Result<Arc<Self>, StoreError> {
        install_tls_provider();
        let (mut sentinel, sentinels) = match &settings.topology {
            Topology::Primary(_) => (None, None),
            Topology::Sentinel { sentinels, master } => {
                let (client, each) = sentinel_client(settings, sentinels, master)?;
                (Some(client), Some(each))
            }
            Topology::Cluster(seeds) => {
                return Self::connect_cluster(settings, seeds, metrics).await;
            }
        };
        let waiting = if settings.wait.is_some() {
            WAITING_CONNECTIONS
        } else {
            0
        };
        let mut delay = Duration::from_millis(200);
        let primary = loop {
            let attempt = match (&settings.topology, sentinel.as_mut()) {
                (Topology::Primary(url), _) => match client(url, settings) {
                    Ok(client) => Primary::connect(client, waiting).await,
                    Err(error) => return Err(error),
                },
                (_, Some(sentinel)) => match sentinel.async_get_client().await {
                    Ok(client) => Primary::connect(client, waiting).await,
                    Err(error) => Err(error),
                },
                (_, None) => unreachable!("a Sentinel topology has its client"),
            };
            match attempt {
                Ok(primary) => break primary,
                Err(error) => {
                    if let Some(fatal) = fatal(&error, settings) {
                        return Err(fatal);
                    }
                    tracing::warn!(%error, retry_in_ms = delay.as_millis() as u64, "Redis is not reachable yet; retrying");
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_secs(5));
                }
            }
        };
        tracing::info!(primary = %primary.address, "connected to Redis");
        metrics.redis_primary(&primary.address);
        let following = sentinels.is_some();
        let link = Arc::new(Self {
            way: Way::Primary(Box::new(Primaries {
                current: RwLock::new(primary),
                waiting,
                next_waiting: std::sync::atomic::AtomicUsize::new(0),
                sentinels,
            })),
            changed: watch::channel(0).0,
            metrics,
        });
        if following {
            tokio::spawn(follow(Arc::downgrade(&link)));
        }
        Ok(link)
    }

    /// Connects to the Cluster the `seeds` belong to, waiting while none answers.
    async fn connect_cluster(
        settings: &RedisSettings,
        seeds: &[String],
        metrics: Metrics,
    ) -> Result<Arc<Self>, StoreError> {
        if settings.wait.is_some() {
            return Err(StoreError(format!(
                "{ENV_REDIS_WAIT_REPLICAS} is for one primary or Sentinel: a Cluster's shards replicate on their own; unset it, or unset {ENV_REDIS_CLUSTER_URLS}"
            )));
        }
        let mut tls = false;
        let mut nodes = Vec::new();
        for seed in seeds {
            let info = seed.as_str().into_connection_info().map_err(|error| {
                StoreError(format!("{ENV_REDIS_CLUSTER_URLS}: {seed:?} is not a Redis URL ({error}); give redis://host:port or rediss://host:port"))
            })?;
            tls |= matches!(info.addr(), ConnectionAddr::TcpTls { .. });
            nodes.push(info);
        }
        if !tls {
            plain_only(settings, ENV_REDIS_CLUSTER_URLS)?;
        }
        let (pushes, received) = mpsc::unbounded_channel();
        let mut builder = ClusterClientBuilder::new(nodes)
            .use_protocol(ProtocolVersion::RESP3)
            .push_sender(pushes)
            .connection_timeout(RESPONSE_TIMEOUT)
            .response_timeout(RESPONSE_TIMEOUT)
            .tcp_settings(nodelay());
        if let Some(username) = &settings.username {
            builder = builder.username(username);
        }
        if let Some(password) = &settings.password {
            builder = builder.password(password);
        }
        if tls {
            builder = builder.tls(TlsMode::Secure).certs(certificates(settings));
        }
        let client = builder.build().map_err(|error| {
            StoreError(format!(
                "{ENV_REDIS_CLUSTER_URLS} cannot be used: {}",
                certificate_hint(&error)
            ))
        })?;
        let mut delay = Duration::from_millis(200);
        let connection = loop {
            match client.get_async_connection().await {
                Ok(connection) => break connection,
                Err(error) => {
                    if let Some(fatal) = fatal(&error, settings) {
                        return Err(fatal);
                    }
                    tracing::warn!(%error, retry_in_ms = delay.as_millis() as u64, "the Redis Cluster is not reachable yet; retrying");
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_secs(5));
                }
            }
        };
        tracing::info!(seeds = seeds.len(), "connected to the Redis Cluster");
        Ok(Arc::new(Self {
            way: Way::Cluster(Shards {
                connection,
                pushes: std::sync::Mutex::new(Some(received)),
            }),
            changed: watch::channel(0).0,
            metrics,
        }))
    }

    /// The command connection to the current primary, or to the Cluster.
    pub(super) fn commands(&self) -> Connection {
        match &self.way {
            Way::Primary(primaries) => Connection::Primary(primaries.current().commands),
            Way::Cluster(shards) => Connection::Cluster(shards.connection.clone()),
        }
    }

    /// A connection for writes followed by `WAIT` (see [`Primary::waiting`]); the command
    /// connection when no write waits.
    pub(super) fn waiting(&self) -> Connection {
        let Way::Primary(primaries) = &self.way else {
            return self.commands();
        };
        let primary = primaries.current();
        if primary.waiting.is_empty() {
            return Connection::Primary(primary.commands);
        }
        let next = primaries
            .next_waiting
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Connection::Primary(primary.waiting[next % primary.waiting.len()].clone())
    }

    /// How the event hub hears events: a client for its own pub/sub connection to the
    /// current primary, or, on a Cluster, the connection and the sharded messages it
    /// receives (these the first time only: one hub per link).
    pub(super) fn events(&self) -> Events {
        match &self.way {
            Way::Primary(primaries) => Events::Plain(Box::new(primaries.current().client)),
            Way::Cluster(shards) => Events::Sharded(
                shards.connection.clone(),
                shards
                    .pushes
                    .lock()
                    .unwrap_or_else(|poisoned| poisoned.into_inner())
                    .take(),
            ),
        }
    }

    /// Says when the primary changed (the event hub reconnects to the new one).
    pub(super) fn primary_changed(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }

    /// Asks every Sentinel for the primary; when most of them name another one, connects
    /// there and switches to it. (Not the first Sentinel that answers, as the crate's client
    /// does: during a failover one may still name the old primary, which, restarted empty,
    /// answers as a primary until the Sentinels make it a replica.)
    async fn follow_once(&self, primaries: &Primaries, sentinels: &Sentinels) {
        let Some((host, port)) = sentinels.agreed_primary().await else {
            tracing::debug!("no majority of the Sentinels names a primary yet");
            return;
        };
        let address = format!("{host}:{port}");
        if address == primaries.current().address {
            return;
        }
        let client = match sentinels.primary_client(&host, port) {
            Ok(client) => client,
            Err(error) => {
                tracing::warn!(%error, %address, "the primary the Sentinels name cannot be used");
                return;
            }
        };
        match Primary::connect(client, primaries.waiting).await {
            Ok(primary) => {
                let old = primaries.current().address;
                tracing::warn!(from = %old, to = %primary.address, "Redis failed over: following the new primary");
                self.metrics.redis_primary(&primary.address);
                self.metrics.redis_failover();
                *primaries
                    .current
                    .write()
                    .unwrap_or_else(|poisoned| poisoned.into_inner()) = primary;
                self.changed.send_modify(|generation| *generation += 1);
            }
            Err(error) => {
                tracing::warn!(%error, %address, "the new Redis primary is not reachable yet");
            }
        }
    }
}

/// The Sentinels, each asked on its own, and what it takes to reach the primary they name.
struct Sentinels {
    /// One client per Sentinel (with its user, password and TLS).
    each: Vec<Client>,
    master: String,
    /// `redis` or `rediss`, for the primary.
    scheme: &'static str,
    settings: RedisSettings,
}

impl Sentinels {
    /// The primary more than half of the Sentinels name, if they agree.
    async fn agreed_primary(&self) -> Option<(String, u16)> {
        let asked = self.each.iter().map(|sentinel| async move {
            let named = async {
                let mut connection = sentinel.get_multiplexed_async_connection().await?;
                redis::cmd("SENTINEL")
                    .arg("get-master-addr-by-name")
                    .arg(&self.master)
                    .query_async::<Option<(String, u16)>>(&mut connection)
                    .await
            };
            tokio::time::timeout(RESPONSE_TIMEOUT, named)
                .await
                .ok()
                .and_then(Result::ok)
                .flatten()
        });
        let named = futures::future::join_all(asked).await;
        let mut votes: Vec<((String, u16), usize)> = Vec::new();
        for primary in named.into_iter().flatten() {
            match votes.iter_mut().find(|(known, _)| *known == primary) {
                Some((_, count)) => *count += 1,
                None => votes.push((primary, 1)),
            }
        }
        votes
            .into_iter()
            .find(|(_, count)| *count * 2 > self.each.len())
            .map(|(primary, _)| primary)
    }

    /// A client for the primary at `host:port`, as the settings say to reach it.
    fn primary_client(&self, host: &str, port: u16) -> Result<Client, StoreError> {
        client(&format!("{}://{host}:{port}", self.scheme), &self.settings)
    }
}

/// Keeps a Sentinel link on the primary the Sentinels name, until the link is dropped.
async fn follow(link: std::sync::Weak<Link>) {
    let mut ticks = tokio::time::interval(FOLLOW);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        let Some(link) = link.upgrade() else { return };
        if let Way::Primary(primaries) = &link.way
            && let Some(sentinels) = &primaries.sentinels
        {
            link.follow_once(primaries, sentinels).await;
        }
    }
}

/// How the event hub hears events (see [`Link::events`]).
pub(super) enum Events {
    /// Plain pub/sub on a connection of its own to the primary this client reaches.
    Plain(Box<Client>),
    /// Sharded pub/sub on the Cluster connection, its messages on the receiver.
    Sharded(ClusterConnection, Option<mpsc::UnboundedReceiver<PushInfo>>),
}

impl Primaries {
    fn current(&self) -> Primary {
        self.current
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }
}

impl Primary {
    /// Connects to the primary `client` reaches, with `waiting` connections for writes that
    /// wait for replicas.
    async fn connect(client: Client, waiting: usize) -> Result<Self, RedisError> {
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(RESPONSE_TIMEOUT))
            .set_response_timeout(Some(RESPONSE_TIMEOUT))
            .set_number_of_retries(1)
            .set_max_delay(Duration::from_secs(1));
        let commands = ConnectionManager::new_with_config(client.clone(), config.clone()).await?;
        let waiting = futures::future::try_join_all(
            (0..waiting)
                .map(|_| ConnectionManager::new_with_config(client.clone(), config.clone())),
        )
        .await?;
        Ok(Self {
            address: client.get_connection_info().addr().to_string(),
            client,
            commands,
            waiting: waiting.into(),
        })
    }
}

impl Connection {
    /// Whether Redis answers. On a Cluster one primary answering is enough: a shard that is
    /// down costs its own sessions, not the replica's readiness (which would take every
    /// replica out of its Service at once).
    pub(super) async fn ping(&mut self) -> redis::RedisResult<()> {
        let ping = redis::cmd("PING");
        let _: redis::Value = match self {
            Self::Primary(_) => ping.query_async(self).await?,
            Self::Cluster(cluster) => {
                use redis::cluster_routing::{
                    MultipleNodeRoutingInfo, ResponsePolicy, RoutingInfo,
                };
                let anyone = RoutingInfo::MultiNode((
                    MultipleNodeRoutingInfo::AllMasters,
                    Some(ResponsePolicy::OneSucceeded),
                ));
                cluster.route_command(ping, anyone).await?
            }
        };
        Ok(())
    }
}

impl ConnectionLike for Connection {
    fn req_packed_command<'a>(
        &'a mut self,
        cmd: &'a redis::Cmd,
    ) -> BoxFuture<'a, redis::RedisResult<redis::Value>> {
        async move {
            match self {
                Self::Primary(manager) => match manager.send_packed_command(cmd).await {
                    Err(error) if error.is_connection_dropped() => {
                        manager.send_packed_command(cmd).await
                    }
                    answered => answered,
                },
                Self::Cluster(cluster) => cluster.req_packed_command(cmd).await,
            }
        }
        .boxed()
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> BoxFuture<'a, redis::RedisResult<Vec<redis::Value>>> {
        async move {
            match self {
                Self::Primary(manager) => {
                    match manager.send_packed_commands(pipeline, offset, count).await {
                        Err(error) if error.is_connection_dropped() => {
                            manager.send_packed_commands(pipeline, offset, count).await
                        }
                        answered => answered,
                    }
                }
                // A Cluster takes a pipeline only within one slot: the commands go one by
                // one, all at once (in order on each shard's connection). The store sends no
                // transactions, so every command's answer is kept.
                Self::Cluster(cluster) => {
                    let sent = pipeline.cmd_iter().map(|command| {
                        let mut cluster = cluster.clone();
                        async move { cluster.req_packed_command(command).await }
                    });
                    let answers = futures::future::try_join_all(sent).await?;
                    Ok(answers.into_iter().skip(offset).take(count).collect())
                }
            }
        }
        .boxed()
    }

    fn get_db(&self) -> i64 {
        match self {
            Self::Primary(manager) => manager.get_db(),
            Self::Cluster(_) => 0,
        }
    }
}

/// rustls' `ring` provider, installed once for the process (rustls is built without a
/// default one, and would panic at the first TLS connection without it).
pub fn install_tls_provider() {
    // An error means a provider is installed already: the first stays.
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// A client for the Redis at `url`, as the user and with the certificates `settings` name.
fn client(url: &str, settings: &RedisSettings) -> Result<Client, StoreError> {
    let info = url
        .into_connection_info()
        .map_err(|error| StoreError(format!("{ENV_REDIS_URL} is not a Redis URL ({error}): give one such as redis://host:6379/0 or rediss://user@host:6380/0")))?;
    let mut redis = info.redis_settings().clone();
    if let Some(username) = &settings.username {
        redis = redis.set_username(username);
    }
    if let Some(password) = &settings.password {
        redis = redis.set_password(password);
    }
    let tls = matches!(info.addr(), ConnectionAddr::TcpTls { .. });
    let info = info
        .set_redis_settings(redis)
        // Nagle's algorithm off (the crate leaves it on): every store operation is a small
        // write that would otherwise wait for the peer's delayed ACK.
        .set_tcp_settings(nodelay());
    let built = if tls {
        Client::build_with_tls(info, certificates(settings))
    } else {
        plain_only(settings, ENV_REDIS_URL)?;
        Client::open(info)
    };
    built.map_err(|error| {
        StoreError(format!(
            "{ENV_REDIS_URL} cannot be used: {}",
            certificate_hint(&error)
        ))
    })
}

/// A client that finds the primary through the Sentinels (the crate's, for the start), and
/// each Sentinel on its own (to follow failovers), with the user, password and certificates
/// `settings` name for the primary and the Sentinels' own.
fn sentinel_client(
    settings: &RedisSettings,
    sentinels: &[String],
    master: &str,
) -> Result<(SentinelClient, Sentinels), StoreError> {
    let mut addresses = Vec::new();
    let mut sentinel_user = None;
    let mut sentinel_password = settings.sentinel_password.clone();
    for sentinel in sentinels {
        let info = if sentinel.contains("://") {
            sentinel.as_str().into_connection_info()
        } else {
            format!("redis://{sentinel}").into_connection_info()
        }
        .map_err(|error| StoreError(format!("{ENV_REDIS_SENTINELS}: {sentinel:?} is not an address ({error}); give host:port or a redis:// URL")))?;
        let redis = info.redis_settings();
        sentinel_user = sentinel_user.or(redis.username().map(str::to_owned));
        sentinel_password = sentinel_password.or(redis.password().map(str::to_owned));
        addresses.push(info.addr().clone());
    }
    let tls = addresses
        .iter()
        .any(|address| matches!(address, ConnectionAddr::TcpTls { .. }));
    if !tls {
        plain_only(settings, ENV_REDIS_SENTINELS)?;
    }
    let mut builder =
        SentinelClientBuilder::new(addresses.clone(), master, SentinelServerType::Master)
            .map_err(|error| StoreError(format!("{ENV_REDIS_SENTINELS} cannot be used: {error}")))?
            .set_client_to_redis_tcp_settings(nodelay())
            .set_client_to_sentinel_tcp_settings(nodelay());
    if let Some(username) = &settings.username {
        builder = builder.set_client_to_redis_username(username);
    }
    if let Some(password) = &settings.password {
        builder = builder.set_client_to_redis_password(password);
    }
    if let Some(username) = &sentinel_user {
        builder = builder.set_client_to_sentinel_username(username);
    }
    if let Some(password) = &sentinel_password {
        builder = builder.set_client_to_sentinel_password(password);
    }
    if tls {
        // One TLS setting for the whole deployment: Sentinels reached over TLS, so is the
        // primary they name, with the same CA and client certificate.
        builder = builder
            .set_client_to_sentinel_tls_mode(TlsMode::Secure)
            .set_client_to_sentinel_certificates(certificates(settings))
            .set_client_to_redis_tls_mode(TlsMode::Secure)
            .set_client_to_redis_certificates(certificates(settings));
    }
    let unusable = |error: RedisError| {
        StoreError(format!(
            "{ENV_REDIS_SENTINELS} cannot be used: {}",
            certificate_hint(&error)
        ))
    };
    let mut each = Vec::new();
    for address in &addresses {
        let mut redis = redis::RedisConnectionInfo::default();
        if let Some(username) = &sentinel_user {
            redis = redis.set_username(username);
        }
        if let Some(password) = &sentinel_password {
            redis = redis.set_password(password);
        }
        let info = address
            .clone()
            .into_connection_info()
            .map_err(unusable)?
            .set_redis_settings(redis)
            .set_tcp_settings(nodelay());
        each.push(if tls {
            Client::build_with_tls(info, certificates(settings)).map_err(unusable)?
        } else {
            Client::open(info).map_err(unusable)?
        });
    }
    let client = builder.build().map_err(unusable)?;
    Ok((
        client,
        Sentinels {
            each,
            master: master.to_owned(),
            scheme: if tls { "rediss" } else { "redis" },
            settings: settings.clone(),
        },
    ))
}

fn nodelay() -> redis::io::tcp::TcpSettings {
    redis::io::tcp::TcpSettings::default().set_nodelay(true)
}

/// The certificates `settings` name, for a TLS connection.
fn certificates(settings: &RedisSettings) -> TlsCertificates {
    TlsCertificates {
        client_tls: settings
            .tls
            .client
            .as_ref()
            .map(|(cert, key)| redis::ClientTlsConfig {
                client_cert: cert.clone(),
                client_key: key.clone(),
            }),
        root_cert: settings.tls.ca.clone(),
    }
}

/// Refuses certificates set for a connection without TLS: they would silently go unused.
fn plain_only(settings: &RedisSettings, variable: &str) -> Result<(), StoreError> {
    if settings.tls.ca.is_some() || settings.tls.client.is_some() {
        return Err(StoreError(format!(
            "{ENV_REDIS_CA_FILE} or {ENV_REDIS_CLIENT_CERT_FILE} is set but {variable} is not TLS: use rediss:// to reach Redis over TLS, or unset the certificate files"
        )));
    }
    Ok(())
}

/// A connection error that waiting will not mend, as the message to end the start with.
fn fatal(error: &RedisError, settings: &RedisSettings) -> Option<StoreError> {
    let mut credentials = if settings.password.is_some() {
        format!("{ENV_REDIS_USERNAME} and {ENV_REDIS_PASSWORD_FILE}")
    } else {
        format!(
            "the user and password in {ENV_REDIS_URL} (or {ENV_REDIS_USERNAME} and {ENV_REDIS_PASSWORD_FILE})"
        )
    };
    if matches!(settings.topology, Topology::Sentinel { .. }) {
        credentials.push_str(&format!(
            ", and the Sentinels' password ({ENV_REDIS_SENTINEL_PASSWORD_FILE} or the URLs in {ENV_REDIS_SENTINELS})"
        ));
    }
    let code = error.code();
    let message = if error.kind() == ErrorKind::AuthenticationFailed
        || matches!(code, Some("WRONGPASS" | "NOAUTH"))
    {
        format!("Redis refused to let this replica in ({error}): check {credentials}")
    } else if error.kind() == ErrorKind::Server(ServerErrorKind::NoPerm) {
        format!(
            "the Redis user may not do what toolrelay needs ({error}): grant it `{}` (the README's ACL line), or check {credentials}",
            acl_line(settings)
        )
    } else if let Some(certificate) = tls_error(error) {
        format!(
            "Redis' TLS certificate was not accepted ({certificate}): set {ENV_REDIS_CA_FILE} to the CA that signed it, and reach Redis by a name the certificate holds"
        )
    } else if error.kind() == ErrorKind::InvalidClientConfig {
        format!("the Redis settings cannot be used: {error}")
    } else {
        return None;
    };
    Some(StoreError(message))
}

/// The least privilege toolrelay needs, as an `ACL SETUSER` rule list for `settings`' prefix.
pub(super) fn acl_line(settings: &RedisSettings) -> String {
    let prefix = &settings.prefix;
    let mut line = format!("~{prefix}* &{prefix}* +@read +@write +@scripting +@pubsub +ping");
    if matches!(settings.topology, Topology::Cluster(_)) {
        // The cluster client learns which shard holds which slots.
        line.push_str(" +cluster|slots");
    }
    line
}

/// The TLS error behind a failed connection, if that is what failed it.
fn tls_error(error: &RedisError) -> Option<&rustls::Error> {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(current) = cause {
        if let Some(tls) = current.downcast_ref::<rustls::Error>() {
            return Some(tls);
        }
        // The redis crate keeps an I/O error behind an `Arc`, and an I/O error's `source`
        // skips the error it wraps: both are looked through by hand.
        let shared = current
            .downcast_ref::<Arc<dyn std::error::Error + Send + Sync>>()
            .map(|shared| -> &(dyn std::error::Error + 'static) { &**shared });
        let io = shared
            .unwrap_or(current)
            .downcast_ref::<std::io::Error>()
            .and_then(std::io::Error::get_ref);
        if let Some(tls) = io.and_then(|inner| inner.downcast_ref::<rustls::Error>()) {
            return Some(tls);
        }
        cause = current.source();
    }
    None
}

/// A client that cannot be built: usually a PEM file that is not one.
fn certificate_hint(error: &RedisError) -> String {
    format!(
        "{error}; check that {ENV_REDIS_CA_FILE}, {ENV_REDIS_CLIENT_CERT_FILE} and its key are PEM files"
    )
}
