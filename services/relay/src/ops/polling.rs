//! Polling's operation: a provider without a connection takes its session's waiting calls by
//! asking.

use tonic::Status;
use toolrelay::convert::Malformed;
use toolrelay::proto::v1 as pb;

use crate::api::Outcome;
use crate::error::RelayError;
use crate::limits::Caller;
use crate::operation::{
    Admit, Checks, Credential, Credentials, Guard, Guarded, Operation, Visitor,
};
use crate::pool::Retry;
use crate::relay::{Polled, Relay};
use crate::remote::RemoteRelay;

/// The polling fallback (provider token): the session's waiting calls, at most `max`.
#[derive(Debug, Clone)]
pub struct PollRequests {
    /// The session code.
    pub code: String,
    /// The provider token.
    pub token: Option<String>,
    /// Most calls handed out (all when `None`).
    pub max: Option<usize>,
    /// The calls the poller runs (to learn which were cancelled).
    pub running: Vec<String>,
}

impl Operation for PollRequests {
    const PATH: &'static str = "/toolrelay.v1.Relay/PollRequests";
    // Calls a lost poll took are handed out again when their lease runs out.
    const RETRY: Retry = Retry::IfNotSent;
    type Message = pb::PollRequestsRequest;
    type Reply = pb::PollRequestsResponse;
    type Output = Polled;

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

    async fn step(self, relay: &Relay, _: &Caller) -> Result<Polled, RelayError> {
        relay
            .poll(&self.code, self.token.as_deref(), self.max, &self.running)
            .await
    }

    fn into_message(self) -> (Self::Message, Credential) {
        let message = pb::PollRequestsRequest {
            code: self.code,
            max: self
                .max
                .map_or(0, |max| u32::try_from(max).unwrap_or(u32::MAX)),
            running: self.running,
        };
        (message, Credential::token(self.token))
    }

    fn from_message(message: Self::Message, credentials: Credentials) -> Result<Self, Status> {
        let max = (message.max > 0).then(|| usize::try_from(message.max).unwrap_or(usize::MAX));
        Ok(Self {
            code: message.code,
            token: credentials.bearer,
            max,
            running: message.running,
        })
    }

    fn reply(output: Polled) -> Self::Reply {
        pb::PollRequestsResponse {
            requests: output.requests.into_iter().map(Into::into).collect(),
            cancelled: output.cancelled,
            approval_request: output.approval.map(crate::convert::card_message),
            callers: output.callers.map(|(allowed, refused)| pb::Callers {
                allowed: allowed
                    .into_iter()
                    .map(crate::convert::card_message)
                    .collect(),
                refused,
            }),
        }
    }

    fn output(reply: Self::Reply) -> Result<Polled, Malformed> {
        Ok(Polled {
            requests: reply.requests.into_iter().map(Into::into).collect(),
            cancelled: reply.cancelled,
            approval: reply.approval_request.map(crate::convert::card_of),
            callers: reply.callers.map(|callers| {
                let allowed = callers.allowed.into_iter().map(crate::convert::card_of);
                (allowed.collect(), callers.refused)
            }),
        })
    }

    async fn send(self, remote: &RemoteRelay, caller: &Caller) -> Outcome<Polled> {
        // A stopping gateway hands out no more calls, as one process does.
        remote.accepting()?;
        remote.unary(caller, self).await
    }
}

/// This family's operations, for the gRPC server's routes ([`crate::operation::each`]).
pub(super) fn operations(visitor: &mut impl Visitor) {
    visitor.visit::<PollRequests>();
}
