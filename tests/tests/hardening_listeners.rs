//! Defects found under attack on every listener, each shown fixed over real sockets: a
//! loopback relay answers only to its own host names (DNS rebinding), and connections are
//! capped per client address and cut off when their request head comes late or too large, or
//! when they sit idle between requests (issue 24, point 4).
#![allow(clippy::unwrap_used)] // a test that cannot unwrap should fail loudly

use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use toolrelay_gateway::config::ENV_ALLOWED_HOSTS;
use toolrelay_relay::RelayConfig;
use toolrelay_relay::listen::ConnectionLimits;
use toolrelay_tests::metrics::Scrape;
use toolrelay_tests::system::{System, paired};
use toolrelay_tests::{Deadline, PATIENCE, TestRelay, from_other_address, wait_until};

#[tokio::test]
async fn a_loopback_relay_answers_only_to_its_own_host_names() {
    let mut system = System::binary(&[(ENV_ALLOWED_HOSTS, "host.docker.internal")]).await;
    let (code, _token) = system.create_session().await;
    let port = system.base.rsplit(':').next().unwrap().to_owned();
    let with_host = |request: reqwest::RequestBuilder, host: &str| request.header("host", host);
    // What a DNS-rebinding page reaches: its own host name, resolved to 127.0.0.1.
    let rebound = [
        system
            .http
            .get(system.url(&format!("/api/sessions/{code}/metadata"))),
        system
            .http
            .post(system.url(&format!("/api/sessions/{code}/call")))
            .json(&json!({"functionName": "echo", "args": {"text": "x"}})),
        system.http.get(system.url("/metrics")),
        system.http.post(system.url("/api/sessions")),
        system
            .http
            .get(system.url(&format!("/metadata?code={code}"))),
    ];
    for request in rebound {
        let refused =
            toolrelay_tests::system::send(with_host(request, &format!("evil.example:{port}")))
                .await;
        assert_eq!(
            refused.status,
            StatusCode::MISDIRECTED_REQUEST,
            "{refused:?}"
        );
        assert_eq!(refused.body["error"], "host_not_allowed");
        assert!(
            refused.body["message"]
                .as_str()
                .unwrap()
                .contains("PUBLIC_BASE_URL"),
            "{refused:?}"
        );
    }
    // Loopback names with any port, and the names ALLOWED_HOSTS adds, are served.
    for host in [
        format!("localhost:{port}"),
        format!("127.0.0.1:{port}"),
        "[::1]:1234".to_owned(),
        format!("host.docker.internal:{port}"),
    ] {
        let served = toolrelay_tests::system::send(with_host(
            system
                .http
                .get(system.url(&format!("/api/sessions/{code}/metadata"))),
            &host,
        ))
        .await;
        assert_eq!(served.status, StatusCode::OK, "{host}: {served:?}");
    }
    assert_eq!(
        refused(&system.url("/metrics"), "host").await,
        5.0,
        "the refusals are counted"
    );
    system.terminate().await;
    system.exited().await;
}

// ---- Connections: caps, header-read and idle timeouts on every listener (issue 24, point 4) ----

/// Connection limits short enough for a test: a head gets `head` seconds, a kept-alive
/// connection `idle`, an address `per_address` connections.
fn connection_limits(head: u64, idle: u64, per_address: usize) -> ConnectionLimits {
    ConnectionLimits {
        header_read_timeout: Duration::from_secs(head),
        keep_alive_idle: Duration::from_secs(idle),
        max_per_address: per_address,
        ..ConnectionLimits::default()
    }
}

/// The one-process system with these connection limits.
async fn limited_system(limits: ConnectionLimits) -> System {
    System::with(RelayConfig::default(), |gateway| {
        gateway.connections = limits
    })
    .await
}

/// A standalone relay (gRPC and WebSocket ports) with these connection limits.
async fn limited_relay(limits: ConnectionLimits) -> TestRelay {
    TestRelay::with_config(RelayConfig {
        connections: limits,
        ..RelayConfig::default()
    })
    .await
}

