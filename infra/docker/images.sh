#!/usr/bin/env bash
# Every image the project runs, built on this machine's engine (infra/docker/engine.sh up):
#
#   infra/docker/images.sh bases      # the bases, from the package registries alone
#   infra/docker/images.sh services   # identity-fanout and rewards-membership, labelled
#   infra/docker/images.sh all        # both (what `make images` runs)
#
# Bases, for machines that reach no public image registry (PIN_IMAGE_BASES=local, the
# default here; `public` builds the services on python:3.11-slim-bookworm and
# ghcr.io/astral-sh/uv instead and builds no base):
#   pin-base/debian:bookworm     debootstrap --variant=minbase of Debian bookworm
#   pin-base/python:3.11         Debian's python3 (3.11) on it
#   pin-base/uv:<version>        uv's binary from its PyPI wheel (the version of the Dockerfile)
#   pin-base/postgres:15         Debian's postgresql-15, the official image's variables
#   pin-base/kafka:4.2.0         Debian's Java 17 and the Maven Central jars of the local broker
# Each is built only when missing (PIN_IMAGE_REBUILD=1 rebuilds); Docker's layer cache makes a
# second `services` build take seconds.
#
# Services: tagged <service>:<short revision> and <service>:local, with the OCI labels and
# `--version` from SOURCE / REVISION / VERSION build arguments, as infra/docker/build-args.sh
# computes them (REVISION carries "-dirty" when the working tree has uncommitted changes).
#
# Extra CA: where TLS is intercepted (as on these machines, or a corporate proxy), the build
# steps that download (uv sync) must trust the interceptor. PIN_BUILD_CA_FILE names a PEM
# bundle given to the build as a BuildKit secret (mounted for that one RUN, never written into
# a layer); by default the host's own bundle, /etc/ssl/certs/ca-certificates.crt, when it
# exists. PIN_BUILD_CA_FILE= (empty) passes none.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$HERE/../checks/tools.sh"
cd "$ROOT"

DOCKER="$("$HERE/engine.sh" docker)"
export DOCKER_BUILDKIT=1
BASES="${PIN_IMAGE_BASES:-local}"
DOCKERFILE=infra/docker/Dockerfile
UV_BASE_VERSION="$(sed -n 's/^ARG UV_IMAGE=.*:\([0-9][^ ]*\)$/\1/p' "$DOCKERFILE")"
KAFKA_VERSION="$(sed -n 's#.*<kafka.version>\(.*\)</kafka.version>.*#\1#p' infra/local/kafka/pom.xml)"
DEBIAN_IMAGE=pin-base/debian:bookworm
PYTHON_BASE=pin-base/python:3.11
UV_BASE="pin-base/uv:$UV_BASE_VERSION"
POSTGRES_BASE=pin-base/postgres:15
KAFKA_BASE="pin-base/kafka:$KAFKA_VERSION"
DEBIAN_MIRROR="${PIN_DEBIAN_MIRROR:-http://deb.debian.org/debian}"

as_root() {
    if [[ $EUID == 0 ]]; then "$@"; else sudo -n "$@"; fi
}

have_image() {
    [[ "${PIN_IMAGE_REBUILD:-0}" != 1 ]] && "$DOCKER" image inspect "$1" >/dev/null 2>&1
}

timed() {
    local what="$1" started=$SECONDS
    shift
    "$@"
    log "images: $what in $((SECONDS - started))s"
}

build_base() {
    local tag="$1" file="$2" context="$3"
    nice -n 19 "$DOCKER" build --network host --quiet --build-arg "DEBIAN_IMAGE=$DEBIAN_IMAGE" \
        -f "$file" -t "$tag" "$context" >/dev/null
}

