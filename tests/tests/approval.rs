//! A guessed code gives nothing (issue 39): in a session whose tab approves callers, the first
//! use of its code by a caller the person has not allowed is held and shown in the tab until
//! the person answers — over the tab's WebSocket here, with a REST caller (known by its address
//! alone: everything comes from 127.0.0.1) and MCP clients (each known by its MCP session).
//!
//! On the in-memory store, and on Redis with `TOOLRELAY_TEST_STORE=redis` (`scripts/test.sh`).
#![allow(clippy::unwrap_used)] // a test that cannot unwrap should fail loudly

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};
use toolrelay_relay::RelayConfig;
use toolrelay_tests::mcp::{call, connect};
use toolrelay_tests::system::{Answer, System, send};
use toolrelay_tests::{PATIENCE, WsTab, demo_tools, wait_until};

/// A session whose tab (a raw WebSocket) registers the demo tools and approves callers: its
/// code and tab. The tab has read the `callers` frame that registering sent.
async fn approving_tab(system: &System) -> (String, String, WsTab) {
    let (code, token) = system.create_session().await;
    let mut tab = WsTab::attach_url(&system.ws_url(&code, &token)).await;
    tab.send(json!({"type": "register", "tools": demo_tools(), "approves": true}))
        .await;
    let mut registered = false;
    let mut callers = false;
    while !(registered && callers) {
        let frame = tab.recv().await;
        match frame["type"].as_str() {
            Some("registered") => registered = true,
            Some("callers") => callers = true,
            _ => panic!("unexpected {frame}"),
        }
    }
    (code, token, tab)
}

/// `POST …/call` of `echo` with `request_id`, waiting up to 40 s, in a task of its own.
fn call_over_rest(
    system: &System,
    session: &str,
    request_id: &str,
) -> tokio::task::JoinHandle<Answer> {
    let request = system
        .request(
            reqwest::Method::POST,
            &format!("/api/sessions/{session}/call"),
        )
        .json(&json!({"functionName": "echo", "args": {"text": "hi"},
            "requestId": request_id, "timeoutMs": 40_000}));
    tokio::spawn(send(request))
}

/// The next frame of `kind`, skipping what the tab is told about approvals meanwhile (the
/// callers list, a question closed); a call is never skipped.
async fn next_of(tab: &mut WsTab, kind: &str) -> Value {
    loop {
        let frame = tab.recv().await;
        if frame["type"] == kind {
            return frame;
        }
        assert!(
            frame["type"] == "callers" || frame["type"] == "approval-closed",
            "waiting for {kind}: {frame}"
        );
    }
}

/// The next frames of each of `kinds`, in whatever order they come (the person's Allow sends
/// the call and closes the question at once), skipping `callers` updates.
async fn next_each(tab: &mut WsTab, kinds: &[&str]) -> Vec<Value> {
    let mut found: Vec<Option<Value>> = vec![None; kinds.len()];
    while found.iter().any(Option::is_none) {
        let frame = tab.recv().await;
        match kinds.iter().position(|kind| frame["type"] == *kind) {
            Some(at) if found[at].is_none() => found[at] = Some(frame),
            _ => assert_eq!(frame["type"], "callers", "waiting for {kinds:?}: {frame}"),
        }
    }
    found.into_iter().flatten().collect()
}

/// The status of call `id` as `GET …/requests/{id}` reads it.
async fn status_of(system: &System, code: &str, id: &str) -> String {
    let answer = system
        .get(&format!("/api/sessions/{code}/requests/{id}"))
        .await;
    assert_eq!(answer.status, StatusCode::OK, "{answer:?}");
    answer.body["status"].as_str().unwrap().to_owned()
}

/// The error code of a tool result (MCP) that failed.
fn error_code(result: &rmcp::model::CallToolResult) -> String {
    assert_eq!(result.is_error, Some(true), "{result:?}");
    result
        .structured_content
        .as_ref()
        .and_then(|content| content["error"]["code"].as_str())
        .unwrap_or_default()
        .to_owned()
}

