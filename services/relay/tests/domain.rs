//! The relay's domain under tokio's paused clock: expiry, sliding, heartbeats, timeouts,
//! leases, idempotency and delivery, without sockets.
#![allow(clippy::unwrap_used)] // a test that cannot unwrap should fail loudly

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::time::advance;
use toolrelay::wire::{ProviderFrame, ProviderResponse, RequestStatus};
use toolrelay_relay::builtin::{Context, Registry, Tool, ToolFailure};
use toolrelay_relay::provider::Uplink;
use toolrelay_relay::store::memory::MemoryStore as Mem;
use toolrelay_relay::store::memory::{MemoryStore, StoreLimits};
use toolrelay_relay::{
    CallInput, Clock, Downlink, Metrics, NewSession, ProviderLink, Relay, RelayConfig, RelayError,
    Transport,
};

fn relay(config: RelayConfig) -> Relay {
    config.validate().unwrap();
    let clock = Clock::new();
    // One registry for the relay and its store, as the binaries have.
    let metrics = Metrics::default();
    let limits = StoreLimits::keeping(config.response_retention);
    Relay::with_tools(
        MemoryStore::observed(clock.clone(), limits, metrics.clone()),
        config,
        clock,
        Registry::new(vec![Arc::new(Shout)]),
        metrics,
    )
}

/// A tool built into the relay (the real ones are the `toolrelay-builtin` crate's): it answers
/// its text in capitals.
struct Shout;

