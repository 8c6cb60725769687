//! The process's Prometheus metrics (SPEC §11): every metric's name and labels in one place,
//! and the small functions the rest of the code calls to say what happened. No Prometheus
//! type leaves this module.
//!
//! * One [`Metrics`] per process, cheap to clone, shared by whatever runs in it: the
//!   one-process server's relay and gateway write to the same registry, so its `/metrics`
//!   shows both. There is no global registry: a test process runs many relays, each with its
//!   own.
//! * Labels come from closed sets only — the enums below, route templates, error names —
//!   never from a request, so no code, id, handle or token can become a label.
//! * Observing is cheap: every series whose labels are known up front is created at start and
//!   kept as a handle, so counting a call is one atomic add, with no lock and no allocation;
//!   only the HTTP families (route × method × status) are looked up, under a read lock.
//! * What describes shared state — sessions alive, unanswered calls, the answers' bytes, the
//!   drain — is read when scraped: [`Metrics::render`] first runs what the relay and the
//!   gateway registered with [`Metrics::on_scrape`], then encodes.

use std::fmt::Write as _;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue, LabelValueEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use toolrelay::wire::RequestStatus;

use crate::store::Transport;

/// The `Content-Type` of [`Metrics::render`]'s text: the Prometheus text format, 0.0.4.
pub const CONTENT_TYPE: &str = prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

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

