//! The gateway over real sockets: an HTTP client plays the LLM; the tab is a WebSocket, SSE or
//! polling client; in one process and split into the real relay and gateway binaries.
#![allow(clippy::unwrap_used)] // a test that cannot unwrap should fail loudly

use std::num::NonZeroU32;
use std::time::Duration;

use futures::StreamExt;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use toolrelay_gateway::config::RateLimits;
use toolrelay_relay::RelayConfig;
use toolrelay_tests::system::{SseTab, System, send};
use toolrelay_tests::{Deadline, PATIENCE, WsTab, demo_tools, wait_until};

fn echo_call(text: &str) -> Value {
    json!({"functionName": "echo", "args": {"text": text}})
}

/// The tab's answer to a call, posted over HTTP.
async fn post_answer(system: &System, code: &str, token: &str, request_id: &str, result: Value) {
    let answer = send(
        system
            .request(Method::POST, &format!("/api/sessions/{code}/response"))
            .bearer_auth(token)
            .json(&json!({"requestId": request_id, "success": true, "result": result})),
    )
    .await;
    assert_eq!(answer.status, StatusCode::OK, "{answer:?}");
    assert_eq!(answer.body["accepted"], true);
}

/// Waits (with a deadline) until call `request_id` has `status`.
async fn until_status(system: &System, code: &str, request_id: &str, status: &str) {
    wait_until(PATIENCE, async || {
        let state = system
            .get(&format!("/api/sessions/{code}/requests/{request_id}"))
            .await;
        if state.body["status"] == status {
            Ok(())
        } else {
            Err(format!(
                "call {request_id} never became {status}: {state:?}"
            ))
        }
    })
    .await;
}

// ---- scenarios, run in one process and split ----

async fn an_llm_call_reaches_a_websocket_tab(system: &System) {
    let (code, token) = system.create_session().await;
    let mut tab = WsTab::attach_url(&system.ws_url(&code, &token)).await;
    tab.register(demo_tools()).await;
    let metadata = system.get(&format!("/api/sessions/{code}/metadata")).await;
    assert_eq!(metadata.body["tools"][0]["id"], "demo", "{metadata:?}");
    assert_eq!(metadata.body["tools"][0]["functions"][0]["name"], "echo");

    let llm = system.post(
        &format!("/api/sessions/{code}/call"),
        echo_call("over websocket"),
    );
    let tab_side = async {
        let request = tab.next_request().await;
        assert_eq!(request["args"], json!({"text": "over websocket"}));
        assert_eq!(request["toolId"], "demo");
        tab.answer(
            request["requestId"].as_str().unwrap(),
            json!({"echoed": "over websocket"}),
        )
        .await;
    };
    let (answer, ()) = tokio::join!(llm, tab_side);
    assert_eq!(answer.status, StatusCode::OK, "{answer:?}");
    assert_eq!(answer.body["success"], true);
    assert_eq!(answer.body["result"], json!({"echoed": "over websocket"}));

    let status = system.get(&format!("/api/sessions/{code}")).await;
    assert_eq!(status.body["providerConnected"], true, "{status:?}");
    assert_eq!(status.body["transport"], "websocket");
}

async fn an_llm_call_reaches_an_sse_tab(system: &System) {
    let (code, token) = system.create_session().await;
    system.put_manifest(&code, &token, demo_tools()).await;
    let mut tab = SseTab::open(
        system,
        &format!("/api/sessions/{code}/stream?token={token}"),
        None,
    )
    .await;

    let llm = system.post(&format!("/api/sessions/{code}/call"), echo_call("over sse"));
    let tab_side = async {
        let event = tab.next().await;
        assert_eq!(event.kind, "tool-request", "{event:?}");
        assert!(event.id.is_some(), "tool requests carry an event id");
        let id = event.data["requestId"].as_str().unwrap().to_owned();
        post_answer(system, &code, &token, &id, json!("sse answer")).await;
    };
    let (answer, ()) = tokio::join!(llm, tab_side);
    assert_eq!(answer.status, StatusCode::OK, "{answer:?}");
    assert_eq!(answer.body["result"], "sse answer");
}

