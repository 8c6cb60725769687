//! Rate limits (SPEC §10) and the client address they are keyed on.
//!
//! Token buckets from `governor`, per minute: sessions created per address, calls per
//! address and session, and a brute-force guard on session codes: an address that looks up
//! too many unknown codes is refused every look-up until its budget refills. The client address
//! is the peer's, or — only when the peer is a configured trusted proxy — the right-most
//! untrusted address of `X-Forwarded-For`.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr};
use std::num::NonZeroU32;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use governor::clock::{Clock, DefaultClock};
use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};
use poem::http::HeaderMap;
use poem::web::RemoteAddr;

use crate::config::RateLimits;
use toolrelay_relay::{ErrorInfo, ErrorKind};

use crate::error::ApiError;

/// Addresses blocked by the brute-force guard are forgotten once this many pile up and expire.
const BLOCKED_PRUNE_AT: usize = 10_000;

/// The gateway's rate limiters.
pub struct Limiters {
    sessions: DefaultKeyedRateLimiter<IpAddr>,
    calls: DefaultKeyedRateLimiter<(IpAddr, String)>,
    tools: DefaultKeyedRateLimiter<IpAddr>,
    misses: DefaultKeyedRateLimiter<IpAddr>,
    /// Until when an address is refused code look-ups. A std mutex: held for a map access,
    /// never across an `.await`.
    blocked: Mutex<HashMap<IpAddr, Instant>>,
    trusted_proxies: Vec<IpAddr>,
}

fn per_minute(n: NonZeroU32) -> Quota {
    Quota::per_minute(n)
}

impl Limiters {
    /// Limiters with these per-minute budgets.
    pub fn new(limits: &RateLimits, trusted_proxies: Vec<IpAddr>) -> Self {
        Self {
            sessions: RateLimiter::keyed(per_minute(limits.sessions_per_ip)),
            calls: RateLimiter::keyed(per_minute(limits.requests_per_code)),
            tools: RateLimiter::keyed(per_minute(limits.requests_per_code)),
            misses: RateLimiter::keyed(per_minute(limits.lookups_per_ip)),
            blocked: Mutex::new(HashMap::new()),
            trusted_proxies,
        }
    }

