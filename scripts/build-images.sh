#!/usr/bin/env bash
# Build the two OCI images rkubelet needs without any registry, and import them
# into containerd's CRI namespace (k8s.io):
#
#   localhost/rkubelet/pause:3.10      - our own static pause binary (scripts/pause.c)
#   docker.io/library/busybox:1.36     - /bin/busybox from Debian's busybox-static
#   docker.io/library/busybox:latest     (same image, second tag)
#
# Idempotent: an image whose names are all present in containerd is skipped,
# unless FORCE=1, or unless it was built by this script from inputs that have
# changed since (stamp files under $WORK_ROOT/stamps).
#
# Requires: umoci, gcc + libc6-dev (static), busybox-static, ctr, a running
# containerd on /run/containerd/containerd.sock. Called by scripts/setup.sh.
set -euo pipefail

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
FORCE="${FORCE:-0}"
NS="k8s.io"
WORK_ROOT="${RKUBELET_SETUP_DIR:-/var/lib/rkubelet-setup}"
WORK="$WORK_ROOT/images"
STAMPS="$WORK_ROOT/stamps"
BUSYBOX_BIN="/bin/busybox"
PAUSE_SRC="$SCRIPT_DIR/pause.c"

PAUSE_BASE="localhost/rkubelet/pause"
PAUSE_TAG="3.10"
BUSYBOX_BASE="docker.io/library/busybox"
BUSYBOX_TAG="1.36"
BUSYBOX_EXTRA_TAGS=("latest")

DEFAULT_PATH="/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

log() { printf '[build-images] %s\n' "$*"; }
die() { printf '[build-images] ERROR: %s\n' "$*" >&2; exit 1; }

[[ $EUID -eq 0 ]] || die "must be run as root"
for tool in umoci gcc ctr tar sha256sum; do
    command -v "$tool" >/dev/null 2>&1 || die "missing required tool: $tool (run scripts/setup.sh)"
done
[[ -x $BUSYBOX_BIN ]] || die "$BUSYBOX_BIN not found (apt-get install busybox-static)"
[[ -f $PAUSE_SRC ]] || die "$PAUSE_SRC not found"

# Map the Debian architecture to the OCI/Go architecture name.
oci_arch() {
    local deb
    deb="$(dpkg --print-architecture)"
    case "$deb" in
        amd64) echo amd64 ;;
        arm64) echo arm64 ;;
        armhf | armel) echo arm ;;
        i386) echo 386 ;;
        ppc64el) echo ppc64le ;;
        s390x) echo s390x ;;
        riscv64) echo riscv64 ;;
        mips64el) echo mips64le ;;
        *) die "unsupported dpkg architecture: $deb" ;;
    esac
}
ARCH="$(oci_arch)"

# All image names currently in containerd's k8s.io namespace (one per line).
# Captured into a variable: `ctr ... | grep -q` breaks under pipefail.
list_images() {
    ctr -n "$NS" images ls -q
}

image_present() { # NAME...
    local have name
    have="$(list_images)"
    for name in "$@"; do
        grep -qxF -- "$name" <<<"$have" || return 1
    done
}

# Stamp: checksum of everything that determines an image's content.
inputs_sum() { # KIND
    case "$1" in
        # Contents only: the same inputs from another checkout path match.
        pause) cat "$PAUSE_SRC" "${BASH_SOURCE[0]}" | sha256sum | cut -d' ' -f1 ;;
        busybox) cat "$BUSYBOX_BIN" "${BASH_SOURCE[0]}" | sha256sum | cut -d' ' -f1 ;;
    esac
}

