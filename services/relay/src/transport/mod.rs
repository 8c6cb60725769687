//! The transports, each a thin adapter over the operations and the domain: gRPC ([`grpc`],
//! its messages converted in `convert`), the browser WebSocket ([`ws`]) whose port also
//! answers probes and scrapes ([`probes`]), and every listener's connection caps and timeouts
//! ([`listen`]).

pub(crate) mod convert;
pub mod grpc;
pub mod listen;
pub mod probes;
pub(crate) mod rewoken;
pub mod ws;
