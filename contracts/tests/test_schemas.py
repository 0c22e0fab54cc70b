"""JSON Schema drift and compatibility checks: passing on the code, failing on breaks."""

from __future__ import annotations

import copy
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, ClassVar, cast

import pytest

from pin_contracts import AgentMembershipChanged, EventPayload, UserAccessChangedKafkaEvent
from pin_contracts.schemas import (
    EVENT_PAYLOAD_TYPES,
    IncompatibleSchemaError,
    check,
    compatibility_problems,
    generate_schema,
    main,
    render_schema,
    schema_file_name,
    write,
)

SCHEMA_DIR = Path(__file__).resolve().parents[1] / "schemas"
MEMBERSHIP_FILE = "agent-membership-changed.v1.json"


class WithNote(AgentMembershipChanged, frozen=True, kw_only=True):
    """Additive change: a new optional field with a default."""

    note: str | None = None


class VersionAsText(AgentMembershipChanged, frozen=True, kw_only=True):
    """Breaking change: an existing field's type changed."""

    version: str  # type: ignore[assignment]


class VersionAsTextV2(VersionAsText, frozen=True, kw_only=True):
    """The same break, shipped properly as a new ContractVersion."""

    CONTRACT_VERSION: ClassVar[int] = 2


# A str Version no longer satisfies EventPayload; that break is what these tests are about.
VERSION_AS_TEXT = cast("type[EventPayload]", VersionAsText)
VERSION_AS_TEXT_V2 = cast("type[EventPayload]", VersionAsTextV2)


@pytest.fixture
def schema_copy(tmp_path: Path) -> Path:
    target = tmp_path / "schemas"
    shutil.copytree(SCHEMA_DIR, target)
    return target


def membership_defs(schema: dict[str, Any]) -> dict[str, Any]:
    payload: dict[str, Any] = schema["$defs"]["AgentMembershipChanged"]
    return payload


# --- the real code ---------------------------------------------------------------------


def test_committed_schemas_match_the_code() -> None:
    assert check(SCHEMA_DIR) == []


def test_every_event_has_a_committed_schema_per_version() -> None:
    names = sorted(path.name for path in SCHEMA_DIR.glob("*.json"))

    assert names == ["agent-membership-changed.v1.json", "user-access-changed.v1.json"]
    assert [schema_file_name(t) for t in EVENT_PAYLOAD_TYPES] == [
        "user-access-changed.v1.json",
        MEMBERSHIP_FILE,
    ]


def test_committed_files_are_pretty_sorted_and_end_with_a_newline() -> None:
    for path in SCHEMA_DIR.glob("*.json"):
        text = path.read_text(encoding="utf-8")
        assert text == json.dumps(json.loads(text), indent=2, sort_keys=True) + "\n"


def test_schema_identifies_event_version_and_topic() -> None:
    schema = generate_schema(UserAccessChangedKafkaEvent)
    envelope = schema["$defs"]["Envelope_UserAccessChangedKafkaEvent_"]["properties"]

    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert schema["x-pin-topic"] == "pin.identity.access.v1"
    assert schema["x-pin-key-field"] == "UserId"
    assert envelope["EventType"]["const"] == "UserAccessChanged"
    assert envelope["ContractVersion"]["const"] == 1


