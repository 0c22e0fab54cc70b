#!/usr/bin/env bash
# Publish the consumer pacts in contracts/pacts/ to a Pact Broker (or PactFlow).
#
#   PACT_BROKER_BASE_URL=https://broker.example.com contracts/pact-publish.sh [VERSION [BRANCH]]
#
# Auth: PACT_BROKER_TOKEN (bearer), or PACT_BROKER_USERNAME + PACT_BROKER_PASSWORD.
# VERSION defaults to the commit (`git rev-parse HEAD`, "+dirty" with uncommitted changes),
# BRANCH to the current git branch (pact-broker-env.sh). Without PACT_BROKER_BASE_URL it says so and exits 0, so
# CI can call it unconditionally. It uses the broker's `POST /contracts/publish` endpoint
# (the one `pact-broker publish` uses) with curl and python3 only: no Pact CLI to install.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
pacts_dir="${PACT_DIR:-$here/pacts}"

[[ -n "${1:-}" ]] && PACT_VERSION="$1"
[[ -n "${2:-}" ]] && PACT_BRANCH="$2"
source "$here/pact-broker-env.sh"
version="$PACT_VERSION"
branch="$PACT_BRANCH"

shopt -s nullglob
files=("$pacts_dir"/*.json)
if ((${#files[@]} == 0)); then
    echo "pact-publish: no pact files in $pacts_dir" >&2
    exit 1
fi

# One request per consumer, carrying all of its pacts (the broker's unit of publication).
python3 - "$version" "$branch" "${files[@]}" <<'PY' | while IFS= read -r request; do
import base64, json, sys
version, branch, *paths = sys.argv[1:]
by_consumer = {}
for path in paths:
    with open(path, "rb") as f:
        raw = f.read()
    pact = json.loads(raw)
    by_consumer.setdefault(pact["consumer"]["name"], []).append({
        "consumerName": pact["consumer"]["name"],
        "providerName": pact["provider"]["name"],
        "specification": "pact",
        "contentType": "application/json",
        "content": base64.b64encode(raw).decode(),
    })
for consumer, contracts in sorted(by_consumer.items()):
    print(json.dumps({
        "pacticipantName": consumer,
        "pacticipantVersionNumber": version,
        "branch": branch,
        "contracts": contracts,
    }))
PY
    consumer="$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["pacticipantName"])' "$request")"
    echo "pact-publish: $consumer $version ($branch) -> $PACT_BROKER_BASE_URL"
    curl --silent --show-error --fail-with-body \
        -X POST "${PACT_BROKER_BASE_URL%/}/contracts/publish" \
        -H "Content-Type: application/json" -H "Accept: application/hal+json" \
        ${PACT_AUTH[@]+"${PACT_AUTH[@]}"} --data-binary "$request" >/dev/null
done
