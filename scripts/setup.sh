#!/usr/bin/env bash
# Prepare a Debian 12 machine (as root) to run pods on containerd via CRI for
# rkubelet, with no container registry reachable:
#
#   a. Debian packages (containerd, runc, CNI plugins, busybox-static, umoci, ...)
#      and a Rust toolchain (cargo) on PATH.
#   b. CNI config   config/cni/10-rkubelet.conflist -> /etc/rkubelet/cni/net.d/
#   c. containerd   config/containerd/config.toml   -> /etc/rkubelet/containerd/
#   d. containerd running on /run/containerd/containerd.sock with the CRI plugin
#      (our own background process when PID 1 is not systemd, tracked by
#      /run/rkubelet/containerd.pid; otherwise the systemd unit).
#   e. Local images (scripts/build-images.sh): localhost/rkubelet/pause:3.10,
#      docker.io/library/busybox:1.36 and :latest, in namespace k8s.io.
#
# Safe to re-run: every step checks current state first and only changes what
# differs. Environment: FORCE=1 rebuilds/re-imports the images.
# Undo with scripts/teardown.sh (stops processes; never removes packages).
set -euo pipefail

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_DIR="$(cd "$SCRIPT_DIR/.." && pwd)"

PACKAGES=(containerd runc containernetworking-plugins busybox-static umoci
    iproute2 iptables gcc libc6-dev ca-certificates procps curl)

CNI_SRC="$REPO_DIR/config/cni/10-rkubelet.conflist"
CNI_CONF_DIR="/etc/rkubelet/cni/net.d"
CNI_DST="$CNI_CONF_DIR/10-rkubelet.conflist"
CNI_BIN_DIR="/usr/lib/cni"

CTRD_SRC="$REPO_DIR/config/containerd/config.toml"
CTRD_CONF_DIR="/etc/rkubelet/containerd"
CTRD_CONF="$CTRD_CONF_DIR/config.toml"
CTRD_SOCK="/run/containerd/containerd.sock"
CTRD_LOG="/var/log/rkubelet-containerd.log"
CTRD_START_TIMEOUT=60

RUN_DIR="/run/rkubelet"
CTRD_PIDFILE="$RUN_DIR/containerd.pid"
CTRD_SUMFILE="$RUN_DIR/containerd.sha256"
CTRD_SYSTEMD_MARK="$RUN_DIR/containerd.systemd"

CHANGES=()

log() { printf '[setup] %s\n' "$*"; }
warn() { printf '[setup] WARNING: %s\n' "$*" >&2; }
die() { printf '[setup] ERROR: %s\n' "$*" >&2; exit 1; }
changed() { CHANGES+=("$*"); log "changed: $*"; }

[[ $EUID -eq 0 ]] || die "must be run as root"

# Install SRC to DST (mode 0644) only if content differs. Returns 0 if it wrote.
install_if_changed() { # SRC DST
    local src="$1" dst="$2"
    [[ -f $src ]] || die "missing source file $src"
    mkdir -p "$(dirname "$dst")"
    if [[ -f $dst ]] && cmp -s "$src" "$dst"; then
        return 1
    fi
    install -m 0644 "$src" "$dst"
    return 0
}

# A pid is alive if it exists and is not a zombie (PID 1 here may not reap).
pid_alive() { # PID
    local pid="$1" stat
    [[ $pid =~ ^[0-9]+$ ]] || return 1
    stat="$(cat "/proc/$pid/stat" 2>/dev/null)" || return 1
    stat="${stat##*) }"
    [[ ${stat%% *} != Z ]]
}

pid_is_containerd() { # PID
    pid_alive "$1" && [[ "$(cat "/proc/$1/comm" 2>/dev/null)" == containerd ]]
}

# Live (non-zombie) processes named exactly "containerd" (not the shims).
containerd_pids() {
    local p out=""
    for p in $(pgrep -x containerd || true); do
        pid_alive "$p" && out+="$p "
    done
    echo "$out"
}

