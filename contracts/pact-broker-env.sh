# Sourced by the Pact Broker scripts (pact-publish.sh, pact-can-i-deploy.sh) and `make
# pact-broker`: one version, one branch and one way to authenticate for every pacticipant of
# this repository (identity-fanout, rewards-membership, pin-access-cache).
#
#   PACT_VERSION  the commit (`git rev-parse HEAD`), "+dirty" when the tree has uncommitted
#                 changes: a result the broker records must name code that can be found again
#   PACT_BRANCH   the current git branch
#   PACT_AUTH     curl arguments: PACT_BROKER_TOKEN (bearer), or PACT_BROKER_USERNAME +
#                 PACT_BROKER_PASSWORD, or none
# Both may be given instead (PACT_VERSION=1.4.2 PACT_BRANCH=main ...).
# Without a broker there is nothing to do: say so and succeed, so CI may call every script
# unconditionally.
if [[ -z "${PACT_BROKER_BASE_URL:-}" ]]; then
    echo "$(basename "$0" .sh): PACT_BROKER_BASE_URL is not set; nothing to do" >&2
    exit 0
fi
pact_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [[ -z "${PACT_VERSION:-}" ]]; then
    PACT_VERSION="$(git -C "$pact_root" rev-parse HEAD)"
    if [[ -n "$(git -C "$pact_root" status --porcelain)" ]]; then
        PACT_VERSION="$PACT_VERSION+dirty"
    fi
fi
PACT_BRANCH="${PACT_BRANCH:-$(git -C "$pact_root" rev-parse --abbrev-ref HEAD)}"
export PACT_VERSION PACT_BRANCH
PACT_AUTH=()
if [[ -n "${PACT_BROKER_TOKEN:-}" ]]; then
    PACT_AUTH=(-H "Authorization: Bearer $PACT_BROKER_TOKEN")
elif [[ -n "${PACT_BROKER_USERNAME:-}" ]]; then
    PACT_AUTH=(-u "$PACT_BROKER_USERNAME:${PACT_BROKER_PASSWORD:-}")
fi