#[tokio::test]
async fn a_new_caller_waits_for_the_person_and_runs_once_allowed() {
    let system = System::start().await;
    let (code, _, mut tab) = approving_tab(&system).await;

    let held = call_over_rest(&system, &code, "first");
    let asked = next_of(&mut tab, "approval-request").await;
    assert_eq!(asked["via"], "the HTTP API", "{asked}");
    assert_eq!(asked["address"], "127.0.0.1", "{asked}");
    // Known by its address alone: the person is told that allowing it allows everyone there.
    assert_eq!(asked["sharedAddress"], true, "{asked}");
    let caller = asked["callerId"].as_str().unwrap().to_owned();
    assert_eq!(
        status_of(&system, &code, "first").await,
        "awaiting_approval"
    );

    tab.send(json!({"type": "approval", "callerId": caller, "allow": true}))
        .await;
    let frames = next_each(&mut tab, &["approval-closed", "tool-request"]).await;
    assert_eq!(frames[0]["outcome"], "allowed", "{frames:?}");
    assert_eq!(frames[1]["requestId"], "first");
    tab.answer("first", json!({"echoed": "hi"})).await;
    let answered = held.await.unwrap();
    assert_eq!(answered.status, StatusCode::OK, "{answered:?}");
    assert_eq!(answered.body["success"], true, "{answered:?}");

    // Allowed once: its next call runs without a question, and the tab lists it.
    let again = call_over_rest(&system, &code, "second");
    let call = next_of(&mut tab, "tool-request").await;
    assert_eq!(call["requestId"], "second");
    tab.answer("second", json!({"echoed": "hi"})).await;
    assert_eq!(again.await.unwrap().body["success"], true);
    system.stop().await;
}

#[tokio::test]
async fn a_denied_caller_gets_approval_declined_and_the_tool_never_runs() {
    let system = System::start().await;
    let (code, _, mut tab) = approving_tab(&system).await;
    let held = call_over_rest(&system, &code, "denied");
    let asked = next_of(&mut tab, "approval-request").await;
    tab.send(json!({"type": "approval", "callerId": asked["callerId"], "allow": false}))
        .await;
    let closed = next_of(&mut tab, "approval-closed").await;
    assert_eq!(closed["outcome"], "declined", "{closed}");
    let answered = held.await.unwrap();
    assert_eq!(answered.status, StatusCode::OK, "{answered:?}");
    assert_eq!(answered.body["success"], false, "{answered:?}");
    assert_eq!(
        answered.body["error"]["code"], "approval_declined",
        "{answered:?}"
    );
    assert_eq!(status_of(&system, &code, "denied").await, "failed");

    // Three denials, and the session takes no new callers: the fourth is refused at once,
    // and the tab hears so (it offers a new code).
    for n in 0..2 {
        let held = call_over_rest(&system, &code, &format!("denied-{n}"));
        let asked = next_of(&mut tab, "approval-request").await;
        tab.send(json!({"type": "approval", "callerId": asked["callerId"], "allow": false}))
            .await;
        let answered = held.await.unwrap();
        assert_eq!(
            answered.body["error"]["code"], "approval_declined",
            "{answered:?}"
        );
    }
    let refused = call_over_rest(&system, &code, "refused").await.unwrap();
    refused.assert_refused(StatusCode::FORBIDDEN, "approval_refused");
    let callers = loop {
        let frame = tab.recv().await;
        if frame["type"] == "callers" && frame["refused"] == true {
            break frame;
        }
        assert_eq!(frame["type"], "approval-closed", "{frame}");
    };
    assert_eq!(callers["allowed"], json!([]));
    system.stop().await;
}

#[tokio::test]
async fn a_question_nobody_answers_lapses_and_is_asked_again_after_a_reconnect() {
    let relay = RelayConfig {
        approval_timeout: Duration::from_secs(2),
        ..RelayConfig::default()
    };
    let system = System::with(relay, |_| {}).await;
    let (code, token, mut tab) = approving_tab(&system).await;

    // The tab goes away and comes back (a reload) while a caller waits: it is asked again.
    let held = call_over_rest(&system, &code, "lapses");
    let asked = next_of(&mut tab, "approval-request").await;
    tab.close().await;
    let mut tab = WsTab::attach_url(&system.ws_url(&code, &token)).await;
    let again = next_of(&mut tab, "approval-request").await;
    assert_eq!(again["callerId"], asked["callerId"]);

    // Nobody answers: the call fails with approval_timeout, and the question closes.
    let answered = held.await.unwrap();
    assert_eq!(
        answered.body["error"]["code"], "approval_timeout",
        "{answered:?}"
    );
    let closed = next_of(&mut tab, "approval-closed").await;
    assert_eq!(closed["outcome"], "timeout", "{closed}");
    system.stop().await;
}