# Decide whether to (re)build. Returns 0 = build, 1 = skip.
need_build() { # KIND NAME...
    local kind="$1"
    shift
    if [[ $FORCE == 1 ]]; then
        log "$kind: FORCE=1, rebuilding"
        return 0
    fi
    if ! image_present "$@"; then
        log "$kind: not present in containerd ($NS), building"
        return 0
    fi
    local stamp="$STAMPS/$kind.sha256"
    if [[ -f $stamp && "$(cat "$stamp")" != "$(inputs_sum "$kind")" ]]; then
        log "$kind: present, but its inputs changed since it was built; rebuilding"
        return 0
    fi
    log "$kind: already present ($*), skipping"
    return 1
}

in_list() { # NEEDLE ITEM...
    local needle="$1" x
    shift
    for x in "$@"; do [[ $x == "$needle" ]] && return 0; done
    return 1
}

# On a rebuild, drop the existing refs first so the import is a fresh
# ImageCreate for the CRI plugin (like the first import): re-importing over an
# existing name only sends ImageUpdate, and the CRI plugin then keeps the old
# "sha256:<old image id>" ref as a dangling, untagged image in ListImages.
# Removed: our NAMEs, plus the "sha256:<id>" refs pointing to the same manifests.
remove_old_refs() { # NAME...
    local table digests="" name d ref
    table="$(ctr -n "$NS" images ls)"
    for name in "$@"; do
        d="$(awk -v n="$name" '$1 == n {print $3}' <<<"$table")"
        if [[ -n $d ]]; then digests+=" $d "; fi
    done
    [[ -n $digests ]] || return 0
    while read -r ref _ d _; do
        [[ $digests == *" $d "* ]] || continue
        if [[ $ref == sha256:* ]] || in_list "$ref" "$@"; then
            log "removing old ref $ref"
            ctr -n "$NS" images rm "$ref" >/dev/null
        fi
    done < <(tail -n +2 <<<"$table")
}

