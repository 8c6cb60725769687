//! Redis as operators run it, on the real binaries and real `redis-server`s: TLS (with a
//! client certificate) and a least-privilege ACL user shared by two relays and two gateways;
//! a wrong password and an untrusted CA each end the start naming the variable to fix; a
//! primary found through Sentinel, `kill -9`ed under calls.

use futures::StreamExt;
use reqwest::StatusCode;
use serde_json::json;
use toolrelay_gateway::config::{ENV_LISTEN, ENV_RELAY_URL};
use toolrelay_relay::config::{
    ENV_GRPC_LISTEN, ENV_RATE_LIMIT_REQUEST, ENV_RATE_LIMIT_SESSION, ENV_REDIS_CA_FILE,
    ENV_REDIS_CLIENT_CERT_FILE, ENV_REDIS_CLIENT_KEY_FILE, ENV_REDIS_CLUSTER_URLS,
    ENV_REDIS_PASSWORD_FILE, ENV_REDIS_SENTINEL_MASTER, ENV_REDIS_SENTINELS, ENV_REDIS_URL,
    ENV_REDIS_USERNAME, ENV_REDIS_WAIT_MS, ENV_REDIS_WAIT_REPLICAS, ENV_WS_LISTEN,
};
use toolrelay_tests::certs::TestCertificates;
use toolrelay_tests::cluster::Cluster;
use toolrelay_tests::recording::RecordingTab;
use toolrelay_tests::redis::{RedisCluster, RedisOptions, RedisSentinel, RedisServer};
use toolrelay_tests::system::binary;
use toolrelay_tests::{PATIENCE, wait_until};

/// The least-privilege ACL the README gives, for the default `toolrelay:` prefix.
const ACL: [&str; 7] = [
    "~toolrelay:*",
    "&toolrelay:*",
    "+@read",
    "+@write",
    "+@scripting",
    "+@pubsub",
    "+ping",
];
/// What the cluster client needs on top, to learn the slots.
const CLUSTER_ACL: [&str; 1] = ["+cluster|slots"];
const USER: &str = "relay";
const PASSWORD: &str = "a-long-redis-password-0123456789";
/// The user the test itself connects as (to inspect and create the Cluster).
const ADMIN: &str = "admin";
const ADMIN_PASSWORD: &str = "admin-password-0123456789";

/// The ACL users of a test Redis: `relay` with the least privilege (plus what the cluster
/// client needs, on a `cluster`), and `admin` for the test itself.
fn users(cluster: bool) -> Vec<Vec<String>> {
    let mut relay = vec![USER.to_owned(), "on".to_owned(), format!(">{PASSWORD}")];
    relay.extend(ACL.iter().map(|rule| (*rule).to_owned()));
    if cluster {
        relay.extend(CLUSTER_ACL.iter().map(|rule| (*rule).to_owned()));
    }
    let admin = [
        ADMIN,
        "on",
        &format!(">{ADMIN_PASSWORD}"),
        "~*",
        "&*",
        "+@all",
    ]
    .iter()
    .map(|word| (*word).to_owned())
    .collect();
    vec![relay, admin]
}

/// A TLS-only Redis that asks clients for a certificate, with the ACL user `relay` (and an
/// `admin` user for the test itself).
async fn secured_redis(certificates: &TestCertificates) -> RedisServer {
    let users = users(false);
    RedisServer::with(RedisOptions {
        tls: Some(certificates.dir().to_owned()),
        users,
        admin: Some((ADMIN.into(), ADMIN_PASSWORD.into())),
        replica_of: None,
    })
    .await
}

/// What every process is given to reach the secured Redis, the password in a file.
fn secured_env(
    redis: &RedisServer,
    certificates: &TestCertificates,
) -> Vec<(&'static str, String)> {
    let password = certificates.path("redis-password");
    std::fs::write(&password, format!("{PASSWORD}\n")).unwrap();
    let path = |name: &str| certificates.path(name).to_str().unwrap().to_owned();
    vec![
        (ENV_REDIS_URL, redis.url()),
        (ENV_REDIS_USERNAME, USER.to_owned()),
        (
            ENV_REDIS_PASSWORD_FILE,
            password.to_str().unwrap().to_owned(),
        ),
        (ENV_REDIS_CA_FILE, path("ca.pem")),
        (ENV_REDIS_CLIENT_CERT_FILE, path("server.pem")),
        (ENV_REDIS_CLIENT_KEY_FILE, path("server.key")),
    ]
}

