//! The Redis store's events: one pub/sub connection per replica, its messages fanned out to
//! the replica's listeners ([`SessionChannel`]).
//!
//! What the scripts publish on a session's channel `<base>ev`: `q` (a call queued for whoever
//! claims), `Q:<call>` (a call queued and handed to the connection it names, whole), `h:<id>`
//! (the same, too large to send whole: read it), `R:<call>` (a call finished, whole), `r:<id>`
//! (the same, too large), `p:<connection>` (a new provider), `m` (a new manifest), `e` (the
//! session ended).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use futures::StreamExt;
use redis::AsyncCommands;

use super::link::Link;
use super::records;
use super::{HEARTBEAT, RESPONSE_TIMEOUT, timed_out};
use crate::store::events::SessionChannel;
use crate::store::{EventStream, RequestRecord, SessionEvent};

/// A call announced whole (its packed record, see `records.rs`); `Missed` (look again) if it
/// cannot be read.
fn announced(packed: &str, event: impl FnOnce(Box<RequestRecord>) -> SessionEvent) -> SessionEvent {
    match records::unpack(packed) {
        Ok(record) => event(Box::new(record)),
        Err(_) => SessionEvent::Missed,
    }
}

/// One pub/sub connection per replica, its messages fanned out to the replica's subscribers.
///
/// The lock on `sink` orders every change of what Redis is subscribed to with the map of
/// channels: a reader adds a channel (and subscribes to it) holding it, the sweep removes
/// unused channels (and unsubscribes) holding it, and a reconnect subscribes to every channel
/// holding it. So a reader that has its stream knows that Redis confirmed the subscription
/// (when Redis is there), and no unsubscription can overtake a subscription.
pub(super) struct EventHub {
    channels: Mutex<HashMap<String, Arc<SessionChannel>>>,
    /// The way to Redis: the pub/sub connection goes to its current primary, and a call
    /// handed over too large to be announced whole (`h:`) is read through it.
    link: Arc<Link>,
    sink: tokio::sync::Mutex<Option<redis::aio::PubSubSink>>,
    /// Wakes the listener to reconnect when a subscription failed on a live connection.
    reconnect: tokio::sync::Notify,
}

impl EventHub {
    pub(super) fn start(link: Arc<Link>) -> Arc<Self> {
        let hub = Arc::new(Self {
            channels: Mutex::new(HashMap::new()),
            link,
            sink: tokio::sync::Mutex::new(None),
            reconnect: tokio::sync::Notify::new(),
        });
        tokio::spawn(listen(Arc::downgrade(&hub)));
        hub
    }

