//! What the tools mean: a session's tools listed, called (waiting for the tab, with
//! progress) and watched for changes, built-in tools called, and every outcome as MCP
//! content (a result, or an `isError` result naming the error).

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use rmcp::RoleServer;
use rmcp::model::{CallToolResult, ContentBlock, JsonObject, ProgressNotificationParam, Tool};
use rmcp::service::{RequestContext, SubscriptionContext};
use serde_json::{Value, json};
use toolrelay_relay::builtin::{FailureCode, Scope};
use toolrelay_relay::relay::operations::{
    AwaitResponse, CallTool, CancelRequest, GetManifest, ResolveHandle, Submit,
};
use toolrelay_relay::{CallInput, Caller, ErrorCode, ErrorInfo, ErrorKind, RelayApi, SessionCode};

use super::{McpRequest, RelayMcp, caller_of, mcp_session_of, request_of};
use crate::types::CallResponse;

/// How often a call waiting for the tab reports progress.
const PROGRESS_EVERY: Duration = Duration::from_secs(2);
/// How often a watcher of a session's tools checks that its MCP client is still there.
const CLIENT_CHECK_EVERY: Duration = Duration::from_secs(30);
/// How soon a watcher of a session's tools whose relay could not be reached asks again
/// (doubling up to 5 s).
const WATCH_RETRY: Duration = Duration::from_millis(500);

pub(super) fn tool(name: &str, description: &str, schema: Value) -> Tool {
    let schema: JsonObject = schema.as_object().cloned().unwrap_or_default();
    Tool::new(name.to_owned(), description.to_owned(), Arc::new(schema))
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

/// A tool failure: `isError` with the message (and the error's name, for programs).
pub(super) fn failure(code: &str, message: &str) -> CallToolResult {
    let mut result = CallToolResult::error(vec![ContentBlock::text(message.to_owned())]);
    result.structured_content = Some(json!({"error": {"code": code, "message": message}}));
    result
}

pub(super) fn from_error(error: &ErrorInfo) -> CallToolResult {
    failure(error.code.as_str(), &error.message)
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

    /// The session code of `/mcp/s/{handle}`.
    pub(super) async fn scoped_code(
        &self,
        context: &RequestContext<RoleServer>,
    ) -> Result<String, ErrorInfo> {
        let handle = request_of(context)
            .and_then(|request| request.handle)
            .unwrap_or_default();
        self.state
            .relay
            .run(&caller_of(context), ResolveHandle { handle })
            .await
    }

    /// A session given as a handle or a pairing code.
    pub(super) async fn session_code(
        &self,
        caller: &Caller,
        session: &str,
    ) -> Result<String, ErrorInfo> {
        if SessionCode::parse(session).is_ok() {
            return Ok(session.to_owned());
        }
        self.state
            .relay
            .run(
                caller,
                ResolveHandle {
                    handle: session.to_owned(),
                },
            )
            .await
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
            .flat()
            .tools
            .into_iter()
            .map(|t| tool(&t.name, &t.description, t.input_schema))
            .collect())
    }

    /// Calls a tool of a session and waits for its answer, reporting progress meanwhile.
    pub(super) async fn call_in_session(
        &self,
        code: &str,
        name: &str,
        arguments: Value,
        context: &RequestContext<RoleServer>,
    ) -> CallToolResult {
        let caller = &caller_of(context);
        let relay = &self.state.relay;
        let call = CallInput {
            function_name: name.to_owned(),
            args: arguments,
            ..CallInput::default()
        };
        let submit = Submit {
            code: code.to_owned(),
            call,
        };
        let mut view = match relay.run(caller, submit).await {
            Ok(view) => view,
            Err(error) => return from_error(&error),
        };
        let token = context.meta.get_progress_token();
        let mut waited = 0.0;
        while view.response.is_none() {
            tokio::select! {
                next = relay.run(caller, AwaitResponse { code: code.to_owned(), request_id: view.request_id.clone(), wait: PROGRESS_EVERY }) => match next {
                    Ok(next) => view = next,
                    Err(error) => return from_error(&error),
                },
                () = context.ct.cancelled() => {
                    // The client cancelled (`notifications/cancelled`, or it closed the
                    // response stream): the call ends for the tab too.
                    let cancel = CancelRequest { code: code.to_owned(), request_id: view.request_id.clone() };
                    if let Err(error) = relay.run(caller, cancel).await {
                        tracing::warn!(error = %error.message, "a call its MCP client cancelled could not be cancelled");
                    }
                    return failure(ErrorCode::Cancelled.as_str(), "The call was cancelled by the client.");
                }
            }
            if view.response.is_none()
                && let Some(token) = token.clone()
            {
                waited += PROGRESS_EVERY.as_secs_f64();
                let message = if view.provider_connected {
                    format!("Waiting for the tab to answer ({waited:.0} s)")
                } else {
                    format!("{} ({waited:.0} s)", crate::types::NO_TAB)
                };
                let note = ProgressNotificationParam::new(token, waited).with_message(message);
                let _ = context.peer.notify_progress(note).await;
            }
        }
        let Some(response) = view.response else {
            return failure(
                ErrorCode::ToolError.as_str(),
                "The call ended without an answer.",
            );
        };
        let answer = CallResponse::from(response);
        match (answer.success, answer.error) {
            (true, _) => {
                let mut value = answer.result.unwrap_or(Value::Null);
                if answer.truncated == Some(true) {
                    value = json!({"truncated": true, "note": answer.note, "result": value});
                }
                success(value)
            }
            (false, Some(error)) => failure(&error.code, &error.message),
            (false, None) => failure(
                ErrorCode::ToolError.as_str(),
                "The tool failed without a message.",
            ),
        }
    }

    /// A built-in tool, outside any session (scope: the MCP session when there is one).
    pub(super) async fn call_builtin(
        &self,
        name: &str,
        arguments: Value,
        context: &RequestContext<RoleServer>,
    ) -> CallToolResult {
        let caller = caller_of(context);
        if let Err(limited) = self.state.limits.tool_call(caller.address).await {
            return failure(limited.code.as_str(), &limited.message);
        }
        let scope = mcp_session_of(context).map_or(Scope::None, Scope::Mcp);
        let call = CallTool {
            name: name.to_owned(),
            args: arguments,
            scope,
        };
        // A cancelled call's run is dropped: a sandboxed process is killed, its slot freed.
        let outcome = tokio::select! {
            outcome = self.state.relay.run(&caller, call) => outcome,
            () = context.ct.cancelled() => {
                return failure(ErrorCode::Cancelled.as_str(), "The call was cancelled by the client.");
            }
        };
        match outcome {
            Ok(Ok(value)) => success(value),
            Ok(Err(error)) => failure(&error.code.to_string(), &error.message),
            // The relay could not be reached (the gateway's own callers are let in).
            Err(refused) => failure(
                &FailureCode::from(refused.code).to_string(),
                &refused.message,
            ),
        }
    }
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
        let resolve = ResolveHandle {
            handle: handle.clone(),
        };
        let watched = match relay.run(&request.caller, resolve).await {
            Ok(code) => relay.manifest_changes(&request.caller, &code).await,
            Err(error) => Err(error),
        };
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
