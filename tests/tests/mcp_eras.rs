//! Every MCP revision the relay serves (2024-11-05, 2025-03-26, 2025-06-18, 2025-11-25 over
//! the `initialize` handshake; 2026-07-28 sessionless), each asked for by a real SDK client;
//! a revision not served refused with the ones that are; the sessionless revision through two
//! gateways on Redis; and the official conformance suite (`@modelcontextprotocol/conformance`
//! 0.2.0-alpha.12), the frozen requirements of 2025-11-25 and of 2026-07-28, against `/mcp` of
//! one process and behind two gateways on Redis, with each revision's expected failures in
//! `tests/conformance/expected-failures-<revision>.yml`.
#![allow(clippy::unwrap_used)] // a test that cannot unwrap should fail loudly

use std::path::PathBuf;
use std::process::Output;

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};
use toolrelay_tests::balancer::RoundRobin;
use toolrelay_tests::cluster::Cluster;
use toolrelay_tests::mcp::{self, answer_of};
use toolrelay_tests::recording::RecordingTab;
use toolrelay_tests::system::System;
use toolrelay_tests::{PATIENCE, mcp_tools, repo_file, test_python};

/// The revisions with an `initialize` handshake, oldest first.
const HANDSHAKE_REVISIONS: [&str; 4] = ["2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25"];
/// The sessionless revision.
const SESSIONLESS: &str = "2026-07-28";
/// How long `/mcp`'s listing and `server/discover` may be cached, as the relay says.
const LISTING_TTL_MS: u64 = 300_000;

/// The npm packages of `tests/browser` (the TypeScript SDK, the conformance suite).
fn npm_package(path: &str) -> PathBuf {
    let file = repo_file("tests/browser/node_modules").join(path);
    assert!(
        file.exists(),
        "{} is missing: run scripts/setup.sh --test (scripts/test.sh does) to install the npm packages of tests/browser",
        file.display()
    );
    file
}

async fn run(command: &mut tokio::process::Command) -> Output {
    let output = command
        .kill_on_drop(true)
        .output()
        .await
        .unwrap_or_else(|error| {
            panic!("{command:?} cannot start ({error}): run scripts/setup.sh --test")
        });
    assert!(
        output.status.success(),
        "{command:?} failed:\n{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

fn json_line(output: &Output) -> Value {
    serde_json::from_slice(&output.stdout).unwrap_or_else(|error| {
        panic!(
            "not one JSON line ({error}): {}",
            String::from_utf8_lossy(&output.stdout)
        )
    })
}

/// The TypeScript SDK asking for `revision` on `url`: lists, calls encodePlantUML.
async fn typescript_client(url: &str, revision: &str) -> Value {
    npm_package("@modelcontextprotocol/sdk/package.json");
    json_line(
        &run(tokio::process::Command::new("node")
            .arg(repo_file("tests/browser/clients/mcp_revision.mjs"))
            .arg(url)
            .arg(revision))
        .await,
    )
}

/// The Python SDK in `mode` on `url`: lists, calls `tool` (encodePlantUML by default).
async fn python_client(url: &str, mode: &str, call: Option<(&str, Value)>) -> Value {
    let mut command = tokio::process::Command::new(test_python());
    command
        .arg(repo_file("tests/python/mcp_revision.py"))
        .arg(url)
        .arg(mode);
    if let Some((tool, arguments)) = call {
        command.arg(tool).arg(arguments.to_string());
    }
    json_line(&run(&mut command).await)
}

fn assert_plantuml_called(answer: &Value) {
    assert_eq!(answer["isError"], false, "{answer}");
    assert!(
        answer["structured"]["url"]
            .as_str()
            .unwrap_or_default()
            .starts_with("https://www.plantuml.com/plantuml/svg/"),
        "{answer}"
    );
}

#[tokio::test]
async fn every_served_revision_is_asked_for_by_a_real_sdk_and_answered() {
    let system = System::start().await;
    let url = system.url("/mcp");
    let typescript = futures::future::join_all(
        HANDSHAKE_REVISIONS.map(|revision| typescript_client(&url, revision)),
    )
    .await;
    for (revision, answer) in HANDSHAKE_REVISIONS.iter().zip(&typescript) {
        assert_eq!(answer["protocolVersion"], *revision, "{answer}");
        // Every request after `initialize` said the revision agreed on.
        let headers = answer["headers"].as_array().unwrap();
        assert!(!headers.is_empty(), "{answer}");
        assert!(headers.iter().all(|header| header == revision), "{answer}");
        assert_eq!(answer["tools"], json!(mcp_tools()), "{answer}");
        assert_plantuml_called(answer);
    }

    let (legacy, sessionless, auto) = tokio::join!(
        python_client(&url, "legacy", None),
        python_client(&url, SESSIONLESS, None),
        python_client(&url, "auto", None),
    );
    assert_eq!(legacy["protocolVersion"], "2025-11-25", "{legacy}");
    assert_eq!(sessionless["protocolVersion"], SESSIONLESS, "{sessionless}");
    // The SDK's `auto` asks `server/discover` first, and keeps the sessionless revision.
    assert_eq!(auto["protocolVersion"], SESSIONLESS, "{auto}");
    for answer in [&legacy, &sessionless, &auto] {
        assert_eq!(answer["tools"], json!(mcp_tools()), "{answer}");
        assert_plantuml_called(answer);
    }
    for answer in [&sessionless, &auto] {
        assert_eq!(answer["ttlMs"], LISTING_TTL_MS, "{answer}");
        assert_eq!(answer["cacheScope"], "public", "{answer}");
    }
    system.stop().await;
}

/// A JSON-RPC request as a 2026-07-28 client sends it ([`mcp::sessionless_request`]): the
/// answer's headers and its message.
async fn sessionless(
    http: &reqwest::Client,
    url: &str,
    revision: &str,
    method: &str,
    params: Value,
) -> (reqwest::header::HeaderMap, Value) {
    let request = mcp::sessionless_request(http, url, revision, method, params);
    let response = request.send().await.unwrap();
    let headers = response.headers().clone();
    let text = response.text().await.unwrap();
    (headers, answer_of(&text))
}

#[tokio::test]
async fn a_revision_not_served_is_refused_with_the_ones_that_are() {
    let system = System::start().await;
    let http = reqwest::Client::new();
    let url = system.url("/mcp");
    let (_, refused) = sessionless(&http, &url, "2027-01-01", "tools/list", json!({})).await;
    assert_eq!(refused["error"]["code"], -32022, "{refused}");
    assert_eq!(refused["error"]["data"]["requested"], "2027-01-01");
    let mut served = HANDSHAKE_REVISIONS.to_vec();
    served.push(SESSIONLESS);
    assert_eq!(refused["error"]["data"]["supported"], json!(served));

    // `initialize` exists only up to 2025-11-25: asked for a later or an unknown revision,
    // it answers with 2025-11-25 (the handshake's rule), which the client may refuse.
    for asked in [SESSIONLESS, "2099-01-01"] {
        let response = http
            .post(&url)
            .header("accept", "application/json, text/event-stream")
            .json(
                &json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
                "protocolVersion": asked, "capabilities": {},
                "clientInfo": {"name": "toolrelay-test", "version": "1.0.0"}}}),
            )
            .send()
            .await
            .unwrap();
        let answer = answer_of(&response.text().await.unwrap());
        assert_eq!(
            answer["result"]["protocolVersion"], "2025-11-25",
            "{answer}"
        );
    }
    system.stop().await;
}

