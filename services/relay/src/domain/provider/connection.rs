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

use serde_json::Value;
use toolrelay::wire::{ProviderFrame, ProviderResponse, RequestStatus};

use super::delivered::Delivered;
use super::shown::{self, Shown};
use crate::clock::Timestamp;
use crate::code::SessionCode;
use crate::downlink::{Downlink, receipt};
use crate::error::RelayError;
use crate::relay::ResponseOutcome;
use crate::relay::approvals::ApprovalView;
use crate::relay::tabs::Notice;
use crate::store::{RequestRecord, SessionEvent};

/// Heartbeats in a row a tab may leave unanswered before its connection counts as dead.
pub(crate) const SILENT_HEARTBEATS: u32 = 2;

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
    /// Read whether this call was cancelled ([`TabConnection::on_cancelled`]).
    CheckCancelled(String),
    /// Read which of these calls have their answer ([`TabConnection::on_answered`]).
    CheckAnswered(Vec<String>),
    /// Calls are out, or events were lost: the upkeep should look at the session.
    Doubt,
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

    /// What the tab (or its transport) sent.
    pub(crate) fn on_frame(&mut self, up: Uplink, expires_at: Timestamp, fx: &mut Effects) {
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
            // Answered from what the upkeep knows: a tab's pings cost the store nothing.
            ProviderFrame::Ping => Effect::Send(Downlink::Heartbeat {
                expires_at,
                answers_ping: true,
            }),
        });
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
                    self.on_claimed(vec![*record], fx);
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
                    // caller: the tab stops running it.
                    match record {
                        Some(record) if record.status == RequestStatus::Cancelled => {
                            fx.push_back(Effect::Send(Downlink::Cancel {
                                request_id: id.clone(),
                            }));
                        }
                        Some(_) => {}
                        None => fx.push_back(Effect::CheckCancelled(id.clone())),
                    }
                    self.settle(&id, fx);
                }
            }
            Some(SessionEvent::ManifestChanged) => {}
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
    pub(crate) fn on_claimed(&mut self, calls: Vec<RequestRecord>, fx: &mut Effects) {
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
            fx.push_back(Effect::Send(Downlink::ToolRequest {
                request: Box::new(record.tool_request()),
                seq: record.seq,
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

    /// A call it was given was cancelled by its caller: the tab stops running it.
    pub(crate) fn on_cancelled(&mut self, request_id: String, fx: &mut Effects) {
        if !self.ended {
            fx.push_back(Effect::Send(Downlink::Cancel { request_id }));
        }
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

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use serde_json::json;
    use toolrelay::wire::{ApprovalAnswer, CallerCard};

    use super::*;
    use crate::store::NewRequest;

    /// What a delivered call holds in these tables: a count of the holds alive.
    struct Held(Arc<AtomicUsize>);

    impl Drop for Held {
        fn drop(&mut self) {
            self.0.fetch_sub(1, Ordering::SeqCst);
        }
    }

    /// One input of a table.
    enum In {
        Start,
        Heard,
        Frame(ProviderFrame),
        Tick,
        Drain(DrainStage),
        EndOfLife,
        Event(Option<SessionEvent>),
        Upkeep(Option<Notice>),
        Claimed(&'static [&'static str]),
        Recorded(&'static str, Result<bool, RelayError>),
        Outcome(Result<Option<Downlink>, RelayError>),
        Approvals(ApprovalView),
        Provider(Served, Option<bool>),
        Cancelled(&'static str),
        Answered(&'static [&'static str]),
    }

    fn call(id: &str) -> RequestRecord {
        let mut record = RequestRecord::queued(
            NewRequest {
                id: id.into(),
                tool_id: Some("demo".into()),
                function_name: "echo".into(),
                args: json!({"text": id}),
                created_at: Timestamp(0),
                deadline: Timestamp(60_000),
                builtin: false,
                correlation_id: None,
                caller: None,
            },
            1,
        );
        record.delivered_to = Some("c1".into());
        record
    }

    fn answer(id: &str) -> ProviderFrame {
        ProviderFrame::Response(Box::new(ProviderResponse {
            request_id: id.into(),
            success: Some(true),
            result: Some(json!("done")),
            error: None,
        }))
    }

    fn answered(id: &str, status: RequestStatus) -> Option<SessionEvent> {
        let mut record = call(id);
        record.status = status;
        Some(SessionEvent::ResponseReady {
            id: id.into(),
            record: Some(Box::new(record)),
        })
    }

    fn card(caller: &str) -> CallerCard {
        CallerCard {
            caller_id: caller.into(),
            label: "Claude".into(),
            via: "MCP".into(),
            address: "203.0.113.7".into(),
            shared_address: false,
            at: "2026-11-29T16:00:00Z".into(),
        }
    }

    fn view(asking: Option<&str>, allowed: &[&str]) -> ApprovalView {
        ApprovalView {
            approves: true,
            asking: asking.map(|caller| (1, card(caller))),
            closed: None,
            allowed: allowed.iter().map(|caller| card(caller)).collect(),
            refused: false,
        }
    }

    /// An effect in a few words.
    fn said(effect: &Effect) -> String {
        match effect {
            Effect::Send(message) => match message {
                Downlink::Welcome { .. } => "welcome".into(),
                Downlink::ToolRequest { request, .. } => format!("call {}", request.request_id),
                Downlink::Cancel { request_id } => format!("cancel {request_id}"),
                Downlink::ApprovalRequest(card) => format!("ask about {}", card.caller_id),
                Downlink::ApprovalClosed(closed) => format!("asked {}: {}", closed.0, closed.1),
                Downlink::Callers(callers) => format!("callers {}", callers.0.len()),
                Downlink::Heartbeat {
                    answers_ping: false,
                    ..
                } => "heartbeat".into(),
                Downlink::Heartbeat { .. } => "heartbeat for a ping".into(),
                Downlink::Registered { tools } => format!("registered {tools}"),
                Downlink::Error { error, .. } => format!("error {}", error.as_str()),
                Downlink::Ack {
                    request_id,
                    refusal: None,
                } => format!("ack {request_id}"),
                Downlink::Ack { request_id, .. } => format!("ack {request_id} refused"),
                Downlink::NotStored { request_id, .. } => format!("not stored {request_id}"),
                Downlink::Replaced => "replaced".into(),
                Downlink::Restarting => "restarting".into(),
                Downlink::Expired { message } => match message.as_str() {
                    SESSION_ENDED => "expired: session ended".into(),
                    SESSION_EXPIRED => "expired: session expired".into(),
                    LIFETIME_REACHED => "expired: lifetime reached".into(),
                    other => format!("expired: {other}"),
                },
            },
            Effect::End(ending) => format!("end {ending:?}"),
            Effect::Claim { redeliver: false } => "claim".into(),
            Effect::Claim { redeliver: true } => "claim again".into(),
            Effect::Record(response) => format!("record {}", response.request_id),
            Effect::Register { approves, .. } => format!("register approving {approves}"),
            Effect::Decide { caller_id, allow } => format!("decide {caller_id} {allow}"),
            Effect::Disconnect { caller_id } => format!("disconnect {caller_id}"),
            Effect::ShowApprovals => "show approvals".into(),
            Effect::CheckProvider { after_missed } => format!("check provider {after_missed:?}"),
            Effect::CheckCancelled(id) => format!("check cancelled {id}"),
            Effect::CheckAnswered(ids) => {
                let mut ids = ids.clone();
                ids.sort();
                format!("check answered {}", ids.join(","))
            }
            Effect::Doubt => "doubt".into(),
        }
    }

    /// Runs a table: each input, the effects it must give (in order), and the holds alive
    /// after it.
    fn table(rows: Vec<(In, &[&str], usize)>) {
        let holds = Arc::new(AtomicUsize::new(0));
        let counter = holds.clone();
        let mut tab = TabConnection::new("c1".into(), move || {
            counter.fetch_add(1, Ordering::SeqCst);
            Held(counter.clone())
        });
        let at = Timestamp(1_000);
        for (n, (input, expected, held)) in rows.into_iter().enumerate() {
            let mut fx = Effects::new();
            match input {
                In::Start => tab.start(SessionCode::generate(), at, &mut fx),
                In::Heard => tab.on_frame(Uplink::Heard, at, &mut fx),
                In::Frame(frame) => tab.on_frame(Uplink::Frame(frame), at, &mut fx),
                In::Tick => tab.on_tick(at, &mut fx),
                In::Drain(stage) => tab.on_drain(stage, &mut fx),
                In::EndOfLife => tab.on_end_of_life(&mut fx),
                In::Event(event) => tab.on_event(event, &mut fx),
                In::Upkeep(notice) => tab.on_notice(notice, &mut fx),
                In::Claimed(ids) => {
                    tab.on_claimed(ids.iter().map(|id| call(id)).collect(), &mut fx)
                }
                In::Recorded(id, accepted) => {
                    let outcome = accepted.map(|accepted| ResponseOutcome {
                        request_id: id.into(),
                        status: RequestStatus::Completed,
                        accepted,
                    });
                    tab.on_recorded(id.into(), outcome, &mut fx);
                }
                In::Outcome(outcome) => tab.on_outcome(outcome, &mut fx),
                In::Approvals(view) => tab.on_approvals(view, &mut fx),
                In::Provider(served, after) => tab.on_provider(served, after, &mut fx),
                In::Cancelled(id) => tab.on_cancelled(id.into(), &mut fx),
                In::Answered(ids) => {
                    tab.on_answered(ids.iter().map(|id| (*id).to_owned()).collect(), &mut fx);
                }
            }
            let effects: Vec<String> = fx.iter().map(said).collect();
            assert_eq!(effects, *expected, "row {n}: effects");
            assert_eq!(holds.load(Ordering::SeqCst), held, "row {n}: holds alive");
            assert_eq!(tab.waiting(), held, "row {n}: calls waiting");
        }
    }

    fn store_down() -> RelayError {
        RelayError::StoreUnavailable(crate::error::StoreError::Unavailable(
            "connection refused".into(),
        ))
    }

    #[test]
    fn a_call_is_delivered_once_and_held_until_its_answer_is_stored() {
        use In::*;
        table(vec![
            (Start, &["welcome", "claim", "show approvals"], 0),
            (Claimed(&["a", "b"]), &["doubt", "call a", "call b"], 2),
            // Claimed again (a redelivery): what it was given is not sent twice.
            (Claimed(&["a", "c"]), &["doubt", "call c"], 3),
            (Frame(answer("a")), &["record a"], 3),
            (Recorded("a", Ok(true)), &["ack a"], 2),
            // The same answer again (the tab sends it until acknowledged): the first won.
            (Frame(answer("a")), &["record a"], 2),
            (Recorded("a", Ok(false)), &["ack a"], 2),
            // The store refusing the answer: the call holds on, and the tab sends it again.
            (Frame(answer("b")), &["record b"], 2),
            (Recorded("b", Err(store_down())), &["not stored b"], 2),
            (Recorded("b", Ok(true)), &["ack b"], 1),
            // An answer refused for good (not this connection's call) settles it too.
            (
                Recorded(
                    "c",
                    Err(RelayError::NotDelivered {
                        code: "ABCD-EFGH".into(),
                        request_id: "c".into(),
                    }),
                ),
                &["ack c refused"],
                0,
            ),
            // Answered by another path (a REST answer, a cancel): the event settles it, and
            // the one cancelled is stopped in the tab.
            (Claimed(&["d", "e"]), &["doubt", "call d", "call e"], 2),
            (Event(answered("d", RequestStatus::Completed)), &[], 1),
            (
                Event(answered("e", RequestStatus::Cancelled)),
                &["cancel e"],
                0,
            ),
            (Event(answered("e", RequestStatus::Cancelled)), &[], 0),
            // Handed over by an event: sent unless it is already known (answered lately).
            (
                Event(Some(SessionEvent::CallHanded(Box::new(call("f"))))),
                &["doubt", "call f"],
                1,
            ),
            (
                Event(Some(SessionEvent::CallHanded(Box::new(call("d"))))),
                &[],
                1,
            ),
            (
                Event(Some(SessionEvent::ResponseReady {
                    id: "f".into(),
                    record: None,
                })),
                &["check cancelled f"],
                0,
            ),
            (Cancelled("f"), &["cancel f"], 0),
            (Event(Some(SessionEvent::RequestQueued)), &["claim"], 0),
        ]);
    }

    #[test]
    fn a_tab_answering_no_ping_for_two_heartbeats_is_dropped() {
        use In::*;
        table(vec![
            (Start, &["welcome", "claim", "show approvals"], 0),
            // A transport that never says it heard (gRPC, SSE) is never taken for silent.
            (Tick, &["heartbeat"], 0),
            (Tick, &["heartbeat"], 0),
            (Tick, &["heartbeat"], 0),
            // A WebSocket says so first, and with every pong.
            (Heard, &[], 0),
            (Tick, &["heartbeat"], 0),
            (Heard, &[], 0),
            (Tick, &["heartbeat"], 0),
            (Tick, &["heartbeat"], 0),
            // Any frame counts as hearing from it; its own pings are answered.
            (Frame(ProviderFrame::Ping), &["heartbeat for a ping"], 0),
            (Tick, &["heartbeat"], 0),
            (Tick, &["heartbeat"], 0),
            (Tick, &["end Silent"], 0),
            // Ended: nothing more.
            (Tick, &[], 0),
            (Frame(ProviderFrame::Ping), &[], 0),
        ]);
    }

    #[test]
    fn a_connection_replaced_or_whose_session_ends_says_so_and_ends() {
        use In::*;
        table(vec![
            (Start, &["welcome", "claim", "show approvals"], 0),
            // A change of provider is only a hint: looked at, it was this connection.
            (
                Event(Some(SessionEvent::ProviderChanged("c1".into()))),
                &["check provider Some(false)"],
                0,
            ),
            (Provider(Served::Here, Some(false)), &["claim"], 0),
            (Provider(Served::Unknown, None), &[], 0),
            (Upkeep(Some(Notice::Replaced)), &["check provider None"], 0),
            (Claimed(&["a"]), &["doubt", "call a"], 1),
            (
                Provider(Served::Elsewhere, None),
                &["replaced", "end Closed"],
                0,
            ),
            (Event(Some(SessionEvent::RequestQueued)), &[], 0),
        ]);
        table(vec![
            (Start, &["welcome", "claim", "show approvals"], 0),
            (Event(None), &["expired: session ended", "end Closed"], 0),
        ]);
        table(vec![
            (Start, &["welcome", "claim", "show approvals"], 0),
            (EndOfLife, &["expired: lifetime reached", "end Closed"], 0),
        ]);
        table(vec![
            (Start, &["welcome", "claim", "show approvals"], 0),
            (
                Upkeep(Some(Notice::Gone)),
                &["expired: session ended", "end Closed"],
                0,
            ),
        ]);
        table(vec![
            (Start, &["welcome", "claim", "show approvals"], 0),
            (
                Provider(Served::Gone, None),
                &["expired: session ended", "end Closed"],
                0,
            ),
        ]);
    }

    #[test]
    fn lost_events_bring_back_what_the_connection_may_have_missed() {
        use In::*;
        table(vec![
            (Start, &["welcome", "claim", "show approvals"], 0),
            (Claimed(&["a", "b"]), &["doubt", "call a", "call b"], 2),
            (
                Event(Some(SessionEvent::Missed)),
                &["check provider Some(true)"],
                2,
            ),
            (
                Provider(Served::Here, Some(true)),
                &[
                    "doubt",
                    "check answered a,b",
                    "claim again",
                    "show approvals",
                ],
                2,
            ),
            (Answered(&["a"]), &[], 1),
            // The upkeep counts more calls waiting than this connection holds.
            (Upkeep(Some(Notice::Pending(1))), &[], 1),
            (
                Upkeep(Some(Notice::Pending(3))),
                &["check answered b", "claim again"],
                1,
            ),
        ]);
    }

    #[test]
    fn a_draining_relay_lets_its_tab_answer_then_tells_it_to_move() {
        use In::*;
        // Handing over: nothing new is given; the tab moves once its last call is answered.
        table(vec![
            (Start, &["welcome", "claim", "show approvals"], 0),
            (Claimed(&["a", "b"]), &["doubt", "call a", "call b"], 2),
            (Drain(DrainStage::HandingOver), &[], 2),
            (Claimed(&["c"]), &[], 2),
            (
                Event(Some(SessionEvent::CallHanded(Box::new(call("d"))))),
                &[],
                2,
            ),
            (Frame(answer("a")), &["record a"], 2),
            (Recorded("a", Ok(true)), &["ack a"], 1),
            (
                Event(answered("b", RequestStatus::Completed)),
                &["restarting", "end Moved"],
                0,
            ),
        ]);
        // With nothing out, it moves at once.
        table(vec![
            (Start, &["welcome", "claim", "show approvals"], 0),
            (
                Drain(DrainStage::HandingOver),
                &["restarting", "end Moved"],
                0,
            ),
        ]);
        // The drain's end: told to reconnect now; what it was given is dropped with it.
        table(vec![
            (Start, &["welcome", "claim", "show approvals"], 0),
            (Claimed(&["a"]), &["doubt", "call a"], 1),
            (Drain(DrainStage::Ended), &["restarting", "end Closed"], 0),
        ]);
    }

    #[test]
    fn the_tabs_own_frames_become_store_operations_and_replies() {
        use In::*;
        table(vec![
            (Start, &["welcome", "claim", "show approvals"], 0),
            (
                Frame(ProviderFrame::Register {
                    tools: Box::new(json!([])),
                    approves: true,
                }),
                &["register approving true"],
                0,
            ),
            (
                Outcome(Ok(Some(Downlink::Registered { tools: 2 }))),
                &["registered 2"],
                0,
            ),
            (
                Outcome(Err(RelayError::InvalidCode)),
                &["error invalid_code"],
                0,
            ),
            (
                Frame(ProviderFrame::Approval(Box::new(ApprovalAnswer {
                    caller_id: "k".into(),
                    allow: true,
                }))),
                &["decide k true"],
                0,
            ),
            (Outcome(Ok(None)), &[], 0),
            // Approvals are shown as they change, once.
            (
                Approvals(view(Some("k"), &[])),
                &["ask about k", "callers 0"],
                0,
            ),
            (Approvals(view(Some("k"), &[])), &[], 0),
            (
                Approvals(view(None, &["k"])),
                &["asked k: timeout", "callers 1"],
                0,
            ),
            (
                Event(Some(SessionEvent::ApprovalsChanged)),
                &["show approvals"],
                0,
            ),
            (Event(Some(SessionEvent::ManifestChanged)), &[], 0),
            (
                Outcome(Err(RelayError::SessionNotFound {
                    code: "ABCD-EFGH".into(),
                })),
                &["expired: session expired", "end Closed"],
                0,
            ),
        ]);
    }
}
