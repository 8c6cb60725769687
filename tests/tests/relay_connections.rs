//! The relay over real sockets while tabs and providers come and go: a tab or gRPC provider
//! that reconnects gets its unanswered call again and nothing runs twice, a second tab replaces
//! the first, heartbeats keep a connected session alive, stopping the relay tells tabs to
//! reconnect, and a silent tab is dropped.
#![allow(clippy::unwrap_used)] // a test that cannot unwrap should fail loudly

use std::time::Duration;

use serde_json::{Value, json};
use tokio_stream::StreamExt;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Code;
use toolrelay::json::from_value;
use toolrelay::proto::v1::{
    self as pb, CallRequest, GetSessionRequest, ListResponsesRequest, RequestStatus,
    provider_message, relay_message,
};
use toolrelay_relay::RelayConfig;
use toolrelay_tests::grpc::{call, result_of, submit};
use toolrelay_tests::{Deadline, PATIENCE, TestRelay, WsTab, demo_tools, wait_until, with_token};

#[tokio::test]
async fn a_tab_that_reconnects_gets_its_unanswered_call_again_and_nothing_runs_twice() {
    let relay = TestRelay::start().await;
    let session = relay.create_session().await;
    let code = session.code.clone();
    let mut first = WsTab::attach(&relay, &session).await;
    first.register(demo_tools()).await;

    let caller = relay
        .spawn_call(CallRequest {
            request_id: "job-1".into(),
            ..call(&code, "echo", json!({"text": "one"}))
        })
        .await;
    assert_eq!(first.next_request().await["requestId"], "job-1");
    first.close().await; // gone without answering

    let mut client = relay.client().await;
    let second_call = client
        .submit(submit(&code, "job-2", "add", json!({"a": 2, "b": 2})))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(second_call.status(), RequestStatus::Queued);

    let mut second = WsTab::attach(&relay, &session).await;
    assert_eq!(
        second.next_request().await["requestId"],
        "job-1",
        "redelivered"
    );
    assert_eq!(
        second.next_request().await["requestId"],
        "job-2",
        "the queued call follows"
    );
    second.answer("job-1", json!("one")).await;
    let state = caller.await.unwrap().unwrap();
    assert_eq!(result_of(&state), json!("one"));

    // Calling again with the same id returns the stored answer and sends nothing to the tab.
    let again = client
        .call(CallRequest {
            request_id: "job-1".into(),
            ..call(&code, "echo", json!({"text": "one"}))
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(result_of(&again), json!("one"));
    second.answer("job-2", json!(4)).await;
    second.answer("job-1", json!("a late duplicate")).await;
    let done = client
        .await_response(pb::AwaitResponseRequest {
            code: code.clone(),
            request_id: "job-2".into(),
            wait_ms: 10_000,
            news: false,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(result_of(&done), json!(4));
    let responses = client
        .list_responses(ListResponsesRequest {
            code: code.clone(),
            request_id: String::new(),
        })
        .await
        .unwrap()
        .into_inner()
        .responses;
    let answers: Vec<(String, Value)> = responses
        .iter()
        .map(|r| (r.request_id.clone(), from_value(r.result.as_ref().unwrap())))
        .collect();
    assert_eq!(
        answers,
        [("job-1".into(), json!("one")), ("job-2".into(), json!(4))]
    );
    relay.stop().await;
}

async fn next_call(inbound: &mut tonic::Streaming<pb::RelayMessage>) -> pb::ToolRequest {
    loop {
        let message = tokio::time::timeout(PATIENCE, inbound.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        if let Some(relay_message::Kind::ToolRequest(request)) = message.kind {
            return request;
        }
    }
}

#[tokio::test]
async fn a_grpc_provider_that_reconnects_gets_its_unanswered_call_again() {
    let relay = TestRelay::start().await;
    let session = relay.create_session().await;
    let mut client = relay.client().await;
    let connect = |client: pb::relay_client::RelayClient<tonic::transport::Channel>| {
        let (code, token) = (session.code.clone(), session.provider_token.clone());
        async move {
            let mut client = client;
            let (outbound, rx) = tokio::sync::mpsc::channel(8);
            let register = provider_message::Kind::Register(pb::Register {
                tools: vec![pb::Tool {
                    name: "job".into(),
                    ..Default::default()
                }],
                ..Default::default()
            });
            outbound
                .send(pb::ProviderMessage {
                    kind: Some(register),
                })
                .await
                .unwrap();
            let mut request = with_token(ReceiverStream::new(rx), &token);
            request
                .metadata_mut()
                .insert("x-session-code", code.parse().unwrap());
            let inbound = client.connect(request).await.unwrap().into_inner();
            (outbound, inbound)
        }
    };

    let (outbound, mut inbound) = connect(client.clone()).await;
    // Wait for the manifest, then queue the call.
    loop {
        let message = inbound.next().await.unwrap().unwrap();
        if matches!(message.kind, Some(relay_message::Kind::Registered(_))) {
            break;
        }
    }
    client
        .submit(submit(&session.code, "once", "job", json!({})))
        .await
        .unwrap();
    assert_eq!(next_call(&mut inbound).await.request_id, "once");
    drop((outbound, inbound)); // the provider crashes

    let (outbound, mut inbound) = connect(client.clone()).await;
    let again = next_call(&mut inbound).await;
    assert_eq!(again.request_id, "once", "redelivered after the reconnect");
    assert!(again.seq > 0);
    let response = pb::ToolResponse {
        request_id: "once".into(),
        success: true,
        result: Some(toolrelay::json::to_value(&json!("done"))),
        error: None,
        content: Vec::new(),
        structured_content: None,
    };
    outbound
        .send(pb::ProviderMessage {
            kind: Some(provider_message::Kind::Response(response)),
        })
        .await
        .unwrap();
    let done = client
        .await_response(pb::AwaitResponseRequest {
            code: session.code.clone(),
            request_id: "once".into(),
            wait_ms: 10_000,
            news: false,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(result_of(&done), json!("done"));
    relay.stop().await;
}

#[tokio::test]
async fn a_second_tab_with_the_token_replaces_the_first() {
    let relay = TestRelay::start().await;
    let session = relay.create_session().await;
    let mut first = WsTab::attach(&relay, &session).await;
    let mut second = WsTab::attach(&relay, &session).await;
    let frame = first.recv().await;
    assert_eq!(
        (frame["type"].as_str(), frame["error"].as_str()),
        (Some("error"), Some("replaced"))
    );
    first.closed().await;

    second.register(demo_tools()).await;
    let mut client = relay.client().await;
    let queued = client
        .submit(submit(&session.code, "", "echo", json!({"text": "x"})))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        second.next_request().await["requestId"],
        queued.request_id.as_str()
    );
    relay.stop().await;
}

#[tokio::test]
async fn heartbeats_keep_a_connected_session_alive_and_deletion_ends_it() {
    let relay = TestRelay::with_config(RelayConfig {
        session_ttl: Duration::from_secs(2),
        heartbeat_interval: Duration::from_millis(500),
        ..RelayConfig::default()
    })
    .await;
    let idle = relay.create_session().await;
    let session = relay.create_session().await;
    let mut tab = WsTab::attach(&relay, &session).await;
    let mut heartbeats = 0;
    let until = tokio::time::Instant::now() + Duration::from_secs(3);
    while tokio::time::Instant::now() < until {
        let frame = tab.next_frame().await.unwrap();
        assert_eq!(frame["type"], "heartbeat", "{frame}");
        heartbeats += 1;
    }
    assert!(heartbeats >= 4, "{heartbeats} heartbeats in 3 s");

    let mut client = relay.client().await;
    let idle_status = client
        .get_session(GetSessionRequest {
            code: idle.code.clone(),
        })
        .await
        .unwrap_err();
    assert_eq!(
        idle_status.code(),
        Code::NotFound,
        "the idle session expired"
    );
    client
        .get_session(GetSessionRequest {
            code: session.code.clone(),
        })
        .await
        .expect("the connected session is alive after 1.5 TTLs");

    let delete = pb::DeleteSessionRequest {
        code: session.code.clone(),
    };
    client
        .delete_session(with_token(delete, &session.provider_token))
        .await
        .unwrap();
    assert_eq!(tab.recv().await["type"], "expired");
    tab.closed().await;
    relay.stop().await;
}

#[tokio::test]
async fn stopping_the_relay_tells_tabs_to_reconnect() {
    let relay = TestRelay::start().await;
    let session = relay.create_session().await;
    let mut tab = WsTab::attach(&relay, &session).await;
    let stopping = tokio::spawn(relay.stop());
    let frame = tab.recv().await;
    assert_eq!(frame["error"], "shutting_down", "{frame}");
    assert_eq!(u16::from(tab.closed().await.unwrap().code), 1012);
    stopping.await.unwrap();
}

#[tokio::test]
async fn a_tab_that_stops_answering_pings_is_dropped_and_its_call_goes_to_the_next_tab() {
    let relay = TestRelay::with_config(RelayConfig {
        session_ttl: Duration::from_secs(30),
        heartbeat_interval: Duration::from_millis(300),
        ..RelayConfig::default()
    })
    .await;
    let (session, mut silent) = relay.paired().await;
    let mut client = relay.client().await;
    let call = client
        .submit(submit(&session.code, "stuck", "echo", json!({"text": "x"})))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(silent.next_request().await["requestId"], "stuck");

    // The tab stops reading (a sleeping laptop): it answers no ping, and no TCP close comes.
    let every = Deadline::within(PATIENCE).every(Duration::from_millis(100));
    wait_until(every, async || {
        let info = client
            .get_session(GetSessionRequest {
                code: session.code.clone(),
            })
            .await
            .unwrap()
            .into_inner();
        if info.provider_connected {
            Err("the silent tab was never dropped")
        } else {
            Ok(())
        }
    })
    .await;

    let mut next = WsTab::attach(&relay, &session).await;
    assert_eq!(
        next.next_request().await["requestId"],
        call.request_id.as_str()
    );
    drop(silent);
    relay.stop().await;
}

#[tokio::test]
async fn a_tab_that_pings_often_is_not_taken_for_silent() {
    let relay = TestRelay::start().await;
    let (session, mut tab) = relay.paired().await;
    // Pings sent back to back: their heartbeat replies must not count as the relay's own
    // heartbeats going unanswered.
    for _ in 0..5 {
        tab.send(json!({"type": "ping"})).await;
    }
    for _ in 0..5 {
        let frame = tab.next_frame().await.expect("the tab is still connected");
        assert_eq!(frame["type"], "heartbeat", "{frame}");
    }
    let pending = relay
        .spawn_call(call(&session.code, "echo", json!({"text": "still here"})))
        .await;
    let request = tab.next_request().await;
    let id = request["requestId"].as_str().unwrap();
    tab.answer(id, json!({"text": "still here"})).await;
    let state = pending.await.unwrap().unwrap();
    assert_eq!(result_of(&state), json!({"text": "still here"}));
    relay.stop().await;
}

/// Behind a split gateway the tab's socket is the gateway's and its connection the relay's:
/// the gateway tells the relay of each pong (`heard` on the `Connect` stream), so a tab that
/// answers the pings stays however long it is quiet, and one that stops is dropped.
#[tokio::test]
async fn behind_a_split_gateway_a_tab_answering_pings_stays_and_a_silent_one_is_dropped() {
    use toolrelay_tests::system::System;
    let system = System::split_with(&[("HEARTBEAT_SECONDS", "1")], &[]).await;
    let (code, token) = system.create_session().await;
    let mut tab = WsTab::attach_url(&system.ws_url(&code, &token)).await;
    tab.register(demo_tools()).await;
    let connected = async || {
        let status = system.get(&format!("/api/sessions/{code}")).await;
        status.body["providerConnected"] == true
    };

    // Reading, the tab answers each heartbeat's ping: four heartbeats, twice the limit.
    let mut heartbeats = 0;
    while heartbeats < 4 {
        let frame = tab.next_frame().await.expect("the tab was dropped");
        if frame["type"] == "heartbeat" {
            heartbeats += 1;
        }
    }
    assert!(connected().await, "a tab answering pings was dropped");

    // It stops reading (a sleeping laptop): no pong, no TCP close.
    let every = Deadline::within(PATIENCE).every(Duration::from_millis(100));
    wait_until(every, async || {
        if connected().await {
            Err("the silent tab was never dropped")
        } else {
            Ok(())
        }
    })
    .await;
    drop(tab);
    system.stop().await;
}