#[tokio::test]
async fn the_sessionless_revision_works_through_two_gateways_on_redis() {
    let cluster = Cluster::start(1, 2, &[]).await;
    let (code, token) = cluster.create_session(0).await;
    let _tab = RecordingTab::start(vec![cluster.tab_url(0, &code, &token)]);
    cluster.until_tab_registered(1, &code).await;
    let http = reqwest::Client::new();
    let mcp = |gateway: usize| format!("{}/mcp", cluster.gateways[gateway]);

    // The entry and `/mcp`'s listing: the same from either gateway, to be cached by anyone.
    let mut discovered = Vec::new();
    let mut listed = Vec::new();
    for gateway in [0, 1] {
        let (headers, discover) = sessionless(
            &http,
            &mcp(gateway),
            SESSIONLESS,
            "server/discover",
            json!({}),
        )
        .await;
        assert!(headers.get("mcp-session-id").is_none(), "{headers:?}");
        let result = &discover["result"];
        assert_eq!(result["supportedVersions"][4], SESSIONLESS, "{discover}");
        assert_eq!(result["ttlMs"], LISTING_TTL_MS, "{discover}");
        assert_eq!(result["cacheScope"], "public", "{discover}");
        discovered.push(result.clone());
        let (_, list) =
            sessionless(&http, &mcp(gateway), SESSIONLESS, "tools/list", json!({})).await;
        assert_eq!(list["result"]["ttlMs"], LISTING_TTL_MS, "{list}");
        assert_eq!(list["result"]["cacheScope"], "public", "{list}");
        listed.push(list["result"].clone());
    }
    assert_eq!(discovered[0], discovered[1]);
    assert_eq!(listed[0], listed[1]);

    // Pairing on one gateway, the session's own server on the other: no session anywhere.
    let (_, paired) = sessionless(
        &http,
        &mcp(0),
        SESSIONLESS,
        "tools/call",
        json!({"name": "connect_session", "arguments": {"code": code}}),
    )
    .await;
    let handle = paired["result"]["structuredContent"]["handle"]
        .as_str()
        .unwrap_or_else(|| panic!("{paired}"))
        .to_owned();
    let scoped = |gateway: usize| format!("{}/mcp/s/{handle}", cluster.gateways[gateway]);
    let (_, session_tools) =
        sessionless(&http, &scoped(1), SESSIONLESS, "tools/list", json!({})).await;
    assert_eq!(
        session_tools["result"]["tools"][0]["name"], "echo",
        "{session_tools}"
    );
    // The session's tools change with its tab: kept by nobody.
    assert_eq!(session_tools["result"]["ttlMs"], 0, "{session_tools}");
    assert_eq!(session_tools["result"]["cacheScope"], "private");
    for gateway in [0, 1] {
        let text = format!("through gateway {gateway}");
        let (headers, called) = sessionless(
            &http,
            &scoped(gateway),
            SESSIONLESS,
            "tools/call",
            json!({"name": "echo", "arguments": {"text": text}}),
        )
        .await;
        assert!(headers.get("mcp-session-id").is_none(), "{headers:?}");
        assert_eq!(called["result"]["isError"], false, "{called}");
        assert_eq!(
            called["result"]["structuredContent"]["text"], text,
            "{called}"
        );
    }

    // And the Python SDK, sessionless, on the other gateway.
    let answer = python_client(
        &scoped(1),
        SESSIONLESS,
        Some(("echo", json!({"text": "from the Python SDK"}))),
    )
    .await;
    assert_eq!(answer["protocolVersion"], SESSIONLESS, "{answer}");
    assert_eq!(answer["isError"], false, "{answer}");
    assert_eq!(
        answer["structured"]["text"], "from the Python SDK",
        "{answer}"
    );

    // The tools change (a manifest put through gateway 0): a 2026-07-28 client listening on
    // gateway 1 (`subscriptions/listen`) hears it and lists them again.
    let mut listener = tokio::process::Command::new(test_python())
        .arg(repo_file("tests/python/mcp_listen.py"))
        .arg(scoped(1))
        .arg("shout")
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(listener.stdout.take().unwrap()).lines();
    let mut next_line = async || {
        let line = tokio::time::timeout(PATIENCE, lines.next_line()).await;
        let line = line.expect("the listener said nothing in time").unwrap();
        serde_json::from_str::<Value>(&line.expect("the listener ended")).unwrap()
    };
    let acknowledged = next_line().await;
    assert_eq!(
        acknowledged["acknowledged"]["toolsListChanged"], true,
        "{acknowledged}"
    );
    let mut tools = toolrelay_tests::demo_tools();
    tools[0]["functions"]
        .as_array_mut()
        .unwrap()
        .push(json!({"name": "shout", "description": "Shouts", "parameters": {"type": "object"}}));
    let put = http
        .put(format!(
            "{}/api/sessions/{code}/manifest",
            cluster.gateways[0]
        ))
        .bearer_auth(&token)
        .json(&json!({"tools": tools}))
        .send()
        .await
        .unwrap();
    assert!(put.status().is_success(), "{put:?}");
    // (The relay may say the tools changed once as it starts watching.)
    loop {
        let heard = next_line().await;
        if heard["tools"].as_array().unwrap().contains(&json!("shout")) {
            break;
        }
    }
    assert!(listener.wait().await.unwrap().success());
}

