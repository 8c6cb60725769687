//! Where sessions, manifests and calls live: the [`Store`] trait and its records.
//!
//! The trait is shaped for a shared store such as Redis as much as for memory:
//! * every session has a TTL the store enforces (`expires_at`; a lookup never returns an
//!   expired session), capped by a maximum lifetime; every call has a deadline the store
//!   enforces the same way (a call past its deadline without an answer is `expired`, with
//!   [`RequestRecord::expired_response`], whenever the store next looks at the session);
//! * every state change that must not race is one operation: enqueue (idempotency check,
//!   pending limit and insert), claim (hand out requests to exactly one provider connection),
//!   finish (first answer wins);
//! * changes are announced on a per-session event stream ([`SessionEvent`]): a new request for
//!   the provider, a response for waiters, a provider replaced, the session ended. Events are
//!   hints: after one (or after [`SessionEvent::Missed`]) readers look at the state again.
//!
//! [`memory::MemoryStore`] is the default implementation.

mod events;
pub mod memory;
pub mod observed;
pub mod redis;

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures::{Stream, StreamExt};
use serde_json::Value;
use toolrelay::wire::{RequestStatus, ToolError, ToolRequest, ToolResponse};

use crate::clock::Timestamp;
use crate::code::SessionCode;
use crate::error::StoreError;

/// A stored session.
#[derive(Debug, Clone, PartialEq)]
pub struct SessionRecord {
    /// Its pairing code.
    pub code: SessionCode,
    /// SHA-256 of the provider token, hex.
    pub token_hash: String,
    /// When it was created.
    pub created_at: Timestamp,
    /// When it expires unless there is activity.
    pub expires_at: Timestamp,
    /// When it expires however active it is.
    pub max_expires_at: Timestamp,
    /// The provider connection that currently serves it.
    pub provider: Option<ProviderInfo>,
    /// Increases with every manifest registration.
    pub manifest_revision: u64,
    /// The secret in the session's MCP connector URL (`/mcp/s/{handle}`).
    pub mcp_handle: String,
}

/// How a provider is attached.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Transport {
    /// The browser WebSocket.
    WebSocket,
    /// Server-sent events with responses by POST.
    Sse,
    /// HTTP polling.
    Polling,
    /// A gRPC `Connect` stream.
    Grpc,
}

impl Transport {
    /// The lowercase name used on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::WebSocket => "websocket",
            Self::Sse => "sse",
            Self::Polling => "polling",
            Self::Grpc => "grpc",
        }
    }

    /// Parses a wire name.
    pub fn parse(name: &str) -> Option<Self> {
        [Self::WebSocket, Self::Sse, Self::Polling, Self::Grpc]
            .into_iter()
            .find(|transport| transport.as_str() == name)
    }
}

/// The provider connection serving a session.
#[derive(Debug, Clone, PartialEq)]
pub struct ProviderInfo {
    /// Random id of the connection; requests delivered to it carry it.
    pub connection_id: String,
    /// How it is attached.
    pub transport: Transport,
    /// When it attached.
    pub connected_at: Timestamp,
    /// When it was last heard from (or a heartbeat reached it).
    pub last_seen: Timestamp,
}

/// A call to queue.
#[derive(Debug, Clone, PartialEq)]
pub struct NewRequest {
    /// Its id, unique in the session.
    pub id: String,
    /// The group named by the caller.
    pub tool_id: Option<String>,
    /// The function to run.
    pub function_name: String,
    /// Validated arguments.
    pub args: Value,
    /// When it was made.
    pub created_at: Timestamp,
    /// When it expires unanswered.
    pub deadline: Timestamp,
    /// Whether a tool built into the relay answers it (never handed to a provider).
    pub builtin: bool,
    /// The correlation id of the request that made it, for the log line of its end.
    pub correlation_id: Option<String>,
}

/// The connection id under which built-in calls count as delivered.
pub const BUILTIN_CONNECTION: &str = "relay";
/// How long a replica holds a built-in call it runs without renewing the lease (it renews a
/// third of the way through). A call queued and not yet taken by a run is held by
/// [`BUILTIN_CONNECTION`] for as long; a call whose lease ran out is taken over by another
/// replica. The Redis scripts spell it in milliseconds too (`redis.rs`, ENQUEUE).
pub const BUILTIN_LEASE: Duration = Duration::from_secs(10);

