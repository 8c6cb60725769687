//! One tab's connection as the relay keeps it, with no IO in it: the calls it was given (each
//! holding the drain open until answered), what it was shown of its approvals, whether it
//! still answers pings, whether it must move to another relay, and why it ended.
//!
//! [`TabConnection`] is fed what happens — a frame from the tab ([`TabConnection::on_frame`]),
//! a session event or the upkeep's notice ([`TabConnection::on_event`],
//! [`TabConnection::on_notice`]), a heartbeat's tick ([`TabConnection::on_tick`]), the drain
//! ([`TabConnection::on_drain`]), and what the store said to an effect it asked for — and
//! answers with [`Effect`]s: frames to send, store operations to run, the end of the
//! connection. The driver ([`super::Driver`]) performs them; the tab protocol is tested here as
//! tables of inputs and effects.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use tokio::time::Instant;
use toolrelay::wire::{LogFrame, ProgressFrame, ProviderFrame, ProviderResponse, RequestStatus};

use super::delivered::Delivered;
use super::shown::{self, Shown};
use crate::clock::Timestamp;
use crate::code::SessionCode;
use crate::downlink::{Downlink, HandedCall, receipt};
use crate::error::RelayError;
use crate::relay::ResponseOutcome;
use crate::relay::approvals::ApprovalView;
use crate::relay::tabs::Notice;
use crate::store::{RequestRecord, SessionEvent};

/// Heartbeats in a row a tab may leave unanswered before its connection counts as dead.
pub(crate) const SILENT_HEARTBEATS: u32 = 2;
/// Log messages a tab may send in a second; more are dropped.
const LOGS_PER_SECOND: u32 = 10;
/// The largest log message passed on, in bytes of JSON; a larger one's data is replaced by a
/// note saying so.
pub(crate) const LOG_BYTES: usize = 8 * 1024;
/// The longest progress message passed on, in bytes; a longer one is cut.
pub(crate) const PROGRESS_MESSAGE_BYTES: usize = 1024;

const SESSION_ENDED: &str = "The session has ended. Start a new session to pair again.";
const SESSION_EXPIRED: &str = "The session has expired. Start a new session to pair again.";
const LIFETIME_REACHED: &str =
    "The session reached its maximum lifetime. Start a new session to pair again.";

/// What a tab sends up its link: its frames, and word from the transport that it heard from
/// the tab (a WebSocket's pong), which is not a frame of the tab protocol.
#[derive(Debug, Clone, PartialEq)]
pub enum Uplink {
    /// A frame the tab sent.
    Frame(ProviderFrame),
    /// The transport heard from the tab. A transport that sends it counts as pinging its tab:
    /// from the first one on, a tab that answers no ping for [`SILENT_HEARTBEATS`] heartbeats
    /// is dropped.
    Heard,
}

/// How a connection ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ending {
    /// The tab went away.
    Disconnected,
    /// The relay ended it and told the tab why (replaced, expired, restarting).
    Closed,
    /// The relay hands its tabs over and told the tab to reconnect to another relay.
    Moved,
    /// The tab answered no ping for [`SILENT_HEARTBEATS`] heartbeats.
    Silent,
}

/// Where the drain stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DrainStage {
    /// The relay hands its tabs over: a tab moves once what it was given is answered.
    HandingOver,
    /// The drain ended: the tab reconnects elsewhere now.
    Ended,
}

/// Who serves the session, as the store says (after [`Effect::CheckProvider`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Served {
    /// This connection.
    Here,
    /// Another connection.
    Elsewhere,
    /// Nobody: the session is gone.
    Gone,
    /// The store could not say: carry on.
    Unknown,
}

