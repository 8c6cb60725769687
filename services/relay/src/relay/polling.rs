//! Polling: a provider without a connection takes its session's waiting calls by asking, and
//! learns which of the calls it runs were cancelled by saying which it runs.

use tonic::Status;
use toolrelay::convert::Malformed;
use toolrelay::proto::v1 as pb;
use toolrelay::wire::{CallerCard, RequestStatus, ToolRequest};

use super::Relay;
use crate::api::Outcome;
use crate::error::RelayError;
use crate::limits::Caller;
use crate::operation::{Credential, Credentials, Operation, Visitor};
use crate::pool::Retry;
use crate::remote::RemoteRelay;
use crate::store::{Claim, ProviderInfo, Transport};

/// The connection id shared by every poll of a session.
const POLLING_CONNECTION: &str = "polling";
/// Most running calls a poll asks about (more are not looked at).
pub const MAX_RUNNING: usize = 64;

/// What a poll hands out: calls to run, and which of the calls the poller said it runs were
/// cancelled by their callers.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Polled {
    /// Calls to run.
    pub requests: Vec<ToolRequest>,
    /// Calls to stop running.
    pub cancelled: Vec<String>,
    /// In a session whose tab approves callers: the caller the person is asked about now.
    pub approval: Option<CallerCard>,
    /// In a session whose tab approves callers: the callers allowed, and whether new ones
    /// are refused.
    pub callers: Option<(Vec<CallerCard>, bool)>,
}

impl Relay {
    /// The polling fallback: hands out the session's waiting calls (at most `max`, all when
    /// `None`) under a lease; a call not answered within the lease is handed out again.
    /// Needs the provider token; polling makes the poller the session's provider. None while
    /// the relay hands its tabs over ([`crate::drain::Drain::hand_over`]). Of the calls in
    /// `running` (at most [`MAX_RUNNING`]), those handed to the poller and since cancelled are
    /// named in [`Polled::cancelled`].
    pub async fn poll(
        &self,
        code: &str,
        token: Option<&str>,
        max: Option<usize>,
        running: &[String],
    ) -> Result<Polled, RelayError> {
        let (code, session) = self.authorized(code, token).await?;
        let now = self.now();
        let is_current = session
            .provider
            .as_ref()
            .is_some_and(|provider| provider.connection_id == POLLING_CONNECTION);
        if !is_current {
            // A poller taking over is a new attach: refused while the relay drains.
            self.accepting()?;
            let provider = ProviderInfo {
                connection_id: POLLING_CONNECTION.to_owned(),
                transport: Transport::Polling,
                connected_at: now,
                last_seen: now,
            };
            self.store().set_provider(&code, provider).await?;
        }
        self.touch(&code, Some(POLLING_CONNECTION)).await?;
        let mut cancelled = Vec::new();
        for id in running.iter().take(MAX_RUNNING) {
            if let Some(record) = self.store().request(&code, id).await?
                && record.status == RequestStatus::Cancelled
                && record.delivered_to.as_deref() == Some(POLLING_CONNECTION)
            {
                cancelled.push(record.id);
            }
        }
        // A relay handing its tabs over hands out no new call: the poller's next poll, on
        // another relay, takes them.
        if self.drain().is_handing_over() {
            return Ok(Polled {
                cancelled,
                ..Polled::default()
            });
        }
        let claim = Claim {
            connection_id: POLLING_CONNECTION.to_owned(),
            now,
            lease_until: now.plus(self.config().poll_lease),
            limit: max.unwrap_or(usize::MAX),
            redeliver: false,
        };
        let claimed = self.store().claim(&code, &claim).await?;
        // The question open about a new caller is in every poll until it closes.
        let view = self.approval_view(&code).await?;
        let approving = view.approves;
        Ok(Polled {
            requests: claimed.iter().map(|record| record.tool_request()).collect(),
            cancelled,
            approval: view.asking.map(|(_, card)| card),
            callers: approving.then_some((view.allowed, view.refused)),
        })
    }
}

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

    async fn run(self, relay: &Relay, caller: &Caller) -> Result<Polled, RelayError> {
        let token = self.token.as_deref();
        let polled = relay.poll(&self.code, token, self.max, &self.running);
        relay.guarded_provider(caller, token, polled).await
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
