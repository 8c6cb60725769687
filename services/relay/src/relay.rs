//! The relay's domain operations, shared by every transport: sessions, manifests, calls and
//! their responses. Provider attachment lives in [`crate::provider`].
//!
//! Each operation takes the session code as the caller typed it, normalises it, and returns a
//! [`RelayError`] whose message tells the caller what to do next.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use serde_json::Value;
use toolrelay::wire::{
    FunctionSpec, GroupedManifest, ProviderResponse, RequestStatus, ToolError, ToolGroup,
    ToolResponse,
};

use crate::builtin::{
    BUILTIN_GROUP, BUILTIN_GROUP_DESCRIPTION, Context, FailureKind, Registry, Scope, Tickets,
    ToolCode, ToolFailure, ToolInfo,
};
use crate::clock::{Clock, Timestamp};
use crate::code::{self, SessionCode};
use crate::config::RelayConfig;
use crate::drain::Drain;
use crate::error::RelayError;
use crate::limits::Limits;
use crate::manifest::{Manifest, ManifestCache, ManifestLimits};
use crate::metrics::{AnsweredBy, Metrics, StoreState};
use crate::store::observed::Observed;
use crate::store::{
    Answerer, BUILTIN_LEASE, BudgetStore, EnqueueChecks, Enqueued, EventStream, Finished,
    NewRequest, RateCharge, RequestRecord, SessionEvent, SessionRecord, Store, Transport,
};

/// How many times creation tries a fresh code when the random one is taken.
const CODE_ATTEMPTS: usize = 8;
/// A polling provider counts as connected this long after its last poll.
const POLLING_PRESENCE: Duration = Duration::from_secs(10);

/// The relay: cheap to clone, all clones share one state.
#[derive(Clone)]
pub struct Relay {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) store: Arc<dyn Store>,
    pub(crate) tools: Registry,
    pub(crate) config: RelayConfig,
    pub(crate) clock: Clock,
    pub(crate) limits: Limits,
    pub(crate) drain: Drain,
    /// Compiled manifests of this replica, by session and revision.
    pub(crate) manifests: ManifestCache,
    /// This replica's name: in the leases of the built-in calls it runs, at the start of its
    /// tab connections' ids, and in the store's record of the live replicas.
    pub(crate) replica: String,
    /// The process's metrics.
    pub(crate) metrics: Metrics,
    /// The tab connections this replica serves, kept up together.
    pub(crate) tabs: crate::tabs::Tabs,
}

/// A session just created: the only time its provider token is revealed.
#[derive(Debug, Clone)]
pub struct NewSession {
    /// The pairing code.
    pub code: SessionCode,
    /// The provider's secret.
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
}