#[tokio::test]
async fn the_tabs_own_handle_needs_no_approval_and_a_closed_tab_is_said_at_once() {
    let system = System::start().await;
    let created = system.post("/api/sessions", json!({})).await;
    let code = created.body["code"].as_str().unwrap().to_owned();
    let token = created.body["providerToken"].as_str().unwrap().to_owned();
    let connector = created.body["connectorUrl"].as_str().unwrap().to_owned();
    let handle = connector.rsplit('/').next().unwrap().to_owned();
    let mut tab = WsTab::attach_url(&system.ws_url(&code, &token)).await;
    tab.send(json!({"type": "register", "tools": demo_tools(), "approves": true}))
        .await;
    next_of(&mut tab, "registered").await;

    // The connector handle is in the tab's copied prompt: its holder was given it.
    let direct = call_over_rest(&system, &handle, "by-handle");
    let call = next_of(&mut tab, "tool-request").await;
    assert_eq!(call["requestId"], "by-handle");
    tab.answer("by-handle", json!({"echoed": "hi"})).await;
    assert_eq!(direct.await.unwrap().body["success"], true);

    // With the tab closed, a new caller cannot be asked about: it hears so at once.
    tab.close().await;
    // (Read by the handle: reading the session by its code is a first use too.)
    wait_until(PATIENCE, async || {
        let answer = system.get(&format!("/api/sessions/{handle}")).await;
        if answer.body["providerConnected"] == false {
            Ok(())
        } else {
            Err(format!("the tab's departure is not recorded: {answer:?}"))
        }
    })
    .await;
    let refused = call_over_rest(&system, &code, "no-tab").await.unwrap();
    refused.assert_refused(StatusCode::CONFLICT, "tab_not_connected");
    system.stop().await;
}

#[tokio::test]
async fn connect_session_waits_for_allow_and_gives_a_handle_that_disconnect_revokes() {
    let system = System::start().await;
    let (code, _, mut tab) = approving_tab(&system).await;
    let client = connect(&system.url("/mcp")).await;

    let connecting = {
        let peer = client.peer().clone();
        let code = code.clone();
        tokio::spawn(async move { call(&peer, "connect_session", json!({"code": code})).await })
    };
    let asked = next_of(&mut tab, "approval-request").await;
    assert_eq!(asked["via"], "MCP", "{asked}");
    assert_eq!(asked["sharedAddress"], false, "{asked}");
    tab.send(json!({"type": "approval", "callerId": asked["callerId"], "allow": true}))
        .await;
    let connected = connecting.await.unwrap();
    next_of(&mut tab, "approval-closed").await;
    assert_ne!(connected.is_error, Some(true), "{connected:?}");
    let handle = connected.structured_content.as_ref().unwrap()["handle"]
        .as_str()
        .unwrap()
        .to_owned();
    let listed = loop {
        let frame = tab.recv().await;
        if frame["type"] == "callers" && frame["allowed"].as_array().is_some_and(|a| !a.is_empty())
        {
            break frame;
        }
    };
    assert_eq!(listed["allowed"][0]["callerId"], asked["callerId"]);

    // Its handle works wherever a code does…
    let peer = client.peer().clone();
    let calling = {
        let handle = handle.clone();
        tokio::spawn(async move {
            call(
                &peer,
                "call_session_tool",
                json!({"session": handle, "name": "echo", "arguments": {"text": "hi"}}),
            )
            .await
        })
    };
    let request = next_of(&mut tab, "tool-request").await;
    tab.answer(
        request["requestId"].as_str().unwrap(),
        json!({"echoed": "hi"}),
    )
    .await;
    let answered = calling.await.unwrap();
    assert_ne!(answered.is_error, Some(true), "{answered:?}");

    // …until the person disconnects the caller.
    tab.send(json!({"type": "disconnect-caller", "callerId": asked["callerId"]}))
        .await;
    // The tab hears the caller is gone once the relay has made it so (a call before that
    // would still be the caller's).
    loop {
        let frame = next_of(&mut tab, "callers").await;
        if frame["allowed"].as_array().is_some_and(Vec::is_empty) {
            break;
        }
    }
    let revoked = wait_until(PATIENCE, async || {
        let arguments = json!({"session": handle, "name": "echo", "arguments": {"text": "hi"}});
        let result = call(client.peer(), "call_session_tool", arguments).await;
        if result.is_error == Some(true) {
            Ok(error_code(&result))
        } else {
            Err(format!("the handle still works: {result:?}"))
        }
    })
    .await;
    assert_eq!(revoked, "caller_disconnected");

    // A second MCP conversation is another caller: it is asked about, and a Deny refuses it.
    let other = connect(&system.url("/mcp")).await;
    let peer = other.peer().clone();
    let second = {
        let code = code.clone();
        tokio::spawn(async move { call(&peer, "connect_session", json!({"code": code})).await })
    };
    let asked_again = next_of(&mut tab, "approval-request").await;
    assert_ne!(asked_again["callerId"], asked["callerId"]);
    tab.send(json!({"type": "approval", "callerId": asked_again["callerId"], "allow": false}))
        .await;
    let refused = second.await.unwrap();
    assert_eq!(error_code(&refused), "approval_declined");
    client.cancel().await.unwrap();
    other.cancel().await.unwrap();
    system.stop().await;
}

