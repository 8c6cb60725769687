//! The brute-force guard on pairing codes holds on every path that takes a code: REST, the
//! legacy aliases, MCP and its connector URLs, the browser WebSocket and every gRPC RPC count
//! against one budget per client address, and a blocked address is refused on all of them
//! (but its own tab, with the token, is served); cross-site pages cannot spend a visitor's
//! budget. Which client address the guard keys on: `guard_addresses.rs`.
#![allow(clippy::unwrap_used)] // a test that cannot unwrap should fail loudly

use reqwest::StatusCode;
use rmcp::model::CallToolResult;
use serde_json::json;
use toolrelay::json::to_struct;
use toolrelay::proto::v1 as pb;
use toolrelay_relay::config::ENV_RATE_LIMIT_LOOKUP;
use toolrelay_tests::guard::{lookups, unknown};
use toolrelay_tests::mcp::{Mcp, call, connect};
use toolrelay_tests::metrics::Scrape;
use toolrelay_tests::system::{SseTab, System, send};
use toolrelay_tests::{TestRelay, WsTab, demo_tools, error_name, relay_client, with_token};

async fn mcp(system: &System) -> Mcp {
    mcp_at(system, "/mcp").await
}

/// An MCP client of the server at `path` (`/mcp`, or a connector URL `/mcp/s/{handle}`).
async fn mcp_at(system: &System, path: &str) -> Mcp {
    connect(&system.url(path)).await
}

/// The error name of a refused `tools/list`.
fn listing_error(error: &rmcp::ServiceError) -> String {
    match error {
        rmcp::ServiceError::McpError(error) => error
            .data
            .as_ref()
            .and_then(|data| data["error"].as_str())
            .unwrap_or_default()
            .to_owned(),
        other => panic!("not a refusal from the server: {other}"),
    }
}

/// The error name of a failed MCP tool result.
fn mcp_error(result: &CallToolResult) -> String {
    assert_eq!(result.is_error, Some(true), "{result:?}");
    let structured = result.structured_content.clone().unwrap();
    structured["error"]["code"].as_str().unwrap().to_owned()
}

#[tokio::test]
async fn every_path_counts_against_one_budget_and_a_blocked_address_is_refused_on_all() {
    let system = System::with(lookups(6), |_| {}).await;
    let (code, token) = system.create_session().await;
    let mcp = mcp(&system).await;
    let mut client = relay_client(system.grpc).await;

    // Six misses, each on another path.
    let rest = system
        .get(&format!("/api/sessions/{}/metadata", unknown(0)))
        .await;
    assert_eq!(rest.status, StatusCode::NOT_FOUND, "{rest:?}");
    let legacy = system.get(&format!("/metadata?code={}", unknown(1))).await;
    assert_eq!(legacy.status, StatusCode::NOT_FOUND, "{legacy:?}");
    let connect = call(&mcp, "connect_session", json!({"code": unknown(2)})).await;
    assert_eq!(mcp_error(&connect), "session_not_found");
    let calling = call(
        &mcp,
        "call_session_tool",
        json!({"session": unknown(3), "name": "echo", "arguments": {}}),
    )
    .await;
    assert_eq!(mcp_error(&calling), "session_not_found");
    let mut socket = WsTab::connect(&system.ws_url(&unknown(4), &token)).await;
    assert_eq!(socket.recv().await["error"], "session_not_found");
    let status = client
        .get_session(pb::GetSessionRequest { code: unknown(5) })
        .await
        .unwrap_err();
    assert_eq!(error_name(&status), "session_not_found");

    // The seventh miss is over the budget, whichever path it takes.
    let listing = call(&mcp, "list_session_tools", json!({"session": unknown(6)})).await;
    assert_eq!(mcp_error(&listing), "rate_limited");

    // Now even the real code is refused everywhere: a guessing client learns nothing.
    let rest = system.get(&format!("/api/sessions/{code}/metadata")).await;
    assert_eq!(rest.status, StatusCode::TOO_MANY_REQUESTS, "{rest:?}");
    assert!(rest.header("retry-after").is_some());
    let legacy = system.get(&format!("/metadata?code={code}")).await;
    assert_eq!(legacy.status, StatusCode::TOO_MANY_REQUESTS);
    let connect = call(&mcp, "connect_session", json!({"code": code})).await;
    assert_eq!(mcp_error(&connect), "rate_limited");
    let status = client
        .get_session(pb::GetSessionRequest { code: code.clone() })
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::ResourceExhausted);
    assert_eq!(error_name(&status), "rate_limited");
    let mut socket = WsTab::connect(&system.ws_url(&code, "not-the-token")).await;
    assert_eq!(socket.recv().await["error"], "rate_limited");
    let close = socket.closed().await.unwrap();
    assert_eq!(u16::from(close.code), 4429);
    // The session's own tab, presenting its token, is never refused by the guard.
    let mut tab = WsTab::connect(&system.ws_url(&code, &token)).await;
    assert_eq!(tab.recv().await["type"], "welcome");

    mcp.cancel().await.unwrap();
    system.stop().await;
}

