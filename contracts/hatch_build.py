"""Build hooks of pin-contracts: package URLs, and the AsyncAPI document inside the wheel.

Package URLs come from the repository the release is built from. The repository's address
is a fact of where it is hosted, not of the code, so it is not written into pyproject.toml:
the release build passes it as PIN_SOURCE_URL, the same address the images carry as their
org.opencontainers.image.source label. Without it the package has no URLs (a local build),
never a guessed one.

The wheel ships `asyncapi.yaml` in the package's folder (pin_contracts), beside the JSON
Schemas it references (`pin_contracts/json_schemas/`, pyproject.toml's force-include): the copy's
payload `$ref`s read `./json_schemas/<file>` where the repository's read `./schemas/<file>`,
so they resolve relative to the installed file. A `$ref` of any other form fails the build
rather than ship a document whose references lead nowhere.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

from hatchling.builders.config import BuilderConfig
from hatchling.builders.hooks.plugin.interface import BuildHookInterface
from hatchling.metadata.plugin.interface import MetadataHookInterface

ASYNCAPI = "asyncapi.yaml"
IN_WHEEL = "pin_contracts/asyncapi.yaml"
SCHEMAS_IN_REPOSITORY = "./schemas/"
SCHEMAS_IN_WHEEL = "./json_schemas/"
_REF = re.compile(r"""\$ref:\s*(['"]?)(?P<target>[^'"\s]+)\1""")


class SourceUrls(MetadataHookInterface):
    PLUGIN_NAME = "custom"

    def update(self, metadata: dict[str, Any]) -> None:
        source = os.environ.get("PIN_SOURCE_URL", "").strip().removesuffix(".git").rstrip("/")
        if not source:
            return
        metadata["urls"] = {
            "Source": source,
            "Documentation": f"{source}/tree/main/contracts#readme",
            "Changelog": f"{source}/blob/main/contracts/CHANGELOG.md",
            "AsyncAPI": f"{source}/blob/main/contracts/asyncapi.yaml",
        }


def asyncapi_for_wheel(text: str) -> str:
    """The document as the wheel ships it: its schema `$ref`s relative to the installed file."""
    for found in _REF.finditer(text):
        target = found["target"]
        if not target.startswith(("#", SCHEMAS_IN_REPOSITORY)):
            raise ValueError(f"{ASYNCAPI}: $ref {target!r} would not resolve inside the wheel")
    return _REF.sub(
        lambda m: (
            m[0].replace(SCHEMAS_IN_REPOSITORY, SCHEMAS_IN_WHEEL, 1)
            if m["target"].startswith(SCHEMAS_IN_REPOSITORY)
            else m[0]
        ),
        text,
    )


class AsyncApiInWheel(BuildHookInterface[BuilderConfig]):
    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        if self.target_name != "wheel":
            return
        text = (Path(self.root) / ASYNCAPI).read_text(encoding="utf-8")
        self._staging = Path(tempfile.mkdtemp(prefix="pin-contracts-asyncapi-"))
        staged = self._staging / ASYNCAPI
        staged.write_text(asyncapi_for_wheel(text), encoding="utf-8")
        build_data["force_include"][str(staged)] = IN_WHEEL

    def finalize(self, version: str, build_data: dict[str, Any], artifact_path: str) -> None:
        staging = getattr(self, "_staging", None)
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)
