//! One session's calls and answers in memory, and what removing a session gives back.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::Arc;

use serde_json::Value;
use toolrelay::wire::{RequestStatus, ToolResponse};

use super::{Indexes, Tables};
use crate::clock::Timestamp;
use crate::code::SessionCode;
use crate::store::events::SessionChannel;
use crate::store::rules::{self, MAX_FINISHED_PER_SESSION};
use crate::store::{Enqueued, RequestRecord, SessionEvent, SessionRecord};

/// A session and everything in it.
pub(super) struct Entry {
    pub(super) session: SessionRecord,
    /// The manifest's JSON, once one is registered: the copy every session registering the
    /// same manifest shares ([`super::Manifests`]).
    pub(super) manifest: Option<Arc<str>>,
    pub(super) requests: HashMap<String, RequestRecord>,
    /// Unfinished calls by queue position, so claims need not scan finished ones.
    pub(super) pending: BTreeMap<u64, String>,
    /// Their deadlines, soonest first: (deadline, queue position).
    pub(super) deadlines: BTreeSet<(Timestamp, u64)>,
    /// Finished calls, oldest first, for the per-session cap.
    pub(super) finished: VecDeque<String>,
    /// What each kept answer costs against the budgets, and its place in `kept`.
    pub(super) answer_costs: HashMap<String, (usize, u64)>,
    /// The kept answers by when they were kept, oldest first: the session's own share of
    /// the answer budget evicts from the front.
    pub(super) kept: BTreeMap<u64, String>,
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
        index.unanswered += 1;
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

    /// Gives a pending call its final answer and files it under the finished ones; the caller
    /// then enforces the budget. Its arguments are dropped: its hash still identifies it.
    pub(super) fn finish(
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
            self.finish(code, index, &id, RequestStatus::Expired, response, now);
            expired += 1;
        }
        expired
    }

    /// Drops a finished call's answer, keeping its record; false when it had none kept.
    pub(super) fn evict(&mut self, index: &mut Indexes, id: &str) -> bool {
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
    pub(super) fn keep_within(&mut self, index: &mut Indexes, budget: usize) {
        while self.answer_bytes > budget {
            let Some((_, oldest)) = self.kept.first_key_value() else {
                return;
            };
            let oldest = oldest.clone();
            self.evict(index, &oldest);
        }
    }

    /// Forgets a finished call altogether.
    pub(super) fn forget(&mut self, index: &mut Indexes, id: &str) {
        self.evict(index, id);
        self.requests.remove(id);
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
        self.index.unanswered -= entry.pending.len();
        entry.announce(SessionEvent::SessionEnded);
        true
    }

    /// Evicts the oldest answers until those kept fit `budget`.
    pub(super) fn keep_within(&mut self, budget: usize) {
        while self.index.answer_bytes > budget {
            let Some((code, id)) = self.index.answers.pop_front() else {
                return;
            };
            if let Some(entry) = self.sessions.get_mut(&code) {
                entry.evict(&mut self.index, &id);
            }
        }
    }
}