/// What the connection asks the driver to do, in order.
#[derive(Debug)]
pub(crate) enum Effect {
    /// Send a frame to the tab.
    Send(Downlink),
    /// The connection ends (after the frames before it are sent).
    End(Ending),
    /// Claim the calls this connection may have ([`TabConnection::on_claimed`]); with
    /// `redeliver`, also those recorded as delivered to it that it may never have sent.
    Claim {
        /// Redeliver.
        redeliver: bool,
    },
    /// Record the tab's answer ([`TabConnection::on_recorded`]).
    Record(Box<ProviderResponse>),
    /// Install a manifest, approval on or off first ([`TabConnection::on_outcome`]).
    Register {
        /// The tools.
        tools: Box<Value>,
        /// Whether the person approves new callers.
        approves: bool,
    },
    /// The person allowed or refused a caller ([`TabConnection::on_outcome`]).
    Decide {
        /// The caller.
        caller_id: String,
        /// Allowed.
        allow: bool,
    },
    /// The person disconnected a caller ([`TabConnection::on_outcome`]).
    Disconnect {
        /// The caller.
        caller_id: String,
    },
    /// Read the session's approvals ([`TabConnection::on_approvals`]).
    ShowApprovals,
    /// Read who serves the session ([`TabConnection::on_provider`]); `after_missed` says what
    /// follows while it is this connection: `Some(true)` after lost events, `Some(false)`
    /// after a change of provider, `None` nothing.
    CheckProvider {
        /// See above.
        after_missed: Option<bool>,
    },
    /// Read whether this call, answered, was cancelled ([`TabConnection::on_checked`]).
    CheckCancelled(String),
    /// Read which of these calls have their answer ([`TabConnection::on_answered`]).
    CheckAnswered(Vec<String>),
    /// Calls are out, or events were lost: the upkeep should look at the session.
    Doubt,
    /// Tell a call's caller how far it has come.
    Progress(Box<ProgressFrame>),
    /// Tell the callers of these calls a log message.
    Log {
        /// The calls it is about.
        calls: Vec<String>,
        /// The message.
        log: Box<LogFrame>,
    },
}

/// Effects waiting to be performed, in order.
pub(crate) type Effects = VecDeque<Effect>;

/// Whether a tab answers the pings its transport sends with each heartbeat.
#[derive(Debug, Clone, Copy)]
struct Liveness {
    heard: bool,
    silent: u32,
}

/// One tab's connection (`H`: what a delivered call holds until answered).
pub(crate) struct TabConnection<H> {
    connection_id: String,
    delivered: Delivered<H>,
    /// What a delivered call holds (the drain, the queue depth's count).
    hold: Box<dyn Fn() -> H + Send + Sync>,
    /// What the tab was last shown of its approvals (`None`: nothing yet).
    shown: Option<Shown>,
    /// `None` until the transport first says it heard from the tab.
    liveness: Option<Liveness>,
    /// The second of log messages counted, and how many.
    logs: (Option<Instant>, u32),
    moving: bool,
    ended: bool,
}

impl<H> TabConnection<H> {
    /// A new connection; `hold` makes what a delivered call holds until it is answered.
    pub(crate) fn new(connection_id: String, hold: impl Fn() -> H + Send + Sync + 'static) -> Self {
        Self {
            connection_id,
            delivered: Delivered::default(),
            hold: Box::new(hold),
            shown: None,
            liveness: None,
            logs: (None, 0),
            moving: false,
            ended: false,
        }
    }

    /// This connection's id.
    pub(crate) fn connection_id(&self) -> &str {
        &self.connection_id
    }

    /// Whether it hands over to another relay once what it was given is answered.
    pub(crate) fn is_moving(&self) -> bool {
        self.moving
    }

    /// Calls delivered and not answered.
    #[cfg(test)]
    pub(crate) fn waiting(&self) -> usize {
        self.delivered.len()
    }

    /// The connection begins: the tab is welcomed, given what it may claim, and asked again
    /// any question open about a new caller.
    pub(crate) fn start(&mut self, code: SessionCode, expires_at: Timestamp, fx: &mut Effects) {
        fx.push_back(Effect::Send(Downlink::Welcome { code, expires_at }));
        fx.push_back(Effect::Claim { redeliver: false });
        fx.push_back(Effect::ShowApprovals);
    }

    /// What the tab (or its transport) sent, at `now`.
    pub(crate) fn on_frame(
        &mut self,
        up: Uplink,
        expires_at: Timestamp,
        now: Instant,
        fx: &mut Effects,
    ) {
        if self.ended {
            return;
        }
        let frame = match up {
            // Only a transport that pings its tab says it heard from it: silence counts from
            // then on.
            Uplink::Heard => {
                self.liveness = Some(Liveness {
                    heard: true,
                    silent: self.liveness.map_or(0, |liveness| liveness.silent),
                });
                return;
            }
            Uplink::Frame(frame) => frame,
        };
        if let Some(liveness) = &mut self.liveness {
            liveness.heard = true;
        }
        fx.push_back(match frame {
            // Approval is on before the tools are there to be called.
            ProviderFrame::Register { tools, approves } => Effect::Register { tools, approves },
            ProviderFrame::Approval(answer) => Effect::Decide {
                caller_id: answer.caller_id,
                allow: answer.allow,
            },
            ProviderFrame::DisconnectCaller(caller) => Effect::Disconnect {
                caller_id: caller.caller_id,
            },
            ProviderFrame::Response(response) => Effect::Record(response),
            // Never refused: a report out of turn, out of order or about a call the tab does
            // not hold is dropped.
            ProviderFrame::Progress(report) => {
                match self.delivered.progress(bounded_progress(*report), now) {
                    Some(report) => Effect::Progress(Box::new(report)),
                    None => return,
                }
            }
            ProviderFrame::Log(log) => match self.logged(*log, now) {
                Some(effect) => effect,
                None => return,
            },
            // Answered from what the upkeep knows: a tab's pings cost the store nothing.
            ProviderFrame::Ping => Effect::Send(Downlink::Heartbeat {
                expires_at,
                answers_ping: true,
            }),
        });
    }

