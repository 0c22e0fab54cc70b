"""What the outbox relay's tests share: the access contract on a test's topic, events, rows,
options of a relay under test, and a relay running in a thread as the worker runs it.

Imported by the test modules (the root pyproject's pytest ``pythonpath`` lists this directory); the
fixtures built on it (``make_relay``) live in ``conftest``.
"""

from __future__ import annotations

import hashlib
import threading
import uuid
from collections.abc import Callable
from dataclasses import asdict, replace
from datetime import timedelta
from typing import Any, Final

import msgspec
import psycopg
from opentelemetry import trace
from prometheus_client import CollectorRegistry

from identity_fanout.app import RELAY_CLIENT_ID
from identity_fanout.outbox.relay import OutboxRelay, RelayInternals, RelaySignals
from identity_fanout.outbox.rules import SLOTS
from identity_fanout.outbox.settings import RelaySettings
from identity_fanout.outbox.store import ReadRequest
from identity_fanout.outbox.tables import OutboxTables
from identity_fanout.outbox.writer import OutboxMessage
from identity_fanout.schema import OUTBOX, OUTBOX_TABLES
from pin_contracts import (
    USER_ACCESS_CHANGED,
    AccessChangeReason,
    Envelope,
    Topic,
    UserAccessChangedKafkaEvent,
    envelope_for,
)
from pin_runtime.http import ComponentState, Heartbeat
from pin_runtime.postgres import SessionLimits
from pin_runtime.settings import Secret

__all__ = [
    "RELAY_TEST_OPTIONS",
    "RelayFactory",
    "RelayThread",
    "access_event",
    "access_topic",
    "key_in",
    "new_relay",
    "outbox_count",
    "read_request",
    "slot_of",
    "write",
]

RelayFactory = Callable[..., OutboxRelay]
"""The ``make_relay`` fixture: ``make_relay(**overrides)`` -> a relay closed after the test."""

RELAY_TEST_OPTIONS: dict[str, Any] = {
    # Short enough that a test sees a retry or a lane change in well under a second, long
    # enough for a broker on two busy cores to acknowledge.
    "delivery_timeout": 20.0,
    "lock_retry_interval": 0.2,
    "backoff_initial": 0.1,
    "backoff_maximum": 0.5,
}

BILLING = OutboxTables(
    schema="billing",
    outbox="events",
    quarantine="refused",
    discards="refused_audit",
    channel="billing_events",
    key_slot_function="slot_of",
    key_fields={"InvoiceIssued": "invoiceId"},
    guarded_event_types=frozenset({"InvoiceIssued"}),
    guard="carry invoices",
)
"""Another service's outbox: every name differs from the identity outbox's."""


ANY_ID: Final = 2**62
"""A frontier past every id: a read of rows known to be committed."""


def read_request(
    slots: tuple[int, ...], after: int, limit: int, budget: int, *, upto: int = ANY_ID
) -> ReadRequest:
    """A read of `slots` with one cursor and one frontier for all of them."""
    return ReadRequest(slots, (after,) * len(slots), (upto,) * len(slots), limit, budget)


SETTING_OF: Final = {
    "lanes": "outbox_lanes",
    "batch_size": "relay_batch_size",
    "window_records": "relay_window_records",
    "window_bytes": "relay_window_bytes",
    "poll_interval": "relay_poll_interval",
    "read_cooldown": "relay_read_cooldown",
    "delivery_timeout": "relay_delivery_timeout",
    "message_max_bytes": "relay_message_max_bytes",
}
"""The tests' short names of the relay's settings (`RelaySettings` fields)."""
_IN_SECONDS: Final = frozenset({"poll_interval", "read_cooldown", "delivery_timeout"})
"""Short names of durations, given in seconds."""
_INTERNALS: Final = frozenset(f.name for f in msgspec.structs.fields(RelayInternals))


def _session_settings(limits: SessionLimits) -> dict[str, Any]:
    """`SessionLimits` as the `DB_*` settings that make them."""
    return {
        f"db_{name}": value if name == "keepalives_count" else timedelta(seconds=value)
        for name, value in asdict(limits).items()
    }


