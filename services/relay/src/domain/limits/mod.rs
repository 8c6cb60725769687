//! Limits the relay applies on **every** path that takes a session code or connector handle —
//! REST and the legacy aliases through the gateway, MCP, the browser WebSocket and every gRPC
//! RPC — so no path is a way around them (SPEC §10). Each budget is kept **per caller**
//! ([`Caller::identity`]: its MCP session, handle, API key, provider token or assistant user),
//! with a per-address flood ceiling above it, because many people share an address:
//!
//! * the brute-force guard: a caller that looks up too many unknown codes (or handles, claims)
//!   in a minute is refused every look-up until its budget refills; an address whose callers
//!   together pass the ceiling is refused look-ups of codes (never of a handle or claim, which
//!   nobody guesses) — so one guesser never locks out the others behind its address;
//! * calls per caller and session;
//! * what a front door lets in ([`ClientBudgets`]): sessions created and built-in tool calls
//!   per caller and address, which the gateway spends for HTTP and MCP, and the relay for a
//!   gRPC peer that reached it directly, together with that peer's API key
//!   ([`Limits::admit`]).
//!
//! Who the client is: [`Caller`] ([`crate::caller`]). The gateway passes the address and
//! identity it saw (in process, or in the gRPC metadata entries [`CLIENT_ADDRESS_METADATA`]
//! and [`CLIENT_IDENTITY_METADATA`](crate::caller::CLIENT_IDENTITY_METADATA)); the relay
//! believes them only from a peer that proves itself a gateway ([`crate::access`]), and
//! otherwise keys on the peer's own address and API key.

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
use crate::locked;
use crate::metrics::{Metrics, RateLimit};
use crate::store::{BudgetStore, RateBudget, RateCharge};

/// gRPC metadata entry in which a gateway names the client's address.
pub const CLIENT_ADDRESS_METADATA: &str = "x-toolrelay-client";
/// gRPC metadata entry carrying the correlation id of the request (as in HTTP).
pub const CORRELATION_ID_METADATA: &str = "x-request-id";
/// Callers blocked by the guard are forgotten once this many pile up and expire.
const BLOCKED_PRUNE_AT: usize = 10_000;

pub use crate::caller::{Admission, Caller, CallerId, IdentityKind};

/// The per-minute budgets: each counted against the caller ([`Caller::identity`]) and, as a
/// flood ceiling, against its address; a caller without an identity is its address, and has
/// only the ceiling.
#[derive(Debug, Clone, Copy)]
pub struct RateLimits {
    /// Look-ups of unknown codes (and handles, claims) per caller.
    pub lookups_per_caller: NonZeroU32,
    /// Look-ups of unknown codes per client address, every caller there together.
    pub lookups_per_ip: NonZeroU32,
    /// Calls per caller and session.
    pub calls_per_code: NonZeroU32,
    /// Sessions created (`POST /api/sessions`, `open_codap`) per caller.
    pub sessions_per_caller: NonZeroU32,
    /// Sessions created per client address (and, for IPv6, per /48 as well).
    pub sessions_per_ip: NonZeroU32,
    /// Built-in tool calls (outside a session) per caller.
    pub tools_per_caller: NonZeroU32,
    /// Built-in tool calls per client address.
    pub tools_per_ip: NonZeroU32,
    /// Length of the IPv6 prefix one client address is keyed by (`GUARD_IPV6_PREFIX`, see
    /// [`client_key`]).
    pub ipv6_prefix: u8,
}

impl Default for RateLimits {
    fn default() -> Self {
        let per_minute = |n| NonZeroU32::new(n).unwrap_or(NonZeroU32::MIN);
        Self {
            lookups_per_caller: per_minute(30),
            lookups_per_ip: per_minute(600),
            calls_per_code: per_minute(60),
            sessions_per_caller: per_minute(30),
            sessions_per_ip: per_minute(2_000),
            tools_per_caller: per_minute(60),
            tools_per_ip: per_minute(600),
            ipv6_prefix: DEFAULT_IPV6_PREFIX,
        }
    }
}

/// The key a budget of `caller` is counted under: its identity, or its address (its
/// [`client_key`]) when it has none.
fn caller_key(caller: &Caller, ipv6_prefix: u8) -> String {
    match &caller.identity {
        Some(identity) => identity.as_str().to_owned(),
        None => address_key(caller.address, ipv6_prefix),
    }
}

/// [`client_key`] as text, made in one allocation (an address is written a part at a time).
fn address_key(address: IpAddr, ipv6_prefix: u8) -> String {
    use std::fmt::Write;
    // An IPv6 address written in full is the longest, 39 characters.
    let mut key = String::with_capacity(39);
    // Writing to a `String` cannot fail.
    let _ = write!(key, "{}", client_key(address, ipv6_prefix));
    key
}

