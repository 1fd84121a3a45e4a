//! Compiles the protocols in `proto/` with protox (a pure-Rust protobuf
//! compiler), so building rkubelet needs no system `protoc`: the CRI
//! (`runtime.v1`), the gRPC health protocol (`grpc.health.v1`, used by
//! gRPC container probes), the kubelet plugin registration API
//! (`pluginregistration`) and the CSI node side (`csi.v1`).

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
    // Plugins serve these and rkubelet calls them; the server sides are
    // generated too, for the fake registrar and driver in the tests (they
    // need only tonic's codegen, no server transport).
    let fds = protox::compile(
        ["pluginregistration/v1/api.proto", "csi/v1/csi.proto"],
        ["proto"],
    )?;
    tonic_prost_build::configure().compile_fds(fds)?;
    Ok(())
}
