//! The relay's settings: one typed struct with defaults and validation, and the command-line
//! flags (each mirroring an environment variable) that fill it.

use std::net::SocketAddr;
use std::num::NonZeroU32;
use std::time::Duration;

use clap::Args;
use ipnet::IpNet;

use crate::builtin::BuiltinConfig;
use crate::builtin::mip::MipConfig;
use crate::builtin::mip::sandbox::SandboxConfig;
use crate::limits::{self, RateLimits};
use crate::listen::{self, ConnectionLimits};

/// `SESSION_TTL_SECONDS`: idle time after which a session expires.
pub const ENV_SESSION_TTL: &str = "SESSION_TTL_SECONDS";
/// `SESSION_MAX_LIFETIME_SECONDS`: a session ends this long after creation, however active.
pub const ENV_SESSION_MAX_LIFETIME: &str = "SESSION_MAX_LIFETIME_SECONDS";
/// `REQUEST_TIMEOUT_SECONDS`: a call not answered in this time expires.
pub const ENV_REQUEST_TIMEOUT: &str = "REQUEST_TIMEOUT_SECONDS";
/// `MAX_PENDING_PER_SESSION`: unanswered calls a session may hold.
pub const ENV_MAX_PENDING: &str = "MAX_PENDING_PER_SESSION";
/// `HEARTBEAT_SECONDS`: interval of heartbeats to connected providers.
pub const ENV_HEARTBEAT: &str = "HEARTBEAT_SECONDS";
/// `GRPC_LISTEN_ADDR`: where the gRPC service listens.
pub const ENV_GRPC_LISTEN: &str = "GRPC_LISTEN_ADDR";
/// `WS_LISTEN_ADDR`: where the standalone relay serves the browser WebSocket.
pub const ENV_WS_LISTEN: &str = "WS_LISTEN_ADDR";
/// `PLANTUML_SERVER_URL`: the PlantUML server `encodePlantUML`'s URLs point at.
pub const ENV_PLANTUML_SERVER: &str = "PLANTUML_SERVER_URL";
/// `MIP_PYTHON`: the Python (a virtualenv with PuLP 3) the MIP sandbox runs.
pub const ENV_MIP_PYTHON: &str = "MIP_PYTHON";
/// `REMIP_URL`: a ReMIP server to solve MIPs with instead of HiGHS.
pub const ENV_REMIP_URL: &str = "REMIP_URL";
/// `MIP_MAX_CONCURRENT`: sandbox runs and solves at once.
pub const ENV_MIP_MAX_CONCURRENT: &str = "MIP_MAX_CONCURRENT";
/// `LOG_FORMAT`: `text` (default) or `json`.
pub const ENV_LOG_FORMAT: &str = "LOG_FORMAT";
/// `RATE_LIMIT_REQUEST_PER_CODE`: calls one address may make to one session per minute.
pub const ENV_RATE_LIMIT_REQUEST: &str = "RATE_LIMIT_REQUEST_PER_CODE";
/// `RATE_LIMIT_LOOKUP_PER_IP`: look-ups of unknown session codes one address may make per
/// minute (the brute-force guard).
pub const ENV_RATE_LIMIT_LOOKUP: &str = "RATE_LIMIT_LOOKUP_PER_IP";
/// `TRUSTED_GATEWAYS`: addresses or networks (CIDR) whose gRPC requests may name the client's
/// address; comma-separated.
pub const ENV_TRUSTED_GATEWAYS: &str = "TRUSTED_GATEWAYS";
/// `MAX_JSON_DEPTH`: deepest nesting of JSON the system accepts anywhere.
pub const ENV_MAX_JSON_DEPTH: &str = "MAX_JSON_DEPTH";
/// `DRAIN_SECONDS`: how long a stopping server waits for delivered calls to be answered.
pub const ENV_DRAIN_SECONDS: &str = "DRAIN_SECONDS";
/// `RESPONSE_BUDGET_MB`: megabytes of finished calls' answers the in-memory store keeps.
pub const ENV_RESPONSE_BUDGET: &str = "RESPONSE_BUDGET_MB";

