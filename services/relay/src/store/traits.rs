//! The store's interface, in parts by concern: [`SessionStore`] (sessions, manifests, calls
//! and their events), [`TicketStore`] (claim checks), [`McpSessionStore`] (MCP client
//! sessions) and [`BudgetStore`] (rate budgets and locks), each [`Reachable`]. [`Store`] is
//! all four: what the relay holds; [`FrontStore`] what a front end keeps itself; a part goes
//! to what needs only that. Every method is written once, in the list
//! [`crate::store_methods`], from which the parts are declared here and the wrappers and the
//! metric labels are made.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures::StreamExt;
use serde_json::Value;
use toolrelay::wire::{RequestStatus, ToolResponse};

use super::{
    Answerer, ApprovalChange, ApprovalState, CallNews, CallProgress, Claim, EnqueueChecks,
    Enqueued, EventStream, Finished, Inserted, McpSessionCaps, McpSessionsFull, NewRequest,
    ProviderInfo, RateBudget, RequestRecord, RoutedAnswer, SessionEvent, SessionRecord, StoreUsage,
    TabState,
};
use crate::clock::Timestamp;
use crate::code::SessionCode;
use crate::error::StoreError;

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

/// Calls `$callback!` once with every part of the store's interface (its docs, its name, its
/// bounds in brackets) and each of its methods (its docs and attributes, its arguments, its
/// output inside `Result<_, StoreError>`, after `=>` the
/// [`StoreOperation`](crate::metrics::StoreOperation) it counts as, labelled with the method's
/// name, and its default body or `;`): the one list of the store's methods. The traits are
/// declared from it (below), and so are the wrappers ([`super::observed::Observed`],
/// [`super::connecting::Connecting`]) and the operations' metric labels: a new method is its
/// entry here and its two implementations (the memory store, the Redis store). Exported for
/// tests that wrap a store; the names it uses must be in scope where it is called.
#[macro_export]
#[doc(hidden)]
macro_rules! store_methods {
    ($callback:ident) => {
        $callback! {
            /// Whether a store answers: what every part of the store's interface shares.
            Reachable [Send + Sync + 'static] {
                /// Whether the store answers (for readiness checks).
                fn ping(&self) -> () => Ping;
            }

            /// Sessions, their manifests and calls, and their events. Operations on a session that
            /// does not exist (or has expired) return `None`, `false` or a `No…` variant, never an
            /// error: errors mean the store itself failed.
            SessionStore [Reachable] {
                /// Inserts a new session with an empty manifest; false when the code is taken.
                fn insert_session(&self, session: SessionRecord) -> bool => InsertSession {
                    let inserted = self.insert_session_within(session, usize::MAX).await?;
                    Ok(inserted == Inserted::Inserted)
                }

                /// Inserts a new session with an empty manifest unless its code is taken, or
                /// `max_live` sessions live already (`MAX_SESSIONS`: every replica sharing the
                /// store counts the same sessions, and the store never holds more).
                fn insert_session_within(
                    &self,
                    session: SessionRecord,
                    max_live: usize,
                ) -> Inserted => InsertSessionWithin;

                /// The live session.
                fn session(&self, code: &SessionCode) -> Option<SessionRecord> => Session;

                /// The code of the live session whose MCP handle this is.
                fn session_by_handle(&self, handle: &str) -> Option<SessionCode> => SessionByHandle;

                /// Slides the expiry to `until` (never backwards, never past the maximum lifetime).
                /// With `seen`, only if that connection is the session's provider, and then it is
                /// recorded as heard from at `now`; a replaced connection keeps nothing alive.
                /// Returns the session either way, so the caller can see who the provider is.
                fn touch_session(
                    &self,
                    code: &SessionCode,
                    now: Timestamp,
                    until: Timestamp,
                    seen: Option<&str>,
                ) -> Option<SessionRecord> => TouchSession;

                /// The sessions of tab connections this replica serves (`(session, connection)`),
                /// in one go: how each stands. With `until`, the session of each connection still
                /// serving it slides to `until` (as [`SessionStore::touch_session`] would, without
                /// recording the connection as heard from: a pushing tab's presence is its
                /// replica's, [`SessionStore::keep_replica`]): the replica's keep-alive of the
                /// sessions due, which costs the store one operation per batch of sessions rather
                /// than one per tab.
                fn refresh(
                    &self,
                    tabs: &[(SessionCode, String)],
                    now: Timestamp,
                    until: Option<Timestamp>,
                ) -> Vec<TabState> => Refresh {
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

                /// Records the relay replica `replica` as alive until `until` (the pushing tabs it
                /// serves count as connected until then), and returns every replica alive at `now`
                /// with when it stops counting as alive. One key outside every session, one round
                /// trip per replica and refresh period however many tabs it serves. By default a
                /// store of one process, which knows of no replica but the one asking.
                fn keep_replica(
                    &self,
                    replica: &str,
                    now: Timestamp,
                    until: Timestamp,
                ) -> Vec<(String, Timestamp)> => KeepReplica {
                    let _ = now;
                    Ok(vec![(replica.to_owned(), until)])
                }

                /// The replicas alive at `now`, with when each stops counting as alive (by default
                /// none: see [`SessionStore::keep_replica`]).
                fn live_replicas(&self, now: Timestamp) -> Vec<(String, Timestamp)> => LiveReplicas {
                    let _ = now;
                    Ok(Vec::new())
                }

                /// Deletes a session and everything in it; false when there was none.
                fn delete_session(&self, code: &SessionCode) -> bool => DeleteSession;

                /// Makes `provider` the session's provider (replacing any other) and announces it.
                fn set_provider(
                    &self,
                    code: &SessionCode,
                    provider: ProviderInfo,
                ) -> Option<SessionRecord> => SetProvider;

                /// Removes the provider, if it is still the connection `connection_id`.
                fn clear_provider(
                    &self,
                    code: &SessionCode,
                    connection_id: &str,
                ) -> () => ClearProvider;

                /// Replaces the session's provider token (its SHA-256, `token_hash`): a claim
                /// redeemed gives its tab a token of its own. False when there is no such session.
                fn set_token(&self, code: &SessionCode, token_hash: &str) -> bool => SetToken;

                /// Replaces the manifest (a validated manifest's JSON,
                /// [`crate::manifest::Manifest::to_json`]); returns the new revision, also in
                /// [`SessionRecord::manifest_revision`]. A store keeps only the JSON: compiled
                /// validators are each replica's own ([`crate::manifest::ManifestCache`]).
                fn set_manifest(
                    &self,
                    code: &SessionCode,
                    json: String,
                ) -> Option<u64> => SetManifest;

                /// The session's manifest JSON and its revision (revision 0, `None`: nothing
                /// registered).
                fn manifest(
                    &self,
                    code: &SessionCode,
                ) -> Option<(u64, Option<String>)> => Manifest;

                /// Queues a call unless its id is taken or `max_pending` calls are pending at
                /// `request.created_at`, and slides the session's expiry to `until` (capped by its
                /// maximum lifetime) in the same step: a queued call is activity. Announces it.
                fn enqueue(
                    &self,
                    code: &SessionCode,
                    request: NewRequest,
                    max_pending: usize,
                    until: Timestamp,
                ) -> Enqueued => Enqueue {
                    let checks = EnqueueChecks::default();
                    let (enqueued, _) = self
                        .enqueue_checked(code, request, max_pending, until, checks)
                        .await?;
                    Ok(enqueued)
                }

                /// [`SessionStore::enqueue`], after spending `checks.charge` (at
                /// `request.created_at`) and only if the manifest is at `checks.manifest_revision`;
                /// with the session as it is after (`None` when there is none, or the charge was
                /// refused; after a call was queued, a store may leave out the session's token
                /// hash, creation time and handle, which no caller reads then). One round trip: all
                /// a call needs to get in.
                fn enqueue_checked(
                    &self,
                    code: &SessionCode,
                    request: NewRequest,
                    max_pending: usize,
                    until: Timestamp,
                    checks: EnqueueChecks,
                ) -> (Enqueued, Option<SessionRecord>) => EnqueueChecked;

                /// The session's approvals: whether its tab approves callers, the relay's book of
                /// questions, the allowed callers and the held calls.
                fn approvals(&self, code: &SessionCode) -> Option<ApprovalState> => Approvals;

                /// Makes `change` in one step at `now` — unless it carries a book and the session's
                /// book is no longer the one it expected (then nothing changes: `Some(false)`) —
                /// and announces [`SessionEvent::ApprovalsChanged`](crate::store::SessionEvent::ApprovalsChanged); released calls are announced
                /// as queued, or as answered. `None`: no such session.
                fn change_approvals(
                    &self,
                    code: &SessionCode,
                    change: &ApprovalChange,
                    now: Timestamp,
                ) -> Option<bool> => ChangeApprovals;

                /// One call.
                fn request(
                    &self,
                    code: &SessionCode,
                    id: &str,
                ) -> Option<RequestRecord> => Request;

                /// The final answers kept for the session, in queue order: of the calls `caller` (a
                /// caller's key) made and of those whose caller is unknown, or all when `None`.
                fn responses(
                    &self,
                    code: &SessionCode,
                    caller: Option<&str>,
                ) -> Option<Vec<ToolResponse>> => Responses;

                /// How many calls wait for an answer.
                fn pending_count(&self, code: &SessionCode) -> Option<usize> => PendingCount;

                /// Leases the unanswered built-in call `id` to `holder` (one run of it on one
                /// replica) until `until`, if it is free: not yet taken by a run (held by
                /// [`super::BUILTIN_CONNECTION`]), leased to `holder` already (a renewal), or its
                /// lease ran out (its replica is gone). The call leased; `None` when it is not
                /// free.
                fn lease_builtin(
                    &self,
                    code: &SessionCode,
                    id: &str,
                    holder: &str,
                    now: Timestamp,
                    until: Timestamp,
                ) -> Option<RequestRecord> => LeaseBuiltin;

                /// Hands claimable calls (see [`RequestRecord::is_claimable`]), oldest first, to
                /// the connection, if it is the session's provider; marks them delivered to it.
                fn claim(
                    &self,
                    code: &SessionCode,
                    claim: &Claim,
                ) -> Vec<RequestRecord> => Claim;

                /// Gives a call its final answer, unless it has one or `answerer` may not answer it
                /// ([`Finished::NotDelivered`]), and slides the session's expiry to `until` in the
                /// same step (an answer is activity); announces it. A call whose deadline has
                /// passed becomes `expired` instead, and an answer other than that is refused
                /// ([`Finished::AlreadyFinished`]).
                #[allow(clippy::too_many_arguments)] // each is one part of the one atomic step
                fn finish(
                    &self,
                    code: &SessionCode,
                    id: &str,
                    status: RequestStatus,
                    response: ToolResponse,
                    answerer: Answerer<'_>,
                    now: Timestamp,
                    until: Timestamp,
                ) -> Finished => Finish;

                /// The session's events from now on.
                fn subscribe(&self, code: &SessionCode) -> Option<EventStream> => Subscribe;

                /// The session's events from now on, without looking the session up (a round trip
                /// less on a call's path): for a session that does not exist the stream may end at
                /// once or stay silent, so the caller must learn whether it exists from its next
                /// operation.
                fn listen(&self, code: &SessionCode) -> EventStream => Listen {
                    Ok(self
                        .subscribe(code)
                        .await?
                        .unwrap_or_else(|| Box::pin(futures::stream::empty())))
                }

                /// From now on, the answer to the session's call `id`
                /// ([`SessionEvent::ResponseReady`](crate::store::SessionEvent::ResponseReady)), the session's end and lost events, and
                /// nothing else: a waiting caller is woken by its own answer, not by every event of
                /// its session. Like [`SessionStore::listen`], without looking the session up.
                fn listen_for_answer(
                    &self,
                    code: &SessionCode,
                    id: &str,
                ) -> EventStream => ListenForAnswer {
                    let id = id.to_owned();
                    Ok(Box::pin(self.listen(code).await?.filter(move |event| {
                        std::future::ready(match event {
                            SessionEvent::ResponseReady { id: answered, .. }
                            | SessionEvent::News { id: answered, .. } => *answered == id,
                            SessionEvent::SessionEnded | SessionEvent::Missed => true,
                            _ => false,
                        })
                    })))
                }

                /// Tells the waiters of call `id` news of it (its progress, a log message from its
                /// tab), wherever they wait; progress is kept with the call while it runs
                /// ([`SessionStore::progress`]). Nothing happens for a call not delivered and
                /// running, nor for progress not above what is kept (progress increases):
                /// whether it was told.
                fn tell(&self, code: &SessionCode, id: &str, news: CallNews) -> bool => Tell;

                /// The progress its tab last reported of call `id`, while it runs.
                fn progress(&self, code: &SessionCode, id: &str) -> Option<CallProgress> => Progress;

                /// A call queued by another replica sharing this store and routed here because its
                /// session's tab is connected to this one (`call`: the record as that replica's
                /// store packed it): handed to the tab here. The stream yields the call's news
                /// while it runs when the caller's replica reads it (`news`), then once the
                /// finished call, packed, or an empty string when it was announced to every
                /// replica instead (listen there), and ends; dropped, the call's answer is
                /// announced to every replica.
                fn accept_routed(
                    &self,
                    code: &SessionCode,
                    call: String,
                    news: bool,
                ) -> RoutedAnswer => AcceptRouted {
                    let _ = (code, call, news);
                    Err(StoreError(
                        "calls are routed only between replicas sharing Redis (REPLICA_URL)".into(),
                    ))
                }

                /// What the kept answers and claim checks cost now (what the byte budgets bound),
                /// and how many sessions and unanswered calls there are. Not for a call's path: it
                /// may end sessions found expired (counting them), and costs a round trip.
                fn usage(&self) -> StoreUsage => Usage;
            }

            /// Claim checks: values kept for a while under a scope and an id.
            TicketStore [Reachable] {
                /// Keeps a claim-check value under `(scope, id)` until `expires_at`.
                fn put_ticket(
                    &self,
                    scope: &str,
                    id: &str,
                    value: Arc<Value>,
                    expires_at: Timestamp,
                ) -> () => PutTicket;

                /// A claim-check value, if it exists in this scope and has not expired.
                fn ticket(&self, scope: &str, id: &str) -> Option<Arc<Value>> => Ticket;
            }

            /// MCP client sessions, kept as opaque text under their id, with caps on how many live.
            McpSessionStore [Reachable] {
                /// Opens a place, named `slot`, for a new MCP client session of the client
                /// `address` (its key: `limits::client_key`) until `expires_at`, unless that client
                /// has `caps.per_address` live sessions already or every client together
                /// `caps.total` (sessions past their expiry do not count). Shared by every gateway
                /// using the store.
                fn open_mcp_session(
                    &self,
                    slot: &str,
                    address: &str,
                    caps: McpSessionCaps,
                    expires_at: Timestamp,
                ) -> Result<(), McpSessionsFull> => OpenMcpSession;

                /// Keeps an MCP client session's state (opaque text: what a gateway needs to take
                /// the session over) under its id until `expires_at`, in the place
                /// [`McpSessionStore::open_mcp_session`] opened as `slot` for `address` (from now
                /// on the place goes by `id`), so any gateway sharing the store can serve the
                /// session's next request.
                fn put_mcp_session(
                    &self,
                    id: &str,
                    slot: &str,
                    address: &str,
                    state: String,
                    expires_at: Timestamp,
                ) -> () => PutMcpSession;

                /// Moves a kept MCP client session's expiry to `expires_at` (it was used): whether
                /// it is kept.
                fn touch_mcp_session(&self, id: &str, expires_at: Timestamp) -> bool => TouchMcpSession;

                /// An MCP client session's state, if kept and not expired.
                fn mcp_session(&self, id: &str) -> Option<String> => McpSession;

                /// Forgets an MCP client session's state and frees its place (the client ended the
                /// session); also frees a place opened as `id` that no session took.
                fn delete_mcp_session(&self, id: &str) -> () => DeleteMcpSession;
            }

            /// Rate budgets and locks shared by every replica using the store.
            BudgetStore [Reachable] {
                /// Takes the lock `key` for `holder` until `until` (or until it is released), or
                /// renews it when `holder` has it already, unless someone else holds it: whether
                /// `holder` has it now. Shared by every replica, so one caller's "one at a time"
                /// holds across replicas; a holder that dies frees it at `until`.
                fn lock(&self, key: &str, holder: &str, until: Timestamp) -> bool => Lock;

                /// Releases the lock `key` if `holder` has it.
                fn unlock(&self, key: &str, holder: &str) -> () => Unlock;

                /// Takes a place for `member` in the set of live things `set` until `expires_at`,
                /// unless `cap` members live at `now` already (a member that has a place keeps it,
                /// and its expiry moves forward): whether `member` has a place now. Shared by every
                /// replica using the store — a global ceiling (claims, distinct manifests) that the
                /// store never passes.
                fn take_place(
                    &self,
                    set: &str,
                    member: &str,
                    cap: usize,
                    now: Timestamp,
                    expires_at: Timestamp,
                ) -> bool => TakePlace;

                /// Spends one unit of the rate budget `key` at `now`: `None` when the budget had
                /// room, or how long until it has room again (nothing is spent then). Shared by
                /// every replica using the store, so a client spreading its requests over replicas
                /// gets one budget.
                fn spend(
                    &self,
                    key: &str,
                    budget: RateBudget,
                    now: Timestamp,
                ) -> Option<Duration> => Spend;
            }
        }
    };
}

/// Declares each part of the store's interface from [`crate::store_methods`].
macro_rules! declared {
    ($(
        $(#[$part_meta:meta])*
        $part:ident [$($bound:tt)*] {
            $(
                $(#[$meta:meta])*
                fn $method:ident(&$self:ident $(, $arg:ident: $type:ty)* $(,)?)
                    -> $output:ty => $operation:ident $body:tt
            )*
        }
    )*) => {
        $(
            $(#[$part_meta])*
            #[async_trait]
            pub trait $part: $($bound)* {
                $(
                    $(#[$meta])*
                    async fn $method(&$self $(, $arg: $type)*) -> Result<$output, StoreError> $body
                )*
            }
        )*
    };
}

crate::store_methods!(declared);