#[tokio::test]
async fn every_grpc_rpc_that_takes_a_code_is_guarded() {
    // One miss per RPC fills the budget; then each RPC is refused.
    const RPCS: u32 = 14;
    let relay = TestRelay::with_config(lookups(RPCS)).await;
    let mut client = relay.client().await;
    for round in 0..2 {
        let code = unknown(round);
        let mut outcomes: Vec<(&str, tonic::Status)> = Vec::new();
        let c = || code.clone();
        let id = || "r1".to_owned();
        outcomes.push((
            "GetSession",
            client
                .get_session(pb::GetSessionRequest { code: c() })
                .await
                .unwrap_err(),
        ));
        outcomes.push((
            "ResolveHandle",
            client
                .resolve_handle(pb::ResolveHandleRequest {
                    handle: "0".repeat(32),
                })
                .await
                .unwrap_err(),
        ));
        outcomes.push((
            "DeleteSession",
            client
                .delete_session(with_token(pb::DeleteSessionRequest { code: c() }, "t"))
                .await
                .unwrap_err(),
        ));
        outcomes.push((
            "GetManifest",
            client
                .get_manifest(pb::GetManifestRequest { code: c() })
                .await
                .unwrap_err(),
        ));
        outcomes.push((
            "WatchManifest",
            client
                .watch_manifest(pb::GetManifestRequest { code: c() })
                .await
                .unwrap_err(),
        ));
        outcomes.push((
            "Submit",
            client
                .submit(pb::SubmitRequest {
                    code: c(),
                    function_name: "echo".into(),
                    args: Some(to_struct(&json!({}))),
                    ..Default::default()
                })
                .await
                .unwrap_err(),
        ));
        outcomes.push((
            "AwaitResponse",
            client
                .await_response(pb::AwaitResponseRequest {
                    code: c(),
                    request_id: id(),
                    wait_ms: 0,
                    news: false,
                })
                .await
                .unwrap_err(),
        ));
        outcomes.push((
            "Call",
            client
                .call(pb::CallRequest {
                    code: c(),
                    function_name: "echo".into(),
                    ..Default::default()
                })
                .await
                .unwrap_err(),
        ));
        outcomes.push((
            "ListResponses",
            client
                .list_responses(pb::ListResponsesRequest {
                    code: c(),
                    request_id: String::new(),
                })
                .await
                .unwrap_err(),
        ));
        outcomes.push((
            "GetRequestStatus",
            client
                .get_request_status(pb::GetRequestStatusRequest {
                    code: c(),
                    request_id: id(),
                })
                .await
                .unwrap_err(),
        ));
        let mut connect =
            tonic::Request::new(tokio_stream::iter(Vec::<pb::ProviderMessage>::new()));
        connect
            .metadata_mut()
            .insert("x-session-code", c().parse().unwrap());
        connect
            .metadata_mut()
            .insert("authorization", "Bearer t".parse().unwrap());
        outcomes.push(("Connect", client.connect(connect).await.unwrap_err()));
        outcomes.push((
            "PollRequests",
            client
                .poll_requests(with_token(
                    pb::PollRequestsRequest {
                        code: c(),
                        max: 0,
                        running: vec![],
                    },
                    "t",
                ))
                .await
                .unwrap_err(),
        ));
        outcomes.push((
            "PostResponse",
            client
                .post_response(with_token(
                    pb::PostResponseRequest {
                        code: c(),
                        response: Some(pb::ToolResponse {
                            request_id: id(),
                            success: true,
                            ..Default::default()
                        }),
                    },
                    "t",
                ))
                .await
                .unwrap_err(),
        ));
        outcomes.push((
            "RegisterManifest",
            client
                .register_manifest(with_token(
                    pb::RegisterManifestRequest {
                        code: c(),
                        tools: Vec::new(),
                        tools_json: "[]".into(),
                        approves: false,
                    },
                    "t",
                ))
                .await
                .unwrap_err(),
        ));
        assert_eq!(outcomes.len(), RPCS as usize);
        for (rpc, status) in outcomes {
            let name = error_name(&status);
            if round == 0 {
                assert!(
                    name == "session_not_found" || name == "unknown_handle",
                    "{rpc}: {status:?}"
                );
            } else {
                assert_eq!(name, "rate_limited", "{rpc} is guarded: {status:?}");
            }
        }
    }
    // Another address is not affected (its own budget): a fresh relay client is the same
    // address here, so check through the session it can still create.
    let created = relay.create_session().await;
    assert_eq!(created.code.len(), 8);
    relay.stop().await;
}

