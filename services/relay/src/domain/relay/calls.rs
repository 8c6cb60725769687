//! Calls: queueing a caller's call (its checks, its idempotency) and calling and waiting.

use std::time::Duration;

use serde_json::Value;
use toolrelay::wire::RequestStatus;

use super::{CallInput, Relay, RequestView, not_found};
use crate::builtin::{BUILTIN_GROUP, Registry};
use crate::clock::Timestamp;
use crate::code::{self, SessionCode};
use crate::error::RelayError;
use crate::manifest::Manifest;
use crate::store::{
    ApprovalCheck, EnqueueChecks, Enqueued, NewRequest, RateCharge, RequestRecord, RoutedAnswer,
};

impl Relay {
    /// Queues a call after checking it against the manifest; returns at once. Repeating a
    /// request id with the same call returns that call's state and runs nothing.
    pub async fn submit(&self, code: &str, call: CallInput) -> Result<RequestView, RelayError> {
        self.submit_charged(code, call, None).await
    }

    /// [`Relay::submit`], spending `charge` (the caller's budget) as the call is queued.
    pub(crate) async fn submit_charged(
        &self,
        code: &str,
        call: CallInput,
        charge: Option<RateCharge>,
    ) -> Result<RequestView, RelayError> {
        let (record, connected) = self.queue(code, call, charge, None).await?;
        Ok(RequestView::of(record, connected))
    }

    /// A call another replica queued and routed here because its session's tab is connected
    /// to this one (`call`: the record as the store packed it; the gRPC `Forward`, which only
    /// a replica proving itself with the gateway secret reaches): handed to the tab, its answer
    /// on the stream. A draining replica takes none: the other announces the call on Redis,
    /// and the tab hears of it wherever it moves.
    pub(crate) async fn accept_routed(
        &self,
        code: &str,
        call: String,
    ) -> Result<RoutedAnswer, RelayError> {
        self.accepting()?;
        let code = SessionCode::parse(code)?;
        Ok(self.inner.store.accept_routed(&code, call).await?)
    }

    /// [`Relay::submit`]'s work: the call's record, and whether a tab is there to run it.
    /// `charge` is spent whatever happens: with the queueing, or on its own when the call is
    /// refused before it gets there (an unknown code, bad arguments). A call that names no
    /// request id gets `fresh_id` (a random one when `None`).
    pub(super) async fn queue(
        &self,
        code: &str,
        call: CallInput,
        charge: Option<RateCharge>,
        fresh_id: Option<String>,
    ) -> Result<(RequestRecord, bool), RelayError> {
        let mut charge = charge;
        let queued = self.try_queue(code, call, &mut charge, fresh_id).await;
        if queued.is_err()
            && let Some(charge) = charge
        {
            self.inner.limits.spend_call(&charge, self.now()).await?;
        }
        queued
    }

