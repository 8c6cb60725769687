//! The in-memory [`Store`]: one process, nothing shared, nothing kept across restarts.
//!
//! All state sits behind one `std::sync::Mutex`: every operation is a few map look-ups with no
//! `.await` inside, so a blocking lock is cheaper than an async one and cannot be held across a
//! suspension point.
//!
//! Time-driven work costs in proportion to what is due, never to what is stored: sessions,
//! call deadlines, finished calls and claim checks each sit in an index ordered by when they
//! are due ([`Indexes`]), and the sweeper (every second) and each access take only what is due
//! from its front. Answers kept count against a byte budget, oldest first out: an evicted
//! answer leaves its call's record (id, call hash, final status) for the rest of the hour, so
//! a repeated request id is still never run twice.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use std::io::{BufReader, BufWriter, Write};

use async_trait::async_trait;
use flate2::Compression;
use flate2::read::DeflateDecoder;
use flate2::write::DeflateEncoder;
use serde_json::Value;
use toolrelay::wire::{RequestStatus, ToolResponse};

use super::events::SessionChannel;
use super::rules::{self, ANSWER_SESSION_SHARE, MAX_FINISHED_PER_SESSION, share_of};
use super::{
    Answerer, BUILTIN_CONNECTION, Claim, EnqueueChecks, Enqueued, EventStream, Finished,
    McpSessionCaps, McpSessionsFull, NewRequest, ProviderInfo, RateBudget, RequestRecord,
    SessionEvent, SessionRecord, Store, StoreUsage,
};
use crate::clock::{Clock, Timestamp};
use crate::code::SessionCode;
use crate::error::StoreError;
use crate::metrics::Metrics;

/// How often the sweeper runs.
const SWEEP_INTERVAL: Duration = Duration::from_secs(1);
/// Claim checks kept per scope at most (the ones expiring first go first).
pub const MAX_TICKETS_PER_SCOPE: usize = 200;
/// Bytes of claim checks kept in all at most, by default (the ones expiring first go first):
/// scopes are the callers' to choose, so the per-scope limit alone bounds nothing. What counts
/// is what a ticket really holds in memory: its compressed JSON, its keys and a fixed overhead.
pub const TICKET_BUDGET: usize = 256 * 1024 * 1024;
/// Bytes of finished calls' answers kept in all at most, by default (the oldest go first).
pub const ANSWER_BUDGET: usize = 64 * 1024 * 1024;
/// What a ticket costs besides its compressed JSON and its keys: the map entry, the `Arc`
/// header, the expiry.
pub(super) const TICKET_OVERHEAD: usize = 96;

/// How much the store keeps.
#[derive(Debug, Clone, Copy)]
pub struct StoreLimits {
    /// How long finished calls are kept.
    pub retention: Duration,
    /// Bytes of answers kept at most ([`ANSWER_BUDGET`] by default).
    pub answer_budget: usize,
    /// Bytes of answers one session keeps at most (an eighth of [`ANSWER_BUDGET`] by
    /// default, [`ANSWER_SESSION_SHARE`]); past it, its own oldest answers go first.
    pub session_answer_budget: usize,
    /// Bytes of claim checks kept at most ([`TICKET_BUDGET`] by default).
    pub ticket_budget: usize,
}

impl StoreLimits {
    /// The default budgets, keeping finished calls for `retention`.
    pub fn keeping(retention: Duration) -> Self {
        Self {
            retention,
            answer_budget: ANSWER_BUDGET,
            session_answer_budget: share_of(ANSWER_BUDGET, ANSWER_SESSION_SHARE),
            ticket_budget: TICKET_BUDGET,
        }
    }
}

/// Sessions and calls in this process's memory.
pub struct MemoryStore {
    clock: Clock,
    limits: StoreLimits,
    /// Where expired sessions and calls are counted.
    metrics: Metrics,
    tables: Mutex<Tables>,
    /// Rate budgets: each key's arrival time (µs, see [`RateBudget`]). Apart from the tables,
    /// so a rate check never waits for the sessions' lock.
    rates: Mutex<HashMap<String, i64>>,
    /// Locks: key → (holder, until).
    locks: Mutex<HashMap<String, (String, Timestamp)>>,
    /// MCP client sessions' places, states and when they expire.
    mcp_sessions: Mutex<McpSessions>,
}

/// MCP client sessions (and places opened for them), with a count per client address.
#[derive(Default)]
struct McpSessions {
    entries: HashMap<String, McpEntry>,
    per_address: HashMap<String, u32>,
}

struct McpEntry {
    address: String,
    /// None while the place awaits its session.
    state: Option<String>,
    expires_at: Timestamp,
}

impl McpSessions {
    fn remove(&mut self, id: &str) {
        if let Some(entry) = self.entries.remove(id) {
            self.uncount(&entry.address);
        }
    }

