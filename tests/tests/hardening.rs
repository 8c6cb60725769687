//! Defects found under attack, each shown fixed over real sockets: deep JSON refused where it
//! enters with a clear error (and never a redelivery loop), hostile schemas that cannot stall
//! the relay, answers a tab may not give, and status codes and closes that tell clients the
//! truth. The listeners' own defences (host names, connection caps and timeouts):
//! `hardening_listeners.rs`.
#![allow(clippy::unwrap_used)] // a test that cannot unwrap should fail loudly

use std::time::{Duration, Instant};

use futures::SinkExt;
use reqwest::StatusCode;
use serde_json::{Map, Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_tungstenite::tungstenite::Message;
use toolrelay_tests::system::{Answer, System, paired};
use toolrelay_tests::{PATIENCE, demo_tools, wait_until};

/// `{"a": {"a": … 1}}`: `levels` nested objects.
fn nested(levels: usize) -> Value {
    let mut value = json!(1);
    for _ in 0..levels {
        value = json!({"a": value});
    }
    value
}

/// An echo call whose arguments nest `levels` deep (the arguments object counts as one).
fn deep_echo(levels: usize) -> Value {
    json!({"functionName": "echo", "args": {"text": "deep", "extra": nested(levels - 1)}, "timeoutMs": 10_000})
}

fn assert_error(answer: &Answer, status: StatusCode, name: &str) {
    assert_eq!(answer.status, status, "{answer:?}");
    assert_eq!(answer.body["error"], name, "{answer:?}");
}

async fn deep_json_is_refused_where_it_enters(system: System) {
    let (code, _token, mut tab) = paired(&system).await;
    let call = format!("/api/sessions/{code}/call");

    // Arguments: 32 levels pass, 33 and far more are refused with a clear 400.
    let ok = system.post(&call, deep_echo(32));
    let tab_side = async {
        let request = tab.next_request().await;
        tab.answer(request["requestId"].as_str().unwrap(), json!({"ok": true}))
            .await;
    };
    let (ok, ()) = tokio::join!(ok, tab_side);
    assert_eq!(ok.status, StatusCode::OK, "{ok:?}");
    for levels in [33, 60, 200] {
        let refused = system.post(&call, deep_echo(levels)).await;
        assert_error(&refused, StatusCode::BAD_REQUEST, "nested_too_deeply");
        assert!(
            refused.body["message"].as_str().unwrap().contains("levels"),
            "{refused:?}"
        );
    }

    // A tab's answer nested too deeply: the tab gets an error frame and keeps its connection,
    // the caller a failed answer at once, and nothing is delivered again.
    for levels in [50, 300] {
        let calling = system.post(
            &call,
            json!({"functionName": "echo", "args": {"text": "x"}}),
        );
        let tab_side = async {
            let request = tab.next_request().await;
            let id = request["requestId"].as_str().unwrap().to_owned();
            tab.send(json!({"type": "response", "requestId": id, "success": true, "result": nested(levels)}))
                .await;
            let frame = tab.recv().await;
            assert_eq!(frame["type"], "error", "{frame}");
            assert_eq!(frame["error"], "nested_too_deeply", "{frame}");
        };
        let (answer, ()) = tokio::join!(calling, tab_side);
        assert_eq!(answer.status, StatusCode::OK, "{answer:?}");
        assert_eq!(answer.body["success"], false, "{answer:?}");
        assert_eq!(
            answer.body["error"]["code"], "nested_too_deeply",
            "{answer:?}"
        );
    }
    // The same connection still serves calls.
    let calling = system.post(
        &call,
        json!({"functionName": "echo", "args": {"text": "after"}}),
    );
    let tab_side = async {
        let request = tab.next_request().await;
        tab.answer(
            request["requestId"].as_str().unwrap(),
            json!({"text": "after"}),
        )
        .await;
    };
    let (answer, ()) = tokio::join!(calling, tab_side);
    assert_eq!(
        answer.body["result"],
        json!({"text": "after"}),
        "{answer:?}"
    );
    system.stop().await;
}

#[tokio::test]
async fn deep_json_is_refused_where_it_enters_in_one_process() {
    deep_json_is_refused_where_it_enters(System::start().await).await;
}

#[tokio::test]
async fn deep_json_is_refused_where_it_enters_in_split_mode() {
    deep_json_is_refused_where_it_enters(System::split().await).await;
}

async fn an_answer_posted_too_deep_or_too_large_fails_the_call_with_the_reason(system: System) {
    let (code, token) = system.create_session().await;
    system.put_manifest(&code, &token, demo_tools()).await;
    let respond = format!("/api/sessions/{code}/response?token={token}");
    let cases = [
        (
            json!({"requestId": "deep", "success": true, "result": nested(40)}),
            StatusCode::BAD_REQUEST,
            "nested_too_deeply",
        ),
        (
            // Deeper than protobuf decodes: in split mode it must never reach the relay as is.
            json!({"requestId": "deeper", "success": true, "result": nested(100)}),
            StatusCode::BAD_REQUEST,
            "nested_too_deeply",
        ),
        (
            // Just over the 1 MB an answer may have, within the body limit.
            json!({"requestId": "big", "success": true, "result": "x".repeat(1024 * 1024 + 10)}),
            StatusCode::PAYLOAD_TOO_LARGE,
            "response_too_large",
        ),
    ];
    for (answer, status, name) in cases {
        let id = answer["requestId"].as_str().unwrap().to_owned();
        let queued = system
            .post(
                &format!("/api/sessions/{code}/request"),
                json!({"requestId": id, "functionName": "echo", "args": {"text": "x"}}),
            )
            .await;
        assert_eq!(queued.status, StatusCode::ACCEPTED);
        let polled = system
            .get(&format!("/api/sessions/{code}/request?token={token}"))
            .await;
        assert_eq!(polled.body[0]["requestId"], id.as_str());
        let refused = system.post(&respond, answer).await;
        assert_error(&refused, status, name);
        let state = system
            .get(&format!("/api/sessions/{code}/requests/{id}"))
            .await;
        assert_eq!(state.body["status"], "failed", "{state:?}");
        assert_eq!(state.body["response"]["error"]["code"], name, "{state:?}");
    }
    system.stop().await;
}

#[tokio::test]
async fn an_answer_posted_too_deep_or_too_large_fails_the_call_in_one_process() {
    an_answer_posted_too_deep_or_too_large_fails_the_call_with_the_reason(System::start().await)
        .await;
}

#[tokio::test]
async fn an_answer_posted_too_deep_or_too_large_fails_the_call_in_split_mode() {
    an_answer_posted_too_deep_or_too_large_fails_the_call_with_the_reason(System::split().await)
        .await;
}

#[tokio::test]
async fn a_websocket_frame_over_the_limit_is_closed_with_1009() {
    let system = System::start().await;
    let (code, token) = system.create_session().await;
    let (mut socket, _) = tokio_tungstenite::connect_async(system.ws_url(&code, &token))
        .await
        .unwrap();
    let huge = format!(
        "{{\"type\":\"response\",\"requestId\":\"r\",\"result\":\"{}\"}}",
        "x".repeat(5 * 1024 * 1024)
    );
    // The relay may close while the frame is still being written.
    let _ = socket.send(Message::text(huge)).await;
    let close = loop {
        use futures::StreamExt;
        match tokio::time::timeout(PATIENCE, socket.next()).await.unwrap() {
            Some(Ok(Message::Close(frame))) => break frame,
            Some(Ok(_)) => {}
            other => panic!("the connection ended without a close frame: {other:?}"),
        }
    };
    assert_eq!(u16::from(close.unwrap().code), 1009);
    system.stop().await;
}

#[tokio::test]
async fn a_refused_body_closes_its_connection_so_the_next_request_is_not_garbled() {
    let system = System::start().await;
    let address = system.base.trim_start_matches("http://").to_owned();
    let (code, _) = system.create_session().await;
    let body = format!(
        "{{\"functionName\":\"echo\",\"args\":{{\"text\":\"{}\"}}}}",
        "x".repeat(300 * 1024)
    );
    let request = format!(
        "POST /api/sessions/{code}/call HTTP/1.1\r\nHost: {address}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}GET /healthz HTTP/1.1\r\nHost: {address}\r\n\r\n",
        body.len()
    );
    let received = exchange(&system, &request).await;
    assert!(received.starts_with("HTTP/1.1 413"), "{received}");
    assert!(
        received.to_ascii_lowercase().contains("connection: close"),
        "{received}"
    );
    assert_eq!(
        received.matches("HTTP/1.1 ").count(),
        1,
        "the rest of the refused body is not read as a request: {received}"
    );
    // A new connection works as usual.
    assert_eq!(system.get("/healthz").await.status, StatusCode::OK);
    system.stop().await;
}

/// `body` sent as a chunked request (no `Content-Length`) to `path`, in chunks of `piece` bytes
/// on a connection of its own: what came back, the connection closed after it.
async fn chunked_post(system: &System, path: &str, body: &str, piece: usize) -> String {
    let address = system.base.trim_start_matches("http://");
    let mut request = format!(
        "POST {path} HTTP/1.1\r\nHost: {address}\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
    );
    for chunk in body.as_bytes().chunks(piece) {
        request.push_str(&format!("{:x}\r\n", chunk.len()));
        request.push_str(std::str::from_utf8(chunk).unwrap());
        request.push_str("\r\n");
    }
    request.push_str("0\r\n\r\n");
    exchange(system, &request).await
}

/// `request`, raw bytes on a connection of its own: all that comes back until the server
/// closes it.
async fn exchange(system: &System, request: &str) -> String {
    let address = system.base.trim_start_matches("http://");
    let mut stream = tokio::net::TcpStream::connect(address).await.unwrap();
    // The server may stop reading once it has refused the body.
    let _ = stream.write_all(request.as_bytes()).await;
    let mut received = Vec::new();
    tokio::time::timeout(PATIENCE, stream.read_to_end(&mut received))
        .await
        .expect("the server answers and closes the connection")
        .ok();
    String::from_utf8_lossy(&received).into_owned()
}

#[tokio::test]
async fn a_body_without_a_declared_length_is_held_to_the_same_limit() {
    let system = System::start().await;
    let (code, token) = system.create_session().await;
    system.put_manifest(&code, &token, demo_tools()).await;
    let path = format!("/api/sessions/{code}/call");
    // Over the limit, streamed in pieces: refused while it is read, not after.
    let large = format!(
        "{{\"functionName\":\"echo\",\"args\":{{\"text\":\"{}\"}},\"timeoutMs\":0}}",
        "x".repeat(300 * 1024)
    );
    let received = chunked_post(&system, &path, &large, 16 * 1024).await;
    assert!(received.starts_with("HTTP/1.1 413"), "{received}");
    // Under it, in pieces: read whole and handled as one body (the call is queued).
    let small = r#"{"functionName":"echo","args":{"text":"in pieces"},"timeoutMs":0}"#;
    let received = chunked_post(&system, &path, small, 7).await;
    assert!(received.starts_with("HTTP/1.1 2"), "{received}");
    assert!(received.contains("\"status\""), "{received}");
    system.stop().await;
}

#[tokio::test]
async fn a_tab_on_a_split_gateway_is_told_to_reconnect_when_the_relay_dies() {
    let mut system = System::split().await;
    let (_, _, mut tab) = paired(&system).await;
    system.kill_relay().await;
    let close = tab.closed().await.expect("a close frame");
    assert_eq!(u16::from(close.code), 1012, "{close:?}");
}

#[tokio::test]
async fn malformed_json_to_mcp_gets_a_json_rpc_parse_error() {
    let system = System::start().await;
    let post = |body: &'static str| {
        system
            .http
            .post(system.url("/mcp"))
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .body(body)
    };
    let answer = toolrelay_tests::system::send(post("{\"jsonrpc\": \"2.0\", ")).await;
    assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{answer:?}");
    assert_eq!(answer.body["jsonrpc"], "2.0", "{answer:?}");
    assert_eq!(answer.body["error"]["code"], -32700, "{answer:?}");
    assert_eq!(answer.body["id"], Value::Null);
    let answer = toolrelay_tests::system::send(post("{\"hello\": 1}")).await;
    assert_eq!(answer.body["error"]["code"], -32600, "{answer:?}");
    system.stop().await;
}

