//! The gateway's settings: a typed struct with defaults and validation, and the command-line
//! flags (each mirroring an environment variable) that fill it.

use std::net::SocketAddr;
use std::num::NonZeroU32;
use std::time::Duration;

use clap::Args;
use toolrelay_relay::front::GatewaySecrets;
use toolrelay_relay::front::config::{
    DEFAULT_MAX_JSON_DEPTH, ServiceArgs, StoreConfig, check_json_depth,
};
pub use toolrelay_relay::front::config::{
    ENV_API_KEYS, ENV_API_KEYS_FILE, ENV_GATEWAY_SECRET, ENV_GATEWAY_SECRET_FILE,
    ENV_RATE_LIMIT_SESSION, ENV_RATE_LIMIT_TOOL,
};
use toolrelay_relay::front::serve::ConnectionLimits;

/// `LISTEN_ADDR`: the public HTTP address.
pub const ENV_LISTEN: &str = "LISTEN_ADDR";
/// `RELAY_URL`: the relay's gRPC URL; unset means the relay runs in this process.
pub const ENV_RELAY_URL: &str = "RELAY_URL";
/// `PUBLIC_BASE_URL`: the URL people and LLMs reach the gateway at.
pub const ENV_PUBLIC_BASE_URL: &str = "PUBLIC_BASE_URL";
/// `CORS_ORIGIN`: origins allowed to call the browser-facing routes, comma-separated; when set,
/// the provider routes (open to every origin by default) are narrowed to them too.
pub const ENV_CORS_ORIGIN: &str = "CORS_ORIGIN";
/// `TRUSTED_PROXIES`: addresses whose `X-Forwarded-For` is believed, comma-separated.
pub const ENV_TRUSTED_PROXIES: &str = "TRUSTED_PROXIES";
/// `SHARED_EGRESS_RANGES`: address ranges (CIDR) that carry many people (a hosted assistant's
/// egress, a school's NAT), where an assistant's per-user header names the caller.
pub const ENV_SHARED_EGRESS_RANGES: &str = "SHARED_EGRESS_RANGES";
/// `MCP_SESSIONS_PER_IP`: live MCP client sessions one client address may hold.
pub const ENV_MCP_SESSIONS_PER_IP: &str = "MCP_SESSIONS_PER_IP";
/// `MCP_MAX_SESSIONS`: live MCP client sessions of every client together, across gateways.
pub const ENV_MCP_MAX_SESSIONS: &str = "MCP_MAX_SESSIONS";
/// `MCP_SESSION_IDLE_SECONDS`: how long an unused MCP client session lives.
pub const ENV_MCP_SESSION_IDLE: &str = "MCP_SESSION_IDLE_SECONDS";
/// `CODAP_URL`: the CODAP that `open_codap`'s app frames (and its fallback link opens).
pub const ENV_CODAP_URL: &str = "CODAP_URL";
/// `APP_HOSTS`: the origins of the conversations that render MCP Apps (whose pages may frame
/// `open_codap`'s CODAP without the plugin asking the person first).
pub const ENV_APP_HOSTS: &str = "APP_HOSTS";
/// The hosts known to render `open_codap`'s app unless `APP_HOSTS` says otherwise.
pub const DEFAULT_APP_HOSTS: [&str; 2] = ["https://claude.ai", "https://chatgpt.com"];
/// The CODAP `open_codap` opens unless `CODAP_URL` says otherwise.
pub const DEFAULT_CODAP_URL: &str = "https://codap3.concord.org/";

/// `ALLOWED_HOSTS`: host names the gateway answers to besides the public host and loopback,
/// comma-separated (e.g. `host.docker.internal`).
pub const ENV_ALLOWED_HOSTS: &str = "ALLOWED_HOSTS";

/// Names a gateway always answers to (a `Host` check never refuses them).
const LOOPBACK_HOSTS: [&str; 3] = ["localhost", "127.0.0.1", "::1"];

