//! What an LLM calls: read a session's tools, call them, read the answers. These operations
//! make up `/openapi/actions.json`, the file to import as GPT Actions, so their summaries and
//! descriptions are written for a model and kept under 300 characters.

use std::time::Duration;

use poem::error::IntoResult;
use poem_openapi::param::{Path, Query};
use poem_openapi::payload::Json;
use poem_openapi::types::ToJSON;
use poem_openapi::{ApiExtractor, ApiResponse, ExtractParamOptions, OpenApi};
use serde_json::Value;
use toolrelay_relay::front::ops::{
    AwaitResponse, Call, CancelRequest, GetManifest, GetRequestStatus, GetSession, ListResponses,
    Submit,
};
use toolrelay_relay::front::{CallInput, ErrorCode};

use super::written::Written;
use super::{Authorization, Client, State, Tag, provider_token};
use crate::error::ApiError;
use crate::types::{
    Arguments, CallResponse, CallState, MAX_LLM_CHARS, MakeCall, Metadata, QueueCall, Queued,
    SessionInfo,
};

/// Answers in a page of `GET …/response` without `limit`, and at most.
const DEFAULT_PAGE: usize = 100;
const MAX_PAGE: usize = 1000;
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
    Accepted(Written<Queued>),
}

/// Finished answers.
#[derive(ApiResponse)]
pub enum Answers {
    /// The answers, oldest first. When some were left out to stay under 100,000 characters,
    /// the last one says so (truncated, note) and so does the header.
    #[oai(status = 200)]
    Ok(
        Json<Vec<CallResponse>>,
        #[oai(header = "x-toolrelay-truncated")] Option<bool>,
    ),
}

