//! What a tab gives back besides a JSON result, through the real relay and real clients: MCP
//! content (an image the model can see, reaching an MCP client whole and a REST caller without
//! its data; an SVG refused with a clear error), and news of a running call — progress (to an
//! MCP client that gave a progress token, in order, a lower value dropped; in the call's REST
//! status; POSTed by a tab over HTTP) and log messages (to an MCP client at or above its level).
#![allow(clippy::unwrap_used)] // a test that cannot unwrap should fail loudly
#![allow(deprecated)] // MCP logging, deprecated from 2026-07-28 on, is still in the older revisions

use std::sync::{Arc, Mutex};
use std::time::Duration;

use data_encoding::BASE64;
use reqwest::{Method, StatusCode};
use rmcp::model::{
    CallToolResult, ClientConfig, LoggingMessageNotificationParam, ProgressNotificationParam,
};
use rmcp::service::NotificationContext;
use rmcp::{ClientHandler, RoleClient};
use serde_json::{Value, json};
use toolrelay_tests::mcp::{call, connect_with};
use toolrelay_tests::system::{System, echo_call, paired, send};
use toolrelay_tests::{Deadline, WsTab, wait_until};

/// A 1×1 PNG, as a tab's canvas would give it.
const PNG: &str = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==";

/// An MCP client that keeps the progress and log messages it hears.
#[derive(Clone, Default)]
struct Hearing {
    progress: Arc<Mutex<Vec<ProgressNotificationParam>>>,
    logs: Arc<Mutex<Vec<LoggingMessageNotificationParam>>>,
}

impl ClientHandler for Hearing {
    async fn on_progress(
        &self,
        params: ProgressNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        self.progress.lock().unwrap().push(params);
    }

    async fn on_logging_message(
        &self,
        params: LoggingMessageNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        self.logs.lock().unwrap().push(params);
    }

    fn get_info(&self) -> ClientConfig {
        ClientConfig::default()
    }
}

/// An MCP client of the session's connector URL `/mcp/s/{handle}`.
async fn scoped(system: &System, code: &str) -> rmcp::service::RunningService<RoleClient, Hearing> {
    let mcp = connect_with(ClientConfig::default(), &system.url("/mcp")).await;
    let paired = call(&mcp, "connect_session", json!({"code": code})).await;
    let handle = paired.structured_content.unwrap()["handle"]
        .as_str()
        .unwrap()
        .to_owned();
    mcp.cancel().await.unwrap();
    connect_with(Hearing::default(), &system.url(&format!("/mcp/s/{handle}"))).await
}

