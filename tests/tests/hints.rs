//! What tools say they do to data, for hosts that ask the person before a change (SPEC §4,
//! §8): every MCP tool has a title and annotations (one process, and a gateway that reaches
//! the relay over gRPC), built-in tools an output schema and the relay's icon, and a read
//! (`read_session_tool`, `POST …/read`) runs only functions marked read-only.
#![allow(clippy::unwrap_used)] // a test that cannot unwrap should fail loudly

use reqwest::StatusCode;
use rmcp::model::{CallToolResult, Tool};
use serde_json::{Value, json};
use toolrelay_tests::mcp::{Mcp, call, connect};
use toolrelay_tests::system::System;
use toolrelay_tests::{BUILTIN_TOOLS, WsTab};

/// A tab's tools: one marked read-only, titled and with untrusted content, one that only
/// adds, one unmarked.
fn marked_tools() -> Value {
    json!([{
        "id": "table",
        "description": "A table of cases",
        "functions": [
            {"name": "countCases", "description": "Counts the cases", "title": "Count cases",
             "readOnly": true, "untrustedContent": true,
             "parameters": {"type": "object", "properties": {}}},
            {"name": "createCase", "description": "Adds a case", "destructive": false,
             "parameters": {"type": "object", "properties": {"value": {"type": "number"}}}},
            {"name": "deleteAllCases", "description": "Deletes every case",
             "parameters": {"type": "object", "properties": {}}}
        ]
    }])
}

fn structured(result: &CallToolResult) -> Value {
    result.structured_content.clone().unwrap_or(Value::Null)
}

/// The annotations of `tool` as JSON, after checking it has a title and every hint.
fn described(tool: &Tool) -> Value {
    let title = tool.title.as_deref().unwrap_or_default();
    assert!(!title.is_empty(), "{} has no title", tool.name);
    let annotations = serde_json::to_value(tool.annotations.as_ref().unwrap()).unwrap();
    for hint in [
        "title",
        "readOnlyHint",
        "destructiveHint",
        "idempotentHint",
        "openWorldHint",
    ] {
        assert!(
            !annotations[hint].is_null(),
            "{} has no {hint}: {annotations}",
            tool.name
        );
    }
    annotations
}

/// The hints (readOnly, destructive, idempotent) of the tool `name` in `tools`.
fn hints_of(tools: &[Tool], name: &str) -> (bool, bool, bool) {
    let tool = tools.iter().find(|t| t.name == name).unwrap();
    let a = described(tool);
    (
        a["readOnlyHint"].as_bool().unwrap(),
        a["destructiveHint"].as_bool().unwrap(),
        a["idempotentHint"].as_bool().unwrap(),
    )
}

fn assert_builtins_described(tools: &[Tool]) {
    for name in BUILTIN_TOOLS {
        let tool = tools.iter().find(|t| t.name == name).unwrap();
        let schema = tool.output_schema.as_ref().unwrap_or_else(|| {
            panic!("{name} has no output schema");
        });
        assert_eq!(schema["type"], "object", "{name}");
        assert!(tool.icons.as_ref().is_some_and(|icons| !icons.is_empty()));
    }
    assert_eq!(hints_of(tools, "encodePlantUML"), (true, false, true));
    assert_eq!(
        hints_of(tools, "generate_mip_problem"),
        (false, false, false)
    );
}

async fn paired(system: &System) -> (String, WsTab, Mcp, String) {
    let (code, token) = system.create_session().await;
    let mut tab = WsTab::attach_url(&system.ws_url(&code, &token)).await;
    tab.register(marked_tools()).await;
    let mcp = connect(&system.url("/mcp")).await;
    let paired = call(&mcp, "connect_session", json!({"code": code})).await;
    let handle = structured(&paired)["handle"].as_str().unwrap().to_owned();
    (code, tab, mcp, handle)
}

/// Every tool of `/mcp` and of `/mcp/s/{handle}` is titled and annotated as marked.
async fn every_tool_is_described(system: &System) {
    let (_code, tab, mcp, handle) = paired(system).await;
    let server = mcp.peer_info().unwrap();
    assert!(
        server
            .server_info
            .as_ref()
            .and_then(|info| info.icons.as_ref())
            .is_some_and(|icons| icons[0].src.starts_with("data:image/svg+xml;base64,")),
        "the relay has an icon"
    );

    let tools = mcp.list_all_tools().await.unwrap();
    assert_builtins_described(&tools);
    assert_eq!(hints_of(&tools, "connect_session"), (true, false, true));
    assert_eq!(hints_of(&tools, "list_session_tools"), (true, false, true));
    assert_eq!(hints_of(&tools, "read_session_tool"), (true, false, true));
    assert_eq!(hints_of(&tools, "call_session_tool"), (false, true, false));

    let scoped = connect(&system.url(&format!("/mcp/s/{handle}"))).await;
    let tools = scoped.list_all_tools().await.unwrap();
    assert_eq!(tools.len(), 3 + BUILTIN_TOOLS.len());
    assert_builtins_described(&tools);
    let title = |name: &str| {
        let tool = tools.iter().find(|t| t.name == name).unwrap();
        tool.title.clone().unwrap()
    };
    assert_eq!(title("countCases"), "Count cases", "given");
    assert_eq!(
        title("deleteAllCases"),
        "Delete all cases",
        "made from the name"
    );
    assert_eq!(hints_of(&tools, "countCases"), (true, false, true));
    assert_eq!(hints_of(&tools, "createCase"), (false, false, false));
    // Unmarked: taken to change data.
    assert_eq!(hints_of(&tools, "deleteAllCases"), (false, true, false));
    // Only a function whose results may hold untrusted content reaches an open world.
    for tool in &tools {
        let open = tool.name == "countCases";
        assert_eq!(described(tool)["openWorldHint"], open, "{}", tool.name);
    }

    // list_session_tools says the same, for clients that call by name.
    let listed = call(&mcp, "list_session_tools", json!({"session": handle})).await;
    let listed = structured(&listed)["tools"].as_array().unwrap().clone();
    let count = listed.iter().find(|t| t["name"] == "countCases").unwrap();
    assert_eq!(count["title"], "Count cases");
    assert_eq!(count["annotations"]["readOnlyHint"], true);
    let delete = listed
        .iter()
        .find(|t| t["name"] == "deleteAllCases")
        .unwrap();
    assert_eq!(delete["annotations"]["destructiveHint"], true);
    assert_eq!(delete["annotations"]["title"], "Delete all cases");

    scoped.cancel().await.unwrap();
    mcp.cancel().await.unwrap();
    tab.close().await;
}

