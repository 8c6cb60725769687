//! [`RelayApi`]: the relay's operations, on whichever side of a process boundary the relay is.
//!
//! The gateway depends on this trait only. [`Relay`] implements it in-process (the default,
//! one-process deployment); [`RemoteRelay`](crate::remote::RemoteRelay) implements it over
//! gRPC (split deployment). Errors are [`ErrorInfo`] in both cases.
//!
//! Every operation names its [`Caller`], so the relay applies its checks on every path — the
//! gateway's HTTP and MCP routes, the browser WebSocket, the gRPC port — in one place, here
//! ([`crate::limits`]): the brute-force guard on codes and handles, the budget of calls per
//! session, and for a client that reached the gRPC port directly (not through a gateway that
//! did it) its API key and budgets of sessions and tool calls. Transports only convert.

use std::time::Duration;

use async_trait::async_trait;
use serde_json::Value;
use toolrelay::wire::{GroupedManifest, ProviderResponse, ToolRequest, ToolResponse};

use crate::builtin::{Scope, ToolFailure, ToolInfo};
use crate::error::{ErrorInfo, RelayError};
use crate::limits::Caller;
use crate::provider::ProviderLink;
use crate::relay::{CallInput, NewSession, Relay, RequestView, ResponseOutcome, SessionStatus};
use crate::store::Transport;

/// The result of a relay operation.
pub type Outcome<T> = Result<T, ErrorInfo>;

/// What a front end (the gateway) needs from the relay. Each method is documented on the
/// [`Relay`] method of the same name.
#[async_trait]
pub trait RelayApi: Send + Sync + 'static {
    /// Whether the relay can serve (its store answers).
    async fn ready(&self) -> Outcome<()>;
    /// Creates a session.
    async fn create_session(&self, caller: &Caller) -> Outcome<NewSession>;
    /// Where a session stands.
    async fn session_status(&self, caller: &Caller, code: &str) -> Outcome<SessionStatus>;
    /// Where a session stands, asked by its provider (provider token): never refused by the
    /// brute-force guard.
    async fn provider_session_status(
        &self,
        caller: &Caller,
        code: &str,
        token: &str,
    ) -> Outcome<SessionStatus>;
    /// The code of the session an MCP connector handle belongs to.
    async fn resolve_handle(&self, caller: &Caller, handle: &str) -> Outcome<String>;
    /// Ends a session (provider token).
    async fn end_session(&self, caller: &Caller, code: &str, token: Option<&str>) -> Outcome<()>;
    /// The session's manifest, grouped.
    async fn manifest(&self, caller: &Caller, code: &str) -> Outcome<GroupedManifest>;
    /// Replaces the manifest (provider token); returns the number of functions.
    async fn register_manifest(
        &self,
        caller: &Caller,
        code: &str,
        token: Option<&str>,
        tools: &Value,
    ) -> Outcome<usize>;
    /// Queues a call.
    async fn submit(&self, caller: &Caller, code: &str, call: CallInput) -> Outcome<RequestView>;
    /// Waits up to `wait` for a call's answer.
    async fn await_response(
        &self,
        caller: &Caller,
        code: &str,
        request_id: &str,
        wait: Duration,
    ) -> Outcome<RequestView>;
    /// Queues a call and waits for its answer.
    async fn call(
        &self,
        caller: &Caller,
        code: &str,
        call: CallInput,
        wait: Option<Duration>,
    ) -> Outcome<RequestView>;
    /// Final answers of the session's calls.
    async fn responses(
        &self,
        caller: &Caller,
        code: &str,
        request_id: Option<&str>,
    ) -> Outcome<Vec<ToolResponse>>;
    /// Where one call stands.
    async fn request_status(
        &self,
        caller: &Caller,
        code: &str,
        request_id: &str,
    ) -> Outcome<RequestView>;
    /// Attaches a provider connection (provider token).
    async fn attach(
        &self,
        caller: &Caller,
        code: &str,
        token: Option<&str>,
        transport: Transport,
    ) -> Outcome<ProviderLink>;
    /// The polling fallback (provider token).
    async fn poll(
        &self,
        caller: &Caller,
        code: &str,
        token: Option<&str>,
        max: Option<usize>,
    ) -> Outcome<Vec<ToolRequest>>;
    /// A provider's answer to a call (provider token).
    async fn post_response(
        &self,
        caller: &Caller,
        code: &str,
        token: Option<&str>,
        response: ProviderResponse,
    ) -> Outcome<ResponseOutcome>;
    /// An item each time the session's manifest changes; ends with the session.
    async fn manifest_changes(
        &self,
        caller: &Caller,
        code: &str,
    ) -> Outcome<futures::stream::BoxStream<'static, ()>>;
    /// The built-in tools.
    async fn tools(&self, caller: &Caller) -> Outcome<Vec<ToolInfo>>;
    /// Runs a built-in tool outside any session: the tool's result or failure, once the call
    /// is let in (a refused call, or a relay that cannot be reached, is the outer error). The MIP tools share
    /// their slots fairly by `caller`'s address.
    async fn call_tool(
        &self,
        caller: &Caller,
        name: &str,
        args: Value,
        scope: Scope,
    ) -> Outcome<Result<Value, ToolFailure>>;
}

