#!/usr/bin/env bash
# Undo the runtime part of scripts/setup.sh: stop only what setup (or the demo)
# started. Never uninstalls packages, never deletes images or config files.
#
#   1. rkubelet, if /run/rkubelet/rkubelet.pid names a live rkubelet process.
#   2. --purge-pods: remove every container/pod in containerd's k8s.io
#      namespace (tasks kill + containers rm, plus a best-effort CNI DEL for
#      pod sandboxes so IPs and iptables rules are released). Best effort.
#   3. containerd, if /run/rkubelet/containerd.pid names a live containerd
#      (SIGTERM, wait, SIGKILL); or, on systemd hosts, containerd.service if
#      setup marked it as managed.
#
# Without --purge-pods, running pods' shims (containerd-shim-runc-v2) keep
# running; containerd reattaches to them when setup.sh starts it again.
set -euo pipefail

usage() {
    echo "usage: $0 [--purge-pods]" >&2
    exit 2
}

PURGE=0
for arg in "$@"; do
    case "$arg" in
        --purge-pods) PURGE=1 ;;
        -h | --help) usage ;;
        *) usage ;;
    esac
done

RUN_DIR="/run/rkubelet"
CTRD_PIDFILE="$RUN_DIR/containerd.pid"
CTRD_SUMFILE="$RUN_DIR/containerd.sha256"
CTRD_SYSTEMD_MARK="$RUN_DIR/containerd.systemd"
RKUBELET_PIDFILE="$RUN_DIR/rkubelet.pid"
CTRD_SOCK="/run/containerd/containerd.sock"
NS="k8s.io"
CNI_CONF="/etc/rkubelet/cni/net.d/10-rkubelet.conflist"
CNI_BIN_DIR="/usr/lib/cni"

log() { printf '[teardown] %s\n' "$*"; }
warn() { printf '[teardown] WARNING: %s\n' "$*" >&2; }
die() { printf '[teardown] ERROR: %s\n' "$*" >&2; exit 1; }

[[ $EUID -eq 0 ]] || die "must be run as root"

pid_alive() { # PID (non-zombie)
    local pid="$1" stat
    [[ $pid =~ ^[0-9]+$ ]] || return 1
    stat="$(cat "/proc/$pid/stat" 2>/dev/null)" || return 1
    stat="${stat##*) }"
    [[ ${stat%% *} != Z ]]
}

stop_pid() { # PID TIMEOUT NAME
    local pid="$1" timeout="$2" name="$3" deadline
    pid_alive "$pid" || return 0
    log "stopping $name (pid $pid): SIGTERM"
    kill -TERM "$pid" 2>/dev/null || true
    deadline=$((SECONDS + timeout))
    while pid_alive "$pid" && ((SECONDS < deadline)); do sleep 0.1; done
    if pid_alive "$pid"; then
        warn "$name (pid $pid) still running after ${timeout}s: SIGKILL"
        kill -KILL "$pid" 2>/dev/null || true
        deadline=$((SECONDS + 10))
        while pid_alive "$pid" && ((SECONDS < deadline)); do sleep 0.1; done
    fi
    if pid_alive "$pid"; then
        warn "$name (pid $pid) could not be stopped"
        return 1
    fi
    log "$name stopped"
}

ctr_ok() { timeout 5 ctr --address "$CTRD_SOCK" version >/dev/null 2>&1; }

# ------------------------------------------------------------- rkubelet ----
stop_rkubelet() {
    [[ -f $RKUBELET_PIDFILE ]] || { log "rkubelet: no pidfile, nothing to stop"; return 0; }
    local pid cmd
    pid="$(cat "$RKUBELET_PIDFILE" 2>/dev/null || true)"
    if pid_alive "$pid"; then
        cmd="$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null || true)"
        if [[ "$(cat "/proc/$pid/comm" 2>/dev/null)" == *rkubelet* || $cmd == *rkubelet* ]]; then
            stop_pid "$pid" 30 rkubelet || true
        else
            warn "rkubelet pidfile names pid $pid, which is not rkubelet ($cmd); not touching it"
        fi
    else
        log "rkubelet: pid '$pid' from pidfile is not running"
    fi
    rm -f "$RKUBELET_PIDFILE"
}

