//! Answers: a provider's answer to a call, checked where it enters the system; and a call's
//! end by its caller (cancellation), which is recorded as its answer.

use serde_json::Value;
use toolrelay::wire::{
    LogFrame, ProgressFrame, ProviderFrame, ProviderResponse, RequestStatus, ToolError,
    ToolResponse,
};

use super::calls::is_valid_request_id;
use super::content::check_content;
use super::{Relay, RequestView, ResponseOutcome, millis, not_found};
use crate::code::SessionCode;
use crate::error::{ErrorCode, RelayError};
use crate::metrics::AnsweredBy;
use crate::provider::{bounded_log, bounded_progress};
use crate::store::{Answerer, CallNews, CallProgress, Finished, RequestRecord};

impl Relay {
    /// A provider's answer to a call, over any transport. Needs the provider token.
    pub async fn post_response(
        &self,
        code: &str,
        token: Option<&str>,
        response: ProviderResponse,
    ) -> Result<ResponseOutcome, RelayError> {
        let (code, session) = self.authorized(code, token).await?;
        // Answers posted over HTTP come from the session's SSE or polling provider, and are
        // accepted for the calls delivered to it.
        let by = session.provider.map_or(AnsweredBy::Nobody, |provider| {
            AnsweredBy::Provider(provider.transport)
        });
        self.accept_response(&code, response, by, Answerer::Provider)
            .await
    }

    /// Records a provider's (or a built-in tool's, `by`) answer to a call; the first wins.
    /// The store takes it only from an `answerer` that may answer the call (see
    /// [`Answerer::may_answer`]): a tab never answers a built-in call, nor one it did not get.
    pub(crate) async fn accept_response(
        &self,
        code: &SessionCode,
        response: ProviderResponse,
        by: AnsweredBy,
        answerer: Answerer<'_>,
    ) -> Result<ResponseOutcome, RelayError> {
        let (response, refused) = contain_response(response, self.answer_limits());
        let (status, response) = normalise_response(response)?;
        let request_id = response.request_id.clone();
        let now = self.now();
        let until = now.plus(self.inner.config.session_ttl);
        let finished = self
            .inner
            .store
            .finish(code, &request_id, status, response, answerer, now, until)
            .await?;
        let outcome = match finished {
            Finished::Finished(record) => {
                self.finished(code, &record, by);
                ResponseOutcome {
                    request_id,
                    status: record.status,
                    accepted: true,
                }
            }
            Finished::AlreadyFinished(record) => ResponseOutcome {
                request_id,
                status: record.status,
                accepted: false,
            },
            Finished::NoRequest => {
                return Err(RelayError::RequestNotFound {
                    code: code.display(),
                    request_id,
                });
            }
            Finished::NotDelivered => {
                return Err(RelayError::NotDelivered {
                    code: code.display(),
                    request_id,
                });
            }
            Finished::NoSession => return Err(not_found(code)),
        };
        // The caller has its (failed) answer; the provider learns why its own was refused.
        match refused {
            Some(error) if outcome.accepted => Err(error),
            _ => Ok(outcome),
        }
    }

    /// A delivered call's news from its tab over HTTP (SSE, polling), which has no connection
    /// to pace it: a `progress` or `log` frame (a log names its call). Needs the provider
    /// token. Whether the call runs (news of one that does not is dropped).
    pub async fn post_news(
        &self,
        code: &str,
        token: Option<&str>,
        news: ProviderFrame,
    ) -> Result<bool, RelayError> {
        let (code, _) = self.authorized(code, token).await?;
        match news {
            ProviderFrame::Progress(report) if report.progress.is_finite() => {
                self.report_progress(&code, bounded_progress(*report)).await
            }
            ProviderFrame::Log(log) => {
                let Some(id) = log.request_id.clone() else {
                    return Err(RelayError::InvalidResponse {
                        reason: "a log message posted over HTTP names its call: give its requestId"
                            .into(),
                    });
                };
                self.report_log(&code, &[id], &bounded_log(*log)).await
            }
            _ => Err(RelayError::InvalidResponse {
                reason: "only progress (with a finite number) and log frames are news".into(),
            }),
        }
    }

    /// Passes on a tab's report of how far call `report.request_id` has come (paced and
    /// checked by its connection, [`crate::provider`]): kept with the call and told to its
    /// waiters, wherever they are.
    pub(crate) async fn report_progress(
        &self,
        code: &SessionCode,
        report: ProgressFrame,
    ) -> Result<bool, RelayError> {
        let progress = CallProgress {
            progress: report.progress,
            total: report.total,
            message: report.message,
            at: self.now(),
        };
        let news = CallNews::Progress(progress);
        Ok(self
            .inner
            .store
            .tell(code, &report.request_id, news)
            .await?)
    }

