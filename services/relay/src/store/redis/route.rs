//! Calls routed to the replica that holds their tab (`REPLICA_URL`).
//!
//! Without routing, a call crosses Redis twice: queued, it is announced on the session's
//! channel for the replica holding the tab; finished, it is announced again for the replica
//! holding the caller. With routing, the queueing script names the tab's replica instead of
//! announcing (`lua/flat_enqueue.lua`): on this replica the call is handed to the tab in the
//! process; on another it is sent there over gRPC (`Forward`) and its answer comes back on the
//! same stream. The finishing replica, which holds the call's waiter, tells it itself and the
//! finish script announces nothing (`lua/flat_finish.lua`'s `quiet`). Redis keeps the durable
//! record all the same (queued, finished: two writes), and the announcements stay the way in
//! for everything else: a forward that fails (the tab's replica gone, draining or unreachable)
//! announces the call on the session's channel at once, and that replica is passed over for a
//! while; a waiter elsewhere (a caller that asked again through another replica) has the
//! answer announced.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;
use tonic::metadata::MetadataValue;
use tonic::transport::{Channel, Endpoint};
use toolrelay::proto::v1 as pb;
use toolrelay::proto::v1::relay_client::RelayClient;

use super::RedisStore;
use super::hub::EventHub;
use super::link::Link;
use super::records;
use crate::access::GATEWAY_PROOF_METADATA;
use crate::clock::{Clock, Timestamp};
use crate::code::SessionCode;
use crate::config::Routing;
use crate::locked;
use crate::metrics::{Metrics, Route};
use crate::store::{CallNews, RequestRecord, SessionEvent};

/// How long a replica a forward failed on is passed over (its calls announced on Redis).
const PASS_OVER: Duration = Duration::from_secs(5);
/// How many calls may be held for their answers here before the overdue ones are forgotten.
const SWEEP_OVER: usize = 1024;

/// Where calls are routed, and the calls whose waiter is on this replica.
pub(super) struct Router {
    /// Where the other replicas reach this one (`REPLICA_URL`).
    pub(super) me: String,
    /// This replica's proof to the others (the gateway secret).
    proof: MetadataValue<tonic::metadata::Ascii>,
    /// Whether events go by sharded pub/sub (a Cluster).
    sharded: bool,
    clock: Clock,
    metrics: Metrics,
    /// Routed calls whose waiter is on this replica (`<key base><id>`), until their deadline:
    /// their answer is told here, not announced on Redis.
    held: Mutex<HashMap<String, Timestamp>>,
    /// Replicas a forward failed on, until when they are passed over.
    passed_over: Mutex<HashMap<String, Instant>>,
    /// A connection to each replica forwarded to, made on first use.
    channels: Mutex<HashMap<String, Channel>>,
}

/// A routed call held here for its answer; no longer when dropped.
pub(super) struct Held {
    router: Arc<Router>,
    key: String,
}

impl Drop for Held {
    fn drop(&mut self) {
        self.router.release(&self.key);
    }
}

impl Router {
    pub(super) fn new(
        routing: &Routing,
        sharded: bool,
        clock: Clock,
        metrics: Metrics,
    ) -> Result<Arc<Self>, String> {
        let proof = MetadataValue::try_from(routing.proof.as_str())
            .map_err(|_| "the gateway secret must be printable ASCII".to_owned())?;
        Ok(Arc::new(Self {
            me: routing.url.clone(),
            proof,
            sharded,
            clock,
            metrics,
            held: Mutex::new(HashMap::new()),
            passed_over: Mutex::new(HashMap::new()),
            channels: Mutex::new(HashMap::new()),
        }))
    }

    /// The replicas passed over now, as the queueing script takes them: ` <url> <url> `.
    pub(super) fn avoided(&self) -> String {
        let now = Instant::now();
        let mut passed_over = locked(&self.passed_over);
        passed_over.retain(|_, until| *until > now);
        let mut avoided = String::from(" ");
        for url in passed_over.keys() {
            avoided.push_str(url);
            avoided.push(' ');
        }
        avoided
    }

