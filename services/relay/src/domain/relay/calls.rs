//! Calls: queueing a caller's call (its checks, its idempotency) and calling and waiting.

use std::sync::Arc;
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
    SessionRecord,
};

/// The error of a call whose session's manifest kept changing while it was queued.
fn manifest_kept_changing() -> RelayError {
    RelayError::StoreUnavailable(crate::error::StoreError(
        "the session's manifest kept changing while a call was queued".into(),
    ))
}

/// A call queued (or found queued before): its record (shared with the store), the status
/// its caller is told, whether a tab can run it now, and whether its function says its
/// results may hold untrusted content.
pub(super) struct Queued {
    pub(super) record: Arc<RequestRecord>,
    pub(super) status: RequestStatus,
    pub(super) connected: bool,
    pub(super) untrusted: bool,
}

impl Queued {
    fn view(self) -> RequestView {
        RequestView {
            status: self.status,
            untrusted: self.untrusted,
            ..RequestView::of(self.record, self.connected)
        }
    }
}

/// What checking a call against the session's tools found: the tool group that serves it,
/// whether it is built into the relay, and whether its results may hold untrusted content.
pub(super) struct Checked {
    group: String,
    builtin: bool,
    untrusted: bool,
}

/// What a call on its way to the queue (a [`NewRequest`], apart: the store takes it) needs
/// for its checks.
struct Queueing {
    /// The tool the caller named, if any.
    asked_tool: Option<String>,
    /// The caller gave the request id (a repeat of it is the same call).
    given_id: bool,
    /// The caller waits for its answer here.
    waited_for: bool,
    read_only: bool,
    /// The checked function says its results may hold untrusted content.
    untrusted: bool,
    approval: ApprovalCheck,
    asker: Option<super::approvals::Asker>,
    now: Timestamp,
    /// The session's queue's bound.
    limit: usize,
    /// Until when a call keeps the session alive.
    until: Timestamp,
}

impl Queueing {
    /// Its caller as the person is asked about it, if the person must allow it.
    fn applicant(&self) -> Option<super::approvals::Applicant> {
        match (&self.approval, &self.asker) {
            (ApprovalCheck::Ask(id), Some(asker)) => Some(asker.applicant(id.clone())),
            _ => None,
        }
    }
}

impl Relay {
    /// Queues a call after checking it against the manifest; returns at once. Repeating a
    /// request id with the same call returns that call's state and runs nothing.
    pub async fn submit(&self, code: &str, call: CallInput) -> Result<RequestView, RelayError> {
        let code = SessionCode::parse(code)?;
        self.submit_charged(&code, call, None).await
    }

    /// [`Relay::submit`], spending `charge` (the caller's budget) as the call is queued.
    pub(crate) async fn submit_charged(
        &self,
        code: &SessionCode,
        call: CallInput,
        charge: Option<RateCharge>,
    ) -> Result<RequestView, RelayError> {
        Ok(self.queue(code, call, charge, None).await?.view())
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
        news: bool,
    ) -> Result<RoutedAnswer, RelayError> {
        self.accepting()?;
        let code = SessionCode::parse(code)?;
        Ok(self.inner.store.accept_routed(&code, call, news).await?)
    }

    /// [`Relay::submit`]'s work: the call's record, and whether a tab is there to run it.
    /// `charge` is spent whatever happens: with the queueing, or on its own when the call is
    /// refused before it gets there (an unknown code, bad arguments). A call that names no
    /// request id gets `fresh_id` (a random one when `None`).
    pub(super) async fn queue(
        &self,
        code: &SessionCode,
        call: CallInput,
        charge: Option<RateCharge>,
        fresh_id: Option<String>,
    ) -> Result<Queued, RelayError> {
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
        code: &SessionCode,
        call: CallInput,
        charge: &mut Option<RateCharge>,
        fresh_id: Option<String>,
    ) -> Result<Queued, RelayError> {
        self.accepting()?;
        let (mut call, mut request) = self.queueing(call, fresh_id)?;
        let mut known = self.inner.manifests.latest(code);
        // A manifest changed between the check and the queueing is rare; twice in a row rarer.
        for _ in 0..3 {
            let cached = known.is_some();
            let (revision, manifest) = match known.take() {
                Some(known) => known,
                None => {
                    let (_, session) = self.live_session(code.as_str()).await?;
                    let revision = session.manifest_revision;
                    (revision, self.manifest_of(code, revision).await?)
                }
            };
            let (asked, read_only) = (call.asked_tool.as_deref(), call.read_only);
            let checked = match self
                .check_call(code, &manifest, asked, &request, read_only)
                .await
            {
                Ok(checked) => checked,
                // Refused by the manifest this replica compiled earlier: the tab may have
                // registered new tools since (through another replica), so the refusal
                // stands only against the session's manifest as it is now.
                Err(_) if cached && self.manifest_moved(code, revision).await? => continue,
                Err(error) => return self.refused(code, &call, &request, error).await,
            };
            // The provider dispatches on (tool, function): name the tool even when the caller
            // did not, so a call with and without `toolId` is the same call.
            request.tool_id = Some(checked.group);
            request.builtin = checked.builtin;
            call.untrusted = checked.untrusted;
            if checked.builtin {
                self.check_builtin_ready(code, &request, call.given_id)
                    .await?;
            }
            let (enqueued, session, connected) = self
                .enqueue(code, &call, request, revision, charge.take())
                .await?;
            request = match enqueued {
                // The manifest moved on since this replica compiled it: the store gave the
                // call back, to be checked against the manifest as it is now.
                Enqueued::StaleManifest(request) => *request,
                enqueued => return self.enqueued(code, &call, enqueued, connected).await,
            };
            if let Some(session) = session {
                let revision = session.manifest_revision;
                known = Some((revision, self.manifest_of(code, revision).await?));
            }
        }
        Err(manifest_kept_changing())
    }