/// The CODAP origins allowed by default, besides the gateway's own.
const CODAP_ORIGINS: [&str; 2] = ["https://codap.concord.org", "https://codap3.concord.org"];

/// Largest body of an LLM-side request (a call with its arguments).
pub const MAX_CALL_BODY: usize = 256 * 1024;
/// Largest body a provider may send (a tool's response, a manifest).
pub const MAX_PROVIDER_BODY: usize = 1024 * 1024 + 64 * 1024;

/// The gateway's command-line flags.
#[derive(Debug, Clone, Args)]
pub struct GatewayArgs {
    /// Public HTTP address: the REST API, SSE, polling and the browser WebSocket.
    #[arg(long, env = ENV_LISTEN, default_value = "127.0.0.1:8080")]
    pub listen: SocketAddr,
    /// The relay's gRPC URL, e.g. http://relay:50051 (split deployment). `toolrelay` runs the
    /// relay in its own process when this is unset; `toolrelay-gateway` needs it.
    #[arg(long, env = ENV_RELAY_URL)]
    pub relay_url: Option<String>,
    /// The URL the gateway is reached at from outside, e.g. https://relay.example.org (used in
    /// the OpenAPI spec, the discovery document and the MCP host check). Default: http://LISTEN.
    #[arg(long, env = ENV_PUBLIC_BASE_URL)]
    pub public_base_url: Option<String>,
    /// Origins allowed to call the browser-facing routes, comma-separated. Default: the CODAP
    /// origins and the public base URL's, and every origin on the provider routes (pages using
    /// the browser SDK); setting it narrows those routes to the same origins.
    #[arg(long, env = ENV_CORS_ORIGIN, value_delimiter = ',')]
    pub cors_origin: Vec<String>,
    /// Proxies (addresses or CIDR networks, comma-separated) whose X-Forwarded-For header is
    /// trusted.
    #[arg(long, env = ENV_TRUSTED_PROXIES, value_delimiter = ',', value_parser = toolrelay_relay::front::limits::parse_network)]
    pub trusted_proxies: Vec<ipnet::IpNet>,
    /// Address ranges (CIDR, comma-separated) that carry many people, such as a hosted
    /// assistant's published egress ranges: a plain REST caller from one is told apart by its
    /// assistant's per-user header (`openai-ephemeral-user-id`), elsewhere by its address.
    #[arg(long, env = ENV_SHARED_EGRESS_RANGES, value_delimiter = ',', value_parser = toolrelay_relay::front::limits::parse_network)]
    pub shared_egress_ranges: Vec<ipnet::IpNet>,
    /// Live MCP client sessions one client address (an IPv6 /64) may hold, its callers
    /// together (a flood ceiling sized for a hosted assistant's egress); past it,
    /// `initialize` gets 429.
    #[arg(long, env = ENV_MCP_SESSIONS_PER_IP, default_value_t = McpSessions::default().per_address)]
    pub mcp_sessions_per_ip: NonZeroU32,
    /// Live MCP client sessions of every client together, across the gateways sharing a
    /// store; past it, `initialize` gets 503.
    #[arg(long, env = ENV_MCP_MAX_SESSIONS, default_value_t = McpSessions::default().total)]
    pub mcp_max_sessions: NonZeroU32,
    /// Seconds an unused MCP client session lives (in the gateway and in the store).
    #[arg(long, env = ENV_MCP_SESSION_IDLE, default_value_t = McpSessions::default().idle.as_secs())]
    pub mcp_session_idle_seconds: u64,
    /// Host names the gateway answers to besides the public base URL's host and loopback,
    /// comma-separated (e.g. host.docker.internal). Requests naming another `Host` are refused
    /// (421) when the gateway listens on loopback, and always on MCP.
    #[arg(long, env = ENV_ALLOWED_HOSTS, value_delimiter = ',')]
    pub allowed_hosts: Vec<String>,
    /// The CODAP that MCP's `open_codap` opens in the conversation (its app frames it with the
    /// relay's plugin), e.g. https://codap3.concord.org/.
    #[arg(long, env = ENV_CODAP_URL, default_value = DEFAULT_CODAP_URL)]
    pub codap_url: String,
    /// Origins of the conversations known to render `open_codap`'s app, comma-separated
    /// (default https://claude.ai,https://chatgpt.com). The plugin, loaded for a claim inside
    /// a CODAP that is itself framed under one of them, pairs without asking; anywhere else
    /// it asks the person first.
    #[arg(long, env = ENV_APP_HOSTS, value_delimiter = ',')]
    pub app_hosts: Vec<String>,
}

