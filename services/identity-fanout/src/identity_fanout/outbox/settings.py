"""The relay's settings: every value an operator sets of a relay, declared once.

A service's `Settings` subclasses `RelaySettings`, so field `relay_batch_size` is read from
`<PREFIX>RELAY_BATCH_SIZE` (`IDENTITY_FANOUT_RELAY_BATCH_SIZE`) like any other setting,
with its bounds checked by the loader and its checks below naming the variable. The relay
takes the settings object itself (`OutboxRelay(settings, ...)`); its connections come from
it too: the database DSN and session limits, the Kafka bootstrap and security.

Built in code (a test, a benchmark), `msgspec.convert(values, RelaySettings)` checks the
bounds as the loader does; the constructor runs only `__post_init__`.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Annotated, Final

from msgspec import Meta

from identity_fanout.outbox.rules import DEFAULT_LANES, MAX_LANES
from pin_contracts import CATALOGUE
from pin_runtime.clients import ServiceSettings
from pin_runtime.settings import Secret

__all__ = ["RELAY_MESSAGE_MAX_BYTES", "RelaySettings"]

MIN_DELIVERY_TIMEOUT: Final = timedelta(seconds=1)
"""The shortest `RELAY_DELIVERY_TIMEOUT` taken."""

RELAY_MESSAGE_MAX_BYTES: Final = 2 * max(
    topic.max_message_bytes for topic in CATALOGUE if topic.dead_letter_of is None
)
"""The relay producer's `message.max.bytes` (16 MiB): twice the largest `max.message.bytes`
of the catalogue's event topics (8 MiB, the access topic). librdkafka compares it with the
UNCOMPRESSED record, the broker compares the topic's limit with the zstd-COMPRESSED batch.
An access snapshot compresses far better than 2x (docs/design/identity-fanout.md "Sizes"),
so anything under this limit fits the access topic with room to spare; a record that
compresses worse is refused by the broker instead, and quarantined all the same."""


class RelaySettings(ServiceSettings, frozen=True, kw_only=True):
    """The relay's settings and the connections it uses (inherited from `ServiceSettings`)."""

    database_dsn: Secret
    """libpq DSN of the database that holds the outbox (the service's own)."""

    outbox_lanes: Annotated[int, Meta(ge=1, le=MAX_LANES)] = DEFAULT_LANES
    """Lanes the outbox is split into by message key: the most relay instances that publish
    at once. May be changed at any time, also by a rolling update
    (docs/design/identity-fanout.md "Relay lanes")."""
    relay_batch_size: Annotated[int, Meta(ge=1, le=100_000)] = 5000
    """Outbox rows the relay reads (and deletes) per round trip, within the window's bytes."""
    relay_window_records: Annotated[int, Meta(ge=1, le=1_000_000)] = 20_000
    """Records one relay instance keeps in flight (produced, not yet settled) at most."""
    relay_window_bytes: Annotated[int, Meta(ge=1_000_000, le=4_000_000_000)] = 32 * 1024 * 1024
    """Bytes of keys and values one relay instance keeps in flight at most (each read asks
    for no more than what is left)."""
    relay_poll_interval: timedelta = timedelta(seconds=1)
    """How often the relay looks at the outbox when no NOTIFY woke it."""
    relay_read_cooldown: timedelta = timedelta(milliseconds=100)
    """After a read that found the relay's lanes caught up, how long before it reads them
    again: the writers' commits meanwhile go out together, one read for many, instead of
    one read per commit of every writer (River's producer waits the same way between
    fetches, FetchCooldown). It delays a row by at most this much, and only while rows keep
    coming; after a quiet spell the first row is read at once
    (docs/design/identity-fanout.md "Outbox relay"). 0 turns it off."""
    relay_delivery_timeout: timedelta = timedelta(seconds=30)
    """How long a record may wait for the broker's acknowledgement before it fails (and
    goes out again after a backoff)."""
    relay_message_max_bytes: Annotated[int, Meta(ge=1000, le=1_000_000_000)] = (
        RELAY_MESSAGE_MAX_BYTES
    )
    """The relay producer's `message.max.bytes`: the largest uncompressed record it sends;
    a larger row is quarantined at once. Raise it together with the topic's
    `max.message.bytes` (docs/design/identity-fanout.md "Sizes")."""

    def __post_init__(self) -> None:
        super().__post_init__()
        # Named without the service's prefix, as `ServiceSettings` names its own: the loader
        # reports them under the full variable (`IDENTITY_FANOUT_RELAY_POLL_INTERVAL`).
        if self.relay_poll_interval <= timedelta(0):
            raise ValueError("RELAY_POLL_INTERVAL: must be positive")
        if not timedelta(0) <= self.relay_read_cooldown <= timedelta(seconds=10):
            raise ValueError("RELAY_READ_COOLDOWN: must be within 0..10s")
        # librdkafka refuses a producer whose message.timeout.ms is not above its linger.ms
        # (tens of ms): a shorter timeout would fail the relay's start, not its settings.
        if self.relay_delivery_timeout < MIN_DELIVERY_TIMEOUT:
            raise ValueError("RELAY_DELIVERY_TIMEOUT: must be at least 1s")