/// `HEADER_READ_TIMEOUT_SECONDS`: how long a request head may take to arrive, on every listener.
pub const ENV_HEADER_READ_TIMEOUT: &str = "HEADER_READ_TIMEOUT_SECONDS";
/// `MAX_HEADER_BYTES`: most bytes of a request head a connection may send.
pub const ENV_MAX_HEADER_BYTES: &str = "MAX_HEADER_BYTES";
/// `KEEP_ALIVE_IDLE_SECONDS`: how long a kept-alive connection may wait for its next request.
pub const ENV_KEEP_ALIVE_IDLE: &str = "KEEP_ALIVE_IDLE_SECONDS";
/// `MAX_CONNECTIONS_PER_IP`: connections one client address may hold open.
pub const ENV_MAX_CONNECTIONS_PER_IP: &str = "MAX_CONNECTIONS_PER_IP";
/// `MAX_CONNECTIONS`: connections the process holds open in all (default from the open-files
/// limit).
pub const ENV_MAX_CONNECTIONS: &str = "MAX_CONNECTIONS";

/// `REDIS_URL`: the Redis holding the state shared by several replicas (unset: in memory).
pub const ENV_REDIS_URL: &str = "REDIS_URL";
/// `REDIS_PREFIX`: what every key in Redis starts with, so deployments can share a Redis.
pub const ENV_REDIS_PREFIX: &str = "REDIS_PREFIX";

/// Deepest JSON nesting by default (SPEC §10).
pub const DEFAULT_MAX_JSON_DEPTH: usize = 32;
/// Deepest nesting that may be configured: protobuf decoders refuse messages nested more than
/// 100 levels, and a JSON level costs up to two of them in `google.protobuf.Struct`, plus the
/// envelope of the message carrying it.
pub const MAX_CONFIGURABLE_JSON_DEPTH: usize = 40;

/// The domain's settings.
#[derive(Debug, Clone)]
pub struct RelayConfig {
    /// Idle time after which a session expires (sliding).
    pub session_ttl: Duration,
    /// Longest life of a session, however active.
    pub session_max_lifetime: Duration,
    /// A call not answered in this time becomes `expired`.
    pub request_timeout: Duration,
    /// Unanswered calls a session may hold; more are refused.
    pub max_pending_per_session: usize,
    /// Interval of heartbeats to connected providers; each also slides the session.
    pub heartbeat_interval: Duration,
    /// How long a polled request stays with the poller before it is handed out again.
    pub poll_lease: Duration,
    /// How long finished calls and their responses are kept.
    pub response_retention: Duration,
    /// Bytes of finished calls' answers kept at most (the oldest are evicted first).
    pub response_budget: usize,
    /// Largest manifest, in bytes of JSON.
    pub max_manifest_bytes: usize,
    /// Most functions in a manifest.
    pub max_functions: usize,
    /// Largest response a provider may send, in bytes of JSON.
    pub max_response_bytes: usize,
    /// How long `Call` waits when the caller gives no timeout.
    pub default_call_wait: Duration,
    /// Deepest nesting of JSON accepted in arguments, answers and manifests.
    pub max_json_depth: usize,
    /// Budgets of the brute-force guard and of calls per address and session.
    pub limits: RateLimits,
    /// Peers whose requests may name the client's address (the gateways).
    pub trusted_gateways: Vec<IpNet>,
    /// How long a stopping relay waits for delivered calls to be answered.
    pub drain_timeout: Duration,
    /// Settings of the built-in tools.
    pub builtin: BuiltinConfig,
    /// Where the state lives.
    pub store: StoreConfig,
    /// What the gRPC and WebSocket listeners allow a connection.
    pub connections: ConnectionLimits,
}

/// Where sessions, calls and claim checks live.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum StoreConfig {
    /// In this process: one replica, nothing to set up (the default).
    #[default]
    Memory,
    /// In Redis, shared by every replica.
    Redis {
        /// `redis://…` or `rediss://…`.
        url: String,
        /// What every key starts with.
        prefix: String,
    },
}