    /// Queues the call checked against manifest `revision`, spending `charge`: what the store
    /// said, the session as it was, and whether a tab is there.
    async fn enqueue(
        &self,
        code: &SessionCode,
        call: &Queueing,
        request: NewRequest,
        revision: u64,
        charge: Option<RateCharge>,
    ) -> Result<(Enqueued, Option<SessionRecord>, bool), RelayError> {
        let checks = EnqueueChecks {
            manifest_revision: Some(revision),
            charge,
            approval: call.approval.clone(),
            route: call.waited_for,
        };
        let (enqueued, session) = self
            .inner
            .store
            .enqueue_checked(code, request, call.limit, call.until, checks)
            .await?;
        let connected = match &session {
            Some(session) => self.connected_transport(session, call.now).await.is_some(),
            None => false,
        };
        Ok((enqueued, session, connected))
    }

    /// The call to queue, from what the caller gave: its arguments within the nesting limit,
    /// its request id (given, `fresh_id`, or a random one), its deadline; and what its checks
    /// need.
    fn queueing(
        &self,
        call: CallInput,
        fresh_id: Option<String>,
    ) -> Result<(Queueing, NewRequest), RelayError> {
        let config = &self.inner.config;
        let limit = config.max_json_depth;
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
        let request = NewRequest {
            id: request_id,
            tool_id: call.tool_id,
            function_name: call.function_name,
            args,
            created_at: now,
            deadline: now.plus(config.request_timeout),
            builtin: false,
            correlation_id: call.correlation_id,
            caller: call.caller,
        };
        let queueing = Queueing {
            asked_tool: request.tool_id.clone(),
            given_id,
            waited_for,
            read_only: call.read_only,
            untrusted: false,
            approval: call.approval,
            asker: call.asker,
            now,
            limit: config.max_pending_per_session,
            until: now.plus(config.session_ttl),
        };
        Ok((queueing, request))
    }

    /// A call its session's tools refuse: a caller the person has not allowed is asked about
    /// first (the refusal names the tab's tools, or their arguments), as its call would be;
    /// and a call asked again while its tab is away (its tools not registered again yet) or
    /// after the tools changed is still the call it was.
    async fn refused(
        &self,
        code: &SessionCode,
        call: &Queueing,
        request: &NewRequest,
        error: RelayError,
    ) -> Result<Queued, RelayError> {
        if let Some(applicant) = call.applicant() {
            self.vetted(code, &applicant).await?;
        }
        if call.given_id
            && let Some((record, connected)) = self.earlier_call(code, request, call.now).await?
        {
            // Its function is no longer there to say what its results hold.
            let untrusted = false;
            return Ok(Queued {
                status: record.status,
                record: Arc::new(record),
                connected,
                untrusted,
            });
        }
        Err(error)
    }