#[async_trait]
impl RelayApi for Relay {
    async fn ready(&self) -> Outcome<()> {
        if self.drain().is_draining() {
            return Err(RelayError::ShuttingDown.into());
        }
        Ok(Relay::ready(self).await?)
    }

    async fn create_session(&self, caller: &Caller) -> Outcome<NewSession> {
        self.limits().admit_session(caller).await?;
        Ok(Relay::create_session(self).await?)
    }

    async fn session_status(&self, caller: &Caller, code: &str) -> Outcome<SessionStatus> {
        self.limits().admit(caller)?;
        Ok(self
            .guarded(caller, Relay::session_status(self, code))
            .await?)
    }

    async fn provider_session_status(
        &self,
        caller: &Caller,
        code: &str,
        token: &str,
    ) -> Outcome<SessionStatus> {
        let status = async {
            self.authorized(code, Some(token)).await?;
            Relay::session_status(self, code).await
        };
        Ok(self.guarded_provider(caller, Some(token), status).await?)
    }

    async fn resolve_handle(&self, caller: &Caller, handle: &str) -> Outcome<String> {
        self.limits().admit(caller)?;
        let code = self
            .guarded(caller, Relay::resolve_handle(self, handle))
            .await?;
        Ok(code.as_str().to_owned())
    }

    async fn end_session(&self, caller: &Caller, code: &str, token: Option<&str>) -> Outcome<()> {
        Ok(self
            .guarded_provider(caller, token, Relay::end_session(self, code, token))
            .await?)
    }

    async fn manifest(&self, caller: &Caller, code: &str) -> Outcome<GroupedManifest> {
        self.limits().admit(caller)?;
        Ok(self.guarded(caller, Relay::manifest(self, code)).await?)
    }

    async fn register_manifest(
        &self,
        caller: &Caller,
        code: &str,
        token: Option<&str>,
        tools: &Value,
    ) -> Outcome<usize> {
        Ok(self
            .guarded_provider(
                caller,
                token,
                Relay::register_manifest(self, code, token, tools),
            )
            .await?)
    }

    async fn submit(&self, caller: &Caller, code: &str, call: CallInput) -> Outcome<RequestView> {
        self.limits().admit(caller)?;
        // The caller's budget is spent as the call is queued: one round trip to the store.
        let charge = self.limits().call_charge(caller, code);
        let call = traced(call, caller);
        Ok(self
            .guarded(
                caller,
                Relay::submit_charged(self, code, call, Some(charge)),
            )
            .await?)
    }

    async fn await_response(
        &self,
        caller: &Caller,
        code: &str,
        request_id: &str,
        wait: Duration,
    ) -> Outcome<RequestView> {
        self.limits().admit(caller)?;
        Ok(self
            .guarded(caller, Relay::await_response(self, code, request_id, wait))
            .await?)
    }

