//! The relay's domain under tokio's paused clock: expiry, sliding, heartbeats, timeouts,
//! leases, idempotency and delivery, without sockets.
#![allow(clippy::unwrap_used)] // a test that cannot unwrap should fail loudly

use std::time::Duration;

use serde_json::{Value, json};
use tokio::time::advance;
use toolrelay::wire::{ProviderFrame, ProviderResponse, RequestStatus};
use toolrelay_relay::store::memory::MemoryStore;
use toolrelay_relay::{
    CallInput, Clock, Downlink, NewSession, ProviderLink, Relay, RelayConfig, Transport,
};

fn relay(config: RelayConfig) -> Relay {
    config.validate().unwrap();
    let clock = Clock::new();
    Relay::new(
        MemoryStore::new(clock.clone(), config.response_retention),
        config,
        clock,
    )
}

fn tools() -> Value {
    json!([{"name": "echo", "description": "Echoes", "inputSchema": {
        "type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]
    }}])
}

async fn session_with_tools(relay: &Relay) -> NewSession {
    let session = relay.create_session().await.unwrap();
    relay
        .register_manifest(
            session.code.as_str(),
            Some(&session.provider_token),
            &tools(),
        )
        .await
        .unwrap();
    session
}

fn echo(text: &str) -> CallInput {
    CallInput {
        function_name: "echo".into(),
        args: json!({"text": text}),
        ..CallInput::default()
    }
}

fn answer(request_id: &str, result: Value) -> ProviderResponse {
    ProviderResponse {
        request_id: request_id.into(),
        success: Some(true),
        result: Some(result),
        error: None,
    }
}

/// The next message for the provider, skipping heartbeats.
async fn next(link: &mut ProviderLink) -> Downlink {
    loop {
        match tokio::time::timeout(Duration::from_secs(3600), link.downlink.recv()).await {
            Ok(Some(Downlink::Heartbeat { .. })) => continue,
            Ok(Some(message)) => return message,
            Ok(None) => panic!("the connection ended"),
            Err(_) => panic!("no message within an hour"),
        }
    }
}

async fn attach(relay: &Relay, session: &NewSession) -> ProviderLink {
    let mut link = relay
        .attach(
            session.code.as_str(),
            Some(&session.provider_token),
            Transport::WebSocket,
        )
        .await
        .unwrap();
    assert!(matches!(next(&mut link).await, Downlink::Welcome { .. }));
    link
}

