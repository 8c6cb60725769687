//! The provider side of a session: attaching a connection, delivering calls to it, heartbeats,
//! replacement (the polling fallback is `relay/polling.rs`).
//!
//! [`Relay::attach`] returns a [`ProviderLink`]: a transport forwards what arrives from the
//! provider into `uplink` and writes what comes out of `downlink` to the provider, and that is
//! all it does. The link's [`LinkDriver`] owns the rest: it delivers queued calls (and, after a
//! reconnect, calls delivered to an earlier connection and never answered), handles
//! registrations, responses and pings, sends heartbeats that keep the session alive, and ends
//! the connection when the session ends, another connection replaces it, or the relay stops.
//! When `downlink` ends, the transport closes the connection.
//!
//! The driver is a future, not a task: a WebSocket tab runs it in its socket's task
//! ([`crate::ws`]), so a call delivered to it wakes one task, not two; transports whose work
//! lives elsewhere (a gRPC stream, an SSE body) spawn it ([`ProviderLink::spawn_driver`]). Either
//! way it sees the transport's end as `uplink` dropped and records the provider's departure. A
//! driver dropped without having run is spawned, so a link taken apart or dropped still
//! detaches cleanly.

use std::time::Duration;

use futures::StreamExt;
use toolrelay::wire::{ProviderFrame, ProviderResponse, RelayFrame, RequestStatus};

use crate::channel::{self, Receiver, Sender};
use crate::clock::Timestamp;
use crate::code::SessionCode;
use crate::drain::Hold;
use crate::error::RelayError;
use crate::metrics::{AnsweredBy, Connected};
use crate::relay::Relay;
use crate::relay::tabs::{Attended, Notice, Watch};
use crate::store::{
    Answerer, Claim, EventStream, ProviderInfo, RequestRecord, SessionEvent, Transport,
};

pub use crate::downlink::{Downlink, Refusal, receipt};

mod delivered;
mod retry;
mod shown;

use delivered::Delivered;
use retry::{Delivery, Retry};
use shown::Shown;

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
    /// Messages from the provider. Dropping it means the provider went away.
    pub uplink: Sender<ProviderFrame>,
    /// Where the transport may hand the provider's answers straight to the relay instead of
    /// sending them up `uplink` (`None`: send them up, as a gateway relaying to a relay
    /// elsewhere must).
    pub answers: Option<Answers>,
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
    max_expires_at: Timestamp,
    events: EventStream,
    attended: Attended,
    uplink: Receiver<ProviderFrame>,
}

impl Start {
    /// The driver's future alone (not an `async fn`, whose future would keep a moved-out copy
    /// of `self` beside it).
    fn run(self) -> impl Future<Output = ()> + Send + 'static {
        self.driver
            .run(self.max_expires_at, self.events, self.attended, self.uplink)
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

/// A provider's answers recorded by the transport itself: an answer needs nothing of the
/// driver, and going through it would cost a hand-off through `uplink` for every call (and,
/// where the driver has a task of its own, a wake-up of that task).
#[derive(Clone)]
pub struct Answers {
    relay: Relay,
    code: SessionCode,
    /// The connection whose answers these are: it answers only the calls delivered to it.
    connection_id: String,
    by: AnsweredBy,
}

impl Answers {
    /// Records an answer; the frame that tells the provider what became of it (see
    /// [`receipt`]). `None` when the session has ended: the driver tells the provider itself.
    pub async fn accept(&self, response: ProviderResponse) -> Option<RelayFrame> {
        let request_id = response.request_id.clone();
        let recorded = self
            .relay
            .accept_response(
                &self.code,
                response,
                self.by,
                Answerer::Connection(&self.connection_id),
            )
            .await;
        receipt(request_id, recorded).ok().map(Downlink::into_frame)
    }
}

impl std::fmt::Debug for Answers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Answers")
            .field("code", &self.code)
            .finish_non_exhaustive()
    }
}

/// How a driver's connection ended.
enum Ending {
    /// The provider went away.
    Disconnected,
    /// The relay ended it and told the provider why.
    Closed,
    /// The relay hands its tabs over and told the provider to reconnect to another relay.
    Moved,
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
            connection_id: connection_id.clone(),
            transport,
            down: down_tx,
            known: Box::default(),
            watch: attended.watch.clone(),
        };
        let driver = LinkDriver(Some(Box::new(Start {
            driver,
            max_expires_at: session.max_expires_at,
            events,
            attended,
            uplink: up_rx,
        })));
        Ok(ProviderLink {
            driver: Some(driver),
            answers: Some(Answers {
                relay: self.clone(),
                code: code.clone(),
                connection_id: connection_id.clone(),
                by: AnsweredBy::Provider(transport),
            }),
            code,
            connection_id,
            downlink,
            uplink,
        })
    }
}

