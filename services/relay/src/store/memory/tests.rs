//! The memory store's own tests (the behaviour both stores share is in the store conformance
//! suite, `tests/tests/store_conformance.rs` and `store_calls.rs`).

use std::time::Duration;

use serde_json::Value;
use toolrelay::wire::{RequestStatus, ToolError, ToolResponse};

use super::{MemoryStore, StoreLimits};
use crate::clock::{Clock, Timestamp};
use crate::code::SessionCode;
use crate::store::{Answerer, Enqueued, Finished, NewRequest, SessionRecord, SessionStore};

fn session(code: &str, now: Timestamp, ttl_ms: i64) -> SessionRecord {
    SessionRecord {
        code: SessionCode::parse(code).unwrap(),
        token_hash: String::new(),
        created_at: now,
        expires_at: Timestamp(now.0 + ttl_ms),
        max_expires_at: Timestamp(now.0 + 10 * ttl_ms),
        provider: None,
        manifest_revision: 0,
        mcp_handle: format!("handle-{code}"),
    }
}

fn call(id: &str, now: Timestamp, text: &str) -> NewRequest {
    NewRequest {
        id: id.into(),
        tool_id: Some("demo".into()),
        function_name: "echo".into(),
        args: serde_json::json!({"text": text}),
        created_at: now,
        deadline: Timestamp(now.0 + 60_000),
        builtin: false,
        correlation_id: None,
        caller: None,
    }
}

fn answer(id: &str, bytes: usize) -> ToolResponse {
    ToolResponse {
        request_id: id.into(),
        success: true,
        result: Some(Value::String("x".repeat(bytes))),
        error: None,
        content: None,
        structured_content: None,
    }
}

/// A code for a number, in the code alphabet.
fn code_of(n: usize) -> String {
    let alphabet = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";
    (0..8)
        .map(|i| alphabet[(n >> (5 * i)) % 32] as char)
        .collect()
}

#[tokio::test(start_paused = true)]
async fn the_sweep_costs_what_is_due_not_what_is_stored() {
    let clock = Clock::new();
    let store = MemoryStore::new(clock.clone(), Duration::from_secs(3600));
    let now = clock.now();
    // Many live sessions, each with a finished call and a pending one.
    for n in 0..2_000 {
        let record = session(&code_of(n), now, 600_000);
        let code = record.code.clone();
        assert!(store.insert_session(record).await.unwrap());
        store
            .enqueue(&code, call("done", now, "a"), 100, now)
            .await
            .unwrap();
        store
            .finish(
                &code,
                "done",
                RequestStatus::Completed,
                answer("done", 10),
                Answerer::Relay,
                now,
                now,
            )
            .await
            .unwrap();
        store
            .enqueue(&code, call("waiting", now, "b"), 100, now)
            .await
            .unwrap();
    }
    // One session about to expire.
    store
        .insert_session(session("ZZZZZZZZ", now, 1_000))
        .await
        .unwrap();
    tokio::time::advance(Duration::from_secs(2)).await;
    let looked_at = store.sweep_once();
    assert!(looked_at <= 8, "the sweep looked at {looked_at} entries");
    let gone = SessionCode::parse("ZZZZZZZZ").unwrap();
    assert!(store.session(&gone).await.unwrap().is_none());
    let live = SessionCode::parse(&code_of(7)).unwrap();
    assert!(store.session(&live).await.unwrap().is_some());
}