impl Default for RelayConfig {
    fn default() -> Self {
        Self {
            session_ttl: Duration::from_secs(600),
            session_max_lifetime: Duration::from_secs(24 * 3600),
            request_timeout: Duration::from_secs(60),
            max_pending_per_session: 100,
            heartbeat_interval: Duration::from_secs(25),
            poll_lease: Duration::from_secs(30),
            response_retention: Duration::from_secs(3600),
            response_budget: crate::store::memory::ANSWER_BUDGET,
            max_manifest_bytes: 256 * 1024,
            max_functions: 256,
            max_response_bytes: 1024 * 1024,
            default_call_wait: Duration::from_secs(25),
            max_json_depth: DEFAULT_MAX_JSON_DEPTH,
            limits: RateLimits::default(),
            trusted_gateways: limits::loopback(),
            drain_timeout: Duration::from_secs(10),
            builtin: BuiltinConfig::default(),
            store: StoreConfig::Memory,
            connections: ConnectionLimits::default(),
        }
    }
}

impl RelayConfig {
    /// Checks that the settings make sense together; the message names the variable to fix.
    pub fn validate(&self) -> Result<(), String> {
        if self.session_ttl.is_zero() {
            return Err(format!("{ENV_SESSION_TTL} must be at least 1"));
        }
        if self.session_max_lifetime < self.session_ttl {
            return Err(format!(
                "{ENV_SESSION_MAX_LIFETIME} ({}) must not be shorter than {ENV_SESSION_TTL} ({})",
                self.session_max_lifetime.as_secs(),
                self.session_ttl.as_secs()
            ));
        }
        if self.heartbeat_interval.is_zero() || self.heartbeat_interval >= self.session_ttl {
            return Err(format!(
                "{ENV_HEARTBEAT} ({}) must be at least 1 and shorter than {ENV_SESSION_TTL} ({}), or a connected tab's session would expire",
                self.heartbeat_interval.as_secs(),
                self.session_ttl.as_secs()
            ));
        }
        if self.request_timeout.is_zero() {
            return Err(format!("{ENV_REQUEST_TIMEOUT} must be at least 1"));
        }
        if self.max_pending_per_session == 0 {
            return Err(format!("{ENV_MAX_PENDING} must be at least 1"));
        }
        check_json_depth(self.max_json_depth)?;
        if let Some(url) = &self.builtin.mip.remip_url
            && !url.starts_with("http://")
        {
            return Err(format!(
                "{ENV_REMIP_URL} ({url}) must be an http:// URL (the ReMIP client speaks plain HTTP, e.g. inside the cluster)"
            ));
        }
        let server = &self.builtin.plantuml_server;
        if !(server.starts_with("http://") || server.starts_with("https://")) {
            return Err(format!(
                "{ENV_PLANTUML_SERVER} ({server}) must be an http:// or https:// URL"
            ));
        }
        Ok(())
    }
}

/// Checks a `MAX_JSON_DEPTH`.
pub fn check_json_depth(depth: usize) -> Result<(), String> {
    if (2..=MAX_CONFIGURABLE_JSON_DEPTH).contains(&depth) {
        Ok(())
    } else {
        Err(format!(
            "{ENV_MAX_JSON_DEPTH} ({depth}) must be between 2 and {MAX_CONFIGURABLE_JSON_DEPTH}: gRPC carries JSON as google.protobuf.Struct, whose decoders refuse deeper messages"
        ))
    }
}