/// Reads what the server sends until it closes the connection (within [`PATIENCE`]).
async fn until_closed(stream: &mut TcpStream) -> Vec<u8> {
    let mut all = Vec::new();
    let mut chunk = [0_u8; 4096];
    loop {
        let read = tokio::time::timeout(PATIENCE, stream.read(&mut chunk))
            .await
            .expect("the server closes the connection");
        match read {
            Ok(0) | Err(_) => return all,
            Ok(read) => all.extend_from_slice(&chunk[..read]),
        }
    }
}

/// Reads one whole answer to `GET /healthz` (whose body is `ok`).
async fn healthz_answer(stream: &mut TcpStream) -> String {
    let mut all = Vec::new();
    let mut chunk = [0_u8; 1024];
    while !all.ends_with(b"ok") {
        let read = tokio::time::timeout(PATIENCE, stream.read(&mut chunk))
            .await
            .unwrap()
            .unwrap();
        assert!(read > 0, "closed before answering");
        all.extend_from_slice(&chunk[..read]);
    }
    String::from_utf8_lossy(&all).into_owned()
}

async fn refused(url: &str, reason: &str) -> f64 {
    Scrape::fetch(&from_other_address(), url)
        .await
        .value("toolrelay_refused_total", &[("reason", reason)])
}

const HEALTHZ: &[u8] = b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n";

#[tokio::test]
async fn a_request_head_that_does_not_arrive_in_time_is_cut_off() {
    let system = limited_system(connection_limits(1, 30, 256)).await;
    let address = system.base.trim_start_matches("http://").to_owned();
    let started = Instant::now();
    let mut partial = TcpStream::connect(&address).await.unwrap();
    partial
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nX-Slow: ")
        .await
        .unwrap();
    let mut silent = TcpStream::connect(&address).await.unwrap();
    assert!(until_closed(&mut partial).await.is_empty());
    assert!(until_closed(&mut silent).await.is_empty());
    assert!(started.elapsed() >= Duration::from_millis(900));
    assert!(refused(&system.url("/metrics"), "header_timeout").await >= 2.0);
}

#[tokio::test]
async fn a_request_head_over_the_byte_limit_gets_431() {
    let system = limited_system(connection_limits(10, 30, 256)).await;
    let address = system.base.trim_start_matches("http://").to_owned();
    // Under the limit (64 KiB by default) is fine.
    let mut fine = TcpStream::connect(&address).await.unwrap();
    let head = format!(
        "GET /healthz HTTP/1.1\r\nHost: localhost\r\nX-Big: {}\r\n\r\n",
        "a".repeat(40 * 1024)
    );
    fine.write_all(head.as_bytes()).await.unwrap();
    assert!(healthz_answer(&mut fine).await.starts_with("HTTP/1.1 200"));
    let mut big = TcpStream::connect(&address).await.unwrap();
    let head = format!(
        "GET /healthz HTTP/1.1\r\nHost: localhost\r\nX-Big: {}\r\n\r\n",
        "a".repeat(80 * 1024)
    );
    // The server may stop reading (and close) before all of it is written.
    let _ = big.write_all(head.as_bytes()).await;
    let answer = String::from_utf8_lossy(&until_closed(&mut big).await).into_owned();
    assert!(answer.starts_with("HTTP/1.1 431"), "{answer:?}");
    assert!(refused(&system.url("/metrics"), "header_too_large").await >= 1.0);
}

#[tokio::test]
async fn an_idle_kept_alive_connection_is_closed_but_a_slow_call_completes() {
    let system = limited_system(connection_limits(10, 1, 256)).await;
    let address = system.base.trim_start_matches("http://").to_owned();
    let mut kept = TcpStream::connect(&address).await.unwrap();
    kept.write_all(HEALTHZ).await.unwrap();
    assert!(healthz_answer(&mut kept).await.starts_with("HTTP/1.1 200"));
    let idle = Instant::now();
    assert!(until_closed(&mut kept).await.is_empty());
    assert!(idle.elapsed() >= Duration::from_millis(900));

    // A call that takes three idle timeouts keeps its connection: it is in progress.
    let (code, _token, mut tab) = paired(&system).await;
    let call = system.post(
        &format!("/api/sessions/{code}/call"),
        json!({"functionName": "echo", "args": {"text": "slow"}, "timeoutMs": 20_000}),
    );
    let slow_tab = async {
        let request = tab.next_request().await;
        tokio::time::sleep(Duration::from_secs(3)).await;
        tab.answer(request["requestId"].as_str().unwrap(), json!("slow"))
            .await;
    };
    let (answer, ()) = tokio::join!(call, slow_tab);
    assert_eq!(answer.status, StatusCode::OK, "{answer:?}");
    assert_eq!(answer.body["result"], "slow", "{answer:?}");
}

