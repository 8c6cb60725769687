//! The relay over real sockets: tonic clients as consumers and providers, WebSocket clients as
//! browser tabs.
#![allow(clippy::unwrap_used)] // a test that cannot unwrap should fail loudly

use std::time::Duration;

use serde_json::{Value, json};
use tokio_stream::StreamExt;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Code;
use toolrelay::json::{from_struct, from_value, to_struct};
use toolrelay::proto::v1::{
    self as pb, CallRequest, GetManifestRequest, GetRequestStatusRequest, GetSessionRequest,
    ListResponsesRequest, PollRequestsRequest, PostResponseRequest, RegisterManifestRequest,
    RequestStatus, SubmitRequest, provider_message, relay_message,
};
use toolrelay_relay::RelayConfig;
use toolrelay_tests::{
    BUILTIN_TOOLS, Deadline, PATIENCE, TestRelay, WsTab, demo_tools, error_name, grpc_channel,
    relay_client, tab_and_builtin_names, wait_until, with_token,
};

/// The built-in tools every session offers besides the tab's.
const BUILTINS: u32 = BUILTIN_TOOLS.len() as u32;

fn call(code: &str, function: &str, args: Value) -> CallRequest {
    CallRequest {
        code: code.into(),
        function_name: function.into(),
        args: Some(to_struct(&args)),
        timeout_ms: 10_000,
        ..CallRequest::default()
    }
}

fn submit(code: &str, request_id: &str, function: &str, args: Value) -> SubmitRequest {
    SubmitRequest {
        code: code.into(),
        request_id: request_id.into(),
        function_name: function.into(),
        args: Some(to_struct(&args)),
        ..SubmitRequest::default()
    }
}

fn result_of(state: &pb::RequestState) -> Value {
    let response = state.response.as_ref().expect("a response");
    assert!(response.success, "{response:?}");
    from_value(response.result.as_ref().unwrap())
}

