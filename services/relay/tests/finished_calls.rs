//! What a finished call costs the memory store: 30,000 calls answered with 11 bytes each,
//! measured on this process's resident memory (one test in its own binary, so nothing else
//! allocates meanwhile). The answer budget counts a finished call's record and answer
//! ([`rules::answer_cost`]), so the budget must cover what memory really holds.
#![allow(clippy::unwrap_used)] // a test that cannot unwrap should fail loudly

use std::time::Duration;

use serde_json::json;
use toolrelay::wire::{RequestStatus, ToolResponse};
use toolrelay_relay::store::memory::{MemoryStore, StoreLimits};
use toolrelay_relay::store::{Answerer, NewRequest, SessionRecord, SessionStore, rules};
use toolrelay_relay::{Clock, SessionCode, Timestamp};

/// This process's resident memory, in bytes.
fn rss() -> usize {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let kib: usize = status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|kib| kib.parse().ok())
        .unwrap();
    kib * 1024
}

const CALLS: usize = 30_000;
/// The bytes of each call's answer (`"hello world"`).
const ANSWER_BYTES: usize = 11;
/// Sessions the calls are spread over (each keeps up to 1,000 finished calls).
const SESSIONS: usize = 60;

/// A code for a number, in the code alphabet.
fn code_of(n: usize) -> SessionCode {
    let alphabet = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";
    let text: String = (0..8)
        .map(|i| alphabet[(n >> (5 * i)) % 32] as char)
        .collect();
    SessionCode::parse(&text).unwrap()
}

/// Answers `CALLS` calls (uuid-like ids, an 11-byte answer) in `SESSIONS` sessions of a
/// store within `limits`; returns the store's growth in resident memory and the bytes the
/// budget counts, and the store (kept, so that the next measurement gets fresh memory).
async fn finish_calls(limits: StoreLimits) -> (usize, usize, std::sync::Arc<MemoryStore>) {
    let clock = Clock::new();
    let store = MemoryStore::with_limits(clock.clone(), limits);
    let now = clock.now();
    let hour = Timestamp(now.0 + 3_600_000);
    for n in 0..SESSIONS {
        let session = SessionRecord {
            code: code_of(n),
            token_hash: "ab".repeat(32),
            created_at: now,
            expires_at: hour,
            max_expires_at: hour,
            provider: None,
            manifest_revision: 0,
            mcp_handle: format!("handle-{n}"),
        };
        assert!(store.insert_session(session).await.unwrap());
    }
    let before = rss();
    for n in 0..CALLS {
        let code = code_of(n % SESSIONS);
        let id = format!("0c9a6f3e-5b1d-4e7a-9f20-{n:012}");
        let request = NewRequest {
            id: id.clone(),
            tool_id: Some("codap".into()),
            function_name: "create_table".into(),
            args: json!({"name": "t", "rows": 3}),
            created_at: now,
            deadline: Timestamp(now.0 + 60_000),
            builtin: false,
            correlation_id: Some(format!("corr-{n:028}")),
            caller: None,
        };
        store.enqueue(&code, request, 100, now).await.unwrap();
        let response = ToolResponse {
            request_id: id.clone(),
            success: true,
            result: Some(json!("hello world")),
            error: None,
            content: None,
            structured_content: None,
        };
        store
            .finish(
                &code,
                &id,
                RequestStatus::Completed,
                response,
                Answerer::Relay,
                now,
                now,
            )
            .await
            .unwrap();
    }
    let grown = rss().saturating_sub(before);
    (grown, store.answer_bytes(), store)
}

#[tokio::test]
async fn finished_calls_cost_what_the_answer_budget_counts() {
    let answer = ToolResponse {
        request_id: "0c9a6f3e-5b1d-4e7a-9f20-000000000000".into(),
        success: true,
        result: Some(json!("hello world")),
        error: None,
        content: None,
        structured_content: None,
    };
    let counted = rules::answer_cost(&answer);
    // Every answer kept: what memory holds per call, against what the budget counts.
    let roomy = StoreLimits {
        answer_budget: 1 << 30,
        session_answer_budget: 1 << 30,
        ..StoreLimits::keeping(Duration::from_secs(3600))
    };
    let (grown, kept, _roomy) = finish_calls(roomy).await;
    assert_eq!(kept, CALLS * counted, "every answer counted");
    let per_call = grown / CALLS;
    println!(
        "{per_call} bytes of memory per finished call with an 11-byte answer; the budget counts {counted}"
    );
    // Measured 268 bytes (debug build, glibc's malloc; 568 before the record was one slot and
    // one allocation, 1,893 with whole records kept): the record keeps at most 300 bytes
    // besides its answer (issue 25, point 8). What they are: the slot in the session's queue
    // (~120), the id and the answer's JSON in one allocation (64 here), the id's place in the
    // session's table (~18) and in the queue of every finished call (~26), and the
    // allocator's slack.
    assert!(
        per_call <= ANSWER_BYTES + 300,
        "{per_call} bytes per finished call"
    );
    // A budget of 1 MB: the answers kept stay within it, and so does memory, because the
    // budget counts a record at least at what it holds (the calls past it are forgotten
    // altogether, the oldest first).
    const BUDGET: usize = 1024 * 1024;
    let small = StoreLimits {
        answer_budget: BUDGET,
        session_answer_budget: BUDGET,
        ..StoreLimits::keeping(Duration::from_secs(3600))
    };
    let (grown, kept, _small) = finish_calls(small).await;
    assert!(kept <= BUDGET, "{kept} bytes of answers kept");
    assert!(kept > BUDGET / 2, "the budget is used: {kept} bytes");
    // Measured 570 KB (19 bytes a call) with the records counted at 600 bytes each: the
    // bound leaves a quarter of the budget for the allocator's slack.
    println!("{grown} bytes of memory for {CALLS} finished calls within a 1 MB budget");
    assert!(
        grown < BUDGET + BUDGET / 4,
        "{grown} bytes for a 1 MB budget"
    );
}