/// The answer of a call, or where it stands.
#[derive(ApiResponse)]
pub enum CallOutcome {
    /// The tool answered (success or failure).
    #[oai(status = 200)]
    Answered(Written<Box<CallResponse>>),
    /// Still running: get the answer later with getCall and this requestId.
    #[oai(status = 202)]
    Pending(Written<Queued>),
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
        authorization: Authorization,
        client: Client,
    ) -> Result<Json<SessionInfo>, ApiError> {
        let caller = &client.0;
        let relay = &self.state.relay;
        let keys = self.state.config.api_keys.as_ref();
        // The tab checking its own session (the SDK on resume) sends its provider token: then
        // no API key is needed, and the brute-force guard never refuses it.
        let bearer = provider_token(authorization.0.as_deref(), None)
            .filter(|bearer| !keys.is_some_and(|keys| keys.accepts(bearer)));
        if let Some(token) = bearer {
            let status = GetSession {
                code: code.0.clone(),
                token: Some(token),
            };
            match relay.run(caller, status).await {
                Ok(status) => return Ok(Json(status.into())),
                Err(error)
                    if matches!(
                        error.code,
                        ErrorCode::InvalidToken | ErrorCode::TokenRequired
                    ) =>
                {
                    if keys.is_some() {
                        return Err(ApiError::new(
                            ErrorCode::InvalidApiKey,
                            "Send an API key this relay accepts (Authorization: Bearer <key>), or the session's provider token.",
                        ));
                    }
                }
                Err(error) => return Err(error.into()),
            }
        }
        let status = relay
            .run(
                caller,
                GetSession {
                    code: code.0,
                    token: None,
                },
            )
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
        let caller = &client.0;
        let manifest = self
            .state
            .relay
            .run(caller, GetManifest { code: code.0 })
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
        self.call_and_wait(code.0, body.0, &client, false).await
    }

    /// Run a read-only tool and wait for its answer
    ///
    /// As callTool, for functions marked readOnly in getMetadata (they only read the user's
    /// data). Any other function is refused with 403 not_read_only: use callTool for it.
    #[oai(
        path = "/api/sessions/:code/read",
        method = "post",
        operation_id = "readTool"
    )]
    async fn read_tool(
        &self,
        /// The pairing code the user gave you, e.g. ABCD-EFGH.
        code: Path<String>,
        body: Json<MakeCall>,
        client: Client,
    ) -> Result<CallOutcome, ApiError> {
        self.call_and_wait(code.0, body.0, &client, true).await
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
        let caller = &client.0;
        let body = body.0;
        let call = call_input(body.request_id, body.tool_id, body.function_name, body.args);
        let view = self
            .state
            .relay
            .run(caller, Submit { code: code.0, call })
            .await?;
        Ok(QueuedCall::Accepted(Written(Queued::from(view))))
    }

    /// Read the answers of queued calls
    ///
    /// This session's finished answers, oldest first (newest last); reading does not remove
    /// them. requestId: that call's only. after/limit page them. wait=N waits up to N s (30).
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
        /// Only the answers after this call's (the last requestId you read).
        after: Query<Option<String>>,
        /// Most answers to return (1 to 1000, default 100).
        limit: Query<Option<u64>>,
        /// Seconds to wait for an answer (0 to 30).
        wait: Query<Option<u64>>,
        client: Client,
    ) -> Result<Answers, ApiError> {
        let caller = &client.0;
        let relay = &self.state.relay;
        let wait = Duration::from_secs(wait.0.unwrap_or(0)).min(MAX_RESPONSE_WAIT);
        let request_id = request_id.0;
        let limit = limit.0.map_or(DEFAULT_PAGE, |limit| {
            usize::try_from(limit.clamp(1, MAX_PAGE as u64)).unwrap_or(MAX_PAGE)
        });
        if let Some(id) = request_id.as_deref().filter(|_| !wait.is_zero()) {
            let waited = AwaitResponse {
                code: code.0.clone(),
                request_id: id.to_owned(),
                wait,
                news: false,
            };
            relay.run(caller, waited).await?;
        }
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let listed = ListResponses {
                code: code.0.clone(),
                request_id: request_id.clone(),
            };
            let responses = relay.run(caller, listed).await?;
            let page = page_after(responses, after.0.as_deref(), limit);
            if !page.is_empty() || tokio::time::Instant::now() >= deadline {
                let (answers, truncated) = fitted(page);
                return Ok(Answers::Ok(Json(answers), truncated.then_some(true)));
            }
            tokio::time::sleep(LIST_POLL).await;
        }
    }

    /// Get one call's status and answer
    ///
    /// Where the call stands (queued, delivered, completed, failed, expired, cancelled) and its answer
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
        let caller = &client.0;
        let view = self
            .state
            .relay
            .run(
                caller,
                GetRequestStatus {
                    code: code.0,
                    request_id: request_id.0,
                },
            )
            .await?;
        Ok(Json(view.into()))
    }

    /// Cancel a call
    ///
    /// Ends a call that has no answer yet: a queued call is never delivered, the tab running
    /// a delivered one is told to stop, and its status becomes cancelled. A call that has its
    /// answer keeps it. Idempotent: answers where the call stands.
    #[oai(
        path = "/api/sessions/:code/requests/:requestId",
        method = "delete",
        operation_id = "cancelCall"
    )]
    async fn cancel_call(
        &self,
        /// The pairing code the user gave you, e.g. ABCD-EFGH.
        code: Path<String>,
        /// The requestId of the call.
        #[oai(name = "requestId")]
        request_id: Path<String>,
        client: Client,
    ) -> Result<Json<CallState>, ApiError> {
        let caller = &client.0;
        let view = self
            .state
            .relay
            .run(
                caller,
                CancelRequest {
                    code: code.0,
                    request_id: request_id.0,
                },
            )
            .await?;
        Ok(Json(view.into()))
    }
}

/// The answers after the one with id `after` (all when it is not among them), at most `limit`.
fn page_after(
    responses: Vec<toolrelay::wire::ToolResponse>,
    after: Option<&str>,
    limit: usize,
) -> Vec<toolrelay::wire::ToolResponse> {
    let start = after
        .and_then(|after| {
            responses
                .iter()
                .position(|response| response.request_id == after)
        })
        .map_or(0, |at| at + 1);
    responses.into_iter().skip(start).take(limit).collect()
}

