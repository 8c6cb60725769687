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

pub mod connecting;
mod events;
pub mod memory;
pub mod observed;
pub mod redis;
pub mod rules;
mod traits;

pub use rules::{BUILTIN_LEASE, RateBudget};
pub use traits::{
    BudgetStore, FrontStore, McpSessionStore, Reachable, SessionStore, Store, TicketStore,
};

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures::Stream;
use serde_json::Value;
use toolrelay::wire::{RequestStatus, ToolError, ToolRequest, ToolRequestFrame, ToolResponse};

use crate::clock::Timestamp;
use crate::code::SessionCode;

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

impl SessionRecord {
    /// The session as a caller of [`SessionStore::enqueue_checked`] reads it after a queued
    /// call: without the token hash, creation time and handle, so nothing is copied for them.
    pub(crate) fn as_enqueued(&self) -> Self {
        Self {
            code: self.code.clone(),
            token_hash: String::new(),
            created_at: Timestamp(0),
            expires_at: self.expires_at,
            max_expires_at: self.max_expires_at,
            provider: self.provider.clone(),
            manifest_revision: self.manifest_revision,
            mcp_handle: String::new(),
        }
    }
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
    /// Who made it (the key its budgets count under: an identity, or an address): only that
    /// caller may cancel it.
    pub caller: Option<String>,
}

/// The connection id under which built-in calls count as delivered.
pub const BUILTIN_CONNECTION: &str = "relay";

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
    /// The call's hash ([`call_hash`], hex), so that a repeated request id can be checked
    /// after the arguments are gone.
    pub call_hash: String,
    /// Whether its answer was dropped to keep the store within its byte budget: the call ran,
    /// and its status stays, but the answer cannot be read any more.
    pub evicted: bool,
    /// Who made it (the key its budgets count under): the call and its answer are that
    /// caller's alone. `None` for a call an older relay packed.
    pub caller: Option<String>,
}

/// A call's hash: the first 128 bits of SHA-256 (32 hex digits) of its tool, function and
/// arguments, with object keys sorted, so that the same call hashes the same whatever order its
/// fields came in. 128 bits keep two calls apart as surely as the whole digest would (the hash
/// is an identity, not a secret), in half the room of a kept call.
pub fn call_hash(tool_id: Option<&str>, function_name: &str, args: &Value) -> String {
    callers_call_hash(tool_id, function_name, args, None)
}

/// [`call_hash`] of a call made by `caller` (the key its budgets count under): a request id is
/// the same call only for the caller that made it, so another caller naming the same id (a
/// guessed `1`) is refused as a conflict and never given the first caller's answer.
pub fn callers_call_hash(
    tool_id: Option<&str>,
    function_name: &str,
    args: &Value,
    caller: Option<&str>,
) -> String {
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
    if let Some(caller) = caller {
        hasher.update(b"\0caller\0");
        hasher.update(caller.as_bytes());
    }
    data_encoding::HEXLOWER.encode(&hasher.finalize()[..CALL_HASH_BYTES])
}

/// The bytes of a call's hash ([`call_hash`]).
pub const CALL_HASH_BYTES: usize = 16;

impl RequestRecord {
    /// The same call without its answer (or arguments): how it stands, cheap to copy.
    pub fn without_answer(&self) -> Self {
        Self {
            id: self.id.clone(),
            seq: self.seq,
            tool_id: self.tool_id.clone(),
            function_name: self.function_name.clone(),
            args: Value::Null,
            status: self.status,
            created_at: self.created_at,
            deadline: self.deadline,
            delivered_to: self.delivered_to.clone(),
            lease_until: self.lease_until,
            deliveries: self.deliveries,
            response: None,
            finished_at: self.finished_at,
            builtin: self.builtin,
            correlation_id: self.correlation_id.clone(),
            call_hash: self.call_hash.clone(),
            evicted: self.evicted,
            caller: self.caller.clone(),
        }
    }

    /// Whether `reader` (a caller's key) may see this call: the caller that made it, anyone
    /// when its caller is unknown, and the relay itself (`None`).
    pub fn made_by(&self, reader: Option<&str>) -> bool {
        match (reader, self.caller.as_deref()) {
            (Some(reader), Some(maker)) => reader == maker,
            _ => true,
        }
    }