#[tokio::test(start_paused = true)]
async fn answers_stay_within_their_budget_and_evicted_calls_are_still_known() {
    const BUDGET: usize = 1024 * 1024;
    let clock = Clock::new();
    let store = MemoryStore::with_limits(
        clock.clone(),
        StoreLimits {
            answer_budget: BUDGET,
            session_answer_budget: BUDGET,
            ..StoreLimits::keeping(Duration::from_secs(3600))
        },
    );
    let now = clock.now();
    let code = SessionCode::parse("ABCD2345").unwrap();
    store
        .insert_session(session("ABCD2345", now, 600_000))
        .await
        .unwrap();
    // A stream of answers of 100 KB: the budget holds after every one.
    for n in 0..50 {
        let id = format!("r{n}");
        store
            .enqueue(&code, call(&id, now, "x"), 100, now)
            .await
            .unwrap();
        store
            .finish(
                &code,
                &id,
                RequestStatus::Completed,
                answer(&id, 100 * 1024),
                Answerer::Relay,
                now,
                now,
            )
            .await
            .unwrap();
        assert!(
            store.answer_bytes() <= BUDGET,
            "{} after {n}",
            store.answer_bytes()
        );
    }
    assert!(store.answer_bytes() > BUDGET / 2, "the budget is used");
    // The oldest answers were evicted; their calls are known, with their final status.
    let oldest = store.request(&code, "r0").await.unwrap().unwrap();
    assert!(oldest.evicted && oldest.response.is_none());
    assert_eq!(oldest.status, RequestStatus::Completed);
    assert!(matches!(
        store.enqueue(&code, call("r0", now, "x"), 100, now).await.unwrap(),
        Enqueued::Existing(record) if record.evicted
    ));
    assert_eq!(
        store
            .enqueue(&code, call("r0", now, "other"), 100, now)
            .await
            .unwrap(),
        Enqueued::Conflict("r0".into())
    );
    let newest = store.request(&code, "r49").await.unwrap().unwrap();
    assert!(!newest.evicted && newest.response.is_some());
    let kept = store.responses(&code, None).await.unwrap().unwrap();
    assert!(kept.len() < 50 && kept.last().unwrap().request_id == "r49");
    // Ending the session gives its bytes back.
    store.delete_session(&code).await.unwrap();
    assert_eq!(store.answer_bytes(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_thousand_sessions_registering_one_manifest_keep_one_copy() {
    let clock = Clock::new();
    let store = MemoryStore::new(clock.clone(), Duration::from_secs(3600));
    let now = clock.now();
    let codap = format!(
        r#"[{{"name":"codap","description":"{}"}}]"#,
        "x".repeat(20_000)
    );
    let codes: Vec<SessionCode> = (0..1_000)
        .map(|n| SessionCode::parse(&code_of(n)).unwrap())
        .collect();
    for code in &codes {
        assert!(
            store
                .insert_session(session(code.as_str(), now, 600_000))
                .await
                .unwrap()
        );
        store.set_manifest(code, codap.clone()).await.unwrap();
    }
    {
        let tables = store.lock();
        assert_eq!(tables.manifests.len(), 1);
        let held = |code: &SessionCode| tables.sessions[code].manifest.clone().unwrap();
        assert!(std::sync::Arc::ptr_eq(&held(&codes[0]), &held(&codes[999])));
    }
    // Another manifest is another copy; the last session to let go frees it.
    store.set_manifest(&codes[0], "[]".into()).await.unwrap();
    assert_eq!(store.lock().manifests.len(), 2);
    for code in &codes[1..] {
        store.delete_session(code).await.unwrap();
    }
    assert_eq!(store.lock().manifests.len(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_finished_call_reads_back_as_it_was_answered() {
    // The store keeps an answer as its JSON text, and an expired call's answer not at all
    // (it is written again from the record): what it gives back is what it was given.
    let clock = Clock::new();
    let store = MemoryStore::new(clock.clone(), Duration::from_secs(3600));
    let now = clock.now();
    let code = SessionCode::parse("ABCDEFGH").unwrap();
    store
        .insert_session(session("ABCDEFGH", now, 600_000))
        .await
        .unwrap();
    store
        .enqueue(&code, call("answered", now, "a"), 100, now)
        .await
        .unwrap();
    let response = ToolResponse {
        request_id: "answered".into(),
        success: false,
        result: Some(serde_json::json!({
            "z": 0.1 + 0.2, "a": [1, -2, u64::MAX, {"k": null}], "text": "é\"\n\u{1F600}"
        })),
        error: Some(ToolError {
            code: "tool_error".into(),
            message: "it broke".into(),
        }),
        content: None,
        structured_content: None,
    };
    let finished = store
        .finish(
            &code,
            "answered",
            RequestStatus::Failed,
            response.clone(),
            Answerer::Relay,
            now,
            now,
        )
        .await
        .unwrap();
    let Finished::Finished(whole) = finished else {
        panic!("{finished:?}");
    };
    let kept = store.request(&code, "answered").await.unwrap().unwrap();
    assert_eq!(kept.response.as_ref(), Some(&response));
    assert_eq!(
        (kept.tool_id.as_deref(), kept.function_name.as_str()),
        (Some("demo"), "echo")
    );
    assert_eq!(
        (kept.status, kept.call_hash),
        (whole.status, whole.call_hash.clone())
    );
    assert_eq!(
        store.responses(&code, None).await.unwrap().unwrap(),
        vec![response]
    );

    let mut late = call("late", now, "b");
    late.deadline = Timestamp(now.0 + 1_000);
    store.enqueue(&code, late, 100, now).await.unwrap();
    let queued = store.request(&code, "late").await.unwrap().unwrap();
    tokio::time::advance(Duration::from_secs(2)).await;
    let expired = store.request(&code, "late").await.unwrap().unwrap();
    assert_eq!(expired.status, RequestStatus::Expired);
    assert_eq!(expired.response, Some(queued.expired_response()));
    assert!(!expired.evicted);
}
