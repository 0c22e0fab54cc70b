"""Which package of the service may import which: the dependencies go one way.

`consumer` writes its dead letters through `dlq.writer`; `dlq` (the writer and the
operator's passes over the topic) never imports `consumer`: what both read of a consumed
record is `rewards_membership.records`. `ops` (the operator's commands) is `cli`'s alone.
"""

from __future__ import annotations

import ast
from importlib.resources import files
from importlib.resources.abc import Traversable


def _imports(package: Traversable) -> dict[str, set[str]]:
    """Every module of `package` (recursively) with the modules it imports."""
    found: dict[str, set[str]] = {}
    for entry in package.iterdir():
        if entry.is_dir():
            found.update({f"{entry.name}/{name}": names for name, names in _imports(entry).items()})
        elif entry.name.endswith(".py"):
            names = found.setdefault(entry.name, set())
            for node in ast.walk(ast.parse(entry.read_text())):
                if isinstance(node, ast.ImportFrom) and node.module is not None:
                    names.add(node.module)
                elif isinstance(node, ast.Import):
                    names.update(alias.name for alias in node.names)
    return found


def _offenders(modules: dict[str, set[str]], forbidden: str) -> list[str]:
    return sorted(
        f"{module}: {name}"
        for module, names in modules.items()
        for name in names
        if name == forbidden or name.startswith(f"{forbidden}.")
    )


def test_the_dead_letter_package_does_not_import_the_consumer() -> None:
    dlq = _imports(files("rewards_membership") / "dlq")
    assert dlq, "no module read"
    assert _offenders(dlq, "rewards_membership.consumer") == []


def test_only_the_cli_imports_the_operator_commands() -> None:
    service = _imports(files("rewards_membership"))
    outside = {m: names for m, names in service.items() if not m.startswith("ops/")}
    importers = {line.split(":")[0] for line in _offenders(outside, "rewards_membership.ops")}
    assert importers == {"cli.py"}