    fn uncount(&mut self, address: &str) {
        if let Some(count) = self.per_address.get_mut(address) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                self.per_address.remove(address);
            }
        }
    }

    fn insert(&mut self, id: String, entry: McpEntry) {
        self.remove(&id);
        *self.per_address.entry(entry.address.clone()).or_default() += 1;
        self.entries.insert(id, entry);
    }

    /// Forgets every expired entry (O(n): only when a cap looks reached).
    fn sweep(&mut self, now: Timestamp) {
        self.entries.retain(|_, entry| entry.expires_at > now);
        self.per_address.clear();
        for entry in self.entries.values() {
            *self.per_address.entry(entry.address.clone()).or_default() += 1;
        }
    }

    fn full(&self, address: &str, caps: McpSessionCaps) -> Option<McpSessionsFull> {
        if self.per_address.get(address).copied().unwrap_or(0) >= caps.per_address {
            Some(McpSessionsFull::PerAddress)
        } else if self.entries.len() >= caps.total as usize {
            Some(McpSessionsFull::Total)
        } else {
            None
        }
    }
}

/// Rate budgets that have refilled are forgotten once this many keys are kept.
const RATES_PRUNE_AT: usize = 10_000;

/// Everything the store holds, under one lock.
#[derive(Default)]
struct Tables {
    sessions: HashMap<SessionCode, Entry>,
    /// MCP handle → session code.
    handles: HashMap<String, SessionCode>,
    index: Indexes,
    /// Claim checks by scope, then id.
    tickets: HashMap<String, HashMap<String, Ticket>>,
    /// When each claim check expires: (expires_at, scope, id).
    ticket_expiries: BTreeSet<(Timestamp, String, String)>,
    /// Their total cost ([`Ticket::cost`]).
    ticket_bytes: usize,
}

/// What is due when, across sessions. Entries of a session that is gone, or of a call that
/// changed since, are stale: whoever takes them checks, and skips them.
#[derive(Default)]
struct Indexes {
    /// When each session expires (exact: kept in step with the sessions).
    expiries: BTreeSet<(Timestamp, SessionCode)>,
    /// Deadlines of unanswered calls: (deadline, session, queue position).
    deadlines: BTreeSet<(Timestamp, SessionCode, u64)>,
    /// Finished calls in the order they finished: forgotten after the retention time.
    finished: VecDeque<(Timestamp, SessionCode, String)>,
    /// Answers kept, oldest first: evicted past the budget.
    answers: VecDeque<(SessionCode, String)>,
    /// Their total cost.
    answer_bytes: usize,
    /// Unfinished calls, in every session.
    unanswered: usize,
}

/// A claim check, kept as DEFLATE-compressed JSON: a model's JSON repeats its field names for
/// every variable and shrinks ~15 times, and what is kept is what is counted.
struct Ticket {
    packed: Arc<[u8]>,
    /// Its size in the byte budget.
    cost: usize,
    expires_at: Timestamp,
}

impl Ticket {
    fn pack(value: &Value, keys: usize, expires_at: Timestamp) -> Result<Self, StoreError> {
        let packed: Arc<[u8]> = pack_ticket(value)?.into();
        Ok(Self {
            cost: packed.len() + keys + TICKET_OVERHEAD,
            packed,
            expires_at,
        })
    }
}

/// Compresses a claim check's value, written straight into the compressor so that the JSON
/// text of a big model never exists whole (a fast level: a 7.5 MB model takes ~30 ms).
pub(super) fn pack_ticket(value: &Value) -> Result<Vec<u8>, StoreError> {
    let failed =
        |error: std::io::Error| StoreError(format!("a claim check cannot be kept: {error}"));
    let mut writer = BufWriter::with_capacity(
        64 * 1024,
        DeflateEncoder::new(Vec::new(), Compression::fast()),
    );
    serde_json::to_writer(&mut writer, value)
        .map_err(|error| StoreError(format!("a claim check is not JSON: {error}")))?;
    writer.flush().map_err(failed)?;
    let encoder = writer
        .into_inner()
        .map_err(|error| failed(error.into_error()))?;
    encoder.finish().map_err(failed)
}

/// A claim check's value back, decompressed as it is parsed.
pub(super) fn unpack_ticket(packed: &[u8]) -> Result<Value, StoreError> {
    serde_json::from_reader(BufReader::with_capacity(
        64 * 1024,
        DeflateDecoder::new(packed),
    ))
    .map_err(|error| StoreError(format!("a claim check is unreadable: {error}")))
}

struct Entry {
    session: SessionRecord,
    /// The manifest's JSON, once one is registered.
    manifest: Option<String>,
    requests: HashMap<String, RequestRecord>,
    /// Unfinished calls by queue position, so claims need not scan finished ones.
    pending: BTreeMap<u64, String>,
    /// Their deadlines, soonest first: (deadline, queue position).
    deadlines: BTreeSet<(Timestamp, u64)>,
    /// Finished calls, oldest first, for the per-session cap.
    finished: VecDeque<String>,
    /// What each kept answer costs against the budgets, and its place in `kept`.
    answer_costs: HashMap<String, (usize, u64)>,
    /// The kept answers by when they were kept, oldest first: the session's own share of
    /// the answer budget evicts from the front.
    kept: BTreeMap<u64, String>,
    /// What the kept answers cost together.
    answer_bytes: usize,
    /// The place in `kept` of the next answer.
    next_kept: u64,
    next_seq: u64,
    /// Who listens on this session.
    listeners: Arc<SessionChannel>,
}

