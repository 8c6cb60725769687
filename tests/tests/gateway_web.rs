//! The gateway over real sockets as browsers and discovery see it: the discovery documents and
//! health, and CORS (the configured origins for callers; any origin for a page serving tools,
//! unless `CORS_ORIGIN` narrows it).
#![allow(clippy::unwrap_used)] // a test that cannot unwrap should fail loudly

use futures::StreamExt;
use reqwest::{Method, StatusCode};
use serde_json::json;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use toolrelay_relay::RelayConfig;
use toolrelay_tests::demo_tools;
use toolrelay_tests::system::{System, send};

#[tokio::test]
async fn discovery_documents_and_health() {
    let system = System::start().await;
    let discovery = system.get("/.well-known/codap-mcp.json").await;
    assert_eq!(
        discovery.body["callEndpoint"],
        system.url("/api/sessions/{code}/call")
    );
    assert_eq!(
        discovery.body["webSocketEndpoint"],
        system.ws_url("{code}", "").trim_end_matches("?token=")
    );
    assert_eq!(discovery.body["openapi"], system.url("/openapi.json"));
    let spec = system.get("/openapi.json").await;
    assert_eq!(spec.body["openapi"], "3.0.0");
    assert_eq!(spec.body["servers"][0]["url"], system.base);
    let actions = system.get("/openapi/actions.json").await;
    assert!(actions.body["paths"]["/api/sessions/{code}/call"]["post"].is_object());
    assert!(
        actions.body["paths"]
            .get("/api/sessions/{code}/stream")
            .is_none(),
        "tab routes stay out"
    );
    let yaml = system
        .request(Method::GET, "/openapi.yaml")
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        yaml.contains("openapi: 3.0.0"),
        "{}",
        &yaml[..200.min(yaml.len())]
    );
    assert_eq!(
        system
            .request(Method::GET, "/healthz")
            .send()
            .await
            .unwrap()
            .status(),
        StatusCode::OK
    );
    assert_eq!(
        system
            .request(Method::GET, "/readyz")
            .send()
            .await
            .unwrap()
            .status(),
        StatusCode::OK
    );
    system.stop().await;
}

#[tokio::test]
async fn cors_allows_the_configured_origins_only() {
    let system = System::start().await;
    // Calling a tool (the provider routes are open to every origin: see below).
    let preflight = |origin: &str| {
        system
            .request(Method::OPTIONS, "/api/sessions/ABCDEFGH/call")
            .header("origin", origin)
            .header("access-control-request-method", "POST")
            .send()
    };
    let allowed = preflight("https://codap.concord.org").await.unwrap();
    assert_eq!(allowed.status(), StatusCode::OK);
    assert_eq!(
        allowed
            .headers()
            .get("access-control-allow-origin")
            .unwrap(),
        "https://codap.concord.org"
    );
    let refused = preflight("https://evil.example").await.unwrap();
    assert!(
        refused
            .headers()
            .get("access-control-allow-origin")
            .is_none()
    );
    system.stop().await;
}

/// What a browser on `origin` is told about `method path`: the preflight's allowed origin.
async fn preflight_allows(
    system: &System,
    origin: &str,
    method: &str,
    path: &str,
) -> Option<String> {
    let answer = system
        .request(Method::OPTIONS, path)
        .header("origin", origin)
        .header("access-control-request-method", method)
        .header(
            "access-control-request-headers",
            "authorization, content-type",
        )
        .send()
        .await
        .unwrap();
    assert!(
        answer
            .headers()
            .get("access-control-allow-credentials")
            .is_none(),
        "never with credentials: {method} {path}"
    );
    answer
        .headers()
        .get("access-control-allow-origin")
        .map(|value| value.to_str().unwrap().to_owned())
}

