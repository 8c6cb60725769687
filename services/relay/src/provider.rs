//! The provider side of a session: attaching a connection, delivering calls to it, heartbeats,
//! replacement, and the polling fallback.
//!
//! [`Relay::attach`] returns a [`ProviderLink`]: a transport forwards what arrives from the
//! provider into `uplink` and writes what comes out of `downlink` to the provider, and that is
//! all it does. A driver task per connection owns the rest: it delivers queued calls (and,
//! after a reconnect, calls delivered to an earlier connection and never answered), handles
//! registrations, responses and pings, sends heartbeats that keep the session alive, and ends
//! the connection when the session ends, another connection replaces it, or the relay stops.
//! When `downlink` ends, the transport closes the connection.

use std::collections::HashMap;
use std::time::Duration;

use futures::StreamExt;
use tokio::sync::mpsc;
use toolrelay::PROTOCOL_VERSION;
use toolrelay::wire::{ProviderFrame, ProviderResponse, RelayFrame, ToolRequest};

use crate::clock::Timestamp;
use crate::code::{self, SessionCode};
use crate::drain::Hold;
use crate::error::{ErrorCode, RelayError};
use crate::metrics::AnsweredBy;
use crate::relay::Relay;
use crate::store::{Answerer, Claim, EventStream, ProviderInfo, SessionEvent, Transport};

/// Frames a slow provider may fall behind by before the driver waits for it.
const DOWNLINK_BUFFER: usize = 128;
/// Frames from the provider waiting to be handled.
const UPLINK_BUFFER: usize = 64;
/// Calls claimed at a time.
const CLAIM_BATCH: usize = 32;
/// The connection id shared by every poll of a session.
const POLLING_CONNECTION: &str = "polling";

/// What the relay sends to a provider.
#[derive(Debug, Clone, PartialEq)]
pub enum Downlink {
    /// First message of a connection.
    Welcome {
        /// The session.
        code: SessionCode,
        /// When it expires unless there is activity.
        expires_at: Timestamp,
    },
    /// A call to run.
    ToolRequest {
        /// The call (boxed: the other messages are small, and every connection's channel
        /// holds a block of messages from the start).
        request: Box<ToolRequest>,
        /// Its position in the session's queue.
        seq: u64,
    },
    /// Periodic, and the answer to a ping.
    Heartbeat {
        /// When the session expires unless there is activity.
        expires_at: Timestamp,
        /// Whether it answers the provider's ping rather than being the relay's periodic one:
        /// only periodic heartbeats count towards a silent provider's limit.
        answers_ping: bool,
    },
    /// A manifest was accepted.
    Registered {
        /// Its number of functions.
        tools: usize,
    },
    /// Something the provider sent was refused; the connection stays.
    Error {
        /// What was refused, by name.
        error: ErrorCode,
        /// What to do about it.
        message: String,
    },
    /// Another connection took over the session; this one ends.
    Replaced,
    /// The relay is stopping; this connection ends and should be made again.
    Restarting,
    /// The session ended; this connection ends.
    Expired {
        /// Why, and what to do.
        message: String,
    },
}

impl Downlink {
    /// Whether the connection ends after this message.
    pub fn is_final(&self) -> bool {
        matches!(
            self,
            Self::Replaced | Self::Restarting | Self::Expired { .. }
        )
    }

    /// The error name and message of the messages sent as `error` frames.
    pub fn error(&self) -> Option<(ErrorCode, String)> {
        match self {
            Self::Error { error, message } => Some((*error, message.clone())),
            Self::Replaced => Some((
                ErrorCode::Replaced,
                "Another connection with this session's token took over; this one is closed."
                    .to_owned(),
            )),
            Self::Restarting => Some((
                RelayError::ShuttingDown.code(),
                RelayError::ShuttingDown.to_string(),
            )),
            _ => None,
        }
    }

    /// The JSON frame of the browser protocol (a call's arguments moved, not copied).
    pub fn into_frame(self) -> RelayFrame {
        match self {
            Self::ToolRequest { request, .. } => RelayFrame::ToolRequest(*request),
            other => other.to_frame(),
        }
    }

