"""The envelope every PIN event travels in, and how a producer builds one."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import ClassVar, Generic, Protocol, TypeVar
from uuid import UUID

from pin_contracts.errors import InvalidEventError
from pin_contracts.wire import AwareDatetime, ContractVersionInt, VersionInt, WireStruct

__all__ = ["Envelope", "EventPayload", "envelope_for"]


class EventPayload(Protocol):
    """What the codec needs to know about a payload Struct."""

    EVENT_TYPE: ClassVar[str]
    CONTRACT_VERSION: ClassVar[int]
    AGGREGATE_TYPE: ClassVar[str]

    @property
    def version(self) -> int: ...

    @property
    def aggregate_id(self) -> str: ...

    @property
    def record_key(self) -> UUID: ...


# Unbound on purpose: msgspec resolves a bound TypeVar to its bound, and a Protocol is not a
# type it can decode. The helpers below bind it.
T = TypeVar("T")
P = TypeVar("P", bound=EventPayload)


class Envelope(WireStruct, Generic[T], frozen=True, kw_only=True):
    """Metadata of one message plus its payload; the JSON object that is the record value."""

    message_id: UUID
    event_type: str
    contract_version: ContractVersionInt
    occurred_at: AwareDatetime
    aggregate_type: str
    # str, not UUID: the envelope is shared by every event type, and widening UUID to str
    # later would be a type change. Both current aggregates put a canonical UUID here.
    aggregate_id: str
    version: VersionInt
    correlation_id: str | None
    payload: T


def envelope_for(
    payload: P,
    *,
    correlation_id: str | None = None,
    occurred_at: datetime | None = None,
) -> Envelope[P]:
    """Wrap a payload with a fresh MessageId and the metadata its type defines."""
    if occurred_at is None:
        occurred_at = datetime.now(UTC)
    elif occurred_at.utcoffset() is None:
        raise InvalidEventError("$.OccurredAt", "datetime must be timezone-aware")
    return Envelope(
        # uuid7 would sort better but needs Python 3.14; MessageId only has to be unique.
        message_id=uuid.uuid4(),
        event_type=payload.EVENT_TYPE,
        contract_version=payload.CONTRACT_VERSION,
        occurred_at=occurred_at,
        aggregate_type=payload.AGGREGATE_TYPE,
        aggregate_id=payload.aggregate_id,
        version=payload.version,
        correlation_id=correlation_id,
        payload=payload,
    )
