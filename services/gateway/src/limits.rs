//! The gateway's own rate limits (SPEC §10), and who a request comes from: the client address
//! and the caller's identity among the clients at that address, which every limit is keyed on.
//!
//! Budgets per minute, kept in the store so every gateway sharing it (`REDIS_URL`) shares
//! them: sessions created, and built-in tool calls, per caller under a per-address ceiling (the
//! relay's [`ClientBudgets`], which the relay also spends for a gRPC client that reaches it
//! directly). The limits on paths that take a session code — the brute-force guard and calls
//! per session — are the relay's ([`toolrelay_relay::front::limits`]), applied on every path; the
//! gateway only tells it who the client is ([`Limiters::caller`]). The client address is the
//! peer's, or — only when the peer is a configured trusted proxy — the right-most untrusted
//! address of `X-Forwarded-For`.

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;

use poem::http::{HeaderMap, Method};
use poem::web::RemoteAddr;
use toolrelay_relay::front::Clock;
use toolrelay_relay::front::limits::{ClientBudgets, is_within};
use toolrelay_relay::front::store::BudgetStore;
use toolrelay_relay::front::{ASSISTANT_USER_HEADERS, CallerId, IdentityKind};
use toolrelay_relay::front::{Caller, ErrorInfo, Metrics};

use crate::config::RateLimits;

/// The gateway's rate limits.
pub struct Limiters {
    budgets: ClientBudgets,
    trusted_proxies: Vec<ipnet::IpNet>,
    /// Ranges carrying many people (`SHARED_EGRESS_RANGES`).
    shared_egress: Vec<ipnet::IpNet>,
    /// Whether the operator set API keys (then a request's key names its caller).
    api_keys: bool,
}

