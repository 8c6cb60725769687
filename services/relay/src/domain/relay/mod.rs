//! The relay's domain, shared by every transport: sessions, manifests, calls and their
//! responses. Provider attachment lives in [`crate::provider`].
//!
//! One file per family of operations (`sessions.rs`, `manifests.rs`, `calls.rs`,
//! `waiting.rs`, `answers.rs`, `polling.rs`, `builtin.rs`, `claims.rs`, `approvals.rs`): each
//! holds the family's domain steps, as [`Relay`] methods, in plain Rust. The units the
//! transports run them through — each operation's checks for its caller, its messages on the
//! wire, what a front end in front of a remote relay does first — are the operations layer's,
//! in [`crate::ops`], one file per family too. Nothing here names a transport type: a test
//! there holds the domain to that.
//!
//! Each operation takes the session code as the caller typed it, normalises it, and returns a
//! [`RelayError`] whose message tells the caller what to do next.

mod answers;
pub mod approvals;
mod builtin;
mod calls;
mod claims;
mod content;
mod manifests;
mod polling;
mod sessions;
pub(crate) mod tabs;
mod waiting;

pub use self::answers::{AnswerLimits, contain_response, too_deep_response};
pub use self::claims::{ClaimDescription, ClaimedSession};
pub use self::polling::{MAX_RUNNING, Polled};

use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use toolrelay::wire::{RequestStatus, ToolResponse};

use crate::builtin::Registry;
use crate::clock::{Clock, Timestamp};
use crate::code::{self, SessionCode};
use crate::config::RelayConfig;
use crate::drain::Drain;
use crate::error::RelayError;
use crate::limits::Limits;
use crate::manifest::ManifestCache;
use crate::metrics::{Metrics, StoreState};
use crate::store::observed::Observed;
use crate::store::{
    BudgetStore, CallNews, CallProgress, EventStream, RequestRecord, SessionRecord, Store,
    Transport,
};

/// How many times creation tries a fresh code when the random one is taken.
const CODE_ATTEMPTS: usize = 8;
/// A polling provider counts as connected this long after its last poll.
const POLLING_PRESENCE: Duration = Duration::from_secs(10);

/// The relay: cheap to clone, all clones share one state.
#[derive(Clone)]
pub struct Relay {
    inner: Arc<Inner>,
}

struct Inner {
    /// Held by type rather than as `dyn Store`, so a call's store operations are boxed once
    /// ([`Observed`]).
    store: Arc<Observed>,
    tools: Registry,
    config: RelayConfig,
    clock: Clock,
    limits: Limits,
    drain: Drain,
    /// Compiled manifests of this replica, by session and revision.
    manifests: ManifestCache,
    /// This replica's name: in the leases of the built-in calls it runs, at the start of its
    /// tab connections' ids, and in the store's record of the live replicas.
    replica: String,
    /// The process's metrics.
    metrics: Metrics,
    /// The tab connections this replica serves, kept up together.
    tabs: crate::relay::tabs::Tabs,
}

/// A session just created: the only time its provider token is revealed.
#[derive(Debug, Clone)]
pub struct NewSession {
    /// The pairing code.
    pub code: SessionCode,
    /// The provider's secret (empty for a session opened for a claim: its tab is given one
    /// when it redeems the claim).
    pub provider_token: String,
    /// The idle timeout.
    pub ttl: Duration,
    /// When it expires unless there is activity.
    pub expires_at: Timestamp,
    /// When it ends however active it is.
    pub max_expires_at: Timestamp,
    /// The secret of its MCP connector URL (`/mcp/s/{handle}`).
    pub mcp_handle: String,
}

/// Where a session stands.
#[derive(Debug, Clone, PartialEq)]
pub struct SessionStatus {
    /// The pairing code.
    pub code: SessionCode,
    /// When it was created.
    pub created_at: Timestamp,
    /// When it expires unless there is activity.
    pub expires_at: Timestamp,
    /// When it ends however active it is.
    pub max_expires_at: Timestamp,
    /// How the provider is attached, when one is.
    pub transport: Option<Transport>,
    /// Number of functions in the manifest.
    pub tool_count: usize,
    /// Calls waiting for an answer.
    pub pending_requests: usize,
    /// The secret of its MCP connector URL.
    pub mcp_handle: String,
}

/// A call as a consumer makes it.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct CallInput {
    /// Idempotency key; generated when absent.
    pub request_id: Option<String>,
    /// The group of the function, if the caller names one.
    pub tool_id: Option<String>,
    /// The function.
    pub function_name: String,
    /// Its arguments (`null` counts as `{}`).
    pub args: Value,
    /// The correlation id of the request that made the call, for the log line of its end.
    pub correlation_id: Option<String>,
    /// Run it only if the function is marked read-only (a read: `…/read`,
    /// `read_session_tool`); otherwise it is refused with `not_read_only`.
    pub read_only: bool,
    /// Who makes it (the key its budgets count under), set by the relay as it lets the call
    /// in: only that caller may cancel it.
    pub caller: Option<String>,
    /// Whether the person must have allowed its caller, set by the relay as it lets the call
    /// in (from how the caller named the session).
    pub approval: crate::store::ApprovalCheck,
    /// Its caller, as the person would be asked about it (set with `approval`).
    pub asker: Option<approvals::Asker>,
}