/// The process's metrics. Cheap to clone; clones share one registry.
#[derive(Clone)]
pub struct Metrics {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

/// Something to run before the metrics are encoded (it sets gauges).
type Refresh = Box<dyn Fn() -> BoxFuture<'static, ()> + Send + Sync>;

struct Inner {
    registry: Registry,
    /// Run by [`Metrics::render`]. A std mutex: held to take the list, never across an await.
    refreshers: Mutex<Vec<Arc<Refresh>>>,
    sessions_created: Counter,
    sessions_expired: Counter,
    sessions_active: Gauge,
    /// By [`status_index`], then [`AnsweredBy::index`] (every `expired` one is the same).
    calls: [[Counter; AnsweredBy::COUNT]; 3],
    queue_depth: Gauge,
    /// By [`connection_index`].
    providers: [Gauge; 3],
    rate_limited: [Counter; RateLimit::ALL.len()],
    refused: [Counter; Refusal::ALL.len()],
    store_durations: Vec<Histogram>,
    store_errors: Vec<Counter>,
    store_up: Gauge,
    mip_runs: [[Counter; MipOutcome::ALL.len()]; MipTool::ALL.len()],
    mip_durations: [Histogram; MipTool::ALL.len()],
    mip_slots_busy: Gauge,
    mip_waiting: Gauge,
    answer_bytes: Gauge,
    answer_budget: Gauge,
    draining: Gauge,
    http_requests: Family<HttpLabels, Counter>,
    http_durations: Family<RouteLabels, Histogram, fn() -> Histogram>,
    http_errors: Family<ErrorLabels, Counter>,
}

impl Default for Metrics {
    /// Metrics nobody scrapes, for a relay or store built outside a binary (tests, tools).
    fn default() -> Self {
        Self::new("library")
    }
}

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
        let expired = call(RequestStatus::Expired, AnsweredBy::Nobody);
        let calls = [
            AnsweredBy::ALL.map(|by| call(RequestStatus::Completed, by)),
            AnsweredBy::ALL.map(|by| call(RequestStatus::Failed, by)),
            AnsweredBy::ALL.map(|_| expired.clone()),
        ];
        registry.register(
            "toolrelay_calls",
            "Calls finished, by how they ended and what answered them (none: they expired), counted once by the replica that finished them",
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
        let store_up = Gauge::default();
        store_up.set(1);
        registry.register(
            "toolrelay_store_up",
            "1 when the store answered the last operation or readiness check, 0 when it did not",
            store_up.clone(),
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
                store_durations,
                store_errors,
                store_up,
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

    /// Runs `refresh` before each [`Metrics::render`] (to set gauges from what it reads).
    pub fn on_scrape(&self, refresh: impl Fn() -> BoxFuture<'static, ()> + Send + Sync + 'static) {
        self.refreshers().push(Arc::new(Box::new(refresh)));
    }

    /// The metrics in the Prometheus text format ([`CONTENT_TYPE`]), after the refreshers ran.
    pub async fn render(&self) -> String {
        let refreshers: Vec<Arc<Refresh>> = self.refreshers().clone();
        futures::future::join_all(refreshers.iter().map(|refresh| refresh())).await;
        let mut text = String::with_capacity(32 * 1024);
        if let Err(error) =
            prometheus_client::encoding::prometheus_text::encode(&mut text, &self.inner.registry)
        {
            // Only a failing writer can fail, and a String does not.
            let _ = write!(text, "# encoding failed: {error}");
        }
        text
    }

    fn refreshers(&self) -> std::sync::MutexGuard<'_, Vec<Arc<Refresh>>> {
        self.inner
            .refreshers
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    // ---- sessions and calls (relay) ----

    /// A session was created.
    pub fn session_created(&self) {
        self.inner.sessions_created.inc();
    }

    /// `count` sessions were found expired and ended.
    pub fn sessions_expired(&self, count: u64) {
        if count > 0 {
            self.inner.sessions_expired.inc_by(count);
        }
    }

    /// A call got its final answer (`completed`, `failed`) or expired, here.
    pub fn call_finished(&self, status: RequestStatus, by: AnsweredBy) {
        if let Some(status) = status_index(status) {
            self.inner.calls[status][by.index()].inc();
        }
    }

    /// `count` calls expired unanswered, here.
    pub fn calls_expired(&self, count: u64) {
        if count > 0 {
            self.inner.calls[2][0].inc_by(count);
        }
    }

    /// A provider connection of `transport` is served here until the guard is dropped.
    pub fn provider_connected(&self, transport: Transport) -> Connected {
        let gauge = connection_index(transport).map(|index| self.inner.providers[index].clone());
        if let Some(gauge) = &gauge {
            gauge.inc();
        }
        Connected(gauge)
    }

    /// A request was refused by the rate limit `limit`.
    pub fn rate_limited(&self, limit: RateLimit) {
        self.inner.rate_limited[limit as usize].inc();
    }

    /// A connection or request was refused by the protection `reason`.
    pub fn refused(&self, reason: Refusal) {
        self.inner.refused[reason as usize].inc();
    }

    /// What the store holds now, and the budget of its answers.
    pub fn store_state(&self, state: StoreState) {
        let inner = &self.inner;
        inner.sessions_active.set(gauge(state.sessions));
        inner.answer_bytes.set(gauge(state.answer_bytes));
        inner.answer_budget.set(gauge(state.answer_budget));
    }

    /// Whether the process is shutting down.
    pub fn draining(&self, draining: bool) {
        self.inner.draining.set(i64::from(draining));
    }

    // ---- the store ----

    /// A store operation took `elapsed` and succeeded or not. The store counts as down from
    /// a failed operation until a readiness check (a ping) succeeds.
    pub fn store_operation(&self, operation: StoreOperation, elapsed: Duration, ok: bool) {
        let index = operation as usize;
        self.inner.store_durations[index].observe(elapsed.as_secs_f64());
        if !ok {
            self.inner.store_errors[index].inc();
            self.inner.store_up.set(0);
        } else if operation == StoreOperation::Ping {
            self.inner.store_up.set(1);
        }
    }

    // ---- the MIP tools ----

    /// A run of a MIP tool ended with `outcome` after `elapsed`.
    pub fn mip_run(&self, tool: MipTool, outcome: MipOutcome, elapsed: Duration) {
        self.inner.mip_runs[tool as usize][outcome as usize].inc();
        self.inner.mip_durations[tool as usize].observe(elapsed.as_secs_f64());
    }

    /// `busy` MIP slots are in use and `waiting` calls wait for one.
    pub fn mip_slots(&self, busy: usize, waiting: usize) {
        self.inner.mip_slots_busy.set(gauge(busy));
        self.inner.mip_waiting.set(gauge(waiting));
    }

    /// A call of a MIP tool was refused before it was queued: its scope runs one already.
    pub fn mip_refused(&self, tool: MipTool) {
        self.inner.mip_runs[tool as usize][MipOutcome::Busy as usize].inc();
    }

    // ---- HTTP (gateway) ----

    /// An HTTP request to `route` was answered with `status` after `elapsed`.
    pub fn http_request(&self, route: &RouteLabel, method: &str, status: u16, elapsed: Duration) {
        let method = method_label(method);
        self.inner
            .http_requests
            .get_or_create(&HttpLabels {
                route: route.clone(),
                method,
                status,
            })
            .inc();
        self.inner
            .http_durations
            .get_or_create(&RouteLabels {
                route: route.clone(),
                method,
            })
            .observe(elapsed.as_secs_f64());
    }

    /// An HTTP request to `route` was answered with the error `error` (an error name from a
    /// closed set: see [`error_label`]).
    pub fn http_error(&self, route: &RouteLabel, error: &'static str) {
        self.inner
            .http_errors
            .get_or_create(&ErrorLabels {
                route: route.clone(),
                error,
            })
            .inc();
    }
}

fn gauge(value: usize) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

/// What the store holds, as [`Metrics::store_state`] reports it.
#[derive(Debug, Clone, Copy, Default)]
pub struct StoreState {
    /// Sessions alive.
    pub sessions: usize,
    /// Bytes of answers kept.
    pub answer_bytes: usize,
    /// The answer budget.
    pub answer_budget: usize,
}

impl Metrics {
    /// A call handed to one of this replica's tab connections, counted in
    /// `toolrelay_queue_depth` until this is dropped (it is answered, or the connection ends).
    pub fn call_handed(&self) -> Connected {
        self.inner.queue_depth.inc();
        Connected(Some(self.inner.queue_depth.clone()))
    }
}

/// A provider connection counted in `toolrelay_providers_connected` while this lives (or, from
/// [`Metrics::call_handed`], a call in `toolrelay_queue_depth`).
#[derive(Debug)]
#[must_use = "the connection counts only while this is kept"]
pub struct Connected(Option<Gauge>);

impl Drop for Connected {
    fn drop(&mut self) {
        if let Some(gauge) = &self.0 {
            gauge.dec();
        }
    }
}

/// The transports of provider connections (polling holds no connection).
const CONNECTIONS: [Transport; 3] = [Transport::WebSocket, Transport::Sse, Transport::Grpc];

fn connection_index(transport: Transport) -> Option<usize> {
    CONNECTIONS.iter().position(|known| *known == transport)
}

fn status_index(status: RequestStatus) -> Option<usize> {
    match status {
        RequestStatus::Completed => Some(0),
        RequestStatus::Failed => Some(1),
        RequestStatus::Expired => Some(2),
        _ => None,
    }
}

/// What gave a call its final answer: `toolrelay_calls_total{transport}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AnsweredBy {
    /// A provider over this transport.
    Provider(Transport),
    /// A tool built into the relay.
    Builtin,
    /// Nothing: the call expired unanswered (or an answer came with no provider attached).
    Nobody,
}

impl AnsweredBy {
    const COUNT: usize = 6;
    const ALL: [Self; Self::COUNT] = [
        Self::Provider(Transport::WebSocket),
        Self::Provider(Transport::Sse),
        Self::Provider(Transport::Polling),
        Self::Provider(Transport::Grpc),
        Self::Builtin,
        Self::Nobody,
    ];

