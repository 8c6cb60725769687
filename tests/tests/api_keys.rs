//! `API_KEYS`: with keys set, the LLM-facing routes (calls, metadata, status, answers, built-in
//! tools, MCP, the legacy LLM aliases) need `Authorization: Bearer <key>`; the tab keeps its
//! provider token; discovery, health, the page, the plugin and the documents stay open; and
//! `actions.json` declares the bearer scheme so GPT Actions can send the key.
#![allow(clippy::unwrap_used)] // a test that cannot unwrap should fail loudly

use reqwest::{Method, StatusCode};
use rmcp::ServiceExt;
use rmcp::model::ClientConfig;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use serde_json::{Value, json};
use toolrelay_gateway::middleware::auth::ApiKeys;
use toolrelay_relay::RelayConfig;
use toolrelay_relay::config::{ENV_API_KEYS, ENV_RATE_LIMIT_LOOKUP};
use toolrelay_tests::system::{Answer, System, send};
use toolrelay_tests::{WsTab, demo_tools, python_on_file, relay_client, repo_file};

const KEY: &str = "test-key-0123456789abcdef";

async fn keyed_system() -> System {
    System::with(RelayConfig::default(), |config| {
        config.api_keys = ApiKeys::load(&[KEY.to_owned()], None).unwrap();
    })
    .await
}

async fn with_key(
    system: &System,
    method: Method,
    path: &str,
    key: Option<&str>,
    body: Option<Value>,
) -> Answer {
    let mut request = system.request(method, path);
    if let Some(key) = key {
        request = request.bearer_auth(key);
    }
    if let Some(body) = body {
        request = request.json(&body);
    }
    send(request).await
}

#[tokio::test]
async fn the_llm_side_needs_a_key_and_the_tab_side_its_token() {
    let system = keyed_system().await;
    // The tab's side works with its provider token alone.
    let (code, token) = system.create_session().await;
    let mut tab = WsTab::attach_url(&system.ws_url(&code, &token)).await;
    tab.register(demo_tools()).await;

    let echo = json!({"functionName": "echo", "args": {"text": "keyed"}});
    let llm_routes = [
        (Method::GET, format!("/api/sessions/{code}"), None),
        (Method::GET, format!("/api/sessions/{code}/metadata"), None),
        (
            Method::POST,
            format!("/api/sessions/{code}/request"),
            Some(echo.clone()),
        ),
        (Method::GET, format!("/api/sessions/{code}/response"), None),
        (
            Method::GET,
            format!("/api/sessions/{code}/requests/nothing"),
            None,
        ),
        (Method::GET, format!("/metadata?code={code}"), None),
    ];
    for (method, path, body) in &llm_routes {
        let missing = with_key(&system, method.clone(), path, None, body.clone()).await;
        assert_eq!(
            missing.status,
            StatusCode::UNAUTHORIZED,
            "{method} {path}: {missing:?}"
        );
        assert_eq!(missing.body["error"], "api_key_required");
        assert_eq!(missing.header("www-authenticate"), Some("Bearer"));
        let wrong = with_key(
            &system,
            method.clone(),
            path,
            Some("not-the-key-0123456789"),
            body.clone(),
        )
        .await;
        wrong.assert_refused(StatusCode::UNAUTHORIZED, "invalid_api_key");
    }
    // With the key, a call goes through to the tab.
    let call_path = format!("/api/sessions/{code}/call");
    let calling = with_key(&system, Method::POST, &call_path, Some(KEY), Some(echo));
    let answering = async {
        let request = tab.next_request().await;
        tab.answer(
            request["requestId"].as_str().unwrap(),
            json!({"text": "keyed"}),
        )
        .await;
    };
    let (answer, ()) = tokio::join!(calling, answering);
    assert_eq!(answer.status, StatusCode::OK, "{answer:?}");

    // The built-in tools keep their own error shape.
    let tool = with_key(
        &system,
        Method::POST,
        "/api/tools/encodePlantUML",
        None,
        Some(json!({"plantumlCode": "A -> B"})),
    )
    .await;
    assert_eq!(tool.status, StatusCode::UNAUTHORIZED);
    assert_eq!(tool.body["error"]["code"], "API_KEY_REQUIRED", "{tool:?}");
    let tool = with_key(
        &system,
        Method::POST,
        "/api/tools/encodePlantUML",
        Some(KEY),
        Some(json!({"plantumlCode": "A -> B"})),
    )
    .await;
    assert_eq!(tool.status, StatusCode::OK, "{tool:?}");

    // MCP: refused without the key, served with it.
    let anonymous = ClientConfig::default()
        .serve(StreamableHttpClientTransport::from_config(
            StreamableHttpClientTransportConfig::with_uri(system.url("/mcp")),
        ))
        .await;
    assert!(anonymous.is_err(), "MCP without a key is refused");
    let keyed = ClientConfig::default()
        .serve(StreamableHttpClientTransport::from_config(
            StreamableHttpClientTransportConfig::with_uri(system.url("/mcp")).auth_header(KEY),
        ))
        .await
        .unwrap();
    assert!(!keyed.list_tools(None).await.unwrap().tools.is_empty());
    keyed.cancel().await.unwrap();

    // Open to all: discovery, health, the page, the plugin, the documents.
    for path in [
        "/healthz",
        "/readyz",
        "/",
        "/codap/",
        "/.well-known/codap-mcp.json",
        "/openapi.json",
        "/openapi/actions.json",
    ] {
        let open = system.http.get(system.url(path)).send().await.unwrap();
        assert_eq!(open.status(), StatusCode::OK, "{path}");
    }
    // The tab ends its session with its token.
    let ended = send(
        system
            .request(Method::DELETE, &format!("/api/sessions/{code}"))
            .bearer_auth(&token),
    )
    .await;
    assert_eq!(ended.status, StatusCode::NO_CONTENT, "{ended:?}");
    system.stop().await;
}