/// The revisions whose frozen requirements the conformance suite checks, each with its own
/// expected failures (`tests/conformance/expected-failures-<revision>.yml`).
const CONFORMANCE_REVISIONS: [&str; 2] = ["2025-11-25", "2026-07-28"];

/// Runs the conformance suite against `url` for each revision's requirements, with that
/// revision's expected failures; prints the summaries.
async fn conformance(url: &str) {
    let cli = npm_package("@modelcontextprotocol/conformance/dist/index.js");
    for revision in CONFORMANCE_REVISIONS {
        let expected = format!("tests/conformance/expected-failures-{revision}.yml");
        let output = tokio::process::Command::new("node")
            .arg(&cli)
            .arg("server")
            .arg("--url")
            .arg(url)
            .arg("--requirements")
            .arg(revision)
            .arg("--expected-failures")
            .arg(repo_file(&expected))
            .kill_on_drop(true)
            .output()
            .await
            .unwrap();
        let stdout = String::from_utf8_lossy(&output.stdout);
        let summary = stdout
            .split_once("=== SUMMARY ===")
            .map_or(stdout.as_ref(), |(_, summary)| summary);
        println!("conformance suite ({revision}) against {url}:{summary}");
        assert!(
            output.status.success(),
            "the conformance suite ({revision}) failed against {url} (a scenario failed that is \
             not in {expected}, or one listed there passes now; if it cannot start, run \
             scripts/setup.sh --test):\n{summary}\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
}

#[tokio::test]
async fn the_conformance_suite_passes_against_one_process() {
    let mut system = System::binary(&[]).await;
    conformance(&system.url("/mcp")).await;
    system.terminate().await;
}

#[tokio::test]
async fn the_conformance_suite_passes_behind_two_gateways_on_redis() {
    let cluster = Cluster::start(1, 2, &[]).await;
    let backends = cluster
        .gateways
        .iter()
        .map(|base| base.trim_start_matches("http://").parse().unwrap())
        .collect();
    // Round robin per connection, no sticky sessions: a session's requests reach both.
    let balancer = RoundRobin::start(backends).await;
    conformance(&format!("{}/mcp", balancer.url())).await;
    let counts = balancer.counts();
    assert!(counts.iter().all(|count| *count > 0), "{counts:?}");
}