# SIGTERM, wait up to TIMEOUT seconds, then SIGKILL.
stop_pid() { # PID TIMEOUT
    local pid="$1" timeout="$2" deadline
    pid_alive "$pid" || return 0
    kill -TERM "$pid" 2>/dev/null || true
    deadline=$((SECONDS + timeout))
    while pid_alive "$pid" && ((SECONDS < deadline)); do sleep 0.1; done
    if pid_alive "$pid"; then
        warn "pid $pid did not exit after ${timeout}s; sending SIGKILL"
        kill -KILL "$pid" 2>/dev/null || true
        deadline=$((SECONDS + 10))
        while pid_alive "$pid" && ((SECONDS < deadline)); do sleep 0.1; done
    fi
    ! pid_alive "$pid" || die "could not stop pid $pid"
}

# containerd 1.7 (from Debian trixie) serves CRI GetContainerEvents, which
# rkubelet's evented PLEG uses to show a container's death at once; bookworm
# ships 1.6, where the 1 s relist is the only source. Only containerd itself
# comes from trixie (its dependencies are bookworm's), and trixie is pinned
# low so nothing else is ever taken from it. RKUBELET_CONTAINERD_UPGRADE=0
# keeps the installed containerd.
TRIXIE_SOURCES=/etc/apt/sources.list.d/rkubelet-trixie.sources
TRIXIE_PIN=/etc/apt/preferences.d/rkubelet-trixie
ensure_containerd_17() {
    local v
    v="$(dpkg-query -W -f='${Version}' containerd 2>/dev/null || true)"
    if dpkg --compare-versions "$v" ge 1.7; then
        log "containerd package: $v"
        return 0
    fi
    if [[ ${RKUBELET_CONTAINERD_UPGRADE:-1} != 1 ]]; then
        log "containerd package: $v (upgrade disabled; evented PLEG unavailable)"
        return 0
    fi
    if [[ ! -f $TRIXIE_SOURCES ]]; then
        printf 'Types: deb\nURIs: http://deb.debian.org/debian\nSuites: trixie\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' >"$TRIXIE_SOURCES"
    fi
    printf 'Package: *\nPin: release n=trixie\nPin-Priority: 100\n' >"$TRIXIE_PIN"
    apt-get update
    DEBIAN_FRONTEND=noninteractive apt-get install -y containerd/trixie
    changed "containerd upgraded from $v to $(dpkg-query -W -f='${Version}' containerd) (trixie)"
}

