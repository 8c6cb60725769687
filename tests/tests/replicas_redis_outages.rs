//! Several replicas on one Redis, as real processes, and Redis lost under them: stopped,
//! stalled or killed mid-call, it costs 503s meanwhile but loses no call and runs none twice.

use std::time::Duration;

use futures::StreamExt;
use reqwest::StatusCode;
use serde_json::{Value, json};
use toolrelay_relay::config::ENV_RATE_LIMIT_REQUEST;
use toolrelay_tests::cluster::{Cluster, echo};
use toolrelay_tests::recording::RecordingTab;
use toolrelay_tests::sdk_tab::SdkTab;
use toolrelay_tests::system::send;
use toolrelay_tests::{Deadline, PATIENCE, demo_tools, wait_until};

/// Waits (with a deadline) until gateway 0's `/readyz` answers `status`; `otherwise` says
/// what went wrong.
async fn until_readyz(cluster: &Cluster, status: StatusCode, otherwise: &str) {
    let every = Deadline::within(PATIENCE).every(Duration::from_millis(50));
    wait_until(every, async || {
        if cluster.get(0, "/readyz").await.status == status {
            Ok(())
        } else {
            Err(otherwise)
        }
    })
    .await;
}

/// Redis stopped for 5 s and started again (AOF on): 503 with Retry-After meanwhile,
/// `/readyz` red then green, no process restarted, a connected tab kept (never told its
/// session expired), queued calls answered afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_outage_is_503_meanwhile_and_nothing_is_lost() {
    let mut cluster = Cluster::start(1, 1, &[]).await;
    let processes = cluster.processes();
    assert!(processes.iter().all(Option::is_some), "{processes:?}");
    // A tab connected before, during and after the outage.
    let (kept_code, kept_token) = cluster.create_session(0).await;
    let kept = RecordingTab::start(vec![cluster.tab_url(0, &kept_code, &kept_token)]);
    cluster.until_tab_registered(0, &kept_code).await;
    let (code, token) = cluster.create_session(0).await;
    let registered = send(
        reqwest::Client::new()
            .put(format!(
                "{}/api/sessions/{code}/manifest",
                cluster.gateways[0]
            ))
            .bearer_auth(&token)
            .json(&json!({"tools": demo_tools()})),
    )
    .await;
    assert_eq!(registered.status, StatusCode::OK, "{registered:?}");
    // A call queued while no tab is there.
    let queued = cluster
        .post(
            0,
            &format!("/api/sessions/{code}/request"),
            echo("queued-before", "q"),
        )
        .await;
    assert_eq!(queued.status, StatusCode::ACCEPTED, "{queued:?}");
    // Ready before the outage (on a loaded machine one of the relay's store checks may
    // have been slow to answer, and its next one tells again).
    until_readyz(
        &cluster,
        StatusCode::OK,
        "/readyz stayed red before the outage",
    )
    .await;

    cluster.redis.stop().await;
    let outage_began = tokio::time::Instant::now();
    let refused = cluster.post(0, "/api/sessions", json!({})).await;
    assert_eq!(
        refused.status,
        StatusCode::SERVICE_UNAVAILABLE,
        "{refused:?}"
    );
    assert!(refused.header("retry-after").is_some(), "{refused:?}");
    let call = cluster
        .post(
            0,
            &format!("/api/sessions/{code}/call"),
            echo("during", "d"),
        )
        .await;
    assert_eq!(call.status, StatusCode::SERVICE_UNAVAILABLE, "{call:?}");
    assert!(call.header("retry-after").is_some(), "{call:?}");
    // The relay notices within a second or so; its health (and the gateway's /readyz) turns red.
    until_readyz(
        &cluster,
        StatusCode::SERVICE_UNAVAILABLE,
        "/readyz stayed green",
    )
    .await;
    // Down for 5 s in all.
    tokio::time::sleep_until(outage_began + Duration::from_secs(5)).await;
    cluster.redis.restart().await;

    until_readyz(&cluster, StatusCode::OK, "/readyz stayed red").await;
    // The same processes serve, with what was queued before the outage.
    assert_eq!(
        cluster.processes(),
        processes,
        "a process stopped or restarted"
    );
    let tab = RecordingTab::start(vec![cluster.tab_url(0, &code, &token)]);
    cluster.until_tab_registered(0, &code).await;
    let answered = cluster
        .post(
            0,
            &format!("/api/sessions/{code}/call"),
            echo("queued-before", "q"),
        )
        .await;
    answered.assert_echoed("q");
    assert_eq!(tab.deliveries(), ["queued-before"]);
    let after = cluster
        .post(0, &format!("/api/sessions/{code}/call"), echo("after", "a"))
        .await;
    after.assert_echoed("a");
    // The tab connected all along kept its one connection, was never told its session ended,
    // and serves calls on it.
    let through = cluster
        .post(
            0,
            &format!("/api/sessions/{kept_code}/call"),
            echo("through", "t"),
        )
        .await;
    through.assert_echoed("t");
    assert_eq!(kept.connections(), 1);
    assert_eq!(kept.delivered_on(1), ["through"]);
    let frames = kept.other_frames();
    assert!(
        !frames
            .iter()
            .any(|kind| kind == "expired" || kind == "error"),
        "{frames:?}"
    );
}

/// How Redis fails in the middle of a run of calls.
#[derive(Debug, Clone, Copy)]
enum RedisFailure {
    /// Frozen for 5 s (`SIGSTOP`, then `SIGCONT`): what the replicas sent meanwhile runs when
    /// it wakes, after they gave up waiting for the replies.
    Stall,
    /// `kill -9`, then started again from its append-only file.
    Crash,
}

