//! MCP over Streamable HTTP with rmcp's own client: the built-in tools on `/mcp`, pairing with a
//! tab, the session-scoped server on `/mcp/s/{handle}`, errors, progress, timeouts, the
//! Host/Origin checks, the split gateway, MIP ids' scopes, and tool-list changes.
#![allow(clippy::unwrap_used)] // a test that cannot unwrap should fail loudly

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use reqwest::StatusCode;
use rmcp::model::{CallToolResult, ClientConfig, ProgressNotificationParam};
use rmcp::service::{NotificationContext, RunningService};
use rmcp::{ClientHandler, RoleClient};
use serde_json::{Value, json};
use toolrelay_relay::RelayConfig;
use toolrelay_tests::mcp::{call, call_unknown, connect_with};
use toolrelay_tests::system::{System, send};
use toolrelay_tests::{Deadline, WsTab, demo_tools, tab_and_builtin_names, wait_until};

#[derive(Clone, Default)]
struct Client {
    progress: Arc<Mutex<Vec<ProgressNotificationParam>>>,
    tool_list_changes: Arc<std::sync::atomic::AtomicUsize>,
}

impl ClientHandler for Client {
    async fn on_tool_list_changed(&self, _context: NotificationContext<RoleClient>) {
        self.tool_list_changes
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }

    async fn on_progress(
        &self,
        params: ProgressNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        self.progress.lock().unwrap().push(params);
    }

    fn get_info(&self) -> ClientConfig {
        ClientConfig::default()
    }
}

type Connection = RunningService<RoleClient, Client>;

async fn connect(url: &str) -> Connection {
    connect_with(Client::default(), url).await
}