#[tokio::test]
async fn a_websocket_tab_answers_a_grpc_call() {
    let relay = TestRelay::start().await;
    let session = relay.create_session().await;
    assert_eq!(session.code.len(), 8);
    assert!(session.provider_token.len() >= 22, "at least 128 bits");

    let mut tab = WsTab::attach(&relay, &session).await;
    assert_eq!(tab.welcome["code"], session.code);
    assert_eq!(tab.welcome["protocolVersion"], "1");
    assert!(tab.welcome["expiresAt"].as_str().unwrap().ends_with('Z'));
    assert_eq!(tab.register(demo_tools()).await["tools"], 2);

    let mut client = relay.client().await;
    let manifest = client
        .get_manifest(GetManifestRequest {
            code: session.code.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    let names: Vec<&str> = manifest.tools.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(
        names,
        tab_and_builtin_names(),
        "the tab's tools, then the built-in ones"
    );
    assert_eq!(manifest.tools[0].tool_id, "demo");
    assert_eq!(
        from_struct(manifest.tools[0].input_schema.as_ref().unwrap())["required"],
        json!(["text"])
    );

    // The code is accepted as people type it.
    let typed = format!("{}-{}", &session.code[..4], &session.code[4..]).to_lowercase();
    let caller = relay
        .spawn_call(call(&typed, "echo", json!({"text": "hi"})))
        .await;

    let request = tab.next_request().await;
    assert_eq!(request["functionName"], "echo");
    assert_eq!(request["args"], json!({"text": "hi"}));
    let request_id = request["requestId"].as_str().unwrap().to_owned();
    tab.answer(&request_id, json!({"echoed": "hi"})).await;

    let state = caller.await.unwrap().unwrap();
    assert_eq!(state.status(), RequestStatus::Completed);
    assert_eq!(state.request_id, request_id);
    assert_eq!(result_of(&state), json!({"echoed": "hi"}));

    let info = client
        .get_session(GetSessionRequest {
            code: session.code.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(info.provider_connected);
    assert_eq!(info.transport, "websocket");
    assert_eq!((info.tool_count, info.pending_requests), (2 + BUILTINS, 0));
    let responses = client
        .list_responses(ListResponsesRequest {
            code: session.code.clone(),
            request_id: String::new(),
        })
        .await
        .unwrap()
        .into_inner()
        .responses;
    assert_eq!(responses.len(), 1);
    assert_eq!(responses[0].request_id, request_id);
    relay.stop().await;
}

#[tokio::test]
async fn a_grpc_connect_provider_answers_calls() {
    let relay = TestRelay::start().await;
    let session = relay.create_session().await;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let provider = {
        let client = relay.client().await;
        let (code, token) = (session.code.clone(), session.provider_token.clone());
        tokio::spawn(async move {
            toolrelay_example_provider::serve(client, &code, &token, async {
                let _ = stopped.await;
            })
            .await
        })
    };

    let mut client = relay.client().await;
    wait_until(PATIENCE, async || {
        let info = client
            .get_session(GetSessionRequest {
                code: session.code.clone(),
            })
            .await
            .unwrap()
            .into_inner();
        if info.tool_count != 2 + BUILTINS {
            return Err("the provider registered in time");
        }
        assert_eq!(info.transport, "grpc");
        Ok(())
    })
    .await;

    let sum = client
        .call(call(
            &session.code,
            "add_numbers",
            json!({"a": 2, "b": 3.5}),
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(result_of(&sum), json!({"sum": 5.5}));
    let words = client
        .call(call(
            &session.code,
            "word_count",
            json!({"text": "tools live elsewhere"}),
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(result_of(&words), json!({"words": 3, "characters": 20}));

    stop.send(()).unwrap();
    assert_eq!(
        provider.await.unwrap().unwrap(),
        toolrelay_example_provider::Ended::Shutdown
    );
    relay.stop().await;
}

#[tokio::test]
async fn submit_then_await_response_works_in_two_steps() {
    let relay = TestRelay::start().await;
    let (session, mut tab) = relay.paired().await;
    let mut client = relay.client().await;

    let queued = client
        .submit(submit(&session.code, "", "add", json!({"a": 1, "b": 2})))
        .await
        .unwrap()
        .into_inner();
    assert!(matches!(
        queued.status(),
        RequestStatus::Queued | RequestStatus::Delivered
    ));
    assert_eq!(queued.request_id.len(), 32, "a generated id");

    let request = tab.next_request().await;
    assert_eq!(request["requestId"], queued.request_id.as_str());
    let status = client
        .get_request_status(GetRequestStatusRequest {
            code: session.code.clone(),
            request_id: queued.request_id.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(status.status(), RequestStatus::Delivered);

    tab.answer(&queued.request_id, json!(3)).await;
    let done = client
        .await_response(pb::AwaitResponseRequest {
            code: session.code.clone(),
            request_id: queued.request_id.clone(),
            wait_ms: 10_000,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(done.status(), RequestStatus::Completed);
    assert_eq!(result_of(&done), json!(3));
    relay.stop().await;
}

#[tokio::test]
async fn the_provider_token_is_required_and_the_code_alone_is_refused() {
    let relay = TestRelay::start().await;
    let (session, tab) = relay.paired().await;
    let mut client = relay.client().await;
    // A call waits in the queue while no tab is attached; no refused attempt may take it.
    // (Queued once the tab's departure is recorded: before, it would be handed to the tab.)
    tab.close().await;
    wait_until(PATIENCE, async || {
        let info = client
            .get_session(GetSessionRequest {
                code: session.code.clone(),
            })
            .await
            .map_err(|status| status.to_string())?
            .into_inner();
        if info.provider_connected {
            Err("the tab's departure is not recorded yet".to_owned())
        } else {
            Ok(())
        }
    })
    .await;
    let waiting = client
        .submit(submit(
            &session.code,
            "waiting",
            "echo",
            json!({"text": "x"}),
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(waiting.status(), RequestStatus::Queued);

    for (token, error, close) in [
        (None, "token_required", 4401),
        (Some("not-the-token"), "invalid_token", 4403),
    ] {
        let mut intruder = WsTab::connect(&relay.ws_url(&session.code, token)).await;
        let frame = intruder.recv().await;
        assert_eq!(frame["type"], "error");
        assert_eq!(frame["error"], error, "{frame}");
        assert_eq!(u16::from(intruder.closed().await.unwrap().code), close);
    }

    let connect_with = |token: Option<&str>| {
        let mut request = tonic::Request::new(ReceiverStream::new(tokio::sync::mpsc::channel(1).1));
        request
            .metadata_mut()
            .insert("x-session-code", session.code.parse().unwrap());
        if let Some(token) = token {
            request
                .metadata_mut()
                .insert("authorization", format!("Bearer {token}").parse().unwrap());
        }
        request
    };
    let refused = client.connect(connect_with(None)).await.unwrap_err();
    assert_eq!(refused.code(), Code::Unauthenticated);
    assert!(
        refused.message().contains("provider token"),
        "{}",
        refused.message()
    );
    let refused = client
        .connect(connect_with(Some("nope")))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::PermissionDenied);

    let poll = PollRequestsRequest {
        code: session.code.clone(),
        max: 0,
        running: vec![],
    };
    assert_eq!(
        client.poll_requests(poll.clone()).await.unwrap_err().code(),
        Code::Unauthenticated
    );
    let forged = pb::ToolResponse {
        request_id: "waiting".into(),
        success: true,
        ..Default::default()
    };
    let post = PostResponseRequest {
        code: session.code.clone(),
        response: Some(forged),
    };
    assert_eq!(
        client.post_response(post.clone()).await.unwrap_err().code(),
        Code::Unauthenticated
    );
    let register = RegisterManifestRequest {
        code: session.code.clone(),
        ..Default::default()
    };
    let refused = client
        .register_manifest(with_token(register, "nope"))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::PermissionDenied);
    let delete = pb::DeleteSessionRequest {
        code: session.code.clone(),
    };
    assert_eq!(
        client.delete_session(delete).await.unwrap_err().code(),
        Code::Unauthenticated
    );

    // Nothing changed: the session lives, its manifest stands, the call still waits.
    let info = client
        .get_session(GetSessionRequest {
            code: session.code.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!((info.tool_count, info.pending_requests), (2 + BUILTINS, 1));
    let status = client
        .get_request_status(GetRequestStatusRequest {
            code: session.code.clone(),
            request_id: "waiting".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(status.status(), RequestStatus::Queued);

    // With the token, the same calls work.
    let polled = client
        .poll_requests(with_token(poll, &session.provider_token))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(polled.requests.len(), 1);
    let posted = client
        .post_response(with_token(post, &session.provider_token))
        .await
        .unwrap()
        .into_inner();
    assert!(posted.accepted);
    relay.stop().await;
}

#[tokio::test]
async fn bad_input_gets_a_clear_error_and_changes_nothing() {
    let relay = TestRelay::start().await;
    let (session, mut tab) = relay.paired().await;
    let code = session.code.clone();
    let mut client = relay.client().await;

    // One completed call, to compare against later.
    let caller = relay
        .spawn_call(CallRequest {
            request_id: "r1".into(),
            ..call(&code, "echo", json!({"text": "one"}))
        })
        .await;
    let request = tab.next_request().await;
    tab.answer(request["requestId"].as_str().unwrap(), json!("one"))
        .await;
    assert_eq!(
        caller.await.unwrap().unwrap().status(),
        RequestStatus::Completed
    );

    let snapshot = |mut client: pb::relay_client::RelayClient<tonic::transport::Channel>,
                    code: String| async move {
        let info = client
            .get_session(GetSessionRequest { code: code.clone() })
            .await
            .unwrap()
            .into_inner();
        let manifest = client
            .get_manifest(GetManifestRequest { code: code.clone() })
            .await
            .unwrap()
            .into_inner();
        let responses = client
            .list_responses(ListResponsesRequest {
                code,
                request_id: String::new(),
            })
            .await
            .unwrap()
            .into_inner();
        (info.tool_count, info.pending_requests, manifest, responses)
    };
    let before = snapshot(client.clone(), code.clone()).await;

    let cases: Vec<(SubmitRequest, Code, &str, &str)> = vec![
        (
            submit("ABC!", "", "echo", json!({"text": "x"})),
            Code::InvalidArgument,
            "invalid_code",
            "ABCD-EFGH",
        ),
        (
            submit("AAAA-AAAA", "", "echo", json!({"text": "x"})),
            Code::NotFound,
            "session_not_found",
            "Ask the user",
        ),
        (
            submit(&code, "", "nope", json!({})),
            Code::NotFound,
            "unknown_function",
            "echo, add",
        ),
        (
            submit(&code, "", "echo", json!({"text": 5})),
            Code::InvalidArgument,
            "invalid_arguments",
            "/text",
        ),
        (
            submit(&code, "", "echo", json!({})),
            Code::InvalidArgument,
            "invalid_arguments",
            "text",
        ),
        (
            submit(&code, "bad id!", "echo", json!({"text": "x"})),
            Code::InvalidArgument,
            "invalid_request_id",
            "requestId",
        ),
        (
            submit(&code, "r1", "echo", json!({"text": "another"})),
            Code::AlreadyExists,
            "request_id_conflict",
            "r1",
        ),
    ];
    for (request, code_expected, name, hint) in cases {
        let status = client.submit(request.clone()).await.unwrap_err();
        assert_eq!(status.code(), code_expected, "{request:?}: {status:?}");
        assert_eq!(error_name(&status), name);
        assert!(
            status.message().contains(hint),
            "{name}: {}",
            status.message()
        );
    }

    // The same id with the same body is the same call: its answer, not a second run.
    let repeat = client
        .submit(submit(&code, "r1", "echo", json!({"text": "one"})))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(repeat.status(), RequestStatus::Completed);
    assert_eq!(result_of(&repeat), json!("one"));

    // Manifests that break the rules are refused over both transports; the old one stays.
    let oversized = json!([{"name": "big", "description": "x".repeat(300 * 1024)}]);
    tab.send(json!({"type": "register", "tools": oversized}))
        .await;
    let refusal = tab.recv().await;
    assert_eq!(
        (refusal["type"].as_str(), refusal["error"].as_str()),
        (Some("error"), Some("manifest_too_large"))
    );
    tab.send(json!({"type": "register", "tools": [{"name": "has space"}]}))
        .await;
    let refusal = tab.recv().await;
    assert_eq!(refusal["error"], "invalid_manifest");
    assert!(
        refusal["message"]
            .as_str()
            .unwrap()
            .contains("previous manifest"),
        "{refusal}"
    );
    let big_tool = pb::Tool {
        name: "big".into(),
        description: "x".repeat(300 * 1024),
        ..Default::default()
    };
    let register = RegisterManifestRequest {
        code: code.clone(),
        tools: vec![big_tool],
        ..Default::default()
    };
    let status = client
        .register_manifest(with_token(register, &session.provider_token))
        .await
        .unwrap_err();
    assert_eq!(error_name(&status), "manifest_too_large");

    // A frame that is not JSON is refused; the connection stays usable.
    tab.send_text("not json").await;
    assert_eq!(tab.recv().await["error"], "invalid_frame");
    tab.send(json!({"type": "ping"})).await;
    assert_eq!(tab.next_frame().await.unwrap()["type"], "heartbeat");

    let after = snapshot(client.clone(), code.clone()).await;
    assert_eq!(before, after, "no refused input changed the session");

    // The tab was never asked to run r1 again: the next request it sees is a new one.
    let fresh = client
        .submit(submit(&code, "r2", "add", json!({"a": 1, "b": 1})))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        tab.next_request().await["requestId"],
        fresh.request_id.as_str()
    );
    relay.stop().await;
}

#[tokio::test]
async fn a_tab_that_reconnects_gets_its_unanswered_call_again_and_nothing_runs_twice() {
    let relay = TestRelay::start().await;
    let session = relay.create_session().await;
    let code = session.code.clone();
    let mut first = WsTab::attach(&relay, &session).await;
    first.register(demo_tools()).await;

    let caller = relay
        .spawn_call(CallRequest {
            request_id: "job-1".into(),
            ..call(&code, "echo", json!({"text": "one"}))
        })
        .await;
    assert_eq!(first.next_request().await["requestId"], "job-1");
    first.close().await; // gone without answering

    let mut client = relay.client().await;
    let second_call = client
        .submit(submit(&code, "job-2", "add", json!({"a": 2, "b": 2})))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(second_call.status(), RequestStatus::Queued);

    let mut second = WsTab::attach(&relay, &session).await;
    assert_eq!(
        second.next_request().await["requestId"],
        "job-1",
        "redelivered"
    );
    assert_eq!(
        second.next_request().await["requestId"],
        "job-2",
        "the queued call follows"
    );
    second.answer("job-1", json!("one")).await;
    let state = caller.await.unwrap().unwrap();
    assert_eq!(result_of(&state), json!("one"));

    // Calling again with the same id returns the stored answer and sends nothing to the tab.
    let again = client
        .call(CallRequest {
            request_id: "job-1".into(),
            ..call(&code, "echo", json!({"text": "one"}))
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(result_of(&again), json!("one"));
    second.answer("job-2", json!(4)).await;
    second.answer("job-1", json!("a late duplicate")).await;
    let done = client
        .await_response(pb::AwaitResponseRequest {
            code: code.clone(),
            request_id: "job-2".into(),
            wait_ms: 10_000,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(result_of(&done), json!(4));
    let responses = client
        .list_responses(ListResponsesRequest {
            code: code.clone(),
            request_id: String::new(),
        })
        .await
        .unwrap()
        .into_inner()
        .responses;
    let answers: Vec<(String, Value)> = responses
        .iter()
        .map(|r| (r.request_id.clone(), from_value(r.result.as_ref().unwrap())))
        .collect();
    assert_eq!(
        answers,
        [("job-1".into(), json!("one")), ("job-2".into(), json!(4))]
    );
    relay.stop().await;
}

async fn next_call(inbound: &mut tonic::Streaming<pb::RelayMessage>) -> pb::ToolRequest {
    loop {
        let message = tokio::time::timeout(PATIENCE, inbound.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        if let Some(relay_message::Kind::ToolRequest(request)) = message.kind {
            return request;
        }
    }
}

#[tokio::test]
async fn a_grpc_provider_that_reconnects_gets_its_unanswered_call_again() {
    let relay = TestRelay::start().await;
    let session = relay.create_session().await;
    let mut client = relay.client().await;
    let connect = |client: pb::relay_client::RelayClient<tonic::transport::Channel>| {
        let (code, token) = (session.code.clone(), session.provider_token.clone());
        async move {
            let mut client = client;
            let (outbound, rx) = tokio::sync::mpsc::channel(8);
            let register = provider_message::Kind::Register(pb::Register {
                tools: vec![pb::Tool {
                    name: "job".into(),
                    ..Default::default()
                }],
                ..Default::default()
            });
            outbound
                .send(pb::ProviderMessage {
                    kind: Some(register),
                })
                .await
                .unwrap();
            let mut request = with_token(ReceiverStream::new(rx), &token);
            request
                .metadata_mut()
                .insert("x-session-code", code.parse().unwrap());
            let inbound = client.connect(request).await.unwrap().into_inner();
            (outbound, inbound)
        }
    };

    let (outbound, mut inbound) = connect(client.clone()).await;
    // Wait for the manifest, then queue the call.
    loop {
        let message = inbound.next().await.unwrap().unwrap();
        if matches!(message.kind, Some(relay_message::Kind::Registered(_))) {
            break;
        }
    }
    client
        .submit(submit(&session.code, "once", "job", json!({})))
        .await
        .unwrap();
    assert_eq!(next_call(&mut inbound).await.request_id, "once");
    drop((outbound, inbound)); // the provider crashes

    let (outbound, mut inbound) = connect(client.clone()).await;
    let again = next_call(&mut inbound).await;
    assert_eq!(again.request_id, "once", "redelivered after the reconnect");
    assert!(again.seq > 0);
    let response = pb::ToolResponse {
        request_id: "once".into(),
        success: true,
        result: Some(toolrelay::json::to_value(&json!("done"))),
        error: None,
    };
    outbound
        .send(pb::ProviderMessage {
            kind: Some(provider_message::Kind::Response(response)),
        })
        .await
        .unwrap();
    let done = client
        .await_response(pb::AwaitResponseRequest {
            code: session.code.clone(),
            request_id: "once".into(),
            wait_ms: 10_000,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(result_of(&done), json!("done"));
    relay.stop().await;
}

#[tokio::test]
async fn a_second_tab_with_the_token_replaces_the_first() {
    let relay = TestRelay::start().await;
    let session = relay.create_session().await;
    let mut first = WsTab::attach(&relay, &session).await;
    let mut second = WsTab::attach(&relay, &session).await;
    let frame = first.recv().await;
    assert_eq!(
        (frame["type"].as_str(), frame["error"].as_str()),
        (Some("error"), Some("replaced"))
    );
    first.closed().await;

    second.register(demo_tools()).await;
    let mut client = relay.client().await;
    let queued = client
        .submit(submit(&session.code, "", "echo", json!({"text": "x"})))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        second.next_request().await["requestId"],
        queued.request_id.as_str()
    );
    relay.stop().await;
}

#[tokio::test]
async fn the_fallback_rpcs_serve_a_polling_provider() {
    let relay = TestRelay::start().await;
    let session = relay.create_session().await;
    let token = session.provider_token.as_str();
    let mut client = relay.client().await;
    let tools = vec![pb::Tool {
        name: "shout".into(),
        description: "Upper-cases text".into(),
        input_schema: Some(to_struct(
            &json!({"type": "object", "properties": {"text": {"type": "string"}}}),
        )),
        tool_id: String::new(),
        title: "Shout".into(),
        read_only: Some(true),
        ..Default::default()
    }];
    let registered = client
        .register_manifest(with_token(
            RegisterManifestRequest {
                code: session.code.clone(),
                tools,
                ..Default::default()
            },
            token,
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(registered.tool_count, 1);
    // What the function does to data comes back with the manifest.
    let manifest = client
        .get_manifest(GetManifestRequest {
            code: session.code.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    let shout = manifest.tools.iter().find(|t| t.name == "shout").unwrap();
    assert_eq!(
        (shout.title.as_str(), shout.read_only, shout.destructive),
        ("Shout", Some(true), None)
    );

    let queued = client
        .submit(submit(&session.code, "p1", "shout", json!({"text": "hey"})))
        .await
        .unwrap()
        .into_inner();
    let poll = || {
        with_token(
            PollRequestsRequest {
                code: session.code.clone(),
                max: 10,
                running: vec![],
            },
            token,
        )
    };
    let polled = client
        .poll_requests(poll())
        .await
        .unwrap()
        .into_inner()
        .requests;
    assert_eq!(polled.len(), 1);
    assert_eq!(polled[0].request_id, queued.request_id);
    assert_eq!(
        from_struct(polled[0].args.as_ref().unwrap()),
        json!({"text": "hey"})
    );
    assert!(
        client
            .poll_requests(poll())
            .await
            .unwrap()
            .into_inner()
            .requests
            .is_empty(),
        "leased to the poller"
    );

    let answer = |text: &str| PostResponseRequest {
        code: session.code.clone(),
        response: Some(pb::ToolResponse {
            request_id: "p1".into(),
            success: true,
            result: Some(toolrelay::json::to_value(&json!(text))),
            error: None,
        }),
    };
    let posted = client
        .post_response(with_token(answer("HEY"), token))
        .await
        .unwrap()
        .into_inner();
    assert!(posted.accepted);
    assert_eq!(posted.status(), RequestStatus::Completed);
    let duplicate = client
        .post_response(with_token(answer("again"), token))
        .await
        .unwrap()
        .into_inner();
    assert!(!duplicate.accepted, "the first answer wins");

    let info = client
        .get_session(GetSessionRequest {
            code: session.code.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.transport, "polling");
    let state = client
        .get_request_status(GetRequestStatusRequest {
            code: session.code.clone(),
            request_id: "p1".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(result_of(&state), json!("HEY"));
    relay.stop().await;
}

#[tokio::test]
async fn heartbeats_keep_a_connected_session_alive_and_deletion_ends_it() {
    let relay = TestRelay::with_config(RelayConfig {
        session_ttl: Duration::from_secs(2),
        heartbeat_interval: Duration::from_millis(500),
        ..RelayConfig::default()
    })
    .await;
    let idle = relay.create_session().await;
    let session = relay.create_session().await;
    let mut tab = WsTab::attach(&relay, &session).await;
    let mut heartbeats = 0;
    let until = tokio::time::Instant::now() + Duration::from_secs(3);
    while tokio::time::Instant::now() < until {
        let frame = tab.next_frame().await.unwrap();
        assert_eq!(frame["type"], "heartbeat", "{frame}");
        heartbeats += 1;
    }
    assert!(heartbeats >= 4, "{heartbeats} heartbeats in 3 s");

    let mut client = relay.client().await;
    let idle_status = client
        .get_session(GetSessionRequest {
            code: idle.code.clone(),
        })
        .await
        .unwrap_err();
    assert_eq!(
        idle_status.code(),
        Code::NotFound,
        "the idle session expired"
    );
    client
        .get_session(GetSessionRequest {
            code: session.code.clone(),
        })
        .await
        .expect("the connected session is alive after 1.5 TTLs");

    let delete = pb::DeleteSessionRequest {
        code: session.code.clone(),
    };
    client
        .delete_session(with_token(delete, &session.provider_token))
        .await
        .unwrap();
    assert_eq!(tab.recv().await["type"], "expired");
    tab.closed().await;
    relay.stop().await;
}

#[tokio::test]
async fn stopping_the_relay_tells_tabs_to_reconnect() {
    let relay = TestRelay::start().await;
    let session = relay.create_session().await;
    let mut tab = WsTab::attach(&relay, &session).await;
    let stopping = tokio::spawn(relay.stop());
    let frame = tab.recv().await;
    assert_eq!(frame["error"], "shutting_down", "{frame}");
    assert_eq!(u16::from(tab.closed().await.unwrap().code), 1012);
    stopping.await.unwrap();
}

#[tokio::test]
async fn health_and_reflection_list_the_services() {
    use tonic_health::pb::health_client::HealthClient;
    use tonic_health::pb::{HealthCheckRequest, health_check_response::ServingStatus};
    use tonic_reflection::pb::{v1, v1alpha};

    let relay = TestRelay::start().await;
    let channel = grpc_channel(relay.grpc).await;
    let health = HealthClient::new(channel.clone())
        .check(HealthCheckRequest {
            service: "toolrelay.v1.Relay".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(health.status(), ServingStatus::Serving);

    let request = v1::ServerReflectionRequest {
        host: String::new(),
        message_request: Some(v1::server_reflection_request::MessageRequest::ListServices(
            String::new(),
        )),
    };
    let mut replies = v1::server_reflection_client::ServerReflectionClient::new(channel.clone())
        .server_reflection_info(tokio_stream::iter([request]))
        .await
        .unwrap()
        .into_inner();
    let reply = replies.next().await.unwrap().unwrap();
    let Some(v1::server_reflection_response::MessageResponse::ListServicesResponse(list)) =
        reply.message_response
    else {
        panic!("expected a service list");
    };
    let services: Vec<&str> = list.service.iter().map(|s| s.name.as_str()).collect();
    assert!(services.contains(&"toolrelay.v1.Relay"), "{services:?}");
    assert!(services.contains(&"grpc.health.v1.Health"), "{services:?}");

    let request = v1alpha::ServerReflectionRequest {
        host: String::new(),
        message_request: Some(
            v1alpha::server_reflection_request::MessageRequest::FileContainingSymbol(
                "toolrelay.v1.Relay".into(),
            ),
        ),
    };
    let mut replies = v1alpha::server_reflection_client::ServerReflectionClient::new(channel)
        .server_reflection_info(tokio_stream::iter([request]))
        .await
        .unwrap()
        .into_inner();
    let reply = replies.next().await.unwrap().unwrap();
    assert!(
        matches!(
            reply.message_response,
            Some(v1alpha::server_reflection_response::MessageResponse::FileDescriptorResponse(ref files)) if !files.file_descriptor_proto.is_empty()
        ),
        "{reply:?}"
    );
    relay.stop().await;
}

#[tokio::test]
async fn python_grpcio_reflection_lists_and_calls_the_relay() {
    let relay = TestRelay::start().await;
    let output = tokio::process::Command::new(toolrelay_tests::test_python())
        .arg(toolrelay_tests::repo_file(
            "tests/python/reflection_client.py",
        ))
        .arg(relay.grpc.to_string())
        .kill_on_drop(true)
        .output()
        .await
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let found: Value = serde_json::from_slice(&output.stdout).unwrap();
    let services = found["services"].as_array().unwrap();
    assert!(services.contains(&json!("toolrelay.v1.Relay")), "{found}");
    assert!(
        services.contains(&json!("grpc.health.v1.Health")),
        "{found}"
    );
    let methods = found["methods"].as_array().unwrap();
    for method in [
        "CreateSession",
        "Call",
        "Connect",
        "PollRequests",
        "PostResponse",
        "RegisterManifest",
    ] {
        assert!(methods.contains(&json!(method)), "{method} in {found}");
    }
    let code = found["created"]["code"].as_str().unwrap();
    assert_eq!(found["info"]["code"], code, "{found}");
    assert!(found["created"]["providerToken"].as_str().unwrap().len() >= 22);
    relay.stop().await;
}

#[tokio::test]
async fn a_tab_that_stops_answering_pings_is_dropped_and_its_call_goes_to_the_next_tab() {
    let relay = TestRelay::with_config(RelayConfig {
        session_ttl: Duration::from_secs(30),
        heartbeat_interval: Duration::from_millis(300),
        ..RelayConfig::default()
    })
    .await;
    let (session, mut silent) = relay.paired().await;
    let mut client = relay.client().await;
    let call = client
        .submit(submit(&session.code, "stuck", "echo", json!({"text": "x"})))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(silent.next_request().await["requestId"], "stuck");

    // The tab stops reading (a sleeping laptop): it answers no ping, and no TCP close comes.
    let every = Deadline::within(PATIENCE).every(Duration::from_millis(100));
    wait_until(every, async || {
        let info = client
            .get_session(GetSessionRequest {
                code: session.code.clone(),
            })
            .await
            .unwrap()
            .into_inner();
        if info.provider_connected {
            Err("the silent tab was never dropped")
        } else {
            Ok(())
        }
    })
    .await;

    let mut next = WsTab::attach(&relay, &session).await;
    assert_eq!(
        next.next_request().await["requestId"],
        call.request_id.as_str()
    );
    drop(silent);
    relay.stop().await;
}

#[tokio::test]
async fn a_tab_that_pings_often_is_not_taken_for_silent() {
    let relay = TestRelay::start().await;
    let (session, mut tab) = relay.paired().await;
    // Pings sent back to back: their heartbeat replies must not count as the relay's own
    // heartbeats going unanswered.
    for _ in 0..5 {
        tab.send(json!({"type": "ping"})).await;
    }
    for _ in 0..5 {
        let frame = tab.next_frame().await.expect("the tab is still connected");
        assert_eq!(frame["type"], "heartbeat", "{frame}");
    }
    let pending = relay
        .spawn_call(call(&session.code, "echo", json!({"text": "still here"})))
        .await;
    let request = tab.next_request().await;
    let id = request["requestId"].as_str().unwrap();
    tab.answer(id, json!({"text": "still here"})).await;
    let state = pending.await.unwrap().unwrap();
    assert_eq!(result_of(&state), json!({"text": "still here"}));
    relay.stop().await;
}

/// The seconds of a refusal's `retry-after` entry.
fn retry_after(status: &tonic::Status) -> u64 {
    status
        .metadata()
        .get("retry-after")
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.parse().ok())
        .unwrap_or_default()
}

fn assert_over_budget(refused: &tonic::Status) {
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    assert_eq!(error_name(refused), "rate_limited", "{refused:?}");
    assert!(retry_after(refused) >= 1, "{refused:?}");
}

fn encode_plantuml() -> pb::CallToolRequest {
    pb::CallToolRequest {
        name: "encodePlantUML".into(),
        args: Some(to_struct(
            &json!({"plantumlCode": "@startuml\nA -> B\n@enduml"}),
        )),
        scope: None,
    }
}

/// A client on the gRPC port spends the budgets it would spend over HTTP — sessions and
/// built-in tool calls per address — against its own address, whatever client address it
/// names without a gateway's proof; past them, `ResourceExhausted` with `retry-after`.
#[tokio::test]
async fn grpc_clients_spend_the_session_and_tool_budgets_of_their_own_address() {
    let mut config = RelayConfig::default();
    config.limits.sessions_per_ip = std::num::NonZeroU32::new(2).unwrap();
    config.limits.tools_per_ip = std::num::NonZeroU32::new(2).unwrap();
    let relay = TestRelay::with_config(config).await;
    let mut client = relay.client().await;
    for _ in 0..2 {
        client
            .create_session(pb::CreateSessionRequest {})
            .await
            .unwrap();
    }
    let refused = client
        .create_session(pb::CreateSessionRequest {})
        .await
        .unwrap_err();
    assert_over_budget(&refused);
    let mut named = tonic::Request::new(pb::CreateSessionRequest {});
    named
        .metadata_mut()
        .insert("x-toolrelay-client", "203.0.113.9".parse().unwrap());
    assert_over_budget(&client.create_session(named).await.unwrap_err());

    for _ in 0..2 {
        let ran = client.call_tool(encode_plantuml()).await.unwrap();
        assert!(ran.into_inner().success);
    }
    assert_over_budget(&client.call_tool(encode_plantuml()).await.unwrap_err());
}

/// On the one-process server, HTTP and its gRPC listener spend one budget of sessions per
/// address, and a session made over HTTP is counted once (by the gateway), not again by the
/// relay behind it.
#[tokio::test]
async fn one_process_http_and_grpc_share_the_session_budget_and_spend_it_once() {
    let three = std::num::NonZeroU32::new(3).unwrap();
    let mut config = RelayConfig::default();
    config.limits.sessions_per_ip = three;
    let system = toolrelay_tests::system::System::with(config, |gateway| {
        gateway.limits.sessions_per_ip = three;
    })
    .await;
    for _ in 0..2 {
        system.create_session().await;
    }
    let mut client = relay_client(system.grpc).await;
    client
        .create_session(pb::CreateSessionRequest {})
        .await
        .unwrap();
    let refused = client
        .create_session(pb::CreateSessionRequest {})
        .await
        .unwrap_err();
    assert_over_budget(&refused);
    let over = system.post("/api/sessions", json!({})).await;
    assert_eq!(
        over.status,
        reqwest::StatusCode::TOO_MANY_REQUESTS,
        "{over:?}"
    );
    system.stop().await;
}
