//! Limits keyed on the client's address that the relay applies on **every** path that takes a
//! session code or connector handle — REST and the legacy aliases through the gateway, MCP,
//! the browser WebSocket and every gRPC RPC — so no path is a way around them (SPEC §10):
//!
//! * the brute-force guard: an address that looks up too many unknown codes (or handles) in a
//!   minute is refused every look-up until its budget refills;
//! * calls per address and session;
//! * what a front door lets in ([`ClientBudgets`]): sessions created and built-in tool calls
//!   per address, which the gateway spends for HTTP and MCP, and the relay for a gRPC peer
//!   that reached it directly, together with that peer's API key ([`Limits::admit`]).
//!
//! Who the client is: [`Caller`]. The gateway passes the address it saw (in process, or in the
//! gRPC metadata entry [`CLIENT_ADDRESS_METADATA`]); the relay believes that entry only from
//! a peer that proves itself a gateway ([`crate::access`]), and otherwise keys on the peer's
//! own address.

use std::collections::HashMap;
use std::future::Future;
use std::net::IpAddr;
use std::num::NonZeroU32;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ipnet::IpNet;

use crate::access::ApiKeys;
use crate::clock::Clock;
use crate::code::SessionCode;
use crate::error::RelayError;
use crate::metrics::{Metrics, RateLimit};
use crate::store::{BudgetStore, RateBudget, RateCharge};

/// gRPC metadata entry in which a gateway names the client's address.
pub const CLIENT_ADDRESS_METADATA: &str = "x-toolrelay-client";
/// gRPC metadata entry carrying the correlation id of the request (as in HTTP).
pub const CORRELATION_ID_METADATA: &str = "x-request-id";
/// Addresses blocked by the guard are forgotten once this many pile up and expire.
const BLOCKED_PRUNE_AT: usize = 10_000;

/// Who makes a request: the address limits are keyed on, what the relay still has to check
/// before letting it in, and the correlation id its log lines carry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    /// The client's address.
    pub address: IpAddr,
    /// Whether a front end let the client in, or the relay has to.
    pub admission: Admission,
    /// The request's correlation id (`x-request-id`), passed on to a relay in another process.
    pub correlation_id: Option<String>,
}

/// Who let a caller in.
#[derive(Clone, PartialEq, Eq)]
pub enum Admission {
    /// A front end did — the gateway, in this process or proven over gRPC: it checked the
    /// client's API key and spent its budgets of sessions and tool calls.
    Gateway,
    /// Nobody yet: the client reached the relay's gRPC port itself. The relay checks the
    /// credential it presented (`authorization: Bearer`, an API key on consumer RPCs) and
    /// spends its budgets.
    Direct {
        /// The bearer credential the request carried.
        bearer: Option<String>,
    },
}

impl std::fmt::Debug for Admission {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The credential is a secret: never in a log line.
        match self {
            Self::Gateway => f.write_str("Gateway"),
            Self::Direct { bearer } => f
                .debug_struct("Direct")
                .field("bearer", &bearer.as_ref().map(|_| "…"))
                .finish(),
        }
    }
}

impl Caller {
    /// A client at `address` that a front end let in (see [`Admission::Gateway`]).
    pub fn new(address: IpAddr) -> Self {
        Self {
            address,
            admission: Admission::Gateway,
            correlation_id: None,
        }
    }

    /// A client at `address` that reached the relay itself, presenting `bearer`.
    pub fn direct(address: IpAddr, bearer: Option<String>) -> Self {
        Self {
            admission: Admission::Direct { bearer },
            ..Self::new(address)
        }
    }

    /// The same client, for the request with this correlation id.
    #[must_use]
    pub fn with_correlation_id(mut self, id: impl Into<String>) -> Self {
        self.correlation_id = Some(id.into());
        self
    }
}

