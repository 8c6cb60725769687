//! Waiting: a caller waiting for a call's answer, and reading answers and calls.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use toolrelay::wire::ToolResponse;

use super::{Relay, RequestView, not_found};
use crate::code::SessionCode;
use crate::error::RelayError;
use crate::store::{BUILTIN_LEASE, EventStream, RequestRecord, SessionEvent};

/// How long a wait that asked for news waits for more after the last (the answer, or more
/// news) before it answers with what it has.
const NEWS_QUIET: Duration = Duration::from_millis(100);

impl Relay {
    /// Waits up to `wait` for a call's final answer; returns its state either way. A call is
    /// its caller's: to any other `reader` (a caller's key; `None`: the relay) it is not
    /// found.
    pub async fn await_response(
        &self,
        code: &str,
        request_id: &str,
        wait: Duration,
        news: bool,
        reader: Option<&str>,
    ) -> Result<RequestView, RelayError> {
        let code = self.session_code(code).await?;
        // Whether the session exists, the first look at the call says.
        let events = self
            .inner
            .store
            .listen_for_answer(&code, request_id)
            .await?;
        self.wait_for_answer(&code, request_id, wait, events, None, news, reader)
            .await
    }

    /// Waits, on `events` (the call's answer and what ends a wait, listened to before `known`
    /// was read, if it was), up to `wait` for a call's final answer; returns its state either
    /// way, and with `news`, as soon as the call has news (with the news). The call must be
    /// `reader`'s (see [`Relay::request_record`]).
    #[allow(clippy::too_many_arguments)] // the wait, and what it starts from
    pub(super) async fn wait_for_answer(
        &self,
        code: &SessionCode,
        request_id: &str,
        wait: Duration,
        mut events: EventStream,
        mut known: Option<Arc<RequestRecord>>,
        news: bool,
        reader: Option<&str>,
    ) -> Result<RequestView, RelayError> {
        let wait_until = self.now().plus(wait);
        // A waiting caller holds a stopping relay open until its answer comes or the drain
        // ends; then it is told to ask again.
        let _hold = self.inner.drain.hold();
        let mut drained = std::pin::pin!(self.inner.drain.ended());
        // The call's news so far, and when it is told if nothing follows it (news that comes
        // just before the answer — a tab's last log message — goes with the answer).
        let mut told = Vec::new();
        let mut quiet: Option<tokio::time::Instant> = None;
        loop {
            let record = match known.take() {
                Some(record) => record,
                None => self.request_record(code, request_id, reader).await?.into(),
            };
            let now = self.now();
            if record.status.is_terminal() || now >= wait_until {
                let view = self.view(code, record).await?;
                return Ok(RequestView { news: told, ..view });
            }
            if record.is_orphaned_builtin(now) {
                self.run_builtin(code.clone(), &record);
            }
            // A built-in call is looked at again when its lease would run out: if its replica
            // is gone by then, this one takes it over.
            let lease = record
                .lease_until
                .filter(|_| record.builtin)
                .map_or(record.deadline, |lease| {
                    lease.max(now.plus(BUILTIN_LEASE / 10))
                });
            let wake = self
                .inner
                .clock
                .instant(wait_until.min(record.deadline).min(lease));
            // Not held while waiting: the store shares the record of an unfinished call, and
            // finishes one nobody else holds in place rather than copying it.
            drop(record);
            // Any event is this call's (its answer, its news; lost events: look again), or the
            // end. News alone does not read the call again.
            loop {
                let settled = async {
                    match quiet {
                        Some(at) => tokio::time::sleep_until(at).await,
                        None => std::future::pending().await,
                    }
                };
                tokio::select! {
                    event = events.next() => match event {
                        Some(SessionEvent::ResponseReady { id, record }) if id == request_id => {
                            known = record;
                            break;
                        }
                        Some(SessionEvent::SessionEnded) | None => return Err(not_found(code)),
                        Some(SessionEvent::News { news: item, .. }) => {
                            if news {
                                told.push(*item);
                                quiet = Some(tokio::time::Instant::now() + NEWS_QUIET);
                            }
                        }
                        Some(_) => break,
                    },
                    () = settled => {
                        let record = self.request_record(code, request_id, reader).await?;
                        let view = self.view(code, record.into()).await?;
                        return Ok(RequestView { news: told, ..view });
                    }
                    () = tokio::time::sleep_until(wake) => break,
                    () = &mut drained => {
                        return Err(RelayError::Drained {
                            code: code.display(),
                            request_id: request_id.to_owned(),
                        });
                    }
                }
            }
        }
    }

    /// Final answers of the calls `reader` (a caller's key; `None`: every call's) made in the
    /// session, oldest first (or only `request_id`'s). Reading does not consume them.
    pub async fn responses(
        &self,
        code: &str,
        request_id: Option<&str>,
        reader: Option<&str>,
    ) -> Result<Vec<ToolResponse>, RelayError> {
        let (code, _) = self.live_session(code).await?;
        let responses = match request_id {
            Some(id) => match self.inner.store.request(&code, id).await? {
                Some(record) if !record.made_by(reader) => Vec::new(),
                Some(record) if record.evicted => {
                    return Err(RelayError::ResponseEvicted {
                        request_id: record.id,
                    });
                }
                record => record
                    .and_then(|record| record.response)
                    .into_iter()
                    .collect(),
            },
            None => self
                .inner
                .store
                .responses(&code, reader)
                .await?
                .unwrap_or_default(),
        };
        Ok(responses)
    }

    /// Where one call stands, for `reader` (see [`Relay::await_response`]).
    pub async fn request_status(
        &self,
        code: &str,
        request_id: &str,
        reader: Option<&str>,
    ) -> Result<RequestView, RelayError> {
        let code = self.session_code(code).await?;
        let record = self.request_record(&code, request_id, reader).await?;
        // A caller polling a built-in call whose replica died is what takes it over here.
        if record.is_orphaned_builtin(self.now()) {
            self.run_builtin(code.clone(), &record);
        }
        self.view(&code, record.into()).await
    }

    /// The call `request_id`, if `reader` (a caller's key; `None`: the relay) made it: a call
    /// and its answer are its caller's alone, and to another caller it is a call the session
    /// does not have (ids the relay makes are 128 random bits; one a caller chose is no key to
    /// another caller's call).
    pub(super) async fn request_record(
        &self,
        code: &SessionCode,
        request_id: &str,
        reader: Option<&str>,
    ) -> Result<RequestRecord, RelayError> {
        match self.inner.store.request(code, request_id).await? {
            Some(record) if record.made_by(reader) => Ok(record),
            Some(_) => {
                tracing::warn!(code = %code.redacted(), request_id, "a caller asked for another caller's call");
                Err(RelayError::RequestNotFound {
                    code: code.display(),
                    request_id: request_id.to_owned(),
                })
            }
            None if self.inner.store.session(code).await?.is_none() => Err(not_found(code)),
            None => Err(RelayError::RequestNotFound {
                code: code.display(),
                request_id: request_id.to_owned(),
            }),
        }
    }
}