/// The gateway's settings.
#[derive(Debug, Clone)]
pub struct GatewayConfig {
    /// The URL the gateway is reached at, without a trailing slash.
    pub public_base_url: String,
    /// Origins allowed by CORS on the browser-facing routes.
    pub cors_origins: Vec<String>,
    /// Whether any origin may call the provider routes (create a session, attach, register,
    /// answer): true unless the operator narrowed CORS with `CORS_ORIGIN`.
    pub open_provider_routes: bool,
    /// Rate limits, per minute.
    pub limits: RateLimits,
    /// Proxies whose `X-Forwarded-For` is believed.
    pub trusted_proxies: Vec<ipnet::IpNet>,
    /// Ranges carrying many people, where an assistant's per-user header names the caller
    /// (`SHARED_EGRESS_RANGES`).
    pub shared_egress: Vec<ipnet::IpNet>,
    /// Host names answered to besides the public host and loopback (`ALLOWED_HOSTS`).
    pub allowed_hosts: Vec<String>,
    /// Whether every route checks `Host` (against [`GatewayConfig::host_names`]): when the
    /// gateway listens on loopback, where a DNS-rebinding page could reach it.
    pub check_host: bool,
    /// Largest response a provider may send over the WebSocket.
    pub max_provider_body: usize,
    /// Deepest JSON nesting accepted (`MAX_JSON_DEPTH`).
    pub max_json_depth: usize,
    /// Keys the LLM-facing routes require, when the operator set some.
    pub api_keys: Option<std::sync::Arc<crate::middleware::auth::ApiKeys>>,
    /// The secrets a gateway in front of a relay elsewhere proves itself with (it sends the
    /// first), so that the relay believes the client addresses it names.
    pub gateway_secrets: Option<std::sync::Arc<GatewaySecrets>>,
    /// Caps and idle time of MCP client sessions.
    pub mcp_sessions: McpSessions,
    /// The CODAP `open_codap` opens (`CODAP_URL`), as given (with a path, at least `/`).
    pub codap_url: String,
    /// Origins of the conversations known to render `open_codap`'s app (`APP_HOSTS`).
    pub app_hosts: Vec<String>,
    /// Where a gateway alone keeps what it shares with other gateways (rate limits, MCP
    /// sessions): `REDIS_URL`. In one process, the relay's store serves.
    pub store: StoreConfig,
    /// What the public listener allows a connection (trusted proxies have no per-address
    /// cap: their connections carry many clients).
    pub connections: ConnectionLimits,
}

/// Rate limits, per minute: the relay's, of which the gateway spends the sessions and built-in
/// tool calls.
pub use toolrelay_relay::front::limits::RateLimits;

/// Caps and idle time of MCP client sessions.
#[derive(Debug, Clone, Copy)]
pub struct McpSessions {
    /// Live sessions per client address (`MCP_SESSIONS_PER_IP`).
    pub per_address: NonZeroU32,
    /// Live sessions in total (`MCP_MAX_SESSIONS`).
    pub total: NonZeroU32,
    /// How long an unused session lives (`MCP_SESSION_IDLE_SECONDS`).
    pub idle: Duration,
    /// The IPv6 prefix one client is keyed by.
    pub ipv6_prefix: u8,
}