#[tokio::test]
async fn a_blocked_address_keeps_its_own_tab_but_learns_nothing_without_the_token() {
    let system = System::with(lookups(1), |_| {}).await;
    let (code, token) = system.create_session().await;
    let miss = system.get(&format!("/api/sessions/{}", unknown(0))).await;
    assert_eq!(miss.status, StatusCode::NOT_FOUND);
    let miss = system.get(&format!("/api/sessions/{}", unknown(1))).await;
    assert_eq!(miss.status, StatusCode::TOO_MANY_REQUESTS);

    // Without the token, or with a wrong one, the blocked address is refused everywhere,
    // whether the code exists or not.
    for token in ["not-the-token", ""] {
        for path in [
            format!("/api/sessions/{code}/request?token={token}"),
            format!("/api/sessions/{}/request?token={token}", unknown(2)),
            format!("/api/sessions/{code}/stream?token={token}"),
            format!("/stream?code={code}&token={token}"),
        ] {
            let refused = system.get(&path).await;
            assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS, "{path}");
        }
        let refused = system
            .post(
                &format!("/api/sessions/{code}/response?token={token}"),
                json!({"requestId": "r1", "success": true, "result": {}}),
            )
            .await;
        assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
    }
    let refused = send(
        system
            .http
            .get(system.url(&format!("/api/sessions/{code}")))
            .bearer_auth("not-the-token"),
    )
    .await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS, "{refused:?}");

    // The session's own tab, with its token, is served: it checks its session, polls,
    // streams, registers, answers and re-attaches.
    let status = send(
        system
            .http
            .get(system.url(&format!("/api/sessions/{code}")))
            .bearer_auth(&token),
    )
    .await;
    assert_eq!(status.status, StatusCode::OK, "{status:?}");
    let polled = system
        .get(&format!("/api/sessions/{code}/request?token={token}"))
        .await;
    assert_eq!(polled.status, StatusCode::OK, "{polled:?}");
    system.put_manifest(&code, &token, demo_tools()).await;
    let answered = system
        .post(
            &format!("/api/sessions/{code}/response?token={token}"),
            json!({"requestId": "r1", "success": true, "result": {}}),
        )
        .await;
    // Heard (there is no such call), not refused.
    assert_eq!(answered.body["error"], "request_not_found", "{answered:?}");
    let sse = SseTab::open(
        &system,
        &format!("/api/sessions/{code}/stream?token={token}"),
        None,
    )
    .await;
    sse.drop_connection();
    let mut tab = WsTab::connect(&system.ws_url(&code, &token)).await;
    assert_eq!(tab.recv().await["type"], "welcome");
    let mut client = relay_client(system.grpc).await;
    let polled = client
        .poll_requests(with_token(
            pb::PollRequestsRequest {
                code: code.clone(),
                max: 0,
                running: vec![],
            },
            &token,
        ))
        .await;
    assert!(polled.is_ok(), "{polled:?}");
    system.stop().await;
}