/// Log output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// The relay's command-line flags; each has an environment variable of the same meaning.
#[derive(Debug, Clone, Args)]
pub struct RelayArgs {
    /// Address of the gRPC service (consumers and backend providers).
    #[arg(long, env = ENV_GRPC_LISTEN, default_value = "127.0.0.1:50051")]
    pub grpc_listen: SocketAddr,
    /// Idle seconds after which a session expires.
    #[arg(long, env = ENV_SESSION_TTL, default_value_t = 600, value_parser = clap::value_parser!(u64).range(1..))]
    pub session_ttl_seconds: u64,
    /// Longest life of a session in seconds, however active.
    #[arg(long, env = ENV_SESSION_MAX_LIFETIME, default_value_t = 86_400, value_parser = clap::value_parser!(u64).range(1..))]
    pub session_max_lifetime_seconds: u64,
    /// Seconds after which an unanswered call expires.
    #[arg(long, env = ENV_REQUEST_TIMEOUT, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..))]
    pub request_timeout_seconds: u64,
    /// Unanswered calls a session may hold.
    #[arg(long, env = ENV_MAX_PENDING, default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..=100_000))]
    pub max_pending_per_session: u64,
    /// Seconds between heartbeats to connected providers.
    #[arg(long, env = ENV_HEARTBEAT, default_value_t = 25, value_parser = clap::value_parser!(u64).range(1..))]
    pub heartbeat_seconds: u64,
    /// PlantUML server the URLs of encodePlantUML point at.
    #[arg(long, env = ENV_PLANTUML_SERVER, default_value = crate::builtin::plantuml::DEFAULT_SERVER)]
    pub plantuml_server_url: String,
    /// Python of the virtualenv (with PuLP 3) that the MIP sandbox runs.
    #[arg(long, env = ENV_MIP_PYTHON, default_value = "/opt/toolrelay/mip-venv/bin/python")]
    pub mip_python: std::path::PathBuf,
    /// A ReMIP server (http://host:port) to solve with instead of HiGHS.
    #[arg(long, env = ENV_REMIP_URL)]
    pub remip_url: Option<String>,
    /// Sandbox runs and solves at once.
    #[arg(long, env = ENV_MIP_MAX_CONCURRENT, default_value_t = 2, value_parser = clap::value_parser!(u64).range(1..=64))]
    pub mip_max_concurrent: u64,
    /// Calls one client address may make to one session per minute.
    #[arg(long, env = ENV_RATE_LIMIT_REQUEST, default_value_t = RateLimits::default().calls_per_code)]
    pub rate_limit_request_per_code: NonZeroU32,
    /// Look-ups of unknown session codes one client address may make per minute.
    #[arg(long, env = ENV_RATE_LIMIT_LOOKUP, default_value_t = RateLimits::default().lookups_per_ip)]
    pub rate_limit_lookup_per_ip: NonZeroU32,
    /// Megabytes of finished calls' answers kept (the oldest go first; their calls are still
    /// known, and a repeated requestId is not run again).
    #[arg(long, env = ENV_RESPONSE_BUDGET, default_value_t = 64, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub response_budget_mb: u64,
    /// Gateways (addresses or CIDR networks, comma-separated) whose gRPC requests may name the
    /// client's address for rate limits. Default: loopback.
    #[arg(long, env = ENV_TRUSTED_GATEWAYS, value_delimiter = ',', default_values_t = limits::loopback(), value_parser = limits::parse_network)]
    pub trusted_gateways: Vec<IpNet>,
}

