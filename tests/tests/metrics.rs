//! `/metrics` on every binary, read the way Prometheus reads it (the Prometheus project's own
//! parser): after a scripted run it shows exactly what happened, with no code, handle or
//! token among its labels. The standalone relay's WebSocket port answers the probes and the
//! scrape itself, and still takes WebSockets.
#![allow(clippy::unwrap_used)] // a test that cannot unwrap should fail loudly

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};
use toolrelay::json::to_struct;
use toolrelay::proto::v1::{CallRequest, CreateSessionRequest, RequestStatus};
use toolrelay_relay::config::{ENV_DRAIN_SECONDS, ENV_RATE_LIMIT_SESSION, ENV_REDIS_URL};
use toolrelay_tests::metrics::Scrape;
use toolrelay_tests::redis::RedisServer;
use toolrelay_tests::system::System;
use toolrelay_tests::{Deadline, PATIENCE, WsTab, demo_tools, relay_client, wait_until};

/// What `/metrics` answers with: the Prometheus text format.
const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// A PuLP model small enough to solve at once.
const MODEL: &str = r#"
import pulp
prob = pulp.LpProblem("tiny", pulp.LpMaximize)
x = pulp.LpVariable("x", 0, 4, cat="Integer")
prob += 3 * x
prob += x <= 3
"#;

fn echo(text: &str) -> Value {
    json!({"functionName": "echo", "args": {"text": text}})
}

/// Waits (with a deadline) until the page at `url` has the line `line`: a call's answer
/// reaches its caller as the relay counts it, so the count may trail the answer a moment.
async fn until_line(http: &reqwest::Client, url: &str, line: &str) {
    wait_until(PATIENCE, async || {
        let text = http.get(url).send().await.unwrap().text().await.unwrap();
        if text.lines().any(|l| l == line) {
            Ok(())
        } else {
            Err(format!("{line} never showed in\n{text}"))
        }
    })
    .await;
}

/// Waits (with a deadline) until `GET url` answers `status`.
async fn until_status(http: &reqwest::Client, url: &str, status: StatusCode) {
    let every = Deadline::within(Duration::from_secs(20)).every(Duration::from_millis(50));
    wait_until(every, async || {
        let answered = http.get(url).send().await.unwrap().status();
        if answered == status {
            Ok(())
        } else {
            Err(format!("{url} stayed {answered}, never {status}"))
        }
    })
    .await;
}

/// One session's secrets, as created over HTTP.
struct Created {
    code: String,
    token: String,
    handle: String,
}

async fn create(system: &System) -> Created {
    let created = system.post("/api/sessions", json!({})).await;
    assert_eq!(created.status, StatusCode::CREATED, "{created:?}");
    let text = |field: &str| created.body[field].as_str().unwrap().to_owned();
    Created {
        code: text("code"),
        token: text("providerToken"),
        handle: text("connectorUrl").rsplit('/').next().unwrap().to_owned(),
    }
}

