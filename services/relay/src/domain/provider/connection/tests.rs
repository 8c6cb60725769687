//! The connection core as tables: each input, the effects it gives, the holds alive after it.

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
    /// A frame, this many milliseconds after the table began.
    FrameAt(ProviderFrame, u64),
    /// Progress reports due this many milliseconds after the table began.
    DueAt(u64),
    /// No progress report waits.
    NoneDue,
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
    Checked(&'static str, bool),
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
        content: None,
        structured_content: None,
    }))
}

fn answered(id: &str, status: RequestStatus) -> Option<SessionEvent> {
    let mut record = call(id);
    record.status = status;
    Some(SessionEvent::ResponseReady {
        id: id.into(),
        record: Some(Arc::new(record)),
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
            Downlink::ToolRequest { request, .. } => format!("call {}", request.request_id()),
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
        Effect::Progress(report) => format!("progress {} {}", report.request_id, report.progress),
        Effect::Log { calls, log } => {
            let mut calls = calls.clone();
            calls.sort();
            format!("log {} to {}", log.level.as_str(), calls.join(","))
        }
    }
}

fn progress(id: &str, progress: f64) -> ProviderFrame {
    ProviderFrame::Progress(Box::new(ProgressFrame {
        request_id: id.into(),
        progress,
        total: Some(100.0),
        message: None,
    }))
}

fn log(id: Option<&str>, data: serde_json::Value) -> ProviderFrame {
    ProviderFrame::Log(Box::new(LogFrame {
        request_id: id.map(str::to_owned),
        level: toolrelay::wire::LogLevel::Info,
        data,
        logger: None,
    }))
}

/// Progress goes to the caller at most every 250 ms, the reports between merged (the last
/// kept); a value not above the last is dropped, as is a report about a call the tab does not
/// hold, and nothing waits once the call is answered. Log messages go to the callers of the
/// call they name, or of every call the tab holds; at most 10 a second.
#[test]
fn progress_is_paced_and_increases_and_logs_reach_the_calls_they_are_about() {
    use In::*;
    let mut rows: Vec<(In, &[&str], usize)> = vec![
        (Claimed(&["a", "b"]), &["doubt", "call a", "call b"], 2),
        (FrameAt(progress("a", 10.0), 0), &["progress a 10"], 2),
        // Too soon: waits, then is replaced by a higher one.
        (FrameAt(progress("a", 20.0), 50), &[], 2),
        (FrameAt(progress("a", 30.0), 100), &[], 2),
        // Lower than the highest taken: dropped.
        (FrameAt(progress("a", 25.0), 120), &[], 2),
        (DueAt(250), &["progress a 30"], 2),
        (FrameAt(progress("a", 30.0), 600), &[], 2),
        (FrameAt(progress("a", 40.0), 600), &["progress a 40"], 2),
        // Another call has its own pace; an unknown call is nobody's.
        (FrameAt(progress("b", 1.0), 610), &["progress b 1"], 2),
        (FrameAt(progress("zz", 1.0), 610), &[], 2),
        (
            FrameAt(log(Some("a"), json!("reading")), 700),
            &["log info to a"],
            2,
        ),
        (
            FrameAt(log(None, json!("both")), 700),
            &["log info to a,b"],
            2,
        ),
        (FrameAt(log(Some("zz"), json!("nobody")), 700), &[], 2),
    ];
    // Eight more in the same second make ten; the eleventh is dropped.
    for _ in 0..8 {
        rows.push((
            FrameAt(log(Some("b"), json!("x")), 900),
            &["log info to b"],
            2,
        ));
    }
    rows.extend([
        (FrameAt(log(Some("b"), json!("x")), 900), &[] as &[&str], 2),
        (
            FrameAt(log(Some("b"), json!("x")), 1_800),
            &["log info to b"],
            2,
        ),
        // Answered with a report waiting: it is dropped with the call.
        (FrameAt(progress("b", 2.0), 1_810), &["progress b 2"], 2),
        (FrameAt(progress("b", 3.0), 1_820), &[], 2),
        (Recorded("b", Ok(true)), &["ack b"], 1),
        (NoneDue, &[], 1),
    ]);
    table(rows);
}

/// A log message too large to pass on has its data replaced by a note saying so.
#[test]
fn a_large_log_message_is_replaced_by_a_note() {
    let mut tab = TabConnection::new("c1".into(), || ());
    let mut fx = Effects::new();
    tab.on_claimed([Arc::new(call("a"))], &mut fx);
    fx.clear();
    let data = json!("x".repeat(LOG_BYTES));
    let now = Instant::now();
    tab.on_frame(
        Uplink::Frame(log(Some("a"), data)),
        Timestamp(0),
        now,
        &mut fx,
    );
    let Some(Effect::Log { log, .. }) = fx.pop_front() else {
        panic!("a log effect");
    };
    let note = log.data.as_str().unwrap_or_default();
    assert!(note.contains("was left out"), "{note}");
    // A progress message is cut (at a character's edge) to what is passed on.
    let long = ProgressFrame {
        request_id: "a".into(),
        progress: 1.0,
        total: None,
        message: Some("é".repeat(PROGRESS_MESSAGE_BYTES)),
    };
    let cut = bounded_progress(long).message.unwrap_or_default();
    assert!(
        cut.len() <= PROGRESS_MESSAGE_BYTES + '…'.len_utf8() && cut.ends_with('…'),
        "{}",
        cut.len()
    );
    assert!(tab.next_progress_due().is_none());
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
    let began = Instant::now();
    let after = |ms: u64| began + std::time::Duration::from_millis(ms);
    for (n, (input, expected, held)) in rows.into_iter().enumerate() {
        let mut fx = Effects::new();
        match input {
            In::Start => tab.start(SessionCode::generate(), at, &mut fx),
            In::Heard => tab.on_frame(Uplink::Heard, at, Instant::now(), &mut fx),
            In::Frame(frame) => tab.on_frame(Uplink::Frame(frame), at, Instant::now(), &mut fx),
            In::FrameAt(frame, ms) => tab.on_frame(Uplink::Frame(frame), at, after(ms), &mut fx),
            In::DueAt(ms) => {
                assert!(
                    tab.next_progress_due().is_some_and(|due| due <= after(ms)),
                    "row {n}: nothing due by {ms} ms"
                );
                tab.on_progress_due(after(ms), &mut fx);
            }
            In::NoneDue => assert!(tab.next_progress_due().is_none(), "row {n}: a report waits"),
            In::Tick => tab.on_tick(at, &mut fx),
            In::Drain(stage) => tab.on_drain(stage, &mut fx),
            In::EndOfLife => tab.on_end_of_life(&mut fx),
            In::Event(event) => tab.on_event(event, &mut fx),
            In::Upkeep(notice) => tab.on_notice(notice, &mut fx),
            In::Claimed(ids) => tab.on_claimed(ids.iter().map(|id| Arc::new(call(id))), &mut fx),
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
            In::Checked(id, cancelled) => tab.on_checked(id.into(), cancelled, &mut fx),
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
            Event(Some(SessionEvent::CallHanded(Arc::new(call("f"))))),
            &["doubt", "call f"],
            1,
        ),
        (
            Event(Some(SessionEvent::CallHanded(Arc::new(call("d"))))),
            &[],
            1,
        ),
        (
            Event(Some(SessionEvent::ResponseReady {
                id: "f".into(),
                record: None,
            })),
            &["check cancelled f"],
            1,
        ),
        (Checked("f", true), &["cancel f"], 0),
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
            Event(Some(SessionEvent::CallHanded(Arc::new(call("d"))))),
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
    // Its last call cancelled, with no record on the event: the tab hears the cancel, then
    // that it moves.
    table(vec![
        (Start, &["welcome", "claim", "show approvals"], 0),
        (Claimed(&["a"]), &["doubt", "call a"], 1),
        (Drain(DrainStage::HandingOver), &[], 1),
        (
            Event(Some(SessionEvent::ResponseReady {
                id: "a".into(),
                record: None,
            })),
            &["check cancelled a"],
            1,
        ),
        (
            Checked("a", true),
            &["cancel a", "restarting", "end Moved"],
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
