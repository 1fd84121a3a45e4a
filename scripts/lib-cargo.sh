# Sourced by the scripts that build: puts a rustup-installed cargo on PATH
# when the caller's environment lacks it (sudo, CI, a login shell).
if ! command -v cargo >/dev/null 2>&1 && [[ -f ${HOME:-/root}/.cargo/env ]]; then
    # shellcheck disable=SC1091
    . "${HOME:-/root}/.cargo/env"
fi
command -v cargo >/dev/null 2>&1 || { echo "cargo not found: install Rust with rustup first" >&2; exit 1; }
