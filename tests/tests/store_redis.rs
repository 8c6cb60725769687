//! The Redis store's own tests, beyond the conformance suite (`store_conformance.rs`,
//! `store_calls.rs`): replicas sharing sessions, calls, events and counts through one Redis;
//! Redis restarted or gone and back; a Cluster node refusing a script that strays into another
//! slot; and calls routed in the process between replicas.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use serde_json::json;
use toolrelay::wire::RequestStatus;
use toolrelay_relay::config::RedisSettings;
use toolrelay_relay::store::redis::RedisStore;
use toolrelay_relay::store::{
    Answerer, EnqueueChecks, Enqueued, EventStream, Finished, RateBudget, SessionEvent, Transport,
};
// The parts of the store's interface, for the tests that hold a store by its own type.
use toolrelay_relay::store::{BudgetStore, Reachable, SessionStore};
use toolrelay_relay::{Clock, Metrics, SessionCode, Timestamp};
use toolrelay_tests::redis::RedisServer;
use toolrelay_tests::store_fixture::{
    HOUR, SESSIONS_EXPIRED, answer, attached, call, claim, code_of, limits, next_event, provider,
    sample, session, wall_now,
};
use toolrelay_tests::{Deadline, PATIENCE, wait_until};

/// Two replicas on one Redis: what one does, the other's subscribers hear, and sees.
#[tokio::test]
async fn replicas_share_sessions_calls_and_events_through_redis() {
    let server = RedisServer::start().await;
    let (clock, _hand) = Clock::manual(wall_now());
    let shared = RedisSettings::primary(server.url(), "shared:");
    let connect = || RedisStore::connect(&shared, clock.clone(), limits(), Metrics::default());
    let (a, b) = (connect().await.unwrap(), connect().await.unwrap());
    let now = clock.now();
    let budget = RateBudget::per_minute(std::num::NonZeroU32::new(2).unwrap());
    assert_eq!(a.spend("k", budget, now).await.unwrap(), None);
    assert_eq!(b.spend("k", budget, now).await.unwrap(), None);
    assert!(
        a.spend("k", budget, now).await.unwrap().is_some(),
        "one budget for both replicas"
    );
    a.insert_session(session("ABCD2345", now, HOUR))
        .await
        .unwrap();
    let code = code_of("ABCD2345");
    b.set_provider(&code, provider("tab-b", now))
        .await
        .unwrap()
        .unwrap();
    let mut heard_on_b = b.subscribe(&code).await.unwrap().unwrap();
    let mut heard_on_a = a.subscribe(&code).await.unwrap().unwrap();
    let mut waiting_on_a = a.listen_for_answer(&code, "r1").await.unwrap();
    a.enqueue(&code, call("r1", now, json!({"x": 1})), 10, now)
        .await
        .unwrap();
    assert_eq!(
        next_event(&mut heard_on_b).await,
        SessionEvent::RequestQueued
    );
    let claimed = b.claim(&code, &claim("tab-b", now, HOUR)).await.unwrap();
    assert_eq!(claimed.len(), 1);
    b.finish(
        &code,
        "r1",
        RequestStatus::Completed,
        answer("r1", json!(2)),
        Answerer::Connection("tab-b"),
        now,
        now,
    )
    .await
    .unwrap();
    assert_eq!(
        next_event(&mut heard_on_a).await,
        SessionEvent::RequestQueued
    );
    let mut record = a.request(&code, "r1").await.unwrap().unwrap();
    assert_eq!(record.correlation_id, None, "what is kept drops it");
    // The waiter on A gets the finished call with its event (with the correlation id its
    // finisher logs it under); A's session stream the same (its answer small).
    record.correlation_id = Some("corr".into());
    assert_eq!(
        next_event(&mut waiting_on_a).await,
        SessionEvent::ResponseReady {
            id: "r1".into(),
            record: Some(std::sync::Arc::new(record.clone()))
        }
    );
    assert_eq!(
        next_event(&mut heard_on_a).await,
        SessionEvent::ResponseReady {
            id: "r1".into(),
            record: Some(std::sync::Arc::new(record.clone()))
        }
    );
    assert_eq!(record.response.unwrap().result, Some(json!(2)));
    // Keys stay under their prefix: another prefix is another world.
    let other = RedisStore::connect(
        &RedisSettings::primary(server.url(), "other:"),
        clock.clone(),
        limits(),
        Metrics::default(),
    )
    .await
    .unwrap();
    assert!(other.session(&code).await.unwrap().is_none());
}

