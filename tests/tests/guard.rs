//! The brute-force guard on pairing codes holds on every path that takes a code: REST, the
//! legacy aliases, MCP, the browser WebSocket and every gRPC RPC count against one budget per
//! client address, and a blocked address is refused on all of them. In split mode the relay
//! keys on the client address a gateway passes only with the gateway secret, and on the peer
//! itself otherwise.
#![allow(clippy::unwrap_used)] // a test that cannot unwrap should fail loudly

use std::num::NonZeroU32;

use reqwest::StatusCode;
use rmcp::model::{CallToolRequestParams, CallToolResult, ClientConfig};
use rmcp::service::RunningService;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::{RoleClient, ServiceExt};
use serde_json::{Value, json};
use tonic::transport::Channel;
use toolrelay::json::to_struct;
use toolrelay::proto::v1::{self as pb, relay_client::RelayClient};
use toolrelay_relay::RelayConfig;
use toolrelay_relay::access::GatewaySecrets;
use toolrelay_relay::limits::RateLimits;
use toolrelay_tests::metrics::Scrape;
use toolrelay_tests::system::{System, send};
use toolrelay_tests::{TestRelay, WsTab, error_name, with_token};

type Mcp = RunningService<RoleClient, ClientConfig>;

async fn mcp(system: &System) -> Mcp {
    mcp_at(system, "/mcp").await
}

