"""Spec steps 1-2 as a pure function: record value -> a typed change or the reason it is invalid.

No I/O: the consumer decides what to do with the outcome (apply, dead-letter, warn).
"""

from __future__ import annotations

import contextlib
import enum
from collections.abc import Mapping
from datetime import datetime
from typing import Final
from uuid import UUID

import msgspec

from pin_contracts import (
    EMPTY_GUID,
    REWARDS_MEMBERSHIP_EVENT_INVALID,
    AgentMembershipChanged,
    AgentMembershipStatus,
    ContractViolation,
    LeaveReason,
    UnknownEnumValue,
    Unreadable,
    decode_membership_changed,
    read_untrusted,
)

__all__ = [
    "EXPECTED_CONTRACT_VERSION",
    "IDEMPOTENCY_PREFIX",
    "KEY_MISSING",
    "KEY_NOT_AGENT_USER_ID",
    "KEY_NOT_UTF8",
    "KEY_PROBLEMS",
    "LOGGED_FIELDS",
    "NO_KEY_CHECK",
    "InvalidEvent",
    "Item",
    "MembershipChange",
    "NoKeyCheck",
    "idempotency_key",
    "key_problem",
    "position_key",
    "readable_fields",
    "validate",
]

EXPECTED_CONTRACT_VERSION: Final = AgentMembershipChanged.CONTRACT_VERSION
IDEMPOTENCY_PREFIX: Final = "rewards:identity-membership:"
_EMPTY_GUID_INT: Final = EMPTY_GUID.int
_VIOLATION_FQCN: Final = f"{ContractViolation.__module__}.{ContractViolation.__qualname__}"


def idempotency_key(message_id: UUID) -> str:
    """The spec's inbox key: `rewards:identity-membership:{MessageId}`."""
    return f"{IDEMPOTENCY_PREFIX}{message_id}"


def position_key(topic: str, partition: int, offset: int) -> str:
    """The inbox key of a record whose MessageId cannot be read: its place in the topic.

    Such a record is dead-lettered once however often it is redelivered; a replayed copy
    lands at another offset, so it is processed again.
    """
    return f"{IDEMPOTENCY_PREFIX}at:{topic}:{partition}:{offset}"


class MembershipChange(msgspec.Struct, frozen=True, kw_only=True):
    """A valid event, with Status and Reason already mapped the way the spec says.

    `status` is the effective one: an unknown wire Status fails closed as LEFT. `leave_reason`
    is None for Active and for an unknown Reason (soft degradation); the decoded `payload`
    keeps the raw strings for the logs, and every other field of the event.
    """

    message_id: UUID
    contract_version: int
    occurred_at: datetime
    correlation_id: str | None
    """The envelope's CorrelationId (identity sets it on every event): on each log line."""
    payload: AgentMembershipChanged
    status: AgentMembershipStatus
    leave_reason: LeaveReason | None
    unknown_status: bool
    unknown_reason: bool

    key: str
    """The inbox key, `idempotency_key(message_id)`, computed once: a batch looks it up twice."""
    key_problem: str | None = None
    """Why the record's Kafka key is not its AgentUserId's canonical text (`KEY_PROBLEMS`),
    None when it is: such a change is applied all the same (the version guard keeps its row
    right whatever the order), counted and logged."""
    row_key: tuple[UUID, UUID]
    """(AgentUserId, CompanyId): the projection row the change belongs to."""

    @property
    def contract_mismatch(self) -> bool:
        return self.contract_version != EXPECTED_CONTRACT_VERSION


class InvalidEvent(msgspec.Struct, frozen=True, kw_only=True):
    """REWARDS_MEMBERSHIP_EVENT_INVALID: the record goes to the DLQ with these details."""

    path: str
    reason: str
    error_code: str = REWARDS_MEMBERSHIP_EVENT_INVALID
    exception_fqcn: str = _VIOLATION_FQCN
    message_id: UUID | None = None
    fields: Mapping[str, object] = msgspec.field(default_factory=dict)
    """What could be decoded (AgentUserId, CompanyId, Status, Reason, Version) for the log."""
    key: str | None = None
    """The inbox key: the MessageId's when it could be read; otherwise the consumer sets
    the record's `position_key` before planning the batch."""

    @property
    def message(self) -> str:
        return f"{self.path}: {self.reason}"


Item = MembershipChange | InvalidEvent
"""What `validate` makes of one record: a change to apply or the reason it is invalid."""


class NoKeyCheck(enum.Enum):
    """`validate` without the key check (the sentinel's type)."""

    NO_KEY_CHECK = enum.auto()


NO_KEY_CHECK: Final = NoKeyCheck.NO_KEY_CHECK


LOGGED_FIELDS: Final = ("AgentUserId", "CompanyId", "Status", "Reason", "Version")
"""The payload's fields every log line of an event names (spec "Наблюдаемость"), MessageId
and CorrelationId beside them."""
_LONGEST_LOGGED: Final = 100
"""A refused record's field is logged up to this many characters (it may be anything)."""


_OBJECT: Final = msgspec.json.Decoder(dict[str, msgspec.Raw])
_SCALAR: Final = msgspec.json.Decoder(str | int | float | bool | None)
_INT64_MIN: Final = -(2**63)
_INT64_MAX: Final = 2**63 - 1