async fn an_llm_call_reaches_a_polling_tab(system: &System) {
    let (code, token) = system.create_session().await;
    system.put_manifest(&code, &token, demo_tools()).await;
    // The tab polls (and so is connected) before the call: a call for a session with no tab
    // answers 202 at once instead of waiting.
    let first = system
        .get(&format!("/api/sessions/{code}/request?token={token}"))
        .await;
    assert_eq!(first.body, json!([]), "{first:?}");

    let llm = system.post(
        &format!("/api/sessions/{code}/call"),
        json!({"functionName": "add", "args": {"a": 2, "b": 3}}),
    );
    let tab_side = async {
        let every = Deadline::within(PATIENCE).every(Duration::from_millis(50));
        let calls = wait_until(every, async || {
            let polled = system
                .get(&format!("/api/sessions/{code}/request?token={token}"))
                .await;
            assert_eq!(polled.status, StatusCode::OK, "{polled:?}");
            let calls = polled.body.as_array().unwrap().clone();
            if calls.is_empty() {
                Err("the call reached the poller")
            } else {
                Ok(calls)
            }
        })
        .await;
        assert_eq!(calls[0]["functionName"], "add");
        post_answer(
            system,
            &code,
            &token,
            calls[0]["requestId"].as_str().unwrap(),
            json!({"sum": 5}),
        )
        .await;
    };
    let (answer, ()) = tokio::join!(llm, tab_side);
    assert_eq!(answer.body["result"], json!({"sum": 5}), "{answer:?}");
    let status = system.get(&format!("/api/sessions/{code}")).await;
    assert_eq!(status.body["transport"], "polling");
}

async fn request_then_response_with_wait_works_in_two_steps(system: &System) {
    let (code, token) = system.create_session().await;
    let mut tab = WsTab::attach_url(&system.ws_url(&code, &token)).await;
    tab.register(demo_tools()).await;

    let queued = system
        .post(
            &format!("/api/sessions/{code}/request"),
            json!({"requestId": "two-step", "functionName": "echo", "args": {"text": "later"}}),
        )
        .await;
    assert_eq!(queued.status, StatusCode::ACCEPTED, "{queued:?}");
    assert_eq!(
        queued.body,
        json!({"requestId": "two-step", "status": "queued", "providerConnected": true})
    );

    let waiting = tokio::spawn(system.get(&format!(
        "/api/sessions/{code}/response?requestId=two-step&wait=10"
    )));
    let request = tab.next_request().await;
    // The relay has recorded the call as delivered, and the waiter, asked before, is still
    // waiting: the answer comes to a caller that waits for it.
    until_status(system, &code, "two-step", "delivered").await;
    assert!(
        !waiting.is_finished(),
        "GET …/response?wait=10 did not wait"
    );
    tab.answer(request["requestId"].as_str().unwrap(), json!("done later"))
        .await;
    let responses = waiting.await.unwrap();
    assert_eq!(responses.status, StatusCode::OK);
    assert_eq!(
        responses.body,
        json!([{"requestId": "two-step", "success": true, "result": "done later"}])
    );

    let state = system
        .get(&format!("/api/sessions/{code}/requests/two-step"))
        .await;
    assert_eq!(state.body["status"], "completed", "{state:?}");
    assert_eq!(state.body["response"]["result"], "done later");
}

async fn the_legacy_aliases_work_with_the_first_designs_shapes(system: &System) {
    let (code, token) = system.create_session().await;
    system.put_manifest(&code, &token, demo_tools()).await;
    let flat = system.get(&format!("/metadata?code={code}")).await;
    assert_eq!(flat.body["tools"][0]["name"], "echo", "{flat:?}");
    assert!(flat.body["tools"][0]["inputSchema"].is_object());

    let mut tab = SseTab::open(system, &format!("/stream?code={code}&token={token}"), None).await;
    let queued = system
        .post(
            "/request",
            json!({"code": code, "id": "legacy-1", "tool": "echo", "args": {"text": "old"}}),
        )
        .await;
    assert_eq!(queued.status, StatusCode::ACCEPTED, "{queued:?}");
    assert_eq!(queued.body, json!({"id": "legacy-1", "status": "queued"}));

    let event = tab.next().await;
    assert_eq!(event.kind, "tool-request");
    assert_eq!(event.data["id"], "legacy-1");
    assert_eq!(event.data["tool"], "echo");
    assert_eq!(event.data["args"], json!({"text": "old"}));

    let unauthenticated = system
        .post(
            "/response",
            json!({"code": code, "id": "legacy-1", "result": {"success": true}}),
        )
        .await;
    assert_eq!(
        unauthenticated.status,
        StatusCode::UNAUTHORIZED,
        "the token is required"
    );
    let answered = send(
        system
            .request(Method::POST, "/response")
            .bearer_auth(&token)
            .json(&json!({"code": code, "id": "legacy-1", "result": {"success": true, "values": {"caseID": 42}}})),
    )
    .await;
    assert_eq!(answered.status, StatusCode::ACCEPTED, "{answered:?}");
    assert_eq!(
        answered.body,
        json!({"id": "legacy-1", "status": "completed"})
    );

    let responses = system
        .get(&format!("/api/sessions/{code}/response?requestId=legacy-1"))
        .await;
    assert_eq!(
        responses.body[0]["result"],
        json!({"success": true, "values": {"caseID": 42}})
    );
}

