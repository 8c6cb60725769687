//! What the tools mean: a session's tools listed, called (waiting for the tab, with
//! progress) and watched for changes, built-in tools called, and every outcome as MCP
//! content (a result, or an `isError` result naming the error).

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use rmcp::model::{
    CallToolResult, ContentBlock, Icon, JsonObject, MetaObject, ProgressNotificationParam, Tool,
    ToolAnnotations,
};
use rmcp::service::{RequestContext, SubscriptionContext};
use rmcp::{ErrorData as McpError, RoleServer};
use serde_json::{Value, json};
use tokio::time::Instant;
use toolrelay::wire::{FunctionSpec, LogFrame, LogLevel, ToolHints, ToolResponse};
use toolrelay_relay::front::ops::{AwaitResponse, Call, CallTool, CancelRequest, GetManifest};
use toolrelay_relay::front::unique_id;
use toolrelay_relay::front::{CallInput, CallNews, Caller, ErrorCode, ErrorInfo, ErrorKind};
use toolrelay_relay::front::{FailureCode, Scope, ToolCode};
use toolrelay_relay::front::{RelayApi, RequestView};

use super::{McpRequest, RelayMcp, caller_of, mcp_session_of, request_of};
use crate::types::CallResponse;

/// How often a call waiting for the tab reports progress.
const PROGRESS_EVERY: Duration = Duration::from_secs(2);
/// How often a watcher of a session's tools checks that its MCP client is still there.
const CLIENT_CHECK_EVERY: Duration = Duration::from_secs(30);
/// How soon a watcher of a session's tools whose relay could not be reached asks again
/// (doubling up to 5 s).
const WATCH_RETRY: Duration = Duration::from_millis(500);

/// The relay's icon (an SVG, as a `data:` URI): the server's and its own tools'.
pub(super) fn relay_icon() -> Icon {
    let svg = data_encoding::BASE64.encode(include_bytes!("icon.svg"));
    Icon::new(format!("data:image/svg+xml;base64,{svg}"))
        .with_mime_type("image/svg+xml")
        .with_sizes(vec!["any".to_owned()])
}

/// An MCP tool with its title and annotations: what it does to data as given, the rest by
/// SPEC §4's defaults (an untitled tool is titled after its name; an unmarked one may change
/// or delete data; only one whose results may hold untrusted content reaches an open world).
pub(super) fn tool(name: &str, description: &str, schema: Value, hints: &ToolHints) -> Tool {
    let schema: JsonObject = schema.as_object().cloned().unwrap_or_default();
    let title = hints.title_or(name);
    let annotations = ToolAnnotations::from_raw(
        Some(title.clone()),
        Some(hints.is_read_only()),
        Some(hints.destructive_hint()),
        Some(hints.idempotent_hint()),
        Some(hints.is_untrusted()),
    );
    Tool::new(name.to_owned(), description.to_owned(), Arc::new(schema))
        .with_title(title)
        .with_annotations(annotations)
}

/// A function of a manifest (a tab's, or a built-in tool) as an MCP tool; a built-in tool
/// carries its output schema and the relay's icon.
pub(super) fn listed(function: FunctionSpec) -> Tool {
    let listed = tool(
        &function.name,
        &function.description,
        function.parameters,
        &function.hints,
    );
    match function.output_schema {
        Some(Value::Object(schema)) => listed
            .with_raw_output_schema(Arc::new(schema))
            .with_icons(vec![relay_icon()]),
        _ => listed,
    }
}

/// A successful result: the value as structured content (wrapped when not an object) and as
/// text, cut to the size an LLM can take like every other answer.
pub(super) fn success(value: Value) -> CallToolResult {
    let text = serde_json::to_string_pretty(&value).unwrap_or_else(|_| value.to_string());
    let mut result = CallToolResult::success(vec![ContentBlock::text(text)]);
    result.structured_content = Some(match value {
        Value::Object(_) => value,
        other => json!({"result": other}),
    });
    result
}

