//! Cancellation, end to end: a caller over REST (`DELETE …/requests/{id}`), gRPC
//! (`CancelRequest`) or MCP (`notifications/cancelled`) ends a call. A queued call is never
//! delivered; a delivered one's tab — the SDK's own transport and dispatcher under node, over
//! WebSocket, SSE or polling — sees its AbortSignal aborted; the call reads `cancelled`,
//! through either replica of a fleet on Redis; a late answer is refused.
#![allow(clippy::unwrap_used)] // a test that cannot unwrap should fail loudly

use std::time::Duration;

use reqwest::StatusCode;
use rmcp::model::{CallToolRequestParams, ClientRequest};
use rmcp::service::PeerRequestOptions;
use serde_json::{Value, json};
use toolrelay::proto::v1::{self as pb, CancelRequestRequest};
use toolrelay_tests::cluster::Cluster;
use toolrelay_tests::sdk_tab::SdkTab;
use toolrelay_tests::system::{Answer, System, send};
use toolrelay_tests::{PATIENCE, demo_tools, mcp, relay_client, wait_until};

/// A tool call takes this long in the test's tabs unless it is cancelled.
const LONG: Duration = Duration::from_secs(120);

/// Queues `echo` on a session through `base` (`POST …/request`): its requestId.
async fn queue(http: &reqwest::Client, base: &str, code: &str) -> String {
    let queued = send(
        http.post(format!("{base}/api/sessions/{code}/request"))
            .json(&json!({"functionName": "echo", "args": {"text": "stop me"}})),
    )
    .await;
    assert_eq!(queued.status, StatusCode::ACCEPTED, "{queued:?}");
    queued.body["requestId"].as_str().unwrap().to_owned()
}

/// `DELETE …/requests/{id}` through `base`.
async fn cancel(http: &reqwest::Client, base: &str, code: &str, id: &str) -> Answer {
    send(http.delete(format!("{base}/api/sessions/{code}/requests/{id}"))).await
}

/// The call's status as `GET …/requests/{id}` through `base` reads it.
async fn status(http: &reqwest::Client, base: &str, code: &str, id: &str) -> Value {
    let answer = send(http.get(format!("{base}/api/sessions/{code}/requests/{id}"))).await;
    assert_eq!(answer.status, StatusCode::OK, "{answer:?}");
    answer.body["status"].clone()
}

/// Waits until `want` calls of the session `code` are pending (`GET /api/sessions/{code}`): an
/// MCP client's call is its own, and another caller cannot read its status, but a call that
/// ended is no longer pending.
async fn until_pending(system: &System, code: &str, want: u64) {
    wait_until(PATIENCE, async || {
        let session = system.get(&format!("/api/sessions/{code}")).await;
        match session.body["pendingRequests"].as_u64() {
            Some(n) if n == want => Ok(()),
            other => Err(format!("{other:?} calls pending, not {want}: {session:?}")),
        }
    })
    .await;
}

/// Waits until the tab runs `id`.
async fn until_running(tab: &SdkTab, id: &str) {
    tab.until(&format!("running {id}"), PATIENCE, |ledger| {
        ledger.runs.contains_key(id)
    })
    .await;
}

/// Waits until the tab's tool sees `id`'s signal aborted.
async fn until_aborted(tab: &SdkTab, id: &str) {
    tab.until(&format!("{id} aborted"), PATIENCE, |ledger| {
        ledger.aborted.iter().any(|aborted| aborted == id)
    })
    .await;
}

/// A new session: its code, provider token and connector URL (`/mcp/s/{handle}`).
async fn session_for_mcp(system: &System) -> (String, String, String) {
    let created = system.post("/api/sessions", json!({})).await;
    let field = |name: &str| created.body[name].as_str().unwrap().to_owned();
    (field("code"), field("providerToken"), field("connectorUrl"))
}

/// A session for an MCP client with the SDK tab attached and its tools registered: its code,
/// connector URL and tab.
async fn mcp_session_with_tab(system: &System) -> (String, String, SdkTab) {
    let (code, token, connector) = session_for_mcp(system).await;
    let tab = SdkTab::start(&system.base, &code, &token, LONG);
    tab.until("registered", PATIENCE, |ledger| ledger.registrations > 0)
        .await;
    (code, connector, tab)
}

