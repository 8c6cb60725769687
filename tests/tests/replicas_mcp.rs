//! Several replicas on one Redis, as real processes, with MCP clients (rmcp's and the
//! official Python SDK) behind a plain round-robin balancer over their gateways.

use std::sync::Arc;

use reqwest::StatusCode;
use serde_json::{Value, json};
use toolrelay_relay::config::ENV_RATE_LIMIT_REQUEST;
use toolrelay_tests::cluster::Cluster;
use toolrelay_tests::recording::RecordingTab;
use toolrelay_tests::system::send;
use toolrelay_tests::{PATIENCE, demo_tools, wait_until};

/// Counts `tools/list_changed` notifications.
#[derive(Clone, Default)]
struct McpClient {
    tool_list_changes: Arc<std::sync::atomic::AtomicUsize>,
}

impl rmcp::ClientHandler for McpClient {
    async fn on_tool_list_changed(
        &self,
        _context: rmcp::service::NotificationContext<rmcp::RoleClient>,
    ) {
        self.tool_list_changes
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
}

type McpConnection = rmcp::service::RunningService<rmcp::RoleClient, McpClient>;

/// rmcp's own client on `url`, opening a connection per request (no keep-alive), so a
/// round-robin balancer sends each request to the next gateway.
async fn mcp_client(url: String) -> McpConnection {
    use rmcp::ServiceExt;
    use rmcp::transport::StreamableHttpClientTransport;
    use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .unwrap();
    let transport = StreamableHttpClientTransport::with_client(
        http,
        StreamableHttpClientTransportConfig::with_uri(url),
    );
    McpClient::default().serve(transport).await.unwrap()
}

async fn mcp_call(connection: &McpConnection, name: &str, arguments: Value) -> Value {
    let result = toolrelay_tests::mcp::call(connection, name, arguments).await;
    assert_eq!(result.is_error, Some(false), "{name}: {result:?}");
    result.structured_content.unwrap_or(Value::Null)
}

/// MCP behind a plain round-robin balancer over two gateways (each in front of its own relay):
/// rmcp's client initialises, lists and calls built-in tools, pairs and calls the tab's tool,
/// uses `/mcp/s/{handle}`, finds a MIP problem made through the other gateway, and hears of a
/// manifest change made through either gateway — with no "session not found".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_works_behind_a_round_robin_balancer() {
    let cluster = Cluster::start(2, 2, &[(ENV_RATE_LIMIT_REQUEST, "100000")]).await;
    let gateways: Vec<std::net::SocketAddr> = cluster
        .gateways
        .iter()
        .map(|base| base.trim_start_matches("http://").parse().unwrap())
        .collect();
    let balancer = toolrelay_tests::balancer::RoundRobin::start(gateways).await;
    let (code, token) = cluster.create_session(0).await;
    let tab = RecordingTab::start(vec![cluster.tab_url(1, &code, &token)]);
    cluster.until_tab_registered(0, &code).await;

    let mcp = mcp_client(format!("{}/mcp", balancer.url())).await;
    for _ in 0..2 {
        let tools = mcp.list_tools(None).await.unwrap().tools;
        assert!(tools.iter().any(|tool| tool.name == "connect_session"));
    }
    let encoded = mcp_call(&mcp, "encodePlantUML", json!({"plantumlCode": "A -> B"})).await;
    assert!(encoded["url"].as_str().is_some(), "{encoded}");
    let paired = mcp_call(&mcp, "connect_session", json!({"code": code})).await;
    let handle = paired["handle"].as_str().unwrap().to_owned();
    for n in 0..4 {
        let text = format!("over mcp {n}");
        let answer = mcp_call(
            &mcp,
            "call_session_tool",
            json!({"session": code, "name": "echo", "arguments": {"text": text}}),
        )
        .await;
        assert_eq!(answer, json!({"text": text}));
    }
    // A MIP problem is generated through one gateway and solved through the other: the id
    // belongs to the MCP session, which both gateways serve.
    let model = "import pulp\nprob = pulp.LpProblem('p', pulp.LpMaximize)\nx = pulp.LpVariable('x', 0, 7, cat='Integer')\nprob += 2 * x + 1";
    let generated = mcp_call(
        &mcp,
        "generate_mip_problem",
        json!({"problemDefinitionCode": model}),
    )
    .await;
    let solved = mcp_call(
        &mcp,
        "solve_mip_problem",
        json!({"problemId": generated["problemId"]}),
    )
    .await;
    assert_eq!(solved["status"], "optimal", "{solved}");

