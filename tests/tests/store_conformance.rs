//! The store conformance suite's cases on what a session holds, run against every store (the
//! memory store, the Redis store on a `redis-server`, on a Redis Cluster node and on a Redis
//! Cluster; `toolrelay_tests::store_fixture`): sessions, their ceiling, expiry and sliding,
//! providers and tokens, replicas' records, manifests, claim checks, subscribers, locks, MCP
//! client sessions, usage and rate budgets. The suite's cases on calls are in `store_calls.rs`;
//! the Redis store's own tests in `store_redis.rs` and `store_redis_scripts.rs`.

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use toolrelay::wire::RequestStatus;
use toolrelay_relay::store::memory::MAX_TICKETS_PER_SCOPE;
use toolrelay_relay::store::{
    Answerer, EnqueueChecks, Enqueued, Inserted, McpSessionCaps, McpSessionsFull, RateBudget,
    SessionEvent, TabState,
};
use toolrelay_relay::{SessionCode, Timestamp};
use toolrelay_tests::store_fixture::{
    HOUR, SESSIONS_EXPIRED, answer, call, claim, code_of, limits, next_event, provider, sample,
    session, wall_now, with_session,
};

/// The series counting the calls a store expired.
const CALLS_EXPIRED: &str = "toolrelay_calls_total{status=\"expired\",transport=\"none\"}";

