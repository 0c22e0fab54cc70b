"""Bytes <-> envelopes. Decoding raises only ContractViolation; encoding only InvalidEventError."""

from __future__ import annotations

import functools
import typing
from collections.abc import Iterator
from typing import Any, TypeVar

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
    for path, marker, raw in _unknown_enum_values(envelope, "$"):
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


@functools.cache
def _open_enum_fields(struct_type: type[msgspec.Struct]) -> dict[str, OpenEnum]:
    """Attribute name -> marker for the fields of ``struct_type`` that carry an enum."""
    found: dict[str, OpenEnum] = {}
    hints = typing.get_type_hints(struct_type, include_extras=True)
    for name in struct_type.__struct_fields__:
        hint = hints[name]
        # Either Annotated[str, ..., OpenEnum] or that alias inside `| None`.
        for candidate in (hint, *typing.get_args(hint)):
            for meta in getattr(candidate, "__metadata__", ()):
                if isinstance(meta, OpenEnum):
                    found[name] = meta
    return found


def _unknown_enum_values(value: object, path: str) -> Iterator[tuple[str, OpenEnum, str]]:
    if isinstance(value, msgspec.Struct):
        markers = _open_enum_fields(type(value))
        for name, wire_name in zip(
            value.__struct_fields__, value.__struct_encode_fields__, strict=True
        ):
            field_value = getattr(value, name)
            field_path = f"{path}.{wire_name}"
            marker = markers.get(name)
            if marker is None:
                yield from _unknown_enum_values(field_value, field_path)
            elif isinstance(field_value, str) and field_value not in marker.values:
                yield field_path, marker, field_value
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            yield from _unknown_enum_values(item, f"{path}[{index}]")