/// The `_meta` key that marks a result holding content from outside the user's document.
const UNTRUSTED_CONTENT: &str = "toolrelay/untrustedContent";

/// A tool failure: `isError` with the message (and the error's name, for programs).
pub(super) fn failure(code: &str, message: &str) -> CallToolResult {
    let mut result = CallToolResult::error(vec![ContentBlock::text(message.to_owned())]);
    result.structured_content = Some(json!({"error": {"code": code, "message": message}}));
    result
}

pub(super) fn from_error(error: &ErrorInfo) -> CallToolResult {
    failure(error.code.as_str(), &error.message)
}

/// What a tool call came to: a result for the model, or the news that no tool of that name is
/// there (its message names the ones that are).
pub(super) enum Called {
    /// The tool's result, or a failure the model can act on.
    Result(CallToolResult),
    /// No tool of that name.
    NoSuchTool(String),
}

impl Called {
    /// As the answer to `tools/call`, where a name that is no tool is a protocol error
    /// (JSON-RPC -32602, the error table of every MCP revision).
    pub(super) fn answering_tools_call(self) -> Result<CallToolResult, McpError> {
        match self {
            Self::Result(result) => Ok(result),
            Self::NoSuchTool(message) => Err(McpError::invalid_params(message, None)),
        }
    }

    /// As the result of a tool that calls another by name (`call_session_tool`): a failed
    /// result naming the functions there are, so that the model can correct itself.
    pub(super) fn inside_a_tool(self) -> CallToolResult {
        match self {
            Self::Result(result) => result,
            Self::NoSuchTool(message) => failure(ErrorCode::UnknownFunction.as_str(), &message),
        }
    }
}

impl From<CallToolResult> for Called {
    fn from(result: CallToolResult) -> Self {
        Self::Result(result)
    }
}

impl RelayMcp {
    /// On `/mcp/s/{handle}`, a task telling the client each time the session's tools change
    /// (the tab reloads, registers more), for as long as the client stays and the session
    /// lives: the revisions with a client session, which hear it on their event stream.
    pub(super) fn watch_tools(&self, context: &RequestContext<RoleServer>) {
        if !self.scoped {
            return;
        }
        let Some(request) = request_of(context) else {
            return;
        };
        let peer = context.peer.clone();
        let relay = self.state.relay.clone();
        // The server's end or the session's.
        let stopping = self.state.shutdown.clone();
        let ended = self.ended.0.clone();
        tokio::spawn(async move {
            let stopped = async {
                tokio::select! {
                    () = stopping.cancelled() => {}
                    () = ended.cancelled() => {}
                }
            };
            let notify = || async { peer.notify_tool_list_changed().await.is_ok() };
            let gone = || peer.is_transport_closed();
            follow_tools(&relay, &request, false, stopped, gone, notify).await;
        });
    }

    /// 2026-07-28's `subscriptions/listen` for `notifications/tools/list_changed` on
    /// `/mcp/s/{handle}`: the same changes, on the listen request's own stream, until the
    /// client cancels it (closes the stream) or the session ends.
    pub(super) async fn listen_tools(&self, subscription: &SubscriptionContext) {
        let Some(request) = request_of(subscription.request_context()) else {
            return;
        };
        let sink = subscription.sink();
        let notify = || async { sink.notify_tool_list_changed().await.is_ok() };
        let peer = &subscription.request_context().peer;
        let stopped = subscription.cancelled();
        let gone = || peer.is_transport_closed();
        // rmcp acknowledges the subscription before this starts watching: a change in between
        // would be missed, so the first watch says the tools may have changed.
        follow_tools(&self.state.relay, &request, true, stopped, gone, notify).await;
    }