toolrelay_tests::conformance! {
    async fn sessions_are_created_once_found_by_code_and_handle_and_deleted(fixture) {
        let now = fixture.now();
        let record = session("ABCD2345", now, HOUR);
        assert!(fixture.store.insert_session(record.clone()).await.unwrap());
        assert!(!fixture.store.insert_session(record.clone()).await.unwrap(), "the code is taken");
        let found = fixture.store.session(&record.code).await.unwrap().unwrap();
        assert_eq!(found, record);
        assert_eq!(
            fixture.store.session_by_handle("handle-ABCD2345").await.unwrap(),
            Some(record.code.clone())
        );
        assert_eq!(fixture.store.session_by_handle("handle-other").await.unwrap(), None);
        assert!(fixture.store.session(&code_of("ZZZZ2345")).await.unwrap().is_none());
        assert!(fixture.store.delete_session(&record.code).await.unwrap());
        assert!(!fixture.store.delete_session(&record.code).await.unwrap());
        assert!(fixture.store.session(&record.code).await.unwrap().is_none());
        assert_eq!(fixture.store.session_by_handle("handle-ABCD2345").await.unwrap(), None);
    }

    async fn live_sessions_stay_within_their_ceiling(fixture) {
        let now = fixture.now();
        let store = &fixture.store;
        let within = |code: &str, ttl| store.insert_session_within(session(code, now, ttl), 2);
        assert_eq!(within("AAAA2345", Duration::from_secs(60)).await.unwrap(), Inserted::Inserted);
        assert_eq!(within("BBBB2345", HOUR).await.unwrap(), Inserted::Inserted);
        // A taken code is still told apart from a full store.
        assert_eq!(within("BBBB2345", HOUR).await.unwrap(), Inserted::Taken);
        assert_eq!(within("CCCC2345", HOUR).await.unwrap(), Inserted::Full);
        assert!(store.session(&code_of("CCCC2345")).await.unwrap().is_none(), "nothing kept");
        assert_eq!(store.usage().await.unwrap().sessions, 2);
        // A session that ends, or expires, makes room.
        assert!(store.delete_session(&code_of("BBBB2345")).await.unwrap());
        assert_eq!(within("CCCC2345", HOUR).await.unwrap(), Inserted::Inserted);
        assert_eq!(within("DDDD2345", HOUR).await.unwrap(), Inserted::Full);
        fixture.advance(Duration::from_secs(61));
        let later = fixture.now();
        let record = session("DDDD2345", later, HOUR);
        assert_eq!(store.insert_session_within(record, 2).await.unwrap(), Inserted::Inserted);
        assert_eq!(store.usage().await.unwrap().sessions, 2);
    }

    async fn a_set_of_live_things_never_passes_its_ceiling(fixture) {
        let now = fixture.now();
        let store = &fixture.store;
        let later = |seconds: i64| Timestamp(now.0 + seconds * 1000);
        assert!(store.take_place("claims", "a", 2, now, later(60)).await.unwrap());
        assert!(store.take_place("claims", "b", 2, now, later(600)).await.unwrap());
        // A member with a place keeps it, and may move its expiry forward.
        assert!(store.take_place("claims", "a", 2, now, later(120)).await.unwrap());
        assert!(!store.take_place("claims", "c", 2, now, later(600)).await.unwrap());
        // Another set has its own ceiling.
        assert!(store.take_place("manifests", "c", 1, now, later(600)).await.unwrap());
        assert!(!store.take_place("manifests", "d", 1, now, later(600)).await.unwrap());
        // Once "a" expires (at 120 s, not 60 s), there is room for one more.
        fixture.advance(Duration::from_secs(90));
        assert!(!store.take_place("claims", "c", 2, fixture.now(), later(600)).await.unwrap());
        fixture.advance(Duration::from_secs(31));
        assert!(store.take_place("claims", "c", 2, fixture.now(), later(600)).await.unwrap());
        assert!(!store.take_place("claims", "d", 2, fixture.now(), later(600)).await.unwrap());
    }

    async fn a_session_expires_unless_touched_and_never_past_its_maximum(fixture) {
        let now = fixture.now();
        let record = session("ABCD2345", now, HOUR);
        fixture.store.insert_session(record.clone()).await.unwrap();
        let code = record.code.clone();
        // Sliding forwards works (by a tenth of the time to live at least), backwards does
        // nothing, past the maximum is capped.
        let later = Timestamp(record.expires_at.0 + 720_000);
        let touched = fixture.store.touch_session(&code, now, later, None).await.unwrap().unwrap();
        assert_eq!(touched.expires_at, later);
        let touched = fixture.store.touch_session(&code, now, now, None).await.unwrap().unwrap();
        assert_eq!(touched.expires_at, later, "never backwards");
        let far = Timestamp(record.max_expires_at.0 + 1_000_000);
        let touched = fixture.store.touch_session(&code, now, far, None).await.unwrap().unwrap();
        assert_eq!(touched.expires_at, record.max_expires_at, "capped");
        // A connection that is not the provider keeps nothing alive and is not recorded.
        fixture.store.set_provider(&code, provider("tab-1", now)).await.unwrap();
        fixture.advance(Duration::from_secs(5));
        let seen_at = fixture.now();
        let touched = fixture
            .store
            .touch_session(&code, seen_at, seen_at, Some("stranger"))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(touched.provider.unwrap().last_seen, now);
        let touched = fixture
            .store
            .touch_session(&code, seen_at, seen_at, Some("tab-1"))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(touched.provider.unwrap().last_seen, seen_at);
        // Past its expiry the session is gone, whatever is asked.
        fixture.advance(3 * HOUR);
        assert!(fixture.store.session(&code).await.unwrap().is_none());
        assert!(fixture.store.touch_session(&code, fixture.now(), fixture.now(), None).await.unwrap().is_none());
        assert_eq!(
            fixture.store.enqueue(&code, call("r1", fixture.now(), json!({})), 10, fixture.now()).await.unwrap(),
            Enqueued::NoSession
        );
        // And the code can be taken again.
        assert!(fixture.store.insert_session(session("ABCD2345", fixture.now(), HOUR)).await.unwrap());
    }

    async fn the_provider_is_replaced_and_cleared_only_by_itself(fixture) {
        let code = with_session(&fixture).await;
        let now = fixture.now();
        let mut events = fixture.store.subscribe(&code).await.unwrap().unwrap();
        let replaced = fixture.store.set_provider(&code, provider("tab-2", now)).await.unwrap().unwrap();
        assert_eq!(replaced.provider.unwrap().connection_id, "tab-2");
        assert_eq!(next_event(&mut events).await, SessionEvent::ProviderChanged("tab-2".into()));
        fixture.store.clear_provider(&code, "tab-1").await.unwrap();
        let session = fixture.store.session(&code).await.unwrap().unwrap();
        assert_eq!(session.provider.unwrap().connection_id, "tab-2", "an old connection clears nothing");
        fixture.store.clear_provider(&code, "tab-2").await.unwrap();
        assert!(fixture.store.session(&code).await.unwrap().unwrap().provider.is_none());
    }

    async fn a_sessions_provider_token_is_replaced_and_only_the_new_one_is_kept(fixture) {
        let code = with_session(&fixture).await;
        let before = fixture.store.session(&code).await.unwrap().unwrap();
        assert!(fixture.store.set_token(&code, "new-hash").await.unwrap());
        let after = fixture.store.session(&code).await.unwrap().unwrap();
        assert_eq!(after.token_hash, "new-hash");
        assert_ne!(before.token_hash, after.token_hash);
        assert_eq!(after.code, before.code, "nothing else changes");
        assert_eq!(after.mcp_handle, before.mcp_handle);
        assert!(!fixture.store.set_token(&code_of("ZZZZ2345"), "x").await.unwrap(), "no such session");
    }

    async fn replicas_count_as_alive_until_their_record_runs_out(fixture) {
        let now = fixture.now();
        let seconds = |n| now.plus(Duration::from_secs(n));
        let sorted = |mut live: Vec<(String, Timestamp)>| {
            live.sort();
            live
        };
        fixture.store.keep_replica("b", now, seconds(5)).await.unwrap();
        let live = fixture.store.keep_replica("a", now, seconds(10)).await.unwrap();
        assert_eq!(sorted(live), vec![("a".into(), seconds(10)), ("b".into(), seconds(5))]);
        fixture.advance(Duration::from_secs(6));
        let later = fixture.now();
        assert_eq!(fixture.store.live_replicas(later).await.unwrap(), vec![("a".into(), seconds(10))]);
        // A late record does not take a replica's life back.
        let live = fixture.store.keep_replica("a", later, seconds(8)).await.unwrap();
        assert_eq!(live, vec![("a".into(), seconds(10))]);
    }

    async fn a_refresh_slides_the_sessions_its_connections_serve_and_tells_how_the_others_stand(fixture) {
        let code = with_session(&fixture).await;
        let now = fixture.now();
        assert!(fixture.store.insert_session(session("EFGH2345", now, HOUR)).await.unwrap());
        let other = code_of("EFGH2345");
        fixture.store.set_provider(&other, provider("tab-9", now)).await.unwrap();
        // Far enough for a slide (a step of a tenth of the time to live at least).
        fixture.advance(HOUR / 2);
        let later = fixture.now();
        let until = later.plus(HOUR);
        let tabs = [
            (code.clone(), "tab-1".to_owned()),
            (other.clone(), "tab-1".to_owned()),
            (code_of("WXYZ2345"), "tab-1".to_owned()),
        ];
        let states = fixture.store.refresh(&tabs, later, Some(until)).await.unwrap();
        assert_eq!(
            states,
            vec![TabState::Serving { pending: 0, expires_at: until }, TabState::Replaced, TabState::Gone]
        );
        let served = fixture.store.session(&code).await.unwrap().unwrap();
        assert_eq!(served.expires_at, until);
        // Presence is the replica's: the refresh records nothing of the connection.
        assert_eq!(served.provider.unwrap().last_seen, now);
        let replaced = fixture.store.session(&other).await.unwrap().unwrap();
        assert_eq!(replaced.expires_at, now.plus(HOUR), "a session another connection serves is not slid");
    }

    async fn manifests_are_kept_as_json_with_a_revision_and_announced(fixture) {
        let code = with_session(&fixture).await;
        assert_eq!(fixture.store.manifest(&code).await.unwrap(), Some((0, None)));
        let mut events = fixture.store.subscribe(&code).await.unwrap().unwrap();
        // Numbers come back exactly as given (no re-encoding on the way).
        let json = r#"[{"name":"demo","big":12345678901234567890,"x":0.1000000000000000055511}]"#;
        assert_eq!(fixture.store.set_manifest(&code, json.into()).await.unwrap(), Some(1));
        assert_eq!(next_event(&mut events).await, SessionEvent::ManifestChanged);
        assert_eq!(fixture.store.manifest(&code).await.unwrap(), Some((1, Some(json.into()))));
        assert_eq!(fixture.store.set_manifest(&code, "[]".into()).await.unwrap(), Some(2));
        assert_eq!(fixture.store.session(&code).await.unwrap().unwrap().manifest_revision, 2);
        assert_eq!(fixture.store.set_manifest(&code_of("ZZZZ2345"), "[]".into()).await.unwrap(), None);
    }

    async fn claim_checks_are_scoped_expire_and_stay_within_their_budgets(fixture) {
        let now = fixture.now();
        let in_an_hour = Timestamp(now.0 + 3_600_000);
        let value = Arc::new(json!({"model": [1, 2.5, 12345678901234567890u64]}));
        fixture.store.put_ticket("scope-a", "t1", value.clone(), in_an_hour).await.unwrap();
        assert_eq!(fixture.store.ticket("scope-a", "t1").await.unwrap(), Some(value.clone()));
        assert_eq!(fixture.store.ticket("scope-b", "t1").await.unwrap(), None, "another scope");
        // Replacing a ticket does not count it twice.
        let once = fixture.store.usage().await.unwrap().ticket_bytes;
        fixture.store.put_ticket("scope-a", "t1", value.clone(), in_an_hour).await.unwrap();
        assert_eq!(fixture.store.usage().await.unwrap().ticket_bytes, once);
        // Past its expiry it is gone.
        let soon = Timestamp(now.0 + 1_000);
        fixture.store.put_ticket("scope-a", "short", value.clone(), soon).await.unwrap();
        fixture.advance(Duration::from_secs(2));
        assert_eq!(fixture.store.ticket("scope-a", "short").await.unwrap(), None);
        // A scope holds at most MAX_TICKETS_PER_SCOPE: the ones expiring first go first.
        for n in 0..=MAX_TICKETS_PER_SCOPE {
            let expires = Timestamp(in_an_hour.0 + i64::try_from(n).unwrap());
            fixture.store.put_ticket("crowded", &format!("t{n}"), Arc::new(json!(n)), expires).await.unwrap();
        }
        assert_eq!(fixture.store.ticket("crowded", "t0").await.unwrap(), None);
        assert_eq!(
            fixture.store.ticket("crowded", &format!("t{MAX_TICKETS_PER_SCOPE}")).await.unwrap(),
            Some(Arc::new(json!(MAX_TICKETS_PER_SCOPE)))
        );
        // The byte budget holds across scopes.
        let budget = limits().ticket_budget;
        for n in 0..40 {
            let big = Arc::new(json!((0..2_000).map(|i| i * n).collect::<Vec<_>>()));
            fixture.store.put_ticket(&format!("scope-{n}"), "big", big, in_an_hour).await.unwrap();
            let used = fixture.store.usage().await.unwrap().ticket_bytes;
            assert!(used <= budget, "{used} bytes after {n}");
        }
        assert!(fixture.store.ticket("scope-39", "big").await.unwrap().is_some());
    }

    async fn subscribers_hear_of_changes_and_of_the_end(fixture) {
        let code = with_session(&fixture).await;
        let now = fixture.now();
        assert!(fixture.store.subscribe(&code_of("ZZZZ2345")).await.unwrap().is_none());
        let mut first = fixture.store.subscribe(&code).await.unwrap().unwrap();
        let mut second = fixture.store.subscribe(&code).await.unwrap().unwrap();
        fixture.store.enqueue(&code, call("r1", now, json!({})), 10, now).await.unwrap();
        fixture.store.finish(&code, "r1", RequestStatus::Completed, answer("r1", json!(1)), Answerer::Relay, now, now).await.unwrap();
        for events in [&mut first, &mut second] {
            assert_eq!(next_event(events).await, SessionEvent::RequestQueued);
            assert!(matches!(
                next_event(events).await,
                SessionEvent::ResponseReady { id, .. } if id == "r1"
            ));
        }
        fixture.store.delete_session(&code).await.unwrap();
        assert_eq!(next_event(&mut first).await, SessionEvent::SessionEnded);
    }

    async fn a_lock_has_one_holder_until_released_or_run_out(fixture) {
        let now = fixture.now();
        let later = now.plus(Duration::from_secs(60));
        assert!(fixture.store.lock("mip:s1", "a", later).await.unwrap());
        assert!(!fixture.store.lock("mip:s1", "b", later).await.unwrap(), "held by a");
        assert!(fixture.store.lock("mip:s1", "a", later.plus(HOUR)).await.unwrap(), "renewed by a");
        assert!(fixture.store.lock("mip:s2", "b", later).await.unwrap(), "another key");
        fixture.store.unlock("mip:s1", "b").await.unwrap();
        assert!(!fixture.store.lock("mip:s1", "b", later).await.unwrap(), "only a releases it");
        fixture.store.unlock("mip:s1", "a").await.unwrap();
        assert!(fixture.store.lock("mip:s1", "b", later).await.unwrap(), "released");
        // A lock whose time ran out (its holder died) is free.
        let past = Timestamp(wall_now().0 - 1_000);
        assert!(fixture.store.lock("mip:s3", "a", past).await.unwrap());
        assert!(fixture.store.lock("mip:s3", "b", later).await.unwrap(), "ran out");
    }

    async fn mcp_sessions_are_kept_until_they_expire_or_are_deleted(fixture) {
        let store = &fixture.store;
        let until = fixture.now().plus(HOUR);
        let caps = McpSessionCaps { per_address: 10, total: 10 };
        assert_eq!(store.mcp_session("m1").await.unwrap(), None);
        for slot in ["p1", "p2"] {
            store.open_mcp_session(slot, "10.0.0.1", caps, until).await.unwrap().unwrap();
        }
        store.put_mcp_session("m1", "p1", "10.0.0.1", r#"{"n":12345678901234567890}"#.into(), until).await.unwrap();
        store.put_mcp_session("m2", "p2", "10.0.0.1", "two".into(), fixture.now().plus(Duration::from_secs(60))).await.unwrap();
        assert_eq!(
            store.mcp_session("m1").await.unwrap().as_deref(),
            Some(r#"{"n":12345678901234567890}"#)
        );
        store.delete_mcp_session("m1").await.unwrap();
        assert_eq!(store.mcp_session("m1").await.unwrap(), None);
        assert!(!store.touch_mcp_session("m1", until).await.unwrap(), "deleted");
        assert_eq!(store.mcp_session("m2").await.unwrap().as_deref(), Some("two"));
        // Used, it lives on from its use.
        fixture.advance(Duration::from_secs(50));
        assert!(store.touch_mcp_session("m2", fixture.now().plus(Duration::from_secs(60))).await.unwrap());
        fixture.advance(Duration::from_secs(50));
        assert_eq!(store.mcp_session("m2").await.unwrap().as_deref(), Some("two"), "touched");
        fixture.advance(Duration::from_secs(11));
        assert_eq!(store.mcp_session("m2").await.unwrap(), None, "expired");
        assert!(!store.touch_mcp_session("m2", until).await.unwrap(), "expired");
    }

    async fn mcp_sessions_are_capped_per_address_and_in_total_until_they_go(fixture) {
        let store = &fixture.store;
        let minute = fixture.now().plus(Duration::from_secs(60));
        let caps = McpSessionCaps { per_address: 2, total: 3 };
        let open = |slot: &'static str, address: &'static str| store.open_mcp_session(slot, address, caps, minute);
        open("a1", "10.0.0.1").await.unwrap().unwrap();
        open("a2", "10.0.0.1").await.unwrap().unwrap();
        assert_eq!(open("a3", "10.0.0.1").await.unwrap(), Err(McpSessionsFull::PerAddress));
        // A place taken by its session still counts; another address has its own share.
        store.put_mcp_session("s1", "a1", "10.0.0.1", "one".into(), minute).await.unwrap();
        assert_eq!(open("a3", "10.0.0.1").await.unwrap(), Err(McpSessionsFull::PerAddress));
        open("b1", "10.0.0.2").await.unwrap().unwrap();
        assert_eq!(open("c1", "10.0.0.3").await.unwrap(), Err(McpSessionsFull::Total));
        // Ended sessions and unused places free theirs.
        store.delete_mcp_session("s1").await.unwrap();
        store.delete_mcp_session("b1").await.unwrap();
        open("c1", "10.0.0.3").await.unwrap().unwrap();
        open("a3", "10.0.0.1").await.unwrap().unwrap();
        assert_eq!(open("c2", "10.0.0.3").await.unwrap(), Err(McpSessionsFull::Total));
        // Expired ones too.
        fixture.advance(Duration::from_secs(61));
        for (slot, address) in [("a4", "10.0.0.1"), ("a5", "10.0.0.1"), ("c2", "10.0.0.3")] {
            open(slot, address).await.unwrap().unwrap();
        }
    }

    async fn usage_counts_live_sessions_and_waiting_calls_and_expiries_once(fixture) {
        let (store, now) = (&fixture.store, fixture.now());
        let minute = Duration::from_secs(60);
        store.insert_session(session("AAAA2345", now, minute)).await.unwrap();
        store.insert_session(session("BBBB2345", now, 2 * minute)).await.unwrap();
        let (a, b) = (code_of("AAAA2345"), code_of("BBBB2345"));
        for id in ["a1", "a2"] {
            store.enqueue(&a, call(id, now, json!({})), 10, now).await.unwrap();
        }
        store.enqueue(&b, call("b1", now, json!({})), 10, now).await.unwrap();
        let usage = store.usage().await.unwrap();
        assert_eq!(usage.sessions, 2);
        store
            .finish(&a, "a1", RequestStatus::Completed, answer("a1", json!(1)), Answerer::Relay, now, now)
            .await
            .unwrap();
        assert_eq!(store.pending_count(&a).await.unwrap(), Some(1));
        // A minute on: session a has expired (its waiting call goes with it), b's call too.
        fixture.advance(minute + Duration::from_secs(1));
        let usage = store.usage().await.unwrap();
        assert_eq!(usage.sessions, 1);
        // Looking at b settles its call (a store may expire it lazily, when it looks).
        let b1 = store.request(&b, "b1").await.unwrap().unwrap();
        assert_eq!(b1.status, RequestStatus::Expired);
        assert!(store.session(&a).await.unwrap().is_none());
        assert!(store.session(&a).await.unwrap().is_none());
        assert_eq!(sample(&fixture.metrics, SESSIONS_EXPIRED).await, 1.0);
        assert_eq!(sample(&fixture.metrics, CALLS_EXPIRED).await, 1.0);
        // A session its provider ends did not expire.
        assert!(store.delete_session(&b).await.unwrap());
        assert_eq!(store.usage().await.unwrap().sessions, 0);
        assert_eq!(sample(&fixture.metrics, SESSIONS_EXPIRED).await, 1.0);
    }

    async fn rate_budgets_allow_a_burst_then_refill_one_unit_per_interval(fixture) {
        // 3 a minute: one unit back every 20 s.
        let budget = RateBudget::per_minute(std::num::NonZeroU32::new(3).unwrap());
        let spend = |key: &'static str| {
            let store = Arc::clone(&fixture.store);
            let now = fixture.now();
            async move { store.spend(key, budget, now).await.unwrap() }
        };
        for _ in 0..3 {
            assert_eq!(spend("a").await, None);
        }
        let wait = spend("a").await.expect("the fourth is over the budget");
        assert!(wait > Duration::from_secs(19) && wait <= Duration::from_secs(20), "{wait:?}");
        assert_eq!(spend("b").await, None, "each key has its own budget");
        // A refusal spends nothing: one interval later exactly one more unit is there.
        fixture.advance(Duration::from_secs(20));
        assert_eq!(spend("a").await, None);
        assert!(spend("a").await.is_some());
        // After a whole period of quiet, the whole burst again.
        fixture.advance(Duration::from_secs(60));
        for _ in 0..3 {
            assert_eq!(spend("a").await, None);
        }
        assert!(spend("a").await.is_some());
    }

    async fn activity_moves_a_session_s_expiry_only_by_a_tenth_of_its_time_to_live(fixture) {
        let code = with_session(&fixture).await;
        let created = fixture.store.session(&code).await.unwrap().unwrap().expires_at;
        let hour = i64::try_from(HOUR.as_millis()).unwrap();
        // Five minutes on (under a tenth of the hour): neither a touch, a call nor an answer
        // moves the expiry.
        fixture.advance(Duration::from_secs(300));
        let now = fixture.now();
        let until = now.plus(HOUR);
        let touched = fixture.store.touch_session(&code, now, until, None).await.unwrap().unwrap();
        assert_eq!(touched.expires_at, created);
        let (queued, session) = fixture
            .store
            .enqueue_checked(&code, call("r1", now, json!({})), 10, until, EnqueueChecks::default())
            .await
            .unwrap();
        assert!(matches!(queued, Enqueued::Queued(_)), "{queued:?}");
        assert_eq!(session.unwrap().expires_at, created);
        fixture.store.claim(&code, &claim("tab-1", now, HOUR)).await.unwrap();
        fixture
            .store
            .finish(&code, "r1", RequestStatus::Completed, answer("r1", json!(1)), Answerer::Connection("tab-1"), now, until)
            .await
            .unwrap();
        assert_eq!(fixture.store.session(&code).await.unwrap().unwrap().expires_at, created);
        // Seven minutes on (past a tenth): it moves, to the full time to live from now.
        fixture.advance(Duration::from_secs(120));
        let now = fixture.now();
        let touched = fixture.store.touch_session(&code, now, now.plus(HOUR), Some("tab-1")).await.unwrap().unwrap();
        assert_eq!(touched.expires_at, Timestamp(now.0 + hour));
        assert_eq!(touched.provider.unwrap().last_seen, now, "heard from, slid or not");
        assert_eq!(fixture.store.session(&code).await.unwrap().unwrap().expires_at, Timestamp(now.0 + hour));
    }

    async fn a_manifest_registered_by_many_sessions_is_theirs_until_each_changes_it(fixture) {
        let now = fixture.now();
        let codes: Vec<SessionCode> = ["MANA2345", "MANB2345", "MANC2345"].into_iter().map(code_of).collect();
        let manifest = r#"[{"name":"codap","functions":[{"name":"create","x":0.1000000000000000055511}]}]"#;
        for code in &codes {
            fixture.store.insert_session(session(code.as_str(), now, HOUR)).await.unwrap();
            assert_eq!(fixture.store.set_manifest(code, manifest.into()).await.unwrap(), Some(1));
        }
        // One session moves on, another ends: the third still has the manifest it registered.
        assert_eq!(fixture.store.set_manifest(&codes[0], "[]".into()).await.unwrap(), Some(2));
        assert!(fixture.store.delete_session(&codes[1]).await.unwrap());
        assert_eq!(fixture.store.manifest(&codes[0]).await.unwrap(), Some((2, Some("[]".into()))));
        assert_eq!(fixture.store.manifest(&codes[2]).await.unwrap(), Some((1, Some(manifest.into()))));
        // Registered again by a new session after every holder let go, it is kept again.
        fixture.store.set_manifest(&codes[2], "[]".into()).await.unwrap();
        fixture.store.insert_session(session("MAND2345", now, HOUR)).await.unwrap();
        fixture.store.set_manifest(&code_of("MAND2345"), manifest.into()).await.unwrap();
        assert_eq!(fixture.store.manifest(&code_of("MAND2345")).await.unwrap(), Some((1, Some(manifest.into()))));
    }
}