    /// The JSON frame of the browser protocol.
    pub fn to_frame(&self) -> RelayFrame {
        match self {
            Self::Welcome { code, expires_at } => RelayFrame::Welcome {
                code: code.as_str().to_owned(),
                expires_at: expires_at.rfc3339(),
                protocol_version: PROTOCOL_VERSION.to_owned(),
            },
            Self::ToolRequest { request, .. } => RelayFrame::ToolRequest(request.as_ref().clone()),
            Self::Heartbeat { expires_at, .. } => RelayFrame::Heartbeat {
                expires_at: expires_at.rfc3339(),
            },
            Self::Registered { tools } => RelayFrame::Registered { tools: *tools },
            Self::Error { .. } | Self::Replaced | Self::Restarting => {
                let (error, message) = self
                    .error()
                    .unwrap_or((ErrorCode::InternalError, String::new()));
                RelayFrame::Error {
                    error: error.as_str().to_owned(),
                    message,
                }
            }
            Self::Expired { message } => RelayFrame::Expired {
                message: message.clone(),
            },
        }
    }
}

/// One attached provider connection, as its transport sees it.
#[derive(Debug)]
pub struct ProviderLink {
    /// The session.
    pub code: SessionCode,
    /// This connection's id.
    pub connection_id: String,
    /// Messages for the provider, in order; ends when the connection should close.
    pub downlink: mpsc::Receiver<Downlink>,
    /// Messages from the provider. Dropping it means the provider went away.
    pub uplink: mpsc::Sender<ProviderFrame>,
    /// Where the transport may hand the provider's answers straight to the relay instead of
    /// sending them up `uplink` (`None`: send them up, as a gateway relaying to a relay
    /// elsewhere must).
    pub answers: Option<Answers>,
}

/// A provider's answers recorded by the transport's own task: an answer needs nothing of the
/// driver, and going through it would cost a hand-off between tasks for every call.
#[derive(Clone)]
pub struct Answers {
    relay: Relay,
    code: SessionCode,
    /// The connection whose answers these are: it answers only the calls delivered to it.
    connection_id: String,
    by: AnsweredBy,
}

