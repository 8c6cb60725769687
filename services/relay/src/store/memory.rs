//! The in-memory [`Store`]: one process, nothing shared, nothing kept across restarts.
//!
//! All state sits behind one `std::sync::Mutex`: every operation is a few map look-ups with no
//! `.await` inside, so a blocking lock is cheaper than an async one and cannot be held across a
//! suspension point. A sweeper task drops expired sessions (announcing their end) and finished
//! calls older than the retention time.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use async_trait::async_trait;
use futures::StreamExt;
use serde_json::Value;
use tokio::sync::broadcast;
use tokio_stream::wrappers::BroadcastStream;
use toolrelay::wire::{RequestStatus, ToolResponse};

use super::{
    Claim, Enqueued, EventStream, Finished, NewRequest, ProviderInfo, RequestRecord, SessionEvent,
    SessionRecord, Store,
};
use crate::clock::{Clock, Timestamp};
use crate::code::SessionCode;
use crate::error::StoreError;
use crate::manifest::Manifest;

/// Events a slow subscriber may fall behind by before it gets [`SessionEvent::Missed`].
const EVENT_BUFFER: usize = 256;
/// How often the sweeper runs.
const SWEEP_INTERVAL: Duration = Duration::from_secs(1);
/// Finished calls kept per session at most (the oldest go first).
const MAX_FINISHED_PER_SESSION: usize = 1000;
/// Claim checks kept per scope at most (the ones expiring first go first).
const MAX_TICKETS_PER_SCOPE: usize = 200;
/// Bytes of claim checks (as JSON) kept in all at most, by default (the ones expiring first
/// go first): scopes are the callers' to choose, so the per-scope limit alone bounds nothing.
pub const TICKET_BUDGET: usize = 256 * 1024 * 1024;

/// Sessions and calls in this process's memory.
pub struct MemoryStore {
    clock: Clock,
    retention: Duration,
    ticket_budget: usize,
    sessions: Mutex<Tables>,
}

/// Everything the store holds, under one lock.
#[derive(Default)]
struct Tables {
    sessions: HashMap<SessionCode, Entry>,
    /// MCP handle → session code. Entries of ended sessions are dropped by the sweeper and
    /// ignored until then (a look-up checks the session still has that handle).
    handles: HashMap<String, SessionCode>,
    /// Claim checks by scope, then id.
    tickets: HashMap<String, HashMap<String, Ticket>>,
    /// Their total size.
    ticket_bytes: usize,
}

/// A claim check, kept as JSON text so its size is what it costs.
struct Ticket {
    json: Arc<str>,
    expires_at: Timestamp,
}

impl Tables {
    /// Drops the ticket of `scope` expiring first; false when there is none.
    fn evict_from(&mut self, scope: &str) -> bool {
        let Some(mine) = self.tickets.get_mut(scope) else {
            return false;
        };
        let Some(id) = mine
            .iter()
            .min_by_key(|(_, ticket)| ticket.expires_at)
            .map(|(id, _)| id.clone())
        else {
            return false;
        };
        if let Some(ticket) = mine.remove(&id) {
            self.ticket_bytes -= ticket.json.len();
        }
        if mine.is_empty() {
            self.tickets.remove(scope);
        }
        true
    }

    /// Drops the ticket expiring first of any scope; false when there is none.
    fn evict_any(&mut self) -> bool {
        let oldest = self
            .tickets
            .iter()
            .filter_map(|(scope, mine)| {
                mine.values()
                    .map(|ticket| ticket.expires_at)
                    .min()
                    .map(|expires| (expires, scope.clone()))
            })
            .min();
        oldest.is_some_and(|(_, scope)| self.evict_from(&scope))
    }
}

impl std::ops::Deref for Tables {
    type Target = HashMap<SessionCode, Entry>;
    fn deref(&self) -> &Self::Target {
        &self.sessions
    }
}

impl std::ops::DerefMut for Tables {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.sessions
    }
}

struct Entry {
    session: SessionRecord,
    manifest: Arc<Manifest>,
    requests: HashMap<String, RequestRecord>,
    /// Unfinished calls by queue position, so claims need not scan finished ones.
    pending: BTreeMap<u64, String>,
    next_seq: u64,
    events: broadcast::Sender<SessionEvent>,
}

impl Entry {
    fn announce(&self, event: SessionEvent) {
        // No subscribers is normal: nobody is waiting.
        let _ = self.events.send(event);
    }

