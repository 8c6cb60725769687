//! SIGTERM drains, on the one-process binary and on either or both processes of a split
//! deployment: new calls, sessions and attaches (WebSocket, SSE, polling, gRPC `Connect`) are
//! refused with 503 and `Retry-After` while `/readyz` is red; connected tabs keep their
//! connections and their answers (over the WebSocket, SSE's POSTs, polling, a gRPC stream)
//! reach the waiting callers; then tabs are closed with 1012, and a caller still waiting at
//! the drain deadline gets 503 with its requestId — never a dropped connection.
//!
//! A rolling restart of one of two relays on Redis goes unnoticed by callers: the draining
//! relay delivers no new call, its tabs move to the other relay once their calls are answered,
//! and the gateways send what it refuses to the other relay.
#![allow(clippy::unwrap_used)] // a test that cannot unwrap should fail loudly

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};
use tokio::sync::watch;
use tokio::time::Instant;
use toolrelay_relay::config::ENV_DRAIN_SECONDS;
use toolrelay_tests::cluster::Cluster;
use toolrelay_tests::system::{Answer, SseTab, System, send};
use toolrelay_tests::{
    Deadline, GrpcProvider, PATIENCE, WsTab, demo_tools, error_name, wait_until,
};

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
    answer.assert_refused(StatusCode::SERVICE_UNAVAILABLE, "shutting_down");
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
    ws_call.await.unwrap().assert_echoed("ws");
    sse_call.await.unwrap().assert_echoed("sse");
    poll_call.await.unwrap().assert_echoed("poll");
    grpc_call.await.unwrap().assert_echoed("grpc");

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
    calling.await.unwrap().assert_echoed("split");

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

/// A caller still waiting when the drain deadline passes (the tab never answers) gets 503
/// with its requestId, from the one-process binary or, through its gateway, from a split
/// deployment's relay; the tab is told to reconnect, and the process exits.
async fn deadline_drain(split: bool) {
    let drain = [(ENV_DRAIN_SECONDS, "1")];
    let mut system = if split {
        System::split_with(&drain, &[]).await
    } else {
        System::binary(&drain).await
    };
    let (code, token) = system.create_session().await;
    let mut tab = WsTab::attach_url(&system.ws_url(&code, &token)).await;
    tab.register(demo_tools()).await;
    let waiting = tokio::spawn(system.post(&format!("/api/sessions/{code}/call"), echo("slow")));
    let request = tab.next_request().await;

    if split {
        system.terminate_relay().await;
    } else {
        system.terminate().await;
    }
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
    let exited = if split {
        system.relay_exited().await
    } else {
        system.exited().await
    };
    assert!(exited.success());
}

#[tokio::test]
async fn a_caller_still_waiting_at_the_drain_deadline_gets_503_with_its_request_id() {
    deadline_drain(false).await;
}

#[tokio::test]
async fn a_caller_still_waiting_at_a_split_relays_drain_deadline_gets_503_with_its_request_id() {
    deadline_drain(true).await;
}

/// One call as its caller saw it: what it asked for, when, and the answer.
struct Called {
    text: String,
    submitted: Instant,
    answer: Answer,
}

/// One call as a tab saw it: what it asked for, the relay it came through, and when.
struct Arrival {
    text: String,
    relay: usize,
    at: Instant,
}

/// How long a tab of the rolling restart works on a call before it answers: long enough that
/// calls are out at the SIGTERM, so that tabs move once they are answered, not at once.
const TAB_WORK: Duration = Duration::from_millis(20);