    /// Passes on a tab's log message to the waiters of `calls`.
    pub(crate) async fn report_log(
        &self,
        code: &SessionCode,
        calls: &[String],
        log: &LogFrame,
    ) -> Result<bool, RelayError> {
        let mut running = false;
        for id in calls {
            let news = CallNews::Log(log.clone());
            running |= self.inner.store.tell(code, id, news).await?;
        }
        Ok(running)
    }

    /// A call got its end here (`by` gave it): counted, and logged with which tool, how it
    /// ended and how long it took — never its arguments or result.
    fn finished(&self, code: &SessionCode, record: &RequestRecord, by: AnsweredBy) {
        self.inner.metrics.call_finished(record.status, by);
        tracing::info!(
            code = %code.redacted(),
            request_id = %record.id,
            call_correlation_id = record.correlation_id.as_deref().unwrap_or(""),
            function = %record.function_name,
            status = record.status.as_str(),
            duration_ms = millis(self.now().since(record.created_at)),
            "call finished"
        );
    }

    /// Cancels a call for its caller: its answer becomes a `cancelled` failure, so a queued
    /// call is never delivered, the connection running a delivered one is told to stop
    /// (`cancel`, from the answer's event, on whichever replica serves the tab), a built-in
    /// run stops, and a late answer is refused. A call that has its answer keeps it:
    /// cancelling is idempotent, and answers where the call stands.
    pub async fn cancel(&self, code: &str, request_id: &str) -> Result<RequestView, RelayError> {
        self.cancel_as(code, request_id, None).await
    }

    /// [`Relay::cancel`] for the caller whose key ([`crate::limits::Limits::caller_key`]) is
    /// `caller`: only the caller that made a call may cancel it; to anyone else it is a call
    /// the session does not have (see [`Relay::request_record`]).
    pub(crate) async fn cancel_as(
        &self,
        code: &str,
        request_id: &str,
        caller: Option<&str>,
    ) -> Result<RequestView, RelayError> {
        let code = self.session_code(code).await?;
        let record = self.request_record(&code, request_id, caller).await?;
        if record.status.is_terminal() {
            return self.view(&code, record.into()).await;
        }
        let response = ToolResponse {
            request_id: request_id.to_owned(),
            success: false,
            result: None,
            error: Some(ToolError {
                code: ErrorCode::Cancelled.as_str().to_owned(),
                message: "The caller cancelled the call before it had an answer.".to_owned(),
            }),
            content: None,
            structured_content: None,
        };
        let now = self.now();
        let until = now.plus(self.inner.config.session_ttl);
        let status = RequestStatus::Cancelled;
        let finished = self
            .inner
            .store
            .finish(
                &code,
                request_id,
                status,
                response,
                Answerer::Relay,
                now,
                until,
            )
            .await?;
        let record = match finished {
            Finished::Finished(record) => {
                self.finished(&code, &record, AnsweredBy::Nobody);
                record
            }
            // Answered (or expired) meanwhile: it keeps that end.
            Finished::AlreadyFinished(record) => record,
            Finished::NoSession => return Err(not_found(&code)),
            Finished::NoRequest | Finished::NotDelivered => {
                return Err(RelayError::RequestNotFound {
                    code: code.display(),
                    request_id: request_id.to_owned(),
                });
            }
        };
        self.view(&code, record).await
    }

    /// The limits a provider's answer must respect.
    pub fn answer_limits(&self) -> AnswerLimits {
        AnswerLimits {
            max_depth: self.inner.config.max_json_depth,
            max_bytes: self.inner.config.max_response_bytes,
        }
    }
}

/// Limits on a provider's answer, checked where it enters the system.
#[derive(Debug, Clone, Copy)]
pub struct AnswerLimits {
    /// Deepest JSON nesting of its result or error.
    pub max_depth: usize,
    /// Largest answer, in bytes of JSON.
    pub max_bytes: usize,
}

impl AnswerLimits {
    /// Only the nesting, for a front end in front of the relay: the JSON must be able to
    /// cross gRPC; the relay checks the size itself.
    pub fn depth_only(max_depth: usize) -> Self {
        Self {
            max_depth,
            max_bytes: usize::MAX,
        }
    }
}

