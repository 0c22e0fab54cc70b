#!/usr/bin/env bash
# The service images without a Docker engine: hadolint (plus the rules it cannot see through
# build arguments), then each service target's install step (`uv sync --package <svc> --frozen
# --no-dev --no-editable`) in a clean environment from the .dockerignore'd context, whose
# console script must answer --help for every command.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/tools.sh"
cd "$ROOT"

HADOLINT="$(ensure_hadolint)"
# One Dockerfile, one target per service (named like the service and its console script).
DOCKERFILE=infra/docker/Dockerfile
SERVICES=()
for dir in services/*/; do SERVICES+=("$(basename "$dir")"); done
"$HADOLINT" --config infra/checks/hadolint.yaml "$DOCKERFILE"

status=0
f="$DOCKERFILE"
fail() { echo "$f: $*" >&2; status=1; }
# The base images are build arguments, which hadolint does not resolve: pinned, never latest.
grep -Eq '^ARG [A-Z_]+_IMAGE=[^ ]+:[0-9][^ ]*$' "$f" || fail "base images must be ARGs with a pinned version tag"
! grep -Eiq '(:latest\b|^ADD +https?://)' "$f" || fail "no :latest, no ADD of URLs"
[[ "$(grep -E '^USER ' "$f" | tail -1)" =~ ^USER\ [1-9][0-9]*(:[1-9][0-9]*)?$ ]] || fail "the last USER must be a numeric non-root uid"
# What an image is, for a registry and a scanner: the OCI labels, from the build's arguments.
for label in source revision version title; do
    grep -Eq "org\.opencontainers\.image\.$label=" "$f" || fail "OCI label org.opencontainers.image.$label missing"
done
grep -Eq 'PIN_BUILD_REVISION="\$\{REVISION\}"' "$f" || fail "the runtime must carry PIN_BUILD_REVISION from the REVISION build argument"
for svc in "${SERVICES[@]}"; do
    grep -Eq "^FROM runtime AS $svc$" "$f" || fail "target $svc must build FROM runtime (the non-root user)"
    grep -Eq "^ENTRYPOINT \[\"$svc\"\]$" "$f" || fail "ENTRYPOINT must be [\"$svc\"]"
    grep -Eq "uv sync --package $svc --frozen --no-dev --no-editable" "$f" || fail "install with uv sync --package $svc --frozen --no-dev --no-editable"
done
[[ $status == 0 ]] || exit 1
echo "hadolint and image rules: $DOCKERFILE (${SERVICES[*]}) ok"

# The install steps, side by side (each mostly waits on bytecode compilation).
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
pids=()
for svc in "${SERVICES[@]}"; do
    UV="$UV" python3 infra/checks/image_install.py "$DOCKERFILE" "$svc" "$WORK/$svc" >"$WORK/$svc.log" 2>&1 &
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
