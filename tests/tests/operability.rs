//! What an operator and a first-time user meet: the binaries' help and start-up errors, the
//! status a relay that cannot be reached gets, logs that say what happened (and carry the
//! correlation id across processes) without secrets, colours, the landing page, the licence.
#![allow(clippy::unwrap_used)] // a test that cannot unwrap should fail loudly

use std::process::Stdio;

use reqwest::StatusCode;
use serde_json::json;
use toolrelay_gateway::config::{ENV_LISTEN, ENV_RELAY_URL};
use toolrelay_relay::config::{ENV_GRPC_LISTEN, ENV_LOG_FORMAT, ENV_REDIS_URL, ENV_WS_LISTEN};
use toolrelay_tests::system::{System, binary, send};
use toolrelay_tests::{PATIENCE, WsTab, demo_tools, free_port, repo_file, wait_until};

/// Runs a binary to its end (with a deadline); its status and everything it printed.
async fn run(
    name: &str,
    args: &[&str],
    env: &[(&str, &str)],
) -> (std::process::ExitStatus, String) {
    let output = tokio::time::timeout(
        PATIENCE,
        tokio::process::Command::new(binary(name))
            .args(args)
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("the binary ended")
    .unwrap();
    let printed = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status, printed)
}

#[tokio::test]
async fn the_gateway_says_it_needs_a_relay_and_refuses_a_malformed_one_at_start() {
    let (status, help) = run("toolrelay-gateway", &["--help"], &[]).await;
    assert!(status.success(), "{help}");
    assert!(help.contains("RELAY_URL"), "{help}");
    assert!(!help.contains("runs in this process"), "{help}");
    let (status, printed) = run("toolrelay-gateway", &[], &[(ENV_LISTEN, "127.0.0.1:0")]).await;
    assert!(!status.success());
    assert!(
        printed.contains("relay-url") || printed.contains("RELAY_URL"),
        "{printed}"
    );
    for url in ["not a url", "relay:50051", "ftp://relay:50051"] {
        let (status, printed) = run(
            "toolrelay-gateway",
            &[],
            &[(ENV_LISTEN, "127.0.0.1:0"), (ENV_RELAY_URL, url)],
        )
        .await;
        assert!(!status.success(), "{url}: {printed}");
        assert!(printed.contains("RELAY_URL"), "{url}: {printed}");
    }
}

#[tokio::test]
async fn a_relay_that_cannot_be_reached_is_503_with_retry_after_everywhere() {
    // A gateway whose relay is not there (nothing listens on the port).
    let relay_url = format!("http://127.0.0.1:{}", free_port());
    let (_gateway, base) = {
        let mut child = tokio::process::Command::new(binary("toolrelay-gateway"))
            .env(ENV_LISTEN, "127.0.0.1:0")
            .env(ENV_RELAY_URL, &relay_url)
            .env(ENV_LOG_FORMAT, "json")
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let mut lines = tokio::io::AsyncBufReadExt::lines(tokio::io::BufReader::new(stdout));
        let base = tokio::time::timeout(PATIENCE, async {
            while let Some(line) = lines.next_line().await.unwrap() {
                let entry: serde_json::Value = serde_json::from_str(&line).unwrap_or_default();
                if entry["message"] == "toolrelay-gateway listening" {
                    return format!("http://{}", entry["listen"].as_str().unwrap());
                }
            }
            panic!("the gateway exited");
        })
        .await
        .unwrap();
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        (child, base)
    };
    let http = reqwest::Client::new();
    let sessions = send(http.post(format!("{base}/api/sessions"))).await;
    assert_eq!(
        sessions.status,
        StatusCode::SERVICE_UNAVAILABLE,
        "{sessions:?}"
    );
    assert!(sessions.header("retry-after").is_some());
    let tool = send(
        http.post(format!("{base}/api/tools/encodePlantUML"))
            .json(&json!({"plantumlCode": "@startuml\nA -> B\n@enduml"})),
    )
    .await;
    assert_eq!(tool.status, StatusCode::SERVICE_UNAVAILABLE, "{tool:?}");
    assert!(tool.header("retry-after").is_some(), "{tool:?}");
    assert_eq!(tool.body["error"]["code"], "RELAY_UNAVAILABLE");
}

