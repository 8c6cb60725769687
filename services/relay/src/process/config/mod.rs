//! The relay's settings: one typed struct with defaults and validation, and the command-line
//! flags (each mirroring an environment variable) that fill it.

use std::net::SocketAddr;
use std::num::NonZeroU32;
use std::time::Duration;

use std::sync::Arc;

use clap::Args;

mod redis;

pub use self::redis::*;

use crate::access::{ApiKeys, GatewaySecrets};
use crate::limits::RateLimits;
use crate::listen::{self, ConnectionLimits};

/// `SESSION_TTL_SECONDS`: idle time after which a session expires.
pub const ENV_SESSION_TTL: &str = "SESSION_TTL_SECONDS";
/// `SESSION_MAX_LIFETIME_SECONDS`: a session ends this long after creation, however active.
pub const ENV_SESSION_MAX_LIFETIME: &str = "SESSION_MAX_LIFETIME_SECONDS";
/// `CLAIM_TTL_SECONDS`: how long the claim an MCP App's plugin pairs with may wait to be
/// redeemed.
pub const ENV_CLAIM_TTL: &str = "CLAIM_TTL_SECONDS";
/// `REQUEST_TIMEOUT_SECONDS`: a call not answered in this time expires.
pub const ENV_REQUEST_TIMEOUT: &str = "REQUEST_TIMEOUT_SECONDS";
/// Environment variable: seconds the person has to answer a tab's question about a new caller.
pub const ENV_APPROVAL_TIMEOUT: &str = "APPROVAL_TIMEOUT_SECONDS";
/// `MAX_PENDING_PER_SESSION`: unanswered calls a session may hold.
pub const ENV_MAX_PENDING: &str = "MAX_PENDING_PER_SESSION";
/// `MAX_SESSIONS`: live sessions the relay holds in all (every replica on one store
/// together); past it, new ones get 503 `at_capacity`.
pub const ENV_MAX_SESSIONS: &str = "MAX_SESSIONS";
/// The default of `MAX_SESSIONS`: at ~2.4 KB a CODAP session in Redis, ~240 MB.
pub const DEFAULT_MAX_SESSIONS: usize = 100_000;
/// `MAX_CLAIMS`: claims (`open_codap`'s one-time secrets) out at once, redeemed or not, until
/// they expire; past it, `open_codap` gets 503 `at_capacity`.
pub const ENV_MAX_CLAIMS: &str = "MAX_CLAIMS";
/// The default of `MAX_CLAIMS`: each a small ticket and a place in Redis, well under 1 KB.
pub const DEFAULT_MAX_CLAIMS: usize = 100_000;
/// `MAX_MANIFESTS`: distinct tool manifests the store keeps (sessions registering the same
/// tools share one); past it, a new one is refused with 503 `at_capacity`.
pub const ENV_MAX_MANIFESTS: &str = "MAX_MANIFESTS";
/// The default of `MAX_MANIFESTS`: CODAP's is 21 KB of JSON; at most 256 KB each.
pub const DEFAULT_MAX_MANIFESTS: usize = 10_000;
/// `HEARTBEAT_SECONDS`: interval of heartbeats to connected providers.
pub const ENV_HEARTBEAT: &str = "HEARTBEAT_SECONDS";
/// `TAB_REFRESH_SECONDS`: how often a replica records itself alive (its tabs' presence) and
/// slides the sessions of its tabs that are due, all in one go.
pub const ENV_TAB_REFRESH: &str = "TAB_REFRESH_SECONDS";
/// `TAB_SWEEP_SECONDS`: how often a replica looks at the sessions of its tabs with calls out or
/// lost events, for what it may have missed (a call, a replacement, the session's end).
pub const ENV_TAB_SWEEP: &str = "TAB_SWEEP_SECONDS";
/// `GRPC_LISTEN_ADDR`: where the gRPC service listens.
pub const ENV_GRPC_LISTEN: &str = "GRPC_LISTEN_ADDR";
/// `WS_LISTEN_ADDR`: where the standalone relay serves the browser WebSocket.
pub const ENV_WS_LISTEN: &str = "WS_LISTEN_ADDR";
/// `LOG_FORMAT`: `text` (default) or `json`.
pub const ENV_LOG_FORMAT: &str = "LOG_FORMAT";
/// `RATE_LIMIT_REQUEST_PER_CODE`: calls one caller may make to one session per minute.
pub const ENV_RATE_LIMIT_REQUEST: &str = "RATE_LIMIT_REQUEST_PER_CODE";
/// `RATE_LIMIT_LOOKUP_PER_CALLER`: look-ups of unknown session codes one caller may make per
/// minute (the brute-force guard).
pub const ENV_RATE_LIMIT_LOOKUP_CALLER: &str = "RATE_LIMIT_LOOKUP_PER_CALLER";
/// `RATE_LIMIT_LOOKUP_PER_IP`: look-ups of unknown session codes the callers at one address
/// may make per minute together (the guard's flood ceiling).
pub const ENV_RATE_LIMIT_LOOKUP: &str = "RATE_LIMIT_LOOKUP_PER_IP";
/// `GUARD_IPV6_PREFIX`: length of the IPv6 prefix one client is keyed by in every per-address
/// budget and cap (an IPv4 address is keyed whole).
pub const ENV_GUARD_IPV6_PREFIX: &str = "GUARD_IPV6_PREFIX";
/// `TRUSTED_GATEWAYS`: no longer used (a gateway proves itself with `GATEWAY_SECRET`); a relay
/// that finds it set without a secret refuses to start, so an upgrade cannot silently count
/// every client against its gateway.
pub const ENV_TRUSTED_GATEWAYS: &str = "TRUSTED_GATEWAYS";
/// `RATE_LIMIT_SESSION_PER_CALLER`: sessions one caller may create per minute.
pub const ENV_RATE_LIMIT_SESSION_CALLER: &str = "RATE_LIMIT_SESSION_PER_CALLER";
/// `RATE_LIMIT_SESSION_PER_IP`: sessions the callers at one address may create per minute
/// together (a flood ceiling).
pub const ENV_RATE_LIMIT_SESSION: &str = "RATE_LIMIT_SESSION_PER_IP";
/// `RATE_LIMIT_TOOL_PER_CALLER`: built-in tool calls (outside a session) one caller may make
/// per minute.
pub const ENV_RATE_LIMIT_TOOL_CALLER: &str = "RATE_LIMIT_TOOL_PER_CALLER";
/// `RATE_LIMIT_TOOL_PER_IP`: built-in tool calls the callers at one address may make per
/// minute together (a flood ceiling).
pub const ENV_RATE_LIMIT_TOOL: &str = "RATE_LIMIT_TOOL_PER_IP";
/// `API_KEYS`: keys consumers need, comma-separated (unset: open).
pub const ENV_API_KEYS: &str = "API_KEYS";
/// `API_KEYS_FILE`: a file of such keys, one per line.
pub const ENV_API_KEYS_FILE: &str = "API_KEYS_FILE";
/// `GATEWAY_SECRET`: the secrets a gateway proves itself to the relay with, comma-separated
/// (relays accept each; a gateway sends the first).
pub const ENV_GATEWAY_SECRET: &str = "GATEWAY_SECRET";
/// `GATEWAY_SECRET_FILE`: a file holding such a list.
pub const ENV_GATEWAY_SECRET_FILE: &str = "GATEWAY_SECRET_FILE";
/// `MAX_JSON_DEPTH`: deepest nesting of JSON the system accepts anywhere.
pub const ENV_MAX_JSON_DEPTH: &str = "MAX_JSON_DEPTH";
/// `DRAIN_SECONDS`: how long a stopping server waits for delivered calls to be answered.
pub const ENV_DRAIN_SECONDS: &str = "DRAIN_SECONDS";
/// `RESPONSE_BUDGET_MB`: megabytes of finished calls' answers the in-memory store keeps.
pub const ENV_RESPONSE_BUDGET: &str = "RESPONSE_BUDGET_MB";
/// `RESPONSE_SESSION_SHARE`: the share of `RESPONSE_BUDGET_MB` one session's answers may take
/// (`1/8`, or `0.125`); past it, that session's own oldest answers go first.
pub const ENV_RESPONSE_SESSION_SHARE: &str = "RESPONSE_SESSION_SHARE";

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
    /// How long a claim (`open_codap`'s one-time secret for its app's plugin) may wait to be
    /// redeemed.
    pub claim_ttl: Duration,
    /// A call not answered in this time becomes `expired`.
    pub request_timeout: Duration,
    /// How long the person has to answer the tab's question about a new caller.
    pub approval_timeout: Duration,
    /// Unanswered calls a session may hold; more are refused.
    pub max_pending_per_session: usize,
    /// Live sessions in all; more are refused (`MAX_SESSIONS`).
    pub max_sessions: usize,
    /// Claims out at once; more are refused (`MAX_CLAIMS`).
    pub max_claims: usize,
    /// Distinct manifests kept; more are refused (`MAX_MANIFESTS`).
    pub max_manifests: usize,
    /// Interval of heartbeats to connected providers.
    pub heartbeat_interval: Duration,
    /// How often the replica records itself alive and slides the sessions of its tabs with
    /// less than half their time to live left, in one go (at most a quarter of
    /// `session_ttl`, whatever is set).
    pub tab_refresh: Duration,
    /// How often the replica looks at the sessions of its tabs with calls out or lost events
    /// for what they may have missed (at most `tab_refresh`).
    pub tab_sweep: Duration,
    /// How long a polled request stays with the poller before it is handed out again.
    pub poll_lease: Duration,
    /// How long finished calls and their responses are kept.
    pub response_retention: Duration,
    /// Bytes of finished calls' answers kept at most (the oldest are evicted first).
    pub response_budget: usize,
    /// The share of `response_budget` one session's answers may take (0 to 1); past it, the
    /// session's own oldest answers are evicted first.
    pub response_session_share: f64,
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
    /// Budgets of the brute-force guard, of calls per address and session, and of sessions
    /// and tool calls per address (spent for gRPC clients that reach the relay directly).
    pub limits: RateLimits,
    /// Keys a gRPC consumer reaching the relay directly needs (`API_KEYS`), when set.
    pub api_keys: Option<Arc<ApiKeys>>,
    /// Secrets with which a gateway proves itself (`GATEWAY_SECRET`); without them no client
    /// address a gRPC peer names is believed.
    pub gateway_secrets: Option<Arc<GatewaySecrets>>,
    /// How long a stopping relay waits for delivered calls to be answered.
    pub drain_timeout: Duration,
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
    Redis(Box<RedisSettings>),
}

