//! The in-memory [`Store`](super::Store): one process, nothing shared, nothing kept across
//! restarts.
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

mod budgets;
mod calls;
mod finished;
mod manifests;
mod mcp;
mod sessions;
#[cfg(test)]
mod tests;
mod tickets;

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use async_trait::async_trait;

use super::Reachable;
use super::rules::{ANSWER_SESSION_SHARE, share_of};
use crate::clock::{Clock, Timestamp};
use crate::code::SessionCode;
use crate::error::StoreError;
use crate::locked;
use crate::metrics::Metrics;
use calls::Entry;
use manifests::Manifests;
use mcp::McpSessions;
use tickets::Ticket;

pub(in crate::store) use tickets::{pack_ticket, unpack_ticket};

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
pub(in crate::store) const TICKET_OVERHEAD: usize = 96;

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
    /// Rate budgets: each key's arrival time (µs, see [`super::RateBudget`]). Apart from the
    /// tables, so a rate check never waits for the sessions' lock.
    rates: Mutex<HashMap<String, i64>>,
    /// Locks: key → (holder, until).
    locks: Mutex<HashMap<String, (String, Timestamp)>>,
    /// Sets of live things under a global ceiling, by name.
    places: Mutex<HashMap<String, budgets::Places>>,
    /// MCP client sessions' places, states and when they expire.
    mcp_sessions: Mutex<McpSessions>,
}

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
    /// The manifests sessions hold, one copy of each.
    manifests: Manifests,
    /// The relay replicas sharing the store, and until when each counts as alive.
    replicas: HashMap<String, Timestamp>,
}

/// What is due when, across sessions. Entries of a session that is gone, or of a call that
/// changed since, are stale: whoever takes them checks, and skips them.
#[derive(Default)]
struct Indexes {
    /// When each session expires (exact: kept in step with the sessions).
    expiries: BTreeSet<(Timestamp, SessionCode)>,
    /// Deadlines of unanswered calls: (deadline, session, queue position).
    deadlines: BTreeSet<(Timestamp, SessionCode, u64)>,
    /// Finished calls in the order they finished: forgotten after the retention time, and
    /// their answers evicted oldest first past the budget.
    /// Each is (when it finished, its session's own code, its number there): the code's `Arc`
    /// is the session's, so a later session under the same code does not pass for it.
    finished: VecDeque<(Timestamp, Arc<SessionCode>, u64)>,
    /// How many calls at the front of `finished` the budget has passed (their answers are
    /// evicted, or were gone already).
    evicted: usize,
    /// What the answers kept cost together.
    answer_bytes: usize,
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
            places: Mutex::new(HashMap::new()),
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
        self.with_live_sharing(code, |entry, index, _| f(entry, index))
    }

    /// [`MemoryStore::with_live`], with the manifests sessions share.
    fn with_live_sharing<R>(
        &self,
        code: &SessionCode,
        f: impl FnOnce(&mut Entry, &mut Indexes, &mut Manifests) -> R,
    ) -> Option<R> {
        let now = self.clock.now();
        let mut tables = self.lock();
        if tables.sessions.get(code)?.session.expires_at <= now {
            tables.remove_session(code);
            self.metrics.sessions_expired(1);
            return None;
        }
        tables.forget_retired(now, self.limits.retention);
        let Tables {
            sessions,
            index,
            manifests,
            ..
        } = &mut *tables;
        let entry = sessions.get_mut(code)?;
        self.metrics
            .calls_expired(entry.expire_due(code, index, now));
        let result = f(entry, index, manifests);
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
        looked_at += tables.forget_retired(now, self.limits.retention);
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
impl Reachable for MemoryStore {
    async fn ping(&self) -> Result<(), StoreError> {
        Ok(())
    }
}

impl Tables {
    /// Forgets the finished calls kept past `retention`, oldest first; returns how many it
    /// looked at. Readers run it too, so a call is gone at the end of its retention time
    /// whenever the sweep comes.
    fn forget_retired(&mut self, now: Timestamp, retention: Duration) -> usize {
        let mut looked_at = 0;
        while let Some((finished_at, code, number)) = self.index.finished.front().cloned() {
            looked_at += 1;
            if now.since(finished_at) < retention {
                break;
            }
            self.index.finished.pop_front();
            self.index.evicted = self.index.evicted.saturating_sub(1);
            if let Some(entry) = self.sessions.get_mut(code.as_ref())
                && entry.has_finished(&code, number)
            {
                entry.forget(&mut self.index, number);
            }
        }
        looked_at
    }
}