    fn pass_over(&self, url: &str) {
        locked(&self.passed_over).insert(url.to_owned(), Instant::now() + PASS_OVER);
    }

    /// Holds the call `key` here for its answer until `deadline`, or until it is answered
    /// here ([`Router::release`]).
    pub(super) fn hold_until(&self, key: String, deadline: Timestamp) {
        let mut held = locked(&self.held);
        if held.len() >= SWEEP_OVER {
            // Calls expired or cancelled are announced on Redis: what is overdue goes.
            let now = self.clock.now();
            held.retain(|_, until| *until > now);
        }
        held.insert(key, deadline);
    }

    /// [`Router::hold_until`], for as long as the guard lives.
    pub(super) fn hold(self: &Arc<Self>, key: String, deadline: Timestamp) -> Held {
        self.hold_until(key.clone(), deadline);
        Held {
            router: self.clone(),
            key,
        }
    }

    /// Whether the call `key`'s waiter is on this replica.
    pub(super) fn holds(&self, key: &str) -> bool {
        locked(&self.held).contains_key(key)
    }

    pub(super) fn release(&self, key: &str) {
        locked(&self.held).remove(key);
    }

    pub(super) fn counted(&self, way: Route) {
        self.metrics.routed(way);
    }

    fn client(&self, url: &str) -> Result<RelayClient<Channel>, String> {
        let mut channels = locked(&self.channels);
        if let Some(channel) = channels.get(url) {
            return Ok(RelayClient::new(channel.clone()));
        }
        let channel = Endpoint::from_shared(url.to_owned())
            .map_err(|error| format!("{url} is not a usable replica URL: {error}"))?
            .connect_timeout(Duration::from_secs(2))
            .tcp_nodelay(true)
            .http2_keep_alive_interval(Duration::from_secs(10))
            .keep_alive_timeout(Duration::from_secs(5))
            .connect_lazy();
        channels.insert(url.to_owned(), channel.clone());
        Ok(RelayClient::new(channel))
    }

    /// Sends `record` (queued in the session with key base `base`, code `code`) to the replica
    /// at `url`, which holds its tab, and tells this replica's waiter its answer. When that
    /// replica cannot take it, the call is announced on the session's channel (whoever holds
    /// the tab hears of it there) and the replica is passed over for a while. Ends at the
    /// call's deadline at the latest.
    pub(super) fn forward(
        self: &Arc<Self>,
        events: Arc<EventHub>,
        link: Arc<Link>,
        base: String,
        code: String,
        url: String,
        record: RequestRecord,
    ) {
        let router = self.clone();
        let deadline = self.clock.instant(record.deadline);
        tokio::spawn(async move {
            let channel = format!("{base}ev");
            let id = record.id.clone();
            let told = |news: CallNews| {
                events.announce(
                    &channel,
                    SessionEvent::News {
                        id: id.clone(),
                        news: Box::new(news),
                    },
                );
            };
            let sent = tokio::time::timeout_at(
                deadline,
                router.send(&url, code, records::pack(&record), told),
            )
            .await;
            match sent {
                Ok(Ok(answer)) if answer.is_empty() => {}
                Ok(Ok(answer)) => match records::unpack(&answer) {
                    Ok(record) => events.announce(
                        &channel,
                        SessionEvent::ResponseReady {
                            id,
                            record: Some(Arc::new(record)),
                        },
                    ),
                    Err(_) => events.announce(&channel, SessionEvent::Missed),
                },
                Ok(Err(error)) => {
                    tracing::warn!(replica = %url, %error, "a call could not be routed to its tab's replica: announcing it on Redis, and passing that replica over for 5 s");
                    router.pass_over(&url);
                    router.counted(Route::Fallback);
                    router.announce_handed(&link, &channel, &id).await;
                }
                // Past its deadline: the waiter wakes by itself.
                Err(_) => {}
            }
        });
    }

