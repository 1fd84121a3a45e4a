#!/usr/bin/env bash
# The main job on a fresh Debian 12 machine, as root: set up containerd and
# images, build rkubelet, run it standalone with config/standalone.yaml and
# the demo static pod, and show the pod Running on the read-only port.
set -euo pipefail
cd "$(dirname "$0")/.."
[[ $(id -u) == 0 ]] || { echo "scripts/demo.sh must run as root" >&2; exit 1; }
source scripts/lib-cargo.sh

./scripts/setup.sh
cargo build --release

install -d /etc/kubernetes/manifests /run/rkubelet
install -m 0644 config/manifests/*.yaml /etc/kubernetes/manifests/
./scripts/stop-rkubelet.sh
setsid nohup target/release/rkubelet --config config/standalone.yaml --v=2 \
    >/var/log/rkubelet.log 2>&1 </dev/null &
echo $! >/run/rkubelet/rkubelet.pid
echo "rkubelet started (pid $(cat /run/rkubelet/rkubelet.pid)), log: /var/log/rkubelet.log"

deadline=$((SECONDS + 120))
until pods=$(curl -sf localhost:10255/pods) && [[ $pods == *'"phase":"Running"'* && $pods == *'"podIP":"'* ]]; do
    if ((SECONDS > deadline)); then
        echo "demo pod did not reach Running within 120s; last lines of the log:" >&2
        tail -n 30 /var/log/rkubelet.log >&2
        exit 1
    fi
    sleep 0.5
done
echo "healthz: $(curl -s localhost:10248/healthz)"
echo "pods on :10255/pods:"
curl -s localhost:10255/pods | python3 -c '
import json, sys
for p in json.load(sys.stdin)["items"]:
    s = p["status"]
    print("  %s/%s  phase=%s  podIP=%s  containers=%s" % (p["metadata"]["namespace"], p["metadata"]["name"],
          s.get("phase"), s.get("podIP"), ",".join(c["name"] + ":" + next(iter(c["state"])) for c in s.get("containerStatuses", []))))
' 2>/dev/null || curl -s localhost:10255/pods
ip=$(curl -s localhost:10255/pods | grep -o '"podIP":"[0-9.]*"' | head -n1 | cut -d'"' -f4)
echo "the demo pod serves: $(curl -s "http://$ip:8080/")"
echo "stop with scripts/stop-rkubelet.sh (pods keep running) or scripts/teardown.sh --purge-pods"