/// `PUT …/manifest` of the demo tools, approving callers.
async fn register_approving(system: &System, code: &str, token: &str) {
    let answer = send(
        system
            .request(
                reqwest::Method::PUT,
                &format!("/api/sessions/{code}/manifest"),
            )
            .bearer_auth(token)
            .json(&json!({"tools": demo_tools(), "approves": true})),
    )
    .await;
    assert_eq!(answer.status, StatusCode::OK, "{answer:?}");
}

/// The person's answer over HTTP, as an SSE or polling tab sends it.
async fn answer_over_http(
    system: &System,
    code: &str,
    token: &str,
    caller: &str,
    allow: bool,
) -> Answer {
    send(
        system
            .request(
                reqwest::Method::POST,
                &format!("/api/sessions/{code}/approvals/{caller}"),
            )
            .bearer_auth(token)
            .json(&json!({"allow": allow})),
    )
    .await
}

#[tokio::test]
async fn a_polling_tab_and_an_sse_tab_answer_the_question_over_http() {
    let system = System::start().await;

    // Polling: the question is an item of every poll until it closes.
    let (code, token) = system.create_session().await;
    register_approving(&system, &code, &token).await;
    let poll = || {
        send(
            system
                .request(
                    reqwest::Method::GET,
                    &format!("/api/sessions/{code}/request"),
                )
                .bearer_auth(&token),
        )
    };
    let first = poll().await;
    assert_eq!(
        first.body,
        json!([{"type": "callers", "allowed": [], "refused": false}])
    );
    let held = call_over_rest(&system, &code, "polled");
    let asked = wait_until(PATIENCE, async || {
        let items = poll().await.body;
        items
            .as_array()
            .and_then(|items| items.iter().find(|item| item["type"] == "approval-request"))
            .cloned()
            .ok_or_else(|| format!("no question yet: {items}"))
    })
    .await;
    let caller = asked["callerId"].as_str().unwrap();
    let read = send(
        system
            .request(
                reqwest::Method::GET,
                &format!("/api/sessions/{code}/approvals"),
            )
            .bearer_auth(&token),
    )
    .await;
    assert_eq!(read.body["pending"]["callerId"], caller, "{read:?}");
    // Only the tab answers: without its token the answer is refused.
    let forged = send(
        system
            .request(
                reqwest::Method::POST,
                &format!("/api/sessions/{code}/approvals/{caller}"),
            )
            .json(&json!({"allow": true})),
    )
    .await;
    assert_eq!(forged.status, StatusCode::UNAUTHORIZED, "{forged:?}");
    let allowed = answer_over_http(&system, &code, &token, caller, true).await;
    assert_eq!(allowed.body["outcome"], "allowed", "{allowed:?}");
    let again = answer_over_http(&system, &code, &token, caller, false).await;
    again.assert_refused(StatusCode::CONFLICT, "approval_not_pending");
    let call = wait_until(PATIENCE, async || {
        let items = poll().await.body;
        items
            .as_array()
            .and_then(|items| items.iter().find(|item| item["type"] == "tool-request"))
            .cloned()
            .ok_or_else(|| format!("no call yet: {items}"))
    })
    .await;
    assert_eq!(call["requestId"], "polled");
    let posted = send(
        system
            .request(
                reqwest::Method::POST,
                &format!("/api/sessions/{code}/response"),
            )
            .bearer_auth(&token)
            .json(&json!({"requestId": "polled", "success": true, "result": {"echoed": "hi"}})),
    )
    .await;
    assert_eq!(posted.status, StatusCode::OK, "{posted:?}");
    assert_eq!(held.await.unwrap().body["success"], true);
    let read = send(
        system
            .request(
                reqwest::Method::GET,
                &format!("/api/sessions/{code}/approvals"),
            )
            .bearer_auth(&token),
    )
    .await;
    assert_eq!(read.body["pending"], Value::Null, "{read:?}");
    assert_eq!(read.body["allowed"][0]["callerId"], caller, "{read:?}");

    // SSE: the question is an event; the tab denies it over HTTP.
    let (code, token) = system.create_session().await;
    let mut tab = toolrelay_tests::system::SseTab::open(
        &system,
        &format!("/api/sessions/{code}/stream?token={token}"),
        None,
    )
    .await;
    register_approving(&system, &code, &token).await;
    let held = call_over_rest(&system, &code, "streamed");
    let asked = loop {
        let event = tab.next().await;
        if event.kind == "approval-request" {
            break event.data;
        }
        assert_eq!(event.kind, "callers", "{event:?}");
    };
    let denied = answer_over_http(
        &system,
        &code,
        &token,
        asked["callerId"].as_str().unwrap(),
        false,
    )
    .await;
    assert_eq!(denied.body["outcome"], "declined", "{denied:?}");
    let closed = loop {
        let event = tab.next().await;
        if event.kind == "approval-closed" {
            break event.data;
        }
        assert_eq!(event.kind, "callers", "{event:?}");
    };
    assert_eq!(closed["outcome"], "declined");
    assert_eq!(
        held.await.unwrap().body["error"]["code"],
        "approval_declined"
    );
    system.stop().await;
}