/// A tab of the rolling restart: answers every call it is given, and when its relay closes
/// the socket (or refuses it), reconnects to the next relay of `urls`, as a tab behind a
/// balancer would; until `stop`.
async fn rolling_tab(
    mut tab: WsTab,
    urls: Vec<String>,
    mut relay: usize,
    arrivals: Arc<Mutex<Vec<Arrival>>>,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        let frame = tokio::select! {
            frame = tab.next_frame() => Some(frame),
            _ = stop.wait_for(|stop| *stop) => None,
        };
        let Some(frame) = frame else {
            return tab.close().await;
        };
        match frame {
            Some(frame) if frame["type"] == "tool-request" => {
                let text = frame["args"]["text"].as_str().unwrap().to_owned();
                arrivals.lock().unwrap().push(Arrival {
                    text: text.clone(),
                    relay,
                    at: Instant::now(),
                });
                tokio::time::sleep(TAB_WORK).await;
                let id = frame["requestId"].as_str().unwrap();
                tab.answer(id, json!({"text": text})).await;
            }
            Some(_) => {}
            None => loop {
                relay = (relay + 1) % urls.len();
                if let Some(next) = WsTab::try_connect(&urls[relay]).await {
                    tab = next;
                    break;
                }
                // Nothing listens there (the relay has exited): the next one, after a pause
                // as a tab's reconnect back-off.
                tokio::time::sleep(Duration::from_millis(50)).await;
            },
        }
    }
}

/// A caller of the rolling restart: calls the session's tab through the gateways in turn,
/// one call after another, until `stop`.
async fn rolling_caller(
    gateways: Vec<String>,
    code: String,
    name: String,
    called: Arc<Mutex<Vec<Called>>>,
    stop: watch::Receiver<bool>,
) {
    let http = reqwest::Client::new();
    for n in 0.. {
        if *stop.borrow() {
            return;
        }
        let text = format!("{name}-{n}");
        let gateway = &gateways[n % gateways.len()];
        let submitted = Instant::now();
        let request = http
            .post(format!("{gateway}/api/sessions/{code}/call"))
            .json(&echo(&text));
        let answer = send(request).await;
        called.lock().unwrap().push(Called {
            text,
            submitted,
            answer,
        });
    }
}

