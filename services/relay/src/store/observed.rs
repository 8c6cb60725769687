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
    Answerer, Claim, EnqueueChecks, Enqueued, EventStream, Finished, McpSessionCaps,
    McpSessionsFull, NewRequest, ProviderInfo, RateBudget, RequestRecord, SessionRecord, Store,
    StoreUsage, TabState,
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

#[async_trait]
impl Store for Observed {
    async fn insert_session(&self, session: SessionRecord) -> Result<bool, StoreError> {
        self.timed(Op::InsertSession, self.inner.insert_session(session))
            .await
    }

    async fn session(&self, code: &SessionCode) -> Result<Option<SessionRecord>, StoreError> {
        self.timed(Op::Session, self.inner.session(code)).await
    }

    async fn session_by_handle(&self, handle: &str) -> Result<Option<SessionCode>, StoreError> {
        self.timed(Op::SessionByHandle, self.inner.session_by_handle(handle))
            .await
    }

    async fn touch_session(
        &self,
        code: &SessionCode,
        now: Timestamp,
        until: Timestamp,
        seen: Option<&str>,
    ) -> Result<Option<SessionRecord>, StoreError> {
        self.timed(
            Op::TouchSession,
            self.inner.touch_session(code, now, until, seen),
        )
        .await
    }

    async fn refresh(
        &self,
        tabs: &[(SessionCode, String)],
        now: Timestamp,
        until: Option<Timestamp>,
    ) -> Result<Vec<TabState>, StoreError> {
        self.timed(Op::Refresh, self.inner.refresh(tabs, now, until))
            .await
    }

    async fn delete_session(&self, code: &SessionCode) -> Result<bool, StoreError> {
        self.timed(Op::DeleteSession, self.inner.delete_session(code))
            .await
    }

    async fn set_provider(
        &self,
        code: &SessionCode,
        provider: ProviderInfo,
    ) -> Result<Option<SessionRecord>, StoreError> {
        self.timed(Op::SetProvider, self.inner.set_provider(code, provider))
            .await
    }

    async fn clear_provider(
        &self,
        code: &SessionCode,
        connection_id: &str,
    ) -> Result<(), StoreError> {
        self.timed(
            Op::ClearProvider,
            self.inner.clear_provider(code, connection_id),
        )
        .await
    }

    async fn set_manifest(
        &self,
        code: &SessionCode,
        json: String,
    ) -> Result<Option<u64>, StoreError> {
        self.timed(Op::SetManifest, self.inner.set_manifest(code, json))
            .await
    }

    async fn manifest(
        &self,
        code: &SessionCode,
    ) -> Result<Option<(u64, Option<String>)>, StoreError> {
        self.timed(Op::Manifest, self.inner.manifest(code)).await
    }

    async fn enqueue_checked(
        &self,
        code: &SessionCode,
        request: &NewRequest,
        max_pending: usize,
        until: Timestamp,
        checks: EnqueueChecks,
    ) -> Result<(Enqueued, Option<SessionRecord>), StoreError> {
        self.timed(
            Op::Enqueue,
            self.inner
                .enqueue_checked(code, request, max_pending, until, checks),
        )
        .await
    }

    async fn request(
        &self,
        code: &SessionCode,
        id: &str,
    ) -> Result<Option<RequestRecord>, StoreError> {
        self.timed(Op::Request, self.inner.request(code, id)).await
    }

    async fn responses(&self, code: &SessionCode) -> Result<Option<Vec<ToolResponse>>, StoreError> {
        self.timed(Op::Responses, self.inner.responses(code)).await
    }

    async fn pending_count(&self, code: &SessionCode) -> Result<Option<usize>, StoreError> {
        self.timed(Op::PendingCount, self.inner.pending_count(code))
            .await
    }

    async fn lease_builtin(
        &self,
        code: &SessionCode,
        id: &str,
        holder: &str,
        now: Timestamp,
        until: Timestamp,
    ) -> Result<Option<RequestRecord>, StoreError> {
        self.timed(
            Op::LeaseBuiltin,
            self.inner.lease_builtin(code, id, holder, now, until),
        )
        .await
    }