/// Settings every server binary has: the JSON nesting limit and the drain on shutdown.
#[derive(Debug, Clone, Args)]
pub struct ServiceArgs {
    /// Deepest nesting of JSON accepted in arguments, answers and manifests.
    #[arg(long, env = ENV_MAX_JSON_DEPTH, default_value_t = DEFAULT_MAX_JSON_DEPTH)]
    pub max_json_depth: usize,
    /// Seconds a stopping server waits for calls its tabs have received to be answered.
    #[arg(long, env = ENV_DRAIN_SECONDS, default_value_t = 10, value_parser = clap::value_parser!(u64).range(0..=3600))]
    pub drain_seconds: u64,
    /// Redis holding the state shared by several replicas (`redis://host:6379/0`): sessions
    /// and calls for relays, rate limits and MCP sessions for gateways. Unset, the state
    /// lives in this process.
    #[arg(long, env = ENV_REDIS_URL)]
    pub redis_url: Option<String>,
    /// What every key in Redis starts with.
    #[arg(long, env = ENV_REDIS_PREFIX, default_value = "toolrelay:")]
    pub redis_prefix: String,
    /// Seconds a request head may take to arrive (from its first byte, or from the accept),
    /// on every listener.
    #[arg(long, env = ENV_HEADER_READ_TIMEOUT, default_value_t = listen::DEFAULT_HEADER_READ_TIMEOUT.as_secs(), value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub header_read_timeout_seconds: u64,
    /// Most bytes of a request head; a larger one gets 431.
    #[arg(long, env = ENV_MAX_HEADER_BYTES, default_value_t = listen::DEFAULT_MAX_HEADER_BYTES as u64, value_parser = clap::value_parser!(u64).range(listen::MIN_HEADER_BYTES as u64..=16 * 1024 * 1024))]
    pub max_header_bytes: u64,
    /// Seconds a kept-alive connection may wait for its next request (never cutting one in
    /// progress: calls, polls, streams and WebSockets run as long as they run).
    #[arg(long, env = ENV_KEEP_ALIVE_IDLE, default_value_t = listen::DEFAULT_KEEP_ALIVE_IDLE.as_secs(), value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub keep_alive_idle_seconds: u64,
    /// Connections one client address (an IPv6 client by its /64) may hold open.
    #[arg(long, env = ENV_MAX_CONNECTIONS_PER_IP, default_value_t = listen::DEFAULT_MAX_CONNECTIONS_PER_IP as u64, value_parser = clap::value_parser!(u64).range(1..))]
    pub max_connections_per_ip: u64,
    /// Connections the process holds open in all. Default: the open-files limit (raised to
    /// its hard limit at start) less an eighth (at least 256) for everything else.
    #[arg(long, env = ENV_MAX_CONNECTIONS, value_parser = clap::value_parser!(u64).range(1..))]
    pub max_connections: Option<u64>,
}

impl ServiceArgs {
    /// What every listener allows a connection, validated.
    pub fn connection_limits(&self) -> Result<ConnectionLimits, String> {
        let size = |value: u64| usize::try_from(value).unwrap_or(usize::MAX);
        let mut limits = ConnectionLimits {
            header_read_timeout: Duration::from_secs(self.header_read_timeout_seconds),
            max_header_bytes: size(self.max_header_bytes),
            keep_alive_idle: Duration::from_secs(self.keep_alive_idle_seconds),
            max_per_address: size(self.max_connections_per_ip),
            max_total: self
                .max_connections
                .map_or_else(listen::default_max_connections, size),
            uncapped: Vec::new(),
        };
        if self.max_connections.is_none() {
            // A total derived from the machine's limit: the per-address cap fits in it.
            limits.max_per_address = limits.max_per_address.min(limits.max_total);
        } else if limits.max_per_address > limits.max_total {
            return Err(format!(
                "{ENV_MAX_CONNECTIONS_PER_IP} ({}) must not be more than {ENV_MAX_CONNECTIONS} ({})",
                limits.max_per_address, limits.max_total
            ));
        }
        Ok(limits)
    }

    /// The drain deadline.
    pub fn drain_timeout(&self) -> Duration {
        Duration::from_secs(self.drain_seconds)
    }

    /// Where the shared state lives.
    pub fn store_config(&self) -> StoreConfig {
        match self.redis_url.as_deref().map(str::trim) {
            None | Some("") => StoreConfig::Memory,
            Some(url) => StoreConfig::Redis {
                url: url.to_owned(),
                prefix: self.redis_prefix.clone(),
            },
        }
    }
}

