//! The built-in tools over HTTP (`/api/tools`, sessions) and gRPC: the PlantUML encoder and
//! decoder, the tool API's error contract, and one registry everywhere.
#![allow(clippy::unwrap_used)] // a test that cannot unwrap should fail loudly

use std::sync::Arc;

use async_trait::async_trait;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use toolrelay::json::{from_struct, from_value, to_struct};
use toolrelay::proto::v1::{CallToolRequest, ListToolsRequest};
use toolrelay_builtin::BuiltinConfig;
use toolrelay_relay::builtin::{Context, FailureKind, Registry, Tool, ToolCode, ToolFailure};
use toolrelay_relay::store::memory::MemoryStore;
use toolrelay_relay::{Clock, Relay, RelayConfig};
use toolrelay_tests::system::{Answer, System, send};
use toolrelay_tests::{BUILTIN_TOOLS, TestRelay};

/// PlantUML's own "Bob -> Alice : hello" example and its published encoding.
const HELLO: &str = "@startuml\nBob -> Alice : hello\n@enduml";
const HELLO_PUBLISHED: &str = "SoWkIImgAStDuNBAJrBGjLDmpCbCJbMmKiX8pSd9vt98pKi1IW80";

async fn encode(system: &System, body: Value) -> Answer {
    system.post("/api/tools/encodePlantUML", body).await
}

async fn decode(system: &System, body: Value) -> Answer {
    system.post("/api/tools/decodePlantUML", body).await
}

/// A text of exactly `bytes` bytes of varied diagram lines.
fn diagram_of(bytes: usize) -> String {
    let mut text = String::from("@startuml\n");
    let mut n = 0;
    while text.len() < bytes - 9 {
        text.push_str(&format!(
            "Actor{} -> Service{} : step {} ✓\n",
            n % 17,
            n % 5,
            n
        ));
        n += 1;
    }
    text.truncate(text.floor_char_boundary(bytes - 8));
    text.push_str("\n@enduml");
    while text.len() < bytes {
        text.insert(text.len() - 8, ' ');
    }
    assert_eq!(text.len(), bytes);
    text
}

#[tokio::test]
async fn encode_then_decode_returns_the_exact_text() {
    let system = System::start().await;
    let texts = [
        HELLO.to_owned(),
        "@startuml\nA -> B : 🎉 emoji, 漢字, ünïcödé\n@enduml".to_owned(),
        "\n\n   @startuml\n\n\tA -> B\n\n@enduml   \n\n".to_owned(),
        diagram_of(50 * 1024),
    ];
    for text in texts {
        let encoded = encode(&system, json!({"plantumlCode": text})).await;
        assert_eq!(encoded.status, StatusCode::OK, "{encoded:?}");
        assert_eq!(encoded.body["success"], true);
        let result = &encoded.body["result"];
        let code = result["encoded"].as_str().unwrap();
        assert_eq!(result["format"], "svg");
        assert_eq!(
            result["url"],
            format!("https://www.plantuml.com/plantuml/svg/{code}")
        );
        assert!(
            code.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        );

        let again = encode(&system, json!({"plantumlCode": text})).await;
        assert_eq!(
            again.body["result"]["url"], result["url"],
            "the same code gives the same URL"
        );

        let decoded = decode(&system, json!({"encoded": code})).await;
        assert_eq!(
            decoded.body["result"]["plantumlCode"],
            text.as_str(),
            "exactly the text"
        );
        let from_url = decode(&system, json!({"url": result["url"]})).await;
        assert_eq!(from_url.body["result"]["plantumlCode"], text.as_str());
    }
    system.stop().await;
}

