//! Approvals' operations: pairing an assistant with a session by its code, and the person's
//! answers about new callers from a tab without a stream of its own.

use crate::caller::Caller;
use crate::error::RelayError;
use crate::operation::{Admit, Checks, Credential, Credentials, Guard, Guarded, Operation};
use crate::relay::approvals::{ApprovalView, Decision, Named};
use crate::relay::{Relay, SessionStatus};

/// Pairs an assistant with a session by its code (MCP's `connect_session`): the session's
/// status, with the handle the caller is to use from now on. In a session whose tab approves
/// callers, a caller the person has not allowed waits until the person answers, and gets a
/// caller handle of its own (revoked by **Disconnect** in the tab); elsewhere, the session's
/// connector handle.
#[derive(Debug, Clone)]
pub struct Connect {
    /// The code (or a handle) the caller was given.
    pub code: String,
}

impl Operation for Connect {
    const PATH: &'static str = "/toolrelay.v1.Relay/ConnectCaller";
    // Asking again waits for the same question, or finds the caller allowed.
    const RETRY: crate::pool::Retry = crate::pool::Retry::Safe;
    type Message = toolrelay::proto::v1::GetSessionRequest;
    type Reply = toolrelay::proto::v1::SessionInfo;
    type Output = SessionStatus;

    const CHECKS: Checks = Checks {
        admit: Admit::Request,
        guard: Guard::Named,
    };

    fn guarded(&self) -> Guarded {
        Guarded {
            session: self.code.clone(),
            ..Guarded::default()
        }
    }

    async fn step(self, relay: &Relay, caller: &Caller) -> Result<SessionStatus, RelayError> {
        {
            let (code, named, handle) = relay.approved(caller, &self.code).await?;
            let mut status = relay.session_status(code.as_str()).await?;
            match named {
                // A caller handle stays the caller's handle.
                Named::CallerHandle(_) => status.mcp_handle = self.code.to_ascii_lowercase(),
                // The caller the person allowed gets its own; the caller that opened the
                // session (open_codap, allowed with none) and the holder of the connector
                // handle keep the session's.
                _ => {
                    if let Some(handle) = handle.filter(|handle| !handle.is_empty()) {
                        status.mcp_handle = handle;
                    }
                }
            }
            Ok(status)
        }
    }

    fn into_message(self) -> (Self::Message, Credential) {
        let message = toolrelay::proto::v1::GetSessionRequest { code: self.code };
        (message, Credential::None)
    }

    fn from_message(message: Self::Message, _: Credentials) -> Result<Self, tonic::Status> {
        Ok(Self { code: message.code })
    }

    fn reply(output: SessionStatus) -> Self::Reply {
        output.into()
    }

    fn output(reply: Self::Reply) -> Result<SessionStatus, toolrelay::convert::Malformed> {
        reply.try_into()
    }
}

/// The person's answer about a new caller, or a caller disconnected, from a tab without a
/// stream of its own (SSE, polling): `POST`/`DELETE …/approvals/{callerId}` with the provider
/// token.
#[derive(Debug, Clone)]
pub struct AnswerApproval {
    /// The session code.
    pub code: String,
    /// The provider token.
    pub token: Option<String>,
    /// The caller.
    pub caller_id: String,
    /// Allow or deny the caller asked about; `None`: disconnect the allowed caller.
    pub allow: Option<bool>,
}

impl Operation for AnswerApproval {
    const PATH: &'static str = "/toolrelay.v1.Relay/AnswerApproval";
    // A second answer finds the question closed: it says so.
    const RETRY: crate::pool::Retry = crate::pool::Retry::IfNotSent;
    type Message = toolrelay::proto::v1::AnswerApprovalRequest;
    type Reply = toolrelay::proto::v1::AnswerApprovalResponse;
    type Output = String;

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

    async fn step(self, relay: &Relay, _: &Caller) -> Result<String, RelayError> {
        {
            let (code, _) = relay.authorized(&self.code, self.token.as_deref()).await?;
            match self.allow {
                None => {
                    relay.disconnect_caller(&code, &self.caller_id).await?;
                    Ok("disconnected".to_owned())
                }
                Some(allow) => {
                    let decision = if allow {
                        Decision::Allow
                    } else {
                        Decision::Deny
                    };
                    let outcome = relay.decide(&code, &self.caller_id, None, decision).await?;
                    Ok(outcome.to_owned())
                }
            }
        }
    }

    fn into_message(self) -> (Self::Message, Credential) {
        let message = toolrelay::proto::v1::AnswerApprovalRequest {
            code: self.code,
            caller_id: self.caller_id,
            allow: self.allow == Some(true),
            disconnect: self.allow.is_none(),
        };
        (message, Credential::token(self.token))
    }

    fn from_message(
        message: Self::Message,
        credentials: Credentials,
    ) -> Result<Self, tonic::Status> {
        Ok(Self {
            code: message.code,
            token: credentials.bearer,
            caller_id: message.caller_id,
            allow: (!message.disconnect).then_some(message.allow),
        })
    }

    fn reply(outcome: String) -> Self::Reply {
        toolrelay::proto::v1::AnswerApprovalResponse { outcome }
    }

    fn output(reply: Self::Reply) -> Result<String, toolrelay::convert::Malformed> {
        Ok(reply.outcome)
    }
}

/// The session's approvals as its tab shows them (provider token): the open question, the
/// allowed callers, whether new ones are refused.
#[derive(Debug, Clone)]
pub struct GetApprovals {
    /// The session code.
    pub code: String,
    /// The provider token.
    pub token: Option<String>,
}

impl Operation for GetApprovals {
    const PATH: &'static str = "/toolrelay.v1.Relay/GetApprovals";
    const RETRY: crate::pool::Retry = crate::pool::Retry::Safe;
    type Message = toolrelay::proto::v1::GetSessionRequest;
    type Reply = toolrelay::proto::v1::Approvals;
    type Output = ApprovalView;

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

    async fn step(self, relay: &Relay, _: &Caller) -> Result<ApprovalView, RelayError> {
        let (code, _) = relay.authorized(&self.code, self.token.as_deref()).await?;
        relay.approval_view(&code).await
    }

    fn into_message(self) -> (Self::Message, Credential) {
        let message = toolrelay::proto::v1::GetSessionRequest { code: self.code };
        (message, Credential::token(self.token))
    }

    fn from_message(
        message: Self::Message,
        credentials: Credentials,
    ) -> Result<Self, tonic::Status> {
        Ok(Self {
            code: message.code,
            token: credentials.bearer,
        })
    }

    fn reply(view: ApprovalView) -> Self::Reply {
        use crate::convert::card_message;
        toolrelay::proto::v1::Approvals {
            pending: view.asking.map(|(_, card)| card_message(card)),
            callers: Some(toolrelay::proto::v1::Callers {
                allowed: view.allowed.into_iter().map(card_message).collect(),
                refused: view.refused,
            }),
        }
    }

    fn output(reply: Self::Reply) -> Result<ApprovalView, toolrelay::convert::Malformed> {
        use crate::convert::card_of;
        let callers = reply.callers.unwrap_or_default();
        Ok(ApprovalView {
            approves: true,
            asking: reply.pending.map(|card| (0, card_of(card))),
            closed: None,
            allowed: callers.allowed.into_iter().map(card_of).collect(),
            refused: callers.refused,
        })
    }
}

/// This family's operations, for the gRPC server's routes ([`crate::operation::each`]).
pub(super) fn operations(visitor: &mut impl crate::operation::Visitor) {
    visitor.visit::<Connect>();
    visitor.visit::<AnswerApproval>();
    visitor.visit::<GetApprovals>();
}