/// The keys a per-address ceiling counts an address under (unknown codes, sessions created):
/// its [`client_key`], and for IPv6 also its /48 (a site is often handed a /48, so a /48 holds
/// many /64s of one owner).
fn state_keys(address: IpAddr, ipv6_prefix: u8) -> Vec<String> {
    let mut keys = vec![address_key(address, ipv6_prefix)];
    if let IpAddr::V6(_) = address.to_canonical()
        && ipv6_prefix > SITE_IPV6_PREFIX
    {
        keys.push(format!(
            "{}/{SITE_IPV6_PREFIX}",
            client_key(address, SITE_IPV6_PREFIX)
        ));
    }
    keys
}

/// What a front door lets in per minute: sessions created and built-in tool calls, counted in
/// the store (so every gateway and relay sharing it shares them) against the caller, then its
/// address.
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

    /// Counts a session created by `caller`.
    pub async fn create_session(&self, caller: &Caller) -> Result<(), RelayError> {
        let budgets = &self.budgets;
        let mut spends = Vec::new();
        if let Some(identity) = &caller.identity {
            spends.push((identity.to_string(), budgets.sessions_per_caller));
        }
        for key in state_keys(caller.address, budgets.ipv6_prefix) {
            spends.push((key, budgets.sessions_per_ip));
        }
        self.spend(RateLimit::Sessions, spends).await
    }

    /// Counts a built-in tool call outside a session by `caller`.
    pub async fn tool_call(&self, caller: &Caller) -> Result<(), RelayError> {
        let budgets = &self.budgets;
        let mut spends = Vec::new();
        if let Some(identity) = &caller.identity {
            spends.push((identity.to_string(), budgets.tools_per_caller));
        }
        spends.push((
            client_key(caller.address, budgets.ipv6_prefix).to_string(),
            budgets.tools_per_ip,
        ));
        self.spend(RateLimit::Tools, spends).await
    }

    /// Spends a unit of each budget in turn (the caller's first), stopping at the first that
    /// has no room.
    async fn spend(
        &self,
        what: RateLimit,
        spends: Vec<(String, NonZeroU32)>,
    ) -> Result<(), RelayError> {
        let (prefix, counted) = match what {
            RateLimit::Sessions => ("sessions", "sessions created"),
            _ => ("tools", "tool calls"),
        };
        for (key, budget) in spends {
            let key = format!("{prefix}:{key}");
            let spent = self
                .store
                .spend(&key, RateBudget::per_minute(budget), self.clock.now())
                .await?;
            if let Some(wait) = spent {
                self.metrics.rate_limited(what);
                return Err(RelayError::RateLimited {
                    what: counted,
                    retry_after: wait.max(Duration::from_secs(1)),
                });
            }
        }
        Ok(())
    }
}

/// What a look-up names: a short code a person types (what guessers try), or a 128-bit secret
/// (a connector handle, a claim) that nobody guesses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reference {
    /// A pairing code.
    Code,
    /// A handle or a claim.
    Secret,
}