#[tokio::test]
async fn known_vectors_agree_with_plantuml() {
    let system = System::start().await;
    let published = decode(&system, json!({"encoded": HELLO_PUBLISHED})).await;
    assert_eq!(
        published.body["result"]["plantumlCode"], HELLO,
        "{published:?}"
    );
    let from_site = decode(
        &system,
        json!({"url": "https://www.plantuml.com/plantuml/uml/Syp9J4vLqBLJSCfFib9mB2t9ICqhoKnEBCdCprC8IYqiJIqkuGBAAUW2rO0LOr5LN92VLvpA1G00"}),
    )
    .await;
    assert_eq!(
        from_site.body["result"]["plantumlCode"],
        "Alice -> Bob: Authentication Request\nBob --> Alice: Authentication Response\n"
    );
    let hex = decode(&system, json!({"encoded": "~h407374617274756d6c0a416c6963652d3e426f62203a204920616d207573696e67206865780a40656e64756d6c"})).await;
    assert_eq!(
        hex.body["result"]["plantumlCode"],
        "@startuml\nAlice->Bob : I am using hex\n@enduml"
    );

    // Our encoding of PlantUML's example decodes, with PlantUML's alphabet and framing.
    let ours = encode(&system, json!({"plantumlCode": HELLO})).await;
    let ours = ours.body["result"]["encoded"].as_str().unwrap().to_owned();
    assert_eq!(
        &ours[..40],
        &HELLO_PUBLISHED[..40],
        "the same DEFLATE start"
    );
    assert_eq!(ours.len() % 4, 0);
    assert_eq!(
        decode(&system, json!({"encoded": ours})).await.body["result"]["plantumlCode"],
        HELLO
    );
    system.stop().await;
}

#[tokio::test]
async fn formats_and_servers_shape_the_url() {
    let tools = BuiltinConfig {
        plantuml_server: "https://plantuml.internal.example/".into(),
        ..Default::default()
    };
    let system = System::with_tools(RelayConfig::default(), tools, |_| {}).await;
    let png = encode(&system, json!({"plantumlCode": HELLO, "format": "png"})).await;
    let url = png.body["result"]["url"].as_str().unwrap();
    assert!(
        url.starts_with("https://plantuml.internal.example/plantuml/png/"),
        "{url}"
    );
    let txt = encode(&system, json!({"plantumlCode": HELLO, "format": "txt", "serverUrl": "http://localhost:9999/plantuml"})).await;
    assert!(
        txt.body["result"]["url"]
            .as_str()
            .unwrap()
            .starts_with("http://localhost:9999/plantuml/txt/"),
        "{txt:?}"
    );
    system.stop().await;
}

/// A tool whose encoder fails, to see the contract's 500 through HTTP.
struct BrokenEncoder;

#[async_trait]
impl Tool for BrokenEncoder {
    fn name(&self) -> &'static str {
        "brokenEncoder"
    }
    fn description(&self) -> &'static str {
        "Always fails to encode."
    }
    fn input_schema(&self) -> Value {
        json!({"type": "object"})
    }
    fn output_schema(&self) -> Value {
        json!({"type": "object"})
    }
    fn hints(&self) -> toolrelay_relay::builtin::ToolHints {
        toolrelay_relay::builtin::ToolHints::default()
    }
    async fn call(&self, _args: Value, _context: &Context) -> Result<Value, ToolFailure> {
        Err(ToolFailure::new(
            FailureKind::Internal,
            ToolCode::EncodingFailed,
            "The encoder failed.",
        ))
    }
}