    /// Expires unanswered calls past their deadline, waking their waiters.
    fn expire_overdue(&mut self, now: Timestamp) {
        let mut expired = Vec::new();
        for (seq, id) in &self.pending {
            if let Some(request) = self.requests.get_mut(id)
                && request.expire_if_overdue(now)
            {
                expired.push((*seq, id.clone()));
            }
        }
        for (seq, id) in expired {
            self.pending.remove(&seq);
            self.announce(SessionEvent::ResponseReady(id));
        }
    }

    /// Drops finished calls older than `retention`, and the oldest beyond
    /// [`MAX_FINISHED_PER_SESSION`].
    fn forget_finished(&mut self, now: Timestamp, retention: Duration) {
        self.requests.retain(|_, request| {
            request
                .finished_at
                .is_none_or(|finished| now.since(finished) < retention)
        });
        let finished = self.requests.len() - self.pending.len();
        if finished > MAX_FINISHED_PER_SESSION {
            let mut by_age: Vec<(Timestamp, String)> = self
                .requests
                .values()
                .filter_map(|request| request.finished_at.map(|at| (at, request.id.clone())))
                .collect();
            by_age.sort();
            for (_, id) in by_age.into_iter().take(finished - MAX_FINISHED_PER_SESSION) {
                self.requests.remove(&id);
            }
        }
    }
}

impl MemoryStore {
    /// A store keeping finished calls for `retention`, with its sweeper running on the current
    /// tokio runtime until the store is dropped.
    pub fn new(clock: Clock, retention: Duration) -> Arc<Self> {
        Self::with_ticket_budget(clock, retention, TICKET_BUDGET)
    }

    /// [`MemoryStore::new`] keeping at most `ticket_budget` bytes of claim checks.
    pub fn with_ticket_budget(
        clock: Clock,
        retention: Duration,
        ticket_budget: usize,
    ) -> Arc<Self> {
        let store = Arc::new(Self {
            clock,
            retention,
            ticket_budget,
            sessions: Mutex::new(Tables::default()),
        });
        tokio::spawn(sweep(Arc::downgrade(&store)));
        store
    }

    fn lock(&self) -> MutexGuard<'_, Tables> {
        // A panic while holding the lock cannot leave an entry half-written (each operation
        // writes whole values), so the data is still sound after poisoning.
        self.sessions
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Runs `f` on the live entry of `code` after expiring its overdue calls, dropping the
    /// entry if the session has expired.
    fn with_live<R>(&self, code: &SessionCode, f: impl FnOnce(&mut Entry) -> R) -> Option<R> {
        let now = self.clock.now();
        let mut sessions = self.lock();
        let expired = sessions.get(code)?.session.expires_at <= now;
        if expired {
            if let Some(entry) = sessions.remove(code) {
                entry.announce(SessionEvent::SessionEnded);
            }
            return None;
        }
        let entry = sessions.get_mut(code)?;
        entry.expire_overdue(now);
        Some(f(entry))
    }

    fn sweep_once(&self) {
        let now = self.clock.now();
        let mut tables = self.lock();
        tables.sessions.retain(|_, entry| {
            if entry.session.expires_at <= now {
                entry.announce(SessionEvent::SessionEnded);
                return false;
            }
            entry.expire_overdue(now);
            entry.forget_finished(now, self.retention);
            true
        });
        let Tables {
            sessions,
            handles,
            tickets,
            ticket_bytes,
        } = &mut *tables;
        handles.retain(|_, code| sessions.contains_key(code));
        tickets.retain(|_, mine| {
            mine.retain(|_, ticket| {
                let live = ticket.expires_at > now;
                if !live {
                    *ticket_bytes -= ticket.json.len();
                }
                live
            });
            !mine.is_empty()
        });
    }
}

async fn sweep(store: Weak<MemoryStore>) {
    let mut ticks = tokio::time::interval(SWEEP_INTERVAL);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        match store.upgrade() {
            Some(store) => store.sweep_once(),
            None => return,
        }
    }
}

#[async_trait]
impl Store for MemoryStore {
    async fn insert_session(&self, session: SessionRecord) -> Result<bool, StoreError> {
        let now = self.clock.now();
        let mut sessions = self.lock();
        if sessions
            .get(&session.code)
            .is_some_and(|entry| entry.session.expires_at > now)
        {
            return Ok(false);
        }
        let (events, _) = broadcast::channel(EVENT_BUFFER);
        sessions
            .handles
            .insert(session.mcp_handle.clone(), session.code.clone());
        sessions.insert(
            session.code.clone(),
            Entry {
                session,
                manifest: Arc::new(Manifest::default()),
                requests: HashMap::new(),
                pending: BTreeMap::new(),
                next_seq: 1,
                events,
            },
        );
        Ok(true)
    }

