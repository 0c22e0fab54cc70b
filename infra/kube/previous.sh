#!/usr/bin/env bash
# The previous release of a service, for the upgrade scenario of `make e2e-kube`: its chart
# and its image, both from the commit UPGRADING.md records for it (pin_testkit.releases).
#
#   infra/kube/previous.sh <service> <dir>   # the chart into <dir>/chart; prints "<commit> <image>"
#
# The image is that commit's workspace built by today's Dockerfile, as images.sh builds
# (the local bases, the build's CA secret, the revision and version labels), and tagged
# <service>:release-<commit12>, so a second run builds nothing. The release's own Dockerfile
# cannot build here: it names the public python image (its pip, its `# syntax=` frontend)
# and predates the CA secret that lets uv reach PyPI where TLS is intercepted.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$HERE/../checks/tools.sh"
cd "$ROOT"

service="${1:?usage: $0 <service> <dir>}"
dest="${2:?usage: $0 <service> <dir>}"
commit="$("$ROOT/.venv/bin/python" -c '
import sys
from pathlib import Path
from pin_testkit.releases import ServiceRelease, previous_release
found = previous_release(ServiceRelease.of(Path("services") / sys.argv[1]))
if found is None:
    sys.exit(f"{sys.argv[1]}: no previous release in its UPGRADING.md")
print(found.commit)' "$service")"
image="$service:release-${commit:0:12}"

mkdir -p "$dest"
rm -rf "$dest/chart"
git archive "$commit" "infra/helm/$service" | tar -x -C "$dest"
mv "$dest/infra/helm/$service" "$dest/chart" && rm -rf "$dest/infra"

DOCKER="$("$ROOT/infra/docker/engine.sh" docker)"
if ! "$DOCKER" image inspect "$image" >/dev/null 2>&1; then
    tree="$(mktemp -d)"
    git archive "$commit" | tar -x -C "$tree"
    version="$(sed -n 's/^version = "\(.*\)"$/\1/p' "$tree/services/$service/pyproject.toml" | head -1)"
    args=(--build-arg "PYTHON_IMAGE=pin-base/python:3.11" --build-arg "UV_IMAGE=pin-base/uv:0.13.9"
          --build-arg "SOURCE=file://$ROOT" --build-arg "REVISION=$commit" --build-arg "VERSION=$version")
    ca="${PIN_BUILD_CA_FILE-/etc/ssl/certs/ca-certificates.crt}"
    if [[ -n "$ca" && -f "$ca" ]]; then args+=(--secret "id=ca-certificates,src=$ca"); fi
    log "previous: building $image ($version) from $commit..."
    DOCKER_BUILDKIT=1 nice -n 19 "$DOCKER" build --network host --quiet "${args[@]}" \
        -f "$ROOT/infra/docker/Dockerfile" --target "$service" -t "$image" "$tree" >/dev/null
    rm -rf "$tree"
fi
printf '%s %s\n' "$commit" "$image"