    /// The session of `/mcp/s/{handle}`: its handle, which the relay takes wherever it takes a
    /// code (and guards as the 128-bit secret it is, never refusing it for other callers'
    /// guesses).
    pub(super) fn scoped_handle(context: &RequestContext<RoleServer>) -> String {
        request_of(context)
            .and_then(|request| request.handle)
            .unwrap_or_default()
    }

    /// The session's tools, as MCP tools.
    pub(super) async fn session_tools(
        &self,
        caller: &Caller,
        code: &str,
    ) -> Result<Vec<Tool>, ErrorInfo> {
        let manifest = self
            .state
            .relay
            .run(
                caller,
                GetManifest {
                    code: code.to_owned(),
                },
            )
            .await?;
        Ok(manifest
            .tools
            .into_iter()
            .flat_map(|group| group.functions)
            .map(listed)
            .collect())
    }

    /// Calls a tool of a session and waits for its answer, reporting progress meanwhile: the
    /// `Call` unit an HTTP caller's `…/call` runs (its view carries the untrusted-content
    /// mark), then `AwaitResponse` while the tab works, as an HTTP caller asks for the call
    /// again. A client that cancels cancels the call (`CancelRequest`). A read (`read_only`)
    /// runs only a function marked read-only.
    pub(super) async fn call_in_session(
        &self,
        code: &str,
        name: &str,
        arguments: Value,
        read_only: bool,
        context: &RequestContext<RoleServer>,
    ) -> Called {
        let caller = &caller_of(context);
        let relay = &self.state.relay;
        // Named here, so that a call cancelled while it is being queued can be found.
        let request_id = unique_id();
        let call = Call {
            code: code.to_owned(),
            call: CallInput {
                request_id: Some(request_id.clone()),
                function_name: name.to_owned(),
                args: arguments,
                read_only,
                ..CallInput::default()
            },
            wait: Some(PROGRESS_EVERY),
            news: true,
        };
        let cancel = CancelRequest {
            code: code.to_owned(),
            request_id: request_id.clone(),
        };
        let started = Instant::now();
        // The call's queueing is owned, so that a client cancelling meanwhile does not cut it
        // short: the call may be on its way into the queue (on another replica, even), and is
        // cancelled once it is there.
        let queueing = {
            let (relay, caller) = (relay.clone(), caller.clone());
            async move { relay.run(&caller, call).await }
        };
        let mut queueing = Box::pin(queueing);
        let first = tokio::select! {
            first = &mut queueing => first,
            () = context.ct.cancelled() => {
                let (relay, caller) = (relay.clone(), caller.clone());
                tokio::spawn(async move {
                    let _ = queueing.await;
                    cancelled(&relay, &caller, cancel).await;
                });
                return failure(ErrorCode::Cancelled.as_str(), "The call was cancelled by the client.").into();
            }
        };
        let mut passed = Passed::default();
        let waiting = async {
            let mut view = first?;
            let untrusted = view.untrusted;
            while view.response.is_none() {
                self.pass_on(context, &mut passed, &view, started).await;
                let again = AwaitResponse {
                    code: code.to_owned(),
                    request_id: request_id.clone(),
                    wait: PROGRESS_EVERY,
                    news: true,
                };
                view = relay.run(caller, again).await?;
            }
            // News that came with the answer goes before it.
            self.pass_on(
                context,
                &mut passed,
                &RequestView {
                    response: None,
                    ..view.clone()
                },
                started,
            )
            .await;
            Ok::<_, ErrorInfo>((view, untrusted))
        };
        let (view, untrusted) = tokio::select! {
            answered = waiting => match answered {
                Ok(answered) => answered,
                Err(error) if error.code == ErrorCode::UnknownFunction => {
                    return Called::NoSuchTool(error.message);
                }
                Err(error) => return from_error(&error).into(),
            },
            () = context.ct.cancelled() => {
                // The client cancelled (`notifications/cancelled`, or it closed the response
                // stream): the call ends for the tab too.
                cancelled(relay, caller, cancel).await;
                return failure(ErrorCode::Cancelled.as_str(), "The call was cancelled by the client.").into();
            }
        };
        let Some(response) = view.response else {
            return failure(
                ErrorCode::ToolError.as_str(),
                "The call ended without an answer.",
            )
            .into();
        };
        let mut result = answered(response);
        if untrusted && !result.is_error.unwrap_or(false) {
            let mut meta = JsonObject::new();
            meta.insert(UNTRUSTED_CONTENT.to_owned(), Value::Bool(true));
            result.meta = Some(MetaObject(meta));
        }
        result.into()
    }