    /// Progress reports whose turn has come by `now` go to their callers.
    pub(crate) fn on_progress_due(&mut self, now: Instant, fx: &mut Effects) {
        if self.ended {
            return;
        }
        for report in self.delivered.due(now) {
            fx.push_back(Effect::Progress(Box::new(report)));
        }
    }

    /// When a progress report waits for its turn: then [`TabConnection::on_progress_due`].
    pub(crate) fn next_progress_due(&self) -> Option<Instant> {
        self.delivered.next_due()
    }

    /// A log message, for the callers of the calls it is about (the one it names, or every
    /// call the tab was given): none past [`LOGS_PER_SECOND`], nor about a call it does not
    /// hold; data over [`LOG_BYTES`] is replaced by a note.
    fn logged(&mut self, log: LogFrame, now: Instant) -> Option<Effect> {
        let calls = match &log.request_id {
            Some(id) if self.delivered.holds(id) => vec![id.clone()],
            Some(_) => return None,
            None => self.delivered.waiting(),
        };
        if calls.is_empty() {
            return None;
        }
        let (second, count) = &mut self.logs;
        if second.is_none_or(|start| now >= start + Duration::from_secs(1)) {
            *second = Some(now);
            *count = 0;
        }
        *count += 1;
        if *count > LOGS_PER_SECOND {
            return None;
        }
        Some(Effect::Log {
            calls,
            log: Box::new(bounded_log(log)),
        })
    }

    /// The relay's heartbeat is due: a tab that answered none of the last
    /// [`SILENT_HEARTBEATS`] is dropped (a sleeping laptop, a dropped network, with no TCP close).
    pub(crate) fn on_tick(&mut self, expires_at: Timestamp, fx: &mut Effects) {
        if self.ended {
            return;
        }
        if let Some(liveness) = &mut self.liveness {
            liveness.silent = if liveness.heard {
                0
            } else {
                liveness.silent + 1
            };
            liveness.heard = false;
            if liveness.silent >= SILENT_HEARTBEATS {
                return self.end(Ending::Silent, fx);
            }
        }
        fx.push_back(Effect::Send(Downlink::Heartbeat {
            expires_at,
            answers_ping: false,
        }));
    }

    /// The drain moved on.
    pub(crate) fn on_drain(&mut self, stage: DrainStage, fx: &mut Effects) {
        if self.ended {
            return;
        }
        match stage {
            DrainStage::HandingOver => {
                self.moving = true;
                self.move_when_done(fx);
            }
            DrainStage::Ended => {
                fx.push_back(Effect::Send(Downlink::Restarting));
                self.end(Ending::Closed, fx);
            }
        }
    }

    /// The session reached its maximum lifetime.
    pub(crate) fn on_end_of_life(&mut self, fx: &mut Effects) {
        self.expire(LIFETIME_REACHED, fx);
    }

