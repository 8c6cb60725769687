//! The first design's paths and JSON shapes, kept working: `POST /request`, `POST /response`,
//! `GET /stream?code=`, `GET /metadata?code=`. They reach the same relay operations as the
//! current API; only the shapes differ.

use poem_openapi::param::{Header, Query};
use poem_openapi::payload::Json;
use poem_openapi::{ApiResponse, Object, OpenApi};
use serde_json::{Value, json};
use toolrelay::wire::ProviderResponse;
use toolrelay_relay::front::ops::{GetManifest, PostResponse, Submit};
use toolrelay_relay::front::{Downlink, Transport};

use super::llm::call_input;
use super::tab::{AnswerBody, EVENT_ID, Events, TooDeepAnswer, events};
use super::{Client, State, Tag, provider_token};
use crate::error::ApiError;
use crate::types::{Arguments, FlatMetadata, Status};

/// The legacy operations.
pub struct LegacyApi {
    /// Shared state.
    pub state: State,
}

/// A call in the first design's shape.
#[derive(Debug, Clone, Object)]
pub struct LegacyRequest {
    /// The pairing code.
    pub code: String,
    /// Your id for the call; generated when absent.
    pub id: Option<String>,
    /// The function to run.
    pub tool: String,
    /// Its arguments.
    pub args: Option<Arguments>,
}

/// A queued or answered call in the first design's shape.
#[derive(Debug, Clone, Object)]
pub struct LegacyStatus {
    /// The call's id.
    pub id: String,
    /// Its status.
    pub status: Status,
}

/// A tab's answer in the first design's shape.
#[derive(Debug, Clone, Object)]
pub struct LegacyResponse {
    /// The pairing code.
    pub code: String,
    /// The call's id.
    pub id: String,
    /// The result; CODAP's `{success, values}` is understood (success false means failure).
    pub result: Value,
}

/// Accepted.
#[derive(ApiResponse)]
pub enum LegacyAccepted {
    /// Accepted.
    #[oai(status = 202)]
    Accepted(Json<LegacyStatus>),
}

#[OpenApi(tag = "Tag::Legacy")]
impl LegacyApi {
    /// Queue a call (first design)
    ///
    /// Same as queueCall with the body {code, id, tool, args}.
    #[oai(path = "/request", method = "post", operation_id = "legacyRequest")]
    async fn request(
        &self,
        body: Json<LegacyRequest>,
        client: Client,
    ) -> Result<LegacyAccepted, ApiError> {
        let caller = &client.0;
        let body = body.0;
        let call = call_input(body.id, None, body.tool, body.args);
        let view = self
            .state
            .relay
            .run(
                caller,
                Submit {
                    code: body.code,
                    call,
                },
            )
            .await?;
        Ok(LegacyAccepted::Accepted(Json(LegacyStatus {
            id: view.request_id,
            status: view.status.into(),
        })))
    }

    /// Answer a call (first design)
    ///
    /// Same as postResponse with the body {code, id, result}; the provider token is required.
    #[oai(path = "/response", method = "post", operation_id = "legacyResponse")]
    async fn response(
        &self,
        body: AnswerBody<LegacyResponse>,
        /// `Bearer <providerToken>`.
        #[oai(name = "Authorization")]
        authorization: Header<Option<String>>,
        /// The provider token, when no Authorization header can be sent.
        token: Query<Option<String>>,
        client: Client,
    ) -> Result<LegacyAccepted, ApiError> {
        let caller = &client.0;
        let token = provider_token(authorization.as_deref(), token.0);
        let outcome = match body.0 {
            Ok(body) => {
                let response = legacy_answer(body.id, body.result);
                self.state
                    .relay
                    .run(
                        caller,
                        PostResponse {
                            code: body.code,
                            token,
                            response,
                        },
                    )
                    .await?
            }
            Err(too_deep) => {
                #[derive(serde::Deserialize)]
                struct Head {
                    code: String,
                    id: String,
                }
                let head: Head = too_deep.head(&self.state)?;
                let answer = TooDeepAnswer {
                    caller,
                    code: &head.code,
                    token: token.as_deref(),
                    request_id: head.id,
                };
                answer.fail_the_call(&self.state).await?
            }
        };
        Ok(LegacyAccepted::Accepted(Json(LegacyStatus {
            id: outcome.request_id,
            status: outcome.status.into(),
        })))
    }

    /// Receive calls as server-sent events (first design)
    ///
    /// Same as streamCalls, with tool-request events shaped {id, tool, args}; the provider
    /// token is required (?token=).
    #[oai(path = "/stream", method = "get", operation_id = "legacyStream")]
    async fn stream(
        &self,
        /// The pairing code.
        code: Query<String>,
        /// The provider token.
        token: Query<Option<String>>,
        /// `Bearer <providerToken>`.
        #[oai(name = "Authorization")]
        authorization: Header<Option<String>>,
        client: Client,
    ) -> Result<Events, ApiError> {
        let caller = &client.0;
        let token = provider_token(authorization.as_deref(), token.0);
        let link = self
            .state
            .relay
            .attach(caller, &code, token.as_deref(), Transport::Sse)
            .await?;
        Ok(events(link, legacy_event, &self.state))
    }

    /// List a session's tools (first design)
    ///
    /// The manifest in flat form: {version, tools: [{name, description, inputSchema}]}.
    #[oai(path = "/metadata", method = "get", operation_id = "legacyMetadata")]
    async fn metadata(
        &self,
        /// The pairing code.
        code: Query<String>,
        client: Client,
    ) -> Result<Json<FlatMetadata>, ApiError> {
        let caller = &client.0;
        let manifest = self
            .state
            .relay
            .run(caller, GetManifest { code: code.0 })
            .await?;
        Ok(Json(manifest.into()))
    }
}

/// A first-design answer: `result` is the tool's result; when it is CODAP's
/// `{success: false, values: {error}}`, the call failed with that error.
fn legacy_answer(id: String, result: Value) -> ProviderResponse {
    let failed = result.get("success").and_then(Value::as_bool) == Some(false);
    let error = failed.then(|| {
        result
            .pointer("/values/error")
            .or_else(|| result.get("error"))
            .cloned()
            .unwrap_or_else(|| json!("the tool reported a failure"))
    });
    ProviderResponse {
        request_id: id,
        success: Some(!failed),
        result: Some(result),
        error,
        content: None,
        structured_content: None,
    }
}

/// The first design's event shapes: `tool-request {id, tool, args}`, `heartbeat {}`.
fn legacy_event(message: Downlink) -> Value {
    match message {
        Downlink::ToolRequest { request, seq } => {
            let call = request.frame();
            json!({
                "type": "tool-request",
                EVENT_ID: seq.to_string(),
                "id": call.request_id,
                "tool": call.function_name,
                "args": call.args,
            })
        }
        other => super::tab::event_value(other),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codap_failures_become_failed_answers() {
        let answer = legacy_answer(
            "r".into(),
            json!({"success": false, "values": {"error": "no such case"}}),
        );
        assert_eq!(
            (answer.success, answer.error),
            (Some(false), Some(json!("no such case")))
        );
        let answer = legacy_answer(
            "r".into(),
            json!({"success": true, "values": {"caseID": 42}}),
        );
        assert_eq!((answer.success, answer.error), (Some(true), None));
    }
}