    /// A record for a newly queued call.
    /// A built-in call starts out delivered to the relay itself.
    pub fn queued(request: NewRequest, seq: u64) -> Self {
        let builtin = request.builtin;
        let call_hash = callers_call_hash(
            request.tool_id.as_deref(),
            &request.function_name,
            &request.args,
            request.caller.as_deref(),
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
                .then(|| rules::builtin_lease(request.created_at, request.deadline)),
            deliveries: u32::from(builtin),
            response: None,
            finished_at: None,
            builtin,
            correlation_id: request.correlation_id,
            caller: request.caller,
        }
    }

    /// The call [`RequestRecord::queued`] made this record of, given back whole when a store
    /// did not queue it (see [`Enqueued::StaleManifest`]).
    pub fn into_request(self) -> NewRequest {
        NewRequest {
            id: self.id,
            tool_id: self.tool_id,
            function_name: self.function_name,
            args: self.args,
            created_at: self.created_at,
            deadline: self.deadline,
            builtin: self.builtin,
            correlation_id: self.correlation_id,
            caller: self.caller,
        }
    }

    /// Whether this is a built-in call nobody runs ([`rules::is_orphaned_builtin`]).
    pub fn is_orphaned_builtin(&self, now: Timestamp) -> bool {
        rules::is_orphaned_builtin(self, now)
    }

    /// Whether `claim` may hand this call out ([`rules::is_claimable`]).
    pub fn is_claimable(&self, claim: &Claim) -> bool {
        rules::is_claimable(self, &claim.connection_id, claim.now, claim.redeliver)
    }

    /// The answer a call gets when its deadline passes unanswered.
    pub fn expired_response(&self) -> ToolResponse {
        let waited = self.deadline.since(self.created_at).as_secs();
        let message = if self.builtin {
            format!(
                "The relay's built-in tool {} did not finish within {waited} s. Call again with a new requestId; if it keeps happening, ask for less work (a smaller model, a shorter time limit).",
                self.function_name
            )
        } else if self.deliveries > 0 {
            format!(
                "The tool did not answer within {waited} s, but the call reached the page serving it (the CODAP plugin, say), so the tool may have run. Look at the current state before repeating it: calling again may repeat the change. Check that the page is open and connected (its status dot is green)."
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
            content: None,
            structured_content: None,
        }
    }

    /// The call as the provider receives it, borrowed: its `tool-request` frame.
    pub fn frame(&self) -> ToolRequestFrame<'_> {
        ToolRequestFrame {
            request_id: &self.id,
            tool_id: self.tool_id.as_deref(),
            function_name: &self.function_name,
            args: &self.args,
        }
    }

    /// The call as the provider receives it.
    pub fn tool_request(&self) -> ToolRequest {
        self.frame().to_request()
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
}

/// A tab connection a replica serves, as [`SessionStore::refresh`] found its session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TabState {
    /// The connection serves the session, which has this many calls waiting for their answer
    /// (a replica that knows of fewer missed an event) and expires then.
    Serving {
        /// Calls waiting for their answer (built-in calls among them).
        pending: u64,
        /// When the session expires unless there is activity.
        expires_at: Timestamp,
    },
    /// Another connection serves the session now.
    Replaced,
    /// The session ended.
    Gone,
}

/// What [`SessionStore::enqueue`] did.
#[derive(Debug, Clone, PartialEq)]
pub enum Enqueued {
    /// The call is queued. (A store shares the record with what it keeps and announces:
    /// a call is not copied per owner.)
    Queued(Arc<RequestRecord>),
    /// A call with this id and the same body exists; nothing changed.
    Existing(Arc<RequestRecord>),
    /// A call with this id (given back) and another body exists; nothing changed.
    Conflict(String),
    /// The session holds `max_pending` unanswered calls; nothing changed.
    Full,
    /// The session does not exist (or expired).
    NoSession,
    /// The session's manifest is no longer at the revision the call was checked against
    /// ([`EnqueueChecks::manifest_revision`]); nothing changed. The call is given back, to be
    /// checked again against the manifest as it is now.
    StaleManifest(Box<NewRequest>),
    /// The caller's budget ([`EnqueueChecks::charge`]) is spent: try again after this long;
    /// nothing changed.
    RateLimited(Duration),
    /// The caller needs the person's approval and the session takes no new callers (the
    /// person denied three); nothing changed.
    ApprovalRefused,
    /// The caller's handle was disconnected by the person; nothing changed.
    Disconnected,
}

