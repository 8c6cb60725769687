//! One session's calls and answers in memory, and what removing a session gives back.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use serde_json::Value;
use toolrelay::wire::{RequestStatus, ToolResponse};

use super::finished::FinishedCalls;
use super::{Indexes, Tables};
use crate::clock::Timestamp;
use crate::code::SessionCode;
use crate::store::events::SessionChannel;
use crate::store::rules::{self, MAX_FINISHED_PER_SESSION};
use crate::store::{
    ApprovalChange, ApprovalCheck, ApprovalState, CallProgress, Enqueued, Release, RequestRecord,
    SessionEvent, SessionRecord,
};

/// A session and everything in it.
pub(super) struct Entry {
    pub(super) session: SessionRecord,
    /// Its code, shared by the indexes of its finished calls.
    pub(super) code: Arc<SessionCode>,
    /// The manifest's JSON, once one is registered: the copy every session registering the
    /// same manifest shares ([`super::Manifests`]).
    pub(super) manifest: Option<Arc<str>>,
    /// Unfinished calls by id: each record shared with the caller that queued it and the
    /// event that handed it to its tab (a change copies it only while they hold it); each id
    /// shared with [`Self::pending`].
    pub(super) requests: HashMap<Arc<str>, Arc<RequestRecord>>,
    /// Finished calls, kept small, oldest first.
    pub(super) finished: FinishedCalls,
    /// Unfinished calls by queue position, so claims need not scan finished ones.
    pub(super) pending: BTreeMap<u64, Arc<str>>,
    /// Their deadlines, soonest first: (deadline, queue position).
    pub(super) deadlines: BTreeSet<(Timestamp, u64)>,
    /// What the kept answers cost together.
    pub(super) answer_bytes: usize,
    pub(super) next_seq: u64,
    /// Who listens on this session.
    pub(super) listeners: Arc<SessionChannel>,
    /// Its approvals.
    pub(super) approvals: ApprovalState,
    /// The progress running calls' tabs last reported, by call id.
    pub(super) progress: HashMap<String, CallProgress>,
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
        approval: &ApprovalCheck,
    ) -> Enqueued {
        if let Some(existing) = self.requests.get(record.id.as_str()) {
            return if existing.call_hash == record.call_hash {
                Enqueued::Existing(Arc::clone(existing))
            } else {
                Enqueued::Conflict(record.id)
            };
        }
        if let Some(done) = self.finished.get(&record.id) {
            return if done.is_call(&record.call_hash) {
                Enqueued::Existing(Arc::new(self.finished.record(done)))
            } else {
                Enqueued::Conflict(record.id)
            };
        }
        let held = match rules::approval_needed(&self.approvals, approval) {
            rules::Approval::Let => None,
            rules::Approval::Hold(caller) => Some(caller),
            rules::Approval::Refused => return Enqueued::ApprovalRefused,
            rules::Approval::Disconnected => return Enqueued::Disconnected,
        };
        // Overdue calls were expired on entry, so every pending call still counts.
        if self.pending.len() >= max_pending {
            return Enqueued::Full;
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        record.seq = seq;
        if let Some(caller) = held {
            record.status = RequestStatus::AwaitingApproval;
            self.approvals
                .held
                .push((caller.to_owned(), record.id.clone()));
        }
        let handed_to = rules::hand_over(self.session.provider.as_ref(), record.builtin)
            .filter(|_| held.is_none());
        let handed = handed_to.is_some();
        if let Some(connection) = handed_to.map(str::to_owned) {
            record.status = RequestStatus::Delivered;
            record.delivered_to = Some(connection);
            record.lease_until = Some(rules::pushed_lease(record.deadline));
            record.deliveries = 1;
        }
        let id: Arc<str> = Arc::from(record.id.as_str());
        self.pending.insert(seq, Arc::clone(&id));
        self.deadlines.insert((record.deadline, seq));
        index.deadlines.insert((record.deadline, code.clone(), seq));
        let record = Arc::new(record);
        self.requests.insert(id, Arc::clone(&record));
        self.slide(code, index, record.created_at, until);
        if held.is_none() {
            self.announce(if handed {
                SessionEvent::CallHanded(Arc::clone(&record))
            } else {
                SessionEvent::RequestQueued
            });
        }
        Enqueued::Queued(record)
    }

    /// Makes a change to the session's approvals ([`crate::store::SessionStore::change_approvals`]);
    /// false when its book moved.
    pub(super) fn change_approvals(
        &mut self,
        code: &SessionCode,
        index: &mut Indexes,
        change: &ApprovalChange,
        now: Timestamp,
    ) -> bool {
        let approvals = &mut self.approvals;
        if let Some((expected, book)) = &change.book {
            if approvals.book != *expected {
                return false;
            }
            approvals.book = Some(book.clone());
        }
        if let Some(approves) = change.approves {
            approvals.approves = approves;
        }
        if let Some(refused) = change.refused {
            approvals.refused = refused;
        }
        if let Some((caller, kept)) = &change.allow {
            approvals.allowed.retain(|(id, _)| id != caller);
            approvals.allowed.push((caller.clone(), kept.clone()));
        }
        if let Some(caller) = &change.revoke {
            approvals.allowed.retain(|(id, _)| id != caller);
        }
        if let Some((caller, release)) = &change.release {
            let (released, kept) = std::mem::take(&mut approvals.held)
                .into_iter()
                .partition(|(id, _)| id == caller);
            approvals.held = kept;
            let mut queued = false;
            for (_, id) in released {
                let Some(record) = self.requests.get_mut(id.as_str()) else {
                    continue;
                };
                if record.status != RequestStatus::AwaitingApproval {
                    continue;
                }
                match release {
                    Release::Queue => {
                        Arc::make_mut(record).status = RequestStatus::Queued;
                        queued = true;
                    }
                    Release::Fail {
                        code: error,
                        message,
                    } => {
                        let response = rules::refused_response(&id, *error, message);
                        let cost = rules::answer_cost(&response);
                        self.finish(code, index, &id, RequestStatus::Failed, response, cost, now);
                    }
                }
            }
            if queued {
                self.announce(SessionEvent::RequestQueued);
            }
        }
        self.announce(SessionEvent::ApprovalsChanged);
        true
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

    /// The call `id`, unfinished or finished.
    pub(super) fn record(&self, id: &str) -> Option<RequestRecord> {
        match self.requests.get(id) {
            Some(record) => Some(RequestRecord::clone(record)),
            None => self.finished.get(id).map(|done| self.finished.record(done)),
        }
    }

    /// Gives a pending call its final answer and files it under the finished ones, kept small
    /// ([`Done`]), at `cost` against the budgets ([`rules::answer_cost`], or
    /// [`rules::expired_cost`] for a call that expired); the caller then enforces the budget.
    /// Returns its whole record, the one its waiters are handed.
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
    ) -> Option<Arc<RequestRecord>> {
        // Its caller may still hold the record it queued: then the finished one is a copy
        // without the arguments, which go anyway.
        let mut record = Arc::try_unwrap(self.requests.remove(id)?)
            .unwrap_or_else(|shared| shared.without_answer());
        self.progress.remove(id);
        let number = self.finished.push(&record, status, &response, now, cost);
        record.status = status;
        record.response = Some(response);
        record.finished_at = Some(now);
        record.lease_until = None;
        record.args = Value::Null;
        let (seq, deadline) = (record.seq, record.deadline);
        self.pending.remove(&seq);
        self.deadlines.remove(&(deadline, seq));
        index.deadlines.remove(&(deadline, code.clone(), seq));
        index
            .finished
            .push_back((now, Arc::clone(&self.code), number));
        index.answer_bytes += cost;
        self.answer_bytes += cost;
        while self.finished.len() > MAX_FINISHED_PER_SESSION {
            let Some(oldest) = self.finished.oldest() else {
                break;
            };
            self.forget(index, oldest);
        }
        // The waiting caller gets the finished call with its wake-up, and need not read it.
        let record = Arc::new(record);
        let announced = self.listeners.waiting_for(id).then(|| Arc::clone(&record));
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
            let Some(request) = self.requests.get(&*id) else {
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

    /// Drops the answer of finished call `number`, keeping its record
    /// ([`FinishedCalls::evict`]); false when it had none kept.
    pub(super) fn evict(&mut self, index: &mut Indexes, number: u64) -> bool {
        let Some(freed) = self.finished.evict(number) else {
            return false;
        };
        self.answer_bytes -= freed;
        index.answer_bytes -= freed;
        true
    }

    /// Keeps what the session's finished calls cost within `budget` (its share): its oldest
    /// answers are evicted first, then, if that is not enough, its oldest finished calls are
    /// forgotten altogether (as the Redis store does).
    pub(super) fn keep_within(&mut self, index: &mut Indexes, budget: usize) {
        while self.answer_bytes > budget {
            if let Some(oldest) = self.finished.oldest_kept() {
                self.evict(index, oldest);
            } else if let Some(oldest) = self.finished.oldest() {
                self.forget(index, oldest);
            } else {
                return;
            }
        }
    }

    /// Forgets finished call `number` altogether, and what it still costs.
    pub(super) fn forget(&mut self, index: &mut Indexes, number: u64) {
        if let Some(done) = self.finished.forget(number) {
            self.answer_bytes -= done.cost();
            index.answer_bytes -= done.cost();
        }
    }

    /// Whether `code` at `number` (a cross-session index's entry) is still this session's
    /// finished call, not one forgotten since or one of an earlier session under the same code.
    pub(super) fn has_finished(&self, code: &Arc<SessionCode>, number: u64) -> bool {
        Arc::ptr_eq(&self.code, code) && self.finished.at(number).is_some()
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
            let Some((_, code, number)) = next else {
                return;
            };
            let (code, number) = (Arc::clone(code), *number);
            if forgetting {
                self.index.finished.pop_front();
                self.index.evicted = self.index.evicted.saturating_sub(1);
            } else {
                self.index.evicted += 1;
            }
            if let Some(entry) = self.sessions.get_mut(code.as_ref()) {
                let same = entry.has_finished(&code, number);
                if same && forgetting {
                    entry.forget(&mut self.index, number);
                } else if same {
                    entry.evict(&mut self.index, number);
                }
            }
        }
    }
}