# build_oci KIND BASE TAG POPULATE_FN [EXTRA_TAG...] -- [umoci config args...]
build_oci() {
    local kind="$1" base="$2" tag="$3" populate="$4"
    shift 4
    local extra_tags=()
    while [[ $# -gt 0 && $1 != "--" ]]; do
        extra_tags+=("$1")
        shift
    done
    [[ ${1:-} == "--" ]] && shift

    local dir="$WORK/$kind"
    local layout="$dir/layout" bundle="$dir/bundle" archive="$dir/image.tar"
    rm -rf "$dir"
    mkdir -p "$dir"

    umoci init --layout "$layout"
    umoci new --image "$layout:$tag"
    umoci unpack --image "$layout:$tag" "$bundle" >/dev/null
    "$populate" "$bundle/rootfs"
    umoci repack --image "$layout:$tag" \
        --history.created_by "rkubelet scripts/build-images.sh ($kind)" "$bundle"
    umoci config --image "$layout:$tag" --os linux --architecture "$ARCH" \
        --history.created_by "rkubelet scripts/build-images.sh ($kind config)" "$@"
    local t
    for t in "${extra_tags[@]}"; do
        umoci tag --image "$layout:$tag" "$t"
    done
    umoci gc --layout "$layout"

    tar -C "$layout" -cf "$archive" .

    local want=("$base:$tag")
    for t in "${extra_tags[@]}"; do want+=("$base:$t"); done
    remove_old_refs "${want[@]}"

    log "$kind: importing $archive as $base:{$tag${extra_tags[*]:+ ${extra_tags[*]}}}"
    # --base-name (not --index-name): the ref-name annotation of each manifest in
    # the layout's index.json ("1.36", "latest") becomes the tag.
    ctr -n "$NS" images import --base-name "$base" "$archive"

    image_present "${want[@]}" || die "$kind: import did not produce ${want[*]}; have: $(list_images | tr '\n' ' ')"
    # The config's os/architecture must match this host, or CRI will not use it.
    local table line
    table="$(ctr -n "$NS" images ls)"
    for t in "${want[@]}"; do
        line="$(awk -v n="$t" '$1 == n' <<<"$table")"
        [[ $line == *"linux/$ARCH"* ]] || die "$kind: $t does not report platform linux/$ARCH: $line"
    done

    mkdir -p "$STAMPS"
    inputs_sum "$kind" >"$STAMPS/$kind.sha256"
    rm -rf "$bundle"
    log "$kind: imported ${want[*]}"
}

# ---------------------------------------------------------------- pause ----
populate_pause() { # ROOTFS
    install -m 0755 "$WORK/pause-bin/pause" "$1/pause"
}

build_pause() {
    mkdir -p "$WORK/pause-bin"
    gcc -static -O2 -Wall -o "$WORK/pause-bin/pause" "$PAUSE_SRC"
    strip "$WORK/pause-bin/pause" 2>/dev/null || true
    # Self-test: must print its version, and exit 0 on SIGTERM.
    "$WORK/pause-bin/pause" --version >/dev/null || die "pause --version failed"
    "$WORK/pause-bin/pause" 2>/dev/null &
    local pid=$! rc=0
    sleep 0.2
    kill -TERM "$pid"
    wait "$pid" || rc=$?
    [[ $rc -eq 0 ]] || die "pause did not exit 0 on SIGTERM (rc=$rc)"

    build_oci pause "$PAUSE_BASE" "$PAUSE_TAG" populate_pause -- \
        --config.entrypoint /pause \
        --config.env "PATH=$DEFAULT_PATH"
}

# -------------------------------------------------------------- busybox ----
populate_busybox() { # ROOTFS
    local root="$1" list p name dir
    mkdir -p "$root"/{bin,sbin,usr/bin,usr/sbin,etc,root,home,proc,sys,dev,var/www}
    install -d -m 1777 "$root/tmp"
    install -m 0755 "$BUSYBOX_BIN" "$root/bin/busybox"

    # Every applet gets a link in /bin (like the official busybox image) and,
    # if busybox's canonical location differs (usr/bin/env, sbin/ip, ...),
    # a link there too.
    list="$("$BUSYBOX_BIN" --list-full)"
    while IFS= read -r p; do
        [[ -n $p ]] || continue
        name="${p##*/}"
        [[ $name == busybox || $name == linuxrc || $p == "$name" ]] && continue
        [[ -e $root/bin/$name || -L $root/bin/$name ]] || ln -s /bin/busybox "$root/bin/$name"
        dir="${p%/*}"
        if [[ $dir != bin ]]; then
            mkdir -p "$root/$dir"
            [[ -e $root/$p || -L $root/$p ]] || ln -s /bin/busybox "$root/$p"
        fi
    done <<<"$list"
    [[ -L $root/bin/sh ]] || die "busybox rootfs has no /bin/sh"

    cat >"$root/etc/passwd" <<'EOF'
root:x:0:0:root:/root:/bin/sh
nobody:x:65534:65534:nobody:/home:/bin/false
EOF
    cat >"$root/etc/group" <<'EOF'
root:x:0:
nobody:x:65534:
EOF
    chmod 0644 "$root/etc/passwd" "$root/etc/group"
    chmod 0700 "$root/root"
}

build_busybox() {
    build_oci busybox "$BUSYBOX_BASE" "$BUSYBOX_TAG" populate_busybox "${BUSYBOX_EXTRA_TAGS[@]}" -- \
        --config.cmd sh \
        --config.env "PATH=$DEFAULT_PATH"
}

# ----------------------------------------------------------------- main ----
mkdir -p "$WORK"
ctr version >/dev/null 2>&1 || die "containerd is not answering on /run/containerd/containerd.sock"

if need_build pause "$PAUSE_BASE:$PAUSE_TAG"; then
    build_pause
fi

busybox_names=("$BUSYBOX_BASE:$BUSYBOX_TAG")
for t in "${BUSYBOX_EXTRA_TAGS[@]}"; do busybox_names+=("$BUSYBOX_BASE:$t"); done
if need_build busybox "${busybox_names[@]}"; then
    build_busybox
fi
