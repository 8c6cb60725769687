//! The Redis settings (`REDIS_*`): where Redis is (one primary, a primary found through
//! Sentinel, or a Cluster), who the replica is to it (an ACL user, its password in a file),
//! and how the connection is protected (TLS with a CA and an optional client certificate).
//! Read and checked at start: every error names the variable to fix, and a file that cannot
//! be read ends the start, not the first call.

use std::path::{Path, PathBuf};

use clap::Args;

/// `REDIS_URL`: the one Redis primary holding the state shared by several replicas
/// (`redis://…` or `rediss://…` for TLS; unset: in memory).
pub const ENV_REDIS_URL: &str = "REDIS_URL";
/// `REDIS_PREFIX`: what every key in Redis starts with, so deployments can share a Redis.
pub const ENV_REDIS_PREFIX: &str = "REDIS_PREFIX";
/// `REDIS_SENTINELS`: the Sentinels to ask for the primary, comma-separated (`host:port`,
/// `redis://…` or `rediss://…`).
pub const ENV_REDIS_SENTINELS: &str = "REDIS_SENTINELS";
/// `REDIS_SENTINEL_MASTER`: the name the Sentinels monitor the primary by.
pub const ENV_REDIS_SENTINEL_MASTER: &str = "REDIS_SENTINEL_MASTER";
/// `REDIS_SENTINEL_PASSWORD_FILE`: a file holding the Sentinels' own password.
pub const ENV_REDIS_SENTINEL_PASSWORD_FILE: &str = "REDIS_SENTINEL_PASSWORD_FILE";
/// `REDIS_CLUSTER_URLS`: seed nodes of a Redis Cluster, comma-separated.
pub const ENV_REDIS_CLUSTER_URLS: &str = "REDIS_CLUSTER_URLS";
/// `REDIS_USERNAME`: the ACL user (instead of one in the URL).
pub const ENV_REDIS_USERNAME: &str = "REDIS_USERNAME";
/// `REDIS_PASSWORD_FILE`: a file holding the password (instead of one in the URL), e.g. a
/// mounted Secret.
pub const ENV_REDIS_PASSWORD_FILE: &str = "REDIS_PASSWORD_FILE";
/// `REDIS_CA_FILE`: the PEM certificate(s) of the CA that signed Redis' certificate (unset:
/// the system's trusted CAs).
pub const ENV_REDIS_CA_FILE: &str = "REDIS_CA_FILE";
/// `REDIS_CLIENT_CERT_FILE`: a PEM client certificate, for a Redis that asks for one.
pub const ENV_REDIS_CLIENT_CERT_FILE: &str = "REDIS_CLIENT_CERT_FILE";
/// `REDIS_CLIENT_KEY_FILE`: the client certificate's PEM private key.
pub const ENV_REDIS_CLIENT_KEY_FILE: &str = "REDIS_CLIENT_KEY_FILE";
/// `REDIS_WAIT_REPLICAS`: replicas that must have each call's queueing and answer before it
/// counts (Redis' `WAIT`); 0, the default, waits for none.
pub const ENV_REDIS_WAIT_REPLICAS: &str = "REDIS_WAIT_REPLICAS";
/// `REDIS_WAIT_MS`: how long such a `WAIT` may take, in milliseconds.
pub const ENV_REDIS_WAIT_MS: &str = "REDIS_WAIT_MS";
/// `REPLICA_URL`: where the other replicas sharing Redis reach this one's gRPC
/// (`http://10.0.0.7:50051`; a port of 0 stands for the port `GRPC_LISTEN_ADDR` bound). Set
/// with `GATEWAY_SECRET`, a call waited for on one replica is routed to the replica holding its
/// session's tab; unset, calls go by Redis pub/sub alone.
pub const ENV_REPLICA_URL: &str = "REPLICA_URL";

