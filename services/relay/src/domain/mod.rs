//! The domain, plain Rust with no transport types (a test in [`crate::ops`] holds [`relay`] to
//! it): the [`relay::Relay`] and its operations' domain steps by family, a tab's connection
//! ([`provider`], [`channel`], [`downlink`]), manifests, built-in tools, who a caller is and
//! the budgets it spends, codes, time and the one error type.

pub mod access;
pub mod builtin;
pub mod caller;
pub mod channel;
pub mod clock;
pub mod code;
pub mod downlink;
pub mod error;
pub mod limits;
pub mod manifest;
pub mod provider;
pub mod relay;
