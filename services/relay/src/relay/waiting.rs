//! Waiting: a caller waiting for a call's answer, and reading answers and calls.

use std::time::Duration;

use futures::StreamExt;
use tonic::Status;
use toolrelay::convert::{Malformed, non_empty};
use toolrelay::proto::v1 as pb;
use toolrelay::wire::ToolResponse;

use super::calls::wire_millis;
use super::{Relay, RequestView, not_found};
use crate::api::Outcome;
use crate::code::SessionCode;
use crate::error::RelayError;
use crate::limits::Caller;
use crate::operation::{Credential, Credentials, Operation, Visitor};
use crate::pool::Retry;
use crate::remote::RemoteRelay;
use crate::store::{BUILTIN_LEASE, EventStream, RequestRecord, SessionEvent};

impl Relay {
    /// Waits up to `wait` for a call's final answer; returns its state either way. A call is
    /// its caller's: to any other `reader` (a caller's key; `None`: the relay) it is not
    /// found.
    pub async fn await_response(
        &self,
        code: &str,
        request_id: &str,
        wait: Duration,
        reader: Option<&str>,
    ) -> Result<RequestView, RelayError> {
        let code = self.session_code(code).await?;
        // Whether the session exists, the first look at the call says.
        let events = self
            .inner
            .store
            .listen_for_answer(&code, request_id)
            .await?;
        self.wait_for_answer(&code, request_id, wait, events, None, reader)
            .await
    }

    /// Waits, on `events` (the call's answer and what ends a wait, listened to before `known`
    /// was read, if it was), up to `wait` for a call's final answer; returns its state either
    /// way. The call must be `reader`'s (see [`Relay::request_record`]).
    pub(super) async fn wait_for_answer(
        &self,
        code: &SessionCode,
        request_id: &str,
        wait: Duration,
        mut events: EventStream,
        mut known: Option<RequestRecord>,
        reader: Option<&str>,
    ) -> Result<RequestView, RelayError> {
        let wait_until = self.now().plus(wait);
        // A waiting caller holds a stopping relay open until its answer comes or the drain
        // ends; then it is told to ask again.
        let _hold = self.inner.drain.hold();
        let mut drained = std::pin::pin!(self.inner.drain.ended());
        loop {
            let record = match known.take() {
                Some(record) => record,
                None => self.request_record(code, request_id, reader).await?,
            };
            let now = self.now();
            if record.status.is_terminal() || now >= wait_until {
                return self.view(code, record).await;
            }
            if record.is_orphaned_builtin(now) {
                self.run_builtin(code.clone(), &record);
            }
            // A built-in call is looked at again when its lease would run out: if its replica
            // is gone by then, this one takes it over.
            let lease = record
                .lease_until
                .filter(|_| record.builtin)
                .map_or(record.deadline, |lease| {
                    lease.max(now.plus(BUILTIN_LEASE / 10))
                });
            let wake = self
                .inner
                .clock
                .instant(wait_until.min(record.deadline).min(lease));
            // Any event is this call's (its answer; lost events: look again), or the end.
            tokio::select! {
                event = events.next() => match event {
                    Some(SessionEvent::ResponseReady { id, record }) if id == request_id => {
                        known = record.map(|record| *record);
                    }
                    Some(SessionEvent::SessionEnded) | None => return Err(not_found(code)),
                    Some(_) => {}
                },
                () = tokio::time::sleep_until(wake) => {}
                () = &mut drained => {
                    return Err(RelayError::Drained {
                        code: code.display(),
                        request_id: request_id.to_owned(),
                    });
                }
            }
        }
    }

    /// Final answers of the calls `reader` (a caller's key; `None`: every call's) made in the
    /// session, oldest first (or only `request_id`'s). Reading does not consume them.
    pub async fn responses(
        &self,
        code: &str,
        request_id: Option<&str>,
        reader: Option<&str>,
    ) -> Result<Vec<ToolResponse>, RelayError> {
        let (code, _) = self.live_session(code).await?;
        let responses = match request_id {
            Some(id) => match self.inner.store.request(&code, id).await? {
                Some(record) if !record.made_by(reader) => Vec::new(),
                Some(record) if record.evicted => {
                    return Err(RelayError::ResponseEvicted {
                        request_id: record.id,
                    });
                }
                record => record
                    .and_then(|record| record.response)
                    .into_iter()
                    .collect(),
            },
            None => self
                .inner
                .store
                .responses(&code, reader)
                .await?
                .unwrap_or_default(),
        };
        Ok(responses)
    }

