//! Several replicas on one Redis, as real processes: calls cross replicas, and a replica (or
//! Redis) lost mid-call loses no call and runs none twice.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use reqwest::StatusCode;
use serde_json::{Value, json};
use toolrelay_relay::config::{
    ENV_RATE_LIMIT_LOOKUP, ENV_RATE_LIMIT_REQUEST, ENV_RATE_LIMIT_SESSION, ENV_RATE_LIMIT_TOOL,
};
use toolrelay_tests::cluster::Cluster;
use toolrelay_tests::recording::RecordingTab;
use toolrelay_tests::sdk_tab::SdkTab;
use toolrelay_tests::system::{Answer, send};
use toolrelay_tests::{Deadline, PATIENCE, demo_tools, wait_until};

fn echo(id: &str, text: &str) -> Value {
    json!({"requestId": id, "functionName": "echo", "args": {"text": text}, "timeoutMs": 30_000})
}

/// 2 relays + 2 gateways + Redis: the tab on relay A, the LLM alternating gateways (B is in
/// front of relay B): 500 calls, each answered and delivered exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_hundred_calls_across_replicas_each_delivered_once() {
    // One test client makes all the calls: lift the per-address budget.
    let cluster = Cluster::start(2, 2, &[(ENV_RATE_LIMIT_REQUEST, "100000")]).await;
    let (code, token) = cluster.create_session(1).await;
    let tab = RecordingTab::start(vec![cluster.tab_url(0, &code, &token)]);
    cluster.until_tab_registered(1, &code).await;

    let calls = futures::stream::iter(0..500)
        .map(|n| {
            let answer = cluster.post(
                n % 2,
                &format!("/api/sessions/{code}/call"),
                echo(&format!("call-{n}"), &format!("n{n}")),
            );
            async move { (n, answer.await) }
        })
        .buffer_unordered(16)
        .collect::<Vec<_>>()
        .await;
    for (n, answer) in &calls {
        answer.assert_echoed(&format!("n{n}"));
    }
    // Every call is finished now, so none is delivered again from the store; a delivery of
    // one already on its way to the tab goes before a call made after (one connection, in
    // order): once that call is answered, every delivery is counted.
    let barrier = cluster
        .post(
            0,
            &format!("/api/sessions/{code}/call"),
            echo("barrier", "b"),
        )
        .await;
    barrier.assert_echoed("b");
    let deliveries = tab.deliveries();
    assert_eq!(deliveries.len(), 501, "every call delivered exactly once");
    let distinct: std::collections::HashSet<&String> = deliveries.iter().collect();
    assert_eq!(distinct.len(), 501, "no call delivered twice");
    assert_eq!(tab.connections(), 1);
}

