//! "CODAP in the conversation" from the relay's side (SPEC §8): `/mcp`'s `open_codap` names
//! its app (`ui://toolrelay/codap`, served by `resources/read` with the CSP hosts build the
//! frame from), creates a session and mints a one-time claim; the tab redeems it
//! (`POST /api/sessions/claim`) for the session, once, before it expires, in one process and
//! through a gateway that reaches the relay over gRPC; an unknown claim counts against the
//! brute-force guard; the MCP client session remembers the session it opened. The app in a
//! browser, framed by a host made from the extension's own library, is in
//! `tests/browser/specs/codap-app.test.mjs`.
#![allow(clippy::unwrap_used)] // a test that cannot unwrap should fail loudly

use std::num::NonZeroU32;
use std::time::Duration;

use reqwest::StatusCode;
use rmcp::model::{ReadResourceRequestParams, ResourceContents};
use serde_json::{Value, json};
use toolrelay_relay::RelayConfig;
use toolrelay_tests::mcp::{Mcp, call, connect};
use toolrelay_tests::system::{Answer, System};
use toolrelay_tests::{WsTab, demo_tools};

/// The CODAP the tests' relays open: nothing listens there, the tests only read the link.
const CODAP: &str = "http://localhost:9/codap/";

fn structured(result: &rmcp::model::CallToolResult) -> Value {
    result.structured_content.clone().unwrap_or(Value::Null)
}

/// `open_codap` through `mcp`: its answer, and the claim inside its link (the plugin's URL,
/// given to CODAP as `?di=`).
async fn open_codap(system: &System, mcp: &Mcp) -> (Value, String) {
    let opened = call(mcp, "open_codap", json!({})).await;
    assert_ne!(opened.is_error, Some(true), "{opened:?}");
    let answer = structured(&opened);
    let link = answer["link"].as_str().unwrap();
    let plugin = link
        .strip_prefix(&format!("{CODAP}?di="))
        .unwrap_or_else(|| panic!("the link opens CODAP with the plugin: {link}"));
    let plugin = percent_decode(plugin);
    let claim = plugin
        .strip_prefix(&system.url("/codap/?claim="))
        .unwrap_or_else(|| panic!("the plugin's URL carries the claim: {plugin}"));
    assert_eq!(claim.len(), 32, "128 bits in hex: {claim}");
    (answer, claim.to_owned())
}

fn percent_decode(encoded: &str) -> String {
    let mut bytes = Vec::new();
    let mut rest = encoded.as_bytes();
    while let Some((&first, tail)) = rest.split_first() {
        if first == b'%' {
            let hex = std::str::from_utf8(&tail[..2]).unwrap();
            bytes.push(u8::from_str_radix(hex, 16).unwrap());
            rest = &tail[2..];
        } else {
            bytes.push(first);
            rest = tail;
        }
    }
    String::from_utf8(bytes).unwrap()
}

/// `call_session_tool` of `echo` with `text`, leaving out `session`: the one the client
/// session opened.
async fn echo_in_opened_session(mcp: &Mcp, text: &str) -> rmcp::model::CallToolResult {
    let arguments = json!({"name": "echo", "arguments": {"text": text}});
    call(mcp, "call_session_tool", arguments).await
}

async fn redeem(system: &System, claim: &str) -> Answer {
    system
        .post("/api/sessions/claim", json!({"claim": claim}))
        .await
}

fn error_name(answer: &Answer) -> &str {
    answer.body["error"].as_str().unwrap_or_default()
}