#[tokio::test]
async fn invalid_arguments_say_what_is_wrong_once() {
    let system = System::start().await;
    let (code, token) = system.create_session().await;
    system.put_manifest(&code, &token, demo_tools()).await;
    for function in ["echo", "encodePlantUML"] {
        let refused = system
            .post(
                &format!("/api/sessions/{code}/call"),
                json!({"functionName": function, "args": {"text": 5, "plantumlCode": 5}}),
            )
            .await;
        assert_error(&refused, StatusCode::BAD_REQUEST, "invalid_arguments");
        let message = refused.body["message"].as_str().unwrap();
        assert_eq!(message.matches("do not match").count(), 1, "{message}");
    }
    system.stop().await;
}

/// Definitions doubling `levels` times: about 2^(levels+2) subschemas.
fn doubling_schema(levels: usize) -> Value {
    let mut defs = Map::new();
    defs.insert("l0".into(), json!({"type": "integer"}));
    for level in 1..=levels {
        let below = format!("#/$defs/l{}", level - 1);
        defs.insert(
            format!("l{level}"),
            json!({"allOf": [{"$ref": below}, {"$ref": below}]}),
        );
    }
    json!({"type": "object", "$defs": defs, "properties": {
        "values": {"type": "array", "items": {"$ref": format!("#/$defs/l{levels}")}}
    }})
}

