//! The gateway over real sockets holding callers to its limits: rate limits answer 429 at the
//! configured numbers, bad input gets the error body and queues nothing, answers are read in
//! pages an LLM can take, and answers past the budget are evicted without their calls running
//! twice.
#![allow(clippy::unwrap_used)] // a test that cannot unwrap should fail loudly

use std::num::NonZeroU32;

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use toolrelay_gateway::config::RateLimits;
use toolrelay_relay::RelayConfig;
use toolrelay_tests::demo_tools;
use toolrelay_tests::system::{System, echo_call, post_answer, send};

#[tokio::test]
async fn rate_limits_answer_429_at_the_configured_numbers() {
    let limits = RateLimits {
        sessions_per_ip: NonZeroU32::new(3).unwrap(),
        tools_per_ip: NonZeroU32::new(60).unwrap(),
        ..RateLimits::default()
    };
    let relay = RelayConfig {
        limits: toolrelay_relay::limits::RateLimits {
            calls_per_code: NonZeroU32::new(4).unwrap(),
            lookups_per_ip: NonZeroU32::new(5).unwrap(),
            ..toolrelay_relay::limits::RateLimits::default()
        },
        ..RelayConfig::default()
    };
    let system = System::with(relay, |config| config.limits = limits).await;

    let (code, token) = system.create_session().await;
    system.create_session().await;
    system.create_session().await;
    let refused = system.post("/api/sessions", json!({})).await;
    assert_eq!(
        refused.status,
        StatusCode::TOO_MANY_REQUESTS,
        "the 4th session in a minute"
    );
    assert!(
        refused
            .header("retry-after")
            .unwrap()
            .parse::<u64>()
            .unwrap()
            >= 1
    );
    assert_eq!(refused.body["error"], "rate_limited");
    assert_eq!(refused.body["code"], 429);

    system.put_manifest(&code, &token, demo_tools()).await;
    for n in 0..4 {
        let queued = system
            .post(
                &format!("/api/sessions/{code}/request"),
                echo_call(&n.to_string()),
            )
            .await;
        assert_eq!(queued.status, StatusCode::ACCEPTED, "call {n}");
    }
    let refused = system
        .post(&format!("/api/sessions/{code}/call"), echo_call("fifth"))
        .await;
    assert_eq!(
        refused.status,
        StatusCode::TOO_MANY_REQUESTS,
        "the 5th call to one session in a minute"
    );
    assert!(refused.header("retry-after").is_some());
    let status = system.get(&format!("/api/sessions/{code}")).await;
    assert_eq!(
        status.body["pendingRequests"], 4,
        "the refused call queued nothing"
    );

    for letter in ["B", "C", "D", "E", "F"] {
        let unknown = system
            .get(&format!("/api/sessions/AAAA{letter}AAA/metadata"))
            .await;
        assert_eq!(unknown.status, StatusCode::NOT_FOUND);
    }
    let blocked = system.get("/api/sessions/BBBBBBBB/metadata").await;
    assert_eq!(
        blocked.status,
        StatusCode::TOO_MANY_REQUESTS,
        "too many unknown codes"
    );
    let blocked = system.get(&format!("/api/sessions/{code}/metadata")).await;
    assert_eq!(
        blocked.status,
        StatusCode::TOO_MANY_REQUESTS,
        "a guessing client learns nothing, even of valid codes"
    );
    system.stop().await;
}

