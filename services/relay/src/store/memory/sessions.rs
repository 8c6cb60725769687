//! [`SessionStore`] in memory: sessions, manifests, calls and their events.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use async_trait::async_trait;
use toolrelay::wire::{RequestStatus, ToolResponse};

use super::finished::FinishedCalls;
use super::{Entry, MemoryStore};
use crate::clock::Timestamp;
use crate::code::SessionCode;
use crate::error::StoreError;
use crate::store::events::SessionChannel;
use crate::store::{
    Answerer, ApprovalChange, ApprovalState, BUILTIN_CONNECTION, BudgetStore, CallNews,
    CallProgress, Claim, EnqueueChecks, Enqueued, EventStream, Finished, Inserted, NewRequest,
    ProviderInfo, RequestRecord, SessionEvent, SessionRecord, SessionStore, StoreUsage,
};

#[async_trait]
impl SessionStore for MemoryStore {
    async fn insert_session_within(
        &self,
        session: SessionRecord,
        max_live: usize,
    ) -> Result<Inserted, StoreError> {
        let now = self.clock.now();
        let mut tables = self.lock();
        if let Some(existing) = tables.sessions.get(&session.code) {
            if existing.session.expires_at > now {
                return Ok(Inserted::Taken);
            }
            // Expired and not swept yet: gone for good now.
            tables.remove_session(&session.code);
            self.metrics.sessions_expired(1);
        }
        // Only near the ceiling are the expired sessions not swept yet told apart (the index
        // is in expiry order: what it costs is what has expired).
        if tables.sessions.len() >= max_live {
            let expired = tables
                .index
                .expiries
                .iter()
                .take_while(|(expires_at, _)| *expires_at <= now)
                .count();
            if tables.sessions.len() - expired >= max_live {
                return Ok(Inserted::Full);
            }
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
                code: Arc::new(session.code.clone()),
                session,
                manifest: None,
                requests: HashMap::new(),
                finished: FinishedCalls::default(),
                pending: BTreeMap::new(),
                deadlines: BTreeSet::new(),
                answer_bytes: 0,
                next_seq: 1,
                listeners: SessionChannel::new(),
                approvals: ApprovalState::default(),
                progress: HashMap::new(),
            },
        );
        Ok(Inserted::Inserted)
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
            entry.slide(code, index, now, until);
            entry.session.clone()
        }))
    }

    async fn keep_replica(
        &self,
        replica: &str,
        now: Timestamp,
        until: Timestamp,
    ) -> Result<Vec<(String, Timestamp)>, StoreError> {
        let mut tables = self.lock();
        tables.replicas.retain(|_, alive_until| *alive_until > now);
        let kept = tables.replicas.entry(replica.to_owned()).or_insert(until);
        *kept = (*kept).max(until);
        Ok(live(&tables.replicas, now))
    }

    async fn live_replicas(&self, now: Timestamp) -> Result<Vec<(String, Timestamp)>, StoreError> {
        Ok(live(&self.lock().replicas, now))
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

    async fn set_token(&self, code: &SessionCode, token_hash: &str) -> Result<bool, StoreError> {
        let set = self.with_live(code, |entry, _| {
            entry.session.token_hash = token_hash.to_owned();
        });
        Ok(set.is_some())
    }

    async fn set_manifest(
        &self,
        code: &SessionCode,
        json: String,
    ) -> Result<Option<u64>, StoreError> {
        Ok(self.with_live_sharing(code, |entry, _, manifests| {
            let previous = entry.manifest.replace(manifests.share(json));
            if let Some(previous) = previous {
                manifests.release(previous);
            }
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
            let manifest = entry.manifest.as_deref().map(str::to_owned);
            (entry.session.manifest_revision, manifest)
        }))
    }

    async fn enqueue_checked(
        &self,
        code: &SessionCode,
        request: NewRequest,
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
        // The record (the call hashed) is made before the lock that every session shares is
        // taken.
        let record = RequestRecord::queued(request, 0);
        let outcome = self.with_live(code, |entry, index| {
            let stale = checks
                .manifest_revision
                .is_some_and(|revision| revision != entry.session.manifest_revision);
            let enqueued = if stale {
                Enqueued::StaleManifest(Box::new(record.into_request()))
            } else {
                entry.enqueue(code, index, record, max_pending, until, &checks.approval)
            };
            (enqueued, Some(entry.session.as_enqueued()))
        });
        Ok(outcome.unwrap_or((Enqueued::NoSession, None)))
    }

    async fn approvals(&self, code: &SessionCode) -> Result<Option<ApprovalState>, StoreError> {
        Ok(self.with_live(code, |entry, _| entry.approvals.clone()))
    }

    async fn change_approvals(
        &self,
        code: &SessionCode,
        change: &ApprovalChange,
        now: Timestamp,
    ) -> Result<Option<bool>, StoreError> {
        Ok(self.with_live(code, |entry, index| {
            entry.change_approvals(code, index, change, now)
        }))
    }

    async fn request(
        &self,
        code: &SessionCode,
        id: &str,
    ) -> Result<Option<RequestRecord>, StoreError> {
        Ok(self.with_live(code, |entry, _| entry.record(id)).flatten())
    }
    async fn responses(
        &self,
        code: &SessionCode,
        caller: Option<&str>,
    ) -> Result<Option<Vec<ToolResponse>>, StoreError> {
        Ok(self.with_live(code, |entry, _| entry.finished.responses(caller)))
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
            let request = Arc::make_mut(entry.requests.get_mut(id)?);
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
                let Some(request) = entry.requests.get_mut(&**id) else {
                    continue;
                };
                if request.is_claimable(claim) {
                    let request = Arc::make_mut(request);
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
            let provider = entry.session.provider.as_ref();
            let provider = provider.map(|provider| provider.connection_id.as_str());
            if let Some(done) = entry.finished.get(id) {
                let record = entry.finished.record(done);
                if !answerer.may_answer(&record, provider) {
                    return Finished::NotDelivered;
                }
                return Finished::AlreadyFinished(Arc::new(record));
            }
            let Some(request) = entry.requests.get(id) else {
                return Finished::NoRequest;
            };
            if !answerer.may_answer(request, provider) {
                return Finished::NotDelivered;
            }
            let cost = crate::store::rules::answer_cost(&response);
            match entry.finish(code, index, id, status, response, cost, now) {
                Some(record) => {
                    entry.slide(code, index, now, until);
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

    async fn tell(&self, code: &SessionCode, id: &str, news: CallNews) -> Result<bool, StoreError> {
        let told = self.with_live(code, |entry, _| {
            let running = entry
                .requests
                .get(id)
                .is_some_and(|record| record.status == RequestStatus::Delivered);
            if !running {
                return false;
            }
            if let CallNews::Progress(progress) = &news {
                if entry
                    .progress
                    .get(id)
                    .is_some_and(|kept| progress.progress <= kept.progress)
                {
                    return false;
                }
                entry.progress.insert(id.to_owned(), progress.clone());
            }
            entry.announce(SessionEvent::News {
                id: id.to_owned(),
                news: Box::new(news),
            });
            true
        });
        Ok(told.unwrap_or(false))
    }

    async fn progress(
        &self,
        code: &SessionCode,
        id: &str,
    ) -> Result<Option<CallProgress>, StoreError> {
        Ok(self
            .with_live(code, |entry, _| entry.progress.get(id).cloned())
            .flatten())
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
}

/// The replicas alive at `now`.
fn live(replicas: &HashMap<String, Timestamp>, now: Timestamp) -> Vec<(String, Timestamp)> {
    replicas
        .iter()
        .filter(|(_, until)| **until > now)
        .map(|(replica, until)| (replica.clone(), *until))
        .collect()
}