    fn index(self) -> usize {
        match self {
            Self::Provider(Transport::WebSocket) => 0,
            Self::Provider(Transport::Sse) => 1,
            Self::Provider(Transport::Polling) => 2,
            Self::Provider(Transport::Grpc) => 3,
            Self::Builtin => 4,
            Self::Nobody => 5,
        }
    }

    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Provider(transport) => transport.as_str(),
            Self::Builtin => "builtin",
            Self::Nobody => "none",
        }
    }
}

/// A rate limit: `toolrelay_rate_limited_total{limit}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RateLimit {
    /// Sessions created per address (gateway).
    Sessions,
    /// Calls per address and session (relay).
    Calls,
    /// Built-in tool calls per address (gateway).
    Tools,
    /// Look-ups of unknown codes per address: the brute-force guard (relay).
    Lookups,
}

impl RateLimit {
    const ALL: [Self; 4] = [Self::Sessions, Self::Calls, Self::Tools, Self::Lookups];

    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Sessions => "sessions",
            Self::Calls => "calls",
            Self::Tools => "tools",
            Self::Lookups => "lookups",
        }
    }
}

/// Why a protection refused a connection or request: `toolrelay_refused_total{reason}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// A connection over the cap of connections from one client address.
    ConnectionsPerAddress,
    /// A connection over the cap of connections in total.
    ConnectionsTotal,
    /// A connection that did not send its request head in time.
    HeaderTimeout,
    /// A connection whose request head was larger than allowed.
    HeaderTooLarge,
    /// An MCP `initialize` over the cap of live MCP sessions from one client address.
    McpSessionsPerAddress,
    /// An MCP `initialize` over the cap of live MCP sessions in total.
    McpSessionsTotal,
    /// A cross-site request refused by the Fetch Metadata policy before any code look-up.
    FetchMetadata,
    /// A request whose `Host` is neither the public host nor an allowed name.
    Host,
    /// A gRPC request naming a client address without a valid gateway secret.
    GatewayProof,
}