fn borrowed<'a>(env: &'a [(&'static str, String)]) -> Vec<(&'static str, &'a str)> {
    env.iter()
        .map(|(name, value)| (*name, value.as_str()))
        .collect()
}

/// Two relays and two gateways on a TLS Redis as a least-privilege ACL user: a session made
/// through one gateway, its tab on the other relay, and calls through both gateways, each
/// answered once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_share_a_session_over_tls_as_a_least_privilege_user() {
    let certificates = TestCertificates::generate();
    let redis = secured_redis(&certificates).await;
    let mut env = secured_env(&redis, &certificates);
    env.push((ENV_RATE_LIMIT_REQUEST, "100000".into()));
    let cluster = Cluster::on(redis, Vec::new(), 2, 2, &borrowed(&env)).await;
    let (code, token) = cluster.create_session(0).await;
    let tab = RecordingTab::start(vec![cluster.tab_url(1, &code, &token)]);
    cluster.until_tab_registered(1, code.as_str()).await;
    let answers = futures::stream::iter(0..40)
        .map(|n| {
            let answer = cluster.post(
                n % 2,
                &format!("/api/sessions/{code}/call"),
                json!({"requestId": format!("call-{n}"), "functionName": "echo", "args": {"text": format!("n{n}")}, "timeoutMs": 30_000}),
            );
            async move { (n, answer.await) }
        })
        .buffer_unordered(8)
        .collect::<Vec<_>>()
        .await;
    for (n, answer) in &answers {
        assert_eq!(answer.status, StatusCode::OK, "{answer:?}");
        assert_eq!(
            answer.body["result"],
            json!({"text": format!("n{n}")}),
            "{answer:?}"
        );
    }
    let deliveries = tab.deliveries();
    let distinct: std::collections::HashSet<&String> = deliveries.iter().collect();
    assert_eq!(
        (deliveries.len(), distinct.len()),
        (40, 40),
        "each call delivered once"
    );
    // The connections really are TLS as the ACL user: Redis lists them so.
    let mut admin = cluster.redis.connection().await.unwrap();
    let clients: String = redis::cmd("CLIENT")
        .arg("LIST")
        .query_async(&mut admin)
        .await
        .unwrap();
    let as_relay = clients
        .lines()
        .filter(|line| line.contains(&format!(" user={USER} ")))
        .count();
    assert!(as_relay >= 4, "every process connects as {USER}: {clients}");
}

/// Runs a binary with `env` until it ends (it must, within the patience); its exit status
/// and what it printed.
async fn run_to_end(name: &str, env: &[(&str, &str)]) -> (std::process::ExitStatus, String) {
    let output = tokio::time::timeout(
        PATIENCE,
        tokio::process::Command::new(binary(name))
            .envs(env.iter().copied())
            .stdin(std::process::Stdio::null())
            .kill_on_drop(true)
            .output(),
    )
    .await
    .unwrap_or_else(|_| panic!("{name} kept running: it should have ended at start"))
    .unwrap();
    let printed = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status, printed)
}

/// A wrong password and an untrusted CA are not waited out: every binary ends at start with
/// a message naming the variable to fix.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_password_or_an_untrusted_ca_ends_the_start_naming_the_variable() {
    let certificates = TestCertificates::generate();
    let redis = secured_redis(&certificates).await;
    let good = secured_env(&redis, &certificates);
    let wrong_password = certificates.path("wrong-password");
    std::fs::write(&wrong_password, "not-the-password-0123456789\n").unwrap();
    let other_ca = certificates.path("other-ca.pem");
    let cases = [
        (ENV_REDIS_PASSWORD_FILE, wrong_password.to_str().unwrap()),
        (ENV_REDIS_CA_FILE, other_ca.to_str().unwrap()),
    ];
    let listen = [
        (ENV_LISTEN, "127.0.0.1:0"),
        (ENV_GRPC_LISTEN, "127.0.0.1:0"),
        (ENV_WS_LISTEN, "127.0.0.1:0"),
        (ENV_RELAY_URL, "http://127.0.0.1:9"),
    ];
    for (variable, value) in cases {
        for name in ["toolrelay", "toolrelay-relay", "toolrelay-gateway"] {
            let mut env: Vec<(&str, &str)> = borrowed(&good)
                .into_iter()
                .filter(|(name, _)| *name != variable)
                .collect();
            env.push((variable, value));
            env.extend_from_slice(&listen);
            let (status, printed) = run_to_end(name, &env).await;
            assert!(!status.success(), "{name} with a bad {variable}: {printed}");
            assert!(
                printed.contains(variable),
                "{name} must name {variable}: {printed}"
            );
        }
    }
}