/// The relay's limits on paths that take a code or handle: the brute-force guard and the
/// calls per session. The budgets are kept in the store, so every replica sharing a store
/// shares them; a caller (or address) blocked by the guard is also remembered here, so it is
/// refused without asking the store (a replica learns of a block made by another on the
/// caller's next unknown code).
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
    /// Until when a caller (by identity) or an address is refused look-ups. A std mutex: held
    /// for a map access or a time check, never across an `.await`.
    blocked: Mutex<HashMap<String, Instant>>,
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
            Admission::Direct { .. } => self.front_door.create_session(caller).await,
        }
    }

    /// Lets `caller` run a built-in tool outside a session: [`Limits::admit`], and a client
    /// that reached the relay directly spends its budget of tool calls.
    pub async fn admit_tool_call(&self, caller: &Caller) -> Result<(), RelayError> {
        self.admit(caller)?;
        match caller.admission {
            Admission::Gateway => Ok(()),
            Admission::Direct { .. } => self.front_door.tool_call(caller).await,
        }
    }

    /// Runs a look-up of a pairing code for `caller` under the guard: a blocked caller — or
    /// any caller at a blocked address — is refused, and an unknown code counts against the
    /// caller and its address (past a budget, the look-up itself is answered with the
    /// rate-limit error).
    pub async fn guarded<T>(
        &self,
        caller: &Caller,
        operation: impl Future<Output = Result<T, RelayError>>,
    ) -> Result<T, RelayError> {
        self.guarded_as(caller, Reference::Code, operation).await
    }

    /// [`Limits::guarded`] for a look-up of `reference`. A handle or claim is a 128-bit secret
    /// nobody guesses, so only its caller's own block refuses it, never one its address earned
    /// through other callers' unknown codes; an unknown one still counts.
    pub async fn guarded_as<T>(
        &self,
        caller: &Caller,
        reference: Reference,
        operation: impl Future<Output = Result<T, RelayError>>,
    ) -> Result<T, RelayError> {
        self.check(caller, reference)?;
        self.counted(caller, operation.await).await
    }

    /// Runs a provider's operation, which proves the session's provider token when `token` is
    /// given, under the guard. A tab presenting its token is never refused by the guard (the
    /// token is a 128-bit secret: an address blocked for guessing codes still re-attaches its
    /// own tab); to a blocked caller, every failure before the token is proven (no such
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
        match operation.await {
            Err(error) if is_unproven(&error) => {
                self.check(caller, Reference::Code)?;
                self.counted(caller, Err(error)).await
            }
            proven => proven,
        }
    }

    /// An unknown code, handle or claim in `outcome` counts against `caller`.
    async fn counted<T>(
        &self,
        caller: &Caller,
        outcome: Result<T, RelayError>,
    ) -> Result<T, RelayError> {
        match outcome {
            Err(
                error @ (RelayError::SessionNotFound { .. }
                | RelayError::UnknownHandle
                | RelayError::UnknownClaim),
            ) => {
                self.miss(caller).await?;
                Err(error)
            }
            other => other,
        }
    }

    /// The key `caller`'s own budgets count under: its identity, or its address.
    pub fn caller_key(&self, caller: &Caller) -> String {
        caller_key(caller, self.budgets.ipv6_prefix)
    }

    /// The keys `caller`'s address is counted under: its [`client_key`], and for IPv6 its /48
    /// as well, so that a site's many /64s share one ceiling.
    fn address_keys(&self, caller: &Caller) -> Vec<String> {
        state_keys(caller.address, self.budgets.ipv6_prefix)
    }

    /// What a call by `caller` to session `code` (spelt as the caller spelt it) costs. The
    /// relay spends it as it queues the call, in the same step (see
    /// [`crate::store::EnqueueChecks`]); the key carries the session's hash tag.
    pub fn call_charge(&self, caller: &Caller, code: &str) -> RateCharge {
        self.call_charge_of(&self.caller_key(caller), code)
    }

    /// [`Limits::call_charge`] for the caller whose key ([`Limits::caller_key`]) is `caller`.
    pub fn call_charge_of(&self, caller: &str, code: &str) -> RateCharge {
        match SessionCode::parse(code) {
            Ok(code) => self.call_charge_in(caller, &code),
            Err(_) => self.charge_under(caller, code),
        }
    }

    /// [`Limits::call_charge_of`] for a code already read.
    pub fn call_charge_in(&self, caller: &str, code: &SessionCode) -> RateCharge {
        self.charge_under(caller, code.as_str())
    }

    fn charge_under(&self, caller: &str, code: &str) -> RateCharge {
        RateCharge {
            key: format!("calls:{caller}:{{{code}}}"),
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

    /// Refuses a look-up of `reference` by a blocked caller, or by any caller at a blocked
    /// address when it names a code. A handle or claim is refused only to a caller blocked by
    /// its own identity: a 128-bit secret is not guessed, so the plugin redeeming its claim
    /// from a school's blocked address still pairs.
    fn check(&self, caller: &Caller, reference: Reference) -> Result<(), RelayError> {
        let now = Instant::now();
        let blocked = locked(&self.blocked);
        let until = |key: &str| blocked.get(key).copied().filter(|until| *until > now);
        let mut refused = caller.identity.as_ref().and_then(|id| until(id.as_str()));
        // (The address's keys are written out only when some key is blocked at all.)
        if reference == Reference::Code && !blocked.is_empty() {
            for key in self.address_keys(caller) {
                refused = refused.max(until(&key));
            }
        }
        match refused {
            Some(until) => {
                self.metrics.rate_limited(RateLimit::Lookups);
                Err(lookup_limited(until - now))
            }
            None => Ok(()),
        }
    }

    /// Counts an unknown code against `caller`'s own budget, then its address's ceiling; past
    /// either, blocks that caller (or the address) until the budget has room again.
    async fn miss(&self, caller: &Caller) -> Result<(), RelayError> {
        let mut spends = Vec::with_capacity(3);
        if let Some(identity) = &caller.identity {
            spends.push((identity.to_string(), self.budgets.lookups_per_caller));
        }
        for address in self.address_keys(caller) {
            spends.push((address, self.budgets.lookups_per_ip));
        }
        for (who, budget) in spends {
            let Some(wait) = self
                .store
                .spend(
                    &format!("misses:{who}"),
                    RateBudget::per_minute(budget),
                    self.clock.now(),
                )
                .await?
            else {
                continue;
            };
            {
                let mut blocked = locked(&self.blocked);
                let now = Instant::now();
                if blocked.len() >= BLOCKED_PRUNE_AT {
                    blocked.retain(|_, until| *until > now);
                }
                blocked.insert(who.clone(), now + wait);
            }
            let address = caller.address;
            if caller
                .identity
                .as_ref()
                .is_some_and(|id| id.as_str() == who)
            {
                tracing::warn!(caller = %who, %address, "caller blocked from code look-ups: too many unknown codes");
            } else {
                tracing::warn!(%address, "address blocked from code look-ups: too many unknown codes from its callers together");
            }
            self.metrics.rate_limited(RateLimit::Lookups);
            return Err(lookup_limited(wait));
        }
        Ok(())
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
/// The IPv6 prefix of a site (what an ISP hands a customer at most): budgets that create state
/// count an IPv6 client by it as well.
pub const SITE_IPV6_PREFIX: u8 = 48;

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
mod tests;