struct Driver {
    relay: Relay,
    code: SessionCode,
    connection_id: String,
    transport: Transport,
    down: Sender<Downlink>,
    /// What it knows of its connection (boxed: an idle tab's task keeps the driver). A std
    /// mutex: held for a few map operations, never across an `.await`.
    known: Box<std::sync::Mutex<Known>>,
    /// What it shares with the replica's upkeep: when the session expires, whether to look.
    watch: std::sync::Arc<Watch>,
}

/// What a driver knows of its connection, with no IO in it.
#[derive(Default)]
struct Known {
    /// The calls delivered to this connection and not answered yet, each holding a stopping
    /// relay open until it is answered (by any path) or the drain ends and counted in the
    /// queue depth; and the ones it answered last.
    delivered: Delivered<(Hold, Connected)>,
    /// What the tab was last shown of the session's approvals (`None`: nothing yet).
    shown: Option<Shown>,
}

/// The provider went away while the driver was sending.
struct Gone;

impl Driver {
    async fn run(
        self,
        max_expires_at: Timestamp,
        events: EventStream,
        mut attended: Attended,
        mut uplink: Receiver<ProviderFrame>,
    ) {
        let _connected = self.relay.metrics().provider_connected(self.transport);
        let ending = self
            .serve(max_expires_at, events, &mut attended, &mut uplink)
            .await;
        // Answers the provider sent just before the connection ended still count.
        uplink.close();
        while let Ok(frame) = uplink.try_recv() {
            if let ProviderFrame::Response(response) = frame
                && let Err(error) = Box::pin(self.relay.accept_response(
                    &self.code,
                    *response,
                    self.answered_by(),
                    Answerer::Connection(&self.connection_id),
                ))
                .await
            {
                tracing::debug!(code = %self.code.redacted(), %error, "a last answer was refused");
            }
        }
        match ending {
            Ok(Ending::Closed) => {
                tracing::info!(code = %self.code.redacted(), "provider connection closed by the relay");
            }
            Ok(Ending::Moved) => {
                // The session keeps this connection as its provider until the tab's next one
                // replaces it: meanwhile the other relays see a tab there (this replica is
                // alive) and their callers wait for it, rather than hear that no tab is
                // connected. (A tab that never comes back stops counting with this replica.)
                tracing::info!(code = %self.code.redacted(), "provider told to move to another relay");
                return;
            }
            _ => tracing::info!(code = %self.code.redacted(), "provider disconnected"),
        }
        // Requests delivered to this connection stay delivered to it: the next connection
        // claims them again, because they are not delivered to *it*.
        if let Err(error) = self
            .relay
            .store()
            .clear_provider(&self.code, &self.connection_id)
            .await
        {
            tracing::warn!(code = %self.code.redacted(), %error, "could not record the provider's departure; trying again later");
            self.relay.clear_later(&self.code, &self.connection_id);
        }
    }

