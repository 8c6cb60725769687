//! The store's interface, in parts by concern: [`SessionStore`] (sessions, manifests, calls
//! and their events), [`TicketStore`] (claim checks), [`McpSessionStore`] (MCP client
//! sessions) and [`BudgetStore`] (rate budgets and locks), each [`Reachable`]. [`Store`] is
//! all four: what the relay holds; a part goes to what needs only that (a gateway holds the
//! budgets and the MCP client sessions).

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures::StreamExt;
use serde_json::Value;
use toolrelay::wire::{RequestStatus, ToolResponse};

use super::{
    Answerer, ApprovalChange, ApprovalState, Claim, EnqueueChecks, Enqueued, EventStream, Finished,
    Inserted, McpSessionCaps, McpSessionsFull, NewRequest, ProviderInfo, RateBudget, RequestRecord,
    RoutedAnswer, SessionEvent, SessionRecord, StoreUsage, TabState,
};
use crate::clock::Timestamp;
use crate::code::SessionCode;
use crate::error::StoreError;

/// Whether a store answers: what every part of the store's interface shares.
#[async_trait]
pub trait Reachable: Send + Sync + 'static {
    /// Whether the store answers (for readiness checks).
    async fn ping(&self) -> Result<(), StoreError>;
}

/// Sessions, their manifests and calls, and their events. Operations on a session that does
/// not exist (or has expired) return `None`, `false` or a `No…` variant, never an error:
/// errors mean the store itself failed.
#[async_trait]
pub trait SessionStore: Reachable {
    /// Inserts a new session with an empty manifest; false when the code is taken.
    async fn insert_session(&self, session: SessionRecord) -> Result<bool, StoreError> {
        let inserted = self.insert_session_within(session, usize::MAX).await?;
        Ok(inserted == Inserted::Inserted)
    }

    /// Inserts a new session with an empty manifest unless its code is taken, or `max_live`
    /// sessions live already (`MAX_SESSIONS`: every replica sharing the store counts the same
    /// sessions, and the store never holds more).
    async fn insert_session_within(
        &self,
        session: SessionRecord,
        max_live: usize,
    ) -> Result<Inserted, StoreError>;

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

    /// The sessions of tab connections this replica serves (`(session, connection)`), in one
    /// go: how each stands. With `until`, the session of each connection still serving it
    /// slides to `until` (as [`SessionStore::touch_session`] would, without recording the
    /// connection as heard from: a pushing tab's presence is its replica's,
    /// [`SessionStore::keep_replica`]): the replica's keep-alive of the sessions due, which
    /// costs the store one operation per batch of sessions rather than one per tab.
    async fn refresh(
        &self,
        tabs: &[(SessionCode, String)],
        now: Timestamp,
        until: Option<Timestamp>,
    ) -> Result<Vec<TabState>, StoreError> {
        let mut states = Vec::with_capacity(tabs.len());
        for (code, connection) in tabs {
            let serving = |session: &SessionRecord| {
                session
                    .provider
                    .as_ref()
                    .is_some_and(|provider| provider.connection_id == *connection)
            };
            let mut session = self.session(code).await?;
            if let (Some(until), Some(found)) = (until, &session)
                && serving(found)
            {
                session = self.touch_session(code, now, until, None).await?;
            }
            states.push(match session {
                None => TabState::Gone,
                Some(session) if serving(&session) => TabState::Serving {
                    pending: self.pending_count(code).await?.unwrap_or(0) as u64,
                    expires_at: session.expires_at,
                },
                Some(_) => TabState::Replaced,
            });
        }
        Ok(states)
    }

    /// Records the relay replica `replica` as alive until `until` (the pushing tabs it serves
    /// count as connected until then), and returns every replica alive at `now` with when it
    /// stops counting as alive. One key outside every session, one round trip per replica
    /// and refresh period however many tabs it serves.
    /// By default a store of one process, which knows of no replica but the one asking.
    async fn keep_replica(
        &self,
        replica: &str,
        now: Timestamp,
        until: Timestamp,
    ) -> Result<Vec<(String, Timestamp)>, StoreError> {
        let _ = now;
        Ok(vec![(replica.to_owned(), until)])
    }

