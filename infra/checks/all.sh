#!/usr/bin/env bash
# Every infra check, as `make test` runs them: images, their SBOMs, Helm charts, monitoring rules, the
# pin-contracts release gate. Tools are installed into the per-user tools cache on the first run.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"
for check in images sbom helm compose monitoring asyncapi contracts-release; do
    echo "== infra/checks/$check.sh"
    start=$SECONDS
    "./$check.sh"
    echo "-- $check: $((SECONDS - start)) s"
done
