//! The provider side of a session: attaching a connection, delivering calls to it, heartbeats,
//! replacement (the polling fallback is `relay/polling.rs`).
//!
//! [`Relay::attach`] returns a [`ProviderLink`]: a transport forwards what arrives from the
//! provider into `uplink` and writes what comes out of `downlink` to the provider, and that is
//! all it does. The link's [`LinkDriver`] owns the rest: it delivers queued calls (and, after a
//! reconnect, calls delivered to an earlier connection and never answered), handles
//! registrations, responses and pings, sends heartbeats that keep the session alive, and ends
//! the connection when the session ends, another connection replaces it, the tab stops
//! answering pings, or the relay stops. When `downlink` ends, the transport closes the
//! connection. What the connection knows and decides is its core, [`connection`]'s
//! `TabConnection`, with no IO in it; the driver feeds it and performs what it asks.
//!
//! The driver is a future, not a task: a WebSocket tab runs it in its socket's task
//! ([`crate::ws`]), so a call delivered to it wakes one task, not two; transports whose work
//! lives elsewhere (a gRPC stream, an SSE body) spawn it ([`ProviderLink::spawn_driver`]). Either
//! way it sees the transport's end as `uplink` dropped and records the provider's departure. A
//! driver dropped without having run is spawned, so a link taken apart or dropped still
//! detaches cleanly.

use std::pin::Pin;
use std::time::Duration;

use tokio::time::Instant;

use futures::StreamExt;
use toolrelay::wire::{ProviderFrame, ProviderResponse, RequestStatus};

use crate::channel::{self, Receiver, Sender};
use crate::clock::Timestamp;
use crate::code::SessionCode;
use crate::drain::Hold;
use crate::error::RelayError;
use crate::metrics::{AnsweredBy, Connected};
use crate::relay::Relay;
use crate::relay::approvals::Decision;
use crate::relay::tabs::{Attended, Watch};
use crate::store::{Answerer, Claim, EventStream, ProviderInfo, Transport};

pub use crate::downlink::{Downlink, HandedCall, Refusal, receipt};

mod connection;
mod delivered;
mod retry;
mod shown;

pub use connection::Uplink;
use connection::{DrainStage, Effect, Effects, Ending, Served, TabConnection};
pub(crate) use connection::{bounded_log, bounded_progress};
pub(crate) use delivered::Delivered;
use retry::{Delivery, Retry};

/// Frames a slow provider may fall behind by before the driver waits for it.
const DOWNLINK_BUFFER: usize = 128;
/// Frames from the provider waiting to be handled.
const UPLINK_BUFFER: usize = 64;
/// Calls claimed at a time.
const CLAIM_BATCH: usize = 32;
/// Most calls a redelivering claim hands out (one claim: it would return the same calls
/// again in batches). Far above what a session may have waiting.
const REDELIVER_LIMIT: usize = 100_000;

/// One attached provider connection, as its transport sees it.
#[derive(Debug)]
pub struct ProviderLink {
    /// The session.
    pub code: SessionCode,
    /// This connection's id.
    pub connection_id: String,
    /// Messages for the provider, in order; ends when the connection should close.
    pub downlink: Receiver<Downlink>,
    /// Messages from the provider, and word that its transport heard from it. Dropping it
    /// means the provider went away.
    pub uplink: Sender<Uplink>,
    /// What serves the connection on the relay's side, for the transport to run in its own
    /// task or to spawn ([`ProviderLink::spawn_driver`]); `None` for a link to a relay
    /// elsewhere, whose driver runs there.
    pub driver: Option<LinkDriver>,
}

impl ProviderLink {
    /// Runs the link's driver in a task of its own, for a transport whose work does not live in
    /// one task it could share (a gRPC stream, an SSE body).
    pub fn spawn_driver(&mut self) {
        if let Some(driver) = self.driver.take() {
            tokio::spawn(driver.run());
        }
    }
}

/// A provider connection's driver, not running yet: [`LinkDriver::run`] is the connection's
/// whole life on the relay's side, and ends once the connection has ended and its departure is
/// recorded. Dropped without having run, it is spawned (inside a Tokio runtime): an attached
/// connection is always served, and always detached.
pub struct LinkDriver(Option<Box<Start>>);

/// What a driver starts from.
struct Start {
    driver: Driver,
    core: Box<Core>,
    max_expires_at: Timestamp,
    events: EventStream,
    attended: Attended,
    uplink: Receiver<Uplink>,
}