fn text(result: &CallToolResult) -> String {
    result
        .content
        .iter()
        .filter_map(|content| content.as_text().map(|text| text.text.clone()))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The connector handle `connect_session` gives for `code`.
async fn handle_of(mcp: &Connection, code: &str) -> String {
    let paired = call(mcp, "connect_session", json!({"code": code})).await;
    structured(&paired)["handle"].as_str().unwrap().to_owned()
}

fn structured(result: &CallToolResult) -> Value {
    result.structured_content.clone().unwrap_or(Value::Null)
}

fn assert_error(result: &CallToolResult, code: &str, words: &str) {
    assert_eq!(result.is_error, Some(true), "{result:?}");
    assert_eq!(structured(result)["error"]["code"], code, "{result:?}");
    assert!(
        text(result).contains(words),
        "{:?} should mention {words:?}",
        text(result)
    );
}

#[tokio::test]
async fn the_built_in_tools_over_mcp() {
    let system = System::start().await;
    let mcp = connect(&system.url("/mcp")).await;
    let info = mcp.peer_info().unwrap();
    assert_eq!(info.protocol_version.to_string(), "2025-11-25");
    let names: Vec<String> = mcp
        .list_tools(None)
        .await
        .unwrap()
        .tools
        .iter()
        .map(|t| t.name.to_string())
        .collect();
    assert_eq!(names, toolrelay_tests::mcp_tools());

    let encoded = call(
        &mcp,
        "encodePlantUML",
        json!({"plantumlCode": "@startuml\nBob -> Alice : hello\n@enduml"}),
    )
    .await;
    assert_eq!(encoded.is_error, Some(false));
    let result = structured(&encoded);
    assert!(
        result["url"]
            .as_str()
            .unwrap()
            .starts_with("https://www.plantuml.com/plantuml/svg/")
    );
    assert!(
        text(&encoded).contains(result["encoded"].as_str().unwrap()),
        "the text renders the result"
    );
    let decoded = call(
        &mcp,
        "decodePlantUML",
        json!({"encoded": result["encoded"]}),
    )
    .await;
    assert_eq!(
        structured(&decoded)["plantumlCode"],
        "@startuml\nBob -> Alice : hello\n@enduml"
    );

    assert_error(
        &call(&mcp, "encodePlantUML", json!({"plantumlCode": " "})).await,
        "EMPTY_CODE",
        "cannot be empty",
    );
    assert_error(
        &call(&mcp, "encodePlantUML", json!({"plantumlCode": 5})).await,
        "INVALID_ARGUMENTS",
        "/plantumlCode",
    );
    // A name that is no tool is a protocol error (-32602), naming the tools there are.
    let unknown = call_unknown(&mcp, "nope").await;
    assert_eq!(unknown.code.0, -32602, "{unknown:?}");
    assert!(unknown.message.contains("encodePlantUML"), "{unknown:?}");
    mcp.cancel().await.unwrap();
    system.stop().await;
}

#[tokio::test]
async fn pairing_over_mcp_reaches_a_websocket_tab() {
    let system = System::start().await;
    let (code, token) = system.create_session().await;
    let mut tab = WsTab::attach_url(&system.ws_url(&code, &token)).await;
    tab.register(demo_tools()).await;
    let mcp = connect(&system.url("/mcp")).await;

    let paired = call(
        &mcp,
        "connect_session",
        json!({"code": code.to_lowercase()}),
    )
    .await;
    assert_eq!(paired.is_error, Some(false), "{paired:?}");
    let paired = structured(&paired);
    let handle = paired["handle"].as_str().unwrap().to_owned();
    assert_eq!(handle.len(), 32);
    assert_eq!(
        paired["connectorUrl"],
        system.url(&format!("/mcp/s/{handle}"))
    );
    assert_eq!(paired["code"], code.as_str(), "programs get the plain form");
    assert_eq!(
        paired["displayCode"],
        format!("{}-{}", &code[..4], &code[4..]),
        "people see the hyphenated one"
    );
    let tool_names: Vec<&str> = paired["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(tool_names, tab_and_builtin_names());

    let listed = call(&mcp, "list_session_tools", json!({"session": handle})).await;
    assert_eq!(
        structured(&listed)["tools"][0]["inputSchema"]["required"],
        json!(["text"])
    );

    // call_session_tool reaches the tab, by handle and by code.
    for session in [handle.clone(), code.clone()] {
        let calling = call(
            &mcp,
            "call_session_tool",
            json!({"session": session, "name": "echo", "arguments": {"text": "hi"}}),
        );
        let tab_side = async {
            let request = tab.next_request().await;
            tab.answer(
                request["requestId"].as_str().unwrap(),
                json!({"echoed": request["args"]["text"]}),
            )
            .await;
        };
        let (answer, ()) = tokio::join!(calling, tab_side);
        assert_eq!(answer.is_error, Some(false), "{answer:?}");
        assert_eq!(structured(&answer), json!({"echoed": "hi"}));
    }

    // The connector URL serves exactly the session's tools, callable by name.
    let scoped = connect(&system.url(&format!("/mcp/s/{handle}"))).await;
    let names: Vec<String> = scoped
        .list_tools(None)
        .await
        .unwrap()
        .tools
        .iter()
        .map(|t| t.name.to_string())
        .collect();
    assert_eq!(names, tab_and_builtin_names());
    let adding = call(&scoped, "add", json!({"a": 2, "b": 3}));
    let tab_side = async {
        let request = tab.next_request().await;
        assert_eq!(request["functionName"], "add");
        tab.answer(request["requestId"].as_str().unwrap(), json!(5))
            .await;
    };
    let (sum, ()) = tokio::join!(adding, tab_side);
    assert_eq!(
        structured(&sum),
        json!({"result": 5}),
        "a non-object result is wrapped"
    );
    assert_eq!(text(&sum), "5");
    let builtin = call(
        &scoped,
        "encodePlantUML",
        json!({"plantumlCode": "@startuml\nA -> B\n@enduml"}),
    )
    .await;
    assert_eq!(
        builtin.is_error,
        Some(false),
        "built-in tools run in the session without the tab"
    );

    scoped.cancel().await.unwrap();
    mcp.cancel().await.unwrap();
    system.stop().await;
}

#[tokio::test]
async fn unknown_handles_ended_sessions_bad_arguments_and_unknown_tools_are_clear_errors() {
    let system = System::start().await;
    let (code, token) = system.create_session().await;
    let mut tab = WsTab::attach_url(&system.ws_url(&code, &token)).await;
    tab.register(demo_tools()).await;
    let mcp = connect(&system.url("/mcp")).await;
    let handle = handle_of(&mcp, &code).await;
    let scoped = connect(&system.url(&format!("/mcp/s/{handle}"))).await;

    assert_error(
        &call(&scoped, "echo", json!({"text": 5})).await,
        "invalid_arguments",
        "/text",
    );
    let unknown = call_unknown(&scoped, "nope").await;
    assert_eq!(unknown.code.0, -32602, "{unknown:?}");
    assert!(unknown.message.contains("echo, add"), "{unknown:?}");
    // Inside call_session_tool it stays the tool's failure, naming the functions, so that the
    // model can correct itself (and never the code).
    let inside = call(
        &mcp,
        "call_session_tool",
        json!({"session": handle, "name": "nope", "arguments": {}}),
    )
    .await;
    assert_error(&inside, "unknown_function", "echo, add");
    assert!(!text(&inside).contains(&code), "{inside:?}");
    assert_error(
        &call(
            &mcp,
            "call_session_tool",
            json!({"session": code, "name": "echo"}),
        )
        .await,
        "invalid_arguments",
        "text",
    );
    assert_error(
        &call(&mcp, "connect_session", json!({"code": "ZZZZ-ZZZZ"})).await,
        "session_not_found",
        "Ask the user",
    );
    assert_error(
        &call(&mcp, "connect_session", json!({})).await,
        "invalid_arguments",
        "pairing code",
    );

    let stranger = connect(&system.url(&format!("/mcp/s/{}", "0".repeat(32)))).await;
    let listing = stranger.list_tools(None).await.unwrap_err();
    assert!(
        listing.to_string().contains("belongs to no active session"),
        "{listing}"
    );
    assert_error(
        &call(&stranger, "echo", json!({"text": "x"})).await,
        "unknown_handle",
        "expired or ended",
    );

    // The tab ends the session: its connector stops working with a message saying why.
    let ended = send(
        system
            .request(reqwest::Method::DELETE, &format!("/api/sessions/{code}"))
            .bearer_auth(&token),
    )
    .await;
    assert_eq!(ended.status, StatusCode::NO_CONTENT);
    assert_error(
        &call(&scoped, "echo", json!({"text": "x"})).await,
        "unknown_handle",
        "Ask the user",
    );
    assert_error(
        &call(
            &mcp,
            "call_session_tool",
            json!({"session": code, "name": "echo", "arguments": {"text": "x"}}),
        )
        .await,
        "session_not_found",
        "Ask the user",
    );
    drop(tab);
    for connection in [mcp, scoped, stranger] {
        connection.cancel().await.unwrap();
    }
    system.stop().await;
}

/// Waits (with a deadline) until `condition` holds.
async fn until(condition: impl Fn() -> bool) {
    let every = Deadline::within(Duration::from_secs(20)).every(Duration::from_millis(50));
    wait_until(every, async || {
        if condition() {
            Ok(())
        } else {
            Err("the condition never held")
        }
    })
    .await;
}

#[tokio::test]
async fn a_call_with_no_tab_says_so_in_its_progress() {
    let system = System::with(
        RelayConfig {
            request_timeout: Duration::from_secs(5),
            ..RelayConfig::default()
        },
        |_| {},
    )
    .await;
    let (code, token) = system.create_session().await;
    system.put_manifest(&code, &token, demo_tools()).await;
    let mcp = connect(&system.url("/mcp")).await;
    let handle = handle_of(&mcp, &code).await;
    let scoped = connect(&system.url(&format!("/mcp/s/{handle}"))).await;
    let unanswered = call(&scoped, "echo", json!({"text": "nobody is there"})).await;
    assert_error(&unanswered, "request_expired", "page serving it");
    let progress = scoped.service().progress.lock().unwrap().clone();
    assert!(!progress.is_empty());
    let message = progress[0].message.clone().unwrap_or_default();
    assert!(
        message.contains("No tab is connected") && message.contains("open the plugin"),
        "{message}"
    );
    scoped.cancel().await.unwrap();
    mcp.cancel().await.unwrap();
    system.stop().await;
}

#[tokio::test]
async fn a_slow_tab_gets_progress_and_an_unanswered_call_fails_at_the_timeout() {
    let system = System::with(
        RelayConfig {
            request_timeout: Duration::from_secs(6),
            ..RelayConfig::default()
        },
        |_| {},
    )
    .await;
    let (code, token) = system.create_session().await;
    let mut tab = WsTab::attach_url(&system.ws_url(&code, &token)).await;
    tab.register(demo_tools()).await;
    let mcp = connect(&system.url("/mcp")).await;
    let handle = handle_of(&mcp, &code).await;
    let scoped = connect(&system.url(&format!("/mcp/s/{handle}"))).await;

    let slow = call(&scoped, "echo", json!({"text": "slow"}));
    // The tab answers once the client has heard progress twice (every 2 s while it waits).
    let tab_side = async {
        let request = tab.next_request().await;
        until(|| scoped.service().progress.lock().unwrap().len() >= 2).await;
        tab.answer(request["requestId"].as_str().unwrap(), json!("finally"))
            .await;
    };
    let (answer, ()) = tokio::join!(slow, tab_side);
    assert_eq!(structured(&answer), json!({"result": "finally"}));
    let progress = scoped.service().progress.lock().unwrap().clone();
    assert!(progress.len() >= 2, "{progress:?}");
    assert!(
        progress[0]
            .message
            .as_deref()
            .unwrap_or_default()
            .contains("Waiting for the tab")
    );

    let started = std::time::Instant::now();
    let unanswered = call(&scoped, "echo", json!({"text": "nobody answers"})).await;
    assert_error(&unanswered, "request_expired", "did not answer within 6 s");
    assert!(
        started.elapsed() < Duration::from_secs(12),
        "it fails at the timeout, not later"
    );
    drop(tab);
    scoped.cancel().await.unwrap();
    mcp.cancel().await.unwrap();
    system.stop().await;
}

/// A raw `initialize` POST with extra headers; returns the status.
async fn initialize(system: &System, headers: HashMap<&str, &str>) -> StatusCode {
    let mut request = system
        .request(reqwest::Method::POST, "/mcp")
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .body(
            json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
                "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "test", "version": "1"}
            }})
            .to_string(),
        );
    for (name, value) in headers {
        request = request.header(name, value);
    }
    request.send().await.unwrap().status()
}