    /// The address a request counts against.
    pub fn client_ip(&self, remote: &RemoteAddr, headers: &HeaderMap) -> IpAddr {
        let peer = remote
            .as_socket_addr()
            .map_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED), |address| address.ip());
        if !self.trusted_proxies.contains(&peer) {
            return peer;
        }
        headers
            .get_all("x-forwarded-for")
            .iter()
            .filter_map(|value| value.to_str().ok())
            .flat_map(|value| value.split(','))
            .rev()
            .filter_map(|hop| hop.trim().parse::<IpAddr>().ok())
            .find(|hop| !self.trusted_proxies.contains(hop))
            .unwrap_or(peer)
    }

    /// Counts a session creation.
    pub fn create_session(&self, ip: IpAddr) -> Result<(), ApiError> {
        self.sessions.check_key(&ip).map_err(|wait| {
            ApiError::rate_limited("sessions created from your address", wait_time(&wait))
        })
    }

    /// Counts a call to session `code` (normalised, so `abcd-efgh` and `ABCDEFGH` are one).
    pub fn call(&self, ip: IpAddr, code: &str) -> Result<(), ApiError> {
        let code: String = code
            .chars()
            .filter(|c| *c != '-')
            .map(|c| c.to_ascii_uppercase())
            .collect();
        self.calls.check_key(&(ip, code)).map_err(|wait| {
            ApiError::rate_limited("calls to this session from your address", wait_time(&wait))
        })
    }

    /// Counts a call of a built-in tool outside a session (limited per address like calls).
    pub fn tool_call(&self, ip: IpAddr) -> Result<(), ErrorInfo> {
        self.tools.check_key(&ip).map_err(|wait| {
            let seconds = wait_time(&wait).as_secs().max(1);
            ErrorInfo {
                kind: ErrorKind::TooManyRequests,
                name: "rate_limited".into(),
                message: format!(
                    "Too many tool calls from your address. Wait {seconds} s, then try again."
                ),
                retry_after: Some(Duration::from_secs(seconds)),
            }
        })
    }

    /// Refuses an address that looked up too many unknown codes.
    pub fn check_lookups(&self, ip: IpAddr) -> Result<(), ApiError> {
        let blocked = self
            .blocked
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        match blocked.get(&ip) {
            Some(until) if *until > Instant::now() => Err(ApiError::rate_limited(
                "look-ups of unknown session codes from your address",
                *until - Instant::now(),
            )),
            _ => Ok(()),
        }
    }

    /// Counts a look-up of an unknown code; past the budget the address is blocked, and the
    /// look-up itself is answered with the rate-limit error.
    pub fn unknown_code(&self, ip: IpAddr) -> Result<(), ApiError> {
        let Err(wait) = self.misses.check_key(&ip) else {
            return Ok(());
        };
        let wait = wait_time(&wait);
        let mut blocked = self
            .blocked
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if blocked.len() >= BLOCKED_PRUNE_AT {
            let now = Instant::now();
            blocked.retain(|_, until| *until > now);
        }
        blocked.insert(ip, Instant::now() + wait);
        tracing::warn!(%ip, "address blocked from code look-ups: too many unknown codes");
        Err(ApiError::rate_limited(
            "look-ups of unknown session codes from your address",
            wait,
        ))
    }

    /// Forgets budgets that have refilled, so memory follows active clients only.
    pub fn shrink(&self) {
        self.sessions.retain_recent();
        self.calls.retain_recent();
        self.tools.retain_recent();
        self.misses.retain_recent();
        let now = Instant::now();
        self.blocked
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .retain(|_, until| *until > now);
    }
}

fn wait_time(not_until: &governor::NotUntil<<DefaultClock as Clock>::Instant>) -> Duration {
    not_until.wait_time_from(DefaultClock::default().now())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::SocketAddr;

    fn limits(n: u32) -> RateLimits {
        let n = NonZeroU32::new(n).unwrap();
        RateLimits {
            sessions_per_ip: n,
            requests_per_code: n,
            lookups_per_ip: n,
        }
    }

    #[test]
    fn forwarded_addresses_count_only_behind_a_trusted_proxy() {
        let proxy: IpAddr = "10.0.0.1".parse().unwrap();
        let limiters = Limiters::new(&limits(1), vec![proxy]);
        let mut headers = HeaderMap::new();
        headers.insert(
            "x-forwarded-for",
            "203.0.113.9, 198.51.100.7, 10.0.0.1".parse().unwrap(),
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

    #[test]
    fn calls_are_counted_per_session_whatever_the_spelling() {
        let limiters = Limiters::new(&limits(2), vec![]);
        let ip: IpAddr = "192.0.2.5".parse().unwrap();
        limiters.call(ip, "ABCD-EFGH").unwrap();
        limiters.call(ip, "abcdefgh").unwrap();
        assert_eq!(limiters.call(ip, "ABCDEFGH").unwrap_err().status(), 429);
        limiters.call(ip, "ZZZZZZZZ").unwrap();
    }

    #[test]
    fn too_many_unknown_codes_block_every_lookup() {
        let limiters = Limiters::new(&limits(2), vec![]);
        let ip: IpAddr = "192.0.2.5".parse().unwrap();
        for _ in 0..2 {
            limiters.check_lookups(ip).unwrap();
            limiters.unknown_code(ip).unwrap();
        }
        limiters.check_lookups(ip).unwrap();
        let over = limiters.unknown_code(ip).unwrap_err();
        assert_eq!(over.status(), 429, "the third miss is over budget");
        assert_eq!(limiters.check_lookups(ip).unwrap_err().status(), 429);
        limiters
            .check_lookups("192.0.2.6".parse().unwrap())
            .unwrap();
    }
}