#[tokio::test]
async fn a_page_on_any_origin_may_serve_tools_unless_cors_origin_narrows_it() {
    let page = "http://127.0.0.1:1";
    let system = System::start().await;
    // Everything a page serving tools does, from an origin nobody configured.
    let created = send(
        system
            .request(Method::POST, "/api/sessions")
            .header("origin", page),
    )
    .await;
    assert_eq!(created.status, StatusCode::CREATED, "{created:?}");
    assert_eq!(created.header("access-control-allow-origin"), Some("*"));
    let code = created.body["code"].as_str().unwrap().to_owned();
    let token = created.body["providerToken"].as_str().unwrap().to_owned();
    for (method, path) in [
        ("POST", "/api/sessions".to_owned()),
        ("GET", format!("/api/sessions/{code}")),
        ("DELETE", format!("/api/sessions/{code}")),
        ("GET", format!("/api/sessions/{code}/stream")),
        ("GET", format!("/api/sessions/{code}/request")),
        ("PUT", format!("/api/sessions/{code}/manifest")),
        ("POST", format!("/api/sessions/{code}/response")),
    ] {
        assert_eq!(
            preflight_allows(&system, page, method, &path)
                .await
                .as_deref(),
            Some("*"),
            "{method} {path}"
        );
    }
    let registered = send(
        system
            .request(Method::PUT, &format!("/api/sessions/{code}/manifest"))
            .header("origin", page)
            .bearer_auth(&token)
            .json(&json!({"tools": demo_tools()})),
    )
    .await;
    assert_eq!(registered.status, StatusCode::OK, "{registered:?}");
    assert_eq!(registered.header("access-control-allow-origin"), Some("*"));
    // The WebSocket has no CORS, but its upgrade request names the page's origin.
    let mut upgrade = system.ws_url(&code, &token).into_client_request().unwrap();
    upgrade
        .headers_mut()
        .insert("origin", page.parse().unwrap());
    let (mut socket, _) = tokio_tungstenite::connect_async(upgrade).await.unwrap();
    let welcome = socket.next().await.unwrap().unwrap();
    assert!(welcome.to_text().unwrap().contains("welcome"), "{welcome}");
    drop(socket);
    let polled = send(
        system
            .request(Method::GET, &format!("/api/sessions/{code}/request"))
            .header("origin", page)
            .bearer_auth(&token),
    )
    .await;
    assert_eq!(polled.status, StatusCode::OK, "{polled:?}");
    assert_eq!(polled.header("access-control-allow-origin"), Some("*"));
    // The SDK itself is open to every origin: pages import it as a module.
    let sdk = send(
        system
            .request(Method::GET, "/sdk/toolrelay.js")
            .header("origin", page),
    )
    .await;
    assert_eq!(sdk.status, StatusCode::OK);
    assert_eq!(sdk.header("access-control-allow-origin"), Some("*"));
    assert!(
        sdk.header("content-type")
            .unwrap()
            .starts_with("text/javascript")
    );
    // Calling tools is not a provider's business: those routes keep the allow-list.
    for (method, path) in [
        ("POST", format!("/api/sessions/{code}/call")),
        ("POST", format!("/api/sessions/{code}/request")),
        ("GET", format!("/api/sessions/{code}/metadata")),
    ] {
        assert_eq!(
            preflight_allows(&system, page, method, &path).await,
            None,
            "{method} {path}"
        );
    }
    system.stop().await;

    // CORS_ORIGIN narrows the provider routes to the origins it names.
    let narrowed = System::with(RelayConfig::default(), |config| {
        config.cors_origins = vec!["https://lab.example.org".to_owned()];
        config.open_provider_routes = false;
    })
    .await;
    assert_eq!(
        preflight_allows(&narrowed, page, "POST", "/api/sessions").await,
        None
    );
    assert_eq!(
        preflight_allows(
            &narrowed,
            "https://lab.example.org",
            "POST",
            "/api/sessions"
        )
        .await
        .as_deref(),
        Some("https://lab.example.org")
    );
    narrowed.stop().await;
}