/// What [`SessionStore::enqueue_checked`] checks in the same step as queueing a call, so that a
/// call's way in is one round trip.
#[derive(Debug, Clone, Default)]
pub struct EnqueueChecks {
    /// Queue only if the session's manifest is at this revision: the one the call's
    /// arguments were checked against.
    pub manifest_revision: Option<u64>,
    /// Spend a unit of this budget first (as [`BudgetStore::spend`] does); when it is spent,
    /// nothing is queued.
    pub charge: Option<RateCharge>,
    /// Whether the caller must be one the person allowed.
    pub approval: ApprovalCheck,
    /// Whether the call may be routed to the replica that holds its tab (its caller waits for
    /// it on this replica; see the Redis store's `route`): a store that does not route
    /// ignores it.
    pub route: bool,
}

/// Whether a call's caller must be one the person allowed, in a session whose tab approves
/// callers (in one that does not, every caller may call).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum ApprovalCheck {
    /// No: the caller holds the session's own connector handle, or is the relay.
    #[default]
    Exempt,
    /// The caller with this approval id, using the session's code: a caller not allowed yet
    /// is held (`awaiting_approval`, filed under the id) until the person answers.
    Ask(String),
    /// The caller with this approval id, using the caller handle it was given when allowed: a
    /// caller no longer allowed (disconnected) is refused ([`Enqueued::Disconnected`]).
    Handle(String),
}

/// A session's approvals as the store keeps them (see [`SessionStore::approvals`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ApprovalState {
    /// Whether the session's tab approves new callers.
    pub approves: bool,
    /// Whether the session refuses new callers without asking.
    pub refused: bool,
    /// The relay's book of questions (JSON, opaque to the store: `relay::approvals`).
    pub book: Option<String>,
    /// The allowed callers: approval id and what the relay keeps of it (JSON, opaque).
    pub allowed: Vec<(String, String)>,
    /// The held calls: (approval id, call id), oldest first.
    pub held: Vec<(String, String)>,
}

/// One change to a session's approvals, made at once ([`SessionStore::change_approvals`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ApprovalChange {
    /// The new book, if the book is still the first (the change is made only then).
    pub book: Option<(Option<String>, String)>,
    /// Sets whether the tab approves callers.
    pub approves: Option<bool>,
    /// Sets whether new callers are refused.
    pub refused: Option<bool>,
    /// Allows a caller: its approval id, and what to keep of it.
    pub allow: Option<(String, String)>,
    /// Disconnects a caller (by approval id).
    pub revoke: Option<String>,
    /// Lets the held calls of a caller (by approval id) go: into the queue, or finished with a
    /// failed answer.
    pub release: Option<(String, Release)>,
}

/// What becomes of a caller's held calls.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Release {
    /// Queued for the tab, as if just made.
    Queue,
    /// Failed, with this error.
    Fail {
        /// Its code.
        code: toolrelay::errors::ErrorCode,
        /// What it means and what to do.
        message: String,
    },
}