fn texts(result: &CallToolResult) -> String {
    result
        .content
        .iter()
        .filter_map(|content| content.as_text().map(|text| text.text.clone()))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Waits, with a deadline, until `condition` holds.
async fn until(what: &'static str, condition: impl Fn() -> bool) {
    let every = Deadline::within(Duration::from_secs(20)).every(Duration::from_millis(20));
    wait_until(every, async || if condition() { Ok(()) } else { Err(what) }).await;
}

/// The tab answers the next call with `frame` (its requestId filled in) and returns what the
/// relay told it up to its acknowledgement (a refusal comes first, as an `error` frame).
async fn answer_next(tab: &mut WsTab, mut frame: Value) -> Vec<Value> {
    let request = tab.next_request().await;
    let id = request["requestId"].as_str().unwrap().to_owned();
    frame["type"] = json!("response");
    frame["requestId"] = json!(id);
    tab.send(frame).await;
    let mut told = Vec::new();
    loop {
        let reply = tab.next_any_frame().await.expect("the relay acknowledges");
        let acknowledged = reply["type"] == "ack" && reply["requestId"] == id.as_str();
        told.push(reply);
        if acknowledged {
            return told;
        }
    }
}

/// The error messages among what the tab was told (an `error` frame, or an `ack` refusing).
fn errors(told: &[Value]) -> Vec<String> {
    told.iter()
        .filter(|frame| frame["type"] == "error" || frame.get("error").is_some())
        .map(|frame| frame["message"].as_str().unwrap_or_default().to_owned())
        .collect()
}

#[tokio::test]
async fn an_image_reaches_an_mcp_client_whole_and_a_rest_caller_without_its_data() {
    let system = System::start().await;
    let (code, _token, mut tab) = paired(&system).await;
    let client = scoped(&system, &code).await;
    let content = json!([
        {"type": "image", "data": PNG, "mimeType": "image/png"},
        {"type": "text", "text": "A scatter plot of height against age, 31 points."}
    ]);

    let calling = call(&client, "echo", json!({"text": "graph"}));
    let answering = answer_next(
        &mut tab,
        json!({"success": true, "content": content, "structuredContent": {"points": 31}}),
    );
    let (result, told) = tokio::join!(calling, answering);
    assert!(errors(&told).is_empty(), "{told:?}");
    assert_eq!(result.is_error, Some(false), "{result:?}");
    let shown = serde_json::to_value(&result.content).unwrap();
    assert_eq!(shown[0]["type"], "image", "{shown}");
    assert_eq!(shown[0]["data"], PNG, "the image arrives whole");
    assert_eq!(shown[0]["mimeType"], "image/png");
    assert_eq!(
        shown[1]["text"],
        "A scatter plot of height against age, 31 points."
    );
    assert_eq!(result.structured_content, Some(json!({"points": 31})));

    // Over REST (a GPT Action reads text only): the same items, the image's data left out.
    let rest = send(
        system
            .request(Method::POST, &format!("/api/sessions/{code}/call"))
            .json(&echo_call("graph")),
    );
    let answering = answer_next(&mut tab, json!({"content": content}));
    let (rest, _) = tokio::join!(rest, answering);
    assert_eq!(rest.status, StatusCode::OK, "{rest:?}");
    let image = &rest.body["content"][0];
    let bytes = BASE64.decode(PNG.as_bytes()).unwrap().len();
    assert_eq!(image["type"], "image", "{rest:?}");
    assert_eq!(image["mimeType"], "image/png");
    assert_eq!(image["bytes"], bytes);
    assert!(
        image.get("data").is_none(),
        "no base64 in a text answer: {image}"
    );
    assert!(image["omitted"].as_str().unwrap().contains("MCP client"));
    assert_eq!(rest.body["content"][1]["type"], "text");

    // An SVG: the tab is told why, the caller gets a clear failure naming the item.
    let svg = BASE64.encode(b"<svg xmlns='http://www.w3.org/2000/svg'/>");
    let calling = call(&client, "echo", json!({"text": "svg"}));
    let answering = answer_next(
        &mut tab,
        json!({"content": [{"type": "text", "text": "ok"}, {"type": "image", "data": svg, "mimeType": "image/svg+xml"}]}),
    );
    let (refused, told) = tokio::join!(calling, answering);
    let heard = errors(&told);
    assert!(
        heard
            .iter()
            .any(|message| message.contains("content[1] was refused: SVG")),
        "the tab hears why: {told:?}"
    );
    assert_eq!(refused.is_error, Some(true), "{refused:?}");
    let said = texts(&refused);
    assert!(
        said.contains("content[1] was refused: SVG images are not accepted"),
        "{said}"
    );

    // An image past the tab's 1 MB answer limit: refused whole, the caller told to ask for less.
    let mut big = b"\x89PNG\r\n\x1a\n".to_vec();
    big.resize(790_000, 0);
    let calling = call(&client, "echo", json!({"text": "big"}));
    let answering = answer_next(
        &mut tab,
        json!({"content": [{"type": "image", "data": BASE64.encode(&big), "mimeType": "image/png"}]}),
    );
    let (refused, told) = tokio::join!(calling, answering);
    assert!(
        errors(&told)
            .iter()
            .any(|message| message.contains("over the limit")),
        "{told:?}"
    );
    assert_eq!(refused.is_error, Some(true), "{refused:?}");
    assert!(texts(&refused).contains("a smaller image"), "{refused:?}");

    // An unknown kind of item, and bad base64.
    for (item, words) in [
        (
            json!({"type": "video", "data": PNG}),
            "\"video\" is not one the relay carries",
        ),
        (
            json!({"type": "image", "data": "not base64!", "mimeType": "image/png"}),
            "is not base64",
        ),
    ] {
        let calling = call(&client, "echo", json!({"text": "bad"}));
        let answering = answer_next(&mut tab, json!({"content": [item]}));
        let (refused, _) = tokio::join!(calling, answering);
        assert_eq!(refused.is_error, Some(true), "{refused:?}");
        assert!(texts(&refused).contains(words), "{refused:?}");
    }
    client.cancel().await.unwrap();
    system.stop().await;
}

#[tokio::test]
async fn a_tabs_progress_and_logs_reach_the_caller_in_order() {
    let system = System::start().await;
    let (code, token, mut tab) = paired(&system).await;
    let client = scoped(&system, &code).await;
    let hearing = client.service().clone();

    let calling = call(&client, "echo", json!({"text": "long"}));
    let working = async {
        let request = tab.next_request().await;
        let id = request["requestId"].as_str().unwrap().to_owned();
        let progress = |value: f64| json!({"type": "progress", "requestId": id, "progress": value, "total": 100, "message": format!("{value} of 100")});
        tab.send(progress(10.0)).await;
        until("the first progress", || {
            hearing.progress.lock().unwrap().len() == 1
        })
        .await;
        // Lower: dropped. Then a flood, merged: at most 4 a second, the last kept.
        tab.send(progress(5.0)).await;
        for value in 11..=60 {
            tab.send(progress(f64::from(value))).await;
        }
        until("the flood's last value", || {
            hearing.progress.lock().unwrap().last().map(|p| p.progress) == Some(60.0)
        })
        .await;
        tab.send(json!({"type": "log", "level": "info", "data": {"read": 3}, "logger": "codap", "requestId": id}))
            .await;
        tab.send(json!({"type": "log", "level": "debug", "data": "below the level"}))
            .await;
        until("the log message", || {
            !hearing.logs.lock().unwrap().is_empty()
        })
        .await;
        tab.answer(&id, json!("done")).await;
    };
    let (result, ()) = tokio::join!(calling, working);
    assert_eq!(result.structured_content, Some(json!({"result": "done"})));
    let heard: Vec<f64> = hearing
        .progress
        .lock()
        .unwrap()
        .iter()
        .map(|p| p.progress)
        .collect();
    assert_eq!(heard.first(), Some(&10.0), "{heard:?}");
    assert!(
        heard.windows(2).all(|pair| pair[0] < pair[1]),
        "increasing: {heard:?}"
    );
    assert!(!heard.contains(&5.0), "a lower value is dropped: {heard:?}");
    assert!(heard.len() < 10, "a flood of 50 is merged: {heard:?}");
    let first = hearing.progress.lock().unwrap()[0].clone();
    assert_eq!(
        (first.total, first.message.as_deref()),
        (Some(100.0), Some("10 of 100"))
    );
    let logs = hearing.logs.lock().unwrap().clone();
    assert_eq!(logs.len(), 1, "debug is below the default level: {logs:?}");
    assert_eq!(logs[0].data, json!({"read": 3}));
    assert_eq!(logs[0].logger.as_deref(), Some("codap"));

    // REST: the call's status shows the last progress; a tab over HTTP posts its progress.
    let queued = send(
        system
            .request(Method::POST, &format!("/api/sessions/{code}/request"))
            .json(&echo_call("queued")),
    )
    .await;
    let id = queued.body["requestId"].as_str().unwrap().to_owned();
    let request = tab.next_request().await;
    assert_eq!(request["requestId"], id.as_str());
    let posted = |value: f64| {
        system
            .request(Method::POST, &format!("/api/sessions/{code}/response"))
            .bearer_auth(&token)
            .json(
                &json!({"type": "progress", "requestId": id, "progress": value, "message": "half"}),
            )
    };
    let told = send(posted(50.0)).await;
    assert_eq!(told.status, StatusCode::OK, "{told:?}");
    assert_eq!(told.body["accepted"], true, "{told:?}");
    let lower = send(posted(40.0)).await;
    assert_eq!(
        lower.body["accepted"], false,
        "a lower value is dropped: {lower:?}"
    );
    let status =
        send(system.request(Method::GET, &format!("/api/sessions/{code}/requests/{id}"))).await;
    assert_eq!(status.body["status"], "delivered", "{status:?}");
    assert_eq!(status.body["progress"]["progress"], 50.0, "{status:?}");
    assert_eq!(status.body["progress"]["message"], "half");
    assert!(
        status.body["progress"]["at"]
            .as_str()
            .unwrap()
            .ends_with('Z')
    );
    tab.answer(&id, json!("done")).await;
    let bad = send(
        system
            .request(Method::POST, &format!("/api/sessions/{code}/response"))
            .bearer_auth(&token)
            .json(&json!({"type": "log", "requestId": id, "level": "loud", "data": 1})),
    )
    .await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST, "{bad:?}");
    assert!(
        bad.body["message"].as_str().unwrap().contains("level"),
        "{bad:?}"
    );
    client.cancel().await.unwrap();
    system.stop().await;
}

