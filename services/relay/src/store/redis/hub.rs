//! The Redis store's events: one pub/sub connection per replica, its messages fanned out to
//! the replica's listeners ([`SessionChannel`]).
//!
//! What the scripts publish on a session's channel `<base>ev`: `q` (a call queued for whoever
//! claims), `Q:<call>` (a call queued and handed to the connection it names, whole), `h:<id>`
//! (the same, too large to send whole: read it), `R:<call>` (a call finished, whole), `r:<id>`
//! (the same, too large), `p:<connection>` (a new provider), `m` (a new manifest), `e` (the
//! session ended).
//!
//! On one primary the hub holds a pub/sub connection of its own (`SUBSCRIBE`), reconnected
//! when it drops or when the primary changes. On a Cluster it subscribes to each session's
//! channel on the shard holding it (`SSUBSCRIBE`, through the cluster connection, which
//! subscribes again by itself after it reconnects to a shard); a shard's lost connection
//! tells every reader to look again.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use futures::StreamExt;
use redis::AsyncCommands;

use super::link::{Connection, Events, Link};
use super::records;
use super::{HEARTBEAT, RESPONSE_TIMEOUT, timed_out};
use crate::store::events::SessionChannel;
use crate::store::{EventStream, RequestRecord, SessionEvent};