/// The logging flag every binary has.
#[derive(Debug, Clone, Args)]
pub struct LogArgs {
    /// Log format (`RUST_LOG` filters what is logged).
    #[arg(long, env = ENV_LOG_FORMAT, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

impl RelayArgs {
    /// The domain settings these flags describe, validated.
    pub fn relay_config(&self, service: &ServiceArgs) -> Result<RelayConfig, String> {
        let config = RelayConfig {
            max_json_depth: service.max_json_depth,
            drain_timeout: service.drain_timeout(),
            limits: RateLimits {
                lookups_per_ip: self.rate_limit_lookup_per_ip,
                calls_per_code: self.rate_limit_request_per_code,
            },
            trusted_gateways: self.trusted_gateways.clone(),
            response_budget: usize::try_from(self.response_budget_mb)
                .unwrap_or(usize::MAX / (1024 * 1024))
                .saturating_mul(1024 * 1024),
            session_ttl: Duration::from_secs(self.session_ttl_seconds),
            session_max_lifetime: Duration::from_secs(self.session_max_lifetime_seconds),
            request_timeout: Duration::from_secs(self.request_timeout_seconds),
            max_pending_per_session: usize::try_from(self.max_pending_per_session)
                .unwrap_or(usize::MAX),
            heartbeat_interval: Duration::from_secs(self.heartbeat_seconds),
            builtin: BuiltinConfig {
                plantuml_server: self.plantuml_server_url.clone(),
                mip: MipConfig {
                    sandbox: SandboxConfig {
                        python: self.mip_python.clone(),
                        ..SandboxConfig::default()
                    },
                    remip_url: self.remip_url.clone(),
                    max_concurrent: usize::try_from(self.mip_max_concurrent).unwrap_or(2),
                },
            },
            store: service.store_config(),
            connections: service.connection_limits()?,
            ..RelayConfig::default()
        };
        config.validate()?;
        Ok(config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        relay: RelayArgs,
        #[command(flatten)]
        service: ServiceArgs,
    }

    impl Cli {
        fn config(&self) -> Result<RelayConfig, String> {
            self.relay.relay_config(&self.service)
        }
    }

    #[test]
    fn defaults_are_the_documented_ones() {
        let cli = Cli::try_parse_from(["relay"]).unwrap();
        let config = cli.config().unwrap();
        assert_eq!(config.session_ttl, Duration::from_secs(600));
        assert_eq!(config.request_timeout, Duration::from_secs(60));
        assert_eq!(config.max_pending_per_session, 100);
        assert_eq!(cli.relay.grpc_listen.to_string(), "127.0.0.1:50051");
    }

    #[test]
    fn bad_combinations_name_the_variable() {
        let cli = Cli::try_parse_from(["relay", "--session-ttl-seconds", "20"]).unwrap();
        let message = cli.config().unwrap_err();
        assert!(
            message.contains(ENV_HEARTBEAT) && message.contains(ENV_SESSION_TTL),
            "{message}"
        );
    }

    #[test]
    fn the_json_depth_stays_within_what_grpc_can_carry() {
        let cli = Cli::try_parse_from(["relay", "--max-json-depth", "64"]).unwrap();
        let message = cli.config().unwrap_err();
        assert!(message.contains(ENV_MAX_JSON_DEPTH), "{message}");
        let cli = Cli::try_parse_from(["relay", "--trusted-gateways", "10.0.0.0/8,192.0.2.7/32"])
            .unwrap();
        assert_eq!(cli.config().unwrap().trusted_gateways.len(), 2);
    }

    #[test]
    fn connection_limits_are_set_and_checked() {
        let cli = Cli::try_parse_from([
            "relay",
            "--header-read-timeout-seconds",
            "3",
            "--max-connections-per-ip",
            "8",
            "--max-connections",
            "100",
        ])
        .unwrap();
        let limits = cli.config().unwrap().connections;
        assert_eq!(limits.header_read_timeout, Duration::from_secs(3));
        assert_eq!((limits.max_per_address, limits.max_total), (8, 100));
        let cli = Cli::try_parse_from(["relay", "--max-connections", "100"]).unwrap();
        let message = cli.config().unwrap_err();
        assert!(
            message.contains(ENV_MAX_CONNECTIONS_PER_IP) && message.contains(ENV_MAX_CONNECTIONS),
            "{message}"
        );
        assert!(Cli::try_parse_from(["relay", "--max-header-bytes", "100"]).is_err());
        assert!(Cli::try_parse_from(["relay", "--keep-alive-idle-seconds", "0"]).is_err());
    }

    #[test]
    fn bad_values_are_refused() {
        assert!(Cli::try_parse_from(["relay", "--session-ttl-seconds", "0"]).is_err());
        assert!(Cli::try_parse_from(["relay", "--session-ttl-seconds", "ten"]).is_err());
    }
}