impl Entry {
    /// Queues a call (`record`, made by [`RequestRecord::queued`] outside the store's lock,
    /// its queue position still to be given) unless its id is taken or the queue is full
    /// (see [`Store::enqueue`]).
    fn enqueue(
        &mut self,
        code: &SessionCode,
        index: &mut Indexes,
        mut record: RequestRecord,
        max_pending: usize,
        until: Timestamp,
    ) -> Enqueued {
        if let Some(existing) = self.requests.get(&record.id) {
            return if existing.call_hash == record.call_hash {
                Enqueued::Existing(existing.clone())
            } else {
                Enqueued::Conflict
            };
        }
        // Overdue calls were expired on entry, so every pending call still counts.
        if self.pending.len() >= max_pending {
            return Enqueued::Full;
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        record.seq = seq;
        self.pending.insert(seq, record.id.clone());
        index.unanswered += 1;
        self.deadlines.insert((record.deadline, seq));
        index.deadlines.insert((record.deadline, code.clone(), seq));
        self.requests.insert(record.id.clone(), record.clone());
        self.slide(code, index, until);
        self.announce(SessionEvent::RequestQueued);
        Enqueued::Queued(record)
    }

    /// Slides the expiry to `until` (never backwards, never past the maximum lifetime).
    fn slide(&mut self, code: &SessionCode, index: &mut Indexes, until: Timestamp) {
        let session = &mut self.session;
        let until = until.min(session.max_expires_at);
        if until > session.expires_at {
            index.expiries.remove(&(session.expires_at, code.clone()));
            index.expiries.insert((until, code.clone()));
            session.expires_at = until;
        }
    }

    fn announce(&self, event: SessionEvent) {
        self.listeners.announce(event);
    }

    /// Gives a pending call its final answer and files it under the finished ones; the caller
    /// then enforces the budget. Its arguments are dropped: its hash still identifies it.
    fn finish(
        &mut self,
        code: &SessionCode,
        index: &mut Indexes,
        id: &str,
        status: RequestStatus,
        response: ToolResponse,
        now: Timestamp,
    ) -> Option<RequestRecord> {
        let request = self.requests.get_mut(id)?;
        let cost = rules::answer_cost(&response);
        request.status = status;
        request.response = Some(response);
        request.finished_at = Some(now);
        request.lease_until = None;
        request.args = Value::Null;
        let (seq, deadline) = (request.seq, request.deadline);
        let record = request.clone();
        if self.pending.remove(&seq).is_some() {
            index.unanswered -= 1;
        }
        self.deadlines.remove(&(deadline, seq));
        index.deadlines.remove(&(deadline, code.clone(), seq));
        index.finished.push_back((now, code.clone(), id.to_owned()));
        index.answers.push_back((code.clone(), id.to_owned()));
        index.answer_bytes += cost;
        self.answer_costs
            .insert(id.to_owned(), (cost, self.next_kept));
        self.kept.insert(self.next_kept, id.to_owned());
        self.next_kept += 1;
        self.answer_bytes += cost;
        self.finished.push_back(id.to_owned());
        while self.finished.len() > MAX_FINISHED_PER_SESSION {
            if let Some(oldest) = self.finished.pop_front() {
                self.forget(index, &oldest);
            }
        }
        // The waiting caller gets the finished call with its wake-up, and need not read it.
        let announced = self
            .listeners
            .waiting_for(id)
            .then(|| Box::new(record.clone()));
        self.announce(SessionEvent::ResponseReady {
            id: id.to_owned(),
            record: announced,
        });
        Some(record)
    }

    /// Expires the unanswered calls past their deadline, waking their waiters; returns how
    /// many it expired.
    fn expire_due(&mut self, code: &SessionCode, index: &mut Indexes, now: Timestamp) -> u64 {
        let mut expired = 0;
        while let Some(&(deadline, seq)) = self.deadlines.first() {
            if deadline > now {
                return expired;
            }
            self.deadlines.pop_first();
            let Some(id) = self.pending.get(&seq).cloned() else {
                continue;
            };
            let Some(request) = self.requests.get(&id) else {
                continue;
            };
            let response = request.expired_response();
            self.finish(code, index, &id, RequestStatus::Expired, response, now);
            expired += 1;
        }
        expired
    }

    /// Drops a finished call's answer, keeping its record; false when it had none kept.
    fn evict(&mut self, index: &mut Indexes, id: &str) -> bool {
        let Some((cost, place)) = self.answer_costs.remove(id) else {
            return false;
        };
        self.kept.remove(&place);
        self.answer_bytes -= cost;
        index.answer_bytes -= cost;
        if let Some(request) = self.requests.get_mut(id) {
            request.response = None;
            request.evicted = true;
        }
        true
    }

    /// Evicts the session's oldest answers until those it keeps fit `budget` (its share).
    fn keep_within(&mut self, index: &mut Indexes, budget: usize) {
        while self.answer_bytes > budget {
            let Some((_, oldest)) = self.kept.first_key_value() else {
                return;
            };
            let oldest = oldest.clone();
            self.evict(index, &oldest);
        }
    }

    /// Forgets a finished call altogether.
    fn forget(&mut self, index: &mut Indexes, id: &str) {
        self.evict(index, id);
        self.requests.remove(id);
    }
}

impl Tables {
    /// Removes a session and what it costs; announces its end.
    fn remove_session(&mut self, code: &SessionCode) -> bool {
        let Some(entry) = self.sessions.remove(code) else {
            return false;
        };
        self.index
            .expiries
            .remove(&(entry.session.expires_at, code.clone()));
        if self.handles.get(&entry.session.mcp_handle) == Some(code) {
            self.handles.remove(&entry.session.mcp_handle);
        }
        self.index.answer_bytes -= entry.answer_bytes;
        self.index.unanswered -= entry.pending.len();
        entry.announce(SessionEvent::SessionEnded);
        true
    }

