//! The gateway over real sockets: an HTTP client plays the LLM; the tab is a WebSocket, SSE or
//! polling client; in one process and split into the real relay and gateway binaries. Also SSE
//! resume, slow calls answered later, codes as people type them, calls for a tab that is not
//! there, and calls asked again.
#![allow(clippy::unwrap_used)] // a test that cannot unwrap should fail loudly

use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde_json::json;
use toolrelay_tests::system::{Answer, SseTab, System, echo_call, post_answer, send};
use toolrelay_tests::{Deadline, PATIENCE, WsTab, demo_tools, wait_until};

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

/// `refused` has `expected`'s status and the same `fields` in its body (each there).
fn same_refusal(refused: &Answer, expected: &Answer, fields: &[&str], what: &str) {
    assert_eq!(refused.status, expected.status, "{what}: {refused:?}");
    for field in fields {
        let field = *field;
        assert!(
            !expected.body[field].is_null(),
            "{what}: no {field} in {expected:?}"
        );
        assert_eq!(
            refused.body[field], expected.body[field],
            "{what}: {refused:?}"
        );
    }
}

/// callTool and readTool are served apart from the other operations (the outer router, not
/// poem-openapi's: `CallRoute`); they refuse what the others refuse in the same words — a
/// missing or foreign content type, JSON that does not parse, a method they do not take, a
/// code that is no code or does not decode — and take a code as people type it.
#[tokio::test]
async fn call_and_read_refuse_and_answer_as_the_other_operations_do() {
    let system = System::start().await;
    let (code, token) = system.create_session().await;
    system.put_manifest(&code, &token, demo_tools()).await;
    let request = |method: Method, route: &str, content_type: Option<&str>, body: &str| {
        let mut request = system
            .http
            .request(method, system.url(&format!("/api/sessions/{code}/{route}")))
            .body(body.to_owned());
        if let Some(content_type) = content_type {
            request = request.header("content-type", content_type);
        }
        send(request)
    };
    // (what is wrong, content type, body): each refused by queueCall (`…/request`, served by
    // poem-openapi) and by callTool and readTool with the same status, name and message.
    let malformed = [
        ("no content type", None, r#"{"functionName": "echo"}"#),
        ("text", Some("text/plain"), r#"{"functionName": "echo"}"#),
        (
            "unparsable JSON",
            Some("application/json"),
            r#"{"functionName": "#,
        ),
    ];
    for (what, content_type, body) in malformed {
        let queued = request(Method::POST, "request", content_type, body).await;
        assert!(queued.status.is_client_error(), "{what}: {queued:?}");
        for route in ["call", "read"] {
            let refused = request(Method::POST, route, content_type, body).await;
            same_refusal(
                &refused,
                &queued,
                &["error", "message"],
                &format!("{what}, {route}"),
            );
        }
    }
    // A body of the wrong shape names its type in the message, so only the status and the name
    // are the same.
    for body in ["", r#"{"args": {}}"#, "[1]", r#"{"functionName": []}"#] {
        let queued = request(Method::POST, "request", Some("application/json"), body).await;
        assert_eq!(queued.status, StatusCode::BAD_REQUEST, "{body}: {queued:?}");
        for route in ["call", "read"] {
            let refused = request(Method::POST, route, Some("application/json"), body).await;
            same_refusal(&refused, &queued, &["error"], &format!("{body}, {route}"));
        }
    }
    for method in [
        Method::GET,
        Method::HEAD,
        Method::PUT,
        Method::DELETE,
        Method::PATCH,
    ] {
        // As another operation that takes POST only answers it.
        let about = system.url("/api/sessions/claim/about");
        let expected = send(system.http.request(method.clone(), about)).await;
        assert_eq!(
            expected.status,
            StatusCode::METHOD_NOT_ALLOWED,
            "{method}: {expected:?}"
        );
        for route in ["call", "read"] {
            let refused = request(method.clone(), route, None, "").await;
            let what = format!("{method} {route}");
            // An answer to HEAD has no body.
            let fields: &[&str] = if method == Method::HEAD {
                &[]
            } else {
                &["error", "message", "code"]
            };
            same_refusal(&refused, &expected, fields, &what);
        }
    }
    let call = echo_call("typed");
    let no_code = system
        .post("/api/sessions/NOT-A-CODE!/request", call.clone())
        .await;
    assert!(no_code.status.is_client_error(), "{no_code:?}");
    for route in ["call", "read"] {
        let refused = system
            .post(&format!("/api/sessions/NOT-A-CODE!/{route}"), call.clone())
            .await;
        same_refusal(&refused, &no_code, &["error", "message"], route);
    }
    // A code that does not decode is refused before its method is looked at, as on the
    // nested routes.
    for method in [Method::POST, Method::GET] {
        let undecodable_code = |route: &str| {
            let url = system.url(&format!("/api/sessions/%FF/{route}"));
            system
                .http
                .request(method.clone(), url)
                .header("content-type", "application/json")
                .body(call.to_string())
        };
        let undecodable = send(undecodable_code("request")).await;
        assert_eq!(
            undecodable.status,
            StatusCode::BAD_REQUEST,
            "{undecodable:?}"
        );
        for route in ["call", "read"] {
            let refused = send(undecodable_code(route)).await;
            let what = format!("{method} %FF {route}");
            same_refusal(&refused, &undecodable, &["error", "message"], &what);
        }
    }
    // A code as a person types it (lower case, a space, a hyphen) reaches the session: the call
    // is queued for a tab that is not there, and is that session's.
    let typed = code.to_ascii_lowercase();
    let typed = format!("{}%20{}-{}", &typed[..3], &typed[3..6], &typed[6..]);
    let mut timed = echo_call("typed");
    timed["timeoutMs"] = json!(1);
    timed["requestId"] = json!("typed");
    let queued = system
        .post(&format!("/api/sessions/{typed}/call"), timed)
        .await;
    assert_eq!(queued.status, StatusCode::ACCEPTED, "{queued:?}");
    assert_eq!(queued.body["requestId"], "typed", "{queued:?}");
    let state = system
        .get(&format!("/api/sessions/{code}/requests/typed"))
        .await;
    assert_eq!(state.status, StatusCode::OK, "{state:?}");
    // readTool refuses a function that is not read-only after reading the request as callTool.
    let not_read_only = system
        .post(&format!("/api/sessions/{code}/read"), echo_call("x"))
        .await;
    assert_eq!(
        not_read_only.status,
        StatusCode::FORBIDDEN,
        "{not_read_only:?}"
    );
    assert_eq!(
        not_read_only.body["error"], "not_read_only",
        "{not_read_only:?}"
    );
    system.stop().await;
}
