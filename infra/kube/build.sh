#!/usr/bin/env bash
# The components of the test cluster (`make e2e-kube`), built from the package registries
# alone and cached per user beside the other tools (`~/.cache/pin-platform/tools/kube`, or
# PIN_TOOLS_DIR): each component in a directory named by its version and a digest of the
# function that builds it, so a changed recipe builds anew and an unchanged one is reused by
# every checkout (the way infra/checks/tools.sh caches helm).
#
#   infra/kube/build.sh [all|kubernetes|debian|pause|coredns]   # builds what is missing, prints the dirs
#   source infra/kube/build.sh; kube_dir kubernetes               # the directory, built or not
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
TOOLS="${PIN_TOOLS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/pin-platform/tools}"

KUBERNETES_VERSION="v1.34.4"
# The staging modules (k8s.io/api, client-go, ...) are published as v0.<minor>.<patch>.
KUBERNETES_STAGING_VERSION="v0.34.4"
# Debian bookworm's: etcd 3.4, containerd 1.6, runc 1.1, the reference CNI plugins.
DEBIAN_PACKAGES=(etcd-server containerd runc containernetworking-plugins)
# The cluster DNS (the version kubeadm 1.34 deploys), with only the plugins this cluster's
# Corefile uses: the full set pulls every cloud SDK and doubles the build.
COREDNS_VERSION="v1.12.1"
COREDNS_PLUGINS=(errors health ready kubernetes cache loadbalance)

log() { printf '%s\n' "$*" >&2; }

# The directory of a component: its version and the digest of its build function.
kube_dir() {
    local name="$1" version
    case "$name" in
        kubernetes) version="$KUBERNETES_VERSION" ;;
        coredns) version="$COREDNS_VERSION" ;;
        debian) version="$(printf '%s\n' "${DEBIAN_PACKAGES[@]}" | sha256sum | cut -c1-8)" ;;
        *) log "unknown component $name"; return 2 ;;
    esac
    printf '%s/kube/%s-%s-%s\n' "$TOOLS" "$name" "$version" \
        "$(declare -f "_build_$name" | sha256sum | cut -c1-12)"
}

# The Go module's zip leaves out staging/, and its go.mod replaces every staging module with
# a path under it: drop each replace and require the published module of the same release.
# Without the version ldflags the server says v0.0.0 and helm refuses a chart's kubeVersion.
_build_kubernetes() {
    local out="$1" src tmp info
    command -v go >/dev/null || { log "go is needed to build Kubernetes"; return 1; }
    info="$(GOTOOLCHAIN=local GOFLAGS=-mod=mod go mod download -json "k8s.io/kubernetes@$KUBERNETES_VERSION")"
    src="$(python3 -c 'import json, sys; print(json.loads(sys.argv[1])["Dir"])' "$info")"
    tmp="$(mktemp -d)"
    cp -r "$src" "$tmp/kubernetes" && chmod -R u+w "$tmp/kubernetes"
    (
        cd "$tmp/kubernetes"
        local edits=() mod
        for mod in $(GOWORK=off go mod edit -json | python3 -c '
import json, sys
for r in json.load(sys.stdin).get("Replace") or []:
    if r["New"]["Path"].startswith("./staging/"):
        print(r["Old"]["Path"])'); do
            edits+=("-dropreplace=$mod" "-require=$mod@$KUBERNETES_STAGING_VERSION")
        done
        GOWORK=off go mod edit "${edits[@]}"
        local v="k8s.io/component-base/version" c="k8s.io/client-go/pkg/version" ldflags="-s -w" p
        local minor="${KUBERNETES_VERSION#v1.}"; minor="${minor%%.*}"
        for p in "$v" "$c"; do
            ldflags+=" -X $p.gitVersion=$KUBERNETES_VERSION -X $p.gitMajor=1 -X $p.gitMinor=$minor"
            ldflags+=" -X $p.gitTreeState=clean -X $p.buildDate=1970-01-01T00:00:00Z"
        done
        mkdir -p "$out.part"
        GOWORK=off GOFLAGS=-mod=mod CGO_ENABLED=0 GOTOOLCHAIN=local \
            go build -trimpath -ldflags "$ldflags" -o "$out.part/" \
            ./cmd/kube-apiserver ./cmd/kube-controller-manager ./cmd/kube-scheduler \
            ./cmd/kubelet ./cmd/kubectl >&2
        # The pause container's source is in the same module (build/pause/linux/pause.c).
        cp build/pause/linux/pause.c "$out.part/pause.c"
    )
    rm -rf "$tmp"
}

# plugin.cfg decides which plugins are compiled in (go generate writes the imports and the
# directive order from it); the order of the kept lines is the order CoreDNS runs them in.
_build_coredns() {
    local out="$1" src tmp info
    info="$(GOTOOLCHAIN=local GOFLAGS=-mod=mod go mod download -json "github.com/coredns/coredns@$COREDNS_VERSION")"
    src="$(python3 -c 'import json, sys; print(json.loads(sys.argv[1])["Dir"])' "$info")"
    tmp="$(mktemp -d)"
    cp -r "$src" "$tmp/coredns" && chmod -R u+w "$tmp/coredns"
    (
        cd "$tmp/coredns"
        local keep
        keep="$(printf '%s\n' "${COREDNS_PLUGINS[@]}" | paste -sd'|')"
        grep -E "^($keep):" plugin.cfg >plugin.cfg.new && mv plugin.cfg.new plugin.cfg
        export GOWORK=off GOFLAGS=-mod=mod CGO_ENABLED=0 GOTOOLCHAIN=local
        go run directives_generate.go >&2
        mkdir -p "$out.part"
        go build -trimpath -ldflags "-s -w" -o "$out.part/coredns" . >&2
    )
    rm -rf "$tmp"
}

# Debian's packages, unpacked (not installed: nothing of them runs outside the cluster).
_build_debian() {
    local out="$1" tmp deb
    tmp="$(mktemp -d)"
    if ! (cd "$tmp" && apt-get download "${DEBIAN_PACKAGES[@]}" >/dev/null 2>&1); then
        apt-get update -qq >&2
        (cd "$tmp" && apt-get download "${DEBIAN_PACKAGES[@]}" >&2)
    fi
    mkdir -p "$out.part"
    for deb in "$tmp"/*.deb; do dpkg-deb -x "$deb" "$out.part"; done
    (cd "$tmp" && ls ./*.deb) >"$out.part/PACKAGES"
    rm -rf "$tmp"
}

ensure() {
    local name="$1" dir
    dir="$(kube_dir "$name")"
    if [[ ! -f "$dir/.done" ]]; then
        log "building $name into $dir (once)..."
        rm -rf "$dir" "$dir.part"
        mkdir -p "$(dirname "$dir")"
        local start=$SECONDS
        "_build_$name" "$dir"
        touch "$dir.part/.done" && mv "$dir.part" "$dir"
        log "built $name in $((SECONDS - start)) s"
    fi
    printf '%s\n' "$dir"
}

if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
    case "${1:-all}" in
        all) ensure kubernetes; ensure debian; ensure coredns ;;
        kubernetes|debian|coredns) ensure "$1" ;;
        *) log "usage: $0 [all|kubernetes|debian|coredns]"; exit 2 ;;
    esac
fi