    /// Evicts the oldest answers until those kept fit `budget`.
    fn keep_within(&mut self, budget: usize) {
        while self.index.answer_bytes > budget {
            let Some((code, id)) = self.index.answers.pop_front() else {
                return;
            };
            if let Some(entry) = self.sessions.get_mut(&code) {
                entry.evict(&mut self.index, &id);
            }
        }
    }

    /// Drops the ticket of `scope` expiring first; false when there is none.
    fn evict_from(&mut self, scope: &str) -> bool {
        let Some(mine) = self.tickets.get(scope) else {
            return false;
        };
        let Some((expires_at, id)) = mine
            .iter()
            .min_by_key(|(_, ticket)| ticket.expires_at)
            .map(|(id, ticket)| (ticket.expires_at, id.clone()))
        else {
            return false;
        };
        self.remove_ticket(expires_at, scope, &id);
        true
    }

    /// Drops the ticket expiring first of any scope; false when there is none.
    fn evict_any(&mut self) -> bool {
        match self.ticket_expiries.first().cloned() {
            Some((expires_at, scope, id)) => {
                self.remove_ticket(expires_at, &scope, &id);
                true
            }
            None => false,
        }
    }

    fn remove_ticket(&mut self, expires_at: Timestamp, scope: &str, id: &str) {
        self.ticket_expiries
            .remove(&(expires_at, scope.to_owned(), id.to_owned()));
        let Some(mine) = self.tickets.get_mut(scope) else {
            return;
        };
        if let Some(ticket) = mine.remove(id) {
            self.ticket_bytes -= ticket.cost;
        }
        if mine.is_empty() {
            self.tickets.remove(scope);
        }
    }
}

impl MemoryStore {
    /// A store keeping finished calls for `retention` within the default budgets, with its
    /// sweeper running on the current tokio runtime until the store is dropped.
    pub fn new(clock: Clock, retention: Duration) -> Arc<Self> {
        Self::with_limits(clock, StoreLimits::keeping(retention))
    }

    /// [`MemoryStore::new`] keeping at most `ticket_budget` bytes of claim checks.
    pub fn with_ticket_budget(
        clock: Clock,
        retention: Duration,
        ticket_budget: usize,
    ) -> Arc<Self> {
        Self::with_limits(
            clock,
            StoreLimits {
                ticket_budget,
                ..StoreLimits::keeping(retention)
            },
        )
    }

    /// A store within these limits, whose expirations nobody counts.
    pub fn with_limits(clock: Clock, limits: StoreLimits) -> Arc<Self> {
        Self::observed(clock, limits, Metrics::default())
    }

    /// A store within these limits, counting the sessions and calls it expires into
    /// `metrics`.
    pub fn observed(clock: Clock, limits: StoreLimits, metrics: Metrics) -> Arc<Self> {
        let store = Arc::new(Self {
            clock,
            limits,
            metrics,
            tables: Mutex::new(Tables::default()),
            rates: Mutex::new(HashMap::new()),
            locks: Mutex::new(HashMap::new()),
            mcp_sessions: Mutex::new(McpSessions::default()),
        });
        tokio::spawn(sweep(Arc::downgrade(&store)));
        store
    }

    /// What the claim checks kept now cost, in bytes (what the budget bounds).
    pub fn ticket_bytes(&self) -> usize {
        self.lock().ticket_bytes
    }

    /// What the answers kept now cost, in bytes (what the answer budget bounds).
    pub fn answer_bytes(&self) -> usize {
        self.lock().index.answer_bytes
    }

    fn lock(&self) -> MutexGuard<'_, Tables> {
        // A panic while holding the lock cannot leave an entry half-written (each operation
        // writes whole values), so the data is still sound after poisoning.
        self.tables
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Runs `f` on the live entry of `code` after expiring its overdue calls, dropping the
    /// entry if the session has expired; then keeps the answers within their budget.
    fn with_live<R>(
        &self,
        code: &SessionCode,
        f: impl FnOnce(&mut Entry, &mut Indexes) -> R,
    ) -> Option<R> {
        let now = self.clock.now();
        let mut tables = self.lock();
        if tables.sessions.get(code)?.session.expires_at <= now {
            tables.remove_session(code);
            self.metrics.sessions_expired(1);
            return None;
        }
        let Tables {
            sessions, index, ..
        } = &mut *tables;
        let entry = sessions.get_mut(code)?;
        self.metrics
            .calls_expired(entry.expire_due(code, index, now));
        let result = f(entry, index);
        entry.keep_within(index, self.limits.session_answer_budget);
        tables.keep_within(self.limits.answer_budget);
        Some(result)
    }

