#!/usr/bin/env bash
# contracts/asyncapi.yaml: generated from the catalogue (`python -m pin_contracts.asyncapi
# check`, in `make lint`), and here parsed and validated by the AsyncAPI parser, its payload
# $refs resolved to the JSON Schemas of contracts/schemas/.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/tools.sh"
cd "$ROOT"
PARSER="$(ensure_asyncapi_parser)"
node infra/checks/asyncapi.mjs "$PARSER" contracts/asyncapi.yaml
