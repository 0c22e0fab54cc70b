"""The software bill of materials of each service image: CycloneDX 1.5, from the lock file.

`make sbom` writes `build/sbom/<service>.cdx.json` with `uv export --format cyclonedx1.5
--package <service> --no-dev --frozen` (what the image installs: the same selection as the
Dockerfile's `uv sync --package <service> --frozen --no-dev`), then checks each against the
lock: every locked package of the service's closure is a component with its locked version,
a third-party one with its `pkg:pypi` purl and the SHA-256 of its distribution, and nothing
else is. `make test` runs it with the infra checks.

    python infra/checks/sbom.py [OUT_DIR]
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
SERVICES = sorted(p.name for p in (ROOT / "services").iterdir() if (p / "pyproject.toml").exists())


SHA256_HEX_DIGITS = 64


class CheckError(Exception):
    pass


def _uv(*args: str) -> str:
    uv = os.environ.get("UV") or shutil.which("uv") or str(ROOT / ".tools/uv/bin/uv")
    return subprocess.run(  # noqa: S603 - the project's own uv
        [uv, "export", "--frozen", "--no-dev", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout


def locked(service: str) -> dict[str, str]:
    """name -> version of every package the service's image installs (workspace members:
    their own version), from the lock file."""
    text = _uv("--package", service, "--format", "requirements.txt", "--no-hashes")
    found: dict[str, str] = {}
    for line in text.splitlines():
        pinned = re.match(r"^([A-Za-z0-9._-]+)==([^ ;]+)", line)
        if pinned:
            found[pinned.group(1).lower()] = pinned.group(2)
        member = re.match(r"^-e \./(.+)$", line)
        if member:
            project = (ROOT / member.group(1) / "pyproject.toml").read_text()
            name = re.search(r'^name = "([^"]+)"', project, flags=re.M)
            version = re.search(r'^version = "([^"]+)"', project, flags=re.M)
            if name is None or version is None:
                raise CheckError(f"{member.group(1)}/pyproject.toml names no name or version")
            found[name.group(1).lower()] = version.group(1)
    return found


def check(service: str, bom: dict[str, Any]) -> int:
    if (bom.get("bomFormat"), bom.get("specVersion")) != ("CycloneDX", "1.5"):
        raise CheckError(f"{service}: not a CycloneDX 1.5 document")
    root = bom["metadata"]["component"]
    components = [root, *bom.get("components", [])]
    listed = {c["name"].lower(): c for c in components}
    expected = locked(service)
    if set(listed) != set(expected):
        missing, extra = sorted(set(expected) - set(listed)), sorted(set(listed) - set(expected))
        raise CheckError(f"{service}: SBOM lacks {missing}, lists {extra} the image lacks")
    for name, version in expected.items():
        component = listed[name]
        if component.get("version") != version:
            raise CheckError(f"{service}: {name} {component.get('version')} != locked {version}")
        workspace = any(p["name"].startswith("uv:") for p in component.get("properties", []))
        if workspace:
            continue
        if component.get("purl") != f"pkg:pypi/{name}@{version}":
            raise CheckError(f"{service}: {name} has purl {component.get('purl')!r}")
        hashes = [h for ref in component.get("externalReferences", []) for h in ref["hashes"]]
        if not any(
            h["alg"] == "SHA-256" and len(h["content"]) == SHA256_HEX_DIGITS for h in hashes
        ):
            raise CheckError(f"{service}: {name} carries no SHA-256 of its distribution")
    return len(expected)


def shown(path: Path) -> str:
    """The path as the report names it: from the repository's root when it is inside the
    checkout (the default build/sbom/), in full anywhere else (any OUT_DIR)."""
    absolute = path.resolve()
    return str(absolute.relative_to(ROOT) if absolute.is_relative_to(ROOT) else absolute)


def main(argv: list[str]) -> int:
    out = Path(argv[0]) if argv else ROOT / "build" / "sbom"
    out.mkdir(parents=True, exist_ok=True)
    try:
        for service in SERVICES:
            text = _uv(
                "--package",
                service,
                "--format",
                "cyclonedx1.5",
                "--preview-features",
                "sbom-export",
            )
            count = check(service, json.loads(text))
            path = out / f"{service}.cdx.json"
            path.write_text(text)
            sys.stdout.write(f"sbom: {shown(path)}: {count} components match uv.lock\n")
    except (CheckError, subprocess.CalledProcessError) as exc:
        sys.stderr.write(f"sbom check failed: {exc}\n")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