/// What one caller's call came to.
#[derive(Debug)]
struct Outcome {
    /// 503s (with `Retry-After`) before the answer.
    refusals: usize,
    /// When the last of them came.
    last_refusal: Option<tokio::time::Instant>,
    /// Whether it was answered, with its own text.
    answered: bool,
}

/// Makes the call `id` through gateway `gateway`, asking again with the same requestId after
/// each 503 (with `Retry-After`: the retryable error callers are promised) until `deadline`.
/// Any other answer than its own text, or another error, fails the test.
async fn call_until_answered(
    cluster: &Cluster,
    gateway: usize,
    code: &str,
    id: &str,
    deadline: tokio::time::Instant,
) -> Outcome {
    let (mut refusals, mut last_refusal) = (0, None);
    while tokio::time::Instant::now() < deadline {
        let answer = cluster
            .post(
                gateway,
                &format!("/api/sessions/{code}/call"),
                json!({"requestId": id, "functionName": "echo", "args": {"text": id}, "timeoutMs": 10_000}),
            )
            .await;
        if answer.status == StatusCode::SERVICE_UNAVAILABLE {
            assert!(answer.header("retry-after").is_some(), "{answer:?}");
            refusals += 1;
            last_refusal = Some(tokio::time::Instant::now());
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            continue;
        }
        if answer.status == StatusCode::ACCEPTED {
            // Not answered within the call's wait: asked again, as a caller is told to.
            continue;
        }
        assert_eq!(answer.status, StatusCode::OK, "{id}: {answer:?}");
        assert_eq!(
            answer.body["result"],
            json!({ "text": id }),
            "{id} got another call's answer: {answer:?}"
        );
        return Outcome {
            refusals,
            last_refusal,
            answered: true,
        };
    }
    Outcome {
        refusals,
        last_refusal,
        answered: false,
    }
}

