//! The relay over real sockets: tonic clients as consumers and providers, WebSocket clients as
//! browser tabs. Calls served by a tab, by the example gRPC provider and by a polling provider,
//! in one step and in two; health and reflection (also from Python's grpcio-reflection).
#![allow(clippy::unwrap_used)] // a test that cannot unwrap should fail loudly

use serde_json::{Value, json};
use tokio_stream::StreamExt;
use toolrelay::json::{from_struct, to_struct};
use toolrelay::proto::v1::{
    self as pb, GetManifestRequest, GetRequestStatusRequest, GetSessionRequest,
    ListResponsesRequest, PollRequestsRequest, PostResponseRequest, RegisterManifestRequest,
    RequestStatus,
};
use toolrelay_tests::grpc::{BUILTINS, call, result_of, submit};
use toolrelay_tests::{
    PATIENCE, TestRelay, WsTab, demo_tools, grpc_channel, tab_and_builtin_names, wait_until,
    with_token,
};

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
            news: false,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(done.status(), RequestStatus::Completed);
    assert_eq!(result_of(&done), json!(3));
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
            content: Vec::new(),
            structured_content: None,
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