    /// What the queueing came to: the call (queued, held for approval, or asked before), or
    /// an error.
    async fn enqueued(
        &self,
        code: &SessionCode,
        call: &Queueing,
        enqueued: Enqueued,
        connected: bool,
    ) -> Result<Queued, RelayError> {
        let (record, status) = match enqueued {
            Enqueued::Queued(record) if record.status == RequestStatus::AwaitingApproval => {
                self.held(code, &record, connected, call.applicant())
                    .await?;
                let status = record.status;
                (record, status)
            }
            Enqueued::Queued(record) => {
                tracing::debug!(code = %code.redacted(), request_id = %record.id, function = %record.function_name, "call queued");
                // Handed to the session's tab in the same step, it is still reported as
                // queued (SPEC §5): the tab has not seen it yet.
                let status = match record.status {
                    RequestStatus::Delivered if !record.builtin => RequestStatus::Queued,
                    status => status,
                };
                if record.builtin {
                    self.run_builtin(code.clone(), &record);
                }
                (record, status)
            }
            Enqueued::Existing(record) if record.evicted => {
                return Err(RelayError::ResponseEvicted {
                    request_id: record.id.clone(),
                });
            }
            Enqueued::Existing(record) => {
                if record.is_orphaned_builtin(call.now) {
                    self.run_builtin(code.clone(), &record);
                }
                let status = record.status;
                (record, status)
            }
            Enqueued::StaleManifest(_) => return Err(manifest_kept_changing()),
            Enqueued::RateLimited(wait) => return Err(self.inner.limits.calls_limited(wait)),
            Enqueued::Conflict(request_id) => {
                return Err(RelayError::RequestIdConflict { request_id });
            }
            Enqueued::Full => {
                return Err(RelayError::QueueFull {
                    code: code.display(),
                    limit: call.limit,
                    retry_after: Duration::from_secs(5),
                });
            }
            Enqueued::NoSession => return Err(not_found(code)),
            Enqueued::ApprovalRefused => return Err(RelayError::Approval {
                code: toolrelay::errors::ErrorCode::ApprovalRefused,
                message: "The person denied three requests to use this session, so it takes no new ones. Ask them for a new code (their plugin offers New code).".into(),
            }),
            Enqueued::Disconnected => return Err(RelayError::CallerDisconnected),
        };
        let untrusted = call.untrusted;
        Ok(Queued {
            record,
            status,
            connected,
            untrusted,
        })
    }

    /// A call held for the person's approval of its caller: the person is asked (or the
    /// caller waits behind whoever is asked about now). With no tab to ask in, the call fails
    /// at once.
    async fn held(
        &self,
        code: &SessionCode,
        record: &RequestRecord,
        connected: bool,
        applicant: Option<super::approvals::Applicant>,
    ) -> Result<(), RelayError> {
        let Some(applicant) = applicant else {
            return Ok(());
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
        self.ask(code, &applicant, record.deadline).await
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
    ) -> Result<Checked, RelayError> {
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
                Ok(Checked {
                    group: function.group_id().to_owned(),
                    builtin: false,
                    untrusted: function.hints.is_untrusted(),
                })
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
                let untrusted = self
                    .inner
                    .tools
                    .hints(name)
                    .is_some_and(|h| h.is_untrusted());
                Ok(Checked {
                    group: BUILTIN_GROUP.to_owned(),
                    builtin: true,
                    untrusted,
                })
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
        let code = SessionCode::parse(code)?;
        self.call_charged(&code, call, wait, false, None).await
    }

    /// [`Relay::call`], spending `charge` (the caller's budget) as the call is queued; with
    /// `news`, answering as soon as the call has news.
    pub(crate) async fn call_charged(
        &self,
        code: &SessionCode,
        call: CallInput,
        wait: Option<Duration>,
        news: bool,
        charge: Option<RateCharge>,
    ) -> Result<RequestView, RelayError> {
        // Listening for the answer before the call is queued, so it cannot slip past: the
        // wait starts from the record the queueing returned, without reading it again.
        // Whether the session exists, the queueing says.
        let request_id = call.request_id.clone().unwrap_or_else(code::unique_id);
        let events = self
            .inner
            .store
            .listen_for_answer(code, &request_id)
            .await?;
        let queued = self.queue(code, call, charge, Some(request_id)).await?;
        // With no tab to run it, the call stays queued, and the caller learns so at once
        // rather than after a wait that cannot end well; with no wait, it learns where the
        // call stands as it was queued.
        let wait = wait.unwrap_or(self.inner.config.default_call_wait);
        let record = &queued.record;
        if record.status.is_terminal() || !(queued.connected || record.builtin) || wait.is_zero() {
            return Ok(queued.view());
        }
        let (request_id, untrusted) = (record.id.clone(), queued.untrusted);
        // The caller waits for its own call.
        let view = self
            .wait_for_answer(
                code,
                &request_id,
                wait,
                events,
                Some(queued.record),
                news,
                None,
            )
            .await?;
        Ok(RequestView { untrusted, ..view })
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