/// As many answers as fit in what an LLM can take (one at least), and whether some were left
/// out: then the last one kept says so, and how to read on.
fn fitted(page: Vec<toolrelay::wire::ToolResponse>) -> (Vec<CallResponse>, bool) {
    let total = page.len();
    let mut answers: Vec<CallResponse> = Vec::with_capacity(total);
    let mut written = 2;
    for response in page {
        let answer = CallResponse::from(response);
        let size = answer.to_json_string().len() + 1;
        if !answers.is_empty() && written + size > MAX_LLM_CHARS - NOTE_ROOM {
            break;
        }
        written += size;
        answers.push(answer);
    }
    let left_out = total - answers.len();
    if left_out > 0
        && let Some(last) = answers.last_mut()
    {
        last.truncated = Some(true);
        last.note = Some(format!(
            "{left_out} more answers were left out to stay under {MAX_LLM_CHARS} characters: ask again with after={} to read on.",
            last.request_id
        ));
    }
    (answers, left_out > 0)
}

/// callTool (`POST /api/sessions/:code/call`) or readTool (`…/read`), as the outer router
/// serves it ([`crate::server::app`]) rather than through poem-openapi's: they are the calls an
/// LLM makes most, and poem-openapi's layers around an operation (its router inside the outer
/// one and the prefix it strips, the query map, the method's table, the operation's id, and a
/// box and a copy of the request's future for each) were ~5 % of a call's CPU (BENCHMARKS.md,
/// issue 44). The operations are still declared on [`LlmApi`], so the documents are unchanged,
/// and this reads a request with the same extractors in the same order, so it is refused in
/// the same words and answered with the same response.
pub struct CallRoute {
    api: LlmApi,
    read_only: bool,
}

impl CallRoute {
    /// callTool's route.
    pub fn call(state: &State) -> Self {
        Self {
            api: LlmApi {
                state: state.clone(),
            },
            read_only: false,
        }
    }

    /// readTool's route.
    pub fn read(state: &State) -> Self {
        Self {
            read_only: true,
            ..Self::call(state)
        }
    }
}

impl poem::Endpoint for CallRoute {
    type Output = poem::Response;

    async fn call(&self, request: poem::Request) -> poem::Result<poem::Response> {
        // A code that does not decode (`%FF`) leaves no parameter: refused as the nested
        // routes refuse a path they cannot decode, whatever the method.
        if request.raw_path_param("code").is_none() {
            return Err(poem::error::ParsePathError.into());
        }
        // As poem's method table answers for a path with POST only (HEAD included).
        if request.method() != poem::http::Method::POST {
            return Err(poem::error::MethodNotAllowedError.into());
        }
        let (request, mut body) = request.split();
        let code = Path::<String>::from_request(&request, &mut body, parameter("code")).await?;
        let call = Json::<MakeCall>::from_request(&request, &mut body, parameter("body")).await?;
        let client = Client(self.api.state.caller(&request));
        let outcome = self
            .api
            .call_and_wait(code.0, call.0, &client, self.read_only)
            .await;
        IntoResult::into_result(outcome).map(poem::IntoResponse::into_response)
    }
}

/// How poem-openapi's generated code asks an extractor for the parameter `name`.
fn parameter<T>(name: &'static str) -> ExtractParamOptions<T> {
    ExtractParamOptions {
        name,
        ..ExtractParamOptions::default()
    }
}

impl LlmApi {
    /// callTool and readTool: queue the call (a read only for read-only functions) and wait.
    async fn call_and_wait(
        &self,
        code: String,
        body: MakeCall,
        client: &Client,
        read_only: bool,
    ) -> Result<CallOutcome, ApiError> {
        let caller = &client.0;
        let wait = body
            .timeout_ms
            .map_or(DEFAULT_CALL_WAIT, Duration::from_millis)
            .min(MAX_CALL_WAIT);
        let call = CallInput {
            read_only,
            ..call_input(body.request_id, body.tool_id, body.function_name, body.args)
        };
        let view = self
            .state
            .relay
            .run(
                caller,
                Call {
                    code,
                    call,
                    wait: Some(wait),
                    news: false,
                },
            )
            .await?;
        Ok(match view.response {
            Some(response) => CallOutcome::Answered(Written(Box::new(response.into()))),
            None => CallOutcome::Pending(Written(Queued::from(view))),
        })
    }
}

/// Room kept for the note [`fitted`] adds.
const NOTE_ROOM: usize = 500;

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
        args: args.map_or(Value::Null, |args| Value::Object(args.0)),
        ..CallInput::default()
    }
}
