//! What an LLM calls: read a session's tools, call them, read the answers. These operations
//! make up `/openapi/actions.json`, the file to import as GPT Actions, so their summaries and
//! descriptions are written for a model and kept under 300 characters.

use std::time::Duration;

use poem_openapi::param::{Path, Query};
use poem_openapi::payload::Json;
use poem_openapi::{ApiResponse, OpenApi};
use serde_json::Value;
use toolrelay_relay::CallInput;

use super::{Client, State, Tag};
use crate::error::ApiError;
use crate::types::{
    Arguments, CallResponse, CallState, MakeCall, Metadata, QueueCall, Queued, SessionInfo,
};

/// Longest wait of `GET …/response?wait=`.
const MAX_RESPONSE_WAIT: Duration = Duration::from_secs(30);
/// Wait of `POST …/call` without `timeoutMs`.
const DEFAULT_CALL_WAIT: Duration = Duration::from_secs(25);
/// Longest wait of `POST …/call` (GPT Actions give up after 45 s).
const MAX_CALL_WAIT: Duration = Duration::from_secs(40);
/// How often a wait for any answer looks again.
const LIST_POLL: Duration = Duration::from_millis(200);

/// The LLM-side operations.
pub struct LlmApi {
    /// Shared state.
    pub state: State,
}

/// A queued call.
#[derive(ApiResponse)]
pub enum QueuedCall {
    /// The call is queued; read its answer with getResponses or getCall.
    #[oai(status = 202)]
    Accepted(Json<Queued>),
}

/// The answer of a call, or where it stands.
#[derive(ApiResponse)]
pub enum CallOutcome {
    /// The tool answered (success or failure).
    #[oai(status = 200)]
    Answered(Json<CallResponse>),
    /// Still running: get the answer later with getCall and this requestId.
    #[oai(status = 202)]
    Pending(Json<Queued>),
}

