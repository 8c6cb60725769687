//! The gateway's settings: a typed struct with defaults and validation, and the command-line
//! flags (each mirroring an environment variable) that fill it.

use std::net::SocketAddr;
use std::num::NonZeroU32;

use clap::Args;
use toolrelay_relay::config::{DEFAULT_MAX_JSON_DEPTH, ServiceArgs, StoreConfig, check_json_depth};
use toolrelay_relay::listen::ConnectionLimits;

/// `LISTEN_ADDR`: the public HTTP address.
pub const ENV_LISTEN: &str = "LISTEN_ADDR";
/// `RELAY_URL`: the relay's gRPC URL; unset means the relay runs in this process.
pub const ENV_RELAY_URL: &str = "RELAY_URL";
/// `PUBLIC_BASE_URL`: the URL people and LLMs reach the gateway at.
pub const ENV_PUBLIC_BASE_URL: &str = "PUBLIC_BASE_URL";
/// `CORS_ORIGIN`: origins allowed to call the browser-facing routes, comma-separated; when set,
/// the provider routes (open to every origin by default) are narrowed to them too.
pub const ENV_CORS_ORIGIN: &str = "CORS_ORIGIN";
/// `RATE_LIMIT_SESSION_PER_IP`: sessions one address may create per minute.
pub const ENV_RATE_LIMIT_SESSION: &str = "RATE_LIMIT_SESSION_PER_IP";
/// `RATE_LIMIT_TOOL_PER_IP`: built-in tool calls (outside a session) one address may make per
/// minute.
pub const ENV_RATE_LIMIT_TOOL: &str = "RATE_LIMIT_TOOL_PER_IP";
/// `TRUSTED_PROXIES`: addresses whose `X-Forwarded-For` is believed, comma-separated.
pub const ENV_TRUSTED_PROXIES: &str = "TRUSTED_PROXIES";
/// `API_KEYS`: keys the LLM-facing routes require, comma-separated (unset: open).
pub const ENV_API_KEYS: &str = "API_KEYS";
/// `API_KEYS_FILE`: a file of such keys, one per line.
pub const ENV_API_KEYS_FILE: &str = "API_KEYS_FILE";

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
    /// Sessions one client address may create per minute.
    #[arg(long, env = ENV_RATE_LIMIT_SESSION, default_value_t = NonZeroU32::new(30).unwrap_or(NonZeroU32::MIN))]
    pub rate_limit_session_per_ip: NonZeroU32,
    /// Built-in tool calls (outside a session) one client address may make per minute.
    #[arg(long, env = ENV_RATE_LIMIT_TOOL, default_value_t = NonZeroU32::new(60).unwrap_or(NonZeroU32::MIN))]
    pub rate_limit_tool_per_ip: NonZeroU32,
    /// Proxies (addresses or CIDR networks, comma-separated) whose X-Forwarded-For header is
    /// trusted.
    #[arg(long, env = ENV_TRUSTED_PROXIES, value_delimiter = ',', value_parser = toolrelay_relay::limits::parse_network)]
    pub trusted_proxies: Vec<ipnet::IpNet>,
    /// API keys the LLM-facing routes (calls, metadata, built-in tools, MCP) require as
    /// `Authorization: Bearer <key>`, comma-separated. Unset: those routes are open.
    #[arg(long, env = ENV_API_KEYS, value_delimiter = ',', hide_env_values = true)]
    pub api_keys: Vec<String>,
    /// A file of API keys, one per line (`#` starts a comment).
    #[arg(long, env = ENV_API_KEYS_FILE)]
    pub api_keys_file: Option<std::path::PathBuf>,
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
    /// Largest response a provider may send over the WebSocket.
    pub max_provider_body: usize,
    /// Deepest JSON nesting accepted (`MAX_JSON_DEPTH`).
    pub max_json_depth: usize,
    /// Keys the LLM-facing routes require, when the operator set some.
    pub api_keys: Option<std::sync::Arc<crate::auth::ApiKeys>>,
    /// Where a gateway alone keeps what it shares with other gateways (rate limits, MCP
    /// sessions): `REDIS_URL`. In one process, the relay's store serves.
    pub store: StoreConfig,
    /// What the public listener allows a connection (trusted proxies have no per-address
    /// cap: their connections carry many clients).
    pub connections: ConnectionLimits,
}

/// Rate limits, per minute.
#[derive(Debug, Clone, Copy)]
pub struct RateLimits {
    /// Sessions created per client address.
    pub sessions_per_ip: NonZeroU32,
    /// Built-in tool calls per client address.
    pub tools_per_ip: NonZeroU32,
}

impl GatewayConfig {
    /// Defaults for a gateway at `public_base_url`.
    pub fn new(public_base_url: &str) -> Result<Self, String> {
        let public_base_url = checked_base_url(public_base_url)?;
        let thirty = NonZeroU32::new(30).unwrap_or(NonZeroU32::MIN);
        Ok(Self {
            cors_origins: default_origins(&public_base_url),
            open_provider_routes: true,
            public_base_url,
            limits: RateLimits {
                sessions_per_ip: thirty,
                tools_per_ip: NonZeroU32::new(60).unwrap_or(NonZeroU32::MIN),
            },
            trusted_proxies: Vec::new(),
            max_provider_body: MAX_PROVIDER_BODY,
            max_json_depth: DEFAULT_MAX_JSON_DEPTH,
            api_keys: None,
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
        config.limits = RateLimits {
            sessions_per_ip: self.rate_limit_session_per_ip,
            tools_per_ip: self.rate_limit_tool_per_ip,
        };
        check_json_depth(service.max_json_depth)?;
        config.max_json_depth = service.max_json_depth;
        config.api_keys =
            crate::auth::ApiKeys::load(&self.api_keys, self.api_keys_file.as_deref())?;
        config.trusted_proxies.clone_from(&self.trusted_proxies);
        config.store = service.store_config();
        config.connections = ConnectionLimits {
            uncapped: self.trusted_proxies.clone(),
            ..service.connection_limits()?
        };
        Ok(config)
    }
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
    }

    #[test]
    fn cors_origin_narrows_the_provider_routes_too() {
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            gateway: GatewayArgs,
            #[command(flatten)]
            service: ServiceArgs,
        }
        let bound: SocketAddr = "127.0.0.1:8080".parse().unwrap();
        let config = |args: &[&str]| {
            let cli = <Cli as clap::Parser>::try_parse_from(args).unwrap();
            cli.gateway.gateway_config(bound, &cli.service).unwrap()
        };
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