impl Start {
    /// The driver's future alone (not an `async fn`, whose future would keep a moved-out copy
    /// of `self` beside it).
    fn run(self) -> impl Future<Output = ()> + Send + 'static {
        self.driver.run(
            self.core,
            self.max_expires_at,
            self.events,
            self.attended,
            self.uplink,
        )
    }
}

impl LinkDriver {
    /// Serves the connection until it ends, then records the provider's departure.
    pub async fn run(mut self) {
        if let Some(start) = self.0.take() {
            Start::run(*start).await;
        }
    }
}

impl Drop for LinkDriver {
    fn drop(&mut self) {
        if let Some(start) = self.0.take()
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            runtime.spawn(Start::run(*start));
        }
    }
}

impl std::fmt::Debug for LinkDriver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LinkDriver").finish_non_exhaustive()
    }
}

impl Relay {
    /// Attaches a provider connection to a session (the provider token is required),
    /// replacing any other connection of that session.
    pub async fn attach(
        &self,
        code: &str,
        token: Option<&str>,
        transport: Transport,
    ) -> Result<ProviderLink, RelayError> {
        self.accepting()?;
        let (code, found) = self.authorized(code, token).await?;
        // Subscribe before anything can be queued for this connection, so nothing is missed.
        let events = self.subscribe(&code).await?;
        // Its replica recorded alive, and the connection attended here, before it is the
        // session's provider: every replica sees it as connected from then on.
        self.keep_replica_alive(false).await?;
        let connection_id = self.new_connection_id();
        let attended = self.attend(&code, &connection_id, found.expires_at);
        let now = self.now();
        let provider = ProviderInfo {
            connection_id: connection_id.clone(),
            transport,
            connected_at: now,
            last_seen: now,
        };
        self.store()
            .set_provider(&code, provider)
            .await?
            .ok_or_else(|| crate::relay::not_found(&code))?;
        let session = self.touch(&code, Some(&connection_id)).await?;
        attended.watch.seen_expiring(session.expires_at);
        tracing::info!(code = %code.redacted(), transport = transport.as_str(), "provider attached");

        let (down_tx, downlink) = channel::channel(DOWNLINK_BUFFER);
        let (uplink, up_rx) = channel::channel(UPLINK_BUFFER);
        let driver = Driver {
            relay: self.clone(),
            code: code.clone(),
            transport,
            down: down_tx,
            watch: attended.watch.clone(),
        };
        let (drain, metrics) = (self.drain().clone(), self.metrics().clone());
        let core = TabConnection::new(connection_id.clone(), move || {
            (drain.hold(), metrics.call_handed())
        });
        let driver = LinkDriver(Some(Box::new(Start {
            driver,
            core: Box::new(core),
            max_expires_at: session.max_expires_at,
            events,
            attended,
            uplink: up_rx,
        })));
        Ok(ProviderLink {
            driver: Some(driver),
            code,
            connection_id,
            downlink,
            uplink,
        })
    }
}

/// What serves one connection on the relay's side: it feeds the connection's core
/// ([`TabConnection`]) what happens and performs the effects it asks for.
struct Driver {
    relay: Relay,
    code: SessionCode,
    transport: Transport,
    down: Sender<Downlink>,
    /// What it shares with the replica's upkeep: when the session expires, whether to look.
    watch: std::sync::Arc<Watch>,
}

/// A connection's core, as the driver keeps it: each delivered call holds the drain open and
/// counts in the queue depth until it is answered.
type Core = TabConnection<(Hold, Connected)>;

/// The provider went away while the driver was sending.
struct Gone;