/// A stored call.
#[derive(Debug, Clone, PartialEq)]
pub struct RequestRecord {
    /// Its id.
    pub id: String,
    /// Position in the session's queue.
    pub seq: u64,
    /// The group named by the caller.
    pub tool_id: Option<String>,
    /// The function to run.
    pub function_name: String,
    /// The arguments.
    pub args: Value,
    /// Where it stands.
    pub status: RequestStatus,
    /// When it was made.
    pub created_at: Timestamp,
    /// When it expires unanswered.
    pub deadline: Timestamp,
    /// The connection it was last handed to.
    pub delivered_to: Option<String>,
    /// Until when that connection holds it.
    pub lease_until: Option<Timestamp>,
    /// How often it was handed out.
    pub deliveries: u32,
    /// The final answer.
    pub response: Option<ToolResponse>,
    /// When it got its final answer.
    pub finished_at: Option<Timestamp>,
    /// Whether a tool built into the relay answers it (never handed to a provider).
    pub builtin: bool,
    /// The correlation id of the request that made it.
    pub correlation_id: Option<String>,
    /// SHA-256 of the call (tool, function, arguments with their keys in order), so that a
    /// repeated request id can be checked after the arguments are gone.
    pub call_hash: String,
    /// Whether its answer was dropped to keep the store within its byte budget: the call ran,
    /// and its status stays, but the answer cannot be read any more.
    pub evicted: bool,
}

/// SHA-256 (hex) of a call: its tool, function and arguments, with object keys sorted, so that
/// the same call hashes the same whatever order its fields came in.
pub fn call_hash(tool_id: Option<&str>, function_name: &str, args: &Value) -> String {
    use sha2::{Digest, Sha256};
    /// Bytes written into the hash.
    struct Fed<'a>(&'a mut Sha256);
    impl std::io::Write for Fed<'_> {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.update(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    /// A scalar (or a key) as JSON, written straight into the hash (no copy of it made).
    fn scalar(hasher: &mut Sha256, value: &impl serde::Serialize) {
        // Writing into a hash cannot fail, and these serialise infallibly.
        let _ = serde_json::to_writer(Fed(hasher), value);
    }
    fn feed(hasher: &mut Sha256, value: &Value) {
        match value {
            Value::Object(map) => {
                let mut entries: Vec<(&String, &Value)> = map.iter().collect();
                entries.sort_unstable_by_key(|(key, _)| *key);
                hasher.update(b"{");
                for (key, value) in entries {
                    scalar(hasher, key);
                    hasher.update(b":");
                    feed(hasher, value);
                    hasher.update(b",");
                }
                hasher.update(b"}");
            }
            Value::Array(items) => {
                hasher.update(b"[");
                for item in items {
                    feed(hasher, item);
                    hasher.update(b",");
                }
                hasher.update(b"]");
            }
            other => scalar(hasher, other),
        }
    }
    let mut hasher = Sha256::new();
    scalar(&mut hasher, &tool_id.unwrap_or_default());
    scalar(&mut hasher, &function_name);
    feed(&mut hasher, args);
    data_encoding::HEXLOWER.encode(&hasher.finalize())
}

impl RequestRecord {
    /// A record for a newly queued call.
    /// A built-in call starts out delivered to the relay itself.
    pub fn queued(request: NewRequest, seq: u64) -> Self {
        let builtin = request.builtin;
        let call_hash = call_hash(
            request.tool_id.as_deref(),
            &request.function_name,
            &request.args,
        );
        Self {
            call_hash,
            evicted: false,
            id: request.id,
            seq,
            tool_id: request.tool_id,
            function_name: request.function_name,
            args: request.args,
            status: if builtin {
                RequestStatus::Delivered
            } else {
                RequestStatus::Queued
            },
            created_at: request.created_at,
            deadline: request.deadline,
            delivered_to: builtin.then(|| BUILTIN_CONNECTION.to_owned()),
            lease_until: builtin
                .then(|| request.created_at.plus(BUILTIN_LEASE).min(request.deadline)),
            deliveries: u32::from(builtin),
            response: None,
            finished_at: None,
            builtin,
            correlation_id: request.correlation_id,
        }
    }

    /// Whether `request` asks for exactly this call (same function, tool and arguments).
    pub fn same_call(&self, request: &NewRequest) -> bool {
        self.call_hash
            == call_hash(
                request.tool_id.as_deref(),
                &request.function_name,
                &request.args,
            )
    }