/// A call announced whole (its packed record, see `records.rs`); `Missed` (look again) if it
/// cannot be read.
fn announced(packed: &str, event: impl FnOnce(Arc<RequestRecord>) -> SessionEvent) -> SessionEvent {
    match records::unpack(packed) {
        Ok(record) => event(Arc::new(record)),
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
    sink: tokio::sync::Mutex<Option<Sink>>,
    /// Wakes the listener to reconnect when a subscription failed on a live connection.
    reconnect: tokio::sync::Notify,
    /// On a Cluster, the channels whose subscription failed (their shard was unreachable):
    /// tried again every second, while the other shards' channels go on.
    stray: Mutex<std::collections::HashSet<String>>,
}

impl EventHub {
    pub(super) fn start(link: Arc<Link>) -> Arc<Self> {
        let hub = Arc::new(Self {
            channels: Mutex::new(HashMap::new()),
            link,
            sink: tokio::sync::Mutex::new(None),
            reconnect: tokio::sync::Notify::new(),
            stray: Mutex::new(std::collections::HashSet::new()),
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
            let subscribed = connected.subscribe(&channel).await;
            match subscribed {
                Ok(()) => {}
                Err(error) if matches!(connected, Sink::Sharded(_)) => {
                    // Its shard is unreachable: tried again every second.
                    tracing::warn!(%error, "could not subscribe to a session's events on its shard; trying again");
                    self.strays().insert(channel.clone());
                }
                Err(error) => {
                    // The listener reconnects, subscribes to every channel and says Missed.
                    tracing::warn!(%error, "could not subscribe to a session's events; reconnecting");
                    *sink = None;
                    self.reconnect.notify_one();
                }
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
        sink.ping().await.is_ok()
    }

    fn deliver(self: &Arc<Self>, channel: &str, payload: &str) {
        let event = match payload {
            "q" => SessionEvent::RequestQueued,
            "m" => SessionEvent::ManifestChanged,
            "a" => SessionEvent::ApprovalsChanged,
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
                Some(("N:", told)) => match told
                    .split_once(' ')
                    .map(|(id, news)| (id, serde_json::from_str(news)))
                {
                    Some((id, Ok(news))) => SessionEvent::News {
                        id: id.to_owned(),
                        news: Box::new(news),
                    },
                    // News is a hint for a waiter: one unread is dropped.
                    _ => return,
                },
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

    /// Tells this replica's listeners on `channel` of `event` (what a message on it would).
    pub(super) fn announce(&self, channel: &str, event: SessionEvent) {
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
        let (hub, channel, id) = (self.clone(), channel.to_owned(), id.to_owned());
        tokio::spawn(async move {
            let mut redis = hub.link.commands();
            let stored: Result<Option<String>, _> = redis.hget(&key, &field).await;
            let record = stored.map(|stored| stored.map(|stored| records::read(&id, &stored)));
            let event = match record {
                Ok(Some(Ok(record))) => SessionEvent::CallHanded(Arc::new(record)),
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
    async fn resubscribe(&self, mut connected: Sink) -> bool {
        let mut sink = self.sink.lock().await;
        for channel in self.wanted() {
            if connected.subscribe(&channel).await.is_err() {
                if !matches!(connected, Sink::Sharded(_)) {
                    return false;
                }
                self.strays().insert(channel);
            }
        }
        *sink = Some(connected);
        drop(sink);
        self.missed_all();
        true
    }

    fn strays(&self) -> std::sync::MutexGuard<'_, std::collections::HashSet<String>> {
        self.stray
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// On a Cluster: subscribes again to the channels whose shard was unreachable; the
    /// readers of each that succeeds look again (`Missed`).
    async fn retry_strays(&self) {
        let strays: Vec<String> = self.strays().drain().collect();
        if strays.is_empty() {
            return;
        }
        let mut sink = self.sink.lock().await;
        let Some(connected) = sink.as_mut() else {
            return;
        };
        for channel in strays {
            let wanted = self.channels().contains_key(&channel);
            if !wanted {
                continue;
            }
            if connected.subscribe(&channel).await.is_ok() {
                self.announce(&channel, SessionEvent::Missed);
            } else {
                self.strays().insert(channel);
            }
        }
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
            connected.unsubscribe(&unused).await;
        }
    }
}

/// Where the hub subscribes: its own pub/sub connection to the primary, or the cluster
/// connection (sharded pub/sub). Every operation is bounded by [`RESPONSE_TIMEOUT`].
enum Sink {
    Plain(redis::aio::PubSubSink),
    Sharded(redis::cluster_async::ClusterConnection),
}

impl Sink {
    async fn subscribe(&mut self, channel: &str) -> redis::RedisResult<()> {
        let subscribed = match self {
            Self::Plain(sink) => {
                tokio::time::timeout(RESPONSE_TIMEOUT, sink.subscribe(channel)).await
            }
            Self::Sharded(cluster) => {
                tokio::time::timeout(RESPONSE_TIMEOUT, cluster.ssubscribe(channel)).await
            }
        };
        subscribed.unwrap_or_else(|_| Err(timed_out()))
    }

    /// Unsubscribes from `channels` (on a Cluster one by one: they live on several shards).
    async fn unsubscribe(&mut self, channels: &[String]) {
        match self {
            Self::Plain(sink) => {
                let _ = tokio::time::timeout(RESPONSE_TIMEOUT, sink.unsubscribe(channels)).await;
            }
            Self::Sharded(cluster) => {
                for channel in channels {
                    let _ =
                        tokio::time::timeout(RESPONSE_TIMEOUT, cluster.sunsubscribe(channel)).await;
                }
            }
        }
    }

    async fn ping(&mut self) -> redis::RedisResult<()> {
        let pinged = match self {
            Self::Plain(sink) => {
                tokio::time::timeout(RESPONSE_TIMEOUT, sink.ping::<redis::Value>())
                    .await
                    .map(|pinged| pinged.map(|_| ()))
            }
            Self::Sharded(cluster) => {
                let mut connection = Connection::Cluster(cluster.clone());
                tokio::time::timeout(RESPONSE_TIMEOUT, connection.ping()).await
            }
        };
        pinged.unwrap_or_else(|_| Err(timed_out()))
    }
}

/// Keeps the hub hearing its events, the one way or the other (see [`Sink`]).
async fn listen(hub: Weak<EventHub>) {
    let Some(strong) = hub.upgrade() else { return };
    let events = strong.link.events();
    drop(strong);
    match events {
        Events::Plain(_) => listen_plain(hub).await,
        Events::Sharded(cluster, Some(pushes)) => listen_sharded(hub, cluster, pushes).await,
        Events::Sharded(_, None) => {
            tracing::error!("a second event hub on one Redis Cluster link hears nothing");
        }
    }
}

/// Keeps the hub's pub/sub connection: connects, subscribes to what is wanted, delivers
/// messages, and on a drop, or when Redis fails over to another primary, reconnects (with
/// `Missed` for everyone, as messages may be lost).
async fn listen_plain(hub: Weak<EventHub>) {
    let mut delay = Duration::from_millis(100);
    loop {
        let Some(strong) = hub.upgrade() else { return };
        let mut failed_over = strong.link.primary_changed();
        failed_over.mark_unchanged();
        let Events::Plain(client) = strong.link.events() else {
            return;
        };
        match tokio::time::timeout(RESPONSE_TIMEOUT, client.get_async_pubsub())
            .await
            .unwrap_or_else(|_| Err(timed_out()))
        {
            Ok(pubsub) => {
                let (sink, mut stream) = pubsub.split();
                let subscribed = strong.resubscribe(Sink::Plain(sink)).await;
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

/// Hears a Cluster's sharded messages: subscribes to what is wanted through the cluster
/// connection, delivers what its shards send, and when a shard's connection drops (the
/// connection subscribes there again by itself) or a subscription failed, tells everyone to
/// look again.
async fn listen_sharded(
    hub: Weak<EventHub>,
    cluster: redis::cluster_async::ClusterConnection,
    mut pushes: tokio::sync::mpsc::UnboundedReceiver<redis::PushInfo>,
) {
    let mut delay = Duration::from_millis(100);
    loop {
        let Some(strong) = hub.upgrade() else { return };
        if strong.resubscribe(Sink::Sharded(cluster.clone())).await {
            drop(strong);
            delay = Duration::from_millis(100);
            let mut sweep = tokio::time::interval(Duration::from_secs(30));
            let mut strays = tokio::time::interval(Duration::from_secs(1));
            loop {
                let Some(strong) = hub.upgrade() else { return };
                tokio::select! {
                    _ = strays.tick() => strong.retry_strays().await,
                    push = pushes.recv() => {
                        let Some(push) = push else { return };
                        match push.kind {
                            redis::PushKind::SMessage => {
                                let mut data = push.data.into_iter();
                                let channel: Option<String> =
                                    data.next().and_then(|value| redis::from_redis_value(value).ok());
                                let payload: Option<String> =
                                    data.next().and_then(|value| redis::from_redis_value(value).ok());
                                if let (Some(channel), Some(payload)) = (channel, payload) {
                                    strong.deliver(&channel, &payload);
                                }
                            }
                            redis::PushKind::Disconnection => strong.missed_all(),
                            _ => {}
                        }
                    }
                    () = strong.reconnect.notified() => break,
                    _ = sweep.tick() => strong.unsubscribe_unused().await,
                }
            }
            tracing::warn!("a Redis Cluster subscription failed; subscribing again");
        } else {
            drop(strong);
            tracing::warn!("the Redis Cluster's events are not reachable yet; retrying");
        }
        if let Some(hub) = hub.upgrade() {
            *hub.sink.lock().await = None;
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(Duration::from_secs(5));
    }
}