    /// Takes what is due from the front of each index; returns how many index entries it
    /// looked at (what the sweep cost).
    fn sweep_once(&self) -> usize {
        let now = self.clock.now();
        let mut tables = self.lock();
        let tables = &mut *tables;
        let mut looked_at = 0;
        while let Some((expires_at, code)) = tables.index.expiries.first().cloned() {
            looked_at += 1;
            if expires_at > now {
                break;
            }
            tables.index.expiries.pop_first();
            if tables.remove_session(&code) {
                self.metrics.sessions_expired(1);
            }
        }
        while let Some((deadline, code, _)) = tables.index.deadlines.first().cloned() {
            looked_at += 1;
            if deadline > now {
                break;
            }
            tables.index.deadlines.pop_first();
            if let Some(entry) = tables.sessions.get_mut(&code) {
                self.metrics
                    .calls_expired(entry.expire_due(&code, &mut tables.index, now));
            }
        }
        while let Some((finished_at, code, id)) = tables.index.finished.front().cloned() {
            looked_at += 1;
            if now.since(finished_at) < self.limits.retention {
                break;
            }
            tables.index.finished.pop_front();
            if let Some(entry) = tables.sessions.get_mut(&code) {
                let same = entry
                    .requests
                    .get(&id)
                    .is_some_and(|request| request.finished_at == Some(finished_at));
                if same {
                    // Calls are forgotten in the order they finished: usually the front.
                    if entry.finished.front() == Some(&id) {
                        entry.finished.pop_front();
                    } else {
                        entry.finished.retain(|finished| *finished != id);
                    }
                    entry.forget(&mut tables.index, &id);
                }
            }
        }
        while let Some((expires_at, scope, id)) = tables.ticket_expiries.first().cloned() {
            looked_at += 1;
            if expires_at > now {
                break;
            }
            tables.remove_ticket(expires_at, &scope, &id);
        }
        tables.keep_within(self.limits.answer_budget);
        looked_at
    }
}

async fn sweep(store: Weak<MemoryStore>) {
    let mut ticks = tokio::time::interval(SWEEP_INTERVAL);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        match store.upgrade() {
            Some(store) => {
                store.sweep_once();
            }
            None => return,
        }
    }
}

#[async_trait]
impl Store for MemoryStore {
    async fn insert_session(&self, session: SessionRecord) -> Result<bool, StoreError> {
        let now = self.clock.now();
        let mut tables = self.lock();
        if let Some(existing) = tables.sessions.get(&session.code) {
            if existing.session.expires_at > now {
                return Ok(false);
            }
            // Expired and not swept yet: gone for good now.
            tables.remove_session(&session.code);
            self.metrics.sessions_expired(1);
        }
        tables
            .handles
            .insert(session.mcp_handle.clone(), session.code.clone());
        tables
            .index
            .expiries
            .insert((session.expires_at, session.code.clone()));
        tables.sessions.insert(
            session.code.clone(),
            Entry {
                session,
                manifest: None,
                requests: HashMap::new(),
                pending: BTreeMap::new(),
                deadlines: BTreeSet::new(),
                finished: VecDeque::new(),
                answer_costs: HashMap::new(),
                kept: BTreeMap::new(),
                answer_bytes: 0,
                next_kept: 0,
                next_seq: 1,
                listeners: SessionChannel::new(),
            },
        );
        Ok(true)
    }

    async fn session(&self, code: &SessionCode) -> Result<Option<SessionRecord>, StoreError> {
        Ok(self.with_live(code, |entry, _| entry.session.clone()))
    }

    async fn session_by_handle(&self, handle: &str) -> Result<Option<SessionCode>, StoreError> {
        let code = self.lock().handles.get(handle).cloned();
        let Some(code) = code else { return Ok(None) };
        let owns = self.with_live(&code, |entry, _| entry.session.mcp_handle == handle);
        Ok(owns.unwrap_or(false).then_some(code))
    }

    async fn touch_session(
        &self,
        code: &SessionCode,
        now: Timestamp,
        until: Timestamp,
        seen: Option<&str>,
    ) -> Result<Option<SessionRecord>, StoreError> {
        Ok(self.with_live(code, |entry, index| {
            if let Some(seen) = seen {
                match entry.session.provider.as_mut() {
                    Some(provider) if provider.connection_id == seen => provider.last_seen = now,
                    _ => return entry.session.clone(),
                }
            }
            entry.slide(code, index, until);
            entry.session.clone()
        }))
    }

    async fn delete_session(&self, code: &SessionCode) -> Result<bool, StoreError> {
        Ok(self.lock().remove_session(code))
    }

