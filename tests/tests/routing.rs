//! Calls routed to the replica that holds their tab (`REPLICA_URL`), as real processes on one
//! Redis: the caller's relay sends the call to the tab's relay and its answer comes back on
//! the same stream; when that relay dies mid-call or is draining, the call takes the pub/sub
//! path and is answered once all the same.

use futures::StreamExt;
use reqwest::StatusCode;
use serde_json::{Value, json};
use toolrelay_relay::config::{ENV_DRAIN_SECONDS, ENV_RATE_LIMIT_REQUEST, ENV_REPLICA_URL};
use toolrelay_tests::PATIENCE;
use toolrelay_tests::cluster::Cluster;
use toolrelay_tests::metrics::Scrape;
use toolrelay_tests::recording::RecordingTab;
use toolrelay_tests::system::Answer;
use toolrelay_tests::wait_until;

/// Port 0: each relay's own gRPC port, as its listener bound it.
const ROUTED: (&str, &str) = (ENV_REPLICA_URL, "http://127.0.0.1:0");

fn echo(id: &str, text: &str) -> Value {
    json!({"requestId": id, "functionName": "echo", "args": {"text": text}, "timeoutMs": 60_000})
}

/// How many calls relay `relay` counted as routed `way` (`toolrelay_routed_calls_total`).
async fn routed(cluster: &Cluster, relay: usize, way: &str) -> f64 {
    let url = format!("http://{}/metrics", cluster.relay_websockets[relay]);
    Scrape::fetch(&reqwest::Client::new(), &url)
        .await
        .value("toolrelay_routed_calls_total", &[("way", way)])
}

/// The tab on relay B, the caller on relay A: calls go to B by the route (never announced on
/// Redis), and the tab on A's own relay is handed its calls in the process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_go_to_the_replica_that_holds_their_tab() {
    let cluster = Cluster::start(2, 2, &[ROUTED, (ENV_RATE_LIMIT_REQUEST, "100000")]).await;
    let (code, token) = cluster.create_session(0).await;
    let tab = RecordingTab::start(vec![cluster.tab_url(1, &code, &token)]);
    cluster.until_tab_registered(0, &code).await;
    for n in 0..5 {
        let answer = cluster
            .post(
                0,
                &format!("/api/sessions/{code}/call"),
                echo(&format!("a-{n}"), &format!("a{n}")),
            )
            .await;
        answer.assert_echoed(&format!("a{n}"));
    }
    assert_eq!(routed(&cluster, 0, "forwarded").await, 5.0);
    assert_eq!(routed(&cluster, 1, "accepted").await, 5.0);
    assert_eq!(routed(&cluster, 0, "fallback").await, 0.0);
    // Many at once, on the one connection between the relays: each stream read to its end, so
    // none is reset and HTTP/2's guard against rapid resets never cuts the connection.
    let path = format!("/api/sessions/{code}/call");
    let many: Vec<Answer> = futures::stream::iter(0..300)
        .map(|n| cluster.post(0, &path, echo(&format!("m-{n}"), &format!("m{n}"))))
        .buffer_unordered(30)
        .collect()
        .await;
    for answer in &many {
        assert_eq!(answer.status, StatusCode::OK, "{answer:?}");
    }
    assert_eq!(routed(&cluster, 0, "forwarded").await, 305.0);
    assert_eq!(
        routed(&cluster, 0, "fallback").await,
        0.0,
        "no forward failed"
    );
    // Through relay B itself: the tab is there.
    for n in 0..3 {
        let answer = cluster
            .post(
                1,
                &format!("/api/sessions/{code}/call"),
                echo(&format!("b-{n}"), &format!("b{n}")),
            )
            .await;
        answer.assert_echoed(&format!("b{n}"));
    }
    assert_eq!(routed(&cluster, 1, "local").await, 3.0);
    // Each call delivered once.
    assert_eq!(tab.deliveries().len(), 308, "each call delivered once");
    let mut delivered = tab.deliveries();
    delivered.retain(|id| !id.starts_with("m-"));
    delivered.sort();
    assert_eq!(
        delivered,
        ["a-0", "a-1", "a-2", "a-3", "a-4", "b-0", "b-1", "b-2"]
    );
}

