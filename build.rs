//! Compiles `proto/` into the contract crate with a vendored `protoc`, so a fresh machine
//! needs no system protobuf compiler.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos = [PathBuf::from("proto/toolrelay/v1/relay.proto")];
    let includes = [PathBuf::from("proto"), protoc_bin_vendored::include_path()?];
    let descriptor = PathBuf::from(std::env::var("OUT_DIR")?).join("toolrelay_descriptor.bin");

    let mut config = tonic_prost_build::Config::new();
    config.protoc_executable(protoc_bin_vendored::protoc_bin_path()?);

    tonic_prost_build::configure()
        .file_descriptor_set_path(descriptor)
        // The RPC `Connect` would clash with the client's `connect` constructor; clients build a
        // `Channel` and call `RelayClient::new(channel)` instead.
        .build_transport(false)
        // The relay's server routes each RPC to its operation unit itself
        // (services/relay/src/transport/grpc.rs): only the client is generated.
        .build_server(false)
        .compile_with_config(config, &protos, &includes)?;

    for proto in &protos {
        println!("cargo:rerun-if-changed={}", proto.display());
    }
    Ok(())
}