/// The LLM-side responses of a document, operation by operation.
fn llm_responses(document: &Value) -> Vec<(String, Value)> {
    document["paths"]
        .as_object()
        .unwrap()
        .iter()
        .flat_map(|(path, item)| {
            item.as_object()
                .unwrap()
                .iter()
                .map(move |(method, operation)| (format!("{method} {path}"), operation.clone()))
        })
        .collect()
}

#[tokio::test]
async fn actions_declare_the_bearer_scheme_only_when_keys_are_set() {
    // Without keys (the checked-in document): no security, and no 401/403 that only a
    // provider token could cause (readTool's 403 is a function not marked read-only).
    let open: Value =
        serde_json::from_str(&std::fs::read_to_string(repo_file("openapi/actions.json")).unwrap())
            .unwrap();
    assert!(open["components"].get("securitySchemes").is_none());
    for (operation, item) in llm_responses(&open) {
        assert!(item["responses"].get("401").is_none(), "{operation}");
        let read = operation.ends_with("/read");
        assert_eq!(item["responses"].get("403").is_some(), read, "{operation}");
        assert!(item.get("security").is_none(), "{operation}");
    }

    let system = keyed_system().await;
    let body = system
        .http
        .get(system.url("/openapi/actions.json"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let keyed: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        keyed["components"]["securitySchemes"]["apiKey"],
        json!({"type": "http", "scheme": "bearer", "description": "An API key from the relay's operator."})
    );
    for (operation, item) in llm_responses(&keyed) {
        assert_eq!(item["security"], json!([{"apiKey": []}]), "{operation}");
        assert!(item["responses"].get("401").is_some(), "{operation}");
        let read = operation.ends_with("/read");
        assert_eq!(item["responses"].get("403").is_some(), read, "{operation}");
    }
    // Still valid OpenAPI.
    let output = python_on_file("validate_openapi.py", "keyed-actions.json", body.as_bytes()).await;
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    system.stop().await;
}

/// A gRPC request carrying `key` (when given) as `authorization: Bearer`.
fn keyed<T>(message: T, key: Option<&str>) -> tonic::Request<T> {
    match key {
        Some(key) => toolrelay_tests::with_token(message, key),
        None => tonic::Request::new(message),
    }
}

/// The consumer RPCs of session `code`, each with `key`: how each ended.
async fn consumer_rpcs(
    grpc: std::net::SocketAddr,
    code: &str,
    key: Option<&str>,
) -> Vec<Result<(), tonic::Status>> {
    use toolrelay::proto::v1 as pb;
    let mut client = relay_client(grpc).await;
    let session = pb::GetSessionRequest { code: code.into() };
    let manifest = pb::GetManifestRequest { code: code.into() };
    let responses = pb::ListResponsesRequest {
        code: code.into(),
        request_id: String::new(),
    };
    let tool = pb::CallToolRequest {
        name: "encodePlantUML".into(),
        args: Some(toolrelay::json::to_struct(
            &json!({"plantumlCode": "@startuml\nA -> B\n@enduml"}),
        )),
        scope: None,
    };
    vec![
        client.get_session(keyed(session, key)).await.map(drop),
        client.get_manifest(keyed(manifest, key)).await.map(drop),
        client.list_responses(keyed(responses, key)).await.map(drop),
        client
            .list_tools(keyed(pb::ListToolsRequest {}, key))
            .await
            .map(drop),
        client.call_tool(keyed(tool, key)).await.map(drop),
    ]
}

fn refused_as(results: &[Result<(), tonic::Status>], name: &str) {
    for result in results {
        let status = result.as_ref().unwrap_err();
        assert_eq!(status.code(), tonic::Code::Unauthenticated, "{status:?}");
        assert_eq!(toolrelay_tests::error_name(status), name, "{status:?}");
    }
}

/// With keys set, a client on the relay's gRPC port needs one on every consumer RPC, as over
/// HTTP; the provider side keeps its token.
#[tokio::test]
async fn grpc_consumers_need_a_key_and_providers_their_token() {
    let keys = ApiKeys::load(&[KEY.to_owned()], None).unwrap();
    let relay = RelayConfig {
        api_keys: keys.clone(),
        ..RelayConfig::default()
    };
    let system = System::with(relay, |config| config.api_keys = keys).await;
    let mut client = relay_client(system.grpc).await;
    let created = client
        .create_session(toolrelay::proto::v1::CreateSessionRequest {})
        .await
        .unwrap()
        .into_inner();
    let register = toolrelay::proto::v1::RegisterManifestRequest {
        code: created.code.clone(),
        tools: Vec::new(),
        tools_json: demo_tools().to_string(),
        approves: false,
    };
    client
        .register_manifest(toolrelay_tests::with_token(
            register,
            &created.provider_token,
        ))
        .await
        .unwrap();

    refused_as(
        &consumer_rpcs(system.grpc, &created.code, None).await,
        "api_key_required",
    );
    refused_as(
        &consumer_rpcs(system.grpc, &created.code, Some("not-a-key-0123456789")).await,
        "invalid_api_key",
    );
    for result in consumer_rpcs(system.grpc, &created.code, Some(KEY)).await {
        result.unwrap();
    }
    system.stop().await;
}

/// A split gateway proves itself to the relay (the gateway secret): its callers' keys are
/// checked once, by the gateway, while a client on the relay's own gRPC port needs a key.
#[tokio::test]
async fn a_split_relay_takes_the_keys_too_and_a_proven_gateway_needs_none() {
    let system = System::split_with(&[(ENV_API_KEYS, KEY)], &[(ENV_API_KEYS, KEY)]).await;
    let (code, token) = system.create_session().await;
    let mut tab = WsTab::attach_url(&system.ws_url(&code, &token)).await;
    tab.register(demo_tools()).await;
    let call = json!({"functionName": "echo", "args": {"text": "through"}});
    let path = format!("/api/sessions/{code}/call");
    let answering = async {
        let request = tab.next_request().await;
        let id = request["requestId"].as_str().unwrap().to_owned();
        tab.answer(&id, json!({"text": "through"})).await;
    };
    let (called, ()) = tokio::join!(
        with_key(&system, Method::POST, &path, Some(KEY), Some(call)),
        answering
    );
    assert_eq!(called.status, StatusCode::OK, "{called:?}");
    refused_as(
        &consumer_rpcs(system.grpc, &code, None).await,
        "api_key_required",
    );
    system.stop().await;
}

/// Where the session's expiry stands, asked with the key (reading the status slides nothing).
async fn expires_at(system: &System, code: &str) -> String {
    let status = with_key(
        system,
        Method::GET,
        &format!("/api/sessions/{code}"),
        Some(KEY),
        None,
    )
    .await;
    assert_eq!(status.status, StatusCode::OK, "{status:?}");
    status.body["expiresAt"].as_str().unwrap().to_owned()
}

#[tokio::test]
async fn head_is_guarded_like_get_and_slides_nothing_without_the_key() {
    // A 10 s time to live: activity moves the expiry once it moves it by a tenth (1 s), so
    // 1.2 s of refused HEADs would show if they were activity.
    let system = System::with(
        RelayConfig {
            session_ttl: std::time::Duration::from_secs(10),
            heartbeat_interval: std::time::Duration::from_secs(3),
            ..RelayConfig::default()
        },
        |config| {
            config.api_keys = ApiKeys::load(&[KEY.to_owned()], None).unwrap();
        },
    )
    .await;
    let (code, token) = system.create_session().await;
    system.put_manifest(&code, &token, demo_tools()).await;
    let first = expires_at(&system, &code).await;
    // For over a second (the expiry has millisecond precision), HEAD without a key is refused
    // and the session's expiry stays where it was.
    let started = std::time::Instant::now();
    while started.elapsed() < std::time::Duration::from_millis(1200) {
        for path in [
            format!("/api/sessions/{code}/metadata"),
            format!("/api/sessions/{code}"),
            format!("/metadata?code={code}"),
        ] {
            let head = with_key(&system, Method::HEAD, &path, None, None).await;
            assert_eq!(head.status, StatusCode::UNAUTHORIZED, "HEAD {path}");
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(
        expires_at(&system, &code).await,
        first,
        "HEAD slid the expiry"
    );
    // With the key, HEAD is GET without the body (fetching the tools is activity).
    let path = format!("/api/sessions/{code}/metadata");
    let head = with_key(&system, Method::HEAD, &path, Some(KEY), None).await;
    assert_eq!(head.status, StatusCode::OK, "{head:?}");
    assert_ne!(expires_at(&system, &code).await, first);
    system.stop().await;
}

#[tokio::test]
async fn a_tab_checks_its_own_session_with_its_token_instead_of_a_key() {
    let system = keyed_system().await;
    let (code, token) = system.create_session().await;
    let path = format!("/api/sessions/{code}");
    // What the SDK does when a reloaded page resumes its stored session.
    let own = with_key(&system, Method::GET, &path, Some(&token), None).await;
    assert_eq!(own.status, StatusCode::OK, "{own:?}");
    assert_eq!(
        own.body["code"].as_str().map(|c| c.replace('-', "")),
        Some(code.replace('-', ""))
    );
    let keyed = with_key(&system, Method::GET, &path, Some(KEY), None).await;
    assert_eq!(keyed.status, StatusCode::OK, "{keyed:?}");
    let anonymous = with_key(&system, Method::GET, &path, None, None).await;
    assert_eq!(anonymous.status, StatusCode::UNAUTHORIZED);
    let wrong = with_key(
        &system,
        Method::GET,
        &path,
        Some("not-a-key-or-a-token"),
        None,
    )
    .await;
    wrong.assert_refused(StatusCode::UNAUTHORIZED, "invalid_api_key");
    // A token proves only its own session: another session's status still needs the key.
    let (other, _) = system.create_session().await;
    let other = with_key(
        &system,
        Method::GET,
        &format!("/api/sessions/{other}"),
        Some(&token),
        None,
    )
    .await;
    assert_eq!(other.status, StatusCode::UNAUTHORIZED, "{other:?}");
    // The SDK sends it.
    let source = system
        .http
        .get(system.url("/sdk/session.js"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        source.contains("Authorization: `Bearer ${stored.token}`"),
        "the SDK checks a stored session with its token"
    );
    system.stop().await;
}

#[tokio::test]
async fn a_tab_checks_its_own_session_with_its_token_through_a_split_gateway() {
    let system = System::split_with(&[(ENV_RATE_LIMIT_LOOKUP, "1")], &[(ENV_API_KEYS, KEY)]).await;
    let (code, token) = system.create_session().await;
    let path = format!("/api/sessions/{code}");
    let own = with_key(&system, Method::GET, &path, Some(&token), None).await;
    assert_eq!(own.status, StatusCode::OK, "{own:?}");
    let wrong = with_key(
        &system,
        Method::GET,
        &path,
        Some("not-a-key-or-a-token"),
        None,
    )
    .await;
    assert_eq!(wrong.status, StatusCode::UNAUTHORIZED, "{wrong:?}");
    // Blocked for guessing, the address still checks its own session with its token.
    for n in ["ZZZZAAAA", "ZZZZBBBB"] {
        with_key(
            &system,
            Method::GET,
            &format!("/api/sessions/{n}"),
            Some(KEY),
            None,
        )
        .await;
    }
    let blocked = with_key(&system, Method::GET, &path, Some(KEY), None).await;
    assert_eq!(blocked.status, StatusCode::TOO_MANY_REQUESTS, "{blocked:?}");
    let own = with_key(&system, Method::GET, &path, Some(&token), None).await;
    assert_eq!(own.status, StatusCode::OK, "{own:?}");
    system.stop().await;
}