/// Two replicas on one Redis count the same sessions alive and calls waiting, and a session
/// that expires is counted by one of them only.
#[tokio::test]
async fn replicas_share_the_counts_and_count_an_expiry_once() {
    let server = RedisServer::start().await;
    let (clock, hand) = Clock::manual(wall_now());
    let replica = async || {
        let metrics = Metrics::default();
        let store = RedisStore::connect(
            &RedisSettings::primary(server.url(), "m:"),
            clock.clone(),
            limits(),
            metrics.clone(),
        )
        .await
        .unwrap();
        (store, metrics)
    };
    let ((a, a_metrics), (b, b_metrics)) = (replica().await, replica().await);
    let now = clock.now();
    a.insert_session(session("ABCD2345", now, HOUR))
        .await
        .unwrap();
    let code = code_of("ABCD2345");
    a.enqueue(&code, call("r1", now, json!({})), 10, now)
        .await
        .unwrap();
    let usage = b.usage().await.unwrap();
    assert_eq!(usage.sessions, 1);
    assert_eq!(b.pending_count(&code).await.unwrap(), Some(1));
    hand.advance(3 * HOUR);
    for store in [&a, &b] {
        let usage = store.usage().await.unwrap();
        assert_eq!(usage.sessions, 0);
        assert!(store.session(&code).await.unwrap().is_none());
    }
    let counted =
        sample(&a_metrics, SESSIONS_EXPIRED).await + sample(&b_metrics, SESSIONS_EXPIRED).await;
    assert_eq!(counted, 1.0);
}

/// A store on `server` (a manual clock at the wall time) holding one session: the store, the
/// time and the session's code.
async fn one_session_on(
    server: &RedisServer,
) -> (std::sync::Arc<RedisStore>, Timestamp, SessionCode) {
    let (clock, _hand) = Clock::manual(wall_now());
    let store = RedisStore::connect(
        &RedisSettings::primary(server.url(), "t:"),
        clock.clone(),
        limits(),
        Metrics::default(),
    )
    .await
    .unwrap();
    let now = clock.now();
    store
        .insert_session(session("ABCD2345", now, HOUR))
        .await
        .unwrap();
    (store, now, code_of("ABCD2345"))
}

/// Redis restarted while the store was idle: the first operation after Redis answers again
/// succeeds. (Its connection broke with the restart: the store sends it again once on a
/// fresh connection rather than failing it, which a caller would see as a 503.)
#[tokio::test]
async fn the_first_operation_after_a_redis_restart_succeeds() {
    let mut server = RedisServer::durable().await;
    let (store, _, code) = one_session_on(&server).await;
    server.restart().await;
    // Redis answers again (the test's own connection, not the store's).
    wait_until(PATIENCE, async || {
        server
            .connection()
            .await
            .map(drop)
            .map_err(|error| error.to_string())
    })
    .await;
    for _ in 0..3 {
        let read = store.session(&code).await;
        assert!(
            matches!(read, Ok(Some(_))),
            "an operation after the restart failed: {read:?}"
        );
    }
}

/// Redis gone and back: operations fail (they do not hang), streams do not end, and they say
/// `Missed` once Redis is back, so readers look again; what was stored is still there.
#[tokio::test]
async fn a_redis_outage_fails_operations_but_ends_no_stream() {
    let mut server = RedisServer::durable().await;
    let (store, now, code) = one_session_on(&server).await;
    store
        .enqueue(&code, call("r1", now, json!({})), 10, now)
        .await
        .unwrap();
    let mut events = store.subscribe(&code).await.unwrap().unwrap();
    server.stop().await;
    let failed = tokio::time::timeout(PATIENCE, store.session(&code))
        .await
        .expect("a failing store answers in time");
    assert!(failed.is_err(), "{failed:?}");
    assert!(store.ping().await.is_err());
    server.restart().await;
    // The stream is still there and says Missed (at once after the reconnect, or by its
    // safety net).
    let event = tokio::time::timeout(PATIENCE, events.next())
        .await
        .expect("an event in time");
    assert_eq!(event, Some(SessionEvent::Missed));
    let every = Deadline::within(PATIENCE).every(Duration::from_millis(50));
    wait_until(every, async || {
        let pinged = store.ping().await;
        pinged.map_err(|_| "the store did not recover")
    })
    .await;
    assert_eq!(
        store.pending_count(&code).await.unwrap(),
        Some(1),
        "the queued call survived"
    );
    // Events flow again once the event connection is back (it reconnects on its own).
    let mut n = 1;
    let again_at_once = Deadline::within(PATIENCE).every(Duration::ZERO);
    wait_until(again_at_once, async || {
        n += 1;
        store
            .enqueue(&code, call(&format!("r{n}"), now, json!({})), 100, now)
            .await
            .unwrap();
        let heard = tokio::time::timeout(Duration::from_secs(3), async {
            while let Some(event) = events.next().await {
                if event == SessionEvent::RequestQueued {
                    return true;
                }
            }
            false
        })
        .await;
        if heard == Ok(true) {
            Ok(())
        } else {
            Err("no event after the outage")
        }
    })
    .await;
}