/// One primary, one replica and three Sentinels; two relays and two gateways find the primary
/// through the Sentinels and wait for the replica on every call's writes (`WAIT 1`). The
/// primary is `kill -9`ed under calls, then comes back (as a replica, the Sentinels see to
/// it): no call is answered twice or with another's answer, every call is answered or told
/// to retry (503), none hangs, and none is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_primary_killed_under_calls_fails_over_losing_no_call() {
    const MASTER: &str = "toolrelay";
    let mut primary = RedisServer::start().await;
    let replica = RedisServer::with(RedisOptions {
        replica_of: Some(primary.port()),
        ..RedisOptions::default()
    })
    .await;
    wait_until(PATIENCE, async || {
        if primary.replicas_online().await == 1 {
            Ok(())
        } else {
            Err("the replica never caught up with the primary")
        }
    })
    .await;
    let mut sentinels = Vec::new();
    for _ in 0..3 {
        sentinels.push(RedisSentinel::start(MASTER, primary.port(), 2).await);
    }
    // The Sentinels know the replica and each other before the primary may fail.
    wait_until(PATIENCE, async || {
        let mut ready = 0;
        for sentinel in &sentinels {
            if sentinel.peers(MASTER).await == Some((1, 2)) {
                ready += 1;
            }
        }
        if ready == sentinels.len() {
            Ok(())
        } else {
            Err("the Sentinels never saw the replica and each other")
        }
    })
    .await;
    let addresses = sentinels
        .iter()
        .map(RedisSentinel::address)
        .collect::<Vec<_>>()
        .join(",");
    let env = [
        (ENV_REDIS_SENTINELS, addresses.as_str()),
        (ENV_REDIS_SENTINEL_MASTER, MASTER),
        (ENV_REDIS_WAIT_REPLICAS, "1"),
        (ENV_REDIS_WAIT_MS, "1000"),
        (ENV_RATE_LIMIT_REQUEST, "100000"),
    ];
    // The cluster keeps the replica; the test keeps the primary, to kill and restart it.
    let replica_port = replica.port();
    let cluster = Cluster::on(replica, Vec::new(), 2, 2, &env).await;
    let (code, token) = cluster.create_session(0).await;
    let tab = RecordingTab::start(vec![
        cluster.tab_url(1, &code, &token),
        cluster.tab_url(0, &code, &token),
    ]);
    cluster.until_tab_registered(0, code.as_str()).await;

    // Four callers, through both gateways, until the fleet has answered calls after the
    // failover for a while.
    let deadline = tokio::time::Instant::now() + 8 * PATIENCE;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let outcomes = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let killed_at = std::sync::Mutex::new(None::<tokio::time::Instant>);
    let cluster_ref = &cluster;
    let callers = (0..4).map(|caller| {
        let (stop, outcomes) = (stop.clone(), outcomes.clone());
        let code = code.clone();
        async move {
            let mut n = 0;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                let id = format!("c{caller}-{n}");
                let outcome = call_until_answered(cluster_ref, n % 2, &code, &id, deadline).await;
                outcomes.lock().unwrap().push((id, outcome));
                n += 1;
            }
        }
    });
    let failover = async {
        let answered = || outcomes.lock().unwrap().len();
        wait_until(PATIENCE, async || {
            if answered() >= 40 {
                Ok(())
            } else {
                Err("the callers never got going")
            }
        })
        .await;
        *killed_at.lock().unwrap() = Some(tokio::time::Instant::now());
        primary.stop().await;
        // The Sentinels promote the replica; the old primary comes back, empty, and they make
        // it the new primary's replica (what `WAIT 1` needs again).
        // The old primary comes back (empty) only once every Sentinel names the new one and
        // every process follows it, as an operator restarts a crashed primary: before that,
        // a process could still reach the old address and find it empty.
        wait_until(PATIENCE, async || {
            for sentinel in &sentinels {
                if sentinel.primary(MASTER).await != Some(replica_port) {
                    return Err("the Sentinels never all named the replica");
                }
            }
            Ok(())
        })
        .await;
        let followed =
            format!("toolrelay_redis_primary{{address=\"127.0.0.1:{replica_port}\"}} 1\n");
        wait_until(PATIENCE, async || {
            let mut pages = Vec::new();
            for relay in &cluster_ref.relay_websockets {
                pages.push(format!("http://{relay}/metrics"));
            }
            for gateway in &cluster_ref.gateways {
                pages.push(format!("{gateway}/metrics"));
            }
            for page in pages {
                let metrics = reqwest::get(&page)
                    .await
                    .map_err(|error| error.to_string())?;
                let metrics = metrics.text().await.map_err(|error| error.to_string())?;
                if !metrics.contains(&followed) {
                    return Err(format!("{page} still names another primary"));
                }
            }
            Ok(())
        })
        .await;
        primary.restart().await;
        // Writes wait for a replica again once the old primary has caught up with the new.
        wait_until(3 * PATIENCE, async || {
            if cluster_ref.redis.replicas_online().await == 1 {
                Ok(())
            } else {
                Err("the old primary never became the new one's replica")
            }
        })
        .await;
        let settled = answered() + 40;
        wait_until(PATIENCE, async || {
            if answered() >= settled {
                Ok(())
            } else {
                Err("calls stalled after the failover")
            }
        })
        .await;
        stop.store(true, std::sync::atomic::Ordering::SeqCst);
    };
    let ((), _) = tokio::join!(failover, futures::future::join_all(callers));
    // Each relay says it followed the failover, and to which primary.
    for relay in &cluster.relay_websockets {
        let metrics = reqwest::get(format!("http://{relay}/metrics"))
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        assert!(
            metrics.contains("toolrelay_redis_failovers_total 1\n"),
            "{metrics}"
        );
        let primary =
            format!("toolrelay_redis_primary{{address=\"127.0.0.1:{replica_port}\"}} 1\n");
        assert!(metrics.contains(&primary), "{primary} in {metrics}");
    }

    let outcomes = outcomes.lock().unwrap();
    let lost: Vec<&String> = outcomes
        .iter()
        .filter(|(_, outcome)| !outcome.answered)
        .map(|(id, _)| id)
        .collect();
    let refusals: usize = outcomes.iter().map(|(_, outcome)| outcome.refusals).sum();
    let deliveries = tab.deliveries();
    let mut per_call = std::collections::HashMap::<&String, usize>::new();
    for id in &deliveries {
        *per_call.entry(id).or_default() += 1;
    }
    let twice = per_call.values().filter(|count| **count > 1).count();
    let killed = killed_at.lock().unwrap().expect("the primary was killed");
    let last_refusal = outcomes
        .iter()
        .filter_map(|(_, outcome)| outcome.last_refusal)
        .max();
    println!(
        "failover: {} calls, {} delivered once, {twice} delivered more than once, {} lost, {refusals} 503s, the last {:?} after the kill",
        outcomes.len(),
        per_call.values().filter(|count| **count == 1).count(),
        lost.len(),
        last_refusal.map(|at| at.duration_since(killed))
    );
    assert!(lost.is_empty(), "calls never answered: {lost:?}");
    assert_eq!(twice, 0, "no call delivered twice");
}