    let scoped = mcp_client(format!("{}/mcp/s/{handle}", balancer.url())).await;
    for n in 0..2 {
        let tools = scoped.list_tools(None).await.unwrap().tools;
        assert!(tools.iter().any(|tool| tool.name == "echo"), "{tools:?}");
        let text = format!("scoped {n}");
        let answer = mcp_call(&scoped, "echo", json!({"text": text})).await;
        assert_eq!(answer, json!({"text": text}));
    }
    // The manifest changes through each gateway in turn (one of them is not the gateway
    // holding the client's event stream): the client hears of both.
    let changes = Arc::clone(&scoped.service().tool_list_changes);
    for gateway in 0..2 {
        let mut tools = demo_tools();
        tools[0]["functions"].as_array_mut().unwrap().push(json!({
            "name": format!("shout{gateway}"), "description": "Shouts",
            "parameters": {"type": "object", "properties": {}}
        }));
        let registered = send(
            reqwest::Client::new()
                .put(format!(
                    "{}/api/sessions/{code}/manifest",
                    cluster.gateways[gateway]
                ))
                .bearer_auth(&token)
                .json(&json!({"tools": tools})),
        )
        .await;
        assert_eq!(registered.status, StatusCode::OK, "{registered:?}");
        wait_until(PATIENCE, async || {
            if changes.load(std::sync::atomic::Ordering::SeqCst) < gateway + 1 {
                Err(format!(
                    "the client never heard of the change through gateway {gateway}"
                ))
            } else {
                Ok(())
            }
        })
        .await;
    }
    let tools = scoped.list_tools(None).await.unwrap().tools;
    assert!(tools.iter().any(|tool| tool.name == "shout1"), "{tools:?}");

    // The official Python SDK, the same way.
    let python = tokio::process::Command::new(toolrelay_tests::test_python())
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/python/mcp_round_robin.py"
        ))
        .arg(balancer.url())
        .arg(&code)
        .kill_on_drop(true)
        .output()
        .await
        .unwrap();
    assert!(
        python.status.success(),
        "the Python SDK failed: {}",
        String::from_utf8_lossy(&python.stderr)
    );
    let seen: Value = serde_json::from_slice(&python.stdout).unwrap();
    assert!(
        seen["tools"]
            .as_array()
            .unwrap()
            .contains(&json!("connect_session")),
        "{seen}"
    );
    assert_eq!(seen["tools_stable"], true, "{seen}");
    assert!(seen["plantuml_url"].as_str().is_some(), "{seen}");
    assert_eq!(
        seen["echo"],
        json!([{"text": "python 0"}, {"text": "python 1"}]),
        "{seen}"
    );
    assert_eq!(seen["mip_status"], "optimal", "{seen}");
    assert!(
        seen["scoped_tools"]
            .as_array()
            .unwrap()
            .contains(&json!("echo")),
        "{seen}"
    );
    assert_eq!(
        seen["scoped_echo"],
        json!({"text": "scoped python"}),
        "{seen}"
    );
    // Both gateways really served: the balancer spread the connections.
    let counts = balancer.counts();
    assert!(counts.iter().all(|&count| count >= 5), "{counts:?}");
    scoped.cancel().await.unwrap();
    mcp.cancel().await.unwrap();
    drop(tab);
}

/// Hears a call's progress and log messages.
#[derive(Clone, Default)]
struct Hearing {
    progress: Arc<std::sync::Mutex<Vec<f64>>>,
    logs: Arc<std::sync::Mutex<Vec<Value>>>,
}

impl rmcp::ClientHandler for Hearing {
    async fn on_progress(
        &self,
        params: rmcp::model::ProgressNotificationParam,
        _context: rmcp::service::NotificationContext<rmcp::RoleClient>,
    ) {
        self.progress.lock().unwrap().push(params.progress);
    }

