#!/usr/bin/env bash
# The pin-contracts release gate: against the last release (the newest `pin-contracts-v*` tag,
# or PIN_CONTRACTS_BASE_REF, or HEAD for the working tree's own changes),
#   1. the JSON Schemas are compatible (python -m pin_contracts.schemas check --base),
#   2. the version moved if a schema moved, with a CHANGELOG section (pin_contracts.release),
# then `uv build --package pin-contracts` makes the wheel and sdist of that version, and the
# wheel installs alone into a clean environment. Publishing (on a tag, in CI) is
#   uv publish --index pin-internal dist/pin_contracts-<version>*   (see contracts/README.md)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/tools.sh"
cd "$ROOT"
RUN=("$UV" run --quiet --frozen --all-packages)

base_ref="${PIN_CONTRACTS_BASE_REF:-}"
if [[ -z "$base_ref" ]]; then
    base_ref="$(git tag --list 'pin-contracts-v*' --sort=-v:refname | head -1)"
    base_ref="${base_ref:-HEAD}"
fi
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
mkdir -p "$WORK/base"
git archive "$base_ref" contracts | tar -x -C "$WORK/base"

"${RUN[@]}" python -m pin_contracts.schemas check --base "$WORK/base/contracts/schemas"
"${RUN[@]}" python -m pin_contracts.release check --base "$WORK/base/contracts" --dir contracts
echo "(compared with $base_ref)"

version="$("${RUN[@]}" python -c 'import tomllib; print(tomllib.load(open("contracts/pyproject.toml", "rb"))["project"]["version"])')"
# The release build names its repository (hatch_build.py); this check stands one in if the
# environment names none, to see the URLs reach both the sdist and the wheel built from it.
source_url="${PIN_SOURCE_URL:-https://git.example.invalid/pin/platform}"
PIN_SOURCE_URL="$source_url" "$UV" build --quiet --package pin-contracts --out-dir "$WORK/dist"
wheel="$WORK/dist/pin_contracts-$version-py3-none-any.whl"
sdist="$WORK/dist/pin_contracts-$version.tar.gz"
[[ -f "$wheel" && -f "$sdist" ]] || { ls "$WORK/dist" >&2; echo "expected $wheel and $sdist" >&2; exit 1; }
"$UV" venv --quiet "$WORK/venv"
"$UV" pip install --quiet --python "$WORK/venv/bin/python" "$wheel"
(cd "$WORK" && venv/bin/python -c "
import importlib.metadata as m, importlib.resources as r, pathlib, pin_contracts
assert m.version('pin-contracts') == '$version', m.version('pin-contracts')
assert pin_contracts.AGENT_MEMBERSHIP_CHANGED.name == 'pin.identity.agent-membership-changed.v1'
meta = m.metadata('pin-contracts')
assert meta['License-Expression'] == 'LicenseRef-PIN-Internal', meta['License-Expression']
urls = dict(u.split(', ', 1) for u in meta.get_all('Project-URL') or [])
assert urls.get('Source') == '${source_url%.git}'.rstrip('/'), urls
assert {'Documentation', 'Changelog', 'AsyncAPI'} <= set(urls), urls
# The JSON Schemas ship inside the package, byte for byte those of the repository.
shipped = {p.name: p.read_bytes() for p in r.files('pin_contracts').joinpath('json_schemas').iterdir()}
repo = {p.name: p.read_bytes() for p in pathlib.Path('$ROOT/contracts/schemas').glob('*.json')}
assert shipped == repo, sorted(set(shipped) ^ set(repo))
")
echo "pin-contracts $version: $(basename "$wheel") and $(basename "$sdist") build and install"