// ---- one process ----

#[tokio::test]
async fn one_process_websocket_tab() {
    let system = System::start().await;
    an_llm_call_reaches_a_websocket_tab(&system).await;
    system.stop().await;
}

#[tokio::test]
async fn one_process_sse_tab() {
    let system = System::start().await;
    an_llm_call_reaches_an_sse_tab(&system).await;
    system.stop().await;
}

#[tokio::test]
async fn one_process_polling_tab() {
    let system = System::start().await;
    an_llm_call_reaches_a_polling_tab(&system).await;
    system.stop().await;
}

#[tokio::test]
async fn one_process_two_steps() {
    let system = System::start().await;
    request_then_response_with_wait_works_in_two_steps(&system).await;
    system.stop().await;
}

#[tokio::test]
async fn one_process_legacy_aliases() {
    let system = System::start().await;
    the_legacy_aliases_work_with_the_first_designs_shapes(&system).await;
    system.stop().await;
}

// ---- split: the relay and the gateway binaries, talking gRPC ----

#[tokio::test]
async fn split_processes_pass_the_same_end_to_end_tests() {
    let system = System::split().await;
    an_llm_call_reaches_a_websocket_tab(&system).await;
    an_llm_call_reaches_an_sse_tab(&system).await;
    an_llm_call_reaches_a_polling_tab(&system).await;
    request_then_response_with_wait_works_in_two_steps(&system).await;
    the_legacy_aliases_work_with_the_first_designs_shapes(&system).await;
    system.stop().await;
}

// ---- behaviour ----

#[tokio::test]
async fn an_sse_tab_that_drops_and_resumes_with_last_event_id_loses_no_request() {
    let system = System::start().await;
    let (code, token) = system.create_session().await;
    system.put_manifest(&code, &token, demo_tools()).await;
    let stream = format!("/api/sessions/{code}/stream?token={token}");
    let queue = |id: &str| {
        system.post(
            &format!("/api/sessions/{code}/request"),
            json!({"requestId": id, "functionName": "echo", "args": {"text": id}}),
        )
    };

    let mut tab = SseTab::open(&system, &stream, None).await;
    assert_eq!(queue("first").await.status, StatusCode::ACCEPTED);
    let event = tab.next().await;
    assert_eq!(event.data["requestId"], "first");
    let last_id = event.id.clone().unwrap();
    tab.drop_connection(); // a network blip before the tab answered

    assert_eq!(queue("second").await.status, StatusCode::ACCEPTED);
    let mut tab = SseTab::open(&system, &stream, Some(&last_id)).await;
    let mut seen = Vec::new();
    for _ in 0..2 {
        let event = tab.next().await;
        assert_eq!(event.kind, "tool-request");
        seen.push(event.data["requestId"].as_str().unwrap().to_owned());
    }
    seen.sort();
    assert_eq!(
        seen,
        ["first", "second"],
        "the unanswered call comes again, the new one follows"
    );
    for id in &seen {
        post_answer(&system, &code, &token, id, json!(id)).await;
    }
    let responses = system.get(&format!("/api/sessions/{code}/response")).await;
    let answered: Vec<&str> = responses
        .body
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["requestId"].as_str().unwrap())
        .collect();
    assert_eq!(answered, ["first", "second"]);
    system.stop().await;
}

#[tokio::test]
async fn rate_limits_answer_429_at_the_configured_numbers() {
    let limits = RateLimits {
        sessions_per_ip: NonZeroU32::new(3).unwrap(),
        tools_per_ip: NonZeroU32::new(60).unwrap(),
        ..RateLimits::default()
    };
    let relay = RelayConfig {
        limits: toolrelay_relay::limits::RateLimits {
            calls_per_code: NonZeroU32::new(4).unwrap(),
            lookups_per_ip: NonZeroU32::new(5).unwrap(),
            ..toolrelay_relay::limits::RateLimits::default()
        },
        ..RelayConfig::default()
    };
    let system = System::with(relay, |config| config.limits = limits).await;

    let (code, token) = system.create_session().await;
    system.create_session().await;
    system.create_session().await;
    let refused = system.post("/api/sessions", json!({})).await;
    assert_eq!(
        refused.status,
        StatusCode::TOO_MANY_REQUESTS,
        "the 4th session in a minute"
    );
    assert!(
        refused
            .header("retry-after")
            .unwrap()
            .parse::<u64>()
            .unwrap()
            >= 1
    );
    assert_eq!(refused.body["error"], "rate_limited");
    assert_eq!(refused.body["code"], 429);

    system.put_manifest(&code, &token, demo_tools()).await;
    for n in 0..4 {
        let queued = system
            .post(
                &format!("/api/sessions/{code}/request"),
                echo_call(&n.to_string()),
            )
            .await;
        assert_eq!(queued.status, StatusCode::ACCEPTED, "call {n}");
    }
    let refused = system
        .post(&format!("/api/sessions/{code}/call"), echo_call("fifth"))
        .await;
    assert_eq!(
        refused.status,
        StatusCode::TOO_MANY_REQUESTS,
        "the 5th call to one session in a minute"
    );
    assert!(refused.header("retry-after").is_some());
    let status = system.get(&format!("/api/sessions/{code}")).await;
    assert_eq!(
        status.body["pendingRequests"], 4,
        "the refused call queued nothing"
    );

    for letter in ["B", "C", "D", "E", "F"] {
        let unknown = system
            .get(&format!("/api/sessions/AAAA{letter}AAA/metadata"))
            .await;
        assert_eq!(unknown.status, StatusCode::NOT_FOUND);
    }
    let blocked = system.get("/api/sessions/BBBBBBBB/metadata").await;
    assert_eq!(
        blocked.status,
        StatusCode::TOO_MANY_REQUESTS,
        "too many unknown codes"
    );
    let blocked = system.get(&format!("/api/sessions/{code}/metadata")).await;
    assert_eq!(
        blocked.status,
        StatusCode::TOO_MANY_REQUESTS,
        "a guessing client learns nothing, even of valid codes"
    );
    system.stop().await;
}

