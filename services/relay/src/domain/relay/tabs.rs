//! The tab connections this replica serves, kept up together by one task per replica, so
//! that an idle tab costs the store (almost) nothing of its own:
//!
//! * **Presence is the replica's.** A pushing tab's connection id starts with its replica's
//!   id; the replica records itself alive every refresh period (`TAB_REFRESH_SECONDS`,
//!   [`crate::store::SessionStore::keep_replica`]), and a tab counts as connected while its
//!   replica does ([`Relay::connection_present`]). Nothing is written per tab for it.
//! * **Sessions are slid when due.** Every refresh period the upkeep slides only the sessions
//!   with less than half their time to live left (about one write per session per half time
//!   to live), in one go ([`crate::store::SessionStore::refresh`]: a pipeline of scripts over
//!   batches of sessions), and hears how each stands: that is also the slow sweep for what a
//!   driver of an idle tab may have missed.
//! * **Only doubtful sessions are looked at in between.** Every sweep period
//!   (`TAB_SWEEP_SECONDS`) it looks at the sessions whose driver has calls out or has reason
//!   to doubt what it knows (lost events, a store error): an idle session costs nothing there.
//! * A connection that closed while the store was down could not be cleared from its session;
//!   the upkeep clears it later, or a live replica would claim a dead tab forever.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};
use std::time::Duration;
use tokio::time::Instant;

use crate::channel::{Receiver, Sender, channel};
use crate::clock::Timestamp;
use crate::code::{SessionCode, random_id};
use crate::locked;
use crate::relay::{Inner, Relay};
use crate::store::TabState;

/// What the upkeep tells a tab's driver.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Notice {
    /// The session has this many calls waiting for their answer.
    Pending(u64),
    /// Another connection serves the session now (or it may: look).
    Replaced,
    /// The session ended.
    Gone,
}

/// Notices a driver may fall behind by (it needs the latest only).
const NOTICES: usize = 2;
/// How often at most a replica reads the live replicas again to learn of one it does not know
/// (a replica started since, or one that is gone).
const REPLICAS_REREAD: Duration = Duration::from_millis(250);
/// What separates a connection id's replica from the rest.
const REPLICA_SEPARATOR: char = '.';

/// What a tab's driver and the upkeep share.
#[derive(Debug)]
pub(crate) struct Watch {
    /// When the session expires, as last seen.
    expires_at: AtomicI64,
    /// The session is worth a look at the next sweep: the driver has calls out, lost events,
    /// or met a store error.
    doubt: AtomicBool,
}

impl Watch {
    /// When the session expires, as the upkeep last saw it.
    pub(crate) fn expires_at(&self) -> Timestamp {
        Timestamp(self.expires_at.load(Ordering::Relaxed))
    }

    /// The session was seen expiring at `at` (an expiry only moves forward).
    pub(crate) fn seen_expiring(&self, at: Timestamp) {
        self.expires_at.fetch_max(at.0, Ordering::Relaxed);
    }

    /// Asks the upkeep to look at the session at its next sweep.
    pub(crate) fn doubt(&self) {
        self.doubt.store(true, Ordering::Relaxed);
    }
}

struct Tab {
    code: SessionCode,
    notices: Sender<Notice>,
    watch: Arc<Watch>,
}

/// The tabs this replica serves, by connection id, and what it knows of the other replicas.
#[derive(Default)]
pub(crate) struct Tabs {
    tabs: Mutex<HashMap<String, Tab>>,
    upkeep: OnceLock<()>,
    /// Connections that ended but could not be cleared from their session (the store
    /// failed): cleared at the upkeep's next rounds.
    uncleared: Mutex<Vec<(SessionCode, String)>>,
    replicas: Mutex<Replicas>,
    /// One read of the live replicas at a time.
    reading: tokio::sync::Mutex<()>,
}

/// The live replicas as last read, and when this replica last recorded itself alive.
#[derive(Default)]
struct Replicas {
    /// Each live replica with when it stops counting as alive.
    live: HashMap<String, Timestamp>,
    read_at: Option<Instant>,
    kept_at: Option<Instant>,
}

/// A tab registered with the upkeep; dropping it unregisters it.
pub(crate) struct Attended {
    relay: Weak<Inner>,
    connection_id: String,
    /// What the driver shares with the upkeep.
    pub(crate) watch: Arc<Watch>,
    /// What the upkeep found.
    pub(crate) notices: Receiver<Notice>,
}