def test_cli_check_passes_on_the_real_code(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check"]) == 0
    assert "match the code" in capsys.readouterr().out


def test_cli_runs_as_a_module() -> None:
    result = subprocess.run(
        [sys.executable, "-W", "error", "-m", "pin_contracts.schemas", "check"],
        capture_output=True,
        text=True,
        check=False,
    )

    assert result.returncode == 0, result.stderr


# --- drift -----------------------------------------------------------------------------


def test_drift_is_found_in_a_corrupted_copy(schema_copy: Path) -> None:
    path = schema_copy / MEMBERSHIP_FILE
    schema = json.loads(path.read_text())
    membership_defs(schema)["description"] = "edited by hand"
    path.write_text(render_schema(schema))

    findings = check(schema_copy)

    assert [(f.file, f.kind) for f in findings] == [(MEMBERSHIP_FILE, "drift")]


def test_unparsable_file_is_reported(schema_copy: Path) -> None:
    (schema_copy / MEMBERSHIP_FILE).write_text("{ not json")

    kinds = {finding.kind for finding in check(schema_copy)}

    assert kinds == {"unreadable", "drift"}


def test_write_repairs_drift(schema_copy: Path) -> None:
    path = schema_copy / MEMBERSHIP_FILE
    path.write_text(path.read_text().replace("Payload of", "Body of"))

    written = write(schema_copy)

    assert written == [schema_copy / MEMBERSHIP_FILE]
    assert check(schema_copy) == []
    assert write(schema_copy) == []


def test_missing_file_is_reported(schema_copy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (schema_copy / MEMBERSHIP_FILE).unlink()

    assert [f.kind for f in check(schema_copy)] == ["missing"]
    assert main(["check", "--dir", str(schema_copy)]) == 1
    assert f"{MEMBERSHIP_FILE}: [missing]" in capsys.readouterr().err


def test_additive_field_drifts_but_stays_compatible() -> None:
    findings = check(SCHEMA_DIR, payload_types=[WithNote])

    assert [(f.file, f.kind) for f in findings] == [(MEMBERSHIP_FILE, "drift")]


# --- compatibility ---------------------------------------------------------------------


def test_changed_field_type_in_a_struct_is_breaking() -> None:
    findings = check(SCHEMA_DIR, payload_types=[VERSION_AS_TEXT])

    assert [f.kind for f in findings] == ["breaking", "drift"]
    assert "$.Payload.Version: type changed" in findings[0].message
    assert "bump VersionAsText.CONTRACT_VERSION past 1" in findings[0].message


def test_write_refuses_to_overwrite_a_version_with_a_break(schema_copy: Path) -> None:
    before = (schema_copy / MEMBERSHIP_FILE).read_text()

    with pytest.raises(IncompatibleSchemaError) as caught:
        write(schema_copy, payload_types=[VERSION_AS_TEXT])

    assert "$.Payload.Version" in str(caught.value)
    assert (schema_copy / MEMBERSHIP_FILE).read_text() == before


def test_base_dir_catches_a_break_already_written_over_the_file(schema_copy: Path) -> None:
    # Someone hand-wrote the broken schema over v1, so the copy agrees with the code.
    (schema_copy / MEMBERSHIP_FILE).write_text(render_schema(generate_schema(VERSION_AS_TEXT)))

    assert check(schema_copy, payload_types=[VERSION_AS_TEXT]) == []
    findings = check(schema_copy, base_dir=SCHEMA_DIR, payload_types=[VERSION_AS_TEXT])
    assert [f.kind for f in findings] == ["breaking"]


def test_bumping_contract_version_writes_a_new_file_next_to_the_old(schema_copy: Path) -> None:
    assert [f.kind for f in check(schema_copy, payload_types=[VERSION_AS_TEXT_V2])] == ["missing"]

    written = write(schema_copy, payload_types=[VERSION_AS_TEXT_V2])

    assert written == [schema_copy / "agent-membership-changed.v2.json"]
    assert (schema_copy / MEMBERSHIP_FILE).read_bytes() == (
        SCHEMA_DIR / MEMBERSHIP_FILE
    ).read_bytes()
    assert check(schema_copy, payload_types=[VERSION_AS_TEXT_V2]) == []


def test_a_published_version_must_stay(schema_copy: Path) -> None:
    write(schema_copy, payload_types=[VERSION_AS_TEXT_V2])
    (schema_copy / MEMBERSHIP_FILE).unlink()

    findings = check(schema_copy, payload_types=[VERSION_AS_TEXT_V2])

    assert [(f.file, f.kind) for f in findings] == [(MEMBERSHIP_FILE, "missing-history")]


def test_a_file_ahead_of_the_code_is_reported(schema_copy: Path) -> None:
    write(schema_copy, payload_types=[VERSION_AS_TEXT_V2])

    findings = check(schema_copy, payload_types=[AgentMembershipChanged])

    assert [(f.file, f.kind) for f in findings] == [("agent-membership-changed.v2.json", "ahead")]


def test_cli_reports_breaks_readably(schema_copy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "--dir", str(schema_copy)], payload_types=[VERSION_AS_TEXT]) == 1
    err = capsys.readouterr().err
    assert f"{MEMBERSHIP_FILE}: [breaking] $.Payload.Version: type changed" in err
    assert "2 schema finding(s)" in err


@pytest.fixture
def published() -> dict[str, Any]:
    return generate_schema(AgentMembershipChanged)


def _changed(schema: dict[str, Any], edit: Any) -> dict[str, Any]:
    changed = copy.deepcopy(schema)
    edit(membership_defs(changed))
    return changed


def _remove_field(payload: dict[str, Any]) -> None:
    del payload["properties"]["AgentUserId"]
    payload["required"].remove("AgentUserId")


def _add_required_field(payload: dict[str, Any]) -> None:
    payload["properties"]["Region"] = {"type": "string"}
    payload["required"].append("Region")


def _make_optional_required(payload: dict[str, Any]) -> None:
    payload["required"].append("Reason")


def _change_type(payload: dict[str, Any]) -> None:
    payload["properties"]["Version"] = {"type": "string"}


def _make_not_nullable(payload: dict[str, Any]) -> None:
    payload["properties"]["LeftAt"] = {"type": "string", "format": "date-time"}


def _tighten_constraint(payload: dict[str, Any]) -> None:
    payload["properties"]["Version"]["minimum"] = 2


def _remove_enum_value(payload: dict[str, Any]) -> None:
    payload["properties"]["Status"]["enum"].remove("Left")


def _remove_nested_enum_value(payload: dict[str, Any]) -> None:
    payload["properties"]["Reason"]["anyOf"][0]["enum"].remove("SelfLeave")


@pytest.mark.parametrize(
    ("edit", "problem"),
    [
        (_remove_field, "$.Payload.AgentUserId: field removed"),
        (_add_required_field, "$.Payload.Region: required field added"),
        (_make_optional_required, "$.Payload.Reason: optional field became required"),
        (_change_type, "$.Payload.Version: type changed"),
        (_make_not_nullable, "$.Payload.LeftAt: type changed"),
        (_tighten_constraint, "$.Payload.Version: type changed"),
        (_remove_enum_value, "$.Payload.Status: enum value(s) removed: ['Left']"),
        (_remove_nested_enum_value, "$.Payload.Reason: enum value(s) removed: ['SelfLeave']"),
    ],
)
def test_breaking_schema_edits_are_found(
    published: dict[str, Any], edit: Any, problem: str
) -> None:
    problems = compatibility_problems(published, _changed(published, edit))

    assert len(problems) == 1
    assert problems[0].startswith(problem)


def _add_optional_field(payload: dict[str, Any]) -> None:
    payload["properties"]["Region"] = {"anyOf": [{"type": "string"}, {"type": "null"}]}


def _add_enum_value(payload: dict[str, Any]) -> None:
    payload["properties"]["Status"]["enum"].append("Suspended")


def _make_required_optional(payload: dict[str, Any]) -> None:
    payload["required"].remove("JoinedAt")


def _redocument(payload: dict[str, Any]) -> None:
    payload["description"] = "new words"
    payload["properties"]["Status"]["description"] = "new words"


@pytest.mark.parametrize(
    "edit", [_add_optional_field, _add_enum_value, _make_required_optional, _redocument]
)
def test_compatible_schema_edits_pass(published: dict[str, Any], edit: Any) -> None:
    assert compatibility_problems(published, _changed(published, edit)) == []


def test_envelope_breaks_are_found(published: dict[str, Any]) -> None:
    changed = copy.deepcopy(published)
    envelope = changed["$defs"]["Envelope_AgentMembershipChanged_"]["properties"]
    envelope["AggregateId"] = {"type": "string", "format": "uuid"}
    envelope["EventType"]["const"] = "MembershipChanged"

    problems = compatibility_problems(published, changed)

    assert [p.split(":")[0] for p in problems] == ["$.EventType", "$.AggregateId"]


def test_cli_write_regenerates_and_refuses_breaks(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "fresh"

    assert main(["write", "--dir", str(target)]) == 0
    assert main(["check", "--dir", str(target), "--base", str(SCHEMA_DIR)]) == 0
    assert main(["write", "--dir", str(target)], payload_types=[VERSION_AS_TEXT]) == 1
    assert "refusing to write" in capsys.readouterr().err
    assert sorted(p.name for p in target.iterdir()) == sorted(p.name for p in SCHEMA_DIR.iterdir())