#[tokio::test]
async fn bad_input_gets_the_error_body_and_queues_nothing() {
    let system = System::start().await;
    let (code, token) = system.create_session().await;
    system.put_manifest(&code, &token, demo_tools()).await;
    let call = format!("/api/sessions/{code}/call");
    let queued = system
        .post(
            &format!("/api/sessions/{code}/request"),
            json!({"requestId": "taken", "functionName": "echo", "args": {"text": "a"}}),
        )
        .await;
    assert_eq!(queued.status, StatusCode::ACCEPTED);

    let raw = |body: &'static str| {
        system
            .request(Method::POST, &call)
            .header("content-type", "application/json")
            .body(body)
    };
    let cases: Vec<(reqwest::RequestBuilder, StatusCode, &str)> = vec![
        (raw("{not json"), StatusCode::BAD_REQUEST, "invalid_request"),
        (
            raw(r#"{"args": {}}"#),
            StatusCode::BAD_REQUEST,
            "invalid_request",
        ),
        (
            system
                .request(Method::POST, "/api/sessions/AB!D/call")
                .json(&echo_call("x")),
            StatusCode::BAD_REQUEST,
            "invalid_code",
        ),
        (
            system
                .request(Method::POST, &call)
                .json(&json!({"functionName": "echo", "args": {"text": 5}})),
            StatusCode::BAD_REQUEST,
            "invalid_arguments",
        ),
        (
            system
                .request(Method::POST, "/api/sessions/ZZZZ-ZZZZ/call")
                .json(&echo_call("x")),
            StatusCode::NOT_FOUND,
            "session_not_found",
        ),
        (
            system
                .request(Method::POST, &call)
                .json(&json!({"functionName": "nope", "args": {}})),
            StatusCode::NOT_FOUND,
            "unknown_function",
        ),
        (
            system.request(Method::POST, &call).json(
                &json!({"requestId": "taken", "functionName": "echo", "args": {"text": "b"}}),
            ),
            StatusCode::CONFLICT,
            "request_id_conflict",
        ),
        (
            system
                .request(Method::POST, &call)
                .json(&echo_call(&"x".repeat(300 * 1024))),
            StatusCode::PAYLOAD_TOO_LARGE,
            "body_too_large",
        ),
        (
            system
                .request(Method::POST, &format!("/api/sessions/{code}/response"))
                .json(&json!({"requestId": "taken", "result": 1})),
            StatusCode::UNAUTHORIZED,
            "token_required",
        ),
        (
            system
                .request(Method::POST, &format!("/api/sessions/{code}/response"))
                .bearer_auth("wrong")
                .json(&json!({"requestId": "taken", "result": 1})),
            StatusCode::FORBIDDEN,
            "invalid_token",
        ),
        (
            system.request(Method::GET, "/api/sessions/{code}/nothing-here"),
            StatusCode::NOT_FOUND,
            "not_found",
        ),
    ];
    for (request, status, name) in cases {
        let answer = send(request).await;
        assert_eq!(answer.status, status, "{name}: {answer:?}");
        assert_eq!(answer.body["error"], name, "{answer:?}");
        assert_eq!(answer.body["code"], status.as_u16());
        assert!(
            answer.body["message"]
                .as_str()
                .is_some_and(|m| m.len() > 20),
            "{answer:?}"
        );
        let correlation = answer.body["correlationId"].as_str().unwrap();
        assert_eq!(answer.header("x-request-id"), Some(correlation));
    }

    // A caller's x-request-id is the correlation id.
    let traced = send(
        system
            .request(Method::GET, "/api/sessions/ZZZZZZZZ")
            .header("x-request-id", "trace-42"),
    )
    .await;
    assert_eq!(traced.header("x-request-id"), Some("trace-42"));
    assert_eq!(traced.body["correlationId"], "trace-42");

    let status = system.get(&format!("/api/sessions/{code}")).await;
    assert_eq!(
        status.body["pendingRequests"], 1,
        "only the first, accepted call is queued"
    );
    system.stop().await;
}