impl Driver {
    async fn run(
        self,
        mut core: Box<Core>,
        max_expires_at: Timestamp,
        events: EventStream,
        mut attended: Attended,
        mut uplink: Receiver<Uplink>,
    ) {
        let _connected = self.relay.metrics().provider_connected(self.transport);
        let ending = self
            .serve(
                &mut core,
                max_expires_at,
                events,
                &mut attended,
                &mut uplink,
            )
            .await;
        // Answers the provider sent just before the connection ended still count.
        uplink.close();
        while let Ok(frame) = uplink.try_recv() {
            if let Uplink::Frame(ProviderFrame::Response(response)) = frame
                && let Err(error) = Box::pin(self.record(core.connection_id(), *response)).await
            {
                tracing::debug!(code = %self.code.redacted(), %error, "a last answer was refused");
            }
        }
        match ending {
            Ending::Closed => {
                tracing::info!(code = %self.code.redacted(), "provider connection closed by the relay");
            }
            Ending::Moved => {
                // The session keeps this connection as its provider until the tab's next one
                // replaces it: meanwhile the other relays see a tab there (this replica is
                // alive) and their callers wait for it, rather than hear that no tab is
                // connected. (A tab that never comes back stops counting with this replica.)
                tracing::info!(code = %self.code.redacted(), "provider told to move to another relay");
                return;
            }
            Ending::Silent => {
                tracing::info!(code = %self.code.redacted(), "provider answered no ping: dropped");
            }
            Ending::Disconnected => {
                tracing::info!(code = %self.code.redacted(), "provider disconnected")
            }
        }
        // Requests delivered to this connection stay delivered to it: the next connection
        // claims them again, because they are not delivered to *it*.
        let connection_id = core.connection_id();
        if let Err(error) = self
            .relay
            .store()
            .clear_provider(&self.code, connection_id)
            .await
        {
            tracing::warn!(code = %self.code.redacted(), %error, "could not record the provider's departure; trying again later");
            self.relay.clear_later(&self.code, connection_id);
        }
    }

    /// Feeds the core until the connection ends. Biased: frames the provider already sent
    /// (answers above all) are taken before anything that could end the connection.
    async fn serve(
        &self,
        core: &mut Core,
        max_expires_at: Timestamp,
        mut events: EventStream,
        attended: &mut Attended,
        uplink: &mut Receiver<Uplink>,
    ) -> Ending {
        // What the loop awaits besides its events is boxed: the future of this function is
        // what an idle tab's task keeps, and the work it waits for is short-lived.
        let period = self.relay.config().heartbeat_interval;
        let mut heartbeat = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
        heartbeat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let end_of_life = self.relay.clock().instant(max_expires_at);
        let mut end_of_life = Box::pin(tokio::time::sleep_until(end_of_life));
        let mut drained = std::pin::pin!(self.relay.drain().ended());
        let mut handing_over = std::pin::pin!(self.relay.drain().handing_over());
        let mut retry = Retry::new();
        let mut fx = Effects::new();
        core.start(self.code.clone(), self.expires_at(), &mut fx);
        loop {
            match Box::pin(self.perform(core, &mut fx, &mut retry)).await {
                Ok(Some(ending)) => return ending,
                Ok(None) => {}
                Err(Gone) => return Ending::Disconnected,
            }
            tokio::select! {
                biased;
                frame = uplink.recv() => match frame {
                    Some(up) => core.on_frame(up, self.expires_at(), Instant::now(), &mut fx),
                    None => return Ending::Disconnected,
                },
                () = &mut drained => core.on_drain(DrainStage::Ended, &mut fx),
                () = &mut handing_over, if !core.is_moving() => core.on_drain(DrainStage::HandingOver, &mut fx),
                // A store operation failed: a claim whose reply was lost may have run.
                () = retry.due() => fx.push_back(Effect::Claim { redeliver: true }),
                event = events.next() => core.on_event(event, &mut fx),
                notice = attended.notices.recv() => core.on_notice(notice, &mut fx),
                // The relay's own heartbeat, from what the upkeep knows: it costs the store
                // nothing (the upkeep keeps the session alive for every tab at once).
                _ = heartbeat.tick() => core.on_tick(self.expires_at(), &mut fx),
                // A progress report that waited for its turn (at most 4 a second a call).
                () = progress_due(core.next_progress_due()) => core.on_progress_due(Instant::now(), &mut fx),
                () = &mut end_of_life => core.on_end_of_life(&mut fx),
                () = self.down.closed() => return Ending::Disconnected,
            }
        }
    }

    /// Performs the effects the core asked for, in order, feeding it what each came to; the
    /// connection's end once it asks for it.
    async fn perform(
        &self,
        core: &mut Core,
        fx: &mut Effects,
        retry: &mut Retry,
    ) -> Result<Option<Ending>, Gone> {
        while let Some(effect) = fx.pop_front() {
            match effect {
                Effect::Send(message) => self.send(message).await?,
                Effect::End(ending) => return Ok(Some(ending)),
                Effect::Claim { redeliver } => {
                    let redeliver = redeliver || retry.owed;
                    let delivered = self.claim(core, redeliver, fx).await;
                    retry.after(redeliver, delivered);
                }
                Effect::Doubt => self.watch.doubt(),
                effect => Box::pin(self.ask(core, effect, fx)).await,
            }
        }
        Ok(None)
    }

