//! What the Redis store runs and keeps for a call, measured on a `redis-server` of the test's
//! own: the flat enqueue and finish scripts (issue 41) and when they leave a call to the
//! library's; what a finished call costs in Redis against what the answer budget counts; and a
//! call an older relay wrote, read and finished by this version.

use std::time::Duration;

use serde_json::{Value, json};
use toolrelay::wire::{RequestStatus, ToolResponse};
use toolrelay_relay::store::memory::StoreLimits;
use toolrelay_relay::store::{Answerer, EnqueueChecks, Enqueued, Finished, NewRequest};
use toolrelay_relay::{SessionCode, Timestamp};
use toolrelay_tests::store_fixture::{
    HOUR, answer, call, claim, code_of, limits, redis, session, with_session,
};

/// What a finished call really keeps in Redis is what the answer budget counts for it
/// (`rules::answer_cost`), and 30,000 finished calls over 30 sessions stay within a small
/// budget: records and answers together, what Redis's keys hold measured (`keys_memory`).
#[tokio::test]
async fn finished_calls_in_redis_cost_what_the_budget_counts() {
    use toolrelay_relay::store::rules;
    const SESSIONS: usize = 30;
    const CALLS: usize = 1000;
    let budget = 1024 * 1024;
    let fixture = redis(StoreLimits {
        retention: HOUR,
        answer_budget: budget,
        session_answer_budget: budget / 8,
        ticket_budget: 64 * 1024,
    })
    .await;
    let server = fixture.redis_server();
    let now = fixture.now();
    let codes: Vec<SessionCode> = (0..SESSIONS).map(|_| SessionCode::generate()).collect();
    for code in &codes {
        let mut record = session(code.as_str(), now, HOUR);
        record.mcp_handle = format!("handle-{}", code.as_str());
        assert!(fixture.store.insert_session(record).await.unwrap());
    }
    let before = server.keys_memory().await;
    // One session first, below its share: what one finished call with an 11-byte answer
    // keeps, against what it is counted at.
    let first = &codes[0];
    let small = answer("r", json!("hello world"));
    let counted = rules::answer_cost(&ToolResponse {
        request_id: "c-0000".into(),
        ..small.clone()
    });
    let finish_all = |code: SessionCode, from: usize, to: usize| {
        let store = fixture.store.clone();
        async move {
            for n in from..to {
                let id = format!("c-{n:04}");
                store
                    .enqueue(&code, call(&id, now, json!({"n": n})), 100, now)
                    .await
                    .unwrap();
                let answer = ToolResponse {
                    request_id: id.clone(),
                    ..answer("r", json!("hello world"))
                };
                let finished = store
                    .finish(
                        &code,
                        &id,
                        RequestStatus::Completed,
                        answer,
                        Answerer::Relay,
                        now,
                        now,
                    )
                    .await
                    .unwrap();
                assert!(matches!(finished, Finished::Finished(_)), "{finished:?}");
            }
        }
    };
    // (Measured as a slope, past the first 100: Redis's fixed costs of the first few keys and
    // its tables' first growth are no call's. It ends below the session's share, past which
    // the oldest calls make way for new ones and the slope would flatten.)
    assert!(
        300 * counted < budget / 8,
        "the session's share holds the 300 calls measured"
    );
    finish_all(first.clone(), 0, 100).await;
    let at_100 = server.keys_memory().await;
    finish_all(first.clone(), 100, 300).await;
    let per_call = (server.keys_memory().await - at_100) / 200;
    assert!(
        per_call as usize <= counted,
        "a finished call keeps {per_call} bytes in Redis but is counted at {counted}"
    );
    println!(
        "a finished call with an 11-byte answer keeps {per_call} bytes of Redis (counted at {counted})"
    );
    // Then 30,000 of them: what Redis keeps stays within the budget and some slack (the
    // sessions themselves).
    let tasks: Vec<_> = codes
        .iter()
        .enumerate()
        .map(|(n, code)| {
            let from = if n == 0 { 300 } else { 0 };
            tokio::spawn(finish_all(code.clone(), from, CALLS))
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    let kept = fixture.store.usage().await.unwrap().answer_bytes;
    assert!(kept <= budget, "the budget's count is {kept}");
    let grown = server.keys_memory().await.saturating_sub(before) as usize;
    println!("30,000 finished calls keep {grown} bytes of Redis with a budget of {budget}");
    // Within the budget whole: what the keys hold includes their tables' slots (twice over
    // during a rehash), which the budget does not count call by call.
    assert!(
        grown <= budget,
        "30,000 finished calls keep {grown} bytes of Redis, over the budget of {budget}"
    );
}

/// The flat enqueue script (issue 41) takes the common path alone — one script, one round trip
/// — and leaves every other outcome to the library's script, which it runs after (two):
/// queued by the flat one; an id taken, a full queue, a manifest that moved and a session past
/// its expiry by the library's, each with the library's answer.
#[tokio::test]
async fn the_flat_enqueue_takes_the_common_path_and_leaves_the_rest_to_the_library() {
    let fixture = redis(limits()).await;
    let server = fixture.redis_server();
    let code = with_session(&fixture).await;
    let now = fixture.now();
    let until = Timestamp(now.0 + 1_000);
    let enqueue = async |request: NewRequest, max_pending: usize, checks: EnqueueChecks| {
        let before = server.scripts_run().await;
        let (enqueued, _) = fixture
            .store
            .enqueue_checked(&code, request, max_pending, until, checks)
            .await
            .unwrap();
        (enqueued, server.scripts_run().await - before)
    };
    let plain = EnqueueChecks::default;

    let (queued, scripts) = enqueue(call("r1", now, json!({})), 10, plain()).await;
    assert!(
        matches!(queued, Enqueued::Queued(ref record) if record.seq == 1),
        "{queued:?}"
    );
    assert_eq!(scripts, 1, "queued by the flat script alone");
    let (existing, scripts) = enqueue(call("r1", now, json!({})), 10, plain()).await;
    assert!(matches!(existing, Enqueued::Existing(_)), "{existing:?}");
    assert_eq!(scripts, 2, "an id taken: the library decides");
    let (conflict, scripts) = enqueue(call("r1", now, json!({"other": 1})), 10, plain()).await;
    assert_eq!((conflict, scripts), (Enqueued::Conflict("r1".into()), 2));
    let (full, scripts) = enqueue(call("r2", now, json!({})), 1, plain()).await;
    assert_eq!((full, scripts), (Enqueued::Full, 2));
    let moved = EnqueueChecks {
        manifest_revision: Some(7),
        ..EnqueueChecks::default()
    };
    let (stale, scripts) = enqueue(call("r3", now, json!({})), 10, moved).await;
    let given_back = Enqueued::StaleManifest(Box::new(call("r3", now, json!({}))));
    assert_eq!((stale, scripts), (given_back, 2));
    let (second, scripts) = enqueue(call("r4", now, json!({})), 10, plain()).await;
    assert!(
        matches!(second, Enqueued::Queued(ref record) if record.seq == 2),
        "{second:?}"
    );
    assert_eq!(scripts, 1);
    // Past its expiry the session is ended by the library's script.
    fixture.advance(HOUR * 4);
    let later = fixture.now();
    let (gone, scripts) = enqueue(call("r5", later, json!({})), 10, plain()).await;
    assert_eq!((gone, scripts), (Enqueued::NoSession, 2));
    // An unknown session the flat script answers itself.
    let before = server.scripts_run().await;
    let (unknown, _) = fixture
        .store
        .enqueue_checked(
            &code_of("ZZZZ2345"),
            call("r6", later, json!({})),
            10,
            until,
            plain(),
        )
        .await
        .unwrap();
    assert_eq!(
        (unknown, server.scripts_run().await - before),
        (Enqueued::NoSession, 1)
    );
}

/// The flat finish script (issue 41) takes the common path alone and leaves the rest to the
/// library's script: finished, and not this connection's, by the flat one (one script); an
/// answer to a call answered already or overdue by the library's (two), each with the
/// library's answer.
#[tokio::test]
async fn the_flat_finish_takes_the_common_path_and_leaves_the_rest_to_the_library() {
    let fixture = redis(limits()).await;
    let server = fixture.redis_server();
    let code = with_session(&fixture).await;
    let now = fixture.now();
    let until = Timestamp(now.0 + 1_000);
    for id in ["r1", "r2"] {
        let queued = fixture
            .store
            .enqueue(&code, call(id, now, json!({})), 10, until)
            .await;
        assert!(matches!(queued, Ok(Enqueued::Queued(_))), "{queued:?}");
    }
    fixture
        .store
        .claim(&code, &claim("tab-1", now, HOUR))
        .await
        .unwrap();
    let finish = async |id: &str, by: &str| {
        let before = server.scripts_run().await;
        let finished = fixture
            .store
            .finish(
                &code,
                id,
                RequestStatus::Completed,
                answer(id, json!(1)),
                Answerer::Connection(by),
                fixture.now(),
                until,
            )
            .await
            .unwrap();
        (finished, server.scripts_run().await - before)
    };
    let (other, scripts) = finish("r1", "tab-2").await;
    assert_eq!(
        (other, scripts),
        (Finished::NotDelivered, 1),
        "not this connection's"
    );
    let (finished, scripts) = finish("r1", "tab-1").await;
    let Finished::Finished(record) = finished else {
        panic!("{finished:?}")
    };
    assert_eq!(
        (record.status, scripts),
        (RequestStatus::Completed, 1),
        "finished by the flat script"
    );
    assert_eq!(
        record.correlation_id.as_deref(),
        Some("corr"),
        "answered with its correlation id"
    );
    assert_eq!(
        fixture
            .store
            .responses(&code, None)
            .await
            .unwrap()
            .unwrap()
            .len(),
        1
    );
    let kept = fixture.store.request(&code, "r1").await.unwrap().unwrap();
    assert_eq!(
        (kept.args, kept.correlation_id, kept.lease_until),
        (Value::Null, None, None)
    );
    assert_eq!(kept.response.unwrap().result, Some(json!(1)));
    let (again, scripts) = finish("r1", "tab-1").await;
    assert!(matches!(again, Finished::AlreadyFinished(_)), "{again:?}");
    assert_eq!(scripts, 2, "answered already: the library decides");
    let (unknown, scripts) = finish("r9", "tab-1").await;
    assert_eq!((unknown, scripts), (Finished::NoRequest, 1));
    // Past its deadline the library's script expires it.
    fixture.advance(Duration::from_secs(61));
    let (overdue, scripts) = finish("r2", "tab-1").await;
    let Finished::AlreadyFinished(record) = overdue else {
        panic!("{overdue:?}")
    };
    assert_eq!((record.status, scripts), (RequestStatus::Expired, 2));
}

/// What a finished call keeps in Redis for its retention beyond its answer, measured the way
/// issue 41 asks (`MEMORY USAGE`, exact with `SAMPLES 0`, of the session's hash and its list
/// of finished calls, before and after 500 calls as the relay makes them: 128-bit ids, a
/// connection's id, a caller's key, a correlation id; less their answers' bytes), is no more
/// than the answer budget counts for it (`rules::answer_cost` less the answer): the budget
/// bounds what Redis really keeps. (449 bytes on Redis 7.0 here; the issue's goal of 300 is
/// missed, BENCHMARKS.md says by what.)
#[tokio::test]
async fn a_finished_call_keeps_no_more_in_redis_than_the_budget_counts() {
    const CALLS: usize = 500;
    // Budgets that keep every answer: none is evicted during the count.
    let fixture = redis(StoreLimits {
        answer_budget: 64 * 1024 * 1024,
        session_answer_budget: 8 * 1024 * 1024,
        ..limits()
    })
    .await;
    let server = fixture.redis_server();
    let now = fixture.now();
    let (code, connection) = fixture.session_with_tab("ABCD2345").await;
    let usage = async || server.keys_memory().await as usize;
    // One finished call first: the list of finished calls exists before the count starts.
    let mut answers = 0;
    let until = Timestamp(now.0 + 1_000);
    let mut before = 0;
    for n in 0..=CALLS {
        if n == 1 {
            before = usage().await;
            answers = 0;
        }
        let id = toolrelay_relay::code::unique_id();
        let request = NewRequest {
            caller: Some("k:0123456789abcdef0123456789".into()),
            correlation_id: Some(toolrelay_relay::code::random_id()),
            ..call(&id, now, json!({"text": format!("hello {n}")}))
        };
        let result = json!({"text": format!("hello {n}")});
        answers += result.to_string().len();
        let queued = fixture
            .store
            .enqueue(&code, request, 10, until)
            .await
            .unwrap();
        assert!(matches!(queued, Enqueued::Queued(_)), "{queued:?}");
        let finished = fixture
            .store
            .finish(
                &code,
                &id,
                RequestStatus::Completed,
                answer(&id, result),
                Answerer::Connection(&connection),
                now,
                until,
            )
            .await
            .unwrap();
        assert!(matches!(finished, Finished::Finished(_)), "{finished:?}");
    }
    let kept = (usage().await - before - answers) / CALLS;
    let responses = fixture.store.responses(&code, None).await.unwrap().unwrap();
    assert_eq!(responses.len(), CALLS + 1, "every answer kept");
    // What the budget counts for a call beyond its answer: the record and its id.
    let counted = toolrelay_relay::store::rules::FINISHED_CALL_BYTES + 32;
    println!(
        "a finished call keeps {kept} bytes of Redis beyond its answer; the budget counts {counted}"
    );
    assert!(
        kept <= counted,
        "a finished call keeps {kept} bytes beyond its answer, the budget counts {counted}"
    );
    // Issue 41's goal for the stored form (records.rs): 289 bytes on Debian 12's Redis 7.0.
    assert!(
        kept <= 300,
        "a finished call keeps {kept} bytes beyond its answer"
    );
}

/// A call an older relay wrote (18 fields, each `<length>:<value>`, its SHA-256 whole) is read,
/// found again when its caller asks again with the same id (not a conflict), and finished by
/// this version, which keeps it in its own layout (`records.rs`): a rolling upgrade loses no
/// call in flight.
#[tokio::test]
async fn a_call_an_older_relay_wrote_is_read_asked_again_and_finished() {
    let fixture = redis(limits()).await;
    let server = fixture.redis_server();
    let now = fixture.now();
    let (code, connection) = fixture.session_with_tab("ABCD2345").await;
    let request = NewRequest {
        caller: Some("k:older".into()),
        ..call("older-1", now, json!({"text": "hi"}))
    };
    // The older relay's hash: SHA-256 whole, of which this version keeps the first 16 bytes.
    let hash = toolrelay_relay::store::callers_call_hash(
        request.tool_id.as_deref(),
        &request.function_name,
        &request.args,
        request.caller.as_deref(),
    );
    let whole_hash = format!("{hash}{}", "0f".repeat(16));
    let (created, deadline) = (now.0.to_string(), request.deadline.0.to_string());
    let fields = [
        "older-1",
        "1",
        "demo",
        "echo",
        r#"{"text":"hi"}"#,
        "delivered",
        &created,
        &deadline,
        &connection,
        &deadline,
        "1",
        "",
        "",
        "0",
        "corr",
        &whole_hash,
        "0",
        "k:older",
    ];
    let packed: String = fields
        .iter()
        .map(|field| format!("{}:{field}", field.len()))
        .collect();
    let mut redis = server.connection().await.unwrap();
    let key = "test:{ABCD2345}:s";
    let _: () = redis::cmd("HSET")
        .arg(key)
        .arg("r:older-1")
        .arg(&packed)
        .arg("queue")
        .arg("older-1 ")
        .arg("pending")
        .arg("1")
        .arg("next_seq")
        .arg("1")
        .query_async(&mut redis)
        .await
        .unwrap();

    let read = fixture
        .store
        .request(&code, "older-1")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(read.status, RequestStatus::Delivered);
    assert_eq!(read.call_hash, hash);
    assert_eq!(read.caller.as_deref(), Some("k:older"));
    assert_eq!(read.args, json!({"text": "hi"}));
    let until = Timestamp(now.0 + 1_000);
    let again = fixture
        .store
        .enqueue(&code, request.clone(), 10, until)
        .await
        .unwrap();
    assert!(matches!(again, Enqueued::Existing(_)), "{again:?}");
    let finished = fixture
        .store
        .finish(
            &code,
            "older-1",
            RequestStatus::Completed,
            answer("older-1", json!({"ok": true})),
            Answerer::Connection(&connection),
            now,
            until,
        )
        .await
        .unwrap();
    assert!(matches!(finished, Finished::Finished(_)), "{finished:?}");
    let stored: String = redis::cmd("HGET")
        .arg(key)
        .arg("r:older-1")
        .query_async(&mut redis)
        .await
        .unwrap();
    assert!(
        stored.starts_with("1 c "),
        "kept in this version's layout: {stored:?}"
    );
    let responses = fixture
        .store
        .responses(&code, Some("k:older"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(responses.len(), 1);
    assert_eq!(responses[0].result, Some(json!({"ok": true})));
    // Asked again once finished: the same call, answered from what is kept.
    let again = fixture
        .store
        .enqueue(&code, request, 10, until)
        .await
        .unwrap();
    assert!(matches!(again, Enqueued::Existing(_)), "{again:?}");
}
