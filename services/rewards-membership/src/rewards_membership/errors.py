"""The error tree of rewards-membership, and the one place failures are classified."""

from __future__ import annotations

from confluent_kafka import KafkaException

from pin_runtime.errors import DeliveryError
from pin_runtime.postgres import is_retriable

__all__ = [
    "CommitInDoubtError",
    "ConcurrentApplyError",
    "InfrastructureError",
    "KafkaUnavailableError",
    "RewardsMembershipError",
    "TopicMissingError",
    "is_infrastructure",
]


class RewardsMembershipError(Exception):
    """Root of every error this service raises."""


class KafkaUnavailableError(RewardsMembershipError):
    """An operator command that cannot do without Kafka found no broker answering (or lost
    it midway): one line, `error: kafka unavailable: <reason>`, exit 1."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"kafka unavailable: {reason}")
        self.reason = reason


class TopicMissingError(RewardsMembershipError):
    """A topic an operator command reads is not on the brokers (the brokers answered)."""

    def __init__(self, topic: str) -> None:
        super().__init__(f"topic {topic} does not exist")
        self.topic = topic


class InfrastructureError(RewardsMembershipError):
    """PostgreSQL, Kafka or the DLQ write failed: roll back, pause, back off, retry."""


class ConcurrentApplyError(InfrastructureError):
    """Another instance committed the same row or inbox key first: re-read and re-decide."""


class CommitInDoubtError(InfrastructureError):
    """The batch's statement decided its records, then the connection was lost with its
    COMMIT unanswered: the transaction may have committed or not. The records keep what the
    statement decided, reported on the retry for those it finds already in the inbox (they
    are what this try committed) and used for nothing else."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(f"commit unanswered: {cause}".strip())


def is_infrastructure(exc: BaseException) -> bool:
    """True for an outage of a dependency (retry later), False for a bug (stop)."""
    if isinstance(exc, InfrastructureError | KafkaException | DeliveryError):
        return True
    return is_retriable(exc)