    /// Performs an effect that asks the relay or its store, and feeds the core the answer.
    async fn ask(&self, core: &mut Core, effect: Effect, fx: &mut Effects) {
        let code = &self.code;
        match effect {
            Effect::Record(response) => {
                let request_id = response.request_id.clone();
                let recorded = self.record(core.connection_id(), *response).await;
                core.on_recorded(request_id, recorded, fx);
            }
            Effect::Register { tools, approves } => {
                let registered = match self.relay.set_approving(code, approves).await {
                    Ok(()) => {
                        let connection = Some(core.connection_id());
                        self.relay.install_manifest(code, &tools, connection).await
                    }
                    Err(error) => Err(error),
                };
                let reply = registered.map(|tools| Some(Downlink::Registered { tools }));
                core.on_outcome(reply, fx);
            }
            Effect::Decide { caller_id, allow } => {
                let decision = if allow {
                    Decision::Allow
                } else {
                    Decision::Deny
                };
                let decided = self.relay.decide(code, &caller_id, None, decision).await;
                core.on_outcome(decided.map(|_| None), fx);
            }
            Effect::Disconnect { caller_id } => {
                let disconnected = self.relay.disconnect_caller(code, &caller_id).await;
                core.on_outcome(disconnected.map(|()| None), fx);
            }
            Effect::ShowApprovals => match self.relay.approval_view(code).await {
                Ok(view) => core.on_approvals(view, fx),
                Err(error) => {
                    tracing::debug!(code = %code.redacted(), %error, "could not read the session's approvals");
                }
            },
            Effect::CheckProvider { after_missed } => {
                let served = self.served(core.connection_id()).await;
                core.on_provider(served, after_missed, fx);
            }
            Effect::CheckCancelled(id) => {
                let cancelled = match self.relay.store().request(code, &id).await {
                    Ok(Some(record)) => record.status == RequestStatus::Cancelled,
                    _ => false,
                };
                core.on_checked(id, cancelled, fx);
            }
            Effect::CheckAnswered(ids) => core.on_answered(self.answered(ids).await, fx),
            // News is a hint: one the store could not take is dropped.
            Effect::Progress(report) => {
                if let Err(error) = self.relay.report_progress(code, *report).await {
                    tracing::debug!(code = %code.redacted(), %error, "could not pass on a call's progress");
                }
            }
            Effect::Log { calls, log } => {
                if let Err(error) = self.relay.report_log(code, &calls, &log).await {
                    tracing::debug!(code = %code.redacted(), %error, "could not pass on a tab's log message");
                }
            }
            Effect::Send(_) | Effect::End(_) | Effect::Claim { .. } | Effect::Doubt => {}
        }
    }

    /// Which of these calls have their answer (or are gone); a store error counts as not.
    async fn answered(&self, ids: Vec<String>) -> Vec<String> {
        let mut answered = Vec::new();
        for id in ids {
            let done = match self.relay.store().request(&self.code, &id).await {
                Ok(Some(record)) => record.status.is_terminal(),
                Ok(None) => true,
                Err(_) => false,
            };
            if done {
                answered.push(id);
            }
        }
        answered
    }

    /// Claims the calls this connection may have — new ones, and ones delivered to an earlier
    /// connection and never answered (with `redeliver`, also the ones recorded as delivered to
    /// this connection: a claim whose reply timed out, or an event that handed one over, may
    /// have been lost) — and gives them to the core. A full batch asks for the next claim after
    /// the calls it brought are sent, so a long queue reaches the tab as it is claimed.
    async fn claim(&self, core: &mut Core, redeliver: bool, fx: &mut Effects) -> Delivery {
        if self.relay.drain().is_handing_over() {
            return Delivery::All;
        }
        let now = self.relay.now();
        let claim = Claim {
            connection_id: core.connection_id().to_owned(),
            now,
            // A pushed call stays with this connection for as long as it lives.
            lease_until: now.plus(self.relay.config().request_timeout + Duration::from_secs(1)),
            // One redelivering claim: a second would hand out the same calls again.
            limit: if redeliver {
                REDELIVER_LIMIT
            } else {
                CLAIM_BATCH
            },
            redeliver,
        };
        let claimed = match self.relay.store().claim(&self.code, &claim).await {
            Ok(claimed) => claimed,
            Err(error) => {
                tracing::warn!(code = %self.code.redacted(), %error, "could not claim calls for the provider");
                self.watch.doubt();
                return Delivery::Failed;
            }
        };
        // A redelivering claim took everything claimable at once.
        let full = !redeliver && claimed.len() >= CLAIM_BATCH;
        core.on_claimed(claimed.into_iter().map(std::sync::Arc::new), fx);
        if full {
            fx.push_back(Effect::Claim { redeliver: false });
        }
        Delivery::All
    }

