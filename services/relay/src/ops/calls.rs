//! Calls' operations: queueing a caller's call, and calling and waiting.

use std::time::Duration;

use tonic::Status;
use toolrelay::convert::Malformed;
use toolrelay::json::to_struct;
use toolrelay::proto::v1 as pb;

use crate::api::Outcome;
use crate::code::{self, SessionCode};
use crate::error::RelayError;
use crate::limits::Caller;
use crate::operation::{
    Admit, Checks, Credential, Credentials, Guard, Guarded, Operation, Visitor,
};
use crate::pool::Retry;
use crate::relay::approvals::{Asker, Named};
use crate::relay::{CallInput, Relay, RequestView};
use crate::remote::RemoteRelay;
use crate::store::RateCharge;

/// Queues a call; answers at once.
#[derive(Debug, Clone)]
pub struct Submit {
    /// The session code.
    pub code: String,
    /// The call.
    pub call: CallInput,
}

impl Operation for Submit {
    const PATH: &'static str = "/toolrelay.v1.Relay/Submit";
    // Named by its request id, so asking another replica again is the same call.
    const RETRY: Retry = Retry::Safe;
    type Message = pb::SubmitRequest;
    type Reply = pb::RequestState;
    type Output = RequestView;

    // The caller's request budget is spent once the session is found (`admitted`: a mistyped
    // code costs only its count in the guard), and its call budget with the call's queueing.
    const CHECKS: Checks = Checks {
        admit: Admit::Nothing,
        guard: Guard::Named,
    };

    fn guarded(&self) -> Guarded {
        Guarded {
            session: self.code.clone(),
            ..Guarded::default()
        }
    }

    async fn step(self, relay: &Relay, caller: &Caller) -> Result<RequestView, RelayError> {
        let (code, named) = relay.named_session(&self.code).await?;
        let (call, charge) = admitted(relay, caller, &code, &named, self.call)?;
        relay.submit_charged(&code, call, Some(charge)).await
    }

    fn into_message(self) -> (Self::Message, Credential) {
        let call = self.call;
        let message = pb::SubmitRequest {
            code: self.code,
            request_id: call.request_id.unwrap_or_default(),
            tool_id: call.tool_id.unwrap_or_default(),
            function_name: call.function_name,
            args: Some(to_struct(&call.args)),
            read_only: call.read_only,
        };
        (message, Credential::None)
    }

    fn from_message(message: Self::Message, _: Credentials) -> Result<Self, Status> {
        let call = CallInput::from_message(
            message.request_id,
            message.tool_id,
            message.function_name,
            message.args,
            message.read_only,
        );
        Ok(Self {
            code: message.code,
            call,
        })
    }

    fn reply(output: RequestView) -> Self::Reply {
        output.into()
    }

    fn output(reply: Self::Reply) -> Result<RequestView, Malformed> {
        Ok(reply.into())
    }

    async fn send(mut self, remote: &RemoteRelay, caller: &Caller) -> Outcome<RequestView> {
        prepare_to_send(remote, &mut self.call)?;
        remote.unary(caller, self).await
    }
}

/// Queues a call and waits for its answer, up to `wait` (the relay's default when `None`).
#[derive(Debug, Clone)]
pub struct Call {
    /// The session code.
    pub code: String,
    /// The call.
    pub call: CallInput,
    /// How long to wait for the answer.
    pub wait: Option<Duration>,
    /// Answer as soon as the call has news (its tab's progress, a log message), with them.
    pub news: bool,
}

impl Operation for Call {
    const PATH: &'static str = "/toolrelay.v1.Relay/Call";
    // A wait cut off by its replica's death goes on, on another replica: the call is named.
    const RETRY: Retry = Retry::Safe;
    type Message = pb::CallRequest;
    type Reply = pb::RequestState;
    type Output = RequestView;