impl Default for McpSessions {
    fn default() -> Self {
        Self {
            per_address: NonZeroU32::new(2_000).unwrap_or(NonZeroU32::MIN),
            total: NonZeroU32::new(20_000).unwrap_or(NonZeroU32::MIN),
            idle: Duration::from_secs(120),
            ipv6_prefix: toolrelay_relay::front::limits::DEFAULT_IPV6_PREFIX,
        }
    }
}

impl GatewayConfig {
    /// Defaults for a gateway at `public_base_url`.
    pub fn new(public_base_url: &str) -> Result<Self, String> {
        let public_base_url = checked_base_url(public_base_url)?;
        Ok(Self {
            cors_origins: default_origins(&public_base_url),
            open_provider_routes: true,
            public_base_url,
            limits: RateLimits::default(),
            trusted_proxies: Vec::new(),
            shared_egress: Vec::new(),
            allowed_hosts: Vec::new(),
            check_host: true,
            max_provider_body: MAX_PROVIDER_BODY,
            max_json_depth: DEFAULT_MAX_JSON_DEPTH,
            api_keys: None,
            gateway_secrets: None,
            mcp_sessions: McpSessions::default(),
            codap_url: DEFAULT_CODAP_URL.to_owned(),
            app_hosts: DEFAULT_APP_HOSTS.map(str::to_owned).to_vec(),
            store: StoreConfig::Memory,
            connections: ConnectionLimits::default(),
        })
    }
}

impl GatewayArgs {
    /// The settings these flags describe, validated; errors name the variable to fix.
    /// `bound` is the address the public listener got (the real port when `LISTEN_ADDR`
    /// asked for port 0); the public base URL defaults to it.
    pub fn gateway_config(
        &self,
        bound: SocketAddr,
        service: &ServiceArgs,
    ) -> Result<GatewayConfig, String> {
        let base = self
            .public_base_url
            .clone()
            .unwrap_or_else(|| format!("http://{bound}"));
        let mut config =
            GatewayConfig::new(&base).map_err(|error| format!("{ENV_PUBLIC_BASE_URL}: {error}"))?;
        if !self.cors_origin.is_empty() {
            let own = origin_of(&config.public_base_url);
            let mut origins = self
                .cors_origin
                .iter()
                .map(|origin| {
                    checked_base_url(origin).map_err(|error| format!("{ENV_CORS_ORIGIN}: {error}"))
                })
                .collect::<Result<Vec<_>, _>>()?;
            if !origins.contains(&own) {
                origins.push(own);
            }
            config.cors_origins = origins;
            config.open_provider_routes = false;
        }
        config.limits = service.front_door_limits();
        check_json_depth(service.max_json_depth)?;
        config.max_json_depth = service.max_json_depth;
        config.api_keys = service.api_keys()?;
        config.gateway_secrets = service.gateway_secrets()?;
        config.trusted_proxies.clone_from(&self.trusted_proxies);
        config.shared_egress.clone_from(&self.shared_egress_ranges);
        if self.mcp_session_idle_seconds == 0 {
            return Err(format!("{ENV_MCP_SESSION_IDLE}: must be at least 1 second"));
        }
        config.mcp_sessions = McpSessions {
            per_address: self.mcp_sessions_per_ip,
            total: self.mcp_max_sessions,
            idle: Duration::from_secs(self.mcp_session_idle_seconds),
            ipv6_prefix: service.guard_ipv6_prefix,
        };
        config.allowed_hosts = self
            .allowed_hosts
            .iter()
            .map(|host| host.trim().to_owned())
            .filter(|host| !host.is_empty())
            .collect();
        if let Some(bad) = config.allowed_hosts.iter().find(|host| host.contains('/')) {
            return Err(format!(
                "{ENV_ALLOWED_HOSTS}: {bad:?} is not a host name (give names such as host.docker.internal, without a scheme or path)"
            ));
        }
        config.codap_url = checked_codap_url(&self.codap_url)?;
        let app_hosts = self.app_hosts.iter().map(|host| host.trim());
        let app_hosts: Vec<_> = app_hosts.filter(|host| !host.is_empty()).collect();
        if !app_hosts.is_empty() {
            config.app_hosts = app_hosts
                .into_iter()
                .map(|host| {
                    checked_base_url(host)
                        .map(|url| origin_of(&url))
                        .map_err(|error| format!("{ENV_APP_HOSTS}: {error}"))
                })
                .collect::<Result<_, _>>()?;
        }
        config.check_host = bound.ip().is_loopback();
        config.store = service.store_config()?;
        config.connections = ConnectionLimits {
            uncapped: self.trusted_proxies.clone(),
            ..service.connection_limits()?
        };
        Ok(config)
    }
}