#[tokio::test]
async fn connections_are_capped_per_client_address() {
    let system = limited_system(connection_limits(30, 30, 3)).await;
    let address = system.base.trim_start_matches("http://").to_owned();
    let mut held = Vec::new();
    for _ in 0..3 {
        let mut connection = TcpStream::connect(&address).await.unwrap();
        connection.write_all(HEALTHZ).await.unwrap();
        assert!(
            healthz_answer(&mut connection)
                .await
                .starts_with("HTTP/1.1 200")
        );
        held.push(connection);
    }
    let mut over = TcpStream::connect(&address).await.unwrap();
    let _ = over.write_all(HEALTHZ).await;
    assert!(
        until_closed(&mut over).await.is_empty(),
        "the fourth is refused"
    );
    // Another address still gets in.
    let other = from_other_address();
    let answer = other.get(system.url("/healthz")).send().await.unwrap();
    assert_eq!(answer.status(), StatusCode::OK);
    assert_eq!(
        refused(&system.url("/metrics"), "connections_per_address").await,
        1.0
    );
    // A closed connection gives its place back.
    drop(held.pop());
    let every = Deadline::within(PATIENCE).every(Duration::from_millis(50));
    wait_until(every, async || {
        let mut again = TcpStream::connect(&address).await.unwrap();
        let mut first = [0_u8; 1];
        if again.write_all(HEALTHZ).await.is_ok() && matches!(again.read(&mut first).await, Ok(1)) {
            Ok(())
        } else {
            Err("the place was not given back")
        }
    })
    .await;
}

#[tokio::test]
async fn the_relay_websocket_port_cuts_off_a_connection_that_sent_one_stray_byte() {
    let relay = limited_relay(connection_limits(1, 30, 256)).await;
    let started = Instant::now();
    let mut stray = TcpStream::connect(relay.websocket).await.unwrap();
    stray.write_all(b"X").await.unwrap();
    assert!(until_closed(&mut stray).await.is_empty());
    assert!(started.elapsed() >= Duration::from_millis(900));
    let metrics = format!("http://{}/metrics", relay.websocket);
    assert!(refused(&metrics, "header_timeout").await >= 1.0);
}

#[tokio::test]
async fn the_relay_grpc_port_has_the_caps_and_timeouts_too() {
    let relay = limited_relay(connection_limits(2, 1, 2)).await;
    let started = Instant::now();
    // A partial HTTP/2 preface, and a silent connection: the address's two places.
    let mut partial = TcpStream::connect(relay.grpc).await.unwrap();
    partial.write_all(b"PRI * HTTP/2.0\r\n").await.unwrap();
    let mut silent = TcpStream::connect(relay.grpc).await.unwrap();
    let mut over = TcpStream::connect(relay.grpc).await.unwrap();
    assert!(
        until_closed(&mut over).await.is_empty(),
        "the third is refused"
    );
    assert!(until_closed(&mut partial).await.is_empty());
    assert!(until_closed(&mut silent).await.is_empty());
    assert!(started.elapsed() >= Duration::from_millis(1900));
    let metrics = format!("http://{}/metrics", relay.websocket);
    assert_eq!(refused(&metrics, "connections_per_address").await, 1.0);
    assert!(refused(&metrics, "header_timeout").await >= 2.0);

    // A call waiting longer than the idle timeout is in progress: it completes.
    let (session, mut tab) = relay.paired().await;
    let caller = relay
        .spawn_call(toolrelay::proto::v1::CallRequest {
            code: session.code.clone(),
            function_name: "echo".into(),
            args: Some(toolrelay::json::to_struct(&json!({"text": "late"}))),
            timeout_ms: 20_000,
            ..Default::default()
        })
        .await;
    let request = tab.next_request().await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    tab.answer(request["requestId"].as_str().unwrap(), json!("late"))
        .await;
    let state = caller.await.unwrap().unwrap();
    assert_eq!(
        state.status(),
        toolrelay::proto::v1::RequestStatus::Completed
    );
}