    async fn serve(
        &self,
        max_expires_at: Timestamp,
        mut events: EventStream,
        attended: &mut Attended,
        uplink: &mut Receiver<ProviderFrame>,
    ) -> Result<Ending, Gone> {
        // What the loop awaits besides its events is boxed: the future of this function is
        // what an idle tab's task keeps, and the work it waits for is short-lived.
        let config = self.relay.config();
        let clock = self.relay.clock();
        Box::pin(self.send(Downlink::Welcome {
            code: self.code.clone(),
            expires_at: self.expires_at(),
        }))
        .await?;
        let mut retry = Retry::new();
        Box::pin(self.deliver_or_retry(&mut retry, false)).await?;
        // A question open about a new caller is asked again in every new connection.
        Box::pin(self.show_approvals()).await?;

        let period = config.heartbeat_interval;
        let mut heartbeat = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
        heartbeat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut end_of_life = Box::pin(tokio::time::sleep_until(clock.instant(max_expires_at)));
        let mut drained = std::pin::pin!(self.relay.drain().ended());
        let mut handing_over = std::pin::pin!(self.relay.drain().handing_over());
        let mut moving = false;

        loop {
            // A relay handing its tabs over tells this one to move once what it was given is
            // answered: it reconnects to another relay, which delivers its queued calls.
            if moving && self.known().delivered.is_empty() {
                Box::pin(self.send(Downlink::Restarting)).await?;
                return Ok(Ending::Moved);
            }
            // Biased: frames the provider already sent (answers above all) are handled before
            // anything that could end the connection.
            tokio::select! {
                biased;
                frame = uplink.recv() => match frame {
                    Some(frame) => {
                        if let Some(ending) = Box::pin(self.handle(frame)).await? {
                            return Ok(ending);
                        }
                    }
                    None => return Ok(Ending::Disconnected),
                },
                () = &mut drained => {
                    Box::pin(self.send(Downlink::Restarting)).await?;
                    return Ok(Ending::Closed);
                }
                () = &mut handing_over, if !moving => moving = true,
                () = retry.due() => {
                    // A store operation failed: a claim whose reply was lost may have run.
                    Box::pin(self.deliver_or_retry(&mut retry, true)).await?;
                }
                event = events.next() => match event {
                    Some(SessionEvent::RequestQueued) => Box::pin(self.deliver_or_retry(&mut retry, false)).await?,
                    // (Unless a redelivery after lost events sent it already: events that
                    // outlived the loss still come.)
                    Some(SessionEvent::CallHanded(record)) => {
                        let mine = record.delivered_to.as_deref() == Some(self.connection_id.as_str());
                        if mine && self.known().delivered.is_new(&record.id) {
                            Box::pin(self.forward(vec![*record])).await?;
                        }
                    }
                    // A lost event may have been the one that replaced this connection, or
                    // one that handed it a call.
                    Some(event @ (SessionEvent::Missed | SessionEvent::ProviderChanged(_))) => {
                        if let Some(ending) = Box::pin(self.check_still_provider()).await? {
                            return Ok(ending);
                        }
                        let missed = event == SessionEvent::Missed;
                        if missed {
                            // More may have been lost than this redelivery finds.
                            self.watch.doubt();
                            Box::pin(self.forget_answered()).await;
                        }
                        // After lost events (the store's events reconnected, or the sweep
                        // found calls this connection does not know of), whatever this
                        // connection holds and never got goes too.
                        Box::pin(self.deliver_or_retry(&mut retry, missed)).await?;
                        if missed {
                            Box::pin(self.show_approvals()).await?;
                        }
                    }
                    Some(SessionEvent::SessionEnded) | None => {
                        return Box::pin(self.expire("The session has ended. Start a new session to pair again.")).await;
                    }
                    Some(SessionEvent::ResponseReady { id, record }) => {
                        Box::pin(self.cancel_if_cancelled(&id, record)).await?;
                        self.settled(&id);
                    }
                    Some(SessionEvent::ManifestChanged) => {}
                    Some(SessionEvent::ApprovalsChanged) => Box::pin(self.show_approvals()).await?,
                },
                notice = attended.notices.recv() => match notice {
                    // The session has calls this connection does not know of: an event that
                    // handed one over was lost.
                    Some(Notice::Pending(pending)) => {
                        if usize::try_from(pending).unwrap_or(usize::MAX) > self.known().delivered.len() {
                            Box::pin(self.forget_answered()).await;
                            Box::pin(self.deliver_or_retry(&mut retry, true)).await?;
                        }
                    }
                    Some(Notice::Replaced) => {
                        if let Some(ending) = Box::pin(self.check_still_provider()).await? {
                            return Ok(ending);
                        }
                    }
                    Some(Notice::Gone) | None => {
                        return Box::pin(self.expire("The session has ended. Start a new session to pair again.")).await;
                    }
                },
                // The relay's own heartbeat, from what the upkeep knows: it costs the store
                // nothing (the upkeep keeps the session alive for every tab at once).
                _ = heartbeat.tick() => {
                    Box::pin(self.send(Downlink::Heartbeat { expires_at: self.expires_at(), answers_ping: false })).await?;
                }
                () = &mut end_of_life => {
                    return Box::pin(self.expire("The session reached its maximum lifetime. Start a new session to pair again.")).await;
                }
                () = self.down.closed() => return Ok(Ending::Disconnected),
            }
        }
    }

