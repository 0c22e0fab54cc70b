"""Message pacts of the platform's Kafka events: what consumer pact tests share.

Every event is the same envelope (MessageId, EventType, ContractVersion, OccurredAt,
AggregateType, AggregateId, Version, CorrelationId, Payload) on a record whose key is the
aggregate's id and whose headers carry the event type and contract version; a consumer's
pact states which of these it relies on with the same matchers. ``examples`` hands a test
each interaction's example value and metadata as the consumer would receive them.

Needs ``pact-python`` (the workspace's development tools install it).
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Iterator
from typing import Any, Final

import pytest
from pact import Pact, match

from pin_contracts import CONTRACT_VERSION_HEADER, EVENT_TYPE_HEADER

__all__ = [
    "RFC3339",
    "envelope",
    "examples",
    "moment",
    "no_telemetry",
    "pact_fixture",
    "record_metadata",
    "record_value",
    "uuid_like",
]

RFC3339: Final = r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d{1,9})?(Z|[+-]\d{2}:\d{2})$"
OCCURRED_AT: Final = "2025-03-01T09:00:00.123456Z"


def uuid_like(example: str) -> object:
    """A UUID in its canonical lower-case text, as every id on the wire is."""
    return match.uuid(example, format="lowercase")


def moment(example: str) -> object:
    """An RFC 3339 timestamp with an offset."""
    return match.regex(example, regex=RFC3339)


def envelope(
    *,
    message_id: str,
    event_type: str,
    aggregate_type: str,
    aggregate_id: str,
    version: int,
    correlation_id: str,
    payload: object,
) -> dict[str, object]:
    """The envelope every event travels in; EventType and AggregateType exactly, the rest by
    format or type."""
    return {
        "MessageId": uuid_like(message_id),
        "EventType": event_type,
        "ContractVersion": match.int(1),
        "OccurredAt": moment(OCCURRED_AT),
        "AggregateType": aggregate_type,
        "AggregateId": uuid_like(aggregate_id),
        "Version": match.int(version),
        "CorrelationId": match.str(correlation_id),
        "Payload": payload,
    }


def record_metadata(key: str, event_type: str) -> dict[str, object]:
    """The record around the value: its key (the aggregate's id: per-aggregate order) and
    the event type and contract version headers."""
    return {
        "key": uuid_like(key),
        EVENT_TYPE_HEADER: event_type,
        CONTRACT_VERSION_HEADER: match.regex("1", regex=r"^[1-9][0-9]*$"),
    }


def record_value(body: str | bytes | None) -> bytes:
    """A message body as a Kafka record value."""
    return body.encode() if isinstance(body, str) else bytes(body or b"")


def _metadata_value(raw: str) -> object:
    # What Pact.verify hands a handler: JSON where the value is JSON, the text otherwise.
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        return raw


def examples(pact: Pact) -> dict[str, tuple[bytes, dict[str, Any]]]:
    """Each interaction's example record value and metadata, by description."""
    found: dict[str, tuple[bytes, dict[str, Any]]] = {}
    for message in pact.interactions("Async"):
        contents = message.contents
        if contents is None:
            raise AssertionError(f"{message.description}: no contents")
        metadata = {pair.key: _metadata_value(pair.value) for pair in contents.metadata}
        found[message.description] = (record_value(contents.contents), metadata)
    return found


@contextlib.contextmanager
def no_telemetry() -> Iterator[None]:
    """Pact's core reports anonymous usage statistics unless told not to: tests stay offline."""
    saved = os.environ.get("PACT_DO_NOT_TRACK")
    os.environ["PACT_DO_NOT_TRACK"] = "true"
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("PACT_DO_NOT_TRACK", None)
        else:
            os.environ["PACT_DO_NOT_TRACK"] = saved


def pact_fixture(build: Callable[[], Pact]) -> Callable[[], Iterator[Pact]]:
    """A module-scoped ``pact`` fixture: the pact ``build`` declares, with Pact's telemetry
    off while the module's tests use it (``pact = pact_fixture(access_pact)``)."""

    @pytest.fixture(scope="module", name="pact")
    def pact() -> Iterator[Pact]:
        with no_telemetry():
            yield build()

    return pact