#[tokio::test]
async fn foreign_hosts_and_origins_are_refused_and_the_public_host_is_accepted() {
    let system = System::with(RelayConfig::default(), |config| {
        config.public_base_url = "https://relay.example.org".into();
    })
    .await;
    assert_eq!(
        initialize(&system, HashMap::new()).await,
        StatusCode::OK,
        "loopback"
    );
    assert_eq!(
        initialize(&system, HashMap::from([("host", "relay.example.org")])).await,
        StatusCode::OK
    );
    assert_eq!(
        initialize(&system, HashMap::from([("host", "evil.example")])).await,
        StatusCode::FORBIDDEN
    );
    assert_eq!(
        initialize(
            &system,
            HashMap::from([("origin", "https://codap.concord.org")])
        )
        .await,
        StatusCode::OK,
        "an allowed origin"
    );
    assert_eq!(
        initialize(&system, HashMap::from([("origin", "https://evil.example")])).await,
        StatusCode::FORBIDDEN
    );
    system.stop().await;
}

#[tokio::test]
async fn split_gateway_serves_mcp_over_the_relays_grpc() {
    let system = System::split().await;
    let (code, token) = system.create_session().await;
    let mut tab = WsTab::attach_url(&system.ws_url(&code, &token)).await;
    tab.register(demo_tools()).await;
    let mcp = connect(&system.url("/mcp")).await;
    let encoded = call(
        &mcp,
        "encodePlantUML",
        json!({"plantumlCode": "@startuml\nA -> B\n@enduml"}),
    )
    .await;
    assert_eq!(encoded.is_error, Some(false), "{encoded:?}");
    let handle = handle_of(&mcp, &code).await;
    let scoped = connect(&system.url(&format!("/mcp/s/{handle}"))).await;
    let echoing = call(&scoped, "echo", json!({"text": "split"}));
    let tab_side = async {
        let request = tab.next_request().await;
        tab.answer(request["requestId"].as_str().unwrap(), json!("split"))
            .await;
    };
    let (answer, ()) = tokio::join!(echoing, tab_side);
    assert_eq!(structured(&answer), json!({"result": "split"}));
    scoped.cancel().await.unwrap();
    mcp.cancel().await.unwrap();
    system.stop().await;
}