impl GatewayConfig {
    /// The origin of the CODAP `open_codap` opens, e.g. `https://codap3.concord.org`.
    pub fn codap_origin(&self) -> String {
        origin_of(&self.codap_url)
    }

    /// The names the gateway answers to, in lower case and without brackets: loopback, the
    /// public base URL's host, and `ALLOWED_HOSTS`. The REST `Host` check and MCP's share it.
    pub fn host_names(&self) -> Vec<String> {
        let public = self
            .public_base_url
            .parse::<poem::http::Uri>()
            .ok()
            .and_then(|uri| uri.host().map(str::to_owned));
        LOOPBACK_HOSTS
            .iter()
            .map(|host| (*host).to_owned())
            .chain(public)
            .chain(self.allowed_hosts.iter().cloned())
            .map(|host| bare_host(&host).to_ascii_lowercase())
            .collect()
    }
}

/// The host of a `Host` header value (or an authority): without its port, without the
/// brackets of an IPv6 address, without a trailing dot.
pub fn bare_host(authority: &str) -> &str {
    let authority = authority.trim();
    let host = match authority.strip_prefix('[') {
        Some(rest) => rest.split(']').next().unwrap_or(rest),
        // One colon: a port; more: an IPv6 address without brackets.
        None => match authority.split_once(':') {
            Some((host, port)) if !port.contains(':') => host,
            _ => authority,
        },
    };
    host.strip_suffix('.').unwrap_or(host)
}

fn default_origins(public_base_url: &str) -> Vec<String> {
    let own = origin_of(public_base_url);
    CODAP_ORIGINS
        .iter()
        .map(|origin| (*origin).to_owned())
        .chain(std::iter::once(own))
        .collect()
}

/// `scheme://host[:port]` of a URL.
fn origin_of(url: &str) -> String {
    match url.find("://") {
        Some(at) => {
            let rest = &url[at + 3..];
            let end = rest.find('/').map_or(url.len(), |slash| at + 3 + slash);
            url[..end].to_owned()
        }
        None => url.to_owned(),
    }
}

/// `CODAP_URL` checked: an http(s) URL with a host, kept as given but with at least `/` as
/// its path (CODAP is opened as `{url}?di=…`).
fn checked_codap_url(url: &str) -> Result<String, String> {
    checked_base_url(url).map_err(|error| format!("{ENV_CODAP_URL}: {error}"))?;
    let url = url.trim();
    let after_scheme = url.split_once("://").map_or(url, |(_, rest)| rest);
    if after_scheme.contains(['/', '?']) {
        Ok(url.to_owned())
    } else {
        Ok(format!("{url}/"))
    }
}