/// A rolling restart of one of two relays on Redis, under calls through two gateways that
/// balance over both relays, with tabs on both: no caller notices. The draining relay
/// delivers no call submitted after its `/readyz` turned red, its tabs move to the other relay
/// once their calls are answered and get their queued calls there, and the gateways send what
/// the draining relay refuses to the other one.
#[tokio::test]
async fn a_rolling_restart_of_one_of_two_relays_goes_unnoticed_by_callers() {
    const SESSIONS: usize = 4;
    const CALLERS_PER_SESSION: usize = 2;
    let mut cluster = Cluster::balanced(2, 2, &[(ENV_DRAIN_SECONDS, "30")]).await;
    let arrivals = Arc::new(Mutex::new(Vec::new()));
    let called = Arc::new(Mutex::new(Vec::new()));
    // Callers stop first, then tabs: a call still out when its tab stopped would wait in vain.
    let (stop_calls, calls_stopped) = watch::channel(false);
    let (stop_tabs, tabs_stopped) = watch::channel(false);
    let (mut tabs, mut callers) = (Vec::new(), Vec::new());
    let mut first_relay = Vec::new();
    let mut codes = Vec::new();
    for session in 0..SESSIONS {
        let (code, token) = cluster.create_session(session % 2).await;
        let urls: Vec<String> = (0..2)
            .map(|relay| cluster.tab_url(relay, &code, &token))
            .collect();
        // Tabs spread over both relays.
        let relay = session % 2;
        first_relay.push(relay);
        let mut tab = WsTab::attach_url(&urls[relay]).await;
        tab.register(demo_tools()).await;
        let serving = rolling_tab(tab, urls, relay, arrivals.clone(), tabs_stopped.clone());
        tabs.push(tokio::spawn(serving));
        codes.push(code);
    }
    // Each relay sees the other's tabs as connected (it reads the live replicas again a
    // moment after one starts): until then a call can be told that no tab is connected.
    let mut probes = 0;
    wait_until(PATIENCE, async || {
        for code in &codes {
            for gateway in 0..cluster.gateways.len() * 2 {
                probes += 1;
                let path = format!("/api/sessions/{code}/call");
                let answer = cluster.post(gateway % 2, &path, echo(&format!("probe-{probes}")));
                if answer.await.status != StatusCode::OK {
                    return Err("a relay does not see the other's tabs yet");
                }
            }
        }
        Ok(())
    })
    .await;
    for (session, code) in codes.iter().enumerate() {
        for caller in 0..CALLERS_PER_SESSION {
            let calling = rolling_caller(
                cluster.gateways.clone(),
                code.clone(),
                format!("s{session}c{caller}"),
                called.clone(),
                calls_stopped.clone(),
            );
            callers.push(tokio::spawn(calling));
        }
    }
    // Calls run through both relays' tabs.
    wait_until(PATIENCE, async || {
        let arrived = arrivals.lock().unwrap();
        let on = |relay| arrived.iter().filter(|a| a.relay == relay).count();
        if on(0) >= 25 && on(1) >= 25 {
            Ok(())
        } else {
            Err("calls are not reaching the tabs of both relays")
        }
    })
    .await;

    cluster.terminate_relay(0).await;
    let readyz = format!("http://{}/readyz", cluster.relay_websockets[0]);
    let http = reqwest::Client::new();
    wait_until(
        Deadline::within(PATIENCE).every(Duration::from_millis(2)),
        async || match http.get(&readyz).send().await {
            Ok(answer) if answer.status() == StatusCode::SERVICE_UNAVAILABLE => Ok(()),
            _ => Err("the draining relay's /readyz stayed green"),
        },
    )
    .await;
    // Every call submitted from now on was submitted after the relay began to drain.
    let red_at = Instant::now();
    assert!(cluster.relay_exited(0).await.success());
    // Calls go on through the relay left, the moved tabs' included.
    wait_until(PATIENCE, async || {
        let called = called.lock().unwrap();
        let late = called.iter().filter(|call| call.submitted > red_at).count();
        if late >= 100 {
            Ok(())
        } else {
            Err("calls did not go on after the restart")
        }
    })
    .await;
    stop_calls.send(true).unwrap();
    for caller in callers {
        caller.await.unwrap();
    }
    stop_tabs.send(true).unwrap();
    for tab in tabs {
        tab.await.unwrap();
    }

    let called = std::mem::take(&mut *called.lock().unwrap());
    let arrivals = std::mem::take(&mut *arrivals.lock().unwrap());
    // Callers that saw anything but their own answer (a 503 above all).
    let refused = called
        .iter()
        .filter(|call| call.answer.status != StatusCode::OK)
        .count();
    // What reached the tabs, call by call.
    let mut deliveries: HashMap<&str, Vec<usize>> = HashMap::new();
    for arrival in &arrivals {
        deliveries
            .entry(arrival.text.as_str())
            .or_default()
            .push(arrival.relay);
    }
    // None submitted after the drain began came through the draining relay.
    let submitted_at: HashMap<&str, Instant> = called
        .iter()
        .map(|call| (call.text.as_str(), call.submitted))
        .collect();
    let late_through_draining = arrivals
        .iter()
        .filter(|arrival| arrival.relay == 0)
        .filter_map(|arrival| submitted_at.get(arrival.text.as_str()))
        .filter(|submitted| **submitted > red_at)
        .count();
    // The draining relay's tabs moved, and got calls on the other relay.
    for (session, relay) in first_relay.iter().enumerate() {
        let prefix = format!("s{session}c");
        let moved = arrivals
            .iter()
            .any(|arrival| arrival.relay == 1 && arrival.text.starts_with(&prefix));
        assert!(
            *relay == 1 || moved,
            "the tab of session {session} never moved to the other relay"
        );
    }
    // The gateways did send calls the draining relay refused to the other one.
    let retried = cluster
        .gateway_logs
        .lines()
        .iter()
        .filter(|line| line.contains("a relay replica is draining"))
        .count();
    let late = called.iter().filter(|call| call.submitted > red_at).count();
    let after_red = arrivals
        .iter()
        .filter(|arrival| arrival.relay == 0 && arrival.at > red_at)
        .count();
    eprintln!(
        "rolling restart: {} calls ({late} submitted after /readyz turned red), {refused} not answered 200, {late_through_draining} of those submitted after it delivered through the draining relay ({after_red} deliveries through it at all after it turned red), {retried} refusals retried on the other relay",
        called.len()
    );
    // Every caller got its own answer (no 503), and every call reached a tab exactly once.
    for call in &called {
        call.answer.assert_echoed(&call.text);
        let relays = deliveries.get(call.text.as_str());
        assert_eq!(relays.map(Vec::len), Some(1), "{}: {relays:?}", call.text);
    }
    assert_eq!(late_through_draining, 0);
    assert!(
        retried > 0,
        "no call met the draining relay: the test proved nothing"
    );
}