/// A request a browser sends for a page on another site: `mode` is its `Sec-Fetch-Mode`.
fn cross_site(request: reqwest::RequestBuilder, mode: &str) -> reqwest::RequestBuilder {
    request
        .header("sec-fetch-site", "cross-site")
        .header("sec-fetch-mode", mode)
}

#[tokio::test]
async fn cross_site_pages_cannot_spend_a_visitors_budget() {
    let system = System::with(lookups(2), |_| {}).await;
    let (code, token) = system.create_session().await;
    system.put_manifest(&code, &token, demo_tools()).await;
    let get = |path: String| system.http.get(system.url(&path));
    // What a page on another site makes the visitor's browser send, many times over: images
    // and no-cors fetches of random codes (even with a made-up ?token=), navigations in
    // iframes, cors fetches and EventSources from an origin the route does not allow.
    let mut attacks = Vec::new();
    for n in 0..5 {
        let random = unknown(n);
        attacks.push(cross_site(
            get(format!("/api/sessions/{random}/metadata")),
            "no-cors",
        ));
        attacks.push(cross_site(
            get(format!("/metadata?code={random}")),
            "no-cors",
        ));
        attacks.push(cross_site(
            get(format!("/api/sessions/{random}/request?token=x")),
            "no-cors",
        ));
        attacks.push(cross_site(
            get(format!("/api/sessions/{random}")),
            "navigate",
        ));
        attacks.push(
            cross_site(get(format!("/api/sessions/{random}/metadata")), "cors")
                .header("origin", "https://evil.example"),
        );
        attacks.push(
            cross_site(get(format!("/api/sessions/{random}/request")), "cors")
                .header("origin", "https://evil.example"),
        );
        attacks.push(
            cross_site(
                system
                    .http
                    .post(system.url(&format!("/api/sessions/{random}/call")))
                    .json(&json!({"functionName": "echo", "args": {}})),
                "no-cors",
            )
            .header("origin", "https://evil.example"),
        );
    }
    let before = Scrape::fetch(&system.http, &system.url("/metrics")).await;
    for attack in attacks {
        let refused = send(attack).await;
        refused.assert_refused(StatusCode::FORBIDDEN, "cross_site_request");
    }
    let after = Scrape::fetch(&system.http, &system.url("/metrics")).await;
    let refused =
        |scrape: &Scrape| scrape.value("toolrelay_refused_total", &[("reason", "fetch_metadata")]);
    assert_eq!(refused(&after) - refused(&before), 35.0);

    // Nothing was counted: the visitor's own code still works, from their LLM's server and
    // from the plugin (same origin).
    let metadata = system.get(&format!("/api/sessions/{code}/metadata")).await;
    assert_eq!(metadata.status, StatusCode::OK, "{metadata:?}");
    let same_origin = send(
        get(format!("/api/sessions/{code}/metadata"))
            .header("sec-fetch-site", "same-origin")
            .header("sec-fetch-mode", "cors")
            .header("origin", &system.base),
    )
    .await;
    assert_eq!(same_origin.status, StatusCode::OK, "{same_origin:?}");
    // A tab on another site, with its token, attaches as before.
    let polled = send(
        cross_site(get(format!("/api/sessions/{code}/request")), "cors")
            .header("origin", "https://lab.example.org")
            .bearer_auth(&token),
    )
    .await;
    assert_eq!(polled.status, StatusCode::OK, "{polled:?}");
    let status = send(
        cross_site(get(format!("/api/sessions/{code}")), "cors")
            .header("origin", "https://lab.example.org")
            .bearer_auth(&token),
    )
    .await;
    assert_eq!(status.status, StatusCode::OK, "{status:?}");
    system.stop().await;
}

