//! Registration: every metric's name, help text and buckets, and the series whose labels are
//! known up front created at zero, kept as handles in [`Metrics`].

use std::sync::{Arc, Mutex};

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use toolrelay::wire::RequestStatus;

use super::labels::{
    AnsweredBy, CONNECTIONS, ErrorLabels, HttpLabels, MipOutcome, MipTool, RateLimit, Refusal,
    Route, RouteLabels, StoreOperation,
};
use super::{Inner, Metrics};

/// Buckets (seconds) of HTTP request latency: a millisecond to the longest call wait.
const HTTP_BUCKETS: [f64; 15] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];
/// Buckets (seconds) of store operations: a memory store's microseconds to a Redis timeout.
const STORE_BUCKETS: [f64; 13] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 2.5,
];
/// Buckets (seconds) of MIP runs: a quick refusal to the longest solve (120 s).
const MIP_BUCKETS: [f64; 12] = [
    0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
];

impl Metrics {
    /// The metrics of the binary `binary` (`toolrelay`, `toolrelay-relay`, …): every metric
    /// registered, every series with fixed labels created at zero.
    pub fn new(binary: &'static str) -> Self {
        let mut registry = Registry::default();

        let build_info = Family::<[(&'static str, &'static str); 2], Gauge>::default();
        build_info
            .get_or_create(&[("version", env!("CARGO_PKG_VERSION")), ("binary", binary)])
            .set(1);
        registry.register(
            "toolrelay_build_info",
            "The running build: always 1, with its version and binary as labels",
            build_info,
        );

        let sessions_created = Counter::default();
        registry.register(
            "toolrelay_sessions_created",
            "Sessions created by this relay",
            sessions_created.clone(),
        );
        let sessions_expired = Counter::default();
        registry.register(
            "toolrelay_sessions_expired",
            "Sessions that ended because they expired (idle or at their maximum lifetime), counted by the replica that found them expired",
            sessions_expired.clone(),
        );
        let sessions_active = Gauge::default();
        registry.register(
            "toolrelay_sessions_active",
            "Sessions alive now, across every replica sharing the store",
            sessions_active.clone(),
        );

        let calls_family = Family::<[(&'static str, &'static str); 2], Counter>::default();
        let call = |status: RequestStatus, by: AnsweredBy| {
            calls_family
                .get_or_create_owned(&[("status", status.as_str()), ("transport", by.as_str())])
        };
        // Nothing answers an expired call: it has the one series `transport="none"`.
        // Nor a cancelled one: its caller ended it (`transport="none"`).
        let expired = call(RequestStatus::Expired, AnsweredBy::Nobody);
        let cancelled = call(RequestStatus::Cancelled, AnsweredBy::Nobody);
        let calls = [
            AnsweredBy::ALL.map(|by| call(RequestStatus::Completed, by)),
            AnsweredBy::ALL.map(|by| call(RequestStatus::Failed, by)),
            AnsweredBy::ALL.map(|_| expired.clone()),
            AnsweredBy::ALL.map(|_| cancelled.clone()),
        ];
        registry.register(
            "toolrelay_calls",
            "Calls finished, by how they ended and what answered them (none: they expired or were cancelled), counted once by the replica that finished them",
            calls_family,
        );
        let queue_depth = Gauge::default();
        registry.register(
            "toolrelay_queue_depth",
            "Calls handed to this replica's tab connections and not answered yet (sum over replicas: every call a tab is working on)",
            queue_depth.clone(),
        );
        let providers_family = Family::<[(&'static str, &'static str); 1], Gauge>::default();
        let providers = CONNECTIONS.map(|transport| {
            providers_family.get_or_create_owned(&[("transport", transport.as_str())])
        });
        registry.register(
            "toolrelay_providers_connected",
            "Provider connections (tabs, backends) this replica serves now",
            providers_family,
        );

        let rate_family = Family::<[(&'static str, &'static str); 1], Counter>::default();
        let rate_limited = RateLimit::ALL
            .map(|limit| rate_family.get_or_create_owned(&[("limit", limit.as_str())]));
        registry.register(
            "toolrelay_rate_limited",
            "Requests refused by a rate limit, by limit, counted where they were refused",
            rate_family,
        );

        let refused_family = Family::<[(&'static str, &'static str); 1], Counter>::default();
        let refused = Refusal::ALL
            .map(|reason| refused_family.get_or_create_owned(&[("reason", reason.as_str())]));
        registry.register(
            "toolrelay_refused",
            "Connections and requests refused by a protection (connection caps, header timeouts, MCP session caps, Fetch Metadata, Host checks, missing gateway proof), by reason",
            refused_family,
        );

        let route_family = Family::<[(&'static str, &'static str); 1], Counter>::default();
        let routed =
            Route::ALL.map(|way| route_family.get_or_create_owned(&[("way", way.as_str())]));
        registry.register(
            "toolrelay_routed_calls",
            "Calls that could go to the replica holding their tab (REPLICA_URL), by what became of them: local (the tab is here), forwarded (sent to its replica), accepted (taken in from another), fallback (announced on Redis instead)",
            route_family,
        );

        let store_family = Family::<[(&'static str, &'static str); 1], Histogram, fn() -> Histogram>::new_with_constructor(
            || Histogram::new(STORE_BUCKETS),
        );
        let store_durations = StoreOperation::ALL
            .iter()
            .map(|op| store_family.get_or_create_owned(&[("operation", op.as_str())]))
            .collect();
        registry.register(
            "toolrelay_store_operation_duration_seconds",
            "How long store operations took, by operation",
            store_family,
        );
        let store_error_family = Family::<[(&'static str, &'static str); 1], Counter>::default();
        let store_errors = StoreOperation::ALL
            .iter()
            .map(|op| store_error_family.get_or_create_owned(&[("operation", op.as_str())]))
            .collect();
        registry.register(
            "toolrelay_store_errors",
            "Store operations that failed (unreachable, timed out, unreadable), by operation",
            store_error_family,
        );
        let store_full = Counter::default();
        registry.register(
            "toolrelay_store_full",
            "Store operations refused because the store is at its memory limit (Redis OOM)",
            store_full.clone(),
        );
        let store_up = Gauge::default();
        store_up.set(1);
        registry.register(
            "toolrelay_store_up",
            "1 when the store answered the last operation or readiness check, 0 when it did not",
            store_up.clone(),
        );
        // The one label taken from outside the code: the primary's address, from the
        // operator's settings or the Sentinels they name, never from a request.
        let redis_primary = Family::<[(&'static str, String); 1], Gauge>::default();
        registry.register(
            "toolrelay_redis_primary",
            "1 for the Redis primary this process talks to, by its address (host:port)",
            redis_primary.clone(),
        );
        let redis_failovers = Counter::default();
        registry.register(
            "toolrelay_redis_failovers",
            "Times this process followed Redis to another primary (Sentinel failovers seen)",
            redis_failovers.clone(),
        );

        let mip_family = Family::<[(&'static str, &'static str); 2], Counter>::default();
        let mip_runs = MipTool::ALL.map(|tool| {
            MipOutcome::ALL.map(|outcome| {
                mip_family
                    .get_or_create_owned(&[("tool", tool.as_str()), ("outcome", outcome.as_str())])
            })
        });
        registry.register(
            "toolrelay_mip_runs",
            "Runs of the MIP tools, by tool and outcome",
            mip_family,
        );
        let mip_duration_family = Family::<
            [(&'static str, &'static str); 1],
            Histogram,
            fn() -> Histogram,
        >::new_with_constructor(|| Histogram::new(MIP_BUCKETS));
        let mip_durations = MipTool::ALL
            .map(|tool| mip_duration_family.get_or_create_owned(&[("tool", tool.as_str())]));
        registry.register(
            "toolrelay_mip_run_duration_seconds",
            "How long runs of the MIP tools took, by tool",
            mip_duration_family,
        );
        let mip_slots_busy = Gauge::default();
        registry.register(
            "toolrelay_mip_slots_busy",
            "MIP slots of this process in use (at most MIP_MAX_CONCURRENT)",
            mip_slots_busy.clone(),
        );
        let mip_waiting = Gauge::default();
        registry.register(
            "toolrelay_mip_waiting",
            "MIP calls waiting for a slot (each for at most MIP_QUEUE_WAIT_SECONDS)",
            mip_waiting.clone(),
        );

        let answer_bytes = Gauge::default();
        registry.register(
            "toolrelay_answer_bytes",
            "Bytes of finished calls' answers the store keeps now (bounded by the answer budget)",
            answer_bytes.clone(),
        );
        let answer_budget = Gauge::default();
        registry.register(
            "toolrelay_answer_budget_bytes",
            "The answer budget (RESPONSE_BUDGET_MB): past it the oldest answers are evicted",
            answer_budget.clone(),
        );
        let draining = Gauge::default();
        registry.register(
            "toolrelay_draining",
            "1 while the process shuts down (refusing new work), else 0",
            draining.clone(),
        );

        let http_requests = Family::<HttpLabels, Counter>::default();
        registry.register(
            "toolrelay_http_requests",
            "HTTP requests answered, by route template, method and status",
            http_requests.clone(),
        );
        let http_durations =
            Family::<RouteLabels, Histogram, fn() -> Histogram>::new_with_constructor(|| {
                Histogram::new(HTTP_BUCKETS)
            });
        registry.register(
            "toolrelay_http_request_duration_seconds",
            "How long HTTP requests took to be answered (until the response head), by route template and method",
            http_durations.clone(),
        );
        let http_errors = Family::<ErrorLabels, Counter>::default();
        registry.register(
            "toolrelay_http_errors",
            "HTTP requests answered with an error, by route template and the error's name",
            http_errors.clone(),
        );

        Self {
            inner: Arc::new(Inner {
                registry,
                refreshers: Mutex::new(Vec::new()),
                sessions_created,
                sessions_expired,
                sessions_active,
                calls,
                queue_depth,
                providers,
                rate_limited,
                refused,
                routed,
                store_durations,
                store_errors,
                store_full,
                store_up,
                redis_primary,
                redis_failovers,
                mip_runs,
                mip_durations,
                mip_slots_busy,
                mip_waiting,
                answer_bytes,
                answer_budget,
                draining,
                http_requests,
                http_durations,
                http_errors,
            }),
        }
    }
}
