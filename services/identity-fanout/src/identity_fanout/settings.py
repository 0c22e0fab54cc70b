"""Configuration of identity-fanout, read once from `IDENTITY_FANOUT_*` variables.

Defaults are the spec's (PollingInterval 5 s, BatchSize 500, MaxLeaseDuration 5 min); the
others are this service's choices, documented in the README.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Annotated, Final

from msgspec import Meta

from identity_fanout.outbox.settings import RelaySettings
from pin_contracts.topics import CATALOGUE, USER_ACCESS_CHANGED
from pin_runtime.clients import Port
from pin_runtime.lag_watch.settings import LagWatchSettings as BaseLagWatchSettings
from pin_runtime.lag_watch.settings import TopicName

ENV_PREFIX: Final = "IDENTITY_FANOUT_"
SERVICE_NAME: Final = "identity-fanout"

PositiveInt = Annotated[int, Meta(ge=1)]


class Settings(RelaySettings, frozen=True, kw_only=True):
    """Every setting of the service; field `batch_size` is `IDENTITY_FANOUT_BATCH_SIZE`.

    The relay's (`outbox_lanes`, `relay_*`) and the database DSN, here the `pin_identity`
    database, are declared by `RelaySettings`, which the relay takes as it is."""

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

    metrics_port: Port = 9108
    db_pool_size: Annotated[int, Meta(ge=2, le=100)] = 4

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.polling_interval <= timedelta(0):
            raise ValueError("IDENTITY_FANOUT_POLLING_INTERVAL: must be positive")
        if self.max_lease_duration < timedelta(seconds=1):
            raise ValueError("IDENTITY_FANOUT_MAX_LEASE_DURATION: must be at least 1s")


class LagWatchSettings(BaseLagWatchSettings, frozen=True, kw_only=True):
    """`identity-fanout lag-watch`: the consumer groups of the access topic, found by
    discovery (crm, catalog, chessboard, gateway: other teams name their groups), under the
    same prefix (`IDENTITY_FANOUT_LAG_WATCH_*`, README "Lag watcher")."""

    lag_watch_topics: tuple[TopicName, ...] = (USER_ACCESS_CHANGED.name,)
    lag_watch_discover: bool = True
    metrics_port: Port = 9108

    def catalogue_partitions(self) -> dict[str, int]:
        return {t.name: t.partitions for t in CATALOGUE if t.name in self.lag_watch_topics}