/// A unit of a rate budget to spend.
#[derive(Debug, Clone)]
pub struct RateCharge {
    /// The budget's key, as for [`BudgetStore::spend`]. In Redis it should carry the session's
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

/// Who gives a call its answer: what [`SessionStore::finish`] checks in the same step as it records
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

/// What [`SessionStore::finish`] did.
#[derive(Debug, Clone, PartialEq)]
pub enum Finished {
    /// The call now has this final answer (the record its waiters are handed too).
    Finished(Arc<RequestRecord>),
    /// The call had its final answer already; nothing changed.
    AlreadyFinished(Arc<RequestRecord>),
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
    /// A call was queued for whoever serves the session to claim.
    RequestQueued,
    /// A call was queued and handed to the connection it names in `delivered_to`
    /// ([`rules::hand_over`]): that connection forwards it as it is, without a claim.
    CallHanded(Arc<RequestRecord>),
    /// A call has its final answer.
    ResponseReady {
        /// The call's id.
        id: String,
        /// The finished call, when the store could send it along (the Redis store does for
        /// answers up to [`rules::ANNOUNCED_ANSWER_BYTES`]), so that a waiter
        /// need not read it; on a session's stream, without its answer when that is over 4 KB
        /// ([`RequestRecord::without_answer`]).
        record: Option<Arc<RequestRecord>>,
    },
    /// The connection with this id is now the provider.
    ProviderChanged(String),
    /// A new manifest was registered.
    ManifestChanged,
    /// The session's approvals changed (a question asked or closed, a caller allowed or
    /// disconnected): its tab looks at them again.
    ApprovalsChanged,
    /// The session was deleted or expired; no more events follow.
    SessionEnded,
    /// Events were lost (a slow subscriber): look at the state again.
    Missed,
    /// News of call `id` while it runs, for its waiters only.
    News {
        /// The call's id.
        id: String,
        /// The news.
        news: Box<CallNews>,
    },
}

/// What a running call's tab says of it before its answer: its progress, a log message.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum CallNews {
    /// How far it has come.
    Progress(CallProgress),
    /// A log message about it.
    Log(toolrelay::wire::LogFrame),
}

/// How far a call has come, as its tab last said.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct CallProgress {
    /// Work done so far.
    pub progress: f64,
    /// The work there is, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub total: Option<f64>,
    /// What is happening, for people.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// When the tab said it.
    pub at: Timestamp,
}

/// A session's events; the stream ends when the session does.
pub type EventStream = Pin<Box<dyn Stream<Item = SessionEvent> + Send>>;

/// What becomes of a call routed here from another replica ([`SessionStore::accept_routed`]):
/// its news while it runs, then its answer.
pub type RoutedAnswer = Pin<Box<dyn Stream<Item = Routed> + Send>>;

/// One item of a [`RoutedAnswer`].
#[derive(Debug, Clone, PartialEq)]
pub enum Routed {
    /// News of the call (its progress, a log message), for its waiter.
    News(Box<CallNews>),
    /// The finished call, packed, or an empty string when it was announced to every replica.
    Answer(String),
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

/// What became of a new session ([`SessionStore::insert_session_within`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Inserted {
    /// It lives.
    Inserted,
    /// A live session has its code: try another.
    Taken,
    /// As many sessions live as may.
    Full,
}

/// Which cap refused a new MCP client session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum McpSessionsFull {
    /// The client address holds its share.
    PerAddress,
    /// Every place is taken.
    Total,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The hash is kept in Redis: it must not change between versions (this is the first
    /// 128 bits of what the first implementation gave), nor with the order of an object's keys.
    #[test]
    fn a_call_hashes_as_it_always_did() {
        let args = serde_json::json!({"b": [1, "x", null, true], "a": {"z": 1.5, "y": "q\"é"}});
        let expected = "271c39a7dec27942beec6dc1106b3674";
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
                caller: None,
            },
            1,
        )
    }

    #[test]
    fn an_expired_call_blames_what_did_not_answer() {
        let tab = call(false).expired_response().error.unwrap().message;
        assert!(tab.contains("page serving it"), "{tab}");
        assert!(tab.contains("call again with a new requestId"), "{tab}");
        // Delivered, the tool may have run: repeating the call may repeat the change.
        let mut delivered = call(false);
        delivered.status = RequestStatus::Delivered;
        delivered.delivered_to = Some("tab-1".into());
        delivered.deliveries = 1;
        let delivered = delivered.expired_response().error.unwrap().message;
        assert!(
            delivered.contains("may have run") && delivered.contains("may repeat the change"),
            "{delivered}"
        );
        assert!(!delivered.contains("new requestId"), "{delivered}");
        let builtin = call(true).expired_response().error.unwrap().message;
        assert!(
            !builtin.contains("plugin") && builtin.contains("built-in tool solve_mip_problem"),
            "{builtin}"
        );
        assert!(builtin.contains("60 s"), "{builtin}");
    }
}