/// The `i`th node of the Redis Cluster behind `cluster` (see [`Cluster::on`]).
fn shard(cluster: &mut Cluster, index: usize) -> &mut RedisServer {
    match index {
        0 => &mut cluster.redis,
        other => &mut cluster.more_redis[other - 1],
    }
}

/// Two relays and two gateways on a three-primary Redis Cluster, as the least-privilege ACL
/// user: sessions spread over the shards and each shard's calls are answered exactly once; a
/// relay `kill -9`ed mid-call loses no call; one shard's primary stopped, only its sessions
/// see 503 while the others go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_carries_sessions_on_every_shard_and_a_stopped_shard_costs_only_its_own() {
    let users = users(true);
    let shards = RedisCluster::with(RedisOptions {
        users,
        admin: Some((ADMIN.into(), ADMIN_PASSWORD.into())),
        ..RedisOptions::default()
    })
    .await;
    let urls = shards.urls();
    let password =
        std::env::temp_dir().join(format!("toolrelay-cluster-password-{}", std::process::id()));
    std::fs::write(&password, PASSWORD).unwrap();
    let env = [
        (ENV_REDIS_CLUSTER_URLS, urls.as_str()),
        (ENV_REDIS_USERNAME, USER),
        (ENV_REDIS_PASSWORD_FILE, password.to_str().unwrap()),
        (ENV_RATE_LIMIT_REQUEST, "100000"),
        (ENV_RATE_LIMIT_SESSION, "100000"),
    ];
    let mut nodes = shards.nodes;
    let first = nodes.remove(0);
    let mut cluster = Cluster::on(first, nodes, 2, 2, &env).await;

    // Sessions until every shard holds one.
    let mut on_shard: [Option<(String, String)>; 3] = [None, None, None];
    let mut made = 0;
    while on_shard.iter().any(Option::is_none) {
        assert!(made < 60, "60 sessions and a shard still holds none");
        let (code, token) = cluster.create_session(made % 2).await;
        let port = cluster
            .redis
            .primary_port_of(&format!("toolrelay:{{{code}}}:s"))
            .await;
        let index = (0..3)
            .find(|index| shard(&mut cluster, *index).port() == port)
            .unwrap();
        on_shard[index].get_or_insert((code, token));
        made += 1;
    }
    let sessions: Vec<(String, String)> = on_shard.into_iter().map(Option::unwrap).collect();
    let tabs: Vec<RecordingTab> = sessions
        .iter()
        .enumerate()
        .map(|(index, (code, token))| {
            RecordingTab::start(vec![
                cluster.tab_url(index % 2, code, token),
                cluster.tab_url((index + 1) % 2, code, token),
            ])
        })
        .collect();
    for (code, _) in &sessions {
        cluster.until_tab_registered(0, code.as_str()).await;
    }

    // Calls on every shard, through both gateways: each answered with its own answer.
    let deadline = tokio::time::Instant::now() + 3 * PATIENCE;
    let calls = futures::stream::iter(0..90)
        .map(|n| {
            let (code, _) = &sessions[n % 3];
            let id = format!("s{}-{n}", n % 3);
            let cluster = &cluster;
            async move { call_until_answered(cluster, n % 2, code, &id, deadline).await }
        })
        .buffer_unordered(9)
        .collect::<Vec<_>>()
        .await;
    assert!(calls.iter().all(|outcome| outcome.answered), "{calls:?}");
    for tab in &tabs {
        let deliveries = tab.deliveries();
        let distinct: std::collections::HashSet<&String> = deliveries.iter().collect();
        assert_eq!(
            (deliveries.len(), distinct.len()),
            (30, 30),
            "each call delivered once"
        );
    }

    // A relay killed while its tabs hold delivered calls: every call still answered once.
    for tab in &tabs {
        tab.hold(true);
    }
    let held: Vec<_> = sessions
        .iter()
        .enumerate()
        .map(|(index, (code, _))| {
            tokio::spawn(cluster.post(
                index % 2,
                &format!("/api/sessions/{code}/call"),
                json!({"requestId": format!("held-{index}"), "functionName": "echo", "args": {"text": format!("held-{index}")}, "timeoutMs": 30_000}),
            ))
        })
        .collect();
    for tab in &tabs {
        tab.until("the held call", 3 * PATIENCE, |ledger| {
            ledger.deliveries.len() >= 31
        })
        .await;
    }
    cluster.kill_relay(0).await;
    for tab in &tabs {
        tab.hold(false);
    }
    for (index, held) in held.into_iter().enumerate() {
        let answer = held.await.unwrap();
        if answer.status == StatusCode::OK {
            assert_eq!(
                answer.body["result"],
                json!({"text": format!("held-{index}")}),
                "{answer:?}"
            );
        }
        // A caller whose gateway's relay died asks again with its requestId.
        let (code, _) = &sessions[index];
        let outcome = call_until_answered(
            &cluster,
            1,
            code,
            &format!("held-{index}"),
            tokio::time::Instant::now() + 3 * PATIENCE,
        )
        .await;
        assert!(outcome.answered, "held-{index}: {outcome:?}");
    }
    for tab in &tabs {
        for connection in 1..=tab.connections() {
            let delivered = tab.delivered_on(connection);
            let distinct: std::collections::HashSet<&String> = delivered.iter().collect();
            assert_eq!(
                distinct.len(),
                delivered.len(),
                "twice on one connection: {delivered:?}"
            );
        }
    }

    // One shard's primary stopped: its session's calls get 503, the others go on.
    shard(&mut cluster, 2).stop().await;
    let (down, _) = &sessions[2];
    wait_until(3 * PATIENCE, async || {
        let answer = cluster
            .post(
                1,
                &format!("/api/sessions/{down}/call"),
                json!({"functionName": "echo", "args": {"text": "x"}, "timeoutMs": 2_000}),
            )
            .await;
        if answer.status == StatusCode::SERVICE_UNAVAILABLE
            && answer.header("retry-after").is_some()
        {
            Ok(())
        } else {
            Err(format!(
                "the stopped shard's session still answers: {answer:?}"
            ))
        }
    })
    .await;
    let mut refusals = 0;
    for n in 0..20 {
        let (code, _) = &sessions[n % 2];
        let id = format!("after-{n}");
        let outcome = call_until_answered(
            &cluster,
            1,
            code,
            &id,
            tokio::time::Instant::now() + 3 * PATIENCE,
        )
        .await;
        assert!(outcome.answered, "{id} on a live shard: {outcome:?}");
        refusals += outcome.refusals;
    }
    println!(
        "cluster: {made} sessions made to cover 3 shards; with one shard stopped, 20 calls on the others met {refusals} 503s"
    );
    assert_eq!(
        cluster.get(1, "/readyz").await.status,
        StatusCode::OK,
        "one shard down is not the fleet down"
    );
    std::fs::remove_file(password).unwrap();
}