debian_base() {
    command -v debootstrap >/dev/null || as_root env DEBIAN_FRONTEND=noninteractive \
        apt-get install -y -q debootstrap >&2
    local rootfs
    rootfs="$(mktemp -d)/rootfs"
    as_root nice -n 19 debootstrap --variant=minbase --include=ca-certificates bookworm \
        "$rootfs" "$DEBIAN_MIRROR" >/dev/null
    as_root sh -c "cat >'$rootfs/etc/apt/sources.list' <<EOF
deb $DEBIAN_MIRROR bookworm main
deb $DEBIAN_MIRROR bookworm-updates main
deb ${DEBIAN_MIRROR%/debian}/debian-security bookworm-security main
EOF
rm -rf '$rootfs'/var/cache/apt/archives/*.deb '$rootfs'/var/lib/apt/lists/*
printf 'APT::Install-Recommends \"false\";\n' >'$rootfs/etc/apt/apt.conf.d/90pin'"
    as_root tar -C "$rootfs" -c . | "$DOCKER" import \
        --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        --change 'CMD ["bash"]' - "$DEBIAN_IMAGE" >/dev/null
    as_root rm -rf "$(dirname "$rootfs")"
}

uv_base() {
    local context wheels
    context="$(mktemp -d)"
    wheels="$TOOLS/wheels/uv-$UV_BASE_VERSION"
    if ! compgen -G "$wheels/uv-$UV_BASE_VERSION-*.whl" >/dev/null; then
        mkdir -p "$wheels"
        # pip of the project's uv installer venv (Makefile), or any python3 -m pip.
        local pip=("$ROOT/.tools/uv/bin/pip")
        [[ -x "${pip[0]}" ]] || pip=(python3 -m pip)
        "${pip[@]}" download --quiet --no-deps --only-binary=:all: -d "$wheels" "uv==$UV_BASE_VERSION" >&2
    fi
    python3 - "$wheels" "$context/uv" <<'EOF'
import glob, sys, zipfile
wheel = sorted(glob.glob(f"{sys.argv[1]}/uv-*.whl"))[0]
with zipfile.ZipFile(wheel) as z:
    name = next(n for n in z.namelist() if n.endswith(".data/scripts/uv"))
    with open(sys.argv[2], "wb") as out:
        out.write(z.read(name))
EOF
    chmod 0755 "$context/uv"
    build_base "$UV_BASE" "$HERE/bases/uv.Dockerfile" "$context"
    rm -rf "$context"
}

# The broker's jars as `pin-local up` resolves them, plus kafka-tools (topics, health check).
kafka_base() {
    local context pom
    context="$(mktemp -d)"
    cp -r "$HERE/bases/kafka-bin" "$HERE/bases/kafka-log4j2.xml" "$context/"
    pom="$context/pom.xml"
    sed 's#^  </dependencies>#    <dependency><groupId>org.apache.kafka</groupId><artifactId>kafka-tools</artifactId><version>${kafka.version}</version></dependency>\n  </dependencies>#' \
        infra/local/kafka/pom.xml >"$pom"
    grep -q '<artifactId>kafka-tools</artifactId>' "$pom" || { log "images: cannot add kafka-tools to the pom"; return 1; }
    mvn -B -q -Dstyle.color=never -f "$pom" -DincludeScope=runtime dependency:copy-dependencies \
        -DoutputDirectory="$context/libs" >&2
    build_base "$KAFKA_BASE" "$HERE/bases/kafka.Dockerfile" "$context"
    rm -rf "$context"
}

bases() {
    have_image "$DEBIAN_IMAGE" || timed "$DEBIAN_IMAGE (debootstrap)" debian_base
    have_image "$PYTHON_BASE" || timed "$PYTHON_BASE" build_base "$PYTHON_BASE" "$HERE/bases/python.Dockerfile" "$HERE/bases"
    have_image "$UV_BASE" || timed "$UV_BASE" uv_base
    have_image "$POSTGRES_BASE" || timed "$POSTGRES_BASE" build_base "$POSTGRES_BASE" "$HERE/bases/postgres.Dockerfile" "$HERE/bases"
    have_image "$KAFKA_BASE" || timed "$KAFKA_BASE" kafka_base
}

services() {
    local revision ca facts args=()
    if [[ "$BASES" == local ]]; then
        args+=(--build-arg "PYTHON_IMAGE=$PYTHON_BASE" --build-arg "UV_IMAGE=$UV_BASE")
    fi
    ca="${PIN_BUILD_CA_FILE-/etc/ssl/certs/ca-certificates.crt}"
    if [[ -n "$ca" && -f "$ca" ]]; then args+=(--secret "id=ca-certificates,src=$ca"); fi
    for svc in services/*/; do
        svc="$(basename "$svc")"
        # SOURCE, REVISION and VERSION, as every build of the images passes them.
        mapfile -t facts < <(UV="$UV" "$HERE/build-args.sh" "$svc")
        [[ ${#facts[@]} == 3 ]] || { log "images: build-args.sh $svc failed"; return 1; }
        revision="${facts[1]#--build-arg=REVISION=}"
        timed "$svc:local" nice -n 19 "$DOCKER" build --network host --quiet "${args[@]}" \
            "${facts[@]}" -f "$DOCKERFILE" --target "$svc" \
            -t "$svc:local" -t "$svc:${revision:0:12}" . >/dev/null
    done
}

case "${1:-all}" in
    bases) [[ "$BASES" != local ]] || bases ;;
    services) services ;;
    all) [[ "$BASES" != local ]] || bases; services ;;
    *) log "usage: $0 bases|services|all"; exit 2 ;;
esac
