//! Sessions: creating one, where one stands, its connector handle, ending it.

use std::sync::Arc;

use super::{
    CODE_ATTEMPTS, NewSession, POLLING_PRESENCE, Relay, RequestView, SessionStatus, not_found,
};
use crate::clock::Timestamp;
use crate::code::{self, SessionCode};
use crate::error::RelayError;
use crate::metrics::Refusal;
use crate::store::{Inserted, RequestRecord, SessionRecord, Transport};
use toolrelay::wire::RequestStatus;

impl Relay {
    /// Creates a session.
    pub async fn create_session(&self) -> Result<NewSession, RelayError> {
        self.create_session_with(code::generate_token()).await
    }

    /// Creates a session whose provider holds `provider_token`.
    pub(super) async fn create_session_with(
        &self,
        provider_token: String,
    ) -> Result<NewSession, RelayError> {
        self.accepting()?;
        let config = &self.inner.config;
        let now = self.now();
        for _ in 0..CODE_ATTEMPTS {
            let record = SessionRecord {
                code: SessionCode::generate(),
                token_hash: code::hash_token(&provider_token),
                created_at: now,
                expires_at: now.plus(config.session_ttl),
                max_expires_at: now.plus(config.session_max_lifetime),
                provider: None,
                manifest_revision: 0,
                mcp_handle: code::random_id(),
            };
            let session = NewSession {
                code: record.code.clone(),
                provider_token: provider_token.clone(),
                ttl: config.session_ttl,
                expires_at: record.expires_at,
                max_expires_at: record.max_expires_at,
                mcp_handle: record.mcp_handle.clone(),
            };
            match self
                .inner
                .store
                .insert_session_within(record, config.max_sessions)
                .await?
            {
                Inserted::Inserted => {
                    self.inner.metrics.session_created();
                    tracing::info!(code = %session.code.redacted(), "session created");
                    return Ok(session);
                }
                Inserted::Taken => {}
                Inserted::Full => {
                    self.inner.metrics.refused(Refusal::SessionsTotal);
                    tracing::warn!(
                        max_sessions = config.max_sessions,
                        "a new session was refused: MAX_SESSIONS live already"
                    );
                    return Err(RelayError::AtCapacity {
                        what: "live sessions",
                        limit: crate::config::ENV_MAX_SESSIONS,
                        value: config.max_sessions,
                    });
                }
            }
        }
        // 8 collisions in a row among 2^40 codes means the store is not behaving.
        Err(RelayError::StoreUnavailable(crate::error::StoreError(
            "no free session code after repeated attempts".into(),
        )))
    }

    /// Where a session stands. Reading the status is not activity: it does not slide expiry.
    pub async fn session_status(&self, code: &str) -> Result<SessionStatus, RelayError> {
        let (code, session) = self.live_session(code).await?;
        let now = self.now();
        let manifest = self.manifest_of(&code, session.manifest_revision).await?;
        let pending_requests = self
            .inner
            .store
            .pending_count(&code)
            .await?
            .ok_or_else(|| not_found(&code))?;
        let transport = self.connected_transport(&session, now).await;
        Ok(SessionStatus {
            created_at: session.created_at,
            expires_at: session.expires_at,
            max_expires_at: session.max_expires_at,
            transport,
            tool_count: manifest.functions().len() + self.inner.tools.names().len(),
            pending_requests,
            mcp_handle: session.mcp_handle,
            code,
        })
    }

    /// How the session's provider is attached, if one is connected now: a poller while it
    /// polls, a pushing connection while its replica serves it (this one, or another that
    /// counts as alive: see [`crate::relay::tabs`]).
    pub(super) async fn connected_transport(
        &self,
        session: &SessionRecord,
        now: Timestamp,
    ) -> Option<Transport> {
        let provider = session.provider.as_ref()?;
        let present = match provider.transport {
            Transport::Polling => now.since(provider.last_seen) <= POLLING_PRESENCE,
            _ => {
                let recent = now.since(provider.last_seen) <= self.inner.config.tab_presence();
                self.connection_present(&provider.connection_id, now, recent)
                    .await
            }
        };
        present.then_some(provider.transport)
    }

    /// A call's view, with whether a provider can answer it now; an error for a call whose
    /// answer was evicted.
    pub(super) async fn view(
        &self,
        code: &SessionCode,
        record: Arc<RequestRecord>,
    ) -> Result<RequestView, RelayError> {
        if record.evicted {
            return Err(RelayError::ResponseEvicted {
                request_id: record.id.clone(),
            });
        }
        if record.builtin || record.status.is_terminal() {
            return Ok(RequestView::of(record, true));
        }
        let connected = match self.inner.store.session(code).await? {
            Some(session) => self
                .connected_transport(&session, self.now())
                .await
                .is_some(),
            None => false,
        };
        // A hint: a store that cannot say leaves it out rather than fail the view.
        let progress = if record.status == RequestStatus::Delivered {
            self.inner
                .store
                .progress(code, &record.id)
                .await
                .ok()
                .flatten()
        } else {
            None
        };
        Ok(RequestView {
            progress,
            ..RequestView::of(record, connected)
        })
    }

    /// The code of the session an MCP connector handle belongs to.
    pub async fn resolve_handle(&self, handle: &str) -> Result<SessionCode, RelayError> {
        self.inner
            .store
            .session_by_handle(handle)
            .await?
            .ok_or(RelayError::UnknownHandle)
    }

    /// Ends a session at once; its provider receives `expired`. Needs the provider token.
    pub async fn end_session(&self, code: &str, token: Option<&str>) -> Result<(), RelayError> {
        let (code, _) = self.authorized(code, token).await?;
        self.inner.store.delete_session(&code).await?;
        tracing::info!(code = %code.redacted(), "session ended by its provider");
        Ok(())
    }
}