    /// Whether this is a built-in call nobody runs: its lease ran out (the replica that ran
    /// it, or queued it, is gone).
    pub fn is_orphaned_builtin(&self, now: Timestamp) -> bool {
        self.builtin
            && !self.status.is_terminal()
            && self.deadline > now
            && self.lease_until.is_some_and(|lease| lease <= now)
    }

    /// Whether `claim` may hand this call out: queued, or delivered to another connection, or
    /// delivered under a lease that has run out, or (when `claim.redeliver`) delivered to the
    /// claiming connection itself; never after its deadline.
    pub fn is_claimable(&self, claim: &Claim) -> bool {
        if self.builtin || self.deadline <= claim.now {
            return false;
        }
        match self.status {
            RequestStatus::Queued => true,
            RequestStatus::Delivered => {
                claim.redeliver
                    || self.delivered_to.as_deref() != Some(claim.connection_id.as_str())
                    || self.lease_until.is_none_or(|lease| lease <= claim.now)
            }
            _ => false,
        }
    }

    /// The answer a call gets when its deadline passes unanswered.
    pub fn expired_response(&self) -> ToolResponse {
        let waited = self.deadline.since(self.created_at).as_secs();
        let message = if self.builtin {
            format!(
                "The relay's built-in tool {} did not finish within {waited} s. Call again with a new requestId; if it keeps happening, ask for less work (a smaller model, a shorter time limit).",
                self.function_name
            )
        } else {
            format!(
                "The tool did not answer within {waited} s. Check that the page serving it (the CODAP plugin, say) is open and connected (its status dot is green), then call again with a new requestId."
            )
        };
        ToolResponse {
            request_id: self.id.clone(),
            success: false,
            result: None,
            error: Some(ToolError {
                code: "request_expired".into(),
                message,
            }),
        }
    }

    /// Makes an unanswered call past its deadline `expired`; true when it did.
    pub fn expire_if_overdue(&mut self, now: Timestamp) -> bool {
        if self.status.is_terminal() || self.deadline > now {
            return false;
        }
        self.response = Some(self.expired_response());
        self.status = RequestStatus::Expired;
        self.finished_at = Some(now);
        self.lease_until = None;
        true
    }

    /// The call as the provider receives it.
    pub fn tool_request(&self) -> ToolRequest {
        ToolRequest {
            request_id: self.id.clone(),
            tool_id: self.tool_id.clone(),
            function_name: self.function_name.clone(),
            args: self.args.clone(),
        }
    }
}

/// What the store holds now, counted across every replica: the bytes its budgets bound, and
/// the sessions and calls the metrics report.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StoreUsage {
    /// Finished calls' answers.
    pub answer_bytes: usize,
    /// Claim checks.
    pub ticket_bytes: usize,
    /// Sessions alive.
    pub sessions: usize,
    /// Calls waiting for their answer (not finished, deadline not passed).
    pub unanswered: usize,
}

/// What [`Store::enqueue`] did.
#[derive(Debug, Clone, PartialEq)]
pub enum Enqueued {
    /// The call is queued.
    Queued(RequestRecord),
    /// A call with this id and the same body exists; nothing changed.
    Existing(RequestRecord),
    /// A call with this id and another body exists; nothing changed.
    Conflict,
    /// The session holds `max_pending` unanswered calls; nothing changed.
    Full,
    /// The session does not exist (or expired).
    NoSession,
    /// The session's manifest is no longer at the revision the call was checked against
    /// ([`EnqueueChecks::manifest_revision`]); nothing changed.
    StaleManifest,
    /// The caller's budget ([`EnqueueChecks::charge`]) is spent: try again after this long;
    /// nothing changed.
    RateLimited(Duration),
}

/// What [`Store::enqueue_checked`] checks in the same step as queueing a call, so that a
/// call's way in is one round trip.
#[derive(Debug, Clone, Default)]
pub struct EnqueueChecks {
    /// Queue only if the session's manifest is at this revision: the one the call's
    /// arguments were checked against.
    pub manifest_revision: Option<u64>,
    /// Spend a unit of this budget first (as [`Store::spend`] does); when it is spent,
    /// nothing is queued.
    pub charge: Option<RateCharge>,
}

