"""Binaries of the tools cache (`infra/checks/tools.sh`): built or extracted once per machine."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from pin_testkit.local.errors import LocalInfraError
from pin_testkit.local.layout import find_repo_root

__all__ = ["repo_root", "tool_binary"]


def repo_root() -> Path:
    root = find_repo_root(Path(__file__).resolve().parent, Path.cwd().resolve())
    if root is None:
        raise LocalInfraError("cannot find the repository (infra/local/kafka/pom.xml)")
    return root


def tool_binary(tool: str, override_env: str) -> Path:
    """`$<override_env>` if set, else `infra/checks/tools.sh <tool>` (installs it on first use)."""
    override = os.environ.get(override_env, "").strip()
    if override:
        return Path(override)
    tools = repo_root() / "infra" / "checks" / "tools.sh"
    result = subprocess.run(  # noqa: S603 - the repository's own script
        ["/bin/bash", str(tools), tool], capture_output=True, text=True, check=False
    )
    if result.returncode != 0:
        raise LocalInfraError(f"cannot install {tool}: {result.stderr.strip()[-500:]}")
    return Path(result.stdout.strip().splitlines()[-1])
