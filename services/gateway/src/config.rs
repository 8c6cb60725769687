//! The gateway's settings: a typed struct with defaults and validation, and the command-line
//! flags (each mirroring an environment variable) that fill it.

use std::net::{IpAddr, SocketAddr};
use std::num::NonZeroU32;

use clap::Args;

/// `LISTEN_ADDR`: the public HTTP address.
pub const ENV_LISTEN: &str = "LISTEN_ADDR";
/// `RELAY_URL`: the relay's gRPC URL; unset means the relay runs in this process.
pub const ENV_RELAY_URL: &str = "RELAY_URL";
/// `PUBLIC_BASE_URL`: the URL people and LLMs reach the gateway at.
pub const ENV_PUBLIC_BASE_URL: &str = "PUBLIC_BASE_URL";
/// `CORS_ORIGIN`: origins allowed to call the browser-facing routes, comma-separated.
pub const ENV_CORS_ORIGIN: &str = "CORS_ORIGIN";
/// `RATE_LIMIT_SESSION_PER_IP`: sessions one address may create per minute.
pub const ENV_RATE_LIMIT_SESSION: &str = "RATE_LIMIT_SESSION_PER_IP";
/// `RATE_LIMIT_REQUEST_PER_CODE`: calls one address may make to one session per minute.
pub const ENV_RATE_LIMIT_REQUEST: &str = "RATE_LIMIT_REQUEST_PER_CODE";
/// `RATE_LIMIT_LOOKUP_PER_IP`: look-ups of unknown session codes one address may make per minute.
pub const ENV_RATE_LIMIT_LOOKUP: &str = "RATE_LIMIT_LOOKUP_PER_IP";
/// `TRUSTED_PROXIES`: addresses whose `X-Forwarded-For` is believed, comma-separated.
pub const ENV_TRUSTED_PROXIES: &str = "TRUSTED_PROXIES";

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
    /// The relay's gRPC URL (split deployment); without it the relay runs in this process.
    #[arg(long, env = ENV_RELAY_URL)]
    pub relay_url: Option<String>,
    /// The URL the gateway is reached at from outside, e.g. https://relay.example.org (used in
    /// the OpenAPI spec, the discovery document and the MCP host check). Default: http://LISTEN.
    #[arg(long, env = ENV_PUBLIC_BASE_URL)]
    pub public_base_url: Option<String>,
    /// Origins allowed to call the browser-facing routes, comma-separated. Default: the CODAP
    /// origins and the public base URL's.
    #[arg(long, env = ENV_CORS_ORIGIN, value_delimiter = ',')]
    pub cors_origin: Vec<String>,
    /// Sessions one client address may create per minute.
    #[arg(long, env = ENV_RATE_LIMIT_SESSION, default_value_t = NonZeroU32::new(30).unwrap_or(NonZeroU32::MIN))]
    pub rate_limit_session_per_ip: NonZeroU32,
    /// Calls one client address may make to one session per minute.
    #[arg(long, env = ENV_RATE_LIMIT_REQUEST, default_value_t = NonZeroU32::new(60).unwrap_or(NonZeroU32::MIN))]
    pub rate_limit_request_per_code: NonZeroU32,
    /// Look-ups of unknown session codes one client address may make per minute.
    #[arg(long, env = ENV_RATE_LIMIT_LOOKUP, default_value_t = NonZeroU32::new(30).unwrap_or(NonZeroU32::MIN))]
    pub rate_limit_lookup_per_ip: NonZeroU32,
    /// Proxy addresses whose X-Forwarded-For header is trusted, comma-separated.
    #[arg(long, env = ENV_TRUSTED_PROXIES, value_delimiter = ',')]
    pub trusted_proxies: Vec<IpAddr>,
}

/// The gateway's settings.
#[derive(Debug, Clone)]
pub struct GatewayConfig {
    /// The URL the gateway is reached at, without a trailing slash.
    pub public_base_url: String,
    /// Origins allowed by CORS on the browser-facing routes.
    pub cors_origins: Vec<String>,
    /// Rate limits, per minute.
    pub limits: RateLimits,
    /// Proxies whose `X-Forwarded-For` is believed.
    pub trusted_proxies: Vec<IpAddr>,
    /// Largest response a provider may send over the WebSocket.
    pub max_provider_body: usize,
}

/// Rate limits, per minute.
#[derive(Debug, Clone, Copy)]
pub struct RateLimits {
    /// Sessions created per client address.
    pub sessions_per_ip: NonZeroU32,
    /// Calls per client address and session.
    pub requests_per_code: NonZeroU32,
    /// Unknown-code look-ups per client address.
    pub lookups_per_ip: NonZeroU32,
}

impl GatewayConfig {
    /// Defaults for a gateway at `public_base_url`.
    pub fn new(public_base_url: &str) -> Result<Self, String> {
        let public_base_url = checked_base_url(public_base_url)?;
        let thirty = NonZeroU32::new(30).unwrap_or(NonZeroU32::MIN);
        Ok(Self {
            cors_origins: default_origins(&public_base_url),
            public_base_url,
            limits: RateLimits {
                sessions_per_ip: thirty,
                requests_per_code: NonZeroU32::new(60).unwrap_or(NonZeroU32::MIN),
                lookups_per_ip: thirty,
            },
            trusted_proxies: Vec::new(),
            max_provider_body: MAX_PROVIDER_BODY,
        })
    }
}

impl GatewayArgs {
    /// The settings these flags describe, validated; errors name the variable to fix.
    /// `bound` is the address the public listener got (the real port when `LISTEN_ADDR`
    /// asked for port 0); the public base URL defaults to it.
    pub fn gateway_config(&self, bound: SocketAddr) -> Result<GatewayConfig, String> {
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
        }
        config.limits = RateLimits {
            sessions_per_ip: self.rate_limit_session_per_ip,
            requests_per_code: self.rate_limit_request_per_code,
            lookups_per_ip: self.rate_limit_lookup_per_ip,
        };
        config.trusted_proxies.clone_from(&self.trusted_proxies);
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