#[tokio::test]
async fn reading_the_tools_or_the_answers_is_a_first_use_too() {
    let system = System::start().await;
    let (code, _, mut tab) = approving_tab(&system).await;

    // GPT Actions read the tools first: that read waits for the person, as a call would.
    let reading = tokio::spawn(system.get(&format!("/api/sessions/{code}/metadata")));
    let asked = next_of(&mut tab, "approval-request").await;
    tab.send(json!({"type": "approval", "callerId": asked["callerId"], "allow": true}))
        .await;
    let read = reading.await.unwrap();
    assert_eq!(read.status, StatusCode::OK, "{read:?}");
    assert_eq!(read.body["tools"][0]["id"], "demo", "{read:?}");

    // An MCP conversation the person denies reads nothing: not the tools, not the answers.
    let client = connect(&system.url("/mcp")).await;
    let peer = client.peer().clone();
    let listing = {
        let code = code.clone();
        tokio::spawn(
            async move { call(&peer, "list_session_tools", json!({"session": code})).await },
        )
    };
    let asked = next_of(&mut tab, "approval-request").await;
    assert_eq!(asked["via"], "MCP", "{asked}");
    tab.send(json!({"type": "approval", "callerId": asked["callerId"], "allow": false}))
        .await;
    assert_eq!(error_code(&listing.await.unwrap()), "approval_declined");
    client.cancel().await.unwrap();
    system.stop().await;
}