/// A 2026-07-28 `tools/call` to `url` (no session), with `meta` added to its `_meta`; the
/// response body as sent (an event stream: the notifications, then the answer).
async fn sessionless_call(url: &str, meta: Value) -> String {
    let mut params = json!({"name": "echo", "arguments": {"text": "news"}});
    let mut all = json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {},
        "io.modelcontextprotocol/clientInfo": {"name": "toolrelay-test", "version": "1.0.0"},
    });
    all.as_object_mut()
        .unwrap()
        .extend(meta.as_object().unwrap().clone());
    params["_meta"] = all;
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params});
    let response = reqwest::Client::new()
        .post(url)
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", "tools/call")
        .header("mcp-name", "echo")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    response.text().await.unwrap()
}

/// Only a client that asked hears a call's news: with a `progressToken` its progress, with a
/// log level (2026-07-28 names it per request) the log messages at or above it; a request that
/// asks for neither hears neither.
#[tokio::test]
async fn a_client_hears_progress_and_logs_only_when_it_asks() {
    let system = System::start().await;
    let (code, _token, mut tab) = paired(&system).await;
    let mcp = connect_with(ClientConfig::default(), &system.url("/mcp")).await;
    let paired = call(&mcp, "connect_session", json!({"code": code})).await;
    let handle = paired.structured_content.unwrap()["handle"]
        .as_str()
        .unwrap()
        .to_owned();
    let url = system.url(&format!("/mcp/s/{handle}"));
    let asks = [
        (
            json!({"progressToken": "p1", "io.modelcontextprotocol/logLevel": "info"}),
            true,
        ),
        (json!({}), false),
    ];
    for (meta, asked) in asks {
        let calling = sessionless_call(&url, meta);
        let working = async {
            let request = tab.next_request().await;
            let id = request["requestId"].as_str().unwrap().to_owned();
            tab.send(json!({"type": "progress", "requestId": id, "progress": 1, "total": 2}))
                .await;
            tab.send(json!({"type": "log", "level": "notice", "data": "halfway", "requestId": id}))
                .await;
            tab.answer_stored(&id, json!("done")).await;
        };
        let (body, ()) = tokio::join!(calling, working);
        assert_eq!(body.contains("notifications/progress"), asked, "{body}");
        assert_eq!(body.contains("notifications/message"), asked, "{body}");
        if asked {
            let progress = body.find("notifications/progress").unwrap();
            let answer = body.find("\"result\"").unwrap();
            assert!(
                progress < answer,
                "the news comes before the answer: {body}"
            );
            assert!(body.contains("\"progressToken\":\"p1\""), "{body}");
            assert!(body.contains("halfway"), "{body}");
        }
    }
    mcp.cancel().await.unwrap();
    system.stop().await;
}

