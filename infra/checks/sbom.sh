#!/usr/bin/env bash
# The images' SBOMs (CycloneDX 1.5 from uv.lock) written to build/sbom/ and checked against
# the lock: infra/checks/sbom.py says how.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
UV="${UV:-.tools/uv/bin/uv}"
"$UV" run --frozen --all-packages python infra/checks/sbom.py "$@"