/// The whole flow on `system`: the tool and its app, the claim redeemed once for the session
/// whose handle `open_codap` returned, and a call without `session` reaching the tab.
async fn claim_pairs_the_tab_once(system: &System) {
    let mcp = connect(&system.url("/mcp")).await;
    let tools = mcp.list_all_tools().await.unwrap();
    let tool = tools.iter().find(|tool| tool.name == "open_codap").unwrap();
    let meta = serde_json::to_value(tool.meta.as_ref().unwrap()).unwrap();
    assert_eq!(meta["ui"]["resourceUri"], "ui://toolrelay/codap", "{meta}");
    let annotations = tool.annotations.as_ref().unwrap();
    assert_eq!(
        annotations.read_only_hint,
        Some(true),
        "opening changes no data"
    );

    let resources = mcp.list_all_resources().await.unwrap();
    assert_eq!(resources.len(), 1, "{resources:?}");
    assert_eq!(resources[0].uri, "ui://toolrelay/codap");
    let read = mcp
        .read_resource(ReadResourceRequestParams::new("ui://toolrelay/codap"))
        .await
        .unwrap();
    let ResourceContents::TextResourceContents {
        mime_type,
        text,
        meta,
        ..
    } = &read.contents[0]
    else {
        panic!("the app is HTML text: {read:?}");
    };
    assert_eq!(mime_type.as_deref(), Some("text/html;profile=mcp-app"));
    assert!(text.contains("<html"), "{text}");
    let csp = serde_json::to_value(meta.as_ref().unwrap()).unwrap()["ui"]["csp"].clone();
    assert_eq!(csp["frameDomains"], json!(["http://localhost:9"]), "{csp}");
    assert_eq!(
        csp["connectDomains"],
        Value::Null,
        "the page reaches nothing itself: {csp}"
    );
    // The list entry carries the same `_meta.ui` (hosts read either).
    let listed = serde_json::to_value(resources[0].meta.as_ref().unwrap()).unwrap();
    assert_eq!(listed["ui"]["csp"], csp, "{listed}");
    let unknown = mcp
        .read_resource(ReadResourceRequestParams::new("ui://toolrelay/other"))
        .await;
    assert!(unknown.is_err(), "{unknown:?}");

    let (answer, claim) = open_codap(system, &mcp).await;
    let handle = answer["handle"].as_str().unwrap();
    assert_eq!(
        answer["connectorUrl"],
        system.url(&format!("/mcp/s/{handle}"))
    );
    assert!(
        answer["note"]
            .as_str()
            .unwrap()
            .contains("cloud assistants"),
        "a loopback relay says who cannot reach it: {answer}"
    );

    // Before the plugin is there, a call waits for a tab like any other (and says so).
    let redeemed = redeem(system, &claim).await;
    assert_eq!(redeemed.status, StatusCode::CREATED, "{redeemed:?}");
    let code = redeemed.body["code"].as_str().unwrap();
    let token = redeemed.body["providerToken"].as_str().unwrap();
    assert_eq!(
        redeemed.body["connectorUrl"], answer["connectorUrl"],
        "the claim opened the session open_codap named"
    );
    let mut tab = WsTab::attach_url(&system.ws_url(code, token)).await;
    tab.register(demo_tools()).await;

    let again = redeem(system, &claim).await;
    assert_eq!(again.status, StatusCode::GONE, "{again:?}");
    assert_eq!(error_name(&again), "claim_used");
    assert!(
        again.body["message"].as_str().unwrap().contains("once"),
        "{again:?}"
    );

    // The client session remembers the session it opened: `session` may be left out.
    let serving = tokio::spawn(async move {
        let request = tab.next_request().await;
        let id = request["requestId"].as_str().unwrap().to_owned();
        let text = request["args"]["text"].clone();
        tab.answer(&id, json!({"echoed": text})).await;
        tab
    });
    let called = echo_in_opened_session(&mcp, "height against age").await;
    assert_ne!(called.is_error, Some(true), "{called:?}");
    assert_eq!(
        structured(&called)["echoed"],
        "height against age",
        "{called:?}"
    );
    serving.await.unwrap().close().await;
    mcp.cancel().await.unwrap();
}

#[tokio::test]
async fn open_codap_opens_a_session_its_claim_pairs_once() {
    let system = System::with(RelayConfig::default(), |config| {
        config.codap_url = CODAP.to_owned();
    })
    .await;
    claim_pairs_the_tab_once(&system).await;
    system.stop().await;
}