    /// The replicas alive at `now`, with when each stops counting as alive (by default none:
    /// see [`SessionStore::keep_replica`]).
    async fn live_replicas(&self, now: Timestamp) -> Result<Vec<(String, Timestamp)>, StoreError> {
        let _ = now;
        Ok(Vec::new())
    }

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

    /// Replaces the session's provider token (its SHA-256, `token_hash`): a claim redeemed
    /// gives its tab a token of its own. False when there is no such session.
    async fn set_token(&self, code: &SessionCode, token_hash: &str) -> Result<bool, StoreError>;

    /// Replaces the manifest (a validated manifest's JSON,
    /// [`crate::manifest::Manifest::to_json`]); returns the new revision, also in
    /// [`SessionRecord::manifest_revision`]. A store keeps only the JSON: compiled validators
    /// are each replica's own ([`crate::manifest::ManifestCache`]).
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

    /// [`SessionStore::enqueue`], after spending `checks.charge` (at `request.created_at`) and only
    /// if the manifest is at `checks.manifest_revision`; with the session as it is after
    /// (`None` when there is none, or the charge was refused; after a call was queued, a store
    /// may leave out the session's token hash, creation time and handle, which no caller reads
    /// then).
    /// One round trip: all a call needs to get in.
    async fn enqueue_checked(
        &self,
        code: &SessionCode,
        request: &NewRequest,
        max_pending: usize,
        until: Timestamp,
        checks: EnqueueChecks,
    ) -> Result<(Enqueued, Option<SessionRecord>), StoreError>;

    /// The session's approvals: whether its tab approves callers, the relay's book of
    /// questions, the allowed callers and the held calls.
    async fn approvals(&self, code: &SessionCode) -> Result<Option<ApprovalState>, StoreError>;

    /// Makes `change` in one step at `now` — unless it carries a book and the session's book
    /// is no longer the one it expected (then nothing changes: `Some(false)`) — and announces
    /// [`SessionEvent::ApprovalsChanged`]; released calls are announced as queued, or as
    /// answered. `None`: no such session.
    async fn change_approvals(
        &self,
        code: &SessionCode,
        change: &ApprovalChange,
        now: Timestamp,
    ) -> Result<Option<bool>, StoreError>;

    /// One call.
    async fn request(
        &self,
        code: &SessionCode,
        id: &str,
    ) -> Result<Option<RequestRecord>, StoreError>;

    /// The final answers kept for the session, in queue order: of the calls `caller` (a
    /// caller's key) made and of those whose caller is unknown, or all when `None`.
    async fn responses(
        &self,
        code: &SessionCode,
        caller: Option<&str>,
    ) -> Result<Option<Vec<ToolResponse>>, StoreError>;

    /// How many calls wait for an answer.
    async fn pending_count(&self, code: &SessionCode) -> Result<Option<usize>, StoreError>;

    /// Leases the unanswered built-in call `id` to `holder` (one run of it on one replica)
    /// until `until`, if it is free: not yet taken by a run (held by
    /// [`super::BUILTIN_CONNECTION`]), leased to `holder` already (a renewal), or its lease
    /// ran out (its replica is gone).
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
    /// own answer, not by every event of its session. Like [`SessionStore::listen`], without
    /// looking the session up.
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

    /// A call queued by another replica sharing this store and routed here because its
    /// session's tab is connected to this one (`call`: the record as that replica's store
    /// packed it): handed to the tab here. The stream yields once — the finished call, packed,
    /// or an empty string when it was announced to every replica instead (listen there) — and
    /// ends; dropped, the call's answer is announced to every replica.
    async fn accept_routed(
        &self,
        code: &SessionCode,
        call: String,
    ) -> Result<RoutedAnswer, StoreError> {
        let _ = (code, call);
        Err(StoreError(
            "calls are routed only between replicas sharing Redis (REPLICA_URL)".into(),
        ))
    }

