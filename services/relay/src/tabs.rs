//! The tab connections this replica serves, kept up together: one task per replica records
//! them as alive and slides their sessions every refresh period (`TAB_REFRESH_SECONDS`), and
//! in between looks at their sessions every sweep period (`TAB_SWEEP_SECONDS`) for what a
//! driver may have missed — a call, a replacement, the session's end — each time in one go
//! ([`crate::store::Store::refresh`]: a pipeline of scripts over batches of sessions), so an
//! idle tab costs the store nothing of its own.

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};
use tokio::time::Instant;

use tokio::sync::mpsc;

use crate::clock::Timestamp;
use crate::code::SessionCode;
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

struct Tab {
    code: SessionCode,
    notices: mpsc::Sender<Notice>,
    /// When its session expires, as last seen.
    expires_at: Arc<AtomicI64>,
}

/// The tabs this replica serves, by connection id.
#[derive(Default)]
pub(crate) struct Tabs {
    tabs: Mutex<HashMap<String, Tab>>,
    upkeep: OnceLock<()>,
}

/// A tab registered with the upkeep; dropping it unregisters it.
pub(crate) struct Attended {
    relay: Weak<Inner>,
    connection_id: String,
    /// When the session expires, as the upkeep last saw it.
    pub(crate) expires_at: Arc<AtomicI64>,
    /// What the upkeep found.
    pub(crate) notices: mpsc::Receiver<Notice>,
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
        // Held for one map operation, never across an `.await`.
        self.tabs
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl Relay {
    /// Registers a tab connection of the session with the upkeep (started with the first).
    pub(crate) fn attend(
        &self,
        code: &SessionCode,
        connection_id: &str,
        expires_at: Timestamp,
    ) -> Attended {
        let (notices, received) = mpsc::channel(NOTICES);
        let expires = Arc::new(AtomicI64::new(expires_at.0));
        self.inner.tabs.lock().insert(
            connection_id.to_owned(),
            Tab {
                code: code.clone(),
                notices,
                expires_at: expires.clone(),
            },
        );
        self.inner.tabs.upkeep.get_or_init(|| {
            tokio::spawn(upkeep(Arc::downgrade(&self.inner)));
        });
        Attended {
            relay: Arc::downgrade(&self.inner),
            connection_id: connection_id.to_owned(),
            expires_at: expires,
            notices: received,
        }
    }

    /// One round of the upkeep: with `refresh`, the tabs are recorded as alive and their
    /// sessions slid.
    async fn look_after_tabs(&self, refresh: bool) {
        let (tabs, senders): (Vec<(SessionCode, String)>, Vec<_>) = self
            .inner
            .tabs
            .lock()
            .iter()
            .map(|(connection, tab)| {
                (
                    (tab.code.clone(), connection.clone()),
                    (tab.notices.clone(), tab.expires_at.clone()),
                )
            })
            .unzip();
        if tabs.is_empty() {
            return;
        }
        let now = self.now();
        let until = refresh.then(|| now.plus(self.config().session_ttl));
        let states = match self.inner.store.refresh(&tabs, now, until).await {
            Ok(states) => states,
            Err(error) => {
                tracing::warn!(%error, tabs = tabs.len(), "could not look after the tabs' sessions; trying again at the next round");
                return;
            }
        };
        for (state, (notices, expires_at)) in states.into_iter().zip(senders) {
            let notice = match state {
                TabState::Serving {
                    pending,
                    expires_at: expires,
                } => {
                    expires_at.fetch_max(expires.0, Ordering::Relaxed);
                    if pending == 0 {
                        continue;
                    }
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