fn request_id(message: Downlink) -> String {
    match message {
        Downlink::ToolRequest { request, .. } => request.request_id,
        other => panic!("expected a tool request, got {other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn an_idle_session_expires_after_its_ttl() {
    let relay = relay(RelayConfig::default());
    let session = relay.create_session().await.unwrap();
    let code = session.code.as_str();

    advance(Duration::from_secs(599)).await;
    assert!(
        relay.session_status(code).await.is_ok(),
        "alive just before the TTL"
    );
    advance(Duration::from_secs(2)).await;
    let error = relay.session_status(code).await.unwrap_err();
    assert_eq!(error.name(), "session_not_found");
    assert!(error.to_string().contains("Ask the user"), "{error}");
}

#[tokio::test(start_paused = true)]
async fn activity_slides_the_expiry() {
    let relay = relay(RelayConfig::default());
    let session = session_with_tools(&relay).await;
    let code = session.code.as_str();

    advance(Duration::from_secs(500)).await;
    relay.submit(code, echo("keep me")).await.unwrap();
    advance(Duration::from_secs(500)).await;
    let status = relay
        .session_status(code)
        .await
        .expect("the call at 500 s slid the expiry");
    assert_eq!(
        status.pending_requests, 0,
        "the call expired after 60 s unanswered"
    );
    advance(Duration::from_secs(101)).await;
    assert!(
        relay.session_status(code).await.is_err(),
        "600 s after the last activity"
    );
}

#[tokio::test(start_paused = true)]
async fn activity_cannot_outlive_the_maximum_lifetime() {
    let relay = relay(RelayConfig {
        session_max_lifetime: Duration::from_secs(1000),
        ..RelayConfig::default()
    });
    let session = session_with_tools(&relay).await;
    let code = session.code.as_str();
    for _ in 0..3 {
        advance(Duration::from_secs(300)).await;
        relay.manifest(code).await.unwrap();
    }
    assert!(
        relay.session_status(code).await.unwrap().expires_at
            <= session.expires_at.plus(Duration::from_secs(400))
    );
    advance(Duration::from_secs(101)).await;
    assert!(
        relay.session_status(code).await.is_err(),
        "gone at 1001 s despite activity"
    );
}

#[tokio::test(start_paused = true)]
async fn a_connected_provider_keeps_its_session_alive_until_it_leaves() {
    let relay = relay(RelayConfig::default());
    let session = session_with_tools(&relay).await;
    let code = session.code.as_str();
    let mut link = attach(&relay, &session).await;

    for _ in 0..4 {
        // Heartbeats every 25 s slide the session while the tab is connected. `sleep` (unlike
        // `advance`) lets the paused clock stop at each heartbeat on the way.
        tokio::time::sleep(Duration::from_secs(600)).await;
        let mut heartbeats = 0;
        while let Ok(message) = link.downlink.try_recv() {
            assert!(matches!(message, Downlink::Heartbeat { .. }), "{message:?}");
            heartbeats += 1;
        }
        assert!(heartbeats >= 23, "{heartbeats} heartbeats in 600 s");
    }
    let status = relay
        .session_status(code)
        .await
        .expect("alive after 40 minutes");
    assert_eq!(status.transport, Some(Transport::WebSocket));

    drop(link);
    tokio::task::yield_now().await;
    advance(Duration::from_secs(601)).await;
    assert!(
        relay.session_status(code).await.is_err(),
        "expired one TTL after the tab left"
    );
}

#[tokio::test(start_paused = true)]
async fn an_unanswered_call_expires_with_a_clear_error() {
    let relay = relay(RelayConfig::default());
    let session = session_with_tools(&relay).await;
    let code = session.code.as_str();

    let view = relay
        .call(code, echo("nobody home"), Some(Duration::from_secs(90)))
        .await
        .unwrap();
    assert_eq!(view.status, RequestStatus::Expired);
    let response = view.response.unwrap();
    assert!(!response.success);
    let error = response.error.unwrap();
    assert_eq!(error.code, "request_expired");
    assert!(error.message.contains("60 s"), "{}", error.message);

    // A late answer is not accepted; the caller keeps seeing the expiry.
    let late = relay
        .post_response(
            code,
            Some(&session.provider_token),
            answer(&view.request_id, json!("late")),
        )
        .await
        .unwrap();
    assert!(!late.accepted);
    assert_eq!(late.status, RequestStatus::Expired);
}

#[tokio::test(start_paused = true)]
async fn a_call_waits_for_the_provider_and_gets_its_answer() {
    let relay = relay(RelayConfig::default());
    let session = session_with_tools(&relay).await;
    let code = session.code.as_str().to_owned();
    let mut link = attach(&relay, &session).await;

    let caller = {
        let relay = relay.clone();
        let code = code.clone();
        tokio::spawn(async move { relay.call(&code, echo("hi"), None).await })
    };
    let id = request_id(next(&mut link).await);
    advance(Duration::from_secs(3)).await;
    link.uplink
        .send(ProviderFrame::Response(answer(&id, json!({"text": "hi"}))))
        .await
        .unwrap();
    let view = caller.await.unwrap().unwrap();
    assert_eq!(view.status, RequestStatus::Completed);
    assert_eq!(view.response.unwrap().result, Some(json!({"text": "hi"})));
}

#[tokio::test(start_paused = true)]
async fn a_reconnecting_provider_gets_unanswered_calls_again_and_the_first_answer_wins() {
    let relay = relay(RelayConfig::default());
    let session = session_with_tools(&relay).await;
    let code = session.code.as_str();

    let mut first = attach(&relay, &session).await;
    let delivered = relay.submit(code, echo("one")).await.unwrap();
    assert_eq!(request_id(next(&mut first).await), delivered.request_id);
    drop(first);
    tokio::task::yield_now().await;

    let queued = relay.submit(code, echo("two")).await.unwrap();
    let mut second = attach(&relay, &session).await;
    assert_eq!(
        request_id(next(&mut second).await),
        delivered.request_id,
        "redelivered"
    );
    assert_eq!(
        request_id(next(&mut second).await),
        queued.request_id,
        "then the queued one"
    );

    let outcome = relay
        .post_response(
            code,
            Some(&session.provider_token),
            answer(&delivered.request_id, json!(1)),
        )
        .await
        .unwrap();
    assert!(outcome.accepted);
    let again = relay
        .post_response(
            code,
            Some(&session.provider_token),
            answer(&delivered.request_id, json!(2)),
        )
        .await
        .unwrap();
    assert!(
        !again.accepted,
        "a second answer to the same call is ignored"
    );
    let responses = relay
        .responses(code, Some(&delivered.request_id))
        .await
        .unwrap();
    assert_eq!(responses.len(), 1);
    assert_eq!(responses[0].result, Some(json!(1)));
}

#[tokio::test(start_paused = true)]
async fn a_second_connection_replaces_the_first() {
    let relay = relay(RelayConfig::default());
    let session = session_with_tools(&relay).await;
    let mut first = attach(&relay, &session).await;
    let _second = attach(&relay, &session).await;
    assert_eq!(next(&mut first).await, Downlink::Replaced);
    assert!(
        first.downlink.recv().await.is_none(),
        "the first connection ends"
    );
}

#[tokio::test(start_paused = true)]
async fn ending_a_session_tells_its_provider() {
    let relay = relay(RelayConfig::default());
    let session = session_with_tools(&relay).await;
    let code = session.code.as_str();
    let mut link = attach(&relay, &session).await;

    assert_eq!(
        relay.end_session(code, None).await.unwrap_err().name(),
        "token_required"
    );
    relay
        .end_session(code, Some(&session.provider_token))
        .await
        .unwrap();
    assert!(matches!(next(&mut link).await, Downlink::Expired { .. }));
    assert!(relay.session_status(code).await.is_err());
}

#[tokio::test(start_paused = true)]
async fn polled_calls_are_handed_out_again_after_their_lease() {
    let relay = relay(RelayConfig::default());
    let session = session_with_tools(&relay).await;
    let code = session.code.as_str();
    let token = Some(session.provider_token.as_str());
    let call = relay.submit(code, echo("poll me")).await.unwrap();

    let first = relay.poll(code, token, None).await.unwrap();
    assert_eq!(first.len(), 1);
    assert_eq!(first[0].request_id, call.request_id);
    assert!(
        relay.poll(code, token, None).await.unwrap().is_empty(),
        "leased"
    );
    assert_eq!(
        relay
            .request_status(code, &call.request_id)
            .await
            .unwrap()
            .status,
        RequestStatus::Delivered
    );

    advance(Duration::from_secs(31)).await;
    let again = relay.poll(code, token, None).await.unwrap();
    assert_eq!(again.len(), 1, "the lease ran out");
    assert_eq!(
        relay.session_status(code).await.unwrap().transport,
        Some(Transport::Polling)
    );
}

#[tokio::test(start_paused = true)]
async fn request_ids_are_idempotent_and_the_queue_is_bounded() {
    let relay = relay(RelayConfig {
        max_pending_per_session: 2,
        ..RelayConfig::default()
    });
    let session = session_with_tools(&relay).await;
    let code = session.code.as_str();
    let with_id = |text: &str| CallInput {
        request_id: Some("call-1".into()),
        ..echo(text)
    };

    let first = relay.submit(code, with_id("a")).await.unwrap();
    let repeat = relay.submit(code, with_id("a")).await.unwrap();
    assert_eq!(first, repeat);
    let conflict = relay.submit(code, with_id("b")).await.unwrap_err();
    assert_eq!(conflict.name(), "request_id_conflict");

    relay.submit(code, echo("second")).await.unwrap();
    let full = relay.submit(code, echo("third")).await.unwrap_err();
    assert_eq!(full.name(), "queue_full");
    assert!(full.retry_after().is_some());
    assert_eq!(
        relay.session_status(code).await.unwrap().pending_requests,
        2
    );
}
