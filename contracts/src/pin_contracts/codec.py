"""Bytes <-> envelopes. Decoding raises only ContractViolation; encoding only InvalidEventError."""

from __future__ import annotations

import functools
import typing
from collections.abc import Iterator
from typing import Any, NamedTuple, TypeVar

import msgspec

from pin_contracts.access import UserAccessChangedKafkaEvent
from pin_contracts.enums import OpenEnum
from pin_contracts.envelope import Envelope, EventPayload
from pin_contracts.errors import ContractViolation, InvalidEventError, UnknownEnumValueError
from pin_contracts.membership import AgentMembershipChanged

__all__ = ["decode", "decode_access_changed", "decode_membership_changed", "encode"]

P = TypeVar("P", bound=EventPayload)

_ENCODER = msgspec.json.Encoder()
_MISSING_FIELD = "Object missing required field `"


@functools.cache
def _decoder(payload_type: type[Any]) -> msgspec.json.Decoder[Any]:
    # One compiled decoder per payload type; msgspec builds it once and reuses it.
    return msgspec.json.Decoder(Envelope[payload_type])  # type: ignore[valid-type]


def _split(exc: msgspec.MsgspecError) -> tuple[str, str]:
    """Turn msgspec's "reason - at `$.path`" into (path, reason), naming a missing field."""
    message = str(exc)
    reason, sep, tail = message.rpartition(" - at `")
    if sep and tail.endswith("`"):
        path = tail[:-1]
    else:
        reason, path = message, "$"
    if reason.startswith(_MISSING_FIELD) and reason.endswith("`"):
        path = f"{path}.{reason[len(_MISSING_FIELD) : -1]}"
    return path, reason


def decode(value: bytes | None, payload_type: type[P]) -> Envelope[P]:
    """Decode a record value into an envelope of ``payload_type``.

    Unknown fields and unknown enum values pass; everything else wrong is a ContractViolation.
    """
    if value is None:
        raise ContractViolation("$", "record value is null (tombstone); events are never null")
    if not isinstance(value, bytes | bytearray | memoryview):
        raise ContractViolation("$", f"record value must be bytes, got {type(value).__name__}")
    try:
        envelope: Envelope[P] = _decoder(payload_type).decode(value)
    except msgspec.ValidationError as exc:
        raise ContractViolation(*_split(exc)) from exc
    except msgspec.DecodeError as exc:
        raise ContractViolation("$", f"not valid UTF-8 JSON: {exc}") from exc
    except RecursionError as exc:
        # msgspec recurses into unknown fields too, so nesting depth is attacker-controlled.
        raise ContractViolation("$", "JSON nested too deeply") from exc
    if envelope.event_type != payload_type.EVENT_TYPE:
        raise ContractViolation(
            "$.EventType",
            f"expected {payload_type.EVENT_TYPE!r}, got {envelope.event_type!r}",
        )
    return envelope


def decode_access_changed(value: bytes | None) -> Envelope[UserAccessChangedKafkaEvent]:
    """Decode a record of ``pin.identity.access.v1``."""
    return decode(value, UserAccessChangedKafkaEvent)


def decode_membership_changed(value: bytes | None) -> Envelope[AgentMembershipChanged]:
    """Decode a record of ``pin.identity.agent-membership-changed.v1``."""
    return decode(value, AgentMembershipChanged)


def encode(envelope: Envelope[P]) -> bytes:
    """Encode an envelope as the record value, refusing anything a reader would reject."""
    payload = envelope.payload
    payload_type = type(payload)
    expected = {
        "$.EventType": (envelope.event_type, payload_type.EVENT_TYPE),
        "$.ContractVersion": (envelope.contract_version, payload_type.CONTRACT_VERSION),
        "$.AggregateType": (envelope.aggregate_type, payload_type.AGGREGATE_TYPE),
        "$.Version": (envelope.version, payload.version),
    }
    for path, (actual, wanted) in expected.items():
        if actual != wanted:
            raise InvalidEventError(path, f"expected {wanted!r} for this payload, got {actual!r}")
    # The envelope's own fields carry no enum; its Payload is generic, so it is walked here.
    for path, marker, raw in _unknown_enum_values(payload, "$.Payload"):
        raise UnknownEnumValueError(path, marker.enum_type, raw)
    try:
        data = _ENCODER.encode(envelope)
    except (TypeError, msgspec.EncodeError) as exc:
        raise InvalidEventError("$", str(exc)) from exc
    # msgspec checks constraints (Version >= 1, aware datetimes, field types) only when
    # decoding, so decode what was produced: a producer can never emit what readers reject.
    try:
        _decoder(payload_type).decode(data)
    except msgspec.ValidationError as exc:
        raise InvalidEventError(*_split(exc)) from exc
    return data


class _FieldCheck(NamedTuple):
    """How to look for unknown enum values in one field of a Struct type."""

    attr: str
    wire_name: str
    marker: OpenEnum | None
    """Set for an enum-carrying field: its value is checked against the known values."""
    nested: tuple[type[msgspec.Struct], bool] | None
    """Set for a field holding a Struct (False) or a sequence of Structs (True)."""


def _struct_in(hint: Any) -> tuple[type[msgspec.Struct], bool] | None:
    """The Struct type a hint holds, directly, optionally, or as the items of a sequence."""
    for candidate in (hint, *typing.get_args(hint)):
        if isinstance(candidate, type) and issubclass(candidate, msgspec.Struct):
            return candidate, False
        origin = typing.get_origin(candidate)
        if origin in (list, tuple):
            items = [a for a in typing.get_args(candidate) if a is not Ellipsis]
            if (
                len(items) == 1
                and isinstance(items[0], type)
                and issubclass(items[0], msgspec.Struct)
            ):
                return items[0], True
    return None


@functools.cache
def _field_checks(struct_type: type[msgspec.Struct]) -> tuple[_FieldCheck, ...]:
    """The fields of ``struct_type`` that can hold an enum value, found once per type.

    Encoding is on the producers' hot path (a fan-out encodes thousands of events a second):
    scalar fields are skipped here once instead of being visited on every encode.
    """
    hints = typing.get_type_hints(struct_type, include_extras=True)
    checks: list[_FieldCheck] = []
    for attr, wire_name in zip(
        struct_type.__struct_fields__, struct_type.__struct_encode_fields__, strict=True
    ):
        hint = hints[attr]
        marker = next(
            (
                meta
                for candidate in (hint, *typing.get_args(hint))
                for meta in getattr(candidate, "__metadata__", ())
                if isinstance(meta, OpenEnum)
            ),
            None,
        )
        nested = None if marker is not None else _struct_in(hint)
        if marker is not None or (nested is not None and _field_checks(nested[0])):
            checks.append(_FieldCheck(attr, wire_name, marker, nested))
    return tuple(checks)


def _unknown_enum_values(value: object, path: str) -> Iterator[tuple[str, OpenEnum, str]]:
    if not isinstance(value, msgspec.Struct):
        return
    for check in _field_checks(type(value)):
        field_value = getattr(value, check.attr)
        field_path = f"{path}.{check.wire_name}"
        if check.marker is not None:
            if isinstance(field_value, str) and field_value not in check.marker.values:
                yield field_path, check.marker, field_value
        elif field_value is None:
            continue
        elif check.nested is not None and check.nested[1]:
            for index, item in enumerate(field_value):
                yield from _unknown_enum_values(item, f"{field_path}[{index}]")
        else:
            yield from _unknown_enum_values(field_value, field_path)