/// An MCP client of the server at `path` (`/mcp`, or a connector URL `/mcp/s/{handle}`).
async fn mcp_at(system: &System, path: &str) -> Mcp {
    let transport = StreamableHttpClientTransport::from_config(
        StreamableHttpClientTransportConfig::with_uri(system.url(path)),
    );
    ClientConfig::default().serve(transport).await.unwrap()
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

async fn mcp_call(mcp: &Mcp, name: &str, arguments: Value) -> CallToolResult {
    let arguments = arguments.as_object().cloned().unwrap();
    mcp.call_tool(CallToolRequestParams::new(name.to_owned()).with_arguments(arguments))
        .await
        .unwrap()
}

/// The error name of a failed MCP tool result.
fn mcp_error(result: &CallToolResult) -> String {
    assert_eq!(result.is_error, Some(true), "{result:?}");
    let structured = result.structured_content.clone().unwrap();
    structured["error"]["code"].as_str().unwrap().to_owned()
}

async fn grpc(address: std::net::SocketAddr) -> RelayClient<Channel> {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{address}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    RelayClient::new(channel)
}

fn lookups(per_minute: u32) -> RelayConfig {
    RelayConfig {
        limits: RateLimits {
            lookups_per_ip: NonZeroU32::new(per_minute).unwrap(),
            ..RateLimits::default()
        },
        ..RelayConfig::default()
    }
}

/// Unknown codes, one per probe, so no answer is cached anywhere.
fn unknown(n: usize) -> String {
    format!(
        "ZZZZ{}",
        ["A", "B", "C", "D", "E", "F", "G", "H", "J", "K"][n].repeat(4)
    )
}

#[tokio::test]
async fn every_path_counts_against_one_budget_and_a_blocked_address_is_refused_on_all() {
    let system = System::with(lookups(6), |_| {}).await;
    let (code, token) = system.create_session().await;
    let mcp = mcp(&system).await;
    let mut client = grpc(system.grpc).await;

    // Six misses, each on another path.
    let rest = system
        .get(&format!("/api/sessions/{}/metadata", unknown(0)))
        .await;
    assert_eq!(rest.status, StatusCode::NOT_FOUND, "{rest:?}");
    let legacy = system.get(&format!("/metadata?code={}", unknown(1))).await;
    assert_eq!(legacy.status, StatusCode::NOT_FOUND, "{legacy:?}");
    let connect = mcp_call(&mcp, "connect_session", json!({"code": unknown(2)})).await;
    assert_eq!(mcp_error(&connect), "session_not_found");
    let calling = mcp_call(
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
    let listing = mcp_call(&mcp, "list_session_tools", json!({"session": unknown(6)})).await;
    assert_eq!(mcp_error(&listing), "rate_limited");

    // Now even the real code is refused everywhere: a guessing client learns nothing.
    let rest = system.get(&format!("/api/sessions/{code}/metadata")).await;
    assert_eq!(rest.status, StatusCode::TOO_MANY_REQUESTS, "{rest:?}");
    assert!(rest.header("retry-after").is_some());
    let legacy = system.get(&format!("/metadata?code={code}")).await;
    assert_eq!(legacy.status, StatusCode::TOO_MANY_REQUESTS);
    let connect = mcp_call(&mcp, "connect_session", json!({"code": code})).await;
    assert_eq!(mcp_error(&connect), "rate_limited");
    let status = client
        .get_session(pb::GetSessionRequest { code: code.clone() })
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::ResourceExhausted);
    assert_eq!(error_name(&status), "rate_limited");
    let mut socket = WsTab::connect(&system.ws_url(&code, &token)).await;
    assert_eq!(socket.recv().await["error"], "rate_limited");
    let close = socket.closed().await.unwrap();
    assert_eq!(u16::from(close.code), 4429);

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
                    pb::PollRequestsRequest { code: c(), max: 0 },
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

/// Misses `n` unknown codes over REST as the client `address` (forwarded by a trusted proxy).
async fn miss_as(system: &System, address: &str, n: usize) -> Vec<StatusCode> {
    let mut statuses = Vec::new();
    for i in 0..n {
        let request = system
            .http
            .get(system.url(&format!("/api/sessions/{}/metadata", unknown(i))))
            .header("x-forwarded-for", address);
        statuses.push(send(request).await.status);
    }
    statuses
}

#[tokio::test]
async fn in_split_mode_the_relay_keys_on_the_client_a_proven_gateway_names() {
    // The split system's relay and gateway share a gateway secret.
    let system = System::split_with(
        &[("RATE_LIMIT_LOOKUP_PER_IP", "3")],
        &[("TRUSTED_PROXIES", "127.0.0.1")],
    )
    .await;
    let statuses = miss_as(&system, "198.51.100.1", 4).await;
    assert_eq!(
        statuses,
        [
            StatusCode::NOT_FOUND,
            StatusCode::NOT_FOUND,
            StatusCode::NOT_FOUND,
            StatusCode::TOO_MANY_REQUESTS
        ]
    );
    // Another client behind the same gateway has its own budget.
    let statuses = miss_as(&system, "198.51.100.2", 1).await;
    assert_eq!(statuses, [StatusCode::NOT_FOUND]);
    system.stop().await;

    // A gateway without the relay's secret (here a wrong one) is not believed: the relay keys
    // on the gateway, so its clients share one budget; and a client address a peer names
    // without the secret counts for nothing.
    let system = System::split_with(
        &[("RATE_LIMIT_LOOKUP_PER_IP", "3")],
        &[
            ("TRUSTED_PROXIES", "127.0.0.1"),
            ("GATEWAY_SECRET", "not-the-relays-secret-0123456789"),
        ],
    )
    .await;
    miss_as(&system, "198.51.100.1", 3).await;
    let statuses = miss_as(&system, "198.51.100.2", 1).await;
    assert_eq!(statuses, [StatusCode::TOO_MANY_REQUESTS]);
    let mut client = grpc(system.grpc).await;
    let forged = probe_as(&mut client, 0, "203.0.113.77", None).await;
    assert_eq!(
        forged, "rate_limited",
        "the forged address is ignored: the peer (loopback) is blocked"
    );
    system.stop().await;
}

const SECRET: &str = "guard-gateway-secret-0123456789";
const NEXT: &str = "guard-gateway-secret-next-0123456789";

/// The error name of a `GetSession` of unknown code `n` over gRPC, naming the client `named`
/// and, when given, proving itself a gateway with `proof`.
async fn probe_as(
    client: &mut RelayClient<Channel>,
    n: usize,
    named: &str,
    proof: Option<&str>,
) -> String {
    let mut request = tonic::Request::new(pb::GetSessionRequest { code: unknown(n) });
    let metadata = request.metadata_mut();
    metadata.insert("x-toolrelay-client", named.parse().unwrap());
    if let Some(proof) = proof {
        metadata.insert("x-toolrelay-gateway", proof.parse().unwrap());
    }
    error_name(&client.get_session(request).await.unwrap_err())
}

/// A peer of the gRPC port picks the address the guard sees only with a gateway secret: with
/// either secret of the list (rotation) the address it names is believed; without one, or
/// with a wrong one, naming a fresh address on every probe buys nothing, the peer itself is
/// blocked after its budget, and each such claim is counted as a `gateway_proof` refusal.
#[tokio::test]
async fn a_grpc_peer_names_the_client_only_with_a_gateway_secret() {
    let config = RelayConfig {
        gateway_secrets: GatewaySecrets::load(&[NEXT.to_owned(), SECRET.to_owned()], None).unwrap(),
        ..lookups(3)
    };
    let system = System::with(config, |_| {}).await;
    let mut client = grpc(system.grpc).await;

    // Proven (with the second secret of the list): the named client spends its own budget.
    let mut names = Vec::new();
    for n in 0..4 {
        names.push(probe_as(&mut client, n, "203.0.113.1", Some(SECRET)).await);
    }
    assert_eq!(
        names,
        [
            "session_not_found",
            "session_not_found",
            "session_not_found",
            "rate_limited"
        ]
    );
    // The first secret of the list is believed too: another client has its own budget, the
    // blocked one stays blocked.
    let other = probe_as(&mut client, 4, "203.0.113.2", Some(NEXT)).await;
    assert_eq!(other, "session_not_found");
    let blocked = probe_as(&mut client, 5, "203.0.113.1", Some(NEXT)).await;
    assert_eq!(blocked, "rate_limited");

    // A wrong secret, then none: a fresh address per probe, and still the peer is blocked.
    let mut names = Vec::new();
    for n in 0..4 {
        let named = format!("198.51.100.{n}");
        names.push(probe_as(&mut client, n, &named, Some("a-wrong-secret-0123456789")).await);
    }
    assert_eq!(
        names,
        [
            "session_not_found",
            "session_not_found",
            "session_not_found",
            "rate_limited"
        ]
    );
    let unproven = probe_as(&mut client, 4, "198.51.100.9", None).await;
    assert_eq!(unproven, "rate_limited");

    let scrape = Scrape::fetch(&system.http, &system.url("/metrics")).await;
    let refused = scrape.value("toolrelay_refused_total", &[("reason", "gateway_proof")]);
    assert!(refused >= 5.0, "gateway_proof refusals counted: {refused}");
    system.stop().await;
}

#[tokio::test]
async fn a_blocked_address_cannot_stream_or_answer_either() {
    let system = System::with(lookups(1), |_| {}).await;
    let (code, token) = system.create_session().await;
    let miss = system.get(&format!("/api/sessions/{}", unknown(0))).await;
    assert_eq!(miss.status, StatusCode::NOT_FOUND);
    let miss = system.get(&format!("/api/sessions/{}", unknown(1))).await;
    assert_eq!(miss.status, StatusCode::TOO_MANY_REQUESTS);
    for path in [
        format!("/api/sessions/{code}/request?token={token}"),
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
    system.stop().await;
}

/// A connector URL that names no session: 32 hex digits, another for each `n`.
fn unknown_handle(n: usize) -> String {
    format!("{n:032x}")
}

/// Unknown connector URLs (`/mcp/s/{handle}`) count against the guard like unknown codes, and
/// a blocked address gets nothing from a real connector URL either.
async fn unknown_connector_urls_count_and_a_blocked_address_is_refused_there(system: System) {
    const BUDGET: usize = 4;
    let (code, _token) = system.create_session().await;
    let pairing = mcp(&system).await;
    let connected = mcp_call(&pairing, "connect_session", json!({"code": code})).await;
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
            let called = mcp_call(&stranger, "echo", json!({"text": "x"})).await;
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

    // The address is blocked: the real connector URL, an open connection to it or a new one,
    // and every other path refuse it.
    let error = listing_error(&real.list_tools(None).await.unwrap_err());
    assert_eq!(error, "rate_limited");
    let called = mcp_call(&real, "echo", json!({"text": "x"})).await;
    assert_eq!(mcp_error(&called), "rate_limited");
    let again = mcp_at(&system, &format!("/mcp/s/{handle}")).await;
    let error = listing_error(&again.list_tools(None).await.unwrap_err());
    assert_eq!(error, "rate_limited");
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
    let system = System::split_with(&[("RATE_LIMIT_LOOKUP_PER_IP", "4")], &[]).await;
    unknown_connector_urls_count_and_a_blocked_address_is_refused_there(system).await;
}
