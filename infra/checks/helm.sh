#!/usr/bin/env bash
# The Helm charts without a cluster: `helm lint`, `helm template` with the default values, the
# production-like ones (ci/production-values.yaml) and a platform team's overlay
# (ci/overlay-values.yaml), the rendered manifests validated by
# kubeconform (strict: unknown fields fail) against the Kubernetes JSON schemas of the oldest
# and newest supported Kubernetes and the prometheus-operator CRD schemas, and values that
# values.schema.json (or the chart) must reject. The library chart infra/helm/pin-common (the
# templates both charts share) is linted on its own, and packaged into each chart's charts/ by
# `helm dependency build` before the chart is linted or rendered, so what is checked is the
# working tree's library, never an older package (charts/ is not in git; Chart.lock is, and a
# Chart.yaml out of step with it fails here). The default values also render and lint without
# --kube-version: Helm's own default capabilities (its client-go's Kubernetes, tools.sh) must
# satisfy the charts' kubeVersion, as they do for anyone running `helm template`.
set -euo pipefail
# No arguments: there are no copies left to fix (`--fix` once copied the helpers into each chart).
[[ $# -eq 0 ]] || { echo "usage: infra/checks/helm.sh (no arguments)" >&2; exit 2; }
source "$(dirname "${BASH_SOURCE[0]}")/tools.sh"
cd "$ROOT"

HELM="$(ensure_helm)"
KUBECONFORM="$(ensure_kubeconform)"
SCHEMAS="$(ensure_schemas)"
OUT="$(mktemp -d)"
trap 'rm -rf "$OUT"' EXIT
# helm template renders for this version (kubeVersion of the charts is checked against it).
RENDER_K8S="${K8S_VERSIONS[-1]}"

# Values each chart must refuse: schema violations, and the checks of the templates.
declare -A BAD=(
    [common]="prometheusRule.enabled=true|prometheusRule.enabled=true,prometheusRule.runbookBaseUrl=docs/runbooks|podDisruptionBudget.minAvailable=1,podDisruptionBudget.maxUnavailable=1|commonLabels.app\\.kubernetes\\.io/name=x|otel.protocol=http/json|otel.endpoint=http://collector|otel.endpoint=http://c:4317,networkPolicy.egress.otlp.ports={4318}|startupProbe.enabled=maybe|startupProbe.successThreshold=2|serviceMonitor.metricRelabelings[0].source=x|extraEnvFrom[0].prefix=X|image.registry=Not A Registry|nameOverride=Fan_out|lagWatcher.nodeSelector=x|ops.tolerations=x|otel.sampler=sometimes|otel.samplerArg=2|otel.endpoint=collector:4318|otel.unknown=1|extraVolumes[0].name=tmp|extraVolumeMounts[0].name=x|extraContainers[0].name=sidecar|initContainers[0].name=init|networkPolicy.enabled=maybe|networkPolicy.egress.postgres.ports={0}|networkPolicy.egress.smtp.ports={25}|kafka.tls.clientSecret=kafka-client|config.batchSize=0|config.batchSize=10001|config.logLevel=LOUD|image.tag=latest|kafka.bootstrap=|kafka.securityProtocol=TLS|kafka.sasl.mechanism=PLAIN|database.existingSecret=|database.migration.existingSecret=|database.migration.dsnKey=|config.dbRolePrefix=Prod-|replicaCount=-1|terminationGracePeriodSeconds=5|securityContext.readOnlyRootFilesystem=false|podSecurityContext.runAsNonRoot=false|unknownKey=1|lagWatcher.enabled=maybe|lagWatcher.config.interval=soon|lagWatcher.config.topics=null|lagWatcher.config.topics[0]=a topic|lagWatcher.config.maxGroups=0|lagWatcher.config.unknown=1|pin-common.unknown=1"
    [identity-fanout]="relay.nodeSelector=x|relay.podAnnotations.a=1|config.pollingInterval=5 minutes|config.dbPoolSize=1|relay.replicaCount=0|database.worker.existingSecret=|database.relay=null"
    [rewards-membership]="replicaCount=4|config.retryMax=forever|config.topic=|database.consumer.existingSecret="
)

status=0
for chart in infra/helm/*/; do
    chart="${chart%/}"
    name="$(basename "$chart")"
    if grep -qx 'type: library' "$chart/Chart.yaml"; then
        # Renders nothing of its own: linted here, rendered through the charts that use it.
        "$HELM" lint --strict --kube-version "$RENDER_K8S" "$chart" >/dev/null
        echo "$name: helm lint (library chart)"
        continue
    fi
    # --skip-refresh: the dependencies are file:// charts of this tree; no repository is asked.
    "$HELM" dependency build --skip-refresh "$chart" >/dev/null
    "$HELM" lint --strict --kube-version "$RENDER_K8S" "$chart" >/dev/null
    "$HELM" lint --strict "$chart" >/dev/null
    "$HELM" template "$name" "$chart" --namespace pin >/dev/null
    for values in production overlay; do
        "$HELM" lint --strict --kube-version "$RENDER_K8S" "$chart" -f "$chart/ci/$values-values.yaml" >/dev/null
        "$HELM" template "$name" "$chart" --namespace pin --kube-version "$RENDER_K8S" \
            -f "$chart/ci/$values-values.yaml" >"$OUT/$name-$values.yaml"
    done
    "$HELM" template "$name" "$chart" --namespace pin --kube-version "$RENDER_K8S" >"$OUT/$name-default.yaml"
    for v in "${K8S_VERSIONS[@]}"; do
        "$KUBECONFORM" -strict -summary -kubernetes-version "$v" \
            -schema-location "$SCHEMAS/{{ .NormalizedKubernetesVersion }}-local-strict/{{ .ResourceKind }}{{ .KindSuffix }}.json" \
            -schema-location "$SCHEMAS/crds/{{ .Group }}/{{ .ResourceKind }}_{{ .ResourceAPIVersion }}.json" \
            "$OUT/$name-default.yaml" "$OUT/$name-production.yaml" "$OUT/$name-overlay.yaml" |
            sed "s|^|$name, Kubernetes $v: |"
    done
    IFS='|' read -r -a bad <<<"${BAD[common]}|${BAD[$name]}"
    for setting in "${bad[@]}"; do
        if "$HELM" template "$name" "$chart" --kube-version "$RENDER_K8S" --set "$setting" >/dev/null 2>&1; then
            echo "$name: accepted bad value --set '$setting'" >&2
            status=1
        fi
    done
    echo "$name: helm lint, template (default, production, overlay), kubeconform, ${#bad[@]} bad values rejected"
done
exit "$status"
