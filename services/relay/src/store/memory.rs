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

/// Sessions and calls in this process's memory.
pub struct MemoryStore {
    clock: Clock,
    retention: Duration,
    sessions: Mutex<HashMap<SessionCode, Entry>>,
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
}

impl MemoryStore {
    /// A store keeping finished calls for `retention`, with its sweeper running on the current
    /// tokio runtime until the store is dropped.
    pub fn new(clock: Clock, retention: Duration) -> Arc<Self> {
        let store = Arc::new(Self {
            clock,
            retention,
            sessions: Mutex::new(HashMap::new()),
        });
        tokio::spawn(sweep(Arc::downgrade(&store)));
        store
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<SessionCode, Entry>> {
        // A panic while holding the lock cannot leave an entry half-written (each operation
        // writes whole values), so the data is still sound after poisoning.
        self.sessions
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Runs `f` on the live entry of `code`, dropping the entry if it has expired.
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
        sessions.get_mut(code).map(f)
    }

    fn sweep_once(&self) {
        let now = self.clock.now();
        let mut sessions = self.lock();
        sessions.retain(|_, entry| {
            if entry.session.expires_at <= now {
                entry.announce(SessionEvent::SessionEnded);
                return false;
            }
            let retention = self.retention;
            entry.requests.retain(|_, request| {
                request
                    .finished_at
                    .is_none_or(|finished| now.since(finished) < retention)
            });
            true
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

    async fn touch_session(
        &self,
        code: &SessionCode,
        now: Timestamp,
        until: Timestamp,
        seen: Option<&str>,
    ) -> Result<Option<SessionRecord>, StoreError> {
        Ok(self.with_live(code, |entry| {
            let session = &mut entry.session;
            let until = until.min(session.max_expires_at);
            session.expires_at = session.expires_at.max(until);
            if let (Some(provider), Some(seen)) = (session.provider.as_mut(), seen)
                && provider.connection_id == seen
            {
                provider.last_seen = now;
            }
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
            let now = request.created_at;
            let pending = entry
                .pending
                .values()
                .filter(|id| entry.requests.get(*id).is_some_and(|r| r.is_pending(now)))
                .count();
            if pending >= max_pending {
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

    async fn requests(&self, code: &SessionCode) -> Result<Option<Vec<RequestRecord>>, StoreError> {
        Ok(self.with_live(code, |entry| {
            let mut requests: Vec<RequestRecord> = entry.requests.values().cloned().collect();
            requests.sort_by_key(|request| request.seq);
            requests
        }))
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
}