/// The per-minute budgets.
#[derive(Debug, Clone, Copy)]
pub struct RateLimits {
    /// Look-ups of unknown codes per client address.
    pub lookups_per_ip: NonZeroU32,
    /// Calls per client address and session.
    pub calls_per_code: NonZeroU32,
    /// Sessions created per client address.
    pub sessions_per_ip: NonZeroU32,
    /// Built-in tool calls (outside a session) per client address.
    pub tools_per_ip: NonZeroU32,
    /// Length of the IPv6 prefix one client is keyed by (`GUARD_IPV6_PREFIX`, see
    /// [`client_key`]).
    pub ipv6_prefix: u8,
}

impl Default for RateLimits {
    fn default() -> Self {
        let per_minute = |n| NonZeroU32::new(n).unwrap_or(NonZeroU32::MIN);
        Self {
            lookups_per_ip: per_minute(30),
            calls_per_code: per_minute(60),
            sessions_per_ip: per_minute(30),
            tools_per_ip: per_minute(60),
            ipv6_prefix: DEFAULT_IPV6_PREFIX,
        }
    }
}

/// What a front door lets in per client and minute: sessions created and built-in tool calls,
/// counted in the store (so every gateway and relay sharing it shares them) under the
/// client's key ([`client_key`]).
pub struct ClientBudgets {
    budgets: RateLimits,
    store: Arc<dyn BudgetStore>,
    clock: Clock,
    /// Where refusals are counted.
    metrics: Metrics,
}

impl ClientBudgets {
    /// The budgets of `budgets` (its sessions and tool calls), counted in `store`; refusals
    /// are counted in `metrics`.
    pub fn new(
        budgets: RateLimits,
        store: Arc<dyn BudgetStore>,
        clock: Clock,
        metrics: Metrics,
    ) -> Self {
        Self {
            budgets,
            store,
            clock,
            metrics,
        }
    }

    /// Counts a session created by the client at `address`.
    pub async fn create_session(&self, address: IpAddr) -> Result<(), RelayError> {
        self.spend(RateLimit::Sessions, address, self.budgets.sessions_per_ip)
            .await
    }

    /// Counts a built-in tool call outside a session by the client at `address`.
    pub async fn tool_call(&self, address: IpAddr) -> Result<(), RelayError> {
        self.spend(RateLimit::Tools, address, self.budgets.tools_per_ip)
            .await
    }

    async fn spend(
        &self,
        what: RateLimit,
        address: IpAddr,
        budget: NonZeroU32,
    ) -> Result<(), RelayError> {
        let (prefix, counted) = match what {
            RateLimit::Sessions => ("sessions", "sessions created"),
            _ => ("tools", "tool calls"),
        };
        let key = format!("{prefix}:{}", client_key(address, self.budgets.ipv6_prefix));
        let spent = self
            .store
            .spend(&key, RateBudget::per_minute(budget), self.clock.now())
            .await?;
        let Some(wait) = spent else { return Ok(()) };
        self.metrics.rate_limited(what);
        Err(RelayError::RateLimited {
            what: counted,
            retry_after: wait.max(Duration::from_secs(1)),
        })
    }
}

/// The relay's address-keyed limits. The budgets are kept in the store, so every replica
/// sharing a store shares them; an address blocked by the guard is also remembered here, so a
/// blocked address is refused without asking the store (a replica learns of a block made by
/// another on the address's next unknown code).
pub struct Limits {
    budgets: RateLimits,
    /// Sessions and tool calls of clients that reached the relay directly.
    front_door: ClientBudgets,
    /// The keys a client reaching the relay directly needs, when the operator set some.
    api_keys: Option<Arc<ApiKeys>>,
    store: Arc<dyn BudgetStore>,
    clock: Clock,
    /// Where refusals are counted.
    metrics: Metrics,
    /// Until when an address is refused look-ups. A std mutex: held for a map access or a
    /// time check, never across an `.await`.
    blocked: Mutex<HashMap<IpAddr, Instant>>,
}