    /// Records the tab's answer.
    async fn record(
        &self,
        connection_id: &str,
        response: ProviderResponse,
    ) -> Result<crate::relay::ResponseOutcome, RelayError> {
        self.relay
            .accept_response(
                &self.code,
                response,
                AnsweredBy::Provider(self.transport),
                Answerer::Connection(connection_id),
            )
            .await
    }

    /// Who serves the session.
    async fn served(&self, connection_id: &str) -> Served {
        match self.relay.store().session(&self.code).await {
            Ok(Some(session)) => {
                let here = session
                    .provider
                    .as_ref()
                    .is_some_and(|provider| provider.connection_id == connection_id);
                if here {
                    Served::Here
                } else {
                    Served::Elsewhere
                }
            }
            Ok(None) => Served::Gone,
            Err(error) => {
                tracing::warn!(code = %self.code.redacted(), %error, "could not check the session's provider");
                Served::Unknown
            }
        }
    }

    /// When the session expires, as the replica's upkeep last saw it.
    fn expires_at(&self) -> Timestamp {
        self.watch.expires_at()
    }

    async fn send(&self, message: Downlink) -> Result<(), Gone> {
        self.down.send(message).await.map_err(|_| Gone)
    }
}

/// Sleeps until `at`, or forever when there is nothing to wait for.
fn progress_due(at: Option<Instant>) -> Pin<Box<dyn Future<Output = ()> + Send>> {
    match at {
        Some(at) => Box::pin(tokio::time::sleep_until(at)),
        None => Box::pin(std::future::pending()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An idle tab's driver is resident for as long as the tab stays (in its socket's task):
    /// its future (the state machine of `Driver::run`) is what every idle tab pays
    /// (BENCHMARKS.md).
    #[tokio::test]
    async fn an_idle_drivers_task_stays_small() {
        use crate::clock::Clock;
        use crate::metrics::Metrics;
        use crate::store::memory::{MemoryStore, StoreLimits};
        let config = crate::config::RelayConfig::default();
        let clock = Clock::new();
        let limits = StoreLimits::keeping(config.response_retention);
        let store = MemoryStore::observed(clock.clone(), limits, Metrics::default());
        let relay = Relay::new(store, config, clock, Metrics::default());
        let relay_drain = relay.drain().clone();
        let (down, _downlink) = channel::channel(1);
        let (_uplink, up_rx) = channel::channel(1);
        let code = SessionCode::generate();
        let now = Timestamp(0);
        let attended = relay.attend(&code, "c", now);
        let driver = Driver {
            relay,
            code,
            transport: Transport::WebSocket,
            down,
            watch: attended.watch.clone(),
        };
        let (drain, metrics) = (relay_drain, Metrics::default());
        let core = TabConnection::new("c".into(), move || (drain.hold(), metrics.call_handed()));
        let events: EventStream = Box::pin(futures::stream::empty());
        let running = driver.run(Box::new(core), now, events, attended, up_rx);
        let size = std::mem::size_of_val(&running);
        // 2,248 bytes before the work it awaits was boxed.
        assert!(size <= 1200, "a driver's future is {size} bytes");
    }

    /// A link's channels keep the slots they grew to for as long as the tab stays, each the
    /// size of a message: the large ones travel boxed. A tab's frames are an answer or a
    /// manifest, both boxed, or a ping.
    #[test]
    fn channel_messages_stay_small() {
        let down = std::mem::size_of::<Downlink>();
        assert!(down <= 40, "a Downlink is {down} bytes");
        let up = std::mem::size_of::<ProviderFrame>();
        assert!(up <= 16, "a ProviderFrame is {up} bytes");
    }
}
