//! SIGTERM drains: new calls, sessions and attaches are refused with 503 and `Retry-After`
//! while `/readyz` is red; connected tabs keep their connections and their answers reach the
//! waiting callers; then tabs are closed with 1012, and a caller still waiting at the drain
//! deadline gets 503 with its requestId — never a dropped connection.
#![allow(clippy::unwrap_used)] // a test that cannot unwrap should fail loudly

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::json;
use toolrelay_tests::system::{Answer, System};
use toolrelay_tests::{PATIENCE, WsTab, demo_tools};

/// Waits (with a deadline) until `/readyz` answers 503.
async fn until_not_ready(system: &System) {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        if system.get("/readyz").await.status == StatusCode::SERVICE_UNAVAILABLE {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "/readyz stayed green"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn assert_retry_later(answer: &Answer) {
    assert_eq!(answer.status, StatusCode::SERVICE_UNAVAILABLE, "{answer:?}");
    assert_eq!(answer.body["error"], "shutting_down", "{answer:?}");
    assert!(answer.header("retry-after").is_some(), "{answer:?}");
}

fn echo(text: &str) -> serde_json::Value {
    json!({"functionName": "echo", "args": {"text": text}, "timeoutMs": 30_000})
}

#[tokio::test]
async fn answers_given_during_the_drain_reach_their_callers_then_tabs_are_told_to_reconnect() {
    let mut system = System::binary(&[("DRAIN_SECONDS", "30")]).await;
    // A tab on the WebSocket and one polling.
    let (ws_code, ws_token) = system.create_session().await;
    let mut tab = WsTab::attach_url(&system.ws_url(&ws_code, &ws_token)).await;
    tab.register(demo_tools()).await;
    let (poll_code, poll_token) = system.create_session().await;
    system
        .put_manifest(&poll_code, &poll_token, demo_tools())
        .await;

    // The polling tab is present once it has polled: before that a call is answered 202
    // "queued" at once rather than waited for.
    let first_poll = system
        .get(&format!(
            "/api/sessions/{poll_code}/request?token={poll_token}"
        ))
        .await;
    assert_eq!(first_poll.status, StatusCode::OK, "{first_poll:?}");
    let ws_call = tokio::spawn(system.post(&format!("/api/sessions/{ws_code}/call"), echo("ws")));
    let request = tab.next_request().await;
    let poll_call =
        tokio::spawn(system.post(&format!("/api/sessions/{poll_code}/call"), echo("poll")));
    let polled = loop {
        let polled = system
            .get(&format!(
                "/api/sessions/{poll_code}/request?token={poll_token}"
            ))
            .await;
        if polled
            .body
            .as_array()
            .is_some_and(|calls| !calls.is_empty())
        {
            break polled;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };

    system.terminate().await;
    until_not_ready(&system).await;
    // (a) New work is refused.
    assert_retry_later(&system.post("/api/sessions", json!({})).await);
    assert_retry_later(
        &system
            .post(&format!("/api/sessions/{ws_code}/call"), echo("new"))
            .await,
    );
    let mut late_tab = WsTab::connect(&system.ws_url(&poll_code, &poll_token)).await;
    assert_eq!(late_tab.recv().await["error"], "shutting_down");

    // (b) Answers still arrive, over the WebSocket and over HTTP.
    tab.answer(
        request["requestId"].as_str().unwrap(),
        json!({"text": "ws"}),
    )
    .await;
    let answered = system
        .post(
            &format!("/api/sessions/{poll_code}/response?token={poll_token}"),
            json!({"requestId": polled.body[0]["requestId"], "success": true, "result": {"text": "poll"}}),
        )
        .await;
    assert_eq!(answered.status, StatusCode::OK, "{answered:?}");
    let ws_answer = ws_call.await.unwrap();
    assert_eq!(ws_answer.status, StatusCode::OK, "{ws_answer:?}");
    assert_eq!(ws_answer.body["result"], json!({"text": "ws"}));
    let poll_answer = poll_call.await.unwrap();
    assert_eq!(
        poll_answer.body["result"],
        json!({"text": "poll"}),
        "{poll_answer:?}"
    );

    // (c) With nothing left to answer the drain ends early: the tab is told to reconnect.
    let close = tab.closed().await.expect("a close frame");
    assert_eq!(u16::from(close.code), 1012);
    assert!(system.exited().await.success());
}

#[tokio::test]
async fn a_caller_still_waiting_at_the_drain_deadline_gets_503_with_its_request_id() {
    let mut system = System::binary(&[("DRAIN_SECONDS", "1")]).await;
    let (code, token) = system.create_session().await;
    let mut tab = WsTab::attach_url(&system.ws_url(&code, &token)).await;
    tab.register(demo_tools()).await;
    let waiting = tokio::spawn(system.post(&format!("/api/sessions/{code}/call"), echo("slow")));
    let request = tab.next_request().await;

    system.terminate().await;
    // The tab never answers: at the deadline the caller learns which call to ask about.
    let answer = waiting.await.unwrap();
    assert_retry_later(&answer);
    assert_eq!(answer.body["requestId"], request["requestId"], "{answer:?}");
    assert!(
        answer.body["message"]
            .as_str()
            .unwrap()
            .contains(request["requestId"].as_str().unwrap())
    );
    let close = tab.closed().await.expect("a close frame");
    assert_eq!(u16::from(close.code), 1012);
    assert!(system.exited().await.success());
}
