//! MCP sessions over Streamable HTTP, as raw requests from chosen loopback addresses: the caps
//! per address (429) and in total (503), idle sessions ending, `DELETE` answering 200 (the
//! official Python SDK ends its session without a complaint), and a flood of `initialize`
//! staying bounded in memory (ignored: `scripts/test.sh` runs it on the release binaries).
#![allow(clippy::unwrap_used)] // a test that cannot unwrap should fail loudly

use std::num::NonZeroU32;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};
use toolrelay_gateway::config::{
    ENV_MCP_MAX_SESSIONS, ENV_MCP_SESSION_IDLE, ENV_MCP_SESSIONS_PER_IP, McpSessions,
};
use toolrelay_relay::RelayConfig;
use toolrelay_relay::config::ENV_REDIS_URL;
use toolrelay_tests::metrics::Scrape;
use toolrelay_tests::system::System;
use toolrelay_tests::{Deadline, wait_until};

/// An HTTP client whose connections come from `from` (a loopback address: 127.0.0.x).
fn client_from(from: [u8; 4]) -> reqwest::Client {
    reqwest::Client::builder()
        .local_address(std::net::IpAddr::from(from))
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap()
}

/// An answered MCP request: status, `Retry-After`, the session it names, its body.
struct McpAnswer {
    status: StatusCode,
    retry_after: Option<String>,
    session: Option<String>,
    body: String,
}

async fn mcp_request(request: reqwest::RequestBuilder) -> McpAnswer {
    let response = request
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .send()
        .await
        .unwrap();
    let header = |name: &str| {
        response
            .headers()
            .get(name)
            .map(|value| value.to_str().unwrap().to_owned())
    };
    let (status, retry_after, session) = (
        response.status(),
        header("retry-after"),
        header("mcp-session-id"),
    );
    McpAnswer {
        status,
        retry_after,
        session,
        body: response.text().await.unwrap(),
    }
}

/// An `initialize` on `url` from `client`.
async fn initialize_with(client: &reqwest::Client, url: &str) -> McpAnswer {
    mcp_request(client.post(url).body(
        json!({"jsonrpc": "2.0", "id": 7, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "test", "version": "1"}
        }})
        .to_string(),
    ))
    .await
}

/// Asserts a refused `initialize`: `status`, `Retry-After`, and a JSON-RPC error (answering
/// the request's id) naming `limit`.
fn assert_refused(answer: &McpAnswer, status: StatusCode, limit: &str) {
    assert_eq!(answer.status, status, "{}", answer.body);
    let wait: u64 = answer.retry_after.as_deref().unwrap().parse().unwrap();
    assert!(wait >= 1);
    let body: Value = serde_json::from_str(&answer.body).unwrap();
    assert_eq!((&body["jsonrpc"], &body["id"]), (&json!("2.0"), &json!(7)));
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains(limit), "{message} should name {limit}");
    assert!(answer.session.is_none());
}

fn mcp_limits(per_address: u32, total: u32, idle_seconds: u64) -> McpSessions {
    McpSessions {
        per_address: NonZeroU32::new(per_address).unwrap(),
        total: NonZeroU32::new(total).unwrap(),
        idle: Duration::from_secs(idle_seconds),
        ..McpSessions::default()
    }
}

async fn refusals(system: &System, reason: &str) -> f64 {
    Scrape::fetch(&reqwest::Client::new(), &system.url("/metrics"))
        .await
        .value("toolrelay_refused_total", &[("reason", reason)])
}

