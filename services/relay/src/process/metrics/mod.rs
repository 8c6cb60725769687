//! The process's Prometheus metrics (SPEC §11): every metric's name and labels in one place,
//! and the small functions the rest of the code calls to say what happened. No Prometheus
//! type leaves this module.
//!
//! * One [`Metrics`] per process, cheap to clone, shared by whatever runs in it: the
//!   one-process server's relay and gateway write to the same registry, so its `/metrics`
//!   shows both. There is no global registry: a test process runs many relays, each with its
//!   own.
//! * Labels come from closed sets only — the enums of `labels`, route templates, error names —
//!   never from a request, so no code, id, handle or token can become a label.
//! * Observing is cheap: every series whose labels are known up front is created at start and
//!   kept as a handle, so counting a call is one atomic add, with no lock and no allocation;
//!   only the HTTP families (route × method × status) are looked up, under a read lock.
//! * What describes shared state — sessions alive, unanswered calls, the answers' bytes, the
//!   drain — is read when scraped: [`Metrics::render`] first runs what the relay and the
//!   gateway registered with [`Metrics::on_scrape`], then encodes.
//!
//! # Layout
//!
//! This file holds the handle, [`Metrics::render`] and the functions that say what happened;
//! `register` names and describes every metric and creates the fixed series; `labels` holds
//! the closed sets of label values.

mod labels;
mod register;

use std::fmt::Write as _;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use toolrelay::wire::RequestStatus;

use crate::store::Transport;
pub use labels::{
    AnsweredBy, MipOutcome, MipTool, RateLimit, Refusal, Route, RouteLabel, StoreOperation,
};
use labels::{ErrorLabels, HttpLabels, RouteLabels, connection_index, method_label, status_index};

/// The `Content-Type` of [`Metrics::render`]'s text: the Prometheus text format, 0.0.4.
pub const CONTENT_TYPE: &str = prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

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
    /// By [`status_index`], then [`AnsweredBy::index`] (every `expired` one is the same, and
    /// so is every `cancelled` one).
    calls: [[Counter; AnsweredBy::COUNT]; 4],
    queue_depth: Gauge,
    /// By [`connection_index`].
    providers: [Gauge; 3],
    rate_limited: [Counter; RateLimit::ALL.len()],
    refused: [Counter; Refusal::ALL.len()],
    routed: [Counter; Route::ALL.len()],
    store_durations: Vec<Histogram>,
    store_errors: Vec<Counter>,
    store_full: Counter,
    store_up: Gauge,
    redis_primary: Family<[(&'static str, String); 1], Gauge>,
    redis_failovers: Counter,
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

    /// A call that could be routed went `way`.
    pub fn routed(&self, way: Route) {
        self.inner.routed[way as usize].inc();
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

    /// The Redis primary this process talks to now, at `address`.
    pub fn redis_primary(&self, address: &str) {
        let primary = &self.inner.redis_primary;
        primary.clear();
        primary
            .get_or_create(&[("address", address.to_owned())])
            .set(1);
    }

    /// This process followed Redis to another primary.
    pub fn redis_failover(&self) {
        self.inner.redis_failovers.inc();
    }

    /// A store operation was refused because the store is full
    /// (`toolrelay_store_full_total`; it counts among the errors too).
    pub fn store_full(&self) {
        self.inner.store_full.inc();
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
    /// closed set: an [`ErrorCode`](crate::ErrorCode)'s name, or `tool_error`).
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
}