    /// The `Forward` RPC: the answer, or why there is none; the call's news meanwhile to
    /// `told`.
    async fn send(
        &self,
        url: &str,
        code: String,
        call: String,
        told: impl Fn(CallNews),
    ) -> Result<String, String> {
        let mut client = self.client(url)?;
        let mut request = tonic::Request::new(pb::ForwardRequest {
            code,
            call,
            news: true,
        });
        request
            .metadata_mut()
            .insert(GATEWAY_PROOF_METADATA, self.proof.clone());
        let mut answers = client
            .forward(request)
            .await
            .map_err(|status| status.message().to_owned())?
            .into_inner();
        self.counted(Route::Forwarded);
        loop {
            match answers.message().await {
                Ok(Some(event)) if !event.news.is_empty() => {
                    // News unread is a hint lost: the answer still comes.
                    if let Ok(news) = serde_json::from_str(&event.news) {
                        told(news);
                    }
                }
                answered => return Self::answered(answered, &mut answers).await,
            }
        }
    }

    /// The end of a `Forward` stream: its answer, or why there is none.
    async fn answered(
        answered: Result<Option<pb::ForwardEvent>, tonic::Status>,
        answers: &mut tonic::Streaming<pb::ForwardEvent>,
    ) -> Result<String, String> {
        match answered {
            Ok(Some(event)) => {
                // Read to the stream's end (the other replica ends it after the answer): a
                // stream dropped before its end is reset, and a peer resetting many streams
                // is cut off by HTTP/2's rapid-reset guard (every call on the connection lost).
                let _ = answers.message().await;
                Ok(event.answer)
            }
            Ok(None) => Err("the replica ended the call's stream without its answer".to_owned()),
            Err(status) => Err(status.message().to_owned()),
        }
    }

    /// Announces the call `id`, handed to the session's tab but not announced, on the session's
    /// channel: the replica holding the tab reads it there (`h:`).
    async fn announce_handed(&self, link: &Link, channel: &str, id: &str) {
        let published: Result<i64, _> =
            redis::cmd(if self.sharded { "SPUBLISH" } else { "PUBLISH" })
                .arg(channel)
                .arg(format!("h:{id}"))
                .query_async(&mut link.commands())
                .await;
        if let Err(error) = published {
            // Lost as any announcement lost with Redis' connection: the tab's replica hears
            // `Missed` from its own and looks again.
            tracing::warn!(%error, "could not announce a call whose route failed");
        }
    }
}

impl RedisStore {
    /// Hands a call the queueing script routed (`routed`: 'local', or the URL of the replica
    /// holding the session's tab; '' when it announced it) to its tab.
    pub(super) fn hand_routed(&self, code: &SessionCode, record: &RequestRecord, routed: &str) {
        let Some(router) = self.router.as_ref().filter(|_| !routed.is_empty()) else {
            return;
        };
        let base = self.base(code);
        if routed == "local" {
            router.hold_until(format!("{base}{}", record.id), record.deadline);
            router.counted(Route::Local);
            self.handed_here(&base, record.clone());
        } else {
            router.forward(
                self.events.clone(),
                self.link.clone(),
                base,
                code.as_str().to_owned(),
                routed.to_owned(),
                record.clone(),
            );
        }
    }

    /// Tells this replica's listeners of the session with key base `base` that `record` was
    /// handed to its tab (what its announcement on Redis would): a routed call is not announced.
    pub(super) fn handed_here(&self, base: &str, record: RequestRecord) {
        self.events.announce(
            &format!("{base}ev"),
            SessionEvent::CallHanded(Arc::new(record)),
        );
    }

    /// Tells this replica's listeners of the session that `record` finished (what its
    /// announcement on Redis would): a routed call's answer is not announced.
    pub(super) fn told_here(&self, code: &SessionCode, record: &RequestRecord) {
        self.events.announce(
            &format!("{}ev", self.base(code)),
            SessionEvent::ResponseReady {
                id: record.id.clone(),
                record: Some(Arc::new(record.clone())),
            },
        );
    }
}