#[tokio::test]
async fn a_slow_call_returns_202_and_its_answer_can_be_fetched() {
    let system = System::start().await;
    let (code, token) = system.create_session().await;
    let mut tab = WsTab::attach_url(&system.ws_url(&code, &token)).await;
    tab.register(demo_tools()).await;
    let pending = system
        .post(&format!("/api/sessions/{code}/call"), json!({"requestId": "slow", "functionName": "echo", "args": {"text": "zz"}, "timeoutMs": 200}))
        .await;
    assert_eq!(pending.status, StatusCode::ACCEPTED, "{pending:?}");
    assert_eq!(pending.body["requestId"], "slow");
    assert_eq!(pending.body["status"], "delivered");
    tab.next_request().await;
    tab.answer("slow", json!("finally")).await;
    let again = system
        .post(
            &format!("/api/sessions/{code}/call"),
            json!({"requestId": "slow", "functionName": "echo", "args": {"text": "zz"}}),
        )
        .await;
    assert_eq!(
        again.status,
        StatusCode::OK,
        "repeating the id returns the answer: {again:?}"
    );
    assert_eq!(again.body["result"], "finally");
    system.stop().await;
}

#[tokio::test]
async fn discovery_documents_and_health() {
    let system = System::start().await;
    let discovery = system.get("/.well-known/codap-mcp.json").await;
    assert_eq!(
        discovery.body["callEndpoint"],
        system.url("/api/sessions/{code}/call")
    );
    assert_eq!(
        discovery.body["webSocketEndpoint"],
        system.ws_url("{code}", "").trim_end_matches("?token=")
    );
    assert_eq!(discovery.body["openapi"], system.url("/openapi.json"));
    let spec = system.get("/openapi.json").await;
    assert_eq!(spec.body["openapi"], "3.0.0");
    assert_eq!(spec.body["servers"][0]["url"], system.base);
    let actions = system.get("/openapi/actions.json").await;
    assert!(actions.body["paths"]["/api/sessions/{code}/call"]["post"].is_object());
    assert!(
        actions.body["paths"]
            .get("/api/sessions/{code}/stream")
            .is_none(),
        "tab routes stay out"
    );
    let yaml = system
        .request(Method::GET, "/openapi.yaml")
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        yaml.contains("openapi: 3.0.0"),
        "{}",
        &yaml[..200.min(yaml.len())]
    );
    assert_eq!(
        system
            .request(Method::GET, "/healthz")
            .send()
            .await
            .unwrap()
            .status(),
        StatusCode::OK
    );
    assert_eq!(
        system
            .request(Method::GET, "/readyz")
            .send()
            .await
            .unwrap()
            .status(),
        StatusCode::OK
    );
    system.stop().await;
}

#[tokio::test]
async fn cors_allows_the_configured_origins_only() {
    let system = System::start().await;
    // Calling a tool (the provider routes are open to every origin: see below).
    let preflight = |origin: &str| {
        system
            .request(Method::OPTIONS, "/api/sessions/ABCDEFGH/call")
            .header("origin", origin)
            .header("access-control-request-method", "POST")
            .send()
    };
    let allowed = preflight("https://codap.concord.org").await.unwrap();
    assert_eq!(allowed.status(), StatusCode::OK);
    assert_eq!(
        allowed
            .headers()
            .get("access-control-allow-origin")
            .unwrap(),
        "https://codap.concord.org"
    );
    let refused = preflight("https://evil.example").await.unwrap();
    assert!(
        refused
            .headers()
            .get("access-control-allow-origin")
            .is_none()
    );
    system.stop().await;
}

/// What a browser on `origin` is told about `method path`: the preflight's allowed origin.
async fn preflight_allows(
    system: &System,
    origin: &str,
    method: &str,
    path: &str,
) -> Option<String> {
    let answer = system
        .request(Method::OPTIONS, path)
        .header("origin", origin)
        .header("access-control-request-method", method)
        .header(
            "access-control-request-headers",
            "authorization, content-type",
        )
        .send()
        .await
        .unwrap();
    assert!(
        answer
            .headers()
            .get("access-control-allow-credentials")
            .is_none(),
        "never with credentials: {method} {path}"
    );
    answer
        .headers()
        .get("access-control-allow-origin")
        .map(|value| value.to_str().unwrap().to_owned())
}

