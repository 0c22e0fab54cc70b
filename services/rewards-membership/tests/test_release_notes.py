"""The release rule of rewards-membership: the version in pyproject.toml has a changelog entry,
the chart ships it, the previous release is tagged and named in UPGRADING.md, and every
migration added since that release is expand-only unless UPGRADING.md lists it as a contract
migration (docs: UPGRADING.md "Versioning policy", "Migrations")."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from pin_testkit.releases import (
    ServiceRelease,
    changelog_versions,
    contract_migrations,
    contract_statements,
    files_at,
    previous_release,
)

SERVICE = ServiceRelease.of(Path(__file__).resolve().parents[1])
ROOT = SERVICE.directory.parents[1]
CHART = ROOT / "infra" / "helm" / SERVICE.name / "Chart.yaml"


def notes(name: str) -> str:
    return (SERVICE.directory / name).read_text(encoding="utf-8")


def test_the_changelog_has_an_entry_for_the_version() -> None:
    versions = changelog_versions(notes("CHANGELOG.md"))
    assert SERVICE.version in versions
    assert versions == sorted(versions, reverse=True), "entries newest first"


def test_the_chart_runs_the_version() -> None:
    chart = yaml.safe_load(CHART.read_text(encoding="utf-8"))
    assert chart["appVersion"] == str(SERVICE.version)


def test_the_previous_release_is_tagged_and_named_in_the_upgrade_notes() -> None:
    previous = previous_release(SERVICE)
    assert previous is not None, f"no {SERVICE.name}-v* tag below {SERVICE.version}"
    version, tag = previous
    assert version in changelog_versions(notes("CHANGELOG.md"))
    assert f"`{tag}`" in notes("UPGRADING.md")


def test_released_migrations_are_never_edited() -> None:
    previous = previous_release(SERVICE)
    assert previous is not None
    released = files_at(previous[1], SERVICE.migrations)
    current = {p.name: p.read_bytes() for p in SERVICE.migrations.glob("*.sql")}
    for name, body in released.items():
        if name.endswith(".sql"):
            assert current.get(name) == body, f"{name} changed (or went) after {previous[1]}"


def test_migrations_since_the_previous_release_are_expand_only() -> None:
    previous = previous_release(SERVICE)
    assert previous is not None
    released = files_at(previous[1], SERVICE.migrations)
    allowed = contract_migrations(notes("UPGRADING.md"))
    new = sorted(p for p in SERVICE.migrations.glob("*.sql") if p.name not in released)
    found = {
        p.name: contract_statements(p.read_text(encoding="utf-8"))
        for p in new
        if p.name not in allowed
    }
    assert {name: reasons for name, reasons in found.items() if reasons} == {}
    assert allowed <= {p.name for p in SERVICE.migrations.glob("*.sql")}, "listed, not found"


def test_the_upgrade_notes_state_the_policy() -> None:
    text = notes("UPGRADING.md")
    for heading in ("Versioning policy", "Migrations", "Contract migrations", "Releases"):
        assert re.search(rf"^## {heading}$", text, re.M), heading