    async fn call(
        &self,
        caller: &Caller,
        code: &str,
        call: CallInput,
        wait: Option<Duration>,
    ) -> Outcome<RequestView> {
        self.limits().admit(caller)?;
        let charge = self.limits().call_charge(caller, code);
        let call = traced(call, caller);
        Ok(self
            .guarded(
                caller,
                Relay::call_charged(self, code, call, wait, Some(charge)),
            )
            .await?)
    }

    async fn responses(
        &self,
        caller: &Caller,
        code: &str,
        request_id: Option<&str>,
    ) -> Outcome<Vec<ToolResponse>> {
        self.limits().admit(caller)?;
        Ok(self
            .guarded(caller, Relay::responses(self, code, request_id))
            .await?)
    }

    async fn request_status(
        &self,
        caller: &Caller,
        code: &str,
        request_id: &str,
    ) -> Outcome<RequestView> {
        self.limits().admit(caller)?;
        Ok(self
            .guarded(caller, Relay::request_status(self, code, request_id))
            .await?)
    }

    async fn attach(
        &self,
        caller: &Caller,
        code: &str,
        token: Option<&str>,
        transport: Transport,
    ) -> Outcome<ProviderLink> {
        Ok(self
            .guarded_provider(caller, token, Relay::attach(self, code, token, transport))
            .await?)
    }

    async fn poll(
        &self,
        caller: &Caller,
        code: &str,
        token: Option<&str>,
        max: Option<usize>,
    ) -> Outcome<Vec<ToolRequest>> {
        Ok(self
            .guarded_provider(caller, token, Relay::poll(self, code, token, max))
            .await?)
    }

    async fn post_response(
        &self,
        caller: &Caller,
        code: &str,
        token: Option<&str>,
        response: ProviderResponse,
    ) -> Outcome<ResponseOutcome> {
        Ok(self
            .guarded_provider(
                caller,
                token,
                Relay::post_response(self, code, token, response),
            )
            .await?)
    }

    async fn manifest_changes(
        &self,
        caller: &Caller,
        code: &str,
    ) -> Outcome<futures::stream::BoxStream<'static, ()>> {
        self.limits().admit(caller)?;
        Ok(self
            .guarded(caller, Relay::manifest_changes(self, code))
            .await?)
    }

    async fn tools(&self, caller: &Caller) -> Outcome<Vec<ToolInfo>> {
        self.limits().admit(caller)?;
        Ok(Relay::tools(self))
    }

    async fn call_tool(
        &self,
        caller: &Caller,
        name: &str,
        args: Value,
        scope: Scope,
    ) -> Outcome<Result<Value, ToolFailure>> {
        self.limits().admit_tool_call(caller).await?;
        Ok(Relay::call_tool(self, name, args, scope, caller.address).await)
    }
}

/// A call carrying its caller's correlation id, unless it has one.
fn traced(mut call: CallInput, caller: &Caller) -> CallInput {
    if call.correlation_id.is_none() {
        call.correlation_id.clone_from(&caller.correlation_id);
    }
    call
}

impl Relay {
    /// Runs an operation on a code or handle for `caller` under the brute-force guard
    /// ([`crate::limits::Limits::guarded`]). Every transport goes through it.
    pub async fn guarded<T>(
        &self,
        caller: &Caller,
        operation: impl Future<Output = Result<T, RelayError>>,
    ) -> Result<T, RelayError> {
        self.limits().guarded(caller, operation).await
    }

    /// Runs a provider's operation (provider token) under the brute-force guard, which never
    /// refuses a valid token ([`crate::limits::Limits::guarded_provider`]).
    pub async fn guarded_provider<T>(
        &self,
        caller: &Caller,
        token: Option<&str>,
        operation: impl Future<Output = Result<T, RelayError>>,
    ) -> Result<T, RelayError> {
        self.limits()
            .guarded_provider(caller, token, operation)
            .await
    }
}
