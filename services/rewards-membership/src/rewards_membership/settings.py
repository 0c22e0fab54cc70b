"""Configuration of rewards-membership, read once from `REWARDS_MEMBERSHIP_*` variables.

Topic and group default to the contract catalogue's; tests and the benchmark point them
elsewhere. Retry defaults are the spec's (exponential backoff 1 s -> 60 s).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Annotated, Final

from msgspec import Meta

from pin_contracts import (
    AGENT_MEMBERSHIP_CHANGED,
    CATALOGUE,
    IDENTITY_MEMBERSHIP_DLQ,
    REWARDS_MEMBERSHIP_CONSUMER_GROUP,
)
from pin_runtime.clients import Port, ServiceSettings
from pin_runtime.lag_watch.settings import GroupName, TopicName
from pin_runtime.lag_watch.settings import LagWatchSettings as BaseLagWatchSettings
from pin_runtime.settings import Secret

ENV_PREFIX: Final = "REWARDS_MEMBERSHIP_"
SERVICE_NAME: Final = "rewards-membership"

# Statements of the longest batch: the batch statement tried up to 5 times (concurrent
# writers make it decide again, consumer/database.py), the dead-letter marks, and a
# recovery probe.
_STATEMENTS_PER_BATCH: Final = 7
# Rounds of DLQ waits per batch: the copies, then the reference records of refused ones.
_DLQ_ROUNDS: Final = 2
_DLQ_REPORT_MARGIN_S: Final = 5.0
_POLL_MARGIN_S: Final = 60.0
_LONGEST_POLL_INTERVAL_MS: Final = 86_400_000
"""librdkafka's upper bound of `max.poll.interval.ms` (24 h)."""


class Settings(ServiceSettings, frozen=True, kw_only=True):
    """Every setting of the service; field `batch_size` is `REWARDS_MEMBERSHIP_BATCH_SIZE`."""

    database_dsn: Secret
    """libpq DSN of the `pin_rewards` database."""

    topic: TopicName = AGENT_MEMBERSHIP_CHANGED.name
    dlq_topic: TopicName = IDENTITY_MEMBERSHIP_DLQ.name
    group_id: GroupName = REWARDS_MEMBERSHIP_CONSUMER_GROUP

    batch_size: Annotated[int, Meta(ge=1, le=10_000)] = 5000
    """Most messages one `consume()` returns, and one database transaction applies."""
    kafka_session_timeout: timedelta = timedelta(seconds=45)
    """librdkafka `session.timeout.ms`: how long a crashed consumer keeps its partitions
    before the group hands them to another instance (the broker bounds it, 6 s..5 min)."""
    poll_timeout: timedelta = timedelta(seconds=1)
    """How long one `consume()` waits for the first message of a batch."""
    retry_initial: timedelta = timedelta(seconds=1)
    retry_max: timedelta = timedelta(seconds=60)
    """Backoff of a paused partition while PostgreSQL / Kafka / the DLQ write fails."""
    delivery_timeout: timedelta = timedelta(seconds=30)
    """How long a batch waits for the broker to acknowledge its DLQ records."""
    lag_interval: timedelta = timedelta(seconds=5)
    """How often the per-partition offset lag gauge is refreshed from the watermarks."""

    metrics_port: Port = 9109

    def __post_init__(self) -> None:
        super().__post_init__()
        if not timedelta(seconds=6) <= self.kafka_session_timeout <= timedelta(minutes=5):
            raise ValueError("REWARDS_MEMBERSHIP_KAFKA_SESSION_TIMEOUT: must be within 6s..5m")
        if self.poll_timeout <= timedelta(0):
            raise ValueError("REWARDS_MEMBERSHIP_POLL_TIMEOUT: must be positive")
        if self.retry_initial <= timedelta(0):
            raise ValueError("REWARDS_MEMBERSHIP_RETRY_INITIAL: must be positive")
        if self.retry_max < self.retry_initial:
            raise ValueError(
                f"REWARDS_MEMBERSHIP_RETRY_MAX: must be at least REWARDS_MEMBERSHIP_RETRY_INITIAL"
                f" ({self.retry_initial.total_seconds():g}s), got"
                f" {self.retry_max.total_seconds():g}s"
            )
        # librdkafka refuses a producer whose message.timeout.ms is not above its linger.ms
        # (tens of ms): a shorter timeout would fail the consumer's start, not its settings.
        if self.delivery_timeout < timedelta(seconds=1):
            raise ValueError("REWARDS_MEMBERSHIP_DELIVERY_TIMEOUT: must be at least 1s")
        if self.lag_interval <= timedelta(0):
            raise ValueError("REWARDS_MEMBERSHIP_LAG_INTERVAL: must be positive")
        if self.dlq_topic == self.topic:
            raise ValueError("REWARDS_MEMBERSHIP_DLQ_TOPIC: must differ from the source topic")
        if self.max_poll_interval_ms() > _LONGEST_POLL_INTERVAL_MS:
            raise ValueError(
                "REWARDS_MEMBERSHIP_DB_STATEMENT_TIMEOUT: with REWARDS_MEMBERSHIP_DELIVERY_TIMEOUT"
                f" {self.delivery_timeout.total_seconds():g}s a batch may take"
                f" {self.max_poll_interval_ms() / 3_600_000:.1f} h, more than the 24 h"
                " librdkafka lets a consumer go between polls: lower one of them (a statement"
                " counts 7 times, the delivery timeout twice)"
            )

    def max_poll_interval_ms(self) -> int:
        """librdkafka `max.poll.interval.ms`: above the longest a batch can take.

        A batch that outlasts it makes the consumer leave the group and its partitions
        move, in the middle of the batch. Longest batch = every statement at its statement
        timeout (a lock wait counts within it) + both DLQ waits + margin; never below
        librdkafka's default of 5 minutes. With a statement timeout of 0 (disabled) nothing
        bounds a batch, so the default's 5 minutes plus the DLQ waits are used.
        """
        statement = self.db_statement_timeout.total_seconds()
        delivery = self.delivery_timeout.total_seconds() + _DLQ_REPORT_MARGIN_S
        longest = statement * _STATEMENTS_PER_BATCH + delivery * _DLQ_ROUNDS + _POLL_MARGIN_S
        return int(max(300.0, longest) * 1000)


class LagWatchSettings(BaseLagWatchSettings, frozen=True, kw_only=True):
    """`rewards-membership lag-watch`: this service's own group on its source topic, under
    the same prefix (`REWARDS_MEMBERSHIP_LAG_WATCH_*`, README "Lag watcher")."""

    lag_watch_topics: tuple[TopicName, ...] = (AGENT_MEMBERSHIP_CHANGED.name,)
    lag_watch_groups: tuple[GroupName, ...] = (REWARDS_MEMBERSHIP_CONSUMER_GROUP,)
    metrics_port: Port = 9109

    def catalogue_partitions(self) -> dict[str, int]:
        return {t.name: t.partitions for t in CATALOGUE if t.name in self.lag_watch_topics}