#[tokio::test]
async fn bad_input_gets_the_error_body_and_queues_nothing() {
    let system = System::start().await;
    let (code, token) = system.create_session().await;
    system.put_manifest(&code, &token, demo_tools()).await;
    let call = format!("/api/sessions/{code}/call");
    let queued = system
        .post(
            &format!("/api/sessions/{code}/request"),
            json!({"requestId": "taken", "functionName": "echo", "args": {"text": "a"}}),
        )
        .await;
    assert_eq!(queued.status, StatusCode::ACCEPTED);

    let raw = |body: &'static str| {
        system
            .request(Method::POST, &call)
            .header("content-type", "application/json")
            .body(body)
    };
    let cases: Vec<(reqwest::RequestBuilder, StatusCode, &str)> = vec![
        (raw("{not json"), StatusCode::BAD_REQUEST, "invalid_request"),
        (
            raw(r#"{"args": {}}"#),
            StatusCode::BAD_REQUEST,
            "invalid_request",
        ),
        (
            system
                .request(Method::POST, "/api/sessions/AB!D/call")
                .json(&echo_call("x")),
            StatusCode::BAD_REQUEST,
            "invalid_code",
        ),
        (
            system
                .request(Method::POST, &call)
                .json(&json!({"functionName": "echo", "args": {"text": 5}})),
            StatusCode::BAD_REQUEST,
            "invalid_arguments",
        ),
        (
            system
                .request(Method::POST, "/api/sessions/ZZZZ-ZZZZ/call")
                .json(&echo_call("x")),
            StatusCode::NOT_FOUND,
            "session_not_found",
        ),
        (
            system
                .request(Method::POST, &call)
                .json(&json!({"functionName": "nope", "args": {}})),
            StatusCode::NOT_FOUND,
            "unknown_function",
        ),
        (
            system.request(Method::POST, &call).json(
                &json!({"requestId": "taken", "functionName": "echo", "args": {"text": "b"}}),
            ),
            StatusCode::CONFLICT,
            "request_id_conflict",
        ),
        (
            system
                .request(Method::POST, &call)
                .json(&echo_call(&"x".repeat(300 * 1024))),
            StatusCode::PAYLOAD_TOO_LARGE,
            "body_too_large",
        ),
        (
            system
                .request(Method::POST, &format!("/api/sessions/{code}/response"))
                .json(&json!({"requestId": "taken", "result": 1})),
            StatusCode::UNAUTHORIZED,
            "token_required",
        ),
        (
            system
                .request(Method::POST, &format!("/api/sessions/{code}/response"))
                .bearer_auth("wrong")
                .json(&json!({"requestId": "taken", "result": 1})),
            StatusCode::FORBIDDEN,
            "invalid_token",
        ),
        (
            system.request(Method::GET, "/api/sessions/{code}/nothing-here"),
            StatusCode::NOT_FOUND,
            "not_found",
        ),
    ];
    for (request, status, name) in cases {
        let answer = send(request).await;
        assert_eq!(answer.status, status, "{name}: {answer:?}");
        assert_eq!(answer.body["error"], name, "{answer:?}");
        assert_eq!(answer.body["code"], status.as_u16());
        assert!(
            answer.body["message"]
                .as_str()
                .is_some_and(|m| m.len() > 20),
            "{answer:?}"
        );
        let correlation = answer.body["correlationId"].as_str().unwrap();
        assert_eq!(answer.header("x-request-id"), Some(correlation));
    }

    // A caller's x-request-id is the correlation id.
    let traced = send(
        system
            .request(Method::GET, "/api/sessions/ZZZZZZZZ")
            .header("x-request-id", "trace-42"),
    )
    .await;
    assert_eq!(traced.header("x-request-id"), Some("trace-42"));
    assert_eq!(traced.body["correlationId"], "trace-42");

    let status = system.get(&format!("/api/sessions/{code}")).await;
    assert_eq!(
        status.body["pendingRequests"], 1,
        "only the first, accepted call is queued"
    );
    system.stop().await;
}

/// Queues calls with these ids and answers each (over polling) with a string of `bytes`.
async fn answered_calls(system: &System, code: &str, token: &str, ids: &[&str], bytes: usize) {
    for id in ids {
        let queued = system
            .post(
                &format!("/api/sessions/{code}/request"),
                json!({"requestId": id, "functionName": "echo", "args": {"text": id}}),
            )
            .await;
        assert_eq!(queued.status, StatusCode::ACCEPTED, "{queued:?}");
    }
    let polled = system
        .get(&format!("/api/sessions/{code}/request?token={token}"))
        .await;
    assert_eq!(polled.body.as_array().unwrap().len(), ids.len());
    for id in ids {
        post_answer(system, code, token, id, json!("x".repeat(bytes))).await;
    }
}