/// A unit of a rate budget to spend.
#[derive(Debug, Clone)]
pub struct RateCharge {
    /// The budget's key, as for [`Store::spend`]. In Redis it should carry the session's
    /// hash tag (`{CODE}`), so that a Redis Cluster keeps it in the session's slot.
    pub key: String,
    /// The budget.
    pub budget: RateBudget,
}

/// A provider connection asking for calls.
#[derive(Debug, Clone, PartialEq)]
pub struct Claim {
    /// The connection; it must be the session's current provider.
    pub connection_id: String,
    /// The current time.
    pub now: Timestamp,
    /// Until when the connection holds what it claims.
    pub lease_until: Timestamp,
    /// Most calls to hand out.
    pub limit: usize,
    /// Also hand out again the calls already delivered to this connection and not answered
    /// (before their deadline): what a driver asks for after lost events or a store error,
    /// when a claim whose reply it never got may have run.
    pub redeliver: bool,
}

/// Who gives a call its answer: what [`Store::finish`] checks in the same step as it records
/// the answer, so that a provider answers only the calls handed to it, on every replica.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answerer<'a> {
    /// The relay itself (a built-in tool's run): any call.
    Relay,
    /// The provider connection with this id (a WebSocket or a gRPC `Connect` stream): a call
    /// that is not built-in and was delivered to it.
    Connection(&'a str),
    /// The session's provider as it is now, whichever connection that is (an answer posted by
    /// the holder of the provider token, for calls it received by SSE or polling): a call
    /// that is not built-in and was delivered to that connection.
    Provider,
}

impl Answerer<'_> {
    /// Whether it may answer `request` of a session whose provider is the connection
    /// `provider`.
    pub fn may_answer(self, request: &RequestRecord, provider: Option<&str>) -> bool {
        let connection = match self {
            Self::Relay => return true,
            Self::Connection(connection) => Some(connection),
            Self::Provider => provider,
        };
        !request.builtin && connection.is_some() && request.delivered_to.as_deref() == connection
    }
}

/// What [`Store::finish`] did.
#[derive(Debug, Clone, PartialEq)]
pub enum Finished {
    /// The call now has this final answer.
    Finished(RequestRecord),
    /// The call had its final answer already; nothing changed.
    AlreadyFinished(RequestRecord),
    /// The session has no such call.
    NoRequest,
    /// The answerer may not answer this call ([`Answerer::may_answer`]): it is built-in, or
    /// was not delivered to that connection; nothing changed.
    NotDelivered,
    /// The session does not exist (or expired).
    NoSession,
}

/// A change in a session, announced to its subscribers.
#[derive(Debug, Clone, PartialEq)]
pub enum SessionEvent {
    /// A call was queued.
    RequestQueued,
    /// A call has its final answer.
    ResponseReady {
        /// The call's id.
        id: String,
        /// The finished call, when the store could send it along (the Redis store does for
        /// answers up to [`crate::store::redis::ANNOUNCED_ANSWER_BYTES`]), so that a waiter
        /// need not read it.
        record: Option<Box<RequestRecord>>,
    },
    /// The connection with this id is now the provider.
    ProviderChanged(String),
    /// A new manifest was registered.
    ManifestChanged,
    /// The session was deleted or expired; no more events follow.
    SessionEnded,
    /// Events were lost (a slow subscriber): look at the state again.
    Missed,
}

/// A session's events; the stream ends when the session does.
pub type EventStream = Pin<Box<dyn Stream<Item = SessionEvent> + Send>>;