/// Where a call stands, with its response once it has one.
#[derive(Debug, Clone, PartialEq)]
pub struct RequestView {
    /// The call's id.
    pub request_id: String,
    /// Its status.
    pub status: RequestStatus,
    /// Its final answer (completed, failed or expired).
    pub response: Option<ToolResponse>,
    /// Whether something can answer it now: a provider is connected to the session, or the
    /// tool is built into the relay. (A finished call counts as answered by one.)
    pub provider_connected: bool,
    /// The called function says its results may hold untrusted content (WebMCP's
    /// `untrustedContentHint`): known to the view of the call as it was queued, which checked
    /// it against the session's tools; false in any later view.
    pub untrusted: bool,
    /// How far it has come, as its tab last said (while it is delivered).
    pub progress: Option<CallProgress>,
    /// Its news since the wait began, oldest first (a wait that asked for news).
    pub news: Vec<CallNews>,
}

impl RequestView {
    /// The view of `record`: its id and answer taken from it when nothing else holds it,
    /// copied when something does (the store, while the call is unfinished).
    fn of(record: Arc<RequestRecord>, provider_connected: bool) -> Self {
        let provider_connected =
            provider_connected || record.builtin || record.status.is_terminal();
        let status = record.status;
        let (request_id, response) = match Arc::try_unwrap(record) {
            Ok(record) => (record.id, record.response),
            Err(shared) => (shared.id.clone(), shared.response.clone()),
        };
        Self {
            provider_connected,
            request_id,
            status,
            response,
            untrusted: false,
            progress: None,
            news: Vec::new(),
        }
    }
}

/// What happened to a provider's response.
#[derive(Debug, Clone, PartialEq)]
pub struct ResponseOutcome {
    /// The call's id.
    pub request_id: String,
    /// The call's status now.
    pub status: RequestStatus,
    /// False when the call had its answer already (a redelivered call answered twice) or had
    /// expired: the first answer wins.
    pub accepted: bool,
}
impl Relay {
    /// A relay over `store` without built-in tools, reporting to `metrics` (the store should
    /// count what it expires there too). `config` must be valid ([`RelayConfig::validate`]).
    /// The binaries give theirs with [`Relay::with_tools`] (`toolrelay-builtin`'s standard
    /// registry).
    pub fn new(store: Arc<dyn Store>, config: RelayConfig, clock: Clock, metrics: Metrics) -> Self {
        Self::with_tools(store, config, clock, Registry::default(), metrics)
    }

    /// A relay with these built-in tools. Its store's operations are measured, and what the
    /// store holds is read into the metrics when they are scraped.
    pub fn with_tools(
        store: Arc<dyn Store>,
        config: RelayConfig,
        clock: Clock,
        tools: Registry,
        metrics: Metrics,
    ) -> Self {
        let store = Observed::wrap(store, metrics.clone());
        let relay = Self {
            inner: Arc::new(Inner {
                limits: Limits::new(
                    config.limits,
                    config.api_keys.clone(),
                    Arc::clone(&store) as Arc<dyn BudgetStore>,
                    clock.clone(),
                    metrics.clone(),
                ),
                store,
                tools,
                config,
                clock,
                drain: Drain::new(),
                replica: code::random_id(),
                manifests: ManifestCache::default(),
                metrics: metrics.clone(),
                tabs: crate::relay::tabs::Tabs::default(),
            }),
        };
        // Weak: the metrics outlive a relay that is dropped (tests make many).
        let weak = Arc::downgrade(&relay.inner);
        metrics.on_scrape(move || {
            let relay = weak.upgrade().map(|inner| Relay { inner });
            Box::pin(async move {
                if let Some(relay) = relay {
                    relay.observe_state().await;
                }
            })
        });
        relay
    }

    /// The process's metrics.
    pub fn metrics(&self) -> &Metrics {
        &self.inner.metrics
    }

    /// Reads what the metrics report about the store and the drain (when they are scraped).
    async fn observe_state(&self) {
        let metrics = &self.inner.metrics;
        metrics.draining(self.inner.drain.is_draining());
        // The ping sets `toolrelay_store_up`; the usage, what the store holds.
        let _ = self.inner.store.ping().await;
        match self.inner.store.usage().await {
            Ok(usage) => metrics.store_state(StoreState {
                sessions: usage.sessions,
                answer_bytes: usage.answer_bytes,
                answer_budget: self.inner.config.response_budget,
            }),
            Err(error) => tracing::debug!(%error, "the store's usage could not be read"),
        }
    }

    /// The settings.
    pub fn config(&self) -> &RelayConfig {
        &self.inner.config
    }

    /// The clock.
    pub fn clock(&self) -> &Clock {
        &self.inner.clock
    }

