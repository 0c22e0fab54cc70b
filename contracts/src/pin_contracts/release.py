"""The release rule of pin-contracts: when a schema moves, the package version moves.

``python -m pin_contracts.release check --base DIR [--dir DIR]`` compares a ``contracts/``
directory (its ``pyproject.toml``, ``CHANGELOG.md`` and ``schemas/``) with the same directory
as last released (``--base``, e.g. extracted from the release tag) and exits 1 when:

- a schema file changed, appeared or disappeared and the version did not move up;
- a new ContractVersion file (``<event>.v<N>.json``) appeared without a major bump (the
  README's policy: a ContractVersion bump is a major release);
- the version went down, or CHANGELOG.md has no ``## <version>`` section for it.

Whether the schema change itself is compatible is ``pin_contracts.schemas check --base``;
infra/checks/contracts-release.sh runs both.
"""

from __future__ import annotations

import argparse
import re
import sys
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = ["ReleaseState", "Version", "main", "problems", "read_state", "schema_changes"]

PACKAGE = "pin-contracts"
_VERSION = re.compile(r"^(\d+)\.(\d+)\.(\d+)$")
_SCHEMA_FILE = re.compile(r"^(?P<stem>.+)\.v(?P<version>\d+)\.json$")


@dataclass(frozen=True, order=True, slots=True)
class Version:
    major: int
    minor: int
    patch: int

    @classmethod
    def parse(cls, text: str) -> Version:
        match = _VERSION.match(text)
        if match is None:
            raise ValueError(f"{PACKAGE} version {text!r} is not MAJOR.MINOR.PATCH")
        return cls(*(int(part) for part in match.groups()))

    def __str__(self) -> str:
        return f"{self.major}.{self.minor}.{self.patch}"


@dataclass(frozen=True, slots=True)
class ReleaseState:
    """What the rule looks at in one ``contracts/`` directory."""

    version: Version
    schemas: dict[str, bytes]
    changelog: str


def read_state(contracts_dir: Path) -> ReleaseState:
    project = tomllib.loads((contracts_dir / "pyproject.toml").read_text(encoding="utf-8"))
    if project["project"]["name"] != PACKAGE:
        raise ValueError(f"{contracts_dir}/pyproject.toml is not {PACKAGE}")
    changelog = contracts_dir / "CHANGELOG.md"
    return ReleaseState(
        version=Version.parse(project["project"]["version"]),
        schemas={
            path.name: path.read_bytes()
            for path in sorted((contracts_dir / "schemas").glob("*.json"))
        },
        changelog=changelog.read_text(encoding="utf-8") if changelog.exists() else "",
    )


def schema_changes(base: ReleaseState, current: ReleaseState) -> list[str]:
    """Schema files added, removed or changed, as ``+name``, ``-name``, ``~name``."""
    names = sorted(base.schemas.keys() | current.schemas.keys())
    changes = []
    for name in names:
        if name not in base.schemas:
            changes.append(f"+{name}")
        elif name not in current.schemas:
            changes.append(f"-{name}")
        elif base.schemas[name] != current.schemas[name]:
            changes.append(f"~{name}")
    return changes


def _new_contract_versions(base: ReleaseState, current: ReleaseState) -> list[str]:
    """Added files that are a new ContractVersion of an event the base already had."""
    base_stems = {m.group("stem") for m in map(_SCHEMA_FILE.match, base.schemas) if m}
    added = current.schemas.keys() - base.schemas.keys()
    return sorted(
        name
        for name in added
        if (match := _SCHEMA_FILE.match(name)) and match.group("stem") in base_stems
    )


def problems(base: ReleaseState, current: ReleaseState) -> list[str]:
    """Why ``current`` may not be released after ``base``; empty when it may."""
    found: list[str] = []
    if current.version < base.version:
        found.append(f"version went down: {base.version} -> {current.version}")
    changes = schema_changes(base, current)
    if changes and current.version == base.version:
        found.append(
            f"schemas changed ({', '.join(changes)}) but {PACKAGE} is still {current.version}:"
            " bump `version` in contracts/pyproject.toml (additive: minor; breaking: major)"
        )
    bumped = _new_contract_versions(base, current)
    if bumped and current.version.major <= base.version.major:
        found.append(
            f"new ContractVersion ({', '.join(bumped)}) needs a major release: "
            f"{base.version} -> {base.version.major + 1}.0.0"
        )
    if not re.search(rf"^## {re.escape(str(current.version))}\b", current.changelog, re.M):
        found.append(f"CHANGELOG.md has no '## {current.version}' section")
    return found


def main(argv: Sequence[str] | None = None) -> int:
    default_dir = Path(__file__).resolve().parents[2]
    parser = argparse.ArgumentParser(prog="python -m pin_contracts.release")
    parser.add_argument("command", choices=("check",))
    parser.add_argument("--base", type=Path, required=True, help="contracts/ as last released")
    parser.add_argument("--dir", type=Path, default=default_dir, help="contracts/ to release")
    args = parser.parse_args(argv)
    try:
        base, current = read_state(args.base), read_state(args.dir)
    except (OSError, KeyError, ValueError, tomllib.TOMLDecodeError) as exc:
        sys.stderr.write(f"cannot read the release state: {exc}\n")
        return 2
    found = problems(base, current)
    for problem in found:
        sys.stderr.write(f"{problem}\n")
    if found:
        return 1
    changes = schema_changes(base, current)
    sys.stdout.write(
        f"{PACKAGE} {base.version} -> {current.version}: "
        f"{', '.join(changes) if changes else 'no schema change'}; release rule ok\n"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
