//! [`Observed`]: any [`Store`] with each operation timed and its failures counted
//! (`toolrelay_store_operation_duration_seconds`, `toolrelay_store_errors_total`,
//! `toolrelay_store_up`). The relay wraps its store in one, and so does a gateway its own, so
//! both stores are measured the same way without either implementation knowing.

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use serde_json::Value;
use toolrelay::wire::{RequestStatus, ToolResponse};

use super::{
    Answerer, BudgetStore, Claim, EnqueueChecks, Enqueued, EventStream, Finished, McpSessionCaps,
    McpSessionStore, McpSessionsFull, NewRequest, ProviderInfo, RateBudget, Reachable,
    RequestRecord, SessionRecord, SessionStore, Store, StoreUsage, TabState, TicketStore,
};
use crate::clock::Timestamp;
use crate::code::SessionCode;
use crate::error::StoreError;
use crate::metrics::{Metrics, StoreOperation as Op};

/// A store whose operations are measured.
pub struct Observed {
    inner: Arc<dyn Store>,
    metrics: Metrics,
}

impl Observed {
    /// `store`, measured into `metrics`.
    pub fn wrap(store: Arc<dyn Store>, metrics: Metrics) -> Arc<dyn Store> {
        Arc::new(Self {
            inner: store,
            metrics,
        })
    }

    /// Runs one operation, recording how long it took and whether it failed.
    async fn timed<T>(
        &self,
        operation: Op,
        run: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        let started = Instant::now();
        let result = run.await;
        self.metrics
            .store_operation(operation, started.elapsed(), result.is_ok());
        result
    }
}

/// Writes `impl $part for Observed`: each listed method forwards to the inner store, timed as
/// the operation named after `=>`.
macro_rules! measured {
    ($part:ident {
        $(
            $(#[$meta:meta])*
            fn $method:ident(&self $(, $arg:ident: $type:ty)* $(,)?)
                -> $output:ty => $operation:ident;
        )*
    }) => {
        #[async_trait]
        impl $part for Observed {
            $(
                $(#[$meta])*
                async fn $method(&self $(, $arg: $type)*) -> Result<$output, StoreError> {
                    self.timed(Op::$operation, self.inner.$method($($arg),*)).await
                }
            )*
        }
    };
}

measured!(Reachable {
    fn ping(&self) -> () => Ping;
});

measured!(SessionStore {
    fn insert_session(&self, session: SessionRecord) -> bool => InsertSession;
    fn session(&self, code: &SessionCode) -> Option<SessionRecord> => Session;
    fn session_by_handle(&self, handle: &str) -> Option<SessionCode> => SessionByHandle;
    fn touch_session(
        &self, code: &SessionCode, now: Timestamp, until: Timestamp, seen: Option<&str>,
    ) -> Option<SessionRecord> => TouchSession;
    fn refresh(
        &self, tabs: &[(SessionCode, String)], now: Timestamp, until: Option<Timestamp>,
    ) -> Vec<TabState> => Refresh;
    fn keep_replica(&self, replica: &str, now: Timestamp, until: Timestamp)
        -> Vec<(String, Timestamp)> => KeepReplica;
    fn live_replicas(&self, now: Timestamp) -> Vec<(String, Timestamp)> => LiveReplicas;
    fn delete_session(&self, code: &SessionCode) -> bool => DeleteSession;
    fn set_provider(&self, code: &SessionCode, provider: ProviderInfo)
        -> Option<SessionRecord> => SetProvider;
    fn clear_provider(&self, code: &SessionCode, connection_id: &str) -> () => ClearProvider;
    fn set_manifest(&self, code: &SessionCode, json: String) -> Option<u64> => SetManifest;
    fn manifest(&self, code: &SessionCode) -> Option<(u64, Option<String>)> => Manifest;
    fn enqueue_checked(
        &self, code: &SessionCode, request: &NewRequest, max_pending: usize, until: Timestamp,
        checks: EnqueueChecks,
    ) -> (Enqueued, Option<SessionRecord>) => Enqueue;
    fn request(&self, code: &SessionCode, id: &str) -> Option<RequestRecord> => Request;
    fn responses(&self, code: &SessionCode) -> Option<Vec<ToolResponse>> => Responses;
    fn pending_count(&self, code: &SessionCode) -> Option<usize> => PendingCount;
    fn lease_builtin(
        &self, code: &SessionCode, id: &str, holder: &str, now: Timestamp, until: Timestamp,
    ) -> Option<RequestRecord> => LeaseBuiltin;
    fn claim(&self, code: &SessionCode, claim: &Claim) -> Vec<RequestRecord> => Claim;
    #[allow(clippy::too_many_arguments)]
    fn finish(
        &self, code: &SessionCode, id: &str, status: RequestStatus, response: ToolResponse,
        answerer: Answerer<'_>, now: Timestamp, until: Timestamp,
    ) -> Finished => Finish;
    fn subscribe(&self, code: &SessionCode) -> Option<EventStream> => Subscribe;
    fn listen(&self, code: &SessionCode) -> EventStream => Listen;
    fn listen_for_answer(&self, code: &SessionCode, id: &str) -> EventStream => Listen;
    fn usage(&self) -> StoreUsage => Usage;
});

measured!(TicketStore {
    fn put_ticket(&self, scope: &str, id: &str, value: Arc<Value>, expires_at: Timestamp)
        -> () => PutTicket;
    fn ticket(&self, scope: &str, id: &str) -> Option<Arc<Value>> => Ticket;
});

measured!(McpSessionStore {
    fn open_mcp_session(
        &self, slot: &str, address: &str, caps: McpSessionCaps, expires_at: Timestamp,
    ) -> Result<(), McpSessionsFull> => OpenMcpSession;
    fn put_mcp_session(
        &self, id: &str, slot: &str, address: &str, state: String, expires_at: Timestamp,
    ) -> () => PutMcpSession;
    fn touch_mcp_session(&self, id: &str, expires_at: Timestamp) -> bool => TouchMcpSession;
    fn mcp_session(&self, id: &str) -> Option<String> => McpSession;
    fn delete_mcp_session(&self, id: &str) -> () => DeleteMcpSession;
});

measured!(BudgetStore {
    fn lock(&self, key: &str, holder: &str, until: Timestamp) -> bool => Lock;
    fn unlock(&self, key: &str, holder: &str) -> () => Unlock;
    fn spend(&self, key: &str, budget: RateBudget, now: Timestamp) -> Option<Duration> => Spend;
});