    /// Tells every connected provider to reconnect and ends their connections at once (the
    /// end of a drain, see [`Relay::drain`]).
    pub fn shutdown(&self) {
        self.inner.drain.end();
    }

    /// The process's drain: once it begins, new sessions, calls and attaches are refused; when
    /// it ends, waiting callers give up and providers are told to reconnect elsewhere.
    pub fn drain(&self) -> &Drain {
        &self.inner.drain
    }

    /// The store, which other components of the same process may share (a gateway's rate
    /// limits).
    pub fn store(&self) -> &Arc<Observed> {
        &self.inner.store
    }

    /// The address-keyed limits (brute-force guard, calls per session) every transport applies.
    pub fn limits(&self) -> &Limits {
        &self.inner.limits
    }

    /// Takes a place for `member` among the live things of `set` until `until`, under the
    /// global ceiling `cap` (the setting `limit`); past it, the refusal — counted once as
    /// `refusal` — names the limit.
    pub(crate) async fn within_ceiling(
        &self,
        ceiling: Ceiling,
        member: &str,
        until: Timestamp,
    ) -> Result<(), RelayError> {
        let (set, cap, limit, what, refusal) = match ceiling {
            Ceiling::Claims => (
                "claims",
                self.inner.config.max_claims,
                crate::config::ENV_MAX_CLAIMS,
                "claims out",
                crate::metrics::Refusal::ClaimsTotal,
            ),
            Ceiling::Manifests => (
                "manifests",
                self.inner.config.max_manifests,
                crate::config::ENV_MAX_MANIFESTS,
                "distinct tool manifests",
                crate::metrics::Refusal::ManifestsTotal,
            ),
        };
        let now = self.now();
        if self
            .inner
            .store
            .take_place(set, member, cap, now, until)
            .await?
        {
            return Ok(());
        }
        self.inner.metrics.refused(refusal);
        tracing::warn!(limit, cap, "refused at a global ceiling");
        Err(RelayError::AtCapacity {
            what,
            limit,
            value: cap,
        })
    }

    /// Refuses new work while the process drains.
    pub(crate) fn accepting(&self) -> Result<(), RelayError> {
        if self.inner.drain.is_draining() {
            Err(RelayError::ShuttingDown)
        } else {
            Ok(())
        }
    }

    /// Whether the relay can serve: its store answers.
    pub async fn ready(&self) -> Result<(), RelayError> {
        Ok(self.inner.store.ping().await?)
    }

    // ---- helpers shared with the provider side ----

    pub(crate) fn now(&self) -> Timestamp {
        self.inner.clock.now()
    }

    /// The session a caller names: by its pairing code, or by a connector handle, which every
    /// consumer operation takes in the code's place (one look-up in the store).
    pub(crate) async fn session_code(&self, session: &str) -> Result<SessionCode, RelayError> {
        Ok(self.named_session(session).await?.0)
    }

    pub(crate) async fn live_session(
        &self,
        code: &str,
    ) -> Result<(SessionCode, SessionRecord), RelayError> {
        let code = self.session_code(code).await?;
        match self.inner.store.session(&code).await? {
            Some(session) => Ok((code, session)),
            None => Err(not_found(&code)),
        }
    }

    /// The live session, if `token` is its provider token.
    pub(crate) async fn authorized(
        &self,
        code: &str,
        token: Option<&str>,
    ) -> Result<(SessionCode, SessionRecord), RelayError> {
        let (code, session) = self.live_session(code).await?;
        match token {
            None | Some("") => Err(RelayError::TokenRequired),
            Some(token) if code::hash_token(token) == session.token_hash => Ok((code, session)),
            Some(_) => Err(RelayError::InvalidToken {
                code: code.display(),
            }),
        }
    }

    /// Slides the session's expiry; `connection` marks that provider connection as seen.
    pub(crate) async fn touch(
        &self,
        code: &SessionCode,
        connection: Option<&str>,
    ) -> Result<SessionRecord, RelayError> {
        let now = self.now();
        let until = now.plus(self.inner.config.session_ttl);
        self.inner
            .store
            .touch_session(code, now, until, connection)
            .await?
            .ok_or_else(|| not_found(code))
    }

    pub(crate) async fn subscribe(&self, code: &SessionCode) -> Result<EventStream, RelayError> {
        self.inner
            .store
            .subscribe(code)
            .await?
            .ok_or_else(|| not_found(code))
    }
}

/// A global ceiling kept as a set of live things in the store (live sessions have theirs in
/// the store's own count, see [`crate::store::SessionStore::insert_session_within`]).
#[derive(Debug, Clone, Copy)]
pub(crate) enum Ceiling {
    /// Claims out (`MAX_CLAIMS`).
    Claims,
    /// Distinct manifests (`MAX_MANIFESTS`).
    Manifests,
}

/// Whole milliseconds, as logs show them.
pub fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

pub(crate) fn not_found(code: &SessionCode) -> RelayError {
    RelayError::SessionNotFound {
        code: code.display(),
    }
}