#[tokio::test]
async fn a_claim_works_through_a_gateway_in_front_of_a_relay_over_grpc() {
    let system = System::split_with(&[], &[("CODAP_URL", CODAP)]).await;
    claim_pairs_the_tab_once(&system).await;
    system.stop().await;
}

#[tokio::test]
async fn a_claim_not_redeemed_in_time_is_refused_and_says_so() {
    let relay = RelayConfig {
        claim_ttl: Duration::from_secs(1),
        ..RelayConfig::default()
    };
    let system = System::with(relay, |config| config.codap_url = CODAP.to_owned()).await;
    let mcp = connect(&system.url("/mcp")).await;
    let (_, claim) = open_codap(&system, &mcp).await;
    // Before the plugin is there, a call gets the usual answer: no tab has registered tools.
    let early = echo_in_opened_session(&mcp, "too soon").await;
    assert_eq!(early.is_error, Some(true), "{early:?}");
    let error = &structured(&early)["error"];
    assert_eq!(error["code"], "unknown_function", "{early:?}");
    assert!(
        error["message"].as_str().unwrap().contains("is it open?"),
        "{early:?}"
    );
    // The relay minted the claim before open_codap answered: a second after the answer, the
    // claim has expired by the relay's clock (this machine's).
    let answered = tokio::time::Instant::now();
    tokio::time::sleep_until(answered + Duration::from_millis(1100)).await;
    let late = redeem(&system, &claim).await;
    assert_eq!(late.status, StatusCode::GONE, "{late:?}");
    assert_eq!(error_name(&late), "claim_expired");
    assert!(
        late.body["message"]
            .as_str()
            .unwrap()
            .contains("open_codap"),
        "says what to do: {late:?}"
    );
    mcp.cancel().await.unwrap();
    system.stop().await;
}

#[tokio::test]
async fn unknown_claims_count_against_the_guard_yet_a_real_claim_pairs_and_opening_spends_the_session_budget()
 {
    let relay = RelayConfig {
        limits: toolrelay_relay::limits::RateLimits {
            lookups_per_ip: NonZeroU32::new(3).unwrap(),
            ..toolrelay_relay::limits::RateLimits::default()
        },
        ..RelayConfig::default()
    };
    let system = System::with(relay, |config| {
        config.codap_url = CODAP.to_owned();
        config.limits.sessions_per_ip = NonZeroU32::new(2).unwrap();
    })
    .await;
    let mcp = connect(&system.url("/mcp")).await;
    let (_, claim) = open_codap(&system, &mcp).await;

    for guess in 0..3 {
        let refused = redeem(&system, &format!("{guess:032x}")).await;
        assert_eq!(refused.status, StatusCode::NOT_FOUND, "{refused:?}");
        assert_eq!(error_name(&refused), "unknown_claim");
    }
    let blocked = redeem(&system, &format!("{:032x}", 4)).await;
    assert_eq!(
        blocked.status,
        StatusCode::TOO_MANY_REQUESTS,
        "the 4th unknown claim: {blocked:?}"
    );
    let code_lookup = system.get("/api/sessions/ABCD2345").await;
    assert_eq!(
        code_lookup.status,
        StatusCode::TOO_MANY_REQUESTS,
        "one guard for codes, handles and claims: {code_lookup:?}"
    );
    // A real claim still pairs from the blocked address: a 128-bit claim is not guessed, and
    // the plugin of a school (one address) must not be locked out by another pupil's guesses.
    let real = redeem(&system, &claim).await;
    assert_eq!(real.status, StatusCode::CREATED, "{real:?}");
    // An unknown one is still refused, and still learns nothing.
    let again = redeem(&system, &format!("{:032x}", 5)).await;
    assert_eq!(again.status, StatusCode::TOO_MANY_REQUESTS, "{again:?}");

    // One session was created by the first open_codap; the budget allows two a minute.
    let second = call(&mcp, "open_codap", json!({})).await;
    assert_ne!(second.is_error, Some(true), "{second:?}");
    let third = call(&mcp, "open_codap", json!({})).await;
    assert_eq!(third.is_error, Some(true), "{third:?}");
    assert_eq!(structured(&third)["error"]["code"], "rate_limited");
    mcp.cancel().await.unwrap();
    system.stop().await;
}

