"""JSON schemas for kubeconform, made from what the package registries ship.

    python kube_schemas.py builtin SRC_DIR DST_DIR   # a kubernetes-validate schema directory
    python kube_schemas.py crds OUT_DIR CRD.yaml...  # CustomResourceDefinitions

`builtin` copies one `v<K8S>-local-strict` directory of the kubernetes-validate wheel (the
yannh/kubernetes-json-schema layout: `deployment-apps-v1.json`, ...) and points its
references (`/api/_definitions.json#/...`, resolved by that package against its own base URL)
at the `_definitions.json` next to each file (and drops the package's `$id`), so kubeconform
resolves them from disk.

`crds` does what `openapi2jsonschema` does: `OUT_DIR/<group>/<kind>_<version>.json` for every
served version, the layout of kubeconform's `{{.Group}}/{{.ResourceKind}}_{{.ResourceAPIVersion}}`
template. Strict like the built-in schemas: an object that lists its properties rejects unknown
ones, so a misspelt field of a ServiceMonitor fails instead of being ignored.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import yaml

_PACKAGE_REF = '"/api/_definitions.json#'
_LOCAL_REF = '"_definitions.json#'


def copy_builtin(source: Path, target: Path) -> int:
    """Copy the schema files, references rewritten; returns how many were written."""
    target.mkdir(parents=True, exist_ok=True)
    count = 0
    for path in source.glob("*.json"):
        schema = json.loads(path.read_text(encoding="utf-8").replace(_PACKAGE_REF, _LOCAL_REF))
        # Without the package's `$id` (https://kubernetes.io/api/...), references resolve
        # against the file's own path.
        schema.pop("$id", None)
        (target / path.name).write_text(json.dumps(schema), encoding="utf-8")
        count += 1
    return count


def _strict(node: Any) -> Any:
    if isinstance(node, dict):
        out = {key: _strict(value) for key, value in node.items()}
        if out.pop("x-kubernetes-int-or-string", False):
            out.pop("anyOf", None)
            out["oneOf"] = [{"type": "string"}, {"type": "integer"}]
        if out.get("type") == "object" and "properties" in out:
            out.setdefault("additionalProperties", False)
        return out
    if isinstance(node, list):
        return [_strict(item) for item in node]
    return node


def convert_crd(crd: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """File name (`<group>/<kind>_<version>.json`) -> schema, for each served version."""
    spec = crd["spec"]
    group = spec["group"]
    kind = spec["names"]["kind"].lower()
    schemas: dict[str, dict[str, Any]] = {}
    for version in spec["versions"]:
        if not version.get("served", True):
            continue
        schema = _strict(version["schema"]["openAPIV3Schema"])
        # metadata is validated by the API server, not by the CRD's schema.
        schema.setdefault("properties", {})["metadata"] = {"type": "object"}
        schemas[f"{group}/{kind}_{version['name']}.json"] = schema
    return schemas


def write_crds(out_dir: Path, sources: list[Path]) -> int:
    count = 0
    for source in sources:
        for document in yaml.safe_load_all(source.read_text(encoding="utf-8")):
            if not document or document.get("kind") != "CustomResourceDefinition":
                continue
            for name, schema in convert_crd(document).items():
                target = out_dir / name
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(json.dumps(schema, indent=1) + "\n", encoding="utf-8")
                count += 1
    return count


def main(argv: list[str]) -> int:
    match argv:
        case ["builtin", source, target]:
            written = copy_builtin(Path(source), Path(target))
        case ["crds", out_dir, *sources] if sources:
            written = write_crds(Path(out_dir), [Path(s) for s in sources])
        case _:
            sys.stderr.write(__doc__ or "")
            return 2
    if not written:
        sys.stderr.write(f"no schema written from {argv[1:]}\n")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
