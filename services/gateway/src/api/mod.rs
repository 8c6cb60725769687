//! The HTTP API: one `#[OpenApi]` struct per audience, all over the same [`Gateway`] state.
//!
//! * [`llm::LlmApi`] — what an LLM calls (and all that `/openapi/actions.json` contains);
//! * [`tab::TabApi`] — the browser tab's side: sessions, SSE, polling, answers, manifest;
//! * [`legacy::LegacyApi`] — the first design's paths and JSON shapes;
//! * [`tools::ToolsApi`] — the built-in tools (`/api/tools`), in the original tool API's shapes;
//! * [`discovery::DiscoveryApi`] — `.well-known`, health and readiness.

pub mod discovery;
pub mod legacy;
pub mod llm;
pub mod tab;
pub mod tools;

use std::net::IpAddr;
use std::sync::Arc;

use poem::http::StatusCode;
use poem::{FromRequest, Request, RequestBody};
use poem_openapi::Tags;
use toolrelay_relay::{ErrorInfo, Outcome, RelayApi};

use crate::config::GatewayConfig;
use crate::error::ApiError;
use crate::limits::Limiters;

/// The gateway's shared state.
pub struct Gateway {
    /// The relay, in this process or over gRPC.
    pub relay: Arc<dyn RelayApi>,
    /// Settings.
    pub config: GatewayConfig,
    /// Rate limiters.
    pub limits: Limiters,
    /// Cancelled when the gateway shuts down (ends long-lived MCP streams).
    pub shutdown: tokio_util::sync::CancellationToken,
}

/// The state as the API structs hold it.
pub type State = Arc<Gateway>;

/// Groups of operations in the spec.
#[derive(Tags)]
pub enum Tag {
    /// What an LLM calls: read a session's tools, call them, read the answers.
    Llm,
    /// What the browser tab (the tool provider) calls.
    Provider,
    /// The first design's paths, kept working.
    Legacy,
    /// Tools built into the relay, callable without a session.
    Tools,
    /// Discovery, health and readiness.
    Discovery,
}

impl Gateway {
    /// Runs a relay operation on session `code` for client `ip` under the brute-force guard:
    /// a blocked address is refused, and a look-up of an unknown code counts against it.
    pub async fn guarded<T>(
        &self,
        ip: IpAddr,
        operation: impl Future<Output = Outcome<T>>,
    ) -> Result<T, ApiError> {
        self.limits.check_lookups(ip)?;
        operation.await.map_err(|error: ErrorInfo| {
            if error.name == "session_not_found"
                && let Err(limited) = self.limits.unknown_code(ip)
            {
                return limited;
            }
            ApiError::from(error)
        })
    }

    /// An absolute URL of this gateway.
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.config.public_base_url)
    }
}

/// The client address a request counts against (see [`Limiters::client_ip`]).
#[derive(Debug, Clone, Copy)]
pub struct Client(pub IpAddr);

impl<'a> FromRequest<'a> for Client {
    async fn from_request(request: &'a Request, _body: &mut RequestBody) -> poem::Result<Self> {
        let state = request.data::<State>().ok_or_else(|| {
            poem::Error::from_string("gateway state missing", StatusCode::INTERNAL_SERVER_ERROR)
        })?;
        Ok(Self(
            state
                .limits
                .client_ip(request.remote_addr(), request.headers()),
        ))
    }
}

/// The provider token of a request: `Authorization: Bearer …`, or `?token=` (for EventSource
/// and WebSocket, which cannot set headers).
pub fn provider_token(authorization: Option<&str>, query: Option<String>) -> Option<String> {
    authorization
        .and_then(|value| {
            let (scheme, token) = value.trim().split_once(' ')?;
            scheme
                .eq_ignore_ascii_case("bearer")
                .then(|| token.trim().to_owned())
        })
        .filter(|token| !token.is_empty())
        .or(query.filter(|token| !token.is_empty()))
}
