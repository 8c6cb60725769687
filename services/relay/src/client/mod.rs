//! The relay reached from a front end: [`api::RelayApi`], the relay in this process or in
//! another over gRPC ([`remote`], through a [`pool`] of replicas).

pub mod api;
pub mod pool;
pub mod remote;