/// What a request says about who sent it, for [`Limiters::identity`].
#[derive(Debug, Clone, Copy)]
pub struct Request<'a> {
    /// Its method.
    pub method: &'a Method,
    /// Its path.
    pub path: &'a str,
    /// Its headers.
    pub headers: &'a HeaderMap,
    /// Its `?token=`, when it has one.
    pub query_token: Option<&'a str>,
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
        Self {
            budgets: ClientBudgets::new(budgets, store, clock, metrics),
            trusted_proxies,
            shared_egress: Vec::new(),
            api_keys: false,
        }
    }

    /// The same limits, telling callers apart by an assistant's per-user header in
    /// `shared_egress`, and by their API key when `api_keys`.
    #[must_use]
    pub fn identifying(mut self, shared_egress: Vec<ipnet::IpNet>, api_keys: bool) -> Self {
        self.shared_egress = shared_egress;
        self.api_keys = api_keys;
        self
    }

    /// The caller of a request from `remote`: its address and identity.
    pub fn caller(&self, remote: &RemoteAddr, request: Request<'_>) -> Caller {
        let address = self.client_ip(remote, request.headers);
        Caller::new(address).with_identity(self.identity(address, request))
    }

    /// Who a request from `address` comes from among the callers there (SPEC §10; the
    /// README's "Who a caller is"), or `None` for the address alone:
    /// * on MCP, its client session (`Mcp-Session-Id`), or for a sessionless client of
    ///   `/mcp/s/{handle}` the handle;
    /// * on a tab's routes, its provider token;
    /// * from a range in `SHARED_EGRESS_RANGES`, the assistant's per-user header;
    /// * where the operator set API keys, the key (which all users of one GPT share, hence
    ///   after the per-user header).
    ///
    /// An identity the relay cannot check (a made-up session id, token or header) buys no
    /// more than a fresh budget under the same address ceiling.
    pub fn identity(&self, address: IpAddr, request: Request<'_>) -> Option<CallerId> {
        let header = |name: &str| {
            request
                .headers
                .get(name)
                .and_then(|value| value.to_str().ok())
                .map(str::trim)
                .filter(|value| !value.is_empty())
        };
        let bearer = header("authorization").and_then(|value| {
            let (scheme, token) = value.split_once(' ')?;
            scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
        });
        if let Some(mcp) = request.path.strip_prefix("/mcp") {
            if let Some(session) = header("mcp-session-id") {
                return Some(CallerId::of(IdentityKind::McpSession, session));
            }
            if let Some(handle) = mcp.strip_prefix("/s/").filter(|handle| !handle.is_empty()) {
                let handle = handle.split('/').next().unwrap_or(handle);
                return Some(CallerId::of(IdentityKind::Handle, handle));
            }
        }
        if is_provider_route(request.method, request.path) {
            let token = bearer
                .or(request.query_token)
                .filter(|token| !token.is_empty());
            return token.map(|token| CallerId::of(IdentityKind::ProviderToken, token));
        }
        // Every user of one GPT sends that GPT's key: its per-user header is the finer name.
        if is_within(&self.shared_egress, address)
            && let Some(user) = ASSISTANT_USER_HEADERS.iter().find_map(|name| header(name))
        {
            return Some(CallerId::of(IdentityKind::AssistantUser, user));
        }
        match bearer {
            Some(key) if self.api_keys => Some(CallerId::of(IdentityKind::ApiKey, key)),
            _ => None,
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

    /// Counts a session created by `caller`.
    pub async fn create_session(&self, caller: &Caller) -> Result<(), ErrorInfo> {
        Ok(self.budgets.create_session(caller).await?)
    }

    /// Counts a call of a built-in tool outside a session by `caller`.
    pub async fn tool_call(&self, caller: &Caller) -> Result<(), ErrorInfo> {
        Ok(self.budgets.tool_call(caller).await?)
    }
}

/// Whether a request is a tab's (its provider token names the caller): attaching (WebSocket,
/// SSE, polling), registering a manifest, answering, ending a session.
fn is_provider_route(method: &Method, path: &str) -> bool {
    if path == "/response" || path == "/stream" {
        return true;
    }
    let Some(rest) = path.strip_prefix("/api/sessions/") else {
        return false;
    };
    match rest.split_once('/') {
        None => *method == Method::DELETE,
        Some((_, tail)) => match tail {
            "ws" | "stream" | "manifest" => true,
            // The tab answers with POST …/response and polls with GET …/request; a caller
            // lists its answers with GET …/response and queues with POST …/request.
            "response" => *method == Method::POST,
            "request" => *method == Method::GET,
            _ => false,
        },
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
            ..RateLimits::default()
        }
    }

    fn limiters(shared: &str, api_keys: bool) -> Limiters {
        let clock = Clock::new();
        let store =
            toolrelay_relay::front::serve::MemoryStore::new(clock.clone(), Duration::from_secs(60));
        let shared = vec![toolrelay_relay::front::limits::parse_network(shared).unwrap()];
        Limiters::new(limits(1), Vec::new(), store, clock, Metrics::default())
            .identifying(shared, api_keys)
    }

    fn identity(
        limiters: &Limiters,
        from: &str,
        method: Method,
        path: &str,
        headers: &[(&str, &str)],
    ) -> Option<String> {
        let mut map = HeaderMap::new();
        for (name, value) in headers {
            map.insert(
                poem::http::HeaderName::from_bytes(name.as_bytes()).unwrap(),
                value.parse().unwrap(),
            );
        }
        let request = Request {
            method: &method,
            path,
            headers: &map,
            query_token: None,
        };
        limiters
            .identity(from.parse().unwrap(), request)
            .map(|id| id.as_str().to_owned())
    }

    #[tokio::test]
    async fn callers_are_told_apart_by_what_their_path_documents() {
        let limiters = limiters("203.0.113.0/24", false);
        let shared = "203.0.113.9";
        let mcp = identity(
            &limiters,
            shared,
            Method::POST,
            "/mcp",
            &[("mcp-session-id", "s1")],
        );
        assert!(mcp.unwrap().starts_with("mcp:"));
        let handle = identity(&limiters, shared, Method::POST, "/mcp/s/h1", &[]);
        assert!(handle.unwrap().starts_with("handle:"));
        // A sessionless client of /mcp from elsewhere is its address.
        assert_eq!(
            identity(&limiters, "192.0.2.1", Method::POST, "/mcp", &[]),
            None
        );
        let tab = identity(
            &limiters,
            shared,
            Method::PUT,
            "/api/sessions/ABCDEFGH/manifest",
            &[("authorization", "Bearer t1")],
        );
        assert!(tab.unwrap().starts_with("tab:"));
        // GPT Actions' per-user header names a caller only from a shared range.
        let user = [("openai-ephemeral-user-id", "u1")];
        let call = "/api/sessions/ABCDEFGH/call";
        let from_shared = identity(&limiters, shared, Method::POST, call, &user).unwrap();
        assert!(from_shared.starts_with("user:"));
        let other = [("openai-ephemeral-user-id", "u2")];
        assert_ne!(
            identity(&limiters, shared, Method::POST, call, &other).unwrap(),
            from_shared
        );
        assert_eq!(
            identity(&limiters, "192.0.2.1", Method::POST, call, &user),
            None
        );
        assert_eq!(identity(&limiters, shared, Method::POST, call, &[]), None);
        // A caller reading its answers is the same caller as when it called (the tab answers
        // on the same path with POST, and polls for calls with GET …/request).
        let answers = "/api/sessions/ABCDEFGH/response";
        let reading = identity(&limiters, shared, Method::GET, answers, &user);
        assert_eq!(reading.as_deref(), Some(from_shared.as_str()));
        let queueing = "/api/sessions/ABCDEFGH/request";
        let queued = identity(&limiters, shared, Method::POST, queueing, &user);
        assert_eq!(queued.as_deref(), Some(from_shared.as_str()));
        let answering = [("authorization", "Bearer t1")];
        let tab = identity(&limiters, shared, Method::POST, answers, &answering);
        assert!(tab.unwrap().starts_with("tab:"));
        let polling = identity(&limiters, shared, Method::GET, queueing, &answering);
        assert!(polling.unwrap().starts_with("tab:"));
        // Without API keys, a bearer on an LLM route names nobody; with them, it is the key.
        let keyed = [("authorization", "Bearer k1")];
        assert_eq!(
            identity(&limiters, "192.0.2.1", Method::POST, call, &keyed),
            None
        );
        let with_keys = self::limiters("203.0.113.0/24", true);
        let key = identity(&with_keys, "192.0.2.1", Method::POST, call, &keyed);
        assert!(key.unwrap().starts_with("key:"));
        // A GPT's users share its key; from a shared range each is still told apart.
        let both = [
            ("authorization", "Bearer k1"),
            ("openai-ephemeral-user-id", "u1"),
        ];
        let user = identity(&with_keys, shared, Method::POST, call, &both);
        assert_eq!(user.as_deref(), Some(from_shared.as_str()));
    }

    #[tokio::test]
    async fn forwarded_addresses_count_only_behind_a_trusted_proxy() {
        let proxy: IpAddr = "10.0.0.1".parse().unwrap();
        let clock = Clock::new();
        let store =
            toolrelay_relay::front::serve::MemoryStore::new(clock.clone(), Duration::from_secs(60));
        // A network of proxies (an ingress controller's pods), given as CIDR.
        let proxies = vec![toolrelay_relay::front::limits::parse_network("10.0.0.0/24").unwrap()];
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