#[tokio::test]
async fn mip_ids_belong_to_the_mcp_session_or_the_pairing_session() {
    // Split, so the scopes also cross the gateway's gRPC link to the relay.
    let system = System::split().await;
    let model = "import pulp\nprob = pulp.LpProblem('p', pulp.LpMaximize)\nx = pulp.LpVariable('x', 0, 7, cat='Integer')\nprob += 2 * x + 1";

    // On /mcp the MCP session is the scope: no scope argument needed, and another MCP
    // session does not find the id.
    let mcp = connect(&system.url("/mcp")).await;
    let generated = call(
        &mcp,
        "generate_mip_problem",
        json!({"problemDefinitionCode": model}),
    )
    .await;
    assert_eq!(generated.is_error, Some(false), "{generated:?}");
    let problem_id = structured(&generated)["problemId"].clone();
    let solved = call(&mcp, "solve_mip_problem", json!({"problemId": problem_id})).await;
    assert_eq!(structured(&solved)["status"], "optimal", "{solved:?}");
    assert_eq!(structured(&solved)["objectiveValue"], 15.0);
    let other = connect(&system.url("/mcp")).await;
    assert_error(
        &call(
            &other,
            "solve_mip_problem",
            json!({"problemId": problem_id}),
        )
        .await,
        "NOT_FOUND",
        "only in the scope",
    );

    // On the connector URL the pairing session is the scope, shared with its HTTP calls.
    let (code, _) = system.create_session().await;
    let handle = handle_of(&mcp, &code).await;
    let scoped = connect(&system.url(&format!("/mcp/s/{handle}"))).await;
    let in_session = call(
        &scoped,
        "generate_mip_problem",
        json!({"problemDefinitionCode": model}),
    )
    .await;
    assert_eq!(in_session.is_error, Some(false), "{in_session:?}");
    let session_problem = structured(&in_session)["problemId"].clone();
    let over_http = system
        .post(
            &format!("/api/sessions/{code}/call"),
            json!({"functionName": "solve_mip_problem", "args": {"problemId": session_problem}}),
        )
        .await;
    assert_eq!(
        over_http.body["result"]["status"], "optimal",
        "{over_http:?}"
    );
    assert_error(
        &call(
            &mcp,
            "solve_mip_problem",
            json!({"problemId": session_problem}),
        )
        .await,
        "NOT_FOUND",
        "only in the scope",
    );
    for connection in [scoped, other, mcp] {
        connection.cancel().await.unwrap();
    }
    system.stop().await;
}

