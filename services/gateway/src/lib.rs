//! The toolrelay gateway: the documented REST API, SSE and polling fallbacks, the browser
//! WebSocket on the public port, the OpenAPI spec, discovery and health.
//!
//! # Layout
//! * [`server`] — the route table ([`server::app`]), the OpenAPI documents, and [`server::run`]
//!   of a [`server::Server`]: in front of the relay in this process or of one elsewhere;
//! * [`api`] — the operations, one `#[OpenApi]` struct per audience (LLM, tab, legacy,
//!   discovery), all over [`api::Gateway`], which reaches the relay through
//!   [`toolrelay_relay::RelayApi`] — in-process or over gRPC, the handlers cannot tell;
//! * [`websocket`] — the provider WebSocket upgrade; [`plugin`] — the CODAP plugin's files;
//!   [`mcp`] — the MCP endpoints (`/mcp`, `/mcp/s/{handle}`);
//! * [`middleware`] — every layer around the routes, and their order in one function
//!   ([`middleware::layers`]): metrics, CORS, the `Host` and Fetch Metadata checks, API keys,
//!   the body limit;
//! * [`types`] — the JSON shapes of the API; [`error`] — error bodies and correlation ids;
//! * [`limits`] — rate limits and client addresses; [`config`] — settings and flags.
//!
//! The gateway keeps no session state: sessions, calls and answers live in the relay.

pub mod api;
pub mod config;
pub mod error;
pub mod limits;
pub mod mcp;
pub mod middleware;
pub mod plugin;
pub mod server;
pub mod types;
pub mod websocket;