    #[allow(deprecated)] // MCP logging, deprecated from 2026-07-28 on
    async fn on_logging_message(
        &self,
        params: rmcp::model::LoggingMessageNotificationParam,
        _context: rmcp::service::NotificationContext<rmcp::RoleClient>,
    ) {
        self.logs.lock().unwrap().push(params.data);
    }
}

/// Waits, with a deadline, until `done` holds.
async fn until(what: &'static str, done: impl Fn() -> bool) {
    let every =
        toolrelay_tests::Deadline::within(PATIENCE).every(std::time::Duration::from_millis(20));
    wait_until(every, async || if done() { Ok(()) } else { Err(what) }).await;
}

/// A tab on one replica, its callers on another: the tab's progress and log messages cross
/// over (on the routed call's `Forward` stream, or the session's Redis channel with
/// `TOOLRELAY_TEST_ROUTE=pubsub`) to the MCP client, in order; a REST caller reads the last
/// progress in the call's status through either gateway.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tabs_progress_crosses_replicas_to_its_caller() {
    let cluster = Cluster::start(2, 2, &[]).await;
    let (code, token) = cluster.create_session(0).await;
    let mut tab = toolrelay_tests::WsTab::attach_url(&cluster.tab_url(1, &code, &token)).await;
    tab.register(demo_tools()).await;
    cluster.until_tab_registered(0, &code).await;
    let plain = mcp_client(format!("{}/mcp", cluster.gateways[0])).await;
    let paired = mcp_call(&plain, "connect_session", json!({"code": code})).await;
    let handle = paired["handle"].as_str().unwrap().to_owned();
    let url = format!("{}/mcp/s/{handle}", cluster.gateways[0]);
    let client = toolrelay_tests::mcp::connect_with(Hearing::default(), &url).await;
    let hearing = client.service().clone();

    let calling = toolrelay_tests::mcp::call(&client, "echo", json!({"text": "far"}));
    let working = async {
        let request = tab.next_request().await;
        let id = request["requestId"].as_str().unwrap().to_owned();
        for value in [1.0, 2.0] {
            tab.send(json!({"type": "progress", "requestId": id, "progress": value, "total": 2}))
                .await;
            until("the progress never crossed over", || {
                hearing.progress.lock().unwrap().contains(&value)
            })
            .await;
        }
        tab.send(json!({"type": "log", "level": "warning", "data": "far away", "requestId": id}))
            .await;
        until("the log never crossed over", || {
            !hearing.logs.lock().unwrap().is_empty()
        })
        .await;
        tab.answer(&id, json!("near")).await;
    };
    let (result, ()) = tokio::join!(calling, working);
    assert_eq!(
        result.structured_content,
        Some(json!({"result": "near"})),
        "{result:?}"
    );
    assert_eq!(*hearing.progress.lock().unwrap(), [1.0, 2.0]);
    assert_eq!(*hearing.logs.lock().unwrap(), [json!("far away")]);

    let queued = cluster
        .post(
            1,
            &format!("/api/sessions/{code}/request"),
            json!({"functionName": "echo", "args": {"text": "rest"}}),
        )
        .await;
    let id = queued.body["requestId"].as_str().unwrap().to_owned();
    let request = tab.next_request().await;
    assert_eq!(request["requestId"], id.as_str());
    tab.send(json!({"type": "progress", "requestId": id, "progress": 7, "message": "seven"}))
        .await;
    for gateway in [0, 1] {
        let path = format!("/api/sessions/{code}/requests/{id}");
        let every =
            toolrelay_tests::Deadline::within(PATIENCE).every(std::time::Duration::from_millis(20));
        wait_until(every, async || {
            let status = cluster.get(gateway, &path).await;
            if status.body["progress"]["progress"] == 7.0 {
                Ok(())
            } else {
                Err(format!("{status:?}"))
            }
        })
        .await;
    }
    tab.answer(&id, json!("done")).await;
    client.cancel().await.unwrap();
    plain.cancel().await.unwrap();
}