/// A tab whose first report comes after the relay reported the seconds waited: its values
/// count on from those seconds, so the client still hears them (one token counts up once).
#[tokio::test]
async fn a_tabs_late_progress_counts_on_from_the_seconds_the_relay_reported() {
    let system = System::start().await;
    let (code, _token, mut tab) = paired(&system).await;
    let client = scoped(&system, &code).await;
    let hearing = client.service().clone();
    let calling = call(&client, "echo", json!({"text": "slow"}));
    let working = async {
        let request = tab.next_request().await;
        let id = request["requestId"].as_str().unwrap().to_owned();
        until("the relay's own progress", || {
            !hearing.progress.lock().unwrap().is_empty()
        })
        .await;
        let waited = hearing.progress.lock().unwrap()[0].progress;
        tab.send(json!({"type": "progress", "requestId": id, "progress": 0.5, "total": 1, "message": "half"}))
            .await;
        until("the tab's progress", || {
            hearing.progress.lock().unwrap().len() >= 2
        })
        .await;
        tab.answer(&id, json!("done")).await;
        waited
    };
    let (result, waited) = tokio::join!(calling, working);
    assert_eq!(result.is_error, Some(false), "{result:?}");
    let heard = hearing.progress.lock().unwrap().clone();
    let tabs = heard
        .iter()
        .find(|p| p.message.as_deref() == Some("half"))
        .unwrap();
    assert_eq!(
        (tabs.progress, tabs.total),
        (waited + 0.5, Some(waited + 1.0)),
        "{heard:?}"
    );
    client.cancel().await.unwrap();
    system.stop().await;
}