    // The caller's request budget is spent once the session is found (`admitted`: a mistyped
    // code costs only its count in the guard), and its call budget with the call's queueing.
    const CHECKS: Checks = Checks {
        admit: Admit::Nothing,
        guard: Guard::Named,
    };

    fn guarded(&self) -> Guarded {
        Guarded {
            session: self.code.clone(),
            ..Guarded::default()
        }
    }

    async fn step(self, relay: &Relay, caller: &Caller) -> Result<RequestView, RelayError> {
        let (code, named) = relay.named_session(&self.code).await?;
        let (call, charge) = admitted(relay, caller, &code, &named, self.call)?;
        relay
            .call_charged(&code, call, self.wait, self.news, Some(charge))
            .await
    }

    fn into_message(self) -> (Self::Message, Credential) {
        let call = self.call;
        let message = pb::CallRequest {
            code: self.code,
            request_id: call.request_id.unwrap_or_default(),
            tool_id: call.tool_id.unwrap_or_default(),
            function_name: call.function_name,
            args: Some(to_struct(&call.args)),
            timeout_ms: self.wait.map_or(0, wire_millis),
            read_only: call.read_only,
            news: self.news,
        };
        (message, Credential::None)
    }

    fn from_message(message: Self::Message, _: Credentials) -> Result<Self, Status> {
        let wait =
            (message.timeout_ms > 0).then(|| Duration::from_millis(u64::from(message.timeout_ms)));
        let call = CallInput::from_message(
            message.request_id,
            message.tool_id,
            message.function_name,
            message.args,
            message.read_only,
        );
        Ok(Self {
            code: message.code,
            call,
            wait,
            news: message.news,
        })
    }

    fn reply(output: RequestView) -> Self::Reply {
        output.into()
    }

    fn output(reply: Self::Reply) -> Result<RequestView, Malformed> {
        Ok(reply.into())
    }

    async fn send(mut self, remote: &RemoteRelay, caller: &Caller) -> Outcome<RequestView> {
        // A caller cut off by the drain is told which call to ask for.
        let request_id = prepare_to_send(remote, &mut self.call)?;
        let code = self.code.clone();
        remote
            .waiting(&code, &request_id, remote.unary(caller, self))
            .await
    }
}

/// A call let in for `caller`: the budget it spends as it is queued (one round trip to the
/// store), and the call carrying its caller's correlation id, unless it has one.
fn admitted(
    relay: &Relay,
    caller: &Caller,
    code: &SessionCode,
    named: &Named,
    mut call: CallInput,
) -> Result<(CallInput, RateCharge), RelayError> {
    let limits = relay.limits();
    limits.admit(caller)?;
    let key = limits.caller_key(caller);
    let charge = limits.call_charge_in(&key, code);
    if call.correlation_id.is_none() {
        call.correlation_id.clone_from(&caller.correlation_id);
    }
    call.approval = Relay::approval_check(named, &key);
    call.asker = Some(Asker::of(caller));
    call.caller = Some(key);
    Ok((call, charge))
}

/// What a front end does before it sends a call to a remote relay: refuses it while draining
/// or when its arguments are nested too deeply to cross gRPC, and names it, so that asking
/// another replica again is the same call. Its request id.
fn prepare_to_send(remote: &RemoteRelay, call: &mut CallInput) -> Outcome<String> {
    remote.accepting()?;
    remote.check_depth(&call.args, "The arguments are")?;
    Ok(call.request_id.get_or_insert_with(code::unique_id).clone())
}

/// A wait as the wire carries it: milliseconds, at most `u32::MAX`.
pub(crate) fn wire_millis(duration: Duration) -> u32 {
    u32::try_from(duration.as_millis()).unwrap_or(u32::MAX)
}

/// This family's operations, for the gRPC server's routes ([`crate::operation::each`]).
pub(super) fn operations(visitor: &mut impl Visitor) {
    visitor.visit::<Submit>();
    visitor.visit::<Call>();
}
