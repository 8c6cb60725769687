//! Answers' operations: a provider's answer to a call, and a call's end by its caller.

use tonic::Status;
use toolrelay::convert::Malformed;
use toolrelay::proto::v1 as pb;
use toolrelay::wire::{ProviderFrame, ProviderResponse};

use crate::api::Outcome;
use crate::error::RelayError;
use crate::limits::Caller;
use crate::operation::{
    Admit, Checks, Credential, Credentials, Guard, Guarded, Operation, Visitor,
};
use crate::pool::Retry;
use crate::relay::{AnswerLimits, Relay, RequestView, ResponseOutcome, contain_response};
use crate::remote::RemoteRelay;

/// A provider's answer to a call (provider token).
#[derive(Debug, Clone)]
pub struct PostResponse {
    /// The session code.
    pub code: String,
    /// The provider token.
    pub token: Option<String>,
    /// The answer.
    pub response: ProviderResponse,
}

impl Operation for PostResponse {
    const PATH: &'static str = "/toolrelay.v1.Relay/PostResponse";
    // Not asked again once sent: the first answer wins, and a second would be told so.
    const RETRY: Retry = Retry::IfNotSent;
    type Message = pb::PostResponseRequest;
    type Reply = pb::PostResponseResponse;
    type Output = ResponseOutcome;

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

    async fn step(self, relay: &Relay, _: &Caller) -> Result<ResponseOutcome, RelayError> {
        relay
            .post_response(&self.code, self.token.as_deref(), self.response)
            .await
    }

    fn into_message(self) -> (Self::Message, Credential) {
        let message = pb::PostResponseRequest {
            code: self.code,
            response: Some(self.response.into()),
        };
        (message, Credential::token(self.token))
    }

    fn from_message(message: Self::Message, credentials: Credentials) -> Result<Self, Status> {
        let response = message
            .response
            .ok_or_else(|| Status::invalid_argument("PostResponse needs a response"))?;
        Ok(Self {
            code: message.code,
            token: credentials.bearer,
            response: response.into(),
        })
    }

    fn reply(output: ResponseOutcome) -> Self::Reply {
        pb::PostResponseResponse {
            request_id: output.request_id,
            status: pb::RequestStatus::from(output.status).into(),
            accepted: output.accepted,
        }
    }

    fn output(reply: Self::Reply) -> Result<ResponseOutcome, Malformed> {
        Ok(ResponseOutcome {
            status: reply.status().into(),
            request_id: reply.request_id,
            accepted: reply.accepted,
        })
    }

    async fn send(mut self, remote: &RemoteRelay, caller: &Caller) -> Outcome<ResponseOutcome> {
        // Only the nesting is checked here (it could not cross gRPC); the relay checks the rest.
        let limits = AnswerLimits::depth_only(remote.max_json_depth());
        let (response, refused) = contain_response(self.response, limits);
        self.response = response;
        let outcome = remote.unary(caller, self).await?;
        match refused {
            Some(error) if outcome.accepted => Err(error.into()),
            _ => Ok(outcome),
        }
    }
}

/// A delivered call's news from its tab over HTTP (SSE, polling): see [`Relay::post_news`].
#[derive(Debug, Clone)]
pub struct PostNews {
    /// The session code.
    pub code: String,
    /// The provider token.
    pub token: Option<String>,
    /// A `progress` or `log` frame.
    pub news: ProviderFrame,
}

impl Operation for PostNews {
    const PATH: &'static str = "/toolrelay.v1.Relay/PostNews";
    // News is a hint: not sent twice.
    const RETRY: Retry = Retry::IfNotSent;
    type Message = pb::PostNewsRequest;
    type Reply = pb::PostNewsResponse;
    type Output = bool;

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

    async fn step(self, relay: &Relay, _: &Caller) -> Result<bool, RelayError> {
        relay
            .post_news(&self.code, self.token.as_deref(), self.news)
            .await
    }

    fn into_message(self) -> (Self::Message, Credential) {
        use pb::post_news_request::Kind;
        let kind = match pb::ProviderMessage::from(self.news).kind {
            Some(pb::provider_message::Kind::Progress(progress)) => Some(Kind::Progress(progress)),
            Some(pb::provider_message::Kind::Log(log)) => Some(Kind::Log(log)),
            _ => None,
        };
        let message = pb::PostNewsRequest {
            code: self.code,
            kind,
        };
        (message, Credential::token(self.token))
    }

    fn from_message(message: Self::Message, credentials: Credentials) -> Result<Self, Status> {
        use pb::post_news_request::Kind;
        let kind = match message.kind {
            Some(Kind::Progress(progress)) => pb::provider_message::Kind::Progress(progress),
            Some(Kind::Log(log)) => pb::provider_message::Kind::Log(log),
            None => return Err(Status::invalid_argument("PostNews needs progress or a log")),
        };
        let news = ProviderFrame::try_from(pb::ProviderMessage { kind: Some(kind) })
            .map_err(|malformed| Status::invalid_argument(malformed.0))?;
        Ok(Self {
            code: message.code,
            token: credentials.bearer,
            news,
        })
    }

    fn reply(running: bool) -> Self::Reply {
        pb::PostNewsResponse { running }
    }

    fn output(reply: Self::Reply) -> Result<bool, Malformed> {
        Ok(reply.running)
    }
}

/// Cancels a call (by its caller): see [`Relay::cancel`].
#[derive(Debug, Clone)]
pub struct CancelRequest {
    /// The session code.
    pub code: String,
    /// The call.
    pub request_id: String,
}

impl Operation for CancelRequest {
    const PATH: &'static str = "/toolrelay.v1.Relay/CancelRequest";
    // Cancelling twice ends the call once.
    const RETRY: Retry = Retry::Safe;
    type Message = pb::CancelRequestRequest;
    type Reply = pb::RequestState;
    type Output = RequestView;

    // What reading the call's status takes: the caller's budget and the guard.
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
        relay
            .cancel_as(&self.code, &self.request_id, Some(&key))
            .await
    }

    fn into_message(self) -> (Self::Message, Credential) {
        let message = pb::CancelRequestRequest {
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
    visitor.visit::<PostResponse>();
    visitor.visit::<PostNews>();
    visitor.visit::<CancelRequest>();
}
