//! What a probe and a caller see while Redis is away at start or full (issue 27): every
//! binary answers `/healthz` at once whatever its store does, `/readyz` is red and requests
//! get 503 with `Retry-After` meanwhile (`store_unavailable`, or `store_full` at Redis's
//! `maxmemory`), and all goes green again once Redis is back or has room. A `REDIS_URL` that
//! cannot work still ends the process at start.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::json;
use toolrelay_gateway::config::{ENV_LISTEN, ENV_RELAY_URL};
use toolrelay_relay::config::{ENV_GRPC_LISTEN, ENV_REDIS_URL, ENV_WS_LISTEN};
use toolrelay_tests::metrics::Scrape;
use toolrelay_tests::redis::RedisServer;
use toolrelay_tests::system::{Answer, System, send};
use toolrelay_tests::{PATIENCE, demo_tools, wait_until};

/// How soon `/healthz` must answer: well inside a liveness probe's timeout.
const AT_ONCE: Duration = Duration::from_secs(2);

/// The two ways the binaries are deployed, against the Redis at `url`.
async fn systems(url: &str) -> [(&'static str, System); 2] {
    let env = [(ENV_REDIS_URL, url)];
    [
        ("toolrelay", System::binary(&env).await),
        (
            "toolrelay-relay + toolrelay-gateway",
            System::split_with(&env, &[]).await,
        ),
    ]
}

/// `GET url` within [`AT_ONCE`].
async fn at_once(system: &System, url: String) -> Answer {
    tokio::time::timeout(AT_ONCE, send(system.http.get(url)))
        .await
        .unwrap_or_else(|_| panic!("no answer within {AT_ONCE:?}"))
}

/// Every `/healthz` a system serves (the gateway's, and a split relay's own port) answers
/// 200 within [`AT_ONCE`].
async fn healthy_at_once(name: &str, system: &System) {
    let mut urls = vec![system.url("/healthz")];
    if let Some(relay) = system.relay_ws {
        urls.push(format!("http://{relay}/healthz"));
    }
    for url in urls {
        let health = at_once(system, url.clone()).await;
        assert_eq!(health.status, StatusCode::OK, "{name}: {url}: {health:?}");
    }
}

/// `/readyz` of the system (and of a split relay's own port) answers `status`.
async fn readiness_is(system: &System, status: StatusCode) -> Result<(), String> {
    let mut urls = vec![system.url("/readyz")];
    if let Some(relay) = system.relay_ws {
        urls.push(format!("http://{relay}/readyz"));
    }
    for url in urls {
        let ready = send(system.http.get(&url)).await;
        if ready.status != status {
            return Err(format!("{url}: {ready:?}"));
        }
    }
    Ok(())
}

/// A 503 with `Retry-After` and the error `error`.
fn assert_unavailable(what: &str, answer: &Answer, error: &str) {
    assert_eq!(
        answer.status,
        StatusCode::SERVICE_UNAVAILABLE,
        "{what}: {answer:?}"
    );
    assert!(answer.header("retry-after").is_some(), "{what}: {answer:?}");
    assert_eq!(answer.body["error"], error, "{what}: {answer:?}");
}

#[tokio::test]
async fn a_replica_started_while_redis_is_away_is_alive_at_once_and_ready_when_redis_comes() {
    let mut redis = RedisServer::away();
    for (name, system) in systems(&redis.url()).await {
        healthy_at_once(name, &system).await;
        wait_until(PATIENCE, async || {
            readiness_is(&system, StatusCode::SERVICE_UNAVAILABLE).await
        })
        .await;
        let created = system.post("/api/sessions", json!({})).await;
        assert_unavailable(name, &created, "store_unavailable");
        // Still alive while it waits.
        healthy_at_once(name, &system).await;
        system.stop().await;
    }

    // Redis comes up after the replicas: they turn ready and serve.
    let waiting = systems(&redis.url()).await;
    redis.restart().await;
    for (name, system) in waiting {
        wait_until(PATIENCE, async || {
            readiness_is(&system, StatusCode::OK).await
        })
        .await;
        let created = system.post("/api/sessions", json!({})).await;
        assert_eq!(created.status, StatusCode::CREATED, "{name}: {created:?}");
        system.stop().await;
    }
}

#[tokio::test]
async fn a_full_redis_is_store_full_and_not_ready_until_it_has_room() {
    let redis = RedisServer::start().await;
    for (name, system) in systems(&redis.url()).await {
        wait_until(PATIENCE, async || {
            readiness_is(&system, StatusCode::OK).await
        })
        .await;
        let (code, token) = system.create_session().await;
        system.put_manifest(&code, &token, demo_tools()).await;

        redis.fill().await;
        let created = system.post("/api/sessions", json!({})).await;
        assert_unavailable(name, &created, "store_full");
        let call = json!({"functionName": "echo", "args": {"text": "hi"}, "timeoutMs": 5_000});
        let called = system
            .post(&format!("/api/sessions/{code}/call"), call)
            .await;
        assert_unavailable(name, &called, "store_full");
        wait_until(PATIENCE, async || {
            readiness_is(&system, StatusCode::SERVICE_UNAVAILABLE).await
        })
        .await;
        // Full is not dead: the liveness probe leaves it alone.
        healthy_at_once(name, &system).await;
        // Counted where the relay serves its metrics.
        let metrics = match system.relay_ws {
            Some(relay) => format!("http://{relay}/metrics"),
            None => system.url("/metrics"),
        };
        let scrape = Scrape::fetch(&system.http, &metrics).await;
        let refused = scrape.value("toolrelay_store_full_total", &[]);
        assert!(refused >= 2.0, "{name}: {refused} writes refused as full");

        redis.config_set("maxmemory", "0").await;
        wait_until(PATIENCE, async || {
            readiness_is(&system, StatusCode::OK).await
        })
        .await;
        let created = system.post("/api/sessions", json!({})).await;
        assert_eq!(created.status, StatusCode::CREATED, "{name}: {created:?}");
        system.stop().await;
    }
}

/// A `REDIS_URL` that cannot work (here an unreadable database number) still ends every
/// binary at start, with the message, while the ports it bound had answered `/healthz`.
#[tokio::test]
async fn a_redis_url_that_cannot_work_still_ends_the_process() {
    let url = "redis://127.0.0.1:6379/not-a-number";
    let gateway = [(ENV_RELAY_URL, "http://127.0.0.1:9")];
    let binaries: [(&str, &[(&str, &str)]); 3] = [
        ("toolrelay", &[]),
        ("toolrelay-relay", &[]),
        ("toolrelay-gateway", &gateway),
    ];
    for (name, extra) in binaries {
        let mut command = tokio::process::Command::new(toolrelay_tests::system::binary(name));
        command
            .env(ENV_REDIS_URL, url)
            .env(ENV_LISTEN, "127.0.0.1:0")
            .env(ENV_GRPC_LISTEN, "127.0.0.1:0")
            .env(ENV_WS_LISTEN, "127.0.0.1:0")
            .envs(extra.iter().copied())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true);
        let ended = tokio::time::timeout(PATIENCE, command.output())
            .await
            .unwrap_or_else(|_| panic!("{name} kept running with REDIS_URL={url}"))
            .unwrap();
        let printed = String::from_utf8_lossy(&ended.stderr);
        assert!(!ended.status.success(), "{name}: {printed}");
        assert!(printed.contains("REDIS_URL"), "{name}: {printed}");
    }
}