#[tokio::test]
async fn only_the_plugin_loaded_for_a_claim_may_be_framed_by_any_page() {
    let system = System::start().await;
    // The plugin page's `frame-ancestors`, as served at `path`.
    let ancestors = |path: &'static str| {
        let request = system.request(reqwest::Method::GET, path).send();
        async move {
            let page = request.await.unwrap();
            assert_eq!(page.status(), StatusCode::OK);
            let policy = page.headers()["content-security-policy"].to_str().unwrap();
            let (_, ancestors) = policy.split_once("frame-ancestors ").unwrap();
            ancestors.split(';').next().unwrap().to_owned()
        }
    };
    let plain = ancestors("/codap/").await;
    assert!(plain.contains("https://codap3.concord.org"), "{plain}");
    assert!(!plain.contains('*'), "CODAP and the relay only: {plain}");
    assert_eq!(
        ancestors("/codap/?claim=0123456789abcdef0123456789abcdef").await,
        "*",
        "inside an app, the ancestors are the host's and its sandbox's"
    );
    // A claim that is not one (empty, malformed) gets the normal page's policy: the plugin
    // takes it for no claim, and shows its buttons.
    for path in [
        "/codap/?claim=",
        "/codap/?claim=nope",
        "/codap/?claim=0123456789abcdef0123456789abcdeg",
        "/codap/?claim=0123456789abcdef0123456789abcdef00",
        "/codap/?x=1&claim=",
    ] {
        assert_eq!(ancestors(path).await, plain, "{path}");
    }
    assert!(plain.contains("'self'"), "{plain}");
    system.stop().await;
}

/// The provider token relays before issue 40 derived from a claim (SHA-256 of a label and the
/// claim): anyone who read the claim could compute it.
fn token_derived_from(claim: &str) -> String {
    let digest = toolrelay_relay::code::hash_token(&format!("toolrelay provider token\n{claim}"));
    let bytes = data_encoding::HEXLOWER.decode(digest.as_bytes()).unwrap();
    data_encoding::BASE64URL_NOPAD.encode(&bytes)
}

/// Asserts that every provider route of session `code` refuses `token`: the WebSocket, SSE,
/// polling, registering tools, answering and the gRPC provider stream.
async fn refused_everywhere(system: &System, code: &str, token: &str) {
    use reqwest::Method;
    let mut socket = WsTab::connect(&system.ws_url(code, token)).await;
    let frame = socket.recv().await;
    assert_eq!(frame["error"], "invalid_token", "WebSocket: {frame}");
    let routes = [
        (
            Method::GET,
            format!("/api/sessions/{code}/stream?token={token}"),
        ),
        (Method::GET, format!("/api/sessions/{code}/request")),
        (Method::PUT, format!("/api/sessions/{code}/manifest")),
        (Method::POST, format!("/api/sessions/{code}/response")),
    ];
    for (method, path) in routes {
        let body = if method == Method::PUT {
            json!({"tools": demo_tools()})
        } else {
            json!({"requestId": "x", "result": 1})
        };
        let request = system.request(method.clone(), &path).bearer_auth(token);
        let request = if method == Method::GET {
            request
        } else {
            request.json(&body)
        };
        let answer = toolrelay_tests::system::send(request).await;
        assert_eq!(
            answer.status,
            StatusCode::FORBIDDEN,
            "{method} {path}: {answer:?}"
        );
        assert_eq!(
            error_name(&answer),
            "invalid_token",
            "{method} {path}: {answer:?}"
        );
    }
    let mut grpc = toolrelay_tests::relay_client(system.grpc).await;
    let (_keep, messages) = tokio::sync::mpsc::channel(1);
    let mut request = tonic::Request::new(tokio_stream::wrappers::ReceiverStream::new(messages));
    request
        .metadata_mut()
        .insert("x-session-code", code.parse().unwrap());
    request
        .metadata_mut()
        .insert("authorization", format!("Bearer {token}").parse().unwrap());
    let refused = grpc.connect(request).await.unwrap_err();
    assert_eq!(
        refused.code(),
        tonic::Code::PermissionDenied,
        "gRPC: {refused:?}"
    );
}