/// Storage of sessions, manifests and calls. Operations on a session that does not exist (or
/// has expired) return `None`, `false` or a `No…` variant, never an error: errors mean the
/// store itself failed.
#[async_trait]
pub trait Store: Send + Sync + 'static {
    /// Inserts a new session with an empty manifest; false when the code is taken.
    async fn insert_session(&self, session: SessionRecord) -> Result<bool, StoreError>;

    /// The live session.
    async fn session(&self, code: &SessionCode) -> Result<Option<SessionRecord>, StoreError>;

    /// The code of the live session whose MCP handle this is.
    async fn session_by_handle(&self, handle: &str) -> Result<Option<SessionCode>, StoreError>;

    /// Slides the expiry to `until` (never backwards, never past the maximum lifetime). With
    /// `seen`, only if that connection is the session's provider, and then it is recorded as
    /// heard from at `now`; a replaced connection keeps nothing alive. Returns the session
    /// either way, so the caller can see who the provider is.
    async fn touch_session(
        &self,
        code: &SessionCode,
        now: Timestamp,
        until: Timestamp,
        seen: Option<&str>,
    ) -> Result<Option<SessionRecord>, StoreError>;

    /// Deletes a session and everything in it; false when there was none.
    async fn delete_session(&self, code: &SessionCode) -> Result<bool, StoreError>;

    /// Makes `provider` the session's provider (replacing any other) and announces it.
    async fn set_provider(
        &self,
        code: &SessionCode,
        provider: ProviderInfo,
    ) -> Result<Option<SessionRecord>, StoreError>;

    /// Removes the provider, if it is still the connection `connection_id`.
    async fn clear_provider(
        &self,
        code: &SessionCode,
        connection_id: &str,
    ) -> Result<(), StoreError>;

    /// Replaces the manifest (a validated manifest's JSON, [`Manifest::to_json`]); returns the
    /// new revision, also in [`SessionRecord::manifest_revision`]. A store keeps only the JSON:
    /// compiled validators are each replica's own ([`crate::manifest::ManifestCache`]).
    async fn set_manifest(
        &self,
        code: &SessionCode,
        json: String,
    ) -> Result<Option<u64>, StoreError>;

    /// The session's manifest JSON and its revision (revision 0, `None`: nothing registered).
    async fn manifest(
        &self,
        code: &SessionCode,
    ) -> Result<Option<(u64, Option<String>)>, StoreError>;

    /// Queues a call unless its id is taken or `max_pending` calls are pending at
    /// `request.created_at`, and slides the session's expiry to `until` (capped by its maximum
    /// lifetime) in the same step: a queued call is activity. Announces it.
    async fn enqueue(
        &self,
        code: &SessionCode,
        request: NewRequest,
        max_pending: usize,
        until: Timestamp,
    ) -> Result<Enqueued, StoreError> {
        let checks = EnqueueChecks::default();
        let (enqueued, _) = self
            .enqueue_checked(code, &request, max_pending, until, checks)
            .await?;
        Ok(enqueued)
    }

    /// [`Store::enqueue`], after spending `checks.charge` (at `request.created_at`) and only
    /// if the manifest is at `checks.manifest_revision`; with the session as it is after
    /// (`None` when there is none, or the charge was refused). One round trip: all a call
    /// needs to get in.
    async fn enqueue_checked(
        &self,
        code: &SessionCode,
        request: &NewRequest,
        max_pending: usize,
        until: Timestamp,
        checks: EnqueueChecks,
    ) -> Result<(Enqueued, Option<SessionRecord>), StoreError>;

    /// One call.
    async fn request(
        &self,
        code: &SessionCode,
        id: &str,
    ) -> Result<Option<RequestRecord>, StoreError>;

    /// The final answers kept for the session, in queue order.
    async fn responses(&self, code: &SessionCode) -> Result<Option<Vec<ToolResponse>>, StoreError>;

    /// How many calls wait for an answer.
    async fn pending_count(&self, code: &SessionCode) -> Result<Option<usize>, StoreError>;

    /// Leases the unanswered built-in call `id` to `holder` (one run of it on one replica)
    /// until `until`, if it is free: not yet taken by a run (held by [`BUILTIN_CONNECTION`]),
    /// leased to `holder` already (a renewal), or its lease ran out (its replica is gone).
    /// The call leased; `None` when it is not free.
    async fn lease_builtin(
        &self,
        code: &SessionCode,
        id: &str,
        holder: &str,
        now: Timestamp,
        until: Timestamp,
    ) -> Result<Option<RequestRecord>, StoreError>;

    /// Hands claimable calls (see [`RequestRecord::is_claimable`]), oldest first, to the
    /// connection, if it is the session's provider; marks them delivered to it.
    async fn claim(
        &self,
        code: &SessionCode,
        claim: &Claim,
    ) -> Result<Vec<RequestRecord>, StoreError>;

    /// Gives a call its final answer, unless it has one or `answerer` may not answer it
    /// ([`Finished::NotDelivered`]), and slides the session's expiry to `until` in the same
    /// step (an answer is activity); announces it. A call whose deadline has passed becomes
    /// `expired` instead, and an answer other than that is refused
    /// ([`Finished::AlreadyFinished`]).
    #[allow(clippy::too_many_arguments)] // each is one part of the one atomic step
    async fn finish(
        &self,
        code: &SessionCode,
        id: &str,
        status: RequestStatus,
        response: ToolResponse,
        answerer: Answerer<'_>,
        now: Timestamp,
        until: Timestamp,
    ) -> Result<Finished, StoreError>;

    /// The session's events from now on.
    async fn subscribe(&self, code: &SessionCode) -> Result<Option<EventStream>, StoreError>;

    /// The session's events from now on, without looking the session up (a round trip less
    /// on a call's path): for a session that does not exist the stream may end at once or
    /// stay silent, so the caller must learn whether it exists from its next operation.
    async fn listen(&self, code: &SessionCode) -> Result<EventStream, StoreError> {
        Ok(self
            .subscribe(code)
            .await?
            .unwrap_or_else(|| Box::pin(futures::stream::empty())))
    }

    /// From now on, the answer to the session's call `id` ([`SessionEvent::ResponseReady`]),
    /// the session's end and lost events, and nothing else: a waiting caller is woken by its
    /// own answer, not by every event of its session. Like [`Store::listen`], without looking
    /// the session up.
    async fn listen_for_answer(
        &self,
        code: &SessionCode,
        id: &str,
    ) -> Result<EventStream, StoreError> {
        let id = id.to_owned();
        Ok(Box::pin(self.listen(code).await?.filter(move |event| {
            std::future::ready(match event {
                SessionEvent::ResponseReady { id: answered, .. } => *answered == id,
                SessionEvent::SessionEnded | SessionEvent::Missed => true,
                _ => false,
            })
        })))
    }

    /// Whether the store answers (for readiness checks).
    async fn ping(&self) -> Result<(), StoreError>;

    /// What the kept answers and claim checks cost now (what the byte budgets bound), and how
    /// many sessions and unanswered calls there are. Not for a call's path: it may end
    /// sessions found expired (counting them), and costs a round trip.
    async fn usage(&self) -> Result<StoreUsage, StoreError>;

    /// Keeps a claim-check value under `(scope, id)` until `expires_at`.
    async fn put_ticket(
        &self,
        scope: &str,
        id: &str,
        value: Arc<Value>,
        expires_at: Timestamp,
    ) -> Result<(), StoreError>;

    /// A claim-check value, if it exists in this scope and has not expired.
    async fn ticket(&self, scope: &str, id: &str) -> Result<Option<Arc<Value>>, StoreError>;

    /// Opens a place, named `slot`, for a new MCP client session of the client `address` (its
    /// key: `limits::client_key`) until `expires_at`, unless that client has
    /// `caps.per_address` live sessions already or every client together `caps.total`
    /// (sessions past their expiry do not count). Shared by every gateway using the store.
    async fn open_mcp_session(
        &self,
        slot: &str,
        address: &str,
        caps: McpSessionCaps,
        expires_at: Timestamp,
    ) -> Result<Result<(), McpSessionsFull>, StoreError>;

    /// Keeps an MCP client session's state (opaque text: what a gateway needs to take the
    /// session over) under its id until `expires_at`, in the place [`Store::open_mcp_session`]
    /// opened as `slot` for `address` (from now on the place goes by `id`), so any gateway
    /// sharing the store can serve the session's next request.
    async fn put_mcp_session(
        &self,
        id: &str,
        slot: &str,
        address: &str,
        state: String,
        expires_at: Timestamp,
    ) -> Result<(), StoreError>;

    /// Moves a kept MCP client session's expiry to `expires_at` (it was used): whether it is
    /// kept.
    async fn touch_mcp_session(&self, id: &str, expires_at: Timestamp) -> Result<bool, StoreError>;

    /// An MCP client session's state, if kept and not expired.
    async fn mcp_session(&self, id: &str) -> Result<Option<String>, StoreError>;

    /// Forgets an MCP client session's state and frees its place (the client ended the
    /// session); also frees a place opened as `id` that no session took.
    async fn delete_mcp_session(&self, id: &str) -> Result<(), StoreError>;

    /// Takes the lock `key` for `holder` until `until` (or until it is released), or renews
    /// it when `holder` has it already, unless someone else holds it: whether `holder` has it
    /// now. Shared by every replica, so one
    /// caller's "one at a time" holds across replicas; a holder that dies frees it at `until`.
    async fn lock(&self, key: &str, holder: &str, until: Timestamp) -> Result<bool, StoreError>;

    /// Releases the lock `key` if `holder` has it.
    async fn unlock(&self, key: &str, holder: &str) -> Result<(), StoreError>;

    /// Spends one unit of the rate budget `key` at `now`: `None` when the budget had room, or
    /// how long until it has room again (nothing is spent then). Shared by every replica
    /// using the store, so a client spreading its requests over replicas gets one budget.
    async fn spend(
        &self,
        key: &str,
        budget: RateBudget,
        now: Timestamp,
    ) -> Result<Option<Duration>, StoreError>;
}

