//! The MIP tools' limits on work at once, end to end over HTTP (and gRPC) on the real sandbox:
//! slots and the wait for one, 429 with Retry-After past them, one model at a time per
//! caller, clients taking turns (through a split gateway too), and a slot held until its run
//! ends even when the caller has left.
#![allow(clippy::unwrap_used)] // a test that cannot unwrap should fail loudly

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::json;
use toolrelay::json::to_struct;
use toolrelay::proto::v1 as pb;
use toolrelay_builtin::BuiltinConfig;
use toolrelay_builtin::config::{ENV_MIP_MAX_CONCURRENT, ENV_MIP_QUEUE_WAIT};
use toolrelay_gateway::config::ENV_TRUSTED_PROXIES;
use toolrelay_relay::RelayConfig;
use toolrelay_tests::mip::{MARKET_SPLIT, PLAN, ok, release, start_held_run, tool};
use toolrelay_tests::system::{Answer, System, send};
use toolrelay_tests::{Deadline, relay_client, wait_until};

#[tokio::test]
async fn work_past_the_limits_gets_429_with_retry_after() {
    let system = System::binary(&[(ENV_MIP_MAX_CONCURRENT, "1"), (ENV_MIP_QUEUE_WAIT, "1")]).await;
    let (held, running) = start_held_run(&system, "first").await;
    // Another caller waits its second for the slot, then is told to come back.
    let other = tool(
        &system,
        "second",
        "generate_mip_problem",
        json!({"problemDefinitionCode": PLAN}),
    )
    .await;
    // So is a call through a session (as the call's answer: it was queued).
    let (code, _) = system.create_session().await;
    let in_session = system
        .post(
            &format!("/api/sessions/{code}/call"),
            json!({"functionName": "generate_mip_problem", "args": {"problemDefinitionCode": PLAN}}),
        )
        .await;
    release(held);
    let first = running.await;
    assert_eq!(first.status, StatusCode::OK, "{first:?}");
    assert_eq!(other.status, StatusCode::TOO_MANY_REQUESTS, "{other:?}");
    let wait: u64 = other.header("retry-after").unwrap().parse().unwrap();
    assert!((1..=10).contains(&wait), "Retry-After {wait}");
    assert_eq!(other.body["error"]["code"], "BUSY");
    assert_eq!(in_session.body["success"], false, "{in_session:?}");
    assert_eq!(in_session.body["error"]["code"], "BUSY", "{in_session:?}");

    // Free again once the run is over.
    let after = tool(
        &system,
        "second",
        "generate_mip_problem",
        json!({"problemDefinitionCode": PLAN}),
    )
    .await;
    assert_eq!(after.status, StatusCode::OK, "{after:?}");
}

/// Python that prints when it ran (the Unix time, in seconds), then sleeps `seconds`.
fn timed(seconds: u32) -> String {
    format!(
        "import time, pulp\nprint(time.time())\nprob = pulp.LpProblem('p')\ntime.sleep({seconds})"
    )
}

/// When the run of a generate call answered `answer` began (as it printed).
fn began(answer: &Answer) -> f64 {
    let stdout = answer.body["result"]["stdout"].as_str();
    stdout
        .and_then(|printed| printed.trim().parse().ok())
        .unwrap_or_else(|| panic!("no start time in {answer:?}"))
}

