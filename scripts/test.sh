#!/usr/bin/env bash
# The whole test suite, as root on a Debian 12 machine: prepares containerd,
# CNI and the local images (idempotent), then formatting, lints, unit tests
# and the real-containerd integration tests.
set -euo pipefail
cd "$(dirname "$0")/.."
[[ $(id -u) == 0 ]] || { echo "scripts/test.sh must run as root (it drives containerd)" >&2; exit 1; }
source scripts/lib-cargo.sh
# A one-off build gains nothing from incremental caches, which would take
# several GB of disk on top of the build.
export CARGO_INCREMENTAL=${CARGO_INCREMENTAL:-0}
# Say so plainly when the disk is too small, not as a linker crash later.
mkdir -p target
avail_kb=$(df -Pk target | awk 'NR==2 {print $4}')
if (( avail_kb < 4 * 1024 * 1024 )); then
    echo "scripts/test.sh: only $((avail_kb / 1024)) MiB free under $(pwd)/target; a fresh build takes about 3 GiB" >&2
    exit 1
fi

./scripts/setup.sh
# One kubelet per node: a demo rkubelet would clean up the tests' pods as
# orphans (and the tests' kubelets the demo's).
./scripts/stop-rkubelet.sh

cargo fmt --all -- --check
cargo clippy --all-targets -- -D warnings
cargo test