/// What makes the `redis_cluster_node` run of this suite prove slot locality: on a Cluster
/// node, Redis refuses a script with a `#!lua` line (as every one of the store's) that touches
/// keys of two slots, even when the node owns both.
#[tokio::test]
async fn a_cluster_node_refuses_a_script_that_strays_into_another_slot() {
    let server = RedisServer::cluster_node().await;
    let client = redis::Client::open(server.url()).unwrap();
    let mut connection = client.get_multiplexed_async_connection().await.unwrap();
    let two_slots =
        "#!lua\nredis.call('SET', KEYS[1], 1)\nredis.call('SET', '{other}:key', 1)\nreturn 1";
    let refused: redis::RedisResult<i64> = redis::cmd("EVAL")
        .arg(two_slots)
        .arg(1)
        .arg("{session}:key")
        .query_async(&mut connection)
        .await;
    let error = refused.expect_err("a script touching two slots must be refused");
    assert!(
        error.to_string().contains("slot"),
        "refused for another reason: {error}"
    );
    let one_slot =
        "#!lua\nredis.call('SET', KEYS[1], 1)\nredis.call('SET', '{session}:other', 1)\nreturn 1";
    let done: i64 = redis::cmd("EVAL")
        .arg(one_slot)
        .arg(1)
        .arg("{session}:key")
        .query_async(&mut connection)
        .await
        .unwrap();
    assert_eq!(done, 1, "keys of one slot, named or built, are served");
}

/// A store that routes (`REPLICA_URL` as `me`) on `server`, at the manual clock `clock`.
async fn routed_store(
    server: &RedisServer,
    me: &str,
    clock: &Clock,
    metrics: &Metrics,
) -> Arc<RedisStore> {
    let settings = RedisSettings {
        routing: Some(toolrelay_relay::config::Routing {
            url: me.to_owned(),
            proof: "secret".to_owned(),
        }),
        ..RedisSettings::primary(server.url(), "test:")
    };
    RedisStore::connect(&settings, clock.clone(), limits(), metrics.clone())
        .await
        .unwrap()
}

/// The next event of `events` that `wanted` picks, within the patience.
async fn next_of<T>(events: &mut EventStream, wanted: impl Fn(SessionEvent) -> Option<T>) -> T {
    tokio::time::timeout(PATIENCE, async {
        loop {
            if let Some(found) = wanted(events.next().await.expect("the stream goes on")) {
                return found;
            }
        }
    })
    .await
    .expect("the event came")
}

