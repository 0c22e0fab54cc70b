#!/usr/bin/env bash
# The outbox protocol's model checks (README.md beside this file), on a machine with nothing
# but Debian's package archive:
#
#   services/identity-fanout/model/run.sh                 # install what is missing, every check
#   services/identity-fanout/model/run.sh --quick         # the checks that decide (the test's)
#   services/identity-fanout/model/run.sh --install-only  # spin and gcc, nothing else
#
# Installs Debian's `spin` (6.5.2 on bookworm) and `gcc` where missing (root, or sudo), then
# runs check.py with the machine's python3: its arguments are check.py's.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
SPIN_VERSION="6.5.2"

log() { printf '%s\n' "$*" >&2; }

as_root() {
    if [[ $EUID == 0 ]]; then "$@"
    elif command -v sudo >/dev/null; then sudo -n "$@"
    else log "model: '$*' needs root (or sudo)"; return 1
    fi
}

ensure_packages() {
    local missing=()
    command -v spin >/dev/null || missing+=(spin)
    command -v gcc >/dev/null || missing+=(gcc)
    if ((${#missing[@]} == 0)); then return; fi
    log "model: installing Debian's ${missing[*]}..."
    if ! as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}" >&2; then
        as_root apt-get update -qq >&2
        as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}" >&2
    fi
}

ensure_packages
if ! spin -V | grep -q "Spin Version $SPIN_VERSION"; then
    log "model: $(spin -V) is not the $SPIN_VERSION the results in README.md were taken with"
fi
if [[ "${1:-}" == "--install-only" ]]; then exit 0; fi
exec python3 "$HERE/check.py" "$@"
