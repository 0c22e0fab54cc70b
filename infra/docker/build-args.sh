#!/usr/bin/env bash
# The facts an image of SERVICE is built with, as `docker build` arguments, one a line:
#
#   docker build -f infra/docker/Dockerfile --target identity-fanout \
#     $(infra/docker/build-args.sh identity-fanout) -t identity-fanout:$(git rev-parse --short HEAD) .
#
#   SOURCE    the repository: git's `origin`, else file://<checkout>  (org.opencontainers.image.source)
#   REVISION  git's HEAD, with "-dirty" when a tracked file has uncommitted changes
#             (org.opencontainers.image.revision, and PIN_BUILD_REVISION: `<service> --version`,
#             the <service>_build_info metric, the spans' resource)
#   VERSION   the service's package version, `uv version --package SERVICE`
#             (org.opencontainers.image.version)
#
# A build without them says `revision unknown`: the Dockerfile's defaults. infra/docker/images.sh
# builds with them; so must any other builder (a CI pipeline, by hand: infra/README.md "Deploy").
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../checks/tools.sh"
cd "$ROOT"

[[ $# -eq 1 && -n "$1" && -d "services/$1" ]] || { log "usage: $0 SERVICE (a directory of services/)"; exit 2; }
revision="$(git rev-parse HEAD)"
[[ -z "$(git status --porcelain --untracked-files=no -- . 2>/dev/null)" ]] || revision+="-dirty"
source="$(git remote get-url origin 2>/dev/null || echo "file://$ROOT")"
version="$("$UV" version --package "$1" --short --frozen)"
printf -- '--build-arg=%s\n' "SOURCE=$source" "REVISION=$revision" "VERSION=$version"