/// Caps on the live MCP client sessions, across every gateway sharing the store
/// (`MCP_SESSIONS_PER_IP`, `MCP_MAX_SESSIONS`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct McpSessionCaps {
    /// Live sessions one client address may hold.
    pub per_address: u32,
    /// Live sessions of every client together.
    pub total: u32,
}

/// Which cap refused a new MCP client session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum McpSessionsFull {
    /// The client address holds its share.
    PerAddress,
    /// Every place is taken.
    Total,
}

/// A rate budget: `limit` units per `period`, all of which may be spent at once (a token
/// bucket, kept as GCRA: one "theoretical arrival time" per key, in microseconds).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateBudget {
    /// Units per period.
    pub limit: std::num::NonZeroU32,
    /// The period.
    pub period: Duration,
}

impl RateBudget {
    /// `limit` units a minute.
    pub fn per_minute(limit: std::num::NonZeroU32) -> Self {
        Self {
            limit,
            period: Duration::from_secs(60),
        }
    }

    /// Microseconds between two units.
    pub fn interval_micros(self) -> i64 {
        i64::try_from(self.period.as_micros() / u128::from(self.limit.get()))
            .unwrap_or(i64::MAX)
            .max(1)
    }

    /// How far ahead of now the arrival time may run: the whole burst.
    pub fn tolerance_micros(self) -> i64 {
        self.interval_micros()
            .saturating_mul(i64::from(self.limit.get()))
    }