/// A backend provider over gRPC reports progress and a log message on its `Connect` stream,
/// and answers with content: the MCP client hears and gets them as from a tab.
#[tokio::test]
async fn a_grpc_providers_progress_logs_and_content_reach_an_mcp_client() {
    use toolrelay::proto::v1::{self as pb, provider_message::Kind};
    let system = System::start().await;
    let (code, token) = system.create_session().await;
    let mut provider = toolrelay_tests::GrpcProvider::attach(
        system.grpc,
        &code,
        &token,
        &toolrelay_tests::demo_tools(),
    )
    .await;
    let client = scoped(&system, &code).await;
    let hearing = client.service().clone();
    let calling = call(&client, "echo", json!({"text": "backend"}));
    let working = async {
        let request = provider.next_request().await;
        let id = request.request_id.clone();
        provider
            .send(Kind::Progress(pb::Progress {
                request_id: id.clone(),
                progress: 3.0,
                total: Some(4.0),
                message: "three of four".into(),
            }))
            .await;
        provider
            .send(Kind::Log(pb::Log {
                request_id: id.clone(),
                level: "error".into(),
                data: Some(toolrelay::json::to_value(&json!({"disk": "full"}))),
                logger: "backend".into(),
            }))
            .await;
        until("the provider's progress", || {
            !hearing.progress.lock().unwrap().is_empty()
        })
        .await;
        let text = toolrelay::json::to_value(&json!({"type": "text", "text": "from the backend"}));
        provider
            .send(Kind::Response(pb::ToolResponse {
                request_id: id,
                success: true,
                content: vec![text],
                ..Default::default()
            }))
            .await;
    };
    let (result, ()) = tokio::join!(calling, working);
    assert_eq!(texts(&result), "from the backend", "{result:?}");
    let progress = hearing.progress.lock().unwrap()[0].clone();
    assert_eq!((progress.progress, progress.total), (3.0, Some(4.0)));
    assert_eq!(progress.message.as_deref(), Some("three of four"));
    let logs = hearing.logs.lock().unwrap().clone();
    assert_eq!(logs.len(), 1, "{logs:?}");
    assert_eq!(logs[0].data, json!({"disk": "full"}));
    client.cancel().await.unwrap();
    system.stop().await;
}
