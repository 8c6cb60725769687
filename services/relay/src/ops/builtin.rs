//! Built-in tools' operations: listing them, and running one outside a session.

use serde_json::Value;
use tonic::Status;
use toolrelay::convert::Malformed;
use toolrelay::json::{from_struct, to_struct};
use toolrelay::proto::v1 as pb;

use crate::api::Outcome;
use crate::builtin::{FailureKind, Scope, ToolCode, ToolFailure, ToolInfo};
use crate::convert::{tool_run, tool_run_message};
use crate::error::RelayError;
use crate::limits::Caller;
use crate::operation::{Admit, Checks, Credential, Credentials, Guard, Operation, Visitor};
use crate::pool::Retry;
use crate::relay::Relay;
use crate::remote::RemoteRelay;

/// The built-in tools.
#[derive(Debug, Clone, Default)]
pub struct ListTools;

impl Operation for ListTools {
    const PATH: &'static str = "/toolrelay.v1.Relay/ListTools";
    const RETRY: Retry = Retry::Safe;
    type Message = pb::ListToolsRequest;
    type Reply = pb::ListToolsResponse;
    type Output = Vec<ToolInfo>;

    const CHECKS: Checks = Checks {
        admit: Admit::Request,
        guard: Guard::Nothing,
    };

    async fn step(self, relay: &Relay, _: &Caller) -> Result<Vec<ToolInfo>, RelayError> {
        Ok(relay.tools())
    }

    fn into_message(self) -> (Self::Message, Credential) {
        (pb::ListToolsRequest {}, Credential::None)
    }

    fn from_message(_: Self::Message, _: Credentials) -> Result<Self, Status> {
        Ok(Self)
    }

    fn reply(output: Vec<ToolInfo>) -> Self::Reply {
        pb::ListToolsResponse {
            tools: output.into_iter().map(Into::into).collect(),
        }
    }

    fn output(reply: Self::Reply) -> Result<Vec<ToolInfo>, Malformed> {
        Ok(reply.tools.into_iter().map(Into::into).collect())
    }
}

/// Runs a built-in tool outside any session: the tool's result or failure, once the call is
/// let in (a refused call, or a relay that cannot be reached, is the outer error). The MIP
/// tools share their slots fairly by the caller's address.
#[derive(Debug, Clone)]
pub struct CallTool {
    /// The tool.
    pub name: String,
    /// Its arguments.
    pub args: Value,
    /// Whose state a stateful tool keeps.
    pub scope: Scope,
}

impl Operation for CallTool {
    const PATH: &'static str = "/toolrelay.v1.Relay/CallTool";
    // A tool's run is not repeated: a caller whose relay died asks again itself.
    const RETRY: Retry = Retry::IfNotSent;
    type Message = pb::CallToolRequest;
    type Reply = pb::CallToolResponse;
    type Output = Result<Value, ToolFailure>;

    const CHECKS: Checks = Checks {
        admit: Admit::ToolCall,
        guard: Guard::Nothing,
    };

    async fn step(self, relay: &Relay, caller: &Caller) -> Result<Self::Output, RelayError> {
        Ok(relay
            .call_tool(&self.name, self.args, self.scope, caller.address)
            .await)
    }

    fn into_message(self) -> (Self::Message, Credential) {
        let message = pb::CallToolRequest {
            name: self.name,
            args: Some(to_struct(&self.args)),
            scope: self.scope.into(),
        };
        (message, Credential::None)
    }

    fn from_message(message: Self::Message, _: Credentials) -> Result<Self, Status> {
        Ok(Self {
            scope: Scope::try_from(message.scope)?,
            args: message.args.as_ref().map_or(Value::Null, from_struct),
            name: message.name,
        })
    }

    fn reply(output: Self::Output) -> Self::Reply {
        tool_run_message(output)
    }

    fn output(reply: Self::Reply) -> Result<Self::Output, Malformed> {
        Ok(tool_run(reply))
    }

    async fn send(self, remote: &RemoteRelay, caller: &Caller) -> Outcome<Self::Output> {
        if let Err(error) = remote.check_depth(&self.args, "The arguments are") {
            return Ok(Err(ToolFailure::new(
                FailureKind::BadInput,
                ToolCode::NestedTooDeeply,
                error.message,
            )));
        }
        remote.unary(caller, self).await
    }
}

/// This family's operations, for the gRPC server's routes ([`crate::operation::each`]).
pub(super) fn operations(visitor: &mut impl Visitor) {
    visitor.visit::<ListTools>();
    visitor.visit::<CallTool>();
}
