"""JSON Schemas of the events: generation, drift and compatibility checks, and a CLI.

``python -m pin_contracts.schemas check [--dir DIR] [--base DIR]`` exits 1 on findings;
``python -m pin_contracts.schemas write [--dir DIR]`` regenerates the current versions.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from pin_contracts.access import UserAccessChangedKafkaEvent
from pin_contracts.envelope import Envelope, EventPayload
from pin_contracts.errors import ContractError
from pin_contracts.membership import AgentMembershipChanged
from pin_contracts.topics import CATALOGUE

__all__ = [
    "DEFAULT_SCHEMA_DIR",
    "EVENT_PAYLOAD_TYPES",
    "Finding",
    "IncompatibleSchemaError",
    "check",
    "compatibility_problems",
    "generate_schema",
    "main",
    "render_schema",
    "schema_file_name",
    "write",
]

EVENT_PAYLOAD_TYPES: tuple[type[EventPayload], ...] = (
    UserAccessChangedKafkaEvent,
    AgentMembershipChanged,
)

# contracts/src/pin_contracts/schemas.py -> contracts/schemas (the editable workspace install).
DEFAULT_SCHEMA_DIR = Path(__file__).resolve().parents[2] / "schemas"

_DIALECT = "https://json-schema.org/draft/2020-12/schema"
# Keywords that document a schema without changing what it accepts.
_ANNOTATIONS = frozenset({"title", "description", "default", "examples", "$comment"})
# Document-level keywords: they identify a file, not the shape of a value.
_DOCUMENT = frozenset({"$defs", "$schema", "$id"})
_DESCRIBE_LIMIT = 160


@dataclass(frozen=True, slots=True)
class Finding:
    """One problem ``check`` found in one schema file."""

    file: str
    kind: str
    message: str

    def __str__(self) -> str:
        return f"{self.file}: [{self.kind}] {self.message}"


class IncompatibleSchemaError(ContractError):
    """``write`` refused to overwrite a published schema with a breaking change."""

    def __init__(self, findings: Sequence[Finding]) -> None:
        super().__init__("\n".join(str(finding) for finding in findings))
        self.findings = tuple(findings)


def _stem(payload_type: type[EventPayload]) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "-", payload_type.EVENT_TYPE).lower()


def schema_file_name(payload_type: type[EventPayload], contract_version: int | None = None) -> str:
    """``user-access-changed.v1.json``: one file per event per ContractVersion."""
    version = payload_type.CONTRACT_VERSION if contract_version is None else contract_version
    return f"{_stem(payload_type)}.v{version}.json"


def generate_schema(payload_type: type[EventPayload]) -> dict[str, Any]:
    """The JSON Schema of a record value carrying ``payload_type`` at its current version."""
    body: dict[str, Any] = msgspec.json.schema(Envelope[payload_type])  # type: ignore[valid-type]
    envelope_def = body["$defs"][body["$ref"].rpartition("/")[2]]
    # The envelope is generic; one file describes one event, so pin its identity fields.
    envelope_def["properties"]["EventType"]["const"] = payload_type.EVENT_TYPE
    envelope_def["properties"]["ContractVersion"]["const"] = payload_type.CONTRACT_VERSION
    topic = next(
        t for t in CATALOGUE if t.event_type == payload_type.EVENT_TYPE and not t.dead_letter_of
    )
    version = payload_type.CONTRACT_VERSION
    return {
        "$schema": _DIALECT,
        "$id": f"urn:pin:contracts:{_stem(payload_type)}:v{version}",
        "title": f"{payload_type.EVENT_TYPE} (ContractVersion {version})",
        "description": (
            "Value of a Kafka record: UTF-8 JSON envelope. Lists what producers may emit; "
            "readers also accept unknown fields and unknown enum values."
        ),
        "x-pin-topic": topic.name,
        "x-pin-key-field": topic.key_field,
        **body,
    }


def render_schema(schema: Mapping[str, Any]) -> str:
    """The committed text: sorted keys, two-space indent, trailing newline."""
    return json.dumps(schema, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def compatibility_problems(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """What in ``new`` would break a reader (or a message) written against ``old``.

    Breaking: a field removed, a required field added, an optional field made required, a
    type or constraint changed, an enum value removed. Compatible: optional fields added,
    enum values added, documentation changed.
    """
    comparer = _Comparer(old.get("$defs", {}), new.get("$defs", {}))
    comparer.compare(old, new, "$")
    return comparer.problems


class _Comparer:
    def __init__(self, old_defs: Mapping[str, Any], new_defs: Mapping[str, Any]) -> None:
        self._old_defs = old_defs
        self._new_defs = new_defs
        self._seen: set[tuple[str, str]] = set()
        self.problems: list[str] = []

    @staticmethod
    def _resolve(schema: Mapping[str, Any], defs: Mapping[str, Any]) -> Mapping[str, Any]:
        while "$ref" in schema:
            name = str(schema["$ref"]).rpartition("/")[2]
            schema = defs.get(name, {})
        return schema

    def compare(self, old: Mapping[str, Any], new: Mapping[str, Any], path: str) -> None:
        if "$ref" in old and "$ref" in new:
            # Recursive definitions would otherwise loop forever.
            pair = (str(old["$ref"]), str(new["$ref"]))
            if pair in self._seen:
                return
            self._seen.add(pair)
        old = self._resolve(old, self._old_defs)
        new = self._resolve(new, self._new_defs)
        if "properties" in old and "properties" in new:
            self._compare_object(old, new, path)
        elif "anyOf" in old and "anyOf" in new and len(old["anyOf"]) == len(new["anyOf"]):
            for index, (old_item, new_item) in enumerate(
                zip(old["anyOf"], new["anyOf"], strict=True)
            ):
                self.compare(old_item, new_item, path if index == 0 else f"{path}|{index}")
            self._compare_rest(old, new, path, nested=("anyOf",))
        elif "items" in old and "items" in new:
            self.compare(old["items"], new["items"], f"{path}[]")
            self._compare_rest(old, new, path, nested=("items",))
        else:
            self._compare_leaf(old, new, path)

    def _compare_object(self, old: Mapping[str, Any], new: Mapping[str, Any], path: str) -> None:
        old_props, new_props = old["properties"], new["properties"]
        old_required, new_required = set(old.get("required", ())), set(new.get("required", ()))
        for name, old_schema in old_props.items():
            field = f"{path}.{name}"
            if name not in new_props:
                self.problems.append(f"{field}: field removed")
                continue
            if name in new_required and name not in old_required:
                self.problems.append(f"{field}: optional field became required")
            self.compare(old_schema, new_props[name], field)
        for name in new_props.keys() - old_props.keys():
            if name in new_required:
                self.problems.append(f"{path}.{name}: required field added")
        self._compare_rest(old, new, path, nested=("properties", "required"))

    def _compare_rest(
        self, old: Mapping[str, Any], new: Mapping[str, Any], path: str, nested: Sequence[str]
    ) -> None:
        old_rest = _strip(old, nested)
        new_rest = _strip(new, nested)
        if old_rest != new_rest:
            self.problems.append(
                f"{path}: changed from {_describe(old_rest)} to {_describe(new_rest)}"
            )

    def _compare_leaf(self, old: Mapping[str, Any], new: Mapping[str, Any], path: str) -> None:
        old_rest = _strip(old, ("enum",))
        new_rest = _strip(new, ("enum",))
        if old_rest != new_rest:
            self.problems.append(
                f"{path}: type changed from {_describe(old_rest)} to {_describe(new_rest)}"
            )
            return
        old_enum, new_enum = old.get("enum"), new.get("enum")
        if old_enum is None and new_enum is not None:
            self.problems.append(f"{path}: values restricted to {new_enum}")
        elif old_enum is not None and new_enum is not None:
            removed = [value for value in old_enum if value not in new_enum]
            if removed:
                self.problems.append(f"{path}: enum value(s) removed: {removed}")


def _strip(schema: Mapping[str, Any], nested: Sequence[str]) -> dict[str, Any]:
    return {
        key: value
        for key, value in schema.items()
        if key not in _ANNOTATIONS
        and key not in _DOCUMENT
        and key not in nested
        and not key.startswith("x-")
    }


def _describe(schema: Mapping[str, Any]) -> str:
    text = json.dumps(schema, sort_keys=True)
    return text if len(text) <= _DESCRIBE_LIMIT else text[: _DESCRIBE_LIMIT - 3] + "..."


def _published_versions(schema_dir: Path, payload_type: type[EventPayload]) -> list[int]:
    pattern = re.compile(rf"^{re.escape(_stem(payload_type))}\.v(\d+)\.json$")
    found = (pattern.match(path.name) for path in schema_dir.glob("*.json"))
    return sorted(int(match.group(1)) for match in found if match)


def _compat_findings(
    base_file: Path, payload_type: type[EventPayload], generated: Mapping[str, Any]
) -> list[Finding]:
    if not base_file.exists():
        # A new ContractVersion may break what it likes: readers opt in to it.
        return []
    try:
        published = json.loads(base_file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        return [Finding(base_file.name, "unreadable", str(exc))]
    version = payload_type.CONTRACT_VERSION
    return [
        Finding(
            base_file.name,
            "breaking",
            f"{problem}; bump {payload_type.__name__}.CONTRACT_VERSION past {version} "
            "(a new file is written next to this one) or make the change additive",
        )
        for problem in compatibility_problems(published, generated)
    ]


def check(
    schema_dir: Path = DEFAULT_SCHEMA_DIR,
    *,
    base_dir: Path | None = None,
    payload_types: Sequence[type[EventPayload]] = EVENT_PAYLOAD_TYPES,
) -> list[Finding]:
    """Drift of ``schema_dir`` from the code, and breaking changes against ``base_dir``.

    ``base_dir`` holds the schemas as published (e.g. extracted from the main branch); it
    defaults to ``schema_dir``, which catches breaks made in code but not yet written.
    """
    findings: list[Finding] = []
    for payload_type in payload_types:
        version = payload_type.CONTRACT_VERSION
        name = schema_file_name(payload_type)
        generated = generate_schema(payload_type)
        published = _published_versions(schema_dir, payload_type)
        for old in range(1, version):
            if old not in published:
                findings.append(
                    Finding(
                        schema_file_name(payload_type, old),
                        "missing-history",
                        "a published ContractVersion's schema must stay committed",
                    )
                )
        findings.extend(
            Finding(
                schema_file_name(payload_type, ahead),
                "ahead",
                f"the code is at ContractVersion {version}; this file has no code behind it",
            )
            for ahead in published
            if ahead > version
        )
        findings.extend(_compat_findings((base_dir or schema_dir) / name, payload_type, generated))
        path = schema_dir / name
        if not path.exists():
            findings.append(Finding(name, "missing", "run `python -m pin_contracts.schemas write`"))
        elif path.read_bytes() != render_schema(generated).encode():
            findings.append(
                Finding(
                    name,
                    "drift",
                    "committed schema differs from the code; "
                    "run `python -m pin_contracts.schemas write` and commit the result",
                )
            )
    return findings


def write(
    schema_dir: Path = DEFAULT_SCHEMA_DIR,
    *,
    payload_types: Sequence[type[EventPayload]] = EVENT_PAYLOAD_TYPES,
) -> list[Path]:
    """Write the current version of every schema that changed; return the files written.

    Refuses (IncompatibleSchemaError) to overwrite a version's file with a breaking change:
    that would let ``check`` pass on a break that readers of the version would feel.
    """
    pending: list[tuple[Path, str]] = []
    refused: list[Finding] = []
    for payload_type in payload_types:
        path = schema_dir / schema_file_name(payload_type)
        generated = generate_schema(payload_type)
        refused.extend(_compat_findings(path, payload_type, generated))
        text = render_schema(generated)
        if not path.exists() or path.read_bytes() != text.encode():
            pending.append((path, text))
    if refused:
        raise IncompatibleSchemaError(refused)
    schema_dir.mkdir(parents=True, exist_ok=True)
    for path, text in pending:
        path.write_text(text, encoding="utf-8")
    return [path for path, _ in pending]


def main(
    argv: Sequence[str] | None = None,
    *,
    payload_types: Sequence[type[EventPayload]] = EVENT_PAYLOAD_TYPES,
) -> int:
    """CLI entry point; returns the exit code."""
    parser = argparse.ArgumentParser(prog="python -m pin_contracts.schemas")
    parser.add_argument("command", choices=("check", "write"))
    parser.add_argument(
        "--dir", type=Path, default=None, help=f"schema directory (default {DEFAULT_SCHEMA_DIR})"
    )
    parser.add_argument(
        "--base", type=Path, default=None, help="published schemas to check compatibility with"
    )
    args = parser.parse_args(argv)
    schema_dir: Path = DEFAULT_SCHEMA_DIR if args.dir is None else args.dir
    # From an installed wheel the default points outside any checkout: never create it there.
    if args.dir is None and not schema_dir.is_dir():
        sys.stderr.write(f"no schema directory at {schema_dir}; pass --dir\n")
        return 2
    if args.command == "write":
        try:
            written = write(schema_dir, payload_types=payload_types)
        except IncompatibleSchemaError as exc:
            sys.stderr.write(f"refusing to write:\n{exc}\n")
            return 1
        for path in written:
            sys.stdout.write(f"wrote {path}\n")
        sys.stdout.write(f"{len(written)} schema file(s) written to {schema_dir}\n")
        return 0
    findings = check(schema_dir, base_dir=args.base, payload_types=payload_types)
    for finding in findings:
        sys.stderr.write(f"{finding}\n")
    if findings:
        sys.stderr.write(f"{len(findings)} schema finding(s) in {schema_dir}\n")
        return 1
    sys.stdout.write(f"schemas in {schema_dir} match the code and are compatible\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
