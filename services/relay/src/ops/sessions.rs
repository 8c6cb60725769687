//! Sessions' operations: creating one, where one stands, its connector handle, ending it.

use tonic::Status;
use toolrelay::convert::Malformed;
use toolrelay::proto::v1 as pb;

use crate::api::Outcome;
use crate::error::RelayError;
use crate::limits::Caller;
use crate::operation::{
    Admit, Checks, Credential, Credentials, Guard, Guarded, Operation, Visitor, run,
};
use crate::pool::Retry;
use crate::relay::approvals::Named;
use crate::relay::{NewSession, Relay, SessionStatus};
use crate::remote::RemoteRelay;

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

    const CHECKS: Checks = Checks {
        admit: Admit::Session,
        guard: Guard::Nothing,
    };

    async fn step(self, relay: &Relay, _: &Caller) -> Result<NewSession, RelayError> {
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

    // The tab asking with its token is never refused by the guard; a caller spends a request.
    const CHECKS: Checks = Checks {
        admit: Admit::RequestWithoutToken,
        guard: Guard::TokenOrNamed,
    };

    fn guarded(&self) -> Guarded {
        Guarded {
            session: self.code.clone(),
            token: self.token.clone(),
        }
    }

    async fn step(self, relay: &Relay, caller: &Caller) -> Result<SessionStatus, RelayError> {
        if let Some(token) = &self.token {
            relay.authorized(&self.code, Some(token)).await?;
            return relay.session_status(&self.code).await;
        }
        let (code, named, _) = relay.approved(caller, &self.code).await?;
        let mut status = relay.session_status(code.as_str()).await?;
        // The connector handle is never asked about: only its holder (and the tab) is told it.
        // Anyone else pairs by `ConnectCaller` and gets a handle of its own.
        if named != Named::ConnectorHandle {
            status.mcp_handle = String::new();
        }
        Ok(status)
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

    const CHECKS: Checks = Checks {
        admit: Admit::Request,
        guard: Guard::Named,
    };

    fn guarded(&self) -> Guarded {
        Guarded {
            session: self.handle.clone(),
            ..Guarded::default()
        }
    }

    async fn step(self, relay: &Relay, _: &Caller) -> Result<String, RelayError> {
        let code = relay.resolve_handle(&self.handle).await?;
        Ok(code.as_str().to_owned())
    }

    /// The reply is the session's status, as `GetSession`'s.
    async fn serve(self, relay: &Relay, caller: &Caller) -> Result<Self::Reply, RelayError> {
        let handle = self.handle.clone();
        run(self, relay, caller).await?;
        // Read by the handle: its holder is never asked about, and is told the handle.
        let read = GetSession {
            code: handle,
            token: None,
        };
        Ok(run(read, relay, caller).await?.into())
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

    const CHECKS: Checks = Checks {
        admit: Admit::Nothing,
        guard: Guard::Provider,
    };

    fn guarded(&self) -> Guarded {
        Guarded {
            token: self.token.clone(),
            ..Guarded::default()
        }
    }

    async fn step(self, relay: &Relay, _: &Caller) -> Result<(), RelayError> {
        relay.end_session(&self.code, self.token.as_deref()).await
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