/// `kill -9` relay A while it holds delivered, unanswered calls: the tab reconnects to B,
/// every call completes once, and every caller gets its answer, directly or by asking again
/// with its requestId through any gateway.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_killed_mid_call_loses_no_call_and_runs_none_twice() {
    let mut cluster = Cluster::start(2, 2, &[]).await;
    let (code, token) = cluster.create_session(0).await;
    let tab = RecordingTab::start(vec![
        cluster.tab_url(0, &code, &token),
        cluster.tab_url(1, &code, &token),
    ]);
    cluster.until_tab_registered(0, &code).await;
    tab.hold(true);
    // Ten calls, alternating gateways, all delivered to the tab on relay A and held there.
    let waiting: Vec<_> = (0..10)
        .map(|n| {
            tokio::spawn(cluster.post(
                n % 2,
                &format!("/api/sessions/{code}/call"),
                echo(&format!("held-{n}"), &format!("h{n}")),
            ))
        })
        .collect();
    tab.until("ten calls", 3 * PATIENCE, |ledger| {
        ledger.deliveries.len() >= 10
    })
    .await;
    cluster.kill_relay(0).await;
    tab.hold(false);
    // The tab is back, on relay B, and gets the held calls again: each once.
    tab.until("a second connection", 3 * PATIENCE, |ledger| {
        ledger.connections >= 2
    })
    .await;
    let held: std::collections::BTreeSet<String> = (0..10).map(|n| format!("held-{n}")).collect();
    tab.until("the held calls again", 3 * PATIENCE, |ledger| {
        ledger.deliveries.iter().filter(|(on, _)| *on >= 2).count() >= 10
    })
    .await;

    for (n, waiting) in waiting.into_iter().enumerate() {
        let answer = waiting.await.unwrap();
        let text = format!("h{n}");
        if answer.status == StatusCode::OK && answer.body["success"] == true {
            assert_eq!(answer.body["result"], json!({"text": text}), "{answer:?}");
            continue;
        }
        // The caller's relay died under it: it asks again, with the same requestId, through
        // the gateway that is left (in front of relay B).
        let again = cluster
            .post(
                1,
                &format!("/api/sessions/{code}/call"),
                echo(&format!("held-{n}"), &text),
            )
            .await;
        again.assert_echoed(&text);
    }
    // Delivered once to the first connection, once again to the one after (the tab answers
    // the repeat from what it ran, as the plugin does): never twice to one connection.
    let first = tab.delivered_on(1);
    assert_eq!(first.len(), 10, "{first:?}");
    assert_eq!(
        first
            .iter()
            .cloned()
            .collect::<std::collections::BTreeSet<_>>(),
        held
    );
    let again: Vec<String> = (2..=tab.connections())
        .flat_map(|c| tab.delivered_on(c))
        .collect();
    assert_eq!(again.len(), 10, "{again:?}");
    assert_eq!(
        again.into_iter().collect::<std::collections::BTreeSet<_>>(),
        held
    );
    // Each call is completed, once: asking for it gives the tab's one answer.
    for n in 0..10 {
        let call = cluster
            .get(1, &format!("/api/sessions/{code}/requests/held-{n}"))
            .await;
        assert_eq!(call.body["status"], "completed", "{call:?}");
        assert_eq!(
            call.body["response"]["result"],
            json!({"text": format!("h{n}")}),
            "{call:?}"
        );
    }
}

/// `kill -9` a gateway mid-call: the caller asks again through the other gateway with the
/// same requestId and gets the answer; the tool ran once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_killed_mid_call_is_answered_through_the_other() {
    let mut cluster = Cluster::start(2, 2, &[]).await;
    let (code, token) = cluster.create_session(0).await;
    let tab = RecordingTab::start(vec![cluster.tab_url(1, &code, &token)]);
    cluster.until_tab_registered(0, &code).await;
    tab.hold(true);
    let waiting = tokio::spawn(
        reqwest::Client::new()
            .post(format!("{}/api/sessions/{code}/call", cluster.gateways[0]))
            .json(&echo("slow", "s"))
            .send(),
    );
    tab.until("the call", 3 * PATIENCE, |ledger| {
        !ledger.deliveries.is_empty()
    })
    .await;
    cluster.kill_gateway(0).await;
    // The caller's connection is gone with the gateway.
    let lost = waiting.await.unwrap();
    assert!(lost.is_err(), "the dead gateway answered: {lost:?}");
    tab.hold(false);
    let again = cluster
        .post(1, &format!("/api/sessions/{code}/call"), echo("slow", "s"))
        .await;
    again.assert_echoed("s");
    assert_eq!(tab.deliveries(), ["slow"], "delivered once, to the one tab");
}

