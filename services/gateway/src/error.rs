//! Errors as the HTTP API answers them: `{error, message, code, correlationId}` with the
//! matching status and, where a retry makes sense, `Retry-After`.
//!
//! Handlers return [`ApiError`]; requests poem refuses before a handler runs (malformed JSON,
//! a missing parameter, a body over the limit, an unknown route) are turned into the same
//! body by [`Correlated`]. The correlation id comes from the request's `x-request-id`
//! (or is generated), is echoed in the response's `x-request-id`, and is on every log line of
//! the request.

use std::time::Duration;

use poem::http::{StatusCode, header};
use poem::{IntoResponse, Request, Response};
use poem_openapi::error::ParseRequestPayloadError;
use poem_openapi::payload::Json;
use poem_openapi::registry::{MetaResponses, Registry};
use poem_openapi::{ApiResponse, Object};
use toolrelay::errors::{FailureCode, ToolCode};
use toolrelay::json::ReadError;
use toolrelay_relay::front::{ErrorCode, ErrorInfo, ErrorKind, RequestContext};

/// Header carrying the correlation id, in and out.
pub const REQUEST_ID_HEADER: &str = "x-request-id";

/// The current request's correlation id.
pub fn correlation_id() -> String {
    RequestContext::with_current(|request| request.correlation_id().to_owned())
        .unwrap_or_else(|| "none".to_owned())
}

/// Every error answer of the API.
#[derive(Debug, Clone, Object)]
#[oai(rename_all = "camelCase")]
pub struct ErrorBody {
    /// Stable snake_case name of the error, e.g. `session_not_found`.
    pub error: String,
    /// What went wrong and what to do next.
    pub message: String,
    /// The HTTP status.
    pub code: u16,
    /// Id of this request in the relay's logs (the `x-request-id` header).
    pub correlation_id: String,
    /// The call this error leaves unfinished (when the relay restarted while you waited):
    /// ask for its answer later with getCall instead of calling again.
    #[oai(skip_serializing_if_is_none)]
    pub request_id: Option<String>,
}

/// An error answer with its status: what the API documents [`ApiError`] as.
#[derive(Debug, ApiResponse)]
pub enum ErrorAnswer {
    /// The request is malformed; the message says what to fix.
    #[oai(status = 400)]
    BadRequest(Json<ErrorBody>),
    /// The provider token is missing.
    #[oai(status = 401)]
    Unauthorized(Json<ErrorBody>),
    /// The provider token is wrong.
    #[oai(status = 403)]
    Forbidden(Json<ErrorBody>),
    /// No such session, call or function (a session expires after 10 idle minutes).
    #[oai(status = 404)]
    NotFound(Json<ErrorBody>),
    /// The requestId was used for a different call.
    #[oai(status = 409)]
    Conflict(Json<ErrorBody>),
    /// The call ran but its answer is no longer kept (response_evicted).
    #[oai(status = 410)]
    Gone(Json<ErrorBody>),
    /// The body is too large.
    #[oai(status = 413)]
    TooLarge(Json<ErrorBody>),
    /// Too many requests; retry after the given seconds.
    #[oai(status = 429)]
    TooManyRequests(Json<ErrorBody>, #[oai(header = "Retry-After")] u64),
    /// The relay cannot serve right now; retry after the given seconds.
    #[oai(status = 503)]
    Unavailable(Json<ErrorBody>, #[oai(header = "Retry-After")] u64),
}

/// An error answer: its body and status, and its name, which the response carries in its
/// extensions for the metrics ([`crate::middleware::observe`]) to count it by.
#[derive(Debug)]
pub struct ApiError {
    code: ErrorCode,
    /// Boxed: handlers return `Result<_, ApiError>`, and the body is large.
    answer: Box<ErrorAnswer>,
}

impl ApiError {
    /// An error `code`, answered with its kind's status.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Self::from(ErrorInfo::new(code, message))
    }

    /// 429 `rate_limited`, retry after `wait`.
    pub fn rate_limited(what: &str, wait: Duration) -> Self {
        Self::from(rate_limited(what, wait))
    }

    /// The HTTP status.
    pub fn status(&self) -> u16 {
        match self.answer.as_ref() {
            ErrorAnswer::BadRequest(body)
            | ErrorAnswer::Unauthorized(body)
            | ErrorAnswer::Forbidden(body)
            | ErrorAnswer::NotFound(body)
            | ErrorAnswer::Conflict(body)
            | ErrorAnswer::Gone(body)
            | ErrorAnswer::TooLarge(body)
            | ErrorAnswer::TooManyRequests(body, _)
            | ErrorAnswer::Unavailable(body, _) => body.code,
        }
    }
}

impl ApiResponse for ApiError {
    fn meta() -> MetaResponses {
        ErrorAnswer::meta()
    }

