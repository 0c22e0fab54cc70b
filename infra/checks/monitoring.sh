#!/usr/bin/env bash
# Prometheus rules: `promtool check rules`, `promtool test rules` (series that fire and series
# that must not), and the copies the charts embed equal to infra/monitoring/rules/
# (`monitoring.sh --fix` copies them over). Dashboards are checked by infra/tests.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/tools.sh"
cd "$ROOT"

status=0
for rules in infra/monitoring/rules/*.rules.yml; do
    name="$(basename "$rules" .rules.yml)"
    copy="infra/helm/$name/files/prometheus-rules.yml"
    if ! cmp -s "$rules" "$copy"; then
        if [[ "${1:-}" == "--fix" ]]; then
            cp "$rules" "$copy" && echo "copied $rules -> $copy"
        else
            echo "$copy differs from $rules: run infra/checks/monitoring.sh --fix" >&2
            status=1
        fi
    fi
done

PROMTOOL="$(ensure_promtool)"
"$PROMTOOL" check rules infra/monitoring/rules/*.rules.yml
(cd infra/monitoring/tests && "$PROMTOOL" test rules *.test.yml)
exit "$status"