/// A gateway in front of both relays (`RELAY_URL` lists them) spreads its calls over them.
/// `kill -9` relay A while callers wait on it and its tab holds their calls: the gateway asks
/// relay B again with the same requestIds, so every caller gets its answer directly, no call
/// runs twice, and the gateway goes on serving from B.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_balances_over_relays_and_moves_waiting_callers_off_a_dead_one() {
    let mut cluster = Cluster::balanced(2, 1, &[]).await;
    for _ in 0..6 {
        cluster.create_session(0).await;
    }
    // Each relay made at least one of the sessions (its log line written a little later).
    for (n, logs) in cluster.relay_logs.iter().enumerate() {
        logs.until(&format!("of a session made by relay {n}"), |line| {
            line.contains("\"session created\"")
        })
        .await;
    }

    let (code, token) = cluster.create_session(0).await;
    let tab = RecordingTab::start(vec![
        cluster.tab_url(0, &code, &token),
        cluster.tab_url(1, &code, &token),
    ]);
    cluster.until_tab_registered(0, &code).await;
    tab.hold(true);
    let waiting: Vec<_> = (0..10)
        .map(|n| {
            tokio::spawn(cluster.post(
                0,
                &format!("/api/sessions/{code}/call"),
                echo(&format!("held-{n}"), &format!("h{n}")),
            ))
        })
        .collect();
    tab.until("ten calls", 3 * PATIENCE, |ledger| {
        ledger.deliveries.len() >= 10
    })
    .await;
    cluster.kill_relay(0).await;
    tab.hold(false);
    for (n, waiting) in waiting.into_iter().enumerate() {
        waiting.await.unwrap().assert_echoed(&format!("h{n}"));
    }
    // Never twice to one connection, and each at most once more after the reconnect.
    for connection in 1..=tab.connections() {
        let delivered = tab.delivered_on(connection);
        let distinct: std::collections::HashSet<&String> = delivered.iter().collect();
        assert_eq!(
            distinct.len(),
            delivered.len(),
            "connection {connection}: {delivered:?}"
        );
    }
    assert_eq!(tab.delivered_on(1).len(), 10);
    // Relay A stays dead: the gateway serves from B, and is ready.
    for n in 0..6 {
        let answer = cluster
            .post(
                0,
                &format!("/api/sessions/{code}/call"),
                echo(&format!("after-{n}"), "a"),
            )
            .await;
        answer.assert_echoed("a");
    }
    assert_eq!(cluster.get(0, "/readyz").await.status, StatusCode::OK);
}