    fn register(registry: &mut Registry) {
        ErrorAnswer::register(registry);
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (*self.answer).into_response();
        response.extensions_mut().insert(self.code);
        response
    }
}

impl From<ApiError> for poem::Error {
    fn from(error: ApiError) -> Self {
        // The code goes in the error's own extensions: they replace the response's when the
        // error is answered.
        let mut answer = poem::Error::from_response((*error.answer).into_response());
        answer.set_data(error.code);
        answer
    }
}

impl From<ErrorInfo> for ApiError {
    fn from(error: ErrorInfo) -> Self {
        let status = status_of(error.kind);
        let code = error.code;
        let body = Json(ErrorBody {
            error: code.as_str().to_owned(),
            message: error.message,
            code: status.as_u16(),
            correlation_id: correlation_id(),
            request_id: error.request_id,
        });
        let retry_after = error.retry_after.map_or(1, |wait| wait.as_secs().max(1));
        tracing::debug!(status = status.as_u16(), error = %body.error, "request refused");
        let answer = match error.kind {
            ErrorKind::BadRequest => ErrorAnswer::BadRequest(body),
            ErrorKind::Unauthenticated => ErrorAnswer::Unauthorized(body),
            ErrorKind::Forbidden => ErrorAnswer::Forbidden(body),
            ErrorKind::NotFound => ErrorAnswer::NotFound(body),
            ErrorKind::Conflict => ErrorAnswer::Conflict(body),
            ErrorKind::Gone => ErrorAnswer::Gone(body),
            ErrorKind::TooLarge => ErrorAnswer::TooLarge(body),
            ErrorKind::TooManyRequests => ErrorAnswer::TooManyRequests(body, retry_after),
            ErrorKind::Unavailable => ErrorAnswer::Unavailable(body, retry_after),
        };
        Self {
            code,
            answer: Box::new(answer),
        }
    }
}

fn status_of(kind: ErrorKind) -> StatusCode {
    match kind {
        ErrorKind::BadRequest => StatusCode::BAD_REQUEST,
        ErrorKind::Unauthenticated => StatusCode::UNAUTHORIZED,
        ErrorKind::Forbidden => StatusCode::FORBIDDEN,
        ErrorKind::NotFound => StatusCode::NOT_FOUND,
        ErrorKind::Conflict => StatusCode::CONFLICT,
        ErrorKind::Gone => StatusCode::GONE,
        ErrorKind::TooLarge => StatusCode::PAYLOAD_TOO_LARGE,
        ErrorKind::TooManyRequests => StatusCode::TOO_MANY_REQUESTS,
        ErrorKind::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
    }
}

/// A request's correlation id (its `x-request-id`, or a new one) and its context for the logs:
/// the request is answered in that context ([`Correlated::answer`]), the id is echoed in the
/// response, and errors poem raised itself become the API's error body.
pub struct Correlated {
    id: String,
    method: poem::http::Method,
    /// A clone of the URI shares its bytes: no copy of the path for a request that succeeds.
    uri: poem::http::Uri,
}

impl Correlated {
    /// The correlation id and context of `request`.
    pub fn of(request: &Request) -> Self {
        let sent = request
            .headers()
            .get(REQUEST_ID_HEADER)
            .and_then(|value| value.to_str().ok());
        Self {
            id: RequestContext::correlation_id_from(sent),
            method: request.method().clone(),
            uri: request.uri().clone(),
        }
    }