#[tokio::test]
async fn one_address_holds_at_most_mcp_sessions_per_ip_and_gets_429_past_it() {
    let system = System::with(RelayConfig::default(), |config| {
        config.mcp_sessions = mcp_limits(2, 100, 120);
    })
    .await;
    let (one, two) = (client_from([127, 0, 0, 1]), client_from([127, 0, 0, 2]));
    for url in [system.url("/mcp"), system.url("/mcp/s/any-handle")] {
        let first = initialize_with(&one, &url).await;
        assert_eq!(first.status, StatusCode::OK, "{}", first.body);
        assert!(first.session.is_some());
    }
    // Both endpoints count against one share.
    for url in [system.url("/mcp"), system.url("/mcp/s/any-handle")] {
        assert_refused(
            &initialize_with(&one, &url).await,
            StatusCode::TOO_MANY_REQUESTS,
            "MCP_SESSIONS_PER_IP",
        );
    }
    assert_eq!(refusals(&system, "mcp_sessions_per_address").await, 2.0);
    // Another address has its own.
    let other = initialize_with(&two, &system.url("/mcp")).await;
    assert_eq!(other.status, StatusCode::OK, "{}", other.body);
    system.stop().await;
}

#[tokio::test]
async fn past_mcp_max_sessions_every_address_gets_503() {
    let system = System::with(RelayConfig::default(), |config| {
        config.mcp_sessions = mcp_limits(10, 2, 120);
    })
    .await;
    for from in [[127, 0, 0, 1], [127, 0, 0, 2]] {
        let opened = initialize_with(&client_from(from), &system.url("/mcp")).await;
        assert_eq!(opened.status, StatusCode::OK, "{}", opened.body);
    }
    assert_refused(
        &initialize_with(&client_from([127, 0, 0, 3]), &system.url("/mcp")).await,
        StatusCode::SERVICE_UNAVAILABLE,
        "MCP_MAX_SESSIONS",
    );
    assert_eq!(refusals(&system, "mcp_sessions_total").await, 1.0);
    system.stop().await;
}

#[tokio::test]
async fn ending_a_session_answers_200_and_frees_its_place() {
    let system = System::with(RelayConfig::default(), |config| {
        config.mcp_sessions = mcp_limits(1, 100, 120);
    })
    .await;
    let client = client_from([127, 0, 0, 1]);
    let opened = initialize_with(&client, &system.url("/mcp")).await;
    let session = opened.session.unwrap();
    assert_refused(
        &initialize_with(&client, &system.url("/mcp")).await,
        StatusCode::TOO_MANY_REQUESTS,
        "MCP_SESSIONS_PER_IP",
    );
    let ended = mcp_request(
        client
            .delete(system.url("/mcp"))
            .header("mcp-session-id", &session),
    )
    .await;
    // 200 or 204 is what clients expect (the Python SDK logs a failure on anything else).
    assert_eq!(ended.status, StatusCode::OK, "{}", ended.body);
    let again = initialize_with(&client, &system.url("/mcp")).await;
    assert_eq!(again.status, StatusCode::OK, "{}", again.body);
    system.stop().await;
}

#[tokio::test]
async fn an_idle_session_ends_in_the_gateway_and_in_the_store() {
    let system = System::with(RelayConfig::default(), |config| {
        config.mcp_sessions = mcp_limits(1, 100, 1);
    })
    .await;
    let client = client_from([127, 0, 0, 1]);
    let url = system.url("/mcp");
    let session = initialize_with(&client, &url).await.session.unwrap();
    // Its place comes free once it has been idle a second (asking with its id would keep it).
    let every = Deadline::within(Duration::from_secs(20)).every(Duration::from_millis(100));
    wait_until(every, async || {
        let answer = initialize_with(&client, &url).await;
        if answer.status == StatusCode::OK {
            return Ok(());
        }
        assert_refused(
            &answer,
            StatusCode::TOO_MANY_REQUESTS,
            "MCP_SESSIONS_PER_IP",
        );
        Err("the session never went idle")
    })
    .await;
    let gone = mcp_request(
        client
            .post(&url)
            .header("mcp-session-id", &session)
            .header("mcp-protocol-version", "2025-06-18")
            .body(json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}).to_string()),
    )
    .await;
    assert_eq!(gone.status, StatusCode::NOT_FOUND, "{}", gone.body);
    system.stop().await;
}

