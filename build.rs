//! Compiles the protocols in `proto/` with protox (a pure-Rust protobuf
//! compiler), so building rkubelet needs no system `protoc`: the CRI
//! (`runtime.v1`) and the gRPC health protocol (`grpc.health.v1`, used by
//! gRPC container probes).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    let fds = protox::compile(
        ["runtime/v1/api.proto", "grpc/health/v1/health.proto"],
        ["proto"],
    )?;
    tonic_prost_build::configure()
        // Only client sides are needed: rkubelet calls containerd and probes.
        .build_server(false)
        .compile_fds(fds)?;
    Ok(())
}