#[tokio::test]
async fn a_grpc_provider_that_approves_callers_is_asked_on_its_stream() {
    use toolrelay::proto::v1::{ApprovalAnswer, provider_message, relay_message};
    let system = System::start().await;
    let (code, token) = system.create_session().await;
    let mut provider = toolrelay_tests::GrpcProvider::connect_approving(
        system.grpc,
        &code,
        &token,
        &demo_tools(),
        true,
    )
    .await
    .unwrap();
    let held = call_over_rest(&system, &code, "over-grpc");
    let asked = loop {
        match provider.next().await {
            Some(relay_message::Kind::ApprovalRequest(card)) => break card,
            Some(relay_message::Kind::Callers(_)) => {}
            other => panic!("expected a question, got {other:?}"),
        }
    };
    assert_eq!(asked.address, "127.0.0.1");
    provider
        .send(provider_message::Kind::Approval(ApprovalAnswer {
            caller_id: asked.caller_id.clone(),
            allow: true,
        }))
        .await;
    let call = loop {
        match provider.next().await {
            Some(relay_message::Kind::ToolRequest(call)) => break call,
            Some(relay_message::Kind::ApprovalClosed(closed)) => {
                assert_eq!(closed.outcome, "allowed");
            }
            Some(relay_message::Kind::Callers(_)) => {}
            other => panic!("expected the call, got {other:?}"),
        }
    };
    assert_eq!(call.request_id, "over-grpc");
    provider.answer("over-grpc", &json!({"echoed": "hi"})).await;
    assert_eq!(held.await.unwrap().body["success"], true);
    system.stop().await;
}

#[tokio::test]
async fn a_request_id_is_its_callers_own_and_never_gives_another_callers_answer() {
    // Two users of one GPT, told apart by their per-user header from a shared range.
    let system = System::with(RelayConfig::default(), |config| {
        config.shared_egress = vec!["127.0.0.0/8".parse().unwrap()];
    })
    .await;
    let (code, token) = system.create_session().await;
    let mut tab = WsTab::attach_url(&system.ws_url(&code, &token)).await;
    tab.register(demo_tools()).await;
    let call_as = |user: &str| {
        let request = system
            .request(reqwest::Method::POST, &format!("/api/sessions/{code}/call"))
            .header("openai-ephemeral-user-id", user)
            .json(&json!({"functionName": "echo", "args": {"text": "secret"}, "requestId": "1"}));
        tokio::spawn(send(request))
    };
    let first = call_as("ada");
    let call = next_of(&mut tab, "tool-request").await;
    tab.answer(
        call["requestId"].as_str().unwrap(),
        json!({"echoed": "secret"}),
    )
    .await;
    assert_eq!(first.await.unwrap().body["result"]["echoed"], "secret");
    // The same caller asking again gets its answer, and nothing runs again…
    let again = call_as("ada").await.unwrap();
    assert_eq!(again.body["result"]["echoed"], "secret", "{again:?}");
    // …another caller naming the same id is refused, and is not given the answer.
    let other = call_as("bob").await.unwrap();
    other.assert_refused(StatusCode::CONFLICT, "request_id_conflict");
    assert!(!other.body.to_string().contains("echoed"), "{other:?}");
    system.stop().await;
}

#[tokio::test]
async fn behind_a_split_gateway_the_question_names_the_client_as_it_says_it_is() {
    let system = System::split().await;
    let (code, _, mut tab) = approving_tab(&system).await;
    let client = connect(&system.url("/mcp")).await;
    let peer = client.peer().clone();
    let connecting = {
        let code = code.clone();
        tokio::spawn(async move { call(&peer, "connect_session", json!({"code": code})).await })
    };
    let asked = next_of(&mut tab, "approval-request").await;
    // rmcp's client names itself in `initialize`; the gateway passes that on to the relay.
    assert!(
        asked["label"].as_str().unwrap().starts_with("rmcp"),
        "{asked}"
    );
    assert_eq!(asked["via"], "MCP", "{asked}");
    tab.send(json!({"type": "approval", "callerId": asked["callerId"], "allow": true}))
        .await;
    let connected = connecting.await.unwrap();
    assert_ne!(connected.is_error, Some(true), "{connected:?}");
    client.cancel().await.unwrap();
    system.stop().await;
}