    /// Where one call stands, for `reader` (see [`Relay::await_response`]).
    pub async fn request_status(
        &self,
        code: &str,
        request_id: &str,
        reader: Option<&str>,
    ) -> Result<RequestView, RelayError> {
        let code = self.session_code(code).await?;
        let record = self.request_record(&code, request_id, reader).await?;
        // A caller polling a built-in call whose replica died is what takes it over here.
        if record.is_orphaned_builtin(self.now()) {
            self.run_builtin(code.clone(), &record);
        }
        self.view(&code, record).await
    }

    /// The call `request_id`, if `reader` (a caller's key; `None`: the relay) made it: a call
    /// and its answer are its caller's alone, and to another caller it is a call the session
    /// does not have (ids the relay makes are 128 random bits; one a caller chose is no key to
    /// another caller's call).
    pub(super) async fn request_record(
        &self,
        code: &SessionCode,
        request_id: &str,
        reader: Option<&str>,
    ) -> Result<RequestRecord, RelayError> {
        match self.inner.store.request(code, request_id).await? {
            Some(record) if record.made_by(reader) => Ok(record),
            Some(_) => {
                tracing::warn!(code = %code.redacted(), request_id, "a caller asked for another caller's call");
                Err(RelayError::RequestNotFound {
                    code: code.display(),
                    request_id: request_id.to_owned(),
                })
            }
            None if self.inner.store.session(code).await?.is_none() => Err(not_found(code)),
            None => Err(RelayError::RequestNotFound {
                code: code.display(),
                request_id: request_id.to_owned(),
            }),
        }
    }
}

/// Waits up to `wait` for a call's answer; answers where the call stands either way.
#[derive(Debug, Clone)]
pub struct AwaitResponse {
    /// The session code.
    pub code: String,
    /// The call.
    pub request_id: String,
    /// How long to wait.
    pub wait: Duration,
}

impl Operation for AwaitResponse {
    const PATH: &'static str = "/toolrelay.v1.Relay/AwaitResponse";
    // A wait cut off by its replica's death goes on, on another replica.
    const RETRY: Retry = Retry::Safe;
    type Message = pb::AwaitResponseRequest;
    type Reply = pb::RequestState;
    type Output = RequestView;

    async fn run(self, relay: &Relay, caller: &Caller) -> Result<RequestView, RelayError> {
        relay.limits().admit(caller)?;
        let key = relay.limits().caller_key(caller);
        let waited = async {
            relay.approved(caller, &self.code).await?;
            relay
                .await_response(&self.code, &self.request_id, self.wait, Some(&key))
                .await
        };
        relay.guarded(caller, &self.code, waited).await
    }

    fn into_message(self) -> (Self::Message, Credential) {
        let message = pb::AwaitResponseRequest {
            code: self.code,
            request_id: self.request_id,
            wait_ms: wire_millis(self.wait),
        };
        (message, Credential::None)
    }

    fn from_message(message: Self::Message, _: Credentials) -> Result<Self, Status> {
        Ok(Self {
            code: message.code,
            request_id: message.request_id,
            wait: Duration::from_millis(u64::from(message.wait_ms)),
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

    async fn run(self, relay: &Relay, caller: &Caller) -> Result<Vec<ToolResponse>, RelayError> {
        relay.limits().admit(caller)?;
        let key = relay.limits().caller_key(caller);
        let responses = async {
            relay.approved(caller, &self.code).await?;
            relay
                .responses(&self.code, self.request_id.as_deref(), Some(&key))
                .await
        };
        relay.guarded(caller, &self.code, responses).await
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

    async fn run(self, relay: &Relay, caller: &Caller) -> Result<RequestView, RelayError> {
        relay.limits().admit(caller)?;
        let key = relay.limits().caller_key(caller);
        let status = async {
            let view = relay
                .request_status(&self.code, &self.request_id, Some(&key))
                .await?;
            relay.readable(caller, &self.code, &view).await?;
            Ok(view)
        };
        relay.guarded(caller, &self.code, status).await
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