    async fn session(&self, code: &SessionCode) -> Result<Option<SessionRecord>, StoreError> {
        Ok(self.with_live(code, |entry| entry.session.clone()))
    }

    async fn session_by_handle(&self, handle: &str) -> Result<Option<SessionCode>, StoreError> {
        let code = self.lock().handles.get(handle).cloned();
        let Some(code) = code else { return Ok(None) };
        let owns = self.with_live(&code, |entry| entry.session.mcp_handle == handle);
        Ok(owns.unwrap_or(false).then_some(code))
    }

    async fn touch_session(
        &self,
        code: &SessionCode,
        now: Timestamp,
        until: Timestamp,
        seen: Option<&str>,
    ) -> Result<Option<SessionRecord>, StoreError> {
        Ok(self.with_live(code, |entry| {
            let session = &mut entry.session;
            if let Some(seen) = seen {
                match session.provider.as_mut() {
                    Some(provider) if provider.connection_id == seen => provider.last_seen = now,
                    _ => return session.clone(),
                }
            }
            let until = until.min(session.max_expires_at);
            session.expires_at = session.expires_at.max(until);
            session.clone()
        }))
    }

    async fn delete_session(&self, code: &SessionCode) -> Result<bool, StoreError> {
        let removed = self.lock().remove(code);
        Ok(match removed {
            Some(entry) => {
                entry.announce(SessionEvent::SessionEnded);
                true
            }
            None => false,
        })
    }

    async fn set_provider(
        &self,
        code: &SessionCode,
        provider: ProviderInfo,
    ) -> Result<Option<SessionRecord>, StoreError> {
        Ok(self.with_live(code, |entry| {
            let connection_id = provider.connection_id.clone();
            entry.session.provider = Some(provider);
            entry.announce(SessionEvent::ProviderChanged(connection_id));
            entry.session.clone()
        }))
    }

    async fn clear_provider(
        &self,
        code: &SessionCode,
        connection_id: &str,
    ) -> Result<(), StoreError> {
        self.with_live(code, |entry| {
            let current = entry.session.provider.as_ref();
            if current.is_some_and(|provider| provider.connection_id == connection_id) {
                entry.session.provider = None;
            }
        });
        Ok(())
    }

    async fn set_manifest(
        &self,
        code: &SessionCode,
        manifest: Arc<Manifest>,
    ) -> Result<Option<u64>, StoreError> {
        Ok(self.with_live(code, |entry| {
            entry.manifest = manifest;
            entry.session.manifest_revision += 1;
            entry.announce(SessionEvent::ManifestChanged);
            entry.session.manifest_revision
        }))
    }

    async fn manifest(&self, code: &SessionCode) -> Result<Option<Arc<Manifest>>, StoreError> {
        Ok(self.with_live(code, |entry| Arc::clone(&entry.manifest)))
    }

    async fn enqueue(
        &self,
        code: &SessionCode,
        request: NewRequest,
        max_pending: usize,
    ) -> Result<Enqueued, StoreError> {
        let outcome = self.with_live(code, |entry| {
            if let Some(existing) = entry.requests.get(&request.id) {
                return if existing.same_call(&request) {
                    Enqueued::Existing(existing.clone())
                } else {
                    Enqueued::Conflict
                };
            }
            // Overdue calls were expired on entry, so every pending call still counts.
            if entry.pending.len() >= max_pending {
                return Enqueued::Full;
            }
            let seq = entry.next_seq;
            entry.next_seq += 1;
            let record = RequestRecord::queued(request, seq);
            entry.pending.insert(seq, record.id.clone());
            entry.requests.insert(record.id.clone(), record.clone());
            entry.announce(SessionEvent::RequestQueued);
            Enqueued::Queued(record)
        });
        Ok(outcome.unwrap_or(Enqueued::NoSession))
    }

    async fn request(
        &self,
        code: &SessionCode,
        id: &str,
    ) -> Result<Option<RequestRecord>, StoreError> {
        Ok(self
            .with_live(code, |entry| entry.requests.get(id).cloned())
            .flatten())
    }

