#!/usr/bin/env bash
# Ask the Pact Broker whether each pacticipant's version may be deployed: every pact it
# consumes and every pact it provides verified, and successfully, against the versions in the
# target environment. The release's last gate, after pact-publish.sh and the provider's
# verification with results published (`make pact-broker` runs all three).
#
#   PACT_BROKER_BASE_URL=https://broker.example.com contracts/pact-can-i-deploy.sh [PACTICIPANT...]
#
# PACTICIPANTs default to every consumer and provider named in contracts/pacts/. The version
# and branch are pact-broker-env.sh's (PACT_VERSION, PACT_BRANCH); the environment is
# PACT_ENVIRONMENT (default production). PACT_CAN_I_DEPLOY_WAIT_S (default 0) waits that long
# while results are still unknown, as `pact-broker can-i-deploy --retry-while-unknown` does.
# It reads the broker's matrix (`GET /matrix?q[][pacticipant]=..&q[][version]=..&latestby=cvp
# &environment=..`, the query `pact-broker can-i-deploy` sends) with curl and python3.
# Exit 0: every one deployable; 1: one is not (its reason is printed); 2: the broker did not
# answer or a setting is wrong; without PACT_BROKER_BASE_URL it says so and exits 0.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
pacts_dir="${PACT_DIR:-$here/pacts}"

source "$here/pact-broker-env.sh"
environment="${PACT_ENVIRONMENT:-production}"
wait_s="${PACT_CAN_I_DEPLOY_WAIT_S:-0}"
[[ "$wait_s" =~ ^[0-9]+$ ]] || { echo "pact-can-i-deploy: PACT_CAN_I_DEPLOY_WAIT_S must be whole seconds, got '$wait_s'" >&2; exit 2; }

pacticipants=("$@")
if ((${#pacticipants[@]} == 0)); then
    mapfile -t pacticipants < <(python3 - "$pacts_dir" <<'PY'
import json, pathlib, sys
names = set()
for path in pathlib.Path(sys.argv[1]).glob("*.json"):
    pact = json.loads(path.read_text())
    names |= {pact["consumer"]["name"], pact["provider"]["name"]}
print("\n".join(sorted(names)))
PY
)
fi
((${#pacticipants[@]} > 0)) || { echo "pact-can-i-deploy: no pacticipants (no pacts in $pacts_dir)" >&2; exit 1; }

# One matrix answer: "<deployable> <unknown count> <reason>" on one line.
ask() {
    curl --silent --show-error --fail-with-body --get "${PACT_BROKER_BASE_URL%/}/matrix" \
        -H "Accept: application/hal+json" ${PACT_AUTH[@]+"${PACT_AUTH[@]}"} \
        --data-urlencode "q[][pacticipant]=$1" --data-urlencode "q[][version]=$PACT_VERSION" \
        --data-urlencode "latestby=cvp" --data-urlencode "environment=$environment" \
    | python3 -c '
import json, sys
summary = json.load(sys.stdin)["summary"]
reason = " ".join(str(summary.get("reason", "")).split())
print("yes" if summary["deployable"] else "no", summary.get("unknown", 0), reason)
'
}

refused=0
for pacticipant in "${pacticipants[@]}"; do
    deadline=$((SECONDS + wait_s))
    while :; do
        # A broker that does not answer (down, auth refused) is not a "no": exit 2, its error above.
        answer="$(ask "$pacticipant")" || { echo "pact-can-i-deploy: the broker did not answer for $pacticipant" >&2; exit 2; }
        read -r deployable unknown reason <<<"$answer"
        if [[ "$deployable" == yes || "$unknown" == 0 ]] || ((SECONDS >= deadline)); then
            break
        fi
        echo "pact-can-i-deploy: $pacticipant: $unknown verification result(s) unknown; asking again" >&2
        sleep 5
    done
    if [[ "$deployable" == yes ]]; then
        echo "pact-can-i-deploy: $pacticipant $PACT_VERSION -> $environment: yes ($reason)"
    else
        echo "pact-can-i-deploy: $pacticipant $PACT_VERSION -> $environment: NO ($reason)" >&2
        refused=1
    fi
done
exit "$refused"
