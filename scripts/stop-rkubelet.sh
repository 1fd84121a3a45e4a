#!/usr/bin/env bash
# Stops an rkubelet started by scripts/demo.sh (its pidfile); pods keep
# running, as when the upstream kubelet stops.
set -euo pipefail
PIDFILE=/run/rkubelet/rkubelet.pid
[[ -f $PIDFILE ]] || exit 0
pid=$(cat "$PIDFILE")
if kill -0 "$pid" 2>/dev/null && grep -q rkubelet "/proc/$pid/cmdline" 2>/dev/null; then
    kill -TERM "$pid"
    for _ in $(seq 1 150); do
        kill -0 "$pid" 2>/dev/null || break
        # A zombie (reaped late by PID 1) counts as stopped.
        [[ $(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null) == Z ]] && break
        sleep 0.1
    done
    kill -0 "$pid" 2>/dev/null && [[ $(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null) != Z ]] && kill -KILL "$pid"
    echo "stopped rkubelet (pid $pid)"
fi
rm -f "$PIDFILE"