    /// Passes a waiting call's news on to the client: its tab's progress (to a client that
    /// gave a progress token, each value above the last one sent) and log messages (at or
    /// above the level the client set). Until the tab reports progress, the relay reports the
    /// seconds waited.
    #[allow(deprecated)] // logging, deprecated from 2026-07-28 on, is still in the older ones
    async fn pass_on(
        &self,
        context: &RequestContext<RoleServer>,
        passed: &mut Passed,
        view: &RequestView,
        started: Instant,
    ) {
        let token = context.meta.get_progress_token();
        let reported = view.news.iter().filter_map(|news| match news {
            CallNews::Progress(progress) => Some(progress),
            CallNews::Log(_) => None,
        });
        // The call's kept progress covers news between two waits. The tab's values count on
        // from the seconds the relay reported before its first (one token counts up once).
        let mut any = false;
        for progress in view.progress.iter().chain(reported) {
            any = true;
            let offset = *passed.offset.get_or_insert(passed.sent.unwrap_or(0.0));
            let Some(token) = token.clone() else { continue };
            let value = offset + progress.progress;
            if passed.sent.is_some_and(|sent| value <= sent) {
                continue;
            }
            passed.sent = Some(value);
            let mut note = ProgressNotificationParam::new(token, value);
            note.total = progress.total.map(|total| offset + total);
            note.message.clone_from(&progress.message);
            let _ = context.peer.notify_progress(note).await;
        }
        // 2026-07-28 asks per request (`_meta`), and a request that names no level gets no
        // log messages; the older revisions set it for the session.
        let asked: Option<LogLevel> = context
            .meta
            .log_level()
            .and_then(|level| serde_json::to_value(level).ok())
            .and_then(|level| serde_json::from_value(level).ok());
        let level = match (asked, context.meta.protocol_version()) {
            (Some(level), _) => Some(level),
            (None, Some(_)) => None,
            (None, None) => Some(self.log_level()),
        };
        for news in &view.news {
            if let CallNews::Log(log) = news
                && level.is_some_and(|level| log.level >= level)
            {
                let _ = context.peer.notify_logging_message(logged(log)).await;
            }
        }
        if !any && passed.offset.is_none() && view.news.is_empty() && view.response.is_none() {
            waited(context, passed, started, view.provider_connected).await;
        }
    }

    /// A built-in tool, outside any session (scope: the MCP session when there is one).
    pub(super) async fn call_builtin(
        &self,
        name: &str,
        arguments: Value,
        context: &RequestContext<RoleServer>,
    ) -> Called {
        let caller = caller_of(context);
        if let Err(limited) = self.state.limits.tool_call(&caller).await {
            return failure(limited.code.as_str(), &limited.message).into();
        }
        let scope = mcp_session_of(context).map_or(Scope::None, Scope::Mcp);
        let call = CallTool {
            name: name.to_owned(),
            args: arguments,
            scope,
        };
        // A cancelled call's run is dropped: a sandboxed process is killed, its slot freed.
        // A long run (a MIP solve may take minutes) tells the client the seconds it has run,
        // so that a host keeping a call alive on progress waits for it.
        let running = self.state.relay.run(&caller, call);
        let mut running = std::pin::pin!(running);
        let started = Instant::now();
        let mut every = tokio::time::interval_at(started + PROGRESS_EVERY, PROGRESS_EVERY);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        let mut sent = 0.0;
        let outcome = loop {
            tokio::select! {
                outcome = &mut running => break outcome,
                _ = every.tick() => ran(context, name, started, &mut sent).await,
                () = context.ct.cancelled() => {
                    return failure(ErrorCode::Cancelled.as_str(), "The call was cancelled by the client.").into();
                }
            }
        };
        let result = match outcome {
            Ok(Ok(value)) => success(value),
            Ok(Err(error)) if error.code == FailureCode::Tool(ToolCode::ToolNotFound) => {
                return Called::NoSuchTool(error.message);
            }
            Ok(Err(error)) => failure(&error.code.to_string(), &error.message),
            // The relay could not be reached (the gateway's own callers are let in).
            Err(refused) => failure(
                &FailureCode::from(refused.code).to_string(),
                &refused.message,
            ),
        };
        result.into()
    }
}

