"""The error tree of rewards-membership, and the one place failures are classified."""

from __future__ import annotations

from confluent_kafka import KafkaException

from pin_runtime.errors import DeliveryError
from pin_runtime.postgres import is_retriable

__all__ = [
    "ConcurrentApplyError",
    "InfrastructureError",
    "RewardsMembershipError",
    "is_infrastructure",
]


class RewardsMembershipError(Exception):
    """Root of every error this service raises."""


class InfrastructureError(RewardsMembershipError):
    """PostgreSQL, Kafka or the DLQ write failed: roll back, pause, back off, retry."""


class ConcurrentApplyError(InfrastructureError):
    """Another instance committed the same row or inbox key first: re-read and re-decide."""


def is_infrastructure(exc: BaseException) -> bool:
    """True for an outage of a dependency (retry later), False for a bug (stop)."""
    if isinstance(exc, InfrastructureError | KafkaException | DeliveryError):
        return True
    return is_retriable(exc)
