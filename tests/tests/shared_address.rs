//! Many people behind one address (SPEC §10): every user of a hosted assistant calls from its
//! vendor's few addresses, and a school sits behind one NAT. With the default settings, one
//! caller guessing codes must not refuse anyone else at its address, and a class must be able
//! to open its tabs at once. Everything here comes from 127.0.0.1, as from one NAT.
//!
//! On the in-memory store, and on Redis with `TOOLRELAY_TEST_STORE=redis` (`scripts/test.sh`).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures::StreamExt;
use serde_json::{Value, json};
use toolrelay_relay::RelayConfig;
use toolrelay_tests::mcp::{Mcp, call, connect};
use toolrelay_tests::system::System;
use toolrelay_tests::{WsTab, demo_tools};

/// Honest users, each with a tab of its own and an MCP conversation of its own.
const HONEST: usize = 150;
/// How many of them mistype a code now and then.
const MISTYPERS: usize = 10;
/// How long the attacker guesses at full speed.
const ATTACK: Duration = Duration::from_secs(20);
/// How often an honest user calls its tab: people, not a loop (well within the 60 calls a
/// minute one caller may make to one session).
const PACE: Duration = Duration::from_millis(1_500);

/// A tab answering every call it gets, until the socket closes or the task is aborted.
fn serve(mut tab: WsTab) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        while let Some(frame) = tab.next_frame().await {
            if frame["type"] == "tool-request" {
                let id = frame["requestId"].as_str().unwrap_or_default().to_owned();
                tab.send(json!({"type": "response", "requestId": id, "success": true,
                    "result": {"echoed": frame["args"]["text"]}}))
                    .await;
            }
        }
    })
}

/// A code nobody was given (`Z` and `2`–`7` only: a created code is random over all of
/// Base32, so a clash is a 1-in-2^40 chance per guess).
fn unknown_code(n: usize) -> String {
    let digits = b"Z234567";
    (0..8)
        .map(|i| char::from(digits[(n / 7usize.pow(i)) % 7]))
        .collect()
}

/// The error name of a failed tool call, if it failed.
fn refusal(result: &rmcp::model::CallToolResult) -> Option<String> {
    (result.is_error == Some(true)).then(|| {
        result
            .structured_content
            .as_ref()
            .and_then(|content| content["error"]["code"].as_str())
            .unwrap_or("unknown")
            .to_owned()
    })
}

/// Who guesses codes among the users of the address.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Attacker {
    /// One MCP conversation trying codes as fast as the relay answers.
    OneIdentity,
    /// A GPT Action user whose per-user header (from a shared egress range) is new for each
    /// guess, as fast as the relay answers: it spends the address's ceiling.
    NewIdentityPerGuess,
}

/// What came of [`honest_users_under`]'s 20 s.
#[derive(Debug)]
struct Outcome {
    answered: usize,
    refused_calls: usize,
    refused_typos: usize,
    guesses: usize,
    guesses_refused: usize,
}

