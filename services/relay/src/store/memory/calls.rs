//! One session's calls and answers in memory, and what removing a session gives back.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};
use std::sync::Arc;

use serde_json::Value;
use toolrelay::wire::{RequestStatus, ToolResponse};

use super::finished::Done;
use super::{Indexes, Tables};
use crate::clock::Timestamp;
use crate::code::SessionCode;
use crate::store::events::SessionChannel;
use crate::store::rules::{self, MAX_FINISHED_PER_SESSION};
use crate::store::{Enqueued, RequestRecord, SessionEvent, SessionRecord};

/// A session and everything in it.
pub(super) struct Entry {
    pub(super) session: SessionRecord,
    /// Its code, shared by the indexes of its finished calls.
    pub(super) code: Arc<SessionCode>,
    /// The manifest's JSON, once one is registered: the copy every session registering the
    /// same manifest shares ([`super::Manifests`]).
    pub(super) manifest: Option<Arc<str>>,
    /// Unfinished calls by id.
    pub(super) requests: HashMap<String, RequestRecord>,
    /// Finished calls by id, kept small ([`Done`]).
    pub(super) done: HashMap<Arc<str>, Box<Done>>,
    /// The tool, function and connection names of its finished calls, one copy of each.
    pub(super) names: HashSet<Arc<str>>,
    /// Unfinished calls by queue position, so claims need not scan finished ones.
    pub(super) pending: BTreeMap<u64, String>,
    /// Their deadlines, soonest first: (deadline, queue position).
    pub(super) deadlines: BTreeSet<(Timestamp, u64)>,
    /// Finished calls, oldest first, for the per-session cap.
    pub(super) finished: VecDeque<Arc<str>>,
    /// The kept answers by when they were kept, oldest first: the session's own share of
    /// the answer budget evicts from the front.
    pub(super) kept: BTreeMap<u64, Arc<str>>,
    /// What the kept answers cost together.
    pub(super) answer_bytes: usize,
    /// The place in `kept` of the next answer.
    pub(super) next_kept: u64,
    pub(super) next_seq: u64,
    /// Who listens on this session.
    pub(super) listeners: Arc<SessionChannel>,
}