/// 3 sessions, 5 calls answered by a WebSocket tab, 1 request refused by a rate limit, one
/// MIP model generated and solved: the one-process server's `/metrics` shows exactly that.
#[tokio::test]
async fn a_scripted_run_shows_exactly_its_counts() {
    let system = System::binary(&[(ENV_RATE_LIMIT_SESSION, "3")]).await;
    let mut sessions = Vec::new();
    for _ in 0..3 {
        sessions.push(create(&system).await);
    }
    let refused = system.post("/api/sessions", json!({})).await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS, "{refused:?}");

    let paired = &sessions[0];
    let mut tab = WsTab::attach_url(&system.ws_url(&paired.code, &paired.token)).await;
    tab.register(demo_tools()).await;
    for n in 0..5 {
        let text = format!("call {n}");
        let llm = system.post(&format!("/api/sessions/{}/call", paired.code), echo(&text));
        let tab_side = async {
            let request = tab.next_request().await;
            tab.answer(request["requestId"].as_str().unwrap(), json!(text))
                .await;
        };
        let (answer, ()) = tokio::join!(llm, tab_side);
        assert_eq!(answer.status, StatusCode::OK, "{answer:?}");
    }

    let generated = system
        .post(
            "/api/tools/generate_mip_problem?scope=metrics",
            json!({"problemDefinitionCode": MODEL}),
        )
        .await;
    assert_eq!(generated.body["success"], true, "{generated:?}");
    let solved = system
        .post(
            "/api/tools/solve_mip_problem?scope=metrics",
            json!({"problemId": generated.body["result"]["problemId"]}),
        )
        .await;
    assert_eq!(solved.body["result"]["status"], "optimal", "{solved:?}");

    // Paths that carry secrets are labelled with their template, or `other`.
    system.get(&format!("/mcp/s/{}", sessions[1].handle)).await;
    system.get(&format!("/secrets/{}", sessions[2].token)).await;

    let url = system.url("/metrics");
    until_line(
        &system.http,
        &url,
        r#"toolrelay_calls_total{status="completed",transport="websocket"} 5"#,
    )
    .await;
    let page = Scrape::fetch(&system.http, &url).await;
    assert_eq!(page.content_type, CONTENT_TYPE);
    for (family, kind) in [
        ("toolrelay_build_info", "gauge"),
        ("toolrelay_sessions_created", "counter"),
        ("toolrelay_sessions_active", "gauge"),
        ("toolrelay_calls", "counter"),
        ("toolrelay_http_request_duration_seconds", "histogram"),
        ("toolrelay_store_operation_duration_seconds", "histogram"),
        ("toolrelay_mip_run_duration_seconds", "histogram"),
    ] {
        assert_eq!(
            page.families.get(family).map(String::as_str),
            Some(kind),
            "{family}"
        );
    }
    let value = |name: &str, labels: &[(&str, &str)]| page.value(name, labels);
    assert_eq!(
        value(
            "toolrelay_build_info",
            &[
                ("version", env!("CARGO_PKG_VERSION")),
                ("binary", "toolrelay")
            ]
        ),
        1.0
    );
    assert_eq!(value("toolrelay_sessions_created_total", &[]), 3.0);
    assert_eq!(value("toolrelay_sessions_active", &[]), 3.0);
    assert_eq!(value("toolrelay_sessions_expired_total", &[]), 0.0);
    let completed = [("status", "completed"), ("transport", "websocket")];
    assert_eq!(value("toolrelay_calls_total", &completed), 5.0);
    assert_eq!(page.sum("toolrelay_calls_total", &[]), 5.0, "no other call");
    assert_eq!(value("toolrelay_queue_depth", &[]), 0.0);
    let websocket = [("transport", "websocket")];
    assert_eq!(value("toolrelay_providers_connected", &websocket), 1.0);
    assert_eq!(
        value("toolrelay_rate_limited_total", &[("limit", "sessions")]),
        1.0
    );
    assert_eq!(page.sum("toolrelay_rate_limited_total", &[]), 1.0);
    let solve_ok = [("tool", "solve"), ("outcome", "ok")];
    assert_eq!(value("toolrelay_mip_runs_total", &solve_ok), 1.0);
    let generate_ok = [("tool", "generate"), ("outcome", "ok")];
    assert_eq!(value("toolrelay_mip_runs_total", &generate_ok), 1.0);
    assert_eq!(page.sum("toolrelay_mip_runs_total", &[]), 2.0);
    assert_eq!(
        value(
            "toolrelay_mip_run_duration_seconds_count",
            &[("tool", "solve")]
        ),
        1.0
    );
    let sessions_route = [("route", "/api/sessions"), ("method", "POST")];
    assert_eq!(
        value(
            "toolrelay_http_requests_total",
            &[sessions_route[0], sessions_route[1], ("status", "201")]
        ),
        3.0
    );
    assert_eq!(
        value(
            "toolrelay_http_requests_total",
            &[sessions_route[0], sessions_route[1], ("status", "429")]
        ),
        1.0
    );
    assert_eq!(
        value(
            "toolrelay_http_errors_total",
            &[("route", "/api/sessions"), ("error", "rate_limited")]
        ),
        1.0
    );
    let call_route = [("route", "/api/sessions/{code}/call"), ("method", "POST")];
    assert_eq!(
        value(
            "toolrelay_http_requests_total",
            &[call_route[0], call_route[1], ("status", "200")]
        ),
        5.0
    );
    assert_eq!(
        value("toolrelay_http_request_duration_seconds_count", &call_route),
        5.0
    );
    assert_eq!(
        value(
            "toolrelay_http_request_duration_seconds_bucket",
            &[call_route[0], call_route[1], ("le", "+Inf")]
        ),
        5.0
    );
    assert_eq!(
        page.sum(
            "toolrelay_http_requests_total",
            &[("route", "/mcp/s/{handle}")]
        ),
        1.0
    );
    assert!(page.sum("toolrelay_http_requests_total", &[("route", "other")]) >= 1.0);
    assert!(value("toolrelay_answer_bytes", &[]) > 0.0);
    assert_eq!(
        value("toolrelay_answer_budget_bytes", &[]),
        64.0 * 1024.0 * 1024.0
    );
    assert_eq!(value("toolrelay_store_up", &[]), 1.0);
    assert_eq!(value("toolrelay_draining", &[]), 0.0);
    assert!(
        page.sum(
            "toolrelay_store_operation_duration_seconds_count",
            &[("operation", "enqueue_checked")]
        ) >= 5.0
    );

    // No label value is, or contains, a code, a handle or a token.
    for session in &sessions {
        let raw_code = session.code.replace('-', "");
        for secret in [&session.code, &raw_code, &session.token, &session.handle] {
            assert!(
                !page.text.contains(secret.as_str()),
                "{secret} is on the page:\n{}",
                page.text
            );
            assert!(
                page.label_values()
                    .all(|value| !value.contains(secret.as_str()))
            );
        }
    }
    tab.close().await;
}