/// Cancels a call its MCP client cancelled.
async fn cancelled(relay: &RelayApi, caller: &Caller, cancel: CancelRequest) {
    if let Err(error) = relay.run(caller, cancel).await {
        tracing::warn!(error = %error.message, "a call its MCP client cancelled could not be cancelled");
    }
}

/// What a call's client was told of its progress.
#[derive(Default)]
struct Passed {
    /// The last progress value sent (each must be above the one before).
    sent: Option<f64>,
    /// Once the tab reports progress (and the relay stops reporting the time waited), what
    /// its values are counted on from: the seconds reported before.
    offset: Option<f64>,
}

/// Tells the client (when it asked, with a progress token) that its call still waits, and how
/// long it has: for the tab to answer, or for a tab to be opened.
async fn waited(
    context: &RequestContext<RoleServer>,
    passed: &mut Passed,
    started: Instant,
    connected: bool,
) {
    let Some(token) = context.meta.get_progress_token() else {
        return;
    };
    let waited = started.elapsed().as_secs_f64().round();
    if passed.sent.is_some_and(|sent| waited <= sent) {
        return;
    }
    passed.sent = Some(waited);
    let message = if connected {
        format!("Waiting for the tab to answer ({waited:.0} s)")
    } else {
        format!("{} ({waited:.0} s)", crate::types::NO_TAB)
    };
    let note = ProgressNotificationParam::new(token, waited).with_message(message);
    let _ = context.peer.notify_progress(note).await;
}

/// Tells the client (when it asked, with a progress token) how long a built-in tool has run.
async fn ran(context: &RequestContext<RoleServer>, name: &str, started: Instant, sent: &mut f64) {
    let Some(token) = context.meta.get_progress_token() else {
        return;
    };
    let seconds = started.elapsed().as_secs_f64().round();
    if seconds <= *sent {
        return;
    }
    *sent = seconds;
    let message = format!("{name} is running ({seconds:.0} s)");
    let note = ProgressNotificationParam::new(token, seconds).with_message(message);
    let _ = context.peer.notify_progress(note).await;
}

/// A tab's log message as MCP's.
#[allow(deprecated)] // logging, deprecated from 2026-07-28 on, is still in the older ones
fn logged(log: &LogFrame) -> rmcp::model::LoggingMessageNotificationParam {
    let level = serde_json::from_value(Value::String(log.level.as_str().to_owned()))
        .unwrap_or(rmcp::model::LoggingLevel::Info);
    let mut message = rmcp::model::LoggingMessageNotificationParam::new(level, log.data.clone());
    message.logger.clone_from(&log.logger);
    message
}

