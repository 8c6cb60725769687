//! Generated gRPC code for `toolrelay.v1`.

/// `toolrelay.v1`: messages, the `Relay` client and the `Relay` server trait.
#[allow(missing_docs, clippy::all)]
pub mod v1 {
    tonic::include_proto!("toolrelay.v1");
}

/// Encoded `FileDescriptorSet` of the contract, for gRPC reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("toolrelay_descriptor");