#[tokio::test]
async fn calls_and_refusals_are_logged_with_their_correlation_id_across_processes() {
    let mut system = System::split_with(&[], &[]).await;
    let (code, token) = system.create_session().await;
    let mut tab = WsTab::attach_url(&system.ws_url(&code, &token)).await;
    tab.register(demo_tools()).await;
    let secret_argument = "an-argument-no-log-may-hold";
    let calling = send(
        system
            .http
            .post(system.url(&format!("/api/sessions/{code}/call")))
            .header("x-request-id", "corr-call-0001")
            .json(&json!({"functionName": "echo", "args": {"text": secret_argument}})),
    );
    let answering = async {
        let request = tab.next_request().await;
        tab.answer(request["requestId"].as_str().unwrap(), json!({"ok": true}))
            .await;
    };
    let (answer, ()) = tokio::join!(calling, answering);
    assert_eq!(answer.status, StatusCode::OK);
    let refused = send(
        system
            .http
            .get(system.url("/api/sessions/ZZZZZZZZ/metadata"))
            .header("x-request-id", "corr-miss-0002"),
    )
    .await;
    assert_eq!(refused.status, StatusCode::NOT_FOUND);
    let created = send(
        system
            .http
            .post(system.url("/api/sessions"))
            .header("x-request-id", "corr-create-0003")
            .json(&json!({})),
    )
    .await;
    assert_eq!(created.status, StatusCode::CREATED, "{created:?}");

    // The relay (another process) logs the call under the gateway's correlation id.
    let finished = system
        .logs
        .until("of the call", |line| {
            line.contains("call finished") && line.contains("corr-call-0001")
        })
        .await;
    let entry: serde_json::Value = serde_json::from_str(&finished).unwrap();
    assert_eq!(entry["function"], "echo", "{entry}");
    assert_eq!(entry["status"], "completed", "{entry}");
    assert!(entry["duration_ms"].is_u64(), "{entry}");
    let refusal = system
        .logs
        .until("of the refusal", |line| {
            line.contains("request refused") && line.contains("corr-miss-0002")
        })
        .await;
    let refusal: serde_json::Value = serde_json::from_str(&refusal).unwrap();
    assert_eq!(refusal["status"], 404, "{refusal}");
    // The request's span, as a JSON object of its own.
    assert_eq!(refusal["span"]["name"], "request", "{refusal}");
    assert_eq!(
        refusal["span"]["correlation_id"], "corr-miss-0002",
        "{refusal}"
    );
    assert_eq!(refusal["span"]["method"], "GET", "{refusal}");
    assert_eq!(
        refusal["spans"][0]["path"], "/api/sessions/ZZZZ…/metadata",
        "{refusal}"
    );
    // A line the relay logs while it answers an RPC carries the RPC, under the id the gateway
    // passed on.
    let created = system
        .logs
        .until("of the session's creation", |line| {
            line.contains("session created") && line.contains("corr-create-0003")
        })
        .await;
    let created: serde_json::Value = serde_json::from_str(&created).unwrap();
    assert_eq!(created["span"]["name"], "rpc", "{created}");
    assert_eq!(
        created["span"]["correlation_id"], "corr-create-0003",
        "{created}"
    );
    let method = created["span"]["method"].as_str().unwrap_or_default();
    assert!(method.ends_with("/CreateSession"), "{created}");
    system.terminate().await;
    system.exited().await;
    assert!(
        !system
            .logs
            .lines()
            .iter()
            .any(|line| line.contains(secret_argument)),
        "arguments are never logged"
    );
}