# ------------------------------------------------------------ a. packages ----
step_packages() {
    local missing=() p st
    for p in "${PACKAGES[@]}"; do
        st="$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)"
        [[ $st == "install ok installed" ]] || missing+=("$p")
    done
    if ((${#missing[@]})); then
        log "installing missing packages: ${missing[*]}"
        apt-get update
        DEBIAN_FRONTEND=noninteractive apt-get install -y "${missing[@]}"
        changed "apt installed ${missing[*]}"
    else
        log "packages: all ${#PACKAGES[@]} present"
    fi

    ensure_containerd_17

    if ! command -v cargo >/dev/null 2>&1 && [[ -f ${HOME:-/root}/.cargo/env ]]; then
        # shellcheck disable=SC1091
        . "${HOME:-/root}/.cargo/env"
    fi
    command -v cargo >/dev/null 2>&1 ||
        die "cargo not found on PATH (nor via \$HOME/.cargo/env). Install Rust with rustup (https://rustup.rs) first."
    log "cargo: $(command -v cargo)"
}

# ----------------------------------------------------------------- b. CNI ----
step_cni() {
    [[ -x $CNI_BIN_DIR/bridge && -x $CNI_BIN_DIR/portmap && -x $CNI_BIN_DIR/host-local ]] ||
        die "CNI plugins missing in $CNI_BIN_DIR (package containernetworking-plugins)"

    # The conflist's cniVersion must be one the plugins support.
    local want ver
    want="$(sed -n 's/^[[:space:]]*"cniVersion":[[:space:]]*"\([^"]*\)".*/\1/p' "$CNI_SRC" | head -n1)"
    ver="$(CNI_COMMAND=VERSION "$CNI_BIN_DIR/bridge" </dev/null 2>/dev/null || true)"
    [[ $ver == *"\"$want\""* ]] || die "CNI bridge plugin does not support cniVersion $want (it reports: $ver)"

    if install_if_changed "$CNI_SRC" "$CNI_DST"; then
        changed "installed $CNI_DST"
    fi
    # containerd only loads the lexically first file of its CNI conf dir (the dir
    # is ours alone): drop anything else.
    local f
    for f in "$CNI_CONF_DIR"/* "$CNI_CONF_DIR"/.[!.]*; do
        [[ -e $f || -L $f ]] || continue
        [[ $f == "$CNI_DST" ]] && continue
        rm -rf -- "$f"
        changed "removed stray $f"
    done
    sysctl -qw net.ipv4.ip_forward=1 2>/dev/null || warn "could not enable net.ipv4.ip_forward"
    log "CNI: $CNI_DST (cniVersion $want)"
}

# ------------------------------------------------------ c. containerd conf ----
step_containerd_config() {
    if install_if_changed "$CTRD_SRC" "$CTRD_CONF"; then
        changed "installed $CTRD_CONF"
    fi
    log "containerd config: $CTRD_CONF"
}

# ---------------------------------------------------- d. start containerd ----
wait_containerd_ready() { # [PID]
    local pid="${1:-}" deadline=$((SECONDS + CTRD_START_TIMEOUT))
    until timeout 5 ctr --address "$CTRD_SOCK" version >/dev/null 2>&1; do
        if [[ -n $pid ]] && ! pid_alive "$pid"; then
            tail -n 30 "$CTRD_LOG" >&2 2>/dev/null || true
            die "containerd (pid $pid) exited during startup; see $CTRD_LOG"
        fi
        if ((SECONDS >= deadline)); then
            tail -n 30 "$CTRD_LOG" >&2 2>/dev/null || true
            die "containerd did not answer on $CTRD_SOCK within ${CTRD_START_TIMEOUT}s"
        fi
        sleep 0.2
    done
}

check_cri_plugin() {
    local plugins line
    plugins="$(ctr --address "$CTRD_SOCK" plugins ls)"
    line="$(awk '$1 == "io.containerd.grpc.v1" && $2 == "cri"' <<<"$plugins")"
    [[ -n $line ]] || die "CRI plugin io.containerd.grpc.v1 cri not listed by 'ctr plugins ls'"
    if [[ "$(awk '{print $NF}' <<<"$line")" != ok ]]; then
        tail -n 30 "$CTRD_LOG" >&2 2>/dev/null || true
        die "CRI plugin not ok: $line"
    fi
    log "CRI plugin: ok"
}

start_containerd_nosystemd() {
    mkdir -p "$RUN_DIR"
    local sum pid="" old
    sum="$(sha256sum "$CTRD_CONF" "$(command -v containerd)" | sha256sum | cut -d' ' -f1)"

    if [[ -f $CTRD_PIDFILE ]]; then
        pid="$(cat "$CTRD_PIDFILE" 2>/dev/null || true)"
        if pid_is_containerd "$pid"; then
            if [[ "$(cat "$CTRD_SUMFILE" 2>/dev/null || true)" == "$sum" ]]; then
                log "containerd: already running (pid $pid, config unchanged)"
                wait_containerd_ready "$pid"
                return 0
            fi
            log "containerd: config or binary changed; restarting pid $pid"
            stop_pid "$pid" 30
        fi
        rm -f "$CTRD_PIDFILE" "$CTRD_SUMFILE"
    fi

    # Someone else's containerd would hold the socket: stop it.
    old="$(containerd_pids)"
    if [[ -n $old ]]; then
        log "containerd: stopping foreign containerd process(es): $old"
        pkill -x containerd || true
        local deadline=$((SECONDS + 30))
        while [[ -n "$(containerd_pids)" ]] && ((SECONDS < deadline)); do sleep 0.1; done
        old="$(containerd_pids)"
        if [[ -n $old ]]; then
            warn "containerd still running after 30s; SIGKILL $old"
            # shellcheck disable=SC2086
            kill -KILL $old 2>/dev/null || true
            deadline=$((SECONDS + 10))
            while [[ -n "$(containerd_pids)" ]] && ((SECONDS < deadline)); do sleep 0.1; done
            [[ -z "$(containerd_pids)" ]] || die "could not stop existing containerd"
        fi
    fi

    printf '=== %s: started by rkubelet scripts/setup.sh ===\n' "$(date -Is)" >>"$CTRD_LOG"
    # setsid: own session, so it outlives this script and its terminal/job.
    # Explicit PATH: containerd and the CNI plugins it runs need runc,
    # containerd-shim-runc-v2 and iptables (in /usr/sbin) whatever the caller's PATH.
    # Close inherited descriptors beyond stdio first: a lock file held by a
    # caller (flock around a test run) would stay locked as long as the daemon.
    (
        for fd in /proc/$BASHPID/fd/*; do
            n=${fd##*/}
            if [[ $n =~ ^[0-9]+$ ]] && ((n > 2)); then eval "exec $n>&-" 2>/dev/null || true; fi
        done
        PATH="/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" \
            exec setsid nohup containerd --config "$CTRD_CONF" >>"$CTRD_LOG" 2>&1 </dev/null
    ) &
    pid=$!
    wait_containerd_ready "$pid"
    # setsid forks when already a group leader; resolve the real daemon pid.
    if ! pid_is_containerd "$pid"; then
        pid="$(pgrep -n -x containerd || true)"
        pid_is_containerd "$pid" || die "cannot find the started containerd process"
    fi
    echo "$pid" >"$CTRD_PIDFILE"
    echo "$sum" >"$CTRD_SUMFILE"
    changed "started containerd (pid $pid, log $CTRD_LOG)"
}

start_containerd_systemd() {
    mkdir -p "$RUN_DIR"
    local dst=/etc/containerd/config.toml restart=0
    if [[ -f $dst && ! -f $dst.rkubelet-orig ]] && ! cmp -s "$CTRD_CONF" "$dst"; then
        cp -p "$dst" "$dst.rkubelet-orig"
        log "saved original $dst as $dst.rkubelet-orig"
    fi
    if install_if_changed "$CTRD_CONF" "$dst"; then
        changed "installed $dst"
        restart=1
    fi
    systemctl is-active --quiet containerd || restart=1
    if ((restart)); then
        systemctl enable containerd >/dev/null 2>&1 || true
        systemctl restart containerd
        changed "restarted containerd.service"
    else
        log "containerd.service: active, config unchanged"
    fi
    touch "$CTRD_SYSTEMD_MARK"
    wait_containerd_ready
}

step_containerd() {
    local init
    init="$(ps -p 1 -o comm= | tr -d '[:space:]')"
    if [[ $init == systemd ]]; then
        start_containerd_systemd
    else
        start_containerd_nosystemd
    fi
    check_cri_plugin
}

# -------------------------------------------------------------- e. images ----
step_images() {
    local before after
    before="$(ctr -n k8s.io images ls)"
    FORCE="${FORCE:-0}" "$SCRIPT_DIR/build-images.sh"
    after="$(ctr -n k8s.io images ls)"
    [[ $before == "$after" ]] || changed "imported images (see build-images output above)"
}

# ------------------------------------------------------------- f. summary ----
summary() {
    local images pid
    images="$(ctr -n k8s.io images ls -q)"
    pid="$(cat "$CTRD_PIDFILE" 2>/dev/null || echo systemd)"
    echo
    echo "=== rkubelet setup complete ($((SECONDS))s) ==="
    echo "containerd : $(containerd --version | awk '{print $3}') pid=$pid socket=$CTRD_SOCK"
    echo "config     : $CTRD_CONF (log $CTRD_LOG)"
    echo "CNI        : $CNI_DST (bins $CNI_BIN_DIR, bridge rkb0, 10.88.0.0/16)"
    echo "images     : $(tr '\n' ' ' <<<"$images")"
    if ((${#CHANGES[@]})); then
        echo "changes    : ${#CHANGES[@]}"
        printf '  - %s\n' "${CHANGES[@]}"
    else
        echo "changes    : none (already set up)"
    fi
    echo "teardown   : $SCRIPT_DIR/teardown.sh [--purge-pods]"
}

step_packages
step_cni
step_containerd_config
step_containerd
step_images
summary