/// Calls in flight when Redis fails.
const CALLS_IN_FLIGHT: usize = 500;

/// Calls `echo` as `outage-{n}` through `gateway` until it is answered, asking again with the
/// same requestId after a 503 (or a 202: not answered within the wait), as a client does:
/// `(n, the answer's body)`.
async fn call_until_answered(
    http: reqwest::Client,
    gateway: String,
    code: String,
    n: usize,
) -> (usize, Value) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(50);
    let mut wait = Duration::from_millis(100);
    loop {
        let sent = http
            .post(format!("{gateway}/api/sessions/{code}/call"))
            .json(&echo(&format!("outage-{n}"), &format!("n{n}")))
            .send()
            .await;
        let again = match sent {
            Ok(response) if response.status() == StatusCode::OK => {
                let body = response.bytes().await.unwrap();
                return (n, serde_json::from_slice(&body).unwrap());
            }
            Ok(response)
                if matches!(
                    response.status(),
                    StatusCode::ACCEPTED | StatusCode::SERVICE_UNAVAILABLE
                ) =>
            {
                response.status().to_string()
            }
            Ok(response) => panic!(
                "call {n}: {} {}",
                response.status(),
                response.text().await.unwrap_or_default()
            ),
            // The gateway's connection broke under a stalled request: ask again.
            Err(error) => error.to_string(),
        };
        assert!(
            tokio::time::Instant::now() < deadline,
            "call {n} never answered: {again}"
        );
        tokio::time::sleep(wait).await;
        wait = (wait * 2).min(Duration::from_secs(1));
    }
}

/// 500 calls in flight through two gateways on two relays, the tab being the browser SDK's
/// own transport on relay B (through gateway 1), Redis failing in the middle: every caller
/// gets its answer (asking again after a 503), none expires, and the tab runs each call
/// exactly once. Two ways were lost before: a claim whose reply timed out but which Redis
/// ran later (the call stayed delivered to a tab that never got it), and an answer refused
/// with `store_unavailable` that the SDK had already forgotten.
async fn calls_in_flight_survive(failure: RedisFailure) {
    let mut cluster = Cluster::start(2, 2, &[(ENV_RATE_LIMIT_REQUEST, "100000")]).await;
    let (code, token) = cluster.create_session(0).await;
    // Each call takes 50 ms in the tab, so that some are always under way there: their
    // answers meet the failure.
    let tab = SdkTab::start(
        &cluster.gateways[1],
        &code,
        &token,
        Duration::from_millis(50),
    );
    cluster.until_tab_registered(0, &code).await;

    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap();
    let gateways = cluster.gateways.clone();
    let calling = code.clone();
    let calls = tokio::spawn(
        futures::stream::iter(0..CALLS_IN_FLIGHT)
            .map(move |n| {
                call_until_answered(http.clone(), gateways[n % 2].clone(), calling.clone(), n)
            })
            .buffer_unordered(50)
            .collect::<Vec<_>>(),
    );
    tab.until("a fifth of the calls run", 3 * PATIENCE, |ledger| {
        ledger.runs.len() >= CALLS_IN_FLIGHT / 5
    })
    .await;
    let ran_before = tab.read(|ledger| ledger.runs.len());
    match failure {
        RedisFailure::Stall => {
            cluster.redis.pause().await;
            tokio::time::sleep(Duration::from_secs(5)).await;
            cluster.redis.resume().await;
        }
        RedisFailure::Crash => {
            cluster.redis.stop().await;
            tokio::time::sleep(Duration::from_secs(2)).await;
            cluster.redis.restart().await;
        }
    }
    assert!(
        ran_before < CALLS_IN_FLIGHT,
        "the calls were over before Redis failed"
    );

    let answers = tokio::time::timeout(Duration::from_secs(90), calls)
        .await
        .expect("the callers never finished")
        .unwrap();
    assert_eq!(answers.len(), CALLS_IN_FLIGHT);
    for (n, body) in &answers {
        // An expired call would be answered too, with success false and request_expired.
        assert_eq!(body["success"], true, "call {n}: {body}");
        assert_eq!(body["result"], json!({"text": format!("n{n}")}), "call {n}");
    }
    // Every call is finished now, so none is delivered again from the store; a delivery of
    // one already on its way to the tab goes before a call made after (one connection, in
    // order): once that call has run, every run is counted.
    let http = reqwest::Client::new();
    let (n, barrier) = call_until_answered(
        http,
        cluster.gateways[0].clone(),
        code.clone(),
        CALLS_IN_FLIGHT,
    )
    .await;
    assert_eq!(
        barrier["result"],
        json!({"text": format!("n{n}")}),
        "{barrier}"
    );
    let runs = tab.read(|ledger| ledger.runs.clone());
    assert_eq!(runs.len(), CALLS_IN_FLIGHT + 1, "every call ran");
    let repeated: Vec<_> = runs.iter().filter(|(_, count)| **count != 1).collect();
    assert!(
        repeated.is_empty(),
        "calls run more than once: {repeated:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_stalled_5_s_under_500_calls_loses_none_and_runs_each_once() {
    calls_in_flight_survive(RedisFailure::Stall).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_killed_and_restarted_under_500_calls_loses_none_and_runs_each_once() {
    calls_in_flight_survive(RedisFailure::Crash).await;
}