impl Entry {
    /// Queues a call (`record`, made by [`RequestRecord::queued`] outside the store's lock,
    /// its queue position still to be given) unless its id is taken or the queue is full
    /// (see [`crate::store::SessionStore::enqueue`]). A call for a connection the relay
    /// pushes calls to is handed to it at once ([`rules::hand_over`]).
    pub(super) fn enqueue(
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
        if let Some(done) = self.done.get(record.id.as_str()) {
            return if done.is_call(&record.call_hash) {
                Enqueued::Existing(done.record(&record.id))
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
        let handed_to = rules::hand_over(self.session.provider.as_ref(), record.builtin);
        let handed = handed_to.is_some();
        if let Some(connection) = handed_to.map(str::to_owned) {
            record.status = RequestStatus::Delivered;
            record.delivered_to = Some(connection);
            record.lease_until = Some(rules::pushed_lease(record.deadline));
            record.deliveries = 1;
        }
        self.pending.insert(seq, record.id.clone());
        self.deadlines.insert((record.deadline, seq));
        index.deadlines.insert((record.deadline, code.clone(), seq));
        self.requests.insert(record.id.clone(), record.clone());
        self.slide(code, index, record.created_at, until);
        self.announce(if handed {
            SessionEvent::CallHanded(Box::new(record.clone()))
        } else {
            SessionEvent::RequestQueued
        });
        Enqueued::Queued(record)
    }

    /// Slides the expiry to `until` for activity at `now`, by the rule ([`rules::slide`]).
    pub(super) fn slide(
        &mut self,
        code: &SessionCode,
        index: &mut Indexes,
        now: Timestamp,
        until: Timestamp,
    ) {
        let session = &mut self.session;
        if let Some(until) = rules::slide(session.expires_at, session.max_expires_at, now, until) {
            index.expiries.remove(&(session.expires_at, code.clone()));
            index.expiries.insert((until, code.clone()));
            session.expires_at = until;
        }
    }

    pub(super) fn announce(&self, event: SessionEvent) {
        self.listeners.announce(event);
    }

    /// The kept copy of a tool's, a function's or a connection's name.
    fn name(&mut self, name: &str) -> Arc<str> {
        if let Some(kept) = self.names.get(name) {
            return Arc::clone(kept);
        }
        let kept: Arc<str> = Arc::from(name);
        self.names.insert(Arc::clone(&kept));
        kept
    }

    /// The call `id`, unfinished or finished.
    pub(super) fn record(&self, id: &str) -> Option<RequestRecord> {
        match self.requests.get(id) {
            Some(record) => Some(record.clone()),
            None => self.done.get(id).map(|done| done.record(id)),
        }
    }

    /// Gives a pending call its final answer and files it under the finished ones, kept small
    /// ([`Done`]), at `cost` against the budgets ([`rules::answer_cost`], or
    /// [`rules::expired_cost`] for a call that expired); the caller then enforces the budget.
    /// Returns its whole record.
    #[allow(clippy::too_many_arguments)] // each is one part of the one step
    pub(super) fn finish(
        &mut self,
        code: &SessionCode,
        index: &mut Indexes,
        id: &str,
        status: RequestStatus,
        response: ToolResponse,
        cost: usize,
        now: Timestamp,
    ) -> Option<RequestRecord> {
        let mut record = self.requests.remove(id)?;
        let names = (
            record.tool_id.as_deref().map(|name| self.name(name)),
            self.name(&record.function_name),
            record.delivered_to.as_deref().map(|name| self.name(name)),
        );
        let done = Done::new(
            &record,
            names,
            status,
            response.clone(),
            now,
            cost,
            self.next_kept,
        );
        record.status = status;
        record.response = Some(response);
        record.finished_at = Some(now);
        record.lease_until = None;
        record.args = Value::Null;
        let (seq, deadline) = (record.seq, record.deadline);
        self.pending.remove(&seq);
        self.deadlines.remove(&(deadline, seq));
        index.deadlines.remove(&(deadline, code.clone(), seq));
        let id: Arc<str> = Arc::from(id);
        self.done.insert(Arc::clone(&id), Box::new(done));
        index
            .finished
            .push_back((now, Arc::clone(&self.code), Arc::clone(&id)));
        index.answer_bytes += cost;
        self.kept.insert(self.next_kept, Arc::clone(&id));
        self.next_kept += 1;
        self.answer_bytes += cost;
        self.finished.push_back(Arc::clone(&id));
        while self.finished.len() > MAX_FINISHED_PER_SESSION {
            if let Some(oldest) = self.finished.pop_front() {
                self.forget(index, &oldest);
            }
        }
        // The waiting caller gets the finished call with its wake-up, and need not read it.
        let announced = self
            .listeners
            .waiting_for(&id)
            .then(|| Box::new(record.clone()));
        self.announce(SessionEvent::ResponseReady {
            id: id.to_string(),
            record: announced,
        });
        Some(record)
    }

    /// Expires the unanswered calls past their deadline, waking their waiters; returns how
    /// many it expired.
    pub(super) fn expire_due(
        &mut self,
        code: &SessionCode,
        index: &mut Indexes,
        now: Timestamp,
    ) -> u64 {
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
            let cost = rules::expired_cost(&id);
            self.finish(
                code,
                index,
                &id,
                RequestStatus::Expired,
                response,
                cost,
                now,
            );
            expired += 1;
        }
        expired
    }

    /// Drops a finished call's answer, keeping its record, which costs
    /// [`rules::expired_cost`] from then on; false when it had none kept.
    pub(super) fn evict(&mut self, index: &mut Indexes, id: &str) -> bool {
        let Some(done) = self.done.get_mut(id).filter(|done| done.has_answer()) else {
            return false;
        };
        done.evict();
        self.kept.remove(&done.kept_at);
        let freed = done.cost.saturating_sub(rules::expired_cost(id));
        done.cost -= freed;
        self.answer_bytes -= freed;
        index.answer_bytes -= freed;
        true
    }

    /// Keeps what the session's finished calls cost within `budget` (its share): its oldest
    /// answers are evicted first, then, if that is not enough, its oldest finished calls are
    /// forgotten altogether (as the Redis store does).
    pub(super) fn keep_within(&mut self, index: &mut Indexes, budget: usize) {
        while self.answer_bytes > budget {
            if let Some((_, oldest)) = self.kept.first_key_value() {
                let oldest = oldest.clone();
                self.evict(index, &oldest);
            } else if let Some(oldest) = self.finished.pop_front() {
                self.forget(index, &oldest);
            } else {
                return;
            }
        }
    }

    /// Forgets a finished call altogether, and what it still costs.
    pub(super) fn forget(&mut self, index: &mut Indexes, id: &str) {
        if let Some(done) = self.done.remove(id) {
            if done.has_answer() {
                self.kept.remove(&done.kept_at);
            }
            self.answer_bytes -= done.cost;
            index.answer_bytes -= done.cost;
        }
    }
}

impl Tables {
    /// Removes a session and what it costs; announces its end.
    pub(super) fn remove_session(&mut self, code: &SessionCode) -> bool {
        let Some(mut entry) = self.sessions.remove(code) else {
            return false;
        };
        if let Some(manifest) = entry.manifest.take() {
            self.manifests.release(manifest);
        }
        self.index
            .expiries
            .remove(&(entry.session.expires_at, code.clone()));
        if self.handles.get(&entry.session.mcp_handle) == Some(code) {
            self.handles.remove(&entry.session.mcp_handle);
        }
        self.index.answer_bytes -= entry.answer_bytes;
        entry.announce(SessionEvent::SessionEnded);
        true
    }

    /// Keeps what finished calls cost within `budget`: the oldest answers are evicted first,
    /// then, if that is not enough, the oldest finished calls are forgotten altogether.
    pub(super) fn keep_within(&mut self, budget: usize) {
        while self.index.answer_bytes > budget {
            let forgetting = self.index.evicted >= self.index.finished.len();
            let next = if forgetting {
                self.index.finished.front()
            } else {
                self.index.finished.get(self.index.evicted)
            };
            let Some((finished_at, code, id)) = next else {
                return;
            };
            let (finished_at, code, id) = (*finished_at, Arc::clone(code), Arc::clone(id));
            if forgetting {
                self.index.finished.pop_front();
                self.index.evicted = self.index.evicted.saturating_sub(1);
            } else {
                self.index.evicted += 1;
            }
            if let Some(entry) = self.sessions.get_mut(code.as_ref()) {
                // Not a call of a later session under the same code.
                let same = entry
                    .done
                    .get(&id)
                    .is_some_and(|done| done.finished_at == finished_at);
                if same && forgetting {
                    entry.finished.retain(|finished| *finished != id);
                    entry.forget(&mut self.index, &id);
                } else if same {
                    entry.evict(&mut self.index, &id);
                }
            }
        }
    }
}
