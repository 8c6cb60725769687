//! The toolrelay contract, shared by the relay, the gateway, backend providers and tests.
//!
//! # Layout
//! * [`proto`]: the gRPC types and client/server stubs generated from
//!   `proto/toolrelay/v1/relay.proto`, and the descriptor set for gRPC reflection.
//! * [`wire`]: the JSON shapes that cross the wire outside gRPC: tool requests and responses,
//!   manifests, and the browser WebSocket frames of the provider protocol.
//! * [`errors`]: every error name that crosses a seam, as one type ([`errors::ErrorCode`]).
//! * [`json`]: conversions between `serde_json::Value` and protobuf `Struct`/`Value`.
//! * [`convert`]: `From`/`TryFrom` between the wire types and their protobuf messages.

pub mod convert;
pub mod errors;
pub mod json;
pub mod proto;
pub mod wire;

/// Version of the provider protocol announced in `welcome` frames.
pub const PROTOCOL_VERSION: &str = "1";