#[async_trait::async_trait]
impl Tool for Shout {
    fn name(&self) -> &'static str {
        "shout"
    }

    fn description(&self) -> &'static str {
        "Answers the text in capitals."
    }

    fn input_schema(&self) -> Value {
        json!({"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]})
    }

    fn output_schema(&self) -> Value {
        json!({"type": "object"})
    }

    fn hints(&self) -> toolrelay_relay::builtin::ToolHints {
        toolrelay_relay::builtin::ToolHints::default()
    }

    async fn call(&self, args: Value, _context: &Context) -> Result<Value, ToolFailure> {
        Ok(json!(
            args["text"].as_str().unwrap_or_default().to_uppercase()
        ))
    }
}

/// The value of the series `series` (name and labels as written) on the relay's page.
async fn metric(relay: &Relay, series: &str) -> f64 {
    let text = relay.metrics().render().await;
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("{series} is not in\n{text}"))
        .parse()
        .unwrap()
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
        content: None,
        structured_content: None,
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

/// Attaches a provider, its driver running in a task of its own (the test is its transport).
async fn attach(relay: &Relay, session: &NewSession) -> ProviderLink {
    let mut link = relay
        .attach(
            session.code.as_str(),
            Some(&session.provider_token),
            Transport::WebSocket,
        )
        .await
        .unwrap();
    link.spawn_driver();
    assert!(matches!(next(&mut link).await, Downlink::Welcome { .. }));
    link
}

fn request_id(message: Downlink) -> String {
    match message {
        Downlink::ToolRequest { request, .. } => request.into_request().request_id,
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

/// A link whose driver never ran (a transport that dropped it, or took it apart and kept none
/// of it) still detaches: the driver, dropped, runs by itself and records the provider gone,
/// as it does when its transport ends.
#[tokio::test(start_paused = true)]
async fn a_link_dropped_with_its_driver_unrun_still_detaches() {
    let relay = relay(RelayConfig::default());
    let session = session_with_tools(&relay).await;
    let link = relay
        .attach(
            session.code.as_str(),
            Some(&session.provider_token),
            Transport::WebSocket,
        )
        .await
        .unwrap();
    let recorded = |relay: Relay| {
        let code = session.code.clone();
        async move {
            let session = relay.store().session(&code).await.unwrap().unwrap();
            session.provider.is_some()
        }
    };
    assert!(recorded(relay.clone()).await, "the attach is recorded");
    drop(link);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while recorded(relay.clone()).await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the dropped link's provider is still recorded"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(start_paused = true)]
async fn an_unanswered_call_expires_with_a_clear_error() {
    let relay = relay(RelayConfig::default());
    let session = session_with_tools(&relay).await;
    let code = session.code.as_str();

    // With no tab, a call answers at once that it waits; waiting for it, the caller sees it
    // expire.
    let queued = relay
        .call(code, echo("nobody home"), Some(Duration::from_secs(90)))
        .await
        .unwrap();
    assert_eq!(queued.status, RequestStatus::Queued);
    assert!(!queued.provider_connected);
    let view = relay
        .await_response(
            code,
            &queued.request_id,
            Duration::from_secs(90),
            false,
            None,
        )
        .await
        .unwrap();
    assert_eq!(view.status, RequestStatus::Expired);
    let response = view.response.unwrap();
    assert!(!response.success);
    let error = response.error.unwrap();
    assert_eq!(error.code, "request_expired");
    assert!(error.message.contains("60 s"), "{}", error.message);

    // An answer to it is not accepted (no tab was given it); the caller keeps seeing the
    // expiry.
    let late = relay
        .post_response(
            code,
            Some(&session.provider_token),
            answer(&view.request_id, json!("late")),
        )
        .await;
    assert!(
        matches!(late, Err(RelayError::NotDelivered { .. })),
        "{late:?}"
    );
    let view = relay
        .request_status(code, &view.request_id, None)
        .await
        .unwrap();
    assert_eq!(view.status, RequestStatus::Expired);
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
        .send(Uplink::Frame(ProviderFrame::Response(Box::new(answer(
            &id,
            json!({"text": "hi"}),
        )))))
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
        .responses(code, Some(&delivered.request_id), None)
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

    let first = relay.poll(code, token, None, &[]).await.unwrap().requests;
    assert_eq!(first.len(), 1);
    assert_eq!(first[0].request_id, call.request_id);
    assert!(
        relay
            .poll(code, token, None, &[])
            .await
            .unwrap()
            .requests
            .is_empty(),
        "leased"
    );
    assert_eq!(
        relay
            .request_status(code, &call.request_id, None)
            .await
            .unwrap()
            .status,
        RequestStatus::Delivered
    );

    advance(Duration::from_secs(31)).await;
    let again = relay.poll(code, token, None, &[]).await.unwrap().requests;
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

// ---- regressions found in review ----

/// A tab answers a call and closes its socket at once (the WS task forwards the frame into
/// `uplink`, then drops the link). The answer must not be lost.
#[tokio::test(start_paused = true)]
async fn an_answer_sent_just_before_disconnecting_is_not_lost() {
    let relay = relay(RelayConfig::default());
    let mut lost = 0;
    for _ in 0..20 {
        let session = session_with_tools(&relay).await;
        let code = session.code.as_str();
        let mut link = attach(&relay, &session).await;
        let call = relay.submit(code, echo("x")).await.unwrap();
        let id = request_id(next(&mut link).await);
        link.uplink
            .send(Uplink::Frame(ProviderFrame::Response(Box::new(answer(
                &id,
                json!("done"),
            )))))
            .await
            .unwrap();
        drop(link); // socket closed right after the answer
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        let status = relay
            .request_status(code, &call.request_id, None)
            .await
            .unwrap()
            .status;
        if status != RequestStatus::Completed {
            lost += 1;
        }
    }
    assert_eq!(lost, 0, "{lost} of 20 answers were dropped by the driver");
}

/// The LLM may omit toolId (§4: optional when calling), but the tab dispatches on
/// `(toolId, functionName)` (§6 tool-request `{requestId, toolId, functionName, args}`).
#[tokio::test(start_paused = true)]
async fn a_tool_request_names_the_tool_even_when_the_caller_did_not() {
    let relay = relay(RelayConfig::default());
    let session = relay.create_session().await.unwrap();
    let code = session.code.as_str();
    relay
        .register_manifest(
            code,
            Some(&session.provider_token),
            &json!({"tools": [{"id": "people", "description": "", "functions": [
                {"name": "addPerson", "description": "", "parameters": {"type": "object"}}]}]}),
        )
        .await
        .unwrap();
    let mut link = attach(&relay, &session).await;
    relay
        .submit(
            code,
            CallInput {
                function_name: "addPerson".into(),
                args: json!({}),
                ..CallInput::default()
            },
        )
        .await
        .unwrap();
    match next(&mut link).await {
        Downlink::ToolRequest { request, .. } => {
            assert_eq!(request.frame().tool_id, Some("people"))
        }
        other => panic!("{other:?}"),
    }
}

/// Calls that time out while nobody looks are never settled, so the sweeper never drops
/// them: a session kept busy accumulates every unobserved call for its whole life.
#[tokio::test(start_paused = true)]
async fn calls_that_expire_unobserved_are_eventually_dropped() {
    let config = RelayConfig {
        max_pending_per_session: 10,
        ..RelayConfig::default()
    };
    config.validate().unwrap();
    let clock = Clock::new();
    let store = Mem::new(clock.clone(), config.response_retention);
    let relay = Relay::new(store.clone(), config, clock, Metrics::default());
    let session = session_with_tools(&relay).await;
    let code = session.code.as_str();
    // 10 calls a minute for 3 hours, never answered, never looked at.
    for _ in 0..180 {
        for _ in 0..10 {
            relay.submit(code, echo("x")).await.unwrap();
        }
        tokio::time::sleep(Duration::from_secs(61)).await;
    }
    use toolrelay_relay::store::SessionStore;
    let kept = store
        .responses(&session.code, None)
        .await
        .unwrap()
        .unwrap()
        .len();
    assert_eq!(store.pending_count(&session.code).await.unwrap(), Some(0));
    // Retention is 1 h after the answer (here: the expiry at +60 s): at most ~70 minutes' worth.
    assert!(kept <= 10 * 71, "{kept} call records kept after 3 hours");
}

/// Two attaches that overlap (a quick reconnect, or two provider processes) can each see the
/// other's ProviderChanged and both close, leaving the session without a provider.
#[tokio::test(start_paused = true)]
async fn overlapping_attaches_leave_one_connection_standing() {
    use toolrelay::wire::{RequestStatus, ToolResponse};
    use toolrelay_relay::error::StoreError;
    use toolrelay_relay::metrics::StoreOperation;
    use toolrelay_relay::store::{
        Answerer, ApprovalChange, ApprovalState, BudgetStore, CallNews, CallProgress, Claim,
        EnqueueChecks, Enqueued, EventStream, Finished, Inserted, McpSessionCaps, McpSessionStore,
        McpSessionsFull, NewRequest, ProviderInfo, RateBudget, Reachable, RequestRecord,
        RoutedAnswer, SessionRecord, SessionStore, StoreUsage, TabState, TicketStore,
    };
    use toolrelay_relay::{SessionCode, Timestamp};
    struct Slow(Arc<Mem>);
    /// Each method forwards to the memory store; `set_provider` first yields, as a store round
    /// trip (Redis) is a suspension point.
    macro_rules! slowed {
        () => {};
        ($(#[$part_meta:meta])* $part:ident [$($bound:tt)*] {
            $(
                $(#[$meta:meta])*
                fn $method:ident(&self $(, $arg:ident: $type:ty)* $(,)?)
                    -> $output:ty => $operation:ident $body:tt
            )*
        } $($rest:tt)*) => {
            #[async_trait::async_trait]
            impl $part for Slow {
                $(
                    $(#[$meta])*
                    async fn $method(&self $(, $arg: $type)*) -> Result<$output, StoreError> {
                        if StoreOperation::$operation == StoreOperation::SetProvider {
                            tokio::task::yield_now().await;
                        }
                        self.0.$method($($arg),*).await
                    }
                )*
            }
            slowed! { $($rest)* }
        };
    }
    toolrelay_relay::store_methods!(slowed);
    let config = RelayConfig::default();
    let clock = Clock::new();
    let relay = Relay::new(
        Arc::new(Slow(Mem::new(clock.clone(), config.response_retention))),
        config,
        clock,
        Metrics::default(),
    );
    let session = relay.create_session().await.unwrap();
    let (code, token) = (session.code.as_str(), Some(session.provider_token.as_str()));
    // Each driver starts as soon as its attach returns, while the other may still run.
    let attach = || async {
        let mut link = relay.attach(code, token, Transport::WebSocket).await;
        if let Ok(link) = &mut link {
            link.spawn_driver();
        }
        link
    };
    let (a, b) = tokio::join!(attach(), attach());
    let (mut a, mut b) = (a.unwrap(), b.unwrap());
    let mut replaced = 0;
    for link in [&mut a, &mut b] {
        while let Ok(Some(message)) =
            tokio::time::timeout(Duration::from_secs(1), link.downlink.recv()).await
        {
            if message == Downlink::Replaced {
                replaced += 1;
            }
        }
    }
    assert_eq!(replaced, 1, "both connections were told they were replaced");
}

/// A driver that falls more than 256 events behind (its provider reads slowly) can miss the
/// ProviderChanged that replaced it; `Missed` only triggers a claim, so the old connection is
/// never told and never closed.
#[tokio::test(start_paused = true)]
async fn a_lagging_connection_still_learns_it_was_replaced() {
    let relay = relay(RelayConfig {
        max_pending_per_session: 10_000,
        ..RelayConfig::default()
    });
    let session = session_with_tools(&relay).await;
    let code = session.code.as_str();
    let mut first = attach(&relay, &session).await; // reads nothing for a while
    for _ in 0..200 {
        relay.submit(code, echo("x")).await.unwrap();
        tokio::task::yield_now().await;
    }
    assert_eq!(
        first.downlink.len(),
        128,
        "the first connection's driver is blocked sending"
    );
    let mut second = attach(&relay, &session).await;
    for _ in 0..300 {
        relay.submit(code, echo("y")).await.unwrap();
        while second.downlink.try_recv().is_ok() {}
        tokio::task::yield_now().await;
    }
    let mut replaced = false;
    while let Ok(Some(message)) =
        tokio::time::timeout(Duration::from_secs(5), first.downlink.recv()).await
    {
        if message == Downlink::Replaced {
            replaced = true;
        }
    }
    assert!(
        replaced,
        "the first connection was never told it was replaced"
    );
}

/// An answer that arrives after the deadline is accepted as `completed` when nobody happened
/// to look at the call before it, and refused (expired) when someone did.
#[tokio::test(start_paused = true)]
async fn an_answer_after_the_deadline_does_not_complete_the_call() {
    let relay = relay(RelayConfig::default());
    let session = session_with_tools(&relay).await;
    let code = session.code.as_str();
    let call = relay.submit(code, echo("slow")).await.unwrap();
    let polled = relay
        .poll(code, Some(&session.provider_token), None, &[])
        .await
        .unwrap()
        .requests;
    assert_eq!(polled.len(), 1);
    advance(Duration::from_secs(61)).await;
    let late = relay
        .post_response(
            code,
            Some(&session.provider_token),
            answer(&call.request_id, json!("late")),
        )
        .await
        .unwrap();
    assert_eq!(
        late.status,
        RequestStatus::Expired,
        "accepted={}",
        late.accepted
    );
}

#[tokio::test(start_paused = true)]
async fn a_session_has_an_mcp_handle_that_ends_with_it() {
    let relay = relay(RelayConfig::default());
    let session = relay.create_session().await.unwrap();
    assert_eq!(session.mcp_handle.len(), 32, "128 random bits");
    let other = relay.create_session().await.unwrap();
    assert_ne!(other.mcp_handle, session.mcp_handle);
    assert_eq!(
        relay.resolve_handle(&session.mcp_handle).await.unwrap(),
        session.code
    );
    assert_eq!(
        relay
            .resolve_handle("not-a-handle")
            .await
            .unwrap_err()
            .name(),
        "unknown_handle"
    );

    relay
        .end_session(session.code.as_str(), Some(&session.provider_token))
        .await
        .unwrap();
    assert_eq!(
        relay
            .resolve_handle(&session.mcp_handle)
            .await
            .unwrap_err()
            .name(),
        "unknown_handle"
    );
    advance(Duration::from_secs(601)).await;
    assert_eq!(
        relay
            .resolve_handle(&other.mcp_handle)
            .await
            .unwrap_err()
            .name(),
        "unknown_handle",
        "expired"
    );
}

/// Claim checks live an hour, only in their scope, and a scope keeps its newest 200.
#[tokio::test(start_paused = true)]
async fn claim_checks_expire_stay_in_their_scope_and_are_bounded() {
    use toolrelay_relay::builtin::Tickets;
    let clock = Clock::new();
    let tickets = Tickets::new(
        MemoryStore::new(clock.clone(), Duration::from_secs(3600)),
        clock,
    );
    let id = tickets.put("alice", "prob", json!({"n": 0})).await.unwrap();
    assert!(id.starts_with("prob_") && id.len() == 5 + 32, "{id}");
    assert_eq!(
        *tickets.get("alice", &id).await.unwrap().unwrap(),
        json!({"n": 0})
    );
    assert_eq!(tickets.get("mallory", &id).await.unwrap(), None);
    assert_ne!(
        tickets.put("alice", "prob", json!({})).await.unwrap(),
        id,
        "ids are random"
    );

    advance(Duration::from_secs(3599)).await;
    assert!(tickets.get("alice", &id).await.unwrap().is_some());
    advance(Duration::from_secs(2)).await;
    assert_eq!(
        tickets.get("alice", &id).await.unwrap(),
        None,
        "gone after an hour"
    );

    let mut ids = Vec::new();
    for n in 0..201 {
        ids.push(tickets.put("busy", "sol", json!({"n": n})).await.unwrap());
        advance(Duration::from_millis(10)).await;
    }
    assert_eq!(
        tickets.get("busy", &ids[0]).await.unwrap(),
        None,
        "the oldest made room"
    );
    for id in &ids[1..] {
        assert!(tickets.get("busy", id).await.unwrap().is_some());
    }
}

/// Text that does not compress (a xorshift stream as hex), so its size is what it costs.
fn incompressible(length: usize, seed: u64) -> String {
    let mut state = seed | 1;
    (0..length)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            char::from_digit((state % 16) as u32, 16).unwrap_or('0')
        })
        .collect()
}

/// Scopes are the callers' to choose: all of them together stay within the byte budget.
#[tokio::test(start_paused = true)]
async fn claim_checks_share_a_byte_budget() {
    use toolrelay_relay::builtin::Tickets;
    let clock = Clock::new();
    // Room for three of the four (level-1 DEFLATE does not shrink random hex digits).
    let store = MemoryStore::with_ticket_budget(clock.clone(), Duration::from_secs(3600), 16_000);
    let tickets = Tickets::new(store, clock);
    let mut ids = Vec::new();
    let mut values = Vec::new();
    for (n, scope) in ["a", "b", "c", "d"].into_iter().enumerate() {
        let big = json!(incompressible(5_000, n as u64 + 7));
        ids.push(tickets.put(scope, "prob", big.clone()).await.unwrap());
        values.push(big);
        advance(Duration::from_secs(1)).await;
    }
    assert_eq!(
        tickets.get("a", &ids[0]).await.unwrap(),
        None,
        "the oldest made room"
    );
    for ((scope, id), value) in ["b", "c", "d"].iter().zip(&ids[1..]).zip(&values[1..]) {
        assert_eq!(*tickets.get(scope, id).await.unwrap().unwrap(), *value);
    }
}

/// What the budget counts is what the store really keeps: a ticket's compressed JSON (plus
/// its keys and a small overhead), not its JSON text. A stream of big models through many
/// scopes stays within the budget, and far more of them stay than their JSON would allow.
#[tokio::test(start_paused = true)]
async fn big_claim_checks_are_kept_compressed_and_counted_so() {
    use toolrelay_relay::builtin::Tickets;
    const BUDGET: usize = 128 * 1024;
    let clock = Clock::new();
    let store = MemoryStore::with_ticket_budget(clock.clone(), Duration::from_secs(3600), BUDGET);
    let tickets = Tickets::new(Arc::clone(&store) as _, clock);
    // PuLP's dict of 3,000 binaries: about 260 KB of JSON, 14 KB compressed.
    let model = |n: usize| {
        let variables: Vec<Value> = (0..3_000)
            .map(|i| json!({"name": format!("x{n}_{i}"), "cat": "Integer", "lowBound": 0, "upBound": 1, "varValue": null, "dj": null}))
            .collect();
        json!({"kind": "problem", "dict": {"variables": variables}})
    };
    let json_bytes = serde_json::to_string(&model(0)).unwrap().len();
    let mut ids = Vec::new();
    for n in 0..20 {
        let scope = format!("caller-{n}");
        let id = tickets.put(&scope, "prob", model(n)).await.unwrap();
        ids.push((scope, id));
        let counted = store.ticket_bytes();
        assert!(
            counted <= BUDGET,
            "{counted} bytes counted, over the budget"
        );
        if n == 0 {
            assert!(
                counted > 1000 && counted < json_bytes / 8,
                "one model of {json_bytes} bytes of JSON counts {counted} bytes: not its compressed size"
            );
        }
        advance(Duration::from_secs(1)).await;
    }
    let mut kept = 0;
    for (scope, id) in &ids {
        if tickets.get(scope, id).await.unwrap().is_some() {
            kept += 1;
        }
    }
    assert!(
        kept * json_bytes > 5 * BUDGET && kept < ids.len(),
        "{kept} of {} models of {json_bytes} bytes kept in a budget of {BUDGET}",
        ids.len()
    );
    let (scope, id) = &ids[0];
    assert_eq!(
        tickets.get(scope, id).await.unwrap(),
        None,
        "the oldest made room"
    );
    let (scope, id) = &ids[19];
    assert_eq!(*tickets.get(scope, id).await.unwrap().unwrap(), model(19));

    // Incompressible tickets count their full size and stay within the budget too.
    for n in 0..8 {
        let noise = json!(incompressible(30_000, n));
        tickets.put("noise", "sol", noise).await.unwrap();
        let counted = store.ticket_bytes();
        assert!(
            counted <= BUDGET,
            "{counted} bytes counted, over the budget"
        );
    }
    assert!(
        store.ticket_bytes() > 3 * 30_000,
        "incompressible tickets were under-counted"
    );
}

/// Each finished call is counted once, under the transport that answered it (an SSE or a
/// polling tab answers by POST, a built-in tool by itself); a call nobody answers counts as
/// expired; a connection counts while it lasts, and a session that expires is counted too.
#[tokio::test(start_paused = true)]
async fn finished_calls_are_counted_once_under_what_answered_them() {
    let relay = relay(RelayConfig::default());
    let session = session_with_tools(&relay).await;
    let (code, token) = (session.code.as_str(), Some(session.provider_token.as_str()));
    let calls = |status: &str, transport: &str| {
        format!("toolrelay_calls_total{{status=\"{status}\",transport=\"{transport}\"}}")
    };
    let sse_connections = "toolrelay_providers_connected{transport=\"sse\"}";

    let mut link = relay.attach(code, token, Transport::Sse).await.unwrap();
    link.spawn_driver();
    assert!(matches!(next(&mut link).await, Downlink::Welcome { .. }));
    assert_eq!(metric(&relay, sse_connections).await, 1.0);
    relay.submit(code, echo("over sse")).await.unwrap();
    let id = request_id(next(&mut link).await);
    relay
        .post_response(code, token, answer(&id, json!("sse")))
        .await
        .unwrap();
    let again = relay
        .post_response(code, token, answer(&id, json!("twice")))
        .await
        .unwrap();
    assert!(
        !again.accepted,
        "the first answer wins, and is the one counted"
    );
    drop(link);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while metric(&relay, sse_connections).await != 0.0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the connection still counts"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    relay.submit(code, echo("polled")).await.unwrap();
    let polled = relay.poll(code, token, None, &[]).await.unwrap().requests;
    relay
        .post_response(code, token, answer(&polled[0].request_id, json!("polled")))
        .await
        .unwrap();

    let shouted = relay
        .call(
            code,
            CallInput {
                function_name: "shout".into(),
                args: json!({"text": "A -> B"}),
                ..CallInput::default()
            },
            None,
        )
        .await
        .unwrap();
    assert_eq!(shouted.status, RequestStatus::Completed);

    relay.submit(code, echo("nobody takes it")).await.unwrap();
    advance(Duration::from_secs(61)).await;
    relay.session_status(code).await.unwrap();

    assert_eq!(metric(&relay, &calls("completed", "sse")).await, 1.0);
    assert_eq!(metric(&relay, &calls("completed", "polling")).await, 1.0);
    assert_eq!(metric(&relay, &calls("completed", "builtin")).await, 1.0);
    assert_eq!(metric(&relay, &calls("expired", "none")).await, 1.0);
    assert_eq!(metric(&relay, &calls("completed", "websocket")).await, 0.0);
    assert_eq!(metric(&relay, "toolrelay_queue_depth").await, 0.0);
    assert_eq!(metric(&relay, "toolrelay_sessions_active").await, 1.0);

    advance(Duration::from_secs(601)).await;
    assert!(relay.session_status(code).await.is_err());
    assert_eq!(
        metric(&relay, "toolrelay_sessions_expired_total").await,
        1.0
    );
    assert_eq!(metric(&relay, "toolrelay_sessions_active").await, 0.0);
    assert_eq!(
        metric(&relay, "toolrelay_sessions_created_total").await,
        1.0
    );
}

/// Calls handed to a tab at enqueue (`SessionEvent::CallHanded`) while its driver is behind
/// on its events (it gets `Missed` instead of some of them) must still reach the tab: on
/// `Missed` the driver sends again what is delivered to its connection and unanswered. With
/// the hand-over alone, 8 of these 30 arrived (the event buffer's 8 slots).
#[tokio::test(start_paused = true)]
async fn calls_handed_over_in_a_burst_all_reach_the_tab() {
    let relay = relay(RelayConfig {
        max_pending_per_session: 10_000,
        ..RelayConfig::default()
    });
    let session = session_with_tools(&relay).await;
    let code = session.code.as_str();
    let mut tab = attach(&relay, &session).await;
    // Queued back to back: the driver runs only once they all are.
    for _ in 0..30 {
        relay.submit(code, echo("x")).await.unwrap();
    }
    let mut received = std::collections::HashSet::new();
    while received.len() < 30 {
        match tokio::time::timeout(Duration::from_secs(10), tab.downlink.recv()).await {
            Ok(Some(Downlink::ToolRequest { request, .. })) => {
                received.insert(request.into_request().request_id);
            }
            Ok(Some(_)) => {}
            Ok(None) | Err(_) => break,
        }
    }
    assert_eq!(
        received.len(),
        30,
        "calls handed over that never reached the tab"
    );
}

/// A cancelled call that was only queued is never delivered; its status and its answer say
/// `cancelled`; cancelling again changes nothing.
#[tokio::test(start_paused = true)]
async fn a_cancelled_queued_call_is_never_delivered() {
    let relay = relay(RelayConfig::default());
    let session = session_with_tools(&relay).await;
    let code = session.code.as_str();
    let queued = relay.submit(code, echo("never")).await.unwrap();

    let view = relay.cancel(code, &queued.request_id).await.unwrap();
    assert_eq!(view.status, RequestStatus::Cancelled);
    let ended = view.response.unwrap();
    assert!(!ended.success);
    assert_eq!(ended.error.unwrap().code, "cancelled");
    let again = relay.cancel(code, &queued.request_id).await.unwrap();
    assert_eq!(again.status, RequestStatus::Cancelled, "idempotent");

    // A tab attaching now is given the next call, not the cancelled one.
    let mut link = attach(&relay, &session).await;
    let next_call = relay.submit(code, echo("next")).await.unwrap();
    assert_eq!(request_id(next(&mut link).await), next_call.request_id);
    relay
        .post_response(
            code,
            Some(&session.provider_token),
            answer(&next_call.request_id, json!("next")),
        )
        .await
        .unwrap();
    // Nor does a poller taking over: nothing is left to hand out.
    let polled = relay
        .poll(code, Some(&session.provider_token), None, &[])
        .await
        .unwrap();
    assert!(polled.requests.is_empty(), "{polled:?}");
    assert_eq!(
        metric(
            &relay,
            "toolrelay_calls_total{status=\"cancelled\",transport=\"none\"}"
        )
        .await,
        1.0
    );
}

/// A delivered call's tab is told to stop; its late answer is refused with the call's status;
/// a call with an answer keeps it when cancelled.
#[tokio::test(start_paused = true)]
async fn a_cancelled_delivered_call_tells_its_tab_and_refuses_a_late_answer() {
    let relay = relay(RelayConfig::default());
    let session = session_with_tools(&relay).await;
    let code = session.code.as_str();
    let token = Some(session.provider_token.as_str());
    let mut link = attach(&relay, &session).await;
    let delivered = relay.submit(code, echo("stop me")).await.unwrap();
    assert_eq!(request_id(next(&mut link).await), delivered.request_id);

    let view = relay.cancel(code, &delivered.request_id).await.unwrap();
    assert_eq!(view.status, RequestStatus::Cancelled);
    assert_eq!(
        next(&mut link).await,
        Downlink::Cancel {
            request_id: delivered.request_id.clone()
        }
    );
    let late = relay
        .post_response(code, token, answer(&delivered.request_id, json!("late")))
        .await
        .unwrap();
    assert!(!late.accepted);
    assert_eq!(late.status, RequestStatus::Cancelled);

    let answered = relay.submit(code, echo("done")).await.unwrap();
    assert_eq!(request_id(next(&mut link).await), answered.request_id);
    relay
        .post_response(code, token, answer(&answered.request_id, json!("done")))
        .await
        .unwrap();
    let kept = relay.cancel(code, &answered.request_id).await.unwrap();
    assert_eq!(kept.status, RequestStatus::Completed, "it keeps its answer");
    assert!(matches!(
        relay.cancel(code, "no-such-call").await,
        Err(RelayError::RequestNotFound { .. })
    ));
}

/// A polling tab names the calls it runs; a poll after one is cancelled says so, once the call
/// was handed to polling.
#[tokio::test(start_paused = true)]
async fn a_polling_tab_learns_of_a_cancel_by_naming_what_it_runs() {
    let relay = relay(RelayConfig::default());
    let session = session_with_tools(&relay).await;
    let code = session.code.as_str();
    let token = Some(session.provider_token.as_str());
    let call = relay.submit(code, echo("polled")).await.unwrap();
    let polled = relay.poll(code, token, None, &[]).await.unwrap();
    assert_eq!(polled.requests.len(), 1);
    let running = vec![call.request_id.clone(), "not-mine".to_owned()];
    let nothing_yet = relay.poll(code, token, None, &running).await.unwrap();
    assert!(nothing_yet.cancelled.is_empty());

    relay.cancel(code, &call.request_id).await.unwrap();
    let told = relay.poll(code, token, None, &running).await.unwrap();
    assert_eq!(told.cancelled, vec![call.request_id]);
    assert!(told.requests.is_empty());
}