impl Limits {
    /// Limits with these budgets, counted in `store`, asking clients that reach the relay
    /// directly for one of `api_keys`; refusals are counted in `metrics`.
    pub fn new(
        budgets: RateLimits,
        api_keys: Option<Arc<ApiKeys>>,
        store: Arc<dyn BudgetStore>,
        clock: Clock,
        metrics: Metrics,
    ) -> Self {
        Self {
            budgets,
            front_door: ClientBudgets::new(
                budgets,
                Arc::clone(&store),
                clock.clone(),
                metrics.clone(),
            ),
            api_keys,
            store,
            clock,
            metrics,
            blocked: Mutex::new(HashMap::new()),
        }
    }

    /// Lets `caller` use a consumer operation: a client that reached the relay directly needs
    /// one of the API keys, when the operator set some (a gateway checked its own clients').
    pub fn admit(&self, caller: &Caller) -> Result<(), RelayError> {
        let (Some(keys), Admission::Direct { bearer }) = (&self.api_keys, &caller.admission) else {
            return Ok(());
        };
        match bearer {
            Some(key) if keys.accepts(key) => Ok(()),
            Some(_) => Err(RelayError::InvalidApiKey),
            None => Err(RelayError::ApiKeyRequired),
        }
    }

    /// Lets `caller` create a session: a client that reached the relay directly spends its
    /// budget of sessions (a gateway spent its own clients').
    pub async fn admit_session(&self, caller: &Caller) -> Result<(), RelayError> {
        match caller.admission {
            Admission::Gateway => Ok(()),
            Admission::Direct { .. } => self.front_door.create_session(caller.address).await,
        }
    }

    /// Lets `caller` run a built-in tool outside a session: [`Limits::admit`], and a client
    /// that reached the relay directly spends its budget of tool calls.
    pub async fn admit_tool_call(&self, caller: &Caller) -> Result<(), RelayError> {
        self.admit(caller)?;
        match caller.admission {
            Admission::Gateway => Ok(()),
            Admission::Direct { .. } => self.front_door.tool_call(caller.address).await,
        }
    }

    /// Runs a look-up of a code or handle for `caller` under the guard: a blocked address is
    /// refused, and an unknown code counts against it (past the budget, the look-up itself is
    /// answered with the rate-limit error).
    pub async fn guarded<T>(
        &self,
        caller: &Caller,
        operation: impl Future<Output = Result<T, RelayError>>,
    ) -> Result<T, RelayError> {
        let client = self.key(caller);
        self.check(client)?;
        self.counted(client, operation.await).await
    }

    /// Runs a provider's operation, which proves the session's provider token when `token` is
    /// given, under the guard. A tab presenting its token is never refused by the guard (the
    /// token is a 128-bit secret: an address blocked for guessing codes still re-attaches its
    /// own tab); to a blocked address, every failure before the token is proven (no such
    /// session, a wrong token) is the rate-limit error, so it learns nothing. Without a token
    /// this is [`Limits::guarded`].
    pub async fn guarded_provider<T>(
        &self,
        caller: &Caller,
        token: Option<&str>,
        operation: impl Future<Output = Result<T, RelayError>>,
    ) -> Result<T, RelayError> {
        if token.is_none_or(str::is_empty) {
            return self.guarded(caller, operation).await;
        }
        let client = self.key(caller);
        match operation.await {
            Err(error) if is_unproven(&error) => {
                self.check(client)?;
                self.counted(client, Err(error)).await
            }
            proven => proven,
        }
    }

    /// An unknown code, handle or claim in `outcome` counts against `client`.
    async fn counted<T>(
        &self,
        client: IpAddr,
        outcome: Result<T, RelayError>,
    ) -> Result<T, RelayError> {
        match outcome {
            Err(
                error @ (RelayError::SessionNotFound { .. }
                | RelayError::UnknownHandle
                | RelayError::UnknownClaim),
            ) => {
                self.miss(client).await?;
                Err(error)
            }
            other => other,
        }
    }

    /// The key `caller`'s budgets are counted under (see [`client_key`]).
    fn key(&self, caller: &Caller) -> IpAddr {
        client_key(caller.address, self.budgets.ipv6_prefix)
    }