#[tokio::test]
async fn a_spent_claim_opens_nothing_and_twenty_redemptions_pair_one_tab() {
    let system = System::with(RelayConfig::default(), |config| {
        config.codap_url = CODAP.to_owned();
    })
    .await;
    let mcp = connect(&system.url("/mcp")).await;
    let (_, claim) = open_codap(&system, &mcp).await;

    // Twenty tabs redeem the claim at once: one is paired, the others are told it was used.
    let redemptions: Vec<_> = (0..20)
        .map(|_| {
            let request = system
                .request(reqwest::Method::POST, "/api/sessions/claim")
                .json(&json!({"claim": claim}));
            tokio::spawn(toolrelay_tests::system::send(request))
        })
        .collect();
    let mut winners = Vec::new();
    let mut used = 0;
    for redemption in redemptions {
        let answer = redemption.await.unwrap();
        match answer.status {
            StatusCode::CREATED => winners.push(answer),
            StatusCode::GONE if error_name(&answer) == "claim_used" => used += 1,
            _ => panic!("{answer:?}"),
        }
    }
    assert_eq!((winners.len(), used), (1, 19));
    let winner = &winners[0].body;
    let code = winner["code"].as_str().unwrap();
    let token = winner["providerToken"].as_str().unwrap();
    assert_ne!(token, token_derived_from(&claim), "a token of its own");

    // Neither the claim nor anything derived from it is a credential; the winner's token is.
    refused_everywhere(&system, code, &claim).await;
    refused_everywhere(&system, code, &token_derived_from(&claim)).await;
    let mut tab = WsTab::attach_url(&system.ws_url(code, token)).await;
    tab.register(demo_tools()).await;
    tab.close().await;
    mcp.cancel().await.unwrap();
    system.stop().await;
}

#[tokio::test]
async fn a_caller_that_names_the_session_by_its_handle_is_never_told_its_code() {
    let system = System::with(RelayConfig::default(), |config| {
        config.codap_url = CODAP.to_owned();
    })
    .await;
    let mcp = connect(&system.url("/mcp")).await;
    let (answer, claim) = open_codap(&system, &mcp).await;
    let handle = answer["handle"].as_str().unwrap().to_owned();
    let redeemed = redeem(&system, &claim).await;
    let code = redeemed.body["code"].as_str().unwrap().to_owned();
    let token = redeemed.body["providerToken"].as_str().unwrap();
    let mut tab = WsTab::attach_url(&system.ws_url(&code, token)).await;
    tab.register(demo_tools()).await;
    let bare = code.replace('-', "");
    let tells_nothing = |text: String| {
        assert!(
            !text.contains(&code) && !text.contains(&bare),
            "names the code {code}: {text}"
        );
    };

    // MCP, in the session open_codap opened (by its handle).
    let unknown = call(
        &mcp,
        "call_session_tool",
        json!({"name": "nothing", "arguments": {}}),
    )
    .await;
    assert_eq!(unknown.is_error, Some(true), "{unknown:?}");
    assert_eq!(structured(&unknown)["error"]["code"], "unknown_function");
    tells_nothing(serde_json::to_string(&unknown).unwrap());
    // REST by the handle.
    let called = system
        .post(
            &format!("/api/sessions/{handle}/call"),
            json!({"functionName": "nothing", "args": {}}),
        )
        .await;
    assert_eq!(error_name(&called), "unknown_function", "{called:?}");
    tells_nothing(called.body.to_string());
    let missing = system
        .get(&format!("/api/sessions/{handle}/requests/no-such-call"))
        .await;
    assert_eq!(error_name(&missing), "request_not_found", "{missing:?}");
    tells_nothing(missing.body.to_string());
    tab.close().await;
    mcp.cancel().await.unwrap();
    system.stop().await;
}

