"""Package URLs for pin-contracts, from the repository the release is built from.

The repository's address is a fact of where it is hosted, not of the code, so it is not
written into pyproject.toml: the release build passes it as PIN_SOURCE_URL, the same address
the images carry as their org.opencontainers.image.source label. Without it the package has
no URLs (a local build), never a guessed one.
"""

from __future__ import annotations

import os
from typing import Any

from hatchling.metadata.plugin.interface import MetadataHookInterface


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