/// Built-in tools called through a session, across replicas: PlantUML, a MIP problem made on
/// relay A and solved on relay B — and a MIP run whose relay is killed under it, taken over
/// by the other relay once its lease runs out and answered to the caller who asks again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn built_in_session_calls_cross_replicas_and_outlive_a_killed_one() {
    let mut cluster = Cluster::start(2, 2, &[]).await;
    let (code, _) = cluster.create_session(0).await;
    let path = format!("/api/sessions/{code}/call");
    // Takes the cluster, which is borrowed mutably to kill a relay in between.
    let call = |cluster: &Cluster, gateway: usize, id: &str, function: &str, args: Value| {
        cluster.post(
            gateway,
            &path,
            json!({"requestId": id, "functionName": function, "args": args, "timeoutMs": 30_000}),
        )
    };
    let succeeded = |answer: &Answer| {
        assert_eq!(answer.status, StatusCode::OK, "{answer:?}");
        assert_eq!(answer.body["success"], true, "{answer:?}");
        answer.body["result"].clone()
    };

    let encoded = succeeded(
        &call(
            &cluster,
            1,
            "uml",
            "encodePlantUML",
            json!({"plantumlCode": "@startuml\nA -> B\n@enduml"}),
        )
        .await,
    );
    assert!(
        encoded["url"]
            .as_str()
            .is_some_and(|url| url.starts_with("https://www.plantuml.com/plantuml/svg/")),
        "{encoded}"
    );

    let model = "import pulp\nprob = pulp.LpProblem('p', pulp.LpMaximize)\nx = pulp.LpVariable('x', 0, 7, cat='Integer')\nprob += 2 * x + 1";
    let generated = succeeded(
        &call(
            &cluster,
            0,
            "made-on-a",
            "generate_mip_problem",
            json!({"problemDefinitionCode": model}),
        )
        .await,
    );
    let solved = succeeded(
        &call(
            &cluster,
            1,
            "solved-on-b",
            "solve_mip_problem",
            json!({"problemId": generated["problemId"]}),
        )
        .await,
    );
    assert_eq!(solved["status"], "optimal", "{solved}");
    assert_eq!(solved["objectiveValue"], 15.0, "{solved}");

    // A slow generation, run by relay A (in front of gateway 0); relay A dies under it.
    let slow = json!({"problemDefinitionCode": format!("import time\ntime.sleep(3)\n{model}")});
    let waiting = tokio::spawn(call(
        &cluster,
        0,
        "slow",
        "generate_mip_problem",
        slow.clone(),
    ));
    wait_until(PATIENCE, async || {
        let seen = cluster
            .get(1, &format!("/api/sessions/{code}/requests/slow"))
            .await;
        if seen.body["status"] == "delivered" {
            Ok(())
        } else {
            Err(format!("the call never started: {seen:?}"))
        }
    })
    .await;
    cluster.kill_relay(0).await;
    let lost = waiting.await.unwrap();
    assert_ne!(lost.body["success"], true, "relay A answered: {lost:?}");
    // The caller asks again through gateway 1: relay B takes the call over when relay A's
    // lease runs out (at most 10 s), runs it, and answers.
    let taken_over = succeeded(&call(&cluster, 1, "slow", "generate_mip_problem", slow).await);
    let solved = succeeded(
        &call(
            &cluster,
            1,
            "slow-solved",
            "solve_mip_problem",
            json!({"problemId": taken_over["problemId"]}),
        )
        .await,
    );
    assert_eq!(solved["objectiveValue"], 15.0, "{solved}");
    let record = cluster
        .get(1, &format!("/api/sessions/{code}/requests/slow"))
        .await;
    assert_eq!(record.body["status"], "completed", "{record:?}");
    assert_eq!(
        record.body["response"]["result"]["problemId"], taken_over["problemId"],
        "{record:?}"
    );
}

/// One MIP run per caller holds across replicas: while a caller's slow model runs on relay
/// A, the same caller is refused (429, "already have a model running") on relay B, and is
/// served there once the run is over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_mip_run_per_caller_holds_across_replicas() {
    let cluster = Cluster::start(2, 2, &[]).await;
    let slow = "import time, pulp\nprob = pulp.LpProblem('p')\ntime.sleep(3)";
    let quick = "import pulp\nprob = pulp.LpProblem('p', pulp.LpMaximize)\nx = pulp.LpVariable('x', 0, 7, cat='Integer')\nprob += 2 * x + 1";
    let generate = |gateway: usize, model: &str| {
        cluster.post(
            gateway,
            "/api/tools/generate_mip_problem?scope=eager",
            json!({"problemDefinitionCode": model}),
        )
    };
    // Asked again and again on relay B while the slow run goes on: refused as soon as relay A
    // holds the caller's lock (a quick model that got in before it is simply served, and a
    // slow run that found a quick one under way is started again).
    let again_at_once = Deadline::within(PATIENCE).every(Duration::ZERO);
    let (running, refused) = wait_until(again_at_once, async || {
        let running = tokio::spawn(generate(0, slow));
        while !running.is_finished() {
            let answer = generate(1, quick).await;
            if answer.status == StatusCode::TOO_MANY_REQUESTS {
                return Ok((running, answer));
            }
            assert_eq!(answer.status, StatusCode::OK, "{answer:?}");
        }
        let first = running.await.unwrap();
        assert_eq!(
            first.status,
            StatusCode::TOO_MANY_REQUESTS,
            "relay B never saw relay A's run: {first:?}"
        );
        Err("the runs never overlapped")
    })
    .await;
    assert!(refused.header("retry-after").is_some(), "{refused:?}");
    assert!(
        refused.body["error"]["message"]
            .as_str()
            .is_some_and(|message| message.contains("already have a model running")),
        "{refused:?}"
    );
    let first = running.await.unwrap();
    assert_eq!(first.status, StatusCode::OK, "{first:?}");
    // The run is over and its lock released: relay B serves the caller.
    let every = Deadline::within(PATIENCE).every(Duration::from_millis(50));
    wait_until(every, async || {
        let after = generate(1, quick).await;
        if after.status == StatusCode::OK {
            return Ok(());
        }
        assert_eq!(after.status, StatusCode::TOO_MANY_REQUESTS, "{after:?}");
        Err(format!("the lock was never released: {after:?}"))
    })
    .await;
}

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