/// The Redis flags (each mirroring an environment variable).
#[derive(Debug, Clone, Args)]
pub struct RedisArgs {
    /// Redis holding the state shared by several replicas (`redis://host:6379/0`, or
    /// `rediss://` for TLS): sessions and calls for relays, rate limits and MCP sessions for
    /// gateways. Unset (with no Sentinels and no Cluster), the state lives in this process.
    #[arg(long, env = ENV_REDIS_URL, hide_env_values = true)]
    pub redis_url: Option<String>,
    /// What every key in Redis starts with.
    #[arg(long, env = ENV_REDIS_PREFIX, default_value = "toolrelay:")]
    pub redis_prefix: String,
    /// Sentinels that know the primary, comma-separated (`host:26379`, or URLs with a user,
    /// a password and `rediss://` for TLS); with `REDIS_SENTINEL_MASTER`.
    #[arg(long, env = ENV_REDIS_SENTINELS, value_delimiter = ',', hide_env_values = true)]
    pub redis_sentinels: Vec<String>,
    /// The name the Sentinels monitor the primary by.
    #[arg(long, env = ENV_REDIS_SENTINEL_MASTER)]
    pub redis_sentinel_master: Option<String>,
    /// A file holding the Sentinels' own password (`requirepass` in their configuration).
    #[arg(long, env = ENV_REDIS_SENTINEL_PASSWORD_FILE)]
    pub redis_sentinel_password_file: Option<PathBuf>,
    /// Seed nodes of a Redis Cluster, comma-separated URLs.
    #[arg(long, env = ENV_REDIS_CLUSTER_URLS, value_delimiter = ',', hide_env_values = true)]
    pub redis_cluster_urls: Vec<String>,
    /// The ACL user to be (overrides one in the URLs).
    #[arg(long, env = ENV_REDIS_USERNAME)]
    pub redis_username: Option<String>,
    /// A file holding the Redis password (overrides one in the URLs).
    #[arg(long, env = ENV_REDIS_PASSWORD_FILE)]
    pub redis_password_file: Option<PathBuf>,
    /// The CA certificate(s) Redis' TLS certificate must chain to, PEM (default: the system's).
    #[arg(long, env = ENV_REDIS_CA_FILE)]
    pub redis_ca_file: Option<PathBuf>,
    /// A client certificate to show Redis over TLS, PEM (with `REDIS_CLIENT_KEY_FILE`).
    #[arg(long, env = ENV_REDIS_CLIENT_CERT_FILE)]
    pub redis_client_cert_file: Option<PathBuf>,
    /// The client certificate's private key, PEM.
    #[arg(long, env = ENV_REDIS_CLIENT_KEY_FILE)]
    pub redis_client_key_file: Option<PathBuf>,
    /// Replicas that must hold a call's queueing and its answer before either is
    /// acknowledged (Redis `WAIT`, sent in the same round trip); 0 waits for none.
    #[arg(long, env = ENV_REDIS_WAIT_REPLICAS, default_value_t = 0, value_parser = clap::value_parser!(u32).range(0..=16))]
    pub redis_wait_replicas: u32,
    /// Milliseconds such a `WAIT` may take before the write is refused as not replicated.
    #[arg(long, env = ENV_REDIS_WAIT_MS, default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..=10_000))]
    pub redis_wait_ms: u64,
    /// Where the other replicas reach this one's gRPC (`http://<pod IP>:50051`; port 0: the
    /// port the gRPC listener bound). With `GATEWAY_SECRET`, calls are routed to the replica
    /// holding their tab.
    #[arg(long, env = ENV_REPLICA_URL)]
    pub replica_url: Option<String>,
}

