//! SIGTERM drains, on the one-process binary and on either or both processes of a split
//! deployment: new calls, sessions and attaches (WebSocket, SSE, polling, gRPC `Connect`) are
//! refused with 503 and `Retry-After` while `/readyz` is red; connected tabs keep their
//! connections and their answers (over the WebSocket, SSE's POSTs, polling, a gRPC stream)
//! reach the waiting callers; then tabs are closed with 1012, and a caller still waiting at
//! the drain deadline gets 503 with its requestId — never a dropped connection.
#![allow(clippy::unwrap_used)] // a test that cannot unwrap should fail loudly

use reqwest::StatusCode;
use serde_json::{Value, json};
use toolrelay_relay::config::ENV_DRAIN_SECONDS;
use toolrelay_tests::system::{Answer, SseTab, System};
use toolrelay_tests::{GrpcProvider, PATIENCE, WsTab, demo_tools, error_name, wait_until};

/// Waits (with a deadline) until `/readyz` answers 503.
async fn until_not_ready(system: &System) {
    wait_until(PATIENCE, async || {
        if system.get("/readyz").await.status == StatusCode::SERVICE_UNAVAILABLE {
            Ok(())
        } else {
            Err("/readyz stayed green")
        }
    })
    .await;
}

fn assert_retry_later(answer: &Answer) {
    assert_eq!(answer.status, StatusCode::SERVICE_UNAVAILABLE, "{answer:?}");
    assert_eq!(answer.body["error"], "shutting_down", "{answer:?}");
    assert!(answer.header("retry-after").is_some(), "{answer:?}");
}

fn echo(text: &str) -> Value {
    json!({"functionName": "echo", "args": {"text": text}, "timeoutMs": 30_000})
}

/// Polls as a tab until a call is handed out (with a deadline); returns it.
async fn poll_until_a_call(system: &System, code: &str, token: &str) -> Value {
    wait_until(PATIENCE, async || {
        let polled = system
            .get(&format!("/api/sessions/{code}/request?token={token}"))
            .await;
        assert_eq!(polled.status, StatusCode::OK, "{polled:?}");
        let first = polled.body.as_array().and_then(|calls| calls.first());
        first.cloned().ok_or("no call reached the poller")
    })
    .await
}

/// A tab's answer posted over HTTP, as SSE and polling tabs answer.
async fn post_answer(system: &System, code: &str, token: &str, request_id: &str, text: &str) {
    let answered = system
        .post(
            &format!("/api/sessions/{code}/response?token={token}"),
            json!({"requestId": request_id, "success": true, "result": {"text": text}}),
        )
        .await;
    assert_eq!(answered.status, StatusCode::OK, "{answered:?}");
    assert_eq!(answered.body["accepted"], true, "{answered:?}");
}

fn assert_answered(answer: &Answer, text: &str) {
    assert_eq!(answer.status, StatusCode::OK, "{answer:?}");
    assert_eq!(answer.body["result"], json!({"text": text}), "{answer:?}");
}

#[tokio::test]
async fn answers_given_during_the_drain_reach_their_callers_then_tabs_are_told_to_reconnect() {
    let mut system = System::binary(&[(ENV_DRAIN_SECONDS, "30")]).await;
    // A tab on each transport, each given a call before the drain begins.
    let (ws_code, ws_token) = system.create_session().await;
    let mut ws_tab = WsTab::attach_url(&system.ws_url(&ws_code, &ws_token)).await;
    ws_tab.register(demo_tools()).await;
    let (sse_code, sse_token) = system.create_session().await;
    system
        .put_manifest(&sse_code, &sse_token, demo_tools())
        .await;
    let mut sse_tab = SseTab::open(
        &system,
        &format!("/api/sessions/{sse_code}/stream?token={sse_token}"),
        None,
    )
    .await;
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
    let (grpc_code, grpc_token) = system.create_session().await;
    let mut provider =
        GrpcProvider::attach(system.grpc, &grpc_code, &grpc_token, &demo_tools()).await;
    // A session with no tab yet, for the attaches the drain refuses.
    let (idle_code, idle_token) = system.create_session().await;

    let ws_call = tokio::spawn(system.post(&format!("/api/sessions/{ws_code}/call"), echo("ws")));
    let ws_request = ws_tab.next_request().await;
    let sse_call =
        tokio::spawn(system.post(&format!("/api/sessions/{sse_code}/call"), echo("sse")));
    let sse_request = sse_tab.next().await;
    assert_eq!(sse_request.kind, "tool-request", "{sse_request:?}");
    let poll_call =
        tokio::spawn(system.post(&format!("/api/sessions/{poll_code}/call"), echo("poll")));
    let polled = poll_until_a_call(&system, &poll_code, &poll_token).await;
    let grpc_call =
        tokio::spawn(system.post(&format!("/api/sessions/{grpc_code}/call"), echo("grpc")));
    let grpc_request = provider.next_request().await;

    system.terminate().await;
    until_not_ready(&system).await;
    // (a) New work is refused: sessions, calls, and attaches on every transport.
    assert_retry_later(&system.post("/api/sessions", json!({})).await);
    assert_retry_later(
        &system
            .post(&format!("/api/sessions/{ws_code}/call"), echo("new"))
            .await,
    );
    let mut late_tab = WsTab::connect(&system.ws_url(&idle_code, &idle_token)).await;
    assert_eq!(late_tab.recv().await["error"], "shutting_down");
    assert_retry_later(
        &system
            .get(&format!(
                "/api/sessions/{idle_code}/stream?token={idle_token}"
            ))
            .await,
    );
    assert_retry_later(
        &system
            .get(&format!(
                "/api/sessions/{idle_code}/request?token={idle_token}"
            ))
            .await,
    );
    let refused = GrpcProvider::connect(system.grpc, &idle_code, &idle_token, &demo_tools())
        .await
        .err()
        .expect("a gRPC provider cannot attach during the drain");
    assert_eq!(error_name(&refused), "shutting_down", "{refused:?}");

    // (b) Answers still arrive: over the WebSocket, SSE's and polling's POSTs, and gRPC.
    ws_tab
        .answer(
            ws_request["requestId"].as_str().unwrap(),
            json!({"text": "ws"}),
        )
        .await;
    post_answer(
        &system,
        &sse_code,
        &sse_token,
        sse_request.data["requestId"].as_str().unwrap(),
        "sse",
    )
    .await;
    post_answer(
        &system,
        &poll_code,
        &poll_token,
        polled["requestId"].as_str().unwrap(),
        "poll",
    )
    .await;
    provider
        .answer(&grpc_request.request_id, &json!({"text": "grpc"}))
        .await;
    assert_answered(&ws_call.await.unwrap(), "ws");
    assert_answered(&sse_call.await.unwrap(), "sse");
    assert_answered(&poll_call.await.unwrap(), "poll");
    assert_answered(&grpc_call.await.unwrap(), "grpc");

    // (c) With nothing left to answer the drain ends early: every tab is told to reconnect.
    let close = ws_tab.closed().await.expect("a close frame");
    assert_eq!(u16::from(close.code), 1012);
    sse_tab.ended().await;
    assert_eq!(provider.ended().await, ["shutting_down"]);
    assert!(system.exited().await.success());
}