#[tokio::test]
async fn every_mcp_tool_has_a_title_and_annotations() {
    let system = System::start().await;
    every_tool_is_described(&system).await;
    system.stop().await;
}

#[tokio::test]
async fn a_gateway_on_the_relays_grpc_describes_tools_alike() {
    let system = System::split().await;
    every_tool_is_described(&system).await;
    system.stop().await;
}

/// Reads run read-only functions and refuse the others, over MCP and REST; `system` is one
/// process or a gateway on the relay's gRPC.
async fn reads_run_only_read_only_functions(system: &System) {
    let (code, mut tab, mcp, handle) = paired(system).await;
    let read = |name: &str| {
        call(
            &mcp,
            "read_session_tool",
            json!({"session": handle, "name": name, "arguments": {}}),
        )
    };
    for changing in ["createCase", "deleteAllCases"] {
        let refused = read(changing).await;
        assert_eq!(refused.is_error, Some(true), "{refused:?}");
        assert_eq!(structured(&refused)["error"]["code"], "not_read_only");
        let text = format!("{:?}", refused.content);
        assert!(text.contains("call_session_tool"), "{text}");
        let rest = system
            .post(
                &format!("/api/sessions/{code}/read"),
                json!({"functionName": changing, "args": {}}),
            )
            .await;
        rest.assert_refused(StatusCode::FORBIDDEN, "not_read_only");
        assert!(
            rest.body["message"]
                .as_str()
                .unwrap()
                .contains("/api/sessions/{code}/call")
        );
    }
    // A built-in tool that adds is refused too; one that only computes runs without the tab.
    let refused = read("generate_mip_problem").await;
    assert_eq!(structured(&refused)["error"]["code"], "not_read_only");
    let encoded = call(
        &mcp,
        "read_session_tool",
        json!({"session": handle, "name": "encodePlantUML",
            "arguments": {"plantumlCode": "@startuml\nA -> B\n@enduml"}}),
    )
    .await;
    assert_eq!(encoded.is_error, Some(false), "{encoded:?}");

    // A read-only function runs, over MCP and REST; the refused calls never reached the tab
    // (the first request it sees is this one).
    let reading = read("countCases");
    let tab_side = async {
        let request = tab.next_request().await;
        assert_eq!(request["functionName"], "countCases");
        tab.answer(request["requestId"].as_str().unwrap(), json!({"count": 3}))
            .await;
    };
    let (answer, ()) = tokio::join!(reading, tab_side);
    assert_eq!(structured(&answer), json!({"count": 3}));
    let meta = serde_json::to_value(answer.meta.as_ref().unwrap()).unwrap();
    assert_eq!(meta, json!({"toolrelay/untrustedContent": true}));
    let rest = system.post(
        &format!("/api/sessions/{code}/read"),
        json!({"functionName": "countCases", "args": {}}),
    );
    let tab_side = async {
        let request = tab.next_request().await;
        assert_eq!(request["functionName"], "countCases");
        tab.answer(request["requestId"].as_str().unwrap(), json!({"count": 4}))
            .await;
    };
    let (rest, ()) = tokio::join!(rest, tab_side);
    assert_eq!(rest.status, StatusCode::OK, "{rest:?}");
    assert_eq!(rest.body["result"], json!({"count": 4}));

    // call_session_tool runs a changing function.
    let calling = call(
        &mcp,
        "call_session_tool",
        json!({"session": handle, "name": "deleteAllCases", "arguments": {}}),
    );
    let tab_side = async {
        let request = tab.next_request().await;
        assert_eq!(request["functionName"], "deleteAllCases");
        tab.answer(
            request["requestId"].as_str().unwrap(),
            json!({"deleted": 3}),
        )
        .await;
    };
    let (answer, ()) = tokio::join!(calling, tab_side);
    assert_eq!(structured(&answer), json!({"deleted": 3}));
    assert!(answer.meta.is_none(), "a trusted result has no mark");

    // getMetadata tells a GPT which functions it may read.
    let metadata = system.get(&format!("/api/sessions/{code}/metadata")).await;
    let functions = &metadata.body["tools"][0]["functions"];
    assert_eq!(functions[0]["readOnly"], true);
    assert_eq!(functions[0]["title"], "Count cases");
    assert_eq!(functions[0]["untrustedContent"], true);
    assert_eq!(functions[1]["destructive"], false);
    assert!(functions[2].get("readOnly").is_none());

    mcp.cancel().await.unwrap();
    tab.close().await;
}

#[tokio::test]
async fn read_session_tool_and_the_read_route_refuse_a_changing_function() {
    let system = System::start().await;
    reads_run_only_read_only_functions(&system).await;
    system.stop().await;
}

#[tokio::test]
async fn reads_are_refused_alike_through_a_gateway_on_the_relays_grpc() {
    let system = System::split().await;
    reads_run_only_read_only_functions(&system).await;
    system.stop().await;
}
