//! Polling: a provider without a connection takes its session's waiting calls by asking, and
//! learns which of the calls it runs were cancelled by saying which it runs.

use toolrelay::wire::{CallerCard, RequestStatus, ToolRequest};

use super::Relay;
use crate::error::RelayError;
use crate::store::{Claim, ProviderInfo, Transport};

/// The connection id shared by every poll of a session.
const POLLING_CONNECTION: &str = "polling";
/// Most running calls a poll asks about (more are not looked at).
pub const MAX_RUNNING: usize = 64;

/// What a poll hands out: calls to run, and which of the calls the poller said it runs were
/// cancelled by their callers.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Polled {
    /// Calls to run.
    pub requests: Vec<ToolRequest>,
    /// Calls to stop running.
    pub cancelled: Vec<String>,
    /// In a session whose tab approves callers: the caller the person is asked about now.
    pub approval: Option<CallerCard>,
    /// In a session whose tab approves callers: the callers allowed, and whether new ones
    /// are refused.
    pub callers: Option<(Vec<CallerCard>, bool)>,
}

impl Relay {
    /// The polling fallback: hands out the session's waiting calls (at most `max`, all when
    /// `None`) under a lease; a call not answered within the lease is handed out again.
    /// Needs the provider token; polling makes the poller the session's provider. None while
    /// the relay hands its tabs over ([`crate::drain::Drain::hand_over`]). Of the calls in
    /// `running` (at most [`MAX_RUNNING`]), those handed to the poller and since cancelled are
    /// named in [`Polled::cancelled`].
    pub async fn poll(
        &self,
        code: &str,
        token: Option<&str>,
        max: Option<usize>,
        running: &[String],
    ) -> Result<Polled, RelayError> {
        let (code, session) = self.authorized(code, token).await?;
        let now = self.now();
        let is_current = session
            .provider
            .as_ref()
            .is_some_and(|provider| provider.connection_id == POLLING_CONNECTION);
        if !is_current {
            // A poller taking over is a new attach: refused while the relay drains.
            self.accepting()?;
            let provider = ProviderInfo {
                connection_id: POLLING_CONNECTION.to_owned(),
                transport: Transport::Polling,
                connected_at: now,
                last_seen: now,
            };
            self.store().set_provider(&code, provider).await?;
        }
        self.touch(&code, Some(POLLING_CONNECTION)).await?;
        let mut cancelled = Vec::new();
        for id in running.iter().take(MAX_RUNNING) {
            if let Some(record) = self.store().request(&code, id).await?
                && record.status == RequestStatus::Cancelled
                && record.delivered_to.as_deref() == Some(POLLING_CONNECTION)
            {
                cancelled.push(record.id);
            }
        }
        // A relay handing its tabs over hands out no new call: the poller's next poll, on
        // another relay, takes them.
        if self.drain().is_handing_over() {
            return Ok(Polled {
                cancelled,
                ..Polled::default()
            });
        }
        let claim = Claim {
            connection_id: POLLING_CONNECTION.to_owned(),
            now,
            lease_until: now.plus(self.config().poll_lease),
            limit: max.unwrap_or(usize::MAX),
            redeliver: false,
        };
        let claimed = self.store().claim(&code, &claim).await?;
        // The question open about a new caller is in every poll until it closes.
        let view = self.approval_view(&code).await?;
        let approving = view.approves;
        Ok(Polled {
            requests: claimed.iter().map(|record| record.tool_request()).collect(),
            cancelled,
            approval: view.asking.map(|(_, card)| card),
            callers: approving.then_some((view.allowed, view.refused)),
        })
    }
}