#[tokio::test]
async fn answers_are_read_in_pages_that_fit_what_an_llm_can_take() {
    let system = System::start().await;
    let (code, token) = system.create_session().await;
    system.put_manifest(&code, &token, demo_tools()).await;
    let ids = ["a1", "a2", "a3", "a4", "a5"];
    answered_calls(&system, &code, &token, &ids, 40_000).await;

    // All five are 200,000 characters: the first page stops before 100,000 and says so.
    let first = system
        .http
        .get(system.url(&format!("/api/sessions/{code}/response")))
        .send()
        .await
        .unwrap();
    assert_eq!(first.headers()["x-toolrelay-truncated"], "true");
    let text = first.text().await.unwrap();
    assert!(text.chars().count() < 100_000, "{}", text.len());
    let page: Value = serde_json::from_str(&text).unwrap();
    let page = page.as_array().unwrap();
    assert_eq!(page.len(), 2, "two answers of 40,000 fit");
    let last = &page[1];
    assert_eq!(
        (last["requestId"].as_str(), last["truncated"].as_bool()),
        (Some("a2"), Some(true))
    );
    assert!(
        last["note"].as_str().unwrap().contains("after=a2"),
        "{last}"
    );

    // Reading on with after= and limit=.
    let next = system
        .get(&format!("/api/sessions/{code}/response?after=a2&limit=2"))
        .await;
    let ids_read: Vec<&str> = next
        .body
        .as_array()
        .unwrap()
        .iter()
        .map(|answer| answer["requestId"].as_str().unwrap())
        .collect();
    assert_eq!(ids_read, ["a3", "a4"], "newest last");
    assert!(next.header("x-toolrelay-truncated").is_none());
    let rest = system
        .get(&format!("/api/sessions/{code}/response?after=a4"))
        .await;
    assert_eq!(rest.body[0]["requestId"], "a5");
    system.stop().await;
}

#[tokio::test]
async fn answers_past_the_budget_are_evicted_but_their_calls_never_run_twice() {
    // One session, allowed the whole budget (its share is another test's).
    let relay = RelayConfig {
        response_budget: 300 * 1024,
        response_session_share: 1.0,
        ..RelayConfig::default()
    };
    let system = System::with(relay, |_| {}).await;
    let (code, token) = system.create_session().await;
    system.put_manifest(&code, &token, demo_tools()).await;
    let ids = ["e1", "e2", "e3", "e4", "e5"];
    answered_calls(&system, &code, &token, &ids, 100 * 1024).await;

    let gone = system
        .get(&format!("/api/sessions/{code}/requests/e1"))
        .await;
    gone.assert_refused(StatusCode::GONE, "response_evicted");
    assert_eq!(gone.body["requestId"], "e1");
    // The same call again is not run again.
    let again = system
        .post(
            &format!("/api/sessions/{code}/request"),
            json!({"requestId": "e1", "functionName": "echo", "args": {"text": "e1"}}),
        )
        .await;
    assert_eq!(again.status, StatusCode::GONE, "{again:?}");
    let polled = system
        .get(&format!("/api/sessions/{code}/request?token={token}"))
        .await;
    assert_eq!(polled.body, json!([]), "nothing was queued again");
    let other = system
        .post(
            &format!("/api/sessions/{code}/request"),
            json!({"requestId": "e1", "functionName": "echo", "args": {"text": "else"}}),
        )
        .await;
    assert_eq!(other.status, StatusCode::CONFLICT);
    let kept = system
        .get(&format!("/api/sessions/{code}/requests/e5"))
        .await;
    assert_eq!(kept.body["status"], "completed", "{kept:?}");
    system.stop().await;
}