#[tokio::test]
async fn a_claim_is_described_without_spending_it_and_the_app_learns_when_codap_pairs() {
    let system = System::with(RelayConfig::default(), |config| {
        config.codap_url = CODAP.to_owned();
    })
    .await;
    let mcp = connect(&system.url("/mcp")).await;
    let tools = mcp.list_all_tools().await.unwrap();
    let status_tool = tools
        .iter()
        .find(|tool| tool.name == "codap_status")
        .unwrap();
    let meta = serde_json::to_value(status_tool.meta.as_ref().unwrap()).unwrap();
    assert_eq!(
        meta["ui"]["visibility"],
        json!(["app"]),
        "only the app calls it: {meta}"
    );
    let (answer, claim) = open_codap(&system, &mcp).await;
    let handle = answer["handle"].as_str().unwrap().to_owned();
    let status = async |mcp: &Mcp| {
        let result = call(
            mcp,
            "codap_status",
            json!({"session": handle, "claim": claim}),
        )
        .await;
        assert_ne!(result.is_error, Some(true), "{result:?}");
        structured(&result)
    };
    let before = status(&mcp).await;
    assert_eq!(before["claim"], "open", "{before}");
    assert_eq!(before["paired"], false, "{before}");

    // Described: who opened it (what its MCP client says it is), and the claim still works.
    let about = system
        .post("/api/sessions/claim/about", json!({"claim": claim}))
        .await;
    assert_eq!(about.status, StatusCode::OK, "{about:?}");
    assert!(
        about.body["label"].as_str().unwrap().starts_with("rmcp"),
        "{about:?}"
    );
    assert!(about.body["expiresAt"].as_str().is_some(), "{about:?}");
    let redeemed = redeem(&system, &claim).await;
    assert_eq!(redeemed.status, StatusCode::CREATED, "{redeemed:?}");
    let spent = system
        .post("/api/sessions/claim/about", json!({"claim": claim}))
        .await;
    assert_eq!(spent.status, StatusCode::GONE, "{spent:?}");
    assert_eq!(error_name(&spent), "claim_used");
    let unknown = system
        .post(
            "/api/sessions/claim/about",
            json!({"claim": format!("{:032x}", 7)}),
        )
        .await;
    assert_eq!(error_name(&unknown), "unknown_claim", "{unknown:?}");

    // The tab comes, approving callers: the conversation that opened it is among the callers
    // it allowed, named as it came; the app hears that CODAP is paired.
    let code = redeemed.body["code"].as_str().unwrap();
    let token = redeemed.body["providerToken"].as_str().unwrap();
    let mut tab = WsTab::attach_url(&system.ws_url(code, token)).await;
    tab.send(json!({"type": "register", "tools": demo_tools(), "approves": true}))
        .await;
    let callers = loop {
        let frame = tab.recv().await;
        if frame["type"] == "callers" {
            break frame;
        }
    };
    let opened_by = &callers["allowed"][0];
    assert!(
        opened_by["label"]
            .as_str()
            .unwrap()
            .starts_with("Opened from your conversation in rmcp"),
        "{callers}"
    );
    let after = status(&mcp).await;
    assert_eq!(after["claim"], "used", "{after}");
    assert_eq!(after["paired"], true, "{after}");
    let functions = toolrelay_tests::tab_and_builtin_names().len();
    assert_eq!(
        after["toolCount"], functions,
        "the tab's and the built-in ones: {after}"
    );
    tab.close().await;
    mcp.cancel().await.unwrap();
    system.stop().await;
}