/// 150 people on 127.0.0.1 open their plugin (a tab each) and connect their own MCP
/// conversation to it; for 20 s each calls its tab every 1.5 s (by its code, or by the handle
/// `connect_session` returned when `by_handle`), ten of them also mistyping a code now and
/// then, while `attacker` guesses codes. Everything at its default but `SHARED_EGRESS_RANGES`
/// (127.0.0.0/8, for the GPT Action attacker's header).
async fn honest_users_under(attacker: Attacker, by_handle: bool) -> Outcome {
    toolrelay_relay::listen::raise_open_files_limit();
    let system = System::with(RelayConfig::default(), |config| {
        config.shared_egress = vec!["127.0.0.0/8".parse().unwrap()];
    })
    .await;

    let mut tabs = Vec::new();
    let mut codes = Vec::new();
    for _ in 0..HONEST {
        let (code, token) = system.create_session().await;
        let mut tab = WsTab::attach_url(&system.ws_url(&code, &token)).await;
        tab.register(demo_tools()).await;
        tabs.push(serve(tab));
        codes.push(code);
    }
    let mcp_url = system.url("/mcp");
    let users: Vec<(Mcp, String)> = futures::stream::iter(codes)
        .map(|code| {
            let url = mcp_url.clone();
            async move {
                let mcp = connect(&url).await;
                let connected = call(&mcp, "connect_session", json!({"code": code})).await;
                assert_eq!(refusal(&connected), None, "{connected:?}");
                let handle = connected.structured_content.as_ref().unwrap()["handle"]
                    .as_str()
                    .unwrap()
                    .to_owned();
                (mcp, if by_handle { handle } else { code })
            }
        })
        .buffer_unordered(16)
        .collect()
        .await;

    let stop = tokio::time::Instant::now() + ATTACK;
    let guessing = match attacker {
        Attacker::OneIdentity => {
            let attacker = connect(&mcp_url).await;
            tokio::spawn(async move {
                let (mut guesses, mut refused) = (0, 0);
                while tokio::time::Instant::now() < stop {
                    let code = unknown_code(guesses);
                    let answer = call(&attacker, "connect_session", json!({"code": code})).await;
                    guesses += 1;
                    match refusal(&answer).as_deref() {
                        Some("rate_limited") => refused += 1,
                        Some("session_not_found") => {}
                        other => panic!("a guess got {other:?}: {answer:?}"),
                    }
                }
                let _ = attacker.cancel().await;
                (guesses, refused)
            })
        }
        Attacker::NewIdentityPerGuess => {
            let http = system.http.clone();
            let base = system.base.clone();
            tokio::spawn(async move {
                let (mut guesses, mut refused) = (0, 0);
                while tokio::time::Instant::now() < stop {
                    let code = unknown_code(guesses);
                    let answer = http
                        .get(format!("{base}/api/sessions/{code}/metadata"))
                        .header("openai-ephemeral-user-id", format!("guesser-{guesses}"))
                        .send()
                        .await
                        .unwrap();
                    guesses += 1;
                    match answer.status().as_u16() {
                        429 => refused += 1,
                        404 => {}
                        other => panic!("a guess got {other}"),
                    }
                }
                (guesses, refused)
            })
        }
    };

    let (answered, refused_calls, refused_typos) = (
        Arc::new(AtomicUsize::new(0)),
        Arc::new(AtomicUsize::new(0)),
        Arc::new(AtomicUsize::new(0)),
    );
    let working = users.into_iter().enumerate().map(|(n, (mcp, session))| {
        let (answered, refused_calls, refused_typos) = (
            Arc::clone(&answered),
            Arc::clone(&refused_calls),
            Arc::clone(&refused_typos),
        );
        tokio::spawn(async move {
            let mut round = 0;
            while tokio::time::Instant::now() < stop {
                let text = format!("{n}-{round}");
                let arguments =
                    json!({"session": session, "name": "echo", "arguments": {"text": text}});
                let answer = call(&mcp, "call_session_tool", arguments).await;
                match refusal(&answer) {
                    None => {
                        let echoed = answer
                            .structured_content
                            .as_ref()
                            .map(|c| c["echoed"].clone());
                        assert_eq!(echoed, Some(Value::from(text)), "{answer:?}");
                        answered.fetch_add(1, Ordering::Relaxed);
                    }
                    Some(name) => {
                        assert_eq!(name, "rate_limited", "an honest call failed: {answer:?}");
                        refused_calls.fetch_add(1, Ordering::Relaxed);
                    }
                }
                if n < MISTYPERS && round % 3 == 1 {
                    let typo = json!({"code": unknown_code(1_000_000 + n * 100 + round)});
                    let typo = call(&mcp, "connect_session", typo).await;
                    match refusal(&typo).as_deref() {
                        Some("session_not_found") => {}
                        Some("rate_limited") => {
                            refused_typos.fetch_add(1, Ordering::Relaxed);
                        }
                        other => panic!("a mistyped code got {other:?}"),
                    }
                }
                round += 1;
                tokio::time::sleep(PACE).await;
            }
            let _ = mcp.cancel().await;
        })
    });
    for worker in futures::future::join_all(working).await {
        worker.unwrap();
    }
    let (guesses, guesses_refused) = guessing.await.unwrap();
    for tab in tabs {
        tab.abort();
    }
    system.stop().await;
    let outcome = Outcome {
        answered: answered.load(Ordering::Relaxed),
        refused_calls: refused_calls.load(Ordering::Relaxed),
        refused_typos: refused_typos.load(Ordering::Relaxed),
        guesses,
        guesses_refused,
    };
    println!(
        "{HONEST} users on one address, {attacker:?}, calls by {}: {outcome:?}",
        if by_handle { "handle" } else { "code" }
    );
    outcome
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn honest_users_behind_one_address_are_never_refused_while_one_of_them_guesses() {
    let outcome = honest_users_under(Attacker::OneIdentity, false).await;
    // No honest call, and no honest typo, is refused; every user got through again and again
    // (slow is allowed; refused is not).
    assert_eq!(
        outcome.refused_calls + outcome.refused_typos,
        0,
        "{outcome:?}"
    );
    assert!(outcome.answered >= HONEST * 2, "{outcome:?}");
    // The guesser itself was stopped: 30 unknown codes, then one more every 2 s as its budget
    // (30 a minute) refills, and refusals for the rest.
    assert!(outcome.guesses > 100, "{outcome:?}");
    let allowed = 30 + usize::try_from(ATTACK.as_secs() / 2).unwrap() + 2;
    assert!(
        outcome.guesses - outcome.guesses_refused <= allowed,
        "{outcome:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guesser_with_a_new_identity_per_guess_spends_the_ceiling_but_refuses_no_handle() {
    let outcome = honest_users_under(Attacker::NewIdentityPerGuess, true).await;
    // The attacker spends the address's ceiling (600 unknown codes a minute) and is refused
    // from then on; the honest users' calls, made with their handles, are never refused (their
    // typos may be, once the ceiling is reached).
    assert!(
        outcome.guesses > 600,
        "the attacker reached the ceiling: {outcome:?}"
    );
    assert!(outcome.guesses_refused > 0, "{outcome:?}");
    assert!(
        outcome.guesses - outcome.guesses_refused <= 600 + 200 + 2,
        "the ceiling held: {outcome:?}"
    );
    assert_eq!(outcome.refused_calls, 0, "{outcome:?}");
    assert!(outcome.answered >= HONEST * 2, "{outcome:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_school_of_a_thousand_tabs_behind_one_address_opens_within_a_minute() {
    const TABS: usize = 1_000;
    toolrelay_relay::listen::raise_open_files_limit();
    let system = System::with(RelayConfig::default(), |_| {}).await;
    let started = tokio::time::Instant::now();
    let deadline = started + Duration::from_secs(60);
    let base = system.url("");
    let ws = base.replacen("http", "ws", 1);
    let http = reqwest::Client::new();
    // Each pupil's plugin creates a session and attaches its WebSocket, 50 at a time.
    let tabs: Vec<(String, WsTab)> = futures::stream::iter(0..TABS)
        .map(|_| {
            let (http, base, ws) = (http.clone(), base.clone(), ws.clone());
            async move {
                let created = http
                    .post(format!("{base}/api/sessions"))
                    .json(&json!({}))
                    .send()
                    .await
                    .unwrap();
                assert_eq!(created.status(), 201, "a session refused to a pupil");
                let body: Value = created.json().await.unwrap();
                let code = body["code"].as_str().unwrap().to_owned();
                let token = body["providerToken"].as_str().unwrap();
                let url = format!("{ws}/api/sessions/{code}/ws?token={token}");
                (code, WsTab::attach_url(&url).await)
            }
        })
        .buffer_unordered(50)
        .collect()
        .await;
    let took = started.elapsed();
    println!("{TABS} tabs from one address created and connected in {took:?}");
    assert_eq!(tabs.len(), TABS);
    assert!(
        tokio::time::Instant::now() < deadline,
        "{TABS} tabs took {took:?}"
    );
    // Each session says its tab is there, over the WebSocket.
    let connected = futures::stream::iter(&tabs)
        .map(|(code, _)| {
            let (http, base) = (http.clone(), base.clone());
            async move {
                let status: Value = http
                    .get(format!("{base}/api/sessions/{code}"))
                    .send()
                    .await
                    .unwrap()
                    .json()
                    .await
                    .unwrap();
                status["providerConnected"] == true && status["transport"] == "websocket"
            }
        })
        .buffer_unordered(50)
        .filter(|connected| std::future::ready(*connected))
        .count()
        .await;
    assert_eq!(connected, TABS);
    drop(tabs);
    system.stop().await;
}

#[tokio::test]
async fn a_valid_handle_is_never_refused_when_other_callers_spent_the_address_ceiling() {
    let relay = RelayConfig {
        limits: toolrelay_relay::limits::RateLimits {
            lookups_per_ip: std::num::NonZeroU32::new(5).unwrap(),
            ..toolrelay_relay::limits::RateLimits::default()
        },
        ..RelayConfig::default()
    };
    let system = System::with(relay, |_| {}).await;
    let (code, token) = system.create_session().await;
    let mut tab = WsTab::attach_url(&system.ws_url(&code, &token)).await;
    tab.register(demo_tools()).await;
    let tab = serve(tab);
    let mcp_url = system.url("/mcp");
    let honest = connect(&mcp_url).await;
    let connected = call(&honest, "connect_session", json!({"code": code})).await;
    let handle = connected.structured_content.as_ref().unwrap()["handle"]
        .as_str()
        .unwrap()
        .to_owned();

    // Six callers at the address, one unknown code each: past its ceiling of five.
    for n in 0..6 {
        let guesser = connect(&mcp_url).await;
        let answer = call(
            &guesser,
            "connect_session",
            json!({"code": unknown_code(n)}),
        )
        .await;
        let expected = if n < 5 {
            "session_not_found"
        } else {
            "rate_limited"
        };
        assert_eq!(refusal(&answer).as_deref(), Some(expected), "guess {n}");
        guesser.cancel().await.unwrap();
    }

    // Now a code is refused to anyone at the address, the honest caller's valid one too …
    let by_code = json!({"session": code, "name": "echo", "arguments": {"text": "c"}});
    let refused = call(&honest, "call_session_tool", by_code).await;
    assert_eq!(refusal(&refused).as_deref(), Some("rate_limited"));
    // … but its handle works: over MCP, on the connector URL, and over REST in a code's place.
    let by_handle = json!({"session": handle, "name": "echo", "arguments": {"text": "h"}});
    let answered = call(&honest, "call_session_tool", by_handle).await;
    assert_eq!(refusal(&answered), None, "{answered:?}");
    assert_eq!(answered.structured_content.unwrap()["echoed"], "h");
    let scoped = connect(&system.url(&format!("/mcp/s/{handle}"))).await;
    let answered = call(&scoped, "echo", json!({"text": "s"})).await;
    assert_eq!(refusal(&answered), None, "{answered:?}");
    let rest = system
        .post(
            &format!("/api/sessions/{handle}/call"),
            json!({"functionName": "echo", "args": {"text": "r"}}),
        )
        .await;
    assert_eq!(rest.status, reqwest::StatusCode::OK, "{rest:?}");
    assert_eq!(rest.body["result"]["echoed"], "r");
    // An unknown handle still counts as a guess: at this address, past the ceiling, it is
    // refused like one.
    let unknown = system
        .get(&format!("/api/sessions/{}/metadata", "0".repeat(32)))
        .await;
    assert_eq!(unknown.body["error"], "rate_limited", "{unknown:?}");

    scoped.cancel().await.unwrap();
    honest.cancel().await.unwrap();
    tab.abort();
    system.stop().await;
}
