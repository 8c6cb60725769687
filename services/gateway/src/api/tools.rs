//! The built-in tools over HTTP: `GET /api/tools` lists them, `POST /api/tools/{toolName}`
//! runs one. These routes keep the original tool API's shapes — `{success:true, result}` or
//! `{success:false, error:{code, message}}` — and are open to every origin.

use poem::{IntoResponse, Response};
use poem_openapi::param::{Path, Query};
use poem_openapi::payload::Json;
use poem_openapi::registry::{MetaResponses, Registry};
use poem_openapi::{ApiResponse, Object, OpenApi};
use serde_json::Value;
use toolrelay_relay::front::ops::{CallTool, ListTools};
use toolrelay_relay::front::{ErrorInfo, ErrorKind};
use toolrelay_relay::front::{FailureCode, FailureKind, Scope, ToolFailure};

use super::{Client, State, Tag};
use crate::error::ApiError;

/// The tool routes.
pub struct ToolsApi {
    /// Shared state.
    pub state: State,
}

/// A built-in tool.
#[derive(Debug, Clone, Object)]
#[oai(rename_all = "camelCase")]
pub struct ToolListing {
    /// Its id (the same as its name).
    pub id: String,
    /// Its name: POST /api/tools/{name} runs it.
    pub name: String,
    /// What it does.
    pub description: String,
    /// JSON Schema of the body to post.
    pub input_schema: Value,
}

/// The built-in tools.
#[derive(Debug, Clone, Object)]
pub struct ToolList {
    /// The tools.
    pub tools: Vec<ToolListing>,
}

/// Why a tool call failed.
#[derive(Debug, Clone, Object)]
pub struct ToolErrorBody {
    /// Stable code: EMPTY_CODE, CODE_TOO_LARGE, ENCODING_FAILED, TOOL_NOT_FOUND, INVALID_ARGUMENTS, …
    pub code: String,
    /// What went wrong and what to do.
    pub message: String,
}

/// The outcome of a tool call.
#[derive(Debug, Clone, Object)]
pub struct ToolResult {
    /// Whether the tool succeeded.
    pub success: bool,
    /// Its result.
    #[oai(skip_serializing_if_is_none)]
    pub result: Option<Value>,
    /// Its failure.
    #[oai(skip_serializing_if_is_none)]
    pub error: Option<ToolErrorBody>,
}

