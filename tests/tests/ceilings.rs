//! Global ceilings (SPEC §10): what the relay holds in all, whoever asks — past one, a new
//! thing gets 503 with `Retry-After` and the name of the limit, the refusal is counted once,
//! and the store holds no more. On the in-memory store, and on Redis with
//! `TOOLRELAY_TEST_STORE=redis` (`scripts/test.sh`).

use reqwest::StatusCode;
use serde_json::json;
use toolrelay_relay::RelayConfig;
use toolrelay_tests::demo_tools;
use toolrelay_tests::mcp::{call, connect};
use toolrelay_tests::system::System;

/// `/metrics` as it is now.
async fn metrics(system: &System) -> String {
    let page = system
        .request(reqwest::Method::GET, "/metrics")
        .send()
        .await;
    page.unwrap().text().await.unwrap()
}

/// `toolrelay_refused_total{reason}` as `/metrics` shows it now.
async fn refused(system: &System, reason: &str) -> f64 {
    let text = metrics(system).await;
    let wanted = format!("toolrelay_refused_total{{reason=\"{reason}\"}} ");
    text.lines()
        .find_map(|line| line.strip_prefix(&wanted))
        .map_or(0.0, |value| value.trim().parse().unwrap())
}

#[tokio::test]
async fn past_max_sessions_a_new_session_gets_503_naming_the_limit_and_nothing_is_kept() {
    let relay = RelayConfig {
        max_sessions: 2,
        ..RelayConfig::default()
    };
    let system = System::with(relay, |_| {}).await;
    system.create_session().await;
    let (code, token) = system.create_session().await;
    let before = refused(&system, "sessions_total").await;

    let refusal = system.post("/api/sessions", json!({})).await;
    assert_eq!(
        refusal.status,
        StatusCode::SERVICE_UNAVAILABLE,
        "{refusal:?}"
    );
    assert_eq!(refusal.body["error"], "at_capacity");
    assert_eq!(refusal.body["code"], 503);
    let message = refusal.body["message"].as_str().unwrap();
    assert!(message.contains("MAX_SESSIONS = 2"), "{message}");
    let retry: u64 = refusal.header("retry-after").unwrap().parse().unwrap();
    assert!(retry >= 1);
    assert_eq!(refused(&system, "sessions_total").await, before + 1.0);

    // MCP's open_codap is a new session too: refused the same way, and counted once more.
    let mcp = connect(&system.url("/mcp")).await;
    let opened = call(&mcp, "open_codap", json!({})).await;
    assert_eq!(opened.is_error, Some(true), "{opened:?}");
    let error = &opened.structured_content.as_ref().unwrap()["error"];
    assert_eq!(error["code"], "at_capacity", "{opened:?}");
    assert_eq!(refused(&system, "sessions_total").await, before + 2.0);
    mcp.cancel().await.unwrap();

    // The store holds two: the metrics say so, and ending one makes room for one.
    let text = metrics(&system).await;
    assert!(
        text.lines()
            .any(|line| line == "toolrelay_sessions_active 2"),
        "{text}"
    );
    let ended = system
        .request(reqwest::Method::DELETE, &format!("/api/sessions/{code}"))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap();
    assert!(ended.status().is_success(), "{ended:?}");
    system.create_session().await;
    let again = system.post("/api/sessions", json!({})).await;
    assert_eq!(again.status, StatusCode::SERVICE_UNAVAILABLE, "{again:?}");
    system.stop().await;
}

#[tokio::test]
async fn past_max_claims_open_codap_gets_503_naming_the_limit_and_opens_no_session() {
    let relay = RelayConfig {
        max_claims: 1,
        ..RelayConfig::default()
    };
    let system = System::with(relay, |_| {}).await;
    let mcp = connect(&system.url("/mcp")).await;
    let first = call(&mcp, "open_codap", json!({})).await;
    assert_ne!(first.is_error, Some(true), "{first:?}");
    let before = refused(&system, "claims_total").await;
    let second = call(&mcp, "open_codap", json!({})).await;
    assert_eq!(second.is_error, Some(true), "{second:?}");
    let error = &second.structured_content.as_ref().unwrap()["error"];
    assert_eq!(error["code"], "at_capacity", "{second:?}");
    assert!(
        error["message"]
            .as_str()
            .unwrap()
            .contains("MAX_CLAIMS = 1"),
        "{error}"
    );
    assert_eq!(refused(&system, "claims_total").await, before + 1.0);
    let text = metrics(&system).await;
    assert!(
        text.lines()
            .any(|line| line == "toolrelay_sessions_active 1"),
        "the refused claim opened no session: {text}"
    );
    mcp.cancel().await.unwrap();
    system.stop().await;
}

#[tokio::test]
async fn past_max_manifests_new_tools_get_503_while_shared_ones_and_the_old_manifest_stay() {
    let relay = RelayConfig {
        max_manifests: 1,
        ..RelayConfig::default()
    };
    let system = System::with(relay, |_| {}).await;
    let put = |code: String, token: String, tools: serde_json::Value| {
        system
            .request(
                reqwest::Method::PUT,
                &format!("/api/sessions/{code}/manifest"),
            )
            .bearer_auth(token)
            .json(&json!({"tools": tools}))
            .send()
    };
    let (first, first_token) = system.create_session().await;
    system
        .put_manifest(&first, &first_token, demo_tools())
        .await;
    // The same tools in another session share the one manifest the store keeps.
    let (second, second_token) = system.create_session().await;
    system
        .put_manifest(&second, &second_token, demo_tools())
        .await;

    let before = refused(&system, "manifests_total").await;
    let other =
        json!([{"name": "other", "description": "Other", "inputSchema": {"type": "object"}}]);
    let refusal = put(second.clone(), second_token.clone(), other)
        .await
        .unwrap();
    assert_eq!(refusal.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(refusal.headers().contains_key("retry-after"));
    let body: serde_json::Value = refusal.json().await.unwrap();
    assert_eq!(body["error"], "at_capacity", "{body}");
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("MAX_MANIFESTS = 1"),
        "{body}"
    );
    assert_eq!(refused(&system, "manifests_total").await, before + 1.0);
    // The session keeps the tools it had.
    let metadata = system
        .get(&format!("/api/sessions/{second}/metadata"))
        .await;
    let names: Vec<&str> = metadata.body["tools"][0]["functions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|function| function["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["echo", "add"]);
    system.stop().await;
}
