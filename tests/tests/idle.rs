//! Idle tabs on Redis: what they cost Redis, that their sessions stay alive, and that a
//! pushing tab's presence is its replica's (issue 25, "idle costs nothing").

use std::num::NonZeroU32;
use std::time::Duration;

use serde_json::Value;
use tokio::time::Instant;
use toolrelay::proto::v1::GetSessionRequest;
use toolrelay_relay::RelayConfig;
use toolrelay_relay::config::{ENV_TAB_REFRESH, ENV_TAB_SWEEP};
use toolrelay_relay::limits::RateLimits;
use toolrelay_tests::cluster::Cluster;
use toolrelay_tests::{Deadline, PATIENCE, TestRelay, WsTab, wait_until};

/// The goal: Redis commands per idle tab and second, at the default settings.
const GOAL_PER_TAB_PER_SECOND: f64 = 0.02;

/// Waits until `condition` holds, at most `patience`.
async fn until<F: Future<Output = bool>>(
    what: &str,
    patience: Duration,
    mut condition: impl FnMut() -> F,
) {
    let every = Deadline::within(patience).every(Duration::from_millis(50));
    wait_until(every, async || {
        if condition().await {
            Ok(())
        } else {
            Err(format!("{what}: not within {patience:?}"))
        }
    })
    .await;
}

/// Keeps a tab answering the relay's pings (by reading what it sends) until its connection
/// closes, as a live tab does.
fn keep_reading(mut tab: WsTab) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move { while tab.next_any_frame().await.is_some() {} })
}

/// The default settings with every period of the tabs' upkeep divided by `scale`: an idle
/// tab then costs `scale` times what it costs at the defaults, in a window `scale` times
/// shorter.
fn scaled_down(scale: u32) -> RelayConfig {
    let defaults = RelayConfig::default();
    RelayConfig {
        session_ttl: defaults.session_ttl / scale,
        tab_refresh: defaults.tab_refresh / scale,
        tab_sweep: defaults.tab_sweep / scale,
        heartbeat_interval: Duration::from_secs(1),
        limits: RateLimits {
            sessions_per_ip: NonZeroU32::new(10_000).unwrap(),
            ..RateLimits::default()
        },
        ..defaults
    }
}

/// N tabs attached and idle: Redis runs at most the goal's commands per tab and second
/// (scaled with the periods), everything counted, the commands that scripts run included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_tabs_cost_redis_under_the_goal() {
    const TABS: usize = 50;
    const SCALE: u32 = 100;
    let config = scaled_down(SCALE);
    let ttl = config.session_ttl;
    let relay = TestRelay::on_redis(config).await;
    let redis = relay.redis().unwrap();
    let mut tabs = Vec::with_capacity(TABS);
    for _ in 0..TABS {
        let session = relay.create_session().await;
        let tab = keep_reading(WsTab::attach(&relay, &session).await);
        tabs.push((session.code, tab));
    }
    // Over three times to live: every session is slid at least once, whenever it attached.
    let window = ttl * 3;
    let before = redis.commands_run().await;
    let started = Instant::now();
    tokio::time::sleep(window).await;
    let commands = redis.commands_run().await - before;
    let elapsed = started.elapsed().as_secs_f64();
    let per_tab = commands as f64 / TABS as f64 / elapsed;
    let bound = GOAL_PER_TAB_PER_SECOND * f64::from(SCALE);
    eprintln!(
        "{commands} commands in {elapsed:.1} s for {TABS} idle tabs: {per_tab:.3} per tab and second (bound {bound})"
    );
    assert!(
        per_tab <= bound,
        "{commands} commands in {elapsed:.1} s for {TABS} idle tabs: {per_tab:.3} per tab and \
         second, over {bound} (the goal of {GOAL_PER_TAB_PER_SECOND} at the default periods, \
         scaled by {SCALE})"
    );
    // They were kept all the same: every tab still has its session.
    let mut client = relay.client().await;
    for (code, _tab) in &tabs {
        let code = code.clone();
        let info = client
            .get_session(GetSessionRequest { code })
            .await
            .unwrap()
            .into_inner();
        assert!(info.provider_connected, "{info:?}");
    }
}

/// A tab attached and silent keeps its session across several times to live; a session
/// without a tab expires meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_attended_tabs_session_outlives_several_ttls() {
    let config = scaled_down(300);
    let ttl = config.session_ttl;
    let relay = TestRelay::on_redis(config).await;
    let attended = relay.create_session().await;
    let _tab = keep_reading(WsTab::attach(&relay, &attended).await);
    let alone = relay.create_session().await;
    let mut client = relay.client().await;
    let started = Instant::now();
    let mut alone_gone = false;
    while started.elapsed() < ttl * 4 {
        let info = client
            .get_session(GetSessionRequest {
                code: attended.code.clone(),
            })
            .await;
        let info = info
            .unwrap_or_else(|status| {
                panic!(
                    "the attended session ended after {:?}: {status:?}",
                    started.elapsed()
                )
            })
            .into_inner();
        assert!(info.provider_connected, "{info:?}");
        if !alone_gone {
            alone_gone = client
                .get_session(GetSessionRequest {
                    code: alone.code.clone(),
                })
                .await
                .is_err();
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(alone_gone, "the session without a tab never expired");
}

/// Two relays on one Redis: a tab on relay A counts as connected through relay B for as long
/// as A lives (past the presence window: A keeps recording itself alive), and stops counting
/// within the presence window once A is killed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_replicas_tabs_stop_counting_as_connected() {
    let refresh_seconds = 1;
    let env = [(ENV_TAB_REFRESH, "1"), (ENV_TAB_SWEEP, "1")];
    let presence = RelayConfig {
        tab_refresh: Duration::from_secs(refresh_seconds),
        ..RelayConfig::default()
    }
    .tab_presence();
    let mut cluster = Cluster::start(2, 2, &env).await;
    let (code, token) = cluster.create_session(1).await;
    let _tab = keep_reading(WsTab::attach_url(&cluster.tab_url(0, &code, &token)).await);
    let path = format!("/api/sessions/{code}");
    let connected = |answer: &Value| answer["providerConnected"] == true;
    // Gateway 1 is in front of relay B.
    until("the tab counts as connected on relay B", PATIENCE, || {
        let answer = cluster.get(1, &path);
        async move { connected(&answer.await.body) }
    })
    .await;
    let alive_since = Instant::now();
    while alive_since.elapsed() < presence + Duration::from_secs(1) {
        let answer = cluster.get(1, &path).await;
        assert!(connected(&answer.body), "{answer:?}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    cluster.kill_relay(0).await;
    let killed = Instant::now();
    until(
        "the tab of the killed relay stops counting",
        presence + Duration::from_secs(3),
        || {
            let answer = cluster.get(1, &path);
            async move { !connected(&answer.await.body) }
        },
    )
    .await;
    assert!(killed.elapsed() <= presence + Duration::from_secs(3));
}
