//! The relay over real sockets refusing what it must: the provider token is required and the
//! code alone is refused; bad input gets a clear error and changes nothing; gRPC clients spend
//! the session and tool budgets of their own address.
#![allow(clippy::unwrap_used)] // a test that cannot unwrap should fail loudly

use serde_json::json;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Code;
use toolrelay::json::to_struct;
use toolrelay::proto::v1::{
    self as pb, CallRequest, GetManifestRequest, GetRequestStatusRequest, GetSessionRequest,
    ListResponsesRequest, PollRequestsRequest, PostResponseRequest, RegisterManifestRequest,
    RequestStatus, SubmitRequest,
};
use toolrelay_relay::RelayConfig;
use toolrelay_tests::grpc::{BUILTINS, call, result_of, submit};
use toolrelay_tests::{
    PATIENCE, TestRelay, WsTab, error_name, relay_client, wait_until, with_token,
};

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