#[tokio::test]
async fn a_client_holding_every_slot_does_not_lock_others_out() {
    // Both slots taken by one client, under two scopes of its choosing, with a third call of
    // its own waiting: another client's call and a call through a session wait for their
    // turns instead of being refused, and are served ahead of the third (which then would
    // be the client's second model at once, while they run none).
    let system = System::binary(&[
        (ENV_MIP_MAX_CONCURRENT, "2"),
        (ENV_MIP_QUEUE_WAIT, "60"),
        (ENV_TRUSTED_PROXIES, "127.0.0.1"),
    ])
    .await;
    let hog = |scope: &'static str, seconds: u32| {
        tool(
            &system,
            scope,
            "generate_mip_problem",
            json!({"problemDefinitionCode": timed(seconds)}),
        )
    };
    let (code, _) = system.create_session().await;
    let hogging = async {
        // The second outlasts the others' runs: each of them has a slot freed by the first.
        tokio::join!(hog("hog-1", 4), hog("hog-2", 12))
    };
    let crowding = async {
        until_mip_slots(&system, (2, 0)).await;
        // The client alone used both slots; its third call waits.
        let third = hog("hog-3", 0);
        let others = async {
            until_mip_slots(&system, (2, 1)).await;
            let elsewhere = send(
                system
                    .request(
                        reqwest::Method::POST,
                        "/api/tools/generate_mip_problem?scope=mine",
                    )
                    .header("x-forwarded-for", "2001:db8::1")
                    .json(&json!({"problemDefinitionCode": timed(0)})),
            );
            let in_session = system.post(
                &format!("/api/sessions/{code}/call"),
                json!({"functionName": "generate_mip_problem", "args": {"problemDefinitionCode": timed(0)}, "timeoutMs": 40000}),
            );
            let waiting = async {
                // Both wait behind the hog's running models (and not refused).
                until_mip_slots(&system, (2, 3)).await;
            };
            let (elsewhere, in_session, ()) = tokio::join!(elsewhere, in_session, waiting);
            (elsewhere, in_session)
        };
        tokio::join!(third, others)
    };
    let ((first, second), (third, (elsewhere, in_session))) = tokio::join!(hogging, crowding);
    for answer in [&first, &second, &third, &elsewhere] {
        assert_eq!(answer.status, StatusCode::OK, "{answer:?}");
    }
    assert_eq!(in_session.status, StatusCode::OK, "{in_session:?}");
    assert_eq!(in_session.body["success"], true, "{in_session:?}");
    let hog_started = began(&third);
    for other in [&elsewhere, &in_session] {
        assert!(
            began(other) < hog_started,
            "another client's call ran before the hog's third: {other:?} {third:?}"
        );
    }
    assert_eq!(mip_slots(&system).await, (0, 0));
    system.stop().await;
}

#[tokio::test]
async fn a_split_gateway_gives_the_relay_the_client_address_to_take_turns_by() {
    // As above, over gRPC: were every call from the gateway keyed by the gateway's address,
    // the hog's waiting call, first in line, would go first.
    let system = System::split_with(
        &[(ENV_MIP_MAX_CONCURRENT, "2"), (ENV_MIP_QUEUE_WAIT, "60")],
        &[(ENV_TRUSTED_PROXIES, "127.0.0.1")],
    )
    .await;
    let hog = |scope: &'static str, seconds: u32| {
        tool(
            &system,
            scope,
            "generate_mip_problem",
            json!({"problemDefinitionCode": timed(seconds)}),
        )
    };
    let hogging = async { tokio::join!(hog("hog-1", 4), hog("hog-2", 8)) };
    let crowding = async {
        until_mip_slots(&system, (2, 0)).await;
        let third = hog("hog-3", 0);
        let elsewhere = async {
            until_mip_slots(&system, (2, 1)).await;
            let elsewhere = send(
                system
                    .request(
                        reqwest::Method::POST,
                        "/api/tools/generate_mip_problem?scope=mine",
                    )
                    .header("x-forwarded-for", "2001:db8::1")
                    .json(&json!({"problemDefinitionCode": timed(0)})),
            );
            let ((), elsewhere) = tokio::join!(until_mip_slots(&system, (2, 2)), elsewhere);
            elsewhere
        };
        tokio::join!(third, elsewhere)
    };
    let ((first, second), (third, elsewhere)) = tokio::join!(hogging, crowding);
    for answer in [&first, &second, &third, &elsewhere] {
        assert_eq!(answer.status, StatusCode::OK, "{answer:?}");
    }
    assert!(
        began(&elsewhere) < began(&third),
        "another client's call ran before the hog's third: {elsewhere:?} {third:?}"
    );
    system.stop().await;
}

#[tokio::test]
async fn one_caller_runs_one_model_at_a_time() {
    let system = System::binary(&[]).await;
    let (held, running) = start_held_run(&system, "eager").await;
    let second = tool(
        &system,
        "eager",
        "generate_mip_problem",
        json!({"problemDefinitionCode": PLAN}),
    )
    .await;
    release(held);
    let first = running.await;
    assert_eq!(first.status, StatusCode::OK, "{first:?}");
    assert_eq!(second.status, StatusCode::TOO_MANY_REQUESTS, "{second:?}");
    assert!(
        second.body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("already have a model running"),
        "{second:?}"
    );
    assert!(second.header("retry-after").is_some());
    system.stop().await;
}

