# rkubelet as a container image, for operators who ship node agents as
# images. It must run privileged, in the host's PID and network namespaces,
# with the host paths it manages mounted (see README.md, "As a container
# image"). The CRI protocol is compiled without protoc (build.rs uses protox).
FROM rust:1-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock build.rs ./
COPY proto proto
COPY src src
RUN cargo build --release --bin rkubelet

FROM debian:bookworm-slim
# mount/umount for subPath binds and pod cleanup; ca-certificates for the
# API server's chain when a kubeconfig names no CA.
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates mount \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /src/target/release/rkubelet /usr/local/bin/rkubelet
ENTRYPOINT ["/usr/local/bin/rkubelet"]