# ----------------------------------------------------------- purge pods ----
# CNI DEL for one sandbox, plugins in reverse order (portmap, then bridge).
# Needs jq to split the conflist; skipped (with a warning) otherwise.
cni_del() { # SANDBOX_ID NETNS_PATH
    local id="$1" netns="$2" n i conf
    [[ -f $CNI_CONF ]] || return 0
    command -v jq >/dev/null 2>&1 || { warn "jq not installed: skipping CNI DEL for $id"; return 0; }
    n="$(jq '.plugins | length' "$CNI_CONF")"
    for ((i = n - 1; i >= 0; i--)); do
        # portmap's DEL is a no-op without runtimeConfig.portMappings; any
        # mapping will do (it deletes the per-container chain by id).
        conf="$(jq -c --argjson i "$i" '.plugins[$i] + {name: .name, cniVersion: .cniVersion}
            | if .capabilities.portMappings then
                .runtimeConfig.portMappings = [{hostPort: 1, containerPort: 1, protocol: "tcp"}]
              else . end' "$CNI_CONF")"
        CNI_COMMAND=DEL CNI_CONTAINERID="$id" CNI_NETNS="$netns" CNI_IFNAME=eth0 \
            CNI_PATH="$CNI_BIN_DIR" \
            "$CNI_BIN_DIR/$(jq -r .type <<<"$conf")" <<<"$conf" >/dev/null 2>&1 ||
            warn "CNI DEL ($(jq -r .type <<<"$conf")) failed for $id"
    done
}

purge_pods() {
    if ! ctr_ok; then
        warn "containerd not answering on $CTRD_SOCK: cannot purge pods"
        return 0
    fi
    local ids id info netns sandboxes=() containers=() deadline
    ids="$(ctr -n "$NS" containers ls -q 2>/dev/null || true)"
    if [[ -z $ids ]]; then
        log "purge: no containers in namespace $NS"
        return 0
    fi
    while IFS= read -r id; do
        [[ -n $id ]] || continue
        info="$(ctr -n "$NS" containers info "$id" 2>/dev/null || true)"
        if [[ $info == *'"io.cri-containerd.kind": "sandbox"'* ]]; then
            sandboxes+=("$id")
        else
            containers+=("$id")
        fi
    done <<<"$ids"
    log "purge: ${#containers[@]} container(s), ${#sandboxes[@]} sandbox(es) in $NS"

    # App containers first, then sandboxes (pause).
    for id in "${containers[@]}" "${sandboxes[@]}"; do
        ctr -n "$NS" tasks kill -s SIGKILL "$id" >/dev/null 2>&1 || true
    done
    deadline=$((SECONDS + 15))
    for id in "${containers[@]}" "${sandboxes[@]}"; do
        while ((SECONDS < deadline)); do
            local tasks
            tasks="$(ctr -n "$NS" tasks ls 2>/dev/null || true)"
            awk -v id="$id" '$1 == id && $3 != "STOPPED" {found=1} END {exit !found}' <<<"$tasks" || break
            sleep 0.1
        done
        ctr -n "$NS" tasks rm -f "$id" >/dev/null 2>&1 || true
    done

    for id in "${sandboxes[@]}"; do
        netns=""
        if command -v jq >/dev/null 2>&1; then
            netns="$(ctr -n "$NS" containers info "$id" 2>/dev/null |
                jq -r '.Spec.linux.namespaces[]? | select(.type == "network") | .path // empty' 2>/dev/null || true)"
        fi
        cni_del "$id" "$netns"
        if [[ $netns == /var/run/netns/* || $netns == /run/netns/* ]]; then
            umount "$netns" 2>/dev/null || true
            rm -f "$netns" 2>/dev/null || true
        fi
        # Sandbox /dev/shm mount made by the CRI plugin.
        umount "/run/containerd/io.containerd.grpc.v1.cri/sandboxes/$id/shm" 2>/dev/null || true
    done

    for id in "${containers[@]}" "${sandboxes[@]}"; do
        ctr -n "$NS" containers rm "$id" >/dev/null 2>&1 || warn "could not remove container $id"
    done
    log "purge: done"
}

# ----------------------------------------------------------- containerd ----
stop_containerd() {
    if [[ -f $CTRD_SYSTEMD_MARK ]]; then
        log "stopping containerd.service (managed by setup.sh)"
        systemctl stop containerd || warn "systemctl stop containerd failed"
        rm -f "$CTRD_SYSTEMD_MARK"
        return 0
    fi
    [[ -f $CTRD_PIDFILE ]] || { log "containerd: no pidfile, nothing to stop"; return 0; }
    local pid
    pid="$(cat "$CTRD_PIDFILE" 2>/dev/null || true)"
    if pid_alive "$pid" && [[ "$(cat "/proc/$pid/comm" 2>/dev/null)" == containerd ]]; then
        stop_pid "$pid" 30 containerd || true
    else
        log "containerd: pid '$pid' from pidfile is not a running containerd"
    fi
    rm -f "$CTRD_PIDFILE" "$CTRD_SUMFILE"
}

stop_rkubelet
if ((PURGE)); then
    purge_pods
fi
stop_containerd
log "done (packages, images and config left in place; re-run scripts/setup.sh to start again)"