/// How to reach Redis and who to be to it, checked.
#[derive(Clone, PartialEq, Eq)]
pub struct RedisSettings {
    /// Where Redis is.
    pub topology: Topology,
    /// What every key starts with.
    pub prefix: String,
    /// The ACL user, when not the one in the URLs.
    pub username: Option<String>,
    /// The password, when not the one in the URLs (`REDIS_PASSWORD_FILE`).
    pub password: Option<String>,
    /// The Sentinels' own password (`REDIS_SENTINEL_PASSWORD_FILE`).
    pub sentinel_password: Option<String>,
    /// The CA and client certificate for `rediss://` connections.
    pub tls: TlsFiles,
    /// Replicas a call's writes must reach before they count.
    pub wait: Option<WaitReplicas>,
    /// Calls routed to the replica holding their tab (`REPLICA_URL`), when set.
    pub routing: Option<Routing>,
}

/// How a replica routes calls to the replica holding their tab, and is reached for them.
#[derive(Clone, PartialEq, Eq)]
pub struct Routing {
    /// Where the other replicas reach this one's gRPC (`REPLICA_URL`, its port bound).
    pub url: String,
    /// What this replica proves itself with to the others (`GATEWAY_SECRET`'s current one).
    pub proof: String,
}

/// Where Redis is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Topology {
    /// One primary (`REDIS_URL`).
    Primary(String),
    /// A primary the Sentinels name, followed through failovers.
    Sentinel {
        /// The Sentinels' addresses or URLs.
        sentinels: Vec<String>,
        /// The name they monitor the primary by.
        master: String,
    },
    /// A Redis Cluster, by its seed nodes.
    Cluster(Vec<String>),
}

/// The certificates for TLS connections, read from their files at start.
#[derive(Clone, PartialEq, Eq, Default)]
pub struct TlsFiles {
    /// PEM CA certificates (`REDIS_CA_FILE`); none: the system's.
    pub ca: Option<Vec<u8>>,
    /// A PEM client certificate and its key.
    pub client: Option<(Vec<u8>, Vec<u8>)>,
}

/// Redis `WAIT` after each call's writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WaitReplicas {
    /// Replicas that must acknowledge.
    pub replicas: u32,
    /// How long to wait for them, in milliseconds.
    pub timeout_ms: u64,
}

impl RedisSettings {
    /// One primary at `url` (`redis://…` or `rediss://…`), its keys under `prefix`, with no
    /// other setting.
    pub fn primary(url: impl Into<String>, prefix: impl Into<String>) -> Self {
        Self {
            topology: Topology::Primary(url.into()),
            prefix: prefix.into(),
            username: None,
            password: None,
            sentinel_password: None,
            tls: TlsFiles::default(),
            wait: None,
            routing: None,
        }
    }
}

impl std::fmt::Debug for Routing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Routing")
            .field("url", &self.url)
            .field("proof", &"<redacted>")
            .finish()
    }
}

impl Routing {
    /// `url` (`REPLICA_URL`) with a port of 0 standing for `grpc`'s (the port the gRPC
    /// listener bound).
    pub fn bound(url: &str, grpc: std::net::SocketAddr) -> String {
        match url.strip_suffix(":0") {
            Some(base) => format!("{base}:{}", grpc.port()),
            None => url.to_owned(),
        }
    }
}

impl std::fmt::Debug for RedisSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The topology's URLs may hold a password: only their number is shown.
        let topology = match &self.topology {
            Topology::Primary(_) => "one primary".to_owned(),
            Topology::Sentinel { sentinels, master } => {
                format!("{master} by {} sentinels", sentinels.len())
            }
            Topology::Cluster(seeds) => format!("cluster by {} seeds", seeds.len()),
        };
        f.debug_struct("RedisSettings")
            .field("topology", &topology)
            .field("prefix", &self.prefix)
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "<redacted>"))
            .field("tls", &self.tls)
            .field("wait", &self.wait)
            .field("routing", &self.routing)
            .finish_non_exhaustive()
    }
}

impl std::fmt::Debug for TlsFiles {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsFiles")
            .field("ca", &self.ca.is_some())
            .field("client", &self.client.is_some())
            .finish()
    }
}