impl Drop for Attended {
    fn drop(&mut self) {
        if let Some(inner) = self.relay.upgrade() {
            inner.tabs.lock().remove(&self.connection_id);
        }
    }
}

impl Tabs {
    fn lock(&self) -> MutexGuard<'_, HashMap<String, Tab>> {
        locked(&self.tabs)
    }
}

impl Relay {
    /// A new connection id of this replica: the replica's id, then a random part.
    pub(crate) fn new_connection_id(&self) -> String {
        format!("{}{REPLICA_SEPARATOR}{}", self.inner.replica, random_id())
    }

    /// Registers a tab connection of the session with the upkeep (started with the first).
    pub(crate) fn attend(
        &self,
        code: &SessionCode,
        connection_id: &str,
        expires_at: Timestamp,
    ) -> Attended {
        let (notices, received) = channel(NOTICES);
        let watch = Arc::new(Watch {
            expires_at: AtomicI64::new(expires_at.0),
            doubt: AtomicBool::new(false),
        });
        self.inner.tabs.lock().insert(
            connection_id.to_owned(),
            Tab {
                code: code.clone(),
                notices,
                watch: watch.clone(),
            },
        );
        self.inner.tabs.upkeep.get_or_init(|| {
            tokio::spawn(upkeep(Arc::downgrade(&self.inner)));
        });
        Attended {
            relay: Arc::downgrade(&self.inner),
            connection_id: connection_id.to_owned(),
            watch,
            notices: received,
        }
    }

    /// A connection that ended and could not be cleared from its session: the upkeep clears
    /// it at its next rounds.
    pub(crate) fn clear_later(&self, code: &SessionCode, connection_id: &str) {
        locked(&self.inner.tabs.uncleared).push((code.clone(), connection_id.to_owned()));
    }

    /// Records this replica as alive (its tabs count as connected) unless it did within the
    /// refresh period; `force` records it all the same. Before its first tab attaches, and
    /// then every refresh period.
    pub(crate) async fn keep_replica_alive(
        &self,
        force: bool,
    ) -> Result<(), crate::error::StoreError> {
        let period = self.config().tab_refresh_period();
        let kept_at = locked(&self.inner.tabs.replicas).kept_at;
        if !force && kept_at.is_some_and(|at| at.elapsed() < period) {
            return Ok(());
        }
        let now = self.now();
        let until = now.plus(self.config().tab_presence());
        let live = self
            .inner
            .store
            .keep_replica(&self.inner.replica, now, until)
            .await?;
        let mut replicas = locked(&self.inner.tabs.replicas);
        replicas.live = live.into_iter().collect();
        let at = Instant::now();
        replicas.kept_at = Some(at);
        replicas.read_at = Some(at);
        Ok(())
    }

    /// Whether a pushing tab's connection is there: attended by this replica, or by a replica
    /// that counts as alive. (A connection id of no known form counts while its last attach
    /// is recent, `recent`.)
    pub(crate) async fn connection_present(
        &self,
        connection_id: &str,
        now: Timestamp,
        recent: bool,
    ) -> bool {
        let Some((replica, _)) = connection_id.split_once(REPLICA_SEPARATOR) else {
            return recent;
        };
        if replica == self.inner.replica {
            // A tab this replica told to move while it hands its tabs over is on its way to
            // another relay: it counts as there, as it does for the other replicas.
            return self.inner.drain.is_handing_over()
                || self.inner.tabs.lock().contains_key(connection_id);
        }
        if self.replica_alive(replica, now) {
            return true;
        }
        // A replica not known alive: read the live ones again (at most every
        // REPLICAS_REREAD, one read at a time), it may have started or recorded itself since.
        let _reading = self.inner.tabs.reading.lock().await;
        let read_at = locked(&self.inner.tabs.replicas).read_at;
        if read_at.is_some_and(|at| at.elapsed() < REPLICAS_REREAD) {
            return self.replica_alive(replica, now);
        }
        match self.inner.store.live_replicas(now).await {
            Ok(live) => {
                let mut replicas = locked(&self.inner.tabs.replicas);
                replicas.live = live.into_iter().collect();
                replicas.read_at = Some(Instant::now());
            }
            Err(error) => {
                tracing::debug!(%error, "the live replicas could not be read");
            }
        }
        self.replica_alive(replica, now)
    }