/// A Redis Cluster over TLS (clients and the cluster bus), as the least-privilege ACL user:
/// two relays and a gateway find its shards, and calls on a session are answered once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_over_tls_serves_calls_as_a_least_privilege_user() {
    let certificates = TestCertificates::generate();
    let users = users(true);
    let shards = RedisCluster::with(RedisOptions {
        tls: Some(certificates.dir().to_owned()),
        users,
        admin: Some((ADMIN.into(), ADMIN_PASSWORD.into())),
        ..RedisOptions::default()
    })
    .await;
    let urls = shards.urls();
    assert!(urls.starts_with("rediss://"), "{urls}");
    let mut env = secured_env(&shards.nodes[0], &certificates);
    env.retain(|(name, _)| *name != ENV_REDIS_URL);
    env.push((ENV_REDIS_CLUSTER_URLS, urls));
    env.push((ENV_RATE_LIMIT_REQUEST, "100000".into()));
    let mut nodes = shards.nodes;
    let first = nodes.remove(0);
    let cluster = Cluster::on(first, nodes, 2, 1, &borrowed(&env)).await;
    let (code, token) = cluster.create_session(0).await;
    let tab = RecordingTab::start(vec![cluster.tab_url(1, &code, &token)]);
    cluster.until_tab_registered(0, code.as_str()).await;
    let deadline = tokio::time::Instant::now() + 3 * PATIENCE;
    for n in 0..20 {
        let id = format!("tls-{n}");
        let outcome = call_until_answered(&cluster, 0, &code, &id, deadline).await;
        assert!(outcome.answered, "{id}: {outcome:?}");
    }
    let deliveries = tab.deliveries();
    let distinct: std::collections::HashSet<&String> = deliveries.iter().collect();
    assert_eq!(
        (deliveries.len(), distinct.len()),
        (20, 20),
        "each call delivered once"
    );
}