def readable_fields(value: bytes | None) -> tuple[UUID | None, dict[str, object]]:
    """What the log of a record the contract refuses can still say: its MessageId and the
    payload's named fields wherever the bytes are a JSON object holding them, as they are
    (scalars only, long text cut). Pure; nothing here decides anything.

    Never raises, whatever the bytes (`read_untrusted`): each level is read as an object of
    unread (raw) members and only the named ones are read further, so a member that is not
    a scalar, a number beyond int64 and float, or invalid text costs only that field, and
    of duplicate keys the last counts (as for the contract's decoder).
    """
    document = read_untrusted(_OBJECT, value or b"")
    if isinstance(document, Unreadable):
        return None, {}
    message_id: UUID | None = None
    raw_id = _scalar(document, "MessageId")
    if isinstance(raw_id, str):
        with contextlib.suppress(ValueError):
            message_id = UUID(raw_id)
    fields: dict[str, object] = {}
    raw_payload = document.get("Payload")
    payload: dict[str, msgspec.Raw] | Unreadable | None = None
    if raw_payload is not None:
        payload = read_untrusted(_OBJECT, raw_payload)
    places = [(name, payload) for name in LOGGED_FIELDS] if isinstance(payload, dict) else []
    for name, where in [*places, ("CorrelationId", document)]:
        found = _scalar(where, name)
        if isinstance(found, str):
            fields[name] = found[:_LONGEST_LOGGED]
        elif isinstance(found, int) and not _INT64_MIN <= found <= _INT64_MAX:
            continue  # thousands of digits are no log field (nor text Python will format)
        elif found is not None:
            fields[name] = found
    return message_id, fields


def _scalar(members: dict[str, msgspec.Raw], name: str) -> str | int | float | bool | None:
    raw = members.get(name)
    found = read_untrusted(_SCALAR, raw) if raw is not None else None
    return None if isinstance(found, Unreadable) else found


_JSON_TEXT: Final = msgspec.json.Encoder().encode
KEY_MISSING: Final = "missing"
KEY_NOT_UTF8: Final = "not_utf8"
KEY_NOT_AGENT_USER_ID: Final = "not_agent_user_id"
KEY_PROBLEMS: Final = (KEY_MISSING, KEY_NOT_UTF8, KEY_NOT_AGENT_USER_ID)
"""The `reason` label values of `rewards_membership_key_mismatch_total`."""


def key_problem(key: bytes | None, agent_user_id: UUID) -> str | None:
    """Why `key` is not the record key the spec fixes (AgentUserId, canonical lowercase
    UUID text, as `pin_contracts.kafka_key` writes it), or None. One bytes comparison for
    a right key; the reason is worked out only for a wrong one."""
    # msgspec writes a UUID as its canonical text in C, quoted: cheaper than str(uuid)
    # (docs/design/rewards-membership.md "Record keys"), and this runs for every record
    # consumed.
    if key == _JSON_TEXT(agent_user_id)[1:-1]:
        return None
    if not key:
        return KEY_MISSING  # null, or empty: no key either way
    try:
        bytes(key).decode()
    except UnicodeDecodeError:
        return KEY_NOT_UTF8
    return KEY_NOT_AGENT_USER_ID


def validate(value: bytes | None, key: bytes | NoKeyCheck | None = NO_KEY_CHECK) -> Item:
    """Decode and check one record value (spec steps 1-2, without the inbox lookup), and,
    when given, its Kafka `key` against the payload's AgentUserId (the consumer gives it;
    a replay or a listing checks only the value)."""
    try:
        envelope = decode_membership_changed(value)
    except ContractViolation as exc:
        message_id, fields = readable_fields(value)
        return InvalidEvent(path=exc.path, reason=exc.reason, message_id=message_id, fields=fields)
    payload = envelope.payload
    # CompanyId is part of the row key: required whatever the Status (spec step 2).
    for path, guid in (
        ("$.Payload.AgentUserId", payload.agent_user_id),
        ("$.Payload.CompanyId", payload.company_id),
    ):
        # is_empty_guid, on the integer: UUID.__eq__ is Python code, and this runs twice
        # for every event consumed.
        if guid.int == _EMPTY_GUID_INT:
            return InvalidEvent(
                path=path,
                reason="must not be Guid.Empty",
                message_id=envelope.message_id,
                key=idempotency_key(envelope.message_id),
                fields={
                    "AgentUserId": payload.agent_user_id,
                    "CompanyId": payload.company_id,
                    "Status": payload.status,
                    "Reason": payload.reason,
                    "Version": payload.version,
                    "CorrelationId": envelope.correlation_id,
                },
            )

    parsed_status = payload.parsed_status
    status: AgentMembershipStatus
    if isinstance(parsed_status, UnknownEnumValue):
        # Fail closed: a Status this reader does not know never counts as an active membership.
        status, unknown_status = AgentMembershipStatus.LEFT, True
    else:
        status, unknown_status = parsed_status, False
    leave_reason: LeaveReason | None = None
    unknown_reason = False
    if status is AgentMembershipStatus.LEFT:
        parsed_reason = payload.parsed_reason
        if isinstance(parsed_reason, UnknownEnumValue):
            unknown_reason = True  # the leave happened; only reason-specific logic is skipped
        else:
            leave_reason = parsed_reason
    return MembershipChange(
        payload=payload,
        key_problem=None if key is NO_KEY_CHECK else key_problem(key, payload.agent_user_id),
        message_id=envelope.message_id,
        contract_version=envelope.contract_version,
        occurred_at=envelope.occurred_at,
        correlation_id=envelope.correlation_id,
        key=idempotency_key(envelope.message_id),
        row_key=(payload.agent_user_id, payload.company_id),
        status=status,
        leave_reason=leave_reason,
        unknown_status=unknown_status,
        unknown_reason=unknown_reason,
    )
