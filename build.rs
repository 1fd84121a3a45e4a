//! Compiles the CRI protocol in `proto/` with protox (a pure-Rust protobuf
//! compiler), so building rkubelet needs no system `protoc`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    let fds = protox::compile(["runtime/v1/api.proto"], ["proto"])?;
    tonic_prost_build::configure()
        // Only the client side is needed: rkubelet talks to containerd.
        .build_server(false)
        .compile_fds(fds)?;
    Ok(())
}