    /// What a call by `caller` to session `code` (spelt as the caller spelt it) costs. The
    /// relay spends it as it queues the call, in the same step (see
    /// [`crate::store::EnqueueChecks`]); the key carries the session's hash tag.
    pub fn call_charge(&self, caller: &Caller, code: &str) -> RateCharge {
        let code = SessionCode::parse(code)
            .map_or_else(|_| code.to_owned(), |code| code.as_str().to_owned());
        RateCharge {
            key: format!("calls:{}:{{{code}}}", self.key(caller)),
            budget: RateBudget::per_minute(self.budgets.calls_per_code),
        }
    }

    /// Counts a call by `caller` to session `code` on its own (see [`Limits::call_charge`]).
    pub async fn call(&self, caller: &Caller, code: &str) -> Result<(), RelayError> {
        self.spend_call(&self.call_charge(caller, code), self.clock.now())
            .await
    }

    /// Spends a call's unit of its budget; past the budget, the error to answer with.
    pub async fn spend_call(
        &self,
        charge: &RateCharge,
        now: crate::clock::Timestamp,
    ) -> Result<(), RelayError> {
        match self.store.spend(&charge.key, charge.budget, now).await? {
            None => Ok(()),
            Some(wait) => Err(self.calls_limited(wait)),
        }
    }

    /// The answer to a call past its caller's budget of calls to the session (counted).
    pub fn calls_limited(&self, wait: Duration) -> RelayError {
        self.metrics.rate_limited(RateLimit::Calls);
        RelayError::RateLimited {
            what: "calls to this session",
            retry_after: wait.max(Duration::from_secs(1)),
        }
    }

    fn check(&self, address: IpAddr) -> Result<(), RelayError> {
        let blocked = locked(&self.blocked);
        match blocked.get(&address) {
            Some(until) if *until > Instant::now() => {
                self.metrics.rate_limited(RateLimit::Lookups);
                Err(lookup_limited(*until - Instant::now()))
            }
            _ => Ok(()),
        }
    }

    async fn miss(&self, address: IpAddr) -> Result<(), RelayError> {
        let Some(wait) = self
            .store
            .spend(
                &format!("misses:{address}"),
                RateBudget::per_minute(self.budgets.lookups_per_ip),
                self.clock.now(),
            )
            .await?
        else {
            return Ok(());
        };
        let mut blocked = locked(&self.blocked);
        let now = Instant::now();
        if blocked.len() >= BLOCKED_PRUNE_AT {
            blocked.retain(|_, until| *until > now);
        }
        blocked.insert(address, now + wait);
        tracing::warn!(%address, "address blocked from code look-ups: too many unknown codes");
        self.metrics.rate_limited(RateLimit::Lookups);
        Err(lookup_limited(wait))
    }
}

/// Whether a provider operation failed before its token was proven: the session is unknown,
/// or the token missing or wrong.
fn is_unproven(error: &RelayError) -> bool {
    matches!(
        error,
        RelayError::SessionNotFound { .. }
            | RelayError::UnknownHandle
            | RelayError::InvalidCode
            | RelayError::TokenRequired
            | RelayError::InvalidToken { .. }
    )
}

fn lookup_limited(wait: Duration) -> RelayError {
    RelayError::RateLimited {
        what: "look-ups of unknown session codes",
        retry_after: wait.max(Duration::from_secs(1)),
    }
}

fn locked<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // Each critical section writes whole values: the data is sound after a panic elsewhere.
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// One entry of a list of trusted peers (`TRUSTED_PROXIES`): an address
/// (`10.0.0.7`, `::1`) or a network in CIDR form (`10.0.0.0/8`).
pub fn parse_network(text: &str) -> Result<IpNet, String> {
    let text = text.trim();
    text.parse::<IpNet>()
        .or_else(|_| text.parse::<std::net::IpAddr>().map(IpNet::from))
        .map_err(|_| {
            format!("{text:?} is neither an IP address nor a CIDR network such as 10.0.0.0/8")
        })
}