impl Refusal {
    const ALL: [Self; 9] = [
        Self::ConnectionsPerAddress,
        Self::ConnectionsTotal,
        Self::HeaderTimeout,
        Self::HeaderTooLarge,
        Self::McpSessionsPerAddress,
        Self::McpSessionsTotal,
        Self::FetchMetadata,
        Self::Host,
        Self::GatewayProof,
    ];

    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ConnectionsPerAddress => "connections_per_address",
            Self::ConnectionsTotal => "connections_total",
            Self::HeaderTimeout => "header_timeout",
            Self::HeaderTooLarge => "header_too_large",
            Self::McpSessionsPerAddress => "mcp_sessions_per_address",
            Self::McpSessionsTotal => "mcp_sessions_total",
            Self::FetchMetadata => "fetch_metadata",
            Self::Host => "host",
            Self::GatewayProof => "gateway_proof",
        }
    }
}

/// A MIP tool: `toolrelay_mip_runs_total{tool}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MipTool {
    /// `generate_mip_problem`: a sandbox run building a model.
    Generate,
    /// `solve_mip_problem`: a solve.
    Solve,
    /// `validate_mip_solution`: a sandbox run checking a solution.
    Validate,
}

impl MipTool {
    const ALL: [Self; 3] = [Self::Generate, Self::Solve, Self::Validate];

    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Generate => "generate",
            Self::Solve => "solve",
            Self::Validate => "validate",
        }
    }
}

/// How a MIP run ended: `toolrelay_mip_runs_total{outcome}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MipOutcome {
    /// It ran and answered (a solve: optimal, infeasible, unbounded, …).
    Ok,
    /// A solve reached its time limit (it answers with the best solution so far).
    Timeout,
    /// The solver or the sandbox failed.
    Error,
    /// The input was refused: the code raised, the model is unreadable or too large, an id
    /// is unknown.
    Invalid,
    /// The sandbox stopped the run at a limit (wall clock, CPU, memory, processes).
    Stopped,
    /// Refused because as much was running as may (429).
    Busy,
    /// The sandbox or the store cannot be used here now.
    Unavailable,
}

impl MipOutcome {
    const ALL: [Self; 7] = [
        Self::Ok,
        Self::Timeout,
        Self::Error,
        Self::Invalid,
        Self::Stopped,
        Self::Busy,
        Self::Unavailable,
    ];

    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::Timeout => "timeout",
            Self::Error => "error",
            Self::Invalid => "invalid",
            Self::Stopped => "stopped",
            Self::Busy => "busy",
            Self::Unavailable => "unavailable",
        }
    }
}

macro_rules! store_operations {
    ($($variant:ident = $name:literal,)*) => {
        /// A [`Store`](crate::store::Store) operation:
        /// `toolrelay_store_operation_duration_seconds{operation}`.
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        #[allow(missing_docs)] // each is the store method of that name
        pub enum StoreOperation { $($variant,)* }

        impl StoreOperation {
            /// Every operation, in declaration order.
            pub const ALL: &[StoreOperation] = &[$(StoreOperation::$variant,)*];

            /// The label value: the store method's name.
            pub const fn as_str(self) -> &'static str {
                match self { $(StoreOperation::$variant => $name,)* }
            }
        }
    };
}

store_operations! {
    InsertSession = "insert_session",
    Session = "session",
    SessionByHandle = "session_by_handle",
    TouchSession = "touch_session",
    Refresh = "refresh",
    KeepReplica = "keep_replica",
    LiveReplicas = "live_replicas",
    DeleteSession = "delete_session",
    SetProvider = "set_provider",
    ClearProvider = "clear_provider",
    SetManifest = "set_manifest",
    Manifest = "manifest",
    Enqueue = "enqueue",
    Request = "request",
    Responses = "responses",
    PendingCount = "pending_count",
    LeaseBuiltin = "lease_builtin",
    Claim = "claim",
    Finish = "finish",
    Subscribe = "subscribe",
    Listen = "listen",
    Ping = "ping",
    Usage = "usage",
    PutTicket = "put_ticket",
    Ticket = "ticket",
    OpenMcpSession = "open_mcp_session",
    PutMcpSession = "put_mcp_session",
    TouchMcpSession = "touch_mcp_session",
    McpSession = "mcp_session",
    DeleteMcpSession = "delete_mcp_session",
    Lock = "lock",
    Unlock = "unlock",
    Spend = "spend",
}

/// A route template as a label value (`/api/sessions/{code}/call`, `other`): cheap to clone,
/// so counting a request allocates nothing. Made from the route table, never from a path.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RouteLabel(Arc<str>);

impl RouteLabel {
    /// The label of the route template `template`.
    pub fn new(template: &str) -> Self {
        Self(template.into())
    }