    /// An event of the session (`None`: its events ended, as the session did).
    pub(crate) fn on_event(&mut self, event: Option<SessionEvent>, fx: &mut Effects) {
        if self.ended {
            return;
        }
        match event {
            Some(SessionEvent::RequestQueued) => fx.push_back(Effect::Claim { redeliver: false }),
            // (Unless a redelivery after lost events sent it already: events that outlived
            // the loss still come.)
            Some(SessionEvent::CallHanded(record)) => {
                let mine = record.delivered_to.as_deref() == Some(self.connection_id.as_str());
                if mine && self.delivered.is_new(&record.id) {
                    // Read where the event holds it: no copy of the call.
                    self.on_claimed([record], fx);
                }
            }
            // A lost event may have been the one that replaced this connection, or one that
            // handed it a call.
            Some(SessionEvent::Missed) => fx.push_back(Effect::CheckProvider {
                after_missed: Some(true),
            }),
            Some(SessionEvent::ProviderChanged(_)) => fx.push_back(Effect::CheckProvider {
                after_missed: Some(false),
            }),
            Some(SessionEvent::SessionEnded) | None => self.expire(SESSION_ENDED, fx),
            Some(SessionEvent::ResponseReady { id, record }) => {
                if self.delivered.holds(&id) {
                    // A call it was given and did not answer may have been cancelled by its
                    // caller: the tab stops running it (told before anything that settling
                    // the call may bring, such as the move of a relay handing over).
                    match record {
                        Some(record) => {
                            self.on_checked(id, record.status == RequestStatus::Cancelled, fx);
                        }
                        None => fx.push_back(Effect::CheckCancelled(id)),
                    }
                }
            }
            // For the call's waiters.
            Some(SessionEvent::ManifestChanged | SessionEvent::News { .. }) => {}
            Some(SessionEvent::ApprovalsChanged) => fx.push_back(Effect::ShowApprovals),
        }
    }

    /// What the replica's upkeep found (`None`: the upkeep forgot the tab, as when the
    /// session ended).
    pub(crate) fn on_notice(&mut self, notice: Option<Notice>, fx: &mut Effects) {
        if self.ended {
            return;
        }
        match notice {
            // The session has calls this connection does not know of: an event that handed
            // one over was lost.
            Some(Notice::Pending(pending)) => {
                if usize::try_from(pending).unwrap_or(usize::MAX) > self.delivered.len() {
                    self.check_answered(fx);
                    fx.push_back(Effect::Claim { redeliver: true });
                }
            }
            Some(Notice::Replaced) => fx.push_back(Effect::CheckProvider { after_missed: None }),
            Some(Notice::Gone) | None => self.expire(SESSION_ENDED, fx),
        }
    }

    /// Calls claimed for this connection: the ones it was not given already are delivered,
    /// each holding the drain open until answered. A relay handing its tabs over sends none:
    /// they stay delivered to this connection in the store, and the tab's next connection
    /// (on another relay) claims them.
    pub(crate) fn on_claimed(
        &mut self,
        calls: impl IntoIterator<Item = Arc<RequestRecord>>,
        fx: &mut Effects,
    ) {
        if self.ended || self.moving {
            return;
        }
        let mut any = false;
        for record in calls {
            if self.delivered.holds(&record.id) {
                continue;
            }
            if !any {
                // Calls out: the upkeep looks at the session at its sweeps until none are.
                fx.push_back(Effect::Doubt);
                any = true;
            }
            self.delivered.deliver(record.id.clone(), (self.hold)());
            let seq = record.seq;
            fx.push_back(Effect::Send(Downlink::ToolRequest {
                request: HandedCall::Held(record),
                seq,
            }));
        }
    }

    /// What recording the tab's answer to `request_id` gave: the tab is told. Stored, already
    /// answered or refused for good, the call is settled; not stored (the store failed), it
    /// holds on, and the tab sends it again.
    pub(crate) fn on_recorded(
        &mut self,
        request_id: String,
        recorded: Result<ResponseOutcome, RelayError>,
        fx: &mut Effects,
    ) {
        if self.ended {
            return;
        }
        match receipt(request_id, recorded) {
            Ok(reply) => {
                if let Downlink::Ack { request_id, .. } = &reply {
                    let id = request_id.clone();
                    fx.push_back(Effect::Send(reply));
                    self.settle(&id, fx);
                } else {
                    fx.push_back(Effect::Send(reply));
                }
            }
            Err(_) => self.expire(SESSION_EXPIRED, fx),
        }
    }

    /// What a registration, the person's decision or a disconnection came to: a reply for the
    /// tab, or an error it is told about (the session gone ends the connection).
    pub(crate) fn on_outcome(
        &mut self,
        outcome: Result<Option<Downlink>, RelayError>,
        fx: &mut Effects,
    ) {
        if self.ended {
            return;
        }
        match outcome {
            Ok(Some(reply)) => fx.push_back(Effect::Send(reply)),
            Ok(None) => {}
            Err(RelayError::SessionNotFound { .. }) => self.expire(SESSION_EXPIRED, fx),
            Err(error) => fx.push_back(Effect::Send(Downlink::Error {
                error: error.code(),
                message: error.to_string(),
            })),
        }
    }

