//! The toolrelay relay: sessions, manifests, request queues, provider connections and expiry.
//!
//! # Layout: one folder per layer
//! * [`domain`] — plain Rust, no transport types (a test in [`ops`] holds the whole folder to
//!   it): [`relay`] — the [`Relay`] and its operations' domain steps by family (sessions,
//!   manifests, calls, waiting, answers, polling, built-in runs, claims, approvals) and the
//!   tabs' upkeep; [`provider`] — attaching a tab's connection, delivery, heartbeats,
//!   replacement, and [`channel`], the channels between a connection's transport and its
//!   driver; [`manifest`] — validated manifests with compiled argument schemas; [`builtin`] —
//!   the [`Tool`](builtin::Tool) trait and the [`Registry`](builtin::Registry) the relay runs
//!   built-in tools from (the tools themselves are the `toolrelay-builtin` crate's, handed in
//!   by the binaries that run them, so a gateway links none); [`caller`] — who makes a request
//!   (its address, and who it is among the many people behind one address); [`limits`] — the
//!   brute-force guard and call limits, per caller under per-address ceilings; [`access`] —
//!   API keys and the proof a gateway gives before the relay believes the client it names;
//!   [`code`] — pairing codes and tokens; [`clock`] — time that tests can pause; [`error`] —
//!   the one error type.
//! * [`ops`] — the operations: every unary operation as a unit ([`operation`]: the caller's
//!   checks, declared, around its domain step, its retry rule, its protobuf messages, what a
//!   front end checks first), one file per family as in [`relay`].
//! * [`store`] — the [`Store`](store::Store) traits (every method written once, in
//!   [`store_methods`]), the in-memory store and the Redis store.
//! * [`transport`] — each a thin adapter over the operations and the domain: [`grpc`] (tonic:
//!   consumers and backend providers, plus health and reflection, its messages converted in
//!   `convert.rs`) and [`ws`] (the browser WebSocket, tokio-tungstenite), whose port also
//!   answers probes and scrapes ([`probes`]); [`listen`] — every listener's connection caps,
//!   header-read and idle timeouts (the gateway's too).
//! * [`client`] — the relay reached from a front end: [`RelayApi`], in this process or over
//!   gRPC from another ([`remote`], through a [`pool`] of replicas).
//! * [`process`] — [`server`], `run(listeners, shutdown)`, used by the binaries (package
//!   `toolrelay-server`) and by tests; [`drain`] — the graceful shutdown both servers of a
//!   process share; [`metrics`] — the process's Prometheus metrics, which everything above
//!   reports to; [`config`] — settings and command-line flags; [`telemetry`] — logs.
//! * [`front`] — all a front end (the gateway) may use of this crate: the relay as
//!   [`RelayApi`] and its units, callers and budgets, errors, the store's face for what a
//!   front end keeps itself ([`store::FrontStore`]: claim checks, MCP client sessions, rate
//!   budgets) and what serving one takes; a test in the gateway holds it to that.
//!
//! Each module is also named at the crate's root (`crate::relay`, `crate::grpc`, …), as it was
//! before the layers had folders.

pub mod client;
pub mod domain;
pub mod front;
pub mod ops;
pub mod process;
pub mod store;
pub mod transport;

// Each module under its own name as well, as before the layers had folders.
pub use client::{api, pool, remote};
pub(crate) use domain::downlink;
pub use domain::{
    access, builtin, caller, channel, clock, code, error, limits, manifest, provider, relay,
};
pub use ops::operation;
pub use process::{config, drain, metrics, server, telemetry};
pub(crate) use transport::convert;
pub use transport::{grpc, listen, probes, ws};

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