    /// [`Relay::queue`]'s work; takes `charge` when it hands it to the store.
    ///
    /// A call's way in is one round trip to the store when this replica knows the session's
    /// manifest (it compiled it for an earlier call): the queueing checks that the manifest
    /// is still at that revision, spends the charge, and says whether a tab is there. Only
    /// the first call (or one after the manifest changed) reads the session first.
    pub(super) async fn try_queue(
        &self,
        code: &str,
        call: CallInput,
        charge: &mut Option<RateCharge>,
        fresh_id: Option<String>,
    ) -> Result<(RequestRecord, bool), RelayError> {
        self.accepting()?;
        let code = SessionCode::parse(code)?;
        let limit = self.inner.config.max_json_depth;
        if toolrelay::json::depth(&call.args) > limit {
            return Err(RelayError::NestedTooDeeply {
                what: "The arguments are",
                limit,
            });
        }
        let given_id = call.request_id.is_some();
        // A caller that waits for its call here listens for its id before it is queued: such a
        // call may be routed to its tab's replica, its answer coming back to this one.
        let waited_for = fresh_id.is_some();
        let request_id = match call.request_id {
            Some(id) if is_valid_request_id(&id) => id,
            Some(_) => return Err(RelayError::InvalidRequestId),
            None => fresh_id.unwrap_or_else(code::unique_id),
        };
        let args = match call.args {
            Value::Null => Value::Object(Default::default()),
            args => args,
        };
        let now = self.now();
        let mut request = NewRequest {
            id: request_id.clone(),
            tool_id: call.tool_id,
            function_name: call.function_name,
            args,
            created_at: now,
            deadline: now.plus(self.inner.config.request_timeout),
            builtin: false,
            correlation_id: call.correlation_id,
            caller: call.caller,
        };
        let (approval, applicant) = (call.approval, call.applicant);
        let asked_tool = request.tool_id.clone();
        let read_only = call.read_only;
        let mut known = self.inner.manifests.latest(&code);
        let limit = self.inner.config.max_pending_per_session;
        let until = now.plus(self.inner.config.session_ttl);
        // A manifest changed between the check and the queueing is rare; twice in a row rarer.
        for _ in 0..3 {
            let cached = known.is_some();
            let (revision, manifest) = match known.take() {
                Some(known) => known,
                None => {
                    let (_, session) = self.live_session(code.as_str()).await?;
                    let revision = session.manifest_revision;
                    (revision, self.manifest_of(&code, revision).await?)
                }
            };
            let (group, builtin) = match self
                .check_call(&code, &manifest, asked_tool.as_deref(), &request, read_only)
                .await
            {
                Ok(checked) => checked,
                // Refused by the manifest this replica compiled earlier: the tab may have
                // registered new tools since (through another replica), so the refusal
                // stands only against the session's manifest as it is now.
                Err(_) if cached && self.manifest_moved(&code, revision).await? => continue,
                Err(error) => {
                    // A refusal names the tab's tools (or their arguments): a caller the
                    // person has not allowed is asked about first, as its call would be.
                    if let (ApprovalCheck::Ask(_), Some(applicant)) = (&approval, &applicant) {
                        self.vetted(&code, applicant).await?;
                    }
                    // A call asked again while its tab is away (its tools not registered
                    // again yet) or after the tools changed is still the call it was.
                    if given_id
                        && let Some(earlier) = self.earlier_call(&code, &request, now).await?
                    {
                        return Ok(earlier);
                    }
                    return Err(error);
                }
            };
            // The provider dispatches on (tool, function): name the tool even when the caller
            // did not, so a call with and without `toolId` is the same call.
            request.tool_id = Some(group);
            request.builtin = builtin;
            if builtin {
                self.check_builtin_ready(&code, &request, given_id).await?;
            }
            let checks = EnqueueChecks {
                manifest_revision: Some(revision),
                charge: charge.take(),
                approval: approval.clone(),
                route: waited_for,
            };
            let (enqueued, session) = self
                .inner
                .store
                .enqueue_checked(&code, &request, limit, until, checks)
                .await?;
            let connected = match &session {
                Some(session) => self.connected_transport(session, now).await.is_some(),
                None => false,
            };
            return match enqueued {
                Enqueued::Queued(record) if record.status == RequestStatus::AwaitingApproval => {
                    self.held(&code, record, connected, applicant.as_ref())
                        .await
                }
                Enqueued::Queued(mut record) => {
                    tracing::debug!(code = %code.redacted(), request_id = %record.id, function = %record.function_name, "call queued");
                    // Handed to the session's tab in the same step, it is still reported as
                    // queued (SPEC §5): the tab has not seen it yet.
                    if !record.builtin && record.status == RequestStatus::Delivered {
                        record.status = RequestStatus::Queued;
                    }
                    if record.builtin {
                        self.run_builtin(code.clone(), &record);
                    }
                    Ok((record, connected))
                }
                Enqueued::Existing(record) if record.evicted => Err(RelayError::ResponseEvicted {
                    request_id: record.id,
                }),
                Enqueued::Existing(record) => {
                    if record.is_orphaned_builtin(now) {
                        self.run_builtin(code.clone(), &record);
                    }
                    Ok((record, connected))
                }
                Enqueued::StaleManifest => {
                    if let Some(session) = session {
                        let revision = session.manifest_revision;
                        known = Some((revision, self.manifest_of(&code, revision).await?));
                    }
                    continue;
                }
                Enqueued::RateLimited(wait) => Err(self.inner.limits.calls_limited(wait)),
                Enqueued::Conflict => Err(RelayError::RequestIdConflict { request_id }),
                Enqueued::Full => Err(RelayError::QueueFull {
                    code: code.display(),
                    limit,
                    retry_after: Duration::from_secs(5),
                }),
                Enqueued::NoSession => Err(not_found(&code)),
                Enqueued::ApprovalRefused => Err(RelayError::Approval {
                    code: toolrelay::errors::ErrorCode::ApprovalRefused,
                    message: "The person denied three requests to use this session, so it takes no new ones. Ask them for a new code (their plugin offers New code).".into(),
                }),
                Enqueued::Disconnected => Err(RelayError::CallerDisconnected),
            };
        }
        Err(RelayError::StoreUnavailable(crate::error::StoreError(
            "the session's manifest kept changing while a call was queued".into(),
        )))
    }