/// A connector URL that names no session: 32 hex digits, another for each `n`.
fn unknown_handle(n: usize) -> String {
    format!("{n:032x}")
}

/// Unknown connector URLs (`/mcp/s/{handle}`) count against the guard like unknown codes; the
/// address they block is refused codes, but a real connector URL still works there.
async fn unknown_connector_urls_count_and_a_blocked_address_is_refused_there(system: System) {
    const BUDGET: usize = 4;
    let (code, _token) = system.create_session().await;
    let pairing = mcp(&system).await;
    let connected = call(&pairing, "connect_session", json!({"code": code})).await;
    let handle = connected.structured_content.unwrap()["handle"]
        .as_str()
        .unwrap()
        .to_owned();
    let real = mcp_at(&system, &format!("/mcp/s/{handle}")).await;
    let tools = real.list_tools(None).await.unwrap();
    assert!(!tools.tools.is_empty(), "the real connector URL works");

    // Each probe of an unknown handle counts once or twice (its `initialize` also looks the
    // session up, to watch its tools): the budget is spent within BUDGET + 1 probes, and not
    // before half of them.
    let mut refused_at = None;
    for probe in 0..=BUDGET {
        let stranger = mcp_at(&system, &format!("/mcp/s/{}", unknown_handle(probe))).await;
        let error = listing_error(&stranger.list_tools(None).await.unwrap_err());
        if error == "rate_limited" {
            let called = call(&stranger, "echo", json!({"text": "x"})).await;
            assert_eq!(mcp_error(&called), "rate_limited");
            stranger.cancel().await.unwrap();
            refused_at = Some(probe);
            break;
        }
        assert_eq!(error, "unknown_handle", "probe {probe}");
        stranger.cancel().await.unwrap();
    }
    let refused_at = refused_at.expect("unknown connector URLs never ran out of budget");
    assert!(
        refused_at >= BUDGET / 2,
        "refused at probe {refused_at}: a probe counted more than twice"
    );

    // The address is blocked for codes: a code is refused on every path. But the real
    // connector URL — a 128-bit secret nobody guesses — still works for its own caller, on an
    // open connection or a new one: other callers' guesses at its address never lock it out.
    let tools = real.list_tools(None).await.unwrap();
    assert!(
        !tools.tools.is_empty(),
        "the real connector URL still works"
    );
    let again = mcp_at(&system, &format!("/mcp/s/{handle}")).await;
    assert!(!again.list_tools(None).await.unwrap().tools.is_empty());
    let rest = system.get(&format!("/api/sessions/{code}/metadata")).await;
    assert_eq!(rest.status, StatusCode::TOO_MANY_REQUESTS, "{rest:?}");
    assert!(rest.header("retry-after").is_some(), "{rest:?}");

    for client in [pairing, real, again] {
        client.cancel().await.unwrap();
    }
    system.stop().await;
}

#[tokio::test]
async fn unknown_connector_urls_count_against_the_guard_in_one_process() {
    let system = System::with(lookups(4), |_| {}).await;
    unknown_connector_urls_count_and_a_blocked_address_is_refused_there(system).await;
}

#[tokio::test]
async fn unknown_connector_urls_count_against_the_guard_in_split_mode() {
    let system = System::split_with(&[(ENV_RATE_LIMIT_LOOKUP, "4")], &[]).await;
    unknown_connector_urls_count_and_a_blocked_address_is_refused_there(system).await;
}