/// The resident memory of process `pid` (`VmRSS`), in MiB.
fn rss_mib(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kib: f64 = status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|value| value.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    kib / 1024.0
}

/// Loopback addresses the flood comes from, and `initialize`s each sends: 10,000 sessions, as
/// many as the default caps allow.
const FLOOD_ADDRESSES: u8 = 100;
const FLOOD_PER_ADDRESS: usize = 100;

/// Floods `system` (whose public port is served by process `pid`) with `initialize` from 100
/// addresses, checks that every one fits the default caps and the next are refused, and that
/// RSS stays under 256 MiB and comes back once the sessions went idle. Prints the figures.
async fn flood(
    name: &str,
    system: &System,
    pid: u32,
    redis: Option<&toolrelay_tests::redis::RedisServer>,
) {
    let url = system.url("/mcp");
    let before = rss_mib(pid);
    let redis_before = match redis {
        Some(redis) => redis.used_memory().await,
        None => 0,
    };
    let peak = Arc::new(Mutex::new(before));
    let sampling = {
        let peak = Arc::clone(&peak);
        tokio::spawn(async move {
            loop {
                let now = rss_mib(pid);
                {
                    let mut peak = peak.lock().unwrap();
                    *peak = peak.max(now);
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    };
    // A session begun before the flood: the gateway stops running it meanwhile (it runs a
    // few hundred at most), yet it still answers.
    let early = initialize_with(&client_from([127, 0, 0, 1]), &url)
        .await
        .session
        .unwrap();
    let started = std::time::Instant::now();
    let senders = (1..=FLOOD_ADDRESSES).map(|last| {
        let client = client_from([127, 0, 0, last]);
        let url = url.clone();
        let count = FLOOD_PER_ADDRESS - usize::from(last == 1);
        tokio::spawn(async move {
            for _ in 0..count {
                let answer = initialize_with(&client, &url).await;
                assert_eq!(answer.status, StatusCode::OK, "{}", answer.body);
            }
        })
    });
    tokio::time::timeout(
        Duration::from_secs(300),
        futures::future::try_join_all(senders),
    )
    .await
    .expect("the flood ends within 5 minutes")
    .unwrap();
    let flooded = started.elapsed();
    // Full: one more from a flooding address gets 429, from a new one 503.
    assert_refused(
        &initialize_with(&client_from([127, 0, 0, 1]), &url).await,
        StatusCode::TOO_MANY_REQUESTS,
        "MCP_SESSIONS_PER_IP",
    );
    assert_refused(
        &initialize_with(&client_from([127, 0, 0, 201]), &url).await,
        StatusCode::SERVICE_UNAVAILABLE,
        "MCP_MAX_SESSIONS",
    );
    let held = rss_mib(pid);
    let listed = mcp_request(
        client_from([127, 0, 0, 1])
            .post(&url)
            .header("mcp-session-id", &early)
            .header("mcp-protocol-version", "2025-06-18")
            .body(json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}).to_string()),
    )
    .await;
    assert_eq!(listed.status, StatusCode::OK, "{}", listed.body);
    assert!(listed.body.contains("connect_session"), "{}", listed.body);
    let redis_held = match redis {
        Some(redis) => redis.used_memory().await,
        None => 0,
    };
    // Idle sessions end: the caps free up, and the memory comes back.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    let newcomer = client_from([127, 0, 0, 202]);
    wait_until(
        Deadline::at(deadline).every(Duration::from_millis(500)),
        async || {
            if initialize_with(&newcomer, &url).await.status == StatusCode::OK {
                Ok(())
            } else {
                Err("the sessions never went idle")
            }
        },
    )
    .await;
    let mut after = rss_mib(pid);
    while after > before + 64.0 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(500)).await;
        after = rss_mib(pid);
    }
    sampling.abort();
    let peak = *peak.lock().unwrap();
    let redis_after = match redis {
        Some(redis) => redis.used_memory().await,
        None => 0,
    };
    let mib = |bytes: u64| bytes as f64 / 1024.0 / 1024.0;
    eprintln!(
        "FLOOD {name}: 10,000 initialize in {:.1} s; RSS before {before:.1} MiB, peak {peak:.1} MiB, held {held:.1} MiB ({:.1} KiB a session), after {after:.1} MiB; Redis used_memory before {:.1} MiB, held {:.1} MiB, after {:.1} MiB",
        flooded.as_secs_f64(),
        (held - before) * 1024.0 / 10_000.0,
        mib(redis_before),
        mib(redis_held),
        mib(redis_after),
    );
    assert!(peak < 256.0, "{name}: RSS peaked at {peak:.1} MiB");
    assert!(
        after <= before + 64.0,
        "{name}: RSS {after:.1} MiB, {before:.1} MiB before"
    );
    if redis.is_some() {
        assert!(
            redis_held < redis_before + 64 * 1024 * 1024,
            "{name}: Redis grew to {redis_held}"
        );
        assert!(
            redis_after < redis_before + 16 * 1024 * 1024,
            "{name}: Redis kept {redis_after}"
        );
    }
}

