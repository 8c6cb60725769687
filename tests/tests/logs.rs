//! Secrets stay out of the logs: a run that uses provider tokens on every path that takes one
//! (WebSocket and SSE `?token=`, Bearer headers, gRPC metadata) and MCP connector handles
//! (`/mcp/s/{handle}`, `connect_session`) logs neither, even at `RUST_LOG=debug`, in one
//! process and split; pairing codes, live secrets for their session's life, are logged by
//! their prefix only (`ABCD…`).
#![allow(clippy::unwrap_used)] // a test that cannot unwrap should fail loudly

use rmcp::ServiceExt;
use rmcp::model::ClientConfig;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use serde_json::json;
use toolrelay_relay::config::ENV_API_KEYS;
use toolrelay_tests::mcp::{call, connect};
use toolrelay_tests::system::{SseTab, System, send};
use toolrelay_tests::{WsTab, demo_tools};

/// Uses every path that carries a token, a handle or a pairing code; returns the secrets it
/// used (pairing codes in both their forms, `ABCDEFGH` and `ABCD-EFGH`).
async fn use_every_secret(system: &System) -> Vec<String> {
    let mut secrets = Vec::new();
    // A WebSocket tab (?token=) answering a call.
    let (code, token) = system.create_session().await;
    secrets.push(token.clone());
    secrets.extend(code_forms(&code));
    let mut tab = WsTab::attach_url(&system.ws_url(&code, &token)).await;
    tab.register(demo_tools()).await;
    let calling = system.post(
        &format!("/api/sessions/{code}/call"),
        json!({"functionName": "echo", "args": {"text": "hi"}}),
    );
    let answering = async {
        let request = tab.next_request().await;
        tab.answer(
            request["requestId"].as_str().unwrap(),
            json!({"text": "hi"}),
        )
        .await;
    };
    let (answer, ()) = tokio::join!(calling, answering);
    assert_eq!(answer.body["success"], true, "{answer:?}");

    // MCP: pairing hands out the handle; the connector URL carries it.
    let mcp = connect(&system.url("/mcp")).await;
    let paired = call(&mcp, "connect_session", json!({"code": code})).await;
    let handle = paired.structured_content.unwrap()["handle"]
        .as_str()
        .unwrap()
        .to_owned();
    secrets.push(handle.clone());
    let scoped = connect(&system.url(&format!("/mcp/s/{handle}"))).await;
    assert!(!scoped.list_tools(None).await.unwrap().tools.is_empty());
    scoped.cancel().await.unwrap();
    mcp.cancel().await.unwrap();

    // SSE (?token=), polling and answers (Bearer), the manifest, the legacy stream, ending.
    let (code, token) = system.create_session().await;
    secrets.push(token.clone());
    secrets.extend(code_forms(&code));
    // An LLM reading the tools, and a guess of an unknown code.
    let metadata = system.get(&format!("/api/sessions/{code}/metadata")).await;
    assert!(metadata.status.is_success(), "{metadata:?}");
    let unknown = system.get("/api/sessions/ZZZZ-QQQQ/metadata").await;
    assert_eq!(unknown.status, reqwest::StatusCode::NOT_FOUND);
    secrets.extend(code_forms("ZZZZQQQQ"));
    system.put_manifest(&code, &token, demo_tools()).await;
    let sse = SseTab::open(
        system,
        &format!("/api/sessions/{code}/stream?token={token}"),
        None,
    )
    .await;
    sse.drop_connection();
    let polled = send(
        system
            .http
            .get(system.url(&format!("/api/sessions/{code}/request")))
            .bearer_auth(&token),
    )
    .await;
    assert!(polled.status.is_success(), "{polled:?}");
    let legacy = SseTab::open(system, &format!("/stream?code={code}&token={token}"), None).await;
    legacy.drop_connection();
    let ended = send(
        system
            .http
            .delete(system.url(&format!("/api/sessions/{code}")))
            .bearer_auth(&token),
    )
    .await;
    assert!(ended.status.is_success(), "{ended:?}");
    secrets
}

/// A pairing code as the relay hands it out and as people see it.
fn code_forms(code: &str) -> [String; 2] {
    let bare = code.replace('-', "");
    let shown = format!("{}-{}", &bare[..4], &bare[4..]);
    [bare, shown]
}

async fn nothing_secret_is_logged(mut system: System) {
    let secrets = use_every_secret(&system).await;
    system.terminate().await;
    system.exited().await;
    let logs = system.logs.lines();
    assert!(
        logs.iter().any(|line| line.contains("/mcp/s/…")),
        "connector requests are logged, with the handle cut"
    );
    assert!(
        logs.iter()
            .any(|line| line.contains("session created") && line.contains('…')),
        "sessions are logged, with the code cut to its prefix"
    );
    for secret in &secrets {
        let leaks: Vec<&String> = logs.iter().filter(|line| line.contains(secret)).collect();
        assert!(leaks.is_empty(), "a secret was logged: {leaks:#?}");
    }
}

#[tokio::test]
async fn no_token_or_handle_is_logged_in_one_process() {
    nothing_secret_is_logged(System::binary(&[("RUST_LOG", "debug")]).await).await;
}

#[tokio::test]
async fn no_token_or_handle_is_logged_in_split_mode() {
    let debug = [("RUST_LOG", "debug")];
    nothing_secret_is_logged(System::split_with(&debug, &debug).await).await;
}

#[tokio::test]
async fn api_keys_are_never_logged() {
    const KEY: &str = "a-key-that-must-never-be-logged-42";
    let mut system = System::binary(&[("RUST_LOG", "debug"), (ENV_API_KEYS, KEY)]).await;
    let (code, _) = system.create_session().await;
    for key in [Some(KEY), Some("a-wrong-key-that-is-long-enough"), None] {
        let mut request = system
            .http
            .get(system.url(&format!("/api/sessions/{code}/metadata")));
        if let Some(key) = key {
            request = request.bearer_auth(key);
        }
        send(request).await;
    }
    let mcp = ClientConfig::default()
        .serve(StreamableHttpClientTransport::from_config(
            StreamableHttpClientTransportConfig::with_uri(system.url("/mcp")).auth_header(KEY),
        ))
        .await
        .unwrap();
    mcp.list_tools(None).await.unwrap();
    mcp.cancel().await.unwrap();
    system.terminate().await;
    system.exited().await;
    let logs = system.logs.lines();
    assert!(logs.iter().any(|line| line.contains("request refused")));
    assert!(
        !logs.iter().any(|line| line.contains(KEY)),
        "the key was logged"
    );
    assert!(
        !logs
            .iter()
            .any(|line| line.contains("a-wrong-key-that-is-long-enough")),
        "a wrong key was logged"
    );
}