#[tokio::test]
async fn a_page_on_any_origin_may_serve_tools_unless_cors_origin_narrows_it() {
    let page = "http://127.0.0.1:1";
    let system = System::start().await;
    // Everything a page serving tools does, from an origin nobody configured.
    let created = send(
        system
            .request(Method::POST, "/api/sessions")
            .header("origin", page),
    )
    .await;
    assert_eq!(created.status, StatusCode::CREATED, "{created:?}");
    assert_eq!(created.header("access-control-allow-origin"), Some("*"));
    let code = created.body["code"].as_str().unwrap().to_owned();
    let token = created.body["providerToken"].as_str().unwrap().to_owned();
    for (method, path) in [
        ("POST", "/api/sessions".to_owned()),
        ("GET", format!("/api/sessions/{code}")),
        ("DELETE", format!("/api/sessions/{code}")),
        ("GET", format!("/api/sessions/{code}/stream")),
        ("GET", format!("/api/sessions/{code}/request")),
        ("PUT", format!("/api/sessions/{code}/manifest")),
        ("POST", format!("/api/sessions/{code}/response")),
    ] {
        assert_eq!(
            preflight_allows(&system, page, method, &path)
                .await
                .as_deref(),
            Some("*"),
            "{method} {path}"
        );
    }
    let registered = send(
        system
            .request(Method::PUT, &format!("/api/sessions/{code}/manifest"))
            .header("origin", page)
            .bearer_auth(&token)
            .json(&json!({"tools": demo_tools()})),
    )
    .await;
    assert_eq!(registered.status, StatusCode::OK, "{registered:?}");
    assert_eq!(registered.header("access-control-allow-origin"), Some("*"));
    // The WebSocket has no CORS, but its upgrade request names the page's origin.
    let mut upgrade = system.ws_url(&code, &token).into_client_request().unwrap();
    upgrade
        .headers_mut()
        .insert("origin", page.parse().unwrap());
    let (mut socket, _) = tokio_tungstenite::connect_async(upgrade).await.unwrap();
    let welcome = socket.next().await.unwrap().unwrap();
    assert!(welcome.to_text().unwrap().contains("welcome"), "{welcome}");
    drop(socket);
    let polled = send(
        system
            .request(Method::GET, &format!("/api/sessions/{code}/request"))
            .header("origin", page)
            .bearer_auth(&token),
    )
    .await;
    assert_eq!(polled.status, StatusCode::OK, "{polled:?}");
    assert_eq!(polled.header("access-control-allow-origin"), Some("*"));
    // The SDK itself is open to every origin: pages import it as a module.
    let sdk = send(
        system
            .request(Method::GET, "/sdk/toolrelay.js")
            .header("origin", page),
    )
    .await;
    assert_eq!(sdk.status, StatusCode::OK);
    assert_eq!(sdk.header("access-control-allow-origin"), Some("*"));
    assert!(
        sdk.header("content-type")
            .unwrap()
            .starts_with("text/javascript")
    );
    // Calling tools is not a provider's business: those routes keep the allow-list.
    for (method, path) in [
        ("POST", format!("/api/sessions/{code}/call")),
        ("POST", format!("/api/sessions/{code}/request")),
        ("GET", format!("/api/sessions/{code}/metadata")),
    ] {
        assert_eq!(
            preflight_allows(&system, page, method, &path).await,
            None,
            "{method} {path}"
        );
    }
    system.stop().await;

    // CORS_ORIGIN narrows the provider routes to the origins it names.
    let narrowed = System::with(RelayConfig::default(), |config| {
        config.cors_origins = vec!["https://lab.example.org".to_owned()];
        config.open_provider_routes = false;
    })
    .await;
    assert_eq!(
        preflight_allows(&narrowed, page, "POST", "/api/sessions").await,
        None
    );
    assert_eq!(
        preflight_allows(
            &narrowed,
            "https://lab.example.org",
            "POST",
            "/api/sessions"
        )
        .await
        .as_deref(),
        Some("https://lab.example.org")
    );
    narrowed.stop().await;
}

#[tokio::test]
async fn codes_are_accepted_as_people_type_them() {
    let system = System::start().await;
    let (code, token) = system.create_session().await;
    system.put_manifest(&code, &token, demo_tools()).await;
    // Lower case, a space and hyphens anywhere, and the digits people type for O, I and B.
    let typed: String = code
        .chars()
        .map(|c| match c {
            'O' => '0',
            'I' => '1',
            'B' => '8',
            other => other.to_ascii_lowercase(),
        })
        .collect();
    let typed = format!("{}%20{}-{}", &typed[..3], &typed[3..6], &typed[6..]);
    let metadata = system.get(&format!("/api/sessions/{typed}/metadata")).await;
    assert_eq!(metadata.status, StatusCode::OK, "{typed}: {metadata:?}");
    let status = system.get(&format!("/api/sessions/{typed}")).await;
    assert_eq!(
        status.body["code"],
        code.as_str(),
        "APIs answer with the plain form"
    );
    system.stop().await;
}