impl Default for RelayConfig {
    fn default() -> Self {
        Self {
            session_ttl: Duration::from_secs(600),
            session_max_lifetime: Duration::from_secs(24 * 3600),
            claim_ttl: Duration::from_secs(600),
            request_timeout: Duration::from_secs(60),
            approval_timeout: Duration::from_secs(60),
            max_pending_per_session: 100,
            max_sessions: DEFAULT_MAX_SESSIONS,
            max_claims: DEFAULT_MAX_CLAIMS,
            max_manifests: DEFAULT_MAX_MANIFESTS,
            heartbeat_interval: Duration::from_secs(25),
            tab_refresh: Duration::from_secs(60),
            tab_sweep: Duration::from_secs(30),
            poll_lease: Duration::from_secs(30),
            response_retention: Duration::from_secs(3600),
            response_budget: crate::store::memory::ANSWER_BUDGET,
            response_session_share: crate::store::rules::ANSWER_SESSION_SHARE,
            max_manifest_bytes: 256 * 1024,
            max_functions: 256,
            max_response_bytes: 1024 * 1024,
            default_call_wait: Duration::from_secs(25),
            max_json_depth: DEFAULT_MAX_JSON_DEPTH,
            limits: RateLimits::default(),
            api_keys: None,
            gateway_secrets: None,
            drain_timeout: Duration::from_secs(DEFAULT_DRAIN_SECONDS),
            store: StoreConfig::Memory,
            connections: ConnectionLimits::default(),
        }
    }
}

