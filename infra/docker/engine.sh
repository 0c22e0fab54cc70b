#!/usr/bin/env bash
# The Docker engine the images, the compose stack and the testcontainers run on, on a Linux
# machine with nothing but Debian's package archive and the Go module proxy:
#
#   infra/docker/engine.sh up       # idempotent: install, build, start, wait
#   infra/docker/engine.sh down     # remove this project's containers and volumes
#   infra/docker/engine.sh docker   # print the docker client the builds use
#
# `up` installs Debian's docker.io where dockerd is missing (root, or sudo), builds the
# Compose CLI plugin from the Go module proxy where `docker compose` is missing (the binary is
# cached per user with the other tools, infra/checks/tools.sh, so a second machine setup is
# instant), and starts dockerd where none answers: without a bridge and without iptables
# rules (`--bridge=none --iptables=false`), so every container runs with host networking,
# the only kind these machines allow. The engine then waits for `docker info` with a deadline
# (PIN_ENGINE_TIMEOUT, 60 s). An engine that already answers is used as it is.
#
# `down` removes what this project started on the engine: the compose stack (project
# pin-stack, its volumes) and any container labelled pin-platform (testcontainers' ones), and
# stops dockerd only when `up` started it (PIN_ENGINE_STOP=1 in the environment).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../checks/tools.sh"

COMPOSE_VERSION="v5.6.0"
COMPOSE_MODULE="github.com/docker/compose/v5"
ENGINE_TIMEOUT="${PIN_ENGINE_TIMEOUT:-60}"
ENGINE_LOG="${PIN_ENGINE_LOG:-/var/log/pin-dockerd.log}"
ENGINE_PIDFILE="${PIN_ENGINE_PIDFILE:-/run/pin-dockerd.pid}"
PROJECT_LABEL="pin-platform"

as_root() {
    if [[ $EUID == 0 ]]; then "$@"
    elif command -v sudo >/dev/null; then sudo -n "$@"
    else log "engine: '$*' needs root (or sudo)"; return 1
    fi
}

# The client the builds use: Debian's (20.10, BuildKit built in) where installed; a newer
# client without the buildx plugin refuses DOCKER_BUILDKIT=1.
docker_client() {
    if [[ -x /usr/bin/docker ]]; then printf '%s\n' /usr/bin/docker
    else command -v docker
    fi
}

engine_answers() { "$(docker_client)" info >/dev/null 2>&1; }

ensure_docker_package() {
    if command -v dockerd >/dev/null && [[ -x /usr/bin/docker ]]; then return; fi
    log "engine: installing Debian's docker.io..."
    if ! as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q docker.io >&2; then
        as_root apt-get update -qq >&2
        as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q docker.io >&2
    fi
}

# `go install` refuses the module (its go.mod has exclude directives): download it, build
# ./cmd inside it.
ensure_compose_binary() {
    local dir="$TOOLS/go/docker-compose-$COMPOSE_VERSION"
    if [[ ! -x "$dir/docker-compose" ]]; then
        command -v go >/dev/null || { log "go is needed to build Compose"; return 1; }
        log "engine: building Compose $COMPOSE_VERSION from the Go module proxy (once, ~100 s)..."
        local module
        module="$(GOTOOLCHAIN=local GOFLAGS=-mod=mod go mod download -json \
            "$COMPOSE_MODULE@$COMPOSE_VERSION" | python3 -c 'import json, sys; print(json.load(sys.stdin)["Dir"])')"
        mkdir -p "$dir"
        (cd "$module" && nice -n 19 env CGO_ENABLED=0 GOTOOLCHAIN=local GOFLAGS=-mod=mod \
            go build -trimpath -ldflags "-w -X $COMPOSE_MODULE/internal.Version=$COMPOSE_VERSION" \
            -o "$dir/docker-compose.part" ./cmd) >&2
        mv "$dir/docker-compose.part" "$dir/docker-compose"
    fi
    printf '%s\n' "$dir/docker-compose"
}

ensure_compose() {
    local binary plugins
    if "$(docker_client)" compose version >/dev/null 2>&1; then return; fi
    binary="$(ensure_compose_binary)"
    if [[ $EUID == 0 ]]; then plugins=/usr/local/lib/docker/cli-plugins
    else plugins="$HOME/.docker/cli-plugins"
    fi
    mkdir -p "$plugins"
    install -m 0755 "$binary" "$plugins/docker-compose"
    log "engine: Compose plugin installed in $plugins"
}

start_engine() {
    if engine_answers; then return; fi
    log "engine: starting dockerd --bridge=none --iptables=false (log: $ENGINE_LOG)..."
    as_root sh -c "nohup dockerd --bridge=none --iptables=false >>'$ENGINE_LOG' 2>&1 & echo \$! >'$ENGINE_PIDFILE'"
    local deadline=$((SECONDS + ENGINE_TIMEOUT))
    until engine_answers; do
        if ((SECONDS >= deadline)); then
            log "engine: dockerd did not answer within ${ENGINE_TIMEOUT}s; last lines of $ENGINE_LOG:"
            tail -20 "$ENGINE_LOG" >&2 || true
            return 1
        fi
        sleep 0.5
    done
}

up() {
    local started=$SECONDS
    ensure_docker_package
    ensure_compose
    start_engine
    log "engine: ready ($("$(docker_client)" info --format '{{.ServerVersion}}'), compose $("$(docker_client)" compose version --short)) in $((SECONDS - started))s"
}

down() {
    engine_answers || { log "engine: not running, nothing to remove"; return 0; }
    local docker ids
    docker="$(docker_client)"
    "$docker" compose -p pin-stack down -v --remove-orphans >/dev/null 2>&1 || true
    ids="$("$docker" ps -aq --filter "label=$PROJECT_LABEL")"
    if [[ -n "$ids" ]]; then
        # shellcheck disable=SC2086 # one id per word
        "$docker" rm -f -v $ids >/dev/null
    fi
    log "engine: project containers removed"
    if [[ "${PIN_ENGINE_STOP:-0}" == 1 && -f "$ENGINE_PIDFILE" ]]; then
        as_root sh -c "kill \$(cat '$ENGINE_PIDFILE') && rm -f '$ENGINE_PIDFILE'"
        log "engine: dockerd stopped"
    fi
}

case "${1:-up}" in
    up) up ;;
    down) down ;;
    docker) docker_client ;;
    compose-binary) ensure_compose_binary ;;
    *) log "usage: $0 up|down|docker|compose-binary"; exit 2 ;;
esac