def new_relay(
    dsn: str,
    bootstrap: str,
    *,
    settings: RelaySettings | None = None,
    tables: OutboxTables = OUTBOX_TABLES,
    client_id: str = RELAY_CLIENT_ID,
    registry: CollectorRegistry | None = None,
    state: ComponentState | None = None,
    heartbeat: Heartbeat | None = None,
    tracer_provider: trace.TracerProvider | None = None,
    probe: Callable[[str, int], None] | None = None,
    **options: Any,
) -> OutboxRelay:
    """A relay as the service builds one (its settings' defaults, its outbox and client id)
    on ``dsn`` and ``bootstrap``, with ``options`` overriding the rest: a setting by its
    field name or its short name (`SETTING_OF`, durations in seconds), ``session`` as
    `SessionLimits`, or a `RelayInternals` field. ``settings`` (e.g. the service's, loaded
    with a cluster's credentials) is the base instead of the defaults. The settings are
    checked as the loader checks them (bounds included); a registry of its own by default."""
    values: dict[str, Any] = msgspec.structs.asdict(settings) if settings else {}
    values |= {"database_dsn": Secret(dsn), "kafka_bootstrap": bootstrap}
    internals: dict[str, Any] = {}
    for name, value in options.items():
        if name in _INTERNALS:
            internals[name] = value
        elif name == "session":
            values |= _session_settings(value)
        elif name in SETTING_OF:
            values[SETTING_OF[name]] = timedelta(seconds=value) if name in _IN_SECONDS else value
        else:
            values[name] = value
    return OutboxRelay(
        msgspec.convert(values, type(settings) if settings else RelaySettings),
        tables=tables,
        client_id=client_id,
        registry=registry or CollectorRegistry(),
        state=state,
        heartbeat=heartbeat,
        tracer_provider=tracer_provider,
        signals=RelaySignals(probe=probe),
        internals=RelayInternals(**internals),
    )


def access_topic(name: str, partitions: int = 3) -> Topic:
    """The access topic's contract under a test's unique name."""
    return replace(USER_ACCESS_CHANGED, name=name, partitions=partitions)


def access_event(
    user_id: uuid.UUID | None = None, version: int = 1, *, correlation_id: str = "relay-test"
) -> Envelope[UserAccessChangedKafkaEvent]:
    """An access event of a role permission change with no assignments."""
    return envelope_for(
        UserAccessChangedKafkaEvent(
            user_id=user_id or uuid.uuid4(),
            company_id=uuid.uuid4(),
            change_reason=AccessChangeReason.ROLE_PERMISSIONS_CHANGED.value,
            active_assignments=(),
            version=version,
        ),
        correlation_id=correlation_id,
    )


def slot_of(key: str) -> int:
    """The key's slot, as `identity.outbox_key_slot` computes it."""
    return hashlib.sha256(key.encode()).digest()[0] % SLOTS


def key_in(slot: int) -> uuid.UUID:
    """A user id whose key falls in `slot`."""
    while slot_of(str(key := uuid.uuid4())) != slot:
        pass
    return key


def write(dsn: str, messages: list[OutboxMessage]) -> None:
    """The rows in one transaction, committed."""
    with psycopg.connect(dsn) as conn:  # committed on exit
        OUTBOX.write(conn, messages)


def outbox_count(dsn: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM identity.outbox").fetchone()
    assert row is not None
    return int(row[0])


class RelayThread:
    """`relay.run(stop)` in a thread, as the worker runs it; stopped and joined on exit."""

    def __init__(self, relay: OutboxRelay, name: str = "relay-test") -> None:
        self.relay = relay
        self.stop = threading.Event()
        self.thread = threading.Thread(target=relay.run, args=(self.stop,), name=name)

    def __enter__(self) -> RelayThread:
        self.thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop.set()
        self.thread.join(timeout=30)
        assert not self.thread.is_alive(), "relay did not stop within 30s"