impl RedisArgs {
    /// The Redis settings, or `None` when no Redis is named (the state stays in this
    /// process). Errors name the variables to fix.
    pub fn settings(&self) -> Result<Option<RedisSettings>, String> {
        let url = match self.redis_url.as_deref().map(str::trim) {
            Some("") => {
                return Err(format!(
                    "{ENV_REDIS_URL} is set but empty: give a Redis URL (redis://host:6379/0), or leave it unset to keep the state in this process"
                ));
            }
            url => url,
        };
        let sentinels = listed(&self.redis_sentinels);
        let cluster = listed(&self.redis_cluster_urls);
        let named: Vec<&str> = [
            (url.is_some(), ENV_REDIS_URL),
            (!sentinels.is_empty(), ENV_REDIS_SENTINELS),
            (!cluster.is_empty(), ENV_REDIS_CLUSTER_URLS),
        ]
        .into_iter()
        .filter_map(|(set, variable)| set.then_some(variable))
        .collect();
        if named.len() > 1 {
            return Err(format!(
                "{} are both set: name one Redis (a primary by {ENV_REDIS_URL}, a primary found through Sentinel by {ENV_REDIS_SENTINELS}, or a Cluster by {ENV_REDIS_CLUSTER_URLS}) and unset the other",
                named.join(" and ")
            ));
        }
        let master = self
            .redis_sentinel_master
            .as_deref()
            .map(str::trim)
            .filter(|master| !master.is_empty());
        let topology = match (url, sentinels.is_empty(), cluster.is_empty(), master) {
            (Some(url), ..) => Topology::Primary(url.to_owned()),
            (None, false, _, Some(master)) => Topology::Sentinel {
                sentinels,
                master: master.to_owned(),
            },
            (None, false, _, None) => {
                return Err(format!(
                    "{ENV_REDIS_SENTINELS} is set without {ENV_REDIS_SENTINEL_MASTER}: set it to the name the Sentinels monitor the primary by (`sentinel monitor NAME …`)"
                ));
            }
            (None, true, false, _) => Topology::Cluster(cluster),
            (None, true, true, _) => return Ok(None),
        };
        if master.is_some() && !matches!(topology, Topology::Sentinel { .. }) {
            return Err(format!(
                "{ENV_REDIS_SENTINEL_MASTER} is set without {ENV_REDIS_SENTINELS}: list the Sentinels to ask for it"
            ));
        }
        let client = match (&self.redis_client_cert_file, &self.redis_client_key_file) {
            (Some(cert), Some(key)) => Some((
                read(cert, ENV_REDIS_CLIENT_CERT_FILE)?,
                read(key, ENV_REDIS_CLIENT_KEY_FILE)?,
            )),
            (None, None) => None,
            _ => {
                return Err(format!(
                    "{ENV_REDIS_CLIENT_CERT_FILE} and {ENV_REDIS_CLIENT_KEY_FILE} go together: set both (a client certificate and its key) or neither"
                ));
            }
        };
        let tls = TlsFiles {
            ca: self
                .redis_ca_file
                .as_deref()
                .map(|path| read(path, ENV_REDIS_CA_FILE))
                .transpose()?,
            client,
        };
        Ok(Some(RedisSettings {
            topology,
            prefix: self.redis_prefix.clone(),
            username: self
                .redis_username
                .as_deref()
                .map(str::trim)
                .filter(|user| !user.is_empty())
                .map(str::to_owned),
            password: password(self.redis_password_file.as_deref(), ENV_REDIS_PASSWORD_FILE)?,
            sentinel_password: password(
                self.redis_sentinel_password_file.as_deref(),
                ENV_REDIS_SENTINEL_PASSWORD_FILE,
            )?,
            tls,
            wait: (self.redis_wait_replicas > 0).then_some(WaitReplicas {
                replicas: self.redis_wait_replicas,
                timeout_ms: self.redis_wait_ms,
            }),
            // Set by `RelayArgs::relay_config`, which has the secret.
            routing: None,
        }))
    }
}

