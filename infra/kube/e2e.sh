#!/usr/bin/env bash
# `make e2e-kube`: both releases on a real Kubernetes (infra/kube/cluster.sh), installed from
# the charts as they ship, then tested:
#
#   1. the cluster up (built or reused), the project's images loaded;
#   2. the platform: the prometheus-operator CRDs, PostgreSQL with the Deploy guide's roles and
#      Kafka with the catalogue's topics (infra/kube/platform.yaml);
#   3. the namespace `pin` and its Secrets (one DSN per login, step 4 of the Deploy guide);
#   4. `helm install --wait` of the previous release of each chart (infra/kube/previous.sh), then
#      the upgrade to this checkout's with work in flight (tests-kube/test_0_upgrade.py), both
#      with infra/kube/values/<chart>.yaml; `helm test` of each;
#   5. the other scenarios on the pods (tests-kube/).
#
# The cluster is taken down at the end, whatever happened (PIN_KUBE_KEEP=1 keeps it, and a
# second run reuses it: `infra/kube/cluster.sh run kubectl get pods -A` looks at it).
# PIN_KUBE_TESTS narrows step 5 (pytest arguments, default: every other tests-kube/test_*.py).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$HERE/build.sh"
source "$ROOT/infra/checks/tools.sh"
cd "$ROOT"

KEEP="${PIN_KUBE_KEEP:-0}"
NAMESPACE=pin
REVISION="$(git rev-parse HEAD | cut -c1-12)"
PG=198.18.0.1:5432
PYTHON="$ROOT/.venv/bin/python"
STARTED=$SECONDS

kc() { "$HERE/cluster.sh" run kubectl "$@"; }
hm() { "$HERE/cluster.sh" run "$HELM" "$@"; }
phase() { log "e2e-kube: $* (+$((SECONDS - STARTED)) s)"; }

teardown() {
    local status=$?
    trap - EXIT INT TERM
    if ((status != 0)) && [[ -e /run/netns/pin-kube ]]; then
        kc get pods -A -o wide >&2 || true
    fi
    if [[ "$KEEP" != 1 ]]; then
        "$HERE/cluster.sh" down || status=1
    fi
    phase "done, status $status"
    exit "$status"
}
trap teardown EXIT
trap 'exit 130' INT TERM

HELM="$(ensure_helm)"
"$HERE/cluster.sh" up
phase "cluster up"
"$HERE/cluster.sh" images "identity-fanout:$REVISION" "rewards-membership:$REVISION" \
    pin-base/postgres:15 pin-base/kafka:4.2.0
phase "images loaded"

# The ServiceMonitor and PrometheusRule CRDs (the charts render both), from the
# prometheus-operator Go module infra/checks/tools.sh validates the charts against.
crds="$(GOTOOLCHAIN=local GOFLAGS=-mod=mod go mod download -json \
    "github.com/prometheus-operator/prometheus-operator@$PROMETHEUS_OPERATOR_VERSION" |
    python3 -c 'import json, sys; print(json.load(sys.stdin)["Dir"])')/example/prometheus-operator-crd"
kc apply --server-side -f "$crds/monitoring.coreos.com_servicemonitors.yaml" \
    -f "$crds/monitoring.coreos.com_prometheusrules.yaml" >/dev/null

# The platform: the roles SQL is the compose stack's (one text for both topologies).
kc create namespace platform --dry-run=client -o yaml | kc apply -f - >/dev/null
roles_sql="$(mktemp)"
"$PYTHON" -c 'import sys, yaml; print(yaml.safe_load(open(sys.argv[1]))["configs"]["pin-roles"]["content"])' \
    infra/compose/docker-compose.yml >"$roles_sql"
kc -n platform create configmap pin-roles --from-file=01-roles.sql="$roles_sql" \
    --dry-run=client -o yaml | kc apply -f - >/dev/null
rm -f "$roles_sql"
kc apply -f infra/kube/platform.yaml >/dev/null
kc -n platform rollout status deploy/postgres deploy/kafka --timeout=300s >/dev/null
while IFS= read -r topic; do
    kc -n platform exec deploy/kafka -- /opt/kafka/bin/kafka-topics.sh \
        --bootstrap-server 198.18.0.1:9092 --create --if-not-exists --topic "${topic%%:*}" \
        --partitions 3 --replication-factor 1 --config "max.message.bytes=${topic##*:}" >/dev/null
done < <("$PYTHON" -c 'from pin_contracts.topics import CATALOGUE
for t in CATALOGUE: print(f"{t.name}:{t.max_message_bytes}")')
phase "platform ready"

kc create namespace "$NAMESPACE" --dry-run=client -o yaml | kc apply -f - >/dev/null
secret() {
    kc -n "$NAMESPACE" create secret generic "$1" --from-literal=dsn="postgresql://$2:pin@$PG/$3" \
        --dry-run=client -o yaml | kc apply -f - >/dev/null
}
secret identity-fanout-database-owner identity_fanout_owner pin_identity
secret identity-fanout-database-worker identity_fanout_worker_app pin_identity
secret identity-fanout-database-relay identity_fanout_relay_app pin_identity
secret identity-fanout-database-operator identity_fanout_ops_app pin_identity
secret rewards-membership-database-owner rewards_membership_owner pin_rewards
secret rewards-membership-database-consumer rewards_membership_consumer_app pin_rewards
secret rewards-membership-database-operator rewards_membership_ops_app pin_rewards

# The previous release of each service first (its chart and image, infra/kube/previous.sh),
# with the same values file; the first scenario upgrades both to this checkout's with work in
# flight (tests-kube/test_0_upgrade.py).
work="$(mktemp -d)"
for chart in identity-fanout rewards-membership; do
    read -r _ image < <("$HERE/previous.sh" "$chart" "$work/$chart")
    "$HERE/cluster.sh" images "$image"
    hm upgrade --install "$chart" "$work/$chart/chart" -n "$NAMESPACE" \
        -f "infra/kube/values/$chart.yaml" --set "image.tag=${image#*:}" --wait --timeout 5m >/dev/null
    phase "$chart: the previous release installed ($image)"
    hm dependency build "infra/helm/$chart" >/dev/null
done
rm -rf "$work"

# The scenarios, from inside the cluster's network namespace (they reach PostgreSQL, Kafka
# and the API server as a pod does).
scenarios() {
    "$HERE/cluster.sh" run env PIN_KUBE_REVISION="$REVISION" PIN_KUBE_HELM="$HELM" \
        PIN_POSTGRES_DSN="postgresql://pin:pin@$PG/postgres" PIN_KAFKA_BOOTSTRAP=198.18.0.1:9092 \
        "$PYTHON" -m pytest -p no:randomly -p no:cacheprovider "$@"
}
scenarios tests-kube/test_0_upgrade.py
phase "both upgraded to this checkout's charts with work in flight"
for chart in identity-fanout rewards-membership; do
    # The test pod is deleted once it passed; a failed one stays, with its log.
    hm test "$chart" -n "$NAMESPACE" --timeout 5m | sed -n '1,/^Phase:/p' ||
        { kc -n "$NAMESPACE" logs "$chart-test-readyz" >&2; exit 1; }
done
phase "helm test passed"
kc get pods -n "$NAMESPACE" -o wide
read -ra tests <<<"${PIN_KUBE_TESTS:-$(ls tests-kube/test_[1-9]*.py | tr '\n' ' ')}"
scenarios "${tests[@]}"
phase "scenarios passed"
