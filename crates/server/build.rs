//! Generates the KServe v2 gRPC service (`inference.GRPCInferenceService`) from inferd-codec's
//! `proto/inference.proto`, over the message types inferd-codec generates from the same file. protox is a
//! protobuf compiler in Rust: nothing needs installing.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto_dir = "../codec/proto";
    println!("cargo:rerun-if-changed={proto_dir}/inference.proto");
    let descriptors = protox::compile(["inference.proto"], [proto_dir])?;
    tonic_prost_build::configure()
        .build_client(false)
        .build_transport(false)
        .extern_path(".inference", "::inferd_codec::grpc::proto")
        // prost's codec with smaller first buffers (crates/server/src/grpc/codec.rs).
        .codec_path("crate::grpc::codec::Codec")
        .compile_fds(descriptors)?;
    Ok(())
}