    fn replica_alive(&self, replica: &str, now: Timestamp) -> bool {
        locked(&self.inner.tabs.replicas)
            .live
            .get(replica)
            .is_some_and(|until| *until > now)
    }

    /// Clears the connections that could not be cleared when they ended.
    async fn clear_uncleared(&self) {
        let uncleared = std::mem::take(&mut *locked(&self.inner.tabs.uncleared));
        for (code, connection) in uncleared {
            if let Err(error) = self.inner.store.clear_provider(&code, &connection).await {
                tracing::debug!(%error, "a closed connection could not be cleared yet");
                self.clear_later(&code, &connection);
            }
        }
    }

    /// One round of the upkeep: with `refresh`, the replica is recorded alive and the
    /// sessions due slid; either way, the doubtful sessions are looked at.
    async fn look_after_tabs(&self, refresh: bool) {
        self.clear_uncleared().await;
        if refresh && let Err(error) = self.keep_replica_alive(true).await {
            tracing::warn!(%error, "could not record this replica as alive; trying again at the next round");
        }
        let now = self.now();
        let half_life = self.config().session_ttl / 2;
        let (mut due, mut doubtful) = (Vec::new(), Vec::new());
        for (connection, tab) in self.inner.tabs.lock().iter() {
            let expires_at = tab.watch.expires_at();
            let entry = (tab.code.clone(), connection.clone(), tab.clone_parts());
            let doubted = tab.watch.doubt.swap(false, Ordering::Relaxed);
            if refresh && expires_at.since(now) < half_life {
                due.push(entry);
            } else if doubted {
                doubtful.push(entry);
            }
        }
        let until = now.plus(self.config().session_ttl);
        self.refresh_tabs(due, now, Some(until)).await;
        self.refresh_tabs(doubtful, now, None).await;
    }

    /// Refreshes (with `until`) or looks at the tabs' sessions, and tells their drivers.
    async fn refresh_tabs(
        &self,
        tabs: Vec<(SessionCode, String, TabParts)>,
        now: Timestamp,
        until: Option<Timestamp>,
    ) {
        if tabs.is_empty() {
            return;
        }
        let (keys, parts): (Vec<_>, Vec<_>) = tabs
            .into_iter()
            .map(|(code, connection, parts)| ((code, connection), parts))
            .unzip();
        let states = match self.inner.store.refresh(&keys, now, until).await {
            Ok(states) => states,
            Err(error) => {
                tracing::warn!(%error, tabs = keys.len(), "could not look after the tabs' sessions; trying again at the next round");
                for (_, watch) in &parts {
                    watch.doubt();
                }
                return;
            }
        };
        for (state, (notices, watch)) in states.into_iter().zip(parts) {
            let notice = match state {
                TabState::Serving {
                    pending,
                    expires_at,
                } => {
                    watch.seen_expiring(expires_at);
                    if pending == 0 {
                        continue;
                    }
                    // Still busy: looked at again at the next sweep.
                    watch.doubt();
                    Notice::Pending(pending)
                }
                TabState::Replaced => Notice::Replaced,
                TabState::Gone => Notice::Gone,
            };
            // A driver with notices waiting has what it needs to look again.
            let _ = notices.try_send(notice);
        }
    }
}

/// What the upkeep needs of a tab once it has its state.
type TabParts = (Sender<Notice>, Arc<Watch>);

impl Tab {
    fn clone_parts(&self) -> TabParts {
        (self.notices.clone(), self.watch.clone())
    }
}

/// The replica's upkeep of its tabs, for as long as the relay lives.
async fn upkeep(relay: Weak<Inner>) {
    let Some(inner) = relay.upgrade() else { return };
    let (sweep, refresh) = (
        inner.config.tab_sweep_period(),
        inner.config.tab_refresh_period(),
    );
    drop(inner);
    let mut ticks = tokio::time::interval(sweep);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticks.tick().await;
    let mut refreshed = Instant::now();
    loop {
        ticks.tick().await;
        let Some(inner) = relay.upgrade() else { return };
        let relay = Relay { inner };
        // A little early rather than a sweep late.
        let refresh_now = refreshed.elapsed() + sweep / 2 >= refresh;
        if refresh_now {
            refreshed = Instant::now();
        }
        relay.look_after_tabs(refresh_now).await;
    }
}