/// An http(s) URL with a host, without a trailing slash.
fn checked_base_url(url: &str) -> Result<String, String> {
    let trimmed = url.trim().trim_end_matches('/');
    let uri: poem::http::Uri = trimmed
        .parse()
        .map_err(|error| format!("{url:?} is not a URL: {error}"))?;
    match (uri.scheme_str(), uri.host()) {
        (Some("http" | "https"), Some(host)) if !host.is_empty() => Ok(trimmed.to_owned()),
        _ => Err(format!(
            "{url:?} must be an http:// or https:// URL with a host"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base_urls_are_checked_and_trimmed() {
        assert_eq!(
            checked_base_url("https://relay.example.org/").unwrap(),
            "https://relay.example.org"
        );
        assert!(checked_base_url("relay.example.org").is_err());
        assert!(checked_base_url("ftp://relay.example.org").is_err());
        assert_eq!(
            checked_codap_url("https://codap3.concord.org").unwrap(),
            "https://codap3.concord.org/"
        );
        assert_eq!(
            checked_codap_url(" https://codap.concord.org/app/ ").unwrap(),
            "https://codap.concord.org/app/"
        );
        assert!(
            checked_codap_url("codap.concord.org")
                .unwrap_err()
                .contains(ENV_CODAP_URL)
        );
    }

    /// The settings of a gateway bound to 127.0.0.1:8080 started with the flags `args`.
    fn parsed(args: &[&str]) -> Result<GatewayConfig, String> {
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            gateway: GatewayArgs,
            #[command(flatten)]
            service: ServiceArgs,
        }
        let bound: SocketAddr = "127.0.0.1:8080".parse().unwrap();
        let cli = <Cli as clap::Parser>::try_parse_from(args).unwrap();
        cli.gateway.gateway_config(bound, &cli.service)
    }

    #[test]
    fn cors_origin_narrows_the_provider_routes_too() {
        let config = |args: &[&str]| parsed(args).unwrap();
        assert!(config(&["toolrelay"]).open_provider_routes);
        let proxied = config(&["toolrelay", "--trusted-proxies", "10.0.0.0/8"]);
        assert_eq!(
            proxied.connections.uncapped,
            ["10.0.0.0/8".parse::<ipnet::IpNet>().unwrap()],
            "a trusted proxy carries many clients: no per-address cap"
        );
        let narrowed = config(&["toolrelay", "--cors-origin", "https://lab.example.org"]);
        assert!(!narrowed.open_provider_routes);
        assert_eq!(
            narrowed.cors_origins,
            ["https://lab.example.org", "http://127.0.0.1:8080"]
        );
    }

    #[test]
    fn mcp_session_settings_are_read_and_checked() {
        let config = parsed;
        let defaults = config(&["toolrelay"]).unwrap().mcp_sessions;
        assert_eq!(
            (
                defaults.per_address.get(),
                defaults.total.get(),
                defaults.idle
            ),
            (2_000, 20_000, Duration::from_secs(120))
        );
        let set = config(&[
            "toolrelay",
            "--mcp-sessions-per-ip",
            "3",
            "--mcp-max-sessions",
            "50",
            "--mcp-session-idle-seconds",
            "5",
        ])
        .unwrap()
        .mcp_sessions;
        assert_eq!(
            (set.per_address.get(), set.total.get(), set.idle),
            (3, 50, Duration::from_secs(5))
        );
        let error = config(&["toolrelay", "--mcp-session-idle-seconds", "0"]).unwrap_err();
        assert!(error.contains(ENV_MCP_SESSION_IDLE), "{error}");
    }

    #[test]
    fn hosts_are_loopback_the_public_host_and_the_allowed_ones() {
        let mut config = GatewayConfig::new("https://Relay.Example.org:8443/base").unwrap();
        config.allowed_hosts = vec!["host.docker.internal".into()];
        assert_eq!(
            config.host_names(),
            [
                "localhost",
                "127.0.0.1",
                "::1",
                "relay.example.org",
                "host.docker.internal"
            ]
        );
        assert_eq!(bare_host("[::1]:8080"), "::1");
        assert_eq!(bare_host("localhost:8080"), "localhost");
        assert_eq!(bare_host("relay.example.org."), "relay.example.org");
        assert_eq!(bare_host("::1"), "::1");
    }

    #[test]
    fn default_origins_are_codap_and_our_own() {
        let config = GatewayConfig::new("https://relay.example.org/base").unwrap();
        assert_eq!(
            config.cors_origins,
            [
                "https://codap.concord.org",
                "https://codap3.concord.org",
                "https://relay.example.org"
            ]
        );
    }
}
