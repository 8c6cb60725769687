//! The toolrelay gateway: the documented REST API, SSE and polling fallbacks, the browser
//! WebSocket on the public port, the OpenAPI spec, discovery and health.
//!
//! # Layout
//! * [`server`] — the route table and middleware ([`server::app`]), the OpenAPI documents,
//!   `run` (the gateway alone) and `run_all` (gateway and relay in one process);
//! * [`api`] — the operations, one `#[OpenApi]` struct per audience (LLM, tab, legacy,
//!   discovery), all over [`api::Gateway`], which reaches the relay through
//!   [`toolrelay_relay::RelayApi`] — in-process or over gRPC, the handlers cannot tell;
//! * [`websocket`] — the provider WebSocket upgrade; [`plugin`] — the CODAP plugin's files;
//!   [`mcp`] — the MCP endpoints (`/mcp`, `/mcp/s/{handle}`);
//! * [`types`] — the JSON shapes of the API; [`error`] — error bodies and correlation ids;
//! * [`limits`] — rate limits and client addresses; [`auth`] — API keys on the LLM side;
//!   [`checks`] — the `Host` check and the Fetch Metadata policy, before any look-up;
//!   [`cors`] — CORS, the allow-list and the open routes;
//!   [`observe`] — the HTTP metrics (the registry is the relay crate's
//!   [`toolrelay_relay::metrics`], shared with the relay in one process); [`config`] —
//!   settings and flags.
//!
//! The gateway keeps no session state: sessions, calls and answers live in the relay.

pub mod api;
pub mod auth;
pub mod checks;
pub mod config;
pub mod cors;
pub mod error;
pub mod limits;
pub mod mcp;
pub mod observe;
pub mod plugin;
pub mod server;
pub mod types;
pub mod websocket;