    /// GCRA: with the key's arrival time `tat` (µs), a unit spent at `now` (µs) gives the new
    /// arrival time, or how long to wait.
    pub fn spend(self, tat: i64, now: i64) -> Result<i64, Duration> {
        let next = tat.max(now).saturating_add(self.interval_micros());
        let over = next - now - self.tolerance_micros();
        if over > 0 {
            Err(Duration::from_micros(u64::try_from(over).unwrap_or(0)))
        } else {
            Ok(next)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The hash is kept in Redis: it must not change between versions (this is what the
    /// first implementation gave), nor with the order of an object's keys.
    #[test]
    fn a_call_hashes_as_it_always_did() {
        let args = serde_json::json!({"b": [1, "x", null, true], "a": {"z": 1.5, "y": "q\"é"}});
        let expected = "271c39a7dec27942beec6dc1106b3674376057f05ecbac47ed74d8d94d5f186a";
        assert_eq!(call_hash(Some("demo"), "echo", &args), expected);
        let reordered: Value =
            serde_json::from_str(r#"{"a": {"y": "q\"é", "z": 1.5}, "b": [1, "x", null, true]}"#)
                .unwrap();
        assert_eq!(call_hash(Some("demo"), "echo", &reordered), expected);
        assert_ne!(call_hash(None, "echo", &args), expected);
    }

    fn call(builtin: bool) -> RequestRecord {
        RequestRecord::queued(
            NewRequest {
                id: "r1".into(),
                tool_id: None,
                function_name: "solve_mip_problem".into(),
                args: Value::Null,
                created_at: Timestamp(0),
                deadline: Timestamp(60_000),
                builtin,
                correlation_id: None,
            },
            1,
        )
    }

    #[test]
    fn an_expired_call_blames_what_did_not_answer() {
        let tab = call(false).expired_response().error.unwrap().message;
        assert!(tab.contains("page serving it"), "{tab}");
        let builtin = call(true).expired_response().error.unwrap().message;
        assert!(
            !builtin.contains("plugin") && builtin.contains("built-in tool solve_mip_problem"),
            "{builtin}"
        );
        assert!(builtin.contains("60 s"), "{builtin}");
    }
}
