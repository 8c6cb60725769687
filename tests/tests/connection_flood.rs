//! Floods of connections from one address (issue 24, point 4), against the real binaries —
//! the release build in `scripts/test.sh`'s `--ignored` phase (`TOOLRELAY_BINARIES`): while
//! 2,000 slow-header and idle connections from 127.0.0.1 are held, `/healthz` and
//! `POST /api/sessions` from 127.0.0.2 answer within 2 s, on the one-process binary and on the
//! relay's WebSocket port. The binaries start with a soft limit of 1,024 open files (a common
//! default, which they raise to the hard limit); the test process holds the flood's sockets.
#![allow(clippy::unwrap_used)] // a test that cannot unwrap should fail loudly

use std::time::{Duration, Instant};

use nix::sys::resource::{Resource, getrlimit, setrlimit};
use reqwest::StatusCode;
use serde_json::json;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use toolrelay_relay::config::ENV_MAX_CONNECTIONS_PER_IP;
use toolrelay_tests::from_other_address;
use toolrelay_tests::system::System;

/// Connections the flood holds.
const FLOOD: usize = 2_000;
/// How long another address may wait for an answer while the flood is held.
const DEADLINE: Duration = Duration::from_secs(2);
/// Soft limit of open files the binaries start with.
const STARTING_FILES: u64 = 1_024;
/// The per-address cap the binaries run with here: below the flood, so that the test shows the
/// cap holding (the default, 5,000, is sized for a school's tabs behind one address and is
/// shown by `shared_address.rs`).
const PER_ADDRESS: &str = "256";

/// Starts a system with a soft limit of [`STARTING_FILES`] open files, then gives this test
/// process as many as it may have (the flood's sockets are here).
async fn started_with_few_files<F: Future<Output = System>>(start: F) -> System {
    let (_, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
    setrlimit(Resource::RLIMIT_NOFILE, STARTING_FILES.min(hard), hard).unwrap();
    let system = start.await;
    setrlimit(Resource::RLIMIT_NOFILE, hard, hard).unwrap();
    assert!(
        hard >= FLOOD as u64 + 500,
        "the open-files hard limit ({hard}) is too low for the flood"
    );
    system
}

/// Opens [`FLOOD`] connections to `address` from 127.0.0.1: half send a request head that never
/// ends, half send nothing.
async fn flood(address: &str) -> Vec<TcpStream> {
    let started = Instant::now();
    let mut held = Vec::with_capacity(FLOOD);
    for n in 0..FLOOD {
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "opening the flood took too long"
        );
        let Ok(Ok(mut stream)) =
            tokio::time::timeout(Duration::from_secs(5), TcpStream::connect(address)).await
        else {
            continue;
        };
        if n % 2 == 0 {
            let _ = stream
                .write_all(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nX-Slow: a")
                .await;
        }
        held.push(stream);
    }
    held
}

/// How many of the flood's connections the server still holds open.
fn still_open(held: &[TcpStream]) -> usize {
    let mut byte = [0_u8; 1];
    held.iter()
        .filter(|stream| {
            matches!(stream.try_read(&mut byte), Err(error) if error.kind() == std::io::ErrorKind::WouldBlock)
        })
        .count()
}

/// `request`'s answer and how long it took, which must be within [`DEADLINE`].
async fn within_deadline(what: &str, request: reqwest::RequestBuilder) -> (StatusCode, Duration) {
    let started = Instant::now();
    let answer = tokio::time::timeout(DEADLINE, request.send())
        .await
        .unwrap_or_else(|_| panic!("{what} did not answer within {DEADLINE:?} during the flood"))
        .unwrap();
    (answer.status(), started.elapsed())
}

async fn refused(client: &reqwest::Client, url: &str, reason: &str) -> u64 {
    let page = client.get(url).send().await.unwrap().text().await.unwrap();
    let series = format!("toolrelay_refused_total{{reason=\"{reason}\"}} ");
    page.lines()
        .find_map(|line| line.strip_prefix(&series))
        .and_then(|value| value.trim().parse::<f64>().ok())
        .map_or(0, |value| value as u64)
}

/// One test, so that the limit of open files this process lowers for a start is never lowered
/// while the other flood is held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "floods of 2,000 connections: run by scripts/test.sh against the release binaries"]
async fn floods_from_one_address_leave_room_for_others() {
    the_one_process_binary_answers_others_while_one_address_floods_it().await;
    the_relay_websocket_port_answers_others_while_one_address_floods_it().await;
}

async fn the_one_process_binary_answers_others_while_one_address_floods_it() {
    let cap = [(ENV_MAX_CONNECTIONS_PER_IP, PER_ADDRESS)];
    let system = started_with_few_files(System::binary(&cap)).await;
    let address = system.base.trim_start_matches("http://").to_owned();
    let opening = Instant::now();
    let held = flood(&address).await;
    let opened = opening.elapsed();
    let other = from_other_address();
    let (health, health_took) =
        within_deadline("/healthz", other.get(system.url("/healthz"))).await;
    assert_eq!(health, StatusCode::OK);
    let (created, created_took) = within_deadline(
        "POST /api/sessions",
        other.post(system.url("/api/sessions")).json(&json!({})),
    )
    .await;
    assert_eq!(created, StatusCode::CREATED);
    let open = still_open(&held);
    let per_address = refused(&other, &system.url("/metrics"), "connections_per_address").await;
    println!(
        "one-process binary: {} of {FLOOD} flood connections opened in {opened:?}, {open} held by the server, {per_address} refused (per address); /healthz in {health_took:?}, POST /api/sessions in {created_took:?}",
        held.len()
    );
    assert!(
        open <= 256,
        "the per-address cap of {PER_ADDRESS} holds ({open} open)"
    );
}

async fn the_relay_websocket_port_answers_others_while_one_address_floods_it() {
    let cap = [(ENV_MAX_CONNECTIONS_PER_IP, PER_ADDRESS)];
    let system = started_with_few_files(System::relay_binary(&cap)).await;
    let address = system.base.trim_start_matches("http://").to_owned();
    let opening = Instant::now();
    let held = flood(&address).await;
    let opened = opening.elapsed();
    let other = from_other_address();
    let (health, health_took) =
        within_deadline("/healthz", other.get(system.url("/healthz"))).await;
    assert_eq!(health, StatusCode::OK);
    let open = still_open(&held);
    let per_address = refused(&other, &system.url("/metrics"), "connections_per_address").await;
    println!(
        "relay WebSocket port: {} of {FLOOD} flood connections opened in {opened:?}, {open} held by the server, {per_address} refused (per address); /healthz in {health_took:?}",
        held.len()
    );
    assert!(
        open <= 256,
        "the per-address cap of {PER_ADDRESS} holds ({open} open)"
    );
}
