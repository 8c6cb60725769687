//! [`RelayApi`]: the relay's operations, on whichever side of a process boundary the relay is.
//!
//! The gateway depends on this trait only. [`Relay`] implements it in-process (the default,
//! one-process deployment); [`RemoteRelay`](crate::remote::RemoteRelay) implements it over
//! gRPC (split deployment). Errors are [`ErrorInfo`] in both cases.

use std::time::Duration;

use async_trait::async_trait;
use serde_json::Value;
use toolrelay::wire::{GroupedManifest, ProviderResponse, ToolRequest, ToolResponse};

use crate::builtin::{Scope, ToolFailure, ToolInfo};
use crate::error::ErrorInfo;
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
    async fn create_session(&self) -> Outcome<NewSession>;
    /// Where a session stands.
    async fn session_status(&self, code: &str) -> Outcome<SessionStatus>;
    /// The code of the session an MCP connector handle belongs to.
    async fn resolve_handle(&self, handle: &str) -> Outcome<String>;
    /// Ends a session (provider token).
    async fn end_session(&self, code: &str, token: Option<&str>) -> Outcome<()>;
    /// The session's manifest, grouped.
    async fn manifest(&self, code: &str) -> Outcome<GroupedManifest>;
    /// Replaces the manifest (provider token); returns the number of functions.
    async fn register_manifest(
        &self,
        code: &str,
        token: Option<&str>,
        tools: &Value,
    ) -> Outcome<usize>;
    /// Queues a call.
    async fn submit(&self, code: &str, call: CallInput) -> Outcome<RequestView>;
    /// Waits up to `wait` for a call's answer.
    async fn await_response(
        &self,
        code: &str,
        request_id: &str,
        wait: Duration,
    ) -> Outcome<RequestView>;
    /// Queues a call and waits for its answer.
    async fn call(
        &self,
        code: &str,
        call: CallInput,
        wait: Option<Duration>,
    ) -> Outcome<RequestView>;
    /// Final answers of the session's calls.
    async fn responses(&self, code: &str, request_id: Option<&str>) -> Outcome<Vec<ToolResponse>>;
    /// Where one call stands.
    async fn request_status(&self, code: &str, request_id: &str) -> Outcome<RequestView>;
    /// Attaches a provider connection (provider token).
    async fn attach(
        &self,
        code: &str,
        token: Option<&str>,
        transport: Transport,
    ) -> Outcome<ProviderLink>;
    /// The polling fallback (provider token).
    async fn poll(
        &self,
        code: &str,
        token: Option<&str>,
        max: Option<usize>,
    ) -> Outcome<Vec<ToolRequest>>;
    /// A provider's answer to a call (provider token).
    async fn post_response(
        &self,
        code: &str,
        token: Option<&str>,
        response: ProviderResponse,
    ) -> Outcome<ResponseOutcome>;
    /// The built-in tools.
    async fn tools(&self) -> Outcome<Vec<ToolInfo>>;
    /// Runs a built-in tool outside any session; a relay that cannot be reached is an
    /// `Internal` failure.
    async fn call_tool(&self, name: &str, args: Value, scope: Scope) -> Result<Value, ToolFailure>;
}

#[async_trait]
impl RelayApi for Relay {
    async fn ready(&self) -> Outcome<()> {
        Ok(Relay::ready(self).await?)
    }

    async fn create_session(&self) -> Outcome<NewSession> {
        Ok(Relay::create_session(self).await?)
    }

    async fn session_status(&self, code: &str) -> Outcome<SessionStatus> {
        Ok(Relay::session_status(self, code).await?)
    }

    async fn resolve_handle(&self, handle: &str) -> Outcome<String> {
        Ok(Relay::resolve_handle(self, handle)
            .await?
            .as_str()
            .to_owned())
    }

    async fn end_session(&self, code: &str, token: Option<&str>) -> Outcome<()> {
        Ok(Relay::end_session(self, code, token).await?)
    }

    async fn manifest(&self, code: &str) -> Outcome<GroupedManifest> {
        Ok(Relay::manifest(self, code).await?)
    }

    async fn register_manifest(
        &self,
        code: &str,
        token: Option<&str>,
        tools: &Value,
    ) -> Outcome<usize> {
        Ok(Relay::register_manifest(self, code, token, tools).await?)
    }

    async fn submit(&self, code: &str, call: CallInput) -> Outcome<RequestView> {
        Ok(Relay::submit(self, code, call).await?)
    }

    async fn await_response(
        &self,
        code: &str,
        request_id: &str,
        wait: Duration,
    ) -> Outcome<RequestView> {
        Ok(Relay::await_response(self, code, request_id, wait).await?)
    }

    async fn call(
        &self,
        code: &str,
        call: CallInput,
        wait: Option<Duration>,
    ) -> Outcome<RequestView> {
        Ok(Relay::call(self, code, call, wait).await?)
    }

    async fn responses(&self, code: &str, request_id: Option<&str>) -> Outcome<Vec<ToolResponse>> {
        Ok(Relay::responses(self, code, request_id).await?)
    }

    async fn request_status(&self, code: &str, request_id: &str) -> Outcome<RequestView> {
        Ok(Relay::request_status(self, code, request_id).await?)
    }

    async fn attach(
        &self,
        code: &str,
        token: Option<&str>,
        transport: Transport,
    ) -> Outcome<ProviderLink> {
        Ok(Relay::attach(self, code, token, transport).await?)
    }

    async fn poll(
        &self,
        code: &str,
        token: Option<&str>,
        max: Option<usize>,
    ) -> Outcome<Vec<ToolRequest>> {
        Ok(Relay::poll(self, code, token, max).await?)
    }

    async fn post_response(
        &self,
        code: &str,
        token: Option<&str>,
        response: ProviderResponse,
    ) -> Outcome<ResponseOutcome> {
        Ok(Relay::post_response(self, code, token, response).await?)
    }

    async fn tools(&self) -> Outcome<Vec<ToolInfo>> {
        Ok(Relay::tools(self))
    }

    async fn call_tool(&self, name: &str, args: Value, scope: Scope) -> Result<Value, ToolFailure> {
        Relay::call_tool(self, name, args, scope).await
    }
}