#[OpenApi(tag = "Tag::Llm")]
impl LlmApi {
    /// Get a session's status
    ///
    /// Whether the user's tab is connected, how many tools it offers, when the session
    /// expires. A 404 means the code is wrong or expired: ask the user for the current code.
    #[oai(
        path = "/api/sessions/:code",
        method = "get",
        operation_id = "getSession"
    )]
    async fn get_session(
        &self,
        /// The pairing code the user gave you, e.g. ABCD-EFGH.
        code: Path<String>,
        client: Client,
    ) -> Result<Json<SessionInfo>, ApiError> {
        let ip = client.0;
        let status = self
            .state
            .guarded(ip, self.state.relay.session_status(&code))
            .await?;
        Ok(Json(status.into()))
    }

    /// List the tools of a session (call this first)
    ///
    /// Returns the tools the user's tab offers: each function's name, description and JSON
    /// Schema of its args. Use them with callTool.
    #[oai(
        path = "/api/sessions/:code/metadata",
        method = "get",
        operation_id = "getMetadata"
    )]
    async fn get_metadata(
        &self,
        /// The pairing code the user gave you, e.g. ABCD-EFGH.
        code: Path<String>,
        client: Client,
    ) -> Result<Json<Metadata>, ApiError> {
        let ip = client.0;
        let manifest = self
            .state
            .guarded(ip, self.state.relay.manifest(&code))
            .await?;
        Ok(Json(manifest.into()))
    }

    /// Call a tool and wait for its answer
    ///
    /// Runs functionName with args in the user's tab and returns the answer (200). If it takes
    /// longer than timeoutMs, returns 202 with the requestId: then use getCall.
    #[oai(
        path = "/api/sessions/:code/call",
        method = "post",
        operation_id = "callTool"
    )]
    async fn call_tool(
        &self,
        /// The pairing code the user gave you, e.g. ABCD-EFGH.
        code: Path<String>,
        body: Json<MakeCall>,
        client: Client,
    ) -> Result<CallOutcome, ApiError> {
        let ip = client.0;
        self.state.limits.call(ip, &code)?;
        let body = body.0;
        let wait = body
            .timeout_ms
            .map_or(DEFAULT_CALL_WAIT, Duration::from_millis)
            .min(MAX_CALL_WAIT);
        let call = call_input(body.request_id, body.tool_id, body.function_name, body.args);
        let view = self
            .state
            .guarded(ip, self.state.relay.call(&code, call, Some(wait)))
            .await?;
        Ok(match view.response {
            Some(response) => CallOutcome::Answered(Json(response.into())),
            None => CallOutcome::Pending(Json(Queued {
                request_id: view.request_id,
                status: view.status.into(),
            })),
        })
    }

    /// Queue a tool call without waiting
    ///
    /// Queues functionName with args for the user's tab and returns its requestId at once
    /// (202). Read the answer with getResponses (wait up to 30 s) or getCall.
    #[oai(
        path = "/api/sessions/:code/request",
        method = "post",
        operation_id = "queueCall"
    )]
    async fn queue_call(
        &self,
        /// The pairing code the user gave you, e.g. ABCD-EFGH.
        code: Path<String>,
        body: Json<QueueCall>,
        client: Client,
    ) -> Result<QueuedCall, ApiError> {
        let ip = client.0;
        self.state.limits.call(ip, &code)?;
        let body = body.0;
        let call = call_input(body.request_id, body.tool_id, body.function_name, body.args);
        let view = self
            .state
            .guarded(ip, self.state.relay.submit(&code, call))
            .await?;
        Ok(QueuedCall::Accepted(Json(Queued {
            request_id: view.request_id,
            status: view.status.into(),
        })))
    }

    /// Read the answers of queued calls
    ///
    /// The answers of this session's finished calls, oldest first; reading does not remove
    /// them. With requestId only that call's; with wait=N, waits up to N seconds (at most 30)
    /// for an answer.
    #[oai(
        path = "/api/sessions/:code/response",
        method = "get",
        operation_id = "getResponses"
    )]
    async fn get_responses(
        &self,
        /// The pairing code the user gave you, e.g. ABCD-EFGH.
        code: Path<String>,
        /// Only the answer of this call.
        #[oai(name = "requestId")]
        request_id: Query<Option<String>>,
        /// Seconds to wait for an answer (0 to 30).
        wait: Query<Option<u64>>,
        client: Client,
    ) -> Result<Json<Vec<CallResponse>>, ApiError> {
        let ip = client.0;
        let relay = &self.state.relay;
        let wait = Duration::from_secs(wait.0.unwrap_or(0)).min(MAX_RESPONSE_WAIT);
        let request_id = request_id.0;
        if let Some(id) = request_id.as_deref().filter(|_| !wait.is_zero()) {
            self.state
                .guarded(ip, relay.await_response(&code, id, wait))
                .await?;
        }
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let responses = self
                .state
                .guarded(ip, relay.responses(&code, request_id.as_deref()))
                .await?;
            if !responses.is_empty() || tokio::time::Instant::now() >= deadline {
                return Ok(Json(
                    responses.into_iter().map(CallResponse::from).collect(),
                ));
            }
            tokio::time::sleep(LIST_POLL).await;
        }
    }

    /// Get one call's status and answer
    ///
    /// Where the call stands (queued, delivered, completed, failed, expired) and its answer
    /// once it has one.
    #[oai(
        path = "/api/sessions/:code/requests/:requestId",
        method = "get",
        operation_id = "getCall"
    )]
    async fn get_call(
        &self,
        /// The pairing code the user gave you, e.g. ABCD-EFGH.
        code: Path<String>,
        /// The requestId of the call.
        #[oai(name = "requestId")]
        request_id: Path<String>,
        client: Client,
    ) -> Result<Json<CallState>, ApiError> {
        let ip = client.0;
        let view = self
            .state
            .guarded(ip, self.state.relay.request_status(&code, &request_id))
            .await?;
        Ok(Json(view.into()))
    }
}

/// A call as the relay takes it.
pub fn call_input(
    request_id: Option<String>,
    tool_id: Option<String>,
    function_name: String,
    args: Option<Arguments>,
) -> CallInput {
    CallInput {
        request_id: request_id.filter(|id| !id.is_empty()),
        tool_id: tool_id.filter(|id| !id.is_empty()),
        function_name,
        args: args.map_or(Value::Null, |args| {
            Value::Object(args.into_iter().collect())
        }),
    }
}