#[tokio::test]
async fn nothing_of_the_tab_is_told_to_a_caller_before_the_person_allows_it() {
    let system = System::with(RelayConfig::default(), |config| {
        config.shared_egress = vec!["127.0.0.0/8".parse().unwrap()];
    })
    .await;
    let created = system.post("/api/sessions", json!({})).await;
    let code = created.body["code"].as_str().unwrap().to_owned();
    let token = created.body["providerToken"].as_str().unwrap().to_owned();
    let handle = created.body["connectorUrl"]
        .as_str()
        .unwrap()
        .rsplit('/')
        .next()
        .unwrap()
        .to_owned();

    // The session's status over gRPC names no connector handle (never asked about) to a
    // caller that named the session by its code.
    let mut grpc = toolrelay_tests::relay_client(system.grpc).await;
    let info = grpc
        .get_session(toolrelay::proto::v1::GetSessionRequest { code: code.clone() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.mcp_handle, "", "{info:?}");

    let mut tab = WsTab::attach_url(&system.ws_url(&code, &token)).await;
    tab.send(json!({"type": "register", "tools": demo_tools(), "approves": true}))
        .await;
    next_of(&mut tab, "registered").await;
    let as_user = |user: &str, request: reqwest::RequestBuilder| {
        tokio::spawn(send(request.header("openai-ephemeral-user-id", user)))
    };

    // A call of a function the tab does not have would list the tab's functions: the person
    // is asked first, and a Deny tells the caller nothing more.
    let unknown = as_user(
        "mallory",
        system
            .request(reqwest::Method::POST, &format!("/api/sessions/{code}/call"))
            .json(&json!({"functionName": "nothing_here", "args": {}})),
    );
    let asked = next_of(&mut tab, "approval-request").await;
    assert_eq!(asked["via"], "GPT Actions", "{asked}");
    tab.send(json!({"type": "approval", "callerId": asked["callerId"], "allow": false}))
        .await;
    let refused = unknown.await.unwrap();
    assert_eq!(refused.body["error"], "approval_declined", "{refused:?}");
    assert!(!refused.body.to_string().contains("echo"), "{refused:?}");

    // A call's answer, read by its id, is its caller's alone: another caller is told there is
    // no such call, and the person is not bothered about it.
    let made = tokio::spawn(send(
        system
            .request(
                reqwest::Method::POST,
                &format!("/api/sessions/{handle}/call"),
            )
            .json(&json!({"functionName": "echo", "args": {"text": "private"}, "requestId": "1"})),
    ));
    let call = next_of(&mut tab, "tool-request").await;
    tab.answer(
        call["requestId"].as_str().unwrap(),
        json!({"echoed": "private"}),
    )
    .await;
    assert_eq!(made.await.unwrap().body["success"], true);
    let reading = as_user(
        "eve",
        system.request(
            reqwest::Method::GET,
            &format!("/api/sessions/{code}/requests/1"),
        ),
    );
    let read = reading.await.unwrap();
    assert_eq!(read.body["error"], "request_not_found", "{read:?}");
    assert!(!read.body.to_string().contains("private"), "{read:?}");
    // Asking to see the session's tools is a first use, and the question comes now: the read
    // above asked nothing.
    let listing = as_user(
        "eve",
        system.request(
            reqwest::Method::GET,
            &format!("/api/sessions/{code}/metadata"),
        ),
    );
    let asked = next_of(&mut tab, "approval-request").await;
    assert_eq!(asked["via"], "GPT Actions", "{asked}");
    tab.send(json!({"type": "approval", "callerId": asked["callerId"], "allow": false}))
        .await;
    let listed = listing.await.unwrap();
    assert_eq!(listed.body["error"], "approval_declined", "{listed:?}");
    assert!(!listed.body.to_string().contains("echo"), "{listed:?}");
    system.stop().await;
}

#[tokio::test]
async fn a_tab_that_stops_approving_lets_the_held_calls_run() {
    let system = System::start().await;
    let (code, _, mut tab) = approving_tab(&system).await;
    let held = call_over_rest(&system, &code, "let-go");
    next_of(&mut tab, "approval-request").await;
    tab.send(json!({"type": "register", "tools": demo_tools(), "approves": false}))
        .await;
    let call = loop {
        let frame = tab.recv().await;
        match frame["type"].as_str() {
            Some("tool-request") => break frame,
            Some("registered" | "callers" | "approval-closed") => {}
            _ => panic!("unexpected {frame}"),
        }
    };
    assert_eq!(call["requestId"], "let-go");
    tab.answer("let-go", json!({"echoed": "hi"})).await;
    assert_eq!(held.await.unwrap().body["success"], true);
    system.stop().await;
}