#[tokio::test]
async fn a_hostile_schema_is_refused_and_the_costliest_accepted_one_cannot_stall_the_relay() {
    // The real binary, in a process of its own, with one async thread.
    let system = System::binary(&[("TOKIO_WORKER_THREADS", "1")]).await;
    let (code, token) = system.create_session().await;
    let refused = system
        .request(
            reqwest::Method::PUT,
            &format!("/api/sessions/{code}/manifest?token={token}"),
        )
        .json(&json!({"tools": [{"name": "f", "inputSchema": doubling_schema(40)}]}));
    let refused = toolrelay_tests::system::send(refused).await;
    assert_error(&refused, StatusCode::BAD_REQUEST, "invalid_manifest");
    assert!(
        refused.body["message"]
            .as_str()
            .unwrap()
            .contains("subschemas"),
        "{refused:?}"
    );

    // The costliest schema accepted, checked against as many values as a check may cost, by
    // more callers at once than the relay has threads.
    system
        .put_manifest(
            &code,
            &token,
            json!([{"name": "f", "inputSchema": doubling_schema(10)}]),
        )
        .await;
    let call = |values: usize| {
        let values: Vec<Value> = (0..values).map(|n| json!(n % 7)).collect();
        json!({"functionName": "f", "args": {"values": values}})
    };
    let too_costly = system
        .post(&format!("/api/sessions/{code}/request"), call(20_000))
        .await;
    assert_error(&too_costly, StatusCode::BAD_REQUEST, "invalid_arguments");
    assert!(
        too_costly.body["message"]
            .as_str()
            .unwrap()
            .contains("smaller"),
        "{too_costly:?}"
    );
    // Checks of the costliest arguments allowed, one after another, on a relay with a single
    // async thread; /healthz is asked again and again meanwhile. A check holding the async
    // thread would keep health waiting for a whole check (seconds in a debug build).
    let checks = async {
        for _ in 0..2 {
            let checked = system
                .post(&format!("/api/sessions/{code}/request"), call(4_800))
                .await;
            assert_eq!(checked.status, StatusCode::ACCEPTED, "{checked:?}");
        }
    };
    let mut checks = Box::pin(checks);
    let (mut answered, mut slowest) = (0, Duration::ZERO);
    loop {
        let asked = Instant::now();
        tokio::select! {
            biased;
            () = &mut checks => break,
            health = system.get("/healthz") => {
                assert_eq!(health.status, StatusCode::OK);
                answered += 1;
                slowest = slowest.max(asked.elapsed());
            }
        }
        // Paced, so that the asking does not crowd out the checking on two cores.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(answered >= 10, "/healthz answered only {answered} times");
    assert!(
        slowest < Duration::from_secs(1),
        "/healthz waited {slowest:?} for a check to finish"
    );
}

/// Polls as the session's tab until `id` is handed out (a poll also makes the poller the
/// session's provider, so a call made after the first poll finds a tab).
async fn poll_until_handed_out(system: &System, code: &str, token: &str, id: &str) {
    wait_until(PATIENCE, async || {
        let polled = system
            .get(&format!("/api/sessions/{code}/request?token={token}"))
            .await;
        assert_eq!(polled.status, StatusCode::OK, "{polled:?}");
        let calls = polled.body.as_array().unwrap();
        if calls.iter().any(|call| call["requestId"] == id) {
            Ok(())
        } else {
            Err(format!("{id} was never handed out"))
        }
    })
    .await;
}

async fn a_tab_answers_neither_a_builtin_call_nor_one_it_was_not_given(system: System) {
    let (code, token) = system.create_session().await;
    system.put_manifest(&code, &token, demo_tools()).await;
    let respond = format!("/api/sessions/{code}/response?token={token}");
    let queue = |body: Value| system.post(&format!("/api/sessions/{code}/request"), body);
    let forge = |id: &str| {
        system.post(
            &respond,
            json!({"requestId": id, "success": true, "result": {"problemId": "forged", "text": "forged"}}),
        )
    };

    // The relay's own call, running for a while: its id is known, its answer is not the tab's.
    let slow = "import time, pulp\nprob = pulp.LpProblem('p')\ntime.sleep(2)";
    let queued = queue(json!({"requestId": "mip-1", "functionName": "generate_mip_problem", "args": {"problemDefinitionCode": slow}})).await;
    assert_eq!(queued.status, StatusCode::ACCEPTED, "{queued:?}");
    let forged = forge("mip-1").await;
    assert_error(&forged, StatusCode::NOT_FOUND, "request_not_found");

    // A call of the tab's that was never handed to it: refused, and still waiting.
    let queued =
        queue(json!({"requestId": "echo-1", "functionName": "echo", "args": {"text": "real"}}))
            .await;
    assert_eq!(queued.status, StatusCode::ACCEPTED, "{queued:?}");
    let forged = forge("echo-1").await;
    assert_error(&forged, StatusCode::NOT_FOUND, "request_not_found");
    let state = system
        .get(&format!("/api/sessions/{code}/requests/echo-1"))
        .await;
    assert_eq!(state.body["status"], "queued", "{state:?}");
    // Once handed out, the tab answers it.
    poll_until_handed_out(&system, &code, &token, "echo-1").await;
    let answered = system
        .post(
            &respond,
            json!({"requestId": "echo-1", "success": true, "result": {"text": "real"}}),
        )
        .await;
    assert_eq!(answered.status, StatusCode::OK, "{answered:?}");
    assert_eq!(answered.body["accepted"], true, "{answered:?}");

    // The callers get the real answers, never the forged ones.
    for (id, forged) in [("mip-1", "/problemId"), ("echo-1", "/text")] {
        let answers = system
            .get(&format!(
                "/api/sessions/{code}/response?requestId={id}&wait=20"
            ))
            .await;
        assert_eq!(answers.status, StatusCode::OK, "{answers:?}");
        let answer = &answers.body[0];
        assert_eq!(answer["requestId"], id, "{answers:?}");
        assert_ne!(
            answer.pointer(&format!("/result{forged}")),
            Some(&json!("forged")),
            "{answers:?}"
        );
    }
    system.stop().await;
}

#[tokio::test]
async fn a_tab_answers_neither_a_builtin_call_nor_one_it_was_not_given_in_one_process() {
    a_tab_answers_neither_a_builtin_call_nor_one_it_was_not_given(System::start().await).await;
}

#[tokio::test]
async fn a_tab_answers_neither_a_builtin_call_nor_one_it_was_not_given_in_split_mode() {
    a_tab_answers_neither_a_builtin_call_nor_one_it_was_not_given(System::split().await).await;
}

/// A session flooding the relay with answers evicts its own oldest ones, never another
/// session's: the answer budget (here 1 MB) is shared, each session's share is an eighth.
#[tokio::test]
async fn one_sessions_answers_cannot_evict_another_sessions() {
    let config = toolrelay_relay::RelayConfig {
        response_budget: 1024 * 1024,
        ..toolrelay_relay::RelayConfig::default()
    };
    let system = System::with(config, |_| {}).await;
    let answer_with = |code: &str, token: &str, id: &str, bytes: usize| {
        let (code, token, id) = (code.to_owned(), token.to_owned(), id.to_owned());
        let system = &system;
        async move {
            let queued = system
                .post(
                    &format!("/api/sessions/{code}/request"),
                    json!({"requestId": id, "functionName": "echo", "args": {"text": "x"}}),
                )
                .await;
            assert_eq!(queued.status, StatusCode::ACCEPTED, "{queued:?}");
            poll_until_handed_out(system, &code, &token, &id).await;
            let answered = system
                .post(
                    &format!("/api/sessions/{code}/response?token={token}"),
                    json!({"requestId": id, "success": true, "result": {"text": "x".repeat(bytes)}}),
                )
                .await;
            assert_eq!(answered.status, StatusCode::OK, "{answered:?}");
        }
    };
    let (quiet, quiet_token) = system.create_session().await;
    system
        .put_manifest(&quiet, &quiet_token, demo_tools())
        .await;
    answer_with(&quiet, &quiet_token, "kept", 32 * 1024).await;
    // Another session answers 1.5 MB: more than the whole budget.
    let (noisy, noisy_token) = system.create_session().await;
    system
        .put_manifest(&noisy, &noisy_token, demo_tools())
        .await;
    for n in 0..24 {
        answer_with(&noisy, &noisy_token, &format!("flood-{n}"), 64 * 1024).await;
    }
    let kept = system
        .get(&format!("/api/sessions/{quiet}/response?requestId=kept"))
        .await;
    assert_eq!(
        kept.status,
        StatusCode::OK,
        "the quiet session's answer: {kept:?}"
    );
    assert_eq!(
        kept.body[0]["result"]["text"].as_str().unwrap().len(),
        32 * 1024
    );
    // The noisy session lost its own oldest answers, and kept its newest.
    let oldest = system
        .get(&format!("/api/sessions/{noisy}/response?requestId=flood-0"))
        .await;
    assert_error(&oldest, StatusCode::GONE, "response_evicted");
    let newest = system
        .get(&format!(
            "/api/sessions/{noisy}/response?requestId=flood-23"
        ))
        .await;
    assert_eq!(newest.status, StatusCode::OK, "{newest:?}");
    system.stop().await;
}

/// A tab's answer nested deeper than the JSON parser reads (128 levels) is refused with 400
/// `nested_too_deeply` on both answer routes, and its caller gets the failed answer at once
/// (not `request_expired` after a minute).
async fn an_answer_too_deep_to_read_still_fails_the_call_at_once(system: System) {
    let (code, token) = system.create_session().await;
    system.put_manifest(&code, &token, demo_tools()).await;
    let routes = [
        (
            "tab-route",
            format!("/api/sessions/{code}/response?token={token}"),
            json!({"requestId": "tab-route", "success": true, "result": nested(200)}),
        ),
        (
            "legacy-route",
            format!("/response?token={token}"),
            json!({"code": code, "id": "legacy-route", "result": nested(200)}),
        ),
    ];
    // The tab polls once first, so that the calls find it connected.
    let polled = system
        .get(&format!("/api/sessions/{code}/request?token={token}"))
        .await;
    assert_eq!(polled.status, StatusCode::OK, "{polled:?}");
    for (id, route, body) in routes {
        let calling = system.post(
            &format!("/api/sessions/{code}/call"),
            json!({"requestId": id, "functionName": "echo", "args": {"text": "x"}, "timeoutMs": 40_000}),
        );
        let tab_side = async {
            poll_until_handed_out(&system, &code, &token, id).await;
            let refused = system.post(&route, body).await;
            assert_error(&refused, StatusCode::BAD_REQUEST, "nested_too_deeply");
        };
        let (answer, ()) = tokio::time::timeout(Duration::from_secs(20), async {
            tokio::join!(calling, tab_side)
        })
        .await
        .expect("the caller got its answer long before the call's deadline");
        assert_eq!(answer.status, StatusCode::OK, "{answer:?}");
        assert_eq!(answer.body["success"], false, "{answer:?}");
        assert_eq!(
            answer.body["error"]["code"], "nested_too_deeply",
            "{answer:?}"
        );
        let state = system
            .get(&format!("/api/sessions/{code}/requests/{id}"))
            .await;
        assert_eq!(state.body["status"], "failed", "{state:?}");
    }
    system.stop().await;
}

#[tokio::test]
async fn an_answer_too_deep_to_read_still_fails_the_call_at_once_in_one_process() {
    an_answer_too_deep_to_read_still_fails_the_call_at_once(System::start().await).await;
}

#[tokio::test]
async fn an_answer_too_deep_to_read_still_fails_the_call_at_once_in_split_mode() {
    an_answer_too_deep_to_read_still_fails_the_call_at_once(System::split().await).await;
}