/// Whether `address` is in one of `networks`.
pub fn is_within(networks: &[IpNet], address: std::net::IpAddr) -> bool {
    networks.iter().any(|network| network.contains(&address))
}

/// The default length of the IPv6 prefix one client is keyed by (`GUARD_IPV6_PREFIX`): a /64 is
/// what one home or office line is handed, so one client has one budget, not 2^64.
pub const DEFAULT_IPV6_PREFIX: u8 = 64;

/// The key every per-address budget and cap counts `address` under: an IPv4 address (an
/// IPv4-mapped IPv6 address is keyed as the IPv4 address it maps) as it is, another IPv6
/// address by its first `ipv6_prefix` bits (the rest zeroed).
pub fn client_key(address: IpAddr, ipv6_prefix: u8) -> IpAddr {
    match address.to_canonical() {
        IpAddr::V4(v4) => IpAddr::V4(v4),
        IpAddr::V6(v6) => {
            let prefix = u32::from(ipv6_prefix.min(128));
            let mask = u128::MAX.checked_shl(128 - prefix).unwrap_or(0);
            IpAddr::V6((u128::from(v6) & mask).into())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clients_are_keyed_by_ipv4_address_or_ipv6_prefix() {
        let key = |text: &str, prefix| client_key(text.parse().unwrap(), prefix).to_string();
        assert_eq!(key("127.0.0.1", 64), "127.0.0.1");
        assert_eq!(key("::ffff:127.0.0.1", 64), "127.0.0.1");
        assert_eq!(key("2001:db8::1", 64), "2001:db8::");
        assert_eq!(key("2001:db8::2", 64), "2001:db8::");
        assert_eq!(key("2001:db8:0:1::2", 64), "2001:db8:0:1::");
        assert_eq!(key("2001:db8::1", 128), "2001:db8::1");
        assert_eq!(key("2001:db8::1", 0), "::");
        assert_eq!(key("::1", 64), "::");
    }

    #[test]
    fn trusted_peers_are_addresses_or_networks() {
        let bare = parse_network("10.1.2.3").unwrap();
        assert!(is_within(&[bare], "10.1.2.3".parse().unwrap()));
        assert!(!is_within(&[bare], "10.1.2.4".parse().unwrap()));
        let network = parse_network(" 10.1.0.0/16").unwrap();
        assert!(is_within(&[network], "10.1.2.4".parse().unwrap()));
        assert!(is_within(
            &[parse_network("::1").unwrap()],
            "::1".parse().unwrap()
        ));
        let error = parse_network("gateway.local").unwrap_err();
        assert!(error.contains("CIDR"), "{error}");
    }

    fn limits(n: u32) -> Limits {
        let n = NonZeroU32::new(n).unwrap();
        let clock = Clock::new();
        Limits::new(
            RateLimits {
                lookups_per_ip: n,
                calls_per_code: n,
                sessions_per_ip: n,
                tools_per_ip: n,
                ipv6_prefix: DEFAULT_IPV6_PREFIX,
            },
            None,
            crate::store::memory::MemoryStore::new(clock.clone(), Duration::from_secs(60)),
            clock,
            Metrics::default(),
        )
    }

    #[tokio::test]
    async fn only_a_client_that_reached_the_relay_itself_is_asked_for_a_key_and_charged() {
        let key = "0123456789abcdef0123";
        let keys = crate::access::ApiKeys::load(&[key.to_owned()], None).unwrap();
        let limits = Limits {
            api_keys: keys,
            ..limits(1)
        };
        let address = "192.0.2.5".parse().unwrap();
        let name = |result: Result<(), RelayError>| result.err().map(|error| error.name());
        assert_eq!(
            name(limits.admit(&Caller::direct(address, None))),
            Some("api_key_required")
        );
        let wrong = Caller::direct(address, Some("fedcba9876543210fedc".into()));
        assert_eq!(name(limits.admit(&wrong)), Some("invalid_api_key"));
        let keyed = Caller::direct(address, Some(key.into()));
        assert_eq!(name(limits.admit(&keyed)), None);
        let admitted = Caller::new(address);
        assert_eq!(name(limits.admit(&admitted)), None);
        assert!(!format!("{keyed:?}").contains(key), "{keyed:?}");

        // A gateway's clients were charged by the gateway; a direct client pays here.
        for _ in 0..3 {
            limits.admit_session(&admitted).await.unwrap();
            limits.admit_tool_call(&admitted).await.unwrap();
        }
        limits.admit_session(&keyed).await.unwrap();
        assert_eq!(
            name(limits.admit_session(&keyed).await),
            Some("rate_limited")
        );
        limits.admit_tool_call(&keyed).await.unwrap();
        assert_eq!(
            name(limits.admit_tool_call(&keyed).await),
            Some("rate_limited")
        );
    }

    fn caller(address: &str) -> Caller {
        Caller::new(address.parse().unwrap())
    }

    async fn lookup(limits: &Limits, who: &Caller, found: bool) -> Result<(), RelayError> {
        limits
            .guarded(who, async {
                if found {
                    Ok(())
                } else {
                    Err(RelayError::SessionNotFound {
                        code: "ABCD-EFGH".into(),
                    })
                }
            })
            .await
    }

    #[tokio::test]
    async fn too_many_unknown_codes_block_every_lookup() {
        let limits = limits(2);
        let probe = caller("192.0.2.5");
        for _ in 0..2 {
            let error = lookup(&limits, &probe, false).await.unwrap_err();
            assert_eq!(error.name(), "session_not_found");
        }
        let over = lookup(&limits, &probe, false).await.unwrap_err();
        assert_eq!(over.name(), "rate_limited", "the third miss is over budget");
        let known = lookup(&limits, &probe, true).await.unwrap_err();
        assert_eq!(known.name(), "rate_limited", "even a good code is refused");
        assert!(known.retry_after().unwrap() >= Duration::from_secs(1));
        lookup(&limits, &caller("192.0.2.6"), true).await.unwrap();
    }

    #[tokio::test]
    async fn a_provider_with_its_token_is_never_refused_and_a_wrong_token_learns_nothing() {
        let limits = limits(1);
        let tab = caller("2001:db8::5");
        let not_found = || async {
            Err::<(), _>(RelayError::SessionNotFound {
                code: "ABCD-EFGH".into(),
            })
        };
        // A wrong token on an unknown code counts like any guess.
        let miss = limits.guarded_provider(&tab, Some("t"), not_found()).await;
        assert_eq!(miss.unwrap_err().name(), "session_not_found");
        let over = limits.guarded_provider(&tab, Some("t"), not_found()).await;
        assert_eq!(over.unwrap_err().name(), "rate_limited");
        // Blocked (its whole /64): the proven token is served, anything unproven refused alike.
        let other = caller("2001:db8::6");
        assert!(
            limits
                .guarded_provider(&other, Some("t"), async { Ok(()) })
                .await
                .is_ok()
        );
        let wrong = async {
            Err::<(), _>(RelayError::InvalidToken {
                code: "ABCD-EFGH".into(),
            })
        };
        let refused = limits.guarded_provider(&other, Some("t"), wrong).await;
        assert_eq!(refused.unwrap_err().name(), "rate_limited");
        let without = limits
            .guarded_provider(&other, None, async { Ok(()) })
            .await;
        assert_eq!(without.unwrap_err().name(), "rate_limited");
    }

    #[tokio::test]
    async fn calls_are_counted_per_session_whatever_the_spelling() {
        let limits = limits(2);
        let who = caller("192.0.2.5");
        limits.call(&who, "ABCD-EFGH").await.unwrap();
        limits.call(&who, "abcdefgh").await.unwrap();
        assert_eq!(
            limits.call(&who, "ABCDEFGH").await.unwrap_err().name(),
            "rate_limited"
        );
        limits.call(&who, "ZZZZZZZZ").await.unwrap();
        limits.call(&caller("192.0.2.6"), "ABCDEFGH").await.unwrap();
    }
}