/// The split binaries each serve their own `/metrics`; the relay's is on its WebSocket port,
/// with `/healthz` and `/readyz`, and tabs still attach there.
#[tokio::test]
async fn the_split_relay_answers_probes_and_scrapes_on_its_websocket_port() {
    let system = System::split().await;
    let relay = format!("http://{}", system.relay_ws.unwrap());
    let health = system
        .http
        .get(format!("{relay}/healthz"))
        .send()
        .await
        .unwrap();
    assert_eq!(health.status(), StatusCode::OK);
    assert_eq!(health.text().await.unwrap(), "ok");
    let ready = system
        .http
        .get(format!("{relay}/readyz"))
        .send()
        .await
        .unwrap();
    assert_eq!(ready.status(), StatusCode::OK);
    // Other paths are still the WebSocket's: not found.
    let other = system
        .http
        .get(format!("{relay}/nope"))
        .send()
        .await
        .unwrap();
    assert_eq!(other.status(), StatusCode::NOT_FOUND);

    let (code, token) = system.create_session().await;
    let ws = format!(
        "ws://{}/api/sessions/{code}/ws?token={token}",
        system.relay_ws.unwrap()
    );
    let mut tab = WsTab::attach_url(&ws).await;
    tab.register(demo_tools()).await;
    let llm = system.post(&format!("/api/sessions/{code}/call"), echo("split"));
    let tab_side = async {
        let request = tab.next_request().await;
        tab.answer(request["requestId"].as_str().unwrap(), json!("split"))
            .await;
    };
    let (answer, ()) = tokio::join!(llm, tab_side);
    assert_eq!(answer.status, StatusCode::OK, "{answer:?}");

    let url = format!("{relay}/metrics");
    until_line(
        &system.http,
        &url,
        r#"toolrelay_calls_total{status="completed",transport="websocket"} 1"#,
    )
    .await;
    let relay_page = Scrape::fetch(&system.http, &url).await;
    assert_eq!(relay_page.content_type, CONTENT_TYPE);
    let binary = |name| [("version", env!("CARGO_PKG_VERSION")), ("binary", name)];
    assert_eq!(
        relay_page.value("toolrelay_build_info", &binary("toolrelay-relay")),
        1.0
    );
    assert_eq!(
        relay_page.value("toolrelay_sessions_created_total", &[]),
        1.0
    );
    assert_eq!(
        relay_page.value(
            "toolrelay_providers_connected",
            &[("transport", "websocket")]
        ),
        1.0
    );

    // The gateway's page is its own: its requests, none of the relay's sessions.
    let gateway_page = Scrape::fetch(&system.http, &system.url("/metrics")).await;
    assert_eq!(
        gateway_page.value("toolrelay_build_info", &binary("toolrelay-gateway")),
        1.0
    );
    assert_eq!(
        gateway_page.value(
            "toolrelay_http_requests_total",
            &[
                ("route", "/api/sessions/{code}/call"),
                ("method", "POST"),
                ("status", "200")
            ]
        ),
        1.0
    );
    assert_eq!(
        gateway_page.value("toolrelay_sessions_created_total", &[]),
        0.0
    );
    tab.close().await;
}