/// How long the flood's sessions live unused: short, so the test sees them go.
const FLOOD_IDLE: &str = "15";
/// The caps the flood fills: 100 addresses of 100 sessions (the defaults, 2,000 an address and
/// 20,000 in all, are sized for a hosted assistant's egress; these keep the flood to 10,000).
const FLOOD_CAPS: [(&str, &str); 2] = [
    (ENV_MCP_SESSIONS_PER_IP, "100"),
    (ENV_MCP_MAX_SESSIONS, "10000"),
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a flood against the release binaries: scripts/test.sh runs it (TOOLRELAY_BINARIES)"]
async fn a_flood_of_initialize_from_100_addresses_stays_bounded_in_memory() {
    let env = [
        (ENV_MCP_SESSION_IDLE, FLOOD_IDLE),
        FLOOD_CAPS[0],
        FLOOD_CAPS[1],
    ];
    let one_process = System::binary(&env).await;
    flood(
        "one process",
        &one_process,
        one_process.pid().unwrap(),
        None,
    )
    .await;
    one_process.stop().await;

    let split = System::split_with(&[], &env).await;
    flood("split gateway", &split, split.pid().unwrap(), None).await;
    split.stop().await;

    let redis = toolrelay_tests::redis::RedisServer::start().await;
    let redis_url = redis.url();
    let on_redis = System::binary(&[
        (ENV_MCP_SESSION_IDLE, FLOOD_IDLE),
        FLOOD_CAPS[0],
        FLOOD_CAPS[1],
        (ENV_REDIS_URL, &redis_url),
    ])
    .await;
    // The binary serves while it connects to its Redis: the flood starts once it is ready.
    toolrelay_tests::system::until_ready(&on_redis.url("/readyz")).await;
    flood(
        "one process on Redis",
        &on_redis,
        on_redis.pid().unwrap(),
        Some(&redis),
    )
    .await;
    on_redis.stop().await;
}

#[tokio::test]
async fn the_python_sdk_ends_its_session_without_a_complaint() {
    let system = System::start().await;
    let output = tokio::process::Command::new(toolrelay_tests::test_python())
        .arg(toolrelay_tests::repo_file("tests/python/mcp_call.py"))
        .arg(system.url("/mcp"))
        .arg("encodePlantUML")
        .arg(json!({"plantumlCode": "@startuml\nA -> B\n@enduml"}).to_string())
        .output()
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    let answer: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(answer["isError"], false, "{answer}");
    // The SDK ends its session with DELETE on leaving, and logs anything but 200 or 204.
    assert!(!stderr.contains("Session termination failed"), "{stderr}");
    system.stop().await;
}