    /// What the kept answers and claim checks cost now (what the byte budgets bound), and how
    /// many sessions and unanswered calls there are. Not for a call's path: it may end
    /// sessions found expired (counting them), and costs a round trip.
    async fn usage(&self) -> Result<StoreUsage, StoreError>;
}

/// Claim checks: values kept for a while under a scope and an id.
#[async_trait]
pub trait TicketStore: Reachable {
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
}

/// MCP client sessions, kept as opaque text under their id, with caps on how many live.
#[async_trait]
pub trait McpSessionStore: Reachable {
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
    /// session over) under its id until `expires_at`, in the place
    /// [`McpSessionStore::open_mcp_session`] opened as `slot` for `address` (from now on the
    /// place goes by `id`), so any gateway sharing the store can serve the session's next
    /// request.
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
}

/// Rate budgets and locks shared by every replica using the store.
#[async_trait]
pub trait BudgetStore: Reachable {
    /// Takes the lock `key` for `holder` until `until` (or until it is released), or renews
    /// it when `holder` has it already, unless someone else holds it: whether `holder` has it
    /// now. Shared by every replica, so one
    /// caller's "one at a time" holds across replicas; a holder that dies frees it at `until`.
    async fn lock(&self, key: &str, holder: &str, until: Timestamp) -> Result<bool, StoreError>;

    /// Releases the lock `key` if `holder` has it.
    async fn unlock(&self, key: &str, holder: &str) -> Result<(), StoreError>;

