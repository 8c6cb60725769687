//! The HTTP API: one `#[OpenApi]` struct per audience, all over the same [`Gateway`] state.
//!
//! * [`llm::LlmApi`] — what an LLM calls (and all that `/openapi/actions.json` contains);
//!   its two busiest operations, callTool and readTool, are served apart from poem-openapi's
//!   router, by [`llm::CallRoute`];
//! * [`tab::TabApi`] — the browser tab's side: sessions, SSE, polling, answers, manifest;
//! * [`legacy::LegacyApi`] — the first design's paths and JSON shapes;
//! * [`tools::ToolsApi`] — the built-in tools (`/api/tools`), in the original tool API's shapes;
//! * [`discovery::DiscoveryApi`] — `.well-known`, health and readiness.

pub mod discovery;
pub mod legacy;
pub mod llm;
pub mod tab;
pub mod tools;
pub mod written;

use std::sync::Arc;

use poem::http::StatusCode;
use poem::{FromRequest, Request, RequestBody};
use poem_openapi::Tags;
use toolrelay_relay::front::{Caller, Drain, RelayApi};

use crate::config::GatewayConfig;
use crate::limits::Limiters;

/// The gateway's shared state.
pub struct Gateway {
    /// The relay, in this process or over gRPC.
    pub relay: RelayApi,
    /// Settings.
    pub config: GatewayConfig,
    /// Rate limiters.
    pub limits: Limiters,
    /// What this gateway shares with the others on the same `REDIS_URL` (in one process, the
    /// relay's store) besides the rate budgets its limiters hold: MCP client sessions, and
    /// the session each one opened (a ticket).
    pub store: Arc<dyn toolrelay_relay::front::store::FrontStore>,
    /// Cancelled when the gateway shuts down (ends long-lived MCP streams).
    pub shutdown: tokio_util::sync::CancellationToken,
    /// The process's drain (shared with the relay when it runs in this process).
    pub drain: Drain,
    /// The process's metrics (shared with the relay when it runs in this process).
    pub metrics: toolrelay_relay::front::Metrics,
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
    /// An absolute URL of this gateway.
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.config.public_base_url)
    }

    /// The caller of `request`, for the relay's limits (see [`Limiters::caller`]).
    pub fn caller(&self, request: &Request) -> Caller {
        let query_token = request.uri().query().and_then(|query| {
            query
                .split('&')
                .find_map(|pair| pair.strip_prefix("token="))
        });
        let seen = crate::limits::Request {
            method: request.method(),
            path: request.original_uri().path(),
            headers: request.headers(),
            query_token,
        };
        self.limits
            .caller(request.remote_addr(), seen)
            .with_correlation_id(crate::error::correlation_id())
    }
}

/// Who makes a request, as the relay's limits (brute-force guard, calls per session) see it.
#[derive(Debug, Clone)]
pub struct Client(pub Caller);

impl<'a> FromRequest<'a> for Client {
    async fn from_request(request: &'a Request, _body: &mut RequestBody) -> poem::Result<Self> {
        let state = request.data::<State>().ok_or_else(|| {
            poem::Error::from_string("gateway state missing", StatusCode::INTERNAL_SERVER_ERROR)
        })?;
        Ok(Self(state.caller(request)))
    }
}

/// The request's `Authorization` header, read without declaring it in the API's documents
/// (where the API key is a security scheme, not a parameter).
#[derive(Debug, Clone)]
pub struct Authorization(pub Option<String>);

impl<'a> FromRequest<'a> for Authorization {
    async fn from_request(request: &'a Request, _body: &mut RequestBody) -> poem::Result<Self> {
        Ok(Self(
            request
                .headers()
                .get(poem::http::header::AUTHORIZATION)
                .and_then(|value| value.to_str().ok())
                .map(str::to_owned),
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
