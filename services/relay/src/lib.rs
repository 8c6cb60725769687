//! The toolrelay relay: sessions, manifests, request queues, provider connections and expiry.
//!
//! # Layout
//! * Domain (plain Rust, no transport types; a test in [`ops`] holds [`relay`] to it):
//!   [`relay`] — the [`Relay`] and its consumer-side operations' domain steps (sessions,
//!   manifests, calls, responses); [`provider`] — attaching providers, delivery, heartbeats,
//!   polling, and [`channel`], the channels between a provider's transport and its driver;
//!   [`manifest`] — validated manifests with compiled argument schemas; [`store`] — the
//!   [`Store`](store::Store) trait and the in-memory store; [`code`] — pairing codes and
//!   tokens; [`clock`] — time that tests can pause; [`error`] — the one error type;
//!   [`builtin`] — the [`Tool`](builtin::Tool) trait and the [`Registry`](builtin::Registry)
//!   the relay runs built-in tools from (the tools themselves are the `toolrelay-builtin`
//!   crate's, handed in by the binaries that run them, so a gateway links none).
//! * Operations: [`ops`] — every unary operation as a unit ([`operation`]: the caller's checks
//!   around its domain step, its retry rule, its protobuf messages, what a front end checks
//!   first), one file per family as in [`relay`]; `convert.rs` — the relay's types to and
//!   from protobuf.
//! * Transports, each a thin adapter over the operations and the domain: [`grpc`] (tonic:
//!   consumers and backend providers, plus health and reflection) and [`ws`] (the browser
//!   WebSocket, tokio-tungstenite), whose port also answers probes and scrapes ([`probes`]);
//!   [`remote`] — the same operations reached over gRPC from another process (the gateway in a
//!   split deployment); [`caller`] — who makes a request (its address, and who it is among the
//!   many people behind one address); [`limits`] — the brute-force guard and call limits
//!   every transport applies through [`RelayApi`], per caller under per-address ceilings;
//!   [`access`] — API keys and the proof a gateway gives before the
//!   relay believes the client it names; [`listen`] — every listener's connection caps,
//!   header-read and idle timeouts (the gateway's too).
//! * [`server`] — `run(listeners, shutdown)`, used by the binaries (package
//!   `toolrelay-server`) and by tests; [`drain`] — the graceful shutdown both servers of a
//!   process share; [`metrics`] — the process's Prometheus metrics, which everything above
//!   reports to; [`config`] — settings and command-line flags.
//! * [`front`] — all a front end (the gateway) may use of this crate: the relay as
//!   [`RelayApi`] and its units, callers and budgets, errors, the store's face for what a
//!   front end keeps itself ([`store::FrontStore`]: claim checks, MCP client sessions, rate
//!   budgets) and what serving one takes; a test in the gateway holds it to that.

pub mod access;
pub mod api;
pub mod builtin;
pub mod caller;
pub mod channel;
pub mod clock;
pub mod code;
pub mod config;
pub(crate) mod convert;
mod downlink;
pub mod drain;
pub mod error;
pub mod front;
pub mod grpc;
pub mod limits;
pub mod listen;
pub mod manifest;
pub mod metrics;
pub mod operation;
pub mod ops;
pub mod pool;
pub mod probes;
pub mod provider;
pub mod relay;
pub mod remote;
pub mod server;
pub mod store;
pub mod telemetry;
pub mod ws;

pub use api::{Outcome, RelayApi};
pub use clock::{Clock, Timestamp};
pub use code::SessionCode;
pub use config::RelayConfig;
pub use drain::Drain;
pub use error::{ErrorCode, ErrorInfo, ErrorKind, RelayError};
pub use limits::Caller;
pub use metrics::Metrics;
pub use operation::Operation;
pub use provider::{Downlink, ProviderLink};
pub use relay::{
    AnswerLimits, CallInput, NewSession, Relay, RequestView, ResponseOutcome, SessionStatus,
    contain_response,
};
pub use store::Transport;

/// Locks a std mutex held for a few map operations, never across an `.await`. Each critical
/// section writes whole values, so the data is sound after a panic elsewhere: a poisoned lock
/// is taken as it stands.
pub(crate) fn locked<T>(mutex: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}