    /// The session's approvals as they are: the tab is shown what changed.
    pub(crate) fn on_approvals(&mut self, view: ApprovalView, fx: &mut Effects) {
        if self.ended {
            return;
        }
        for message in shown::changes(&mut self.shown, view) {
            fx.push_back(Effect::Send(message));
        }
    }

    /// Who serves the session (events are only hints: a `ProviderChanged` may be older than
    /// this connection's own attach), and what follows while it is this connection.
    pub(crate) fn on_provider(
        &mut self,
        served: Served,
        after_missed: Option<bool>,
        fx: &mut Effects,
    ) {
        if self.ended {
            return;
        }
        match served {
            Served::Elsewhere => {
                fx.push_back(Effect::Send(Downlink::Replaced));
                return self.end(Ending::Closed, fx);
            }
            Served::Gone => return self.expire(SESSION_ENDED, fx),
            Served::Here | Served::Unknown => {}
        }
        let Some(missed) = after_missed else { return };
        if missed {
            // More may have been lost than the redelivery finds.
            fx.push_back(Effect::Doubt);
            self.check_answered(fx);
        }
        // After lost events (the store's events reconnected, or the sweep found calls this
        // connection does not know of), whatever this connection holds and never got goes too.
        fx.push_back(Effect::Claim { redeliver: missed });
        if missed {
            fx.push_back(Effect::ShowApprovals);
        }
    }

    /// A call it was given has its answer, and whether that answer is its caller's cancel
    /// (after [`Effect::CheckCancelled`]; a store that could not say counts as no): a cancelled
    /// call is stopped in the tab, then the call is settled.
    pub(crate) fn on_checked(&mut self, request_id: String, cancelled: bool, fx: &mut Effects) {
        if self.ended {
            return;
        }
        if cancelled {
            fx.push_back(Effect::Send(Downlink::Cancel {
                request_id: request_id.clone(),
            }));
        }
        self.settle(&request_id, fx);
    }

    /// These calls it was given have their answer (found after lost events).
    pub(crate) fn on_answered(&mut self, ids: Vec<String>, fx: &mut Effects) {
        for id in ids {
            self.settle(&id, fx);
        }
    }

    fn check_answered(&mut self, fx: &mut Effects) {
        let waiting = self.delivered.waiting();
        if !waiting.is_empty() {
            fx.push_back(Effect::CheckAnswered(waiting));
        }
    }

    /// Call `id` has its answer: it holds nothing more. A relay handing over lets the tab move
    /// once its last call is answered.
    fn settle(&mut self, id: &str, fx: &mut Effects) {
        if self.delivered.settle(id) {
            self.move_when_done(fx);
        }
    }

    /// A relay handing its tabs over tells this one to move once what it was given is
    /// answered: it reconnects to another relay, which delivers its queued calls.
    fn move_when_done(&mut self, fx: &mut Effects) {
        if self.moving && self.delivered.is_empty() && !self.ended {
            fx.push_back(Effect::Send(Downlink::Restarting));
            self.end(Ending::Moved, fx);
        }
    }

    fn expire(&mut self, message: &str, fx: &mut Effects) {
        if self.ended {
            return;
        }
        fx.push_back(Effect::Send(Downlink::Expired {
            message: message.to_owned(),
        }));
        self.end(Ending::Closed, fx);
    }

    /// The connection ends: what it was given holds nothing more here (the session keeps it
    /// delivered to this connection, and the tab's next connection claims it).
    fn end(&mut self, ending: Ending, fx: &mut Effects) {
        self.ended = true;
        self.delivered = Delivered::default();
        fx.push_back(Effect::End(ending));
    }
}

/// A log message as the relay passes it on: data over [`LOG_BYTES`] of JSON replaced by a
/// note saying so.
pub(crate) fn bounded_log(mut log: LogFrame) -> LogFrame {
    let size = toolrelay::json::encoded_len(&log.data);
    if size > LOG_BYTES {
        log.data = Value::String(format!(
            "(a log message of {size} bytes was left out: the relay passes on {LOG_BYTES} at most)"
        ));
    }
    log
}

/// A progress report as the relay passes it on: its message cut to [`PROGRESS_MESSAGE_BYTES`].
pub(crate) fn bounded_progress(mut report: ProgressFrame) -> ProgressFrame {
    if let Some(message) = &mut report.message
        && message.len() > PROGRESS_MESSAGE_BYTES
    {
        let mut cut = PROGRESS_MESSAGE_BYTES;
        while !message.is_char_boundary(cut) {
            cut -= 1;
        }
        message.truncate(cut);
        message.push('…');
    }
    report
}

#[cfg(test)]
mod tests;