/// The non-blank entries of a comma-separated list.
fn listed(entries: &[String]) -> Vec<String> {
    entries
        .iter()
        .map(|entry| entry.trim())
        .filter(|entry| !entry.is_empty())
        .map(str::to_owned)
        .collect()
}

fn read(path: &Path, variable: &str) -> Result<Vec<u8>, String> {
    std::fs::read(path)
        .map_err(|error| format!("{variable}: cannot read {}: {error}", path.display()))
}

/// A password from its file: the first line, without its line ending.
fn password(path: Option<&Path>, variable: &str) -> Result<Option<String>, String> {
    let Some(path) = path else { return Ok(None) };
    let text = String::from_utf8(read(path, variable)?)
        .map_err(|_| format!("{variable}: {} is not text", path.display()))?;
    let password = text.lines().next().unwrap_or_default();
    if password.is_empty() {
        return Err(format!(
            "{variable}: {} is empty; put the password on its first line",
            path.display()
        ));
    }
    Ok(Some(password.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        redis: RedisArgs,
    }

    fn settings(args: &[&str]) -> Result<Option<RedisSettings>, String> {
        let mut all = vec!["relay"];
        all.extend_from_slice(args);
        Cli::try_parse_from(all).unwrap().redis.settings()
    }

    #[test]
    fn no_redis_keeps_the_state_in_the_process() {
        assert_eq!(settings(&[]).unwrap(), None);
    }

    #[test]
    fn one_topology_at_a_time() {
        let message = settings(&[
            "--redis-url",
            "redis://a",
            "--redis-cluster-urls",
            "redis://b",
        ])
        .unwrap_err();
        assert!(
            message.contains(ENV_REDIS_URL) && message.contains(ENV_REDIS_CLUSTER_URLS),
            "{message}"
        );
        let message = settings(&["--redis-sentinels", "a:26379"]).unwrap_err();
        assert!(message.contains(ENV_REDIS_SENTINEL_MASTER), "{message}");
        let message =
            settings(&["--redis-url", "redis://a", "--redis-sentinel-master", "m"]).unwrap_err();
        assert!(message.contains(ENV_REDIS_SENTINELS), "{message}");
        let sentinel = settings(&[
            "--redis-sentinels",
            "a:26379, b:26379",
            "--redis-sentinel-master",
            "main",
        ])
        .unwrap()
        .unwrap();
        assert_eq!(
            sentinel.topology,
            Topology::Sentinel {
                sentinels: vec!["a:26379".into(), "b:26379".into()],
                master: "main".into()
            }
        );
    }

    #[test]
    fn secrets_come_from_files_and_are_never_printed() {
        let dir = std::env::temp_dir().join(format!("toolrelay-redis-args-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("password");
        std::fs::write(&file, "s3cret-word\n").unwrap();
        let path = file.to_str().unwrap();
        let found = settings(&[
            "--redis-url",
            "redis://u:inline@a",
            "--redis-password-file",
            path,
        ])
        .unwrap()
        .unwrap();
        assert_eq!(found.password.as_deref(), Some("s3cret-word"));
        let printed = format!("{found:?}");
        assert!(
            !printed.contains("s3cret") && !printed.contains("inline"),
            "{printed}"
        );
        let missing = dir.join("absent");
        let message = settings(&[
            "--redis-url",
            "redis://a",
            "--redis-ca-file",
            missing.to_str().unwrap(),
        ])
        .unwrap_err();
        assert!(message.contains(ENV_REDIS_CA_FILE), "{message}");
        let message =
            settings(&["--redis-url", "redis://a", "--redis-client-cert-file", path]).unwrap_err();
        assert!(message.contains(ENV_REDIS_CLIENT_KEY_FILE), "{message}");
        std::fs::remove_dir_all(dir).unwrap();
    }
}