/// `kill -9` the relay holding the tab while a call routed to it is unanswered: the caller's
/// relay announces the call on Redis, the tab (moved to the caller's relay) gets it again and
/// answers it from what it ran, and the caller — still waiting — gets the one answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_routed_call_whose_tab_replica_is_killed_is_answered_once_through_the_fallback() {
    let mut cluster = Cluster::start(2, 1, &[ROUTED]).await;
    let (code, token) = cluster.create_session(0).await;
    let tab = RecordingTab::start(vec![
        cluster.tab_url(1, &code, &token),
        cluster.tab_url(0, &code, &token),
    ]);
    cluster.until_tab_registered(0, &code).await;
    tab.hold(true);
    let waiting = tokio::spawn(cluster.post(
        0,
        &format!("/api/sessions/{code}/call"),
        echo("routed-1", "r1"),
    ));
    tab.until("the call on relay B", PATIENCE, |ledger| {
        !ledger.deliveries.is_empty()
    })
    .await;
    assert_eq!(
        routed(&cluster, 0, "forwarded").await,
        1.0,
        "sent by the route"
    );
    cluster.kill_relay(1).await;
    tab.hold(false);

    let answer = waiting.await.unwrap();
    answer.assert_echoed("r1");
    assert_eq!(routed(&cluster, 0, "fallback").await, 1.0);
    // Delivered once on the connection to B, once again on the one to A (answered from what
    // it ran): never twice to one connection, run once.
    assert_eq!(tab.delivered_on(1), ["routed-1"]);
    assert_eq!(tab.delivered_on(2), ["routed-1"]);
    let call = cluster
        .get(0, &format!("/api/sessions/{code}/requests/routed-1"))
        .await;
    assert_eq!(call.body["status"], "completed", "{call:?}");
    assert_eq!(
        call.body["response"]["result"],
        json!({"text": "r1"}),
        "{call:?}"
    );
}

/// A relay draining (`SIGTERM`) while its tab still answers a call takes no routed call: the
/// caller's relay falls back to Redis at once, and the call reaches the tab only after it
/// moved — never through the draining relay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_to_a_draining_replica_s_tab_is_not_sent_there() {
    let mut cluster = Cluster::start(2, 1, &[ROUTED, (ENV_DRAIN_SECONDS, "30")]).await;
    let (code, token) = cluster.create_session(0).await;
    let tab = RecordingTab::start(vec![
        cluster.tab_url(1, &code, &token),
        cluster.tab_url(0, &code, &token),
    ]);
    cluster.until_tab_registered(0, &code).await;
    // A call held by the tab keeps it on relay B while B drains.
    tab.hold(true);
    let first = tokio::spawn(cluster.post(
        0,
        &format!("/api/sessions/{code}/call"),
        echo("before-drain", "one"),
    ));
    tab.until("the first call", PATIENCE, |ledger| {
        !ledger.deliveries.is_empty()
    })
    .await;
    cluster.terminate_relay(1).await;
    let readyz = format!("http://{}/readyz", cluster.relay_websockets[1]);
    let http = reqwest::Client::new();
    wait_until(PATIENCE, async || match http.get(&readyz).send().await {
        Ok(answer) if answer.status() == StatusCode::SERVICE_UNAVAILABLE => Ok(()),
        _ => Err("relay B's /readyz stayed green"),
    })
    .await;

    let second = tokio::spawn(cluster.post(
        0,
        &format!("/api/sessions/{code}/call"),
        echo("during-drain", "two"),
    ));
    wait_until(PATIENCE, async || {
        if routed(&cluster, 0, "fallback").await >= 1.0 {
            Ok(())
        } else {
            Err("relay A did not fall back from the draining relay")
        }
    })
    .await;
    assert_eq!(
        routed(&cluster, 1, "accepted").await,
        1.0,
        "only the first call"
    );
    tab.hold(false);
    first.await.unwrap().assert_echoed("one");
    second.await.unwrap().assert_echoed("two");
    assert!(cluster.relay_exited(1).await.success());
    // The second call reached the tab on its connection to relay A only.
    assert_eq!(tab.delivered_on(1), ["before-drain"]);
    assert_eq!(tab.delivered_on(2), ["during-drain"]);
}
