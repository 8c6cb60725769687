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

use std::sync::{Arc, RwLock};
use std::time::Duration;

use futures::FutureExt;
use futures::future::BoxFuture;
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::sentinel::{SentinelClient, SentinelClientBuilder, SentinelServerType};
use redis::{
    Client, ConnectionAddr, ErrorKind, IntoConnectionInfo, RedisError, ServerErrorKind,
    TlsCertificates, TlsMode,
};
use tokio::sync::watch;

use super::RESPONSE_TIMEOUT;
use crate::config::{
    ENV_REDIS_CA_FILE, ENV_REDIS_CLIENT_CERT_FILE, ENV_REDIS_CLUSTER_URLS, ENV_REDIS_PASSWORD_FILE,
    ENV_REDIS_SENTINEL_PASSWORD_FILE, ENV_REDIS_SENTINELS, ENV_REDIS_URL, ENV_REDIS_USERNAME,
    RedisSettings, Topology,
};
use crate::error::StoreError;
use crate::metrics::Metrics;

/// How often a replica on Sentinel asks which primary to use.
const FOLLOW: Duration = Duration::from_secs(1);

/// The connection to the current primary, and how to find the next one.
pub(super) struct Link {
    current: RwLock<Primary>,
    /// How many connections writes that wait for replicas get (0 without `WAIT`).
    waiting: usize,
    /// The next of them to use.
    next_waiting: std::sync::atomic::AtomicUsize,
    /// The Sentinels, when the primary is found through them.
    sentinel: Option<tokio::sync::Mutex<SentinelClient>>,
    /// Bumped when the primary changes; the event hub reconnects on it.
    changed: watch::Sender<u64>,
    metrics: Metrics,
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

/// The command connection: cheap to clone, retried once on a connection found dropped.
#[derive(Clone)]
pub(super) struct Connection(ConnectionManager);

impl Link {
    /// Connects as `settings` say, waiting while Redis cannot be reached; what waiting cannot
    /// mend is an error naming the variable to fix.
    pub(super) async fn connect(
        settings: &RedisSettings,
        metrics: Metrics,
    ) -> Result<Arc<Self>, StoreError> {
        install_tls_provider();
        let mut sentinel = match &settings.topology {
            Topology::Primary(_) => None,
            Topology::Sentinel { sentinels, master } => {
                Some(sentinel_client(settings, sentinels, master)?)
            }
            Topology::Cluster(_) => {
                return Err(StoreError(format!(
                    "{ENV_REDIS_CLUSTER_URLS}: Redis Cluster is not supported yet; name one primary by {ENV_REDIS_URL} or a primary through Sentinel by {ENV_REDIS_SENTINELS}"
                )));
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
        let link = Arc::new(Self {
            current: RwLock::new(primary),
            waiting,
            next_waiting: std::sync::atomic::AtomicUsize::new(0),
            sentinel: sentinel.map(tokio::sync::Mutex::new),
            changed: watch::channel(0).0,
            metrics,
        });
        if link.sentinel.is_some() {
            tokio::spawn(follow(Arc::downgrade(&link)));
        }
        Ok(link)
    }

    fn current(&self) -> Primary {
        self.current
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }

    /// The command connection to the current primary.
    pub(super) fn commands(&self) -> Connection {
        Connection(self.current().commands)
    }

    /// A connection for writes followed by `WAIT` (see [`Primary::waiting`]); the command
    /// connection when no write waits.
    pub(super) fn waiting(&self) -> Connection {
        let primary = self.current();
        if primary.waiting.is_empty() {
            return Connection(primary.commands);
        }
        let next = self
            .next_waiting
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Connection(primary.waiting[next % primary.waiting.len()].clone())
    }

    /// A client for new connections to the current primary (the event hub's).
    pub(super) fn client(&self) -> Client {
        self.current().client
    }

    /// Says when the primary changed (the event hub reconnects to the new one).
    pub(super) fn primary_changed(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }

    /// Asks the Sentinels for the primary; when they name another one, connects there and
    /// switches to it.
    async fn follow_once(&self, sentinel: &tokio::sync::Mutex<SentinelClient>) {
        let found = sentinel.lock().await.async_get_client().await;
        let client = match found {
            Ok(client) => client,
            Err(error) => {
                tracing::debug!(%error, "the Sentinels name no reachable primary yet");
                return;
            }
        };
        let address = client.get_connection_info().addr().to_string();
        if address == self.current().address {
            return;
        }
        match Primary::connect(client, self.waiting).await {
            Ok(primary) => {
                let old = self.current().address;
                tracing::warn!(from = %old, to = %primary.address, "Redis failed over: following the new primary");
                self.metrics.redis_primary(&primary.address);
                self.metrics.redis_failover();
                *self
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

/// Keeps a Sentinel link on the primary the Sentinels name, until the link is dropped.
async fn follow(link: std::sync::Weak<Link>) {
    let mut ticks = tokio::time::interval(FOLLOW);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        let Some(link) = link.upgrade() else { return };
        if let Some(sentinel) = &link.sentinel {
            link.follow_once(sentinel).await;
        }
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

impl ConnectionLike for Connection {
    fn req_packed_command<'a>(
        &'a mut self,
        cmd: &'a redis::Cmd,
    ) -> BoxFuture<'a, redis::RedisResult<redis::Value>> {
        async move {
            match self.0.send_packed_command(cmd).await {
                Err(error) if error.is_connection_dropped() => {
                    self.0.send_packed_command(cmd).await
                }
                answered => answered,
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
            match self.0.send_packed_commands(pipeline, offset, count).await {
                Err(error) if error.is_connection_dropped() => {
                    self.0.send_packed_commands(pipeline, offset, count).await
                }
                answered => answered,
            }
        }
        .boxed()
    }

    fn get_db(&self) -> i64 {
        self.0.get_db()
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

/// A client that finds the primary through the Sentinels, with the user, password and
/// certificates `settings` name for the primary and the Sentinels' own.
fn sentinel_client(
    settings: &RedisSettings,
    sentinels: &[String],
    master: &str,
) -> Result<SentinelClient, StoreError> {
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
    let mut builder = SentinelClientBuilder::new(addresses, master, SentinelServerType::Master)
        .map_err(|error| StoreError(format!("{ENV_REDIS_SENTINELS} cannot be used: {error}")))?
        .set_client_to_redis_tcp_settings(nodelay())
        .set_client_to_sentinel_tcp_settings(nodelay());
    if let Some(username) = &settings.username {
        builder = builder.set_client_to_redis_username(username);
    }
    if let Some(password) = &settings.password {
        builder = builder.set_client_to_redis_password(password);
    }
    if let Some(username) = sentinel_user {
        builder = builder.set_client_to_sentinel_username(username);
    }
    if let Some(password) = sentinel_password {
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
    builder.build().map_err(|error| {
        StoreError(format!(
            "{ENV_REDIS_SENTINELS} cannot be used: {}",
            certificate_hint(&error)
        ))
    })
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
            "the Redis user may not do what toolrelay needs ({error}): grant it `~PREFIX* &PREFIX* +@read +@write +@scripting +@pubsub +ping` (the README's ACL line), or check {credentials}"
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
