#!/usr/bin/env bash
# The images' SBOMs (CycloneDX 1.5 from uv.lock) written to build/sbom/ (or the directory
# given, `sbom.sh [OUT_DIR]`) and checked against the lock: infra/checks/sbom.py says how.
set -euo pipefail
# OUT_DIR (optional) is relative to where the script is run from, not to the repository root
# it changes to.
if [[ $# -gt 0 && "$1" != /* ]]; then set -- "$PWD/$1" "${@:2}"; fi
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
UV="${UV:-.tools/uv/bin/uv}"
"$UV" run --frozen --all-packages python infra/checks/sbom.py "$@"