impl RequestView {
    fn of(record: RequestRecord, provider_connected: bool) -> Self {
        Self {
            provider_connected: provider_connected || record.builtin || record.status.is_terminal(),
            request_id: record.id,
            status: record.status,
            response: record.response,
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
    /// A relay over `store`, with the standard built-in tools, reporting to `metrics` (the
    /// store should count what it expires there too). `config` must be valid
    /// ([`RelayConfig::validate`]).
    pub fn new(store: Arc<dyn Store>, config: RelayConfig, clock: Clock, metrics: Metrics) -> Self {
        let tools = Registry::standard(&config.builtin, &metrics);
        Self::with_tools(store, config, clock, tools, metrics)
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
                tabs: crate::tabs::Tabs::default(),
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
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.inner.store
    }

    /// The address-keyed limits (brute-force guard, calls per session) every transport applies.
    pub fn limits(&self) -> &Limits {
        &self.inner.limits
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

    /// Creates a session.
    pub async fn create_session(&self) -> Result<NewSession, RelayError> {
        self.accepting()?;
        let config = &self.inner.config;
        let now = self.now();
        let provider_token = code::generate_token();
        for _ in 0..CODE_ATTEMPTS {
            let record = SessionRecord {
                code: SessionCode::generate(),
                token_hash: code::hash_token(&provider_token),
                created_at: now,
                expires_at: now.plus(config.session_ttl),
                max_expires_at: now.plus(config.session_max_lifetime),
                provider: None,
                manifest_revision: 0,
                mcp_handle: code::random_id(),
            };
            let session = NewSession {
                code: record.code.clone(),
                provider_token: provider_token.clone(),
                ttl: config.session_ttl,
                expires_at: record.expires_at,
                max_expires_at: record.max_expires_at,
                mcp_handle: record.mcp_handle.clone(),
            };
            if self.inner.store.insert_session(record).await? {
                self.inner.metrics.session_created();
                tracing::info!(code = %session.code.redacted(), "session created");
                return Ok(session);
            }
        }
        // 8 collisions in a row among 2^40 codes means the store is not behaving.
        Err(RelayError::StoreUnavailable(crate::error::StoreError(
            "no free session code after repeated attempts".into(),
        )))
    }

    /// Where a session stands. Reading the status is not activity: it does not slide expiry.
    pub async fn session_status(&self, code: &str) -> Result<SessionStatus, RelayError> {
        let (code, session) = self.live_session(code).await?;
        let now = self.now();
        let manifest = self.manifest_of(&code, session.manifest_revision).await?;
        let pending_requests = self
            .inner
            .store
            .pending_count(&code)
            .await?
            .ok_or_else(|| not_found(&code))?;
        let transport = self.connected_transport(&session, now).await;
        Ok(SessionStatus {
            created_at: session.created_at,
            expires_at: session.expires_at,
            max_expires_at: session.max_expires_at,
            transport,
            tool_count: manifest.functions().len() + self.inner.tools.names().len(),
            pending_requests,
            mcp_handle: session.mcp_handle,
            code,
        })
    }

    /// How the session's provider is attached, if one is connected now: a poller while it
    /// polls, a pushing connection while its replica serves it (this one, or another that
    /// counts as alive: see [`crate::tabs`]).
    async fn connected_transport(
        &self,
        session: &SessionRecord,
        now: Timestamp,
    ) -> Option<Transport> {
        let provider = session.provider.as_ref()?;
        let present = match provider.transport {
            Transport::Polling => now.since(provider.last_seen) <= POLLING_PRESENCE,
            _ => {
                let recent = now.since(provider.last_seen) <= self.inner.config.tab_presence();
                self.connection_present(&provider.connection_id, now, recent)
                    .await
            }
        };
        present.then_some(provider.transport)
    }

    /// A call's view, with whether a provider can answer it now; an error for a call whose
    /// answer was evicted.
    async fn view(
        &self,
        code: &SessionCode,
        record: RequestRecord,
    ) -> Result<RequestView, RelayError> {
        if record.evicted {
            return Err(RelayError::ResponseEvicted {
                request_id: record.id,
            });
        }
        if record.builtin || record.status.is_terminal() {
            return Ok(RequestView::of(record, true));
        }
        let connected = match self.inner.store.session(code).await? {
            Some(session) => self
                .connected_transport(&session, self.now())
                .await
                .is_some(),
            None => false,
        };
        Ok(RequestView::of(record, connected))
    }

    /// The code of the session an MCP connector handle belongs to.
    pub async fn resolve_handle(&self, handle: &str) -> Result<SessionCode, RelayError> {
        self.inner
            .store
            .session_by_handle(handle)
            .await?
            .ok_or(RelayError::UnknownHandle)
    }

    /// Ends a session at once; its provider receives `expired`. Needs the provider token.
    pub async fn end_session(&self, code: &str, token: Option<&str>) -> Result<(), RelayError> {
        let (code, _) = self.authorized(code, token).await?;
        self.inner.store.delete_session(&code).await?;
        tracing::info!(code = %code.redacted(), "session ended by its provider");
        Ok(())
    }

    /// The session's tools: the provider's, then the built-in ones (group [`BUILTIN_GROUP`]).
    /// Fetching them counts as activity.
    pub async fn manifest(&self, code: &str) -> Result<GroupedManifest, RelayError> {
        let (code, _) = self.live_session(code).await?;
        let session = self.touch(&code, None).await?;
        let mut grouped = self
            .manifest_of(&code, session.manifest_revision)
            .await?
            .grouped();
        grouped.tools.push(ToolGroup {
            id: BUILTIN_GROUP.to_owned(),
            description: BUILTIN_GROUP_DESCRIPTION.to_owned(),
            functions: self
                .inner
                .tools
                .list()
                .into_iter()
                .map(|tool| FunctionSpec {
                    name: tool.name,
                    description: tool.description,
                    parameters: tool.input_schema,
                })
                .collect(),
        });
        Ok(grouped)
    }

    /// A stream with an item each time the session's manifest changes; it ends with the
    /// session. Lost events (and a shared store's periodic "look again") are checked against
    /// the manifest's revision, so an item always means a new manifest.
    pub async fn manifest_changes(
        &self,
        code: &str,
    ) -> Result<futures::stream::BoxStream<'static, ()>, RelayError> {
        let code = SessionCode::parse(code)?;
        // Subscribed before the revision is read, so no change falls between the two.
        let events = self.subscribe(&code).await?;
        let (code, session) = self.live_session(code.as_str()).await?;
        let store = Arc::clone(&self.inner.store);
        let changes = futures::stream::unfold(
            (events, session.manifest_revision),
            move |(mut events, seen)| {
                let store = Arc::clone(&store);
                let code = code.clone();
                async move {
                    loop {
                        match events.next().await? {
                            SessionEvent::SessionEnded => return None,
                            SessionEvent::ManifestChanged | SessionEvent::Missed => {
                                match store.session(&code).await {
                                    Ok(Some(session)) if session.manifest_revision != seen => {
                                        return Some(((), (events, session.manifest_revision)));
                                    }
                                    Ok(None) => return None,
                                    // Unchanged, or the store is unreachable: look again at
                                    // the next event.
                                    Ok(Some(_)) | Err(_) => {}
                                }
                            }
                            _ => {}
                        }
                    }
                }
            },
        );
        Ok(changes.boxed())
    }

    /// The built-in tools.
    pub fn tools(&self) -> Vec<ToolInfo> {
        self.inner.tools.list()
    }

    /// Runs a built-in tool outside any session, for `scope` (stateful tools need one), for
    /// the client at `client` (the MIP tools share their slots fairly by it).
    pub async fn call_tool(
        &self,
        name: &str,
        args: Value,
        scope: Scope,
        client: IpAddr,
    ) -> Result<Value, ToolFailure> {
        let limit = self.inner.config.max_json_depth;
        if toolrelay::json::depth(&args) > limit {
            let error = RelayError::NestedTooDeeply {
                what: "The arguments are",
                limit,
            };
            return Err(ToolFailure::new(
                FailureKind::BadInput,
                ToolCode::NestedTooDeeply,
                error.to_string(),
            ));
        }
        // Keyed as every per-address budget is (an IPv6 client by its /GUARD_IPV6_PREFIX).
        let client = crate::limits::client_key(client, self.inner.config.limits.ipv6_prefix);
        let context = Context {
            client: Some(client),
            ..self.tool_context(scope)
        };
        self.inner.tools.call(name, args, &context).await
    }

    fn tool_context(&self, scope: Scope) -> Context {
        Context {
            scope,
            client: None,
            tickets: Tickets::new(Arc::clone(&self.inner.store), self.inner.clock.clone()),
            metrics: self.inner.metrics.clone(),
        }
    }

    /// Replaces the manifest; returns the number of functions. Needs the provider token. A
    /// refused manifest leaves the previous one in place.
    pub async fn register_manifest(
        &self,
        code: &str,
        token: Option<&str>,
        tools: &Value,
    ) -> Result<usize, RelayError> {
        let (code, _) = self.authorized(code, token).await?;
        self.install_manifest(&code, tools, None).await
    }

    pub(crate) async fn install_manifest(
        &self,
        code: &SessionCode,
        tools: &Value,
        connection: Option<&str>,
    ) -> Result<usize, RelayError> {
        let manifest = Manifest::parse(tools, self.manifest_limits())?;
        for function in manifest.functions() {
            if self.inner.tools.contains(&function.name) || function.group_id() == BUILTIN_GROUP {
                return Err(RelayError::InvalidManifest {
                    reason: format!(
                        "{} is the name of a tool built into the relay (tool id {BUILTIN_GROUP}); give yours another name",
                        if function.group_id() == BUILTIN_GROUP {
                            BUILTIN_GROUP
                        } else {
                            &function.name
                        }
                    ),
                });
            }
        }
        let count = manifest.functions().len();
        let json = manifest.to_json();
        // Another session's copy of the same tools, if there is one: one compiled copy each.
        let manifest = self
            .inner
            .manifests
            .shared(&json, || Ok::<_, RelayError>(manifest))?;
        let revision = self
            .inner
            .store
            .set_manifest(code, json)
            .await?
            .ok_or_else(|| not_found(code))?;
        self.inner.manifests.put(code, revision, manifest);
        self.touch(code, connection).await?;
        tracing::info!(code = %code.redacted(), functions = count, "manifest registered");
        Ok(count)
    }

    /// Queues a call after checking it against the manifest; returns at once. Repeating a
    /// request id with the same call returns that call's state and runs nothing.
    pub async fn submit(&self, code: &str, call: CallInput) -> Result<RequestView, RelayError> {
        self.submit_charged(code, call, None).await
    }

    /// [`Relay::submit`], spending `charge` (the caller's budget) as the call is queued.
    pub async fn submit_charged(
        &self,
        code: &str,
        call: CallInput,
        charge: Option<RateCharge>,
    ) -> Result<RequestView, RelayError> {
        let (record, connected) = self.queue(code, call, charge, None).await?;
        Ok(RequestView::of(record, connected))
    }

    /// [`Relay::submit`]'s work: the call's record, and whether a tab is there to run it.
    /// `charge` is spent whatever happens: with the queueing, or on its own when the call is
    /// refused before it gets there (an unknown code, bad arguments). A call that names no
    /// request id gets `fresh_id` (a random one when `None`).
    async fn queue(
        &self,
        code: &str,
        call: CallInput,
        charge: Option<RateCharge>,
        fresh_id: Option<String>,
    ) -> Result<(RequestRecord, bool), RelayError> {
        let mut charge = charge;
        let queued = self.try_queue(code, call, &mut charge, fresh_id).await;
        if queued.is_err()
            && let Some(charge) = charge
        {
            self.inner.limits.spend_call(&charge, self.now()).await?;
        }
        queued
    }

    /// [`Relay::queue`]'s work; takes `charge` when it hands it to the store.
    ///
    /// A call's way in is one round trip to the store when this replica knows the session's
    /// manifest (it compiled it for an earlier call): the queueing checks that the manifest
    /// is still at that revision, spends the charge, and says whether a tab is there. Only
    /// the first call (or one after the manifest changed) reads the session first.
    async fn try_queue(
        &self,
        code: &str,
        call: CallInput,
        charge: &mut Option<RateCharge>,
        fresh_id: Option<String>,
    ) -> Result<(RequestRecord, bool), RelayError> {
        self.accepting()?;
        let code = SessionCode::parse(code)?;
        let limit = self.inner.config.max_json_depth;
        if toolrelay::json::depth(&call.args) > limit {
            return Err(RelayError::NestedTooDeeply {
                what: "The arguments are",
                limit,
            });
        }
        let given_id = call.request_id.is_some();
        let request_id = match call.request_id {
            Some(id) if is_valid_request_id(&id) => id,
            Some(_) => return Err(RelayError::InvalidRequestId),
            None => fresh_id.unwrap_or_else(code::unique_id),
        };
        let args = match call.args {
            Value::Null => Value::Object(Default::default()),
            args => args,
        };
        let now = self.now();
        let mut request = NewRequest {
            id: request_id.clone(),
            tool_id: call.tool_id,
            function_name: call.function_name,
            args,
            created_at: now,
            deadline: now.plus(self.inner.config.request_timeout),
            builtin: false,
            correlation_id: call.correlation_id,
        };
        let asked_tool = request.tool_id.clone();
        let mut known = self.inner.manifests.latest(&code);
        let limit = self.inner.config.max_pending_per_session;
        let until = now.plus(self.inner.config.session_ttl);
        // A manifest changed between the check and the queueing is rare; twice in a row rarer.
        for _ in 0..3 {
            let cached = known.is_some();
            let (revision, manifest) = match known.take() {
                Some(known) => known,
                None => {
                    let (_, session) = self.live_session(code.as_str()).await?;
                    let revision = session.manifest_revision;
                    (revision, self.manifest_of(&code, revision).await?)
                }
            };
            let (group, builtin) = match self
                .check_call(&code, &manifest, asked_tool.as_deref(), &request)
                .await
            {
                Ok(checked) => checked,
                // Refused by the manifest this replica compiled earlier: the tab may have
                // registered new tools since (through another replica), so the refusal
                // stands only against the session's manifest as it is now.
                Err(_) if cached && self.manifest_moved(&code, revision).await? => continue,
                // A call asked again while its tab is away (its tools not registered again
                // yet) or after the tools changed is still the call it was.
                Err(error) if given_id => {
                    return match self.earlier_call(&code, &request, now).await? {
                        Some(earlier) => Ok(earlier),
                        None => Err(error),
                    };
                }
                Err(error) => return Err(error),
            };
            // The provider dispatches on (tool, function): name the tool even when the caller
            // did not, so a call with and without `toolId` is the same call.
            request.tool_id = Some(group);
            request.builtin = builtin;
            if builtin {
                self.check_builtin_ready(&code, &request, given_id).await?;
            }
            let checks = EnqueueChecks {
                manifest_revision: Some(revision),
                charge: charge.take(),
            };
            let (enqueued, session) = self
                .inner
                .store
                .enqueue_checked(&code, &request, limit, until, checks)
                .await?;
            let connected = match &session {
                Some(session) => self.connected_transport(session, now).await.is_some(),
                None => false,
            };
            return match enqueued {
                Enqueued::Queued(mut record) => {
                    tracing::debug!(code = %code.redacted(), request_id = %record.id, function = %record.function_name, "call queued");
                    // Handed to the session's tab in the same step, it is still reported as
                    // queued (SPEC §5): the tab has not seen it yet.
                    if !record.builtin && record.status == RequestStatus::Delivered {
                        record.status = RequestStatus::Queued;
                    }
                    if record.builtin {
                        self.run_builtin(code.clone(), &record);
                    }
                    Ok((record, connected))
                }
                Enqueued::Existing(record) if record.evicted => Err(RelayError::ResponseEvicted {
                    request_id: record.id,
                }),
                Enqueued::Existing(record) => {
                    if record.is_orphaned_builtin(now) {
                        self.run_builtin(code.clone(), &record);
                    }
                    Ok((record, connected))
                }
                Enqueued::StaleManifest => {
                    if let Some(session) = session {
                        let revision = session.manifest_revision;
                        known = Some((revision, self.manifest_of(&code, revision).await?));
                    }
                    continue;
                }
                Enqueued::RateLimited(wait) => Err(self.inner.limits.calls_limited(wait)),
                Enqueued::Conflict => Err(RelayError::RequestIdConflict { request_id }),
                Enqueued::Full => Err(RelayError::QueueFull {
                    code: code.display(),
                    limit,
                    retry_after: Duration::from_secs(5),
                }),
                Enqueued::NoSession => Err(not_found(&code)),
            };
        }
        Err(RelayError::StoreUnavailable(crate::error::StoreError(
            "the session's manifest kept changing while a call was queued".into(),
        )))
    }

    /// Whether the session's manifest is no longer at `revision` (this replica's compiled
    /// one is stale).
    async fn manifest_moved(&self, code: &SessionCode, revision: u64) -> Result<bool, RelayError> {
        let (_, session) = self.live_session(code.as_str()).await?;
        Ok(session.manifest_revision != revision)
    }

    /// The call already recorded under `request`'s id, if it is the same call (the tool it
    /// was queued for standing in for an unnamed one); whether a tab is connected. A different
    /// call under that id is a conflict.
    async fn earlier_call(
        &self,
        code: &SessionCode,
        request: &NewRequest,
        now: Timestamp,
    ) -> Result<Option<(RequestRecord, bool)>, RelayError> {
        let Some(record) = self.inner.store.request(code, &request.id).await? else {
            return Ok(None);
        };
        let tool_id = request.tool_id.as_deref().or(record.tool_id.as_deref());
        if record.call_hash
            != crate::store::call_hash(tool_id, &request.function_name, &request.args)
        {
            return Err(RelayError::RequestIdConflict {
                request_id: record.id,
            });
        }
        if record.evicted {
            return Err(RelayError::ResponseEvicted {
                request_id: record.id,
            });
        }
        let (_, session) = self.live_session(code.as_str()).await?;
        let connected = self.connected_transport(&session, now).await.is_some();
        Ok(Some((record, connected)))
    }

    /// Checks a call against the session's manifest and the built-in tools: the group it
    /// belongs to, and whether it is a built-in tool.
    async fn check_call(
        &self,
        code: &SessionCode,
        manifest: &Manifest,
        tool_id: Option<&str>,
        request: &NewRequest,
    ) -> Result<(String, bool), RelayError> {
        let (name, args) = (&request.function_name, &request.args);
        match manifest.function(tool_id, name) {
            Some(function) => {
                function.check_arguments_async(args).await?;
                Ok((function.group_id().to_owned(), false))
            }
            None if tool_id.is_none_or(|id| id == BUILTIN_GROUP)
                && self.inner.tools.contains(name) =>
            {
                if let Some(problems) = self.inner.tools.violations(name, args) {
                    return Err(RelayError::InvalidArguments {
                        function: name.clone(),
                        problems,
                    });
                }
                Ok((BUILTIN_GROUP.to_owned(), true))
            }
            None => Err(unknown_function(
                code,
                manifest,
                &self.inner.tools,
                name,
                tool_id,
            )),
        }
    }

    /// A new call to a built-in tool that would be refused (a MIP tool while the session runs
    /// a model already) gets 429 now, rather than a queued request that fails with BUSY (a
    /// repeated call returns its own state). A call that only has to wait for its turn is
    /// queued.
    async fn check_builtin_ready(
        &self,
        code: &SessionCode,
        request: &NewRequest,
        given_id: bool,
    ) -> Result<(), RelayError> {
        if given_id && self.inner.store.request(code, &request.id).await?.is_some() {
            return Ok(());
        }
        let context = self.tool_context(Scope::Session(code.clone()));
        match self.inner.tools.ready(&request.function_name, &context) {
            Err(failure) if failure.kind == FailureKind::Busy => {
                if let Some(tool) = crate::builtin::mip::metric_tool(&request.function_name) {
                    self.inner.metrics.mip_refused(tool);
                }
                Err(RelayError::ToolBusy {
                    message: failure.message,
                    retry_after: failure.retry_after.unwrap_or(Duration::from_secs(2)),
                })
            }
            _ => Ok(()),
        }
    }

    /// Waits up to `wait` for a call's final answer; returns its state either way.
    pub async fn await_response(
        &self,
        code: &str,
        request_id: &str,
        wait: Duration,
    ) -> Result<RequestView, RelayError> {
        let code = SessionCode::parse(code)?;
        // Whether the session exists, the first look at the call says.
        let events = self
            .inner
            .store
            .listen_for_answer(&code, request_id)
            .await?;
        self.wait_for_answer(&code, request_id, wait, events, None)
            .await
    }

    /// Waits, on `events` (the call's answer and what ends a wait, listened to before `known`
    /// was read, if it was), up to `wait` for a call's final answer; returns its state either
    /// way.
    async fn wait_for_answer(
        &self,
        code: &SessionCode,
        request_id: &str,
        wait: Duration,
        mut events: EventStream,
        mut known: Option<RequestRecord>,
    ) -> Result<RequestView, RelayError> {
        let wait_until = self.now().plus(wait);
        // A waiting caller holds a stopping relay open until its answer comes or the drain
        // ends; then it is told to ask again.
        let _hold = self.inner.drain.hold();
        let mut drained = std::pin::pin!(self.inner.drain.ended());
        loop {
            let record = match known.take() {
                Some(record) => record,
                None => self.request_record(code, request_id).await?,
            };
            let now = self.now();
            if record.status.is_terminal() || now >= wait_until {
                return self.view(code, record).await;
            }
            if record.is_orphaned_builtin(now) {
                self.run_builtin(code.clone(), &record);
            }
            // A built-in call is looked at again when its lease would run out: if its replica
            // is gone by then, this one takes it over.
            let lease = record
                .lease_until
                .filter(|_| record.builtin)
                .map_or(record.deadline, |lease| {
                    lease.max(now.plus(BUILTIN_LEASE / 10))
                });
            let wake = self
                .inner
                .clock
                .instant(wait_until.min(record.deadline).min(lease));
            // Any event is this call's (its answer; lost events: look again), or the end.
            tokio::select! {
                event = events.next() => match event {
                    Some(SessionEvent::ResponseReady { id, record }) if id == request_id => {
                        known = record.map(|record| *record);
                    }
                    Some(SessionEvent::SessionEnded) | None => return Err(not_found(code)),
                    Some(_) => {}
                },
                () = tokio::time::sleep_until(wake) => {}
                () = &mut drained => {
                    return Err(RelayError::Drained {
                        code: code.display(),
                        request_id: request_id.to_owned(),
                    });
                }
            }
        }
    }

    /// Queues a call and waits up to `wait` (the configured default when `None`) for its
    /// answer.
    pub async fn call(
        &self,
        code: &str,
        call: CallInput,
        wait: Option<Duration>,
    ) -> Result<RequestView, RelayError> {
        self.call_charged(code, call, wait, None).await
    }

    /// [`Relay::call`], spending `charge` (the caller's budget) as the call is queued.
    pub async fn call_charged(
        &self,
        code: &str,
        call: CallInput,
        wait: Option<Duration>,
        charge: Option<RateCharge>,
    ) -> Result<RequestView, RelayError> {
        let parsed = SessionCode::parse(code)?;
        // Listening for the answer before the call is queued, so it cannot slip past: the
        // wait starts from the record the queueing returned, without reading it again.
        // Whether the session exists, the queueing says.
        let request_id = call.request_id.clone().unwrap_or_else(code::unique_id);
        let events = self
            .inner
            .store
            .listen_for_answer(&parsed, &request_id)
            .await?;
        let (record, connected) = self.queue(code, call, charge, Some(request_id)).await?;
        // With no tab to run it, the call stays queued, and the caller learns so at once
        // rather than after a wait that cannot end well.
        if record.status.is_terminal() || !(connected || record.builtin) {
            return Ok(RequestView::of(record, connected));
        }
        let wait = wait.unwrap_or(self.inner.config.default_call_wait);
        let request_id = record.id.clone();
        self.wait_for_answer(&parsed, &request_id, wait, events, Some(record))
            .await
    }

    /// Final answers of the session's calls, oldest first (or only `request_id`'s). Reading
    /// does not consume them.
    pub async fn responses(
        &self,
        code: &str,
        request_id: Option<&str>,
    ) -> Result<Vec<ToolResponse>, RelayError> {
        let (code, _) = self.live_session(code).await?;
        let responses = match request_id {
            Some(id) => match self.inner.store.request(&code, id).await? {
                Some(record) if record.evicted => {
                    return Err(RelayError::ResponseEvicted {
                        request_id: record.id,
                    });
                }
                record => record
                    .and_then(|record| record.response)
                    .into_iter()
                    .collect(),
            },
            None => self.inner.store.responses(&code).await?.unwrap_or_default(),
        };
        Ok(responses)
    }

    /// Where one call stands.
    pub async fn request_status(
        &self,
        code: &str,
        request_id: &str,
    ) -> Result<RequestView, RelayError> {
        let code = SessionCode::parse(code)?;
        let record = self.request_record(&code, request_id).await?;
        // A caller polling a built-in call whose replica died is what takes it over here.
        if record.is_orphaned_builtin(self.now()) {
            self.run_builtin(code.clone(), &record);
        }
        self.view(&code, record).await
    }

    /// A provider's answer to a call, over any transport. Needs the provider token.
    pub async fn post_response(
        &self,
        code: &str,
        token: Option<&str>,
        response: ProviderResponse,
    ) -> Result<ResponseOutcome, RelayError> {
        let (code, session) = self.authorized(code, token).await?;
        // Answers posted over HTTP come from the session's SSE or polling provider, and are
        // accepted for the calls delivered to it.
        let by = session.provider.map_or(AnsweredBy::Nobody, |provider| {
            AnsweredBy::Provider(provider.transport)
        });
        self.accept_response(&code, response, by, Answerer::Provider)
            .await
    }

    /// Records a provider's (or a built-in tool's, `by`) answer to a call; the first wins.
    /// The store takes it only from an `answerer` that may answer the call (see
    /// [`Answerer::may_answer`]): a tab never answers a built-in call, nor one it did not get.
    pub(crate) async fn accept_response(
        &self,
        code: &SessionCode,
        response: ProviderResponse,
        by: AnsweredBy,
        answerer: Answerer<'_>,
    ) -> Result<ResponseOutcome, RelayError> {
        let (response, refused) = contain_response(response, self.answer_limits());
        let (status, response) = normalise_response(response)?;
        let request_id = response.request_id.clone();
        let now = self.now();
        let until = now.plus(self.inner.config.session_ttl);
        let finished = self
            .inner
            .store
            .finish(code, &request_id, status, response, answerer, now, until)
            .await?;
        let outcome = match finished {
            Finished::Finished(record) => {
                self.inner.metrics.call_finished(record.status, by);
                // Which tool, how it ended, how long it took: never its arguments or result.
                tracing::info!(
                    code = %code.redacted(),
                    request_id = %record.id,
                    call_correlation_id = record.correlation_id.as_deref().unwrap_or(""),
                    function = %record.function_name,
                    status = record.status.as_str(),
                    duration_ms = millis(self.now().since(record.created_at)),
                    "call finished"
                );
                ResponseOutcome {
                    request_id,
                    status: record.status,
                    accepted: true,
                }
            }
            Finished::AlreadyFinished(record) => ResponseOutcome {
                request_id,
                status: record.status,
                accepted: false,
            },
            Finished::NoRequest => {
                return Err(RelayError::RequestNotFound {
                    code: code.display(),
                    request_id,
                });
            }
            Finished::NotDelivered => {
                return Err(RelayError::NotDelivered {
                    code: code.display(),
                    request_id,
                });
            }
            Finished::NoSession => return Err(not_found(code)),
        };
        // The caller has its (failed) answer; the provider learns why its own was refused.
        match refused {
            Some(error) if outcome.accepted => Err(error),
            _ => Ok(outcome),
        }
    }

    /// Runs a built-in tool called through a session, in the background, and records its
    /// answer like a tab's — if this run gets the call's lease (see [`BUILTIN_LEASE`]): the
    /// call was just queued here, or the replica that ran it is gone. The lease is renewed
    /// while the tool runs; a run that loses it (another replica took the call over) stops.
    fn run_builtin(&self, code: SessionCode, record: &RequestRecord) {
        let relay = self.clone();
        let (id, name, args) = (
            record.id.clone(),
            record.function_name.clone(),
            record.args.clone(),
        );
        tokio::spawn(async move {
            let holder = format!("{}/{}", relay.inner.replica, code::random_id());
            let lease = || {
                let now = relay.now();
                relay
                    .inner
                    .store
                    .lease_builtin(&code, &id, &holder, now, now.plus(BUILTIN_LEASE))
            };
            match lease().await {
                Ok(Some(record)) if record.deliveries > 1 => {
                    tracing::info!(code = %code.redacted(), request_id = %id, function = %name, "took over a built-in call whose replica is gone");
                }
                Ok(Some(_)) => {}
                Ok(None) => return,
                Err(error) => {
                    tracing::warn!(code = %code.redacted(), %error, "a built-in call could not be leased; another replica will take it over");
                    return;
                }
            }
            let context = relay.tool_context(Scope::Session(code.clone()));
            let mut run = std::pin::pin!(relay.inner.tools.call(&name, args, &context));
            let mut renew = tokio::time::interval(BUILTIN_LEASE / 3);
            renew.reset();
            let outcome = loop {
                tokio::select! {
                    outcome = &mut run => break outcome,
                    _ = renew.tick() => match lease().await {
                        Ok(Some(_)) => {}
                        Ok(None) => return,
                        // Redis is away: keep running; the answer is recorded if it is back
                        // in time, and the lease may be taken over meanwhile.
                        Err(error) => tracing::warn!(code = %code.redacted(), %error, "a built-in call's lease was not renewed"),
                    },
                }
            };
            let response = match outcome {
                Ok(result) => ProviderResponse {
                    request_id: id,
                    success: Some(true),
                    result: Some(result),
                    error: None,
                },
                Err(failure) => ProviderResponse {
                    request_id: id,
                    success: Some(false),
                    result: None,
                    error: Some(
                        serde_json::json!({"code": failure.code, "message": failure.message}),
                    ),
                },
            };
            if let Err(error) = relay
                .accept_response(&code, response, AnsweredBy::Builtin, Answerer::Relay)
                .await
            {
                tracing::warn!(code = %code.redacted(), %error, "a built-in tool's answer was not recorded");
            }
        });
    }

    /// The limits a provider's answer must respect.
    pub fn answer_limits(&self) -> AnswerLimits {
        AnswerLimits {
            max_depth: self.inner.config.max_json_depth,
            max_bytes: self.inner.config.max_response_bytes,
        }
    }

    // ---- helpers shared with the provider side ----

    pub(crate) fn now(&self) -> Timestamp {
        self.inner.clock.now()
    }

    pub(crate) async fn live_session(
        &self,
        code: &str,
    ) -> Result<(SessionCode, SessionRecord), RelayError> {
        let code = SessionCode::parse(code)?;
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

    /// The compiled manifest of `code` at `revision`: this replica's, or compiled from the
    /// store's JSON (registered through another replica, or forgotten here).
    async fn manifest_of(
        &self,
        code: &SessionCode,
        revision: u64,
    ) -> Result<Arc<Manifest>, RelayError> {
        if let Some(manifest) = self.inner.manifests.get(code, revision) {
            return Ok(manifest);
        }
        let (revision, json) = self
            .inner
            .store
            .manifest(code)
            .await?
            .ok_or_else(|| not_found(code))?;
        let manifest = match json {
            Some(json) => self.inner.manifests.shared(&json, || {
                Manifest::from_json(&json, self.manifest_limits()).map_err(|error| {
                    RelayError::StoreUnavailable(crate::error::StoreError(format!(
                        "a stored manifest cannot be read: {error}"
                    )))
                })
            })?,
            None => Arc::new(Manifest::default()),
        };
        self.inner
            .manifests
            .put(code, revision, Arc::clone(&manifest));
        Ok(manifest)
    }

    fn manifest_limits(&self) -> ManifestLimits {
        ManifestLimits {
            max_bytes: self.inner.config.max_manifest_bytes,
            max_functions: self.inner.config.max_functions,
            max_depth: self.inner.config.max_json_depth,
        }
    }

    async fn request_record(
        &self,
        code: &SessionCode,
        request_id: &str,
    ) -> Result<RequestRecord, RelayError> {
        match self.inner.store.request(code, request_id).await? {
            Some(record) => Ok(record),
            None if self.inner.store.session(code).await?.is_none() => Err(not_found(code)),
            None => Err(RelayError::RequestNotFound {
                code: code.display(),
                request_id: request_id.to_owned(),
            }),
        }
    }
}

/// Limits on a provider's answer, checked where it enters the system.
#[derive(Debug, Clone, Copy)]
pub struct AnswerLimits {
    /// Deepest JSON nesting of its result or error.
    pub max_depth: usize,
    /// Largest answer, in bytes of JSON.
    pub max_bytes: usize,
}

impl AnswerLimits {
    /// Only the nesting, for a front end in front of the relay: the JSON must be able to
    /// cross gRPC; the relay checks the size itself.
    pub fn depth_only(max_depth: usize) -> Self {
        Self {
            max_depth,
            max_bytes: usize::MAX,
        }
    }
}

/// A provider's answer within `limits`, or — when it is too deep or too large to keep — a
/// failed answer saying so, with the error for the provider. Either way the caller gets an
/// answer: a refused answer must not leave the call to be delivered again and again.
pub fn contain_response(
    response: ProviderResponse,
    limits: AnswerLimits,
) -> (ProviderResponse, Option<RelayError>) {
    let depth = [&response.result, &response.error]
        .into_iter()
        .flatten()
        .map(toolrelay::json::depth)
        .max()
        .unwrap_or(0);
    if depth > limits.max_depth {
        let (failed, refusal) = too_deep_response(response.request_id, limits.max_depth);
        return (failed, Some(refusal));
    }
    let size = serde_json::to_vec(&response).map_or(usize::MAX, |bytes| bytes.len());
    if size <= limits.max_bytes {
        return (response, None);
    }
    let refusal = RelayError::ResponseTooLarge {
        size,
        limit: limits.max_bytes,
    };
    let message = format!(
        "The tool's answer was over {} bytes and could not be kept. Ask for less data (fewer items, fewer attributes) and call again.",
        limits.max_bytes
    );
    (
        failed_response(response.request_id, &refusal, message),
        Some(refusal),
    )
}

/// The failed answer the caller gets for a provider's answer to `request_id` nested more than
/// `limit` levels deep (one too deep for the JSON parser to read at all, too), with the error
/// for the provider.
pub fn too_deep_response(request_id: String, limit: usize) -> (ProviderResponse, RelayError) {
    let refusal = RelayError::NestedTooDeeply {
        what: "The tool's answer is",
        limit,
    };
    let message = format!(
        "The tool's answer was nested more than {limit} levels deep and could not be kept. Ask for the data in a flatter shape, or for less of it."
    );
    (failed_response(request_id, &refusal, message), refusal)
}

fn failed_response(request_id: String, refusal: &RelayError, message: String) -> ProviderResponse {
    ProviderResponse {
        request_id,
        success: Some(false),
        result: None,
        error: Some(serde_json::json!({"code": refusal.name(), "message": message})),
    }
}

/// Whole milliseconds, as logs show them.
pub fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// Request ids chosen by callers: 1 to 128 of `[A-Za-z0-9._:-]`.
fn is_valid_request_id(id: &str) -> bool {
    (1..=128).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'-'))
}

/// A provider's response in the one shape the relay keeps: `success` defaults to "no error
/// given"; an error may be a string, an object with `message` (and `code`), or anything else.
fn normalise_response(
    response: ProviderResponse,
) -> Result<(RequestStatus, ToolResponse), RelayError> {
    if !is_valid_request_id(&response.request_id) {
        return Err(RelayError::InvalidResponse {
            reason: "requestId is missing or malformed; echo the requestId of the tool-request"
                .into(),
        });
    }
    let success = response.success.unwrap_or(response.error.is_none());
    let error = if success {
        None
    } else {
        Some(match response.error {
            None | Some(Value::Null) => ToolError {
                code: "tool_error".into(),
                message: "The tool reported a failure without a message.".into(),
            },
            Some(Value::String(message)) => ToolError {
                code: "tool_error".into(),
                message,
            },
            Some(Value::Object(object)) => ToolError {
                code: object
                    .get("code")
                    .and_then(Value::as_str)
                    .unwrap_or("tool_error")
                    .to_owned(),
                message: object
                    .get("message")
                    .and_then(Value::as_str)
                    .map_or_else(|| Value::Object(object.clone()).to_string(), str::to_owned),
            },
            Some(other) => ToolError {
                code: "tool_error".into(),
                message: other.to_string(),
            },
        })
    };
    let status = if success {
        RequestStatus::Completed
    } else {
        RequestStatus::Failed
    };
    let result = match (success, response.result) {
        (true, None) => Some(Value::Null),
        (_, result) => result,
    };
    Ok((
        status,
        ToolResponse {
            request_id: response.request_id,
            success,
            result,
            error,
        },
    ))
}

pub(crate) fn not_found(code: &SessionCode) -> RelayError {
    RelayError::SessionNotFound {
        code: code.display(),
    }
}

fn unknown_function(
    code: &SessionCode,
    manifest: &Manifest,
    tools: &Registry,
    name: &str,
    tool_id: Option<&str>,
) -> RelayError {
    let mut names: Vec<&str> = manifest
        .functions()
        .iter()
        .map(|f| f.name.as_str())
        .collect();
    let tab_has_tools = !names.is_empty();
    names.extend(tools.names());
    let mut available = names.join(", ");
    if !tab_has_tools {
        available.push_str(" (the tab has not registered its tools yet; is it open?)");
    }
    RelayError::UnknownFunction {
        code: code.display(),
        name: name.to_owned(),
        in_tool: tool_id
            .map(|id| format!(" in tool {id}"))
            .unwrap_or_default(),
        available,
    }
}