/// Routing on Redis (issue 41): a call that may be routed, whose session's tab is on this
/// replica, is handed to the tab and its answer told to its waiter in the process — neither
/// announced on Redis (no `PUBLISH`), both kept there; a call asked again (perhaps through
/// another replica) has its answer announced; a call not to be routed is announced as
/// before; and a call whose tab's replica cannot be reached is announced on Redis at once.
#[tokio::test]
async fn a_routed_call_is_handed_over_in_the_process_and_kept_in_redis() {
    let server = RedisServer::start().await;
    let (clock, _hand) = Clock::manual(wall_now());
    let metrics = Metrics::default();
    let me = "http://127.0.0.1:9";
    let store = routed_store(&server, me, &clock, &metrics).await;
    let now = clock.now();
    let code = code_of("ABCD2345");
    assert!(
        store
            .insert_session(session("ABCD2345", now, HOUR))
            .await
            .unwrap()
    );
    store
        .set_provider(&code, attached("tab-1", Transport::WebSocket, now))
        .await
        .unwrap();
    let mut tab = store.subscribe(&code).await.unwrap().unwrap();
    let until = Timestamp(now.0 + 1_000);
    let routed = EnqueueChecks {
        route: true,
        ..EnqueueChecks::default()
    };
    let enqueue = async |id: &str, checks: EnqueueChecks| {
        let (enqueued, _) = store
            .enqueue_checked(&code, call(id, now, json!({})), 10, until, checks)
            .await
            .unwrap();
        enqueued
    };
    let finish = async |id: &str| {
        store
            .finish(
                &code,
                id,
                RequestStatus::Completed,
                answer(id, json!(id)),
                Answerer::Connection("tab-1"),
                now,
                until,
            )
            .await
            .unwrap()
    };

    let published = server.calls_of("publish").await;
    let mut waiter = store.listen_for_answer(&code, "r1").await.unwrap();
    let queued = enqueue("r1", routed.clone()).await;
    assert!(
        matches!(&queued, Enqueued::Queued(record) if record.delivered_to.as_deref() == Some("tab-1")),
        "{queued:?}"
    );
    let handed = next_of(&mut tab, |event| match event {
        SessionEvent::CallHanded(record) => Some(record),
        _ => None,
    })
    .await;
    assert_eq!((handed.id.as_str(), handed.seq), ("r1", 1));
    let kept = store.request(&code, "r1").await.unwrap().unwrap();
    assert_eq!(
        kept.status,
        RequestStatus::Delivered,
        "queued in Redis all the same"
    );
    assert!(matches!(finish("r1").await, Finished::Finished(_)));
    let told = next_of(&mut waiter, |event| match event {
        SessionEvent::ResponseReady { record, .. } => Some(record),
        _ => None,
    })
    .await
    .expect("told with the call");
    assert_eq!(told.response.as_ref().unwrap().result, Some(json!("r1")));
    assert_eq!(
        server.calls_of("publish").await - published,
        0,
        "neither the call nor its answer announced on Redis"
    );
    let kept = store.request(&code, "r1").await.unwrap().unwrap();
    assert_eq!(kept.status, RequestStatus::Completed, "finished in Redis");

    // Asked again before its answer (perhaps through another replica): the call is announced
    // again (a replica that never handed it over — its queueing answered an error — has it
    // reach the tab this way) and its answer is announced for the waiter elsewhere.
    let published = server.calls_of("publish").await;
    assert!(matches!(
        enqueue("r2", routed.clone()).await,
        Enqueued::Queued(_)
    ));
    assert_eq!(server.calls_of("publish").await - published, 0);
    assert!(matches!(
        enqueue("r2", routed.clone()).await,
        Enqueued::Existing(_)
    ));
    assert_eq!(
        server.calls_of("publish").await - published,
        1,
        "the call again"
    );
    assert!(matches!(finish("r2").await, Finished::Finished(_)));
    assert_eq!(
        server.calls_of("publish").await - published,
        2,
        "and its answer"
    );

    // Not to be routed (its caller does not wait on this replica): announced as before.
    let published = server.calls_of("publish").await;
    assert!(matches!(
        enqueue("r3", EnqueueChecks::default()).await,
        Enqueued::Queued(_)
    ));
    assert!(matches!(finish("r3").await, Finished::Finished(_)));
    assert_eq!(server.calls_of("publish").await - published, 2);

    // The tab on a replica nobody answers at: routed there, the call falls back to Redis at
    // once — the tab's replica hears of it by its id — and that replica is passed over.
    let elsewhere = routed_store(&server, "http://127.0.0.1:1", &clock, &metrics).await;
    elsewhere
        .set_provider(&code, attached("tab-2", Transport::WebSocket, now))
        .await
        .unwrap();
    let mut moved = elsewhere.subscribe(&code).await.unwrap().unwrap();
    assert!(matches!(
        enqueue("r4", routed.clone()).await,
        Enqueued::Queued(_)
    ));
    let handed = next_of(&mut moved, |event| match event {
        SessionEvent::CallHanded(record) => Some(record),
        _ => None,
    })
    .await;
    assert_eq!(
        (handed.id.as_str(), handed.delivered_to.as_deref()),
        ("r4", Some("tab-2"))
    );
    assert_eq!(
        sample(&metrics, r#"toolrelay_routed_calls_total{way="fallback"}"#).await,
        1.0
    );
    // Passed over now: the next call is announced by the script itself.
    let published = server.calls_of("publish").await;
    assert!(matches!(enqueue("r5", routed).await, Enqueued::Queued(_)));
    assert_eq!(server.calls_of("publish").await - published, 1);
    assert_eq!(
        sample(&metrics, r#"toolrelay_routed_calls_total{way="fallback"}"#).await,
        1.0
    );
}
