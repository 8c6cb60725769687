//! The rendered manifests run: `podman kube play` of `k8s/overlays/podman` (the base with the
//! differences its README lists) starts Redis, two relays and two gateways from the image
//! `scripts/image.sh` builds, with the ConfigMaps' and the Secret's environment; a call goes
//! through; a relay is killed (`SIGKILL`) while its tab holds a call, the tab reconnects to
//! the other relay, and the call completes once. So the manifests cannot drift from the
//! binaries' real flags, environment and ports. `scripts/test.sh` runs it after the image.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use toolrelay_tests::deploy::{
    a_call_goes_through, manifests, podman, podman_blocking, podman_ok, render, scratch,
};
use toolrelay_tests::recording::RecordingTab;
use toolrelay_tests::system::{Answer, send};
use toolrelay_tests::{Deadline, repo_file, wait_until};

/// Where the overlay puts every process, on the host's loopback (below the ephemeral range,
/// so that no outgoing connection holds one of these ports).
const GATEWAYS: [&str; 2] = ["http://127.0.0.1:26080", "http://127.0.0.1:26090"];
const RELAY_WEBSOCKETS: [&str; 2] = ["ws://127.0.0.1:26081", "ws://127.0.0.1:26082"];
const PORTS: [u16; 7] = [26379, 26051, 26052, 26081, 26082, 26080, 26090];
/// podman names a Deployment's pod `<name>-pod-0` and its containers `<pod>-<container>`.
const RELAY_A: &str = "toolrelay-relay-a-pod-0-relay";
const PATIENCE: Duration = Duration::from_secs(60);

/// What was played, taken down when dropped (also after a failed assertion): the pods, the
/// Redis volume and the secret.
struct Played {
    play: PathBuf,
}

impl Played {
    fn down(&self) {
        podman_blocking(&["kube", "down", self.play.to_str().unwrap()]);
        podman_blocking(&["volume", "rm", "--force", "toolrelay-redis-data"]);
        podman_blocking(&["secret", "rm", "toolrelay"]);
    }
}

impl Drop for Played {
    fn drop(&mut self) {
        self.down();
    }
}

/// Waits until `url` answers 200.
async fn until_ready(url: &str) {
    let http = reqwest::Client::new();
    let every = Deadline::within(PATIENCE).every(Duration::from_millis(100));
    wait_until(every, async || {
        let ready = http.get(url).send().await;
        if ready.is_ok_and(|answer| answer.status().is_success()) {
            Ok(())
        } else {
            Err(format!("{url} never answered 200"))
        }
    })
    .await;
}

fn post(
    gateway: usize,
    path: &str,
    key: &str,
    body: Value,
) -> impl Future<Output = Answer> + use<> {
    send(
        reqwest::Client::new()
            .post(format!("{}{path}", GATEWAYS[gateway]))
            .bearer_auth(key)
            .json(&body),
    )
}