#[tokio::test]
async fn a_call_for_a_tab_that_is_not_there_says_so_at_once_and_stays_queued() {
    let system = System::start().await;
    let (code, token) = system.create_session().await;
    system.put_manifest(&code, &token, demo_tools()).await;
    // No tab is connected: the answer comes at once (not after the call's 40 s wait).
    let call = system.post(
        &format!("/api/sessions/{code}/call"),
        json!({"requestId": "waiting", "functionName": "echo", "args": {"text": "x"}, "timeoutMs": 40_000}),
    );
    let pending = tokio::time::timeout(PATIENCE, call)
        .await
        .expect("a call for a missing tab does not wait");
    assert_eq!(pending.status, StatusCode::ACCEPTED, "{pending:?}");
    assert_eq!(pending.body["providerConnected"], false);
    assert_eq!(pending.body["status"], "queued");
    assert!(
        pending.body["message"]
            .as_str()
            .unwrap()
            .contains("open the plugin"),
        "{pending:?}"
    );
    let queued = system
        .post(&format!("/api/sessions/{code}/request"), echo_call("later"))
        .await;
    assert_eq!(queued.body["providerConnected"], false, "{queued:?}");
    let state = system
        .get(&format!("/api/sessions/{code}/requests/waiting"))
        .await;
    assert_eq!(state.body["providerConnected"], false, "{state:?}");
    assert!(state.body["message"].is_string());

    // The call stays queued and runs once the tab comes (its tools are registered already).
    let mut tab = WsTab::attach_url(&system.ws_url(&code, &token)).await;
    let request = tab.next_request().await;
    assert_eq!(request["requestId"], "waiting");
    tab.answer("waiting", json!({"text": "x"})).await;
    let answered = system
        .get(&format!(
            "/api/sessions/{code}/response?requestId=waiting&wait=10"
        ))
        .await;
    assert_eq!(
        answered.body[0]["result"],
        json!({"text": "x"}),
        "{answered:?}"
    );
    let state = system
        .get(&format!("/api/sessions/{code}/requests/waiting"))
        .await;
    assert_eq!(state.body["providerConnected"], true, "{state:?}");
    assert!(state.body.get("message").is_none(), "{state:?}");
    system.stop().await;
}

/// A call asked again with its requestId while the tab's tools are not (or no longer) there —
/// the tab is reconnecting, or registered other tools — is still that call, not an unknown
/// function; another call under the same id is still a conflict.
#[tokio::test]
async fn a_call_asked_again_while_its_tools_are_away_is_still_that_call() {
    let system = System::start().await;
    let (code, token) = system.create_session().await;
    let mut tab = WsTab::attach_url(&system.ws_url(&code, &token)).await;
    tab.register(demo_tools()).await;
    let call = json!({"requestId": "again", "functionName": "echo", "args": {"text": "x"}, "timeoutMs": 1_000});
    let first = system
        .post(&format!("/api/sessions/{code}/request"), call.clone())
        .await;
    assert_eq!(first.status, StatusCode::ACCEPTED, "{first:?}");
    let delivered = tab.next_request().await;
    assert_eq!(delivered["requestId"], "again");
    // The tab now offers other tools: `echo` is gone from the session.
    tab.register(json!([{"name": "other", "description": "Another tool",
        "inputSchema": {"type": "object", "properties": {}}}]))
        .await;
    let unknown = system
        .post(
            &format!("/api/sessions/{code}/call"),
            json!({"functionName": "echo", "args": {"text": "x"}}),
        )
        .await;
    assert_eq!(unknown.body["error"], "unknown_function", "{unknown:?}");
    let again = system
        .post(&format!("/api/sessions/{code}/call"), call.clone())
        .await;
    assert_eq!(again.status, StatusCode::ACCEPTED, "{again:?}");
    assert_eq!(again.body["requestId"], "again", "{again:?}");
    assert_eq!(again.body["status"], "delivered", "{again:?}");
    let other = system
        .post(
            &format!("/api/sessions/{code}/call"),
            json!({"requestId": "again", "functionName": "echo", "args": {"text": "y"}}),
        )
        .await;
    assert_eq!(other.body["error"], "request_id_conflict", "{other:?}");
    // The tab's answer to the call it was given completes it, once.
    tab.answer("again", json!({"text": "x"})).await;
    wait_until(PATIENCE, async || {
        let state = system
            .get(&format!("/api/sessions/{code}/requests/again"))
            .await;
        if state.body["status"] != "completed" {
            return Err(format!("{state:?}"));
        }
        assert_eq!(
            state.body["response"]["result"],
            json!({"text": "x"}),
            "{state:?}"
        );
        Ok(())
    })
    .await;
    system.stop().await;
}

