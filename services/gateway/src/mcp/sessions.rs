//! MCP client sessions: kept within their caps ([`Keeper`]) and in the store, so that any
//! gateway can serve a session another made ([`SharedSessions`]).

use std::sync::Arc;
use std::time::Duration;

use rmcp::transport::streamable_http_server::session::SessionManager;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::session::store::{
    SessionState, SessionStore, SessionStoreError,
};
use serde_json::{Value, json};
use toolrelay_relay::front::Caller;
use toolrelay_relay::front::Refusal;
use toolrelay_relay::front::limits::client_key;
use toolrelay_relay::front::random_id;
use toolrelay_relay::front::store::{McpSessionCaps, McpSessionStore, McpSessionsFull};
use toolrelay_relay::front::{Clock, Timestamp};

use crate::api::State;

/// Sessions a gateway keeps running at most (both endpoints together). A running session
/// costs ~110 KiB in rmcp (its worker, its service loop and seven channels, each of which
/// allocates a block of 32 messages at once, whatever its capacity; measured on 2026-11-29 by
/// the flood test: 1,000 running held ~120 MiB, 250 held ~35 MiB). Past this many, the one
/// used longest ago is stopped here, and its next request takes it over again from the store,
/// as another gateway would. So 10,000 live sessions cost the store a few hundred bytes each
/// and the gateway ~55 MiB for those it runs (the flood's peak RSS, allocator cache included:
/// 143–163 MiB, where 1,000 running peaked at 224–261 MiB).
const RUNNING_SESSIONS: usize = 500;

tokio::task_local! {
    /// The place [`Keeper::open`] took for the session an `initialize` is creating, for
    /// [`SharedSessions::store`] (rmcp stores the session in the request's task).
    pub(super) static OPENED: Opened;
}

/// A place taken in the session caps.
#[derive(Debug, Clone)]
pub(super) struct Opened {
    pub(super) slot: String,
    /// The client's key (`limits::client_key`).
    address: String,
}

/// Keeps MCP client sessions bounded: takes a place in the caps for each `initialize`,
/// refusing it when the client or everyone has no more; slides a session's expiry on each
/// request; and ends in this gateway a session the store has let go (expired or deleted
/// elsewhere), so that a session lives no longer here than in the store.
#[derive(Clone)]
pub(super) struct Keeper {
    pub(super) state: State,
    pub(super) sessions: Arc<LocalSessionManager>,
    pub(super) namespace: &'static str,
    pub(super) clock: Clock,
    pub(super) running: Arc<std::sync::Mutex<Running>>,
}