/// A tool call's answer: what the API documents [`ToolOutcome`] as.
#[derive(ApiResponse)]
pub enum ToolAnswer {
    /// The tool's result.
    #[oai(status = 200)]
    Done(Json<ToolResult>),
    /// The input is wrong (EMPTY_CODE, INVALID_ARGUMENTS, INVALID_JSON, …).
    #[oai(status = 400)]
    BadRequest(Json<ToolResult>),
    /// No such tool (TOOL_NOT_FOUND).
    #[oai(status = 404)]
    NotFound(Json<ToolResult>),
    /// The input is too large (CODE_TOO_LARGE).
    #[oai(status = 413)]
    TooLarge(Json<ToolResult>),
    /// Too many calls; retry after the given seconds.
    #[oai(status = 429)]
    Busy(Json<ToolResult>, #[oai(header = "Retry-After")] u64),
    /// The tool failed (ENCODING_FAILED, …).
    #[oai(status = 500)]
    Failed(Json<ToolResult>),
    /// The relay cannot run it right now (RELAY_UNAVAILABLE); retry after the given seconds.
    #[oai(status = 503)]
    Unavailable(Json<ToolResult>, #[oai(header = "Retry-After")] u64),
}

/// A tool call's answer, and the failure's code, which the response carries in its extensions
/// for the metrics ([`crate::middleware::observe`]) to count it by.
pub struct ToolOutcome {
    failure: Option<FailureCode>,
    answer: ToolAnswer,
}

impl ApiResponse for ToolOutcome {
    fn meta() -> MetaResponses {
        ToolAnswer::meta()
    }

    fn register(registry: &mut Registry) {
        ToolAnswer::register(registry);
    }
}

impl IntoResponse for ToolOutcome {
    fn into_response(self) -> Response {
        let mut response = self.answer.into_response();
        if let Some(code) = self.failure {
            response.extensions_mut().insert(code);
        }
        response
    }
}

impl From<ToolFailure> for ToolOutcome {
    fn from(failure: ToolFailure) -> Self {
        let retry_after = failure.retry_after.map_or(1, |wait| wait.as_secs().max(1));
        let body = Json(ToolResult {
            success: false,
            result: None,
            error: Some(ToolErrorBody {
                code: failure.code.to_string(),
                message: failure.message,
            }),
        });
        let answer = match failure.kind {
            FailureKind::BadInput => ToolAnswer::BadRequest(body),
            FailureKind::NotFound => ToolAnswer::NotFound(body),
            FailureKind::TooLarge => ToolAnswer::TooLarge(body),
            FailureKind::Busy => ToolAnswer::Busy(body, retry_after),
            FailureKind::Internal => ToolAnswer::Failed(body),
            FailureKind::Unavailable => ToolAnswer::Unavailable(body, retry_after),
        };
        Self {
            failure: Some(failure.code),
            answer,
        }
    }
}

#[OpenApi(tag = "Tag::Tools")]
impl ToolsApi {
    /// List the built-in tools
    ///
    /// Tools that run in the relay itself (no tab needed), each with the JSON Schema of its
    /// input. They are also in every session's metadata.
    #[oai(path = "/api/tools", method = "get", operation_id = "listTools")]
    async fn list_tools(&self, client: Client) -> Result<Json<ToolList>, ApiError> {
        let tools = self.state.relay.run(&client.0, ListTools).await?;
        Ok(Json(ToolList {
            tools: tools
                .into_iter()
                .map(|tool| ToolListing {
                    id: tool.name.clone(),
                    name: tool.name,
                    description: tool.description,
                    input_schema: tool.input_schema,
                })
                .collect(),
        }))
    }

    /// Run a built-in tool
    ///
    /// Posts the tool's input (see listTools) and returns {success:true, result} or
    /// {success:false, error:{code, message}}.
    #[oai(
        path = "/api/tools/:toolName",
        method = "post",
        operation_id = "runTool"
    )]
    async fn run_tool(
        &self,
        /// The tool's name, e.g. encodePlantUML.
        #[oai(name = "toolName")]
        tool_name: Path<String>,
        /// Who the call is for: tools that store results keep them apart per scope.
        scope: Query<Option<String>>,
        body: Json<Value>,
        client: Client,
    ) -> ToolOutcome {
        if let Err(limited) = self.state.limits.tool_call(&client.0).await {
            return refused(limited).into();
        }
        let scope = scope
            .0
            .filter(|scope| !scope.is_empty())
            .map_or(Scope::None, Scope::Caller);
        let ran = self
            .state
            .relay
            .run(
                &client.0,
                CallTool {
                    name: tool_name.clone(),
                    args: body.0,
                    scope,
                },
            )
            .await;
        match ran {
            Ok(Ok(result)) => ToolOutcome {
                failure: None,
                answer: ToolAnswer::Done(Json(ToolResult {
                    success: true,
                    result: Some(result),
                    error: None,
                })),
            },
            Ok(Err(failure)) => failure.into(),
            Err(refusal) => refused(refusal).into(),
        }
    }
}

/// A tool call that was not let in (over its budget, or the relay unreachable), as a tool
/// failure.
fn refused(error: ErrorInfo) -> ToolFailure {
    let busy = error.kind == ErrorKind::TooManyRequests;
    ToolFailure {
        kind: if busy {
            FailureKind::Busy
        } else {
            FailureKind::Unavailable
        },
        code: error.code.into(),
        message: error.message,
        retry_after: error.retry_after,
    }
}
