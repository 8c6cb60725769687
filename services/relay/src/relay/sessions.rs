//! Sessions: creating one, where one stands, its connector handle, ending it.

use tonic::Status;
use toolrelay::convert::Malformed;
use toolrelay::proto::v1 as pb;

use super::{
    CODE_ATTEMPTS, NewSession, POLLING_PRESENCE, Relay, RequestView, SessionStatus, not_found,
};
use crate::api::Outcome;
use crate::clock::Timestamp;
use crate::code::{self, SessionCode};
use crate::error::RelayError;
use crate::limits::Caller;
use crate::metrics::Refusal;
use crate::operation::{Credential, Credentials, Operation, Visitor};
use crate::pool::Retry;
use crate::remote::RemoteRelay;
use crate::store::{Inserted, RequestRecord, SessionRecord, Transport};

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
        record: RequestRecord,
    ) -> Result<RequestView, RelayError> {
        if record.evicted {
            return Err(RelayError::ResponseEvicted {
                request_id: record.id,
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
        Ok(RequestView::of(record, connected))
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

/// Creates a session.
#[derive(Debug, Clone, Default)]
pub struct CreateSession;

impl Operation for CreateSession {
    const PATH: &'static str = "/toolrelay.v1.Relay/CreateSession";
    // Asking again at worst leaves a session nobody uses, which expires.
    const RETRY: Retry = Retry::Safe;
    type Message = pb::CreateSessionRequest;
    type Reply = pb::CreateSessionResponse;
    type Output = NewSession;

    async fn run(self, relay: &Relay, caller: &Caller) -> Result<NewSession, RelayError> {
        relay.limits().admit_session(caller).await?;
        relay.create_session().await
    }

    fn into_message(self) -> (Self::Message, Credential) {
        (pb::CreateSessionRequest {}, Credential::None)
    }

    fn from_message(_: Self::Message, _: Credentials) -> Result<Self, Status> {
        Ok(Self)
    }

    fn reply(output: NewSession) -> Self::Reply {
        output.into()
    }

    fn output(reply: Self::Reply) -> Result<NewSession, Malformed> {
        reply.try_into()
    }

    async fn send(self, remote: &RemoteRelay, caller: &Caller) -> Outcome<NewSession> {
        remote.accepting()?;
        remote.unary(caller, self).await
    }
}

/// Where a session stands. With the session's provider token (`token`), the guard never
/// refuses it; a wrong token is refused.
#[derive(Debug, Clone)]
pub struct GetSession {
    /// The session code.
    pub code: String,
    /// The provider token, when the session's own provider asks.
    pub token: Option<String>,
}

impl Operation for GetSession {
    const PATH: &'static str = "/toolrelay.v1.Relay/GetSession";
    const RETRY: Retry = Retry::Safe;
    type Message = pb::GetSessionRequest;
    type Reply = pb::SessionInfo;
    type Output = SessionStatus;

    async fn run(self, relay: &Relay, caller: &Caller) -> Result<SessionStatus, RelayError> {
        let Some(token) = self.token else {
            relay.limits().admit(caller)?;
            let status = async {
                let (code, named, _) = relay.approved(caller, &self.code).await?;
                let mut status = relay.session_status(code.as_str()).await?;
                // The connector handle is never asked about: only its holder (and the tab) is
                // told it. Anyone else pairs by `ConnectCaller` and gets a handle of its own.
                if named != super::approvals::Named::ConnectorHandle {
                    status.mcp_handle = String::new();
                }
                Ok(status)
            };
            return relay.guarded(caller, &self.code, status).await;
        };
        let status = async {
            relay.authorized(&self.code, Some(&token)).await?;
            relay.session_status(&self.code).await
        };
        relay.guarded_provider(caller, Some(&token), status).await
    }

    fn into_message(self) -> (Self::Message, Credential) {
        let credential = self
            .token
            .map_or(Credential::None, Credential::ProviderToken);
        (pb::GetSessionRequest { code: self.code }, credential)
    }

    fn from_message(message: Self::Message, credentials: Credentials) -> Result<Self, Status> {
        Ok(Self {
            code: message.code,
            token: credentials.provider_token,
        })
    }

    fn reply(output: SessionStatus) -> Self::Reply {
        output.into()
    }

    fn output(reply: Self::Reply) -> Result<SessionStatus, Malformed> {
        reply.try_into()
    }
}

/// The code of the session an MCP connector handle belongs to.
#[derive(Debug, Clone)]
pub struct ResolveHandle {
    /// The connector handle.
    pub handle: String,
}

impl Operation for ResolveHandle {
    const PATH: &'static str = "/toolrelay.v1.Relay/ResolveHandle";
    const RETRY: Retry = Retry::Safe;
    type Message = pb::ResolveHandleRequest;
    type Reply = pb::SessionInfo;
    type Output = String;

    async fn run(self, relay: &Relay, caller: &Caller) -> Result<String, RelayError> {
        relay.limits().admit(caller)?;
        let code = relay
            .guarded(caller, &self.handle, relay.resolve_handle(&self.handle))
            .await?;
        Ok(code.as_str().to_owned())
    }

    /// The reply is the session's status, as `GetSession`'s.
    async fn serve(self, relay: &Relay, caller: &Caller) -> Result<Self::Reply, RelayError> {
        let handle = self.handle.clone();
        self.run(relay, caller).await?;
        // Read by the handle: its holder is never asked about, and is told the handle.
        let status = GetSession {
            code: handle,
            token: None,
        }
        .run(relay, caller)
        .await?;
        Ok(status.into())
    }

    fn into_message(self) -> (Self::Message, Credential) {
        let message = pb::ResolveHandleRequest {
            handle: self.handle,
        };
        (message, Credential::None)
    }

    fn from_message(message: Self::Message, _: Credentials) -> Result<Self, Status> {
        Ok(Self {
            handle: message.handle,
        })
    }

    fn reply(code: String) -> Self::Reply {
        pb::SessionInfo {
            code,
            ..Default::default()
        }
    }

    fn output(reply: Self::Reply) -> Result<String, Malformed> {
        Ok(reply.code)
    }
}

/// Ends a session (provider token).
#[derive(Debug, Clone)]
pub struct EndSession {
    /// The session code.
    pub code: String,
    /// The provider token.
    pub token: Option<String>,
}

impl Operation for EndSession {
    const PATH: &'static str = "/toolrelay.v1.Relay/DeleteSession";
    // Not asked again once sent: a second ending would say the session is gone.
    const RETRY: Retry = Retry::IfNotSent;
    type Message = pb::DeleteSessionRequest;
    type Reply = pb::DeleteSessionResponse;
    type Output = ();

    async fn run(self, relay: &Relay, caller: &Caller) -> Result<(), RelayError> {
        let token = self.token.as_deref();
        relay
            .guarded_provider(caller, token, relay.end_session(&self.code, token))
            .await
    }

    fn into_message(self) -> (Self::Message, Credential) {
        let message = pb::DeleteSessionRequest { code: self.code };
        (message, Credential::token(self.token))
    }

    fn from_message(message: Self::Message, credentials: Credentials) -> Result<Self, Status> {
        Ok(Self {
            code: message.code,
            token: credentials.bearer,
        })
    }

    fn reply((): ()) -> Self::Reply {
        pb::DeleteSessionResponse {}
    }

    fn output(_: Self::Reply) -> Result<(), Malformed> {
        Ok(())
    }
}

/// This family's operations, for the gRPC server's routes ([`crate::operation::each`]).
pub(super) fn operations(visitor: &mut impl Visitor) {
    visitor.visit::<CreateSession>();
    visitor.visit::<GetSession>();
    visitor.visit::<ResolveHandle>();
    visitor.visit::<EndSession>();
}