    async fn claim(
        &self,
        code: &SessionCode,
        claim: &Claim,
    ) -> Result<Vec<RequestRecord>, StoreError> {
        self.timed(Op::Claim, self.inner.claim(code, claim)).await
    }

    async fn finish(
        &self,
        code: &SessionCode,
        id: &str,
        status: RequestStatus,
        response: ToolResponse,
        answerer: Answerer<'_>,
        now: Timestamp,
        until: Timestamp,
    ) -> Result<Finished, StoreError> {
        self.timed(
            Op::Finish,
            self.inner
                .finish(code, id, status, response, answerer, now, until),
        )
        .await
    }

    async fn subscribe(&self, code: &SessionCode) -> Result<Option<EventStream>, StoreError> {
        self.timed(Op::Subscribe, self.inner.subscribe(code)).await
    }

    async fn listen(&self, code: &SessionCode) -> Result<EventStream, StoreError> {
        self.timed(Op::Listen, self.inner.listen(code)).await
    }

    async fn listen_for_answer(
        &self,
        code: &SessionCode,
        id: &str,
    ) -> Result<EventStream, StoreError> {
        self.timed(Op::Listen, self.inner.listen_for_answer(code, id))
            .await
    }

    async fn ping(&self) -> Result<(), StoreError> {
        self.timed(Op::Ping, self.inner.ping()).await
    }

    async fn usage(&self) -> Result<StoreUsage, StoreError> {
        self.timed(Op::Usage, self.inner.usage()).await
    }

    async fn put_ticket(
        &self,
        scope: &str,
        id: &str,
        value: Arc<Value>,
        expires_at: Timestamp,
    ) -> Result<(), StoreError> {
        self.timed(
            Op::PutTicket,
            self.inner.put_ticket(scope, id, value, expires_at),
        )
        .await
    }

    async fn ticket(&self, scope: &str, id: &str) -> Result<Option<Arc<Value>>, StoreError> {
        self.timed(Op::Ticket, self.inner.ticket(scope, id)).await
    }

    async fn open_mcp_session(
        &self,
        slot: &str,
        address: &str,
        caps: McpSessionCaps,
        expires_at: Timestamp,
    ) -> Result<Result<(), McpSessionsFull>, StoreError> {
        self.timed(
            Op::OpenMcpSession,
            self.inner.open_mcp_session(slot, address, caps, expires_at),
        )
        .await
    }

    async fn put_mcp_session(
        &self,
        id: &str,
        slot: &str,
        address: &str,
        state: String,
        expires_at: Timestamp,
    ) -> Result<(), StoreError> {
        self.timed(
            Op::PutMcpSession,
            self.inner
                .put_mcp_session(id, slot, address, state, expires_at),
        )
        .await
    }

    async fn touch_mcp_session(&self, id: &str, expires_at: Timestamp) -> Result<bool, StoreError> {
        self.timed(
            Op::TouchMcpSession,
            self.inner.touch_mcp_session(id, expires_at),
        )
        .await
    }

    async fn mcp_session(&self, id: &str) -> Result<Option<String>, StoreError> {
        self.timed(Op::McpSession, self.inner.mcp_session(id)).await
    }

    async fn delete_mcp_session(&self, id: &str) -> Result<(), StoreError> {
        self.timed(Op::DeleteMcpSession, self.inner.delete_mcp_session(id))
            .await
    }

    async fn lock(&self, key: &str, holder: &str, until: Timestamp) -> Result<bool, StoreError> {
        self.timed(Op::Lock, self.inner.lock(key, holder, until))
            .await
    }

    async fn unlock(&self, key: &str, holder: &str) -> Result<(), StoreError> {
        self.timed(Op::Unlock, self.inner.unlock(key, holder)).await
    }

    async fn spend(
        &self,
        key: &str,
        budget: RateBudget,
        now: Timestamp,
    ) -> Result<Option<Duration>, StoreError> {
        self.timed(Op::Spend, self.inner.spend(key, budget, now))
            .await
    }
}
