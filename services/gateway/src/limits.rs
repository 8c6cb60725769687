//! The gateway's own rate limits (SPEC §10) and the client address every limit is keyed on.
//!
//! Budgets per minute, kept in the store so every gateway sharing it (`REDIS_URL`) shares
//! them: sessions created per address, and built-in tool calls per address (the relay's
//! [`ClientBudgets`], which the relay also spends for a gRPC client that reaches it
//! directly). The limits on
//! paths that take a session code — the brute-force guard and calls per session — are the
//! relay's ([`toolrelay_relay::limits`]), applied on every path; the gateway only tells it who
//! the client is. The client address is the peer's, or — only
//! when the peer is a configured trusted proxy — the right-most untrusted address of
//! `X-Forwarded-For`.

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;

use poem::http::HeaderMap;
use poem::web::RemoteAddr;
use toolrelay_relay::clock::Clock;
use toolrelay_relay::limits::{ClientBudgets, is_within};
use toolrelay_relay::store::BudgetStore;
use toolrelay_relay::{ErrorInfo, Metrics};

use crate::config::RateLimits;

/// The gateway's rate limits.
pub struct Limiters {
    budgets: ClientBudgets,
    trusted_proxies: Vec<ipnet::IpNet>,
}

impl Limiters {
    /// Limits with these per-minute budgets, counted in `store`; refusals are counted in
    /// `metrics`.
    pub fn new(
        budgets: RateLimits,
        trusted_proxies: Vec<ipnet::IpNet>,
        store: Arc<dyn BudgetStore>,
        clock: Clock,
        metrics: Metrics,
    ) -> Self {
        let budgets = toolrelay_relay::limits::RateLimits {
            sessions_per_ip: budgets.sessions_per_ip,
            tools_per_ip: budgets.tools_per_ip,
            ipv6_prefix: budgets.ipv6_prefix,
            ..toolrelay_relay::limits::RateLimits::default()
        };
        Self {
            budgets: ClientBudgets::new(budgets, store, clock, metrics),
            trusted_proxies,
        }
    }

    /// The address a request counts against.
    pub fn client_ip(&self, remote: &RemoteAddr, headers: &HeaderMap) -> IpAddr {
        let peer = remote
            .as_socket_addr()
            .map_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED), |address| address.ip());
        if !is_within(&self.trusted_proxies, peer) {
            return peer;
        }
        headers
            .get_all("x-forwarded-for")
            .iter()
            .filter_map(|value| value.to_str().ok())
            .flat_map(|value| value.split(','))
            .rev()
            .filter_map(|hop| hop.trim().parse::<IpAddr>().ok())
            .find(|hop| !is_within(&self.trusted_proxies, *hop))
            .unwrap_or(peer)
    }

    /// Counts a session creation.
    pub async fn create_session(&self, ip: IpAddr) -> Result<(), ErrorInfo> {
        Ok(self.budgets.create_session(ip).await?)
    }

    /// Counts a call of a built-in tool outside a session (limited per address like calls).
    pub async fn tool_call(&self, ip: IpAddr) -> Result<(), ErrorInfo> {
        Ok(self.budgets.tool_call(ip).await?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::SocketAddr;
    use std::num::NonZeroU32;
    use std::time::Duration;

    fn limits(n: u32) -> RateLimits {
        let n = NonZeroU32::new(n).unwrap();
        RateLimits {
            sessions_per_ip: n,
            tools_per_ip: n,
            ipv6_prefix: toolrelay_relay::limits::DEFAULT_IPV6_PREFIX,
        }
    }

    #[tokio::test]
    async fn forwarded_addresses_count_only_behind_a_trusted_proxy() {
        let proxy: IpAddr = "10.0.0.1".parse().unwrap();
        let clock = Clock::new();
        let store = toolrelay_relay::store::memory::MemoryStore::new(
            clock.clone(),
            Duration::from_secs(60),
        );
        // A network of proxies (an ingress controller's pods), given as CIDR.
        let proxies = vec![toolrelay_relay::limits::parse_network("10.0.0.0/24").unwrap()];
        let limiters = Limiters::new(limits(1), proxies, store, clock, Metrics::default());
        let mut headers = HeaderMap::new();
        headers.insert(
            "x-forwarded-for",
            "203.0.113.9, 198.51.100.7, 10.0.0.2, 10.0.0.1"
                .parse()
                .unwrap(),
        );
        let via_proxy = RemoteAddr(poem::Addr::SocketAddr(SocketAddr::new(proxy, 40000)));
        assert_eq!(
            limiters.client_ip(&via_proxy, &headers),
            "198.51.100.7".parse::<IpAddr>().unwrap()
        );
        let direct = RemoteAddr(poem::Addr::SocketAddr(
            "192.0.2.5:40000".parse::<SocketAddr>().unwrap(),
        ));
        assert_eq!(
            limiters.client_ip(&direct, &headers),
            "192.0.2.5".parse::<IpAddr>().unwrap()
        );
    }
}