    fn channels(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<SessionChannel>>> {
        // A std mutex: held for one map operation, never across an `.await`.
        self.channels
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// A stream of the session's events (its key base `base`), subscribed on Redis before it
    /// is returned when Redis is there; it never ends on a Redis error. After the event
    /// connection was lost it says `Missed` (look again); the relay's sweep
    /// (`Relay::upkeep`) covers a message lost otherwise.
    pub(super) async fn subscribe(&self, base: &str) -> EventStream {
        self.listen(base, |channel| channel.subscribe()).await
    }

    /// [`EventHub::subscribe`] for one call's waiter ([`Store::listen_for_answer`]).
    pub(super) async fn wait_for(&self, base: &str, id: &str) -> EventStream {
        self.listen(base, |channel| channel.wait_for(id)).await
    }

    /// `listen` on the session's channel, subscribed on Redis (see [`EventHub::subscribe`]).
    async fn listen(
        &self,
        base: &str,
        listen: impl FnOnce(&Arc<SessionChannel>) -> EventStream,
    ) -> EventStream {
        let channel = format!("{base}ev");
        let mut sink = self.sink.lock().await;
        // The listener is there before Redis is asked (under the sink's lock, so the sweep
        // cannot take the channel away in between).
        let (events, new) = {
            let mut channels = self.channels();
            match channels.get(&channel) {
                Some(listeners) => (listen(listeners), false),
                None => {
                    let listeners = SessionChannel::new();
                    let events = listen(&listeners);
                    channels.insert(channel.clone(), listeners);
                    (events, true)
                }
            }
        };
        if new && let Some(connected) = sink.as_mut() {
            let subscribed = tokio::time::timeout(RESPONSE_TIMEOUT, connected.subscribe(&channel))
                .await
                .unwrap_or_else(|_| Err(timed_out()));
            if let Err(error) = subscribed {
                // The listener reconnects, subscribes to every channel and says Missed.
                tracing::warn!(%error, "could not subscribe to a session's events; reconnecting");
                *sink = None;
                self.reconnect.notify_one();
            }
        }
        drop(sink);
        events
    }

    /// Whether the pub/sub connection is there and answers a ping in time.
    pub(super) async fn alive(&self) -> bool {
        let mut sink = self.sink.lock().await;
        let Some(sink) = sink.as_mut() else {
            return false;
        };
        matches!(
            tokio::time::timeout(RESPONSE_TIMEOUT, sink.ping::<redis::Value>()).await,
            Ok(Ok(_))
        )
    }

    fn deliver(self: &Arc<Self>, channel: &str, payload: &str) {
        let event = match payload {
            "q" => SessionEvent::RequestQueued,
            "m" => SessionEvent::ManifestChanged,
            "e" => SessionEvent::SessionEnded,
            other => match other.split_at_checked(2) {
                Some(("r:", id)) => SessionEvent::ResponseReady {
                    id: id.to_owned(),
                    record: None,
                },
                Some(("R:", packed)) => announced(packed, |record| SessionEvent::ResponseReady {
                    id: record.id.clone(),
                    record: Some(record),
                }),
                Some(("Q:", packed)) => announced(packed, SessionEvent::CallHanded),
                Some(("h:", id)) => {
                    self.read_handed(channel, id);
                    return;
                }
                Some(("p:", connection)) => SessionEvent::ProviderChanged(connection.to_owned()),
                _ => SessionEvent::Missed,
            },
        };
        self.announce(channel, event);
    }

    fn announce(&self, channel: &str, event: SessionEvent) {
        let listeners = self.channels().get(channel).cloned();
        if let Some(listeners) = listeners {
            listeners.announce(event);
        }
    }

    /// A call handed over too large to be announced whole: read, then announced as if it
    /// had been (or `Missed`, look again, when it cannot be read).
    fn read_handed(self: &Arc<Self>, channel: &str, id: &str) {
        let Some(base) = channel.strip_suffix("ev") else {
            return;
        };
        let (key, field) = (format!("{base}s"), format!("r:{id}"));
        let (hub, channel) = (self.clone(), channel.to_owned());
        tokio::spawn(async move {
            let mut redis = hub.link.commands();
            let packed: Result<Option<String>, _> = redis.hget(&key, &field).await;
            let event = match packed {
                Ok(Some(packed)) => announced(&packed, SessionEvent::CallHanded),
                _ => SessionEvent::Missed,
            };
            hub.announce(&channel, event);
        });
    }

    /// Forgets channels nobody listens to; returns those still wanted.
    fn wanted(&self) -> Vec<String> {
        let mut channels = self.channels();
        channels.retain(|_, listeners| listeners.in_use());
        channels.keys().cloned().collect()
    }

    /// Tells every local subscriber to look again: messages may have been lost.
    fn missed_all(&self) {
        let everyone: Vec<_> = self.channels().values().cloned().collect();
        for listeners in everyone {
            listeners.announce(SessionEvent::Missed);
        }
    }

    /// On a new connection: subscribes to every wanted channel and installs the connection,
    /// holding the sink's lock so that no reader joins in between; then says `Missed` to
    /// everyone, who look again with their events flowing. False if a subscription failed.
    async fn resubscribe(&self, mut connected: redis::aio::PubSubSink) -> bool {
        let mut sink = self.sink.lock().await;
        for channel in self.wanted() {
            let subscribed =
                tokio::time::timeout(RESPONSE_TIMEOUT, connected.subscribe(&channel)).await;
            if !matches!(subscribed, Ok(Ok(()))) {
                return false;
            }
        }
        *sink = Some(connected);
        drop(sink);
        self.missed_all();
        true
    }

    /// Unsubscribes from sessions no local reader follows any more.
    async fn unsubscribe_unused(&self) {
        let mut sink = self.sink.lock().await;
        let unused: Vec<String> = {
            let mut channels = self.channels();
            let unused: Vec<String> = channels
                .iter()
                .filter(|(_, listeners)| !listeners.in_use())
                .map(|(channel, _)| channel.clone())
                .collect();
            for channel in &unused {
                channels.remove(channel);
            }
            unused
        };
        if let Some(connected) = sink.as_mut()
            && !unused.is_empty()
        {
            let _ = tokio::time::timeout(RESPONSE_TIMEOUT, connected.unsubscribe(&unused)).await;
        }
    }
}

/// Keeps the hub's pub/sub connection: connects, subscribes to what is wanted, delivers
/// messages, and on a drop, or when Redis fails over to another primary, reconnects (with
/// `Missed` for everyone, as messages may be lost).
async fn listen(hub: Weak<EventHub>) {
    let mut delay = Duration::from_millis(100);
    loop {
        let Some(strong) = hub.upgrade() else { return };
        let mut failed_over = strong.link.primary_changed();
        failed_over.mark_unchanged();
        let client = strong.link.client();
        match tokio::time::timeout(RESPONSE_TIMEOUT, client.get_async_pubsub())
            .await
            .unwrap_or_else(|_| Err(timed_out()))
        {
            Ok(pubsub) => {
                let (sink, mut stream) = pubsub.split();
                let subscribed = strong.resubscribe(sink).await;
                drop(strong);
                if subscribed {
                    delay = Duration::from_millis(100);
                    let mut sweep = tokio::time::interval(Duration::from_secs(30));
                    let mut heartbeat = tokio::time::interval(HEARTBEAT);
                    loop {
                        let Some(strong) = hub.upgrade() else { return };
                        tokio::select! {
                            message = stream.next() => {
                                let Some(message) = message else { break };
                                let channel = message.get_channel_name();
                                let payload: String = message.get_payload().unwrap_or_default();
                                strong.deliver(channel, &payload);
                            }
                            () = strong.reconnect.notified() => break,
                            _ = failed_over.changed() => break,
                            _ = sweep.tick() => strong.unsubscribe_unused().await,
                            _ = heartbeat.tick() => {
                                // A half-open connection (a Redis that vanished without a
                                // FIN) ends no stream: a ping that is not answered does.
                                if !strong.alive().await {
                                    break;
                                }
                            }
                        }
                    }
                }
                tracing::warn!("lost the Redis event connection; reconnecting");
                if let Some(hub) = hub.upgrade() {
                    *hub.sink.lock().await = None;
                }
            }
            Err(error) => {
                drop(strong);
                tracing::warn!(%error, "Redis events are not reachable yet; retrying");
            }
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(Duration::from_secs(5));
    }
}