/// Queues calls with these ids and answers each (over polling) with a string of `bytes`.
async fn answered_calls(system: &System, code: &str, token: &str, ids: &[&str], bytes: usize) {
    for id in ids {
        let queued = system
            .post(
                &format!("/api/sessions/{code}/request"),
                json!({"requestId": id, "functionName": "echo", "args": {"text": id}}),
            )
            .await;
        assert_eq!(queued.status, StatusCode::ACCEPTED, "{queued:?}");
    }
    let polled = system
        .get(&format!("/api/sessions/{code}/request?token={token}"))
        .await;
    assert_eq!(polled.body.as_array().unwrap().len(), ids.len());
    for id in ids {
        post_answer(system, code, token, id, json!("x".repeat(bytes))).await;
    }
}

#[tokio::test]
async fn answers_are_read_in_pages_that_fit_what_an_llm_can_take() {
    let system = System::start().await;
    let (code, token) = system.create_session().await;
    system.put_manifest(&code, &token, demo_tools()).await;
    let ids = ["a1", "a2", "a3", "a4", "a5"];
    answered_calls(&system, &code, &token, &ids, 40_000).await;

    // All five are 200,000 characters: the first page stops before 100,000 and says so.
    let first = system
        .http
        .get(system.url(&format!("/api/sessions/{code}/response")))
        .send()
        .await
        .unwrap();
    assert_eq!(first.headers()["x-toolrelay-truncated"], "true");
    let text = first.text().await.unwrap();
    assert!(text.chars().count() < 100_000, "{}", text.len());
    let page: Value = serde_json::from_str(&text).unwrap();
    let page = page.as_array().unwrap();
    assert_eq!(page.len(), 2, "two answers of 40,000 fit");
    let last = &page[1];
    assert_eq!(
        (last["requestId"].as_str(), last["truncated"].as_bool()),
        (Some("a2"), Some(true))
    );
    assert!(
        last["note"].as_str().unwrap().contains("after=a2"),
        "{last}"
    );

    // Reading on with after= and limit=.
    let next = system
        .get(&format!("/api/sessions/{code}/response?after=a2&limit=2"))
        .await;
    let ids_read: Vec<&str> = next
        .body
        .as_array()
        .unwrap()
        .iter()
        .map(|answer| answer["requestId"].as_str().unwrap())
        .collect();
    assert_eq!(ids_read, ["a3", "a4"], "newest last");
    assert!(next.header("x-toolrelay-truncated").is_none());
    let rest = system
        .get(&format!("/api/sessions/{code}/response?after=a4"))
        .await;
    assert_eq!(rest.body[0]["requestId"], "a5");
    system.stop().await;
}

#[tokio::test]
async fn answers_past_the_budget_are_evicted_but_their_calls_never_run_twice() {
    // One session, allowed the whole budget (its share is another test's).
    let relay = RelayConfig {
        response_budget: 300 * 1024,
        response_session_share: 1.0,
        ..RelayConfig::default()
    };
    let system = System::with(relay, |_| {}).await;
    let (code, token) = system.create_session().await;
    system.put_manifest(&code, &token, demo_tools()).await;
    let ids = ["e1", "e2", "e3", "e4", "e5"];
    answered_calls(&system, &code, &token, &ids, 100 * 1024).await;

    let gone = system
        .get(&format!("/api/sessions/{code}/requests/e1"))
        .await;
    gone.assert_refused(StatusCode::GONE, "response_evicted");
    assert_eq!(gone.body["requestId"], "e1");
    // The same call again is not run again.
    let again = system
        .post(
            &format!("/api/sessions/{code}/request"),
            json!({"requestId": "e1", "functionName": "echo", "args": {"text": "e1"}}),
        )
        .await;
    assert_eq!(again.status, StatusCode::GONE, "{again:?}");
    let polled = system
        .get(&format!("/api/sessions/{code}/request?token={token}"))
        .await;
    assert_eq!(polled.body, json!([]), "nothing was queued again");
    let other = system
        .post(
            &format!("/api/sessions/{code}/request"),
            json!({"requestId": "e1", "functionName": "echo", "args": {"text": "else"}}),
        )
        .await;
    assert_eq!(other.status, StatusCode::CONFLICT);
    let kept = system
        .get(&format!("/api/sessions/{code}/requests/e5"))
        .await;
    assert_eq!(kept.body["status"], "completed", "{kept:?}");
    system.stop().await;
}
