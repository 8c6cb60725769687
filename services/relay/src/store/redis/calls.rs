//! A call's two round trips on the Redis store: queueing it (the flat script first, the
//! library's when it says `slow`), handing a routed call on, and finishing it (told here when
//! its waiter is here); and a call routed here by another replica (`Forward`).

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use toolrelay::wire::{RequestStatus, ToolResponse};

use super::RedisStore;
use super::records::{self, call_in, is_slow, missing, outcome, unexpected, unreadable};
use super::scripts::{Enqueue, Finish, FlatEnqueue};
use crate::clock::Timestamp;
use crate::code::SessionCode;
use crate::error::StoreError;
use crate::metrics::Route;
use crate::store::{
    Answerer, ApprovalCheck, EnqueueChecks, Enqueued, Finished, NewRequest, RequestRecord, Routed,
    RoutedAnswer, SessionEvent, SessionRecord, rules,
};

impl RedisStore {
    /// [`SessionStore::enqueue_checked`](crate::store::SessionStore::enqueue_checked).
    pub(super) async fn enqueue_call(
        &self,
        code: &SessionCode,
        request: NewRequest,
        max_pending: usize,
        until: Timestamp,
        checks: EnqueueChecks,
    ) -> Result<(Enqueued, Option<SessionRecord>), StoreError> {
        let (rate_key, interval, tolerance) = match &checks.charge {
            Some(charge) => (
                vec![self.rate_key(&charge.key)],
                charge.budget.interval_micros().to_string(),
                charge.budget.tolerance_micros().to_string(),
            ),
            None => (Vec::new(), String::new(), String::new()),
        };
        let revision = checks
            .manifest_revision
            .map_or_else(String::new, |revision| revision.to_string());
        let (approval_mode, approver) = match &checks.approval {
            ApprovalCheck::Exempt => ("", ""),
            ApprovalCheck::Ask(caller) => ("ask", caller.as_str()),
            ApprovalCheck::Handle(caller) => ("handle", caller.as_str()),
        };
        let max_pending = max_pending.to_string();
        let until_ms = until.0.to_string();
        // The common path first, flat; anything else the library's script decides.
        let queued = RequestRecord::queued(request, 0);
        let [state, rest] = records::pieces(&queued);
        let (me, avoid) = match &self.router {
            Some(router) if checks.route => (router.me.as_str(), router.avoided()),
            _ => ("", String::new()),
        };
        let flat: redis::Value = self
            .run(
                &self.scripts.flat_enqueue,
                code,
                &rate_key,
                FlatEnqueue {
                    id: &queued.id,
                    state: &state,
                    rest: &rest,
                    builtin: if queued.builtin { "1" } else { "0" },
                    lease: &records::handed_lease(&queued),
                    max_pending: &max_pending,
                    until_ms: &until_ms,
                    revision: &revision,
                    rate_interval: &interval,
                    rate_tolerance: &tolerance,
                    approval: approval_mode,
                    approver,
                    me,
                    avoid: &avoid,
                    route: if me.is_empty() { "" } else { "1" },
                },
            )
            .await?;
        let queued = match records::flat_queued(queued, code, &flat)? {
            Ok((record, session, routed)) => {
                self.hand_routed(code, &record, &routed);
                return Ok((Enqueued::Queued(Arc::new(record)), Some(session)));
            }
            Err(queued) => queued,
        };
        let answer = if is_slow(&flat) {
            let packed = records::stored(&queued);
            let arguments = Enqueue {
                id: &queued.id,
                packed: &packed,
                max_pending: &max_pending,
                until_ms: &until_ms,
                revision: &revision,
                rate_interval: &interval,
                rate_tolerance: &tolerance,
                approval: approval_mode,
                approver,
            };
            self.run(&self.scripts.enqueue, code, &rate_key, arguments)
                .await?
        } else {
            flat
        };
        let (outcome, items) = outcome(answer)?;
        let mut items = items.into_iter();
        let record = call_in(items.next())?;
        let session = match items.next() {
            None | Some(redis::Value::Nil | redis::Value::Boolean(false)) => None,
            Some(values) => {
                let values: Vec<String> = redis::from_redis_value(values).map_err(unreadable)?;
                Some(records::session(&values)?)
            }
        };
        let call = || record.map(Arc::new).ok_or_else(|| missing("call"));
        let enqueued = match outcome.as_str() {
            "queued" => Enqueued::Queued(call()?),
            "existing" => Enqueued::Existing(call()?),
            "conflict" => Enqueued::Conflict(queued.id),
            "full" => Enqueued::Full,
            "stale" => Enqueued::StaleManifest(Box::new(queued.into_request())),
            "nosession" => Enqueued::NoSession,
            "refused" => Enqueued::ApprovalRefused,
            "disconnected" => Enqueued::Disconnected,
            "limited" => {
                let over: i64 = items
                    .next()
                    .map(redis::from_redis_value)
                    .transpose()
                    .map_err(unreadable)?
                    .ok_or_else(|| missing("time to wait"))?;
                Enqueued::RateLimited(Duration::from_micros(over.unsigned_abs()))
            }
            other => return Err(unexpected(other)),
        };
        Ok((enqueued, session))
    }