/// Which processes of a split deployment get SIGTERM.
#[derive(Clone, Copy, Debug)]
enum Stopping {
    Gateway,
    Relay,
    Both,
}

/// A split deployment with a WebSocket tab attached to the gateway: the processes in
/// `stopping` get SIGTERM while a caller through the gateway waits for the tab. New work is
/// refused, the tab's answer still reaches the caller, and then the tab is told to reconnect
/// and the stopped processes exit.
async fn split_drain(stopping: Stopping) {
    let drain = [(ENV_DRAIN_SECONDS, "30")];
    let mut system = System::split_with(&drain, &drain).await;
    let (code, token) = system.create_session().await;
    let mut tab = WsTab::attach_url(&system.ws_url(&code, &token)).await;
    tab.register(demo_tools()).await;
    let (idle_code, idle_token) = system.create_session().await;
    let calling = tokio::spawn(system.post(&format!("/api/sessions/{code}/call"), echo("split")));
    let request = tab.next_request().await;

    if matches!(stopping, Stopping::Relay | Stopping::Both) {
        system.terminate_relay().await;
    }
    if matches!(stopping, Stopping::Gateway | Stopping::Both) {
        system.terminate().await;
    }
    until_not_ready(&system).await;
    // (a) Whichever process drains, the client is told to come back later.
    assert_retry_later(&system.post("/api/sessions", json!({})).await);
    assert_retry_later(
        &system
            .post(&format!("/api/sessions/{code}/call"), echo("new"))
            .await,
    );
    let mut late_tab = WsTab::connect(&system.ws_url(&idle_code, &idle_token)).await;
    assert_eq!(late_tab.recv().await["error"], "shutting_down");
    assert_retry_later(
        &system
            .get(&format!(
                "/api/sessions/{idle_code}/stream?token={idle_token}"
            ))
            .await,
    );
    assert_retry_later(
        &system
            .get(&format!(
                "/api/sessions/{idle_code}/request?token={idle_token}"
            ))
            .await,
    );

    // (b) The tab's answer crosses the draining process(es) to its caller.
    tab.answer(
        request["requestId"].as_str().unwrap(),
        json!({"text": "split"}),
    )
    .await;
    assert_answered(&calling.await.unwrap(), "split");

    // (c) Then the tab is told to reconnect, and what was stopped exits cleanly.
    let close = tab.closed().await.expect("a close frame");
    assert_eq!(u16::from(close.code), 1012, "{stopping:?}");
    if matches!(stopping, Stopping::Relay | Stopping::Both) {
        assert!(system.relay_exited().await.success());
    }
    if matches!(stopping, Stopping::Gateway | Stopping::Both) {
        assert!(system.exited().await.success());
    } else {
        let health = system.get("/healthz").await;
        assert_eq!(
            health.status,
            StatusCode::OK,
            "the gateway lives on: {health:?}"
        );
    }
}

#[tokio::test]
async fn a_draining_gateway_lets_its_websocket_tab_answer_then_tells_it_to_reconnect() {
    split_drain(Stopping::Gateway).await;
}

#[tokio::test]
async fn a_draining_relay_lets_a_tab_on_the_gateway_answer_then_tells_it_to_reconnect() {
    split_drain(Stopping::Relay).await;
}

#[tokio::test]
async fn a_split_deployment_stopping_whole_lets_the_tab_answer_then_tells_it_to_reconnect() {
    split_drain(Stopping::Both).await;
}

#[tokio::test]
async fn a_caller_still_waiting_at_the_drain_deadline_gets_503_with_its_request_id() {
    let mut system = System::binary(&[(ENV_DRAIN_SECONDS, "1")]).await;
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