/// Budgets are kept in Redis: a client alternating gateways (each in front of its own relay)
/// is refused at the configured total, not at twice it — for sessions created, calls to a
/// session, built-in tool calls, and unknown codes (the brute-force guard).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn budgets_hold_across_gateways_and_relays() {
    // Four a minute: a unit comes back every 15 s, far longer than the test's requests take.
    let cluster = Cluster::start(
        2,
        2,
        &[
            (ENV_RATE_LIMIT_SESSION, "4"),
            (ENV_RATE_LIMIT_REQUEST, "4"),
            (ENV_RATE_LIMIT_TOOL, "4"),
            (ENV_RATE_LIMIT_LOOKUP, "4"),
        ],
    )
    .await;
    let four_then_refused = |ok: u16| vec![ok, ok, ok, ok, 429, 429, 429, 429];
    let statuses = |answers: &[Answer]| {
        for answer in answers {
            if answer.status == StatusCode::TOO_MANY_REQUESTS {
                assert!(answer.header("retry-after").is_some(), "{answer:?}");
            }
        }
        answers
            .iter()
            .map(|answer| answer.status.as_u16())
            .collect::<Vec<_>>()
    };

    let mut created = Vec::new();
    for n in 0..8 {
        created.push(cluster.post(n % 2, "/api/sessions", json!({})).await);
    }
    assert_eq!(
        statuses(&created),
        four_then_refused(201),
        "sessions created"
    );
    let code = created[0].body["code"].as_str().unwrap().to_owned();
    let token = created[0].body["providerToken"]
        .as_str()
        .unwrap()
        .to_owned();
    let registered = send(
        reqwest::Client::new()
            .put(format!(
                "{}/api/sessions/{code}/manifest",
                cluster.gateways[1]
            ))
            .bearer_auth(&token)
            .json(&json!({"tools": demo_tools()})),
    )
    .await;
    assert_eq!(registered.status, StatusCode::OK, "{registered:?}");

    let mut calls = Vec::new();
    for n in 0..8 {
        let path = format!("/api/sessions/{code}/request");
        calls.push(
            cluster
                .post(n % 2, &path, echo(&format!("c{n}"), "c"))
                .await,
        );
    }
    assert_eq!(
        statuses(&calls),
        four_then_refused(202),
        "calls to one session"
    );

    let mut tools = Vec::new();
    for n in 0..8 {
        let diagram = json!({"plantumlCode": format!("A -> B: {n}")});
        tools.push(
            cluster
                .post(n % 2, "/api/tools/encodePlantUML", diagram)
                .await,
        );
    }
    assert_eq!(
        statuses(&tools),
        four_then_refused(200),
        "built-in tool calls"
    );

    let mut probes = Vec::new();
    for n in 0..8 {
        probes.push(
            cluster
                .get(n % 2, &format!("/api/sessions/ZZZZ-ZZZ{n}"))
                .await,
        );
    }
    assert_eq!(statuses(&probes), four_then_refused(404), "unknown codes");
    // Blocked now, on both sides: even a live code is refused to this address. (A replica
    // learns of a block made by another on the address's next unknown code; both have seen
    // one here.)
    for gateway in 0..2 {
        let known = cluster.get(gateway, &format!("/api/sessions/{code}")).await;
        assert_eq!(known.status, StatusCode::TOO_MANY_REQUESTS, "{known:?}");
    }
}

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