    /// The label of requests that match no route.
    pub fn other() -> Self {
        Self::new("other")
    }

    /// The template.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl EncodeLabelValue for RouteLabel {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
        encoder.write_str(&self.0)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct HttpLabels {
    route: RouteLabel,
    method: &'static str,
    status: u16,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct RouteLabels {
    route: RouteLabel,
    method: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ErrorLabels {
    route: RouteLabel,
    error: &'static str,
}

/// The method label: the standard methods, else `other`.
fn method_label(method: &str) -> &'static str {
    const METHODS: [&str; 7] = ["GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS"];
    METHODS
        .into_iter()
        .find(|known| *known == method)
        .unwrap_or("other")
}

/// The `error` label of an error body's name: an [`ErrorCode`](crate::ErrorCode) name (a
/// built-in tool's `SCREAMING_SNAKE` code counts when it spells one), `tool_error` for another
/// built-in tool code, `other` for anything else — never the text a client could choose.
pub fn error_label(name: &str, from_tool: bool) -> &'static str {
    let lower = name.to_ascii_lowercase();
    match crate::ErrorCode::parse(&lower) {
        Some(code) => code.as_str(),
        None if from_tool => "tool_error",
        None => "other",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn fixed_series_exist_from_the_start_and_count() {
        let metrics = Metrics::new("test-binary");
        metrics.session_created();
        metrics.call_finished(
            RequestStatus::Completed,
            AnsweredBy::Provider(Transport::WebSocket),
        );
        metrics.calls_expired(2);
        metrics.rate_limited(RateLimit::Lookups);
        metrics.refused(Refusal::HeaderTimeout);
        let connected = metrics.provider_connected(Transport::Sse);
        metrics.mip_run(MipTool::Solve, MipOutcome::Ok, Duration::from_millis(30));
        let text = metrics.render().await;
        for line in [
            "toolrelay_build_info{version=\"0.1.0\",binary=\"test-binary\"} 1",
            "toolrelay_sessions_created_total 1",
            "toolrelay_calls_total{status=\"completed\",transport=\"websocket\"} 1",
            "toolrelay_calls_total{status=\"expired\",transport=\"none\"} 2",
            "toolrelay_calls_total{status=\"failed\",transport=\"builtin\"} 0",
            "toolrelay_calls_total{status=\"failed\",transport=\"none\"} 0",
            "toolrelay_rate_limited_total{limit=\"lookups\"} 1",
            "toolrelay_rate_limited_total{limit=\"sessions\"} 0",
            "toolrelay_refused_total{reason=\"header_timeout\"} 1",
            "toolrelay_refused_total{reason=\"gateway_proof\"} 0",
            "toolrelay_providers_connected{transport=\"sse\"} 1",
            "toolrelay_mip_runs_total{tool=\"solve\",outcome=\"ok\"} 1",
            "toolrelay_mip_run_duration_seconds_count{tool=\"solve\"} 1",
            "toolrelay_store_errors_total{operation=\"finish\"} 0",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} missing in\n{text}");
        }
        assert!(!text.contains("status=\"expired\",transport=\"websocket\""));
        drop(connected);
        let text = metrics.render().await;
        assert!(text.contains("toolrelay_providers_connected{transport=\"sse\"} 0"));
    }

    #[tokio::test]
    async fn refreshers_run_before_encoding() {
        let metrics = Metrics::default();
        let handle = metrics.clone();
        metrics.on_scrape(move || {
            let handle = handle.clone();
            Box::pin(async move {
                handle.store_state(StoreState {
                    sessions: 3,
                    answer_bytes: 10,
                    answer_budget: 100,
                });
                handle.draining(true);
            })
        });
        let handed = metrics.call_handed();
        let text = metrics.render().await;
        assert!(text.contains("toolrelay_sessions_active 3\n"), "{text}");
        assert!(text.contains("toolrelay_queue_depth 1\n"), "{text}");
        drop(handed);
        assert!(metrics.render().await.contains("toolrelay_queue_depth 0\n"));
        assert!(
            text.contains("toolrelay_answer_budget_bytes 100\n"),
            "{text}"
        );
        assert!(text.contains("toolrelay_draining 1\n"), "{text}");
    }

    #[test]
    fn error_labels_come_from_a_closed_set() {
        assert_eq!(error_label("session_not_found", false), "session_not_found");
        assert_eq!(error_label("RATE_LIMITED", true), "rate_limited");
        assert_eq!(error_label("EMPTY_CODE", true), "tool_error");
        assert_eq!(error_label("ABCD-EFGH", false), "other");
        assert_eq!(method_label("BREW"), "other");
    }
}
