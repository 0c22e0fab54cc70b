#!/usr/bin/env bash
# The compose stack against the charts, without a Docker engine: each compose service has
# exactly its chart's variables, arguments and hardening (compose_env.py).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/tools.sh"
cd "$ROOT"
"$UV" run --frozen --all-packages python infra/checks/compose_env.py
