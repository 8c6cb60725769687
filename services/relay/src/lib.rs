//! The toolrelay relay: sessions, manifests, request queues, provider connections and expiry.
//!
//! # Layout
//! * Domain (plain Rust, no transport types):
//!   [`relay`] — the [`Relay`] and its consumer-side operations (sessions, manifests, calls,
//!   responses); [`provider`] — attaching providers, delivery, heartbeats, polling;
//!   [`manifest`] — validated manifests with compiled argument schemas; [`store`] — the
//!   [`Store`](store::Store) trait and the in-memory store; [`code`] — pairing codes and
//!   tokens; [`clock`] — time that tests can pause; [`error`] — the one error type.
//! * Transports, each a thin adapter over the domain: [`grpc`] (tonic: consumers and backend
//!   providers, plus health and reflection) and [`ws`] (the browser WebSocket,
//!   tokio-tungstenite); [`remote`] — the same operations reached over gRPC from another
//!   process (the gateway in a split deployment).
//! * [`server`] — `run(listeners, shutdown)`, used by the binaries and by tests;
//!   [`config`] — settings and command-line flags.

pub mod api;
pub mod builtin;
pub mod clock;
pub mod code;
pub mod config;
pub mod error;
pub mod grpc;
pub mod manifest;
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
pub use error::{ErrorInfo, ErrorKind, RelayError};
pub use provider::{Downlink, ProviderLink};
pub use relay::{CallInput, NewSession, Relay, RequestView, ResponseOutcome, SessionStatus};
pub use store::Transport;
