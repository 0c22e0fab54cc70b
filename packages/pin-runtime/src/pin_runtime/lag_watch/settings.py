"""What the lag watcher watches and how often: a service's `<PREFIX>LAG_WATCH_*` variables.

Each service subclasses `LagWatchSettings` with its own defaults (its topic, its group or
discovery, its metrics port), read under the service's prefix: `IDENTITY_FANOUT_LAG_WATCH_GROUPS`,
`REWARDS_MEMBERSHIP_LAG_WATCH_INTERVAL`. The Kafka connection settings are the service's own
(`<PREFIX>KAFKA_*`), so one set of credentials serves the service and its watcher. No
database: the watcher's pod gets no DSN.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta
from typing import Annotated

from msgspec import Meta

from pin_runtime.clients import Port
from pin_runtime.kafka_settings import KafkaClientSettings
from pin_runtime.logging import LogLevel

__all__ = ["GroupName", "LagWatchSettings", "TopicName"]

TopicName = Annotated[str, Meta(pattern=r"^[a-zA-Z0-9._-]{1,249}$")]
"""A Kafka topic name (the broker's own rule)."""
GroupName = Annotated[str, Meta(min_length=1, max_length=255)]


class LagWatchSettings(KafkaClientSettings, frozen=True, kw_only=True):
    """The watcher's settings; a service's subclass gives the defaults of its topics."""

    lag_watch_topics: tuple[TopicName, ...] = ()
    """Topics whose consumer groups are watched (at least one)."""
    lag_watch_groups: tuple[GroupName, ...] = ()
    """Groups watched on every topic of `lag_watch_topics`, whether or not they have
    committed anything yet (a partition never committed counts from its first record)."""
    lag_watch_discover: bool = False
    """Also watch every group that has committed offsets on one of the topics (the
    consumers of other teams, whose names this service does not know)."""
    lag_watch_exclude_groups: tuple[GroupName, ...] = ()
    """Groups discovery leaves out (a retired consumer whose offsets the broker still keeps)."""
    lag_watch_interval: timedelta = timedelta(seconds=15)
    """Time between the starts of two passes."""
    lag_watch_request_timeout: timedelta = timedelta(seconds=10)
    """Longest wait for one kind of broker request of a pass (all requests of a kind are
    sent together, so a pass takes at most a few of these)."""
    lag_watch_stale_after: timedelta = timedelta(minutes=10)
    """A group whose lag could not be read for this long loses its series; until then they
    keep their last value (README "Lag watcher")."""
    lag_watch_max_groups: Annotated[int, Meta(ge=1, le=2000)] = 200
    """Most groups watched; discovery beyond it keeps the first by name and counts an
    error (the series and the requests of a pass stay bounded)."""

    metrics_host: str = "0.0.0.0"  # noqa: S104 - the pod's metrics port is meant to be scraped
    metrics_port: Port = 0
    log_level: LogLevel = "INFO"

    def catalogue_partitions(self) -> Mapping[str, int]:
        """The topic catalogue's partition count of each watched topic it fixes: exported
        beside the count the cluster has, for the alert that they differ. A service's
        subclass answers from its catalogue (pin-runtime knows none)."""
        return {}

    def __post_init__(self) -> None:
        super().__post_init__()  # the Kafka authentication checks
        if not self.lag_watch_topics:
            raise ValueError("LAG_WATCH_TOPICS: at least one topic")
        if not (self.lag_watch_groups or self.lag_watch_discover):
            raise ValueError("LAG_WATCH_GROUPS: no group to watch and LAG_WATCH_DISCOVER is false")
        if self.lag_watch_interval < timedelta(seconds=1):
            raise ValueError("LAG_WATCH_INTERVAL: must be at least 1s")
        if not timedelta(0) < self.lag_watch_request_timeout <= self.lag_watch_interval:
            raise ValueError(
                "LAG_WATCH_REQUEST_TIMEOUT: must be positive and at most LAG_WATCH_INTERVAL"
            )
        if self.lag_watch_stale_after < 2 * self.lag_watch_interval:
            raise ValueError("LAG_WATCH_STALE_AFTER: must be at least twice LAG_WATCH_INTERVAL")