#[tokio::test]
async fn a_session_scoped_client_hears_when_the_tabs_tools_change() {
    for system in [System::start().await, System::split().await] {
        let (code, token) = system.create_session().await;
        let mut tab = WsTab::attach_url(&system.ws_url(&code, &token)).await;
        tab.register(demo_tools()).await;
        let mcp = connect(&system.url("/mcp")).await;
        let handle = handle_of(&mcp, &code).await;
        let scoped = connect(&system.url(&format!("/mcp/s/{handle}"))).await;
        let names = |tools: Vec<rmcp::model::Tool>| -> Vec<String> {
            tools.iter().map(|t| t.name.to_string()).collect()
        };
        assert!(!names(scoped.list_tools(None).await.unwrap().tools).contains(&"shout".to_owned()));

        // The tab (reloaded, say) registers one more tool.
        let mut more = demo_tools();
        more[0]["functions"].as_array_mut().unwrap().push(json!({
            "name": "shout", "description": "Shouts", "parameters": {"type": "object", "properties": {}}
        }));
        tab.register(more).await;
        let changes = Arc::clone(&scoped.service().tool_list_changes);
        until(|| changes.load(std::sync::atomic::Ordering::SeqCst) >= 1).await;
        assert!(names(scoped.list_tools(None).await.unwrap().tools).contains(&"shout".to_owned()));

        scoped.cancel().await.unwrap();
        mcp.cancel().await.unwrap();
        drop(tab);
        system.stop().await;
    }
}