fn get(gateway: usize, path: &str, key: &str) -> impl Future<Output = Answer> + use<> {
    send(
        reqwest::Client::new()
            .get(format!("{}{path}", GATEWAYS[gateway]))
            .bearer_auth(key),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the image: scripts/test.sh builds it (scripts/image.sh) and runs this"]
async fn the_podman_overlay_runs_and_a_relay_killed_mid_call_loses_no_call() {
    for port in PORTS {
        assert!(
            std::net::TcpListener::bind(("127.0.0.1", port)).is_ok(),
            "127.0.0.1:{port} is taken: another run of this test (podman pod ps), or another program"
        );
    }
    let dir = scratch("kube-play");
    // The overlay's Redis image, on the same local base as toolrelay's (cached after once).
    let overlay = repo_file("k8s/overlays/podman");
    podman_ok(&[
        "build",
        "--quiet",
        "--pull=never",
        "-f",
        overlay.join("redis.Containerfile").to_str().unwrap(),
        "-t",
        "localhost/toolrelay-redis:bookworm",
        overlay.to_str().unwrap(),
    ])
    .await;

    let rendered = render("overlays/podman", &dir).await;
    let prepared = manifests(&["play", rendered.to_str().unwrap(), dir.to_str().unwrap()]).await;
    assert!(
        prepared.status.success(),
        "{}",
        String::from_utf8_lossy(&prepared.stderr)
    );
    let secrets: Value = serde_json::from_slice(&prepared.stdout).unwrap();
    let key = secrets["toolrelay"]["API_KEYS"]
        .as_str()
        .unwrap()
        .to_owned();
    let played = Played {
        play: dir.join("play.yaml"),
    };
    // What an interrupted run may have left.
    played.down();
    podman_ok(&[
        "secret",
        "create",
        "toolrelay",
        dir.join("secret-toolrelay.json").to_str().unwrap(),
    ])
    .await;
    let started = Instant::now();
    let play = podman()
        .args(["kube", "play", "--replace"])
        .arg(&played.play)
        .output()
        .await
        .unwrap();
    assert!(
        play.status.success(),
        "podman kube play: {}",
        String::from_utf8_lossy(&play.stderr)
    );
    for gateway in GATEWAYS {
        until_ready(&format!("{gateway}/readyz")).await;
    }
    // The relays answer their probes on their WebSocket port, as the Deployments ask.
    for relay in RELAY_WEBSOCKETS {
        until_ready(&format!(
            "http://{}/readyz",
            relay.trim_start_matches("ws://")
        ))
        .await;
    }
    eprintln!("kube play: ready after {:?}", started.elapsed());

    // A call through gateway A to a tab on relay A, with the Secret's API key.
    a_call_goes_through(GATEWAYS[0], RELAY_WEBSOCKETS[0], Some(&key)).await;

    // A tab on relay A holding a call made through gateway A; relay A is killed.
    let created = post(0, "/api/sessions", &key, json!({})).await;
    assert_eq!(created.status.as_u16(), 201, "{created:?}");
    let code = created.body["code"].as_str().unwrap().to_owned();
    let token = created.body["providerToken"].as_str().unwrap();
    // The tab connects to relay A, and after a lost connection to B, as the Ingress would
    // send it elsewhere.
    let tab = RecordingTab::start(
        RELAY_WEBSOCKETS
            .iter()
            .map(|relay| format!("{relay}/api/sessions/{code}/ws?token={token}"))
            .collect(),
    );
    wait_until(PATIENCE, async || {
        let tools = get(1, &format!("/api/sessions/{code}/metadata"), &key).await;
        if tools.body["tools"][0]["id"] == "demo" {
            Ok(())
        } else {
            Err(format!("the tab's tools never showed: {tools:?}"))
        }
    })
    .await;
    tab.hold(true);
    let call = json!({"requestId": "held-1", "functionName": "echo", "args": {"text": "held"}, "timeoutMs": 30_000});
    let waiting = tokio::spawn(post(
        0,
        &format!("/api/sessions/{code}/call"),
        &key,
        call.clone(),
    ));
    tab.until("the call", PATIENCE, |ledger| !ledger.deliveries.is_empty())
        .await;
    podman_ok(&["kill", RELAY_A]).await;
    tab.hold(false);
    tab.until("a connection to the other relay", PATIENCE, |ledger| {
        ledger.connections >= 2
    })
    .await;
    tab.until("the call again on the other relay", PATIENCE, |ledger| {
        ledger
            .deliveries
            .iter()
            .any(|(connection, _)| *connection >= 2)
    })
    .await;

    let answer = waiting.await.unwrap();
    let answer = if answer.status.as_u16() == 200 && answer.body["success"] == true {
        eprintln!("the caller got its answer directly");
        answer
    } else {
        eprintln!("the caller's relay died under it ({answer:?}): asking again");
        // The caller's relay died under it: it asks again, with the same requestId, through
        // the other gateway.
        post(1, &format!("/api/sessions/{code}/call"), &key, call).await
    };
    assert_eq!(answer.status.as_u16(), 200, "{answer:?}");
    assert_eq!(answer.body["result"], json!({"text": "held"}), "{answer:?}");
    // Delivered once to the first connection and once to the one on relay B (the tab
    // answers the repeat from what it ran): never twice to one connection, never run twice.
    let delivered = tab.delivered();
    assert_eq!(
        delivered
            .iter()
            .filter(|(connection, _)| *connection == 1)
            .count(),
        1,
        "{delivered:?}"
    );
    assert_eq!(
        delivered
            .iter()
            .filter(|(connection, _)| *connection >= 2)
            .count(),
        1,
        "{delivered:?}"
    );
    assert!(
        delivered.iter().all(|(_, id)| id == "held-1"),
        "{delivered:?}"
    );
    let recorded = get(1, &format!("/api/sessions/{code}/requests/held-1"), &key).await;
    assert_eq!(recorded.body["status"], "completed", "{recorded:?}");
    assert_eq!(
        recorded.body["response"]["result"],
        json!({"text": "held"}),
        "{recorded:?}"
    );
    drop(tab);
    drop(played);
    std::fs::remove_dir_all(dir).unwrap();
}