/// The sessions running in this gateway, by last use (some may have ended since).
#[derive(Default)]
pub(super) struct Running {
    uses: u64,
    by_use: std::collections::BTreeMap<u64, (Arc<LocalSessionManager>, &'static str, String)>,
    last_use: std::collections::HashMap<(&'static str, String), u64>,
}

impl Keeper {
    fn expiry(&self) -> Timestamp {
        self.clock.now().plus(self.state.config.mcp_sessions.idle)
    }

    /// A place for a new session of `caller`, or the refusal to answer its `initialize`
    /// (`request_id`) with.
    pub(super) async fn open(
        &self,
        caller: &Caller,
        request_id: &Value,
    ) -> Result<Opened, poem::Response> {
        let limits = self.state.config.mcp_sessions;
        let address = client_key(caller.address, limits.ipv6_prefix).to_string();
        let slot = format!("{}opening:{}", self.namespace, random_id());
        let caps = McpSessionCaps {
            per_address: limits.per_address.get(),
            total: limits.total.get(),
        };
        let wait = limits.idle.as_secs().max(1);
        match self
            .state
            .store
            .open_mcp_session(&slot, &address, caps, self.expiry())
            .await
        {
            Ok(Ok(())) => Ok(Opened { slot, address }),
            Ok(Err(McpSessionsFull::PerAddress)) => {
                self.state.metrics.refused(Refusal::McpSessionsPerAddress);
                Err(refusal(
                    poem::http::StatusCode::TOO_MANY_REQUESTS,
                    request_id,
                    wait,
                    &format!(
                        "Too many MCP sessions from your address (MCP_SESSIONS_PER_IP = {}): end sessions you no longer use (DELETE /mcp with their Mcp-Session-Id) or wait for idle ones to end.",
                        caps.per_address
                    ),
                ))
            }
            Ok(Err(McpSessionsFull::Total)) => {
                self.state.metrics.refused(Refusal::McpSessionsTotal);
                Err(refusal(
                    poem::http::StatusCode::SERVICE_UNAVAILABLE,
                    request_id,
                    wait,
                    &format!(
                        "The relay holds as many MCP sessions as it may (MCP_MAX_SESSIONS = {}): try again later.",
                        caps.total
                    ),
                ))
            }
            Err(error) => {
                tracing::warn!(%error, "the store could not open an MCP session");
                Err(refusal(
                    poem::http::StatusCode::SERVICE_UNAVAILABLE,
                    request_id,
                    1,
                    "The relay cannot open an MCP session right now: try again in a moment.",
                ))
            }
        }
    }

    /// A request of session `id` came: it lives on from now, unless the store let it go.
    pub(super) async fn touch(&self, id: &str) {
        let kept = self
            .state
            .store
            .touch_mcp_session(&format!("{}{id}", self.namespace), self.expiry())
            .await;
        if let Ok(false) = kept {
            // rmcp then answers 404, and the client starts a new session.
            let _ = self.sessions.close_session(&id.into()).await;
        } else {
            self.used(id);
        }
    }

    /// Session `id` runs here now (it began, or a request for it came): the one used longest
    /// ago stops if too many run.
    pub(super) fn used(&self, id: &str) {
        let stopping = {
            // A std mutex: held for a few map operations, never across an await.
            let mut running = self
                .running
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            running.uses += 1;
            let now = running.uses;
            if let Some(before) = running
                .last_use
                .insert((self.namespace, id.to_owned()), now)
            {
                running.by_use.remove(&before);
            }
            running.by_use.insert(
                now,
                (Arc::clone(&self.sessions), self.namespace, id.to_owned()),
            );
            if running.by_use.len() > RUNNING_SESSIONS {
                running
                    .by_use
                    .pop_first()
                    .map(|(_, (sessions, namespace, id))| {
                        running.last_use.remove(&(namespace, id.clone()));
                        (sessions, id)
                    })
            } else {
                None
            }
        };
        if let Some((sessions, id)) = stopping {
            // Only here: the store keeps it, so its next request takes it over again.
            tokio::spawn(async move {
                let _ = sessions.close_session(&id.as_str().into()).await;
            });
        }
    }
}

/// A JSON-RPC error refusing a new session, with `Retry-After`.
fn refusal(
    status: poem::http::StatusCode,
    request_id: &Value,
    retry_after: u64,
    message: &str,
) -> poem::Response {
    let body =
        json!({"jsonrpc": "2.0", "id": request_id, "error": {"code": -32000, "message": message}});
    poem::Response::builder()
        .status(status)
        .header(poem::http::header::RETRY_AFTER, retry_after)
        .content_type("application/json")
        .body(body.to_string())
}

/// MCP client sessions kept in the gateway's store (Redis when gateways share one), so any
/// gateway can serve a session another made: rmcp keeps the client's `initialize`
/// parameters there and, on a request for a session it does not hold, replays the handshake.
pub(super) struct SharedSessions {
    pub(super) store: Arc<dyn McpSessionStore>,
    pub(super) clock: Clock,
    /// Keeps `/mcp` and `/mcp/s/{handle}` sessions apart.
    pub(super) namespace: &'static str,
    /// How long an unused session is kept.
    pub(super) idle: Duration,
}

#[async_trait::async_trait]
impl SessionStore for SharedSessions {
    async fn load(&self, id: &str) -> Result<Option<SessionState>, SessionStoreError> {
        let Some(text) = self
            .store
            .mcp_session(&format!("{}{id}", self.namespace))
            .await?
        else {
            return Ok(None);
        };
        Ok(Some(serde_json::from_str(&text)?))
    }

    async fn store(&self, id: &str, state: &SessionState) -> Result<(), SessionStoreError> {
        let id = format!("{}{id}", self.namespace);
        // Always in an `initialize` the keeper let through; a session stored otherwise is
        // kept, counted under no address.
        let opened = OPENED.try_with(Opened::clone).unwrap_or_else(|_| Opened {
            slot: id.clone(),
            address: "unknown".to_owned(),
        });
        self.store
            .put_mcp_session(
                &id,
                &opened.slot,
                &opened.address,
                serde_json::to_string(state)?,
                self.clock.now().plus(self.idle),
            )
            .await?;
        Ok(())
    }

    async fn delete(&self, id: &str) -> Result<(), SessionStoreError> {
        self.store
            .delete_mcp_session(&format!("{}{id}", self.namespace))
            .await?;
        Ok(())
    }
}