    /// Handles one frame from the provider; `Some` when the connection must end.
    async fn handle(&self, frame: ProviderFrame) -> Result<Option<Ending>, Gone> {
        let connection = Some(self.connection_id.as_str());
        let reply = match frame {
            // Approval is on before the tools are there to be called.
            ProviderFrame::Register { tools, approves } => {
                match self.relay.set_approving(&self.code, approves).await {
                    Ok(()) => self
                        .relay
                        .install_manifest(&self.code, &tools, connection)
                        .await
                        .map(|tools| Some(Downlink::Registered { tools })),
                    Err(error) => Err(error),
                }
            }
            ProviderFrame::Approval(answer) => {
                let decision = if answer.allow {
                    crate::relay::approvals::Decision::Allow
                } else {
                    crate::relay::approvals::Decision::Deny
                };
                self.relay
                    .decide(&self.code, &answer.caller_id, None, decision)
                    .await
                    .map(|_| None)
            }
            ProviderFrame::DisconnectCaller(caller) => self
                .relay
                .disconnect_caller(&self.code, &caller.caller_id)
                .await
                .map(|()| None),
            ProviderFrame::Response(response) => {
                let request_id = response.request_id.clone();
                let recorded = self
                    .relay
                    .accept_response(
                        &self.code,
                        *response,
                        self.answered_by(),
                        Answerer::Connection(&self.connection_id),
                    )
                    .await;
                receipt(request_id, recorded).map(Some)
            }
            // Answered from what the upkeep knows: a tab's pings cost the store nothing.
            ProviderFrame::Ping => Ok(Some(Downlink::Heartbeat {
                expires_at: self.expires_at(),
                answers_ping: true,
            })),
        };
        match reply {
            Ok(Some(reply)) => self.send(reply).await.map(|()| None),
            Ok(None) => Ok(None),
            Err(RelayError::SessionNotFound { .. }) => self
                .expire("The session has expired. Start a new session to pair again.")
                .await
                .map(Some),
            Err(error) => {
                self.send(Downlink::Error {
                    error: error.code(),
                    message: error.to_string(),
                })
                .await?;
                Ok(None)
            }
        }
    }

    fn is_provider_of(&self, session: &crate::store::SessionRecord) -> bool {
        session
            .provider
            .as_ref()
            .is_some_and(|provider| provider.connection_id == self.connection_id)
    }

    /// Looks up who serves the session; `Some` when it is no longer this connection. Events
    /// are only hints: a `ProviderChanged` may be older than this connection's own attach.
    async fn check_still_provider(&self) -> Result<Option<Ending>, Gone> {
        match self.relay.store().session(&self.code).await {
            Ok(Some(session)) if self.is_provider_of(&session) => Ok(None),
            Ok(Some(_)) => self.replaced().await.map(Some),
            Ok(None) => self
                .expire("The session has ended. Start a new session to pair again.")
                .await
                .map(Some),
            Err(error) => {
                tracing::warn!(code = %self.code.redacted(), %error, "could not check the session's provider");
                Ok(None)
            }
        }
    }