    async fn responses(&self, code: &SessionCode) -> Result<Option<Vec<ToolResponse>>, StoreError> {
        Ok(self.with_live(code, |entry| {
            let mut finished: Vec<&RequestRecord> = entry
                .requests
                .values()
                .filter(|request| request.response.is_some())
                .collect();
            finished.sort_by_key(|request| request.seq);
            finished
                .into_iter()
                .filter_map(|request| request.response.clone())
                .collect()
        }))
    }

    async fn pending_count(&self, code: &SessionCode) -> Result<Option<usize>, StoreError> {
        Ok(self.with_live(code, |entry| entry.pending.len()))
    }

    async fn claim(
        &self,
        code: &SessionCode,
        claim: &Claim,
    ) -> Result<Vec<RequestRecord>, StoreError> {
        let claimed = self.with_live(code, |entry| {
            let is_provider = entry
                .session
                .provider
                .as_ref()
                .is_some_and(|provider| provider.connection_id == claim.connection_id);
            if !is_provider {
                return Vec::new();
            }
            let mut claimed = Vec::new();
            for id in entry.pending.values() {
                if claimed.len() >= claim.limit {
                    break;
                }
                let Some(request) = entry.requests.get_mut(id) else {
                    continue;
                };
                if request.is_claimable(claim) {
                    request.status = RequestStatus::Delivered;
                    request.delivered_to = Some(claim.connection_id.clone());
                    request.lease_until = Some(claim.lease_until);
                    request.deliveries += 1;
                    claimed.push(request.clone());
                }
            }
            claimed
        });
        Ok(claimed.unwrap_or_default())
    }

    async fn finish(
        &self,
        code: &SessionCode,
        id: &str,
        status: RequestStatus,
        response: ToolResponse,
        now: Timestamp,
    ) -> Result<Finished, StoreError> {
        let outcome = self.with_live(code, |entry| {
            let Some(request) = entry.requests.get_mut(id) else {
                return Finished::NoRequest;
            };
            if request.status.is_terminal() {
                return Finished::AlreadyFinished(request.clone());
            }
            request.status = status;
            request.response = Some(response);
            request.finished_at = Some(now);
            request.lease_until = None;
            let record = request.clone();
            entry.pending.remove(&record.seq);
            entry.announce(SessionEvent::ResponseReady(record.id.clone()));
            Finished::Finished(record)
        });
        Ok(outcome.unwrap_or(Finished::NoSession))
    }

    async fn subscribe(&self, code: &SessionCode) -> Result<Option<EventStream>, StoreError> {
        Ok(self.with_live(code, |entry| {
            let events = BroadcastStream::new(entry.events.subscribe())
                .map(|event| event.unwrap_or(SessionEvent::Missed));
            Box::pin(events) as EventStream
        }))
    }

    async fn ping(&self) -> Result<(), StoreError> {
        Ok(())
    }

    async fn put_ticket(
        &self,
        scope: &str,
        id: &str,
        value: Arc<Value>,
        expires_at: Timestamp,
    ) -> Result<(), StoreError> {
        let json: Arc<str> = serde_json::to_string(&*value)
            .map_err(|error| StoreError(format!("a claim check is not JSON: {error}")))?
            .into();
        let mut tables = self.lock();
        // A scope keeps its newest tickets only, and all scopes share a byte budget.
        while tables.tickets.get(scope).map_or(0, HashMap::len) >= MAX_TICKETS_PER_SCOPE {
            tables.evict_from(scope);
        }
        while tables.ticket_bytes + json.len() > self.ticket_budget && tables.evict_any() {}
        tables.ticket_bytes += json.len();
        let previous = tables
            .tickets
            .entry(scope.to_owned())
            .or_default()
            .insert(id.to_owned(), Ticket { json, expires_at });
        if let Some(previous) = previous {
            tables.ticket_bytes -= previous.json.len();
        }
        Ok(())
    }

    async fn ticket(&self, scope: &str, id: &str) -> Result<Option<Arc<Value>>, StoreError> {
        let now = self.clock.now();
        let tables = self.lock();
        let Some(json) = tables
            .tickets
            .get(scope)
            .and_then(|mine| mine.get(id))
            .filter(|ticket| ticket.expires_at > now)
            .map(|ticket| Arc::clone(&ticket.json))
        else {
            return Ok(None);
        };
        drop(tables);
        // Parsed outside the lock: a large model must not hold up every session.
        serde_json::from_str(&json)
            .map(|value| Some(Arc::new(value)))
            .map_err(|error| StoreError(format!("a claim check is unreadable: {error}")))
    }
}
