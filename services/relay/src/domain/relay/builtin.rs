//! Built-in tools: listing them, running one outside a session, and running a session's
//! built-in calls.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use serde_json::Value;
use toolrelay::wire::ProviderResponse;

use super::Relay;
use crate::builtin::{Context, FailureKind, Scope, Tickets, ToolCode, ToolFailure, ToolInfo};
use crate::code::{self, SessionCode};
use crate::error::RelayError;
use crate::metrics::{AnsweredBy, MipTool};
use crate::store::{Answerer, BUILTIN_LEASE, NewRequest, RequestRecord, SessionEvent, Store};

impl Relay {
    /// The built-in tools.
    pub(crate) fn tools(&self) -> Vec<ToolInfo> {
        self.inner.tools.list()
    }

    /// Runs a built-in tool outside any session, for `scope` (stateful tools need one), for
    /// the client at `client` (the MIP tools share their slots fairly by it).
    pub(crate) async fn call_tool(
        &self,
        name: &str,
        args: Value,
        scope: Scope,
        client: IpAddr,
    ) -> Result<Value, ToolFailure> {
        let limit = self.inner.config.max_json_depth;
        if toolrelay::json::depth(&args) > limit {
            let error = RelayError::NestedTooDeeply {
                what: "The arguments are",
                limit,
            };
            return Err(ToolFailure::new(
                FailureKind::BadInput,
                ToolCode::NestedTooDeeply,
                error.to_string(),
            ));
        }
        // Keyed as every per-address budget is (an IPv6 client by its /GUARD_IPV6_PREFIX).
        let client = crate::limits::client_key(client, self.inner.config.limits.ipv6_prefix);
        let context = Context {
            client: Some(client),
            ..self.tool_context(scope)
        };
        self.inner.tools.call(name, args, &context).await
    }

    pub(super) fn tool_context(&self, scope: Scope) -> Context {
        Context {
            scope,
            client: None,
            tickets: Tickets::new(
                Arc::clone(&self.inner.store) as Arc<dyn Store>,
                self.inner.clock.clone(),
            ),
            metrics: self.inner.metrics.clone(),
        }
    }

    /// A new call to a built-in tool that would be refused (a MIP tool while the session runs
    /// a model already) gets 429 now, rather than a queued request that fails with BUSY (a
    /// repeated call returns its own state). A call that only has to wait for its turn is
    /// queued.
    pub(super) async fn check_builtin_ready(
        &self,
        code: &SessionCode,
        request: &NewRequest,
        given_id: bool,
    ) -> Result<(), RelayError> {
        if given_id && self.inner.store.request(code, &request.id).await?.is_some() {
            return Ok(());
        }
        let context = self.tool_context(Scope::Session(code.clone()));
        match self.inner.tools.ready(&request.function_name, &context) {
            Err(failure) if failure.kind == FailureKind::Busy => {
                if let Some(tool) = MipTool::of_tool(&request.function_name) {
                    self.inner.metrics.mip_refused(tool);
                }
                Err(RelayError::ToolBusy {
                    message: failure.message,
                    retry_after: failure.retry_after.unwrap_or(Duration::from_secs(2)),
                })
            }
            _ => Ok(()),
        }
    }

    /// Runs a built-in tool called through a session, in the background, and records its
    /// answer like a tab's — if this run gets the call's lease (see [`BUILTIN_LEASE`]): the
    /// call was just queued here, or the replica that ran it is gone. The lease is renewed
    /// while the tool runs; a run that loses it (another replica took the call over) stops.
    pub(super) fn run_builtin(&self, code: SessionCode, record: &RequestRecord) {
        let relay = self.clone();
        let (id, name, args) = (
            record.id.clone(),
            record.function_name.clone(),
            record.args.clone(),
        );
        tokio::spawn(async move {
            let holder = format!("{}/{}", relay.inner.replica, code::random_id());
            let lease = || {
                let now = relay.now();
                relay
                    .inner
                    .store
                    .lease_builtin(&code, &id, &holder, now, now.plus(BUILTIN_LEASE))
            };
            match lease().await {
                Ok(Some(record)) if record.deliveries > 1 => {
                    tracing::info!(code = %code.redacted(), request_id = %id, function = %name, "took over a built-in call whose replica is gone");
                }
                Ok(Some(_)) => {}
                Ok(None) => return,
                Err(error) => {
                    tracing::warn!(code = %code.redacted(), %error, "a built-in call could not be leased; another replica will take it over");
                    return;
                }
            }
            // The call's answer from elsewhere (its caller cancelled it) stops the run: the
            // tool's future is dropped, which ends its sandbox process or its solve and frees
            // its slot.
            let mut answered = match relay.inner.store.listen_for_answer(&code, &id).await {
                Ok(events) => events,
                Err(_) => Box::pin(futures::stream::pending()),
            };
            let context = relay.tool_context(Scope::Session(code.clone()));
            let mut run = std::pin::pin!(relay.inner.tools.call(&name, args, &context));
            let mut renew = tokio::time::interval(BUILTIN_LEASE / 3);
            renew.reset();
            let outcome = loop {
                tokio::select! {
                    outcome = &mut run => break outcome,
                    event = answered.next() => match event {
                        Some(SessionEvent::ResponseReady { id: answered_id, .. }) if answered_id == id => {
                            tracing::info!(code = %code.redacted(), request_id = %id, function = %name, "a built-in call was cancelled; its run stops");
                            return;
                        }
                        Some(SessionEvent::SessionEnded) => return,
                        // Lost events, or the stream's end: the lease's renewal finds out.
                        Some(_) => {}
                        None => answered = Box::pin(futures::stream::pending()),
                    },
                    _ = renew.tick() => match lease().await {
                        Ok(Some(_)) => {}
                        Ok(None) => return,
                        // Redis is away: keep running; the answer is recorded if it is back
                        // in time, and the lease may be taken over meanwhile.
                        Err(error) => tracing::warn!(code = %code.redacted(), %error, "a built-in call's lease was not renewed"),
                    },
                }
            };
            let response = match outcome {
                Ok(result) => ProviderResponse {
                    request_id: id,
                    success: Some(true),
                    result: Some(result),
                    error: None,
                    content: None,
                    structured_content: None,
                },
                Err(failure) => ProviderResponse {
                    request_id: id,
                    success: Some(false),
                    result: None,
                    error: Some(
                        serde_json::json!({"code": failure.code, "message": failure.message}),
                    ),
                    content: None,
                    structured_content: None,
                },
            };
            if let Err(error) = relay
                .accept_response(&code, response, AnsweredBy::Builtin, Answerer::Relay)
                .await
            {
                tracing::warn!(code = %code.redacted(), %error, "a built-in tool's answer was not recorded");
            }
        });
    }
}