impl RelayConfig {
    /// The settings with `REPLICA_URL`'s port 0 (if any) made the port the gRPC listener bound
    /// at `grpc`: what the binaries do once they have bound it.
    #[must_use]
    pub fn with_grpc_bound(mut self, grpc: SocketAddr) -> Self {
        if let StoreConfig::Redis(settings) = &mut self.store
            && let Some(routing) = &mut settings.routing
        {
            routing.url = Routing::bound(&routing.url, grpc);
        }
        self
    }

    /// How often the replica keeps its tabs' sessions alive: `tab_refresh`, at most a quarter
    /// of the session's time to live.
    pub fn tab_refresh_period(&self) -> Duration {
        self.tab_refresh
            .min(self.session_ttl / 4)
            .max(Duration::from_millis(100))
    }

    /// How often the replica sweeps its tabs' sessions: `tab_sweep`, at most the refresh
    /// period.
    pub fn tab_sweep_period(&self) -> Duration {
        self.tab_sweep.min(self.tab_refresh_period())
    }

    /// How long after its replica last recorded itself alive a pushing tab still counts as
    /// connected: two refresh periods and some slack (a replica that died takes its tabs'
    /// presence that long to fade).
    pub fn tab_presence(&self) -> Duration {
        self.tab_refresh_period() * 2 + Duration::from_secs(5)
    }

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
        let share = self.response_session_share;
        if !(share > 0.0 && share <= 1.0) {
            return Err(format!(
                "{ENV_RESPONSE_SESSION_SHARE} ({share}) must be a share of {ENV_RESPONSE_BUDGET} above 0 and at most 1, such as 1/8 or 0.125"
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
    /// Seconds within which a claim (the one-time secret `open_codap` gives its app's plugin)
    /// must be redeemed.
    #[arg(long, env = ENV_CLAIM_TTL, default_value_t = 600, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub claim_ttl_seconds: u64,
    /// Seconds after which an unanswered call expires.
    #[arg(long, env = ENV_REQUEST_TIMEOUT, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..))]
    pub request_timeout_seconds: u64,
    /// Seconds the person has to answer the tab's question about a new caller (a call
    /// held for it fails with `approval_timeout` after).
    #[arg(long, env = ENV_APPROVAL_TIMEOUT, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..=3_600))]
    pub approval_timeout_seconds: u64,
    /// Unanswered calls a session may hold.
    #[arg(long, env = ENV_MAX_PENDING, default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..=100_000))]
    pub max_pending_per_session: u64,
    /// Live sessions the relay holds in all, every replica on one store together; past it,
    /// new sessions get 503 `at_capacity` naming this setting.
    #[arg(long, env = ENV_MAX_SESSIONS, default_value_t = DEFAULT_MAX_SESSIONS as u64, value_parser = clap::value_parser!(u64).range(1..))]
    pub max_sessions: u64,
    /// Claims (`open_codap`) out at once, until each expires; past it, `open_codap` gets 503
    /// `at_capacity` naming this setting.
    #[arg(long, env = ENV_MAX_CLAIMS, default_value_t = DEFAULT_MAX_CLAIMS as u64, value_parser = clap::value_parser!(u64).range(1..))]
    pub max_claims: u64,
    /// Distinct tool manifests kept (sessions registering the same tools share one); past it,
    /// a new one is refused with 503 `at_capacity` naming this setting.
    #[arg(long, env = ENV_MAX_MANIFESTS, default_value_t = DEFAULT_MAX_MANIFESTS as u64, value_parser = clap::value_parser!(u64).range(1..))]
    pub max_manifests: u64,
    /// Seconds between heartbeats to connected providers.
    #[arg(long, env = ENV_HEARTBEAT, default_value_t = 25, value_parser = clap::value_parser!(u64).range(1..))]
    pub heartbeat_seconds: u64,
    /// Seconds between a replica's records of itself as alive and slides of its tabs'
    /// sessions that are due (each one pipeline).
    #[arg(long, env = ENV_TAB_REFRESH, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..))]
    pub tab_refresh_seconds: u64,
    /// Seconds between a replica's looks at its busy or doubtful tabs' sessions.
    #[arg(long, env = ENV_TAB_SWEEP, default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..))]
    pub tab_sweep_seconds: u64,
    /// Calls one caller may make to one session per minute.
    #[arg(long, env = ENV_RATE_LIMIT_REQUEST, default_value_t = RateLimits::default().calls_per_code)]
    pub rate_limit_request_per_code: NonZeroU32,
    /// Look-ups of unknown session codes one caller may make per minute.
    #[arg(long, env = ENV_RATE_LIMIT_LOOKUP_CALLER, default_value_t = RateLimits::default().lookups_per_caller)]
    pub rate_limit_lookup_per_caller: NonZeroU32,
    /// Look-ups of unknown session codes the callers at one client address may make per
    /// minute together; past it, that address is refused look-ups of codes (not of handles).
    #[arg(long, env = ENV_RATE_LIMIT_LOOKUP, default_value_t = RateLimits::default().lookups_per_ip)]
    pub rate_limit_lookup_per_ip: NonZeroU32,
    /// Megabytes of finished calls' answers kept (the oldest go first; their calls are still
    /// known, and a repeated requestId is not run again).
    #[arg(long, env = ENV_RESPONSE_BUDGET, default_value_t = 64, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub response_budget_mb: u64,
    /// The share of the answer budget one session's answers may take, as a fraction (`1/8`)
    /// or a decimal (`0.125`); past it, that session's own oldest answers go first.
    #[arg(long, env = ENV_RESPONSE_SESSION_SHARE, default_value = "1/8", value_parser = parse_share)]
    pub response_session_share: f64,
    /// No longer used: a gateway proves itself with GATEWAY_SECRET. Set without a secret, the
    /// relay refuses to start.
    #[arg(long, env = ENV_TRUSTED_GATEWAYS, hide = true)]
    pub trusted_gateways: Option<String>,
}

/// A share such as `1/8` or `0.125` (checked to lie in (0, 1] by [`RelayConfig::validate`]).
fn parse_share(text: &str) -> Result<f64, String> {
    let number = |part: &str| {
        part.trim()
            .parse::<f64>()
            .map_err(|error| error.to_string())
    };
    let share = match text.split_once('/') {
        Some((numerator, denominator)) => number(numerator)? / number(denominator)?,
        None => number(text)?,
    };
    if share.is_finite() {
        Ok(share)
    } else {
        Err(format!("{text} is not a share such as 1/8 or 0.125"))
    }
}

/// How long a stopping server waits for the calls its tabs have received, unless told
/// (`DRAIN_SECONDS`).
pub const DEFAULT_DRAIN_SECONDS: u64 = 10;

/// Settings every server binary has: the JSON nesting limit and the drain on shutdown.
#[derive(Debug, Clone, Args)]
pub struct ServiceArgs {
    /// Deepest nesting of JSON accepted in arguments, answers and manifests.
    #[arg(long, env = ENV_MAX_JSON_DEPTH, default_value_t = DEFAULT_MAX_JSON_DEPTH)]
    pub max_json_depth: usize,
    /// Seconds a stopping server waits for calls its tabs have received to be answered.
    #[arg(long, env = ENV_DRAIN_SECONDS, default_value_t = DEFAULT_DRAIN_SECONDS, value_parser = clap::value_parser!(u64).range(0..=3600))]
    pub drain_seconds: u64,
    /// Length of the IPv6 prefix one client is keyed by in every per-address budget and cap
    /// (one home or office line gets a /64); IPv4 addresses are keyed whole.
    #[arg(long, env = ENV_GUARD_IPV6_PREFIX, default_value_t = crate::limits::DEFAULT_IPV6_PREFIX, value_parser = clap::value_parser!(u8).range(1..=128))]
    pub guard_ipv6_prefix: u8,
    /// Where the state shared by several replicas lives, when in Redis.
    #[command(flatten)]
    pub redis: RedisArgs,
    /// Sessions one caller may create per minute.
    #[arg(long, env = ENV_RATE_LIMIT_SESSION_CALLER, default_value_t = RateLimits::default().sessions_per_caller)]
    pub rate_limit_session_per_caller: NonZeroU32,
    /// Sessions the callers at one client address (and an IPv6 /48) may create per minute
    /// together.
    #[arg(long, env = ENV_RATE_LIMIT_SESSION, default_value_t = RateLimits::default().sessions_per_ip)]
    pub rate_limit_session_per_ip: NonZeroU32,
    /// Built-in tool calls (outside a session) one caller may make per minute.
    #[arg(long, env = ENV_RATE_LIMIT_TOOL_CALLER, default_value_t = RateLimits::default().tools_per_caller)]
    pub rate_limit_tool_per_caller: NonZeroU32,
    /// Built-in tool calls the callers at one client address may make per minute together.
    #[arg(long, env = ENV_RATE_LIMIT_TOOL, default_value_t = RateLimits::default().tools_per_ip)]
    pub rate_limit_tool_per_ip: NonZeroU32,
    /// API keys the LLM-facing routes (calls, metadata, built-in tools, MCP) and gRPC consumer
    /// RPCs require as `Authorization: Bearer <key>`, comma-separated. Unset: they are open.
    #[arg(long, env = ENV_API_KEYS, value_delimiter = ',', hide_env_values = true)]
    pub api_keys: Vec<String>,
    /// A file of API keys, one per line (`#` starts a comment).
    #[arg(long, env = ENV_API_KEYS_FILE)]
    pub api_keys_file: Option<std::path::PathBuf>,
    /// Secrets a gateway proves itself to the relay with, comma-separated: the relay believes
    /// the client address a gateway names only with one of them; a gateway sends the first.
    #[arg(long, env = ENV_GATEWAY_SECRET, value_delimiter = ',', hide_env_values = true)]
    pub gateway_secret: Vec<String>,
    /// A file holding the gateway secrets (comma- or line-separated), e.g. a mounted Secret.
    #[arg(long, env = ENV_GATEWAY_SECRET_FILE)]
    pub gateway_secret_file: Option<std::path::PathBuf>,
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
    /// The API keys (`API_KEYS`, `API_KEYS_FILE`), when set; errors name the variable.
    pub fn api_keys(&self) -> Result<Option<Arc<ApiKeys>>, String> {
        ApiKeys::load(&self.api_keys, self.api_keys_file.as_deref())
    }

    /// The budgets a front door spends (sessions and built-in tool calls, per caller and
    /// address); the others at their defaults.
    pub fn front_door_limits(&self) -> RateLimits {
        RateLimits {
            sessions_per_caller: self.rate_limit_session_per_caller,
            sessions_per_ip: self.rate_limit_session_per_ip,
            tools_per_caller: self.rate_limit_tool_per_caller,
            tools_per_ip: self.rate_limit_tool_per_ip,
            ipv6_prefix: self.guard_ipv6_prefix,
            ..RateLimits::default()
        }
    }

    /// The gateway secrets (`GATEWAY_SECRET`, `GATEWAY_SECRET_FILE`), when set; errors name
    /// the variable.
    pub fn gateway_secrets(&self) -> Result<Option<Arc<GatewaySecrets>>, String> {
        GatewaySecrets::load(&self.gateway_secret, self.gateway_secret_file.as_deref())
    }

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
            ipv6_prefix: self.guard_ipv6_prefix,
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

    /// Where the shared state lives (`REDIS_*`, see [`RedisArgs`]). An empty `REDIS_URL` is
    /// refused: a fleet whose Secret lost its URL would otherwise run each replica on a state
    /// of its own.
    pub fn store_config(&self) -> Result<StoreConfig, String> {
        Ok(self
            .redis
            .settings()?
            .map_or(StoreConfig::Memory, |settings| {
                StoreConfig::Redis(Box::new(settings))
            }))
    }

    /// [`ServiceArgs::store_config`], routing calls between replicas when `REPLICA_URL` is set:
    /// only on Redis, and only with the secret the replicas prove themselves with.
    pub fn routed_store_config(
        &self,
        secrets: Option<&GatewaySecrets>,
    ) -> Result<StoreConfig, String> {
        let mut store = self.store_config()?;
        let Some(url) = self.redis.replica_url.as_deref().map(str::trim) else {
            return Ok(store);
        };
        let StoreConfig::Redis(settings) = &mut store else {
            return Err(format!(
                "{ENV_REPLICA_URL} routes calls between replicas sharing Redis: set REDIS_URL (or the Sentinel or Cluster settings) too, or unset {ENV_REPLICA_URL}"
            ));
        };
        let Some(secrets) = secrets else {
            return Err(format!(
                "{ENV_REPLICA_URL} routes calls between replicas, which prove themselves to each other with {ENV_GATEWAY_SECRET}: set {ENV_GATEWAY_SECRET} (or {ENV_GATEWAY_SECRET_FILE}) to the same secret on every replica and gateway"
            ));
        };
        let usable = url
            .parse::<tonic::codegen::http::Uri>()
            .ok()
            .filter(|uri| matches!(uri.scheme_str(), Some("http" | "https")))
            .and_then(|uri| uri.port_u16().map(|_| uri.host().is_some()))
            .unwrap_or(false);
        if !usable {
            return Err(format!(
                "{ENV_REPLICA_URL} must be where other replicas reach this one's gRPC, with scheme and port, such as http://10.0.0.7:50051 (got {url:?})"
            ));
        }
        settings.routing = Some(Routing {
            url: url.to_owned(),
            proof: secrets.current().to_owned(),
        });
        Ok(store)
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
        let gateway_secrets = service.gateway_secrets()?;
        if self.trusted_gateways.is_some() {
            if gateway_secrets.is_none() {
                return Err(format!(
                    "{ENV_TRUSTED_GATEWAYS} is no longer used: a gateway proves itself with {ENV_GATEWAY_SECRET}. Set {ENV_GATEWAY_SECRET} (or {ENV_GATEWAY_SECRET_FILE}) to the same secret on the relay and its gateways, and remove {ENV_TRUSTED_GATEWAYS}"
                ));
            }
            tracing::warn!(
                "{ENV_TRUSTED_GATEWAYS} is no longer used (gateways prove themselves with {ENV_GATEWAY_SECRET}): remove it"
            );
        }
        let store = service.routed_store_config(gateway_secrets.as_deref())?;
        let config = RelayConfig {
            max_json_depth: service.max_json_depth,
            drain_timeout: service.drain_timeout(),
            limits: RateLimits {
                lookups_per_caller: self.rate_limit_lookup_per_caller,
                lookups_per_ip: self.rate_limit_lookup_per_ip,
                calls_per_code: self.rate_limit_request_per_code,
                sessions_per_ip: service.rate_limit_session_per_ip,
                ..service.front_door_limits()
            },
            api_keys: service.api_keys()?,
            gateway_secrets,
            response_budget: usize::try_from(self.response_budget_mb)
                .unwrap_or(usize::MAX / (1024 * 1024))
                .saturating_mul(1024 * 1024),
            response_session_share: self.response_session_share,
            session_ttl: Duration::from_secs(self.session_ttl_seconds),
            session_max_lifetime: Duration::from_secs(self.session_max_lifetime_seconds),
            claim_ttl: Duration::from_secs(self.claim_ttl_seconds),
            request_timeout: Duration::from_secs(self.request_timeout_seconds),
            approval_timeout: Duration::from_secs(self.approval_timeout_seconds),
            max_pending_per_session: usize::try_from(self.max_pending_per_session)
                .unwrap_or(usize::MAX),
            max_sessions: usize::try_from(self.max_sessions).unwrap_or(usize::MAX),
            max_claims: usize::try_from(self.max_claims).unwrap_or(usize::MAX),
            max_manifests: usize::try_from(self.max_manifests).unwrap_or(usize::MAX),
            heartbeat_interval: Duration::from_secs(self.heartbeat_seconds),
            tab_refresh: Duration::from_secs(self.tab_refresh_seconds),
            tab_sweep: Duration::from_secs(self.tab_sweep_seconds),
            store,
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
        let cli = Cli::try_parse_from(["relay", "--trusted-gateways", "10.0.0.0/8"]).unwrap();
        let message = cli.config().unwrap_err();
        assert!(message.contains(ENV_GATEWAY_SECRET), "{message}");
    }

    #[test]
    fn a_sessions_share_of_the_answer_budget_is_a_fraction_or_a_decimal() {
        let cli = Cli::try_parse_from(["relay"]).unwrap();
        assert!((cli.config().unwrap().response_session_share - 0.125).abs() < 1e-12);
        let cli = Cli::try_parse_from(["relay", "--response-session-share", "0.5"]).unwrap();
        assert!((cli.config().unwrap().response_session_share - 0.5).abs() < 1e-12);
        for bad in ["0", "3/2", "-1/4"] {
            let flag = format!("--response-session-share={bad}");
            let cli = Cli::try_parse_from(["relay", flag.as_str()]).unwrap();
            let message = cli.config().unwrap_err();
            assert!(message.contains(ENV_RESPONSE_SESSION_SHARE), "{message}");
        }
        assert!(Cli::try_parse_from(["relay", "--response-session-share", "1/0"]).is_err());
        assert!(Cli::try_parse_from(["relay", "--response-session-share", "half"]).is_err());
    }

    #[test]
    fn ipv6_clients_are_keyed_by_a_prefix_of_the_configured_length() {
        let cli = Cli::try_parse_from(["relay"]).unwrap();
        assert_eq!(cli.config().unwrap().limits.ipv6_prefix, 64);
        let cli = Cli::try_parse_from(["relay", "--guard-ipv6-prefix", "56"]).unwrap();
        assert_eq!(cli.config().unwrap().limits.ipv6_prefix, 56);
        let error = Cli::try_parse_from(["relay", "--guard-ipv6-prefix", "129"])
            .err()
            .unwrap()
            .to_string();
        assert!(error.contains("129"), "{error}");
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
