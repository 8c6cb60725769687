//! One suite of store-level tests, run against both stores: [`MemoryStore`] and the Redis
//! store on a `redis-server` the test starts. Time is explicit: each store reads a manual
//! clock that the test moves; nothing waits on a timer. Each store counts what it expires
//! into metrics of its own, which the tests read.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use serde_json::{Value, json};
use toolrelay::wire::{RequestStatus, ToolResponse};
use toolrelay_relay::clock::ClockHand;
use toolrelay_relay::config::{RedisSettings, Topology};
use toolrelay_relay::store::memory::{MAX_TICKETS_PER_SCOPE, MemoryStore, StoreLimits};
use toolrelay_relay::store::redis::RedisStore;
use toolrelay_relay::store::{
    Answerer, BUILTIN_LEASE, Claim, EnqueueChecks, Enqueued, EventStream, Finished, Inserted,
    McpSessionCaps, McpSessionsFull, NewRequest, ProviderInfo, RateBudget, RateCharge,
    SessionEvent, SessionRecord, Store, TabState, Transport,
};
// The parts of the store's interface, for the tests that hold a store by its own type.
use toolrelay_relay::store::{BudgetStore, Reachable, SessionStore};
use toolrelay_relay::{Clock, Metrics, SessionCode, Timestamp};
use toolrelay_tests::redis::{RedisCluster, RedisServer};
use toolrelay_tests::{Deadline, PATIENCE, wait_until};

const HOUR: Duration = Duration::from_secs(3600);

/// A store, the hand of its clock, and what must live as long as it.
struct Fixture {
    store: Arc<dyn Store>,
    clock: Clock,
    hand: ClockHand,
    metrics: Metrics,
    /// The Redis server or Cluster behind the store, kept running as long as it.
    redis: Option<Box<dyn std::any::Any + Send>>,
}

impl Fixture {
    /// A session `code` for an hour, its tab on a WebSocket with a new connection id: the
    /// session's code and that id.
    async fn session_with_tab(&self, code: &str) -> (SessionCode, String) {
        let now = self.now();
        assert!(
            self.store
                .insert_session(session(code, now, HOUR))
                .await
                .unwrap()
        );
        let connection = toolrelay_relay::code::random_id();
        self.store
            .set_provider(
                &code_of(code),
                attached(&connection, Transport::WebSocket, now),
            )
            .await
            .unwrap();
        (code_of(code), connection)
    }

    /// The one Redis server behind a fixture made by [`redis`].
    fn redis_server(&self) -> &RedisServer {
        self.redis
            .as_ref()
            .and_then(|redis| redis.downcast_ref::<RedisServer>())
            .expect("a fixture on one Redis server")
    }

    fn now(&self) -> Timestamp {
        self.clock.now()
    }

    fn advance(&self, duration: Duration) {
        self.hand.advance(duration);
    }
}

fn wall_now() -> Timestamp {
    Clock::new().now()
}

async fn memory(limits: StoreLimits) -> Fixture {
    let (clock, hand) = Clock::manual(wall_now());
    let metrics = Metrics::default();
    Fixture {
        store: MemoryStore::observed(clock.clone(), limits, metrics.clone()),
        clock,
        hand,
        metrics,
        redis: None,
    }
}

async fn redis(limits: StoreLimits) -> Fixture {
    on_redis(RedisServer::start().await, limits).await
}

/// On one Redis Cluster node owning every slot: a script touching two slots fails there.
async fn cluster_node(limits: StoreLimits) -> Fixture {
    on_redis(RedisServer::cluster_node().await, limits).await
}

/// On a Redis Cluster of three primaries: sessions spread over its shards, events by
/// sharded pub/sub.
async fn cluster(limits: StoreLimits) -> Fixture {
    let cluster = RedisCluster::start().await;
    let settings = RedisSettings {
        topology: Topology::Cluster(cluster.urls().split(',').map(str::to_owned).collect()),
        ..RedisSettings::primary("", "test:")
    };
    connected(&settings, Box::new(cluster), limits).await
}

async fn on_redis(server: RedisServer, limits: StoreLimits) -> Fixture {
    let settings = RedisSettings::primary(server.url(), "test:");
    connected(&settings, Box::new(server), limits).await
}

async fn connected(
    settings: &RedisSettings,
    redis: Box<dyn std::any::Any + Send>,
    limits: StoreLimits,
) -> Fixture {
    let (clock, hand) = Clock::manual(wall_now());
    let metrics = Metrics::default();
    let store = RedisStore::connect(settings, clock.clone(), limits, metrics.clone())
        .await
        .unwrap();
    Fixture {
        store,
        clock,
        hand,
        metrics,
        redis: Some(redis),
    }
}

/// The value of the series `series` (name and labels, as written) in `metrics`.
async fn sample(metrics: &Metrics, series: &str) -> f64 {
    let text = metrics.render().await;
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("{series} is not in\n{text}"))
        .parse()
        .unwrap()
}

const SESSIONS_EXPIRED: &str = "toolrelay_sessions_expired_total";
const CALLS_EXPIRED: &str = "toolrelay_calls_total{status=\"expired\",transport=\"none\"}";