#[tokio::test]
async fn text_logs_have_no_colour_codes_off_a_terminal() {
    let port = free_port();
    let base = format!("http://127.0.0.1:{port}");
    let child = tokio::process::Command::new(binary("toolrelay"))
        .env(ENV_LISTEN, format!("127.0.0.1:{port}"))
        .env(ENV_GRPC_LISTEN, "127.0.0.1:0")
        .env(ENV_LOG_FORMAT, "text")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let http = reqwest::Client::new();
    wait_until(PATIENCE, async || {
        let answered = http.get(format!("{base}/healthz")).send().await;
        answered.map(drop).map_err(|_| "the relay never answered")
    })
    .await;
    let refused = send(http.get(format!("{base}/api/sessions/ZZZZZZZZ"))).await;
    assert_eq!(refused.status, StatusCode::NOT_FOUND);
    let status = tokio::process::Command::new("kill")
        .args(["-TERM", &child.id().unwrap().to_string()])
        .status()
        .await
        .unwrap();
    assert!(status.success());
    let output = tokio::time::timeout(PATIENCE, child.wait_with_output())
        .await
        .unwrap()
        .unwrap();
    let logs = String::from_utf8_lossy(&output.stdout);
    assert!(logs.contains("request refused"), "{logs}");
    // The request, as tracing shows a span: its correlation id, method and path without the
    // code.
    assert!(
        logs.contains(" INFO request{correlation_id=")
            && logs.contains(" method=GET path=/api/sessions/ZZZZ…}: "),
        "{logs}"
    );
    assert!(!logs.contains('\u{1b}'), "{logs}");
}

#[tokio::test]
async fn the_status_of_a_session_without_a_tab_names_no_transport() {
    let system = System::start().await;
    let (code, _) = system.create_session().await;
    let status = system.get(&format!("/api/sessions/{code}")).await;
    let fields = status.body.as_object().unwrap();
    assert_eq!(
        fields.get("transport"),
        Some(&serde_json::Value::Null),
        "{status:?}"
    );
    assert_eq!(status.body["providerConnected"], false);
    system.stop().await;
}

#[tokio::test]
async fn people_who_open_the_address_learn_what_it_is() {
    let system = System::start().await;
    let page = system.http.get(system.url("/")).send().await.unwrap();
    assert_eq!(page.status(), StatusCode::OK);
    assert!(
        page.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/html")
    );
    let html = page.text().await.unwrap();
    for link in [
        "/codap/",
        "/openapi/actions.json",
        "/mcp",
        "/openapi.json",
        "/sdk/toolrelay.js",
        "/demo/",
    ] {
        assert!(html.contains(&system.url(link)), "{link} in {html}");
    }
    system.stop().await;
}

#[test]
fn the_licence_the_manifest_names_is_in_the_repository() {
    let manifest = std::fs::read_to_string(repo_file("Cargo.toml")).unwrap();
    assert!(manifest.contains("license = \"MIT\""));
    let licence = std::fs::read_to_string(repo_file("LICENSE")).unwrap();
    assert!(licence.starts_with("MIT License"), "{licence}");
}

/// An empty `REDIS_URL` (a Secret that lost its URL) would run each replica on a state of its
/// own: every binary refuses it at start, naming the variable.
#[tokio::test]
async fn an_empty_redis_url_is_refused_at_start() {
    let gateway = [(ENV_RELAY_URL, "http://127.0.0.1:9")];
    for (name, extra) in [
        ("toolrelay", &[][..]),
        ("toolrelay-relay", &[][..]),
        ("toolrelay-gateway", &gateway[..]),
    ] {
        for empty in ["", "  "] {
            let mut env = vec![
                (ENV_LISTEN, "127.0.0.1:0"),
                (ENV_GRPC_LISTEN, "127.0.0.1:0"),
                (ENV_WS_LISTEN, "127.0.0.1:0"),
                (ENV_REDIS_URL, empty),
            ];
            env.extend_from_slice(extra);
            let (status, printed) = run(name, &[], &env).await;
            assert!(
                !status.success(),
                "{name} with REDIS_URL={empty:?}: {printed}"
            );
            assert!(
                printed.contains("REDIS_URL is set but empty"),
                "{name}: {printed}"
            );
        }
    }
}