#[tokio::test]
async fn every_error_of_the_tool_api_over_http() {
    let system = System::start().await;
    let raw = |method: Method, path: &str| system.request(method, path);
    let json_body = |body: &str| {
        raw(Method::POST, "/api/tools/encodePlantUML")
            .header("content-type", "application/json")
            .body(body.to_owned())
    };
    let cases: Vec<(reqwest::RequestBuilder, StatusCode, &str)> = vec![
        (
            raw(Method::POST, "/api/tools/encodePlantUML").json(&json!({"plantumlCode": ""})),
            StatusCode::BAD_REQUEST,
            "EMPTY_CODE",
        ),
        (
            raw(Method::POST, "/api/tools/encodePlantUML")
                .json(&json!({"plantumlCode": " \n\t \n"})),
            StatusCode::BAD_REQUEST,
            "EMPTY_CODE",
        ),
        (
            raw(Method::POST, "/api/tools/encodePlantUML")
                .json(&json!({"plantumlCode": diagram_of(50 * 1024 + 1)})),
            StatusCode::PAYLOAD_TOO_LARGE,
            "CODE_TOO_LARGE",
        ),
        (
            raw(Method::POST, "/api/tools/nope").json(&json!({})),
            StatusCode::NOT_FOUND,
            "TOOL_NOT_FOUND",
        ),
        (
            raw(Method::GET, "/api/tools/encodePlantUML"),
            StatusCode::METHOD_NOT_ALLOWED,
            "METHOD_NOT_ALLOWED",
        ),
        (
            raw(Method::POST, "/api/tools/").json(&json!({})),
            StatusCode::BAD_REQUEST,
            "TOOL_NAME_REQUIRED",
        ),
        (
            json_body("{not json"),
            StatusCode::BAD_REQUEST,
            "INVALID_JSON",
        ),
        (
            raw(Method::POST, "/api/tools/encodePlantUML").json(&json!({"plantumlCode": 5})),
            StatusCode::BAD_REQUEST,
            "INVALID_ARGUMENTS",
        ),
        (
            raw(Method::POST, "/api/tools/encodePlantUML")
                .json(&json!({"plantumlCode": HELLO, "format": "gif"})),
            StatusCode::BAD_REQUEST,
            "INVALID_ARGUMENTS",
        ),
        (
            raw(Method::POST, "/api/tools/decodePlantUML")
                .json(&json!({"encoded": "not an encoding!"})),
            StatusCode::BAD_REQUEST,
            "INVALID_ENCODING",
        ),
        (
            raw(Method::POST, "/api/tools/decodePlantUML").json(&json!({})),
            StatusCode::BAD_REQUEST,
            "EMPTY_CODE",
        ),
    ];
    for (request, status, code) in cases {
        let answer = send(request).await;
        assert_eq!(answer.status, status, "{code}: {answer:?}");
        assert_eq!(answer.body["success"], false, "{answer:?}");
        assert_eq!(answer.body["error"]["code"], code, "{answer:?}");
        assert!(
            answer.body["error"]["message"]
                .as_str()
                .is_some_and(|m| m.len() > 10)
        );
        assert_eq!(answer.header("access-control-allow-origin"), Some("*"));
    }
    system.stop().await;

    // ENCODING_FAILED: a registry with an encoder that fails.
    let config = RelayConfig::default();
    let clock = Clock::new();
    let relay = Relay::with_tools(
        MemoryStore::new(clock.clone(), config.response_retention),
        config,
        clock,
        Registry::new(vec![Arc::new(BrokenEncoder)]),
        toolrelay_relay::Metrics::default(),
    );
    let system = System::serving(relay, |_| {}).await;
    let failed = system.post("/api/tools/brokenEncoder", json!({})).await;
    assert_eq!(failed.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(
        failed.body,
        json!({"success": false, "error": {"code": "ENCODING_FAILED", "message": "The encoder failed."}})
    );
    system.stop().await;
}

#[tokio::test]
async fn the_tool_routes_are_open_to_every_origin() {
    let system = System::start().await;
    let preflight = system
        .request(Method::OPTIONS, "/api/tools/encodePlantUML")
        .header("origin", "https://some-agent.example")
        .header("access-control-request-method", "POST")
        .header("access-control-request-headers", "content-type")
        .send()
        .await
        .unwrap();
    assert!(preflight.status().is_success());
    assert_eq!(preflight.headers()["access-control-allow-origin"], "*");
    assert!(
        preflight.headers()["access-control-allow-methods"]
            .to_str()
            .unwrap()
            .contains("POST")
    );
    let call = send(
        system
            .request(Method::POST, "/api/tools/encodePlantUML")
            .header("origin", "https://some-agent.example")
            .json(&json!({"plantumlCode": HELLO})),
    )
    .await;
    assert_eq!(call.status, StatusCode::OK);
    assert_eq!(call.header("access-control-allow-origin"), Some("*"));
    system.stop().await;
}

#[tokio::test]
async fn the_tools_are_listed_identically_by_api_tools_and_in_a_session() {
    let system = System::start().await;
    let listed = system.get("/api/tools").await;
    let listed: Vec<Value> = listed.body["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|tool| {
            assert_eq!(tool["id"], tool["name"]);
            json!({"name": tool["name"], "description": tool["description"], "schema": tool["inputSchema"]})
        })
        .collect();
    assert_eq!(listed.len(), BUILTIN_TOOLS.len());

    let (code, _) = system.create_session().await;
    let metadata = system.get(&format!("/api/sessions/{code}/metadata")).await;
    let relay_group = metadata.body["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|group| group["id"] == "relay")
        .expect("the built-in group")
        .clone();
    let in_session: Vec<Value> = relay_group["functions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| json!({"name": f["name"], "description": f["description"], "schema": f["parameters"]}))
        .collect();
    assert_eq!(listed, in_session);

    let flat = system.get(&format!("/metadata?code={code}")).await;
    let flat_names: Vec<&str> = flat.body["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(flat_names, BUILTIN_TOOLS);
    system.stop().await;
}

#[tokio::test]
async fn a_built_in_tool_runs_through_a_session_without_a_tab() {
    let system = System::start().await;
    let (code, token) = system.create_session().await;
    let call = json!({"requestId": "diagram-1", "functionName": "encodePlantUML", "args": {"plantumlCode": HELLO}});
    let answer = system
        .post(&format!("/api/sessions/{code}/call"), call.clone())
        .await;
    assert_eq!(answer.status, StatusCode::OK, "{answer:?}");
    assert_eq!(answer.body["success"], true);
    let encoded = answer.body["result"]["encoded"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(
        decode(&system, json!({"encoded": encoded})).await.body["result"]["plantumlCode"],
        HELLO
    );
    let state = system
        .get(&format!("/api/sessions/{code}/requests/diagram-1"))
        .await;
    assert_eq!(state.body["status"], "completed");
    let repeat = system
        .post(&format!("/api/sessions/{code}/call"), call)
        .await;
    assert_eq!(
        repeat.body, answer.body,
        "the same requestId returns the same answer"
    );

    // A tool failure reaches the LLM as a failed call with the tool's code.
    let empty = system
        .post(
            &format!("/api/sessions/{code}/call"),
            json!({"functionName": "encodePlantUML", "args": {"plantumlCode": " "}}),
        )
        .await;
    assert_eq!(empty.status, StatusCode::OK);
    assert_eq!(empty.body["success"], false);
    assert_eq!(empty.body["error"]["code"], "EMPTY_CODE");

    // A tab may not take a built-in tool's name.
    let clash = send(
        system
            .request(Method::PUT, &format!("/api/sessions/{code}/manifest"))
            .bearer_auth(&token)
            .json(&json!({"tools": [{"name": "encodePlantUML"}]})),
    )
    .await;
    clash.assert_refused(StatusCode::BAD_REQUEST, "invalid_manifest");
    let status = system.get(&format!("/api/sessions/{code}")).await;
    assert_eq!(status.body["pendingRequests"], 0);
    system.stop().await;
}

#[tokio::test]
async fn grpc_lists_and_calls_the_same_tools() {
    let relay = TestRelay::start().await;
    let mut client = relay.client().await;
    let tools = client
        .list_tools(ListToolsRequest {})
        .await
        .unwrap()
        .into_inner()
        .tools;
    let names: Vec<&str> = tools.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, BUILTIN_TOOLS);
    assert_eq!(
        from_struct(tools[0].input_schema.as_ref().unwrap())["required"],
        json!(["plantumlCode"])
    );

    let call = |name: &str, args: Value| CallToolRequest {
        name: name.into(),
        args: Some(to_struct(&args)),
        scope: None,
    };
    let encoded = client
        .call_tool(call("encodePlantUML", json!({"plantumlCode": HELLO})))
        .await
        .unwrap()
        .into_inner();
    assert!(encoded.success);
    let result = from_value(encoded.result.as_ref().unwrap());
    let decoded = client
        .call_tool(call(
            "decodePlantUML",
            json!({"encoded": result["encoded"]}),
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        from_value(decoded.result.as_ref().unwrap())["plantumlCode"],
        HELLO
    );
    let empty = client
        .call_tool(call("encodePlantUML", json!({"plantumlCode": ""})))
        .await
        .unwrap()
        .into_inner();
    assert!(!empty.success);
    assert_eq!(empty.failure.unwrap().code, "EMPTY_CODE");
    relay.stop().await;
}

#[tokio::test]
async fn split_gateway_reaches_the_tools_over_grpc() {
    let system = System::split().await;
    let listed = system.get("/api/tools").await;
    assert_eq!(
        listed.body["tools"][0]["name"], "encodePlantUML",
        "{listed:?}"
    );
    let encoded = encode(&system, json!({"plantumlCode": HELLO})).await;
    assert_eq!(encoded.status, StatusCode::OK, "{encoded:?}");
    let empty = encode(&system, json!({"plantumlCode": ""})).await;
    assert_eq!(
        (empty.status, empty.body["error"]["code"].as_str()),
        (StatusCode::BAD_REQUEST, Some("EMPTY_CODE"))
    );
    system.stop().await;
}
