"""Configuration of identity-fanout, read once from `IDENTITY_FANOUT_*` variables.

Defaults are the spec's (PollingInterval 5 s, BatchSize 500, MaxLeaseDuration 5 min); the
others are this service's choices, documented in the README.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Annotated, Final

from msgspec import Meta

from pin_contracts.topics import AGENT_MEMBERSHIP_CHANGED, CATALOGUE, USER_ACCESS_CHANGED
from pin_runtime.clients import Port, ServiceSettings
from pin_runtime.lag_watch.settings import LagWatchSettings as BaseLagWatchSettings
from pin_runtime.lag_watch.settings import TopicName
from pin_runtime.settings import Secret

ENV_PREFIX: Final = "IDENTITY_FANOUT_"
SERVICE_NAME: Final = "identity-fanout"

RELAY_MESSAGE_MAX_BYTES: Final = 2 * max(
    USER_ACCESS_CHANGED.max_message_bytes, AGENT_MEMBERSHIP_CHANGED.max_message_bytes
)
"""The relay producer's `message.max.bytes` (16 MiB): librdkafka compares it with the
UNCOMPRESSED record, the broker compares the topic's `max.message.bytes` (8 MiB for the
access topic) with the zstd-COMPRESSED batch. An access snapshot compresses far better than
2x (docs/design/identity-fanout.md "Sizes"), so anything under this limit fits the access topic
with room to spare; a record that compresses worse is refused by the broker instead, and
quarantined all the same."""

PositiveInt = Annotated[int, Meta(ge=1)]


class Settings(ServiceSettings, frozen=True, kw_only=True):
    """Every setting of the service; field `batch_size` is `IDENTITY_FANOUT_BATCH_SIZE`."""

    database_dsn: Secret
    """libpq DSN of the `pin_identity` database."""

    polling_interval: timedelta = timedelta(seconds=5)
    """Spec PollingInterval: how often the queue is polled when no NOTIFY woke the worker."""
    batch_size: Annotated[int, Meta(ge=1, le=10_000)] = 500
    """Spec BatchSize: users per page, and per transaction."""
    max_lease_duration: timedelta = timedelta(minutes=5)
    """Spec MaxLeaseDuration: a claimed task is invisible to others this long."""
    max_attempts: PositiveInt = 5
    """A task claimed this many times without completing becomes Failed (poison)."""
    inline_fanout_threshold: Annotated[int, Meta(ge=0)] = 1000
    """Roles with at most this many active users are fanned out inside set-role-permissions."""
    shard_size: Annotated[int, Meta(ge=1)] = 25_000
    """A queued role with more active users than this is split into shards of about this
    many users, each claimed by its own worker (docs/design/identity-fanout.md "Sharded
    fan-out")."""
    max_outbox_backlog: Annotated[int, Meta(ge=1, le=10_000_000)] = 10_000
    """The fan-out waits before its next batch while this many outbox rows (or more) wait
    for the relays: a point change committed during a mass fan-out waits behind at most
    this many rows, and the outbox table stays bounded (docs/design/identity-fanout.md
    "Backpressure")."""

    outbox_lanes: Annotated[int, Meta(ge=1, le=64)] = 8
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
    one read per commit of every writer. It delays a row by at most this much, and only
    while rows keep coming; after a quiet spell the first row is read at once
    (docs/design/identity-fanout.md "Relays side by side"). 0 turns it off."""
    relay_delivery_timeout: timedelta = timedelta(seconds=30)
    """How long a record may wait for the broker's acknowledgement before it fails (and
    goes out again after a backoff)."""
    relay_message_max_bytes: Annotated[int, Meta(ge=1000, le=1_000_000_000)] = (
        RELAY_MESSAGE_MAX_BYTES
    )
    """The relay producer's `message.max.bytes`: the largest uncompressed record it sends;
    a larger row is quarantined at once. Raise it together with the topic's
    `max.message.bytes` (docs/design/identity-fanout.md "Sizes")."""

    metrics_port: Port = 9108
    db_pool_size: Annotated[int, Meta(ge=2, le=100)] = 4

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.polling_interval <= timedelta(0):
            raise ValueError("IDENTITY_FANOUT_POLLING_INTERVAL: must be positive")
        if self.max_lease_duration < timedelta(seconds=1):
            raise ValueError("IDENTITY_FANOUT_MAX_LEASE_DURATION: must be at least 1s")
        if self.relay_poll_interval <= timedelta(0):
            raise ValueError("IDENTITY_FANOUT_RELAY_POLL_INTERVAL: must be positive")
        if not timedelta(0) <= self.relay_read_cooldown <= timedelta(seconds=10):
            raise ValueError("IDENTITY_FANOUT_RELAY_READ_COOLDOWN: must be within 0..10s")
        if self.relay_delivery_timeout < timedelta(milliseconds=1):
            raise ValueError("IDENTITY_FANOUT_RELAY_DELIVERY_TIMEOUT: must be at least 1ms")


class LagWatchSettings(BaseLagWatchSettings, frozen=True, kw_only=True):
    """`identity-fanout lag-watch`: the consumer groups of the access topic, found by
    discovery (crm, catalog, chessboard, gateway: other teams name their groups), under the
    same prefix (`IDENTITY_FANOUT_LAG_WATCH_*`, README "Lag watcher")."""

    lag_watch_topics: tuple[TopicName, ...] = (USER_ACCESS_CHANGED.name,)
    lag_watch_discover: bool = True
    metrics_port: Port = 9108

    def catalogue_partitions(self) -> dict[str, int]:
        return {t.name: t.partitions for t in CATALOGUE if t.name in self.lag_watch_topics}
