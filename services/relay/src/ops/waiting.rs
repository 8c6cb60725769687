//! Waiting's operations: a caller waiting for a call's answer, and reading answers and calls.

use std::time::Duration;

use tonic::Status;
use toolrelay::convert::{Malformed, non_empty};
use toolrelay::proto::v1 as pb;
use toolrelay::wire::ToolResponse;

use super::calls::wire_millis;
use crate::api::Outcome;
use crate::error::RelayError;
use crate::limits::Caller;
use crate::operation::{
    Admit, Checks, Credential, Credentials, Guard, Guarded, Operation, Visitor,
};
use crate::pool::Retry;
use crate::relay::{Relay, RequestView};
use crate::remote::RemoteRelay;

/// Waits up to `wait` for a call's answer; answers where the call stands either way.
#[derive(Debug, Clone)]
pub struct AwaitResponse {
    /// The session code.
    pub code: String,
    /// The call.
    pub request_id: String,
    /// How long to wait.
    pub wait: Duration,
    /// Answer as soon as the call has news (its tab's progress, a log message), with them.
    pub news: bool,
}

impl Operation for AwaitResponse {
    const PATH: &'static str = "/toolrelay.v1.Relay/AwaitResponse";
    // A wait cut off by its replica's death goes on, on another replica.
    const RETRY: Retry = Retry::Safe;
    type Message = pb::AwaitResponseRequest;
    type Reply = pb::RequestState;
    type Output = RequestView;

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

    async fn step(self, relay: &Relay, caller: &Caller) -> Result<RequestView, RelayError> {
        let key = relay.limits().caller_key(caller);
        relay.approved(caller, &self.code).await?;
        relay
            .await_response(
                &self.code,
                &self.request_id,
                self.wait,
                self.news,
                Some(&key),
            )
            .await
    }

    fn into_message(self) -> (Self::Message, Credential) {
        let message = pb::AwaitResponseRequest {
            code: self.code,
            request_id: self.request_id,
            wait_ms: wire_millis(self.wait),
            news: self.news,
        };
        (message, Credential::None)
    }

    fn from_message(message: Self::Message, _: Credentials) -> Result<Self, Status> {
        Ok(Self {
            code: message.code,
            request_id: message.request_id,
            wait: Duration::from_millis(u64::from(message.wait_ms)),
            news: message.news,
        })
    }

    fn reply(output: RequestView) -> Self::Reply {
        output.into()
    }

    fn output(reply: Self::Reply) -> Result<RequestView, Malformed> {
        Ok(reply.into())
    }

    async fn send(self, remote: &RemoteRelay, caller: &Caller) -> Outcome<RequestView> {
        let (code, request_id) = (self.code.clone(), self.request_id.clone());
        remote
            .waiting(&code, &request_id, remote.unary(caller, self))
            .await
    }
}

/// Final answers of the session's calls (or only `request_id`'s), oldest first.
#[derive(Debug, Clone)]
pub struct ListResponses {
    /// The session code.
    pub code: String,
    /// Only this call's answer.
    pub request_id: Option<String>,
}

impl Operation for ListResponses {
    const PATH: &'static str = "/toolrelay.v1.Relay/ListResponses";
    const RETRY: Retry = Retry::Safe;
    type Message = pb::ListResponsesRequest;
    type Reply = pb::ListResponsesResponse;
    type Output = Vec<ToolResponse>;

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

    async fn step(self, relay: &Relay, caller: &Caller) -> Result<Vec<ToolResponse>, RelayError> {
        let key = relay.limits().caller_key(caller);
        relay.approved(caller, &self.code).await?;
        relay
            .responses(&self.code, self.request_id.as_deref(), Some(&key))
            .await
    }

    fn into_message(self) -> (Self::Message, Credential) {
        let message = pb::ListResponsesRequest {
            code: self.code,
            request_id: self.request_id.unwrap_or_default(),
        };
        (message, Credential::None)
    }

    fn from_message(message: Self::Message, _: Credentials) -> Result<Self, Status> {
        Ok(Self {
            code: message.code,
            request_id: non_empty(message.request_id),
        })
    }

    fn reply(output: Vec<ToolResponse>) -> Self::Reply {
        pb::ListResponsesResponse {
            responses: output.into_iter().map(Into::into).collect(),
        }
    }

    fn output(reply: Self::Reply) -> Result<Vec<ToolResponse>, Malformed> {
        Ok(reply.responses.into_iter().map(Into::into).collect())
    }
}

/// Where one call stands.
#[derive(Debug, Clone)]
pub struct GetRequestStatus {
    /// The session code.
    pub code: String,
    /// The call.
    pub request_id: String,
}

impl Operation for GetRequestStatus {
    const PATH: &'static str = "/toolrelay.v1.Relay/GetRequestStatus";
    const RETRY: Retry = Retry::Safe;
    type Message = pb::GetRequestStatusRequest;
    type Reply = pb::RequestState;
    type Output = RequestView;

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

    async fn step(self, relay: &Relay, caller: &Caller) -> Result<RequestView, RelayError> {
        let key = relay.limits().caller_key(caller);
        let view = relay
            .request_status(&self.code, &self.request_id, Some(&key))
            .await?;
        relay.readable(caller, &self.code, &view).await?;
        Ok(view)
    }

    fn into_message(self) -> (Self::Message, Credential) {
        let message = pb::GetRequestStatusRequest {
            code: self.code,
            request_id: self.request_id,
        };
        (message, Credential::None)
    }

    fn from_message(message: Self::Message, _: Credentials) -> Result<Self, Status> {
        Ok(Self {
            code: message.code,
            request_id: message.request_id,
        })
    }

    fn reply(output: RequestView) -> Self::Reply {
        output.into()
    }

    fn output(reply: Self::Reply) -> Result<RequestView, Malformed> {
        Ok(reply.into())
    }
}

/// This family's operations, for the gRPC server's routes ([`crate::operation::each`]).
pub(super) fn operations(visitor: &mut impl Visitor) {
    visitor.visit::<AwaitResponse>();
    visitor.visit::<ListResponses>();
    visitor.visit::<GetRequestStatus>();
}