    /// Sends every call this connection may claim: new ones, and ones delivered to an earlier
    /// connection and never answered. With `redeliver`, also the calls recorded as delivered
    /// to this connection that this driver never sent: a claim whose reply timed out, or an
    /// event that handed one over, may have been lost. (The ones it did send, the provider
    /// has: it sends their answers until they are acknowledged.)
    async fn deliver(&self, redeliver: bool) -> Result<Delivery, Gone> {
        loop {
            if self.relay.drain().is_handing_over() {
                return Ok(Delivery::All);
            }
            let now = self.relay.now();
            let claim = Claim {
                connection_id: self.connection_id.clone(),
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
                    return Ok(Delivery::Failed);
                }
            };
            let full = !redeliver && claimed.len() >= CLAIM_BATCH;
            let fresh: Vec<_> = {
                let known = self.known();
                claimed
                    .into_iter()
                    .filter(|record| !known.delivered.holds(&record.id))
                    .collect()
            };
            self.forward(fresh).await?;
            // A redelivering claim took everything claimable at once.
            if !full {
                return Ok(Delivery::All);
            }
        }
    }

    /// Sends calls delivered to this connection, each holding a stopping relay open and
    /// counted in the queue depth until it is answered. A relay handing its tabs over sends
    /// none: they stay delivered to this connection in the store, and the tab's next
    /// connection (on another relay) claims them.
    async fn forward(&self, calls: Vec<RequestRecord>) -> Result<(), Gone> {
        if self.relay.drain().is_handing_over() {
            return Ok(());
        }
        if !calls.is_empty() {
            // Calls out: the upkeep looks at the session at its sweeps until none are.
            self.watch.doubt();
        }
        for record in &calls {
            let held = (
                self.relay.drain().hold(),
                self.relay.metrics().call_handed(),
            );
            self.known().delivered.deliver(record.id.clone(), held);
        }
        for record in calls {
            self.send(Downlink::ToolRequest {
                request: Box::new(record.tool_request()),
                seq: record.seq,
            })
            .await?;
        }
        Ok(())
    }

    /// When the session expires, as the replica's upkeep last saw it.
    fn expires_at(&self) -> Timestamp {
        self.watch.expires_at()
    }

    /// Delivers (redelivering when asked, or when a store error left a redelivery owed) and
    /// keeps `retry` up to date.
    async fn deliver_or_retry(&self, retry: &mut Retry, redeliver: bool) -> Result<(), Gone> {
        let redeliver = redeliver || retry.owed;
        let delivered = Box::pin(self.deliver(redeliver)).await?;
        retry.after(redeliver, delivered);
        Ok(())
    }

    fn answered_by(&self) -> AnsweredBy {
        AnsweredBy::Provider(self.transport)
    }

    fn known(&self) -> std::sync::MutexGuard<'_, Known> {
        crate::locked(&self.known)
    }

    /// A call this connection was given and has not answered was cancelled by its caller
    /// (its answer, announced by the store, says so): tell the provider to stop running it.
    async fn cancel_if_cancelled(
        &self,
        id: &str,
        record: Option<Box<RequestRecord>>,
    ) -> Result<(), Gone> {
        if !self.known().delivered.holds(id) {
            return Ok(());
        }
        let status = match record {
            Some(record) => Some(record.status),
            // Not sent along with the event: read it.
            None => match self.relay.store().request(&self.code, id).await {
                Ok(record) => record.map(|record| record.status),
                Err(_) => None,
            },
        };
        if status == Some(RequestStatus::Cancelled) {
            self.send(Downlink::Cancel {
                request_id: id.to_owned(),
            })
            .await?;
        }
        Ok(())
    }

    /// A call this connection was given has its answer: it holds nothing more, and is
    /// remembered as answered.
    fn settled(&self, id: &str) {
        self.known().delivered.settle(id);
    }

    /// Stops holding the drain open for calls that have their answer (after lost events).
    async fn forget_answered(&self) {
        let ids = self.known().delivered.waiting();
        for id in ids {
            let answered = match self.relay.store().request(&self.code, &id).await {
                Ok(Some(record)) => record.status.is_terminal(),
                Ok(None) => true,
                Err(_) => false,
            };
            if answered {
                self.settled(&id);
            }
        }
    }

    /// Shows the tab what changed in its session's approvals ([`shown::changes`]).
    async fn show_approvals(&self) -> Result<(), Gone> {
        let view = match self.relay.approval_view(&self.code).await {
            Ok(view) => view,
            Err(error) => {
                tracing::debug!(code = %self.code.redacted(), %error, "could not read the session's approvals");
                return Ok(());
            }
        };
        let messages = shown::changes(&mut self.known().shown, view);
        for message in messages {
            self.send(message).await?;
        }
        Ok(())
    }

    async fn replaced(&self) -> Result<Ending, Gone> {
        self.send(Downlink::Replaced).await?;
        Ok(Ending::Closed)
    }

    async fn expire(&self, message: &str) -> Result<Ending, Gone> {
        self.send(Downlink::Expired {
            message: message.to_owned(),
        })
        .await?;
        Ok(Ending::Closed)
    }

    async fn send(&self, message: Downlink) -> Result<(), Gone> {
        self.down.send(message).await.map_err(|_| Gone)
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
        let (down, _downlink) = channel::channel(1);
        let (_uplink, up_rx) = channel::channel(1);
        let code = SessionCode::generate();
        let now = Timestamp(0);
        let attended = relay.attend(&code, "c", now);
        let driver = Driver {
            relay,
            code,
            connection_id: "c".into(),
            transport: Transport::WebSocket,
            down,
            known: Box::default(),
            watch: attended.watch.clone(),
        };
        let events: EventStream = Box::pin(futures::stream::empty());
        let running = driver.run(now, events, attended, up_rx);
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
