//! A call and its answer are its caller's alone (issue 39): another caller of the same session —
//! another user of the same assistant, behind the same address — cannot read where the call
//! stands, read its answer, list it among the session's answers, or cancel it, even knowing its
//! id. Over REST, gRPC and MCP.
//!
//! On the in-memory store, and on Redis with `TOOLRELAY_TEST_STORE=redis` (`scripts/test.sh`).
#![allow(clippy::unwrap_used)] // a test that cannot unwrap should fail loudly

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use toolrelay::proto::v1 as pb;
use toolrelay_relay::RelayConfig;
use toolrelay_tests::mcp::{call, connect};
use toolrelay_tests::system::{Answer, System, send};
use toolrelay_tests::{WsTab, demo_tools, relay_client};

/// A session with a tab (a raw WebSocket, which does not approve callers) serving the demo
/// tools: its code and tab.
async fn session_with_tab(system: &System) -> (String, WsTab) {
    let (code, token) = system.create_session().await;
    let mut tab = WsTab::attach_url(&system.ws_url(&code, &token)).await;
    tab.register(demo_tools()).await;
    (code, tab)
}

/// The next call the tab is given.
async fn next_call(tab: &mut WsTab) -> Value {
    let frame = tab.recv().await;
    assert_eq!(frame["type"], "tool-request", "{frame}");
    frame
}

/// A request to `path` as the GPT Action user `user` (its per-user header, from a shared
/// range).
async fn as_user(system: &System, user: &str, method: Method, path: &str) -> Answer {
    send(
        system
            .request(method, path)
            .header("openai-ephemeral-user-id", user),
    )
    .await
}

/// Asserts that `answer` says the session has no such call, and names nothing of it.
fn not_found(answer: &Answer) {
    answer.assert_refused(StatusCode::NOT_FOUND, "request_not_found");
    assert!(!answer.body.to_string().contains("echoed"), "{answer:?}");
}

#[tokio::test]
async fn another_user_of_the_same_assistant_cannot_read_list_or_cancel_a_call() {
    // Two users of one GPT, from one address, told apart by their per-user header.
    let system = System::with(RelayConfig::default(), |config| {
        config.shared_egress = vec!["127.0.0.0/8".parse().unwrap()];
    })
    .await;
    let (code, mut tab) = session_with_tab(&system).await;
    let queued = send(
        system
            .request(Method::POST, &format!("/api/sessions/{code}/request"))
            .header("openai-ephemeral-user-id", "ada")
            .json(&json!({"functionName": "echo", "args": {"text": "ada's"}})),
    )
    .await;
    assert_eq!(queued.status, StatusCode::ACCEPTED, "{queued:?}");
    let id = queued.body["requestId"].as_str().unwrap().to_owned();
    let delivered = next_call(&mut tab).await;
    assert_eq!(delivered["requestId"], id.as_str());

    // While it runs, to bob (who learned its id) it is a call the session does not have.
    let one = format!("/api/sessions/{code}/requests/{id}");
    not_found(&as_user(&system, "bob", Method::GET, &one).await);
    not_found(&as_user(&system, "bob", Method::DELETE, &one).await);

    tab.answer_stored(&id, json!({"echoed": "ada's"})).await;
    let mine = as_user(&system, "ada", Method::GET, &one).await;
    assert_eq!(mine.status, StatusCode::OK, "{mine:?}");
    assert_eq!(mine.body["status"], "completed", "{mine:?}");
    assert_eq!(mine.body["response"]["result"]["echoed"], "ada's");

    // Finished, it is still ada's alone: bob reads nothing of it, by id or in the list, and
    // cannot cancel it.
    not_found(&as_user(&system, "bob", Method::GET, &one).await);
    not_found(&as_user(&system, "bob", Method::DELETE, &one).await);
    let listed = format!("/api/sessions/{code}/response");
    let bobs = as_user(&system, "bob", Method::GET, &listed).await;
    assert_eq!(bobs.status, StatusCode::OK, "{bobs:?}");
    assert_eq!(bobs.body, json!([]), "{bobs:?}");
    let by_id = format!("{listed}?requestId={id}");
    let bobs = as_user(&system, "bob", Method::GET, &by_id).await;
    assert_eq!(bobs.body, json!([]), "{bobs:?}");
    let adas = as_user(&system, "ada", Method::GET, &listed).await;
    assert_eq!(adas.body[0]["requestId"], id.as_str(), "{adas:?}");
    assert_eq!(adas.body[0]["result"]["echoed"], "ada's", "{adas:?}");
    let adas = as_user(&system, "ada", Method::GET, &by_id).await;
    assert_eq!(adas.body.as_array().map(Vec::len), Some(1), "{adas:?}");
    system.stop().await;
}

#[tokio::test]
async fn an_mcp_clients_call_is_its_own_to_rest_and_grpc_callers_at_its_address() {
    let system = System::start().await;
    let (code, mut tab) = session_with_tab(&system).await;
    let client = connect(&system.url("/mcp")).await;
    let calling = {
        let peer = client.peer().clone();
        let arguments = json!({"session": code, "name": "echo", "arguments": {"text": "private"}});
        tokio::spawn(async move { call(&peer, "call_session_tool", arguments).await })
    };
    // The call's id leaks (the tab sees it); a REST and a gRPC caller at the same address,
    // who are not that MCP session, try it while the call runs.
    let delivered = next_call(&mut tab).await;
    let id = delivered["requestId"].as_str().unwrap().to_owned();
    let one = format!("/api/sessions/{code}/requests/{id}");
    not_found(&send(system.request(Method::GET, &one)).await);
    not_found(&send(system.request(Method::DELETE, &one)).await);
    let mut grpc = relay_client(system.grpc).await;
    let status = grpc
        .get_request_status(pb::GetRequestStatusRequest {
            code: code.clone(),
            request_id: id.clone(),
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::NotFound, "{status:?}");
    let status = grpc
        .cancel_request(pb::CancelRequestRequest {
            code: code.clone(),
            request_id: id.clone(),
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::NotFound, "{status:?}");
    let status = grpc
        .await_response(pb::AwaitResponseRequest {
            code: code.clone(),
            request_id: id.clone(),
            wait_ms: 0,
            news: false,
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::NotFound, "{status:?}");

    // Nothing they did touched it: the tab's answer reaches the MCP client.
    tab.answer(&id, json!({"echoed": "private"})).await;
    let result = calling.await.unwrap();
    assert_ne!(result.is_error, Some(true), "{result:?}");
    assert_eq!(
        result.structured_content.as_ref().unwrap()["echoed"],
        "private",
        "{result:?}"
    );
    // Finished, its answer is listed to neither.
    let listed = grpc
        .list_responses(pb::ListResponsesRequest {
            code: code.clone(),
            request_id: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(listed.responses.is_empty(), "{listed:?}");
    let rest = send(system.request(Method::GET, &format!("/api/sessions/{code}/response"))).await;
    assert_eq!(rest.body, json!([]), "{rest:?}");
    client.cancel().await.unwrap();
    system.stop().await;
}