impl Answers {
    /// Records an answer; the `error` frame to send the provider if it was refused. (That the
    /// session has ended, the driver tells the provider itself.)
    pub async fn accept(&self, response: ProviderResponse) -> Option<RelayFrame> {
        match self
            .relay
            .accept_response(
                &self.code,
                response,
                self.by,
                Answerer::Connection(&self.connection_id),
            )
            .await
        {
            Ok(_) | Err(RelayError::SessionNotFound { .. }) => None,
            Err(error) => Some(
                Downlink::Error {
                    error: error.code(),
                    message: error.to_string(),
                }
                .into_frame(),
            ),
        }
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
        let (code, _) = self.authorized(code, token).await?;
        // Subscribe before anything can be queued for this connection, so nothing is missed.
        let events = self.subscribe(&code).await?;
        let connection_id = code::random_id();
        let now = self.now();
        let provider = ProviderInfo {
            connection_id: connection_id.clone(),
            transport,
            connected_at: now,
            last_seen: now,
        };
        self.inner
            .store
            .set_provider(&code, provider)
            .await?
            .ok_or_else(|| crate::relay::not_found(&code))?;
        let session = self.touch(&code, Some(&connection_id)).await?;
        tracing::info!(code = %code.redacted(), transport = transport.as_str(), "provider attached");

        let (down_tx, downlink) = mpsc::channel(DOWNLINK_BUFFER);
        let (uplink, up_rx) = mpsc::channel(UPLINK_BUFFER);
        let driver = Driver {
            relay: self.clone(),
            code: code.clone(),
            connection_id: connection_id.clone(),
            transport,
            down: down_tx,
            outstanding: std::sync::Mutex::default(),
        };
        tokio::spawn(driver.run(session.expires_at, session.max_expires_at, events, up_rx));
        Ok(ProviderLink {
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

    /// The polling fallback: hands out the session's waiting calls (at most `max`, all when
    /// `None`) under a lease; a call not answered within the lease is handed out again.
    /// Needs the provider token; polling makes the poller the session's provider.
    pub async fn poll(
        &self,
        code: &str,
        token: Option<&str>,
        max: Option<usize>,
    ) -> Result<Vec<ToolRequest>, RelayError> {
        let (code, session) = self.authorized(code, token).await?;
        let now = self.now();
        let is_current = session
            .provider
            .as_ref()
            .is_some_and(|provider| provider.connection_id == POLLING_CONNECTION);
        if !is_current {
            // A poller taking over is a new attach: refused while the relay drains.
            self.accepting()?;
            let provider = ProviderInfo {
                connection_id: POLLING_CONNECTION.to_owned(),
                transport: Transport::Polling,
                connected_at: now,
                last_seen: now,
            };
            self.inner.store.set_provider(&code, provider).await?;
        }
        self.touch(&code, Some(POLLING_CONNECTION)).await?;
        let claim = Claim {
            connection_id: POLLING_CONNECTION.to_owned(),
            now,
            lease_until: now.plus(self.inner.config.poll_lease),
            limit: max.unwrap_or(usize::MAX),
        };
        let claimed = self.inner.store.claim(&code, &claim).await?;
        Ok(claimed.iter().map(|record| record.tool_request()).collect())
    }
}

struct Driver {
    relay: Relay,
    code: SessionCode,
    connection_id: String,
    transport: Transport,
    down: mpsc::Sender<Downlink>,
    /// Calls delivered to this connection and not answered yet: each holds a stopping relay
    /// open until it is answered (by any path) or the drain ends. A std mutex: held for one
    /// map operation, never across an `.await`.
    outstanding: std::sync::Mutex<HashMap<String, Hold>>,
}

/// The provider went away while the driver was sending.
struct Gone;

impl Driver {
    async fn run(
        self,
        expires_at: Timestamp,
        max_expires_at: Timestamp,
        events: EventStream,
        mut uplink: mpsc::Receiver<ProviderFrame>,
    ) {
        let _connected = self.relay.metrics().provider_connected(self.transport);
        let ending = self
            .serve(expires_at, max_expires_at, events, &mut uplink)
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
        if let Ok(Ending::Closed) = ending {
            tracing::info!(code = %self.code.redacted(), "provider connection closed by the relay");
        } else {
            tracing::info!(code = %self.code.redacted(), "provider disconnected");
        }
        // Requests delivered to this connection stay delivered to it: the next connection
        // claims them again, because they are not delivered to *it*.
        if let Err(error) = self
            .relay
            .inner
            .store
            .clear_provider(&self.code, &self.connection_id)
            .await
        {
            tracing::warn!(code = %self.code.redacted(), %error, "could not record the provider's departure");
        }
    }

    async fn serve(
        &self,
        expires_at: Timestamp,
        max_expires_at: Timestamp,
        mut events: EventStream,
        uplink: &mut mpsc::Receiver<ProviderFrame>,
    ) -> Result<Ending, Gone> {
        // What the loop awaits besides its events is boxed: the future of this function is
        // what an idle tab's task keeps, and the work it waits for is short-lived.
        let config = self.relay.config();
        let clock = self.relay.clock();
        Box::pin(self.send(Downlink::Welcome {
            code: self.code.clone(),
            expires_at,
        }))
        .await?;
        Box::pin(self.deliver()).await?;

        let period = config.heartbeat_interval;
        let mut heartbeat = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
        heartbeat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut end_of_life = Box::pin(tokio::time::sleep_until(clock.instant(max_expires_at)));
        let mut drained = std::pin::pin!(self.relay.inner.drain.ended());

        loop {
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
                event = events.next() => match event {
                    Some(SessionEvent::RequestQueued) => Box::pin(self.deliver()).await?,
                    // Queued already delivered to this connection: forwarded as it is.
                    Some(SessionEvent::CallHanded(record)) => {
                        if record.delivered_to.as_deref() == Some(self.connection_id.as_str()) {
                            self.outstanding().insert(record.id.clone(), self.relay.inner.drain.hold());
                            let (request, seq) = (Box::new(record.tool_request()), record.seq);
                            Box::pin(self.send(Downlink::ToolRequest { request, seq })).await?;
                        }
                    }
                    // A lost event may have been the one that replaced this connection.
                    Some(event @ (SessionEvent::Missed | SessionEvent::ProviderChanged(_))) => {
                        if let Some(ending) = Box::pin(self.check_still_provider()).await? {
                            return Ok(ending);
                        }
                        if event == SessionEvent::Missed {
                            Box::pin(self.forget_answered()).await;
                        }
                        Box::pin(self.deliver()).await?;
                    }
                    Some(SessionEvent::SessionEnded) | None => {
                        return Box::pin(self.expire("The session has ended. Start a new session to pair again.")).await;
                    }
                    Some(SessionEvent::ResponseReady { id, .. }) => {
                        self.outstanding().remove(&id);
                    }
                    Some(SessionEvent::ManifestChanged) => {}
                },
                _ = heartbeat.tick() => {
                    match Box::pin(self.relay.touch(&self.code, Some(&self.connection_id))).await {
                        Ok(session) if self.is_provider_of(&session) => {
                            Box::pin(self.send(Downlink::Heartbeat { expires_at: session.expires_at, answers_ping: false })).await?;
                            // Also retries a claim that failed on a store error.
                            Box::pin(self.deliver()).await?;
                        }
                        Ok(_) => return Box::pin(self.replaced()).await,
                        Err(RelayError::SessionNotFound { .. }) => {
                            return Box::pin(self.expire("The session has expired. Start a new session to pair again.")).await;
                        }
                        Err(error) => tracing::warn!(code = %self.code.redacted(), %error, "heartbeat could not slide the session"),
                    }
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
            ProviderFrame::Register { tools } => self
                .relay
                .install_manifest(&self.code, &tools, connection)
                .await
                .map(|tools| Some(Downlink::Registered { tools })),
            ProviderFrame::Response(response) => self
                .relay
                .accept_response(
                    &self.code,
                    *response,
                    self.answered_by(),
                    Answerer::Connection(&self.connection_id),
                )
                .await
                .map(|_| None),
            ProviderFrame::Ping => match self.relay.touch(&self.code, connection).await {
                Ok(session) if self.is_provider_of(&session) => Ok(Some(Downlink::Heartbeat {
                    expires_at: session.expires_at,
                    answers_ping: true,
                })),
                Ok(_) => return self.replaced().await.map(Some),
                Err(error) => Err(error),
            },
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
        match self.relay.inner.store.session(&self.code).await {
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
    /// connection and never answered.
    async fn deliver(&self) -> Result<(), Gone> {
        loop {
            let now = self.relay.now();
            let claim = Claim {
                connection_id: self.connection_id.clone(),
                now,
                // A pushed call stays with this connection for as long as it lives.
                lease_until: now.plus(self.relay.config().request_timeout + Duration::from_secs(1)),
                limit: CLAIM_BATCH,
            };
            let claimed = match self.relay.inner.store.claim(&self.code, &claim).await {
                Ok(claimed) => claimed,
                Err(error) => {
                    // The next event or heartbeat tries again.
                    tracing::warn!(code = %self.code.redacted(), %error, "could not claim calls for the provider");
                    return Ok(());
                }
            };
            let count = claimed.len();
            for record in &claimed {
                let hold = self.relay.inner.drain.hold();
                self.outstanding().insert(record.id.clone(), hold);
            }
            for record in claimed {
                self.send(Downlink::ToolRequest {
                    request: Box::new(record.tool_request()),
                    seq: record.seq,
                })
                .await?;
            }
            if count < CLAIM_BATCH {
                return Ok(());
            }
        }
    }

    fn answered_by(&self) -> AnsweredBy {
        AnsweredBy::Provider(self.transport)
    }

    fn outstanding(&self) -> std::sync::MutexGuard<'_, HashMap<String, Hold>> {
        self.outstanding
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Stops holding the drain open for calls that have their answer (after lost events).
    async fn forget_answered(&self) {
        let ids: Vec<String> = self.outstanding().keys().cloned().collect();
        for id in ids {
            let answered = match self.relay.inner.store.request(&self.code, &id).await {
                Ok(Some(record)) => record.status.is_terminal(),
                Ok(None) => true,
                Err(_) => false,
            };
            if answered {
                self.outstanding().remove(&id);
            }
        }
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

    /// Every connection's two channels allocate a block of 32 messages when they are made, so
    /// the size of a message is paid 32 times by every idle tab (BENCHMARKS.md): the large
    /// ones travel boxed. A tab's frames are an answer or a manifest, both boxed, or a ping.
    /// An idle tab's driver task is resident for as long as the tab stays: its future (the
    /// state machine of `Driver::run`) is what every idle tab pays (BENCHMARKS.md).
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
        let (down, _downlink) = mpsc::channel(1);
        let (_uplink, up_rx) = mpsc::channel(1);
        let driver = Driver {
            relay,
            code: SessionCode::generate(),
            connection_id: "c".into(),
            transport: Transport::WebSocket,
            down,
            outstanding: std::sync::Mutex::default(),
        };
        let now = Timestamp(0);
        let events: EventStream = Box::pin(futures::stream::empty());
        let running = driver.run(now, now, events, up_rx);
        let size = std::mem::size_of_val(&running);
        // 2,248 bytes before the work it awaits was boxed.
        assert!(size <= 1200, "a driver's future is {size} bytes");
    }

    #[test]
    fn channel_messages_stay_small() {
        let down = std::mem::size_of::<Downlink>();
        assert!(down <= 40, "a Downlink is {down} bytes");
        let up = std::mem::size_of::<ProviderFrame>();
        assert!(up <= 16, "a ProviderFrame is {up} bytes");
    }
}