/// Calls `echo` with `text` through `client` as a request its client can cancel.
async fn echo_cancellable(
    client: &mcp::Mcp,
    text: &str,
) -> rmcp::service::RequestHandle<rmcp::RoleClient> {
    let arguments = json!({"text": text}).as_object().cloned().unwrap();
    let request = ClientRequest::CallToolRequest(rmcp::model::CallToolRequest::new(
        CallToolRequestParams::new("echo").with_arguments(arguments),
    ));
    client
        .send_cancellable_request(request, PeerRequestOptions::no_options())
        .await
        .unwrap()
}

/// A session whose tools are registered but whose tab is not there: calls stay queued.
async fn without_tab(system: &System) -> (String, String) {
    let (code, token) = system.create_session().await;
    system.put_manifest(&code, &token, demo_tools()).await;
    (code, token)
}

/// A session with the SDK tab attached over `kind`, its tools registered: its code, token
/// and tab.
async fn with_tab(system: &System, kind: &str) -> (String, String, SdkTab) {
    let (code, token) = system.create_session().await;
    let tab = SdkTab::over(&system.base, &code, &token, LONG, kind);
    tab.until("registered", PATIENCE, |ledger| ledger.registrations > 0)
        .await;
    (code, token, tab)
}

#[tokio::test]
async fn a_queued_call_cancelled_over_rest_or_grpc_is_never_delivered() {
    let system = System::start().await;
    let http = &system.http;
    let base = system.base.as_str();
    let (code, token) = without_tab(&system).await;

    let over_rest = queue(http, base, &code).await;
    let cancelled = cancel(http, base, &code, &over_rest).await;
    assert_eq!(cancelled.status, StatusCode::OK, "{cancelled:?}");
    assert_eq!(cancelled.body["status"], "cancelled");
    assert_eq!(cancelled.body["response"]["error"]["code"], "cancelled");
    let again = cancel(http, base, &code, &over_rest).await;
    assert_eq!(again.body["status"], "cancelled", "idempotent: {again:?}");

    let over_grpc = queue(http, base, &code).await;
    let mut client = relay_client(system.grpc).await;
    let state = client
        .cancel_request(CancelRequestRequest {
            code: code.clone(),
            request_id: over_grpc.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(state.status(), pb::RequestStatus::Cancelled);
    assert_eq!(status(http, base, &code, &over_grpc).await, "cancelled");

    // The tab comes: it runs the call queued after them, never the cancelled ones.
    let kept = queue(http, base, &code).await;
    let tab = SdkTab::start(base, &code, &token, Duration::ZERO);
    until_running(&tab, &kept).await;
    wait_until(PATIENCE, async || {
        match status(http, base, &code, &kept).await {
            status if status == "completed" => Ok(()),
            other => Err(format!("the kept call is {other}")),
        }
    })
    .await;
    tab.read(|ledger| {
        assert!(!ledger.runs.contains_key(&over_rest), "{:?}", ledger.runs);
        assert!(!ledger.runs.contains_key(&over_grpc), "{:?}", ledger.runs);
    });

    let unknown = cancel(http, base, &code, "no-such-call").await;
    unknown.assert_refused(StatusCode::NOT_FOUND, "request_not_found");
    system.stop().await;
}

#[tokio::test]
async fn a_delivered_call_cancelled_over_rest_or_grpc_aborts_the_tools_signal() {
    let system = System::start().await;
    let http = &system.http;
    let base = system.base.as_str();
    let (code, token, tab) = with_tab(&system, "websocket").await;

    let over_rest = queue(http, base, &code).await;
    until_running(&tab, &over_rest).await;
    let cancelled = cancel(http, base, &code, &over_rest).await;
    assert_eq!(cancelled.body["status"], "cancelled", "{cancelled:?}");
    until_aborted(&tab, &over_rest).await;
    assert_eq!(status(http, base, &code, &over_rest).await, "cancelled");

    let over_grpc = queue(http, base, &code).await;
    until_running(&tab, &over_grpc).await;
    let mut client = relay_client(system.grpc).await;
    client
        .cancel_request(CancelRequestRequest {
            code: code.clone(),
            request_id: over_grpc.clone(),
        })
        .await
        .unwrap();
    until_aborted(&tab, &over_grpc).await;
    assert_eq!(status(http, base, &code, &over_grpc).await, "cancelled");

    // A late answer (the tab's, posted with its token) is refused with the call's status.
    let late = send(
        http.post(format!("{base}/api/sessions/{code}/response"))
            .bearer_auth(&token)
            .json(&json!({"requestId": over_rest, "success": true, "result": {"text": "late"}})),
    )
    .await;
    assert_eq!(late.status, StatusCode::OK, "{late:?}");
    assert_eq!(late.body["accepted"], false, "{late:?}");
    assert_eq!(late.body["status"], "cancelled", "{late:?}");
    system.stop().await;
}

#[tokio::test]
async fn sse_and_polling_tabs_see_the_cancel() {
    let system = System::start().await;
    let http = &system.http;
    let base = system.base.as_str();
    for kind in ["sse", "polling"] {
        let (code, _token, tab) = with_tab(&system, kind).await;
        let id = queue(http, base, &code).await;
        until_running(&tab, &id).await;
        let cancelled = cancel(http, base, &code, &id).await;
        assert_eq!(
            cancelled.body["status"], "cancelled",
            "{kind}: {cancelled:?}"
        );
        until_aborted(&tab, &id).await;
    }
    system.stop().await;
}

#[tokio::test]
async fn an_mcp_client_cancelling_ends_the_call_for_the_tab() {
    let system = System::start().await;
    let (code, connector, tab) = mcp_session_with_tab(&system).await;
    let client = mcp::connect(&connector).await;

    let handle = echo_cancellable(&client, "stop me").await;
    tab.until("the MCP call running", PATIENCE, |ledger| {
        ledger.runs.len() == 1
    })
    .await;
    let id = tab.read(|ledger| ledger.runs.keys().next().cloned().unwrap());
    handle
        .cancel(Some("the person changed their mind".into()))
        .await
        .unwrap();
    until_aborted(&tab, &id).await;
    until_pending(&system, &code, 0).await;
    client.cancel().await.unwrap();
    system.stop().await;
}

/// An MCP call still queued (no tab yet) that its client cancels is never delivered.
#[tokio::test]
async fn a_queued_call_its_mcp_client_cancels_is_never_delivered() {
    let system = System::start().await;
    let base = system.base.as_str();
    let (code, token, connector) = session_for_mcp(&system).await;
    system.put_manifest(&code, &token, demo_tools()).await;
    let client = mcp::connect(&connector).await;
    let handle = echo_cancellable(&client, "never").await;
    until_pending(&system, &code, 1).await;
    handle.cancel(None).await.unwrap();
    until_pending(&system, &code, 0).await;

    // The tab comes: it runs the call made after, never the cancelled one.
    let tab = SdkTab::start(base, &code, &token, Duration::ZERO);
    let kept = queue(&system.http, base, &code).await;
    until_running(&tab, &kept).await;
    tab.read(|ledger| assert_eq!(ledger.runs.len(), 1, "{:?}", ledger.runs));
    client.cancel().await.unwrap();
    system.stop().await;
}

/// In the 2026-07-28 revision (no MCP session) a client that closes a call's response stream
/// cancels the call: the revision says a server must take it so.
#[tokio::test]
async fn a_sessionless_mcp_client_closing_the_stream_cancels_the_call() {
    let system = System::start().await;
    let http = &system.http;
    let (code, connector, tab) = mcp_session_with_tab(&system).await;

    let params = json!({"name": "echo", "arguments": {"text": "stop me"}});
    let call = mcp::sessionless_request(http, &connector, "2026-07-28", "tools/call", params);
    let waiting = tokio::spawn(async move { call.send().await.map(drop) });
    tab.until("the MCP call running", PATIENCE, |ledger| {
        ledger.runs.len() == 1
    })
    .await;
    let id = tab.read(|ledger| ledger.runs.keys().next().cloned().unwrap());
    // The client goes away: its connection, and the call's stream with it, closes.
    waiting.abort();
    until_aborted(&tab, &id).await;
    until_pending(&system, &code, 0).await;
    system.stop().await;
}

#[tokio::test]
async fn a_cancel_through_one_replica_reaches_the_tab_on_the_other() {
    let cluster = Cluster::start(2, 2, &[]).await;
    let http = reqwest::Client::new();
    let (caller_side, tab_side) = (cluster.gateways[0].as_str(), cluster.gateways[1].as_str());
    let (code, token) = cluster.create_session(1).await;
    let tab = SdkTab::start(tab_side, &code, &token, LONG);
    tab.until("registered", PATIENCE, |ledger| ledger.registrations > 0)
        .await;

    let queued_then_delivered = queue(&http, caller_side, &code).await;
    until_running(&tab, &queued_then_delivered).await;
    let cancelled = cancel(&http, caller_side, &code, &queued_then_delivered).await;
    assert_eq!(cancelled.body["status"], "cancelled", "{cancelled:?}");
    until_aborted(&tab, &queued_then_delivered).await;
    for side in [caller_side, tab_side] {
        assert_eq!(
            status(&http, side, &code, &queued_then_delivered).await,
            "cancelled"
        );
    }
}

/// A MIP run cancelled while its sandboxed Python sleeps stops: its slot is free again.
#[tokio::test]
async fn a_cancelled_mip_run_frees_its_slot() {
    let system = System::start().await;
    let http = &system.http;
    let base = system.base.as_str();
    let (code, _token) = system.create_session().await;
    // Longer than the test waits: only the cancel can end it in time (the sandbox's own
    // wall-clock limit is 30 s).
    let slow = "import time\ntime.sleep(300)\n";
    let args = json!({"problemDefinitionCode": slow});
    let queued = send(
        http.post(format!("{base}/api/sessions/{code}/request"))
            .json(&json!({"functionName": "generate_mip_problem", "args": args})),
    )
    .await;
    assert_eq!(queued.status, StatusCode::ACCEPTED, "{queued:?}");
    let id = queued.body["requestId"].as_str().unwrap().to_owned();
    let busy = async |want: f64| {
        let page = http.get(format!("{base}/metrics")).send().await;
        let text = match page {
            Ok(page) => page.text().await.unwrap_or_default(),
            Err(error) => return Err(error.to_string()),
        };
        let slots = text
            .lines()
            .find_map(|line| line.strip_prefix("toolrelay_mip_slots_busy "))
            .and_then(|n| n.parse::<f64>().ok());
        if slots == Some(want) {
            Ok(())
        } else {
            Err(format!("toolrelay_mip_slots_busy is {slots:?}, not {want}"))
        }
    };
    wait_until(PATIENCE, async || busy(1.0).await).await;
    let cancelled = cancel(http, base, &code, &id).await;
    assert_eq!(cancelled.body["status"], "cancelled", "{cancelled:?}");
    wait_until(PATIENCE, async || busy(0.0).await).await;
    system.stop().await;
}

#[tokio::test]
async fn only_the_caller_that_made_a_call_may_cancel_it() {
    // Two users of one assistant, told apart by its per-user header from a shared range.
    let system = System::with(toolrelay_relay::RelayConfig::default(), |config| {
        config.shared_egress = vec!["127.0.0.0/8".parse().unwrap()];
    })
    .await;
    let http = &system.http;
    let base = system.base.as_str();
    let (code, _token) = without_tab(&system).await;
    let as_user = |user: &str, request: reqwest::RequestBuilder| {
        request.header("openai-ephemeral-user-id", user.to_owned())
    };
    let queued = send(as_user(
        "ada",
        http.post(format!("{base}/api/sessions/{code}/request"))
            .json(&json!({"requestId": "ada-1", "functionName": "echo", "args": {"text": "mine"}})),
    ))
    .await;
    assert_eq!(queued.status, StatusCode::ACCEPTED, "{queued:?}");

    // Another user who knows the session and the id cannot cancel it: to them it is unknown.
    let url = format!("{base}/api/sessions/{code}/requests/ada-1");
    let refused = send(as_user("bob", http.delete(&url))).await;
    refused.assert_refused(StatusCode::NOT_FOUND, "request_not_found");
    // Nor can a gRPC client at the same address.
    let mut client = relay_client(system.grpc).await;
    let over_grpc = client
        .cancel_request(CancelRequestRequest {
            code: code.clone(),
            request_id: "ada-1".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(toolrelay_tests::error_name(&over_grpc), "request_not_found");
    let adas = send(as_user("ada", http.get(&url))).await;
    assert_eq!(adas.body["status"], "queued", "{adas:?}");

    // Its maker can.
    let cancelled = send(as_user("ada", http.delete(&url))).await;
    assert_eq!(cancelled.status, StatusCode::OK, "{cancelled:?}");
    assert_eq!(cancelled.body["status"], "cancelled");
    system.stop().await;
}
