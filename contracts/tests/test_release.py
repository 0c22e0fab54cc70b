"""The version of pin-contracts moves when a schema moves (pin_contracts.release)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from pin_contracts.release import ReleaseState, Version, main, problems, read_state

CONTRACTS = Path(__file__).resolve().parents[1]


def state(version: str, schemas: dict[str, bytes], changelog: str | None = None) -> ReleaseState:
    text = f"# Changelog\n\n## {version}\n\n- something\n" if changelog is None else changelog
    return ReleaseState(version=Version.parse(version), schemas=schemas, changelog=text)


V1 = {"agent-membership-changed.v1.json": b'{"a": 1}\n', "user-access-changed.v1.json": b"{}\n"}


def test_no_schema_change_needs_no_bump() -> None:
    assert problems(state("1.0.0", V1), state("1.0.0", V1)) == []


def test_a_changed_schema_needs_a_new_version() -> None:
    changed = {**V1, "agent-membership-changed.v1.json": b'{"a": 2}\n'}
    (problem,) = problems(state("1.0.0", V1), state("1.0.0", changed))
    assert "~agent-membership-changed.v1.json" in problem
    assert "bump" in problem
    assert problems(state("1.0.0", V1), state("1.1.0", changed)) == []


def test_a_removed_schema_needs_a_new_version() -> None:
    fewer = {"user-access-changed.v1.json": b"{}\n"}
    (problem,) = problems(state("1.0.0", V1), state("1.0.0", fewer))
    assert "-agent-membership-changed.v1.json" in problem


def test_a_new_contract_version_needs_a_major_release() -> None:
    v2 = {**V1, "agent-membership-changed.v2.json": b"{}\n"}
    (problem,) = problems(state("1.0.0", V1), state("1.1.0", v2))
    assert "major" in problem
    assert "2.0.0" in problem
    assert problems(state("1.0.0", V1), state("2.0.0", v2)) == []


def test_a_new_event_is_a_minor_release() -> None:
    more = {**V1, "agency-renamed.v1.json": b"{}\n"}
    assert problems(state("1.0.0", V1), state("1.1.0", more)) == []


def test_the_version_never_goes_down() -> None:
    found = problems(state("1.2.0", V1), state("1.1.0", V1))
    assert any("went down" in p for p in found)


def test_the_version_has_a_changelog_section() -> None:
    (problem,) = problems(state("1.0.0", V1), state("1.0.1", V1, changelog="## 1.0.0\n"))
    assert "## 1.0.1" in problem
    assert problems(state("1.0.0", V1), state("1.0.10", V1, changelog="## 1.0.1\n"))


def test_version_parsing() -> None:
    assert Version.parse("1.10.0") > Version.parse("1.9.3")
    with pytest.raises(ValueError, match=r"MAJOR\.MINOR\.PATCH"):
        Version.parse("1.0")


def test_the_repository_state_is_releasable_against_itself() -> None:
    current = read_state(CONTRACTS)
    assert current.schemas, "no schema files found"
    assert problems(current, current) == []


def test_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = tmp_path / "base"
    shutil.copytree(CONTRACTS, base, ignore=shutil.ignore_patterns("src", "tests", "*cache*"))
    assert main(["check", "--base", str(base), "--dir", str(CONTRACTS)]) == 0
    assert "release rule ok" in capsys.readouterr().out
    schema = next((base / "schemas").glob("*.json"))
    schema.write_text(schema.read_text() + " ")
    assert main(["check", "--base", str(base), "--dir", str(CONTRACTS)]) == 1
    assert "bump" in capsys.readouterr().err
    assert main(["check", "--base", str(tmp_path / "missing"), "--dir", str(CONTRACTS)]) == 2
