#!/usr/bin/env bash
# The service images without a Docker engine: hadolint (plus the rules it cannot see through
# build arguments), then each Dockerfile's install step (`uv sync --package <svc> --frozen
# --no-dev --no-editable`) in a clean environment from the .dockerignore'd context, whose
# console script must answer --help for every command.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/tools.sh"
cd "$ROOT"

HADOLINT="$(ensure_hadolint)"
DOCKERFILES=(services/*/Dockerfile)
"$HADOLINT" --config infra/checks/hadolint.yaml "${DOCKERFILES[@]}"

status=0
for f in "${DOCKERFILES[@]}"; do
    svc="$(basename "$(dirname "$f")")"
    fail() { echo "$f: $*" >&2; status=1; }
    # The base images are build arguments, which hadolint does not resolve: pinned, never latest.
    grep -Eq '^ARG [A-Z_]+_IMAGE=[^ ]+:[0-9][^ ]*$' "$f" || fail "base images must be ARGs with a pinned version tag"
    ! grep -Eiq '(:latest\b|^ADD +https?://)' "$f" || fail "no :latest, no ADD of URLs"
    [[ "$(grep -E '^USER ' "$f" | tail -1)" =~ ^USER\ [1-9][0-9]*(:[1-9][0-9]*)?$ ]] || fail "the last USER must be a numeric non-root uid"
    grep -Eq "^ENTRYPOINT \[\"$svc\"\]$" "$f" || fail "ENTRYPOINT must be [\"$svc\"]"
    grep -Eq "uv sync --package $svc --frozen --no-dev --no-editable" "$f" || fail "install with uv sync --package $svc --frozen --no-dev --no-editable"
done
[[ $status == 0 ]] || exit 1
echo "hadolint and image rules: ${DOCKERFILES[*]} ok"

# The install steps, side by side (each mostly waits on bytecode compilation).
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
pids=()
for f in "${DOCKERFILES[@]}"; do
    svc="$(basename "$(dirname "$f")")"
    UV="$UV" python3 infra/checks/image_install.py "$f" "$WORK/$svc" >"$WORK/$svc.log" 2>&1 &
    pids+=("$!:$svc")
done
for entry in "${pids[@]}"; do
    if wait "${entry%%:*}"; then
        tail -1 "$WORK/${entry#*:}.log"
    else
        cat "$WORK/${entry#*:}.log" >&2
        status=1
    fi
done
exit "$status"
