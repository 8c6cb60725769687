//! Manifests' operations: a session's tools, as its tab registers them and callers read them.

use serde_json::Value;
use tonic::Status;
use toolrelay::convert::{Malformed, registered_tools};
use toolrelay::proto::v1 as pb;
use toolrelay::wire::GroupedManifest;

use crate::convert::count;
use crate::error::RelayError;
use crate::limits::Caller;
use crate::operation::{
    Admit, Checks, Credential, Credentials, Guard, Guarded, Operation, Visitor,
};
use crate::pool::Retry;
use crate::relay::Relay;

/// The session's manifest, grouped.
#[derive(Debug, Clone)]
pub struct GetManifest {
    /// The session code.
    pub code: String,
}

impl Operation for GetManifest {
    const PATH: &'static str = "/toolrelay.v1.Relay/GetManifest";
    const RETRY: Retry = Retry::Safe;
    type Message = pb::GetManifestRequest;
    type Reply = pb::Manifest;
    type Output = GroupedManifest;

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

    async fn step(self, relay: &Relay, caller: &Caller) -> Result<GroupedManifest, RelayError> {
        relay.approved(caller, &self.code).await?;
        relay.manifest(&self.code).await
    }

    fn into_message(self) -> (Self::Message, Credential) {
        (pb::GetManifestRequest { code: self.code }, Credential::None)
    }

    fn from_message(message: Self::Message, _: Credentials) -> Result<Self, Status> {
        Ok(Self { code: message.code })
    }

    fn reply(output: GroupedManifest) -> Self::Reply {
        (&output).into()
    }

    fn output(reply: Self::Reply) -> Result<GroupedManifest, Malformed> {
        Ok(reply.into())
    }
}

/// Replaces the manifest (provider token); answers the number of functions.
#[derive(Debug, Clone)]
pub struct RegisterManifest {
    /// The session code.
    pub code: String,
    /// The provider token.
    pub token: Option<String>,
    /// The tools, as the provider wrote them.
    pub tools: Value,
    /// Whether the person approves each new caller in the tab.
    pub approves: bool,
}

impl Operation for RegisterManifest {
    const PATH: &'static str = "/toolrelay.v1.Relay/RegisterManifest";
    // The same manifest again is the same manifest.
    const RETRY: Retry = Retry::Safe;
    type Message = pb::RegisterManifestRequest;
    type Reply = pb::RegisterManifestResponse;
    type Output = usize;

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

    async fn step(self, relay: &Relay, _: &Caller) -> Result<usize, RelayError> {
        let token = self.token.as_deref();
        // Approval is on before the tools are there to be called.
        let (code, _) = relay.authorized(&self.code, token).await?;
        relay.set_approving(&code, self.approves).await?;
        relay
            .register_manifest(&self.code, token, &self.tools)
            .await
    }

    fn into_message(self) -> (Self::Message, Credential) {
        let message = pb::RegisterManifestRequest {
            code: self.code,
            tools: Vec::new(),
            tools_json: self.tools.to_string(),
            approves: self.approves,
        };
        (message, Credential::token(self.token))
    }

    fn from_message(message: Self::Message, credentials: Credentials) -> Result<Self, Status> {
        Ok(Self {
            tools: registered_tools(&message.tools, &message.tools_json),
            code: message.code,
            token: credentials.bearer,
            approves: message.approves,
        })
    }

    fn reply(output: usize) -> Self::Reply {
        pb::RegisterManifestResponse {
            tool_count: count(output),
        }
    }

    fn output(reply: Self::Reply) -> Result<usize, Malformed> {
        Ok(reply.tool_count as usize)
    }
}

/// This family's operations, for the gRPC server's routes ([`crate::operation::each`]).
pub(super) fn operations(visitor: &mut impl Visitor) {
    visitor.visit::<GetManifest>();
    visitor.visit::<RegisterManifest>();
}
