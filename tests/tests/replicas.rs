//! Several replicas on one Redis, as real processes: calls cross replicas (the built-in
//! tools' too), budgets hold across them, and a relay or gateway lost mid-call loses no call
//! and runs none twice. Redis lost mid-call: `replicas_redis_outages.rs`; MCP behind a
//! round-robin balancer: `replicas_mcp.rs`.

use std::time::Duration;

use futures::StreamExt;
use reqwest::StatusCode;
use serde_json::{Value, json};
use toolrelay_relay::config::{
    ENV_RATE_LIMIT_LOOKUP, ENV_RATE_LIMIT_REQUEST, ENV_RATE_LIMIT_SESSION, ENV_RATE_LIMIT_TOOL,
};
use toolrelay_tests::cluster::{Cluster, echo};
use toolrelay_tests::recording::RecordingTab;
use toolrelay_tests::system::{Answer, send};
use toolrelay_tests::{Deadline, PATIENCE, demo_tools, wait_until};

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