    /// A call held for the person's approval of its caller: the person is asked (or the
    /// caller waits behind whoever is asked about now). With no tab to ask in, the call fails
    /// at once.
    async fn held(
        &self,
        code: &SessionCode,
        record: RequestRecord,
        connected: bool,
        applicant: Option<&super::approvals::Applicant>,
    ) -> Result<(RequestRecord, bool), RelayError> {
        let Some(applicant) = applicant else {
            return Ok((record, connected));
        };
        if !connected {
            let change = crate::store::ApprovalChange {
                release: Some((
                    applicant.id.clone(),
                    crate::store::Release::Fail {
                        code: toolrelay::errors::ErrorCode::TabNotConnected,
                        message: "The page serving this session was not open.".into(),
                    },
                )),
                ..Default::default()
            };
            self.inner
                .store
                .change_approvals(code, &change, self.now())
                .await?;
            return Err(RelayError::TabNotConnected {
                code: code.display(),
            });
        }
        tracing::info!(code = %code.redacted(), request_id = %record.id, "call held for the person's approval");
        self.ask(code, applicant, record.deadline).await?;
        Ok((record, connected))
    }

    /// The call already recorded under `request`'s id, if it is the same call (the tool it
    /// was queued for standing in for an unnamed one); whether a tab is connected. A different
    /// call under that id is a conflict.
    pub(super) async fn earlier_call(
        &self,
        code: &SessionCode,
        request: &NewRequest,
        now: Timestamp,
    ) -> Result<Option<(RequestRecord, bool)>, RelayError> {
        let Some(record) = self.inner.store.request(code, &request.id).await? else {
            return Ok(None);
        };
        let tool_id = request.tool_id.as_deref().or(record.tool_id.as_deref());
        if record.call_hash
            != crate::store::callers_call_hash(
                tool_id,
                &request.function_name,
                &request.args,
                request.caller.as_deref(),
            )
        {
            return Err(RelayError::RequestIdConflict {
                request_id: record.id,
            });
        }
        if record.evicted {
            return Err(RelayError::ResponseEvicted {
                request_id: record.id,
            });
        }
        let (_, session) = self.live_session(code.as_str()).await?;
        let connected = self.connected_transport(&session, now).await.is_some();
        Ok(Some((record, connected)))
    }