    async fn set_provider(
        &self,
        code: &SessionCode,
        provider: ProviderInfo,
    ) -> Result<Option<SessionRecord>, StoreError> {
        Ok(self.with_live(code, |entry, _| {
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
        self.with_live(code, |entry, _| {
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
        json: String,
    ) -> Result<Option<u64>, StoreError> {
        Ok(self.with_live(code, |entry, _| {
            entry.manifest = Some(json);
            entry.session.manifest_revision += 1;
            entry.announce(SessionEvent::ManifestChanged);
            entry.session.manifest_revision
        }))
    }

    async fn manifest(
        &self,
        code: &SessionCode,
    ) -> Result<Option<(u64, Option<String>)>, StoreError> {
        Ok(self.with_live(code, |entry, _| {
            (entry.session.manifest_revision, entry.manifest.clone())
        }))
    }

    async fn enqueue_checked(
        &self,
        code: &SessionCode,
        request: &NewRequest,
        max_pending: usize,
        until: Timestamp,
        checks: EnqueueChecks,
    ) -> Result<(Enqueued, Option<SessionRecord>), StoreError> {
        if let Some(charge) = &checks.charge
            && let Some(wait) = self
                .spend(&charge.key, charge.budget, request.created_at)
                .await?
        {
            return Ok((Enqueued::RateLimited(wait), None));
        }
        // The record (its arguments copied, the call hashed) is made before the lock that
        // every session shares is taken.
        let record = RequestRecord::queued(request.clone(), 0);
        let outcome = self.with_live(code, |entry, index| {
            let stale = checks
                .manifest_revision
                .is_some_and(|revision| revision != entry.session.manifest_revision);
            let enqueued = if stale {
                Enqueued::StaleManifest
            } else {
                entry.enqueue(code, index, record, max_pending, until)
            };
            (enqueued, Some(entry.session.clone()))
        });
        Ok(outcome.unwrap_or((Enqueued::NoSession, None)))
    }

    async fn request(
        &self,
        code: &SessionCode,
        id: &str,
    ) -> Result<Option<RequestRecord>, StoreError> {
        Ok(self
            .with_live(code, |entry, _| entry.requests.get(id).cloned())
            .flatten())
    }
    async fn responses(&self, code: &SessionCode) -> Result<Option<Vec<ToolResponse>>, StoreError> {
        Ok(self.with_live(code, |entry, _| {
            let mut finished: Vec<&RequestRecord> = entry
                .finished
                .iter()
                .filter_map(|id| entry.requests.get(id))
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
        Ok(self.with_live(code, |entry, _| entry.pending.len()))
    }

    async fn lease_builtin(
        &self,
        code: &SessionCode,
        id: &str,
        holder: &str,
        now: Timestamp,
        until: Timestamp,
    ) -> Result<Option<RequestRecord>, StoreError> {
        let leased = self.with_live(code, |entry, _| {
            let request = entry.requests.get_mut(id)?;
            if !request.builtin || request.deadline <= now {
                return None;
            }
            let held_by = request.delivered_to.as_deref();
            let renewal = held_by == Some(holder);
            let unstarted = held_by == Some(BUILTIN_CONNECTION);
            let free = match request.status {
                RequestStatus::Queued => true,
                RequestStatus::Delivered => {
                    renewal || unstarted || request.lease_until.is_none_or(|lease| lease <= now)
                }
                _ => false,
            };
            if !free {
                return None;
            }
            request.status = RequestStatus::Delivered;
            request.delivered_to = Some(holder.to_owned());
            request.lease_until = Some(until);
            // A run after the first (counted when the call was queued) is a takeover.
            if !renewal && !unstarted {
                request.deliveries += 1;
            }
            Some(request.clone())
        });
        Ok(leased.flatten())
    }

    async fn claim(
        &self,
        code: &SessionCode,
        claim: &Claim,
    ) -> Result<Vec<RequestRecord>, StoreError> {
        let claimed = self.with_live(code, |entry, _| {
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
        answerer: Answerer<'_>,
        now: Timestamp,
        until: Timestamp,
    ) -> Result<Finished, StoreError> {
        let outcome = self.with_live(code, |entry, index| {
            let Some(request) = entry.requests.get(id) else {
                return Finished::NoRequest;
            };
            let provider = entry.session.provider.as_ref();
            let provider = provider.map(|provider| provider.connection_id.as_str());
            if !answerer.may_answer(request, provider) {
                return Finished::NotDelivered;
            }
            if request.status.is_terminal() {
                return Finished::AlreadyFinished(request.clone());
            }
            match entry.finish(code, index, id, status, response, now) {
                Some(record) => {
                    entry.slide(code, index, until);
                    Finished::Finished(record)
                }
                None => Finished::NoRequest,
            }
        });
        Ok(outcome.unwrap_or(Finished::NoSession))
    }

    async fn subscribe(&self, code: &SessionCode) -> Result<Option<EventStream>, StoreError> {
        Ok(self.with_live(code, |entry, _| entry.listeners.subscribe()))
    }

    async fn listen_for_answer(
        &self,
        code: &SessionCode,
        id: &str,
    ) -> Result<EventStream, StoreError> {
        Ok(self
            .with_live(code, |entry, _| entry.listeners.wait_for(id))
            .unwrap_or_else(|| Box::pin(futures::stream::empty())))
    }

    async fn ping(&self) -> Result<(), StoreError> {
        Ok(())
    }

    async fn open_mcp_session(
        &self,
        slot: &str,
        address: &str,
        caps: McpSessionCaps,
        expires_at: Timestamp,
    ) -> Result<Result<(), McpSessionsFull>, StoreError> {
        let mut sessions = locked(&self.mcp_sessions);
        if sessions.full(address, caps).is_some() {
            sessions.sweep(self.clock.now());
            if let Some(full) = sessions.full(address, caps) {
                return Ok(Err(full));
            }
        }
        sessions.insert(
            slot.to_owned(),
            McpEntry {
                address: address.to_owned(),
                state: None,
                expires_at,
            },
        );
        Ok(Ok(()))
    }

    async fn put_mcp_session(
        &self,
        id: &str,
        slot: &str,
        address: &str,
        state: String,
        expires_at: Timestamp,
    ) -> Result<(), StoreError> {
        let mut sessions = locked(&self.mcp_sessions);
        sessions.remove(slot);
        sessions.insert(
            id.to_owned(),
            McpEntry {
                address: address.to_owned(),
                state: Some(state),
                expires_at,
            },
        );
        Ok(())
    }

    async fn touch_mcp_session(&self, id: &str, expires_at: Timestamp) -> Result<bool, StoreError> {
        let now = self.clock.now();
        let mut sessions = locked(&self.mcp_sessions);
        match sessions.entries.get_mut(id) {
            Some(entry) if entry.expires_at > now && entry.state.is_some() => {
                entry.expires_at = expires_at;
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    async fn mcp_session(&self, id: &str) -> Result<Option<String>, StoreError> {
        let now = self.clock.now();
        Ok(locked(&self.mcp_sessions)
            .entries
            .get(id)
            .filter(|entry| entry.expires_at > now)
            .and_then(|entry| entry.state.clone()))
    }

    async fn delete_mcp_session(&self, id: &str) -> Result<(), StoreError> {
        locked(&self.mcp_sessions).remove(id);
        Ok(())
    }

    async fn lock(&self, key: &str, holder: &str, until: Timestamp) -> Result<bool, StoreError> {
        let now = self.clock.now();
        let mut locks = locked(&self.locks);
        if locks.len() >= RATES_PRUNE_AT && !locks.contains_key(key) {
            locks.retain(|_, (_, until)| *until > now);
        }
        match locks.get(key) {
            Some((other, until)) if other != holder && *until > now => Ok(false),
            _ => {
                locks.insert(key.to_owned(), (holder.to_owned(), until));
                Ok(true)
            }
        }
    }

    async fn unlock(&self, key: &str, holder: &str) -> Result<(), StoreError> {
        let mut locks = locked(&self.locks);
        if locks.get(key).is_some_and(|(other, _)| other == holder) {
            locks.remove(key);
        }
        Ok(())
    }

    async fn spend(
        &self,
        key: &str,
        budget: RateBudget,
        now: Timestamp,
    ) -> Result<Option<Duration>, StoreError> {
        let now = now.0.saturating_mul(1000);
        let mut rates = locked(&self.rates);
        if rates.len() >= RATES_PRUNE_AT && !rates.contains_key(key) {
            // A key whose arrival time has passed is as good as a new one.
            rates.retain(|_, tat| *tat > now);
        }
        let tat = rates.get(key).copied().unwrap_or(now);
        match budget.spend(tat, now) {
            Ok(next) => {
                rates.insert(key.to_owned(), next);
                Ok(None)
            }
            Err(wait) => Ok(Some(wait)),
        }
    }

    async fn usage(&self) -> Result<StoreUsage, StoreError> {
        // What is due goes first, so that expired sessions and calls do not count.
        self.sweep_once();
        let tables = self.lock();
        Ok(StoreUsage {
            answer_bytes: tables.index.answer_bytes,
            ticket_bytes: tables.ticket_bytes,
            sessions: tables.sessions.len(),
        })
    }

    async fn put_ticket(
        &self,
        scope: &str,
        id: &str,
        value: Arc<Value>,
        expires_at: Timestamp,
    ) -> Result<(), StoreError> {
        // Compressed before the lock is taken: a large model must not hold up every session.
        let ticket = Ticket::pack(&value, scope.len() + id.len(), expires_at)?;
        drop(value);
        let mut tables = self.lock();
        if let Some(previous) = tables
            .tickets
            .get(scope)
            .and_then(|mine| mine.get(id))
            .map(|ticket| ticket.expires_at)
        {
            tables.remove_ticket(previous, scope, id);
        }
        // A scope keeps its newest tickets only, and all scopes share a byte budget.
        while tables.tickets.get(scope).map_or(0, HashMap::len) >= MAX_TICKETS_PER_SCOPE {
            tables.evict_from(scope);
        }
        while tables.ticket_bytes + ticket.cost > self.limits.ticket_budget && tables.evict_any() {}
        tables.ticket_bytes += ticket.cost;
        tables
            .ticket_expiries
            .insert((expires_at, scope.to_owned(), id.to_owned()));
        tables
            .tickets
            .entry(scope.to_owned())
            .or_default()
            .insert(id.to_owned(), ticket);
        Ok(())
    }

    async fn ticket(&self, scope: &str, id: &str) -> Result<Option<Arc<Value>>, StoreError> {
        let now = self.clock.now();
        let tables = self.lock();
        let Some(packed) = tables
            .tickets
            .get(scope)
            .and_then(|mine| mine.get(id))
            .filter(|ticket| ticket.expires_at > now)
            .map(|ticket| Arc::clone(&ticket.packed))
        else {
            return Ok(None);
        };
        drop(tables);
        // Read outside the lock: a large model must not hold up every session.
        unpack_ticket(&packed).map(|value| Some(Arc::new(value)))
    }
}

fn locked<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // Each critical section writes whole values: the data is sound after a panic elsewhere.
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;
    use toolrelay::wire::ToolResponse;

    fn session(code: &str, now: Timestamp, ttl_ms: i64) -> SessionRecord {
        SessionRecord {
            code: SessionCode::parse(code).unwrap(),
            token_hash: String::new(),
            created_at: now,
            expires_at: Timestamp(now.0 + ttl_ms),
            max_expires_at: Timestamp(now.0 + 10 * ttl_ms),
            provider: None,
            manifest_revision: 0,
            mcp_handle: format!("handle-{code}"),
        }
    }

    fn call(id: &str, now: Timestamp, text: &str) -> NewRequest {
        NewRequest {
            id: id.into(),
            tool_id: Some("demo".into()),
            function_name: "echo".into(),
            args: serde_json::json!({"text": text}),
            created_at: now,
            deadline: Timestamp(now.0 + 60_000),
            builtin: false,
            correlation_id: None,
        }
    }

    fn answer(id: &str, bytes: usize) -> ToolResponse {
        ToolResponse {
            request_id: id.into(),
            success: true,
            result: Some(Value::String("x".repeat(bytes))),
            error: None,
        }
    }

    /// A code for a number, in the code alphabet.
    fn code_of(n: usize) -> String {
        let alphabet = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";
        (0..8)
            .map(|i| alphabet[(n >> (5 * i)) % 32] as char)
            .collect()
    }

    #[tokio::test(start_paused = true)]
    async fn the_sweep_costs_what_is_due_not_what_is_stored() {
        let clock = Clock::new();
        let store = MemoryStore::new(clock.clone(), Duration::from_secs(3600));
        let now = clock.now();
        // Many live sessions, each with a finished call and a pending one.
        for n in 0..2_000 {
            let record = session(&code_of(n), now, 600_000);
            let code = record.code.clone();
            assert!(store.insert_session(record).await.unwrap());
            store
                .enqueue(&code, call("done", now, "a"), 100, now)
                .await
                .unwrap();
            store
                .finish(
                    &code,
                    "done",
                    RequestStatus::Completed,
                    answer("done", 10),
                    Answerer::Relay,
                    now,
                    now,
                )
                .await
                .unwrap();
            store
                .enqueue(&code, call("waiting", now, "b"), 100, now)
                .await
                .unwrap();
        }
        // One session about to expire.
        store
            .insert_session(session("ZZZZZZZZ", now, 1_000))
            .await
            .unwrap();
        tokio::time::advance(Duration::from_secs(2)).await;
        let looked_at = store.sweep_once();
        assert!(looked_at <= 8, "the sweep looked at {looked_at} entries");
        let gone = SessionCode::parse("ZZZZZZZZ").unwrap();
        assert!(store.session(&gone).await.unwrap().is_none());
        let live = SessionCode::parse(&code_of(7)).unwrap();
        assert!(store.session(&live).await.unwrap().is_some());
    }

    #[tokio::test(start_paused = true)]
    async fn answers_stay_within_their_budget_and_evicted_calls_are_still_known() {
        const BUDGET: usize = 1024 * 1024;
        let clock = Clock::new();
        let store = MemoryStore::with_limits(
            clock.clone(),
            StoreLimits {
                answer_budget: BUDGET,
                session_answer_budget: BUDGET,
                ..StoreLimits::keeping(Duration::from_secs(3600))
            },
        );
        let now = clock.now();
        let code = SessionCode::parse("ABCD2345").unwrap();
        store
            .insert_session(session("ABCD2345", now, 600_000))
            .await
            .unwrap();
        // A stream of answers of 100 KB: the budget holds after every one.
        for n in 0..50 {
            let id = format!("r{n}");
            store
                .enqueue(&code, call(&id, now, "x"), 100, now)
                .await
                .unwrap();
            store
                .finish(
                    &code,
                    &id,
                    RequestStatus::Completed,
                    answer(&id, 100 * 1024),
                    Answerer::Relay,
                    now,
                    now,
                )
                .await
                .unwrap();
            assert!(
                store.answer_bytes() <= BUDGET,
                "{} after {n}",
                store.answer_bytes()
            );
        }
        assert!(store.answer_bytes() > BUDGET / 2, "the budget is used");
        // The oldest answers were evicted; their calls are known, with their final status.
        let oldest = store.request(&code, "r0").await.unwrap().unwrap();
        assert!(oldest.evicted && oldest.response.is_none());
        assert_eq!(oldest.status, RequestStatus::Completed);
        assert!(matches!(
            store.enqueue(&code, call("r0", now, "x"), 100, now).await.unwrap(),
            Enqueued::Existing(record) if record.evicted
        ));
        assert_eq!(
            store
                .enqueue(&code, call("r0", now, "other"), 100, now)
                .await
                .unwrap(),
            Enqueued::Conflict
        );
        let newest = store.request(&code, "r49").await.unwrap().unwrap();
        assert!(!newest.evicted && newest.response.is_some());
        let kept = store.responses(&code).await.unwrap().unwrap();
        assert!(kept.len() < 50 && kept.last().unwrap().request_id == "r49");
        // Ending the session gives its bytes back.
        store.delete_session(&code).await.unwrap();
        assert_eq!(store.answer_bytes(), 0);
    }
}