    /// Takes a place for `member` in the set of live things `set` until `expires_at`, unless
    /// `cap` members live at `now` already (a member that has a place keeps it, and its expiry
    /// moves forward): whether `member` has a place now. Shared by every replica using the
    /// store — a global ceiling (claims, distinct manifests) that the store never passes.
    async fn take_place(
        &self,
        set: &str,
        member: &str,
        cap: usize,
        now: Timestamp,
        expires_at: Timestamp,
    ) -> Result<bool, StoreError>;

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

/// What a front end (the gateway) keeps in the store: claim checks, MCP client sessions and
/// rate budgets, each with the store's reachability. Sessions, calls and answers it reaches
/// only through the relay's operations. An `Arc<dyn Store>` gives it as `Arc<dyn FrontStore>`.
pub trait FrontStore: TicketStore + McpSessionStore + BudgetStore {}

impl<T: TicketStore + McpSessionStore + BudgetStore> FrontStore for T {}

/// The whole store: what the relay holds. Anything implementing the four parts is one, and an
/// `Arc<dyn Store>` gives each part as `Arc<dyn BudgetStore>` (and so on) to what needs only
/// that.
pub trait Store: SessionStore + FrontStore {}

impl<T: SessionStore + FrontStore> Store for T {}

/// Calls `$callback!` once per part of the store's interface with every method of that part
/// (its arguments, its output inside `Result<_, StoreError>`, and after `=>` the
/// [`StoreOperation`](crate::metrics::StoreOperation) it counts as): the one list of the
/// store's methods that the wrappers ([`super::observed::Observed`],
/// [`super::connecting::Connecting`]) forward.
macro_rules! store_methods {
    ($callback:ident) => {
        $callback!(Reachable {
            fn ping(&self) -> () => Ping;
        });

        $callback!(SessionStore {
            fn insert_session_within(&self, session: SessionRecord, max_live: usize)
                -> Inserted => InsertSession;
            fn session(&self, code: &SessionCode) -> Option<SessionRecord> => Session;
            fn session_by_handle(&self, handle: &str) -> Option<SessionCode> => SessionByHandle;
            fn touch_session(
                &self, code: &SessionCode, now: Timestamp, until: Timestamp, seen: Option<&str>,
            ) -> Option<SessionRecord> => TouchSession;
            fn refresh(
                &self, tabs: &[(SessionCode, String)], now: Timestamp, until: Option<Timestamp>,
            ) -> Vec<TabState> => Refresh;
            fn keep_replica(&self, replica: &str, now: Timestamp, until: Timestamp)
                -> Vec<(String, Timestamp)> => KeepReplica;
            fn live_replicas(&self, now: Timestamp) -> Vec<(String, Timestamp)> => LiveReplicas;
            fn delete_session(&self, code: &SessionCode) -> bool => DeleteSession;
            fn set_provider(&self, code: &SessionCode, provider: ProviderInfo)
                -> Option<SessionRecord> => SetProvider;
            fn clear_provider(&self, code: &SessionCode, connection_id: &str) -> () => ClearProvider;
            fn set_token(&self, code: &SessionCode, token_hash: &str) -> bool => SetToken;
            fn set_manifest(&self, code: &SessionCode, json: String) -> Option<u64> => SetManifest;
            fn manifest(&self, code: &SessionCode) -> Option<(u64, Option<String>)> => Manifest;
            fn enqueue_checked(
                &self, code: &SessionCode, request: &NewRequest, max_pending: usize, until: Timestamp,
                checks: EnqueueChecks,
            ) -> (Enqueued, Option<SessionRecord>) => Enqueue;
            fn approvals(&self, code: &SessionCode) -> Option<ApprovalState> => Approvals;
            fn change_approvals(&self, code: &SessionCode, change: &ApprovalChange, now: Timestamp)
                -> Option<bool> => ChangeApprovals;
            fn request(&self, code: &SessionCode, id: &str) -> Option<RequestRecord> => Request;
            fn responses(&self, code: &SessionCode, caller: Option<&str>) -> Option<Vec<ToolResponse>> => Responses;
            fn pending_count(&self, code: &SessionCode) -> Option<usize> => PendingCount;
            fn lease_builtin(
                &self, code: &SessionCode, id: &str, holder: &str, now: Timestamp, until: Timestamp,
            ) -> Option<RequestRecord> => LeaseBuiltin;
            fn claim(&self, code: &SessionCode, claim: &Claim) -> Vec<RequestRecord> => Claim;
            #[allow(clippy::too_many_arguments)]
            fn finish(
                &self, code: &SessionCode, id: &str, status: RequestStatus, response: ToolResponse,
                answerer: Answerer<'_>, now: Timestamp, until: Timestamp,
            ) -> Finished => Finish;
            fn subscribe(&self, code: &SessionCode) -> Option<EventStream> => Subscribe;
            fn listen(&self, code: &SessionCode) -> EventStream => Listen;
            fn listen_for_answer(&self, code: &SessionCode, id: &str) -> EventStream => Listen;
            fn accept_routed(&self, code: &SessionCode, call: String) -> RoutedAnswer => AcceptRouted;
            fn usage(&self) -> StoreUsage => Usage;
        });

        $callback!(TicketStore {
            fn put_ticket(&self, scope: &str, id: &str, value: Arc<Value>, expires_at: Timestamp)
                -> () => PutTicket;
            fn ticket(&self, scope: &str, id: &str) -> Option<Arc<Value>> => Ticket;
        });

        $callback!(McpSessionStore {
            fn open_mcp_session(
                &self, slot: &str, address: &str, caps: McpSessionCaps, expires_at: Timestamp,
            ) -> Result<(), McpSessionsFull> => OpenMcpSession;
            fn put_mcp_session(
                &self, id: &str, slot: &str, address: &str, state: String, expires_at: Timestamp,
            ) -> () => PutMcpSession;
            fn touch_mcp_session(&self, id: &str, expires_at: Timestamp) -> bool => TouchMcpSession;
            fn mcp_session(&self, id: &str) -> Option<String> => McpSession;
            fn delete_mcp_session(&self, id: &str) -> () => DeleteMcpSession;
        });

        $callback!(BudgetStore {
            fn lock(&self, key: &str, holder: &str, until: Timestamp) -> bool => Lock;
            fn unlock(&self, key: &str, holder: &str) -> () => Unlock;
            fn spend(&self, key: &str, budget: RateBudget, now: Timestamp) -> Option<Duration> => Spend;
            fn take_place(
                &self, set: &str, member: &str, cap: usize, now: Timestamp, expires_at: Timestamp,
            ) -> bool => TakePlace;
        });
    };
}
pub(crate) use store_methods;