    /// Checks a call against the session's manifest and the built-in tools: the group it
    /// belongs to, and whether it is a built-in tool. A read (`read_only`) is refused unless
    /// the function is marked read-only.
    pub(super) async fn check_call(
        &self,
        code: &SessionCode,
        manifest: &Manifest,
        tool_id: Option<&str>,
        request: &NewRequest,
        read_only: bool,
    ) -> Result<(String, bool), RelayError> {
        let (name, args) = (&request.function_name, &request.args);
        let not_read_only = || RelayError::NotReadOnly {
            function: name.clone(),
        };
        match manifest.function(tool_id, name) {
            Some(function) => {
                if read_only && !function.hints.is_read_only() {
                    return Err(not_read_only());
                }
                function.check_arguments_async(args).await?;
                Ok((function.group_id().to_owned(), false))
            }
            None if tool_id.is_none_or(|id| id == BUILTIN_GROUP)
                && self.inner.tools.contains(name) =>
            {
                if read_only
                    && !self
                        .inner
                        .tools
                        .hints(name)
                        .is_some_and(|h| h.is_read_only())
                {
                    return Err(not_read_only());
                }
                if let Some(problems) = self.inner.tools.violations(name, args) {
                    return Err(RelayError::InvalidArguments {
                        function: name.clone(),
                        problems,
                    });
                }
                Ok((BUILTIN_GROUP.to_owned(), true))
            }
            None => Err(unknown_function(
                code,
                manifest,
                &self.inner.tools,
                name,
                tool_id,
            )),
        }
    }

    /// Queues a call and waits up to `wait` (the configured default when `None`) for its
    /// answer.
    pub async fn call(
        &self,
        code: &str,
        call: CallInput,
        wait: Option<Duration>,
    ) -> Result<RequestView, RelayError> {
        self.call_charged(code, call, wait, None).await
    }

    /// [`Relay::call`], spending `charge` (the caller's budget) as the call is queued.
    pub(crate) async fn call_charged(
        &self,
        code: &str,
        call: CallInput,
        wait: Option<Duration>,
        charge: Option<RateCharge>,
    ) -> Result<RequestView, RelayError> {
        let parsed = SessionCode::parse(code)?;
        // Listening for the answer before the call is queued, so it cannot slip past: the
        // wait starts from the record the queueing returned, without reading it again.
        // Whether the session exists, the queueing says.
        let request_id = call.request_id.clone().unwrap_or_else(code::unique_id);
        let events = self
            .inner
            .store
            .listen_for_answer(&parsed, &request_id)
            .await?;
        let (record, connected) = self.queue(code, call, charge, Some(request_id)).await?;
        // With no tab to run it, the call stays queued, and the caller learns so at once
        // rather than after a wait that cannot end well.
        if record.status.is_terminal() || !(connected || record.builtin) {
            return Ok(RequestView::of(record, connected));
        }
        let wait = wait.unwrap_or(self.inner.config.default_call_wait);
        let request_id = record.id.clone();
        // The caller waits for its own call.
        self.wait_for_answer(&parsed, &request_id, wait, events, Some(record), None)
            .await
    }
}

/// Request ids chosen by callers: 1 to 128 of `[A-Za-z0-9._:-]`.
pub(super) fn is_valid_request_id(id: &str) -> bool {
    (1..=128).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'-'))
}

pub(super) fn unknown_function(
    code: &SessionCode,
    manifest: &Manifest,
    tools: &Registry,
    name: &str,
    tool_id: Option<&str>,
) -> RelayError {
    let mut names: Vec<&str> = manifest
        .functions()
        .iter()
        .map(|f| f.name.as_str())
        .collect();
    let tab_has_tools = !names.is_empty();
    names.extend(tools.names());
    let mut available = names.join(", ");
    if !tab_has_tools {
        available.push_str(" (the tab has not registered its tools yet; is it open?)");
    }
    RelayError::UnknownFunction {
        code: code.display(),
        name: name.to_owned(),
        in_tool: tool_id
            .map(|id| format!(" in tool {id}"))
            .unwrap_or_default(),
        available,
    }
}
