#!/usr/bin/env bash
# The whole test suite, as root on a Debian 12 machine: prepares containerd,
# CNI and the local images (idempotent), then formatting, lints, unit tests
# and the real-containerd integration tests.
set -euo pipefail
cd "$(dirname "$0")/.."
[[ $(id -u) == 0 ]] || { echo "scripts/test.sh must run as root (it drives containerd)" >&2; exit 1; }
source scripts/lib-cargo.sh

./scripts/setup.sh
# One kubelet per node: a demo rkubelet would clean up the tests' pods as
# orphans (and the tests' kubelets the demo's).
./scripts/stop-rkubelet.sh

cargo fmt --all -- --check
cargo clippy --all-targets -- -D warnings
cargo test
