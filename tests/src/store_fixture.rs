//! What the store tests share: a store under test on a manual clock (the memory store, or the
//! Redis store on a `redis-server` or Cluster the test starts), the records and calls they
//! make, and [`conformance!`](crate::conformance), which runs each case once per store. Time
//! is explicit: each store reads a manual clock that the test moves; nothing waits on a timer.
//! Each store counts what it expires into metrics of its own, which the tests read.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use serde_json::Value;
use toolrelay::wire::ToolResponse;
use toolrelay_relay::clock::ClockHand;
use toolrelay_relay::config::{RedisSettings, Topology};
use toolrelay_relay::store::memory::{MemoryStore, StoreLimits};
use toolrelay_relay::store::redis::RedisStore;
use toolrelay_relay::store::{
    Claim, EventStream, NewRequest, ProviderInfo, SessionEvent, SessionRecord, Store, Transport,
};
use toolrelay_relay::{Clock, Metrics, SessionCode, Timestamp};

use crate::PATIENCE;
use crate::redis::{RedisCluster, RedisServer};

/// An hour: the time to live of the tests' sessions and the retention of their calls.
pub const HOUR: Duration = Duration::from_secs(3600);

/// A store, the hand of its clock, and what must live as long as it.
pub struct Fixture {
    /// The store under test.
    pub store: Arc<dyn Store>,
    clock: Clock,
    hand: ClockHand,
    /// The store's own metrics, read with [`sample`].
    pub metrics: Metrics,
    /// The Redis server or Cluster behind the store, kept running as long as it.
    redis: Option<Box<dyn std::any::Any + Send>>,
}

impl Fixture {
    /// A session `code` for an hour, its tab on a WebSocket with a new connection id: the
    /// session's code and that id.
    pub async fn session_with_tab(&self, code: &str) -> (SessionCode, String) {
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
    pub fn redis_server(&self) -> &RedisServer {
        self.redis
            .as_ref()
            .and_then(|redis| redis.downcast_ref::<RedisServer>())
            .expect("a fixture on one Redis server")
    }

    /// The time on the store's clock.
    pub fn now(&self) -> Timestamp {
        self.clock.now()
    }

    /// Moves the store's clock `duration` forward.
    pub fn advance(&self, duration: Duration) {
        self.hand.advance(duration);
    }
}

/// The wall clock's time, at which each fixture's manual clock starts.
pub fn wall_now() -> Timestamp {
    Clock::new().now()
}

/// On a memory store.
pub async fn memory(limits: StoreLimits) -> Fixture {
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

/// On a `redis-server` of its own.
pub async fn redis(limits: StoreLimits) -> Fixture {
    on_redis(RedisServer::start().await, limits).await
}

/// On one Redis Cluster node owning every slot: a script touching two slots fails there.
pub async fn cluster_node(limits: StoreLimits) -> Fixture {
    on_redis(RedisServer::cluster_node().await, limits).await
}

/// On a Redis Cluster of three primaries: sessions spread over its shards, events by
/// sharded pub/sub.
pub async fn cluster(limits: StoreLimits) -> Fixture {
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
pub async fn sample(metrics: &Metrics, series: &str) -> f64 {
    let text = metrics.render().await;
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("{series} is not in\n{text}"))
        .parse()
        .unwrap()
}

/// The series counting the sessions a store expired.
pub const SESSIONS_EXPIRED: &str = "toolrelay_sessions_expired_total";

/// Defines each case, `async fn name(fixture) { … }`, once per store: a test in each of
/// `memory_store`, `redis_store`, `redis_cluster_node` and `redis_cluster`.
#[macro_export]
macro_rules! conformance {
    ($($(#[$meta:meta])* async fn $name:ident($fixture:ident) $body:block)*) => {
        $(
            $(#[$meta])*
            async fn $name($fixture: $crate::store_fixture::Fixture) $body
        )*
        mod memory_store {
            use $crate::store_fixture::{limits, memory};
            $(
                #[tokio::test]
                async fn $name() {
                    super::$name(memory(limits()).await).await;
                }
            )*
        }
        mod redis_store {
            use $crate::store_fixture::{limits, redis};
            $(
                #[tokio::test]
                async fn $name() {
                    super::$name(redis(limits()).await).await;
                }
            )*
        }
        mod redis_cluster_node {
            use $crate::store_fixture::{cluster_node, limits};
            $(
                #[tokio::test]
                async fn $name() {
                    super::$name(cluster_node(limits()).await).await;
                }
            )*
        }
        mod redis_cluster {
            use $crate::store_fixture::{cluster, limits};
            $(
                #[tokio::test]
                async fn $name() {
                    super::$name(cluster(limits()).await).await;
                }
            )*
        }
    };
}

/// The limits every test runs with: budgets small enough to reach.
pub fn limits() -> StoreLimits {
    StoreLimits {
        retention: HOUR,
        answer_budget: 64 * 1024,
        session_answer_budget: 48 * 1024,
        ticket_budget: 64 * 1024,
    }
}

/// The session code `text`.
pub fn code_of(text: &str) -> SessionCode {
    SessionCode::parse(text).unwrap()
}

/// A session `code_text` made at `now` for `ttl`, which activity may slide to three times that.
pub fn session(code_text: &str, now: Timestamp, ttl: Duration) -> SessionRecord {
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

/// A call `id` of the `demo` tool's `echo` with `args`, made at `now`, due a minute later.
pub fn call(id: &str, now: Timestamp, args: Value) -> NewRequest {
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

/// A successful answer to the call `id`: `result`.
pub fn answer(id: &str, result: Value) -> ToolResponse {
    ToolResponse {
        request_id: id.into(),
        success: true,
        result: Some(result),
        error: None,
        content: None,
        structured_content: None,
    }
}

/// A provider connection that asks for its calls (polling): calls wait for its claim.
pub fn provider(connection: &str, now: Timestamp) -> ProviderInfo {
    attached(connection, Transport::Polling, now)
}

/// A provider connection attached by `transport`.
pub fn attached(connection: &str, transport: Transport, now: Timestamp) -> ProviderInfo {
    ProviderInfo {
        connection_id: connection.into(),
        transport,
        connected_at: now,
        last_seen: now,
    }
}

/// A claim by `connection` at `now` of up to 10 calls, leased for `lease`.
pub fn claim(connection: &str, now: Timestamp, lease: Duration) -> Claim {
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
pub async fn with_session(fixture: &Fixture) -> SessionCode {
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
pub async fn next_event(events: &mut EventStream) -> SessionEvent {
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