/// While the relay drains, `/readyz` on its WebSocket port is 503 (and `/metrics` says it
/// drains) but `/healthz` stays 200; the drain ends when the tab answers.
#[tokio::test]
async fn the_relay_port_is_not_ready_while_draining() {
    let mut relay = System::relay_binary(&[(ENV_DRAIN_SECONDS, "30")]).await;
    let mut client = relay_client(relay.grpc).await;
    let session = client
        .create_session(CreateSessionRequest {})
        .await
        .unwrap()
        .into_inner();
    let ws = format!(
        "ws://{}/api/sessions/{}/ws?token={}",
        relay.relay_ws.unwrap(),
        session.code,
        session.provider_token
    );
    let mut tab = WsTab::attach_url(&ws).await;
    tab.register(demo_tools()).await;
    let call = tokio::spawn(async move {
        client
            .call(CallRequest {
                code: session.code.clone(),
                function_name: "echo".into(),
                args: Some(to_struct(&json!({"text": "held"}))),
                timeout_ms: 30_000,
                ..CallRequest::default()
            })
            .await
    });
    // Delivered and not answered: it holds the drain open.
    let request = tab.next_request().await;
    relay.terminate().await;
    until_status(
        &relay.http,
        &relay.url("/readyz"),
        StatusCode::SERVICE_UNAVAILABLE,
    )
    .await;
    assert_eq!(relay.get("/healthz").await.status, StatusCode::OK);
    until_line(&relay.http, &relay.url("/metrics"), "toolrelay_draining 1").await;

    tab.answer(request["requestId"].as_str().unwrap(), json!("held"))
        .await;
    let answered = call.await.unwrap().unwrap().into_inner();
    assert_eq!(answered.status(), RequestStatus::Completed, "{answered:?}");
    assert!(relay.exited().await.success());
}

/// A relay whose Redis is down is not ready, and says so in `toolrelay_store_up`; it is ready
/// again once Redis is back, without a restart.
#[tokio::test]
async fn the_relay_port_is_not_ready_while_its_redis_is_down() {
    let mut redis = RedisServer::start().await;
    let relay = System::relay_binary(&[(ENV_REDIS_URL, &redis.url())]).await;
    let ready = relay.url("/readyz");
    until_status(&relay.http, &ready, StatusCode::OK).await;
    redis.stop().await;
    until_status(&relay.http, &ready, StatusCode::SERVICE_UNAVAILABLE).await;
    assert_eq!(relay.get("/healthz").await.status, StatusCode::OK);
    until_line(&relay.http, &relay.url("/metrics"), "toolrelay_store_up 0").await;
    redis.restart().await;
    until_status(&relay.http, &ready, StatusCode::OK).await;
    until_line(&relay.http, &relay.url("/metrics"), "toolrelay_store_up 1").await;
}
