//! What a process is made of around the relay: its servers ([`server`]), the graceful
//! shutdown they share ([`drain`]), its settings ([`config`]), metrics ([`metrics`]) and logs
//! ([`telemetry`]).

pub mod config;
pub mod drain;
pub mod metrics;
pub mod server;
pub mod telemetry;