/// The relay's MIP slots in use and the calls waiting for one, as its `/metrics` says (the
/// relay's own port in a split system).
async fn mip_slots(system: &System) -> (u64, u64) {
    let url = match system.relay_ws {
        Some(relay) => format!("http://{relay}/metrics"),
        None => system.url("/metrics"),
    };
    let page = system.http.get(url).send().await.unwrap();
    let text = page.text().await.unwrap();
    let value = |name: &str| {
        text.lines()
            .find_map(|line| line.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or_else(|| panic!("no {name} in /metrics"))
    };
    (
        value("toolrelay_mip_slots_busy"),
        value("toolrelay_mip_waiting"),
    )
}

/// Waits (with a deadline) until the relay's MIP slots and waiting calls are `wanted`.
async fn until_mip_slots(system: &System, wanted: (u64, u64)) {
    let every = Deadline::within(Duration::from_secs(30)).every(Duration::from_millis(50));
    wait_until(every, async || {
        let now = mip_slots(system).await;
        if now == wanted {
            Ok(())
        } else {
            Err(format!(
                "the MIP slots and waiting calls never became {wanted:?} (now {now:?})"
            ))
        }
    })
    .await;
}

#[tokio::test]
async fn a_solve_whose_caller_left_keeps_its_slot_until_it_ends() {
    const LIMIT_SECONDS: f64 = 3.0;
    let mut tools = BuiltinConfig::default();
    tools.mip.max_concurrent = 1;
    // A call that finds the slot taken is refused at once rather than waiting for its turn.
    tools.mip.queue_wait = Duration::ZERO;
    let system = System::with_tools(RelayConfig::default(), tools, |_| {}).await;
    let hard = ok(
        &system,
        "leaver",
        "generate_mip_problem",
        json!({"problemDefinitionCode": MARKET_SPLIT}),
    )
    .await;
    assert_eq!(mip_slots(&system).await, (0, 0));

    // The caller asks for the solve over gRPC and gives up (its stream is reset, and the
    // relay drops its handler) as soon as the relay has started the solve; HiGHS goes on for
    // its 3 s. (Over HTTP/1 the server finishes a handler whose client has gone, so a caller
    // leaving there would show nothing.)
    let sent = tokio::time::Instant::now();
    let mut client = relay_client(system.grpc).await;
    let solve = pb::CallToolRequest {
        name: "solve_mip_problem".into(),
        args: Some(to_struct(
            &json!({"problemId": hard["problemId"], "timeLimitSeconds": LIMIT_SECONDS}),
        )),
        scope: Some(pb::call_tool_request::Scope::CallerScope("leaver".into())),
    };
    let caller = tokio::spawn(async move { client.call_tool(solve).await });
    until_mip_slots(&system, (1, 0)).await;
    caller.abort();
    assert!(caller.await.unwrap_err().is_cancelled());

    // The abandoned solve still holds the only slot, until its time is up: another caller is
    // told to come back (unless this machine was so slow that the 3 s are over already).
    let at_least = LIMIT_SECONDS - 0.5;
    let meanwhile = tool(
        &system,
        "other",
        "generate_mip_problem",
        json!({"problemDefinitionCode": PLAN}),
    )
    .await;
    if sent.elapsed().as_secs_f64() < at_least {
        assert_eq!(
            meanwhile.status,
            StatusCode::TOO_MANY_REQUESTS,
            "the abandoned solve still holds the only slot: {meanwhile:?}"
        );
    }
    until_mip_slots(&system, (0, 0)).await;
    let held = sent.elapsed().as_secs_f64();
    assert!(
        held >= at_least,
        "the slot was freed {held:.2} s after the solve was sent, before its {LIMIT_SECONDS} s were up"
    );
    let after = tool(
        &system,
        "other",
        "generate_mip_problem",
        json!({"problemDefinitionCode": PLAN}),
    )
    .await;
    assert_eq!(after.status, StatusCode::OK, "{after:?}");
    system.stop().await;
}
