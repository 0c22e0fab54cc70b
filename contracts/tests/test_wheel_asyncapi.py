"""The wheel ships asyncapi.yaml beside the JSON Schemas, and every `$ref` of it resolves
inside the installed package: built with `uv build` (sdist, then the wheel from it, as a
release builds it), installed alone into a fresh virtual environment, read from there."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[2]
DRAFT_2020_12 = "https://json-schema.org/draft/2020-12/schema"
SCHEMA_FORMAT = "application/schema+json;version=draft-2020-12"


def uv() -> str:
    found = os.environ.get("UV") or shutil.which("uv") or str(ROOT / ".tools/uv/bin/uv")
    if not Path(found).is_file():
        pytest.fail("uv not found: set UV, put uv on PATH, or run `make sync`", pytrace=False)
    return found


def run(*args: str, cwd: Path) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("UV_")} | {"UV_NO_CONFIG": "1"}
    done = subprocess.run(
        args, cwd=cwd, env=env, capture_output=True, text=True, timeout=240, check=False
    )
    if done.returncode != 0:
        pytest.fail(f"{' '.join(args)} failed ({done.returncode}):\n{done.stdout}{done.stderr}")
    return done.stdout


def load(path: Path) -> Any:
    text = path.read_text(encoding="utf-8")
    return yaml.safe_load(text) if path.suffix in (".yaml", ".yml") else json.loads(text)


def refs(node: Any) -> list[str]:
    if isinstance(node, dict):
        found = [node["$ref"]] if isinstance(node.get("$ref"), str) else []
        return found + [ref for value in node.values() for ref in refs(value)]
    if isinstance(node, list):
        return [ref for item in node for ref in refs(item)]
    return []


def resolve(ref: str, base: Path) -> tuple[Path, Any]:
    """The file a `$ref` names (relative to `base`, the file it stands in) and the node its
    JSON pointer names there; AssertionError for either missing."""
    target, _, pointer = ref.partition("#")
    path = (base.parent / target).resolve() if target else base
    assert path.is_file(), f"{base.name}: $ref {ref!r}: no file {path}"
    node = load(path)
    for part in [p.replace("~1", "/").replace("~0", "~") for p in pointer.split("/")[1:]]:
        assert isinstance(node, dict | list), f"{base.name}: $ref {ref!r}: no {part!r}"
        node = node[int(part)] if isinstance(node, list) else node.get(part)
        assert node is not None, f"{base.name}: $ref {ref!r}: no {part!r} in {path.name}"
    return path, node


def check_refs(path: Path, seen: set[Path]) -> None:
    """Every `$ref` of `path`, and of each file it leads to, resolves."""
    seen.add(path)
    for ref in refs(load(path)):
        target, _ = resolve(ref, path)
        if target not in seen:
            check_refs(target, seen)


def test_the_installed_wheel_has_the_document_with_refs_that_resolve_there(
    tmp_path: Path,
) -> None:
    dist = tmp_path / "dist"
    run(uv(), "build", "--quiet", "--package", "pin-contracts", "--out-dir", str(dist), cwd=ROOT)
    [wheel] = dist.glob("pin_contracts-*-py3-none-any.whl")
    venv = tmp_path / "venv"
    run(uv(), "venv", "--quiet", "--python", sys.executable, str(venv), cwd=tmp_path)
    python = venv / "bin" / "python"
    # Alone: the document is data, read without importing the package (or msgspec).
    run(uv(), "pip", "install", "--quiet", "--no-deps", "--python", str(python), str(wheel),
        cwd=tmp_path)  # fmt: skip
    # Where the installed distribution says its files are (nothing of the checkout).
    locate = (
        "import importlib.metadata as m, json; d = m.distribution('pin-contracts');"
        " print(json.dumps({'files': [str(f) for f in d.files or ()],"
        " 'document': str(d.locate_file('pin_contracts/asyncapi.yaml'))}))"
    )
    where = json.loads(run(str(python), "-c", locate, cwd=tmp_path))
    assert "pin_contracts/asyncapi.yaml" in where["files"]
    document = Path(where["document"])
    assert tmp_path in document.parents
    assert document.with_name("json_schemas").is_dir()

    seen: set[Path] = set()
    check_refs(document, seen)
    schemas = {p.name for p in seen if p.suffix == ".json"}
    assert schemas == {p.name for p in (ROOT / "contracts/schemas").glob("*.json")}

    # Each payload names the dialect of the schema it references: draft 2020-12.
    messages = load(document)["components"]["messages"]
    assert messages
    for name, message in messages.items():
        payload = message["payload"]
        assert payload["schemaFormat"] == SCHEMA_FORMAT, name
        _, schema = resolve(payload["schema"]["$ref"], document)
        assert schema["$schema"] == DRAFT_2020_12, name