/// A provider's answer within `limits`, or — when it is too deep or too large to keep — a
/// failed answer saying so, with the error for the provider. Either way the caller gets an
/// answer: a refused answer must not leave the call to be delivered again and again.
pub fn contain_response(
    response: ProviderResponse,
    limits: AnswerLimits,
) -> (ProviderResponse, Option<RelayError>) {
    let depth = [
        &response.result,
        &response.error,
        &response.structured_content,
    ]
    .into_iter()
    .flatten()
    .chain(response.content.iter().flatten())
    .map(toolrelay::json::depth)
    .max()
    .unwrap_or(0);
    if depth > limits.max_depth {
        let (failed, refusal) = too_deep_response(response.request_id, limits.max_depth);
        return (failed, Some(refusal));
    }
    let size = toolrelay::json::encoded_len(&response);
    if size <= limits.max_bytes {
        if let Err(bad) = check_content(
            response.content.as_deref(),
            response.structured_content.as_ref(),
        ) {
            let refusal = RelayError::InvalidResponse {
                reason: bad.message(),
            };
            let message = format!(
                "The tool's answer could not be passed on: {}",
                bad.message()
            );
            return (
                failed_response(response.request_id, &refusal, message),
                Some(refusal),
            );
        }
        return (response, None);
    }
    let refusal = RelayError::ResponseTooLarge {
        size,
        limit: limits.max_bytes,
    };
    let message = format!(
        "The tool's answer was over {} bytes and could not be kept. Ask for less data (fewer items, fewer attributes, a smaller image) and call again.",
        limits.max_bytes
    );
    (
        failed_response(response.request_id, &refusal, message),
        Some(refusal),
    )
}

/// The failed answer the caller gets for a provider's answer to `request_id` nested more than
/// `limit` levels deep (one too deep for the JSON parser to read at all, too), with the error
/// for the provider.
pub fn too_deep_response(request_id: String, limit: usize) -> (ProviderResponse, RelayError) {
    let refusal = RelayError::NestedTooDeeply {
        what: "The tool's answer is",
        limit,
    };
    let message = format!(
        "The tool's answer was nested more than {limit} levels deep and could not be kept. Ask for the data in a flatter shape, or for less of it."
    );
    (failed_response(request_id, &refusal, message), refusal)
}

pub(super) fn failed_response(
    request_id: String,
    refusal: &RelayError,
    message: String,
) -> ProviderResponse {
    ProviderResponse {
        request_id,
        success: Some(false),
        result: None,
        error: Some(serde_json::json!({"code": refusal.name(), "message": message})),
        content: None,
        structured_content: None,
    }
}

/// A provider's response in the one shape the relay keeps: `success` defaults to "no error
/// given"; an error may be a string, an object with `message` (and `code`), or anything else.
pub(super) fn normalise_response(
    response: ProviderResponse,
) -> Result<(RequestStatus, ToolResponse), RelayError> {
    if !is_valid_request_id(&response.request_id) {
        return Err(RelayError::InvalidResponse {
            reason: "requestId is missing or malformed; echo the requestId of the tool-request"
                .into(),
        });
    }
    let success = response.success.unwrap_or(response.error.is_none());
    let error = if success {
        None
    } else {
        Some(match response.error {
            None | Some(Value::Null) => ToolError {
                code: "tool_error".into(),
                message: "The tool reported a failure without a message.".into(),
            },
            Some(Value::String(message)) => ToolError {
                code: "tool_error".into(),
                message,
            },
            Some(Value::Object(object)) => ToolError {
                code: object
                    .get("code")
                    .and_then(Value::as_str)
                    .unwrap_or("tool_error")
                    .to_owned(),
                message: object
                    .get("message")
                    .and_then(Value::as_str)
                    .map_or_else(|| Value::Object(object.clone()).to_string(), str::to_owned),
            },
            Some(other) => ToolError {
                code: "tool_error".into(),
                message: other.to_string(),
            },
        })
    };
    let status = if success {
        RequestStatus::Completed
    } else {
        RequestStatus::Failed
    };
    // An answer of content alone has no result; one of nothing succeeded with `null`.
    let has_content = response.content.is_some() || response.structured_content.is_some();
    let result = match (success, response.result) {
        (true, None) if !has_content => Some(Value::Null),
        (_, result) => result,
    };
    Ok((
        status,
        ToolResponse {
            request_id: response.request_id,
            success,
            result,
            error,
            content: response.content,
            structured_content: response.structured_content,
        },
    ))
}