/// A tab's answer as an MCP tool result: its content as it sent it (text cut to what an LLM
/// can take) with its JSON result as text after it, its structured content (or its result,
/// wrapped when not an object); a failure with its content, or its error's message.
pub(super) fn answered(response: ToolResponse) -> CallToolResult {
    let structured = response.structured_content.clone();
    let content = response.content.clone();
    let answer = CallResponse::from(ToolResponse {
        content: None,
        structured_content: None,
        ..response
    });
    let Some(items) = content else {
        // No content: the result as text and structured content, as always.
        return match (answer.success, answer.error) {
            (true, _) => {
                // Structured content alone is its own text, for clients that read no other.
                let mut value = answer
                    .result
                    .or_else(|| structured.clone())
                    .unwrap_or(Value::Null);
                if answer.truncated == Some(true) {
                    value = json!({"truncated": true, "note": answer.note, "result": value});
                }
                let mut result = success(value);
                if let Some(structured) = structured {
                    result.structured_content = Some(structured);
                }
                result
            }
            (false, Some(error)) => failure(&error.code, &error.message),
            (false, None) => failure(
                ErrorCode::ToolError.as_str(),
                "The tool failed without a message.",
            ),
        };
    };
    let mut items = items;
    crate::types::cut_texts(&mut items);
    let mut blocks: Vec<ContentBlock> = items
        .into_iter()
        .map(|item| {
            serde_json::from_value(item.clone())
                .unwrap_or_else(|_| ContentBlock::text(item.to_string()))
        })
        .collect();
    let result = answer.result.filter(|result| !result.is_null());
    if let Some(result) = &result {
        let text = serde_json::to_string_pretty(result).unwrap_or_else(|_| result.to_string());
        blocks.push(ContentBlock::text(text));
    }
    let mut called = if answer.success {
        CallToolResult::success(blocks)
    } else {
        CallToolResult::error(blocks)
    };
    called.structured_content = match (structured, result, answer.error) {
        (Some(structured), _, _) => Some(structured),
        (None, Some(Value::Object(result)), _) if answer.success => Some(Value::Object(result)),
        (None, Some(result), _) if answer.success => Some(json!({"result": result})),
        (None, _, Some(error)) => {
            Some(json!({"error": {"code": error.code, "message": error.message}}))
        }
        _ => None,
    };
    called
}

/// Calls `notify` each time the tools of the session behind `request`'s handle change, and
/// once when a broken watch resumes (they may have changed meanwhile), or starts if
/// `from_start`; until the session is
/// gone, `notify` fails, `client_gone` says so (asked every `CLIENT_CHECK_EVERY`) or `stopped`
/// completes. A relay that cannot be reached (a replica died, the store is away) is asked
/// again; only a session that is gone ends the watch.
async fn follow_tools<N: Future<Output = bool>>(
    relay: &RelayApi,
    request: &McpRequest,
    from_start: bool,
    stopped: impl Future<Output = ()>,
    client_gone: impl Fn() -> bool,
    mut notify: impl FnMut() -> N,
) {
    let handle = request.handle.clone().unwrap_or_default();
    let mut still_there = tokio::time::interval(CLIENT_CHECK_EVERY);
    let mut retry = WATCH_RETRY;
    let mut resumed = from_start;
    let mut stopped = std::pin::pin!(stopped);
    loop {
        let watched = relay.manifest_changes(&request.caller, &handle).await;
        let mut changes = match watched {
            Ok(changes) => changes,
            Err(error) if error.kind == ErrorKind::NotFound => return,
            Err(_) => {
                tokio::select! {
                    () = tokio::time::sleep(retry) => {}
                    () = &mut stopped => return,
                }
                retry = (retry * 2).min(Duration::from_secs(5));
                if client_gone() {
                    return;
                }
                continue;
            }
        };
        retry = WATCH_RETRY;
        if resumed && !notify().await {
            return;
        }
        resumed = true;
        loop {
            tokio::select! {
                change = changes.next() => match change {
                    Some(()) => {
                        if !notify().await {
                            return;
                        }
                    }
                    // The session ended, or the stream broke: look again.
                    None => break,
                },
                _ = still_there.tick() => {
                    if client_gone() {
                        return;
                    }
                }
                () = &mut stopped => return,
            }
        }
    }
}