    /// [`SessionStore::finish`](crate::store::SessionStore::finish) (the scripts take `now`
    /// from the clock, as every script does).
    pub(super) async fn finish_call(
        &self,
        code: &SessionCode,
        id: &str,
        status: RequestStatus,
        response: ToolResponse,
        answerer: Answerer<'_>,
        until: Timestamp,
    ) -> Result<Finished, StoreError> {
        let cost = rules::answer_cost(&response);
        let response = records::stored_answer(&response)?;
        let (answerer, connection) = match answerer {
            Answerer::Relay => ("relay", ""),
            Answerer::Connection(connection) => ("connection", connection),
            Answerer::Provider => ("provider", ""),
        };
        let (cost, until_ms) = (cost.to_string(), until.0.to_string());
        let share = self.limits.session_answer_budget.to_string();
        // A routed call whose waiter is on this replica is told here, not announced.
        let held = self
            .router
            .as_ref()
            .map(|router| (router, format!("{}{id}", self.base(code))))
            .filter(|(router, key)| router.holds(key));
        // Both scripts take the same arguments.
        let arguments = || Finish {
            id,
            status: status.as_str(),
            response: &response,
            cost: &cost,
            until_ms: &until_ms,
            answerer,
            connection,
            share: &share,
            quiet: if held.is_some() { "1" } else { "" },
        };
        // The common path first, flat; anything else the library's script decides.
        let flat: redis::Value = self
            .run(&self.scripts.flat_finish, code, &[], arguments())
            .await?;
        let answer = if is_slow(&flat) {
            self.run(&self.scripts.finish, code, &[], arguments())
                .await?
        } else {
            flat
        };
        let (outcome, items) = outcome(answer)?;
        let record = || -> Result<RequestRecord, StoreError> {
            call_in(items.first().cloned())?.ok_or_else(|| missing("call"))
        };
        Ok(match outcome.as_str() {
            "finished" => {
                self.answered(code);
                let record = record()?;
                let announced = !matches!(items.get(1), Some(redis::Value::Int(0)));
                if let Some((router, key)) = held.filter(|_| !announced) {
                    router.release(&key);
                    self.told_here(code, &record);
                }
                Finished::Finished(Arc::new(record))
            }
            "already" => {
                let record = record()?;
                // A routed call answered again (the tab sends an answer until it is
                // acknowledged): the first finish may have stored it and failed after (a
                // `WAIT` not met), its waiter here never told.
                if let Some((router, key)) = held {
                    router.release(&key);
                    self.told_here(code, &record);
                }
                Finished::AlreadyFinished(Arc::new(record))
            }
            "norequest" => Finished::NoRequest,
            "notdelivered" => Finished::NotDelivered,
            "nosession" => Finished::NoSession,
            other => return Err(unexpected(other)),
        })
    }

    /// [`SessionStore::accept_routed`](crate::store::SessionStore::accept_routed).
    pub(super) async fn accept_call(
        &self,
        code: &SessionCode,
        call: String,
        news: bool,
    ) -> Result<RoutedAnswer, StoreError> {
        let Some(router) = &self.router else {
            return Err(StoreError(
                "this replica takes no routed calls: set REPLICA_URL on it".into(),
            ));
        };
        let record = records::unpack(&call)?;
        let base = self.base(code);
        let held = router.hold(format!("{base}{}", record.id), record.deadline);
        let waiter = self.events.wait_for(&base, &record.id).await;
        self.handed_here(&base, record);
        router.counted(Route::Accepted);
        Ok(Box::pin(futures::stream::unfold(
            Some((waiter, held)),
            move |state| async move {
                let (mut waiter, _held) = state?;
                loop {
                    match waiter.next().await? {
                        SessionEvent::ResponseReady {
                            record: Some(record),
                            ..
                        } => return Some((Routed::Answer(records::pack(&record)), None)),
                        // Announced on Redis (too large to tell whole), or gone: the caller's
                        // replica hears of it there.
                        SessionEvent::ResponseReady { record: None, .. }
                        | SessionEvent::SessionEnded => {
                            return Some((Routed::Answer(String::new()), None));
                        }
                        // A replica older than news would take it for the answer.
                        SessionEvent::News { news: told, .. } if news => {
                            return Some((Routed::News(told), Some((waiter, _held))));
                        }
                        _ => {}
                    }
                }
            },
        )))
    }
}