/// Defines each test once per store.
macro_rules! conformance {
    ($($(#[$meta:meta])* async fn $name:ident($fixture:ident) $body:block)*) => {
        $(
            $(#[$meta])*
            async fn $name($fixture: Fixture) $body
        )*
        mod memory_store {
            $(
                #[tokio::test]
                async fn $name() {
                    super::$name(super::memory(super::limits()).await).await;
                }
            )*
        }
        mod redis_store {
            $(
                #[tokio::test]
                async fn $name() {
                    super::$name(super::redis(super::limits()).await).await;
                }
            )*
        }
        mod redis_cluster_node {
            $(
                #[tokio::test]
                async fn $name() {
                    super::$name(super::cluster_node(super::limits()).await).await;
                }
            )*
        }
        mod redis_cluster {
            $(
                #[tokio::test]
                async fn $name() {
                    super::$name(super::cluster(super::limits()).await).await;
                }
            )*
        }
    };
}

/// The limits every test runs with: budgets small enough to reach.
fn limits() -> StoreLimits {
    StoreLimits {
        retention: HOUR,
        answer_budget: 64 * 1024,
        session_answer_budget: 48 * 1024,
        ticket_budget: 64 * 1024,
    }
}

fn code_of(text: &str) -> SessionCode {
    SessionCode::parse(text).unwrap()
}

fn session(code_text: &str, now: Timestamp, ttl: Duration) -> SessionRecord {
    let ttl = i64::try_from(ttl.as_millis()).unwrap();
    SessionRecord {
        code: code_of(code_text),
        token_hash: "ab".repeat(32),
        created_at: now,
        expires_at: Timestamp(now.0 + ttl),
        max_expires_at: Timestamp(now.0 + 3 * ttl),
        provider: None,
        manifest_revision: 0,
        mcp_handle: format!("handle-{code_text}"),
    }
}

fn call(id: &str, now: Timestamp, args: Value) -> NewRequest {
    NewRequest {
        id: id.into(),
        tool_id: Some("demo".into()),
        function_name: "echo".into(),
        args,
        created_at: now,
        deadline: Timestamp(now.0 + 60_000),
        builtin: false,
        correlation_id: Some("corr".into()),
        caller: None,
    }
}

fn answer(id: &str, result: Value) -> ToolResponse {
    ToolResponse {
        request_id: id.into(),
        success: true,
        result: Some(result),
        error: None,
    }
}

/// A provider connection that asks for its calls (polling): calls wait for its claim.
fn provider(connection: &str, now: Timestamp) -> ProviderInfo {
    attached(connection, Transport::Polling, now)
}

/// A provider connection attached by `transport`.
fn attached(connection: &str, transport: Transport, now: Timestamp) -> ProviderInfo {
    ProviderInfo {
        connection_id: connection.into(),
        transport,
        connected_at: now,
        last_seen: now,
    }
}

fn claim(connection: &str, now: Timestamp, lease: Duration) -> Claim {
    Claim {
        connection_id: connection.into(),
        now,
        lease_until: Timestamp(now.0 + i64::try_from(lease.as_millis()).unwrap()),
        limit: 10,
        redeliver: false,
    }
}

/// A session `ABCD2345` with a provider `tab-1` that claims its calls, made at the fixture's
/// now.
async fn with_session(fixture: &Fixture) -> SessionCode {
    let now = fixture.now();
    assert!(
        fixture
            .store
            .insert_session(session("ABCD2345", now, HOUR))
            .await
            .unwrap()
    );
    let code = code_of("ABCD2345");
    fixture
        .store
        .set_provider(&code, provider("tab-1", now))
        .await
        .unwrap()
        .unwrap();
    code
}

/// The next event other than the safety net's `Missed`.
async fn next_event(events: &mut EventStream) -> SessionEvent {
    tokio::time::timeout(PATIENCE, async {
        loop {
            match events.next().await {
                Some(SessionEvent::Missed) => {}
                Some(event) => return event,
                None => return SessionEvent::SessionEnded,
            }
        }
    })
    .await
    .expect("an event in time")
}

conformance! {
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

    async fn enqueue_is_idempotent_by_id_bounded_and_slides_the_expiry(fixture) {
        let code = with_session(&fixture).await;
        let now = fixture.now();
        let mut events = fixture.store.subscribe(&code).await.unwrap().unwrap();
        let args = json!({"text": "hi", "n": 12345678901234567890u64, "f": 0.1});
        let until = Timestamp(now.0 + 2 * 3_600_000);
        let Enqueued::Queued(record) =
            fixture.store.enqueue(&code, call("r1", now, args.clone()), 2, until).await.unwrap()
        else {
            panic!("not queued")
        };
        assert_eq!(next_event(&mut events).await, SessionEvent::RequestQueued);
        assert_eq!((record.status, record.args.clone(), record.seq), (RequestStatus::Queued, args.clone(), record.seq));
        assert_eq!(fixture.store.session(&code).await.unwrap().unwrap().expires_at, until);
        // The same id and call: the existing record; the same id, another call: a conflict.
        assert!(matches!(
            fixture.store.enqueue(&code, call("r1", now, args.clone()), 2, now).await.unwrap(),
            Enqueued::Existing(existing) if existing.id == "r1" && existing.args == args
        ));
        assert_eq!(
            fixture.store.enqueue(&code, call("r1", now, json!({"text": "other"})), 2, now).await.unwrap(),
            Enqueued::Conflict
        );
        // Key order does not make another call.
        let reordered: Value = serde_json::from_str(r#"{"f":0.1,"n":12345678901234567890,"text":"hi"}"#).unwrap();
        assert!(matches!(
            fixture.store.enqueue(&code, call("r1", now, reordered), 2, now).await.unwrap(),
            Enqueued::Existing(_)
        ));
        let Enqueued::Queued(second) =
            fixture.store.enqueue(&code, call("r2", now, json!({})), 2, now).await.unwrap()
        else {
            panic!("not queued")
        };
        assert!(second.seq > record.seq);
        assert_eq!(
            fixture.store.enqueue(&code, call("r3", now, json!({})), 2, now).await.unwrap(),
            Enqueued::Full
        );
        assert_eq!(fixture.store.pending_count(&code).await.unwrap(), Some(2));
        assert_eq!(fixture.store.request(&code, "r3").await.unwrap(), None);
    }

    async fn claims_go_to_the_provider_only_oldest_first_under_a_lease(fixture) {
        let code = with_session(&fixture).await;
        let now = fixture.now();
        for id in ["r1", "r2", "r3"] {
            fixture.store.enqueue(&code, call(id, now, json!({"id": id})), 10, now).await.unwrap();
        }
        let mut builtin = call("b1", now, json!({}));
        builtin.builtin = true;
        let Enqueued::Queued(builtin) = fixture.store.enqueue(&code, builtin, 10, now).await.unwrap() else {
            panic!("not queued")
        };
        assert_eq!(builtin.status, RequestStatus::Delivered, "the relay runs a built-in call");
        assert!(fixture.store.claim(&code, &claim("stranger", now, HOUR)).await.unwrap().is_empty());
        let mut two = claim("tab-1", now, Duration::from_secs(30));
        two.limit = 2;
        let claimed = fixture.store.claim(&code, &two).await.unwrap();
        let ids: Vec<_> = claimed.iter().map(|record| record.id.as_str()).collect();
        assert_eq!(ids, ["r1", "r2"]);
        assert!(claimed.iter().all(|record| record.status == RequestStatus::Delivered
            && record.delivered_to.as_deref() == Some("tab-1")
            && record.deliveries == 1
            && record.args["id"] == record.id.as_str()));
        // Under the lease only what is left; after it, everything unanswered again.
        let rest = fixture.store.claim(&code, &claim("tab-1", now, Duration::from_secs(30))).await.unwrap();
        assert_eq!(rest.iter().map(|record| record.id.as_str()).collect::<Vec<_>>(), ["r3"]);
        fixture.advance(Duration::from_secs(31));
        let again = fixture.store.claim(&code, &claim("tab-1", fixture.now(), Duration::from_secs(30))).await.unwrap();
        assert_eq!(again.len(), 3);
        assert!(again.iter().all(|record| record.deliveries == 2));
        // A new provider gets what the old one held, at once.
        fixture.store.set_provider(&code, provider("tab-2", fixture.now())).await.unwrap();
        let moved = fixture.store.claim(&code, &claim("tab-2", fixture.now(), HOUR)).await.unwrap();
        assert_eq!(moved.len(), 3);
        assert!(fixture.store.claim(&code, &claim("tab-1", fixture.now(), HOUR)).await.unwrap().is_empty());
    }

    async fn a_redelivering_claim_hands_out_again_what_its_connection_holds(fixture) {
        let code = with_session(&fixture).await;
        let now = fixture.now();
        for id in ["r1", "r2", "r3"] {
            fixture.store.enqueue(&code, call(id, now, json!({"id": id})), 10, now).await.unwrap();
        }
        let mut one = claim("tab-1", now, HOUR);
        one.limit = 1;
        assert_eq!(fixture.store.claim(&code, &one).await.unwrap().len(), 1);
        let finished = fixture.store.finish(&code, "r1", RequestStatus::Completed, answer("r1", json!(1)),
            Answerer::Connection("tab-1"), now, now.plus(HOUR)).await.unwrap();
        assert!(matches!(finished, Finished::Finished(_)), "{finished:?}");
        let mut two = claim("tab-1", now, HOUR);
        two.limit = 1;
        let held = fixture.store.claim(&code, &two).await.unwrap();
        assert_eq!(held.iter().map(|record| record.id.as_str()).collect::<Vec<_>>(), ["r2"]);
        // Under its lease, a plain claim leaves r2 alone; a redelivering one hands it out
        // again with what is queued, never the answered r1.
        let plain = fixture.store.claim(&code, &claim("tab-1", now, HOUR)).await.unwrap();
        assert_eq!(plain.iter().map(|record| record.id.as_str()).collect::<Vec<_>>(), ["r3"]);
        let mut again = claim("tab-1", now, HOUR);
        again.redeliver = true;
        let redelivered = fixture.store.claim(&code, &again).await.unwrap();
        assert_eq!(redelivered.iter().map(|record| record.id.as_str()).collect::<Vec<_>>(), ["r2", "r3"]);
        assert!(redelivered.iter().all(|record| record.delivered_to.as_deref() == Some("tab-1")));
        // Only to the session's provider, and never past a call's deadline.
        let mut stranger = claim("stranger", now, HOUR);
        stranger.redeliver = true;
        assert!(fixture.store.claim(&code, &stranger).await.unwrap().is_empty());
        fixture.advance(Duration::from_secs(61));
        let mut late = claim("tab-1", fixture.now(), HOUR);
        late.redeliver = true;
        assert!(fixture.store.claim(&code, &late).await.unwrap().is_empty());
    }

    async fn the_first_answer_wins_and_answers_are_kept_in_queue_order(fixture) {
        let code = with_session(&fixture).await;
        let now = fixture.now();
        for id in ["r1", "r2"] {
            fixture.store.enqueue(&code, call(id, now, json!({})), 10, now).await.unwrap();
        }
        let mut events = fixture.store.subscribe(&code).await.unwrap().unwrap();
        let mut waiting_r1 = fixture.store.listen_for_answer(&code, "r1").await.unwrap();
        let mut waiting_r2 = fixture.store.listen_for_answer(&code, "r2").await.unwrap();
        let result = json!({"n": 12345678901234567890u64, "x": 0.30000000000000004, "s": "é\u{0}"});
        let until = Timestamp(now.0 + 2 * 3_600_000);
        let Finished::Finished(record) = fixture
            .store
            .finish(&code, "r2", RequestStatus::Completed, answer("r2", result.clone()), Answerer::Relay, now, until)
            .await
            .unwrap()
        else {
            panic!("not finished")
        };
        // The finished call comes with its waiter's event: a waiter need not read it. The
        // session's stream hears of it too, without its answer (how it ended: a tab learns of
        // a cancelled call without reading it); a waiter for another call does not.
        assert_eq!(
            next_event(&mut waiting_r2).await,
            SessionEvent::ResponseReady { id: "r2".into(), record: Some(Box::new(record.clone())) }
        );
        assert_eq!(
            next_event(&mut events).await,
            SessionEvent::ResponseReady { id: "r2".into(), record: Some(Box::new(record.without_answer())) }
        );
        assert_eq!(
            futures::FutureExt::now_or_never(waiting_r1.next()),
            None,
            "a waiter woken by another call's answer"
        );
        assert_eq!(record.status, RequestStatus::Completed);
        assert_eq!(record.response.as_ref().unwrap().result, Some(result.clone()));
        assert_eq!(fixture.store.session(&code).await.unwrap().unwrap().expires_at, until);
        assert!(matches!(
            fixture.store.finish(&code, "r2", RequestStatus::Failed, answer("r2", json!(1)), Answerer::Relay, now, now).await.unwrap(),
            Finished::AlreadyFinished(kept) if kept.response.as_ref().unwrap().result == Some(result.clone())
        ));
        assert_eq!(
            fixture.store.finish(&code, "nope", RequestStatus::Completed, answer("nope", json!(1)), Answerer::Relay, now, now).await.unwrap(),
            Finished::NoRequest
        );
        fixture.store.finish(&code, "r1", RequestStatus::Completed, answer("r1", json!(1)), Answerer::Relay, now, now).await.unwrap();
        let responses = fixture.store.responses(&code, None).await.unwrap().unwrap();
        assert_eq!(responses.iter().map(|r| r.request_id.as_str()).collect::<Vec<_>>(), ["r1", "r2"]);
        assert_eq!(fixture.store.pending_count(&code).await.unwrap(), Some(0));
        // A finished call is never handed out again.
        assert!(fixture.store.claim(&code, &claim("tab-1", now, HOUR)).await.unwrap().is_empty());
        // Its id still identifies it.
        assert!(matches!(
            fixture.store.enqueue(&code, call("r1", now, json!({})), 10, now).await.unwrap(),
            Enqueued::Existing(existing) if existing.status == RequestStatus::Completed
        ));
    }

    async fn a_finished_call_is_kept_for_the_retention_time_then_gone_and_its_id_free(fixture) {
        let code = with_session(&fixture).await;
        let finished_at = fixture.now();
        fixture.store.enqueue(&code, call("r1", finished_at, json!({})), 10, finished_at).await.unwrap();
        fixture
            .store
            .finish(&code, "r1", RequestStatus::Completed, answer("r1", json!(1)), Answerer::Relay, finished_at, finished_at)
            .await
            .unwrap();
        // The session lives on (its tab keeps it alive) past the call's retention time.
        let keep_alive = |fixture: &Fixture| {
            let now = fixture.now();
            let store = fixture.store.clone();
            let code = code.clone();
            async move { store.touch_session(&code, now, now.plus(HOUR), None).await.unwrap().unwrap() }
        };
        fixture.advance(HOUR - Duration::from_secs(1));
        keep_alive(&fixture).await;
        assert!(fixture.store.request(&code, "r1").await.unwrap().is_some(), "kept within the retention");
        fixture.advance(Duration::from_secs(1));
        keep_alive(&fixture).await;
        assert!(fixture.store.request(&code, "r1").await.unwrap().is_none(), "gone past the retention");
        assert!(fixture.store.responses(&code, None).await.unwrap().unwrap().is_empty());
        // Its id may name a new call, even a different one.
        let now = fixture.now();
        assert!(matches!(
            fixture.store.enqueue(&code, call("r1", now, json!({"again": true})), 10, now).await.unwrap(),
            Enqueued::Queued(record) if record.status != RequestStatus::Completed
        ));
        assert_eq!(fixture.store.pending_count(&code).await.unwrap(), Some(1));
    }

    async fn a_call_past_its_deadline_expires_and_refuses_a_late_answer(fixture) {
        let code = with_session(&fixture).await;
        let now = fixture.now();
        fixture.store.enqueue(&code, call("r1", now, json!({})), 10, now).await.unwrap();
        fixture.store.claim(&code, &claim("tab-1", now, HOUR)).await.unwrap();
        fixture.advance(Duration::from_secs(61));
        let later = fixture.now();
        let record = fixture.store.request(&code, "r1").await.unwrap().unwrap();
        assert_eq!(record.status, RequestStatus::Expired);
        assert_eq!(record.response.unwrap().error.unwrap().code, "request_expired");
        assert!(matches!(
            fixture.store.finish(&code, "r1", RequestStatus::Completed, answer("r1", json!(1)), Answerer::Relay, later, later).await.unwrap(),
            Finished::AlreadyFinished(kept) if kept.status == RequestStatus::Expired
        ));
        assert_eq!(fixture.store.pending_count(&code).await.unwrap(), Some(0));
        assert!(fixture.store.claim(&code, &claim("tab-1", later, HOUR)).await.unwrap().is_empty());
    }

    async fn answers_stay_within_their_budget_and_evicted_calls_are_still_known(fixture) {
        let code = with_session(&fixture).await;
        let now = fixture.now();
        let budget = limits().answer_budget;
        for n in 0..20 {
            let id = format!("r{n}");
            fixture.store.enqueue(&code, call(&id, now, json!({})), 100, now).await.unwrap();
            fixture
                .store
                .finish(&code, &id, RequestStatus::Completed, answer(&id, json!("x".repeat(8 * 1024))), Answerer::Relay, now, now)
                .await
                .unwrap();
            let used = fixture.store.usage().await.unwrap().answer_bytes;
            assert!(used <= budget, "{used} bytes after {n}");
        }
        assert!(fixture.store.usage().await.unwrap().answer_bytes > budget / 2);
        let oldest = fixture.store.request(&code, "r0").await.unwrap().unwrap();
        assert!(oldest.evicted && oldest.response.is_none());
        assert_eq!(oldest.status, RequestStatus::Completed);
        assert!(matches!(
            fixture.store.enqueue(&code, call("r0", now, json!({})), 100, now).await.unwrap(),
            Enqueued::Existing(record) if record.evicted
        ));
        let newest = fixture.store.request(&code, "r19").await.unwrap().unwrap();
        assert!(!newest.evicted && newest.response.is_some());
        // Ending the session gives its bytes back.
        fixture.store.delete_session(&code).await.unwrap();
        assert_eq!(fixture.store.usage().await.unwrap().answer_bytes, 0);
    }

    async fn a_session_over_its_share_of_the_answer_budget_evicts_its_own_oldest_answers(fixture) {
        let now = fixture.now();
        let share = limits().session_answer_budget;
        let quiet = code_of("QUIET234");
        let noisy = code_of("NOISY234");
        for code in [&quiet, &noisy] {
            let record = session(code.as_str(), now, HOUR);
            assert!(fixture.store.insert_session(record).await.unwrap());
        }
        let answered = |code: &SessionCode, id: String, bytes: usize| {
            let store = Arc::clone(&fixture.store);
            let code = code.clone();
            async move {
                store.enqueue(&code, call(&id, now, json!({})), 100, now).await.unwrap();
                let answer = answer(&id, json!("x".repeat(bytes)));
                let finished = store
                    .finish(&code, &id, RequestStatus::Completed, answer, Answerer::Relay, now, now)
                    .await
                    .unwrap();
                assert!(matches!(finished, Finished::Finished(_)), "{finished:?}");
            }
        };
        // A quiet session's two small answers, then a noisy one's flood of larger ones: within
        // the budget it has room for, but over the noisy session's share.
        for n in 0..2 {
            answered(&quiet, format!("q{n}"), 2 * 1024).await;
        }
        let quiet_bytes = fixture.store.usage().await.unwrap().answer_bytes;
        for n in 0..20 {
            answered(&noisy, format!("n{n}"), 8 * 1024).await;
            let noisy_bytes = fixture.store.usage().await.unwrap().answer_bytes - quiet_bytes;
            assert!(noisy_bytes <= share, "the noisy session keeps {noisy_bytes} bytes after {n}");
        }
        // The quiet session lost nothing.
        for n in 0..2 {
            let kept = fixture.store.request(&quiet, &format!("q{n}")).await.unwrap().unwrap();
            assert!(!kept.evicted && kept.response.is_some(), "q{n} was evicted");
        }
        assert_eq!(fixture.store.responses(&quiet, None).await.unwrap().unwrap().len(), 2);
        // The noisy one kept its newest answers, within its share, and lost its oldest.
        let mut evicted = Vec::new();
        for n in 0..20 {
            let record = fixture.store.request(&noisy, &format!("n{n}")).await.unwrap().unwrap();
            assert_eq!(record.status, RequestStatus::Completed);
            evicted.push(record.evicted);
        }
        let kept = evicted.iter().filter(|evicted| !**evicted).count();
        assert!((3..=6).contains(&kept), "{kept} answers kept: {evicted:?}");
        assert!(evicted[..20 - kept].iter().all(|evicted| *evicted), "oldest first: {evicted:?}");
        // Ending the noisy session gives its bytes back, and its share counts from nothing.
        fixture.store.delete_session(&noisy).await.unwrap();
        assert_eq!(fixture.store.usage().await.unwrap().answer_bytes, quiet_bytes);
    }

    async fn a_tab_answers_only_the_calls_delivered_to_it_and_never_a_builtin_one(fixture) {
        let code = with_session(&fixture).await;
        let now = fixture.now();
        for id in ["r1", "r2", "r3"] {
            fixture.store.enqueue(&code, call(id, now, json!({})), 10, now).await.unwrap();
        }
        let mut builtin = call("b1", now, json!({}));
        builtin.builtin = true;
        fixture.store.enqueue(&code, builtin, 10, now).await.unwrap();
        assert_eq!(fixture.store.claim(&code, &claim("tab-1", now, HOUR)).await.unwrap().len(), 3);
        fixture.store.enqueue(&code, call("r4", now, json!({})), 10, now).await.unwrap();
        let finish = |id: &'static str, answerer: Answerer<'static>| {
            let store = Arc::clone(&fixture.store);
            let code = code.clone();
            async move {
                let answer = answer(id, json!("forged"));
                store
                    .finish(&code, id, RequestStatus::Completed, answer, answerer, now, now)
                    .await
                    .unwrap()
            }
        };
        // Refused, and nothing changed: a call delivered to another connection, one not
        // delivered yet, and the relay's own call, whoever asks.
        let refused = [
            ("r1", Answerer::Connection("tab-2")),
            ("r4", Answerer::Connection("tab-1")),
            ("r4", Answerer::Provider),
            ("b1", Answerer::Connection("tab-1")),
            ("b1", Answerer::Connection("relay")),
            ("b1", Answerer::Provider),
        ];
        for (id, answerer) in refused {
            assert_eq!(finish(id, answerer).await, Finished::NotDelivered, "{id} by {answerer:?}");
        }
        for (id, status) in [
            ("r1", RequestStatus::Delivered),
            ("r4", RequestStatus::Queued),
            ("b1", RequestStatus::Delivered),
        ] {
            let record = fixture.store.request(&code, id).await.unwrap().unwrap();
            assert_eq!((record.status, record.response), (status, None), "{id}");
        }
        assert_eq!(fixture.store.pending_count(&code).await.unwrap(), Some(5));
        // Accepted: the connection the call was delivered to, and the current provider for
        // the calls delivered to it (an answer posted over HTTP).
        assert!(matches!(finish("r1", Answerer::Connection("tab-1")).await, Finished::Finished(_)));
        assert!(matches!(finish("r2", Answerer::Provider).await, Finished::Finished(_)));
        // A call the next provider took over is its own, no longer the old connection's.
        fixture.store.set_provider(&code, provider("tab-2", now)).await.unwrap();
        assert_eq!(finish("r3", Answerer::Provider).await, Finished::NotDelivered);
        let moved = fixture.store.claim(&code, &claim("tab-2", now, HOUR)).await.unwrap();
        assert_eq!(moved.iter().map(|record| record.id.as_str()).collect::<Vec<_>>(), ["r3", "r4"]);
        assert_eq!(finish("r3", Answerer::Connection("tab-1")).await, Finished::NotDelivered);
        assert!(matches!(finish("r3", Answerer::Connection("tab-2")).await, Finished::Finished(_)));
        // A repeated answer from the right connection is told the call is answered.
        assert!(matches!(finish("r3", Answerer::Provider).await, Finished::AlreadyFinished(_)));
        // The relay answers its own call.
        let Finished::Finished(record) = finish("b1", Answerer::Relay).await else {
            panic!("the relay's answer to its own call was refused")
        };
        assert_eq!(record.response.unwrap().result, Some(json!("forged")));
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

    async fn a_checked_enqueue_spends_the_charge_and_queues_only_at_the_known_manifest(fixture) {
        let code = with_session(&fixture).await;
        let now = fixture.now();
        let until = Timestamp(now.0 + 2 * 3_600_000);
        assert_eq!(fixture.store.set_manifest(&code, "[]".into()).await.unwrap(), Some(1));
        let charge = RateCharge {
            key: "calls:192.0.2.1:{ABCD2345}".into(),
            budget: RateBudget::per_minute(std::num::NonZeroU32::new(2).unwrap()),
        };
        let checks = |revision| EnqueueChecks { manifest_revision: Some(revision), charge: Some(charge.clone()), ..EnqueueChecks::default() };
        // Checked against revision 0, the manifest moved on: nothing queued, the session told.
        let (stale, session) = fixture
            .store
            .enqueue_checked(&code, &call("r1", now, json!({})), 10, until, checks(0))
            .await
            .unwrap();
        assert_eq!(stale, Enqueued::StaleManifest);
        let session = session.expect("the session");
        assert_eq!(session.manifest_revision, 1);
        assert_eq!(session.provider.as_ref().unwrap().connection_id, "tab-1");
        assert_eq!(fixture.store.request(&code, "r1").await.unwrap(), None);
        // At the current revision it is queued, with the session as it is after (slid).
        let (queued, session) = fixture
            .store
            .enqueue_checked(&code, &call("r1", now, json!({})), 10, until, checks(1))
            .await
            .unwrap();
        assert!(matches!(queued, Enqueued::Queued(ref record) if record.id == "r1"), "{queued:?}");
        assert_eq!(session.unwrap().expires_at, until);
        // Two units a minute, both spent (the stale attempt cost one too): the third waits.
        let (limited, session) = fixture
            .store
            .enqueue_checked(&code, &call("r2", now, json!({})), 10, until, checks(1))
            .await
            .unwrap();
        let Enqueued::RateLimited(wait) = limited else { panic!("not limited: {limited:?}") };
        assert!(wait > Duration::ZERO && wait <= Duration::from_secs(30), "{wait:?}");
        assert_eq!(session, None);
        assert_eq!(fixture.store.request(&code, "r2").await.unwrap(), None);
        // The budget is the same one `spend` keeps.
        assert!(fixture.store.spend(&charge.key, charge.budget, fixture.now()).await.unwrap().is_some());
        // An unknown session: nothing queued, no session.
        let (none, session) = fixture
            .store
            .enqueue_checked(&code_of("ZZZZ2345"), &call("r3", now, json!({})), 10, until, EnqueueChecks::default())
            .await
            .unwrap();
        assert_eq!((none, session), (Enqueued::NoSession, None));
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

    async fn a_built_in_call_is_leased_to_one_run_and_taken_over_when_the_lease_runs_out(fixture) {
        let code = with_session(&fixture).await;
        let now = fixture.now();
        let mut request = call("b1", now, json!({"plantumlCode": "A -> B"}));
        request.builtin = true;
        let Enqueued::Queued(queued) = fixture.store.enqueue(&code, request, 10, now).await.unwrap()
        else {
            panic!("not queued")
        };
        // Queued, it is held for the relay for one lease, and no tab ever gets it.
        assert_eq!(queued.status, RequestStatus::Delivered);
        assert_eq!(queued.delivered_to.as_deref(), Some("relay"));
        assert_eq!(queued.lease_until, Some(now.plus(BUILTIN_LEASE)));
        assert_eq!(queued.deliveries, 1);
        assert!(!queued.is_orphaned_builtin(now));
        assert!(fixture.store.claim(&code, &claim("tab-1", now, HOUR)).await.unwrap().is_empty());
        let lease = |holder: &'static str, now: Timestamp| {
            fixture.store.lease_builtin(&code, "b1", holder, now, now.plus(BUILTIN_LEASE))
        };
        // The replica that queued it runs it: the first run, not a takeover.
        let run = lease("a/1", now).await.unwrap().expect("leased");
        assert_eq!((run.delivered_to.as_deref(), run.deliveries), (Some("a/1"), 1));
        assert!(lease("b/1", now).await.unwrap().is_none(), "held by a/1");
        // Renewed a third of the way, it holds past the first lease.
        fixture.advance(BUILTIN_LEASE / 3);
        let renewed = lease("a/1", fixture.now()).await.unwrap().expect("renewed");
        assert_eq!((renewed.lease_until, renewed.deliveries), (Some(fixture.now().plus(BUILTIN_LEASE)), 1));
        fixture.advance(BUILTIN_LEASE - Duration::from_millis(1));
        assert!(lease("b/1", fixture.now()).await.unwrap().is_none(), "still held");
        // a/1 is gone: once its lease runs out, the call is orphaned and b/1 takes it over.
        fixture.advance(Duration::from_millis(1));
        let now = fixture.now();
        let orphaned = fixture.store.request(&code, "b1").await.unwrap().unwrap();
        assert!(orphaned.is_orphaned_builtin(now), "{orphaned:?}");
        let taken = lease("b/1", now).await.unwrap().expect("taken over");
        assert_eq!((taken.delivered_to.as_deref(), taken.deliveries), (Some("b/1"), 2));
        assert!(lease("a/1", now).await.unwrap().is_none(), "a/1 lost it");
        // Answered, it is leased to nobody.
        fixture
            .store
            .finish(&code, "b1", RequestStatus::Completed, answer("b1", json!({"ok": true})), Answerer::Relay, now, now)
            .await
            .unwrap();
        assert!(lease("b/1", now).await.unwrap().is_none());
        assert!(!fixture.store.request(&code, "b1").await.unwrap().unwrap().is_orphaned_builtin(now));
        // A tab's call is never leased as a built-in one.
        fixture.store.enqueue(&code, call("t1", now, json!({})), 10, now).await.unwrap();
        assert!(fixture.store.lease_builtin(&code, "t1", "a/1", now, now.plus(BUILTIN_LEASE)).await.unwrap().is_none());
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

    async fn a_call_for_a_pushing_connection_is_handed_to_it_at_enqueue(fixture) {
        let now = fixture.now();
        let pushing = [("ws", Transport::WebSocket), ("sse", Transport::Sse), ("grpc", Transport::Grpc)];
        for (n, (connection, transport)) in pushing.into_iter().enumerate() {
            let code = code_of(&format!("PUSH{}234", ["A", "B", "C"][n]));
            fixture.store.insert_session(session(code.as_str(), now, HOUR)).await.unwrap();
            fixture.store.set_provider(&code, attached(connection, transport, now)).await.unwrap().unwrap();
            let mut events = fixture.store.subscribe(&code).await.unwrap().unwrap();
            let Enqueued::Queued(record) =
                fixture.store.enqueue(&code, call("r1", now, json!({"x": 1})), 10, now).await.unwrap()
            else {
                panic!("not queued")
            };
            // Queued delivered to the connection, under a lease as long as the call lives.
            assert_eq!(record.status, RequestStatus::Delivered, "{transport:?}");
            assert_eq!(record.delivered_to.as_deref(), Some(connection));
            assert_eq!(record.lease_until, Some(record.deadline));
            assert_eq!((record.deliveries, record.args.clone()), (1, json!({"x": 1})));
            // Announced whole: its connection forwards it without a claim.
            assert_eq!(next_event(&mut events).await, SessionEvent::CallHanded(Box::new(record.clone())));
            assert_eq!(fixture.store.request(&code, "r1").await.unwrap(), Some(record.clone()));
            assert!(fixture.store.claim(&code, &claim(connection, now, HOUR)).await.unwrap().is_empty());
            // Its connection answers it; a connection that takes over claims it as before.
            fixture.store.enqueue(&code, call("r2", now, json!({})), 10, now).await.unwrap();
            let Finished::Finished(_) = fixture
                .store
                .finish(&code, "r1", RequestStatus::Completed, answer("r1", json!(1)), Answerer::Connection(connection), now, now)
                .await
                .unwrap()
            else {
                panic!("the connection it was handed to could not answer it")
            };
            fixture.store.set_provider(&code, provider("next", now)).await.unwrap();
            let moved = fixture.store.claim(&code, &claim("next", now, HOUR)).await.unwrap();
            assert_eq!(moved.iter().map(|record| (record.id.as_str(), record.deliveries)).collect::<Vec<_>>(), [("r2", 2)]);
        }
        // A polling provider, or none: queued for a claim, announced as queued.
        let code = with_session(&fixture).await;
        let mut events = fixture.store.subscribe(&code).await.unwrap().unwrap();
        let Enqueued::Queued(polled) = fixture.store.enqueue(&code, call("p1", now, json!({})), 10, now).await.unwrap() else {
            panic!("not queued")
        };
        assert_eq!((polled.status, polled.delivered_to, polled.deliveries), (RequestStatus::Queued, None, 0));
        assert_eq!(next_event(&mut events).await, SessionEvent::RequestQueued);
        fixture.store.clear_provider(&code, "tab-1").await.unwrap();
        let Enqueued::Queued(unserved) = fixture.store.enqueue(&code, call("p2", now, json!({})), 10, now).await.unwrap() else {
            panic!("not queued")
        };
        assert_eq!((unserved.status, unserved.delivered_to), (RequestStatus::Queued, None));
        assert_eq!(next_event(&mut events).await, SessionEvent::RequestQueued);
        // A built-in call is never handed to a tab, whatever its transport.
        fixture.store.set_provider(&code, attached("ws", Transport::WebSocket, now)).await.unwrap();
        let _ = next_event(&mut events).await;
        let mut builtin = call("b1", now, json!({}));
        builtin.builtin = true;
        let Enqueued::Queued(builtin) = fixture.store.enqueue(&code, builtin, 10, now).await.unwrap() else {
            panic!("not queued")
        };
        assert_eq!(builtin.delivered_to.as_deref(), Some("relay"));
        assert_eq!(next_event(&mut events).await, SessionEvent::RequestQueued);
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
            .enqueue_checked(&code, &call("r1", now, json!({})), 10, until, EnqueueChecks::default())
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

    async fn both_stores_evict_the_same_answers_for_the_same_calls(fixture) {
        let now = fixture.now();
        let share = limits().session_answer_budget;
        let (quiet, noisy) = (code_of("QUIET234"), code_of("NOISY234"));
        for code in [&quiet, &noisy] {
            assert!(fixture.store.insert_session(session(code.as_str(), now, HOUR)).await.unwrap());
        }
        // Answers of assorted sizes, some failed, within the total budget but over the noisy
        // session's share; the quiet one's stay.
        let sizes = [9_000, 200, 14_000, 3_000, 11, 20_000, 700, 6_500, 12_000, 11, 5_000, 16_000];
        let mut kept: Vec<(String, usize)> = Vec::new();
        let mut expected_evicted = Vec::new();
        let mut evicted_records = 0;
        let mut quiet_bytes = 0;
        for (n, bytes) in sizes.iter().enumerate() {
            for (code, id) in [(&quiet, format!("q{n}")), (&noisy, format!("n{n}"))] {
                let bytes = if code == &quiet { 11 } else { *bytes };
                fixture.store.enqueue(code, call(&id, now, json!({})), 100, now).await.unwrap();
                let response = if n % 5 == 4 {
                    ToolResponse {
                        request_id: id.clone(),
                        success: false,
                        result: None,
                        error: Some(toolrelay::wire::ToolError { code: "tool_error".into(), message: "e".repeat(bytes) }),
                    }
                } else {
                    answer(&id, json!("x".repeat(bytes)))
                };
                let cost = toolrelay_relay::store::rules::answer_cost(&response);
                let status = if response.success { RequestStatus::Completed } else { RequestStatus::Failed };
                fixture.store.finish(code, &id, status, response, Answerer::Relay, now, now).await.unwrap();
                if code == &quiet {
                    quiet_bytes += cost;
                    continue;
                }
                // The rule: past its share, the session's oldest answers go first; an evicted
                // call's record still costs what a record does.
                kept.push((id, cost));
                while kept.iter().map(|(_, cost)| cost).sum::<usize>() + evicted_records > share {
                    let (id, _) = kept.remove(0);
                    evicted_records += toolrelay_relay::store::rules::expired_cost(&id);
                    expected_evicted.push(id);
                }
            }
        }
        let mut evicted = Vec::new();
        for n in 0..sizes.len() {
            let record = fixture.store.request(&noisy, &format!("n{n}")).await.unwrap().unwrap();
            if record.evicted {
                evicted.push(record.id);
            }
            let quiet_one = fixture.store.request(&quiet, &format!("q{n}")).await.unwrap().unwrap();
            assert!(!quiet_one.evicted, "{}", quiet_one.id);
        }
        assert_eq!(evicted, expected_evicted);
        // Each answer costs the same in both stores: the usage is the sum of the rule's costs.
        let noisy_bytes: usize = kept.iter().map(|(_, cost)| cost).sum();
        assert_eq!(
            fixture.store.usage().await.unwrap().answer_bytes,
            quiet_bytes + noisy_bytes + evicted_records
        );
        let answered: Vec<String> = fixture
            .store
            .responses(&noisy, None)
            .await
            .unwrap()
            .unwrap()
            .into_iter()
            .map(|response| response.request_id)
            .collect();
        assert_eq!(answered, kept.into_iter().map(|(id, _)| id).collect::<Vec<_>>());
    }

    async fn both_stores_evict_the_oldest_answers_across_sessions_when_over_the_budget(fixture) {
        use toolrelay_relay::store::rules::{answer_cost, expired_cost};
        // Three sessions answer in turn, each well within its share, together past the whole
        // budget: the answers that go are the oldest of all, whichever session holds them.
        let budget = limits().answer_budget;
        let codes: Vec<SessionCode> = ["OLDA2345", "OLDB2345", "OLDC2345"].into_iter().map(code_of).collect();
        for code in &codes {
            assert!(fixture.store.insert_session(session(code.as_str(), fixture.now(), HOUR)).await.unwrap());
        }
        let mut kept: Vec<(SessionCode, String, usize)> = Vec::new();
        for n in 0..6 {
            for (i, code) in codes.iter().enumerate() {
                let (id, now) = (format!("a{n}"), fixture.now());
                fixture.store.enqueue(code, call(&id, now, json!({})), 100, now).await.unwrap();
                let response = answer(&id, json!("x".repeat(3_500 + 500 * i)));
                kept.push((code.clone(), id.clone(), answer_cost(&response)));
                fixture.store.finish(code, &id, RequestStatus::Completed, response, Answerer::Relay, now, now).await.unwrap();
                fixture.advance(Duration::from_millis(1));
            }
        }
        // The rule: the oldest answers go until what is kept fits; an evicted call's record
        // still costs what a record does.
        let (mut expected, mut evicted_records) = (Vec::new(), 0);
        while kept.iter().map(|(_, _, cost)| cost).sum::<usize>() + evicted_records > budget {
            let (code, id, _) = kept.remove(0);
            evicted_records += expired_cost(&id);
            expected.push((code, id));
        }
        assert!(expected.len() >= 3, "the calls should pass the budget by a few answers");
        // (A Redis replica keeps the total by its trim, which `usage` runs first.)
        assert_eq!(
            fixture.store.usage().await.unwrap().answer_bytes,
            kept.iter().map(|(_, _, cost)| cost).sum::<usize>() + evicted_records
        );
        let mut evicted = Vec::new();
        for n in 0..6 {
            for code in &codes {
                let record = fixture.store.request(code, &format!("a{n}")).await.unwrap().unwrap();
                assert_eq!(record.evicted, record.response.is_none(), "{}", record.id);
                if record.evicted {
                    evicted.push((code.clone(), record.id));
                }
            }
        }
        assert_eq!(evicted, expected);
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
    // finisher logs it under); A's session stream the call without its answer.
    record.correlation_id = Some("corr".into());
    assert_eq!(
        next_event(&mut waiting_on_a).await,
        SessionEvent::ResponseReady {
            id: "r1".into(),
            record: Some(Box::new(record.clone()))
        }
    );
    assert_eq!(
        next_event(&mut heard_on_a).await,
        SessionEvent::ResponseReady {
            id: "r1".into(),
            record: Some(Box::new(record.without_answer()))
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

/// What a finished call really keeps in Redis is what the answer budget counts for it
/// (`rules::answer_cost`), and 30,000 finished calls over 30 sessions stay within a small
/// budget: records and answers together, `used_memory` measured.
#[tokio::test]
async fn finished_calls_in_redis_cost_what_the_budget_counts() {
    use toolrelay_relay::store::rules;
    const SESSIONS: usize = 30;
    const CALLS: usize = 1000;
    let budget = 1024 * 1024;
    let fixture = redis(StoreLimits {
        retention: HOUR,
        answer_budget: budget,
        session_answer_budget: budget / 8,
        ticket_budget: 64 * 1024,
    })
    .await;
    let server = fixture.redis_server();
    let now = fixture.now();
    let codes: Vec<SessionCode> = (0..SESSIONS).map(|_| SessionCode::generate()).collect();
    for code in &codes {
        let mut record = session(code.as_str(), now, HOUR);
        record.mcp_handle = format!("handle-{}", code.as_str());
        assert!(fixture.store.insert_session(record).await.unwrap());
    }
    let before = server.used_memory().await;
    // One session first, below its share: what one finished call with an 11-byte answer
    // keeps, against what it is counted at.
    let first = &codes[0];
    let small = answer("r", json!("hello world"));
    let counted = rules::answer_cost(&ToolResponse {
        request_id: "c-0000".into(),
        ..small.clone()
    });
    let finish_all = |code: SessionCode, from: usize, to: usize| {
        let store = fixture.store.clone();
        async move {
            for n in from..to {
                let id = format!("c-{n:04}");
                store
                    .enqueue(&code, call(&id, now, json!({"n": n})), 100, now)
                    .await
                    .unwrap();
                let answer = ToolResponse {
                    request_id: id.clone(),
                    ..answer("r", json!("hello world"))
                };
                let finished = store
                    .finish(
                        &code,
                        &id,
                        RequestStatus::Completed,
                        answer,
                        Answerer::Relay,
                        now,
                        now,
                    )
                    .await
                    .unwrap();
                assert!(matches!(finished, Finished::Finished(_)), "{finished:?}");
            }
        }
    };
    // (Measured as a slope, past the first 100: Redis's fixed costs of the first few keys,
    // its dictionaries' and buffers' first growth, are no call's.)
    finish_all(first.clone(), 0, 100).await;
    let at_100 = server.used_memory().await;
    finish_all(first.clone(), 100, 500).await;
    let per_call = (server.used_memory().await - at_100) / 400;
    assert!(
        per_call as usize <= counted,
        "a finished call keeps {per_call} bytes in Redis but is counted at {counted}"
    );
    println!(
        "a finished call with an 11-byte answer keeps {per_call} bytes of Redis (counted at {counted})"
    );
    // Then 30,000 of them: what Redis keeps stays within the budget and some slack (the
    // sessions themselves).
    let tasks: Vec<_> = codes
        .iter()
        .enumerate()
        .map(|(n, code)| {
            let from = if n == 0 { 500 } else { 0 };
            tokio::spawn(finish_all(code.clone(), from, CALLS))
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    let kept = fixture.store.usage().await.unwrap().answer_bytes;
    assert!(kept <= budget, "the budget's count is {kept}");
    let grown = server.used_memory().await.saturating_sub(before) as usize;
    println!("30,000 finished calls keep {grown} bytes of Redis with a budget of {budget}");
    // Half the budget again for Redis's own growth with the keys (its dictionaries, during a
    // rehash twice over; the sessions' lists and buffers), which no budget of ours counts.
    assert!(
        grown <= budget + budget / 2,
        "30,000 finished calls keep {grown} bytes of Redis, over the budget of {budget}"
    );
}

/// The flat enqueue script (issue 41) takes the common path alone — one script, one round trip
/// — and leaves every other outcome to the library's script, which it runs after (two):
/// queued by the flat one; an id taken, a full queue, a manifest that moved and a session past
/// its expiry by the library's, each with the library's answer.
#[tokio::test]
async fn the_flat_enqueue_takes_the_common_path_and_leaves_the_rest_to_the_library() {
    let fixture = redis(limits()).await;
    let server = fixture.redis_server();
    let code = with_session(&fixture).await;
    let now = fixture.now();
    let until = Timestamp(now.0 + 1_000);
    let enqueue = async |request: NewRequest, max_pending: usize, checks: EnqueueChecks| {
        let before = server.scripts_run().await;
        let (enqueued, _) = fixture
            .store
            .enqueue_checked(&code, &request, max_pending, until, checks)
            .await
            .unwrap();
        (enqueued, server.scripts_run().await - before)
    };
    let plain = EnqueueChecks::default;

    let (queued, scripts) = enqueue(call("r1", now, json!({})), 10, plain()).await;
    assert!(
        matches!(queued, Enqueued::Queued(ref record) if record.seq == 1),
        "{queued:?}"
    );
    assert_eq!(scripts, 1, "queued by the flat script alone");
    let (existing, scripts) = enqueue(call("r1", now, json!({})), 10, plain()).await;
    assert!(matches!(existing, Enqueued::Existing(_)), "{existing:?}");
    assert_eq!(scripts, 2, "an id taken: the library decides");
    let (conflict, scripts) = enqueue(call("r1", now, json!({"other": 1})), 10, plain()).await;
    assert_eq!((conflict, scripts), (Enqueued::Conflict, 2));
    let (full, scripts) = enqueue(call("r2", now, json!({})), 1, plain()).await;
    assert_eq!((full, scripts), (Enqueued::Full, 2));
    let moved = EnqueueChecks {
        manifest_revision: Some(7),
        ..EnqueueChecks::default()
    };
    let (stale, scripts) = enqueue(call("r3", now, json!({})), 10, moved).await;
    assert_eq!((stale, scripts), (Enqueued::StaleManifest, 2));
    let (second, scripts) = enqueue(call("r4", now, json!({})), 10, plain()).await;
    assert!(
        matches!(second, Enqueued::Queued(ref record) if record.seq == 2),
        "{second:?}"
    );
    assert_eq!(scripts, 1);
    // Past its expiry the session is ended by the library's script.
    fixture.advance(HOUR * 4);
    let later = fixture.now();
    let (gone, scripts) = enqueue(call("r5", later, json!({})), 10, plain()).await;
    assert_eq!((gone, scripts), (Enqueued::NoSession, 2));
    // An unknown session the flat script answers itself.
    let before = server.scripts_run().await;
    let (unknown, _) = fixture
        .store
        .enqueue_checked(
            &code_of("ZZZZ2345"),
            &call("r6", later, json!({})),
            10,
            until,
            plain(),
        )
        .await
        .unwrap();
    assert_eq!(
        (unknown, server.scripts_run().await - before),
        (Enqueued::NoSession, 1)
    );
}

/// The flat finish script (issue 41) takes the common path alone and leaves the rest to the
/// library's script: finished, and not this connection's, by the flat one (one script); an
/// answer to a call answered already or overdue by the library's (two), each with the
/// library's answer.
#[tokio::test]
async fn the_flat_finish_takes_the_common_path_and_leaves_the_rest_to_the_library() {
    let fixture = redis(limits()).await;
    let server = fixture.redis_server();
    let code = with_session(&fixture).await;
    let now = fixture.now();
    let until = Timestamp(now.0 + 1_000);
    for id in ["r1", "r2"] {
        let queued = fixture
            .store
            .enqueue(&code, call(id, now, json!({})), 10, until)
            .await;
        assert!(matches!(queued, Ok(Enqueued::Queued(_))), "{queued:?}");
    }
    fixture
        .store
        .claim(&code, &claim("tab-1", now, HOUR))
        .await
        .unwrap();
    let finish = async |id: &str, by: &str| {
        let before = server.scripts_run().await;
        let finished = fixture
            .store
            .finish(
                &code,
                id,
                RequestStatus::Completed,
                answer(id, json!(1)),
                Answerer::Connection(by),
                fixture.now(),
                until,
            )
            .await
            .unwrap();
        (finished, server.scripts_run().await - before)
    };
    let (other, scripts) = finish("r1", "tab-2").await;
    assert_eq!(
        (other, scripts),
        (Finished::NotDelivered, 1),
        "not this connection's"
    );
    let (finished, scripts) = finish("r1", "tab-1").await;
    let Finished::Finished(record) = finished else {
        panic!("{finished:?}")
    };
    assert_eq!(
        (record.status, scripts),
        (RequestStatus::Completed, 1),
        "finished by the flat script"
    );
    assert_eq!(
        record.correlation_id.as_deref(),
        Some("corr"),
        "answered with its correlation id"
    );
    assert_eq!(
        fixture
            .store
            .responses(&code, None)
            .await
            .unwrap()
            .unwrap()
            .len(),
        1
    );
    let kept = fixture.store.request(&code, "r1").await.unwrap().unwrap();
    assert_eq!(
        (kept.args, kept.correlation_id, kept.lease_until),
        (Value::Null, None, None)
    );
    assert_eq!(kept.response.unwrap().result, Some(json!(1)));
    let (again, scripts) = finish("r1", "tab-1").await;
    assert!(matches!(again, Finished::AlreadyFinished(_)), "{again:?}");
    assert_eq!(scripts, 2, "answered already: the library decides");
    let (unknown, scripts) = finish("r9", "tab-1").await;
    assert_eq!((unknown, scripts), (Finished::NoRequest, 1));
    // Past its deadline the library's script expires it.
    fixture.advance(Duration::from_secs(61));
    let (overdue, scripts) = finish("r2", "tab-1").await;
    let Finished::AlreadyFinished(record) = overdue else {
        panic!("{overdue:?}")
    };
    assert_eq!((record.status, scripts), (RequestStatus::Expired, 2));
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
            .enqueue_checked(&code, &call(id, now, json!({})), 10, until, checks)
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
    assert_eq!(told.response.unwrap().result, Some(json!("r1")));
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

/// What a finished call keeps in Redis for its retention beyond its answer, measured the way
/// issue 41 asks (`MEMORY USAGE`, exact with `SAMPLES 0`, of the session's hash and its list
/// of finished calls, before and after 500 calls as the relay makes them: 128-bit ids, a
/// connection's id, a caller's key, a correlation id; less their answers' bytes), is no more
/// than the answer budget counts for it (`rules::answer_cost` less the answer): the budget
/// bounds what Redis really keeps. (449 bytes on Redis 7.0 here; the issue's goal of 300 is
/// missed, BENCHMARKS.md says by what.)
#[tokio::test]
async fn a_finished_call_keeps_no_more_in_redis_than_the_budget_counts() {
    const CALLS: usize = 500;
    // Budgets that keep every answer: none is evicted during the count.
    let fixture = redis(StoreLimits {
        answer_budget: 64 * 1024 * 1024,
        session_answer_budget: 8 * 1024 * 1024,
        ..limits()
    })
    .await;
    let server = fixture.redis_server();
    let now = fixture.now();
    let (code, connection) = fixture.session_with_tab("ABCD2345").await;
    let mut redis = server.connection().await.unwrap();
    let mut usage = async || {
        let mut total = 0;
        for key in ["s", "f"] {
            let used: Option<usize> = redis::cmd("MEMORY")
                .arg("USAGE")
                .arg(format!("test:{{ABCD2345}}:{key}"))
                .arg("SAMPLES")
                .arg(0)
                .query_async(&mut redis)
                .await
                .unwrap();
            total += used.unwrap_or(0);
        }
        total
    };
    // One finished call first: the list of finished calls exists before the count starts.
    let mut answers = 0;
    let until = Timestamp(now.0 + 1_000);
    let mut before = 0;
    for n in 0..=CALLS {
        if n == 1 {
            before = usage().await;
            answers = 0;
        }
        let id = toolrelay_relay::code::unique_id();
        let request = NewRequest {
            caller: Some("k:0123456789abcdef0123456789".into()),
            correlation_id: Some(toolrelay_relay::code::random_id()),
            ..call(&id, now, json!({"text": format!("hello {n}")}))
        };
        let result = json!({"text": format!("hello {n}")});
        answers += result.to_string().len();
        let queued = fixture
            .store
            .enqueue(&code, request, 10, until)
            .await
            .unwrap();
        assert!(matches!(queued, Enqueued::Queued(_)), "{queued:?}");
        let finished = fixture
            .store
            .finish(
                &code,
                &id,
                RequestStatus::Completed,
                answer(&id, result),
                Answerer::Connection(&connection),
                now,
                until,
            )
            .await
            .unwrap();
        assert!(matches!(finished, Finished::Finished(_)), "{finished:?}");
    }
    let kept = (usage().await - before - answers) / CALLS;
    let responses = fixture.store.responses(&code, None).await.unwrap().unwrap();
    assert_eq!(responses.len(), CALLS + 1, "every answer kept");
    // What the budget counts for a call beyond its answer: the record and its id.
    let counted = toolrelay_relay::store::rules::FINISHED_CALL_BYTES + 32;
    println!(
        "a finished call keeps {kept} bytes of Redis beyond its answer; the budget counts {counted}"
    );
    assert!(
        kept <= counted,
        "a finished call keeps {kept} bytes beyond its answer, the budget counts {counted}"
    );
    // Issue 41's goal for the stored form (records.rs): 289 bytes on Debian 12's Redis 7.0.
    assert!(
        kept <= 300,
        "a finished call keeps {kept} bytes beyond its answer"
    );
}

/// A call an older relay wrote (18 fields, each `<length>:<value>`, its SHA-256 whole) is read,
/// found again when its caller asks again with the same id (not a conflict), and finished by
/// this version, which keeps it in its own layout (`records.rs`): a rolling upgrade loses no
/// call in flight.
#[tokio::test]
async fn a_call_an_older_relay_wrote_is_read_asked_again_and_finished() {
    let fixture = redis(limits()).await;
    let server = fixture.redis_server();
    let now = fixture.now();
    let (code, connection) = fixture.session_with_tab("ABCD2345").await;
    let request = NewRequest {
        caller: Some("k:older".into()),
        ..call("older-1", now, json!({"text": "hi"}))
    };
    // The older relay's hash: SHA-256 whole, of which this version keeps the first 16 bytes.
    let hash = toolrelay_relay::store::callers_call_hash(
        request.tool_id.as_deref(),
        &request.function_name,
        &request.args,
        request.caller.as_deref(),
    );
    let whole_hash = format!("{hash}{}", "0f".repeat(16));
    let (created, deadline) = (now.0.to_string(), request.deadline.0.to_string());
    let fields = [
        "older-1",
        "1",
        "demo",
        "echo",
        r#"{"text":"hi"}"#,
        "delivered",
        &created,
        &deadline,
        &connection,
        &deadline,
        "1",
        "",
        "",
        "0",
        "corr",
        &whole_hash,
        "0",
        "k:older",
    ];
    let packed: String = fields
        .iter()
        .map(|field| format!("{}:{field}", field.len()))
        .collect();
    let mut redis = server.connection().await.unwrap();
    let key = "test:{ABCD2345}:s";
    let _: () = redis::cmd("HSET")
        .arg(key)
        .arg("r:older-1")
        .arg(&packed)
        .arg("queue")
        .arg("older-1 ")
        .arg("pending")
        .arg("1")
        .arg("next_seq")
        .arg("1")
        .query_async(&mut redis)
        .await
        .unwrap();

    let read = fixture
        .store
        .request(&code, "older-1")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(read.status, RequestStatus::Delivered);
    assert_eq!(read.call_hash, hash);
    assert_eq!(read.caller.as_deref(), Some("k:older"));
    assert_eq!(read.args, json!({"text": "hi"}));
    let until = Timestamp(now.0 + 1_000);
    let again = fixture
        .store
        .enqueue(&code, request.clone(), 10, until)
        .await
        .unwrap();
    assert!(matches!(again, Enqueued::Existing(_)), "{again:?}");
    let finished = fixture
        .store
        .finish(
            &code,
            "older-1",
            RequestStatus::Completed,
            answer("older-1", json!({"ok": true})),
            Answerer::Connection(&connection),
            now,
            until,
        )
        .await
        .unwrap();
    assert!(matches!(finished, Finished::Finished(_)), "{finished:?}");
    let stored: String = redis::cmd("HGET")
        .arg(key)
        .arg("r:older-1")
        .query_async(&mut redis)
        .await
        .unwrap();
    assert!(
        stored.starts_with("1 c "),
        "kept in this version's layout: {stored:?}"
    );
    let responses = fixture
        .store
        .responses(&code, Some("k:older"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(responses.len(), 1);
    assert_eq!(responses[0].result, Some(json!({"ok": true})));
    // Asked again once finished: the same call, answered from what is kept.
    let again = fixture
        .store
        .enqueue(&code, request, 10, until)
        .await
        .unwrap();
    assert!(matches!(again, Enqueued::Existing(_)), "{again:?}");
}