    /// Runs the request's handling (the future `answering` makes) in the request's context
    /// (its lines carry its correlation id, method and path), and gives its answer the id and,
    /// for an error poem raised, the API's error body. (The future is made inside, where it is
    /// awaited: taken made, it was held three times over in this one's.)
    pub async fn answer<F>(self, answering: impl FnOnce() -> F) -> Response
    where
        F: Future<Output = poem::Result<Response>>,
    {
        let Self { id, method, uri } = self;
        let started = std::time::Instant::now();
        let context = RequestContext::http(id.clone(), method, uri.clone());
        let handled = context
            .scope(async {
                // Boxed: poem boxes a request's whole future, copying it, and each layer's
                // future is copied as it is made; with the handling inline that future was
                // ~11 KB, with it boxed ~2.5 KB (the gateway's tests/request_future_size.rs).
                let response = match Box::pin(answering()).await {
                    Ok(response) => response,
                    Err(error) if error.is_from_response() => error.into_response(),
                    Err(error) if is_tool_route(uri.path()) => {
                        tool_response_for(uri.path(), &error)
                    }
                    Err(error) => response_for(&error),
                };
                // The access log, in the request's context (correlation id, method, path
                // without secrets): refusals at info, the rest at debug. Never bodies or tokens.
                let status = response.status().as_u16();
                let duration_ms = toolrelay_relay::front::millis(started.elapsed());
                if status >= 400 {
                    tracing::info!(status, duration_ms, "request refused");
                } else {
                    tracing::debug!(status, duration_ms, "request served");
                }
                response
            })
            .await;
        let mut response = handled;
        if let Ok(value) = id.parse() {
            response.headers_mut().insert(REQUEST_ID_HEADER, value);
        }
        if response.status() == StatusCode::PAYLOAD_TOO_LARGE {
            // The body was refused before it was read to its end: what is left of it on the
            // connection would be taken for the next request, so the connection must close.
            response.headers_mut().insert(
                header::CONNECTION,
                header::HeaderValue::from_static("close"),
            );
        }
        response
    }
}

/// The built-in tool routes, which keep the original tool API's error shape.
pub(crate) fn is_tool_route(path: &str) -> bool {
    path == "/api/tools" || path.starts_with("/api/tools/")
}

/// The tool API's answer for an error poem raised: `{success:false, error:{code, message}}`.
fn tool_response_for(path: &str, error: &poem::Error) -> Response {
    let status = error.status();
    let (status, code, message) = if path == "/api/tools/" {
        (
            StatusCode::BAD_REQUEST,
            ToolCode::ToolNameRequired,
            "Name the tool in the path: POST /api/tools/{toolName}. GET /api/tools lists them."
                .to_owned(),
        )
    } else {
        match status {
            StatusCode::NOT_FOUND => (
                status,
                ToolCode::ToolNotFound,
                "There is no tool at this path. GET /api/tools lists the tools.".to_owned(),
            ),
            StatusCode::METHOD_NOT_ALLOWED => (
                status,
                ToolCode::MethodNotAllowed,
                "Run a tool with POST /api/tools/{toolName}; list them with GET /api/tools."
                    .to_owned(),
            ),
            StatusCode::PAYLOAD_TOO_LARGE => (
                status,
                ToolCode::CodeTooLarge,
                "The request body is over 256 KB. Send less.".to_owned(),
            ),
            status if status.is_client_error() => (
                StatusCode::BAD_REQUEST,
                ToolCode::InvalidJson,
                format!("The body must be a JSON object with the tool's input: {error}."),
            ),
            _ => {
                tracing::error!(%status, detail = %error, "tool request failed");
                (
                    StatusCode::INTERNAL_SERVER_ERROR,
                    ToolCode::InternalError,
                    "The relay could not handle this request. Try again in a few seconds."
                        .to_owned(),
                )
            }
        }
    };
    let body = serde_json::json!({"success": false, "error": {"code": code, "message": message}});
    let mut response = Response::builder()
        .status(status)
        .content_type("application/json; charset=utf-8")
        .body(body.to_string());
    response.extensions_mut().insert(FailureCode::Tool(code));
    response
}

/// Marks a body that its JSON reader refused for nesting past the parser's limit.
#[derive(Debug, Clone, Copy)]
struct TooDeepToRead;

/// `error`, marked when it is the JSON payload's refusal of `body` for nesting deeper than the
/// parser reads ([`toolrelay::json::ReadError::TooDeep`]): its answer is `nested_too_deeply`.
/// Looked at only when the payload failed, so a body read well costs nothing more.
pub fn note_too_deep(mut error: poem::Error, body: &[u8]) -> poem::Error {
    if error.is::<ParseRequestPayloadError>()
        && matches!(toolrelay::json::check(body), Err(ReadError::TooDeep(_)))
    {
        error.set_data(TooDeepToRead);
    }
    error
}

/// The error answer for an error poem raised before (or instead of) a handler.
fn response_for(error: &poem::Error) -> Response {
    let status = error.status();
    let detail = error.to_string();
    let (status, name, message) = match status {
        StatusCode::NOT_FOUND => (
            status,
            ErrorCode::NotFound,
            "No such endpoint. The API is described at /openapi.json.".to_owned(),
        ),
        StatusCode::METHOD_NOT_ALLOWED => (
            status,
            ErrorCode::MethodNotAllowed,
            "This endpoint does not take that method. The API is described at /openapi.json.".to_owned(),
        ),
        StatusCode::FORBIDDEN => (
            status,
            ErrorCode::OriginNotAllowed,
            "Browsers on this origin may not call the relay. The operator can allow the origin with CORS_ORIGIN.".to_owned(),
        ),
        StatusCode::PAYLOAD_TOO_LARGE => (
            status,
            ErrorCode::BodyTooLarge,
            "The request body is too large (calls take up to 256 KB, tool responses up to 1 MB). Send less data.".to_owned(),
        ),
        status if status.is_client_error() && error.data::<TooDeepToRead>().is_some() => (
            StatusCode::BAD_REQUEST,
            ErrorCode::NestedTooDeeply,
            "The JSON body is nested too deeply to read. Send flatter JSON (the relay accepts MAX_JSON_DEPTH levels, 32 unless its operator changed it).".to_owned(),
        ),
        status if status.is_client_error() => (
            StatusCode::BAD_REQUEST,
            ErrorCode::InvalidRequest,
            format!("The request could not be read: {detail}. Check it against /openapi.json."),
        ),
        _ => {
            tracing::error!(%status, %detail, "request failed");
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                ErrorCode::InternalError,
                "The relay could not handle this request. Try again in a few seconds.".to_owned(),
            )
        }
    };
    error_response(status, name, message)
}

/// 429 `rate_limited` for too many `what`, retry after `wait` (at least a second).
pub fn rate_limited(what: &str, wait: Duration) -> ErrorInfo {
    let seconds = wait.as_secs().max(1);
    ErrorInfo {
        retry_after: Some(Duration::from_secs(seconds)),
        ..ErrorInfo::new(
            ErrorCode::RateLimited,
            format!("Too many {what}. Wait {seconds} s, then try again."),
        )
    }
}

/// An error answer with any status.
pub fn error_response(status: StatusCode, code: ErrorCode, message: String) -> Response {
    let body = serde_json::json!({
        "error": code.as_str(),
        "message": message,
        "code": status.as_u16(),
        "correlationId": correlation_id(),
    });
    let mut response = Response::builder()
        .status(status)
        .content_type("application/json; charset=utf-8")
        .body(body.to_string());
    response.extensions_mut().insert(code);
    response
}
